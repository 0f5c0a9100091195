# Session 19, device call 3 (issue 17): the fp32 rowload kernel and the GEMM route chosen by
# the tuner's times. GPU tests of the touched families with the sanitizers over the fp32
# rowload tests beside them; then, alone on the GPU, every rowload / simt candidate at
# fp32 rows of B that are not 16-byte multiples (s19_mma.py, kernel-only cold, exact fp32 on
# both sides) and bench_gemm's untuned odd and prime shapes (autotuner on: each shape tuned
# at its first call, as a user's would be).
out=$OUT total=${TOTAL:-540}
source benchmarks/_device_site.sh
step tests
for tool in memcheck racecheck synccheck; do
    san f32 $tool 150 -m pytest -p no:cacheprovider -q tests/test_gemm_rowload.py -m gpu \
        -k "f32" &
done
timeout 170 python3 -P -m pytest -p no:cacheprovider -q -n 6 tests/test_gemm_rowload.py \
    tests/test_gemm_pack.py tests/test_gemm_simt.py tests/test_gemm_simt_pack.py \
    tests/test_gemm_rows.py tests/test_gemm_mma_unaligned.py -m gpu > "$out/pytest.log" 2>&1
echo "pytest: $(tail -n 1 "$out/pytest.log")"; grep -E "^(FAILED|ERROR)" "$out/pytest.log" | head
wait
step f32
(cd benchmarks && GPURT_GEMM_AUTOTUNE=0 timeout 100 python3 s19_mma.py --tag f32 --dtype fp32 \
    --kernels rowload,simt --json "$out/f32.json" \
    --shapes 1x5003x4099,1x4099x4099,2x4099x11003,4x4099x4099,3x11003x4093 \
    > "$out/f32.log" 2>&1)
grep -v "^{" "$out/f32.log" | tail -5
python3 -c "
import json
for r in json.load(open('$out/f32.json'))['rows']:
    print(r['shape'], r['config'], r['us'], r['cublas_us'], r['ratio'], r['ok'])"
step odd
(cd benchmarks && timeout $(( $(left) - 15 )) python3 bench_gemm.py --dtypes bf16,fp32 \
    --shapes 1x5003x4099,7x4099x11003,29x11003x4099,97x4093x4099,127x8191x2053,131x3001x1999 \
    --repeat 10 --json "$out/gemm-odd.json" > "$out/odd.log" 2>&1)
python3 -c "
import json
for r in json.load(open('$out/gemm-odd.json'))['rows']:
    print(r['shape'], r['dtype'], r['config'], r['ratio'], r.get('graph_ratio'), r['rel_err'])"
step done
