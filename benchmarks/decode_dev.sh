#!/usr/bin/env bash
# One device call for the decode GEMM family (run from the tree's root): makes gpurt importable
# (_device_site.sh), compiles the decode variants in parallel into the disk cache, then the
# forced-config checks (decode_dev.py check), tests/test_gemm_decode.py, memcheck and racecheck
# on `decode_dev.py sanitize`, bench_gemm_decode.py (heuristics unless BENCH_AUTOTUNE=1; JSON
# into OUTDIR) unless --no-bench, with SWEEP=seconds the quick gemm sweep of
# scripts/sanitize_sweep.py, and with the time left the per-variant timings (decode_dev.py
# time; DECODE_M=comma list of M) unless --no-time.
# Usage: bash benchmarks/decode_dev.sh OUTDIR [--no-time] [--no-bench]   (limit: $TOTAL, 290 s)
set -u
out=${1:?OUTDIR}
total=${TOTAL:-290}
. "$(dirname "${BASH_SOURCE[0]}")/_device_site.sh"
export GPURT_GEMM_AUTOTUNE=0
step precompile
timeout 90 python3 -P benchmarks/decode_dev.py precompile >> "$out/setup.log" 2>&1; tail -n 3 "$out/setup.log"
step check
timeout 60 python3 -P benchmarks/decode_dev.py check > "$out/check.log" 2>&1; echo "check rc=$?"
grep -E "FAIL|checks:" "$out/check.log" | head -n 20
step pytest
timeout ${TEST_LIMIT:-60} python3 -P -m pytest -p no:cacheprovider -q tests/test_gemm_decode.py ${PYTEST_EXTRA:-} > "$out/pytest.log" 2>&1
tail -n 3 "$out/pytest.log"
step sanitizers
san="compute-sanitizer --report-api-errors no --error-exitcode 3"
for tool in memcheck racecheck; do
    timeout 40 $san --tool $tool python3 -P benchmarks/decode_dev.py sanitize > "$out/san-$tool.log" 2>&1
    echo "$tool rc=$? $(grep -c PASS "$out/san-$tool.log") passed: $(tail -n 1 "$out/san-$tool.log")" >> "$out/san.txt"
done
cat "$out/san.txt"
case " $* " in *" --no-bench "*) ;; *)
    step bench
    limit=$(( $(left) - ${TIME_MIN:-60} )); [ $limit -gt 10 ] || limit=10
    (cd benchmarks && GPURT_GEMM_AUTOTUNE=${BENCH_AUTOTUNE:-0} timeout $limit python3 bench_gemm_decode.py --json "$out/gemm_decode.json" ${BENCH_EXTRA:-}) > "$out/bench.log" 2>&1
    echo "bench rc=$?"
    grep -vE "^\{" "$out/bench.log" | tail -n 45 ;;
esac
if [ -n "${SWEEP:-}" ]; then  # the quick gemm sweep of scripts/sanitize_sweep.py (memcheck)
    step sweep
    timeout $SWEEP python3 -P scripts/sanitize_sweep.py --out "$out/sweep" --tier quick --kinds gemm > "$out/sweep.log" 2>&1
    echo "sweep rc=$?"; tail -n 4 "$out/sweep.log"
fi
case " $* " in *" --no-time "*) ;; *)
    step time
    limit=$(( $(left) - 3 )); [ $limit -gt 10 ] || limit=10
    timeout $limit python3 -P benchmarks/decode_dev.py time --json "$out/time.json" > "$out/time.log" 2>&1
    echo "time rc=$?"; tail -n 22 "$out/time.log" ;;
esac
step done
