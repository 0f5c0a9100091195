#!/usr/bin/env bash
# Session 8's one device call for the decode GEMMs (run from the tree's root): makes gpurt
# importable (_device_site.sh); runs the correctness jobs (tests/test_gemm_decode.py and
# tests/test_gemm.py -k "decode or split"; memcheck and racecheck over `decode_dev.py
# sanitize`) in the background while the sweep's programs compile on the CPUs; then, alone on
# the GPU, the occupancy table, the variant sweep (decode_sweep_dev.py) and bench_gemm_decode.py
# (heuristics: GPURT_GEMM_AUTOTUNE=0). Packs everything but the two JSONs into OUTDIR/runs.tgz.
# Usage: bash benchmarks/decode_sweep_dev.sh OUTDIR   (limit: $TOTAL, 232 s)
set -u
out=${1:?OUTDIR}
total=${TOTAL:-232}
. "$(dirname "${BASH_SOURCE[0]}")/_device_site.sh"
export GPURT_GEMM_AUTOTUNE=0
logs="$out/logs"; mkdir -p "$logs"
pack() { tar czf "$out/runs.tgz" -C "$out" logs smi.txt setup.log 2>/dev/null; }
step correctness-and-precompile
timeout 90 python3 -P -m pytest -p no:cacheprovider -q tests/test_gemm_decode.py > "$logs/pytest-decode.log" 2>&1 &
timeout 90 python3 -P -m pytest -p no:cacheprovider -q tests/test_gemm.py -k "decode or split" \
    > "$logs/pytest-gemm.log" 2>&1 &
san="compute-sanitizer --report-api-errors no --error-exitcode 3"
for tool in memcheck racecheck; do
    (timeout 90 $san --tool $tool python3 -P benchmarks/decode_dev.py sanitize > "$logs/san-$tool.log" 2>&1
     echo "$tool rc=$? $(grep -c PASS "$logs/san-$tool.log") passed: $(tail -n 1 "$logs/san-$tool.log")" > "$logs/san-$tool.txt") &
done
timeout 70 python3 -P benchmarks/decode_sweep_dev.py precompile > "$logs/precompile.log" 2>&1
echo "precompile rc=$? $(tail -n 1 "$logs/precompile.log")"
wait
for f in "$logs"/pytest-*.log; do
    echo "$(basename "$f"): $(tail -n 1 "$f")"; grep -E "^(FAILED|ERROR)" "$f" | head -n 10
done
cat "$logs"/san-*.txt
pack
step occupancy
timeout 20 python3 -P benchmarks/decode_sweep_dev.py occupancy > "$logs/occupancy.log" 2>&1
echo "occupancy rc=$?"
step sweep
limit=$(( $(left) - ${BENCH_MIN:-70} )); [ $limit -gt 10 ] || limit=10
timeout $limit python3 -P benchmarks/decode_sweep_dev.py sweep --json "$out/sweep.json" > "$logs/sweep.log" 2>&1
echo "sweep rc=$?"; grep -E "^ |FAIL" "$logs/sweep.log" | tail -n 14
pack
step bench
limit=$(( $(left) - 4 )); [ $limit -gt 10 ] || limit=10
(cd benchmarks && timeout $limit python3 bench_gemm_decode.py --repeat 20 --json "$out/gemm_decode.json") > "$logs/bench.log" 2>&1
echo "bench rc=$?"; grep -vE "^\{" "$logs/bench.log" | tail -n 45
pack
step done
