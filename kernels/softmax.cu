// Softmax and log-softmax, forward and backward, over the last dimension of a contiguous
// (rows x cols) tensor of float32, float16 or bfloat16, accumulating in float32.
//
// Every variant but the split one reads each input element once and writes each output
// element once: a row stays on chip (registers, and shared memory for the longest rows)
// between its reduction and its outputs. One template body serves the four operations (a
// Policy says what is reduced and how outputs follow from it) and these ways of spreading
// rows over threads:
//   softmax_rows     GROUP threads per row, THREADS / GROUP rows per CTA. GROUP <= 32: warp
//                    shuffles only; GROUP < THREADS: shuffles + a named barrier per group;
//                    GROUP == THREADS: one CTA per row.
//   softmax_cluster  a thread-block cluster of CLUSTER CTAs per row, each holding a slice; the
//                    per-CTA partials meet through distributed shared memory (sm_90). The
//                    launch has a cluster per row; a smaller grid would loop over the rows
//                    (persistent clusters: measured slower, not used). CLUSTER 16 is a
//                    non-portable size: the launcher allows it on the kernel first.
//   softmax_ticket   rows too long for a cluster: one CTA per chunk of a row, in row order
//                    (each CTA takes the next chunk from a global ticket as it starts),
//                    holding its chunk on chip; it publishes the chunk's partial, waits
//                    until the row's other chunks have published theirs, then writes. Two
//                    passes of bytes, any number of SMs per row; needs as many co-resident
//                    CTAs as a row has chunks (the plan checks).
//   softmax_persist  the same chunks and ticket in a grid of as many CTAs as fit at once, each
//                    walking chunks with two stages: the next chunk's loads are in flight
//                    while the current one waits for its row and writes (Stage).
//   softmax_ends     (softmax_ends.cu, appended to this source) softmax_ticket's chunks with
//                    the rows at the launch's two ends in smaller chunks (16-bit forward).
//   softmax_partial + softmax_finish
//                    rows too long for a cluster: each CTA reduces one chunk into a float2
//                    workspace, a second launch re-reads the chunk, combines the row's
//                    partials and writes its outputs (three passes of bytes instead of two).
// Loads and stores are VEC elements wide (16 bytes when the pointers' alignments agree; with
// EDGES, a row's unaligned first and last elements are single-element edge slots: Edges);
// 16-bit types stay packed in registers and are widened to float32 where they are used.
// Which variant suits which rows is decided in _softmax_plan.py (measurements in
// benchmarks/notes_softmax.md).
//
// Template parameters: DT (0 float32, 1 float16, 2 bfloat16), OP (0 softmax, 1 log_softmax,
// 2 softmax backward, 3 log_softmax backward), VEC, ITEMS (vectors of each input per thread),
// GROUP (threads per row in a CTA), THREADS (per CTA), MINB (CTAs per multiprocessor the
// registers must allow), CLUSTER (CTAs per row), SMEM (of the ITEMS vectors, how many are
// kept in shared memory rather than registers), EDGES (1: rows may start at any element
// alignment and have any length; 0: every row starts VEC-aligned and is whole vectors).
// The forward pass is one online max+sum reduction: each thread reduces its values to
// (max m, sum of exp(x - m)), pairs combine as (M, s1 e^(m1-M) + s2 e^(m2-M)), and exp is
// exp2 of (x - m) * log2(e) (the subtraction first, so large magnitudes keep their accuracy).

#define SM_LOG2E 1.4426950408889634f
#define SM_NEG_INF (-__int_as_float(0x7f800000))

namespace gpurt_softmax {

// ---- storage types and conversions (no CUDA headers needed) --------------------------------

template <int DT> struct Elem;

template <> struct Elem<0> {
    typedef float storage;
    static __device__ __forceinline__ float load(float v) { return v; }
    static __device__ __forceinline__ float store(float v) { return v; }
};

template <> struct Elem<1> {
    typedef unsigned short storage;
    static __device__ __forceinline__ float load(unsigned short h) {
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
        return f;
    }
    static __device__ __forceinline__ unsigned short store(float f) {
        unsigned short h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
        return h;
    }
};

template <> struct Elem<2> {
    typedef unsigned short storage;
    static __device__ __forceinline__ float load(unsigned short h) {
        return __uint_as_float(((unsigned int)h) << 16);
    }
    static __device__ __forceinline__ unsigned short store(float f) {
#if __CUDA_ARCH__ >= 800
        unsigned short h;
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
        return h;
#else
        unsigned int u = __float_as_uint(f);
        if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);  // NaN
        u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
        return (unsigned short)(u >> 16);
#endif
    }
};

template <int BYTES> struct Raw;
template <> struct Raw<16> { typedef uint4 type; };
template <> struct Raw<8> { typedef uint2 type; };
template <> struct Raw<4> { typedef unsigned int type; };
template <> struct Raw<2> { typedef unsigned short type; };

// One VEC-wide access: a single load or store instruction of VEC * sizeof(storage) bytes.
template <int DT, int VEC>
struct Access {
    typedef typename Elem<DT>::storage S;
    typedef typename Raw<VEC * sizeof(S)>::type R;
    union Bits {
        R raw;
        S item[VEC];
    };

    static __device__ __forceinline__ void unpack(const R& raw, float (&v)[VEC]) {
        Bits b;
        b.raw = raw;
#pragma unroll
        for (int k = 0; k < VEC; ++k) v[k] = Elem<DT>::load(b.item[k]);
    }
    static __device__ __forceinline__ R pack(const float (&v)[VEC]) {
        Bits b;
#pragma unroll
        for (int k = 0; k < VEC; ++k) b.item[k] = Elem<DT>::store(v[k]);
        return b.raw;
    }
    static __device__ __forceinline__ R load(const S* p) { return *reinterpret_cast<const R*>(p); }
    static __device__ __forceinline__ void store(S* p, const float (&v)[VEC]) {
        *reinterpret_cast<R*>(p) = pack(v);
    }
};

// ---- where a thread's values live ------------------------------------------------------------
// Vectors 0..ITEMS-SMEM-1 of each input in registers, as loaded (16-bit types stay packed and
// are widened where they are used); the last SMEM vectors (16-byte vectors only) in dynamic
// shared memory, filled by cp.async, one commit group per vector (for each vector, one per
// input), so the first pass over them waits for each in turn rather than for all at once.
// Each thread reads back only the shared-memory slots it filled itself: no barrier needed.

