# Session 21's device call for the simt wave model's unaligned rate (kernels/_gemm_simt_model.py:
# one factor for every tile, and none where A and B are both K-major), after split-K's partial
# rows became 16-byte aligned: kernel-only cold, tuner off, gemm's pick (the new model) against
# the 128 x 128 x 16 tile of 8 x 8 thread tiles (the old model's pick at these shapes, at the
# same split) and the 96 x 128 x 8 tile, against cuBLAS, on the shapes whose pick changed;
# then the GEMM CPU+GPU tests of the model. ~150 s.
out=$OUT total=${TOTAL:-300}
source benchmarks/_device_site.sh
logs=$site/logs && mkdir -p "$logs"
cd benchmarks
step "time"
GPURT_GEMM_AUTOTUNE=0 timeout 200 python3 s19_mma.py --tag model --dtype fp32 --kernels simt \
    --repeat 10 --match "128x128x16 s3 ;96x128x8" --json "$out/time.json" --shapes \
97x4093x4099,127x8191x2053,97x5003x2999,200x8191x2053,500x5003x2999,97x4099x4099,\
500x4099x4099,1023x4099x4099,97x3001x1999t,257x4093x4099t,1023x5003x2999t,2053x4093x4099t,\
500x1025x1027t,4099x4099x4099,2053x3001x1999 > "$logs/time.log" 2>&1
echo "rc=$?"; grep -E "Error|'ok': False" "$logs/time.log" | tail -n 5
python3 -c 'import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r["shape"], r["config"].replace("simt ", "")[:60], r["us"], "cublas", r["cublas_us"],
          r["ratio"])' "$out/time.json"
cd ..
step "tests"
timeout 90 python3 -P -m pytest -p no:cacheprovider -q -ra -n 6 tests/test_gemm.py \
    tests/test_gemm_simt.py tests/test_gemm_simt_pack.py > "$logs/pytest.log" 2>&1
echo "pytest rc=$?: $(tail -n 1 "$logs/pytest.log")"
grep -E "^(FAILED|ERROR)" "$logs/pytest.log" | head -n 20
step done
