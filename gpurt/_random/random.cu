// gpurt.random's kernels: fills (uniform, normal, randint, bernoulli) and dropout over
// contiguous or strided arrays, and the replay-time write of a generator's device state.
// Every element's value depends only on (seed, offset, its C-order index): see
// <gpurt/random.cuh> for the mapping. Instantiated through name expressions by
// gpurt/_random/kernels.py, one program per (distribution, dtype).
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <gpurt/random.cuh>

namespace gpurt_rng {

constexpr int kMaxDims = 8;

// An array's elements: shape and element strides after merging dimensions; mode says how
// the kernel may address it (0 contiguous and aligned for a block's vector store,
// 1 contiguous, 2 strided).
struct Layout {
    long long ndim;
    long long mode;
    long long shape[kMaxDims];
    long long stride[kMaxDims];
};

__device__ __forceinline__ long long element_offset(const Layout& L, unsigned long long i) {
    if (L.mode < 2) return (long long)i;
    long long offset = 0;
    for (int d = (int)L.ndim - 1; d >= 0; --d) {
        unsigned long long extent = (unsigned long long)L.shape[d];
        offset += (long long)(i % extent) * L.stride[d];
        i /= extent;
    }
    return offset;
}

template <typename T> __device__ __forceinline__ T cast_to(float v) { return (T)v; }
template <> __device__ __forceinline__ __half cast_to<__half>(float v) {
    return __float2half_rn(v);
}
template <> __device__ __forceinline__ __nv_bfloat16 cast_to<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}
template <typename T> __device__ __forceinline__ float to_float(T v) { return (float)v; }
template <> __device__ __forceinline__ float to_float<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) {
    return __bfloat162float(v);
}

// Two values rounded to T into v[0], v[1] (v 4-byte aligned for 2-byte T): 16-bit types
// through one paired conversion (each value rounded to nearest even, as cast_to).
template <typename T> __device__ __forceinline__ void store2(T* v, float a, float b) {
    v[0] = cast_to<T>(a);
    v[1] = cast_to<T>(b);
}
template <> __device__ __forceinline__ void store2<__half>(__half* v, float a, float b) {
    *reinterpret_cast<__half2*>(v) = __floats2half2_rn(a, b);
}
template <> __device__ __forceinline__ void store2<__nv_bfloat16>(__nv_bfloat16* v, float a,
                                                                  float b) {
    *reinterpret_cast<__nv_bfloat162*>(v) = __floats2bfloat162_rn(a, b);
}

// K values of T, stored with one instruction up to 16 bytes (wider packs: several).
template <typename T, int K> struct alignas(sizeof(T) * K < 16 ? sizeof(T) * K : 16) Pack {
    T v[K];
};

// Philox blocks a thread turns into one store: as many as fill 16 bytes (at least one).
template <typename T, int K> __host__ __device__ constexpr int calls_per_store() {
    return sizeof(T) * K >= 16 ? 1 : 16 / (sizeof(T) * K);
}

// ---- distributions: K values of type T from one Philox block ---------------------------------

// 4-byte outputs take one word (24 bits) per value; 2-byte outputs half a word (16 bits), so
// one Philox block gives 8 of them.
template <typename T> struct Uniform {
    static constexpr int K = sizeof(T) == 2 ? 8 : 4;
    float low, scale;
    __device__ void operator()(uint4 w, T* v) const {
        const unsigned int words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int j = 0; j < K; j += 2) {
            float u0 = K == 8 ? gpurt::uniform01_half(words[j / 2], 0) : gpurt::uniform01(words[j]);
            float u1 = K == 8 ? gpurt::uniform01_half(words[j / 2], 1)
                              : gpurt::uniform01(words[j + 1]);
            store2(v + j, __fadd_rn(low, __fmul_rn(u0, scale)),
                   __fadd_rn(low, __fmul_rn(u1, scale)));
        }
    }
};

template <typename T> struct Normal {
    static constexpr int K = 4;
    float mean, std;
    __device__ void operator()(uint4 w, T* v) const {
        float2 a = gpurt::normal2(w.x, w.y), b = gpurt::normal2(w.z, w.w);
        store2(v, gpurt::scale_normal(a.x, mean, std), gpurt::scale_normal(a.y, mean, std));
        store2(v + 2, gpurt::scale_normal(b.x, mean, std), gpurt::scale_normal(b.y, mean, std));
    }
};

