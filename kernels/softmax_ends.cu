// softmax_ends: softmax_ticket's chunks, except that the rows at the launch's two ends are cut
// into SPLIT times as many, smaller chunks. Appended to softmax.cu's source (one program: it
// uses that file's helpers).
//
// Why: a ticket launch's first wave of CTAs starts together, so all of them load, then all
// reduce, meet and write with the DRAM nearly idle (~9 us at 64x1000003 bf16 on an H100), and
// its last wave writes at the SMs' pace with nothing left to read (~11 us): ncu's timeline in
// benchmarks/notes_softmax.md, v16. Both phases last about one chunk's SM work, so chunks of
// 1/SPLIT the columns at the ends shorten them; the rows between keep full chunks.
//
// Tickets stay in row order: the first `head` rows in `small` chunks each, then full
// `chunks`, then the last `tail` rows in `small` chunks, so softmax_ticket's argument holds
// as long as `small` CTAs fit on the device at once. A small chunk is the same CTA with only
// its first ITEMS / SPLIT vectors live (the others hold the policy's neutral value, and the
// 16-bit reductions skip them). Partials: `small` float2 per row.

#define SM_STORAGE typename gpurt_softmax::Elem<DT>::storage
#define SM_HELD(SMEM) gpurt_softmax::Held<DT, gpurt_softmax::Policy<OP>::NIN, VEC, ITEMS, SMEM>

namespace gpurt_softmax {

struct EndsChunk {
    long long row;  // `rows` for a ticket past the launch's (a workspace not zeroed)
    int chunk;
    int chunks;  // the row's chunks
    int split;   // 1 (a full chunk) or SPLIT
};

// Ticket t's chunk: rows [0, head) and [rows - tail, rows) in `small` chunks, others in `chunks`.
__device__ __forceinline__ EndsChunk ends_chunk(unsigned long long t, long long rows,
                                                int chunks, int small, long long head,
                                                long long tail, int split) {
    const unsigned long long first = (unsigned long long)head * small;
    if (t < first) return EndsChunk{(long long)(t / small), (int)(t % small), small, split};
    t -= first;
    const long long middle = rows - head - tail;
    const unsigned long long between = (unsigned long long)middle * chunks;
    if (t < between)
        return EndsChunk{head + (long long)(t / chunks), (int)(t % chunks), chunks, 1};
    t -= between;
    const long long row = head + middle + (long long)(t / small);
    return EndsChunk{row < rows ? row : rows, (int)(t % small), small, split};
}

}  // namespace gpurt_softmax

// `chunks` full chunks a row, `small` (= ceil(cols / (columns / SPLIT))) at the ends; the
// host keeps head + tail <= rows. `counters`, `partials`: the workspace, as softmax_ticket's.
// TUNE: softmax_ticket's TUNE_ORDER and TUNE_PRE bits (not TUNE_EVEN: the ends set the chunks).
template <int DT, int OP, int VEC, int ITEMS, int THREADS, int MINB, int SMEM, int EDGES,
          int ONE_PASS, int SPLIT, int TUNE = 0>
__global__ void __launch_bounds__(THREADS, MINB)
softmax_ends(const SM_STORAGE* a, const SM_STORAGE* b, SM_STORAGE* out, unsigned int* counters,
             float2* partials, long long rows, int cols, int chunks, int small, long long head,
             long long tail) {
    using namespace gpurt_softmax;
    static_assert(SPLIT >= 2 && ITEMS % SPLIT == 0, "SPLIT must divide ITEMS");
    static_assert((TUNE & ~(TUNE_ORDER | TUNE_PRE)) == 0, "TUNE_ORDER and TUNE_PRE only");
    __shared__ float2 warp_total[THREADS / 32];
    __shared__ float2 row_total;
    __shared__ unsigned int ticket;
    const long long draws = (head + tail) * small + (rows - head - tail) * chunks;
    if (threadIdx.x == 0) ticket = take_ticket(counters, draws);
    __syncthreads();
    const EndsChunk c = ends_chunk(ticket, rows, chunks, small, head, tail, SPLIT);
    if (c.row >= rows) return;  // only with a workspace not zeroed: never write out of bounds
    const int width = THREADS * ITEMS * VEC / c.split;
    const int col0 = c.chunk * width;
    const long long base = c.row * (long long)cols;
    const SM_STORAGE* in[2] = {a, b};
    extern __shared__ uint4 shared_items[];
    SM_HELD(SMEM) h;
    h.slot = reinterpret_cast<typename SM_HELD(SMEM)::R*>(shared_items) + threadIdx.x;
    Edges<DT, OP, VEC, THREADS, EDGES> edges(a, base, cols, c.chunk == 0);
    const RowSpan& span = edges.span;
    // the chunk's columns of the body: [col0, end); the vectors past `end` count as outside
    const int end = (int)min((long long)span.body, (long long)col0 + width);
    float2 own;
    const float2 mine = reduce_warps<OP, THREADS, THREADS>(
        load_share_upto<DT, OP, VEC, ITEMS, THREADS, SMEM, ONE_PASS, EDGES, TUNE>(
            h, edges, in, col0, end, true, own),
        warp_total);
    const float2 total = meet_row<OP>(mine, counters, partials, c.row, c.chunk, c.chunks, small,
                                      &row_total);  // a row's partials `small` apart
    store_row<DT, OP, VEC, ITEMS, THREADS, SMEM, TUNE>(h, own, total, out, span.body_base, col0,
                                                       end, true);
    edges.store(out, total);
}

#undef SM_HELD
#undef SM_STORAGE
