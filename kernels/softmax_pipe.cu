// softmax_pipe: rows spread over a thread-block cluster, each cluster walking several rows
// with two stages, so that one row's writes overlap the next row's reads. Appended to
// softmax.cu's source (one program: it uses that file's helpers).
//
// Why: a launch of ticket chunks that fits one wave (64x200003 bf16: 256 chunks for 264
// places) loads everything, meets, then writes everything, with nothing to overlap the
// phases: ~58% of copy on an H100 (benchmarks/notes_softmax.md, v17). Here a row is shared
// by the CLUSTER CTAs of a cluster (equal shares of its body, whole 128-byte lines), which
// meet through distributed shared memory (reduce_cluster: one cluster barrier a row, no
// global ticket); each CTA keeps its share in shared memory (cp.async, ITEMS vectors a
// thread, all in shared memory: two stages of NIN * ITEMS * THREADS * 16 bytes), and the
// grid holds as many clusters as fit at once, cluster c taking rows c, c + clusters, ... .
// With EARLY 0 the next row's loads are issued after the current row's reduction (which
// waits for its vectors one by one), with EARLY 1 before it (the current row's vectors then
// waited for all at once); either way they are in flight during the meeting and the writes.
// Rows: at most CLUSTER * THREADS * ITEMS * VEC columns (the host checks).

#if __CUDA_ARCH__ >= 900
namespace gpurt_softmax {

// One row's share of a CTA in softmax_pipe: its vectors in one stage of shared memory, and
// (rank 0) the row's edges.
template <int DT, int OP, int VEC, int ITEMS, int THREADS, int CLUSTER, int EDGES, int ONE>
struct PipeStage {
    typedef typename Elem<DT>::storage S;
    typedef Held<DT, Policy<OP>::NIN, VEC, ITEMS, ITEMS> H;
    typedef typename H::R R;
    static const int OPERATION = OP;
    static const int GROUPS = Policy<OP>::NIN * ITEMS;  // copy groups a row commits
    H h;
    Edges<DT, OP, VEC, THREADS, EDGES> edges;
    int col0;
    int end;
    float2 own;  // the body's partial (finish's)

    __device__ __forceinline__ explicit PipeStage(const S* a) : edges(a, 0, 1, false) {}

    // Issue the loads of this CTA's share of row `row`: body columns [col0, end).
    __device__ __forceinline__ void start(const S* const (&in)[2], long long row, int cols,
                                          unsigned int rank) {
        edges = Edges<DT, OP, VEC, THREADS, EDGES>(in[0], row * (long long)cols, cols, rank == 0);
        const int body = edges.span.body;
        const int line = 8 * VEC;  // 128 bytes
        const int width = (body + CLUSTER * line - 1) / (CLUSTER * line) * line;
        col0 = min(body, (int)rank * width);
        end = min(body, col0 + width);
        load_row<DT, OP, VEC, ITEMS, THREADS, ITEMS>(h, in, edges.span.body_base, col0, end,
                                                     true);
        edges.load(in);
    }
    // The CTA's partial of the row. LANDED: every copy of the row has landed (else they are
    // the last committed, waited for one by one).
    template <bool LANDED>
    __device__ __forceinline__ float2 reduce(float2* warp_total) {
        const int live = live_items<VEC, ITEMS, THREADS>(col0, end, true);
        if constexpr (LANDED) {
            Landed<DT, Policy<OP>::NIN, VEC, ITEMS, ITEMS> landed{h};
            own = Policy<OP>::template local<ITEMS, VEC, ONE != 0>(landed, live);
        } else {
            own = Policy<OP>::template local<ITEMS, VEC, ONE != 0>(h, live);
        }
        return reduce_warps<OP, THREADS, THREADS>(edges.local(own), warp_total);
    }
    // The share's outputs from the row's total (its copies landed: no wait).
    __device__ __forceinline__ void finish(S* out, float2 total) {
        store_landed<DT, OP, VEC, ITEMS, THREADS, ITEMS>(h, own, total, out,
                                                          edges.span.body_base, col0, end);
        edges.store(out, total);
    }
};

// Row `row` (held in `cur`): reduce it, issue the loads of the cluster's next row into
// `next` (EARLY: before the reduction), meet the cluster's CTAs in `slot` (alternating
// between two, so that a peer still reading the last row's is not overwritten), write.
// False when the cluster has no next row.
template <int EARLY, int CLUSTER, class St>
__device__ __forceinline__ bool pipe_step(St& cur, St& next,
                                          const typename St::S* const (&in)[2],
                                          typename St::S* out, long long row, long long step,
                                          long long rows, int cols, unsigned int rank,
                                          float2* warp_total, float2* slot) {
    const bool more = row + step < rows;
    float2 mine;
    if constexpr (EARLY != 0) {
        if (more) {
            next.start(in, row + step, cols, rank);
            copy_async_wait_n<St::GROUPS>();  // all but next's
        } else {
            copy_async_wait_n<0>();
        }
        mine = cur.template reduce<true>(warp_total);
    } else {
        mine = cur.template reduce<false>(warp_total);
        if (more) next.start(in, row + step, cols, rank);
    }
    // the cluster barrier in reduce_cluster also orders warp_total's reuse by the next row
    const float2 total = reduce_cluster<St::OPERATION, CLUSTER>(mine, slot);
    cur.finish(out, total);
    return more;
}

}  // namespace gpurt_softmax

#define SM_STORAGE typename gpurt_softmax::Elem<DT>::storage

// Dynamic shared memory: two stages of NIN * ITEMS * THREADS * 16 bytes. The grid: whole
// clusters, at most one per row (the host: as many as fit at once).
template <int DT, int OP, int VEC, int ITEMS, int THREADS, int CLUSTER, int MINB, int EDGES,
          int ONE_PASS, int EARLY>
__global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(THREADS, MINB)
softmax_pipe(const SM_STORAGE* a, const SM_STORAGE* b, SM_STORAGE* out, long long rows,
             int cols) {
    using namespace gpurt_softmax;
    typedef PipeStage<DT, OP, VEC, ITEMS, THREADS, CLUSTER, EDGES, ONE_PASS> St;
    __shared__ float2 warp_total[THREADS / 32];
    __shared__ float2 cta_total[2];
    const long long step = gridDim.x / CLUSTER;
    long long row = blockIdx.x / CLUSTER;
    if (row >= rows) return;  // the whole cluster (never with the host's grid)
    const unsigned int rank = cluster_rank();
    const SM_STORAGE* in[2] = {a, b};
    extern __shared__ uint4 shared_items[];
    typedef typename St::R R;
    St first(a), second(a);
    first.h.slot = reinterpret_cast<R*>(shared_items) + threadIdx.x;
    second.h.slot = first.h.slot + Policy<OP>::NIN * ITEMS * THREADS;
    first.start(in, row, cols, rank);
    for (;;) {
        if (!pipe_step<EARLY, CLUSTER>(first, second, in, out, row, step, rows, cols, rank,
                                       warp_total, &cta_total[0]))
            break;
        row += step;
        if (!pipe_step<EARLY, CLUSTER>(second, first, in, out, row, step, rows, cols, rank,
                                       warp_total, &cta_total[1]))
            break;
        row += step;
    }
    cluster_arrive();  // peers may still read this CTA's last slot: stay until they are done
    cluster_wait();
}

#undef SM_STORAGE
#endif