#if __CUDA_ARCH__ >= 800
__device__ __forceinline__ void copy_async_16(void* shared, const void* global) {
    unsigned int addr = (unsigned int)__cvta_generic_to_shared(shared);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(addr), "l"(global) : "memory");
}
__device__ __forceinline__ void copy_async_commit() {
    asm volatile("cp.async.commit_group;" ::: "memory");
}
#endif
// Wait until at most `pending` of this thread's committed copy groups are still in flight
// (fewer is always safe: 7 stands for more). `pending` is a constant once loops are unrolled.
// (-DSM_COPY_WAIT_ALL: wait for all at the first use, for comparisons.)
#define SM_WAIT_CASE(n) \
    case n: asm volatile("cp.async.wait_group " #n ";" ::: "memory"); break;
__device__ __forceinline__ void copy_async_wait(int pending) {
#if __CUDA_ARCH__ >= 800
#ifdef SM_COPY_WAIT_ALL
    pending = 0;
#endif
    switch (pending < 7 ? pending : 7) {
        SM_WAIT_CASE(0) SM_WAIT_CASE(1) SM_WAIT_CASE(2) SM_WAIT_CASE(3)
        SM_WAIT_CASE(4) SM_WAIT_CASE(5) SM_WAIT_CASE(6) SM_WAIT_CASE(7)
    }
#endif
}
// copy_async_wait up to 15 (TUNE_ORDER). (Not one function with a flag: its larger switch
// changes what NVVM makes of the default kernels around it.)
__device__ __forceinline__ void copy_async_wait_exact(int pending) {
#if __CUDA_ARCH__ >= 800
    switch (pending < 15 ? pending : 15) {
        SM_WAIT_CASE(0) SM_WAIT_CASE(1) SM_WAIT_CASE(2) SM_WAIT_CASE(3)
        SM_WAIT_CASE(4) SM_WAIT_CASE(5) SM_WAIT_CASE(6) SM_WAIT_CASE(7)
        SM_WAIT_CASE(8) SM_WAIT_CASE(9) SM_WAIT_CASE(10) SM_WAIT_CASE(11)
        SM_WAIT_CASE(12) SM_WAIT_CASE(13) SM_WAIT_CASE(14) SM_WAIT_CASE(15)
    }
#endif
}
#undef SM_WAIT_CASE
// Shared-memory vectors are read and written with explicit instructions, so that each use
// reads again (cheap) instead of the compiler keeping every value in registers.
__device__ __forceinline__ uint4 load_shared(const uint4* p) {
    unsigned int addr = (unsigned int)__cvta_generic_to_shared(p);
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr) : "memory");
    return v;
}
__device__ __forceinline__ void store_shared(uint4* p, uint4 v) {
    unsigned int addr = (unsigned int)__cvta_generic_to_shared(p);
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};"
                 ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}

template <int DT, int NIN, int VEC, int ITEMS, int SMEM>
struct Held {
    typedef Access<DT, VEC> A;
    typedef typename A::R R;
    static const int DTYPE = DT;
    static const int REG = ITEMS - SMEM;
    static_assert(SMEM == 0 || (sizeof(R) == 16 && REG >= 0), "only 16-byte vectors go to smem");

    R reg[NIN][REG > 0 ? REG : 1];
    R* slot;  // this thread's first shared-memory vector; the next ones every blockDim.x

    __device__ __forceinline__ R* shared_vec(int t, int i) const {
        return slot + (t * SMEM + i - REG) * blockDim.x;
    }
    // Vector i of input t as loaded (from shared memory once its copy has landed; `exact`:
    // waiting for no later group, up to 15 of them).
    __device__ __forceinline__ R raw(int t, int i, bool exact = false) const {
        if constexpr (SMEM > 0) {
            if (i >= REG) {
                const int later = NIN * (ITEMS - i) - 1 - t;  // groups committed after it
                if (exact) copy_async_wait_exact(later);
                else copy_async_wait(later);
                return load_shared(shared_vec(t, i));
            }
        }
        return reg[t][i];
    }
    // Vector i of input t as VEC floats.
    __device__ __forceinline__ void item(int t, int i, float (&c)[VEC]) const {
        A::unpack(raw(t, i), c);
    }
    // Replace vector i of input t (float32 inputs keep intermediate values in place).
    __device__ __forceinline__ void set_item(int t, int i, const float (&c)[VEC]) {
        if constexpr (SMEM > 0) {
            if (i >= REG) {
                store_shared(shared_vec(t, i), A::pack(c));
                return;
            }
        }
        reg[t][i] = A::pack(c);
    }
};

// ---- what each operation reduces and writes ------------------------------------------------
// A Policy reduces a thread's values to a float2 partial (what an empty slot holds must not
// change it), combines partials, and writes one vector of outputs from the row's total.

__device__ __forceinline__ float2 combine_max_sum(float2 a, float2 b) {
    float m = fmaxf(a.x, b.x);
    if (m == SM_NEG_INF) return make_float2(m, a.y + b.y);  // no maximum: 0, or NaN from NaNs
    float s = a.y * exp2f((a.x - m) * SM_LOG2E) + b.y * exp2f((b.x - m) * SM_LOG2E);
    return make_float2(m, s);
}

template <int OP> struct Policy;

// Knobs of softmax_ticket (its TUNE bits; 0: as before), issue 17's one-wave 16-bit forward
// (s15-soft1w, benchmarks/notes_softmax.md v23):
//   TUNE_ORDER  the one-pass reduction reads the shared-memory vectors first, in the order
//               their copies were committed, each waiting for its own group only (up to 15
//               later ones in flight), then the register vectors: ptxas issues the register
//               loads after the copies, so they land last and the default order (registers
//               first) waits for almost every load before its first exp.
//   TUNE_PRE    the outputs' 1 / sum (log_softmax: log(sum)) once a thread, not once a vector
//               (the same values: the division and its slow path were inside every vector's
//               branch).
//   TUNE_EVEN   a row's chunks share its body equally (whole vectors) instead of full chunks
//               and a short last one: a wave's compute spreads over every SM.
constexpr int TUNE_ORDER = 1, TUNE_PRE = 2, TUNE_EVEN = 4;

// exp2 with float32 subnormal results flushed to zero: one MUFU.EX2 (exp2f adds a scaling
// around it for subnormals); for 16-bit outputs only.
__device__ __forceinline__ float exp2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// The 32-bit words of a vector of 16-bit values (pairs).
template <class R>
union Pairs {
    R raw;
    unsigned int word[sizeof(R) / 4];
};

// max(m, the vector's 16-bit values (DT 1 or 2)), NaN skipped like fmaxf: max.f16x2 /
// max.bf16x2 over pairs (one instruction for two values, no widening), exact.
template <int DT, class R>
__device__ __forceinline__ float max_vec(const R& raw, float m) {
    typedef typename Elem<DT>::storage S;
#if __CUDA_ARCH__ >= 800
    if constexpr (sizeof(R) >= 4) {
        Pairs<R> p;
        p.raw = raw;
        unsigned int pair = p.word[0];
#pragma unroll
        for (int w = 1; w < (int)(sizeof(R) / 4); ++w) {
            if constexpr (DT == 2) asm("max.bf16x2 %0, %0, %1;" : "+r"(pair) : "r"(p.word[w]));
            else asm("max.f16x2 %0, %0, %1;" : "+r"(pair) : "r"(p.word[w]));
        }
        const float lo = Elem<DT>::load((S)(pair & 0xffffu));
        return fmaxf(m, fmaxf(lo, Elem<DT>::load((S)(pair >> 16))));
    }
#endif
    const int n = sizeof(R) / sizeof(S);
    union {
        R raw;
        S item[n];
    } v;
    v.raw = raw;
#pragma unroll
    for (int k = 0; k < n; ++k) m = fmaxf(m, Elem<DT>::load(v.item[k]));
    return m;
}

// How many of a thread's ITEMS vectors (vector i at column col0 + (i * GROUP + lane) * VEC)
// lie inside a row of `cols` columns: a prefix of them (0 for a thread of no live row).
template <int VEC, int ITEMS, int GROUP>
__device__ __forceinline__ int live_items(int col0, int cols, bool live) {
    const int first = col0 + (int)(threadIdx.x % GROUP) * VEC;
    if (!live || first >= cols) return 0;
    const int n = (cols - first - 1) / (GROUP * VEC) + 1;
    return n < ITEMS ? n : ITEMS;
}

