#!/usr/bin/env bash
# Session 17's first call (run from the tree's root; `.old/kernels` carried: the kernels of the
# tree before, 7e89a80): the merged session-16 branches (decode/skinny and softmax_cluster
# exchanges under shared-memory-restricted fences, gemm_wgmma_x's clusters with the producer's
# tail) and lean bit 8's removal. Their GPU tests and compute-sanitizer memcheck / racecheck /
# synccheck (decode_dev sanitize/race, wgirr_dev --set s17x, softmax_cluster_san) side by side,
# then wgirr_dev time --set s17x on the old and the new tree in turn and softmax_mid_dev
# --cluster-old.
set -u
top=${1:?OUTDIR}
out=$(mktemp -d)/w; total=${TOTAL:-560}; . benchmarks/_device_site.sh
export PYTHONPATH=$PYTHONPATH:$tree/benchmarks PYTHONUNBUFFERED=1
new_site=$site old_site=$(mktemp -d)
cp -R "$site/." "$old_site/" && rm -rf "$old_site/gpurt/kernels" "$old_site/cache"
cp -R .old/kernels "$old_site/gpurt/kernels"
step "tests and sanitizers, side by side"
timeout 220 python3 -P -m pytest -p no:cacheprovider -q -n 6 tests/test_gemm_decode.py \
    tests/test_gemm_decode_tf32.py tests/test_gemm_skinny.py tests/test_gemm_wgmma_x.py \
    tests/test_gemm_lean.py tests/test_gemm_swap.py tests/test_softmax.py \
    tests/test_softmax_ends.py -m gpu > "$out/pytest.log" 2>&1 &
cluster_sanitizers 200
wait
echo "pytest: $(tail -n 1 "$out/pytest.log")"; grep -E "^(FAILED|ERROR)" "$out/pytest.log" | head -20
step "x clusters, old and new tree in turn"
for round in 1 2; do
    for which in old new; do
        [ $(left) -lt 150 ] && break 2
        s=${which}_site
        PYTHONPATH=${!s}:$tree/benchmarks GPURT_CACHE_DIR=${!s}/cache timeout 120 python3 -P \
            benchmarks/wgirr_dev.py time --set s17x --json "$top/x-$which-$round.json" \
            > "$out/x-$which-$round.log" 2>&1
        echo "x $which $round rc=$?"; tail -n 5 "$out/x-$which-$round.log"
    done
done
step "softmax_cluster, old and new"
timeout $(( $(left) - 15 )) python3 -P benchmarks/softmax_mid_dev.py --cluster-old \
    .old/kernels/softmax.cu --json "$top/softmax-cluster.json" > "$out/soft.log" 2>&1
echo "soft rc=$?"; tail -n 16 "$out/soft.log"
step done
tar czf "$top/call1-logs.tgz" -C "$(dirname "$out")" w
