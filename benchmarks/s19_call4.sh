# Session 19, device call 4 (issue 17): gemm_pack's 16-byte chunk copies. The copy kernel's
# own test and the packed route's GPU tests, memcheck over the copy test; then gemm's choice
# at packed-route shapes, kernel-only cold (s19_mma.py --only-chosen, autotuner off), on this
# tree and on the element-wise copies (benchmarks/.s19_old), one after the other; and the fp32
# rowload heuristic's pick.
out=$OUT total=${TOTAL:-300}
source benchmarks/_device_site.sh
old=$(mktemp -d)
cp -R "$site/." "$old/" && rm -rf "$old/cache"
cp benchmarks/.s19_old/gemm_pack.cu "$old/gpurt/kernels/gemm_pack.cu"
step tests
san pack memcheck 100 -m pytest -p no:cacheprovider -q tests/test_gemm_pack.py -m gpu \
    -k "copy_kernel_moves" &
timeout 120 python3 -P -m pytest -p no:cacheprovider -q -n 6 tests/test_gemm_pack.py \
    tests/test_gemm_simt_pack.py -m gpu > "$out/pytest.log" 2>&1
echo "pytest: $(tail -n 1 "$out/pytest.log")"; grep -E "^(FAILED|ERROR)" "$out/pytest.log" | head
wait
shapes=97x4093x4099,128x4099x4099,64x4099x4099,127x8191x2053,4099x4099x4099,97x4093x4099t
for tag in new old; do
    step $tag
    site_for=$site; [ $tag = old ] && site_for=$old
    (cd benchmarks && PYTHONPATH=$site_for GPURT_CACHE_DIR=$site_for/cache \
        GPURT_GEMM_AUTOTUNE=0 timeout 60 python3 s19_mma.py --tag $tag --only-chosen \
        --shapes $shapes --json "$out/pack-$tag.json" > "$out/pack-$tag.log" 2>&1)
done
step f32
(cd benchmarks && GPURT_GEMM_AUTOTUNE=0 timeout 40 python3 s19_mma.py --tag f32 --dtype fp32 \
    --only-chosen --shapes 1x5003x4099,3x11003x4093,2x4099x11003 --json "$out/f32.json" \
    > "$out/f32.log" 2>&1)
python3 - "$out" <<'PY'
import json, sys
for name in ("pack-new", "pack-old", "f32"):
    try:
        for r in json.load(open(f"{sys.argv[1]}/{name}.json"))["rows"]:
            print(name, r["shape"], r["config"], r["us"], r["cublas_us"], r["ratio"], r["ok"])
    except OSError:
        print(name, "missing")
PY
step done
