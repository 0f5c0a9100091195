#!/usr/bin/env bash
# One device call for the bandwidth kernels (run from the tree's root): makes gpurt importable
# as scripts/gpu-check does, then, each step time-limited: benchmarks/bandwidth_dev.py (timings
# of random fills, reduction variants and bf16 softmax variants, JSON into OUTDIR), the GPU
# tests of gpurt.random and of tests/test_bandwidth_cases.py, and compute-sanitizer memcheck
# over the fill and reduction cases of scripts/sanitize_sweep.py's quick tier.
# Usage: bash benchmarks/bandwidth_dev.sh OUTDIR [AREAS]   (total limit: $TOTAL, 230 s)
set -u
out=${1:?OUTDIR}
areas=${2:-random,reduce,softmax}
mkdir -p "$out"
tree=$(pwd)
site=$(mktemp -d)
t0=$SECONDS
total=${TOTAL:-230}
left() { echo $((total - (SECONDS - t0))); }
step() { echo "== $1 ($((SECONDS - t0)) s)"; }
python3 -m pip install -q --no-index --no-deps --target "$site" .whl/*.whl > "$out/setup.log" 2>&1
cp -R gpurt "$site/gpurt" && cp -R kernels "$site/gpurt/kernels"
(cd "$site" && python3 "$tree/setup.py" -q build_ext --inplace) >> "$out/setup.log" 2>&1 || true
export PYTHONPATH="$site" GPURT_CACHE_DIR="$site/cache" PYTHONDONTWRITEBYTECODE=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$out/smi.txt" 2>&1
step dev
(cd benchmarks && timeout ${DEV_LIMIT:-100} python3 bandwidth_dev.py --areas "$areas" --json "$out/dev.json") > "$out/dev.log" 2>&1
echo "dev rc=$?"
step pytest
timeout ${TEST_LIMIT:-70} python3 -P -m pytest -p no:cacheprovider -q -x tests/test_random_gpu.py tests/test_random_graphs.py tests/test_bandwidth_cases.py > "$out/pytest.log" 2>&1
echo "pytest rc=$?"; tail -n 3 "$out/pytest.log"
step memcheck
limit=$(left); [ $limit -gt 10 ] || limit=10
timeout $limit compute-sanitizer --tool memcheck --report-api-errors no --print-limit 20 \
    python3 -P scripts/sanitize_sweep.py --cases quick --kinds fill,reduce > "$out/memcheck.log" 2>&1
echo "memcheck rc=$?"; tail -n 3 "$out/memcheck.log"
step done
