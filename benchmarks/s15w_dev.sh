#!/usr/bin/env bash
# s15-soft1w's device call (issue 17, the one-wave 16-bit softmax; run from the tree's root):
# softmax_edges_dev.py --routes --set s15w (softmax_ticket's TUNE knobs against the pick and
# the copy), the GPU test of the tuned variants, compute-sanitizer memcheck (every tuned
# variant), racecheck and synccheck (bf16) over that test, then, time left, an ncu timeline
# of the tuned ticket chunks (TUNE 7) at 64 x 200003 bf16.
#     bash benchmarks/s15w_dev.sh OUTDIR   (TOTAL: seconds, default 280)
set -u
out=${1:?OUTDIR}
total=${TOTAL:-280}
. benchmarks/_device_site.sh
step routes
timeout $(($(left) - 120)) python3 -P benchmarks/softmax_edges_dev.py --routes --set s15w --warm \
    --json "$out/s15w.json" > "$out/routes.log" 2>&1
echo "routes rc=$?"
grep -A 200 "^copy " "$out/routes.log" || tail -5 "$out/routes.log"
step tests
timeout 60 python3 -P -m pytest -q -p no:cacheprovider tests/test_softmax.py -k tuned \
    > "$out/tests.log" 2>&1
tail -3 "$out/tests.log"
san="compute-sanitizer --report-api-errors no --error-exitcode 3"
for tool in memcheck racecheck synccheck; do
    step "$tool"
    k="tuned_ticket"
    [ "$tool" = memcheck ] || k="tuned_ticket and bfloat16"
    timeout $(($(left) > 45 ? 40 : $(left) - 5)) $san --tool "$tool" python3 -P -m pytest -q \
        -p no:cacheprovider tests/test_softmax.py -k "$k" > "$out/san-$tool.log" 2>&1
    echo "$tool rc=$?"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" "$out/san-$tool.log" | tail -3
done
if [ "$(left)" -gt 40 ]; then
    step "ncu tune 7"
    timeout $(($(left) - 5)) ncu --clock-control none -k regex:softmax_ --launch-skip 2 \
        --launch-count 1 --section SpeedOfLight --section PmSampling -f -o "$out/ncu-t7" \
        python3 -P benchmarks/softmax_ncu_dev.py --rows 64 --cols 200003 --dtype bfloat16 \
        --tune 7 > "$out/ncu-t7.log" 2>&1
    ncu -i "$out/ncu-t7.ncu-rep" --page raw --csv --print-metric-instances values \
        > "$out/raw-t7.csv" 2>/dev/null && python3 benchmarks/ncu_timeline.py "$out/raw-t7.csv"
    ncu -i "$out/ncu-t7.ncu-rep" --page details 2>/dev/null | grep -E "Duration|Elapsed|SM Active"
    rm -f "$out/ncu-t7.ncu-rep"
fi
step done
