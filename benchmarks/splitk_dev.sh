#!/usr/bin/env bash
# Session 8's one device call for the split-K ending (issue 17; run from the tree's root):
# makes gpurt importable (_device_site.sh), and a second copy whose kernels/ is OLD_KERNELS
# (main's, for the before numbers); runs the correctness jobs (tests/test_gemm.py -k "split or
# every_config", test_gemm_decode.py, test_gemm_workspace.py, test_gemm_planned.py; memcheck
# and racecheck over `splitk_dev.py sanitize`) while both copies' timed programs compile; then,
# alone on the GPU, `splitk_dev.py time` with main's kernels, with this tree's, and main's
# again (the run's noise), and the comparison (OUTDIR/compare.txt). Packs the logs into
# OUTDIR/runs.tgz.
# Usage: bash benchmarks/splitk_dev.sh OUTDIR OLD_KERNELS   (limit: $TOTAL, 228 s)
set -u
out=${1:?OUTDIR}
old_kernels=$(cd "${2:?OLD_KERNELS}" && pwd)
total=${TOTAL:-228}
. "$(dirname "${BASH_SOURCE[0]}")/_device_site.sh"
export GPURT_GEMM_AUTOTUNE=0
logs=$(mktemp -d)/logs; mkdir -p "$logs"  # outside OUTDIR: 8 files come back
old=$(mktemp -d)
cp -R "$site/gpurt" "$old/gpurt" && rm -rf "$old/gpurt/kernels" && cp -R "$old_kernels" "$old/gpurt/kernels"
as_old() { PYTHONPATH="$old:$site" GPURT_CACHE_DIR="$old/cache" "$@"; }
pack() { tar czf "$out/runs.tgz" -C "$logs/.." logs 2>/dev/null; }
xdist() { python3 -c 'import xdist' 2>/dev/null && echo "-n $1"; }
py="python3 -P"

step correctness-and-precompile
timeout $(( 125 - (SECONDS - t0) )) $py -m pytest -p no:cacheprovider -q $(xdist 6) tests/test_gemm.py \
    -k "split or every_config" > "$logs/pytest-gemm.log" 2>&1 &
timeout $(( 125 - (SECONDS - t0) )) $py -m pytest -p no:cacheprovider -q $(xdist 3) tests/test_gemm_decode.py \
    tests/test_gemm_workspace.py tests/test_gemm_planned.py > "$logs/pytest-rest.log" 2>&1 &
timeout 60 $py benchmarks/splitk_dev.py precompile > "$logs/precompile-new.log" 2>&1
echo "precompile new: $(tail -n 1 "$logs/precompile-new.log")"
as_old timeout 60 $py benchmarks/splitk_dev.py precompile > "$logs/precompile-old.log" 2>&1 &
san="compute-sanitizer --report-api-errors no --error-exitcode 3"
for tool in memcheck racecheck; do
    (timeout $(( 125 - (SECONDS - t0) )) $san --tool $tool $py benchmarks/splitk_dev.py sanitize \
        > "$logs/san-$tool.log" 2>&1
     echo "$tool rc=$? $(grep -c PASS "$logs/san-$tool.log") passed: $(tail -n 1 "$logs/san-$tool.log")" > "$logs/san-$tool.txt") &
done
wait
echo "precompile old: $(tail -n 1 "$logs/precompile-old.log")"
for f in "$logs"/pytest-*.log; do
    echo "$(basename "$f"): $(tail -n 1 "$f")"; grep -E "^(FAILED|ERROR)" "$f" | head -n 10
done
cat "$logs"/san-*.txt
grep -E "FAIL|=========" "$logs"/san-*.log | head -n 10
pack

for run in old new old2; do
    step "time $run"
    limit=$(( $(left) - 6 )); [ $limit -gt 5 ] || break
    if [ "$run" = new ]; then
        timeout $limit $py benchmarks/splitk_dev.py time --json "$out/$run.json" \
            --bits "$logs/$run.bits.json" > "$logs/time-$run.log" 2>&1
    else
        as_old timeout $limit $py benchmarks/splitk_dev.py time --json "$out/$run.json" \
            --bits "$logs/$run.bits.json" > "$logs/time-$run.log" 2>&1
    fi
    echo "time $run rc=$?"; grep -vE '^\{' "$logs/time-$run.log" | tail -n 5
    cp "$out/$run.json" "$logs/$run.json" 2>/dev/null
    pack
done
step compare
$py benchmarks/splitk_dev.py compare "$logs/old.json" "$logs/new.json" | tee "$out/compare.txt"
[ -f "$logs/old2.json" ] && $py benchmarks/splitk_dev.py compare "$logs/old.json" "$logs/old2.json" > "$logs/compare-old-old2.txt"
pack
step done
