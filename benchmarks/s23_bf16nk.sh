# Session 23: 16-bit x @ W.T on 16-byte aligned rows at M = 1-2: rowload's aligned dot-product
# path (forced) against gemm's pick and cuBLAS, kernel-only cold (s19_mma.py).
out=$OUT total=${TOTAL:-200}
source benchmarks/_device_site.sh
cd benchmarks
GPURT_GEMM_AUTOTUNE=0 timeout $(( $(left) - 10 )) python3 s19_mma.py --tag bf16nk --dtype bf16 \
    --kernels rowload --splits 1,2,4 --repeat 15 --json "$out/bf16nk.json" --shapes \
${SHAPES:-1x4096x4096t,1x11008x4096t,1x14336x4096t,1x4096x11008t,2x4096x4096t,2x11008x4096t} \
    > "$out/bf16nk.log" 2>&1
echo "rc=$?"
grep -E "cublas .* \| pick" "$out/bf16nk.log"
