#!/usr/bin/env bash
# What the 16-bit softmax forward's exps cost (issue 17, session 15; run from the tree's root):
# softmax_mid_dev.py --old with softmax.cu's output-pass exps (F), reduction-pass exps (L) or
# both (FL) replaced by a multiplication: wrong results, a bound on the MUFU work's share.
# Usage: bash benchmarks/softmax_exp_dev.sh OUTDIR
set -u
out=${1:?OUTDIR}; total=${TOTAL:-200}
. "$(dirname "${BASH_SOURCE[0]}")/_device_site.sh"
export PYTHONPATH="$PYTHONPATH:$tree/benchmarks"
F='s/y\[k\] = exp2_ftz((c\[k\] - row.x) \* SM_LOG2E) \* inv;/y[k] = ((c[k] - row.x) * SM_LOG2E) * inv;/'
L='s/s += exp2_ftz((c\[k\] - ref) \* SM_LOG2E);/s += ((c[k] - ref) * SM_LOG2E);/'
for v in F L FL; do
    case $v in F) e=(-e "$F") ;; L) e=(-e "$L") ;; FL) e=(-e "$F" -e "$L") ;; esac
    (sed "${e[@]}" kernels/softmax.cu; echo; cat kernels/softmax_ends.cu) > "$out/softmax-$v.cu"
    step "no exps: $v"
    (cd /tmp && timeout $(( $(left) - 5 )) python3 -P "$tree/benchmarks/softmax_mid_dev.py" \
        --old "$out/softmax-$v.cu" --json "$out/exp-$v.json" > "$out/exp-$v.log" 2>&1)
    tail -12 "$out/exp-$v.log"
done
