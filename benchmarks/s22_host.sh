# Session 22: where one eager gemm call's time goes (s22_host.py), fp32 and bf16, tuner off.
out=$OUT total=${TOTAL:-300}
source benchmarks/_device_site.sh
cd benchmarks
step fp32
GPURT_GEMM_AUTOTUNE=0 timeout $(( $(left) - 100 )) python3 s22_host.py --json "$out/fp32.json" \
    --shapes ${FP32:-1x4093x4099,13x8191x2053,97x4093x4099,61x5003x3001t,128x4097x4097t,1024x1024x1024} \
    --profile ${PROFILE:-97x4093x4099,1x4093x4099} > "$out/fp32.log" 2>&1
echo "rc=$?"; tail -n 8 "$out/fp32.log"
step bf16
GPURT_GEMM_AUTOTUNE=0 timeout $(( $(left) - 10 )) python3 s22_host.py --json "$out/bf16.json" \
    --dtype bf16 --shapes ${BF16:-1x4096x4096t,16x4096x4096t,128x4096x4096t,4096x4096x4096} \
    --profile 16x4096x4096t > "$out/bf16.log" 2>&1
echo "rc=$?"; tail -n 5 "$out/bf16.log"
step done