// Forward: partial = (max m, sum exp(x - m)); outputs from x and the row's (max, sum).
// A row of only -inf gives NaN like torch (-inf - -inf); NaN inputs give a NaN sum.
template <int OP>
struct Forward {
    static const int NIN = 1;
    static __device__ __forceinline__ float fill(int) { return SM_NEG_INF; }
    static __device__ __forceinline__ float2 identity() { return make_float2(SM_NEG_INF, 0.0f); }
    static __device__ __forceinline__ float2 combine(float2 a, float2 b) {
        return combine_max_sum(a, b);
    }

    // A max pass, then a sum pass. float32: its exp(x - m) replace x (softmax), so the
    // outputs need one multiplication each. 16-bit inputs: local16 (ONE: in one pass).
    // `live`: how many of the thread's vectors lie inside the row (a prefix; 16-bit only,
    // the rest hold -inf).
    template <int ITEMS, int VEC, bool ONE = false, int TUNE = 0, class H>
    static __device__ __forceinline__ float2 local(H& h, int live) {
        if constexpr (sizeof(typename H::A::S) == 2)
            return local16<ITEMS, VEC, ONE, TUNE>(h, live);
        else return local32<ITEMS, VEC>(h);
    }

    template <int ITEMS, int VEC, class H>
    static __device__ __forceinline__ float2 local32(H& h) {
        float m = SM_NEG_INF;
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) {
            float c[VEC];
            h.item(0, i, c);
#pragma unroll
            for (int k = 0; k < VEC; ++k) m = fmaxf(m, c[k]);
        }
        // Values only -inf (or NaN, which fmaxf skips): sum exp(x - 0), i.e. 0 or NaN.
        const float ref = reference(m);
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) {
            float c[VEC];
            h.item(0, i, c);
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
                c[k] = exp2f((c[k] - ref) * SM_LOG2E);
                s += c[k];
            }
            if (OP == 0) h.set_item(0, i, c);
        }
        return make_float2(m, s);
    }

    // 16-bit inputs, where these rows are compute-bound: only the thread's `live` vectors;
    // the maximum on packed pairs (exact); the sum pass widens again (there is no room to
    // keep exps), with exp2 flushing float32 subnormals (below every 16-bit normal, and at
    // most 1e-38 for bfloat16 outputs): two exps an element, no scaling around them.
    // A thread whose vectors are all live runs the passes without the per-vector branches,
    // which keep the compiler from loading the next shared-memory vector during the current
    // one's exps (up to 8 vectors a thread: with 16, the loads in flight spill at 64
    // registers).
    template <int ITEMS, int VEC, bool ONE, int TUNE = 0, class H>
    static __device__ __forceinline__ float2 local16(const H& h, int live) {
        const bool ORDER = (TUNE & TUNE_ORDER) != 0;
        if constexpr (ITEMS <= 8) {
            if (live == ITEMS) {
                if constexpr (ONE) return one_pass16<ITEMS, VEC, true, ORDER>(h, ITEMS);
                else return passes16<ITEMS, VEC, true>(h, ITEMS);
            }
        }
        if constexpr (ONE) return one_pass16<ITEMS, VEC, false, ORDER>(h, live);
        else return passes16<ITEMS, VEC, false>(h, live);
    }

    template <int ITEMS, int VEC, bool ALL, class H>
    static __device__ __forceinline__ float2 passes16(const H& h, int some) {
        typedef typename H::A A;
        const int live = ALL ? ITEMS : some;
        float m = SM_NEG_INF;
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) {
            if (i < live) m = max_vec<H::DTYPE>(h.raw(0, i), m);
        }
        // Values only -inf (or NaN, which max skips): sum exp(x - 0), i.e. 0 or NaN.
        const float ref = reference(m);
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) {
            if (i >= live) continue;
            float c[VEC];
            A::unpack(h.raw(0, i), c);
#pragma unroll
            for (int k = 0; k < VEC; ++k) s += exp2_ftz((c[k] - ref) * SM_LOG2E);
        }
        return make_float2(m, s);
    }

    // The max and the sum in one pass, each vector as it lands (ONE_PASS): the sum pass's
    // exps overlap the loads still in flight instead of following the last of them, which
    // counts where CTAs start together and have nothing else to do meanwhile (ticket
    // chunks). The exps are taken against a reference `ref` that may trail the running
    // maximum by up to LAZY (so exp(x - ref) <= e^LAZY: no overflow), moved up, with the
    // sum rescaled, only when a vector's maximum passes it by more: one exp per vector at
    // most, mostly none. The partial is then rescaled to the thread's maximum (exact, as
    // the two-pass form's). -FLT_MAX as the first reference makes -inf values (and
    // padding) add exp(-inf) = 0 and any finite maximum move it. ORDER (TUNE_ORDER, Held
    // only): the shared-memory vectors first, each waiting for its own copy only.
    template <int ITEMS, int VEC, bool ALL, bool ORDER = false, class H>
    static __device__ __forceinline__ float2 one_pass16(const H& h, int some) {
        typedef typename H::A A;
        const float LAZY = 8.0f;
        const int live = ALL ? ITEMS : some;
        float m = SM_NEG_INF, ref = -3.402823466e38f, s = 0.0f;
#pragma unroll
        for (int j = 0; j < ITEMS; ++j) {
            int i = j;  // ORDER: the ITEMS - REG shared-memory vectors, then the registers
            if constexpr (ORDER) i = j < ITEMS - H::REG ? H::REG + j : j - (ITEMS - H::REG);
            if (i >= live) continue;
            typename A::R raw;
            if constexpr (ORDER) raw = h.raw(0, i, true);
            else raw = h.raw(0, i);
            const float top = max_vec<H::DTYPE>(raw, SM_NEG_INF);
            m = fmaxf(m, top);
            if (top > ref + LAZY) {  // also +inf: then s is 0 * ... + NaN, as torch's row
                s *= exp2_ftz((ref - top) * SM_LOG2E);
                ref = top;
            }
            float c[VEC];
            A::unpack(raw, c);
#pragma unroll
            for (int k = 0; k < VEC; ++k) s += exp2_ftz((c[k] - ref) * SM_LOG2E);
        }
        // No maximum (only -inf, or NaN): s is 0 or NaN, as passes16 gives.
        if (m == SM_NEG_INF) return make_float2(m, s);
        return make_float2(m, s * exp2_ftz((ref - m) * SM_LOG2E));
    }

    static __device__ __forceinline__ float reference(float m) {
        return m == SM_NEG_INF ? 0.0f : m;
    }

    // The row's total as finish<PRE> takes it: (max, 1 / sum), log_softmax (max, log(sum)).
    static __device__ __forceinline__ float2 prepare(float2 row) {
        return make_float2(row.x, OP == 0 ? 1.0f / row.y : logf(row.y));
    }

    // own: this thread's partial (float32 softmax: its exps are relative to own's maximum,
    // unless RAW: `h` holds the inputs as loaded, as 16-bit ones always are). PRE: `row`
    // is prepare's.
    template <int VEC, bool RAW = false, bool PRE = false, class H>
    static __device__ __forceinline__ void finish(const H& h, float2 own, float2 row, int i,
                                                  float (&y)[VEC]) {
        const bool wide = sizeof(typename H::A::S) == 4;
        const bool in_place = wide && !RAW;
        float c[VEC];
        h.item(0, i, c);
        if (OP == 0) {
            const float inv = PRE ? row.y : 1.0f / row.y;
            if (in_place) {
                // A thread with no maximum of its own holds exps of 0 (or NaN from NaNs): its
                // scale is 0 * inv (NaN for a NaN row, and for a row of only -inf, where
                // the sum is 0, like torch's -inf - -inf).
                const float scale = own.x == SM_NEG_INF
                                        ? 0.0f * inv
                                        : exp2f((own.x - row.x) * SM_LOG2E) * inv;
#pragma unroll
                for (int k = 0; k < VEC; ++k) y[k] = c[k] * scale;
            } else if (wide) {  // float32 outputs keep their subnormals
#pragma unroll
                for (int k = 0; k < VEC; ++k) y[k] = exp2f((c[k] - row.x) * SM_LOG2E) * inv;
            } else {
#pragma unroll
                for (int k = 0; k < VEC; ++k) y[k] = exp2_ftz((c[k] - row.x) * SM_LOG2E) * inv;
            }
        } else {
            const float log_sum = PRE ? row.y : logf(row.y);
#pragma unroll
            for (int k = 0; k < VEC; ++k) y[k] = (c[k] - row.x) - log_sum;
        }
    }
};

