# Session 22: fp32 problems of a few tiles (127x257x61: 0.88 of cuBLAS in the published
# table), every simt tile at K splits 1-4 and gemm's pick, kernel-only cold against cuBLAS
# (s19_mma.py), plus s22_ab.py's host time per call after the C capture check. ~200 s.
out=$OUT total=${TOTAL:-300}
source benchmarks/_device_site.sh
cd benchmarks
step tiny
GPURT_GEMM_AUTOTUNE=0 timeout $(( $(left) - 80 )) python3 s19_mma.py --tag tiny --dtype fp32 \
    --kernels simt --splits 1,2,4 --repeat 20 --json "$out/tiny.json" \
    --shapes ${SHAPES:-127x257x61,127x257x61t,255x129x63,64x127x255,100x300x100} > "$out/tiny.log" 2>&1
echo "rc=$?"
grep -E "cublas .* \| pick" "$out/tiny.log"  # s19_mma.py's per-shape summary
step ab
for s in 97x4093x4099:fp32 1x4093x4099:fp32 16x4096x4096t:bf16; do
    GPURT_GEMM_AUTOTUNE=0 timeout 50 python3 s22_ab.py --shapes $s > "$out/ab1.log" 2>&1
    grep -E "==|us per call" "$out/ab1.log"; cat "$out/ab1.log" >> "$out/ab.log"
done
rm -f "$out/ab1.log"
step done
