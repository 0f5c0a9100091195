#!/usr/bin/env bash
# The decode family's racecheck hazards (benchmarks/notes_gemm.md, session 5): racecheck over
# `decode_dev.py race` (the full sweep's TMA-aligned case with every decode config) for the
# kernel as it is and for variants patched into the device site's copy of gemm_decode.cu
# (the tree is not changed):
#   syncwarp  __syncwarp() closing the producer warpgroup's branch, so warp 0 (whose lane 0
#           issued the TMA loads) reaches the CTA barrier before the summing loop converged
#   barsync   the SPLIT == 1 CTA barrier written as bar.sync 0 (aligned) instead of
#           __syncthreads()
#   both      syncwarp and barsync
#   own       the partial tile in its own shared memory after the ring (not written over it)
#   consumers SPLIT == 1 sums among the consumer warpgroups only (named barrier, the
#           producer warpgroup leaves after its loads)
# (Session 6 on an H200: the async-proxy fence variant left 20 of 26 errors; -lineinfo put
# every hazard between the partial-tile store, line 196, and load_partial, line 72, of
# SPLIT == 1 kernels only: the clusters' aligned barrier.cluster was clean.)
# Usage: bash benchmarks/decode_race_dev.sh OUTDIR   (limit: $TOTAL, default 280 s)
set -u
out=${1:?OUTDIR}
total=${TOTAL:-280}
. "$(dirname "${BASH_SOURCE[0]}")/_device_site.sh"
export GPURT_GEMM_AUTOTUNE=0
src="$site/gpurt/kernels/gemm_decode.cu" host="$site/gpurt/kernels/_gemm_decode.py"
cp "$src" "$out/gemm_decode.as-is.cu"
cp "$host" "$out/_gemm_decode.as-is.py"
for variant in ${VARIANTS:-as-is syncwarp barsync both own consumers}; do
    cp "$out/gemm_decode.as-is.cu" "$src"
    cp "$out/_gemm_decode.as-is.py" "$host"
    python3 - "$src" "$host" "$variant" <<'PY'
import sys
path, host, variant = sys.argv[1:]
text = open(path).read()
patches = {
    "syncwarp": ("    } else {\n        const int half = warpgroup - 1;",
                 "        __syncwarp();\n    } else {\n        const int half = warpgroup - 1;"),
    "barsync": ("        __syncthreads();\n    }\n    // Rank r",
                '        asm volatile("bar.sync 0;\\n" ::: "memory");\n    }\n    // Rank r'),
}
many = {
    "own": [("const u32 full_bar = base + (RING > PART ? RING : PART);",
             "const u32 full_bar = base + RING + PART;"),
            ("(smem_raw + (base - smem_addr(smem_raw)));",
             "(smem_raw + (base - smem_addr(smem_raw)) + RING);"),
            ("const u32 at = base + 4 * (", "const u32 at = base + RING + 4 * (")],
    "consumers": [("        __syncthreads();\n    }\n    // Rank r",
                   "        named_sync(1, 128 * CONSUMERS);\n    }\n    // Rank r"),
                  ("    for (int u = threadIdx.x; u < ROWS * cols; u += THREADS) {",
                   "    if (SPLIT == 1 && warpgroup == 0) return;\n"
                   "    constexpr int READERS = SPLIT == 1 ? THREADS - 128 : THREADS;\n"
                   "    for (int u = threadIdx.x - (SPLIT == 1 ? 128 : 0); u < ROWS * cols;"
                   " u += READERS) {")],
}
chosen = {"as-is": [], "both": ["syncwarp", "barsync"]}.get(variant, [variant])
edits = [e for name in chosen for e in (many[name] if name in many else [patches[name]])]
for old, new in edits:
    assert text.count(old) == 1, f"{variant}: the anchor {old!r} moved; update this script"
    text = text.replace(old, new)
open(path, "w").write(text)
if variant == "own":
    py = open(host).read()
    old = "return max(ring, partial) + 16"
    assert py.count(old) == 1, "shared_mem moved; update this script"
    open(host, "w").write(py.replace(old, "return ring + partial + 16"))
PY
    extra=""
    step "racecheck $variant"
    GPURT_CACHE_DIR="$site/cache-$variant" timeout $(( $(left) / 2 )) compute-sanitizer \
        --tool racecheck --report-api-errors no --print-limit 10 $extra \
        python3 -P benchmarks/decode_dev.py race > "$out/race-$variant.log" 2>&1
    echo "$variant rc=$? $(grep -c PASS "$out/race-$variant.log") passed," \
        "$(grep -E 'RACECHECK SUMMARY' "$out/race-$variant.log")"
done
step done
