#!/usr/bin/env bash
# s7-softlong's one device run (issue 17, rows of 1M): softmax_edges_dev.py --routes --set
# ticket (the chooser's ticket variants against the clusters of 16 and the split, torch and
# the copy in the same process), the GPU tests of the ticket and split routes, and
# compute-sanitizer memcheck, racecheck and synccheck over the ticket tests. Every step has
# its own time limit, so one that hangs still leaves the others' logs.
#
#     bash benchmarks/softmax_ticket_dev.sh OUTDIR
set -u
out=$(mkdir -p "$1" && cd "$1" && pwd)
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
step routes 90 python3 benchmarks/softmax_edges_dev.py --routes --set ticket --warm \
    --json "$out/routes.json"
step tests 50 python3 -P -m pytest -p no:cacheprovider -q -ra tests/test_softmax.py \
    -k "ticket or split or stands_in or clusters_of_16"
sanitize() {
    step "$1" "$2" compute-sanitizer --tool "$1" --report-api-errors no \
        python3 -P -m pytest -p no:cacheprovider -q tests/test_softmax.py -k "$3"
}
sanitize memcheck 40 "ticket_chunks or (ticket_rows and float32)"
sanitize racecheck 25 "ticket_chunks and (float32 or bfloat16)"
sanitize synccheck 20 "ticket_chunks and bfloat16"
tar -C "$out" -czf "$out/runs.tgz" --exclude runs.tgz --exclude routes.json \
    --exclude steps.txt . 2>/dev/null
