# Session 21's device call for the simt kernel's K-major copies with up to 8 rows a thread
# (kernels/gemm_simt.cu's KMajorShape: P = min(E, 8) instead of min(E, 4), so that more
# threads side by side along K read each row: 32-byte sectors whole where E = 16), a variant
# made by sed in the site (tag p8) against the committed source (tag new): kernel-only cold,
# tuner off, every simt candidate and gemm's pick against cuBLAS, B given N x K (t) and N-major.
out=$OUT total=${TOTAL:-400}
source benchmarks/_device_site.sh
logs=$site/logs && mkdir -p "$logs"
cp kernels/gemm_simt.cu "$logs/new.cu"
sed 's/P = E < 4 ? E : 4, KPT = E \/ P/P = E < 8 ? E : 8, KPT = E \/ P/' kernels/gemm_simt.cu \
    > "$logs/p8.cu"
cmp -s "$logs/new.cu" "$logs/p8.cu" && echo "sed changed nothing" && exit 1
cd benchmarks
for tag in new p8; do
    cp "$logs/$tag.cu" "$site/gpurt/kernels/gemm_simt.cu"
    step "time $tag"
    GPURT_GEMM_AUTOTUNE=0 timeout 170 python3 s19_mma.py --tag $tag --dtype fp32 \
        --kernels simt --repeat 10 --json "$logs/time-$tag.json" --shapes \
4096x4096x4096t,2048x2048x2048t,1024x1024x1024t,257x4096x4096t,96x4096x4096t,32x11008x4096t,\
128x11008x4096t,1023x5003x2999t,97x4093x4099,127x8191x2053,1024x1024x1024 \
        > "$logs/time-$tag.log" 2>&1
    echo "rc=$?"; grep -E "Error|'ok': False" "$logs/time-$tag.log" | tail -n 5
done
python3 s21_rows.py "$out/time.json" "$logs"/time-*.json
cd ..
step done
