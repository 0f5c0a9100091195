#!/usr/bin/env bash
# One device call for the TF32 wgmma GEMM and the 16-bit wgmma split-K (run from the tree's
# root): makes gpurt importable as scripts/gpu-check does, compiles every program the call uses
# in parallel into the disk cache, then (each step limited): tf32_dev.py's and
# decode_split_dev.py's checks against float64, tests/test_gemm.py's TF32 and wgmma GPU tests,
# compute-sanitizer memcheck on both `sanitize` sweeps (racecheck on the TF32 one), the timing
# tables against cuBLAS, and bench_gemm.py rows (tf32 and bf16, gemm's heuristic choice; JSON
# into OUTDIR) unless --no-bench.
# Usage: bash benchmarks/tf32_dev.sh OUTDIR [--no-bench]   (total limit: $TOTAL, 285 s)
set -u
out=${1:?OUTDIR}
total=${TOTAL:-285}
. "$(dirname "${BASH_SOURCE[0]}")/_device_site.sh"
export GPURT_GEMM_AUTOTUNE=0 PYTHONUNBUFFERED=1
cat "$out/smi.txt"
step precompile
timeout 70 python3 -P benchmarks/tf32_dev.py precompile >> "$out/setup.log" 2>&1 &
timeout 70 python3 -P benchmarks/decode_split_dev.py precompile >> "$out/setup.log" 2>&1 &
wait; grep precompiled "$out/setup.log"
step check
timeout ${CHECK_LIMIT:-45} python3 -P benchmarks/tf32_dev.py check > "$out/check.log" 2>&1
echo "tf32 check rc=$?"; grep -E "^FAIL|^checks:" "$out/check.log" | head -12
timeout 30 python3 -P benchmarks/decode_split_dev.py check > "$out/check-split.log" 2>&1
echo "split check rc=$?"; grep -E "^FAIL|^checks:" "$out/check-split.log" | head -12
step pytest
timeout ${TEST_LIMIT:-50} python3 -P -m pytest -p no:cacheprovider -q tests/test_gemm.py \
    -k "${GEMM_TESTS:-tf32 or wgmma_all}" > "$out/pytest.log" 2>&1
tail -n 2 "$out/pytest.log"; grep -E "^(FAILED|ERROR)" "$out/pytest.log" | head -10
step sanitizers
san="compute-sanitizer --report-api-errors no --error-exitcode 3"
for job in "tf32_dev memcheck" "decode_split_dev memcheck" "tf32_dev racecheck --quick"; do
    read -r script tool extra <<< "$job"
    log="$out/san-$script-$tool.log"
    GPURT_NO_CACHING=1 timeout ${SAN_LIMIT:-40} $san --tool $tool python3 -P benchmarks/$script.py sanitize $extra > "$log" 2>&1
    echo "$script $tool rc=$? $(grep -c ^PASS "$log") passed, $(grep -c ^FAIL "$log") failed: $(tail -n 1 "$log")"
done
step time
timeout 45 python3 -P benchmarks/tf32_dev.py time --json "$out/tf32_time.json" > "$out/time.log" 2>&1
echo "tf32 time rc=$?"; grep -v "^{" "$out/time.log" | tail -n 20
limit=$(( $(left) - ${BENCH_MIN:-35} )); [ $limit -gt 20 ] || limit=20
timeout $limit python3 -P benchmarks/decode_split_dev.py time --json "$out/split_time.json" > "$out/time-split.log" 2>&1
echo "split time rc=$?"; grep -v "^{" "$out/time-split.log" | tail -n 20
if [ "${2:-}" != "--no-bench" ]; then
    step bench
    limit=$(left); [ $limit -gt 10 ] || limit=10
    (cd benchmarks && timeout $limit python3 bench_gemm.py --dtypes tf32,bf16 \
        --shapes ${BENCH_SHAPES:-4096,8192,2048,1024,1000,3000x5000x2000,8192x8192x512,4096x4096x1024,128x4096x4096} \
        --json "$out/gemm_bench.json") > "$out/bench.log" 2>&1
    echo "bench rc=$?"; grep -E "^\{" "$out/bench.log" | cut -c1-150
fi
step done
