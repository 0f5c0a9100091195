# Session 22 review: after the last host-side and PlannedLaunch changes (launch attributes built
# once), the GPU tests of cooperative and cluster launches, compute-sanitizer over the session's
# sets, and gemm at shapes no sweep tuned, torch tensors in, one call and kernel-only, against
# torch / cuBLAS (s22_host.py).
out=$OUT total=${TOTAL:-330}
source benchmarks/_device_site.sh
export GPURT_GEMM_AUTOTUNE=0
san small memcheck 200 benchmarks/s22_small_san.py > "$out/san.txt" &
san nk memcheck 200 benchmarks/s22_nk_san.py >> "$out/san.txt" &
san nk racecheck 200 benchmarks/s22_nk_san.py >> "$out/san.txt" &
step tests
timeout 170 python3 -P -m pytest -q -n 10 --dist loadfile -p no:cacheprovider \
    tests/test_gemm_simt.py tests/test_planned_launch.py tests/test_gemm_decode.py \
    tests/test_gemm_wgmma_x.py tests/test_launch.py tests/test_gemm.py -k "not slow" \
    > "$out/pytest.log" 2>&1
echo "pytest rc=$?"; tail -n 1 "$out/pytest.log"; grep -E "^(FAILED|ERROR)" "$out/pytest.log" | head
cd benchmarks
step host
timeout 70 python3 s22_host.py --json "$out/host32.json" --profile none --repeat 20 \
    --shapes 1x5003x3001t,7x4099x2053,61x3001x5003,113x4097x4099t,3x8191x4093t \
    > "$out/host32.log" 2>&1; echo "rc=$?"; tail -n 5 "$out/host32.log"
timeout 50 python3 s22_host.py --json "$out/host16.json" --profile none --repeat 20 --dtype bf16 \
    --shapes 9x14336x4096t,37x8191x4099,128x5003x3001t > "$out/host16.log" 2>&1
echo "rc=$?"; tail -n 3 "$out/host16.log"
wait
cat "$out/san.txt"
step done
