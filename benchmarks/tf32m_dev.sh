#!/usr/bin/env bash
# One device call for TF32 decode tiles (session 9 s9-tf32m; run from the tree's root): makes
# gpurt importable (_device_site.sh), compiles the programs tf32m_dev.py and the tests use in
# parallel, then (each step limited) the timings against cuBLAS TF32 (JSON into OUTDIR), the
# GPU tests, compute-sanitizer memcheck and racecheck on `tf32m_dev.py sanitize`, and the
# TF32 tests of test_gemm.py with the time left.
# Usage: bash benchmarks/tf32m_dev.sh OUTDIR   (total limit: $TOTAL, 190 s)
set -u
out=${1:?OUTDIR}
total=${TOTAL:-190}
. "$(dirname "${BASH_SOURCE[0]}")/_device_site.sh"
export GPURT_GEMM_AUTOTUNE=0 PYTHONUNBUFFERED=1
cat "$out/smi.txt"
step precompile
timeout ${COMPILE_LIMIT:-45} python3 -P benchmarks/tf32m_dev.py precompile >> "$out/setup.log" 2>&1
echo "precompile rc=$?"; grep precompil "$out/setup.log"
step time
timeout ${TIME_LIMIT:-60} python3 -P benchmarks/tf32m_dev.py time --json "$out/tf32m_time.json" > "$out/time.log" 2>&1
echo "time rc=$?"; grep -v "^{" "$out/time.log" | tail -n 40
step pytest
timeout ${TEST_LIMIT:-30} python3 -P -m pytest -p no:cacheprovider -q tests/test_gemm_decode_tf32.py -k "not compile" \
    > "$out/pytest.log" 2>&1
echo "pytest rc=$?"; tail -n 2 "$out/pytest.log"; grep -E "^(FAILED|ERROR)" "$out/pytest.log" | head -10
step sanitizers
san="compute-sanitizer --report-api-errors no --error-exitcode 3"
for tool in memcheck racecheck; do
    log="$out/san-$tool.log"
    GPURT_NO_CACHING=1 timeout ${SAN_LIMIT:-18} $san --tool $tool python3 -P benchmarks/tf32m_dev.py sanitize > "$log" 2>&1
    echo "$tool rc=$? $(grep -c ^PASS "$log") passed, $(grep -c ^FAIL "$log") failed: $(tail -n 1 "$log")"
done
step pytest2
limit=$(( $(left) - 3 )); [ $limit -gt 5 ] || limit=5
timeout $limit python3 -P -m pytest -p no:cacheprovider -q tests/test_gemm.py tests/test_gemm_decode.py \
    -k "tf32 or gemms_own_choice_and_out_views" > "$out/pytest2.log" 2>&1
echo "pytest2 rc=$?"; tail -n 2 "$out/pytest2.log"; grep -E "^(FAILED|ERROR)" "$out/pytest2.log" | head -10
step done