// Backward: input 0 = y (forward output), input 1 = dy; partial.x = sum(dy * y) or sum(dy).
template <int OP>
struct Backward {
    static const int NIN = 2;
    static __device__ __forceinline__ float fill(int) { return 0.0f; }
    static __device__ __forceinline__ float2 identity() { return make_float2(0.0f, 0.0f); }
    static __device__ __forceinline__ float2 combine(float2 a, float2 b) {
        return make_float2(a.x + b.x, 0.0f);
    }

    template <int ITEMS, int VEC, bool ONE = false, class H>
    static __device__ __forceinline__ float2 local(H& h, int) {
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) {
            float y[VEC], dy[VEC];
            h.item(0, i, y);
            h.item(1, i, dy);
#pragma unroll
            for (int k = 0; k < VEC; ++k) s += (OP == 2) ? dy[k] * y[k] : dy[k];
        }
        return make_float2(s, 0.0f);
    }

    template <int VEC, bool RAW = false, class H>
    static __device__ __forceinline__ void finish(const H& h, float2, float2 row, int i,
                                                  float (&dx)[VEC]) {
        float y[VEC], dy[VEC];
        h.item(0, i, y);
        h.item(1, i, dy);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            if (OP == 2) dx[k] = y[k] * (dy[k] - row.x);      // y * (dy - sum(dy * y))
            else dx[k] = dy[k] - expf(y[k]) * row.x;         // dy - exp(y) * sum(dy)
        }
    }
};

template <> struct Policy<0> : Forward<0> {};
template <> struct Policy<1> : Forward<1> {};
template <> struct Policy<2> : Backward<2> {};
template <> struct Policy<3> : Backward<3> {};

// ---- reductions ------------------------------------------------------------------------------

__device__ __forceinline__ float2 shfl_xor(float2 a, int offset) {
    return make_float2(__shfl_xor_sync(0xffffffffu, a.x, offset),
                       __shfl_xor_sync(0xffffffffu, a.y, offset));
}

__device__ __forceinline__ float2 shfl_lane0(float2 a) {
    return make_float2(__shfl_sync(0xffffffffu, a.x, 0), __shfl_sync(0xffffffffu, a.y, 0));
}

// Butterfly over aligned groups of WIDTH lanes: every lane ends with its group's total.
template <int OP, int WIDTH>
__device__ __forceinline__ float2 reduce_lanes(float2 a) {
#pragma unroll
    for (int offset = WIDTH / 2; offset > 0; offset /= 2)
        a = Policy<OP>::combine(a, shfl_xor(a, offset));
    return a;
}

// Total over each group of GROUP consecutive threads (a multiple of 32), in every thread:
// warps reduce, warp totals meet in `warp_total` (THREADS / 32 slots), a barrier (the CTA's,
// or a named one per group) orders them, then each warp reduces its group's warp totals.
// Callers that reduce again reuse `warp_total` only after another barrier of theirs.
template <int OP, int GROUP, int THREADS>
__device__ __forceinline__ float2 reduce_warps(float2 a, float2* warp_total) {
    a = reduce_lanes<OP, 32>(a);
    if constexpr (GROUP == 32) return a;
    const int WARPS = GROUP / 32;
    const int lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32;
    const int first = warp - warp % WARPS;  // the group's first warp
    if (lane == 0) warp_total[warp] = a;
    if constexpr (GROUP == THREADS) {
        __syncthreads();
    } else {
        asm volatile("bar.sync %0, %1;" ::"r"(1 + warp / WARPS), "n"(GROUP) : "memory");
    }
    a = lane < WARPS ? warp_total[first + lane] : Policy<OP>::identity();
    return shfl_lane0(reduce_lanes<OP, WARPS>(a));
}

// ---- cluster helpers (sm_90: distributed shared memory) --------------------------------------

#if __CUDA_ARCH__ >= 900
__device__ __forceinline__ unsigned int cluster_rank() {
    unsigned int r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ void cluster_arrive() {
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// A cluster barrier after which the peers may read (ld.shared::cluster) what this CTA's threads
// wrote to its shared memory before it: release and acquire restricted to shared memory around
// a relaxed arrive (~0.3 us on an H100 where a release-arrive costs ~0.9,
// benchmarks/cluster_cost_dev.py). Not for a barrier that says "done reading the peers": a
// relaxed arrive does not wait for this thread's loads (notes_softmax.md v26).
__device__ __forceinline__ void cluster_publish() {
    asm volatile("fence.release.sync_restrict::shared::cta.cluster;\n"
                 "barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;\n"
                 "fence.acquire.sync_restrict::shared::cluster.cluster;\n" ::: "memory");
}
// Read a float2 at the same shared-memory offset in CTA `rank` of this cluster.
__device__ __forceinline__ float2 load_peer(const float2* local, unsigned int rank) {
    unsigned int addr = (unsigned int)__cvta_generic_to_shared(local);
    unsigned int peer;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(peer) : "r"(addr), "r"(rank));
    float2 v;
    asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];"
                 : "=f"(v.x), "=f"(v.y) : "r"(peer) : "memory");
    return v;
}
// The cluster's total from each CTA's `total`: published in `slot`, exchanged after a cluster
// barrier. A CTA must not exit (or rewrite `slot`) before its peers have read it: callers end
// with another cluster barrier, or use a second slot for the next row.
template <int OP, int CLUSTER>
__device__ __forceinline__ float2 reduce_cluster(float2 total, float2* slot) {
    if (threadIdx.x == 0) *slot = total;
    cluster_publish();
    const unsigned int lane = threadIdx.x % 32;
    total = lane < CLUSTER ? load_peer(slot, lane) : Policy<OP>::identity();
    return shfl_lane0(reduce_lanes<OP, CLUSTER>(total));
}
#endif

// ---- chunks of a row over CTAs that wait for each other (softmax_ticket) -------------------
// The workspace (kernels/_gemm_workspace.py, the stream's): `counters` zero before each
// launch and left zero by it (`counters[0]` the ticket, `counters[1 + r]` row r's count: +1
// per chunk published, +1 per chunk that has read the row's total; the last resets it), and
// a float2 partial per chunk (`partials`). A CTA takes ticket t = row * chunks + chunk when
// it starts, so every chunk of a row below t's has been taken by a running CTA: the wait
// ends as long as `chunks` CTAs fit on the device at once.

