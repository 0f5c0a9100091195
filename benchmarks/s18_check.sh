#!/usr/bin/env bash
# Session 18's review call, prepared and not run in full (the device budget ran out; the
# full sanitizer sweep and a short bench ran instead). Run from the tree's root: the
# finalizer deferral's GPU tests (graphs, launch, memory), the cluster kernels' GPU tests
# (one cluster_sync helper now) and compute-sanitizer memcheck / racecheck / synccheck over
# them (decode_dev sanitize/race, wgirr_dev --set s17x, softmax_cluster_san) side by side;
# then GEMM at shapes the tuning table does not hold: bench_gemm_decode (M = 1..128 x layer
# sizes, graph replay and one call) and bench_gemm at prime and odd sizes (torch tensors in;
# warm, graph, one call), cuBLAS in the same process.
set -u
top=${1:?OUTDIR}
out=$(mktemp -d)/w; total=${TOTAL:-560}; . benchmarks/_device_site.sh
export PYTHONPATH=$PYTHONPATH:$tree/benchmarks PYTHONUNBUFFERED=1
step "tests and sanitizers, side by side"
timeout 230 python3 -P -m pytest -p no:cacheprovider -q -n 6 tests/test_graphs.py \
    tests/test_launch.py tests/test_memory.py tests/test_gemm_decode.py \
    tests/test_gemm_skinny.py tests/test_gemm_wgmma_x.py tests/test_gemm_lean.py -m gpu \
    > "$out/pytest.log" 2>&1 &
cluster_sanitizers 220
wait
echo "pytest: $(tail -n 1 "$out/pytest.log")"; grep -E "^(FAILED|ERROR)" "$out/pytest.log" | head
step "bench_gemm_decode"
timeout 170 python3 -P benchmarks/bench_gemm_decode.py --json "$top/decode.json" \
    > "$out/decode.log" 2>&1
echo "decode rc=$?"
step "bench_gemm, untuned odd and prime shapes"
timeout $(( $(left) - 10 )) python3 -P benchmarks/bench_gemm.py --dtypes bf16,fp16,fp32 \
    --repeat 9 --json "$top/odd.json" --shapes \
1x5003x4099,7x4099x11003,29x11003x4099,61x14341x4099,97x4093x4099,127x8191x2053,\
131x3001x1999,509x1021x2039,1531x2053x1021 > "$out/odd.log" 2>&1
echo "odd rc=$?"
step done
tar czf "$top/check-logs.tgz" -C "$(dirname "$out")" w
