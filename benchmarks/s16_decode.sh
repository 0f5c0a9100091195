#!/usr/bin/env bash
# Session 16's decode call (run from the tree's root): the split decode and skinny kernels'
# cluster barriers restricted to shared memory (gemm_common.cu's cluster_sync_shared): their GPU
# tests, compute-sanitizer memcheck / racecheck / synccheck over decode_dev.py's sanitize and
# race sweeps, then bench_gemm_decode (autotuner on) into OUTDIR/bench-decode.json. (Ran on
# 8a91048; that change was reverted, see notes_gemm.md session 16: reapply it with the acquire
# fence before the last barrier's arrive, then run this and regenerate the tuning table.)
set -u
top=${1:?OUTDIR}
out=$(mktemp -d)/w; total=${TOTAL:-420}; . benchmarks/_device_site.sh
export PYTHONPATH=$PYTHONPATH:$tree/benchmarks PYTHONUNBUFFERED=1
step tests
timeout 150 python3 -P -m pytest -p no:cacheprovider -q -n 4 tests/test_gemm_decode.py \
    tests/test_gemm_decode_tf32.py tests/test_gemm_skinny.py -m gpu > "$out/pytest.log" 2>&1
echo "pytest rc=$?"; tail -n 2 "$out/pytest.log"; grep -E "^(FAILED|ERROR)" "$out/pytest.log" | head
step sanitizers
for tool in memcheck racecheck synccheck; do
    for mode in sanitize race; do
        log="$out/san-$tool-$mode.log"
        timeout 40 compute-sanitizer --report-api-errors no --error-exitcode 3 --tool $tool \
            python3 -P benchmarks/decode_dev.py $mode > "$log" 2>&1
        echo "$tool $mode rc=$? $(grep -c ^PASS "$log") passed, $(grep -c ^FAIL "$log") failed: $(tail -n 1 "$log")"
    done
done
step bench
GPURT_GEMM_AUTOTUNE=1 timeout $(( $(left) - 10 )) python3 -P benchmarks/bench_gemm_decode.py \
    --json "$top/bench-decode.json" > "$out/bench.log" 2>&1
echo "bench rc=$?"; tail -n 5 "$out/bench.log"
tar czf "$top/decode-logs.tgz" -C "$(dirname "$out")" w
