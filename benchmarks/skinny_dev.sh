#!/usr/bin/env bash
# One device call for the skinny GEMM (run from the tree's root): makes gpurt importable as
# scripts/gpu-check does, then skinny_dev.py main (checks, variant timings), compute-sanitizer
# (memcheck, racecheck, synccheck) on skinny_dev.py sanitize, the skinny GPU tests and the
# decode benchmark. Usage: bash benchmarks/skinny_dev.sh OUTDIR [--no-bench]
set -u
out=${1:?OUTDIR}
mkdir -p "$out"
tree=$(pwd)
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target "$site" .whl/*.whl > "$out/setup.log" 2>&1
cp -R gpurt "$site/gpurt" && cp -R kernels "$site/gpurt/kernels"
(cd "$site" && python3 "$tree/setup.py" -q build_ext --inplace) >> "$out/setup.log" 2>&1 || true
export PYTHONPATH="$site" GPURT_CACHE_DIR="$site/cache" PYTHONDONTWRITEBYTECODE=1
export GPURT_GEMM_AUTOTUNE=0
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$out/smi.txt" 2>&1
t0=$SECONDS
step() { echo "== $1 ($((SECONDS - t0)) s)"; }
step dev
timeout ${DEV_LIMIT:-150} python3 -P benchmarks/skinny_dev.py main --out "$out" > "$out/dev.log" 2>&1; echo "rc=$?" >> "$out/dev.log"
step memcheck
san="compute-sanitizer --report-api-errors no --error-exitcode 3"
for tool in memcheck racecheck synccheck; do
    limit=35; [ $tool = memcheck ] && limit=50
    timeout $limit $san --tool $tool python3 -P benchmarks/skinny_dev.py sanitize > "$out/san-$tool.log" 2>&1
    echo "$tool rc=$?" | tee -a "$out/san.txt"
    tail -n 3 "$out/san-$tool.log" >> "$out/san.txt"
done
step pytest
timeout ${TEST_LIMIT:-60} python3 -P -m pytest -p no:cacheprovider -q -x tests/test_gemm_skinny.py ${PYTEST_EXTRA:-} > "$out/pytest.log" 2>&1
tail -n 3 "$out/pytest.log"
if [ -n "${GEMM_TESTS:-}" ]; then  # tests/test_gemm.py's GPU tests matching this -k
    timeout ${TEST_LIMIT:-60} python3 -P -m pytest -p no:cacheprovider -q tests/test_gemm.py -k "$GEMM_TESTS" > "$out/pytest-gemm.log" 2>&1
    tail -n 3 "$out/pytest-gemm.log"
fi
if [ "${2:-}" != "--no-bench" ]; then
    step bench
    (cd benchmarks && timeout 150 python3 bench_gemm_decode.py --json "$out/gemm_decode.json" ${BENCH_EXTRA:-}) > "$out/bench.log" 2>&1
    tail -n 45 "$out/bench.log" | cut -c1-200
fi
step done
cat "$out/san.txt"
tail -n 32 "$out/dev.log"
