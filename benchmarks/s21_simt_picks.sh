# Session 21's device calls for the simt wave model's choices (kernels/_gemm_simt_model.py):
# kernel-only cold, tuner off, gemm's pick (*) and the simt candidates whose labels contain one
# of MATCH's ';'-separated texts (each at the model's split, and at SPLITS too), at SHAPES
# (MxNxK, t: B given N x K), against cuBLAS fp32 in the same process; rows in time.json, the
# pick and the fastest other config per shape printed. Session 21 ran it four times:
#   TAG=model  MATCH="128x128x16 s3 ;96x128x8"  (the unaligned rate; 15 shapes)
#   TAG=kmajor MATCH="96x128x8;128x128x16 w32x128;64x256x16;128x128x16 s3 ;64x128x8"
#   TAG=narrow MATCH="32x128x8;32x256;64x64x8;64x128x8;64x256" SPLITS=4,8,16
#   TAG=narrow2 MATCH="64x256x16;32x256;64x128x8"
# (the shapes: results/gemm-simt-{pitch,kmajor96,narrow,narrow2}-s21-nvidia-h100.json).
out=$OUT total=${TOTAL:-200}
source benchmarks/_device_site.sh
logs=$site/logs && mkdir -p "$logs"
cd benchmarks
step "time"
GPURT_GEMM_AUTOTUNE=0 timeout $(($(left) - 10)) python3 s19_mma.py --tag "${TAG:-picks}" \
    --dtype fp32 --kernels simt --repeat 10 --match "$MATCH" --splits "${SPLITS:-}" \
    --json "$out/time.json" --shapes "$SHAPES" > "$logs/time.log" 2>&1
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
