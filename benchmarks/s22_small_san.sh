# Session 22: compute-sanitizer (memcheck, racecheck, synccheck) over s22_small_san.py: gemm's
# own fp32 choices under 2^24 multiply-adds (K split down to one tile a slice) and x @ W.T at
# M <= 4, run plainly first.
out=$OUT total=${TOTAL:-300}
source benchmarks/_device_site.sh
export GPURT_GEMM_AUTOTUNE=0
python3 -P benchmarks/s22_small_san.py > "$out/plain.log" 2>&1; echo "plain rc=$?"
cat "$out/plain.log"
for tool in memcheck racecheck synccheck; do san small $tool 250 benchmarks/s22_small_san.py & done
wait
