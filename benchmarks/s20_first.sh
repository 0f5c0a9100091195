# Prepared in session 19 for session 20's first device call (issue 17): (1) the two test files
# session 19's last call ran under a limit too short to print pytest's summary (one failure,
# name lost: test_gemm_small.py, test_gemm_rowload.py, with its first-call helper never run
# on a GPU); (2) bench_gemm's published table again (its packed 4099 rows now take the 16-byte
# pack copies and the timed route; the fp32 rowload rows are new), for benchmarks/publish.py.
out=$OUT total=${TOTAL:-580}
source benchmarks/_device_site.sh
step tests
timeout 200 python3 -P -m pytest -p no:cacheprovider -q -ra -n 8 tests/test_gemm_small.py \
    tests/test_gemm_rowload.py > "$out/pytest.log" 2>&1
echo "pytest: $(tail -n 1 "$out/pytest.log")"; grep -E "^(FAILED|ERROR)" "$out/pytest.log" | head
step bench
(cd benchmarks && timeout $(( $(left) - 15 )) python3 bench_gemm.py --json "$out/gemm.json" \
    > "$out/bench.log" 2>&1)
tail -n 3 "$out/bench.log"
step done
