# Session 21's device call: the simt kernel's cp.async copies with an L2 prefetch hint
# (`.L2::128B`, as cuBLAS's align-4 SGEMM issues its 4-byte LDGSTS), variants made by sed
# from kernels/gemm_simt.cu in the site: new (no hint), pf4 (the 4-byte copies: A's K-major
# and N-major rows not 16-byte aligned), pfall (the 16-byte ones too). Kernel-only cold,
# tuner off, gemm's pick and every simt candidate against cuBLAS at odd pitches, the pick
# at aligned and other shapes; rows merged into time.json. ~170 s.
out=$OUT total=${TOTAL:-300}
source benchmarks/_device_site.sh
logs=$site/logs && mkdir -p "$logs"
cp kernels/gemm_simt.cu "$logs/new.cu"
sed 's/cp.async.ca.shared.global \[/cp.async.ca.shared.global.L2::128B [/' kernels/gemm_simt.cu \
    > "$logs/pf4.cu"
sed 's/cp.async.cg.shared.global \[/cp.async.cg.shared.global.L2::128B [/' "$logs/pf4.cu" \
    > "$logs/pfall.cu"
cd benchmarks
for tag in new pf4 pfall; do
    cp "$logs/$tag.cu" "$site/gpurt/kernels/gemm_simt.cu"
    step "time $tag"
    GPURT_GEMM_AUTOTUNE=0 timeout 60 python3 s19_mma.py --tag $tag --dtype fp32 \
        --kernels simt --repeat 10 --shapes 97x4093x4099,127x8191x2053,2053x3001x1999 \
        --json "$logs/time-$tag.json" > "$logs/time-$tag.log" 2>&1
    GPURT_GEMM_AUTOTUNE=0 timeout 50 python3 s19_mma.py --tag $tag --dtype fp32 --only-chosen \
        --repeat 10 --shapes 97x4096x4096,1024x1024x1024,2048x2048x2048,4096x4096x4096,\
3000x5000x2000,128x4097x4097,1023x1025x1027,61x3001x7919,31x8191x1021,97x4093x4099t \
        --json "$logs/time-$tag-2.json" > "$logs/time-$tag-2.log" 2>&1
    tail -n 40 "$logs/time-$tag.log" "$logs/time-$tag-2.log" | grep "'tag'" \
        | sed -E "s/'(dtype|rel_err|ok)': [^,]*, //g"
done
python3 s21_rows.py "$out/time.json" "$logs"/time-*.json
cd ..
step done
