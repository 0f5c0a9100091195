#!/usr/bin/env bash
# One device call for the TF32 wgmma GEMM (run from the tree's root): makes gpurt importable as
# scripts/gpu-check does, compiles every TF32 program in parallel into the disk cache, then
# (each step limited): tf32_dev.py's checks against float64, tests/test_gemm.py's TF32 and wgmma
# GPU tests, compute-sanitizer memcheck (and racecheck) on `tf32_dev.py sanitize`, the timing
# table against cuBLAS TF32, and bench_gemm.py's tf32 rows (JSON into OUTDIR) unless --no-bench.
# Usage: bash benchmarks/tf32_dev.sh OUTDIR [--no-bench]   (total limit: $TOTAL, 280 s)
set -u
out=${1:?OUTDIR}
mkdir -p "$out"
tree=$(pwd)
site=$(mktemp -d)
t0=$SECONDS
total=${TOTAL:-280}
left() { echo $((total - (SECONDS - t0))); }
step() { echo "== $1 ($((SECONDS - t0)) s)"; }
python3 -m pip install -q --no-index --no-deps --target "$site" .whl/*.whl > "$out/setup.log" 2>&1
cp -R gpurt "$site/gpurt" && cp -R kernels "$site/gpurt/kernels"
(cd "$site" && python3 "$tree/setup.py" -q build_ext --inplace) >> "$out/setup.log" 2>&1 || true
export PYTHONPATH="$site" GPURT_CACHE_DIR="$site/cache" PYTHONDONTWRITEBYTECODE=1
export GPURT_GEMM_AUTOTUNE=0 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$out/smi.txt" 2>&1
cat "$out/smi.txt"
step precompile
timeout 60 python3 -P benchmarks/tf32_dev.py precompile >> "$out/setup.log" 2>&1; tail -n 1 "$out/setup.log"
step check
timeout ${CHECK_LIMIT:-60} python3 -P benchmarks/tf32_dev.py check > "$out/check.log" 2>&1
echo "check rc=$?"; grep -E "^FAIL|^checks:" "$out/check.log" | head -20
step pytest
timeout ${TEST_LIMIT:-45} python3 -P -m pytest -p no:cacheprovider -q tests/test_gemm.py \
    -k "${GEMM_TESTS:-tf32 or wgmma_all or every_config}" > "$out/pytest.log" 2>&1
tail -n 3 "$out/pytest.log"; grep -E "^(FAILED|ERROR)" "$out/pytest.log" | head -10
step sanitizers
san="compute-sanitizer --report-api-errors no --error-exitcode 3"
for tool in ${TOOLS:-memcheck racecheck}; do
    quick=""; [ $tool = memcheck ] || quick=--quick
    GPURT_NO_CACHING=1 timeout ${SAN_LIMIT:-45} $san --tool $tool python3 -P benchmarks/tf32_dev.py sanitize $quick > "$out/san-$tool.log" 2>&1
    echo "$tool rc=$? $(grep -c PASS "$out/san-$tool.log") passed, $(grep -c FAIL "$out/san-$tool.log") failed: $(tail -n 1 "$out/san-$tool.log")"
done
step time
limit=$(( $(left) - ${BENCH_MIN:-30} )); [ $limit -gt 20 ] || limit=20
timeout $limit python3 -P benchmarks/tf32_dev.py time --json "$out/tf32_time.json" > "$out/time.log" 2>&1
echo "time rc=$?"; grep -v "^{" "$out/time.log" | tail -n 14
if [ "${2:-}" != "--no-bench" ]; then
    step bench
    limit=$(left); [ $limit -gt 10 ] || limit=10
    (cd benchmarks && timeout $limit python3 bench_gemm.py --dtypes tf32 \
        --shapes ${BENCH_SHAPES:-1024,2048,4096,8192,8192x8192x512,16x4096x4096,128x4096x4096,4096x4096x1024,127x257x61,1000,3000x5000x2000,4099} \
        --json "$out/gemm_tf32.json") > "$out/bench.log" 2>&1
    echo "bench rc=$?"; grep -E "^\{" "$out/bench.log" | cut -c1-200
fi
step done
