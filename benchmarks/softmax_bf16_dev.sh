#!/usr/bin/env bash
# s7-softbf16's one device run (issue 17, 16-bit forward rows): softmax_edges_dev.py --routes
# --set softbf16 (each variant before the change (--old) and after it, torch and the copy in
# the same process), the GPU tests of the 16-bit forward shapes and of the chooser's 16-bit
# picks at long and odd lengths, and compute-sanitizer memcheck, racecheck and synccheck over
# the forced 16-bit forward shapes. (The timed run also had an --exp16 source: commit 6b6daea.)
# Every step has its own time limit, so one that hangs still leaves the others' logs.
#
#     bash benchmarks/softmax_bf16_dev.sh OUTDIR OLD_SOFTMAX_CU
set -u
out=$(mkdir -p "$1" && cd "$1" && pwd)
old=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
tree=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$tree"
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target "$site" .whl/*.whl > "$out/setup.log" 2>&1
cp -R gpurt "$site/gpurt" && cp -R kernels "$site/gpurt/kernels"
export PYTHONPATH="$site" GPURT_CACHE_DIR="$site/cache"
nvidia-smi -L > "$out/device.txt" 2>&1
step() {  # step NAME LIMIT COMMAND...: its output in $out/NAME.log, its time and rc after
    local name=$1 limit=$2 t0=$SECONDS rc=0
    shift 2
    timeout -s INT -k 10 "$limit" "$@" > "$out/$name.log" 2>&1 || rc=$?
    echo "$name rc=$rc seconds=$((SECONDS - t0))" | tee -a "$out/steps.txt"
}
step routes 85 python3 benchmarks/softmax_edges_dev.py --routes --set softbf16 --warm \
    --old "$old" --json "$out/routes.json"
step tests 40 python3 -P -m pytest -p no:cacheprovider -q -ra tests/test_softmax.py -k \
    "16bit_forward or (ticket_rows and bfloat16 and softmax and not backward)"
sanitize() {
    step "$1" "$2" compute-sanitizer --tool "$1" --report-api-errors no \
        python3 -P -m pytest -p no:cacheprovider -q tests/test_softmax.py -k "$3"
}
sanitize memcheck 25 "16bit_forward and bfloat16"
sanitize racecheck 20 "16bit_forward and bfloat16 and log"
sanitize synccheck 12 "16bit_forward and float16 and log"
tar -C "$out" -czf "$out/runs.tgz" --exclude runs.tgz --exclude routes.json \
    --exclude steps.txt . 2>/dev/null
