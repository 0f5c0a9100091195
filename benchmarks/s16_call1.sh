#!/usr/bin/env bash
# Session 16's first device call (run from the tree's root; OUTDIR gets few files):
# cluster_cost_dev.py (what a cluster costs a launch, apart from the GEMM), then
# wgirr_dev.sh --set s16cs (the split cluster barrier on 192-row c2 tiles, on the held-stage
# 128 x 192 c2 ps and on 128 x 256 c2; test_gemm_lean's GPU tests; three sanitizers).
set -u
top=${1:?OUTDIR}
W=$(mktemp -d)
mkdir -p "$top/x"
(
    out=$W/cc; total=60; . benchmarks/_device_site.sh
    step cluster_cost
    timeout 50 python3 -P benchmarks/cluster_cost_dev.py --json "$top/cluster-cost.json" \
        > "$out/cc.log" 2>&1
    echo "cluster_cost rc=$?"; tail -n 4 "$out/cc.log"
    cp "$out/cc.log" "$top/cc.log"
)
SET=s16cs TOTAL=${GEMM_TOTAL:-330} AFTER_TIME=110 SAN_TOOLS="memcheck racecheck synccheck" \
    SAN_LIMIT=25 TESTS="tests/test_gemm_lean.py -m gpu" bash benchmarks/wgirr_dev.sh "$top/x"
ls -la "$top" "$top/x"
