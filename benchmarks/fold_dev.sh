#!/usr/bin/env bash
# s13-col's one device call (issue 20; run from the tree's root): gpurt importable as
# scripts/gpu-check makes it (_device_site.sh), then, each step time-limited:
#   dev     bandwidth_dev.py --areas reduce: the s13 variants (main, both, staged, early,
#           main and both again) over the issue's shapes in float32/bfloat16/float16
#   trace   colsum_trace.py: block-by-block times of the shipped fold and the variants
#   tests   the GPU reduction tests (tests/test_elementwise*.py, test_bandwidth_cases.py)
#           beside memcheck, racecheck and synccheck over benchmarks/fold_sweep.py
# Results in OUTDIR: dev.json, trace.json, runs.tgz (every log, trace.npz).
# Usage: bash benchmarks/fold_dev.sh OUTDIR   (total limit: $TOTAL, 230 s)
set -u
out=${1:?OUTDIR}
total=${TOTAL:-230}
. "$(dirname "${BASH_SOURCE[0]}")/_device_site.sh"
logs="$out/logs"; mkdir -p "$logs"
pack() { tar -C "$out" -czf "$out/runs.tgz" logs; }
step dev
(cd benchmarks && PYTHONUNBUFFERED=1 timeout ${DEV_LIMIT:-95} python3 bandwidth_dev.py \
    --areas reduce --json "$out/dev.json") > "$logs/dev.log" 2>&1
echo "dev rc=$?"; pack
step trace
(cd benchmarks && PYTHONUNBUFFERED=1 timeout ${TRACE_LIMIT:-35} python3 colsum_trace.py \
    --variants 0:0,20480:0,0:1,20480:1 --json "$out/trace.json" --npz "$logs/trace.npz") \
    > "$logs/trace.log" 2>&1
echo "trace rc=$?"; pack
step tests
limit=$(left); [ $limit -gt 20 ] || limit=20
for tool in memcheck racecheck synccheck; do
    GPURT_NO_CACHING=1 timeout $limit compute-sanitizer --tool $tool --report-api-errors no \
        --print-limit 20 python3 -P benchmarks/fold_sweep.py > "$logs/$tool.log" 2>&1 &
done
timeout $limit python3 -P -m pytest -p no:cacheprovider -q -k \
    "sum or fold or split or column or tall or realign or reduc or count" \
    tests/test_elementwise.py tests/test_elementwise_planned.py tests/test_elementwise_folds.py \
    tests/test_bandwidth_cases.py > "$logs/pytest.log" 2>&1
echo "pytest rc=$?"; tail -n 3 "$logs/pytest.log"
wait
for tool in memcheck racecheck synccheck; do
    echo "$tool: $(grep -E 'calls:|fold sweep|SUMMARY' "$logs/$tool.log" | tr '\n' ' ')"
done
pack
step done