// gpurt::bernoulli(word, p) as one integer compare: uniform01(word) < p exactly when
// word < threshold = ceil(p * 2^24) * 2^8 (computed on the host, at most 2^32).
__device__ __forceinline__ bool below(unsigned int word, unsigned long long threshold) {
    return word < threshold;
}

template <typename T> struct Bernoulli {
    static constexpr int K = 4;
    unsigned long long threshold;
    __device__ void operator()(uint4 w, T* v) const {
        v[0] = cast_to<T>(below(w.x, threshold) ? 1.0f : 0.0f);
        v[1] = cast_to<T>(below(w.y, threshold) ? 1.0f : 0.0f);
        v[2] = cast_to<T>(below(w.z, threshold) ? 1.0f : 0.0f);
        v[3] = cast_to<T>(below(w.w, threshold) ? 1.0f : 0.0f);
    }
};

// word % range through a multiply-high quotient (gpurt::randint32_div), magic from the host.
template <typename T> struct RandInt32 {
    static constexpr int K = 4;
    long long low;
    unsigned int range, magic, shifts;
    __device__ void operator()(uint4 w, T* v) const {
        v[0] = (T)gpurt::randint32_div(w.x, low, range, magic, shifts);
        v[1] = (T)gpurt::randint32_div(w.y, low, range, magic, shifts);
        v[2] = (T)gpurt::randint32_div(w.z, low, range, magic, shifts);
        v[3] = (T)gpurt::randint32_div(w.w, low, range, magic, shifts);
    }
};

template <typename T> struct RandInt64 {
    static constexpr int K = 2;
    long long low;
    unsigned long long range;
    __device__ void operator()(uint4 w, T* v) const {
        v[0] = (T)gpurt::randint64(w.x, w.y, low, range);
        v[1] = (T)gpurt::randint64(w.z, w.w, low, range);
    }
};

__device__ __forceinline__ uint4 block_words(uint2 key, unsigned long long block4,
                                             unsigned long long b) {
    uint4 counter = make_uint4((unsigned int)block4, (unsigned int)(block4 >> 32),
                               (unsigned int)b, (unsigned int)(b >> 32));
    return gpurt::philox4x32_10(counter, key);
}

__device__ __forceinline__ uint2 seed_key(unsigned long long seed) {
    return make_uint2((unsigned int)seed, (unsigned int)(seed >> 32));
}

// One chunk: CALLS element blocks (E = CALLS * K elements, one store of up to 16 bytes);
// element block b always gets Philox block b, whatever the grid.
template <typename T, typename Dist, int CALLS, int E = CALLS * Dist::K>
__device__ __forceinline__ Pack<T, E> chunk_values(const Dist& dist, uint2 key,
                                                   unsigned long long block4,
                                                   unsigned long long c) {
    Pack<T, E> values;
#pragma unroll
    for (int j = 0; j < CALLS; ++j) {
        dist(block_words(key, block4, c * CALLS + j), values.v + j * Dist::K);
    }
    return values;
}

// Stores chunk c's pack. A 32-byte pack (8-byte outputs) is two 16-byte stores; a warp
// storing its first halves, then its second halves, moved 36% of copy (randint into int64,
// H200), and lane pairs trading halves (each instruction writing whole sectors) 80% (H100).
// So in a warp whose 32 chunks are all whole (lanes hold chunks c0 + lane), instruction i
// writes the warp's 16-byte quads 32i .. 32i + 31, 512 contiguous bytes: lane l's is half
// l & 1 of lane 16i + l / 2's pack, fetched by shuffles (102% of copy, H100).
template <typename P>
__device__ __forceinline__ void store_pack(P* packs, unsigned long long c, const P& value,
                                           bool whole_warp) {
    if constexpr (sizeof(P) != 32) {
        packs[c] = value;
    } else {
        const uint4* half = reinterpret_cast<const uint4*>(&value);
        uint4* quads = reinterpret_cast<uint4*>(packs);
        if (!whole_warp) {
            quads[2 * c] = half[0];
            quads[2 * c + 1] = half[1];
            return;
        }
        const unsigned int lane = threadIdx.x & 31u;
        const unsigned long long q0 = 2 * (c - lane);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int src = 16 * i + (int)(lane >> 1);
            uint4 a, b;
            a.x = __shfl_sync(0xFFFFFFFFu, half[0].x, src);
            a.y = __shfl_sync(0xFFFFFFFFu, half[0].y, src);
            a.z = __shfl_sync(0xFFFFFFFFu, half[0].z, src);
            a.w = __shfl_sync(0xFFFFFFFFu, half[0].w, src);
            b.x = __shfl_sync(0xFFFFFFFFu, half[1].x, src);
            b.y = __shfl_sync(0xFFFFFFFFu, half[1].y, src);
            b.z = __shfl_sync(0xFFFFFFFFu, half[1].z, src);
            b.w = __shfl_sync(0xFFFFFFFFu, half[1].w, src);
            quads[q0 + 32 * i + lane] = (lane & 1u) ? b : a;
        }
    }
}

