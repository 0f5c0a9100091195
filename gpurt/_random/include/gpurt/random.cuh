// gpurt/random.cuh: gpurt's counter-based random numbers for CUDA C++ kernels.
//
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11; the
// generator of curand's Philox and of torch's CUDA generator) and the transforms that
// gpurt.random's fill functions use, so a kernel of yours draws exactly what they would.
// Include it from gpurt.compile with include_paths=[gpurt.random.include_dir()] or
// headers=gpurt.random.headers(), as #include <gpurt/random.cuh>. Needs no other header.
//
// The mapping (docs/random.md): a call at generator offset `offset` (a multiple of 4) gives
// its element block b (elements [K*b, K*b + K), K = 4; 8 for 16-bit uniform fills, 2 for
// randint over ranges wider than 2^32) the four
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
#ifdef __CUDA_ARCH__
    *hi = __umulhi(a, b);
    return a * b;
#else
    unsigned long long product = (unsigned long long)a * b;
    *hi = (unsigned int)(product >> 32);
    return (unsigned int)product;
#endif
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

// Uniform in [0, 1) from half a word (the 16-bit fills: 8 values per Philox block): bits
// [16 * half, 16 * half + 16) of word, every value a multiple of 2^-16.
__host__ __device__ __forceinline__ float uniform01_half(unsigned int word, int half) {
    return (float)((word >> (16 * half)) & 0xFFFFu) * 0x1p-16f;
}

// low + u * scale with scale = high - low, rounded once per operation (no FMA contraction),
// so the value is reproducible in any IEEE float32 arithmetic.
__device__ __forceinline__ float uniform(unsigned int word, float low, float scale) {
    return __fadd_rn(low, __fmul_rn(uniform01(word), scale));
}

// The normal transform is built from float32 operations that are each correctly rounded
// (conversions, __fmaf_rn, __fmul_rn, a square root with __fsqrt_rn's bits; no fast-math
// intrinsics), so the numpy reference in tests/_philox.py computes the same bits. Polynomials: least-squares fits on
// Chebyshev nodes, relative error < 6e-8 (log) and absolute < 3e-8 (sin, cos).
namespace detail {

// ln(m * 2^-24) for 1 <= m < 2^24: m = 2^e * f with f in [sqrt(1/2), sqrt(2)), then
// ln f = t * P(t), t = f - 1 (exact), P of degree 8.
__device__ __forceinline__ float log_unit24(unsigned int m) {
    int bits = __float_as_int((float)m);  // exact: m < 2^24
    int e = (bits >> 23) - 127 - 24;
    int fbits = (bits & 0x7FFFFF) | 0x3F800000;
    if (fbits > 0x3FB504F3) {  // f > sqrt(2): halve it
        fbits -= 0x00800000;
        e += 1;
    }
    float t = __fadd_rn(__int_as_float(fbits), -1.0f);
    float p = 0x1.662724p-4f;
    p = __fmaf_rn(p, t, -0x1.2672cep-3f);
    p = __fmaf_rn(p, t, 0x1.32285ap-3f);
    p = __fmaf_rn(p, t, -0x1.5329b8p-3f);
    p = __fmaf_rn(p, t, 0x1.98b808p-3f);
    p = __fmaf_rn(p, t, -0x1.0005a6p-2f);
    p = __fmaf_rn(p, t, 0x1.555790p-2f);
    p = __fmaf_rn(p, t, -0x1.fffff8p-2f);
    p = __fmaf_rn(p, t, 1.0f);
    return __fmaf_rn((float)e, 0x1.62e430p-1f, __fmul_rn(p, t));
}

// (sin, cos) of 2 pi v / 2^24 for 0 <= v < 2^24: the octant from the top 3 bits, the
// angle inside it (reflected in odd octants) as pi/4 * x, x in [0, 1], then polynomials in x^2.
__device__ __forceinline__ float2 sincos_turn24(unsigned int v) {
    unsigned int octant = v >> 21;
    unsigned int m = v & 0x1FFFFFu;
    if (octant & 1u) m = 0x200000u - m;
    float x = __fmul_rn((float)m, 0x1p-21f);  // exact
    float x2 = __fmul_rn(x, x);
    float s = -0x1.2dc17cp-15f;
    s = __fmaf_rn(s, x2, 0x1.465fc0p-9f);
    s = __fmaf_rn(s, x2, -0x1.4abbbep-4f);
    s = __fmaf_rn(s, x2, 0x1.921fb6p-1f);
    s = __fmul_rn(s, x);
    float c = 0x1.d9f0a6p-19f;
    c = __fmaf_rn(c, x2, -0x1.55c63cp-12f);
    c = __fmaf_rn(c, x2, 0x1.03c1dep-6f);
    c = __fmaf_rn(c, x2, -0x1.3bd3ccp-2f);
    c = __fmaf_rn(c, x2, 1.0f);
    // Inside the quadrant (octant >> 1) the angle is pi/4 * x (even octant) or pi/2 - pi/4 * x
    // (odd: sin and cos swap); rotating by the quadrant swaps them again in odd quadrants and
    // negates sin in quadrants 2, 3 and cos in 1, 2. Branch-free: octants differ lane to lane.
    bool swap = ((octant ^ (octant >> 1)) & 1u) != 0;
    unsigned int sin_sign = (octant & 4u) << 29;
    unsigned int cos_sign = ((octant + 2u) & 4u) << 29;
    float sin = swap ? c : s, cos = swap ? s : c;
    return make_float2(__int_as_float(__float_as_int(sin) ^ sin_sign),
                       __int_as_float(__float_as_int(cos) ^ cos_sign));
}

// sqrt(x), correctly rounded, for x in [2^-100, 2^100]: the fast path of __fsqrt_rn (an
// approximate reciprocal square root, then one correction) without its test and branch to
// the slow path for zero, subnormal, infinite and NaN x, which -2 ln u (in [1e-7, 34]) never
// is; the same bits as __fsqrt_rn there.
__device__ __forceinline__ float sqrt_normal_range(float x) {
    float r;
    asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    float s = __fmul_rn(x, r);
    float e = __fmaf_rn(-s, s, x);
    return __fmaf_rn(e, __fmul_rn(r, 0.5f), s);
}

}  // namespace detail

