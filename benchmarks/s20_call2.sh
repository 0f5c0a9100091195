# Session 20's second device call: (1) issue 17's 64 x 96 C^T rule (kernels/_gemm_tune.py
# _swapped64_for) over the band of shapes it now takes, against 64 x 128 lean5 (the pick
# before) and 64 x 80 C^T, kernel-only cold, and bench_gemm's 768^3 rows again; (2) exact fp32
# at M = 97 / 127 on aligned rows beside the odd ones (what the 4-byte copies cost); (3) issue
# 20's tall 16-bit column sums under the walk's width, one-level folds and fewer splits
# (bandwidth_dev.py --set s20); (4) the swapped tiles' GPU tests.
out=$OUT total=${TOTAL:-400}
source benchmarks/_device_site.sh
cd benchmarks
step band
timeout 150 python3 s19_mma.py --tag s20 --dtype bf16 --kernels wgmma --repeat 10 \
    --match "64x128x64 s8 tmaC lean5;64x96x64 s10 tmaC lean5 T;64x80x64 s11 tmaC lean5 T" \
    --shapes 768x768x768,768x768x768t,768x768x2048,512x1024x1024,512x1024x1024t,576x1024x2048,640x896x768,704x832x4096,832x704x1024,896x640x2048,1152x512x1024,448x1280x4096,896x896x896 \
    --json "$out/band.json" > "$out/band.log" 2>&1; tail -n 1 "$out/band.log"
timeout 40 python3 bench_gemm.py --dtypes bf16,fp16 --shapes 768 --json "$out/gemm768.json" \
    > "$out/bench768.log" 2>&1; tail -n 4 "$out/bench768.log"
step fp32
timeout 60 python3 s19_mma.py --tag s20 --dtype fp32 --only-chosen --repeat 10 \
    --shapes 97x4096x4096,97x4093x4099,127x8192x2048,127x8191x2053,113x4096x4096t,113x4099x4099t \
    --json "$out/align.json" > "$out/align.log" 2>&1; tail -n 1 "$out/align.log"
step colsum
timeout 120 python3 bandwidth_dev.py --areas reduce --set s20 --json "$out/colsum.json" \
    > "$out/colsum.log" 2>&1; tail -n 1 "$out/colsum.log"
cd ..
step tests
timeout $(( $(left) - 10 )) python3 -P -m pytest -p no:cacheprovider -q -ra -n 8 \
    tests/test_gemm_swap.py tests/test_gemm_tile96.py > "$out/pytest.log" 2>&1
echo "pytest: $(tail -n 1 "$out/pytest.log")"; grep -E "^(FAILED|ERROR)" "$out/pytest.log" | head
step done
