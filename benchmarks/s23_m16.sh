# Session 23, call 5: rowload's dot-product tiles for fp32 x @ W.T at 8 and 16 rows of A (every
# row of W's values first, then A a row at a time). The rowload GPU tests beside compute-
# sanitizer (memcheck, racecheck) over s22_nk_san.py, then kernel-only cold against cuBLAS
# and gemm's own pick (simt): each candidate at K splits 1-4 (s19_mma.py).
out=$OUT total=${TOTAL:-500}
source benchmarks/_device_site.sh
rowload_checks 200
step time
cd benchmarks
GPURT_GEMM_AUTOTUNE=0 timeout $(( $(left) - 15 )) python3 s19_mma.py --tag m16 --dtype fp32 \
    --kernels rowload --splits 1,2,4 --repeat 15 --json "$out/m16.json" --shapes \
${SHAPES:-16x11008x4096t,16x4096x4096t,8x4096x4096t,8x11008x4096t,16x14336x4096t,16x4096x11008t,12x4099x4099t,6x5003x3001t,5x4096x4096t} \
    > "$out/m16.log" 2>&1
echo "rc=$?"
grep -E "cublas .* \| pick" "$out/m16.log"
step done
