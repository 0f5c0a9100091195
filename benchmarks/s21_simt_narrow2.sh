# Session 21's check of the refit narrow-tile K-major rates where no sweep timed them: gemm's
# pick (the refit model) against the tiles the model picked before it, B given N x K, M = 1-8,
# 48, 128 x 1024 x 1024, kernel-only cold, tuner off, against cuBLAS fp32. ~60 s.
out=$OUT total=${TOTAL:-200}
source benchmarks/_device_site.sh
logs=$site/logs && mkdir -p "$logs"
cd benchmarks
step "time"
GPURT_GEMM_AUTOTUNE=0 timeout 170 python3 s19_mma.py --tag narrow2 --dtype fp32 --kernels simt \
    --repeat 10 --match "64x256x16;32x256;64x128x8" \
    --json "$out/time.json" --shapes \
1x4096x4096t,4x11008x4096t,8x4096x4096t,48x4096x4096t,48x11008x4096t,128x1024x1024t \
    > "$logs/time.log" 2>&1
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