// Two standard normals from two words (Box-Muller): sqrt(-2 ln u) * (cos, sin)(2 pi v), with
// u in (0, 1) from the top 24 bits of a with the lowest of them set, v in [0, 1) from the top
// 24 bits of b; every float32 operation correctly rounded (see detail above).
__device__ __forceinline__ float2 normal2(unsigned int a, unsigned int b) {
    float r = detail::sqrt_normal_range(__fmul_rn(-2.0f, detail::log_unit24((a >> 8) | 1u)));
    float2 sc = detail::sincos_turn24(b >> 8);
    return make_float2(__fmul_rn(r, sc.y), __fmul_rn(r, sc.x));
}

// mean + std * z, one rounding (fused multiply-add).
__device__ __forceinline__ float scale_normal(float z, float mean, float std) {
    return __fmaf_rn(z, std, mean);
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

// The same remainder without a division (Lemire, Kaser and Kurz, "Faster remainder by
// direct computation", 2019): low + word % range for 1 <= range <= 2^32, given range32 =
// range mod 2^32 (0 standing for 2^32) and magic = ceil(2^64 / range) mod 2^64
// (fastmod_magic); exact for every 32-bit word. (fraction * range) >> 64 is taken in 32-bit
// halves: fraction = hi * 2^32 + lo, and the low half's carry is hi32(lo * range).
__host__ __device__ __forceinline__ unsigned long long fastmod_magic(unsigned long long range) {
    return ~0ull / range + 1;
}

__device__ __forceinline__ long long randint32_fast(unsigned int word, long long low,
                                                    unsigned int range32,
                                                    unsigned long long magic) {
    unsigned long long fraction = magic * word;
    unsigned int lo = (unsigned int)fraction, hi = (unsigned int)(fraction >> 32);
    unsigned long long top = (unsigned long long)hi * range32 + __umulhi(lo, range32);
    unsigned int rest = range32 ? (unsigned int)(top >> 32) : word;
    return (long long)((unsigned long long)low + rest);
}

// The same remainder with one multiply-high and one multiply-add (Granlund and Montgomery,
// "Division by invariant integers using multiplication", 1994, figure 4.1): for range32 =
// range mod 2^32 in [1, 2^32) the quotient is q = (t + ((word - t) >> sh1)) >> sh2 with
// t = umulhi(magic32, word); magic32 and shifts = sh1 | sh2 << 8 from the host
// (gpurt.random's _divisor); range32 == 0 stands for 2^32 (the word itself). Exact for every
// 32-bit word.
__device__ __forceinline__ long long randint32_div(unsigned int word, long long low,
                                                   unsigned int range32, unsigned int magic32,
                                                   unsigned int shifts) {
    unsigned int t = __umulhi(magic32, word);
    unsigned int q = (t + ((word - t) >> (shifts & 0xFFu))) >> (shifts >> 8);
    unsigned int rest = range32 ? word - q * range32 : word;
    return (long long)((unsigned long long)low + rest);
}

// ... and from two words (lo, hi) for larger ranges; range == 0 stands for 2^64.
__host__ __device__ __forceinline__ long long randint64(unsigned int lo, unsigned int hi,
                                                        long long low, unsigned long long range) {
    unsigned long long word = ((unsigned long long)hi << 32) | lo;
    return (long long)((unsigned long long)low + (range ? word % range : word));
}

}  // namespace gpurt
