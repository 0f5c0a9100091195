#!/usr/bin/env bash
# One device call for the skinny GEMM (run from the tree's root): makes gpurt importable as
# scripts/gpu-check does, compiles every variant the call uses in parallel into the disk cache,
# then (each step limited, the last ones taking what time is left): the skinny GPU tests and
# tests/test_gemm.py's GPU tests matching $GEMM_TESTS, compute-sanitizer (memcheck, racecheck,
# synccheck) on `skinny_dev.py sanitize`, the decode benchmark (bench_gemm_decode.py, JSON
# into OUTDIR) unless --no-bench, and `skinny_dev.py main` (checks, per-variant timings).
# Usage: bash benchmarks/skinny_dev.sh OUTDIR [--no-bench]   (total limit: $TOTAL, 340 s)
set -u
out=${1:?OUTDIR}
total=${TOTAL:-340}
. "$(dirname "${BASH_SOURCE[0]}")/_device_site.sh"
export GPURT_GEMM_AUTOTUNE=0
step precompile
timeout 75 python3 -P benchmarks/skinny_dev.py precompile >> "$out/setup.log" 2>&1; tail -n 1 "$out/setup.log"
step pytest
timeout ${TEST_LIMIT:-60} python3 -P -m pytest -p no:cacheprovider -q tests/test_gemm_skinny.py > "$out/pytest.log" 2>&1
tail -n 2 "$out/pytest.log"
if [ -n "${GEMM_TESTS:-}" ]; then  # tests/test_gemm.py's GPU tests matching this -k
    timeout ${TEST_LIMIT:-60} python3 -P -m pytest -p no:cacheprovider -q tests/test_gemm.py -k "$GEMM_TESTS" > "$out/pytest-gemm.log" 2>&1
    tail -n 2 "$out/pytest-gemm.log"
fi
step sanitizers
san="compute-sanitizer --report-api-errors no --error-exitcode 3"
for tool in memcheck racecheck synccheck; do
    timeout 30 $san --tool $tool python3 -P benchmarks/skinny_dev.py sanitize > "$out/san-$tool.log" 2>&1
    echo "$tool rc=$? $(grep -c PASS "$out/san-$tool.log") passed: $(tail -n 1 "$out/san-$tool.log")" >> "$out/san.txt"
done
cat "$out/san.txt"
if [ "${2:-}" != "--no-bench" ]; then
    step bench
    limit=$(( $(left) - ${DEV_MIN:-40} )); [ $limit -gt 20 ] || limit=20
    (cd benchmarks && GPURT_GEMM_AUTOTUNE=${BENCH_AUTOTUNE:-1} timeout $limit python3 bench_gemm_decode.py --json "$out/gemm_decode.json" ${BENCH_EXTRA:-}) > "$out/bench.log" 2>&1
    echo "bench rc=$?"
fi
step dev
limit=$(left); [ $limit -gt 10 ] || limit=10
timeout $limit python3 -P benchmarks/skinny_dev.py main --out "$out" > "$out/dev.log" 2>&1; echo "dev rc=$?"
step done
grep -E "^\{" "$out/bench.log" 2>/dev/null | python3 -c '
import sys, ast
for line in sys.stdin:
    r = ast.literal_eval(line)
    print(f"{r[\"shape\"]:>15} {r[\"dtype\"]:>8} {r[\"config\"][:34]:<34} g {r[\"gpurt_graph_us\"]:6.2f} c {r[\"cublas_graph_us\"]:6.2f} fl {r[\"copy_graph_us\"]:6.2f} x{r[\"ratio_graph\"]:.2f} | host g {r[\"gpurt_host_us\"]:6.2f} c {r[\"cublas_host_us\"]:6.2f} x{r[\"ratio_host\"]:.2f}")
'
tail -n 12 "$out/dev.log"
