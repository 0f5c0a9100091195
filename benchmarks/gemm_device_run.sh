#!/usr/bin/env bash
# One device-machine call for the GEMM work (see notes_gemm.md): the GEMM tests, the benchmark
# table against cuBLAS, and a per-config sweep on the key shapes, all under $OUT.
# Limits (seconds) per step: T_TEST, T_BENCH, T_CFG. Run from the repository root.
set -u
out=${OUT:-/tmp/gemm-out}
mkdir -p "$out"
site=$(mktemp -d)
cp -R gpurt "$site/gpurt"
cp -R kernels "$site/gpurt/kernels"
find "$site" -name __pycache__ -prune -exec rm -rf {} +
if ls .whl/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --target "$site" .whl/*.whl > /dev/null 2>&1 || true
fi
export PYTHONPATH=$site GPURT_CACHE_DIR=$site/cache PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
{
    nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv
    python3 -c 'import torch, cupy, cuda.bindings; print("torch", torch.__version__, "cupy", cupy.__version__, "cuda-bindings", cuda.bindings.__version__)'
} > "$out/run.log" 2>&1
t0=$SECONDS
timeout -k 5 "${T_SMOKE:-60}" python3 benchmarks/gemm_smoke.py > "$out/smoke.log" 2>&1
echo "smoke rc=$? in $((SECONDS - t0)) s" >> "$out/run.log"
# keep the benchmarks informative: turn off what the smoke check found broken
off=""
grep -q "^wgmma.*c2.*\(WRONG\|ERROR\)" "$out/smoke.log" && off="$off,cluster"
grep -q "^wgmma.*tmaC.*\(WRONG\|ERROR\)" "$out/smoke.log" && off="$off,tma_store"
if ! grep -q "^smoke:" "$out/smoke.log" || \
        grep -v "c2\|tmaC" "$out/smoke.log" | grep -q "^wgmma.*\(WRONG\|ERROR\)"; then
    off="$off,wgmma"
fi
if [ -n "$off" ]; then
    export GPURT_GEMM_DISABLE=${off#,}
    echo "GPURT_GEMM_DISABLE=$GPURT_GEMM_DISABLE for the benchmarks" >> "$out/run.log"
fi
t0=$SECONDS
cp -R tests pyproject.toml "$site/"  # run from the site: its gpurt has kernels/ (no -P: torch dislikes it)
(cd "$site" && timeout -s INT -k 10 "${T_TEST:-120}" python3 -m pytest tests/test_gemm.py -q -ra \
    -p no:cacheprovider --durations=8 -k "not compile" > "$out/pytest.log" 2>&1)
echo "pytest rc=$? in $((SECONDS - t0)) s" >> "$out/run.log"
t0=$SECONDS
timeout -k 10 "${T_BENCH:-110}" python3 benchmarks/bench_gemm.py ${BENCH_ARGS:-} \
    --json "$out/bench.json" > "$out/bench.log" 2>&1
echo "bench rc=$? in $((SECONDS - t0)) s" >> "$out/run.log"
t0=$SECONDS
timeout -k 10 "${T_CFG:-70}" python3 benchmarks/bench_gemm.py --configs \
    --shapes "${CFG_SHAPES:-4096,8192,8192x8192x512,16x4096x4096}" --dtypes "${CFG_DTYPES:-bf16,fp32}" \
    --json "$out/configs.json" > "$out/configs.log" 2>&1
echo "configs rc=$? in $((SECONDS - t0)) s" >> "$out/run.log"
cat "$out/run.log"
cat "$out/smoke.log"
grep -E "passed|failed|error" "$out/pytest.log" | tail -3
grep -E "^(FAILED|ERROR)" "$out/pytest.log" | head -30
tail -c 3500 "$out/bench.log"
tail -c 2500 "$out/configs.log"