// Grid-stride loops over chunks: for an aligned contiguous array, whole chunks with one
// vector store each (a 32-bit index when it fits: the loop's integer work shares the
// pipe that Philox's multiplies bound), then the last partial chunk; otherwise each
// element through the layout.
template <typename T, typename Dist>
__device__ void fill(T* out, unsigned long long n, const Layout& L,
                     const gpurt::PhiloxCudaState& ps, const Dist& dist) {
    constexpr int CALLS = calls_per_store<T, Dist::K>();
    constexpr int E = CALLS * Dist::K;
    ulonglong2 seed_offset = gpurt::philox_unpack(ps);
    uint2 key = seed_key(seed_offset.x);
    unsigned long long block4 = seed_offset.y / 4;
    unsigned long long chunks = (n + E - 1) / E;
    unsigned long long start = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long first = 0;
    if (L.mode == 0) {
        unsigned long long whole = n / E;
        Pack<T, E>* packs = reinterpret_cast<Pack<T, E>*>(out);
        if (whole + stride <= 0xFFFFFFFFull) {
            for (unsigned int c = (unsigned int)start; c < (unsigned int)whole;
                 c += (unsigned int)stride) {
                store_pack(packs, c, chunk_values<T, Dist, CALLS>(dist, key, block4, c),
                           c - (threadIdx.x % 32) + 31 < whole);
            }
        } else {
            for (unsigned long long c = start; c < whole; c += stride) {
                store_pack(packs, c, chunk_values<T, Dist, CALLS>(dist, key, block4, c),
                           c - (threadIdx.x % 32) + 31 < whole);
            }
        }
        first = whole;
    }
    for (unsigned long long c = first + start; c < chunks; c += stride) {
        Pack<T, E> values = chunk_values<T, Dist, CALLS>(dist, key, block4, c);
#pragma unroll
        for (int j = 0; j < E; ++j) {
            unsigned long long i = c * E + j;
            if (i < n) out[element_offset(L, i)] = values.v[j];
        }
    }
}

}  // namespace gpurt_rng

using namespace gpurt_rng;

template <typename T>
__global__ void fill_uniform(T* out, unsigned long long n, Layout L, gpurt::PhiloxCudaState ps,
                             float low, float scale) {
    fill(out, n, L, ps, Uniform<T>{low, scale});
}

template <typename T>
__global__ void fill_normal(T* out, unsigned long long n, Layout L, gpurt::PhiloxCudaState ps,
                            float mean, float std) {
    fill(out, n, L, ps, Normal<T>{mean, std});
}

template <typename T>
__global__ void fill_bernoulli(T* out, unsigned long long n, Layout L,
                               gpurt::PhiloxCudaState ps, unsigned long long threshold) {
    fill(out, n, L, ps, Bernoulli<T>{threshold});
}

template <typename T>
__global__ void fill_randint32(T* out, unsigned long long n, Layout L,
                               gpurt::PhiloxCudaState ps, long long low, unsigned int range,
                               unsigned int magic, unsigned int shifts) {
    fill(out, n, L, ps, RandInt32<T>{low, range, magic, shifts});
}

template <typename T>
__global__ void fill_randint64(T* out, unsigned long long n, Layout L,
                               gpurt::PhiloxCudaState ps, long long low,
                               unsigned long long range) {
    fill(out, n, L, ps, RandInt64<T>{low, range});
}

