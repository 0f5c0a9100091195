#!/usr/bin/env bash
# One device run of a set of softmax routes (issue 17): softmax_edges_dev.py --routes --set SET
# (the set's variants, torch and the copy in the same process; with OLD_SOFTMAX_CU, each
# variant also built from that source), the set's GPU tests, and compute-sanitizer memcheck,
# racecheck and synccheck over them. Every step has its own time limit, so one that hangs
# still leaves the others' logs. Sets: ticket (s7-softlong: rows of 1M, against the clusters
# of 16 and the split), softbf16 (s7-softbf16: the 16-bit forward rows), softlong16
# (s8-softlong16: 16-bit rows of 200k-1M, ticket chunks sharing a row equally, the one-pass
# 16-bit reduction), softpersist (s8-softpersist: ticket chunks in a persistent grid, two
# stages a CTA, and small chunks for few rows), softprofile (s10-soft16: the chooser's picks
# for 16-bit rows of 200k-1M, ncu with PM sampling of the ticket kernel at 64x1000003 bf16 and
# fp32 (benchmarks/ncu_timeline.py), bench_softmax.py --quick), softends (s10-softends: ticket
# chunks with the rows at the launch's two ends in smaller chunks, softmax_ends; its tests are
# tests/test_softmax_ends.py; with DEADLINE=S the bench gets what is left of S seconds),
# s15w (s15-soft1w: softmax_ticket's TUNE knobs on the one-wave 16-bit forward against the
# pick and the copy; its tests and sanitizers over the tuned variants).
# Session 9's lagged chunks
# (sets softlag, softlag2), session 10's softmax_meet (set softmeet) and session 11's
# softmax_pipe with its ends sweep (set softpipe) lost and were removed; they are on branches
# s9-soft16, s10-soft16 (3235936) and s11-soft (0a73c35). Logs are packed into
# PACK_TO (default OUTDIR)/runs.tgz after every step (a run stopped by its limit keeps them).
#
#     [PACK_TO=DIR] bash benchmarks/softmax_routes_dev.sh SET OUTDIR [OLD_SOFTMAX_CU]
set -u
set_name=${1:?SET}
out=$(mkdir -p "${2:?OUTDIR}" && cd "$2" && pwd)
old=()
[ -z "${3-}" ] || old=(--old "$(cd "$(dirname "$3")" && pwd)/$(basename "$3")")
limits=(90 50 40 25 20 0)  # seconds: routes, tests, memcheck, racecheck, synccheck, bench
files=tests/test_softmax.py
case "$set_name" in
    ticket)
        tests="ticket or split or stands_in or clusters_of_16"
        memcheck="ticket_chunks or (ticket_rows and float32)"
        racecheck="ticket_chunks and (float32 or bfloat16)"
        synccheck="ticket_chunks and bfloat16" ;;
    softbf16)
        tests="16bit_forward or (ticket_rows and bfloat16 and softmax and not backward)"
        memcheck="16bit_forward and bfloat16"
        racecheck="16bit_forward and bfloat16 and log"
        synccheck="16bit_forward and float16 and log" ;;
    softlong16)
        tests="16bit_forward or ticket_chunks or ticket_rows"
        memcheck="(16bit_forward and bfloat16 and not log) or (ticket_chunks and float16 and not log and not backward)"
        racecheck="16bit_forward and float16 and not log"
        synccheck="ticket_chunks and bfloat16 and not log and not backward"
        limits=(80 45 40 25 15) ;;
    softpersist)
        tests="persist or ticket_rows or (16bit_forward and bfloat16 and not log)"
        memcheck="persist_chunks and ((bfloat16 and not log and not backward) or (float32 and backward and not log))"
        racecheck="persist_chunks and bfloat16 and not log and not backward"
        synccheck="persist_chunks and float16 and not bfloat16 and log and not backward"
        limits=(110 45 30 20 15) ;;
    softprofile)
        tests="ticket_rows or captured_graph"
        memcheck="captured_graph and bfloat16"
        racecheck="ticket_rows and bfloat16 and not log and not backward"
        synccheck="ticket_rows and float32 and not log and not backward"
        limits=(60 45 30 20 15 60) ;;
    softends)
        files=tests/test_softmax_ends.py
        tests="not compile"
        memcheck="ends_chunks_against and bfloat16 and not log and not backward"
        racecheck="ends_chunks_against and float16 and not bfloat16 and not log and not backward"
        synccheck="ends_chunks_against and float32 and softmax_backward and not log"
        limits=(95 40 25 15 12 60) ;;
    s15w)
        tests="tuned"
        memcheck="tuned_ticket"
        racecheck="tuned_ticket and bfloat16"
        synccheck="tuned_ticket and bfloat16"
        limits=(140 40 25 15 10 0) ;;
    *) echo "unknown set $set_name" >&2; exit 2 ;;
