# Session 20's first device call (issue 17): (1) the two test files session 19's last call
# ran under a limit too short to print pytest's summary (test_gemm_small.py,
# test_gemm_rowload.py, its first-call helper never run on a GPU); (2) exact fp32 at M = 97-127
# on rows of odd pitch (0.77 / 0.84 of cuBLAS): every simt tile at K splits 1-16, kernel-only
# cold; (3) bf16 / fp16 768^3's wgmma candidates; (4) bench_gemm's published table again.
out=$OUT total=${TOTAL:-580}
source benchmarks/_device_site.sh
step tests
timeout 200 python3 -P -m pytest -p no:cacheprovider -q -ra -n 8 tests/test_gemm_small.py \
    tests/test_gemm_rowload.py > "$out/pytest.log" 2>&1
echo "pytest: $(tail -n 1 "$out/pytest.log")"; grep -E "^(FAILED|ERROR)" "$out/pytest.log" | head
cd benchmarks
step fp32
timeout 150 python3 s19_mma.py --tag s20 --dtype fp32 --kernels simt --repeat 10 \
    --splits 1,2,3,4,6,8,12,16 --shapes 97x4093x4099,127x8191x2053,113x5003x3001t \
    --json "$out/simt.json" > "$out/simt.log" 2>&1; tail -n 2 "$out/simt.log"
step w768
for dt in bf16 fp16; do
    timeout 60 python3 s19_mma.py --tag s20 --dtype $dt --kernels wgmma --repeat 10 \
        --shapes 768x768x768,640x640x640,896x896x896 --json "$out/w768-$dt.json" \
        > "$out/w768-$dt.log" 2>&1; tail -n 1 "$out/w768-$dt.log"
done
step bench
timeout $(( $(left) - 15 )) python3 bench_gemm.py --json "$out/gemm.json" > "$out/bench.log" 2>&1
tail -n 3 "$out/bench.log"
step done
