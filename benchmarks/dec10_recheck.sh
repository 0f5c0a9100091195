#!/usr/bin/env bash
# Session 10's second device call (s10-dec): checks what the first (dec10_dev.sh) found:
# cuBLAS's tiling at 64..128 x 4096^2 (64-row tiles, K unsplit, deep rings) on the decode
# kernel, and the new choice at 16 x 4099^2 (tests/test_gemm.py -k few_rows; memcheck and
# racecheck over one call), timed by `dec10_dev.py time --recheck`. Heuristics only.
# Usage: bash benchmarks/dec10_recheck.sh OUTDIR   (limit: $TOTAL, 140 s)
set -u
out=${1:?OUTDIR}
total=${TOTAL:-140}
. "$(dirname "${BASH_SOURCE[0]}")/_device_site.sh"
export GPURT_GEMM_AUTOTUNE=0 PYTHONUNBUFFERED=1
logs="$out/logs"; mkdir -p "$logs"
pack() { tar czf "$out/runs.tgz" -C "$out" logs smi.txt setup.log 2>/dev/null; }
step tests-and-precompile
timeout 60 python3 -P -m pytest -p no:cacheprovider -q tests/test_gemm.py -k few_rows \
    > "$logs/pytest-few-rows.log" 2>&1 &
san="compute-sanitizer --report-api-errors no --error-exitcode 3"
for tool in memcheck racecheck; do
    (timeout 60 $san --tool $tool python3 -P benchmarks/dec10_dev.py one gpurt bf16 16 4099 4099 \
        > "$logs/san-$tool.log" 2>&1
     echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$logs/san-$tool.log" | tail -n 1)" \
        > "$logs/san-$tool.txt") &
done
timeout 40 python3 -P benchmarks/dec10_dev.py precompile --recheck > "$logs/precompile.log" 2>&1
echo "precompile rc=$? $(tail -n 1 "$logs/precompile.log")"
wait
echo "pytest: $(tail -n 1 "$logs/pytest-few-rows.log")"; grep -E "^(FAILED|ERROR)" "$logs/pytest-few-rows.log" | head
cat "$logs"/san-*.txt; pack
step time
limit=$(( $(left) - 5 )); [ $limit -gt 15 ] || limit=15
timeout $limit python3 -P benchmarks/dec10_dev.py time --recheck --budget $(( limit - 8 )) \
    --json "$out/recheck.json" > "$logs/recheck.log" 2>&1
echo "time rc=$?"; pack
step done
