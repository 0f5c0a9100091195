#!/usr/bin/env bash
# Session 15's first device call (run from the tree's root; OUTDIR gets few files):
# bench_elementwise with its samecopy column (gpu-check), softmax's few-row tests on the
# launch_form refactor, ncu PM-sampling timelines of the one-wave bf16 softmax (64 and 300 rows
# of 200003), then wgirr_dev.sh --set s15c2 (the 64-row tiles of C^T in 2-CTA clusters).
set -u
top=${1:?OUTDIR}
W=$(mktemp -d)
mkdir -p "$W/ew" "$top/x"
timeout 100 scripts/gpu-check "$W/ew" --bench elementwise --bench-timeout 80 --deadline 90 \
    > "$W/ew/run.log" 2>&1
cp "$W/ew/bench.json" "$top/elementwise-bench.json" 2>/dev/null
(
    out=$W/ncu; total=190; . benchmarks/_device_site.sh
    step tests
    timeout 60 python3 -P -m pytest -q tests/test_softmax.py -k few_rows > "$out/tests.log" 2>&1
    tail -3 "$out/tests.log"
    for r in 64 300; do
        step "ncu $r"
        timeout 60 ncu --clock-control none -k regex:softmax_ --launch-skip 2 --launch-count 1 \
            --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
            --section WarpStateStats --section PmSampling -f -o "$out/ncu-$r" \
            python3 -P benchmarks/softmax_ncu_dev.py --rows $r --cols 200003 --dtype bfloat16 \
            > "$out/ncu-$r.log" 2>&1
        ncu -i "$out/ncu-$r.ncu-rep" --page raw --csv --print-metric-instances values \
            > "$out/raw-$r.csv" 2>/dev/null
        ncu -i "$out/ncu-$r.ncu-rep" --page details > "$out/details-$r.txt" 2>/dev/null
    done
)
tar czf "$top/ew-ncu.tgz" -C "$W" ew ncu
SET=s15c2 TOTAL=250 AFTER_TIME=60 TESTS="tests/test_gemm_swap.py -m gpu" \
    bash benchmarks/wgirr_dev.sh "$top/x"
ls -la "$top" "$top/x"
