# Session 23: the published decode suite's exact fp32 x @ W.T rows (bench_gemm_decode.py
# --dtypes fp32 --weights nk, autotune on as published), merged into
# results/gemm_decode-nvidia-h100-80gb-hbm3.json afterwards.
out=$OUT total=${TOTAL:-300}
source benchmarks/_device_site.sh
cd benchmarks
step decode-fp32-nk
timeout $(( $(left) - 10 )) python3 bench_gemm_decode.py --dtypes fp32 --weights nk \
    --json "$out/dec32.json" > "$out/dec32.log" 2>&1
echo "rc=$?"
python3 -c 'import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r["shape"], r["config"][:34], "graph", r["gpurt_graph_us"], r["cublas_graph_us"],
          r["ratio_graph"], "host", r["ratio_host"], r["rel_err"])' "$out/dec32.json"
step done
