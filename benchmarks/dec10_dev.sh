#!/usr/bin/env bash
# Session 10's one device call for the decode shapes (benchmarks/dec10_dev.py; run from the
# tree's root): makes gpurt importable (_device_site.sh); the decode / rowload / split tests
# run while the sweep's programs compile on the CPUs; then, alone on the GPU: the kernels
# cuBLAS and gemm launch (torch.profiler), the sweep, bench_gemm_decode at 4096^2 and ncu over
# one call of each side at 128 x 4096^2 and 16 x 4099^2. Heuristics only (AUTOTUNE=0).
# Usage: bash benchmarks/dec10_dev.sh OUTDIR   (limit: $TOTAL, 290 s)
set -u
out=${1:?OUTDIR}
total=${TOTAL:-290}
. "$(dirname "${BASH_SOURCE[0]}")/_device_site.sh"
export GPURT_GEMM_AUTOTUNE=0 PYTHONUNBUFFERED=1
logs="$out/logs"; mkdir -p "$logs"
pack() { tar czf "$out/runs.tgz" -C "$out" logs smi.txt setup.log 2>/dev/null; }
step tests-and-precompile
timeout 100 python3 -P -m pytest -p no:cacheprovider -q tests/test_gemm_decode.py \
    tests/test_gemm_rowload.py -k "not compile" > "$logs/pytest-decode.log" 2>&1 &
timeout 100 python3 -P -m pytest -p no:cacheprovider -q tests/test_gemm.py -k "decode or split" \
    > "$logs/pytest-gemm.log" 2>&1 &
san="compute-sanitizer --report-api-errors no --error-exitcode 3"
for tool in memcheck racecheck; do
    (timeout 100 $san --tool $tool python3 -P benchmarks/dec10_dev.py sanitize > "$logs/san-$tool.log" 2>&1
     echo "$tool rc=$? $(grep -c PASS "$logs/san-$tool.log") passed, $(grep -c FAIL "$logs/san-$tool.log") failed: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$logs/san-$tool.log" | tail -n 1)" > "$logs/san-$tool.txt") &
done
timeout 60 python3 -P benchmarks/dec10_dev.py precompile > "$logs/precompile.log" 2>&1
echo "precompile rc=$? $(tail -n 1 "$logs/precompile.log")"
wait
for f in "$logs"/pytest-*.log; do
    echo "$(basename "$f"): $(tail -n 1 "$f")"; grep -E "^(FAILED|ERROR)" "$f" | head -n 8
done
cat "$logs"/san-*.txt
pack
step kernels
timeout 40 python3 -P benchmarks/dec10_dev.py kernels --json "$out/kernels.json" > "$logs/kernels.log" 2>&1
echo "kernels rc=$?"; pack
step sweep
limit=$(( $(left) - 120 )); [ $limit -gt 90 ] && limit=90; [ $limit -gt 15 ] || limit=15
timeout $limit python3 -P benchmarks/dec10_dev.py time --budget $(( limit - 10 )) --json "$out/sweep.json" > "$logs/sweep.log" 2>&1
echo "sweep rc=$?"; pack
step ncu
prof="ncu --clock-control none --profile-from-start off --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy"
for job in "gpurt bf16 128 4096 4096" "torch bf16 128 4096 4096" "gpurt fp16 16 4099 4099" \
           "torch fp16 16 4099 4099" "torch bf16 16 4099 4099"; do
    [ $(left) -gt 40 ] || break
    name=$(echo $job | tr ' ' '-')
    timeout 25 $prof python3 -P benchmarks/dec10_dev.py one $job > "$logs/ncu-$name.log" 2>&1
    echo "ncu $name rc=$?"; pack
done
step bench
(cd benchmarks && timeout $(( $(left) - 3 )) python3 bench_gemm_decode.py --dtypes bf16,fp16 --nk 4096x4096 \
    --m 1,16,64,128 --fp16-m 16,128 --repeat 20 --json "$out/gemm_decode.json") > "$logs/bench.log" 2>&1
echo "bench rc=$?"; pack
step done
