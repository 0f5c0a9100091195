# Session 23's last call: the whole GPU suite on the session's source (scripts/gpu-check
# --tests-only, 16 workers), cut to the device time left.
out=$OUT total=${TOTAL:-390}
GPURT_CHECK_WORKERS=${WORKERS:-16} scripts/gpu-check "$out/suite" --tests-only \
    --deadline "${DEADLINE:-320}" > "$out/suite.log" 2>&1
echo "gpu-check rc=$?"; tail -n 6 "$out/suite/check.log"
mv "$out/suite/summary.json" "$out/suite/check.log" "$out/"
grep -E "^(FAILED|ERROR)" "$out/suite/pytest.log" | head -20 > "$out/failed.txt"
rm -rf "$out/suite"
