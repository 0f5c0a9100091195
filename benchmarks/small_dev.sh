#!/usr/bin/env bash
# One device call for small and odd GEMMs (issue 17; run from the tree's root): makes gpurt
# importable (_device_site.sh), compiles the programs small_dev.py uses in parallel, then (each
# step limited) the timings of every candidate next to cuBLAS (JSON into OUTDIR), the TF32
# decode rows several times over, the checks against float64, compute-sanitizer memcheck and
# racecheck on `small_dev.py sanitize`, and the GPU tests with the time left.
# Usage: bash benchmarks/small_dev.sh OUTDIR   (total limit: $TOTAL, 280 s)
set -u
out=${1:?OUTDIR}
total=${TOTAL:-280}
. "$(dirname "${BASH_SOURCE[0]}")/_device_site.sh"
export GPURT_GEMM_AUTOTUNE=0 PYTHONUNBUFFERED=1
cat "$out/smi.txt"
step precompile
timeout ${COMPILE_LIMIT:-100} python3 -P benchmarks/small_dev.py precompile >> "$out/setup.log" 2>&1
echo "precompile rc=$?"; grep precompil "$out/setup.log"
step time
timeout ${TIME_LIMIT:-60} python3 -P benchmarks/small_dev.py time --json "$out/small_time.json" > "$out/time.log" 2>&1
echo "time rc=$?"; grep -v "^{" "$out/time.log" | tail -n 50
step tf32
timeout ${TF32_LIMIT:-30} python3 -P benchmarks/small_dev.py tf32 --json "$out/tf32_time.json" > "$out/tf32.log" 2>&1
echo "tf32 rc=$?"; cat "$out/tf32.log"
step check
timeout ${CHECK_LIMIT:-30} python3 -P benchmarks/small_dev.py check > "$out/check.log" 2>&1
echo "check rc=$?"; grep -E "^FAIL|^checks:" "$out/check.log" | head -12
step sanitizers
san="compute-sanitizer --report-api-errors no --error-exitcode 3"
for tool in memcheck racecheck; do
    log="$out/san-$tool.log"
    GPURT_NO_CACHING=1 timeout ${SAN_LIMIT:-25} $san --tool $tool python3 -P benchmarks/small_dev.py sanitize > "$log" 2>&1
    echo "$tool rc=$? $(grep -c ^PASS "$log") passed, $(grep -c ^FAIL "$log") failed: $(tail -n 1 "$log")"
done
step pytest
limit=$(( $(left) - 3 )); [ $limit -gt 5 ] || limit=5
timeout $limit python3 -P -m pytest -p no:cacheprovider -q tests/test_gemm_small.py \
    tests/test_gemm.py -k "small or unaligned or test_shapes or transposes \
    or test_tf32 or alpha_beta or (compiles_without_spills and mma)" \
    > "$out/pytest.log" 2>&1
echo "pytest rc=$?"; tail -n 2 "$out/pytest.log"; grep -E "^(FAILED|ERROR)" "$out/pytest.log" | head -10
step done
