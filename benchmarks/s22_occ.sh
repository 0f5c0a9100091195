# Session 22 experiment: fp32 x @ W.T at M = 1 on rowload's dot products with 3 or 4 CTAs an SM
# (__launch_bounds__(256, OCC) for MT = 1: 70 / 64 registers, no spills) against the landed 2,
# at K splits 2-12, one after another in one call (the kernel cache is keyed by source).
out=$OUT total=${TOTAL:-300}
source benchmarks/_device_site.sh
cd benchmarks
SH=${SHAPES:-1x4096x4096t,1x14336x4096t,1x11008x4096t,1x4096x11008t,1x4099x4099t}
for occ in 2 3 4; do
    python3 - "$occ" "$tree/kernels/gemm_rowload.cu" "$site/gpurt/kernels/gemm_rowload.cu" <<'PY'
import sys
occ, src, dst = sys.argv[1:]
s = open(src).read()
for name in ("gemm_rowload_nk(", "gemm_rowload_nk_splitk("):
    old = "__launch_bounds__(256, 2)\n" + name
    assert s.count(old) == 1
    s = s.replace(old, f"__launch_bounds__(256, MT == 1 && is_f32(DT) ? {occ} : 2)\n" + name)
open(dst, "w").write(s)
PY
    step "occ $occ"
    GPURT_GEMM_AUTOTUNE=0 timeout 70 python3 s19_mma.py --tag "occ$occ" --dtype fp32 \
        --kernels rowload --match "1x64x124" --splits 2,4,6,8,12 --repeat 15 \
        --json "$out/occ-$occ.json" --shapes "$SH" > "$out/occ-$occ.log" 2>&1
    echo "rc=$?"
    python3 -c 'import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print("  ", r["shape"], r["config"][:30], r["us"], "cublas", r["cublas_us"], r["ratio"], "ok", r["ok"])' \
        "$out/occ-$occ.json"
done
step done
