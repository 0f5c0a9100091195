// softmax_meet: softmax_ticket's chunks with a shorter meeting (appended to softmax.cu, whose
// helpers it uses; issue 17, s10-soft16). softmax_ticket publishes a chunk's partial with a
// store, a release (a fence at GPU scope) and an atomic on the row's count, and its waiter
// polls that count with acquire loads and then reads the partials: three to four round trips
// to L2 between a chunk's last load and its first store, once per wave of chunks. Here:
//   MEET & 2  a chunk publishes its partial as one 64-bit store into the row's slot for it,
//             whose bits are never zero (zero is "not yet"); warp 0 polls the row's slots
//             themselves (one per lane) and combines what it reads: one store, one poll. After
//             its outputs, each chunk counts itself on the row's count; the last one zeroes
//             the row's slots and count for the next launch (the slots lie in the zeroed
//             counters region, which every kernel leaves zero).
//   MEET & 1  before its ticket, thread 0 prefetches into L2 the chunk whose ticket equals
//             its blockIdx.x (mostly the one it gets): the ticket's round trip overlaps the
//             first bytes instead of preceding them.
//   MEET & 4  the poll spins without __nanosleep.
//   MEET & 24 once its partial is out, thread 0 prefetches into L2 the first quarter (8), half
//             (16) or all (24) of the chunk one residency ahead (ticket + SMs * MINB), which a
//             CTA of the next wave takes: the wait for the row, when the chunks of a wave
//             start and meet together and nothing else reads, keeps DRAM reading, and the
//             next wave's first loads hit L2.
// Counters: [0] the ticket, [1 + r] row r's count, then (8-byte aligned, MEET & 2) a 64-bit
// slot per chunk. Deadlock-free under softmax_ticket's condition: a chunk publishes before it
// waits.

namespace gpurt_softmax {

__device__ __forceinline__ void store_slot(unsigned long long* slot, float2 p) {
    unsigned long long bits = ((unsigned long long)__float_as_uint(p.y) << 32)
                              | __float_as_uint(p.x);
    if (bits == 0ull) bits = 1ull << 63;  // (0, 0) published as (0, -0): the same partial
    asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(slot), "l"(bits) : "memory");
}

__device__ __forceinline__ unsigned long long load_slot(const unsigned long long* slot) {
    unsigned long long bits;
    asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(bits) : "l"(slot) : "memory");
    return bits;
}

// Warp 0 waits for the row's `chunks` slots and combines them; the total in every thread.
template <int OP, int MEET>
__device__ __forceinline__ float2 await_slots(const unsigned long long* slots, int chunks,
                                              float2* shared) {
    if (threadIdx.x < 32) {
        float2 total = Policy<OP>::identity();
        for (int c = threadIdx.x; c < chunks; c += 32) {
            unsigned long long bits;
            while ((bits = load_slot(slots + c)) == 0ull) {
                if constexpr (!(MEET & 4)) __nanosleep(64);
            }
            total = Policy<OP>::combine(
                total, make_float2(__uint_as_float((unsigned int)bits),
                                   __uint_as_float((unsigned int)(bits >> 32))));
        }
        total = reduce_lanes<OP, 32>(total);
        if (threadIdx.x == 0) *shared = total;
    }
    __syncthreads();
    return *shared;
}

// Prefetch into L2 the first `span` columns of chunk `guess`'s inputs (bytes wholly inside
// them, 16-byte aligned: a hint, never outside the arrays).
template <int DT, int NIN, int CAPACITY>
__device__ __forceinline__ void prefetch_chunk(const typename Elem<DT>::storage* const (&in)[2],
                                               long long guess, long long rows, int cols,
                                               int chunks, int span) {
#if __CUDA_ARCH__ >= 900
    const long long row = guess / chunks;
    if (row >= rows) return;
    const int col0 = (int)(guess % chunks) * CAPACITY;
    const int end = cols - col0 < span ? cols : col0 + span;
#pragma unroll
    for (int t = 0; t < NIN; ++t) {
        const unsigned long long first =
            (reinterpret_cast<unsigned long long>(in[t] + row * cols + col0) + 15) & ~15ull;
        const unsigned long long last =
            reinterpret_cast<unsigned long long>(in[t] + row * cols + end) & ~15ull;
        for (unsigned long long p = first; p < last; p += 32768) {
            const unsigned int size = last - p < 32768 ? (unsigned int)(last - p) : 32768u;
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(size)
                         : "memory");
        }
    }
#endif
}

