#!/usr/bin/env bash
# One device call for the bandwidth kernels (run from the tree's root): makes gpurt importable
# as scripts/gpu-check does, then, each step time-limited: the benchmark suites named in
# $BENCHES (default random elementwise softmax; merged into OUTDIR/bench.json as gpu-check
# does, for benchmarks/publish.py), benchmarks/bandwidth_dev.py over $AREAS (variant timings,
# JSON into OUTDIR), the GPU tests of gpurt.random and tests/test_bandwidth_cases.py, and
# compute-sanitizer memcheck over the fill and reduction cases of scripts/sanitize_sweep.py's
# quick tier plus 16-bit backward softmax rows of 32k-64k elements at several offsets (each
# checked against float64).
# $BASELINE (optional): another tree (the one to compare with, e.g. the lead's checkout) whose
# benchmarks $BASE_BENCHES (default random) run first from its own gpurt (pure-Python
# launches), into OUTDIR/baseline-NAME.json and baseline.log.
# $TESTS: the GPU test files (default the random and bandwidth-case tests), run with
# $PYTEST_ARGS (default -x); $KINDS: the sweep's kinds under memcheck (default fill,reduce);
# $RACECHECK: kinds also run under racecheck, beside memcheck (default none); both with
# GPURT_NO_CACHING=1.
# Usage: bash benchmarks/bandwidth_dev.sh OUTDIR   (total limit: $TOTAL, 230 s)
set -u
out=${1:?OUTDIR}
total=${TOTAL:-230}
. "$(dirname "${BASH_SOURCE[0]}")/_device_site.sh"
if [ -n "${BASELINE-}" ]; then
    step baseline
    base=$(mktemp -d)
    cp -R "$BASELINE/gpurt" "$base/gpurt" && cp -R "$BASELINE/kernels" "$base/gpurt/kernels"
    for name in ${BASE_BENCHES-random}; do
        (cd "$BASELINE/benchmarks" && PYTHONPATH="$base:$site" GPURT_CACHE_DIR="$base/cache" \
            timeout ${BENCH_LIMIT:-60} python3 bench_$name.py --quick \
            --json "$out/baseline-$name.json") >> "$out/baseline.log" 2>&1
        echo "baseline $name rc=$?"
    done
fi
step bench
stage="$site/stage" runs="$site/runs.tsv"
mkdir -p "$stage"; : > "$runs"
for name in ${BENCHES-random elementwise softmax}; do
    s0=$SECONDS; rc=0
    echo "==== bench_$name" >> "$out/bench.log"
    GPURT_BENCH_OUT="$stage" timeout -k 5 ${BENCH_LIMIT:-60} python3 benchmarks/bench_$name.py \
        >> "$out/bench.log" 2>&1 < /dev/null || rc=$?
    case "$rc" in 0) status=ok ;; 124|137) status=timeout ;; *) status=failed ;; esac
    printf 'bench_%s\t%s\t%s\t%s\n' "$name" "$rc" $((SECONDS - s0)) "$status" >> "$runs"
    echo "bench_$name $status $((SECONDS - s0)) s"
done
python3 scripts/gpu_check_report.py bench "$out" --stage "$stage" --runs "$runs" > /dev/null 2>&1 || echo "bench.json failed"
cp "$stage"/*.json "$out/" 2>/dev/null  # each suite's own results file too
if [ -n "${AREAS-reduce,softmax}" ]; then
    step dev
    (cd benchmarks && timeout ${DEV_LIMIT:-45} python3 bandwidth_dev.py --areas "${AREAS-reduce,softmax}" --json "$out/dev.json") > "$out/dev.log" 2>&1
    echo "dev rc=$?"
fi
step pytest
timeout ${TEST_LIMIT:-60} python3 -P -m pytest -p no:cacheprovider -q ${PYTEST_ARGS--x} \
    ${TESTS-tests/test_random_gpu.py tests/test_random_graphs.py tests/test_bandwidth_cases.py} \
    > "$out/pytest.log" 2>&1
echo "pytest rc=$?"; tail -n 3 "$out/pytest.log"
step memcheck
limit=$(left); [ $limit -gt 10 ] || limit=10
san="compute-sanitizer --tool memcheck --report-api-errors no --print-limit 20"
if [ -n "${RACECHECK-}" ]; then  # racecheck over the same sweep's $RACECHECK kinds, beside memcheck
    GPURT_NO_CACHING=1 timeout $limit compute-sanitizer --tool racecheck --report-api-errors no \
        --print-limit 20 python3 -P scripts/sanitize_sweep.py --cases quick --kinds $RACECHECK \
        > "$out/racecheck.log" 2>&1 &
    race=$!
fi
# every array its own allocation (as sanitize_sweep.py's own runs): a read past a view's end
# is past its allocation's
GPURT_NO_CACHING=1 timeout $limit $san python3 -P scripts/sanitize_sweep.py --cases quick --kinds ${KINDS-fill,reduce} > "$out/memcheck.log" 2>&1
echo "memcheck ${KINDS-fill,reduce} rc=$?"; tail -n 2 "$out/memcheck.log"
if [ -n "${RACECHECK-}" ]; then
    wait $race
    echo "racecheck $RACECHECK rc=$?"; tail -n 2 "$out/racecheck.log"
fi
[ "${MEMCHECK_SOFTMAX-1}" = 1 ] || { step done; exit 0; }
limit=$(left); [ $limit -gt 10 ] || limit=10
timeout $limit $san python3 -P -c '
import sys; sys.path.insert(0, "tests")
import numpy as np
from _kernel_cases import SoftmaxCase, run_softmax
rng = np.random.default_rng(3)
for dtype in ("bfloat16", "float16"):
    for op in ("softmax_backward", "log_softmax_backward"):
        for cols in (32769, 50257, 65536):
            for offsets in ((0, 0, 0), (1, 1, 1), (1, 3, 1)):
                run_softmax(SoftmaxCase(op, dtype, 2, cols, offsets, given_out=True), rng)
print("softmax cases: pass")' > "$out/memcheck-softmax.log" 2>&1
echo "memcheck softmax rc=$?"; tail -n 2 "$out/memcheck-softmax.log"
step done
