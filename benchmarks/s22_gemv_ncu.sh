# Session 22: Nsight Compute over fp32 x @ W.T at M = 1, gemm's dot products against cuBLAS's
# GEMV (s22_gemv_ncu.py): DRAM and L2 traffic, throughput, stalls; the details page into $OUT.
out=$OUT total=${TOTAL:-200}
source benchmarks/_device_site.sh
GPURT_GEMM_AUTOTUNE=0 timeout $(( $(left) - 30 )) ncu --profile-from-start off \
    --clock-control none --set full -f -o "$out/gemv" python3 -P benchmarks/s22_gemv_ncu.py \
    > "$out/ncu.log" 2>&1
echo "ncu rc=$?"
ncu -i "$out/gemv.ncu-rep" --page details > "$out/gemv-details.txt" 2>&1
grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Memory Throughput|L2 Hit Rate|L1/TEX Hit|Achieved Occupancy|Registers Per|Grid Size|Block Size|Mem Busy|Max Bandwidth|dram__|Elapsed Cycles|Warp Cycles Per Issued|Issued Warp|No Eligible|One or More" \
    "$out/gemv-details.txt" | head -120
rm -f "$out/gemv.ncu-rep"
