#!/usr/bin/env bash
# s14-col's device calls (issue 20; run from the tree's root): gpurt importable as
# scripts/gpu-check makes it (_device_site.sh), then, each step time-limited:
#   dev     bandwidth_dev.py --areas reduce: the s14 variants (main, tagged partials, the
#           fitted carveout, both, tagged with a polling sleep, main and tagged again) over
#           S14_SHAPES (skipped with AREAS=)
#   tests   $TESTS (default the tagged fold's) beside memcheck, racecheck and synccheck over
#           benchmarks/tagged_sweep.py (TAGGED=${TAGGED:-1}, TAGLOAD=${TAGLOAD:-relaxed}, the
#           early ticket; memcheck also with the late one)
# Results in OUTDIR: dev.json and logs/.
# Usage: bash benchmarks/col_dev.sh OUTDIR   (total limit: $TOTAL, 285 s)
set -u
out=${1:?OUTDIR}
total=${TOTAL:-285}
. "$(dirname "${BASH_SOURCE[0]}")/_device_site.sh"
logs="$out/logs"; mkdir -p "$logs"
if [ -n "${AREAS-reduce}" ]; then
    step dev
    (cd benchmarks && PYTHONUNBUFFERED=1 timeout ${DEV_LIMIT:-165} python3 bandwidth_dev.py \
        --areas "${AREAS-reduce}" --json "$out/dev.json") > "$logs/dev.log" 2>&1
    echo "dev rc=$?"
fi
step tests
limit=$(left); [ $limit -gt 20 ] || limit=20
for run in memcheck racecheck synccheck memcheck-late; do  # -late: TAGTICKET=late
    ticket=early; [ "$run" = memcheck-late ] && ticket=late
    TAGGED=${TAGGED:-1} TAGTICKET=$ticket TAGLOAD=${TAGLOAD:-relaxed} GPURT_NO_CACHING=1 \
        timeout $limit \
        compute-sanitizer --tool ${run%-late} --report-api-errors no --print-limit 20 \
        python3 -P benchmarks/tagged_sweep.py > "$logs/$run.log" 2>&1 &
done
timeout $limit python3 -P -m pytest -p no:cacheprovider -q ${PYTEST_ARGS-} \
    ${TESTS-tests/test_elementwise_tagged.py} > "$logs/pytest.log" 2>&1
echo "pytest rc=$?"; tail -n 3 "$logs/pytest.log"
wait
for tool in memcheck racecheck synccheck memcheck-late; do
    echo "$tool: $(grep -E 'calls:|tagged sweep|SUMMARY|Error' "$logs/$tool.log" | head -5 | tr '\n' ' ')"
done
step done
