# Session 20's last device call: the whole GPU suite (scripts/gpu-check --tests-only, 12
# workers), then bench_gemm's fp16 768^3 row (the 64 x 96 C^T rule's pick) for the README.
GPURT_CHECK_WORKERS=12 scripts/gpu-check "$OUT" --tests-only --deadline 525
tail -n 12 "$OUT/check.log"
out=$(mktemp -d) total=60
source benchmarks/_device_site.sh
(cd benchmarks && timeout 35 python3 bench_gemm.py --dtypes fp16 --shapes 768 \
    --json "$OUT/gemm768fp16.json" > /dev/null 2>&1); echo "bench768 rc=$?"
