#!/usr/bin/env bash
# The second device call for s11-simt (run from the tree's root), redoing what the first lost
# to a stale harness (simt_s10_dev.py's label helper): the heuristic's fp32 picks at session
# 11's shapes against cuBLAS cold, warm and single calls (simt_s11_dev.py time), the GPU
# tests of the tuner's keys, forced tiles/splits near the picks (configs), then the stall reasons
# of one warm 1000^3 call of ours (cuBLAS's grid: 64 x 128 x 8, 128 CTAs) and of cuBLAS's.
# Usage: bash benchmarks/simt_s11_check.sh OUTDIR   (total limit: $TOTAL, 112 s)
set -u
out=${1:?OUTDIR}
total=${TOTAL:-112}
. "$(dirname "${BASH_SOURCE[0]}")/_device_site.sh"
export GPURT_GEMM_AUTOTUNE=0
dev="python3 -P benchmarks/simt_s11_dev.py"
pack() { tar -czf "${PACK:-$out/runs.tgz}" -C "$out" --exclude runs.tgz . 2>/dev/null; }
cap() { local l=$(( $(left) - 6 )); [ $l -gt 5 ] || l=5; [ $l -lt $1 ] && echo $l || echo $1; }
step precompile
timeout $(cap 20) $dev precompile >> "$out/setup.log" 2>&1
echo "precompile rc=$?"; tail -n 1 "$out/setup.log"
step time
timeout $(cap 25) $dev time --json "$out/time.json" \
    --shapes 1536x1536x1536,768x768x768,1000x1000x4000,1000x1000x1000,1024x1024x1024,2053x3001x1999 \
    > "$out/time.log" 2>&1
echo "time rc=$?"; cut -c1-330 "$out/time.log"; pack
step pytest
timeout $(cap 20) python3 -P -m pytest -p no:cacheprovider -q \
    tests/test_tunable.py::test_shapes_of_one_bucket_with_different_picks_are_tuned_apart \
    tests/test_gemm.py::test_problem_key_buckets \
    tests/test_gemm.py::test_problem_key_parts_bucket_by_heuristic_pick > "$out/pytest.log" 2>&1
echo "pytest rc=$?"; tail -n 3 "$out/pytest.log"; pack
step configs
timeout $(cap 28) $dev configs --json "$out/configs.json" \
    --shapes 1536x1536x1536,1000x1000x1000,645x3008x1999,768x768x768,1000x1000x4000 \
    > "$out/configs.log" 2>&1
echo "configs rc=$?"; pack
step ncu
stalls=""
for r in barrier branch_resolving dispatch_stall drain imc_miss lg_throttle long_scoreboard \
         math_pipe_throttle membar mio_throttle misc no_instruction not_selected selected \
         short_scoreboard sleeping tex_throttle wait; do
    stalls="$stalls${stalls:+,}smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"
done
ncu_args="--clock-control none --cache-control none --launch-skip 1 --launch-count 1
  -k regex:gemm|sgemm|xmma --metrics $stalls"
timeout $(cap 12) ncu $ncu_args $dev one 1000 1000 1000 3 > "$out/ncu-ours.log" 2>&1
echo "ncu ours rc=$?"; pack
timeout $(cap 12) ncu $ncu_args $dev one 1000 1000 1000 cublas > "$out/ncu-cublas.log" 2>&1
echo "ncu cublas rc=$?"
step done
pack
