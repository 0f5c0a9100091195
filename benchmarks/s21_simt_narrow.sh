# Session 21's device call for the wave model's K-major rates of the narrow simt tiles (after
# the K-major copies took 8 threads along K): kernel-only cold, tuner off, gemm's pick and the
# 32- and 64-row tiles at the model's split and at K splits 4, 8 and 16, B given N x K, M = 16-64
# times (4096, 11008, 14336) projections, against cuBLAS fp32. ~150 s.
out=$OUT total=${TOTAL:-200}
source benchmarks/_device_site.sh
logs=$site/logs && mkdir -p "$logs"
cd benchmarks
step "time"
GPURT_GEMM_AUTOTUNE=0 timeout 170 python3 s19_mma.py --tag narrow --dtype fp32 --kernels simt \
    --repeat 10 --match "32x128x8;32x256;64x64x8;64x128x8;64x256" --splits 4,8,16 \
    --json "$out/time.json" --shapes \
16x4096x4096t,32x4096x4096t,64x4096x4096t,16x11008x4096t,32x11008x4096t,64x11008x4096t,\
16x4096x11008t,32x14336x4096t,64x14336x4096t > "$logs/time.log" 2>&1
echo "rc=$?"; grep -E "Error|'ok': False" "$logs/time.log" | tail -n 5
python3 -c 'import json, sys
best = {}
for r in json.load(open(sys.argv[1]))["rows"]:
    if r["config"].endswith("*"):
        print(r["shape"], "pick", r["config"][5:60], r["us"], "cublas", r["cublas_us"], r["ratio"])
    elif r["us"] < best.get(r["shape"], (1e9,))[0]:
        best[r["shape"]] = (r["us"], r["config"][5:60], r["ratio"])
for shape, b in best.items():
    print(shape, "best", b)' "$out/time.json"
cd ..
step done
