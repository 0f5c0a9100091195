# Session 22: the published GEMM suite (bench_gemm.py) for DTYPES, and with DISPATCH=1 the
# host-path suite (bench_dispatch.py), their JSON into $OUT (merged and published from this
# machine afterwards: benchmarks/publish.py).
out=$OUT total=${TOTAL:-560}
source benchmarks/_device_site.sh
cd benchmarks
if [ -n "${DISPATCH:-}" ]; then
    step dispatch
    timeout 120 python3 bench_dispatch.py --json "$out/dispatch.json" > "$out/dispatch.log" 2>&1
    echo "dispatch rc=$?"
fi
step "gemm $DTYPES"
timeout $(( $(left) - 10 )) python3 bench_gemm.py --dtypes "$DTYPES" --json "$out/gemm-$TAG.json" \
    > "$out/gemm-$TAG.log" 2>&1
echo "gemm rc=$?"
python3 -c 'import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r["shape"], r["dtype"], r["config"][:34], "graph", r.get("graph_ratio"), "call",
          r.get("gpurt_call_us"), r.get("cublas_call_us"))' "$out/gemm-$TAG.json"
step done
