#!/usr/bin/env bash
# One device call for the fp32 SIMT GEMM at issue 17's shapes (run from the tree's root):
# gpurt importable (_device_site.sh), every simt program compiled in parallel into the disk
# cache, then the decode-shape sweep (simt_shapes_dev.py time --group skinny), the fp32/simt
# GPU tests of tests/test_gemm.py, memcheck and racecheck over `simt_shapes_dev.py sanitize`,
# the irregular/square, N x K-weight and control sweeps, and with OLD_KERNELS=DIR the split-K
# ending of the kernel sources in DIR (same run, same card). Each step is time-limited; all
# logs and JSON land in OUTDIR.
# Usage: bash benchmarks/simt_shapes_dev.sh OUTDIR   (total limit: $TOTAL, 230 s)
set -u
out=${1:?OUTDIR}
total=${TOTAL:-230}
. "$(dirname "${BASH_SOURCE[0]}")/_device_site.sh"
export GPURT_GEMM_AUTOTUNE=0
dev="python3 -P benchmarks/simt_shapes_dev.py"
step precompile
timeout 60 $dev precompile >> "$out/setup.log" 2>&1; echo "precompile rc=$?"
tail -n 2 "$out/setup.log"
step skinny
timeout 50 $dev time --group skinny --json "$out/skinny.json" > "$out/skinny.log" 2>&1
echo "skinny rc=$?"
step pytest
timeout 45 python3 -P -m pytest -p no:cacheprovider -q tests/test_gemm.py \
    -k "(simt or float32) and not compile" > "$out/pytest.log" 2>&1
echo "pytest rc=$?"; tail -n 3 "$out/pytest.log"
step sanitizers
san="compute-sanitizer --report-api-errors no --error-exitcode 3"
for tool in memcheck racecheck; do
    timeout $([ $tool = memcheck ] && echo 25 || echo 30) $san --tool $tool $dev sanitize > "$out/san-$tool.log" 2>&1
    echo "$tool rc=$? $(grep -c PASS "$out/san-$tool.log") passed: $(tail -n 1 "$out/san-$tool.log")" >> "$out/san.txt"
done
cat "$out/san.txt"
step big
limit=$(( $(left) - 20 )); [ $limit -gt 10 ] || limit=10
timeout $limit $dev time --group control,big,nk --json "$out/big.json" > "$out/big.log" 2>&1
echo "big rc=$?"
if [ -n "${OLD_KERNELS:-}" ]; then
    step old
    limit=$(( $(left) - 3 )); [ $limit -gt 5 ] || limit=5
    timeout $limit $dev old --old-kernels "$OLD_KERNELS" --json "$out/old.json" > "$out/old.log" 2>&1
    echo "old rc=$?"
fi
step done
