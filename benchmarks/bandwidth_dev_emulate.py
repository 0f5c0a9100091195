"""CPU emulation of the column walk's generated reduction kernels, for a machine without a
GPU (session 6 had no device time left): the CUDA source compiled by g++ with shims (a
std::thread per CUDA thread, blocks one after another so that __shared__ can be static,
std::barrier for __syncthreads, std::atomic_ref for atomicAdd), launched twice with the
plan's grid and arguments (the second launch finds the split counters as the first left
them), checked against float64 numpy. SAN="-fsanitize=address" (with
ASAN_OPTIONS=detect_leaks=0) checks the addresses, SAN="-fsanitize=thread" races on the
shared arrays (racecheck's job). Shuffles are not emulated (the row walk is not covered).

    SMS=8 [QUICK=1] [REALIGN=1] [TREE=G] [BATCH=B] [FROM=R] [TICKET=T] [BATCH_FROM=N] [SAN=...] \
        python benchmarks/bandwidth_dev_emulate.py

TREE=G BATCH=B FROM=R: the column fold in two levels of G splits where a thread of one level
would read more than R partial rows, B partials in flight a thread (reduction.COLUMN_FOLD_TREE,
COLUMN_FOLD_TREE_FROM, reduce_codegen.FOLD_BATCH; default: the shipped values). TICKET=T:
reduce_codegen.TICKET (the acq_rel atomic is emulated by atomicAdd). BATCH_FROM=N:
realign_codegen.REALIGN_BATCH_FROM (the realigned walk's batched loop).
"""

import itertools
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import ml_dtypes
import numpy as np

import gpurt
from _elementwise_fakes import fake_array
from gpurt._elementwise import api, realign_codegen, reduce_codegen, reduction
from gpurt._elementwise.codegen import PRELUDE


class Props:
    multi_processor_count = int(os.environ.get("SMS", "132"))


for where in (gpurt, api):
    where.get_arch = lambda device=None: "sm_90"
    where.current_device = lambda: 0
    where.get_device_properties = lambda device=None: Props()
TREE = int(os.environ.get("TREE", reduction.COLUMN_FOLD_TREE))
BATCH = int(os.environ.get("BATCH", reduce_codegen.FOLD_BATCH))
FROM = int(os.environ.get("FROM", reduction.COLUMN_FOLD_TREE_FROM))
reduce_codegen.TICKET = os.environ.get("TICKET", reduce_codegen.TICKET)
realign_codegen.REALIGN_BATCH_FROM = int(os.environ.get("BATCH_FROM",
                                                      realign_codegen.REALIGN_BATCH_FROM))
reduction._blocks_per_sm = lambda kernel, device: int(os.environ.get("PER_SM", "8"))
captured = []
orig = api.compile
api.compile = lambda src, *a, **k: (captured.append(src), orig(src, *a, **k))[1]

SHIM = r"""
#include <barrier>
#include <atomic>
#include <thread>
#include <vector>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <cmath>
#include <algorithm>
using std::min;
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__
#define __align__(n) alignas(n)
#define __shared__ static
struct dim3 { unsigned x, y, z; };
thread_local dim3 threadIdx, blockIdx; dim3 gridDim, blockDim;
std::barrier<>* g_bar;
inline void __syncthreads() { g_bar->arrive_and_wait(); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline unsigned atomicAdd(unsigned* p, unsigned v) {
    return std::atomic_ref<unsigned>(*p).fetch_add(v); }
template <class T> T __ldcg(const T* p) { return *p; }
template <class T> T __shfl_xor_sync(unsigned, T v, int) { std::abort(); return v; }
struct __nv_bfloat16 { uint16_t b; };
struct __half { uint16_t b; };
inline float _gpurt_ld(__nv_bfloat16 v) {
    uint32_t u = uint32_t(v.b) << 16; float f; memcpy(&f, &u, 4); return f; }
template <typename T> inline T _gpurt_ld(T v) { return v; }
template <typename S> struct _gpurt_cvt {
    template <typename C> static S to(C v) { return static_cast<S>(v); } };
template <typename S, int V> struct alignas(sizeof(S) * V) _gpurt_vec { S v[V]; };
struct _gpurt_index { long long n; long long size() const { return n; } };
"""

