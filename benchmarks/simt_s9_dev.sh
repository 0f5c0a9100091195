#!/usr/bin/env bash
# One device call for session 9's fp32 SIMT work (run from the tree's root): gpurt importable
# (_device_site.sh), every program compiled in parallel, issue 17's four fp32 misses timed
# (simt_shapes_dev.py s9: graph replay and bench_gemm's warm Timer, each split variant with
# the spread and the last-CTA ending), the simt GPU tests, memcheck and racecheck over
# `simt_shapes_dev.py sanitize`, then the controls (s9ctl). Each step time-limited; logs and
# JSON in OUTDIR, packed into $PACK (default OUTDIR/runs.tgz) as it goes.
# Usage: bash benchmarks/simt_s9_dev.sh OUTDIR   (total limit: $TOTAL, 280 s)
set -u
out=${1:?OUTDIR}
total=${TOTAL:-280}
. "$(dirname "${BASH_SOURCE[0]}")/_device_site.sh"
export GPURT_GEMM_AUTOTUNE=0
dev="python3 -P benchmarks/simt_shapes_dev.py"
pack() { tar -czf "${PACK:-$out/runs.tgz}" -C "$out" --exclude runs.tgz . 2>/dev/null; }
step precompile
timeout 75 $dev precompile >> "$out/setup.log" 2>&1; echo "precompile rc=$?"
tail -n 2 "$out/setup.log"
step s9
timeout 85 $dev s9 --group s9 --json "$out/s9.json" > "$out/s9.log" 2>&1
echo "s9 rc=$?"; pack
step pytest
timeout 45 python3 -P -m pytest -p no:cacheprovider -q -x tests/test_gemm_simt.py > "$out/pytest.log" 2>&1
echo "pytest simt rc=$?"; tail -n 3 "$out/pytest.log"
timeout 35 python3 -P -m pytest -p no:cacheprovider -q tests/test_gemm.py \
    -k "(simt or float32 or split) and not compile" > "$out/pytest2.log" 2>&1
echo "pytest gemm rc=$?"; tail -n 3 "$out/pytest2.log"; pack
step sanitizers
san="compute-sanitizer --report-api-errors no --error-exitcode 3"
for tool in memcheck racecheck; do
    timeout $([ $tool = memcheck ] && echo 25 || echo 35) $san --tool $tool $dev sanitize > "$out/san-$tool.log" 2>&1
    echo "$tool rc=$? $(grep -c PASS "$out/san-$tool.log") passed: $(tail -n 1 "$out/san-$tool.log")" >> "$out/san.txt"
done
cat "$out/san.txt"; pack
step s9ctl
limit=$(( $(left) - 8 )); [ $limit -gt 5 ] || limit=5
timeout $limit $dev s9 --group s9ctl --json "$out/s9ctl.json" > "$out/s9ctl.log" 2>&1
echo "s9ctl rc=$?"
step done
pack
