#!/usr/bin/env bash
# One device call for issue 17's output side and small M (benchmarks/padc_dev.py; run from the
# tree's root): makes gpurt importable (_device_site.sh), precompiles over 16 processes, runs
# the GEMM tests that cover the packed route (C copied back included), the big shapes' routes
# (`time`), the small-M kernels (`small`), then memcheck and racecheck over `sanitize`.
# Heuristics only (GPURT_GEMM_AUTOTUNE=0). Logs go to OUTDIR, packed into OUTDIR/runs.tgz.
# Usage: bash benchmarks/padc_dev.sh OUTDIR   (limit: $TOTAL, 232 s)
set -u
out=${1:?OUTDIR}
total=${TOTAL:-232}
. "$(dirname "${BASH_SOURCE[0]}")/_device_site.sh"
export GPURT_GEMM_AUTOTUNE=0 PYTHONUNBUFFERED=1
pack() { tar czf "${PACK_TO:-$out}/runs.tgz" -C "$out" --exclude runs.tgz . 2>/dev/null; }
step precompile
timeout ${PRE_LIMIT:-60} python3 -P benchmarks/padc_dev.py precompile > "$out/precompile.log" 2>&1
echo "precompile rc=$?"; tail -n 2 "$out/precompile.log"
step pytest
timeout ${TEST_LIMIT:-50} python3 -P -m pytest -p no:cacheprovider -q \
    tests/test_gemm_pack.py tests/test_gemm_workspace.py tests/test_gemm_planned.py \
    tests/test_gemm.py -k "(pack or workspace or planned or unaligned or transposes or alpha) and not compiles" \
    > "$out/pytest.log" 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|Error" "$out/pytest.log" | tail -n 15; pack
step time
timeout ${TIME_LIMIT:-38} python3 -P benchmarks/padc_dev.py time --json "$out/time.json" > "$out/time.log" 2>&1
echo "time rc=$?"; pack
step small
limit=$(( $(left) - 42 )); [ $limit -gt 45 ] && limit=45; [ $limit -gt 10 ] || limit=10
timeout $limit python3 -P benchmarks/padc_dev.py small --budget $(( limit - 8 )) --json "$out/small.json" > "$out/small.log" 2>&1
echo "small rc=$?"; pack
step sanitizers
san="compute-sanitizer --report-api-errors no --error-exitcode 3"
for tool in memcheck racecheck; do
    limit=$(( ($(left) - 3) / 2 )); [ $limit -gt 8 ] || limit=8
    [ $tool = racecheck ] && limit=$(( $(left) - 3 ))
    timeout $limit $san --tool $tool python3 -P benchmarks/padc_dev.py sanitize > "$out/san-$tool.log" 2>&1
    echo "$tool rc=$? $(grep -c PASS "$out/san-$tool.log") passed, $(grep -c FAIL "$out/san-$tool.log") failed: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/san-$tool.log" | tail -n 1)"
done
pack
step done
