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
