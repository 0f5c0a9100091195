#!/usr/bin/env bash
# One device call for session 10's fp32 SIMT work (run from the tree's root): gpurt importable
# (_device_site.sh), every simt program compiled in parallel, issue 17's fp32 misses and
# controls timed with and without the cut along M (simt_s10_dev.py time: graph replay and
# bench_gemm's warm Timer, cuBLAS both ways), the GPU tests of the cut and the simt paths,
# memcheck and racecheck over `simt_s10_dev.py sanitize`, cuBLAS's and gpurt's kernels
# (torch.profiler), ncu of one call each at 3000^3, then bench_gemm's fp32 rows with what is
# left. Each step time-limited; logs and JSON in OUTDIR, packed into $PACK (default
# OUTDIR/runs.tgz) as it goes.
# Usage: bash benchmarks/simt_s10_dev.sh OUTDIR   (total limit: $TOTAL, 285 s)
set -u
out=${1:?OUTDIR}
total=${TOTAL:-285}
. "$(dirname "${BASH_SOURCE[0]}")/_device_site.sh"
export GPURT_GEMM_AUTOTUNE=0
dev="python3 -P benchmarks/simt_s10_dev.py"
pack() { tar -czf "${PACK:-$out/runs.tgz}" -C "$out" --exclude runs.tgz . 2>/dev/null; }
cap() { local l=$(( $(left) - 8 )); [ $l -gt 5 ] || l=5; [ $l -lt $1 ] && echo $l || echo $1; }
step precompile
timeout $(cap 65) python3 -P benchmarks/simt_shapes_dev.py precompile >> "$out/setup.log" 2>&1
echo "precompile rc=$?"; tail -n 2 "$out/setup.log"
step time
timeout $(cap 95) $dev time --json "$out/time.json" > "$out/time.log" 2>&1
echo "time rc=$?"; pack
step pytest
timeout $(cap 40) python3 -P -m pytest -p no:cacheprovider -q tests/test_gemm_rows.py \
    tests/test_gemm_simt.py > "$out/pytest.log" 2>&1
echo "pytest rows+simt rc=$?"; tail -n 3 "$out/pytest.log"
timeout $(cap 20) python3 -P -m pytest -p no:cacheprovider -q tests/test_gemm.py \
    -k "float32 and (shapes or transposes or alpha or unaligned or column)" > "$out/pytest2.log" 2>&1
echo "pytest gemm rc=$?"; tail -n 2 "$out/pytest2.log"; pack
step sanitizers
san="compute-sanitizer --report-api-errors no --error-exitcode 3"
for tool in memcheck racecheck; do
    timeout $(cap 28) $san --tool $tool $dev sanitize > "$out/san-$tool.log" 2>&1
    echo "$tool rc=$? $(grep -c PASS "$out/san-$tool.log") passed: $(tail -n 1 "$out/san-$tool.log")" >> "$out/san.txt"
done
cat "$out/san.txt"; pack
step profile
timeout $(cap 20) $dev profile --json "$out/profile.json" > "$out/profile.log" 2>&1
echo "profile rc=$?"; pack
step ncu
ncu="ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats"
for which in cublas gpurt nocut; do
    [ "$(left)" -gt 40 ] || break
    case $which in
        cublas) filt="regex:gemm"; skip=1; count=1 ;;
        gpurt) filt="regex:gemm_simt"; skip=2; count=2 ;;
        nocut) filt="regex:gemm_simt"; skip=1; count=1 ;;
    esac
    timeout $(cap 35) $ncu -k "$filt" --launch-skip $skip --launch-count $count \
        $dev one 3000 3000 3000 $which > "$out/ncu-$which.log" 2>&1
    echo "ncu $which rc=$?"; pack
done
step bench_gemm
limit=$(( $(left) - 5 )); [ $limit -gt 5 ] || limit=5
timeout $limit python3 benchmarks/bench_gemm.py --dtypes fp32 --repeat 9 \
    --shapes 3000,2053x3001x1999,1000,3000x5000x2000,4096 \
    --json "$out/bench_gemm.json" > "$out/bench_gemm.log" 2>&1
echo "bench_gemm rc=$?"
step done
pack
