# Session 22: fp32 with B given N x K and M <= 4 on the rowload kernel's dot-product tiles
# (run_nk at fp32): the rowload tests, compute-sanitizer over s22_nk_san.py, and the tiles at
# K splits 1-8 and gemm's pick against cuBLAS (TF32 off), kernel-only cold (s19_mma.py), the
# pick also as one eager call with torch tensors. ~300 s.
out=$OUT total=${TOTAL:-420}
source benchmarks/_device_site.sh
for tool in memcheck racecheck synccheck; do san nk $tool 300 benchmarks/s22_nk_san.py & done
step tests
timeout 200 python3 -P -m pytest -q -n 6 -p no:cacheprovider tests/test_gemm_rowload.py \
    tests/test_gemm.py -k "rowload or f32_k_major or torch_tensors_repeat" > "$out/pytest.log" 2>&1
echo "pytest rc=$?"; tail -n 2 "$out/pytest.log"; grep -E "^(FAILED|ERROR)" "$out/pytest.log" | head
cd benchmarks
step time
GPURT_GEMM_AUTOTUNE=0 timeout $(( $(left) - 40 )) python3 s19_mma.py --tag nk --dtype fp32 \
    --kernels rowload --splits 1,2,4,8 --host --repeat 15 --json "$out/time.json" --shapes \
${SHAPES:-1x4096x4096t,2x4096x4096t,3x4099x4099t,4x4096x4096t,1x11008x4096t,4x11008x4096t,1x4096x11008t,4x4096x11008t,1x14336x4096t,4x14336x4096t,2x5003x3001t} \
    > "$out/time.log" 2>&1
echo "rc=$?"
python3 -c 'import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r["shape"], r["config"][:44], r["us"], "cublas", r["cublas_us"], r["ratio"],
          "| call", r.get("host_us"), r.get("torch_host_us"), "ok", r["ok"])' "$out/time.json"
cd ..
wait
step done