__device__ __forceinline__ void add_release(unsigned int* p, unsigned int v) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned int load_acquire(const unsigned int* p) {
    unsigned int v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ float2 load_relaxed(const float2* p) {
    float2 v;
    asm volatile("ld.relaxed.gpu.global.v2.f32 {%0, %1}, [%2];"
                 : "=f"(v.x), "=f"(v.y) : "l"(p) : "memory");
    return v;
}

// The next ticket (thread 0); the last of a launch's `draws` leaves the counter zero (every
// other draw has happened).
__device__ __forceinline__ unsigned int take_ticket(unsigned int* counter, long long draws) {
    const unsigned int t = atomicAdd(counter, 1u);
    if (t == draws - 1) *counter = 0u;
    return t;
}

// Wait (warp 0) until a row's `chunks` partials (`mine`) are published (its count,
// `arrived`, reaches `chunks`), combine them and count this chunk's read (the row's last
// read leaves the count zero); the total in every thread. The count's atomic comes after
// the barrier, so that only thread 0 waits for it.
template <int OP>
__device__ __forceinline__ float2 await_row(unsigned int* arrived, const float2* mine,
                                            int chunks, float2* shared) {
    if (threadIdx.x < 32) {
        while (load_acquire(arrived) < (unsigned int)chunks) __nanosleep(64);
        float2 total = Policy<OP>::identity();
        for (int c = threadIdx.x; c < chunks; c += 32)
            total = Policy<OP>::combine(total, load_relaxed(mine + c));
        total = reduce_lanes<OP, 32>(total);
        if (threadIdx.x == 0) *shared = total;
    }
    __syncthreads();
    const float2 total = *shared;
    if (threadIdx.x == 0 && atomicAdd(arrived, 1u) == 2u * (unsigned int)chunks - 1u)
        *arrived = 0u;
    return total;
}

// Publish this chunk's `partial` of row `row` (thread 0; a row's partials `stride` apart),
// wait for the row's `chunks` partials and return their total in every thread (await_row).
template <int OP>
__device__ __forceinline__ float2 meet_row(float2 partial, unsigned int* counters,
                                           float2* partials, long long row, int chunk,
                                           int chunks, int stride, float2* shared) {
    unsigned int* arrived = counters + 1 + row;
    float2* mine = partials + row * stride;
    if (threadIdx.x == 0) {
        mine[chunk] = partial;
        add_release(arrived, 1u);  // orders the partial's store before the count
    }
    return await_row<OP>(arrived, mine, chunks, shared);
}

// ---- the shared body ------------------------------------------------------------------------

// Load this thread's values: vector i of input t holds columns col0 + (i*GROUP + lane)*VEC;
// slots past the row's end hold the policy's neutral value.
template <int DT, int OP, int VEC, int ITEMS, int GROUP, int SMEM>
__device__ __forceinline__ void load_row(Held<DT, Policy<OP>::NIN, VEC, ITEMS, SMEM>& h,
                                         const typename Elem<DT>::storage* const (&in)[2],
                                         long long base, int col0, int cols, bool live) {
    typedef Access<DT, VEC> A;
    const int lane = threadIdx.x % GROUP;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
        const int col = col0 + (i * GROUP + lane) * VEC;
        const bool inside = live && col < cols;
#pragma unroll
        for (int t = 0; t < Policy<OP>::NIN; ++t) {
            float empty[VEC];
#pragma unroll
            for (int k = 0; k < VEC; ++k) empty[k] = Policy<OP>::fill(t);
            if constexpr (SMEM > 0) {
                if (i >= h.REG) {
#if __CUDA_ARCH__ >= 800
                    if (inside) copy_async_16(h.shared_vec(t, i), in[t] + base + col);
                    else store_shared(h.shared_vec(t, i), A::pack(empty));
                    copy_async_commit();  // one group per vector: see Held::item
#endif
                    continue;
                }
            }
            if (inside) h.reg[t][i] = A::load(in[t] + base + col);
            else h.reg[t][i] = A::pack(empty);
        }
    }
}

// TUNE_PRE (forward only): the row's factor once (Forward::prepare), not in every vector.
template <int DT, int OP, int VEC, int ITEMS, int GROUP, int SMEM, int TUNE = 0>
__device__ __forceinline__ void store_row(const Held<DT, Policy<OP>::NIN, VEC, ITEMS, SMEM>& h,
                                          float2 own, float2 total,
                                          typename Elem<DT>::storage* out,
                                          long long base, int col0, int cols, bool live) {
    const int lane = threadIdx.x % GROUP;
    const bool PRE = (TUNE & TUNE_PRE) != 0;
    float2 row = total;  // PRE: prepare's
    if constexpr (PRE) row = Policy<OP>::prepare(total);
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
        const int col = col0 + (i * GROUP + lane) * VEC;
        if (live && col < cols) {
            float y[VEC];
            if constexpr (PRE) Policy<OP>::template finish<VEC, false, true>(h, own, row, i, y);
            else Policy<OP>::finish(h, own, total, i, y);
            Access<DT, VEC>::store(out + base + col, y);
        }
    }
}


// ---- rows at any alignment -------------------------------------------------------------------
// With EDGES, VEC-wide accesses start at a row's first VEC-aligned element: every array has
// the same address modulo VEC elements (the plan checks), so one offset serves all inputs
// and the output. The `head` elements before it and the tail after the body's last whole
// vector (each fewer than VEC) are edge slots of one element, spread over the group's lanes
// (N per thread): slot e is column e (e < head) or e + body. Their partial is combined with
// the body's before the row's reduction, and their outputs use it (as own) like the body's.
// Without EDGES (N == 0) the whole row is body: its length and pointers allow VEC.
struct RowSpan {
    long long body_base;  // element index of the body's first element
    int body;             // body columns, a multiple of VEC
    int head;             // edge slots: columns [0, head) and [head + body, cols)
    int edges;            // head + tail
};

template <int DT, int OP, int VEC, int GROUP, int EDGES>
struct Edges {
    typedef typename Elem<DT>::storage S;
    typedef Access<DT, 1> A;
    static const int N = (EDGES && VEC > 1) ? (2 * VEC - 2 + GROUP - 1) / GROUP : 0;
    Held<DT, Policy<OP>::NIN, 1, (N > 0 ? N : 1), 0> h;
    RowSpan span;
    float2 own;
    bool live;  // this thread's group holds the row's edges (a live row; first CTA of several)

