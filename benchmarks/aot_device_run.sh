#!/usr/bin/env bash
# The AOT work's GPU run (issue 22): install gpurt into a private folder as scripts/gpu-check
# does, run the AOT GPU tests while `gpurt build-kernels --arch $ARCHS` (default sm_90a) builds
# the archive, tune the GEMM's common shapes from it, rebuild it with that default tuning table,
# and time the first 4096^3 bf16 gemm in cold processes (JIT; prebuilt with and without the
# table) against torch's first matmul.
# Usage: bash benchmarks/aot_device_run.sh OUTDIR
set -uo pipefail
out=${1:?OUTDIR}
archs=${ARCHS:-sm_90a}
mkdir -p "$out"
site=/tmp/aot-site
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start )) s] $*" | tee -a "$out/run.log"; }

stamp setup
rm -rf "$site" && mkdir -p "$site/gpurt"
python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" \
    $(ls .whl/*.whl | grep -v nvjitlink) >> "$out/run.log" 2>&1
# nvJitLink: the machine's own (torch's) where there is one, else the carried wheel
if ! python3 -c "from cuda import pathfinder; pathfinder.load_nvidia_dynamic_lib('nvJitLink')" \
        >> "$out/run.log" 2>&1; then
    echo "installing the carried nvJitLink wheel" >> "$out/run.log"
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" \
        .whl/nvidia_nvjitlink*.whl >> "$out/run.log" 2>&1
fi
cp -r gpurt/. "$site/gpurt/" && rm -rf "$site/gpurt/kernels" && cp -r kernels "$site/gpurt/kernels"
cp setup.py "$site/" && (cd "$site" && python3 setup.py -q build_ext --inplace >> "$out/run.log" 2>&1)
export PYTHONPATH=$site
python3 -P -c "
import cuda.bindings, importlib.metadata as md
print('cuda-bindings', cuda.bindings.__version__)
for d in ('nvidia-nvjitlink', 'nvidia-nvjitlink-cu13', 'nvidia-nvfatbin', 'nvidia-cuda-nvrtc', 'torch'):
    try: print(d, md.version(d))
    except Exception as e: print(d, 'absent')
import gpurt._nvrtc.link as l, gpurt._nvrtc.fatbin as f
print('nvJitLink', l.version(), 'nvFatbin', f.version())
" >> "$out/run.log" 2>&1
nproc >> "$out/run.log"

stamp "build-kernels $archs (background) + GPU tests"
( GPURT_CACHE_DIR=/tmp/aot-build-cache timeout 150 python3 -P -m gpurt build-kernels \
      --arch "$archs" -j 14 -o /tmp/aot-k1.gpak > "$out/build1.json" 2> "$out/build1.log";
  echo "rc=$?" >> "$out/build1.log" ) &
build=$!
GPURT_CACHE_DIR=/tmp/aot-test-cache timeout 100 python3 -P -m pytest -q -ra -p no:cacheprovider \
    tests/test_aot.py tests/test_nvrtc.py > "$out/pytest.log" 2>&1
echo "rc=$?" >> "$out/pytest.log"
stamp "tests done: $(tail -n 2 "$out/pytest.log" | head -n 1)"
wait $build
stamp "build done: $(cat "$out/build1.json")"

stamp tune
GPURT_PREBUILT=/tmp/aot-k1.gpak GPURT_CACHE_DIR=/tmp/aot-tune-cache timeout 45 python3 -P \
    benchmarks/tune_defaults.py --budget 25 -o "$out/gemm-tune-default.json" > "$out/tune.log" 2>&1
stamp "tune done rc=$?"

stamp "rebuild with the tuning table"
GPURT_CACHE_DIR=/tmp/aot-build-cache timeout 60 python3 -P -m gpurt build-kernels --arch "$archs" \
    -j 14 -o /tmp/aot-k2.gpak --tuning "$out/gemm-tune-default.json" > "$out/build2.json" \
    2> "$out/build2.log"
stamp "rebuild rc=$? $(cat "$out/build2.json")"
ls -la /tmp/aot-k1.gpak /tmp/aot-k2.gpak >> "$out/run.log" 2>&1
GPURT_PREBUILT=/tmp/aot-k2.gpak python3 -P -m gpurt info --json > "$out/info.json" 2>> "$out/run.log"

stamp "first call"
timeout 100 python3 benchmarks/bench_first_call.py --archive "table=/tmp/aot-k2.gpak" \
    --archive "no table=/tmp/aot-k1.gpak" \
    --json "$out/first_call.json" > "$out/first_call.log" 2>&1
stamp "first call rc=$?"
tar -C "$out" -czf "$out/../aot-logs.tgz" . 2>/dev/null && mv "$out/../aot-logs.tgz" "$out/"
stamp end
