#!/usr/bin/env bash
# s13-simt's device call: the branch-free K-tile copies (Config.flat) and 64 x 32 warps against
# the kernels they vary. Precompile; the heuristic's plans and the same plans flat at issue 17's
# shapes against cuBLAS (cold / warm / single), two rounds; forced tiles at 1000^3 and on
# 2053 x 3001 x 1999's tail; tests/test_gemm_simt_flat.py; memcheck and racecheck over the
# variants; the main loops' SASS as compiled there. Each step time-limited; logs and JSON in
# OUTDIR, packed into $PACK (default OUTDIR/runs.tgz) as it goes.
# Usage: bash benchmarks/simt_s13_dev.sh OUTDIR   (total limit: $TOTAL, 228 s)
set -u
out=${1:?OUTDIR}
total=${TOTAL:-228}
. "$(dirname "${BASH_SOURCE[0]}")/_device_site.sh"
export GPURT_GEMM_AUTOTUNE=0
dev="python3 -P benchmarks/simt_s13_dev.py"
pack() { tar -czf "${PACK:-$out/runs.tgz}" -C "$out" --exclude runs.tgz . 2>/dev/null; }
cap() { local l=$(( $(left) - 5 )); [ $l -gt 3 ] || l=3; [ $l -lt $1 ] && echo $l || echo $1; }
shapes=1000x1000x1000,2053x3001x1999,4096x4096x4096,1536x1536x1536,1024x1024x1024,\
768x768x768,3000x3000x3000
step precompile
timeout $(cap 50) $dev precompile >> "$out/setup.log" 2>&1
echo "precompile rc=$?"; tail -n 2 "$out/setup.log"
for round in 1 2; do
    step "time round $round"
    timeout $(cap 55) $dev time --json "$out/time-r$round.json" --shapes $shapes \
        > "$out/time-r$round.log" 2>&1
    echo "time rc=$?"; cut -c1-200 "$out/time-r$round.log" | grep -v '^{' | head -5; pack
done
step configs
timeout $(cap 30) $dev configs --shapes 1000x1000x1000,645x3008x1999,768x768x768 \
    --json "$out/configs.json" \
    > "$out/configs.log" 2>&1
echo "configs rc=$?"; pack
step pytest
timeout $(cap 30) python3 -P -m pytest -p no:cacheprovider -q tests/test_gemm_simt_flat.py \
    > "$out/pytest.log" 2>&1
echo "pytest rc=$?"; tail -n 3 "$out/pytest.log"; pack
step memcheck
timeout $(cap 15) compute-sanitizer --tool memcheck --report-api-errors no $dev sanitize \
    > "$out/memcheck.log" 2>&1
echo "memcheck rc=$?"; tail -n 2 "$out/memcheck.log"; pack
step racecheck
timeout $(cap 30) compute-sanitizer --tool racecheck --report-api-errors no \
    $dev sanitize --count 3 \
    > "$out/racecheck.log" 2>&1
echo "racecheck rc=$?"; tail -n 2 "$out/racecheck.log"; pack
step sass
timeout $(cap 8) python3 -P benchmarks/simt_sass.py --usage \
    "gemm_simt<64, 128, 8, 8, 3, true, false, true>" \
    "gemm_simt<64, 128, 8, 8, 3, true, false, true, 1>" \
    "gemm_simt<64, 128, 8, 8, 3, true, false, true, 3>" > "$out/sass.txt" 2>&1
echo "sass rc=$?"; grep -v "^    " "$out/sass.txt" | cut -c1-160
step done
pack
