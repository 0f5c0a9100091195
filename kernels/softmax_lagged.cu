// Rows longer than a CTA holds, in chunks that are reduced now and written later
// (softmax_lagged); appended to softmax.cu, whose helpers it uses (one NVRTC program).
//
// softmax_ticket keeps each chunk on chip while it waits for its row's other chunks, so a
// CTA holds its SM from its first load to its last store, and a launch is a few waves of big
// CTAs that start, wait and finish together (benchmarks/notes_softmax.md, v11-v15). Here a
// CTA does two independent things: it reduces chunk t (its ticket: loads, the partial,
// published as softmax_ticket does) and it writes chunk t - lag, whose row was published
// `lag` tickets earlier: it reads that chunk again (from L2: it was read `lag` chunks ago),
// takes the row's total and writes its outputs. Nothing waits with a chunk on chip, CTAs
// are small and many, and the inputs leave HBM once as long as the lag's chunks stay in L2.
// A launch is rows * chunks + lag CTAs; ticket t < rows * chunks reduces chunk t, ticket
// t >= lag writes chunk t - lag. With lag >= chunks a CTA waits only for chunks of lower
// tickets, whose CTAs started before it and publish before waiting for anything: no
// deadlock, whatever number of CTAs fit at once. Measured (s9-soft16, H100): at best level
// with softmax_ticket at rows of 1M (with HINT 2), slower elsewhere: for forced comparisons
// only, the chooser does not pick it.
//
// The workspace is softmax_ticket's (counters left zero: take_ticket, await_row).
// Template parameters as softmax_ticket's (no shared-memory vectors), and HINT: 0 none; 1
// the second read and the stores with the streaming hint (.cs: evict first), so that they
// do not push the lag's chunks out of L2; 2 the first read with an L2 evict-last policy, the
// second read and the stores with an evict-first one. EARLY: issue the second read of the
// chunk to write before reducing the chunk to reduce (the inputs do not change: only this CTA
// writes that chunk), so that its latency overlaps the first read's.

namespace gpurt_softmax {

// The loads and stores of 16-byte vectors with the L2 hints of HINT (others plain).
template <int HINT>
struct Hints {
    unsigned long long keep = 0, drop = 0;  // HINT 2: L2 evict-last and evict-first policies

    __device__ __forceinline__ Hints() {
        if constexpr (HINT == 2) {
            asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(keep));
            asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(drop));
        }
    }
    template <class R>
    __device__ __forceinline__ R load(const R* p, bool again) const {
        if constexpr (sizeof(R) == 16 && HINT == 2) {
            R v;
            asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                         : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                         : "l"(p), "l"(again ? drop : keep));
            return v;
        }
        if constexpr (sizeof(R) == 16 && HINT == 1) {
            if (again) {
                R v;
                asm volatile("ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%4];"
                             : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
                return v;
            }
        }
        return *p;
    }
    template <class R>
    __device__ __forceinline__ void store(R* p, const R& v) const {
        if constexpr (sizeof(R) == 16 && HINT == 2) {
            asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1, %2, %3, %4}, %5;"
                         ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "l"(drop)
                         : "memory");
            return;
        }
        if constexpr (sizeof(R) == 16 && HINT == 1) {
            asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};"
                         ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
            return;
        }
        *p = v;
    }
};

// A chunk's body vectors of every input into `h` (vector i at col0 + (i * THREADS + thread)
// * VEC; those past the body hold the policy's neutral value). `again`: its second read.
template <int DT, int OP, int VEC, int ITEMS, int THREADS, int HINT>
__device__ __forceinline__ void load_chunk(Held<DT, Policy<OP>::NIN, VEC, ITEMS, 0>& h,
                                           const typename Elem<DT>::storage* const (&in)[2],
                                           const RowSpan& span, int col0, bool again,
                                           const Hints<HINT>& hints) {
    typedef Access<DT, VEC> A;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
        const int col = col0 + (i * THREADS + (int)threadIdx.x) * VEC;
#pragma unroll
        for (int t = 0; t < Policy<OP>::NIN; ++t) {
            float empty[VEC];
#pragma unroll
            for (int k = 0; k < VEC; ++k) empty[k] = Policy<OP>::fill(t);
            h.reg[t][i] = col < span.body
                ? hints.load(reinterpret_cast<const typename A::R*>(in[t] + span.body_base + col),
                             again)
                : A::pack(empty);
        }
    }
}

}  // namespace gpurt_softmax

