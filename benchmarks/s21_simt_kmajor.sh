# Session 21's device call for the simt wave model's 96 x 128 x 8 tile on K-major B
# (kernels/_gemm_simt_model.py's _RATE_B_KMAJOR, 0.5 -> 0.8: session 21 timed it at 0.86 of the
# pick's time at 257 x 4093 x 4099 with B given N x K, 1.05-1.5x elsewhere): kernel-only cold,
# tuner off, gemm's pick (the new model) against the tiles the old model picked at the shapes
# whose pick changed (each at the split its rate gives), against cuBLAS. ~90 s.
out=$OUT total=${TOTAL:-200}
source benchmarks/_device_site.sh
logs=$site/logs && mkdir -p "$logs"
cd benchmarks
step "time"
GPURT_GEMM_AUTOTUNE=0 timeout 150 python3 s19_mma.py --tag kmajor --dtype fp32 --kernels simt \
    --repeat 10 --match "96x128x8;128x128x16 w32x128;64x256x16;128x128x16 s3 ;64x128x8" \
    --json "$out/time.json" --shapes \
96x4096x4096t,129x4096x4096t,160x11008x4096t,192x4096x11008t,257x4096x4096t,257x14336x4096t,\
129x1000x1000t,192x3001x1999t,1500x1024x1024t,257x4093x4099t > "$logs/time.log" 2>&1
echo "rc=$?"; grep -E "Error|'ok': False" "$logs/time.log" | tail -n 5
python3 -c 'import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r["shape"], r["config"].replace("simt ", "")[:60], r["us"], "cublas", r["cublas_us"],
          r["ratio"])' "$out/time.json"
cd ..
step done
