#!/usr/bin/env bash
# Session 8's one device call of helper s8-splitk2 (issue 17; run from the tree's root): makes
# gpurt importable (_device_site.sh); runs the correctness jobs (tests/test_gemm.py -k "split or
# every_config", test_gemm_workspace.py; memcheck and racecheck over `splitk2_dev.py sanitize`)
# while the timed programs compile; then, alone on the GPU, `splitk2_dev.py probe` (the split-4
# call at 128x128x4096 taken apart, graph node census), ncu (--set full, clocks left alone) of
# split 4 / its ending disabled / the unsplit tiles, `splitk2_dev.py sweep`, and nsys of the
# probe where the box has it. Logs packed into OUTDIR/runs.tgz.
# Usage: bash benchmarks/splitk2_dev.sh OUTDIR   (limit: $TOTAL, 228 s)
set -u
out=${1:?OUTDIR}
total=${TOTAL:-228}
. "$(dirname "${BASH_SOURCE[0]}")/_device_site.sh"
export GPURT_GEMM_AUTOTUNE=0
logs=$(mktemp -d)/logs; mkdir -p "$logs"  # outside OUTDIR: 8 files come back
pack() { tar czf "$out/runs.tgz" -C "$logs/.." logs 2>/dev/null; }
xdist() { python3 -c 'import xdist' 2>/dev/null && echo "-n $1"; }
py="python3 -P"
dev=benchmarks/splitk2_dev.py

step correctness-and-precompile
timeout $(( 110 - (SECONDS - t0) )) $py -m pytest -p no:cacheprovider -q $(xdist 8) tests/test_gemm.py \
    -k "split or every_config" > "$logs/pytest-gemm.log" 2>&1 &
timeout $(( 110 - (SECONDS - t0) )) $py -m pytest -p no:cacheprovider -q tests/test_gemm_workspace.py \
    > "$logs/pytest-workspace.log" 2>&1 &
timeout 60 $py $dev precompile > "$logs/precompile.log" 2>&1
echo "precompile: $(tail -n 1 "$logs/precompile.log")"
san="compute-sanitizer --report-api-errors no --error-exitcode 3"
for tool in memcheck racecheck; do
    (timeout $(( 110 - (SECONDS - t0) )) $san --tool $tool $py $dev sanitize > "$logs/san-$tool.log" 2>&1
     echo "$tool rc=$? $(grep -c PASS "$logs/san-$tool.log") passed: $(tail -n 1 "$logs/san-$tool.log")" \
        > "$logs/san-$tool.txt") &
done
wait
for f in "$logs"/pytest-*.log; do
    echo "$(basename "$f"): $(tail -n 1 "$f")"; grep -E "^(FAILED|ERROR)" "$f" | head -n 10
done
cat "$logs"/san-*.txt
grep -hE "FAIL|ERROR|graph nodes|=========" "$logs"/san-*.log | head -n 12
pack

step probe
timeout 40 $py $dev probe --json "$logs/probe.json" > "$logs/probe.log" 2>&1
echo "probe rc=$?"; cat "$logs/probe.log" | cut -c1-220
cp "$logs/probe.json" "$out/probe.json" 2>/dev/null
pack

step ncu
if command -v ncu > /dev/null; then
    timeout $(( $(left) > 150 ? 60 : 30 )) ncu --clock-control none --set full -k regex:gemm_wgmma \
        --launch-skip 3 --launch-count 3 -f -o "$logs/ncu" $py $dev ncucall > "$logs/ncu.log" 2>&1
    echo "ncu rc=$?"; tail -n 3 "$logs/ncu.log"
    ncu -i "$logs/ncu.ncu-rep" --page details > "$logs/ncu-details.txt" 2>&1
    ncu -i "$logs/ncu.ncu-rep" --page raw --csv > "$logs/ncu-raw.csv" 2>&1
    grep -E "gemm_wgmma|Duration|Elapsed Cycles|Memory Throughput|DRAM Throughput|L2 Hit|Registers|Achieved Occupancy|Waves" \
        "$logs/ncu-details.txt" | head -n 40
else
    echo "no ncu on the box"
fi
pack

step sweep
limit=$(( $(left) - 30 )); [ $limit -gt 5 ] || limit=5
timeout $limit $py $dev sweep --json "$logs/sweep.json" > "$logs/sweep.log" 2>&1
echo "sweep rc=$?"; tail -n 2 "$logs/sweep.log" | cut -c1-200
cp "$logs/sweep.json" "$out/sweep.json" 2>/dev/null
pack

step nsys
limit=$(( $(left) - 6 ))
if command -v nsys > /dev/null && [ $limit -gt 15 ]; then
    timeout $limit nsys profile --cuda-graph-trace=node -o "$logs/probe-nsys" -f true \
        $py $dev probe --json "$logs/probe-nsys.json" > "$logs/nsys.log" 2>&1
    echo "nsys rc=$?"
    timeout 10 nsys stats -q --report cuda_gpu_trace --format csv -o "$logs/nsys" \
        "$logs/probe-nsys.nsys-rep" > /dev/null 2>&1
    rm -f "$logs/probe-nsys.sqlite"
else
    echo "nsys skipped (absent or no time)"
fi
pack
step done
