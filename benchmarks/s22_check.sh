# Session 22: gemm's host path after the C key and the C cooperative launch: the tests that
# touch it, then s22_ab.py (torch tensors vs Arrays vs torch.matmul, host time per call) and
# s22_host.py (one eager call between events, kernel-only beside it), tuner off.
out=$OUT total=${TOTAL:-400}
source benchmarks/_device_site.sh
step tests
timeout 200 python3 -P -m pytest -q -n 8 -p no:cacheprovider tests/test_gemm.py \
    tests/test_gemm_simt.py tests/test_planned_launch.py tests/test_kernel_plans.py \
    tests/test_softmax.py -k "${TESTS_K:-not slow}" > "$out/pytest.log" 2>&1
echo "pytest rc=$?"; tail -n 3 "$out/pytest.log"; grep -E "^(FAILED|ERROR)" "$out/pytest.log" | head
cd benchmarks
step ab
for s in 1024x1024x1024:fp32 97x4093x4099:fp32 1x4093x4099:fp32 16x4096x4096t:bf16 \
         4096x4096x4096:bf16; do
    GPURT_GEMM_AUTOTUNE=0 timeout 60 python3 s22_ab.py --shapes $s > "$out/ab1.log" 2>&1
    grep -E "==|us per call" "$out/ab1.log"; cat "$out/ab1.log" >> "$out/ab.log"
done
step host
GPURT_GEMM_AUTOTUNE=0 timeout $(( $(left) - 10 )) python3 s22_host.py --json "$out/host.json" \
    --shapes 1x4093x4099,13x8191x2053,97x4093x4099,128x4097x4097t,1024x1024x1024 \
    --profile none > "$out/host.log" 2>&1
echo "rc=$?"; tail -n 5 "$out/host.log"
rm -f "$out/ab1.log" "$out/host.json"
step done
