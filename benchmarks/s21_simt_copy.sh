# Session 21's device call for the simt kernel at rows that are not 16-byte aligned
# (kernels/gemm_simt.cu): MNMajorCopy<VEC=false>'s four 4-byte copies take floats ML apart
# (each warp-wide cp.async reads and writes consecutive words), and split-K's partial sums
# lie in rows padded to 4 floats (16-byte stores and loads at any N). (1) The GEMM GPU tests
# beside compute-sanitizer memcheck, racecheck and synccheck over benchmarks/s21_simt_san.py;
# (2) kernel-only cold times, tuner off, of every simt candidate and gemm's pick against
# cuBLAS for each kernel source given as TAG=FILE (swapped into the site's kernels in turn),
# merged into time.json (SHAPES1: every candidate; SHAPES2: the pick only). ~100 s + ~45 s a
# source. Session 21 ran it with
# SOURCES="old=OLD remap=REMAP": OLD = `git show d9b961f:kernels/gemm_simt.cu`, REMAP = the
# copies' change alone (results/gemm-simt-pitch-s21-nvidia-h100.json).
out=$OUT total=${TOTAL:-400}
source benchmarks/_device_site.sh
logs=$site/logs && mkdir -p "$logs"
cp kernels/gemm_simt.cu "$logs/new.cu"
tags=new
for pair in ${SOURCES:-}; do cp "${pair#*=}" "$logs/${pair%%=*}.cu" && tags="$tags ${pair%%=*}"; done
step "tests + sanitizers"
for tool in memcheck racecheck synccheck; do
    san simt $tool 120 benchmarks/s21_simt_san.py &
done
timeout 120 python3 -P -m pytest -p no:cacheprovider -q -ra -n 6 -m gpu \
    tests/test_gemm_simt.py tests/test_gemm_simt_pack.py tests/test_gemm_planned.py \
    tests/test_gemm.py tests/test_gemm_pack.py tests/test_gemm_workspace.py > "$logs/pytest.log" 2>&1
echo "pytest rc=$?: $(tail -n 1 "$logs/pytest.log")"
grep -E "^(FAILED|ERROR)" "$logs/pytest.log" | head -n 20
wait
cd benchmarks
for tag in $tags; do
    cp "$logs/$tag.cu" "$site/gpurt/kernels/gemm_simt.cu"
    step "time $tag"
    GPURT_GEMM_AUTOTUNE=0 timeout 100 python3 s19_mma.py --tag $tag --dtype fp32 \
        --kernels simt --repeat 10 --shapes ${SHAPES1:-97x4093x4099,127x8191x2053,2053x3001x1999} \
        --json "$logs/time-$tag.json" > "$logs/time-$tag.log" 2>&1
    GPURT_GEMM_AUTOTUNE=0 timeout 50 python3 s19_mma.py --tag $tag --dtype fp32 --only-chosen \
        --repeat 10 --shapes ${SHAPES2:-97x4096x4096,1024x1024x1024,2048x2048x2048,3000x5000x2000,\
128x4097x4097,1023x1025x1027,61x3001x7919,31x8191x1021,97x4093x4099t,17x5003x2999} \
        --json "$logs/time-$tag-2.json" > "$logs/time-$tag-2.log" 2>&1
    grep -c "'ok': True" "$logs/time-$tag.log" "$logs/time-$tag-2.log"
    grep -E "Error|'ok': False" "$logs/time-$tag.log" "$logs/time-$tag-2.log" | tail -n 5
done
python3 s21_rows.py "$out/time.json" "$logs"/time-*.json
cd ..
step done
