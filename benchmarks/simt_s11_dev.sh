#!/usr/bin/env bash
# One device call for s11-simt (run from the tree's root): the heuristic's fp32 picks at
# session 11's shapes against cuBLAS (simt_s11_dev.py time), bench_gemm's fp32 rows with the
# tuner ON (a fresh results file: 2048^3 before 1536^3, so a shared tuning result would show),
# forced tiles/splits at 1536^3, 768^3 and 1000 x 1000 x 4000, cuBLAS's kernels there, the GPU
# tests of the tuner and the fp32 path, then ncu of one warm 1000^3 call of ours (cuBLAS's grid)
# and of cuBLAS's. Each step time-limited; logs and JSON in OUTDIR, packed into $PACK (default
# OUTDIR/runs.tgz) as it goes.
# Usage: bash benchmarks/simt_s11_dev.sh OUTDIR   (total limit: $TOTAL, 230 s)
set -u
out=${1:?OUTDIR}
total=${TOTAL:-230}
. "$(dirname "${BASH_SOURCE[0]}")/_device_site.sh"
export GPURT_GEMM_AUTOTUNE=0
dev="python3 -P benchmarks/simt_s11_dev.py"
pack() { tar -czf "${PACK:-$out/runs.tgz}" -C "$out" --exclude runs.tgz . 2>/dev/null; }
cap() { local l=$(( $(left) - 8 )); [ $l -gt 5 ] || l=5; [ $l -lt $1 ] && echo $l || echo $1; }
step precompile
timeout $(cap 40) python3 -P benchmarks/simt_s10_dev.py precompile >> "$out/setup.log" 2>&1
echo "precompile rc=$?"; tail -n 2 "$out/setup.log"
step time
timeout $(cap 40) $dev time --json "$out/time.json" \
    --shapes 1536x1536x1536,768x768x768,1000x1000x4000,1000x1000x1000,1024x1024x1024,2053x3001x1999 \
    > "$out/time.log" 2>&1
echo "time rc=$?"; pack
step bench_tuned
limit=$(cap 45)
GPURT_GEMM_AUTOTUNE=1 timeout $limit python3 benchmarks/bench_gemm.py --dtypes fp32 --repeat 9 \
    --shapes 2048,1536,1024,1000,768,1000x1000x4000,2053x3001x1999,3000,2000x3000x1000,4099,4096 \
    --json "$out/bench_tuned.json" > "$out/bench_tuned.log" 2>&1
echo "bench_tuned rc=$?"; cp "$GPURT_CACHE_DIR"/gemm-tune-v1.json "$out/tuner.json" 2>/dev/null
grep -E "ms \|" "$out/bench_tuned.log" | cut -c1-160; pack
step configs
timeout $(cap 30) $dev configs --shapes 1536x1536x1536,768x768x768,1000x1000x4000 \
    --json "$out/configs.json" > "$out/configs.log" 2>&1
echo "configs rc=$?"; pack
step profile
timeout $(cap 15) $dev profile --shapes 1536x1536x1536,768x768x768,1000x1000x4000 \
    --json "$out/profile.json" > "$out/profile.log" 2>&1
echo "profile rc=$?"; cat "$out/profile.log" | cut -c1-200; pack
step pytest
timeout $(cap 35) python3 -P -m pytest -p no:cacheprovider -q tests/test_tunable.py \
    tests/test_gemm_simt.py tests/test_gemm.py -k "tuner or key or tunable or simt or float32" \
    > "$out/pytest.log" 2>&1
echo "pytest rc=$?"; tail -n 3 "$out/pytest.log"; pack
step ncu
ncu_args="--clock-control none --cache-control none --launch-skip 1 --launch-count 1
  -k regex:gemm|sgemm|xmma --section SpeedOfLight --section ComputeWorkloadAnalysis
  --section WarpStateStats --section SchedulerStats --section InstructionStats
  --metrics l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"
timeout $(cap 25) ncu $ncu_args $dev one 1000 1000 1000 3 > "$out/ncu-ours.log" 2>&1
echo "ncu ours rc=$?"; pack
timeout $(cap 25) ncu $ncu_args $dev one 1000 1000 1000 cublas > "$out/ncu-cublas.log" 2>&1
echo "ncu cublas rc=$?"; pack
step done
pack
