#!/usr/bin/env bash
# Session 9's one device call of helper s9-splitk (issue 17; run from the tree's root): makes
# gpurt importable (_device_site.sh), and a second copy whose kernels/ is OLD_KERNELS (main's:
# the pair-loop ending); runs the correctness jobs (tests/test_gemm.py -k "split or
# every_config", test_gemm_decode.py, test_gemm_workspace.py, test_gemm_planned.py; memcheck
# and racecheck over `splitk3_dev.py sanitize`) while the timed programs compile; then, alone
# on the GPU, `splitk3_dev.py time` with main's kernels (--changed), this tree's (everything),
# this tree's with one slice in flight (GEMM_WG_SUM_SLICES=1: s8-splitk2-ending's sum) and
# main's again (the noise), and the comparisons (OUTDIR/compare.txt). Logs in OUTDIR/runs.tgz.
# Usage: bash benchmarks/splitk3_dev.sh OUTDIR OLD_KERNELS   (limit: $TOTAL, 280 s)
set -u
out=${1:?OUTDIR}
old_kernels=$(cd "${2:?OLD_KERNELS}" && pwd)
total=${TOTAL:-280}
. "$(dirname "${BASH_SOURCE[0]}")/_device_site.sh"
export GPURT_GEMM_AUTOTUNE=0
logs=$(mktemp -d)/logs; mkdir -p "$logs"  # outside OUTDIR: 8 files come back
old=$(mktemp -d)
cp -R "$site/gpurt" "$old/gpurt" && rm -rf "$old/gpurt/kernels" && cp -R "$old_kernels" "$old/gpurt/kernels"
as_old() { PYTHONPATH="$old:$site" GPURT_CACHE_DIR="$old/cache" "$@"; }
as_sb1() { GPURT_GEMM_NVRTC_OPTIONS=-DGEMM_WG_SUM_SLICES=1 "$@"; }
pack() { tar czf "$out/runs.tgz" -C "$logs/.." logs 2>/dev/null; }
xdist() { python3 -c 'import xdist' 2>/dev/null && echo "-n $1"; }
py="python3 -P"
dev=benchmarks/splitk3_dev.py

step correctness-and-precompile
timeout $(( 135 - (SECONDS - t0) )) $py -m pytest -p no:cacheprovider -q $(xdist 6) tests/test_gemm.py \
    -k "split or every_config" > "$logs/pytest-gemm.log" 2>&1 &
timeout $(( 135 - (SECONDS - t0) )) $py -m pytest -p no:cacheprovider -q $(xdist 3) tests/test_gemm_decode.py \
    tests/test_gemm_workspace.py tests/test_gemm_planned.py > "$logs/pytest-rest.log" 2>&1 &
timeout 75 $py $dev precompile > "$logs/precompile-new.log" 2>&1
echo "precompile new: $(tail -n 1 "$logs/precompile-new.log")"
as_old timeout 60 $py $dev precompile --changed > "$logs/precompile-old.log" 2>&1 &
as_sb1 timeout 60 $py $dev precompile --changed > "$logs/precompile-sb1.log" 2>&1 &
san="compute-sanitizer --report-api-errors no --error-exitcode 3"
for tool in memcheck racecheck; do
    (timeout $(( 135 - (SECONDS - t0) )) $san --tool $tool $py $dev sanitize > "$logs/san-$tool.log" 2>&1
     echo "$tool rc=$? $(grep -c PASS "$logs/san-$tool.log") passed: $(tail -n 1 "$logs/san-$tool.log")" \
        > "$logs/san-$tool.txt") &
done
wait
echo "precompile old: $(tail -n 1 "$logs/precompile-old.log"); sb1: $(tail -n 1 "$logs/precompile-sb1.log")"
for f in "$logs"/pytest-*.log; do
    echo "$(basename "$f"): $(tail -n 1 "$f")"; grep -E "^(FAILED|ERROR)" "$f" | head -n 10
done
cat "$logs"/san-*.txt
grep -hE "FAIL|ERROR|graph nodes|=========" "$logs"/san-*.log | head -n 12
pack

for run in old new sb1 old2; do
    step "time $run"
    limit=$(( $(left) - 8 )); [ $limit -gt 5 ] || break
    case $run in
        new) timeout $limit $py $dev time --json "$logs/$run.json" --bits "$logs/$run.bits.json" ;;
        sb1) as_sb1 timeout $limit $py $dev time --changed --json "$logs/$run.json" \
                --bits "$logs/$run.bits.json" ;;
        *) as_old timeout $limit $py $dev time --changed --json "$logs/$run.json" \
                --bits "$logs/$run.bits.json" ;;
    esac > "$logs/time-$run.log" 2>&1
    echo "time $run rc=$?"; grep -vE '^\{' "$logs/time-$run.log" | tail -n 5
    cp "$logs/$run.json" "$out/$run.json" 2>/dev/null
    pack
done
step compare
for pair in "old new" "sb1 new" "old old2"; do
    set -- $pair
    echo "== $1 -> $2"
    [ -f "$logs/$1.json" ] && [ -f "$logs/$2.json" ] && \
        $py $dev compare "$logs/$1.json" "$logs/$2.json"
done > "$out/compare.txt" 2>&1
cat "$out/compare.txt" | cut -c1-150
pack
step done