    __device__ __forceinline__ Edges(const S* a, long long base, int cols, bool edges_live)
        : own(Policy<OP>::identity()), live(edges_live) {
        span = RowSpan{base, cols, 0, 0};
        if constexpr (N > 0) {
            const int bytes = VEC * (int)sizeof(S);
            const int off = (int)(reinterpret_cast<unsigned long long>(a + base) & (bytes - 1));
            int head = off ? (bytes - off) / (int)sizeof(S) : 0;
            head = head < cols ? head : cols;
            span.body = (cols - head) / VEC * VEC;
            span.body_base = base + head;
            span.head = head;
            span.edges = cols - span.body;
        }
    }
    __device__ __forceinline__ long long column(int e) const {
        return span.body_base - span.head + (e < span.head ? e : e + span.body);
    }
    __device__ __forceinline__ void load(const S* const (&in)[2]) {
        if constexpr (N > 0) {
            const int lane = threadIdx.x % GROUP;
#pragma unroll
            for (int j = 0; j < N; ++j) {
                const int e = j * GROUP + lane;
                const bool inside = live && e < span.edges;
#pragma unroll
                for (int t = 0; t < Policy<OP>::NIN; ++t) {
                    const float empty[1] = {Policy<OP>::fill(t)};
                    h.reg[t][j] = inside ? A::load(in[t] + column(e)) : A::pack(empty);
                }
            }
        }
    }
    // The thread's partial: the body's `body`, with the edges' folded in.
    __device__ __forceinline__ float2 local(float2 body) {
        if constexpr (N == 0) return body;
        own = Policy<OP>::template local<N, 1>(h, N);
        return Policy<OP>::combine(body, own);
    }
    __device__ __forceinline__ void store(S* out, float2 total) const {
        if constexpr (N > 0) {
            const int lane = threadIdx.x % GROUP;
#pragma unroll
            for (int j = 0; j < N; ++j) {
                const int e = j * GROUP + lane;
                if (live && e < span.edges) {
                    float y[1];
                    Policy<OP>::finish(h, own, total, j, y);
                    A::store(out + column(e), y);
                }
            }
        }
    }
};

// A group's share of a row: the body's columns from col0 up to `end` (and, with `edges`
// live, the row's edges) loaded into `h` and `edges`; returns the thread's partial with the
// edges folded in, and the body's alone in `own` (store_row's). ONE: the 16-bit forward
// reduction in one pass (Forward::one_pass16).
template <int DT, int OP, int VEC, int ITEMS, int GROUP, int SMEM, int ONE, int EDGES,
          int TUNE = 0>
__device__ __forceinline__ float2 load_share_upto(Held<DT, Policy<OP>::NIN, VEC, ITEMS, SMEM>& h,
                                                  Edges<DT, OP, VEC, GROUP, EDGES>& edges,
                                                  const typename Elem<DT>::storage* const (&in)[2],
                                                  int col0, int end, bool live, float2& own) {
    load_row<DT, OP, VEC, ITEMS, GROUP, SMEM>(h, in, edges.span.body_base, col0, end, live);
    edges.load(in);
    const int n = live_items<VEC, ITEMS, GROUP>(col0, end, live);
    // (TUNE only for Forward: Backward::local takes no TUNE value)
    if constexpr (TUNE != 0) own = Policy<OP>::template local<ITEMS, VEC, ONE != 0, TUNE>(h, n);
    else own = Policy<OP>::template local<ITEMS, VEC, ONE != 0>(h, n);
    return edges.local(own);
}

// load_share_upto to the body's end.
template <int DT, int OP, int VEC, int ITEMS, int GROUP, int SMEM, int ONE, int EDGES>
__device__ __forceinline__ float2 load_share(Held<DT, Policy<OP>::NIN, VEC, ITEMS, SMEM>& h,
                                             Edges<DT, OP, VEC, GROUP, EDGES>& edges,
                                             const typename Elem<DT>::storage* const (&in)[2],
                                             int col0, bool live, float2& own) {
    return load_share_upto<DT, OP, VEC, ITEMS, GROUP, SMEM, ONE>(h, edges, in, col0,
                                                                 edges.span.body, live, own);
}


// ---- persistent chunks (softmax_persist) -------------------------------------------------------
// A grid of as many CTAs as fit at once, each taking chunks from the ticket in turn with two
// stages (two sets of registers and two halves of its shared memory): after it publishes a
// chunk's partial it takes the next ticket and issues that chunk's loads, then waits for the
// row and writes, so the next chunk's loads are in flight during the wait and the writes.
// A stage whose chunk is of the row being waited for is reduced and published before the
// wait (else the row would wait for it). Deadlock-free under tickets_fit's condition, as
// softmax_ticket: a CTA that waits has published every chunk it holds of that row.

// A stage's vectors read (and, float32 softmax, rewritten) after all of them landed, while
// the other stage's copies are in flight: no cp.async wait, which would wait for those too.
template <int DT, int NIN, int VEC, int ITEMS, int SMEM>
struct Landed {
    typedef Held<DT, NIN, VEC, ITEMS, SMEM> H;
    typedef typename H::A A;
    typedef typename H::R R;
    static const int DTYPE = DT;
    H& h;

    __device__ __forceinline__ R raw(int t, int i) const {
        if constexpr (SMEM > 0) {
            if (i >= H::REG) return load_shared(h.shared_vec(t, i));
        }
        return h.reg[t][i];
    }
    __device__ __forceinline__ void item(int t, int i, float (&c)[VEC]) const {
        A::unpack(raw(t, i), c);
    }
    __device__ __forceinline__ void set_item(int t, int i, const float (&c)[VEC]) {
        h.set_item(t, i, c);
    }
};

// Wait until at most N of this thread's copy groups are in flight (any N).
template <int N>
__device__ __forceinline__ void copy_async_wait_n() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

template <int DT, int OP, int VEC, int ITEMS, int THREADS, int SMEM, int EDGES, int ONE>
struct Stage {
    typedef typename Elem<DT>::storage S;
    static const int GROUPS = Policy<OP>::NIN * SMEM;  // copy groups a chunk commits
    Held<DT, Policy<OP>::NIN, VEC, ITEMS, SMEM> h;
    Edges<DT, OP, VEC, THREADS, EDGES> edges;
    long long row;
    int chunk;
    int col0;
    float2 own;   // the body's partial (store's)
    float2 mine;  // the CTA's partial of the chunk
    bool reduced;

    __device__ __forceinline__ explicit Stage(const S* a) : edges(a, 0, 1, false) {}

    // Take chunk `ticket` and issue its loads.
    __device__ __forceinline__ void start(const S* const (&in)[2], unsigned int ticket,
                                          int cols, int chunks) {
        row = ticket / (unsigned int)chunks;
        chunk = (int)(ticket % (unsigned int)chunks);
        col0 = chunk * (THREADS * ITEMS * VEC);
        edges = Edges<DT, OP, VEC, THREADS, EDGES>(in[0], row * (long long)cols, cols, chunk == 0);
        load_row<DT, OP, VEC, ITEMS, THREADS, SMEM>(h, in, edges.span.body_base, col0,
                                                    edges.span.body, true);
        edges.load(in);
        reduced = false;
    }
    // Reduce the chunk and publish its partial. LANDED: its copies have landed (else they
    // are the last committed, waited for one by one).
    template <bool LANDED = false>
    __device__ __forceinline__ void reduce(float2* warp_total, unsigned int* counters,
                                           float2* partials, int chunks) {
        const int live = live_items<VEC, ITEMS, THREADS>(col0, edges.span.body, true);
        if constexpr (LANDED) {
            Landed<DT, Policy<OP>::NIN, VEC, ITEMS, SMEM> landed{h};
            own = Policy<OP>::template local<ITEMS, VEC, ONE != 0>(landed, live);
        } else {
            own = Policy<OP>::template local<ITEMS, VEC, ONE != 0>(h, live);
        }
        mine = reduce_warps<OP, THREADS, THREADS>(edges.local(own), warp_total);
        if (threadIdx.x == 0) {
            partials[row * chunks + chunk] = mine;
            add_release(counters + 1 + row, 1u);  // orders the partial's store before the count
        }
        reduced = true;
    }
    // Wait for the row's partials (warp 0), then write the chunk's outputs.
    __device__ __forceinline__ void finish(S* out, unsigned int* counters,
                                           const float2* partials, int chunks, float2* shared) {
        const float2 total = await_row<OP>(counters + 1 + row, partials + row * chunks, chunks,
                                           shared);
        Landed<DT, Policy<OP>::NIN, VEC, ITEMS, SMEM> landed{h};
        const int body = edges.span.body;
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) {
            const int col = col0 + (i * THREADS + (int)threadIdx.x) * VEC;
            if (col < body) {
                float y[VEC];
                Policy<OP>::finish(landed, own, total, i, y);
                Access<DT, VEC>::store(out + edges.span.body_base + col, y);
            }
        }
        edges.store(out, total);
    }
};

