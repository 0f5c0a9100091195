#!/usr/bin/env bash
# Session 9's second device call of helper s9-splitk (issue 17; run from the tree's root): the
# chooser after splitk3_dev.sh's sweep. Makes gpurt importable (_device_site.sh); runs
# tests/test_gemm_decode.py and tests/test_gemm.py -k "split or heuristic", memcheck and
# racecheck over `splitk3_dev.py sanitize` (the chosen decode tilings among them) while the
# programs compile; then, alone on the GPU, `splitk3_dev.py time --auto` (gemm's choice against
# the configs it replaced). Logs in OUTDIR/runs.tgz.
# Usage: bash benchmarks/splitk3_verify.sh OUTDIR   (limit: $TOTAL, 185 s)
set -u
out=${1:?OUTDIR}
total=${TOTAL:-185}
. "$(dirname "${BASH_SOURCE[0]}")/_device_site.sh"
export GPURT_GEMM_AUTOTUNE=0
logs=$(mktemp -d)/logs; mkdir -p "$logs"
pack() { tar czf "$out/runs.tgz" -C "$logs/.." logs 2>/dev/null; }
xdist() { python3 -c 'import xdist' 2>/dev/null && echo "-n $1"; }
py="python3 -P"
dev=benchmarks/splitk3_dev.py

step correctness-and-precompile
timeout 110 $py -m pytest -p no:cacheprovider -q $(xdist 4) tests/test_gemm_decode.py \
    > "$logs/pytest-decode.log" 2>&1 &
timeout 110 $py -m pytest -p no:cacheprovider -q $(xdist 4) tests/test_gemm.py -k "split or heuristic" \
    > "$logs/pytest-gemm.log" 2>&1 &
timeout 60 $py $dev precompile > "$logs/precompile.log" 2>&1
echo "precompile: $(tail -n 1 "$logs/precompile.log")"
san="compute-sanitizer --report-api-errors no --error-exitcode 3"
for tool in memcheck racecheck; do
    (timeout $(( 120 - (SECONDS - t0) )) $san --tool $tool $py $dev sanitize > "$logs/san-$tool.log" 2>&1
     echo "$tool rc=$? $(grep -c PASS "$logs/san-$tool.log") passed: $(tail -n 1 "$logs/san-$tool.log")" \
        > "$logs/san-$tool.txt") &
done
wait
for f in "$logs"/pytest-*.log; do
    echo "$(basename "$f"): $(tail -n 1 "$f")"; grep -E "^(FAILED|ERROR)" "$f" | head -n 10
done
cat "$logs"/san-*.txt
grep -hE "FAIL|ERROR|graph nodes|=========" "$logs"/san-*.log | head -n 12
pack

step "time auto"
limit=$(( $(left) - 8 )); [ $limit -gt 5 ] || limit=5
timeout $limit $py $dev time --auto --json "$logs/auto.json" --bits "$logs/auto.bits.json" \
    > "$logs/time-auto.log" 2>&1
echo "time auto rc=$?"; grep -vE '^\{' "$logs/time-auto.log" | tail -n 5
cp "$logs/auto.json" "$out/auto.json" 2>/dev/null
$py -c "
import json
for r in json.load(open('$logs/auto.json')):
    print(f\"{r['shape']:>24} {r.get('chosen', r['config'])[:34]:<34} cuBLAS {r['cublas_graph_us']:>6} \"
          f\"gpurt {r.get('gpurt_graph_us', r.get('error', '-'))} x{r.get('ratio_graph', '-')} \"
          f\"host {r.get('gpurt_host_us', '-')}/{r['cublas_host_us']} err {r.get('rel_err', '-')}\")
" | tee "$out/auto.txt"
pack
step done
