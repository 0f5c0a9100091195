#!/usr/bin/env bash
# Session 12's one device call for 16-bit column sums (s12-col16), from the tree's root: makes
# gpurt importable (_device_site.sh), then, each step time-limited: bandwidth_dev.py's reduce
# area (REDUCE_VARIANTS: the defaults, the wide cap, its vector fold, the walks alone, 8-byte
# aligned loads, the defaults again; torch and the copy rate in the same process) into
# OUTDIR/dev.json; the GPU tests of the reductions; then compute-sanitizer memcheck, racecheck
# and synccheck side by side over benchmarks/col16_sweep.py with the wide cap and the vector
# fold on (GPURT_NO_CACHING=1: every array its own allocation).
# Usage: bash benchmarks/col16_dev.sh OUTDIR   (total limit: $TOTAL, 225 s)
set -u
out=${1:?OUTDIR}
total=${TOTAL:-225}
. "$(dirname "${BASH_SOURCE[0]}")/_device_site.sh"
step dev
(cd benchmarks && timeout ${DEV_LIMIT:-90} python3 bandwidth_dev.py --areas reduce \
    --json "$out/dev.json") > "$out/dev.log" 2>&1
echo "dev rc=$?"; grep -c '"pct_copy"' "$out/dev.log"
step pytest
timeout ${TEST_LIMIT:-70} python3 -P -m pytest -p no:cacheprovider -q -x \
    tests/test_elementwise_wide.py tests/test_bandwidth_cases.py tests/test_elementwise.py \
    tests/test_elementwise_planned.py \
    -k "not fill and (wide or reduc or sum or fold or column or split or tall or ticket or realign or bandwidth)" \
    > "$out/pytest.log" 2>&1
echo "pytest rc=$?"; tail -n 3 "$out/pytest.log"
step sanitizers
limit=$(left); [ $limit -gt 10 ] || limit=10
knobs="reduction.COLUMN_WIDE_MIN_BLOCKS=6 reduction.FOLD_VECTOR=True"
for tool in memcheck racecheck synccheck; do
    GPURT_NO_CACHING=1 timeout $limit compute-sanitizer --tool $tool --report-api-errors no \
        --print-limit 20 python3 -P benchmarks/col16_sweep.py $knobs > "$out/$tool.log" 2>&1 &
done
wait
for tool in memcheck racecheck synccheck; do
    echo "$tool: $(grep -E '^calls:|SUMMARY' "$out/$tool.log" | tr '\n' ' ')"
done
step done
