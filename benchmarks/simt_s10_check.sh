#!/usr/bin/env bash
# Session 10's second fp32 SIMT device call (after simt_s10_dev.sh, whose racecheck ran out of
# time after 3 of 12 calls and whose bench_gemm step failed to import _common under -P):
# racecheck over every third `simt_s10_dev.py sanitize` call, bench_gemm's fp32 rows with the
# heuristic's choices (the cut included), then the tiles for 2053 x 3001 x 1999's tail
# (simt_s10_dev.py tail). Logs and JSON in OUTDIR, packed into $PACK as it goes.
# Usage: bash benchmarks/simt_s10_check.sh OUTDIR   (total limit: $TOTAL, 140 s)
set -u
out=${1:?OUTDIR}
total=${TOTAL:-140}
. "$(dirname "${BASH_SOURCE[0]}")/_device_site.sh"
export GPURT_GEMM_AUTOTUNE=0
dev="python3 -P benchmarks/simt_s10_dev.py"
pack() { tar -czf "${PACK:-$out/runs.tgz}" -C "$out" --exclude runs.tgz . 2>/dev/null; }
cap() { local l=$(( $(left) - 8 )); [ $l -gt 5 ] || l=5; [ $l -lt $1 ] && echo $l || echo $1; }
step precompile
timeout $(cap 45) python3 -P benchmarks/simt_shapes_dev.py precompile >> "$out/setup.log" 2>&1
echo "precompile rc=$?"
step racecheck
timeout $(cap 55) compute-sanitizer --report-api-errors no --error-exitcode 3 --tool racecheck \
    $dev sanitize 3 > "$out/san-racecheck.log" 2>&1
echo "racecheck rc=$? $(grep -c PASS "$out/san-racecheck.log") passed: $(tail -n 1 "$out/san-racecheck.log")"
pack
step bench_gemm
timeout $(cap 30) python3 benchmarks/bench_gemm.py --dtypes fp32 --repeat 9 \
    --shapes 3000,2053x3001x1999,1000,3000x5000x2000,4096 \
    --json "$out/bench_gemm.json" > "$out/bench_gemm.log" 2>&1
echo "bench_gemm rc=$?"; pack
step tail
timeout $(cap 40) $dev tail --json "$out/tail.json" > "$out/tail.log" 2>&1
echo "tail rc=$?"
step done
pack