esac
tree=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$tree"
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target "$site" .whl/*.whl > "$out/setup.log" 2>&1
cp -R gpurt "$site/gpurt" && cp -R kernels "$site/gpurt/kernels"
export PYTHONPATH="$site" GPURT_CACHE_DIR="$site/cache"
nvidia-smi -L > "$out/device.txt" 2>&1
pack_to=${PACK_TO:-$out}  # where runs.tgz (and steps.txt, routes.json, bench.json) go
pack() {
    tar -C "$out" -czf "$pack_to/runs.tgz.part" --exclude 'runs.tgz*' --exclude routes.json \
        --exclude steps.txt --exclude bench.json . 2>/dev/null \
        && mv "$pack_to/runs.tgz.part" "$pack_to/runs.tgz"
    [ "$pack_to" = "$out" ] || for f in steps.txt routes.json bench.json; do
        [ ! -f "$out/$f" ] || cp "$out/$f" "$pack_to/"
    done
}
step() {  # step NAME LIMIT COMMAND...: its output in $out/NAME.log, its time and rc after
    local name=$1 limit=$2 t0=$SECONDS rc=0
    shift 2
    timeout -s INT -k 10 "$limit" "$@" > "$out/$name.log" 2>&1 || rc=$?
    echo "$name rc=$rc seconds=$((SECONDS - t0))" | tee -a "$out/steps.txt"
    pack
}
step routes "${limits[0]}" python3 benchmarks/softmax_edges_dev.py --routes --set "$set_name" --warm \
    "${old[@]}" --json "$out/routes.json"
if [ "$set_name" = softprofile ]; then  # ncu of the ticket kernel: counters, PM sampling
    sections=(--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats
              --section SchedulerStats --section LaunchStats --section Occupancy
              --section ComputeWorkloadAnalysis
              --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct)
    for dtype in bfloat16 float32; do
        for extra in --section=PmSampling ""; do  # without it if this ncu lacks it
            step "ncu-$dtype" 25 ncu --clock-control none -k regex:softmax_ticket --launch-skip 2 \
                --launch-count 1 "${sections[@]}" $extra -f -o "$out/ncu-$dtype" \
                python3 benchmarks/softmax_ncu_dev.py --dtype $dtype
            [ -f "$out/ncu-$dtype.ncu-rep" ] && break
        done
        ncu -i "$out/ncu-$dtype.ncu-rep" --page details > "$out/ncu-$dtype-details.txt" 2>&1
        ncu -i "$out/ncu-$dtype.ncu-rep" --page raw --csv --print-metric-instances values \
            > "$out/ncu-$dtype-raw.csv" 2>&1
        python3 benchmarks/ncu_timeline.py "$out/ncu-$dtype-raw.csv" > "$out/ncu-$dtype-timeline.txt" 2>&1
        pack
    done
fi
step tests "${limits[1]}" python3 -P -m pytest -p no:cacheprovider -q -ra $files -k "$tests"
sanitize() {
    step "$1" "$2" compute-sanitizer --tool "$1" --report-api-errors no \
        python3 -P -m pytest -p no:cacheprovider -q $files -k "$3"
}
sanitize memcheck "${limits[2]}" "$memcheck"
sanitize racecheck "${limits[3]}" "$racecheck"
sanitize synccheck "${limits[4]}" "$synccheck"
[ -z "${DEADLINE-}" ] || limits[5]=$((DEADLINE - SECONDS))
[ "${limits[5]}" -le 0 ] || step bench "${limits[5]}" python3 benchmarks/bench_softmax.py --quick \
    --json "$out/bench.json"
