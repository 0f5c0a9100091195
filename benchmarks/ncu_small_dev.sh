#!/usr/bin/env bash
# Nsight Compute's full set over one call each of the 64 x 128 tile, 128 x 128 pipelined and
# cuBLAS (torch.matmul) at 1000^3 and 768^3 bf16 (issue 17: the fixed cost of small grids), the
# report and its details page into OUTDIR (session 12).
#     TOTAL=S bash benchmarks/ncu_small_dev.sh OUTDIR
set -u
out=${1:?OUTDIR}
total=${TOTAL:-120}
. "$(dirname "${BASH_SOURCE[0]}")/_device_site.sh"
export GPURT_GEMM_AUTOTUNE=0
timeout $(( $(left) - 10 )) ncu --profile-from-start off --clock-control none --set full \
    -f -o "$out/small" python3 -P benchmarks/wgirr_dev.py ncu --set s12 > "$out/ncu.log" 2>&1
echo "ncu rc=$?"
ncu -i "$out/small.ncu-rep" --page details > "$out/small-details.txt" 2>&1
ncu -i "$out/small.ncu-rep" --page raw --csv > "$out/small-raw.csv" 2>&1
grep -c "^  [a-z_].*(" "$out/small-details.txt"
