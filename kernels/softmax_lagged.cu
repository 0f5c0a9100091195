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
// deadlock, whatever number of CTAs fit at once.
//
// The workspace (kernels/_gemm_workspace.py): `counters` zero before the launch and left
// zero after it ([0] the ticket, [1 + r] row r's count: +1 per published partial, +1 per
// chunk written, reset by the last), and a float2 partial per chunk (`partials`).
// Template parameters as softmax_ticket's (no shared-memory vectors); HINT 1: the second
// read and the stores with the streaming hint (.cs: evict first), so that they do not push
// the lag's chunks out of L2.

namespace gpurt_softmax {

template <int HINT, class R>
__device__ __forceinline__ R load_again(const R* p) {
    if constexpr (HINT && sizeof(R) == 16) {
        R v;
        asm volatile("ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
        return v;
    }
    return *p;
}

template <int HINT, class R>
__device__ __forceinline__ void store_out(R* p, const R& v) {
    if constexpr (HINT && sizeof(R) == 16) {
        asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};"
                     ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
        return;
    }
    *p = v;
}

// Wait (warp 0) until row `row`'s `chunks` partials are published, combine them, count this
// chunk's read (the last of the row's 2 * chunks counts leaves the counter zero) and return
// the total in every thread.
template <int OP>
__device__ __forceinline__ float2 row_total(unsigned int* arrived, const float2* mine,
                                            int chunks, float2* shared) {
    if (threadIdx.x < 32) {
        while (load_acquire(arrived) < (unsigned int)chunks) __nanosleep(32);
        float2 total = Policy<OP>::identity();
        for (int c = threadIdx.x; c < chunks; c += 32)
            total = Policy<OP>::combine(total, load_relaxed(mine + c));
        total = reduce_lanes<OP, 32>(total);
        if (threadIdx.x == 0) {
            *shared = total;
            if (atomicAdd(arrived, 1u) == 2u * (unsigned int)chunks - 1u) *arrived = 0u;
        }
    }
    __syncthreads();
    return *shared;
}

// Write chunk `chunk` of row `row` from its inputs read again and the row's total.
template <int DT, int OP, int VEC, int ITEMS, int THREADS, int EDGES, int HINT>
__device__ __forceinline__ void write_chunk(const typename Elem<DT>::storage* const (&in)[2],
                                            typename Elem<DT>::storage* out,
                                            unsigned int* counters, const float2* partials,
                                            long long row, int chunk, int chunks, int cols,
                                            float2* shared) {
    typedef Access<DT, VEC> A;
    const float2 total = row_total<OP>(counters + 1 + row, partials + row * chunks, chunks,
                                       shared);
    Edges<DT, OP, VEC, THREADS, EDGES> edges(in[0], row * (long long)cols, cols, chunk == 0);
    const RowSpan& span = edges.span;
    const int col0 = chunk * (THREADS * ITEMS * VEC);
    Held<DT, Policy<OP>::NIN, VEC, ITEMS, 0> h;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
        const int col = col0 + (i * THREADS + (int)threadIdx.x) * VEC;
#pragma unroll
        for (int t = 0; t < Policy<OP>::NIN; ++t) {
            if (col < span.body)
                h.reg[t][i] = load_again<HINT>(
                    reinterpret_cast<const typename A::R*>(in[t] + span.body_base + col));
        }
    }
    edges.load(in);
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
        const int col = col0 + (i * THREADS + (int)threadIdx.x) * VEC;
        if (col < span.body) {
            float y[VEC];
            Policy<OP>::template finish<VEC, true>(h, Policy<OP>::identity(), total, i, y);
            store_out<HINT>(reinterpret_cast<typename A::R*>(out + span.body_base + col),
                            A::pack(y));
        }
    }
    edges.local(Policy<OP>::identity());  // the edges' own partial, as their outputs use it
    edges.store(out, total);
}

}  // namespace gpurt_softmax

template <int DT, int OP, int VEC, int ITEMS, int THREADS, int MINB, int EDGES, int HINT>
__global__ void __launch_bounds__(THREADS, MINB)
softmax_lagged(const typename gpurt_softmax::Elem<DT>::storage* a,
               const typename gpurt_softmax::Elem<DT>::storage* b,
               typename gpurt_softmax::Elem<DT>::storage* out, unsigned int* counters,
               float2* partials, long long rows, int cols, int chunks, int lag) {
    using namespace gpurt_softmax;
    typedef typename Elem<DT>::storage S;
    __shared__ float2 warp_total[THREADS / 32];
    __shared__ float2 shared_total;
    __shared__ unsigned int ticket;
    const long long reduced = rows * chunks;
    const long long launched = reduced + lag;
    if (threadIdx.x == 0) {
        const unsigned int t = atomicAdd(counters, 1u);
        if (t == launched - 1) *counters = 0u;  // the last ticket: every CTA has taken one
        ticket = t;
    }
    __syncthreads();
    const long long t = ticket;
    if (t >= launched) return;  // only with counters not zeroed: never write out of bounds
    const S* in[2] = {a, b};
    if (t < reduced) {
        const long long row = t / chunks;
        const int chunk = (int)(t % chunks);
        const int col0 = chunk * (THREADS * ITEMS * VEC);
        Held<DT, Policy<OP>::NIN, VEC, ITEMS, 0> h;
        Edges<DT, OP, VEC, THREADS, EDGES> edges(a, row * (long long)cols, cols, chunk == 0);
        float2 own;
        const float2 mine = reduce_warps<OP, THREADS, THREADS>(
            load_share<DT, OP, VEC, ITEMS, THREADS, 0, (DT != 0 && OP < 2), EDGES>(
                h, edges, in, col0, true, own),
            warp_total);
        if (threadIdx.x == 0) {
            partials[t] = mine;
            add_release(counters + 1 + row, 1u);  // orders the partial's store before the count
        }
    }
    if (t >= lag) {
        const long long u = t - lag;
        write_chunk<DT, OP, VEC, ITEMS, THREADS, EDGES, HINT>(in, out, counters, partials,
                                                             u / chunks, (int)(u % chunks),
                                                             chunks, cols, &shared_total);
    }
}
