#!/usr/bin/env bash
# One device call for s10-simt2 (run from the tree's root): fp32 rows along M or N that are
# not 16-byte multiples copied into 128-byte rows first (the packed route for simt), timed
# against the rows as they are and cuBLAS (simt_s10_dev.py time: graph replay and bench_gemm's
# warm Timer), its GPU tests, memcheck and racecheck over forced packed calls, every tile and
# split near the model's pick at 1000^3 both ways (simt_s10_dev.py configs), then bench_gemm's
# fp32 rows with what is left. Each step time-limited; logs and JSON in OUTDIR, packed into
# $PACK (default OUTDIR/runs.tgz) as it goes.
# Usage: bash benchmarks/simt_s10_pack_dev.sh OUTDIR   (total limit: $TOTAL, 230 s)
set -u
out=${1:?OUTDIR}
total=${TOTAL:-230}
. "$(dirname "${BASH_SOURCE[0]}")/_device_site.sh"
export GPURT_GEMM_AUTOTUNE=0
dev="python3 -P benchmarks/simt_s10_dev.py"
pack() { tar -czf "${PACK:-$out/runs.tgz}" -C "$out" --exclude runs.tgz . 2>/dev/null; }
cap() { local l=$(( $(left) - 8 )); [ $l -gt 5 ] || l=5; [ $l -lt $1 ] && echo $l || echo $1; }
step precompile
timeout $(cap 40) $dev precompile >> "$out/setup.log" 2>&1
echo "precompile rc=$?"; tail -n 2 "$out/setup.log"
step time
timeout $(cap 45) $dev time --variants auto,nopack,nocut --json "$out/time.json" \
    --shapes 2053x3001x1999,4099x4099x4099,1999x3001x2053 > "$out/time.log" 2>&1
echo "time rc=$?"; pack
step pytest
timeout $(cap 40) python3 -P -m pytest -p no:cacheprovider -q tests/test_gemm_simt_pack.py \
    tests/test_gemm_rows.py > "$out/pytest.log" 2>&1
echo "pytest simt_pack+rows rc=$?"; tail -n 3 "$out/pytest.log"; pack
step sanitizers
san="compute-sanitizer --report-api-errors no --error-exitcode 3"
timeout $(cap 18) $san --tool memcheck $dev sanitize_pack > "$out/san-memcheck.log" 2>&1
echo "memcheck rc=$? $(grep -c PASS "$out/san-memcheck.log") passed: $(tail -n 1 "$out/san-memcheck.log")" >> "$out/san.txt"
timeout $(cap 28) $san --tool racecheck $dev sanitize_pack 3 > "$out/san-racecheck.log" 2>&1
echo "racecheck rc=$? $(grep -c PASS "$out/san-racecheck.log") passed: $(tail -n 1 "$out/san-racecheck.log")" >> "$out/san.txt"
cat "$out/san.txt"; pack
step configs
timeout $(cap 30) $dev configs --shapes 1000x1000x1000 --json "$out/configs.json" \
    > "$out/configs.log" 2>&1
echo "configs rc=$?"; pack
step bench_gemm
limit=$(( $(left) - 5 )); [ $limit -gt 5 ] || limit=5
timeout $limit python3 benchmarks/bench_gemm.py --dtypes fp32 --repeat 9 \
    --shapes 2053x3001x1999,1000,3000,3000x5000x2000 \
    --json "$out/bench_gemm.json" > "$out/bench_gemm.log" 2>&1
echo "bench_gemm rc=$?"
step done
pack
