// gpurt/random.cuh: gpurt's counter-based random numbers for CUDA C++ kernels.
//
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11; the
// generator of curand's Philox and of torch's CUDA generator) and the transforms that
// gpurt.random's fill functions use, so a kernel of yours draws exactly what they would.
// Include it from gpurt.compile with include_paths=[gpurt.random.include_dir()] or
// headers=gpurt.random.headers(), as #include <gpurt/random.cuh>. Needs no other header.
//
// The mapping (docs/random.md): a call at generator offset `offset` (a multiple of 4) gives
// its element block b (elements [K*b, K*b + K), K = 4, or 2 for 64-bit integers) the four
// words philox4x32_10(counter = (lo(offset/4), hi(offset/4), lo(b), hi(b)),
//                     key = (lo(seed), hi(seed))),
// i.e. the first draw of curand_init(seed, subsequence = b, offset). It does not depend on
// the launch configuration or the device.
#pragma once

namespace gpurt {

// What gpurt.Generator.philox_cuda_state(n) hands a kernel (48 bytes, passed by value): the
// seed and offset as values, or under CUDA graph capture pointers to the generator's device
// copy of them plus the offset of this draw inside the graph. Read it with philox_unpack.
struct PhiloxCudaState {
    unsigned long long seed;
    unsigned long long offset;
    const unsigned long long* seed_ptr;
    const unsigned long long* offset_ptr;
    unsigned long long intragraph_offset;
    unsigned int captured;
    unsigned int reserved;
};

// (seed, offset) of a draw: the values, or read from device memory when captured.
__device__ __forceinline__ ulonglong2 philox_unpack(const PhiloxCudaState& s) {
    if (s.captured) {
        return make_ulonglong2(*s.seed_ptr, *s.offset_ptr + s.intragraph_offset);
    }
    return make_ulonglong2(s.seed, s.offset);
}

__host__ __device__ __forceinline__ unsigned int philox_mulhilo(unsigned int a, unsigned int b,
                                                                unsigned int* hi) {
    unsigned long long product = (unsigned long long)a * b;
    *hi = (unsigned int)(product >> 32);
    return (unsigned int)product;
}

// Philox4x32 with 10 rounds: Random123's philox4x32_R(10, counter, key).
__host__ __device__ __forceinline__ uint4 philox4x32_10(uint4 c, uint2 k) {
#pragma unroll
    for (int round = 0; round < 10; ++round) {
        unsigned int hi0, hi1;
        unsigned int lo0 = philox_mulhilo(0xD2511F53u, c.x, &hi0);
        unsigned int lo1 = philox_mulhilo(0xCD9E8D57u, c.z, &hi1);
        c = make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
        k.x += 0x9E3779B9u;
        k.y += 0xBB67AE85u;
    }
    return c;
}

// A Philox stream like curand's curandStatePhilox4_32_10 for kernels that draw more than one
// block per thread: philox_init(seed, subsequence, offset) then philox_next() repeatedly.
struct Philox {
    uint4 counter;
    uint2 key;
};

__host__ __device__ __forceinline__ Philox philox_init(unsigned long long seed,
                                                       unsigned long long subsequence,
                                                       unsigned long long offset) {
    unsigned long long block = offset / 4;
    Philox p;
    p.counter = make_uint4((unsigned int)block, (unsigned int)(block >> 32),
                           (unsigned int)subsequence, (unsigned int)(subsequence >> 32));
    p.key = make_uint2((unsigned int)seed, (unsigned int)(seed >> 32));
    return p;
}

// The next four words of the stream (the counter is a 128-bit integer, incremented by one).
__host__ __device__ __forceinline__ uint4 philox_next(Philox& p) {
    uint4 words = philox4x32_10(p.counter, p.key);
    if (++p.counter.x == 0 && ++p.counter.y == 0 && ++p.counter.z == 0) {
        ++p.counter.w;
    }
    return words;
}

// ---- transforms: one 32-bit word per value (two for 64-bit integers) ----------------------

// Uniform in [0, 1): the top 24 bits, exactly (every value a multiple of 2^-24).
__host__ __device__ __forceinline__ float uniform01(unsigned int word) {
    return (float)(word >> 8) * 0x1p-24f;
}

// low + u * scale with scale = high - low, rounded once per operation (no FMA contraction),
// so the value is reproducible in any IEEE float32 arithmetic.
__device__ __forceinline__ float uniform(unsigned int word, float low, float scale) {
    return __fadd_rn(low, __fmul_rn(uniform01(word), scale));
}

// Two standard normals from two words (Box-Muller): u in (0, 1) from the top 24 bits of a
// with the lowest of them set, angle pi*v with v in [0, 2) from the top 24 bits of b.
__device__ __forceinline__ float2 normal2(unsigned int a, unsigned int b) {
    float u = (float)((a >> 8) | 1u) * 0x1p-24f;
    float v = (float)(b >> 8) * 0x1p-23f;
    float r = sqrtf(-2.0f * logf(u));
    float s, c;
    sincospif(v, &s, &c);
    return make_float2(r * c, r * s);
}

// A Bernoulli trial: true with probability p (uniform01(word) < p).
__host__ __device__ __forceinline__ bool bernoulli(unsigned int word, float p) {
    return uniform01(word) < p;
}

// An integer in [low, low + range): low + word % range for 1 <= range <= 2^32 (32 bits) ...
__host__ __device__ __forceinline__ long long randint32(unsigned int word, long long low,
                                                        unsigned long long range) {
    return (long long)((unsigned long long)low + word % range);
}

// ... and from two words (lo, hi) for larger ranges; range == 0 stands for 2^64.
__host__ __device__ __forceinline__ long long randint64(unsigned int lo, unsigned int hi,
                                                        long long low, unsigned long long range) {
    unsigned long long word = ((unsigned long long)hi << 32) | lo;
    return (long long)((unsigned long long)low + (range ? word % range : word));
}

}  // namespace gpurt