// Dropout's chunk c: CALLS blocks of 4 elements of x (loaded by the caller: 16-byte
// vectors) to out and mask.
template <typename T, int CALLS, int E = 4 * CALLS>
__device__ __forceinline__ void dropout_chunk(const Pack<T, E>& in, T* out, bool* mask,
                                              unsigned long long c, uint2 key,
                                              unsigned long long block4,
                                              unsigned long long threshold, float scale) {
    Pack<T, E> res;
    Pack<bool, E> flags;
#pragma unroll
    for (int j = 0; j < CALLS; ++j) {
        uint4 w = block_words(key, block4, c * CALLS + j);
        const unsigned int words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) flags.v[4 * j + i] = below(words[i], threshold);
    }
#pragma unroll
    for (int j = 0; j < E; j += 2) {
        store2(res.v + j, flags.v[j] ? __fmul_rn(to_float(in.v[j]), scale) : 0.0f,
               flags.v[j + 1] ? __fmul_rn(to_float(in.v[j + 1]), scale) : 0.0f);
    }
    reinterpret_cast<Pack<T, E>*>(out)[c] = res;
    if (mask) reinterpret_cast<Pack<bool, E>*>(mask)[c] = flags;
}

// out = x * scale where kept (uniform01 < keep: word < threshold, as in below()), else 0;
// mask = kept (may be null). Chunks as fill's: vectors where all three arrays allow them.
template <typename T>
__global__ void dropout(const T* x, T* out, bool* mask, unsigned long long n, Layout Lx,
                        Layout Lout, Layout Lmask, gpurt::PhiloxCudaState ps,
                        unsigned long long threshold, float scale) {
    constexpr int CALLS = calls_per_store<T, 4>();
    constexpr int E = 4 * CALLS;
    ulonglong2 seed_offset = gpurt::philox_unpack(ps);
    uint2 key = seed_key(seed_offset.x);
    unsigned long long block4 = seed_offset.y / 4;
    unsigned long long chunks = (n + E - 1) / E;
    unsigned long long start = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long first = 0;
    if (Lx.mode == 0 && Lout.mode == 0 && Lmask.mode == 0) {
        typedef Pack<T, E> P;
        const P* xs = reinterpret_cast<const P*>(x);
        first = n / E;
        if (first + 2 * stride <= 0xFFFFFFFFull) {
            // a 32-bit index (as fill's) and two chunks a step, both loads issued first (the
            // load is the only latency a thread waits on)
            const unsigned int s = (unsigned int)stride, f = (unsigned int)first;
            unsigned int c = (unsigned int)start;
            for (; c + s < f; c += 2 * s) {
                P a = xs[c], b = xs[c + s];
                dropout_chunk<T, CALLS>(a, out, mask, c, key, block4, threshold, scale);
                dropout_chunk<T, CALLS>(b, out, mask, c + s, key, block4, threshold, scale);
            }
            if (c < f) dropout_chunk<T, CALLS>(xs[c], out, mask, c, key, block4, threshold, scale);
        } else {
            for (unsigned long long c = start; c < first; c += stride) {
                dropout_chunk<T, CALLS>(xs[c], out, mask, c, key, block4, threshold, scale);
            }
        }
    }
    for (unsigned long long c = first + start; c < chunks; c += stride) {
#pragma unroll
        for (int j = 0; j < CALLS; ++j) {
            uint4 w = block_words(key, block4, c * CALLS + j);
            const unsigned int words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                unsigned long long i = c * E + 4 * j + k;
                if (i >= n) break;
                bool kept = below(words[k], threshold);
                float v = to_float(x[element_offset(Lx, i)]);
                out[element_offset(Lout, i)] = cast_to<T>(kept ? __fmul_rn(v, scale) : 0.0f);
                if (mask) mask[element_offset(Lmask, i)] = kept;
            }
        }
    }
}

// Before a CUDA graph replay: the generator's seed and offset where captured kernels read them.
extern "C" __global__ void philox_set_state(unsigned long long* state, unsigned long long seed,
                                            unsigned long long offset) {
    state[0] = seed;
    state[1] = offset;
}
