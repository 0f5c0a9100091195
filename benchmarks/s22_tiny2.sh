# Session 22: the wave model's latency floor for problems under 2^24 multiply-adds (split K in
# slices of 2+ tiles): gemm's pick, 64 x 64 x 8 and 32 x 128 x 8 at K splits 1-16, kernel-only
# cold against cuBLAS, and the pick as one eager call with torch tensors against torch.matmul.
out=$OUT total=${TOTAL:-300}
source benchmarks/_device_site.sh
cd benchmarks
GPURT_GEMM_AUTOTUNE=0 timeout $(( $(left) - 20 )) python3 s19_mma.py --tag tiny2 --dtype fp32 \
    --kernels simt --match "64x64x8;32x128x8" --splits 1,2,4,8,16 --host --repeat 20 \
    --json "$out/tiny2.json" --shapes \
${SHAPES:-64x64x64,128x128x128,200x200x200,127x257x61,100x300x100,64x127x255,33x65x4097,127x257x61t} \
    > "$out/tiny2.log" 2>&1
echo "rc=$?"
grep -E "cublas .* \| pick" "$out/tiny2.log"  # s19_mma.py's per-shape summary
