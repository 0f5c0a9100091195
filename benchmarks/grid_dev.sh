#!/usr/bin/env bash
# One device call for GEMMs of few tiles (issue 17; run from the tree's root): makes gpurt
# importable (_device_site.sh), compiles the programs grid_dev.py uses in parallel, then (each
# step limited) the 128 x 64 tile checks against float64, the timings of every candidate next
# to cuBLAS (grid_dev.py time; JSON into OUTDIR), then compute-sanitizer memcheck and racecheck
# on `grid_dev.py sanitize`, and tests/test_gemm.py's wgmma, TF32 and split-K GPU tests with the
# time left. With --final: those tests first instead of the checks, memcheck only, and gemm's
# own choices timed.
# Usage: bash benchmarks/grid_dev.sh OUTDIR [--final]   (total limit: $TOTAL, 230 s)
set -u
out=${1:?OUTDIR}
total=${TOTAL:-230}
final=${2:-}
. "$(dirname "${BASH_SOURCE[0]}")/_device_site.sh"
export GPURT_GEMM_AUTOTUNE=0 PYTHONUNBUFFERED=1
cat "$out/smi.txt"
step precompile
timeout ${COMPILE_LIMIT:-80} python3 -P benchmarks/grid_dev.py precompile >> "$out/setup.log" 2>&1
echo "precompile rc=$?"; grep precompiled "$out/setup.log"
if [ "$final" = "--final" ]; then
    step pytest
    timeout ${TEST_LIMIT:-60} python3 -P -m pytest -p no:cacheprovider -q tests/test_gemm.py \
        -k "wgmma or tf32 or split" > "$out/pytest.log" 2>&1
    tail -n 2 "$out/pytest.log"; grep -E "^(FAILED|ERROR)" "$out/pytest.log" | head -10
    tools="memcheck"
else
    step check
    timeout ${CHECK_LIMIT:-40} python3 -P benchmarks/grid_dev.py check > "$out/check.log" 2>&1
    echo "check rc=$?"; grep -E "^FAIL|^checks:" "$out/check.log" | head -12
    tools="memcheck racecheck"
fi
step time
limit=$(( $(left) - ${SAN_MIN:-45} )); [ $limit -gt 10 ] || limit=10
extra=""; [ "$final" = "--final" ] && extra="--auto-only"
timeout $limit python3 -P benchmarks/grid_dev.py time $extra --json "$out/grid_time.json" > "$out/time.log" 2>&1
echo "time rc=$?"; grep -v "^{" "$out/time.log" | tail -n 22
step sanitizers
san="compute-sanitizer --report-api-errors no --error-exitcode 3"
for tool in $tools; do
    log="$out/san-$tool.log"
    GPURT_NO_CACHING=1 timeout ${SAN_LIMIT:-35} $san --tool $tool python3 -P benchmarks/grid_dev.py sanitize > "$log" 2>&1
    echo "$tool rc=$? $(grep -c ^PASS "$log") passed, $(grep -c ^FAIL "$log") failed: $(tail -n 1 "$log")"
done
if [ "$final" != "--final" ] && [ $(left) -gt 25 ]; then  # the GPU tests with the time left
    step pytest
    timeout $(( $(left) - 3 )) python3 -P -m pytest -p no:cacheprovider -q tests/test_gemm.py \
        -k "wgmma or tf32 or split" > "$out/pytest.log" 2>&1
    tail -n 2 "$out/pytest.log"; grep -E "^(FAILED|ERROR)" "$out/pytest.log" | head -10
fi
step done
