#!/usr/bin/env bash
# Session 16's softmax call (run from the tree's root): the cluster rows' relaxed and
# shared-memory-restricted barriers. softmax_mid_dev.py --cluster-old (the picks from the
# source before, $OLD, against the shipped one), the softmax GPU tests and the suite's files
# the whole-suite run of this session did not reach (test_kernels_property, test_amp), then
# memcheck / racecheck / synccheck over softmax_cluster_san.py, then bench_softmax.
set -u
top=${1:?OUTDIR}
out=$(mktemp -d)/w; total=${TOTAL:-420}; . benchmarks/_device_site.sh
export PYTHONPATH=$PYTHONPATH:$tree/benchmarks PYTHONUNBUFFERED=1
step time
timeout 100 python3 -P benchmarks/softmax_mid_dev.py --cluster-old "${OLD:?}" \
    --json "$top/softmax-cluster.json" > "$out/time.log" 2>&1
echo "time rc=$?"; tail -n 14 "$out/time.log"
step tests
timeout 200 python3 -P -m pytest -p no:cacheprovider -q -n 8 tests/test_softmax.py \
    tests/test_softmax_ends.py tests/test_kernels_property.py tests/test_amp.py -m gpu \
    > "$out/pytest.log" 2>&1
echo "pytest rc=$?"; tail -n 2 "$out/pytest.log"; grep -E "^(FAILED|ERROR)" "$out/pytest.log" | head
step sanitizers
for tool in memcheck racecheck synccheck; do
    log="$out/san-$tool.log"
    timeout 40 compute-sanitizer --report-api-errors no --error-exitcode 3 --tool $tool \
        python3 -P benchmarks/softmax_cluster_san.py > "$log" 2>&1
    echo "$tool rc=$? $(grep -c ^PASS "$log") passed, $(grep -c ^FAIL "$log") failed: $(tail -n 1 "$log")"
done
step bench
if [ $(left) -gt 70 ]; then
    timeout $(( $(left) - 5 )) scripts/gpu-check "$out/bench" --bench softmax --bench-timeout 60 \
        --deadline 70 > "$out/bench.log" 2>&1
    echo "bench rc=$?"; cp "$out/bench/bench.json" "$top/bench-softmax.json" 2>/dev/null
fi
tar czf "$top/softmax-logs.tgz" -C "$(dirname "$out")" w
