#!/usr/bin/env bash
# The second device call of small_dev (run from the tree's root): the small-problem rule's check
# (small_dev.py rule: gemm's choice against its choice without the rule, and the rivals, on
# sizes the first call did not time; TF32 16 x 4096^2 tilings), tests/test_gemm_small.py and
# the chooser's CPU tests, compute-sanitizer memcheck and racecheck on `small_dev.py sanitize`.
# Usage: bash benchmarks/small_rule.sh OUTDIR   (total limit: $TOTAL, 185 s)
set -u
out=${1:?OUTDIR}
total=${TOTAL:-185}
. "$(dirname "${BASH_SOURCE[0]}")/_device_site.sh"
export GPURT_GEMM_AUTOTUNE=0 PYTHONUNBUFFERED=1
cat "$out/smi.txt"
step precompile
timeout ${COMPILE_LIMIT:-50} python3 -P benchmarks/small_dev.py precompile --rule >> "$out/setup.log" 2>&1
echo "precompile rc=$?"; grep precompil "$out/setup.log"
step rule
timeout ${RULE_LIMIT:-60} python3 -P benchmarks/small_dev.py rule --json "$out/rule.json" > "$out/rule.log" 2>&1
echo "rule rc=$?"; grep -v "^{" "$out/rule.log" | tail -n 45
step sanitizers
san="compute-sanitizer --report-api-errors no --error-exitcode 3"
for tool in memcheck racecheck; do
    log="$out/san-$tool.log"
    GPURT_NO_CACHING=1 timeout ${SAN_LIMIT:-20} $san --tool $tool python3 -P benchmarks/small_dev.py sanitize > "$log" 2>&1
    echo "$tool rc=$? $(grep -c ^PASS "$log") passed, $(grep -c ^FAIL "$log") failed: $(tail -n 1 "$log")"
done
step pytest
limit=$(( $(left) - 3 )); [ $limit -gt 5 ] || limit=5
timeout $limit python3 -P -m pytest -p no:cacheprovider -q tests/test_gemm_small.py \
    tests/test_gemm.py -k "small or heuristic or candidates or fallbacks" > "$out/pytest.log" 2>&1
echo "pytest rc=$?"; tail -n 2 "$out/pytest.log"; grep -E "^(FAILED|ERROR)" "$out/pytest.log" | head -10
step done
