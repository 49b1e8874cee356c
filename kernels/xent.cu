/* xent.cu - softmax cross-entropy: loss and gradient with each row read once, a warp, a block
 * or a cluster of blocks per row by width (kernels/xent.c is the reference). */
#include "cuda_impl.h"  /* cuda_impl, the device helpers, the other families' functions */
#include "cuda_check.h" /* CUDA_CHECK, CUDA_CHECK_LAUNCH, CUBLAS_CHECK */

#include <cooperative_groups.h> /* this_cluster: xent_cluster_kernel */

namespace cg = cooperative_groups;

namespace mgpu_cuda
{
namespace
{

__device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ float block_max(float v)
{
    __shared__ float part[32];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    v = warp_max(v);
    if (lane == 0)
        part[w] = v;
    __syncthreads();
    v = lane < nw ? part[lane] : -INFINITY;
    return warp_max(v);
}

template <int G> __device__ __forceinline__ float group_max(float v)
{
    for (int o = G / 2; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

template <int G> __device__ __forceinline__ float group_sum(float v)
{
    for (int o = G / 2; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Softmax cross-entropy, G lanes per row (G = 32: a warp; short rows: 32 / G rows side by
 * side, so a warp's loads and shuffles serve several rows): each lane holds V values of a row
 * (columns g, g + G, ...), R rows at a time, so the row is read from memory once and R * V
 * loads per lane are in flight together, with the rows' labels. A warp takes 32 / G * R
 * consecutive rows an iteration. Nothing is read after the reductions: the lane holding the
 * label's logit adds that row's loss, and the gradient is exp(v - max) / sum, kept from the
 * sum. dlogits may alias logits (a lane writes only what it read itself). */
template <int G, int V, int R>
__global__ void __launch_bounds__(kThreads)
    xent_warp_kernel(int rows, int cols, const float *logits, const int32_t *labels, float *dlogits,
                     float inv_rows, float *part, float *out, double scale)
{
    constexpr int kPerWarp = 32 / G * R;
    const int lane = threadIdx.x & 31, g = lane & (G - 1), sub = lane / G;
    long warp = ((long)blockIdx.x * kThreads + threadIdx.x) >> 5;
    long nwarps = ((long)gridDim.x * kThreads) >> 5;
    float loss = 0.0f;
    for (long base = warp * kPerWarp; base < rows; base += nwarps * kPerWarp) {
        float v[R][V], mx[R], s[R], ly[R];
        int y[R];
#pragma unroll
        for (int i = 0; i < R; i++) {
            const long r = base + sub * R + i;
            y[i] = r < rows ? __ldg(labels + r) : 0;
            mx[i] = -INFINITY;
#pragma unroll
            for (int j = 0; j < V; j++) {
                const int c = g + G * j;
                /* (rows past the end: zeros, so that their unused sums stay finite) */
                v[i][j] = r >= rows ? 0.0f : c < cols ? logits[(size_t)r * cols + c] : -INFINITY;
                mx[i] = fmaxf(mx[i], v[i][j]);
            }
        }
#pragma unroll
        for (int i = 0; i < R; i++) {
            mx[i] = group_max<G>(mx[i]);
            s[i] = 0.0f;
            ly[i] = 0.0f;
#pragma unroll
            for (int j = 0; j < V; j++) {
                if (g + G * j == y[i])
                    ly[i] = v[i][j];
                v[i][j] = g + G * j < cols ? expf(v[i][j] - mx[i]) : 0.0f;
                s[i] += v[i][j];
            }
        }
#pragma unroll
        for (int i = 0; i < R; i++)
            s[i] = group_sum<G>(s[i]);
#pragma unroll
        for (int i = 0; i < R; i++) {
            const long r = base + sub * R + i;
            if (r >= rows)
                break;
            const float lse = mx[i] + logf(s[i]), gs = inv_rows / s[i];
            const bool ok = y[i] >= 0 && y[i] < cols;
            if (dlogits != nullptr) {
                float *d = dlogits + (size_t)r * cols;
#pragma unroll
                for (int j = 0; j < V; j++) {
                    const int c = g + G * j;
                    if (c < cols)
                        d[c] = ok ? v[i][j] * gs - (c == y[i] ? inv_rows : 0.0f) : NAN;
                }
            }
            if (!ok ? g == 0 : (y[i] & (G - 1)) == g)
                loss += ok ? lse - ly[i] : NAN;
        }
    }
    loss = block_sum(loss);
    block_result(loss, part, out, scale);
}

/* The same with a block per row and V values per thread (rows of up to kThreads * V); the
 * thread holding the label's logit adds the row's loss. */
template <int V>
__global__ void __launch_bounds__(kThreads)
    xent_block_kernel(int rows, int cols, const float *logits, const int32_t *labels,
                      float *dlogits, float inv_rows, float *part, float *out, double scale)
{
    int t = threadIdx.x;
    float loss = 0.0f;
    for (long r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *l = logits + (size_t)r * cols;
        const int y = __ldg(labels + r);
        float v[V], mx = -INFINITY, s = 0.0f, ly = 0.0f;
#pragma unroll
        for (int j = 0; j < V; j++) {
            int c = t + kThreads * j;
            v[j] = c < cols ? l[c] : -INFINITY;
            mx = fmaxf(mx, v[j]);
        }
        mx = block_max(mx);
#pragma unroll
        for (int j = 0; j < V; j++) {
            if (t + kThreads * j == y)
                ly = v[j];
            v[j] = t + kThreads * j < cols ? expf(v[j] - mx) : 0.0f;
            s += v[j];
        }
        s = block_sum(s);
        const float lse = mx + logf(s), g = inv_rows / s;
        const bool ok = y >= 0 && y < cols;
        if (dlogits != nullptr) {
            float *d = dlogits + (size_t)r * cols;
#pragma unroll
            for (int j = 0; j < V; j++) {
                int c = t + kThreads * j;
                if (c < cols)
                    d[c] = ok ? v[j] * g - (c == y ? inv_rows : 0.0f) : NAN;
            }
        }
        if (!ok ? t == 0 : y % kThreads == t)
            loss += ok ? lse - ly : NAN;
    }
    loss = block_sum(loss);
    block_result(loss, part, out, scale);
}

/* Hopper's transaction barriers in shared memory (PTX mbarrier), for xent_cluster_kernel: a
 * value stored into another block's shared memory with st.async counts its bytes on that
 * block's barrier, so the receiver waits for exactly those stores; a cluster barrier would
 * also wait for every global store the blocks made before it (their gradients). */
__device__ __forceinline__ unsigned smem_addr(const void *p)
{
    return (unsigned)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void mbar_init(uint64_t *bar, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count)
                 : "memory");
}

/* This thread's arrival for the barrier's current phase, which then also waits for bytes. */
__device__ __forceinline__ void mbar_arrive_expect(uint64_t *bar, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
                 "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t *bar, unsigned parity)
{
    asm volatile("{\n\t.reg .pred p;\n"
                 "wait:\n\t"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n\t"
                 "@!p bra wait;\n}" ::"r"(smem_addr(bar)),
                 "r"(parity)
                 : "memory");
}

/* bytes (a multiple of 16, both addresses 16-byte aligned) from global src into this block's
 * shared dst by the copy engine (TMA), counted on *bar. */
__device__ __forceinline__ void bulk_load(void *dst, const void *src, unsigned bytes, uint64_t *bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], "
                 "%2, [%3];" ::"r"(smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(smem_addr(bar))
                 : "memory");
}

/* v into block `rank`'s copy of *dst, counted on its copy of *bar. */
__device__ __forceinline__ void st_async_to(float *dst, uint64_t *bar, unsigned rank, float v)
{
    unsigned rd, rb;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                 : "=r"(rd)
                 : "r"(smem_addr(dst)), "r"(rank));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                 : "=r"(rb)
                 : "r"(smem_addr(bar)), "r"(rank));
    asm volatile(
        "st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [%0], %1, [%2];" ::"r"(rd),
        "f"(v), "r"(rb)
        : "memory");
}

/* Thread 0 sends v, the same in every thread, into slots[rank] of each of the cluster's n
 * blocks; every thread then waits until this block's slots[0 .. n) hold all n values (its
 * barrier's phase `phase`). */
__device__ __forceinline__ void cluster_exchange(float v, float *slots, uint64_t *bar,
                                                 unsigned phase, int rank, int n)
{
    if (threadIdx.x == 0) {
        mbar_arrive_expect(bar, sizeof(float) * n);
        for (int k = 0; k < n; k++)
            st_async_to(&slots[rank], bar, (unsigned)k, v);
    }
    mbar_wait(bar, phase);
}

/* Rows too wide for a block's registers: a cluster of n blocks per row, each holding
 * kThreads * V of its columns (block rank k: columns k * kThreads * V ...), which send each
 * other their maximum, then their sum of exponentials (st.async into every block's slot,
 * added in rank order: the same bits every run). One read of each row, and several rows in
 * flight on each multiprocessor, where a block of 1024 threads per row left the SM idle
 * between rows (60% of the copy bandwidth at 32768 columns on the H200; a cluster barrier in
 * place of st.async, which also waits for the blocks' earlier gradient stores: 53%).
 * STAGED (rows of a multiple of 4 floats, 16-byte aligned): the copy engine brings each
 * block's share of its next row into shared memory while the block works on this one, so
 * memory is read while the blocks wait for each other (without: 64% at 32768 columns). A
 * buffer is refilled one row after it was read, by then past the block's barriers.
 * A block's slots are rewritten only after it read them: block A sends row r + 1's maximum
 * after it has every sum of row r, so after each block read its maxima of row r; likewise
 * for the sums. Each barrier completes once a row, so its phase is the row's parity. (One
 * exchange a row, of each block's maximum and sum combined, measured slower: 71%.) */
template <int V, bool STAGED>
__global__ void __launch_bounds__(kThreads, V <= 16 ? 4 : 2)
    xent_cluster_kernel(int rows, int cols, const float *logits, const int32_t *labels,
                        float *dlogits, float inv_rows, float *part, float *out, double scale)
{
    cg::cluster_group cl = cg::this_cluster();
    __shared__ __align__(8) uint64_t bar[2]; /* the maxima, the sums */
    __shared__ float slot[2][kXentClusterMax];
    __shared__ __align__(128) float buf[STAGED ? 2 : 1][STAGED ? kThreads * V : 1];
    __shared__ __align__(8) uint64_t ld[2]; /* buf's */
    const int t = threadIdx.x, rank = (int)cl.block_rank(), n = (int)cl.num_blocks();
    const int c0 = rank * kThreads * V;
    const long clusters = gridDim.x / n;
    const int share = min(max(cols - c0, 0), kThreads * V); /* this block's columns */
    auto stage = [&](long row, int b) {
        if (share > 0)
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        mbar_arrive_expect(&ld[b], sizeof(float) * share);
        if (share > 0)
            bulk_load(buf[b], logits + (size_t)row * cols + c0, sizeof(float) * share, &ld[b]);
    };
    if (t == 0) {
        mbar_init(&bar[0], 1);
        mbar_init(&bar[1], 1);
        mbar_init(&ld[0], 1);
        mbar_init(&ld[1], 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    cl.sync(); /* every block's barriers are ready before anything is sent to them */
    float loss = 0.0f;
    unsigned it = 0, phase = 0;
    if (STAGED && t == 0 && blockIdx.x / n < rows)
        stage(blockIdx.x / n, 0);
    /* The same rows for every block of a cluster. */
    for (long r = blockIdx.x / n; r < rows; r += clusters, it++, phase ^= 1) {
        const float *l = logits + (size_t)r * cols;
        const int y = __ldg(labels + r);
        float v[V], mx = -INFINITY, s = 0.0f, ly = 0.0f;
        if (STAGED) {
            if (t == 0 && r + clusters < rows)
                stage(r + clusters, (it + 1) & 1);
            mbar_wait(&ld[it & 1], (it >> 1) & 1);
        }
#pragma unroll
        for (int j = 0; j < V; j++) {
            const int c = c0 + t + kThreads * j;
            v[j] = c >= cols ? -INFINITY : STAGED ? buf[it & 1][t + kThreads * j] : l[c];
            mx = fmaxf(mx, v[j]);
        }
        cluster_exchange(block_max(mx), slot[0], &bar[0], phase, rank, n);
        mx = -INFINITY;
        for (int k = 0; k < n; k++)
            mx = fmaxf(mx, slot[0][k]);
#pragma unroll
        for (int j = 0; j < V; j++) {
            const int c = c0 + t + kThreads * j;
            if (c == y)
                ly = v[j];
            v[j] = c < cols ? expf(v[j] - mx) : 0.0f;
            s += v[j];
        }
        cluster_exchange(block_sum(s), slot[1], &bar[1], phase, rank, n);
        s = 0.0f;
        for (int k = 0; k < n; k++)
            s += slot[1][k];
        const float lse = mx + logf(s), gs = inv_rows / s;
        const bool ok = y >= 0 && y < cols;
        if (dlogits != nullptr) {
            float *d = dlogits + (size_t)r * cols;
#pragma unroll
            for (int j = 0; j < V; j++) {
                const int c = c0 + t + kThreads * j;
                if (c < cols)
                    d[c] = ok ? v[j] * gs - (c == y ? inv_rows : 0.0f) : NAN;
            }
        }
        const int own = y - c0;
        if (!ok ? rank == 0 && t == 0 : own >= 0 && own < kThreads * V && own % kThreads == t)
            loss += ok ? lse - ly : NAN;
    }
    cl.sync(); /* no block leaves while another may still address its shared memory */
    loss = block_sum(loss);
    block_result(loss, part, out, scale);
}

/* Rows too wide for registers: one online pass for the maximum and the sum of exponentials
 * (the sum rescaled whenever the maximum grows), then the gradient pass; two reads per row. */
__global__ void __launch_bounds__(kThreads)
    xent_wide_kernel(int rows, int cols, const float *logits, const int32_t *labels, float *dlogits,
                     float inv_rows, float *part, float *out, double scale)
{
    int t = threadIdx.x;
    float loss = 0.0f;
    for (long r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *l = logits + (size_t)r * cols;
        float m = -INFINITY, s = 0.0f;
        for (int c = t; c < cols; c += kThreads) {
            float x = l[c];
            if (x > m) {
                s = s * expf(m - x) + 1.0f;
                m = x;
            } else if (m != -INFINITY) {
                s += expf(x - m);
            }
        }
        float mx = block_max(m);
        s = m == -INFINITY ? 0.0f : s * expf(m - mx);
        s = block_sum(s);
        float lse = mx + logf(s);
        int y = labels[r];
        bool ok = y >= 0 && y < cols;
        float ly = ok ? l[y] : NAN;
        __syncthreads();
        if (dlogits != nullptr) {
            float *d = dlogits + (size_t)r * cols;
            for (int c = t; c < cols; c += kThreads)
                d[c] = ok ? (expf(l[c] - lse) - (c == y ? 1.0f : 0.0f)) * inv_rows : NAN;
        }
        if (t == 0)
            loss += lse - ly;
    }
    loss = block_sum(loss);
    block_result(loss, part, out, scale);
}

/* Launches xent_warp_kernel<G, V, R> with R = 8 / V rows per lane group for short rows (at
 * least 8 loads in flight per lane) and one row for long ones. */
template <int G, int V>
unsigned launch_xent_warp(cuda_impl *c, int rows, int cols, const float *logits,
                          const int32_t *labels, float *dlogits, float *loss)
{
    constexpr int R = G < 32 ? 4 : V >= 8 ? 1 : 8 / V, kGroups = 32 / G;
    /* Fewer rows than lane groups in one wave: a row per group, the latency of one row. */
    if (R > 1 && (size_t)rows <= (size_t)c->sms * 32 * kGroups) {
        size_t warps = ((size_t)rows + kGroups - 1) / kGroups;
        unsigned blocks = (unsigned)((warps * 32 + kThreads - 1) / kThreads);
        xent_warp_kernel<G, V, 1><<<blocks, kThreads, 0, c->stream>>>(
            rows, cols, logits, labels, dlogits, 1.0f / (float)rows, c->scratch, loss, 1.0 / rows);
        return blocks;
    }
    size_t warps = ((size_t)rows + kGroups * R - 1) / (kGroups * R);
    unsigned blocks = grid_for(c, warps * 32, kRedBlocksPerSm);
    xent_warp_kernel<G, V, R><<<blocks, kThreads, 0, c->stream>>>(
        rows, cols, logits, labels, dlogits, 1.0f / (float)rows, c->scratch, loss, 1.0 / rows);
    return blocks;
}

template <int V>
unsigned launch_xent_block(cuda_impl *c, int rows, int cols, const float *logits,
                           const int32_t *labels, float *dlogits, float *loss)
{
    size_t cap = (size_t)c->sms * kRedBlocksPerSm;
    unsigned blocks = (unsigned)((size_t)rows < cap ? (size_t)rows : cap);
    xent_block_kernel<V><<<blocks, kThreads, 0, c->stream>>>(
        rows, cols, logits, labels, dlogits, 1.0f / (float)rows, c->scratch, loss, 1.0 / rows);
    return blocks;
}

/* xent_cluster_kernel<V> with clusters of 1, 2, 4 or 8 blocks (cols <= 8 * kThreads * V),
 * staged where the rows allow it and the buffers fit the 48 KiB of static shared memory. */
template <int V>
cudaError_t launch_xent_cluster(cuda_impl *c, int rows, int cols, const float *logits,
                                const int32_t *labels, float *dlogits, float *loss,
                                unsigned *blocks)
{
    int n = (cols + kThreads * V - 1) / (kThreads * V);
    n = n <= 2 ? n : n <= 4 ? 4 : kXentClusterMax;
    size_t clusters = (size_t)c->sms * kRedBlocksPerSm / n;
    clusters = (size_t)rows < clusters ? (size_t)rows : clusters;
    *blocks = (unsigned)(clusters * n);
    const bool staged = V <= 16 && cols % 4 == 0 && ((uintptr_t)logits & 15) == 0;
    return mgpu_sg::launch_clustered(
        staged ? xent_cluster_kernel<V, V <= 16> : xent_cluster_kernel<V, false>,
        dim3(*blocks, 1, 1), kThreads, 0, c->stream, (unsigned)n, rows, cols, logits, labels,
        dlogits, 1.0f / (float)rows, c->scratch, loss, 1.0 / rows);
}

} /* namespace */

int cuda_softmax_xent(void *impl, int rows, int cols, const float *logits, const int32_t *labels,
                      float *loss, float *dlogits, mgpu_err_t *err)
{
    if (dlogits != nullptr)
        invalidate((cuda_impl *)impl, dlogits, sizeof(float) * rows * (size_t)cols);
    cuda_impl *c = (cuda_impl *)impl;
    unsigned blocks;
    if (cols <= 4)
        blocks = launch_xent_warp<1, 4>(c, rows, cols, logits, labels, dlogits, loss);
    else if (cols <= 8)
        blocks = launch_xent_warp<2, 4>(c, rows, cols, logits, labels, dlogits, loss);
    else if (cols <= 16)
        blocks = launch_xent_warp<4, 4>(c, rows, cols, logits, labels, dlogits, loss);
    else if (cols <= 32)
        blocks = launch_xent_warp<8, 4>(c, rows, cols, logits, labels, dlogits, loss);
    else if (cols <= 64)
        blocks = launch_xent_warp<32, 2>(c, rows, cols, logits, labels, dlogits, loss);
    else if (cols <= 128)
        blocks = launch_xent_warp<32, 4>(c, rows, cols, logits, labels, dlogits, loss);
    else if (cols <= 256)
        blocks = launch_xent_warp<32, 8>(c, rows, cols, logits, labels, dlogits, loss);
    else if (cols <= 512)
        blocks = launch_xent_warp<32, 16>(c, rows, cols, logits, labels, dlogits, loss);
    else if (cols <= kXentWarpMaxCols)
        blocks = launch_xent_warp<32, 32>(c, rows, cols, logits, labels, dlogits, loss);
    else if (cols <= kThreads * 8)
        blocks = launch_xent_block<8>(c, rows, cols, logits, labels, dlogits, loss);
    else if (cols <= kThreads * 16)
        blocks = launch_xent_block<16>(c, rows, cols, logits, labels, dlogits, loss);
    else if (cols <= kThreads * 32)
        blocks = launch_xent_block<32>(c, rows, cols, logits, labels, dlogits, loss);
    else if (cols <= kXentClusterMax * kThreads * 32) {
        cudaError_t le =
            cols <= kXentClusterMax * kThreads * 16
                ? launch_xent_cluster<16>(c, rows, cols, logits, labels, dlogits, loss, &blocks)
                : launch_xent_cluster<32>(c, rows, cols, logits, labels, dlogits, loss, &blocks);
        if (le != cudaSuccess) {
            (void)cudaGetLastError();
            return mgpu_err_set(err, MGPU_E_CUDA,
                                "launch of softmax_xent's cluster kernel (%d x %d, %u blocks): %s",
                                rows, cols, blocks, cudaGetErrorString(le));
        }
    } else {
        /* Two reads of each row: the second hits L2 only while the rows in flight fit in half
         * of it (a full wave of 1056 rows of 32768 floats, 138 MB, read every row twice from
         * memory on the H200: 41% of the copy bandwidth). */
        size_t cap = (size_t)c->sms * kRedBlocksPerSm, row_bytes = sizeof(float) * (size_t)cols;
        size_t fit = (size_t)c->l2_bytes / 2 / row_bytes;
        cap = fit < cap ? (fit > (size_t)c->sms ? fit : (size_t)c->sms) : cap;
        blocks = (unsigned)((size_t)rows < cap ? (size_t)rows : cap);
        xent_wide_kernel<<<blocks, kThreads, 0, c->stream>>>(
            rows, cols, logits, labels, dlogits, 1.0f / (float)rows, c->scratch, loss, 1.0 / rows);
    }
    CUDA_CHECK_LAUNCH(err, "softmax_xent kernel (%d x %d, %u blocks)", rows, cols, blocks);
    return 0;
}

} /* namespace mgpu_cuda */