// MEET & 24: thread 0 prefetches part of the chunk a CTA of the next wave takes.
template <int DT, int OP, int MINB, int CAPACITY, int MEET>
__device__ __forceinline__ void prefetch_ahead(const typename Elem<DT>::storage* const (&in)[2],
                                               unsigned int drawn, long long rows, int cols,
                                               int chunks) {
    if constexpr ((MEET & 24) != 0) {
        if (threadIdx.x == 0) {
            unsigned int sms;
            asm("mov.u32 %0, %%nsmid;" : "=r"(sms));
            const int span = (MEET & 24) == 24 ? CAPACITY : (MEET & 24) == 16 ? CAPACITY / 2
                                                                              : CAPACITY / 4;
            prefetch_chunk<DT, Policy<OP>::NIN, CAPACITY>(
                in, (long long)drawn + (long long)sms * MINB, rows, cols, chunks, span);
        }
    }
}

}  // namespace gpurt_softmax

#define SM_STORAGE typename gpurt_softmax::Elem<DT>::storage
#define SM_HELD(SMEM) gpurt_softmax::Held<DT, gpurt_softmax::Policy<OP>::NIN, VEC, ITEMS, SMEM>

// softmax_ticket's arguments and launch; `partials` unused with MEET & 2 (the slots follow
// the counters).
template <int DT, int OP, int VEC, int ITEMS, int THREADS, int MINB, int SMEM, int EDGES,
          int ONE_PASS, int MEET>
__global__ void __launch_bounds__(THREADS, MINB)
softmax_meet(const SM_STORAGE* a, const SM_STORAGE* b, SM_STORAGE* out, unsigned int* counters,
             float2* partials, long long rows, int cols, int chunks) {
    using namespace gpurt_softmax;
    const int CAPACITY = THREADS * ITEMS * VEC;
    __shared__ float2 warp_total[THREADS / 32];
    __shared__ float2 row_total;
    __shared__ unsigned int ticket;
    const SM_STORAGE* in[2] = {a, b};
    if (threadIdx.x == 0) {
        if constexpr ((MEET & 1) != 0)
            prefetch_chunk<DT, Policy<OP>::NIN, CAPACITY>(in, blockIdx.x, rows, cols, chunks,
                                                          CAPACITY);
        ticket = take_ticket(counters, rows * chunks);
    }
    __syncthreads();
    const unsigned int drawn = ticket;
    const long long row = drawn / (unsigned int)chunks;
    if (row >= rows) return;  // only with a workspace not zeroed: never write out of bounds
    const int chunk = (int)(drawn % (unsigned int)chunks);
    const int col0 = chunk * CAPACITY;
    const long long base = row * (long long)cols;
    extern __shared__ uint4 shared_items[];
    SM_HELD(SMEM) h;
    h.slot = reinterpret_cast<typename SM_HELD(SMEM)::R*>(shared_items) + threadIdx.x;
    Edges<DT, OP, VEC, THREADS, EDGES> edges(a, base, cols, chunk == 0);
    const RowSpan& span = edges.span;
    float2 own;
    const float2 mine = reduce_warps<OP, THREADS, THREADS>(
        load_share<DT, OP, VEC, ITEMS, THREADS, SMEM, ONE_PASS>(h, edges, in, col0, true, own),
        warp_total);
    unsigned int* count = counters + 1 + row;
    unsigned long long* slots = reinterpret_cast<unsigned long long*>(counters + ((rows + 2) & ~1ll))
                                + row * chunks;
    float2 total;
    if constexpr ((MEET & 2) != 0) {
        if (threadIdx.x == 0) store_slot(slots + chunk, mine);
        prefetch_ahead<DT, OP, MINB, CAPACITY, MEET>(in, drawn, rows, cols, chunks);
        total = await_slots<OP, MEET>(slots, chunks, &row_total);
    } else {
        if (threadIdx.x == 0) {  // publish as meet_row does
            partials[row * chunks + chunk] = mine;
            add_release(count, 1u);
        }
        prefetch_ahead<DT, OP, MINB, CAPACITY, MEET>(in, drawn, rows, cols, chunks);
        total = await_row<OP>(count, partials + row * chunks, chunks, &row_total);
    }
    store_row<DT, OP, VEC, ITEMS, THREADS, SMEM>(h, own, total, out, span.body_base, col0,
                                                 span.body, true);
    edges.store(out, total);
    if constexpr ((MEET & 2) != 0) {
        // every chunk of the row has read the slots once its count is in: the last leaves
        // them and the count zero
        if (threadIdx.x == 0 && atomicAdd(count, 1u) == (unsigned int)chunks - 1u) {
            for (int c = 0; c < chunks; ++c) slots[c] = 0ull;
            *count = 0u;
        }
    }
}

#undef SM_HELD
#undef SM_STORAGE
