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

template <typename T, int K> struct alignas(sizeof(T) * K) Pack { T v[K]; };

// ---- distributions: K values of type T from one Philox block ---------------------------------

template <typename T> struct Uniform {
    static constexpr int K = 4;
    float low, scale;
    __device__ void operator()(uint4 w, T* v) const {
        v[0] = cast_to<T>(gpurt::uniform(w.x, low, scale));
        v[1] = cast_to<T>(gpurt::uniform(w.y, low, scale));
        v[2] = cast_to<T>(gpurt::uniform(w.z, low, scale));
        v[3] = cast_to<T>(gpurt::uniform(w.w, low, scale));
    }
};

template <typename T> struct Normal {
    static constexpr int K = 4;
    float mean, std;
    __device__ void operator()(uint4 w, T* v) const {
        float2 a = gpurt::normal2(w.x, w.y), b = gpurt::normal2(w.z, w.w);
        v[0] = cast_to<T>(fmaf(a.x, std, mean));
        v[1] = cast_to<T>(fmaf(a.y, std, mean));
        v[2] = cast_to<T>(fmaf(b.x, std, mean));
        v[3] = cast_to<T>(fmaf(b.y, std, mean));
    }
};

template <typename T> struct Bernoulli {
    static constexpr int K = 4;
    float p;
    __device__ void operator()(uint4 w, T* v) const {
        v[0] = cast_to<T>(gpurt::bernoulli(w.x, p) ? 1.0f : 0.0f);
        v[1] = cast_to<T>(gpurt::bernoulli(w.y, p) ? 1.0f : 0.0f);
        v[2] = cast_to<T>(gpurt::bernoulli(w.z, p) ? 1.0f : 0.0f);
        v[3] = cast_to<T>(gpurt::bernoulli(w.w, p) ? 1.0f : 0.0f);
    }
};

template <typename T> struct RandInt32 {
    static constexpr int K = 4;
    long long low;
    unsigned long long range;
    __device__ void operator()(uint4 w, T* v) const {
        v[0] = (T)gpurt::randint32(w.x, low, range);
        v[1] = (T)gpurt::randint32(w.y, low, range);
        v[2] = (T)gpurt::randint32(w.z, low, range);
        v[3] = (T)gpurt::randint32(w.w, low, range);
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

template <typename T, typename Dist>
__device__ void fill(T* out, unsigned long long n, const Layout& L,
                     const gpurt::PhiloxCudaState& ps, const Dist& dist) {
    constexpr int K = Dist::K;
    ulonglong2 seed_offset = gpurt::philox_unpack(ps);
    uint2 key = seed_key(seed_offset.x);
    unsigned long long block4 = seed_offset.y / 4;
    unsigned long long blocks = (n + K - 1) / K;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long b = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         b < blocks; b += stride) {
        Pack<T, K> values;
        dist(block_words(key, block4, b), values.v);
        unsigned long long first = b * K;
        if (L.mode == 0 && first + K <= n) {
            *reinterpret_cast<Pack<T, K>*>(out + first) = values;
        } else {
#pragma unroll
            for (int j = 0; j < K; ++j) {
                if (first + j < n) out[element_offset(L, first + j)] = values.v[j];
            }
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
                               gpurt::PhiloxCudaState ps, float p) {
    fill(out, n, L, ps, Bernoulli<T>{p});
}

template <typename T>
__global__ void fill_randint32(T* out, unsigned long long n, Layout L,
                               gpurt::PhiloxCudaState ps, long long low,
                               unsigned long long range) {
    fill(out, n, L, ps, RandInt32<T>{low, range});
}

template <typename T>
__global__ void fill_randint64(T* out, unsigned long long n, Layout L,
                               gpurt::PhiloxCudaState ps, long long low,
                               unsigned long long range) {
    fill(out, n, L, ps, RandInt64<T>{low, range});
}

// out = x * scale where uniform01 < keep (else 0), mask = kept; mask may be null.
template <typename T>
__global__ void dropout(const T* x, T* out, bool* mask, unsigned long long n, Layout Lx,
                        Layout Lout, Layout Lmask, gpurt::PhiloxCudaState ps, float keep,
                        float scale) {
    ulonglong2 seed_offset = gpurt::philox_unpack(ps);
    uint2 key = seed_key(seed_offset.x);
    unsigned long long block4 = seed_offset.y / 4;
    unsigned long long blocks = (n + 3) / 4;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    bool vector = Lx.mode == 0 && Lout.mode == 0 && Lmask.mode == 0;
    for (unsigned long long b = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         b < blocks; b += stride) {
        uint4 w = block_words(key, block4, b);
        unsigned int words[4] = {w.x, w.y, w.z, w.w};
        unsigned long long first = b * 4;
        if (vector && first + 4 <= n) {
            Pack<T, 4> in = *reinterpret_cast<const Pack<T, 4>*>(x + first), res;
            Pack<bool, 4> kept;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                kept.v[j] = gpurt::bernoulli(words[j], keep);
                res.v[j] = cast_to<T>(kept.v[j] ? __fmul_rn(to_float(in.v[j]), scale) : 0.0f);
            }
            *reinterpret_cast<Pack<T, 4>*>(out + first) = res;
            if (mask) *reinterpret_cast<Pack<bool, 4>*>(mask + first) = kept;
            continue;
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            unsigned long long i = first + j;
            if (i >= n) break;
            bool kept = gpurt::bernoulli(words[j], keep);
            float v = to_float(x[element_offset(Lx, i)]);
            out[element_offset(Lout, i)] = cast_to<T>(kept ? __fmul_rn(v, scale) : 0.0f);
            if (mask) mask[element_offset(Lmask, i)] = kept;
        }
    }
}

// Before a CUDA graph replay: the generator's seed and offset where captured kernels read them.
extern "C" __global__ void philox_set_state(unsigned long long* state, unsigned long long seed,
                                            unsigned long long offset) {
    state[0] = seed;
    state[1] = offset;
}
