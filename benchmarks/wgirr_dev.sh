#!/usr/bin/env bash
# One device call for issue 17's irregular and short-K wgmma shapes (run from the tree's root):
# makes gpurt importable (_device_site.sh), compiles wgirr_dev.py's programs in parallel, then
# (each step limited) the timings of every variant next to cuBLAS (JSON into OUTDIR), the
# variants' GPU tests (tests/test_gemm_wgmma_x.py), compute-sanitizer memcheck and racecheck
# on `wgirr_dev.py sanitize`, and with the time left Nsight Compute's L2 counters over one call
# per variant. Logs are packed into OUTDIR/runs.tgz after every step.
# Usage: [SET=split|shortk] [TESTS="pytest args"] bash benchmarks/wgirr_dev.sh OUTDIR
# (total limit: $TOTAL, 285 s). SET=split: session 9's second call (wgirr_dev.py --set split:
# split-row shapes, no ncu); SET=shortk: session 10's short-K ping-pong (its programs only);
# SET=tile192: session 10's 128 x 192 tiles (its programs only; warm timings too); SET=tile192r:
# session 11's 192-row tiles (likewise, and ncu at 3000^3).
# SET=tile64: session 11's 64-row tiles (its programs only; warm timings too; no ncu).
# SET=stages: session 11b's 5 stages of 128 x 192 (likewise, and ncu at 3000^3).
# SET=s12t64: session 12's 64-row tiles in clusters (likewise, and ncu at 1000^3).
# SET=s12lean: the lean bits (twice each, warm too; ncu at 768^3 and 1024^3; synccheck too).
# SET=s13narrow: the 96- and 80-wide tiles (twice each, warm too; the tests' variants precompiled).
# SET=s13ct: the same tiles on C^T = B^T A^T (Config.swap; likewise; ncu at 1536^3 and 768^3).
# TESTS: the pytest selection (default: tests/test_gemm_wgmma_x.py -k "not compile").
# SAN_TOOLS: the compute-sanitizer tools, SAN_LIMIT seconds each (default: memcheck racecheck).
# TUNE_S: seconds (at most) for the default tuning table after the sanitizers, autotuner on,
# this site's kernel cache (benchmarks/tune_defaults.py -> OUTDIR/gemm-tune.json; a .cu edit
# moves the GEMM source digest, and the committed table's keys with it). Default 0: none.
set -u
top=${1:?OUTDIR}
work=$(mktemp -d)  # logs outside OUTDIR: only runs.tgz and the timings' JSON go back
out=$work/w
total=${TOTAL:-285}
set_=${SET:-first}
. "$(dirname "${BASH_SOURCE[0]}")/_device_site.sh"
export GPURT_GEMM_AUTOTUNE=0 PYTHONUNBUFFERED=1
pack() { tar czf "$top/runs.tgz" -C "$work" w; cp "$out/wgirr_time.json" "$top/" 2>/dev/null; }
cat "$out/smi.txt"
step precompile
timeout ${COMPILE_LIMIT:-70} python3 -P benchmarks/wgirr_dev.py precompile --set "$set_" >> "$out/setup.log" 2>&1
echo "precompile rc=$?"; grep -E "precompiled|Error" "$out/setup.log" | head -5; pack
step time
reserve=${AFTER_TIME:-110}
while [ $(left) -gt $((reserve + 15)) ]; do  # again after a hung variant (rc 5), without it
    timeout $(( $(left) - reserve )) python3 -P benchmarks/wgirr_dev.py time --set "$set_" \
        --json "$out/wgirr_time.json" >> "$out/time.log" 2>&1
    rc=$?; echo "time rc=$rc"; [ $rc -eq 5 ] || break
done
grep -E "HUNG|Error" "$out/time.log" | head -5; sed -n '/kernel-only us/,$p' "$out/time.log"; pack
step pytest
if [ $(left) -gt 30 ]; then
    eval "set -- ${TESTS:-tests/test_gemm_wgmma_x.py -k \"not compile\"}"
    timeout $(( $(left) - ${AFTER_PYTEST:-42} )) python3 -P -m pytest -p no:cacheprovider -q \
        "$@" > "$out/pytest.log" 2>&1
    echo "pytest rc=$?"; tail -n 2 "$out/pytest.log"; grep -E "^(FAILED|ERROR)" "$out/pytest.log" | head -10
fi
pack
step sanitizers
san="compute-sanitizer --report-api-errors no --error-exitcode 3"
for tool in ${SAN_TOOLS:-memcheck racecheck}; do
    log="$out/san-$tool.log"
    timeout ${SAN_LIMIT:-18} $san --tool $tool python3 -P benchmarks/wgirr_dev.py sanitize --set "$set_" > "$log" 2>&1
    echo "$tool rc=$? $(grep -c ^PASS "$log") passed, $(grep -c ^FAIL "$log") failed: $(tail -n 1 "$log")"
done
pack
if [ "${TUNE_S:-0}" -gt 0 ] && [ $(left) -gt 40 ]; then
    step tune
    lim=$(( $(left) - 5 )); [ $lim -gt $TUNE_S ] && lim=$TUNE_S
    GPURT_GEMM_AUTOTUNE=1 timeout -k 5 $lim python3 -P benchmarks/tune_defaults.py \
        --budget $((lim - 25)) -o "$top/gemm-tune.json" > "$out/tune.log" 2>&1
    echo "tune rc=$? $(grep -c 'tuned in' "$out/tune.log") tuned; $(tail -n 1 "$out/tune.log")"
    if [ ! -s "$top/gemm-tune.json" ]; then  # killed: the results file written after each tune
        found=$(find "$GPURT_CACHE_DIR" -name gemm-tune-v1.json 2>/dev/null | head -n 1)
        [ -n "$found" ] && cp "$found" "$top/gemm-tune.json" && echo "tune: copied $found"
    fi
    pack
fi
step ncu
metrics=gpu__time_duration.sum,lts__t_requests.sum,lts__t_requests_srcunit_tex.sum
metrics=$metrics,lts__t_sectors_srcunit_tex_op_read.sum,dram__bytes_read.sum
metrics=$metrics,lts__t_tag_requests.avg.pct_of_peak_sustained_elapsed
metrics=$metrics,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed
metrics=$metrics,smsp__inst_executed.sum,sm__cycles_elapsed.max
[ "$set_" != split ] && [ "$set_" != tile64 ] && [ $(left) -gt 12 ] && timeout $(( $(left) - 4 )) ncu --profile-from-start off --clock-control none --csv \
    --metrics $metrics python3 -P benchmarks/wgirr_dev.py ncu --set "$set_" > "$out/ncu.csv" 2> "$out/ncu.err"
echo "ncu rc=$? $(grep -c gemm_wgmma "$out/ncu.csv") kernel rows"; pack
step done
