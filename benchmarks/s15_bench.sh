#!/usr/bin/env bash
# Session 15's benchmark call (run from the tree's root; OUTDIR gets few files): bench_softmax,
# bench_elementwise and bench_gemm (autotuner on; BENCHES picks some: session 16 ran gemm
# alone, session 17 softmax, gemm_decode and gemm) through scripts/gpu-check with one shared
# kernel cache, the tuner's results file after bench_gemm, then tune_defaults.py's shapes in
# that cache with the time left (the new GEMM source digest's tuning table).
set -u
top=${1:?OUTDIR}
export GPURT_CACHE_DIR=/tmp/kc
W=$(mktemp -d)
for b in ${BENCHES:-softmax elementwise gemm}; do
    mkdir -p "$W/$b"
    case $b in gemm) lim=300 ;; gemm_decode) lim=150 ;; *) lim=60 ;; esac
    timeout $((lim + 20)) scripts/gpu-check "$W/$b" --bench $b --bench-timeout $lim \
        --deadline $((lim + 10)) > "$W/$b/run.log" 2>&1
    echo "bench $b rc=$?"; cp "$W/$b/bench.json" "$top/bench-$b.json" 2>/dev/null
done
found=$(find /tmp/kc -name gemm-tune-v1.json 2>/dev/null | head -n 1)
[ -n "$found" ] && cp "$found" "$top/gemm-tune-bench.json"
(
    out=$W/tune; total=${TUNE_TOTAL:-120}; . benchmarks/_device_site.sh
    export GPURT_CACHE_DIR=/tmp/kc
    GPURT_GEMM_AUTOTUNE=1 timeout -k 5 $((total - 10)) python3 -P benchmarks/tune_defaults.py \
        --budget $((total - 35)) -o "$top/gemm-tune.json" > "$out/tune.log" 2>&1
    echo "tune rc=$? $(grep -c 'tuned in' "$out/tune.log") tuned; $(tail -n 1 "$out/tune.log")"
)
tar czf "$top/logs.tgz" -C "$W" .
