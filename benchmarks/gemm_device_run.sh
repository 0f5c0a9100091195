#!/usr/bin/env bash
# One device-machine call for the GEMM work (see notes_gemm.md): the GEMM tests, the benchmark
# table against cuBLAS, and a per-config sweep on the key shapes, all under $OUT.
# STEPS picks the steps (default "smoke test bench configs"; "simt" adds the fp32 SIMT
# variant sweep, benchmarks/simt_sweep.py); TEST_K is pytest's -k filter.
# Limits (seconds) per step: T_SMOKE, T_SIMT, T_TEST, T_BENCH, T_CFG. Run from the repository root.
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
steps=" ${STEPS:-smoke test bench configs} "
step() { case "$steps" in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
if step simt; then
    t0=$SECONDS
    (cd benchmarks && timeout -k 5 "${T_SIMT:-120}" python3 simt_sweep.py ${SIMT_ARGS:-} \
        --json "$out/simt.json" > "$out/simt.log" 2>&1)
    echo "simt rc=$? in $((SECONDS - t0)) s" >> "$out/run.log"
fi
if step smoke; then
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
fi
if step test; then
    t0=$SECONDS
    cp -R tests pyproject.toml "$site/"  # run from the site: its gpurt has kernels/ (no -P: torch dislikes it)
    (cd "$site" && timeout -s INT -k 10 "${T_TEST:-120}" python3 -m pytest tests/test_gemm.py -q -ra \
        -p no:cacheprovider --durations=8 -k "${TEST_K:-not compile}" > "$out/pytest.log" 2>&1)
    echo "pytest rc=$? in $((SECONDS - t0)) s" >> "$out/run.log"
fi
if step bench; then
    t0=$SECONDS
    timeout -k 10 "${T_BENCH:-110}" python3 benchmarks/bench_gemm.py ${BENCH_ARGS:-} \
        --json "$out/bench.json" > "$out/bench.log" 2>&1
    echo "bench rc=$? in $((SECONDS - t0)) s" >> "$out/run.log"
fi
if step configs; then
    t0=$SECONDS
    timeout -k 10 "${T_CFG:-70}" python3 benchmarks/bench_gemm.py --configs \
        --shapes "${CFG_SHAPES:-4096,8192,8192x8192x512,16x4096x4096}" --dtypes "${CFG_DTYPES:-bf16,fp32}" \
        --json "$out/configs.json" > "$out/configs.log" 2>&1
    echo "configs rc=$? in $((SECONDS - t0)) s" >> "$out/run.log"
fi
cat "$out/run.log"
for log in smoke simt; do [ -f "$out/$log.log" ] && tail -c 5000 "$out/$log.log"; done
if [ -f "$out/pytest.log" ]; then
    grep -E "passed|failed|error" "$out/pytest.log" | tail -3
    grep -E "^(FAILED|ERROR)" "$out/pytest.log" | head -30
fi
[ -f "$out/bench.log" ] && tail -c 3500 "$out/bench.log"
[ -f "$out/configs.log" ] && tail -c 2500 "$out/configs.log"
true