// One chunk of softmax_persist: `cur` (loaded; reduced or not), and the next ticket's loads
// into `next`, issued after cur's reduction, or (EARLY) before it (cur's copies, issued a
// chunk earlier, then waited for all at once); false when there is no next chunk.
template <int EARLY, class St>
__device__ __forceinline__ bool persist_step(St& cur, St& next,
                                             const typename St::S* const (&in)[2],
                                             typename St::S* out, unsigned int* counters,
                                             float2* partials, long long total_chunks, int cols,
                                             int chunks, float2* warp_total, float2* row_total,
                                             unsigned int* ticket) {
    if (!EARLY && !cur.reduced) cur.reduce(warp_total, counters, partials, chunks);
    // each CTA draws until it fails once: total_chunks + gridDim.x draws in all
    if (threadIdx.x == 0) *ticket = take_ticket(counters, total_chunks + gridDim.x);
    __syncthreads();
    const unsigned int u = *ticket;
    const bool more = u < total_chunks;
    if (more) next.start(in, u, cols, chunks);
    if (EARLY && !cur.reduced) {
        if (more) copy_async_wait_n<St::GROUPS>();  // all but next's
        else copy_async_wait_n<0>();
        cur.template reduce<true>(warp_total, counters, partials, chunks);
    }
    if (more && next.row == cur.row) {
        if (EARLY) __syncthreads();  // cur's reduction has read warp_total (else: the ticket's)
        next.reduce(warp_total, counters, partials, chunks);
    }
    cur.finish(out, counters, partials, chunks, row_total);
    return more;
}

}  // namespace gpurt_softmax

// ---- kernels ---------------------------------------------------------------------------------
// Arguments: a = x (forward) or y (backward), b = dy (backward; ignored forward), out,
// rows, cols. Rows are contiguous: row r starts at element r * cols. Dynamic shared memory:
// NIN * SMEM * THREADS * 16 bytes.

#define SM_STORAGE typename gpurt_softmax::Elem<DT>::storage
#define SM_HELD(SMEM) gpurt_softmax::Held<DT, gpurt_softmax::Policy<OP>::NIN, VEC, ITEMS, SMEM>

template <int DT, int OP, int VEC, int ITEMS, int GROUP, int THREADS, int MINB, int SMEM,
          int EDGES = 0, int ONE_PASS = 0>
__global__ void __launch_bounds__(THREADS, MINB)
softmax_rows(const SM_STORAGE* a, const SM_STORAGE* b, SM_STORAGE* out, long long rows, int cols) {
    using namespace gpurt_softmax;
    static_assert(GROUP <= 32 || (GROUP % 32 == 0 && THREADS % GROUP == 0 && THREADS / GROUP <= 15),
                  "GROUP is a lane group, whole warps (at most 15 groups), or the whole CTA");
    __shared__ float2 warp_total[THREADS / 32];
    const long long row = (long long)blockIdx.x * (THREADS / GROUP) + threadIdx.x / GROUP;
    const bool live = row < rows;
    const long long base = row * (long long)cols;
    const SM_STORAGE* in[2] = {a, b};
    extern __shared__ uint4 shared_items[];
    SM_HELD(SMEM) h;
    h.slot = reinterpret_cast<typename SM_HELD(SMEM)::R*>(shared_items) + threadIdx.x;
    Edges<DT, OP, VEC, GROUP, EDGES> edges(a, base, cols, live);
    const RowSpan& span = edges.span;
    float2 own;
    const float2 mine = load_share<DT, OP, VEC, ITEMS, GROUP, SMEM, ONE_PASS>(h, edges, in, 0,
                                                                            live, own);
    float2 total;
    if constexpr (GROUP <= 32) total = reduce_lanes<OP, GROUP>(mine);
    else total = reduce_warps<OP, GROUP, THREADS>(mine, warp_total);
    store_row<DT, OP, VEC, ITEMS, GROUP, SMEM>(h, own, total, out, span.body_base, 0, span.body,
                                               live);
    edges.store(out, total);
}

#if __CUDA_ARCH__ >= 900  // thread-block clusters
template <int DT, int OP, int VEC, int ITEMS, int THREADS, int CLUSTER, int MINB, int SMEM,
          int EDGES = 0, int ONE_PASS = 0>
__global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(THREADS, MINB)
softmax_cluster(const SM_STORAGE* a, const SM_STORAGE* b, SM_STORAGE* out, long long rows,
                int cols) {
    using namespace gpurt_softmax;
    __shared__ float2 warp_total[THREADS / 32];
    __shared__ float2 cta_total;
    const int col0 = (int)cluster_rank() * (THREADS * ITEMS * VEC);
    const SM_STORAGE* in[2] = {a, b};
    extern __shared__ uint4 shared_items[];
    SM_HELD(SMEM) h;
    h.slot = reinterpret_cast<typename SM_HELD(SMEM)::R*>(shared_items) + threadIdx.x;
    // One row per cluster, or (a grid of fewer clusters than rows) every gridDim.x/CLUSTER-th.
    for (long long row = blockIdx.x / CLUSTER; row < rows; row += gridDim.x / CLUSTER) {
        const long long base = row * (long long)cols;
        Edges<DT, OP, VEC, THREADS, EDGES> edges(a, base, cols, col0 == 0);
        const RowSpan& span = edges.span;
        float2 own;
        float2 total = reduce_warps<OP, THREADS, THREADS>(
            load_share<DT, OP, VEC, ITEMS, THREADS, SMEM, ONE_PASS>(h, edges, in, col0, true,
                                                                    own),
            warp_total);
        total = reduce_cluster<OP, CLUSTER>(total, &cta_total);
        cluster_arrive();  // done reading peers; their shared memory must outlive this
        store_row<DT, OP, VEC, ITEMS, THREADS, SMEM>(h, own, total, out, span.body_base, col0,
                                                     span.body, true);
        edges.store(out, total);
        cluster_wait();  // (and cta_total may be rewritten for the next row)
    }
}
#endif

// Rows longer than a cluster holds, in one launch: see meet_row. `counters`, `partials`: the
// workspace. TUNE: the TUNE_ bits (16-bit forward; 0 as before).
// (Chunks of equal length instead of full ones and a short last one read 2-8 points slower
// on an H100 in s8-softlong16, not explained: benchmarks/notes_softmax.md, v13; TUNE_EVEN.)
template <int DT, int OP, int VEC, int ITEMS, int THREADS, int MINB, int SMEM, int EDGES = 0,
          int ONE_PASS = 0, int TUNE = 0>
