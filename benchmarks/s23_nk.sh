# Session 23: x @ W.T through rowload's dot-product tiles with 16-64 rows of W a CTA and, on
# 16-byte aligned rows, every lane's load its own (slices in whole 128 / 256 k steps; W's first
# loads in flight while A is staged). GPU tests (the new tiles and last session's unfinished
# subset), compute-sanitizer over s22_nk_san.py, then kernel-only cold against cuBLAS
# (s19_mma.py) with the new source and with 88641c0's gemm_rowload.cu and _gemm_rowload.py
# (benchmarks/old_s23/, ignored by git: `git show 88641c0:kernels/...`), each candidate at K
# splits 1-8. (Call 1's source chose aligned rows at run time; superseded.)
out=$OUT total=${TOTAL:-560}
source benchmarks/_device_site.sh
old=$(mktemp -d)
cp -R "$site/." "$old/"
cp benchmarks/old_s23/gemm_rowload.cu benchmarks/old_s23/_gemm_rowload.py "$old/gpurt/kernels/"
rm -rf "$old/cache"
for tool in memcheck racecheck synccheck; do san nk $tool 260 benchmarks/s22_nk_san.py & done
step tests
timeout 250 python3 -P -m pytest -q -n 10 --dist loadfile -p no:cacheprovider \
    tests/test_gemm_rowload.py tests/test_gemm_simt.py tests/test_planned_launch.py \
    tests/test_gemm_decode.py tests/test_gemm_wgmma_x.py tests/test_launch.py tests/test_gemm.py \
    -k "not slow" > "$out/pytest.log" 2>&1
echo "pytest rc=$?"; tail -n 1 "$out/pytest.log"; grep -E "^(FAILED|ERROR)" "$out/pytest.log" | head
wait
cat "$out"/san-*.log | grep -E "^(FAIL|=========) " | head -5
step time
cd benchmarks
F32=${SHAPES:-1x4096x4096t,1x11008x4096t,1x4096x11008t,1x14336x4096t,2x4096x4096t,4x4096x4096t,4x11008x4096t,3x4099x4099t,1x5003x3001t}
export GPURT_GEMM_AUTOTUNE=0
timeout $(( $(left) / 2 - 10 )) python3 s19_mma.py --tag new --dtype fp32 --kernels rowload \
    --splits 1,2,4,8 --repeat 15 --json "$out/new.json" --shapes "$F32" > "$out/new.log" 2>&1
echo "new rc=$?"
PYTHONPATH=$old GPURT_CACHE_DIR=$old/cache timeout $(( $(left) - 30 )) python3 s19_mma.py \
    --tag old --dtype fp32 --kernels rowload --splits 1,2,4,8 --repeat 15 --json "$out/old.json" \
    --shapes "$F32" > "$out/old.log" 2>&1
echo "old rc=$?"
python3 - "$out/new.json" "$out/old.json" <<'PY'
import json, sys
best = {}
for path in sys.argv[1:]:
    try:
        rows = json.load(open(path))["rows"]
    except Exception as exc:
        print(path, exc); continue
    for r in rows:
        key = (r["tag"], r["shape"])
        if r["config"].endswith("*"):
            best.setdefault(key, {})["pick"] = (r["us"], r["config"][:40], r["ratio"], r["ok"])
        b = best.setdefault(key, {}).get("best")
        if r["ok"] and (b is None or r["us"] < b[0]):
            best[key]["best"] = (r["us"], r["config"][:40], r["ratio"])
        if not r["ok"]:
            print("NOT OK", r)
for key in sorted(best):
    print(key, best[key])
PY
cd ..
step done
