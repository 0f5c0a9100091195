#!/usr/bin/env bash
# One device call for issue 17's row-streaming kernel (benchmarks/rowload_dev.py; run from the
# tree's root): makes gpurt importable (_device_site.sh), precompiles over 16 processes, checks
# forced configs against float64, runs tests/test_gemm_rowload.py (GPU) and the packed route's
# tests, times the small-M shapes (`time`), then memcheck and racecheck over `sanitize`.
# Heuristics only (GPURT_GEMM_AUTOTUNE=0). Logs go to OUTDIR, packed into OUTDIR/runs.tgz.
# Usage: bash benchmarks/rowload_dev.sh OUTDIR   (limit: $TOTAL, 285 s)
set -u
out=${1:?OUTDIR}
total=${TOTAL:-285}
. "$(dirname "${BASH_SOURCE[0]}")/_device_site.sh"
export GPURT_GEMM_AUTOTUNE=0 PYTHONUNBUFFERED=1
pack() { tar czf "${PACK_TO:-$out}/runs.tgz" -C "$out" --exclude runs.tgz . 2>/dev/null; }
step precompile
timeout ${PRE_LIMIT:-70} python3 -P benchmarks/rowload_dev.py precompile > "$out/precompile.log" 2>&1
echo "precompile rc=$?"; tail -n 3 "$out/precompile.log"
step check
timeout ${CHECK_LIMIT:-40} python3 -P benchmarks/rowload_dev.py check > "$out/check.log" 2>&1
echo "check rc=$? $(grep -c PASS "$out/check.log") passed, $(grep -c FAIL "$out/check.log") failed"
grep FAIL "$out/check.log" | head -n 5; tail -n 2 "$out/check.log"; pack
step pytest
timeout ${TEST_LIMIT:-55} python3 -P -m pytest -p no:cacheprovider -q -x \
    tests/test_gemm_rowload.py tests/test_gemm_pack.py -k "not compile" \
    > "$out/pytest.log" 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|Error" "$out/pytest.log" | tail -n 12; pack
step time
limit=$(( $(left) - 45 )); [ $limit -gt 90 ] && limit=90; [ $limit -gt 15 ] || limit=15
timeout $limit python3 -P benchmarks/rowload_dev.py time --budget $(( limit - 12 )) --json "$out/time.json" > "$out/time.log" 2>&1
echo "time rc=$?"; pack
step sanitizers
san="compute-sanitizer --report-api-errors no --error-exitcode 3"
for tool in memcheck racecheck; do
    limit=$(( ($(left) - 3) / 2 )); [ $limit -gt 8 ] || limit=8
    [ $tool = racecheck ] && limit=$(( $(left) - 3 ))
    timeout $limit $san --tool $tool python3 -P benchmarks/rowload_dev.py sanitize > "$out/san-$tool.log" 2>&1
    echo "$tool rc=$? $(grep -c PASS "$out/san-$tool.log") passed, $(grep -c FAIL "$out/san-$tool.log") failed: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/san-$tool.log" | tail -n 1)"
done
pack
step done
