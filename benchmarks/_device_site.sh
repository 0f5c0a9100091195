# Sourced by the *_dev.sh device scripts (run from the tree's root), with `out` (the output
# folder) and `total` (the call's time limit in seconds) set: makes gpurt importable as
# scripts/gpu-check does (the carried wheels, gpurt with kernels/ as gpurt/kernels, the C
# launch extension) in a fresh site folder with its own kernel cache, records the GPU's clocks,
# and defines `left` (seconds left) and `step NAME` (a timestamped heading).
mkdir -p "$out"
tree=$(pwd)
site=$(mktemp -d)
t0=$SECONDS
left() { echo $((total - (SECONDS - t0))); }
step() { echo "== $1 ($((SECONDS - t0)) s)"; }
python3 -m pip install -q --no-index --no-deps --target "$site" .whl/*.whl > "$out/setup.log" 2>&1
cp -R gpurt "$site/gpurt" && cp -R kernels "$site/gpurt/kernels"
(cd "$site" && python3 "$tree/setup.py" -q build_ext --inplace) >> "$out/setup.log" 2>&1 || true
export PYTHONPATH="$site" GPURT_CACHE_DIR="$site/cache" PYTHONDONTWRITEBYTECODE=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw \
    --format=csv > "$out/smi.txt" 2>&1
# san NAME TOOL LIMIT SCRIPT ARGS...: python3 SCRIPT under compute-sanitizer TOOL (its own
# kernel cache), the log in $out/san-NAME-TOOL.log; prints the PASS / FAIL counts and summary.
san() {
    local name=$1 tool=$2 limit=$3; shift 3
    local log=$out/san-$name-$tool.log
    GPURT_CACHE_DIR=$site/cache-$name-$tool timeout "$limit" compute-sanitizer \
        --report-api-errors no --error-exitcode 3 --tool "$tool" python3 -P "$@" > "$log" 2>&1
    echo "$tool $name rc=$? $(grep -c ^PASS "$log") passed, $(grep -c ^FAIL "$log") failed:" \
         "$(tail -n 1 "$log")"
}
# cluster_sanitizers LIMIT: the cluster kernels' sets (decode_dev sanitize / race, wgirr_dev
# --set s17x, softmax_cluster_san) under memcheck, racecheck and synccheck, all in the
# background (the caller waits).
cluster_sanitizers() {
    local tool
    for tool in memcheck racecheck synccheck; do
        san decode $tool "$1" benchmarks/decode_dev.py sanitize &
        san race $tool "$1" benchmarks/decode_dev.py race &
        san x $tool "$1" benchmarks/wgirr_dev.py sanitize --set s17x &
        san soft $tool "$1" benchmarks/softmax_cluster_san.py &
    done
}
# rowload_checks LIMIT: the rowload GPU tests beside compute-sanitizer's memcheck and racecheck
# over s22_nk_san.py (x @ W.T through every kind of dot-product tile); waits for all three.
rowload_checks() {
    local tool
    for tool in memcheck racecheck; do san nk $tool "$1" benchmarks/s22_nk_san.py & done
    step tests
    timeout "$1" python3 -P -m pytest -q -n 8 -p no:cacheprovider tests/test_gemm_rowload.py \
        > "$out/pytest.log" 2>&1
    echo "pytest rc=$?"; tail -n 1 "$out/pytest.log"
    grep -E "^(FAILED|ERROR)" "$out/pytest.log" | head
    wait
}
