# Session 22: gemm's torch-tensor intake piece by piece (s22_intake.py), fp32 and bf16.
out=$OUT total=${TOTAL:-200}
source benchmarks/_device_site.sh
which perf py-spy gdb 2>&1 | head -3; nproc; lscpu | grep -i "model name"
cd benchmarks
for case in "97x4093x4099 fp32" "16x4096x4096t bf16" "1024x1024x1024 fp32"; do
    set -- $case
    step "$1 $2"
    GPURT_GEMM_AUTOTUNE=0 timeout 60 python3 s22_intake.py --shape $1 --dtype $2 2>&1 \
        | tee "$out/intake-$1-$2.log"
done
step done