def emulate(shape, axis, dtype, keepdims=False, index=None, width=32, vector=16, unroll=4,
            waves=1, least=32, fold=True, rng=None, realign=16, fit=True, tree=None,
            batch=None):
    rng = rng or np.random.default_rng(1)
    reduce_codegen.COLUMN_WIDTH, reduction.COLUMN_VECTOR_BYTES = width, vector
    reduce_codegen.COLUMN_UNROLL, reduction.COLUMN_SPLIT_WAVES = unroll, waves
    reduction.COLUMN_SPLIT_LEAST, reduction.FOLD = least, fold
    reduction.COLUMN_REALIGN_BYTES = realign
    reduction.COLUMN_SPLIT_FIT = fit
    reduction.COLUMN_FOLD_TREE = TREE if tree is None else tree
    reduction.COLUMN_FOLD_TREE_FROM = FROM
    reduce_codegen.FOLD_BATCH = BATCH if batch is None else batch
    base = rng.standard_normal(shape).astype(dtype)
    view = base[index] if index is not None else base
    item = base.dtype.itemsize
    BASE = 1 << 20
    off = (view.__array_interface__["data"][0] - base.__array_interface__["data"][0])
    arr = fake_array(view.shape, dtype, ptr=BASE + off, strides=view.strides)
    r = gpurt.ReductionKernel("T x", "float32 y", "x", "a + b", "y = a", "0", "emu_sum",
                              reduce_type="float32")
    captured.clear()
    plan = r._plan([arr], [None], axis, keepdims)
    src = captured[0]
    assert src.startswith(PRELUDE)
    body = src[len(PRELUDE):]
    want = view.astype(np.float64).sum(axis=axis, keepdims=keepdims)
    nout = int(np.prod(plan.out_shape))
    args = [f"(const {'float' if dtype == np.float32 else '__nv_bfloat16'}*)(in + {off // item})"]
    if plan.splits > 1:
        args += ["partial"]
        if plan.fold:
            args += ["counts"]
    if plan.fold or plan.splits == 1:
        args += ["out"]
    args += [str(v) for v in plan.middle]
    if plan.fold or plan.splits == 1:
        args += [str(v) for v in plan.out_strides]
    assert plan.fold or plan.splits == 1, "finish kernel not emulated"
    ctype = "float" if dtype == np.float32 else "__nv_bfloat16"
    main = f"""
int main() {{
    size_t nin = {base.size};
    void* in_raw = nullptr;  // exactly the input's bytes: AddressSanitizer sees a read past
    if (posix_memalign(&in_raw, 64, nin * {item})) return 4;
    {ctype}* in = ({ctype}*)in_raw;
    FILE* f = fopen("in.bin", "rb"); fread(in, {item}, nin, f); fclose(f);
    float* out = (float*)aligned_alloc(64, (({nout} * 4 + 63) / 64) * 64);
    for (int i = 0; i < {nout}; ++i) out[i] = NAN;
    long long np_ = (long long){plan.splits} * {plan.size};
    float* partial = (float*)malloc(np_ * 4);
    for (long long i = 0; i < np_; ++i) partial[i] = NAN;
    unsigned* counts = (unsigned*)calloc({plan.counts}, 4);
    (void)partial; (void)counts;
    gridDim = dim3{{{plan.grid[0]}, {plan.grid[1]}, 1}}; blockDim = dim3{{256, 1, 1}};
    for (int rep = 0; rep < 2; ++rep)
    for (unsigned by = 0; by < gridDim.y; ++by)
        for (unsigned bx = 0; bx < gridDim.x; ++bx) {{
            std::barrier<> bar(256); g_bar = &bar;
            std::vector<std::thread> ts;
            for (unsigned t = 0; t < 256; ++t)
                ts.emplace_back([&, t] {{
                    threadIdx = dim3{{t, 0, 0}}; blockIdx = dim3{{bx, by, 0}};
                    emu_sum({", ".join(args)});
                    bar.arrive_and_drop();
                }});
            for (auto& th : ts) th.join();
        }}
    for (unsigned i = 0; i < {plan.counts}; ++i)
        if (counts[i]) {{ printf("counter %u = %u\\n", i, counts[i]); return 3; }}
    f = fopen("out.bin", "wb"); fwrite(out, 4, {nout}, f); fclose(f);
    return 0;
}}
"""
    with tempfile.TemporaryDirectory() as d:
        open(f"{d}/k.cc", "w").write(SHIM + body.replace('extern "C" ', "") + main)
        base.tofile(f"{d}/in.bin")
        c = subprocess.run(["g++", "-std=c++20", "-O1", "-g", "-pthread", "-w",
                            *os.environ.get("SAN", "").split(), "k.cc", "-o", "k"],
                           cwd=d, capture_output=True, text=True)
        if c.returncode:
            print(c.stderr[:3000])
            raise SystemExit(1)
        p = subprocess.run(["./k"], cwd=d, capture_output=True, text=True)
        if p.returncode:
            raise AssertionError(f"rc {p.returncode} {p.stdout} {p.stderr}")
        got = np.fromfile(f"{d}/out.bin", dtype=np.float32).reshape(plan.out_shape)
    err = np.abs(got - want).max()
    ok = np.allclose(got, want, rtol=1e-4, atol=1e-3)
    per = -(-plan.size // plan.grid[0])
    print(f"{'ok ' if ok else 'BAD'} {shape} {index} axis={axis} kd={keepdims} "
          f"{np.dtype(dtype).name} w={width} v={vector} u={unroll} grid={plan.grid} "
          f"splits={plan.splits} per={per} r={realign} tree={reduction.COLUMN_FOLD_TREE} "
          f"batch={reduce_codegen.FOLD_BATCH} err={err:.2e}", flush=True)
    return ok

if __name__ == "__main__":
    BF = np.dtype(ml_dtypes.bfloat16)
    cases = [((300, 256), 0, None, False), ((2100, 1040), 0, None, False),
             ((2100, 1040), 0, (slice(0, 37), slice(None)), True),
             ((2100, 1040), 0, (slice(None), slice(1, 1025)), False),
             ((6, 700, 64), 1, None, True), ((130, 257), 0, None, False),
             ((4099, 24), 0, None, False)]
    bad = 0
    combos = [(32, 4), (32, 16), (64, 8), (256, 4), (256, 16), (128, 16)]
    if os.environ.get("REALIGN"):  # the realigning walk: odd rows, views ending at the buffer's end
        combos = [(32, 4), (64, 4), (128, 4)]
        cases = [((130, 257), 0, None, False), ((301, 1039), 0, (slice(1, None), slice(3, None)),
                                                 True),
                 ((2100, 1040), 0, (slice(None), slice(1, 1025)), False),
                 ((4099, 3), 0, None, False), ((130, 5), 0, None, False),
                 ((2, 1001), 0, None, False), ((3, 1001), 0, (slice(None), slice(1, None)), False),
                 ((1000, 8191), 0, None, False),
                 ((301, 1039), 0, (slice(None, None, -1), slice(2, None)), False),
                 ((130, 257), 0, (slice(None, None, -1), slice(None)), False)]
    if os.environ.get("QUICK"):
        combos, cases = [(32, 4), (32, 16), (256, 16)], cases[1:5] + cases[6:]
    for (width, vector), dtype in itertools.product(combos, [np.float32, BF]):
        for shape, axis, index, kd in cases:
            bad += not emulate(shape, axis, dtype, kd, index, width, vector)
    print("bad", bad)
