#!/usr/bin/env bash
# s12-simt's device call, as it stands without the rolled K tile (session 12's call, at commit
# f4707ee, also timed kstep modes, ran tests/test_gemm_simt_kstep.py and memcheck/racecheck over
# rolled calls): the heuristic's fp32 plans against cuBLAS cold (graph replay, rotating inputs),
# warm and single calls at issue 17's shapes; forced tiles at 1000^3, 4096^3 and on
# 2053 x 3001 x 1999's tail (configs); torch.profiler's kernel times at 2053 x 3001 x 1999 and
# 1000^3 (ours: the packed copy, the cut's head and tail); the simt GPU tests; the main loops'
# SASS as compiled there (simt_sass.py); the stall reasons and per-instruction stall samples
# (ncu's source page as CSV) of one warm 1000^3 call of ours on cuBLAS's grid (64 x 128 x 8)
# and of cuBLAS's. Each step time-limited; logs and JSON in OUTDIR, packed into $PACK (default
# OUTDIR/runs.tgz) as it goes.
# Usage: bash benchmarks/simt_s12_dev.sh OUTDIR   (total limit: $TOTAL, 226 s)
set -u
out=${1:?OUTDIR}
total=${TOTAL:-226}
. "$(dirname "${BASH_SOURCE[0]}")/_device_site.sh"
export GPURT_GEMM_AUTOTUNE=0
dev="python3 -P benchmarks/simt_s12_dev.py"
pack() { tar -czf "${PACK:-$out/runs.tgz}" -C "$out" --exclude runs.tgz --exclude "*.ncu-rep" . 2>/dev/null; }
cap() { local l=$(( $(left) - 5 )); [ $l -gt 3 ] || l=3; [ $l -lt $1 ] && echo $l || echo $1; }
which cuobjdump nvdisasm ncu compute-sanitizer > "$out/tools.txt" 2>&1
step precompile
timeout $(cap 45) $dev precompile >> "$out/setup.log" 2>&1
echo "precompile rc=$?"; tail -n 2 "$out/setup.log"
step time
timeout $(cap 70) $dev time --json "$out/time.json" --shapes \
1000x1000x1000,2053x3001x1999,4096x4096x4096,1536x1536x1536,1024x1024x1024,768x768x768,\
3000x3000x3000,4099x4099x4099,2000x3000x1000 > "$out/time.log" 2>&1
echo "time rc=$?"; pack
step configs
timeout $(cap 28) $dev configs --shapes 1000x1000x1000,645x3008x1999,4096x4096x4096 \
    --json "$out/configs.json" \
    > "$out/configs.log" 2>&1
echo "configs rc=$?"; pack
step profile
timeout $(cap 12) $dev profile --shapes 2053x3001x1999,1000x1000x1000 --json "$out/profile.json" \
    > "$out/profile.log" 2>&1
echo "profile rc=$?"; cut -c1-220 "$out/profile.log"; pack
step pytest
timeout $(cap 60) python3 -P -m pytest -p no:cacheprovider -q tests/test_gemm_simt.py \
    tests/test_gemm_simt_pack.py > "$out/pytest.log" 2>&1
echo "pytest rc=$?"; tail -n 3 "$out/pytest.log"; pack
step sass
timeout $(cap 10) python3 -P benchmarks/simt_sass.py --dump "$out/simt.sass" \
    "gemm_simt<64, 128, 8, 8, 4, true, false, true>" \
    "gemm_simt<128, 256, 16, 16, 3, true, false, true>" > "$out/sass.txt" 2>&1
echo "sass rc=$?"; cut -c1-160 "$out/sass.txt"; pack
step ncu
stalls=""
for r in barrier branch_resolving dispatch_stall drain imc_miss lg_throttle long_scoreboard \
         math_pipe_throttle membar mio_throttle misc no_instruction not_selected selected \
         short_scoreboard sleeping tex_throttle wait; do
    stalls="$stalls${stalls:+,}smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"
done
ncu_args="--clock-control none --cache-control none --launch-skip 1 --launch-count 1
  -k regex:gemm|sgemm|xmma --section SchedulerStats --section SourceCounters --metrics $stalls"
for who in "64,128,8,0,4,1" cublas; do
    name=$(echo "$who" | tr ',' '-')
    timeout $(cap 20) ncu $ncu_args -o "$out/ncu-$name" $dev one 1000 1000 1000 "$who" \
        > "$out/ncu-$name.log" 2>&1
    echo "ncu $who rc=$?"
    timeout $(cap 8) ncu -i "$out/ncu-$name.ncu-rep" --page details > "$out/ncu-$name.txt" 2>&1
    timeout $(cap 8) ncu -i "$out/ncu-$name.ncu-rep" --page source --csv --print-source sass \
        > "$out/ncu-$name-source.csv" 2>&1
    grep -E "stalled|Issued Warp|Eligible|No Eligible" "$out/ncu-$name.txt" | head -30; pack
done
step done
pack