template <int DT, int OP, int VEC, int ITEMS, int THREADS, int MINB, int EDGES, int HINT,
          int EARLY>
__global__ void __launch_bounds__(THREADS, MINB)
softmax_lagged(const typename gpurt_softmax::Elem<DT>::storage* a,
               const typename gpurt_softmax::Elem<DT>::storage* b,
               typename gpurt_softmax::Elem<DT>::storage* out, unsigned int* counters,
               float2* partials, long long rows, int cols, int chunks, int lag) {
    using namespace gpurt_softmax;
    typedef typename Elem<DT>::storage S;
    typedef Access<DT, VEC> A;
    const int COLUMNS = THREADS * ITEMS * VEC;
    __shared__ float2 warp_total[THREADS / 32];
    __shared__ float2 shared_total;
    __shared__ unsigned int ticket;
    const long long reduced = rows * chunks;
    const long long launched = reduced + lag;
    if (threadIdx.x == 0) ticket = take_ticket(counters, launched);
    __syncthreads();
    const long long t = ticket;
    if (t >= launched) return;  // only with counters not zeroed: never write out of bounds
    const S* in[2] = {a, b};
    const Hints<HINT> hints;
    // the chunk to write (u = t - lag), read again: early, or after the reduction
    const long long u = t >= lag ? t - lag : 0;
    const long long row_w = u / chunks;
    const int chunk_w = (int)(u % chunks);
    Edges<DT, OP, VEC, THREADS, EDGES> edges_w(a, row_w * (long long)cols, cols, chunk_w == 0);
    Held<DT, Policy<OP>::NIN, VEC, ITEMS, 0> w;
    if (EARLY && t >= lag) load_chunk<DT, OP, VEC, ITEMS, THREADS>(w, in, edges_w.span,
                                                                    chunk_w * COLUMNS, true, hints);
    if (t < reduced) {
        const long long row = t / chunks;
        const int chunk = (int)(t % chunks);
        Held<DT, Policy<OP>::NIN, VEC, ITEMS, 0> h;
        Edges<DT, OP, VEC, THREADS, EDGES> edges(a, row * (long long)cols, cols, chunk == 0);
        load_chunk<DT, OP, VEC, ITEMS, THREADS>(h, in, edges.span, chunk * COLUMNS, false,
                                                hints);
        edges.load(in);
        const float2 own = Policy<OP>::template local<ITEMS, VEC, (DT != 0 && OP < 2)>(
            h, live_items<VEC, ITEMS, THREADS>(chunk * COLUMNS, edges.span.body, true));
        const float2 mine = reduce_warps<OP, THREADS, THREADS>(edges.local(own), warp_total);
        if (threadIdx.x == 0) {
            partials[t] = mine;
            add_release(counters + 1 + row, 1u);  // orders the partial's store before the count
        }
    }
    if (t < lag) return;
    if (!EARLY) load_chunk<DT, OP, VEC, ITEMS, THREADS>(w, in, edges_w.span, chunk_w * COLUMNS,
                                                        true, hints);
    edges_w.load(in);
    const float2 total = await_row<OP>(counters + 1 + row_w, partials + row_w * chunks, chunks,
                                       &shared_total);
    const RowSpan& span = edges_w.span;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
        const int col = chunk_w * COLUMNS + (i * THREADS + (int)threadIdx.x) * VEC;
        if (col < span.body) {
            float y[VEC];
            Policy<OP>::template finish<VEC, true>(w, Policy<OP>::identity(), total, i, y);
            hints.store(reinterpret_cast<typename A::R*>(out + span.body_base + col), A::pack(y));
        }
    }
    edges_w.local(Policy<OP>::identity());  // the edges' own partial, as their outputs use it
    edges_w.store(out, total);
}
