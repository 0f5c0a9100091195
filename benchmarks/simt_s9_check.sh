#!/usr/bin/env bash
# Session 9's second device call (after simt_s9_dev.sh): the re-fitted simt chooser's picks at
# the shapes it changed beside their old choices and the neighbours of the picks at 1000^3
# and 2053 x 3001 (simt_shapes_dev.py s9 --group s9chk), bench_gemm's fp32 rows of issue 17's
# shapes (autotuned, as results/gemm-*.json are taken), and the fp32 GPU tests that run the
# heuristic's choices. Logs and JSON in OUTDIR, packed into $PACK (default OUTDIR/runs.tgz).
# Usage: bash benchmarks/simt_s9_check.sh OUTDIR   (total limit: $TOTAL, 190 s)
set -u
out=${1:?OUTDIR}
total=${TOTAL:-190}
. "$(dirname "${BASH_SOURCE[0]}")/_device_site.sh"
dev="python3 -P benchmarks/simt_shapes_dev.py"
pack() { tar -czf "${PACK:-$out/runs.tgz}" -C "$out" --exclude runs.tgz . 2>/dev/null; }
step precompile
GPURT_GEMM_AUTOTUNE=0 timeout 70 $dev precompile >> "$out/setup.log" 2>&1; echo "precompile rc=$?"
step s9chk
GPURT_GEMM_AUTOTUNE=0 timeout 50 $dev s9 --group s9chk --json "$out/s9chk.json" > "$out/s9chk.log" 2>&1
echo "s9chk rc=$?"; pack
step pytest
GPURT_GEMM_AUTOTUNE=0 timeout 25 python3 -P -m pytest -p no:cacheprovider -q tests/test_gemm.py \
    -k "float32 and (shapes or transposes or alpha or unaligned or column)" > "$out/pytest.log" 2>&1
echo "pytest rc=$?"; tail -n 2 "$out/pytest.log"; pack
step bench_gemm
limit=$(( $(left) - 5 )); [ $limit -gt 5 ] || limit=5
timeout $limit python3 benchmarks/bench_gemm.py --dtypes fp32 --repeat 9 \
    --shapes 128x4096x4096,64x4096x4096,1000,2053x3001x1999,1024,16x4096x4096,32x11008x4096,4096 \
    --json "$out/bench_gemm.json" > "$out/bench_gemm.log" 2>&1
echo "bench_gemm rc=$?"
step done
pack
