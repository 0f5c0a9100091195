# Session 23, call 3: run_nk's two compile-time paths (16-byte aligned rows of W: 32 lanes a
# load; any others: HEAD's code). The rowload GPU tests beside compute-sanitizer (memcheck,
# racecheck) over s22_nk_san.py, then s23_ab.py: HEAD's gemm_rowload against this tree's in
# one process.
out=$OUT total=${TOTAL:-560}
source benchmarks/_device_site.sh
rowload_checks 200
step ab
cd benchmarks
GPURT_GEMM_AUTOTUNE=0 timeout $(( $(left) - 15 )) python3 s23_ab.py --json "$out/ab.json" \
    > "$out/ab.log" 2>&1
echo "ab rc=$?"; tail -n 2 "$out/ab.log" | cut -c1-300
python3 -c 'import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r["shape"], "cublas", r["cublas_us"], "new", r["new"], "old", r["old"], r["all"])' "$out/ab.json"
step done
