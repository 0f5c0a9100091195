#!/usr/bin/env bash
# One device call for the packed route (kernels/_gemm_pack.py; run from the tree's root): makes
# gpurt importable (_device_site.sh), precompiles the TMA kernels over 16 processes, runs the
# GEMM tests that cover the route, the kernel-only route table (`padrows_dev.py time`), then
# memcheck and racecheck on `padrows_dev.py sanitize` with the time left. Heuristics only
# (GPURT_GEMM_AUTOTUNE=0): the tuner would compile every candidate. Logs go to OUTDIR;
# runs.tgz (in $PACK_TO, default OUTDIR) packs them.
# Usage: bash benchmarks/padrows_dev.sh OUTDIR   (limit: $TOTAL, 235 s)
set -u
out=${1:?OUTDIR}
total=${TOTAL:-235}
. "$(dirname "${BASH_SOURCE[0]}")/_device_site.sh"
export GPURT_GEMM_AUTOTUNE=0 PYTHONUNBUFFERED=1
pack() { tar czf "${PACK_TO:-$out}/runs.tgz" -C "$out" --exclude runs.tgz . 2>/dev/null; }
step precompile
timeout ${PRE_LIMIT:-45} python3 -P benchmarks/padrows_dev.py precompile > "$out/precompile.log" 2>&1
echo "precompile rc=$?"; tail -n 2 "$out/precompile.log"
step pytest
timeout ${TEST_LIMIT:-55} python3 -P -m pytest -p no:cacheprovider -q \
    tests/test_gemm_pack.py tests/test_gemm_workspace.py tests/test_gemm_planned.py \
    tests/test_gemm.py -k "(pack or workspace or planned or unaligned or tf32 or transposes or alpha or shapes) and not compiles" \
    > "$out/pytest.log" 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|Error" "$out/pytest.log" | tail -n 12; pack
step time
limit=$(( $(left) - 45 )); [ $limit -gt ${TIME_MAX:-80} ] && limit=${TIME_MAX:-80}; [ $limit -gt 10 ] || limit=10
timeout $limit python3 -P benchmarks/padrows_dev.py time --json "$out/time.json" > "$out/time.log" 2>&1
echo "time rc=$?"; grep -vE '^\{' "$out/time.log" | tail -n 24
pack
step sanitizers
san="compute-sanitizer --report-api-errors no --error-exitcode 3"
for tool in memcheck racecheck; do
    limit=$(( ($(left) - 4) / 2 )); [ $limit -gt 8 ] || limit=8
    timeout $limit $san --tool $tool python3 -P benchmarks/padrows_dev.py sanitize > "$out/san-$tool.log" 2>&1
    echo "$tool rc=$? $(grep -c PASS "$out/san-$tool.log") passed, $(grep -c FAIL "$out/san-$tool.log") failed: $(tail -n 1 "$out/san-$tool.log")"
done
pack
step done
