# Session 22 experiment: fp32 x @ W.T at M <= 4 with each warp reading contiguous runs of one
# row of W (benchmarks/s22_gemv/gemm_rowload.cu, CONTIG_J loads of 124 k a lane) against the
# landed 124-k step over 8 rows, one after another in one call (kernel cache keyed by source).
out=$OUT total=${TOTAL:-400}
source benchmarks/_device_site.sh
cd benchmarks
SH=${SHAPES:-1x4096x4096t,4x11008x4096t,1x14336x4096t,2x5003x3001t,1x4096x11008t}
for variant in landed 4 8 16; do
    if [ "$variant" != landed ]; then
        sed "s/#define CONTIG_J 4/#define CONTIG_J $variant/" s22_gemv/gemm_rowload.cu \
            > "$site/gpurt/kernels/gemm_rowload.cu"
    fi
    step "$variant"
    GPURT_GEMM_AUTOTUNE=0 timeout 100 python3 s19_mma.py --tag "$variant" --dtype fp32 \
        --kernels rowload --match "x64x124" --splits 1,2,4 --repeat 15 \
        --json "$out/gemv-$variant.json" --shapes "$SH" > "$out/gemv-$variant.log" 2>&1
    echo "rc=$?"
    python3 -c 'import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print("  ", r["shape"], r["config"][:30], r["us"], "cublas", r["cublas_us"], r["ratio"], "ok", r["ok"])' \
        "$out/gemv-$variant.json"
done
step done
