#!/usr/bin/env bash
# The decode family's racecheck hazards (benchmarks/notes_gemm.md, session 5): racecheck over
# `decode_dev.py race` (the full sweep's TMA-aligned case with every decode config) for the
# kernel as it is and for variants patched into the device site's copy of gemm_decode.cu
# (the tree is not changed):
#   fence   fence.proxy.async.shared::cta after the consumers' last wgmma wait, before the
#           partial-tile stores reuse the ring that TMA (the async proxy) wrote
#   lineinfo  the kernel as it is, built with -lineinfo, racecheck with device backtraces
# Usage: bash benchmarks/decode_race_dev.sh OUTDIR   (limit: $TOTAL, default 280 s)
set -u
out=${1:?OUTDIR}
total=${TOTAL:-280}
. "$(dirname "${BASH_SOURCE[0]}")/_device_site.sh"
export GPURT_GEMM_AUTOTUNE=0
src="$site/gpurt/kernels/gemm_decode.cu"
cp "$src" "$out/gemm_decode.as-is.cu"
for variant in as-is fence lineinfo; do
    cp "$out/gemm_decode.as-is.cu" "$src"
    extra=""
    case $variant in
        fence) python3 - "$src" <<'PY'
import sys
path = sys.argv[1]
text = open(path).read()
anchor = "        wgmma_wait<0>();\n"
assert text.count(anchor) == 1, "the consumers' last wgmma wait moved: update this script"
fence = '        asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory");\n'
open(path, "w").write(text.replace(anchor, anchor + fence))
PY
            ;;
        lineinfo) export GPURT_GEMM_NVRTC_OPTIONS=-lineinfo; extra="--show-backtrace device" ;;
    esac
    step "racecheck $variant"
    GPURT_CACHE_DIR="$site/cache-$variant" timeout $(( $(left) / 2 )) compute-sanitizer \
        --tool racecheck --report-api-errors no --print-limit 10 $extra \
        python3 -P benchmarks/decode_dev.py race > "$out/race-$variant.log" 2>&1
    echo "$variant rc=$? $(grep -c PASS "$out/race-$variant.log") passed," \
        "$(grep -E 'RACECHECK SUMMARY' "$out/race-$variant.log")"
    unset GPURT_GEMM_NVRTC_OPTIONS
done
step done
