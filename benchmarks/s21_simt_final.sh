# Session 21's last device call, on the final source: compute-sanitizer memcheck over
# s21_simt_san.py (every simt tile, odd shapes, offset views; split-K's partial room now taken
# from Call.partials) beside gemm's pick at fp32 shapes no sweep tuned (M 1-128, primes, B
# also given N x K): kernel-only cold and one eager call with torch tensors in (host path
# included), against cuBLAS / torch.matmul in the same process (s19_mma.py --host). ~120 s.
out=$OUT total=${TOTAL:-200}
source benchmarks/_device_site.sh
san final memcheck 150 benchmarks/s21_simt_san.py &
cd benchmarks
GPURT_GEMM_AUTOTUNE=0 timeout 140 python3 s19_mma.py --tag final --dtype fp32 --kernels simt \
    --only-chosen --host --repeat 20 --json "$out/time.json" --shapes \
1x4093x4099,7x4099x4099t,13x8191x2053,61x5003x3001t,97x4093x4099,113x6007x4001,128x4097x4097t \
    > "$out/time.log" 2>&1
echo "rc=$?"
python3 -c 'import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r["shape"], r["config"][:50], "graph", r["us"], "cublas", r["cublas_us"], r["ratio"],
          "| call", r.get("host_us"), "torch", r.get("torch_host_us"), "ok", r["ok"])' \
    "$out/time.json"
cd ..
wait
step done