__global__ void __launch_bounds__(THREADS, MINB)
softmax_ticket(const SM_STORAGE* a, const SM_STORAGE* b, SM_STORAGE* out,
               unsigned int* counters, float2* partials, long long rows, int cols, int chunks) {
    using namespace gpurt_softmax;
    __shared__ float2 warp_total[THREADS / 32];
    __shared__ float2 row_total;
    __shared__ unsigned int ticket;
    if (threadIdx.x == 0) ticket = take_ticket(counters, rows * chunks);
    __syncthreads();
    const long long row = ticket / (unsigned int)chunks;
    if (row >= rows) return;  // only with a workspace not zeroed: never write out of bounds
    const int chunk = (int)(ticket % (unsigned int)chunks);
    int col0 = chunk * (THREADS * ITEMS * VEC);  // full chunks (TUNE_EVEN: below)
    const long long base = row * (long long)cols;
    const SM_STORAGE* in[2] = {a, b};
    extern __shared__ uint4 shared_items[];
    SM_HELD(SMEM) h;
    h.slot = reinterpret_cast<typename SM_HELD(SMEM)::R*>(shared_items) + threadIdx.x;
    Edges<DT, OP, VEC, THREADS, EDGES> edges(a, base, cols, chunk == 0);
    const RowSpan& span = edges.span;
    int end = span.body;  // the chunk's body columns: [col0, end)
    if constexpr ((TUNE & TUNE_EVEN) != 0) {
        const int step = (span.body / VEC + chunks - 1) / chunks * VEC;
        col0 = chunk * step;
        end = min(col0 + step, span.body);
    }
    float2 own;
    const float2 mine = reduce_warps<OP, THREADS, THREADS>(
        load_share_upto<DT, OP, VEC, ITEMS, THREADS, SMEM, ONE_PASS, EDGES, TUNE>(
            h, edges, in, col0, end, true, own),
        warp_total);
    const float2 total = meet_row<OP>(mine, counters, partials, row, chunk, chunks, chunks,
                                      &row_total);
    store_row<DT, OP, VEC, ITEMS, THREADS, SMEM, TUNE>(h, own, total, out, span.body_base, col0,
                                                       end, true);
    edges.store(out, total);
}

// Rows longer than a cluster holds, in a persistent grid (as many CTAs as fit at once) that
// overlaps each chunk's wait and writes with the next chunk's loads: see Stage. Dynamic
// shared memory: two stages of NIN * SMEM * THREADS * 16 bytes.
template <int DT, int OP, int VEC, int ITEMS, int THREADS, int MINB, int SMEM, int EDGES,
          int ONE_PASS, int EARLY>
__global__ void __launch_bounds__(THREADS, MINB)
softmax_persist(const SM_STORAGE* a, const SM_STORAGE* b, SM_STORAGE* out,
                unsigned int* counters, float2* partials, long long rows, int cols, int chunks) {
    using namespace gpurt_softmax;
    typedef Stage<DT, OP, VEC, ITEMS, THREADS, SMEM, EDGES, ONE_PASS> St;
    __shared__ float2 warp_total[THREADS / 32];
    __shared__ float2 row_total;
    __shared__ unsigned int ticket;
    const long long total_chunks = rows * chunks;
    const SM_STORAGE* in[2] = {a, b};
    extern __shared__ uint4 shared_items[];
    typedef typename SM_HELD(SMEM)::R R;
    St first(a), second(a);
    first.h.slot = reinterpret_cast<R*>(shared_items) + threadIdx.x;
    second.h.slot = first.h.slot + Policy<OP>::NIN * SMEM * THREADS;
    if (threadIdx.x == 0) ticket = take_ticket(counters, total_chunks + gridDim.x);
    __syncthreads();
    const unsigned int t = ticket;
    __syncthreads();  // read by all before thread 0 takes the next
    if (t >= total_chunks) return;
    first.start(in, t, cols, chunks);
    for (;;) {
        if (!persist_step<EARLY>(first, second, in, out, counters, partials, total_chunks, cols,
                                 chunks, warp_total, &row_total, &ticket))
            break;
        if (!persist_step<EARLY>(second, first, in, out, counters, partials, total_chunks, cols,
                                 chunks, warp_total, &row_total, &ticket))
            break;
    }
}

// Rows longer than a cluster holds: pass 1 writes one float2 partial per (row, chunk).
template <int DT, int OP, int VEC, int ITEMS, int THREADS, int EDGES = 0>
__global__ void __launch_bounds__(THREADS)
softmax_partial(const SM_STORAGE* a, const SM_STORAGE* b, float2* partials, long long rows,
                int cols, int chunks) {
    using namespace gpurt_softmax;
    typedef Policy<OP> P;
    __shared__ float2 warp_total[THREADS / 32];
    const long long row = blockIdx.x / chunks;
    const int col0 = (int)(blockIdx.x % chunks) * (THREADS * ITEMS * VEC);
    const long long base = row * (long long)cols;
    const SM_STORAGE* in[2] = {a, b};
    SM_HELD(0) h;
    Edges<DT, OP, VEC, THREADS, EDGES> edges(a, base, cols, col0 == 0);
    load_row<DT, OP, VEC, ITEMS, THREADS, 0>(h, in, edges.span.body_base, col0, edges.span.body,
                                             true);
    edges.load(in);
    const float2 own = edges.local(P::template local<ITEMS, VEC>(
        h, live_items<VEC, ITEMS, THREADS>(col0, edges.span.body, true)));
    const float2 total = reduce_warps<OP, THREADS, THREADS>(own, warp_total);
    if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

// Pass 2: chunks in reverse order (the last ones read are likeliest still in L2); each warp
// combines the row's partials itself, then the chunk's outputs are written.
template <int DT, int OP, int VEC, int ITEMS, int THREADS, int EDGES = 0>
__global__ void __launch_bounds__(THREADS)
softmax_finish(const SM_STORAGE* a, const SM_STORAGE* b, SM_STORAGE* out,
               const float2* partials, long long rows, int cols, int chunks) {
    using namespace gpurt_softmax;
    typedef Policy<OP> P;
    const unsigned int id = gridDim.x - 1 - blockIdx.x;
    const long long row = id / chunks;
    const int col0 = (int)(id % chunks) * (THREADS * ITEMS * VEC);
    const long long base = row * (long long)cols;
    const SM_STORAGE* in[2] = {a, b};
    SM_HELD(0) h;
    Edges<DT, OP, VEC, THREADS, EDGES> edges(a, base, cols, col0 == 0);
    const RowSpan& span = edges.span;
    load_row<DT, OP, VEC, ITEMS, THREADS, 0>(h, in, span.body_base, col0, span.body, true);
    edges.load(in);
    const float2 own = P::template local<ITEMS, VEC>(
        h, live_items<VEC, ITEMS, THREADS>(col0, span.body, true));
    edges.local(own);
    float2 total = P::identity();
    for (int c = threadIdx.x % 32; c < chunks; c += 32)
        total = P::combine(total, partials[row * chunks + c]);
    total = reduce_lanes<OP, 32>(total);
    store_row<DT, OP, VEC, ITEMS, THREADS, 0>(h, own, total, out, span.body_base, col0, span.body,
                                              true);
    edges.store(out, total);
}

#undef SM_HELD
#undef SM_STORAGE
