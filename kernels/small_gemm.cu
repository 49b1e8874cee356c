/* small_gemm.cu - fp32 products of launch-bound linear layers with their epilogues (see
 * small_gemm.h for what and why). */
#include "small_gemm.h"

#include <cooperative_groups.h> /* this_cluster, map_shared_rank */

#include <stdint.h> /* uintptr_t */

namespace cg = cooperative_groups;

namespace mgpu_sg
{
namespace
{

constexpr int kTile = 32; /* output tile: kTile x kTile */
/* The staged operands' row stride: 36 keeps the transposing stores free of bank conflicts. */
constexpr int kLd = kTile + 4;
constexpr int kThreads = 512; /* eight k-groups of 64 threads, each thread 4 x 4 outputs */
constexpr int kGroups = kThreads / 64;
constexpr int kRed = kGroups * kTile * kTile; /* the groups' partial tiles */
constexpr int kKc = 0, kRc = 1;               /* operand layouts: k-contiguous, row-contiguous */
constexpr int kPer = kMaxSlice * kTile / 4 / kThreads; /* float4 loads per thread per operand */

/* The k slice of each block when K is split over `split` blocks: a multiple of 8 (pairs of
 * float4 loads along k). */
__host__ __device__ constexpr int slice(int K, int split)
{
    return ((K + split - 1) / split + 7) / 8 * 8;
}

/* Floats of dynamic shared memory for a slice of ks: the operands (or, after them, the
 * groups' partials), the block's partial tile and its row sums. */
__host__ __device__ constexpr int smem_floats(int ks)
{
    return (2 * ks * kLd > kRed ? 2 * ks * kLd : kRed) + kTile * kTile + kTile;
}

/* The float4 loads of one operand's slice: element (r0 + r, k0 + k) for k < ks, r < kTile,
 * zero past R or kn. A thread issues all of both operands' loads before storing any, so the
 * slice costs one memory latency. Along k, two neighbouring threads take the two halves of a
 * 32-byte sector (one thread a row would use half of each sector it fetches). */
template <int L>
__device__ __forceinline__ void load(const float *__restrict__ src, int ld, int r0, int R, int k0,
                                     int kn, int ks, float4 (&v)[kPer], int tid)
{
    const int items = ks * kTile / 4;
#pragma unroll
    for (int i = 0; i < kPer; i++) {
        const int idx = tid + i * kThreads;
        v[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (idx < items) {
            if (L == kKc) {
                const int r = (idx >> 1) % kTile, kq = idx / (2 * kTile) * 2 + (idx & 1);
                if (r0 + r < R && kq * 4 < kn)
                    v[i] = __ldg(reinterpret_cast<const float4 *>(src + (size_t)(r0 + r) * ld + k0 +
                                                                  kq * 4));
            } else {
                const int rq = idx % (kTile / 4), k = idx / (kTile / 4);
                if (k < kn && r0 + rq * 4 < R)
                    v[i] = __ldg(reinterpret_cast<const float4 *>(src + (size_t)(k0 + k) * ld + r0 +
                                                                  rq * 4));
            }
        }
    }
}

/* ... and their stores, k-major: dst[k * kLd + r]. */
template <int L>
__device__ __forceinline__ void store(const float4 (&v)[kPer], int ks, float *dst, int tid)
{
    const int items = ks * kTile / 4;
#pragma unroll
    for (int i = 0; i < kPer; i++) {
        const int idx = tid + i * kThreads;
        if (idx < items) {
            if (L == kKc) {
                const int r = (idx >> 1) % kTile, kq = idx / (2 * kTile) * 2 + (idx & 1);
                float *d = dst + kq * 4 * kLd + r;
                d[0] = v[i].x;
                d[kLd] = v[i].y;
                d[2 * kLd] = v[i].z;
                d[3 * kLd] = v[i].w;
            } else {
                const int rq = idx % (kTile / 4), k = idx / (kTile / 4);
                *reinterpret_cast<float4 *>(dst + k * kLd + rq * 4) = v[i];
            }
        }
    }
}

/* Grid: (split, N tiles, M tiles), clusters of (split, 1, 1): the blocks of a cluster share
 * one output tile and take consecutive k slices of ks. */
/* acc += a b^T for one k: a thread's 4 x 4 outputs from four staged values of each operand
 * (16-byte aligned). */
__device__ __forceinline__ void outer4(float (&acc)[4][4], const float *a4, const float *b4)
{
    const float4 a = *reinterpret_cast<const float4 *>(a4);
    const float4 b = *reinterpret_cast<const float4 *>(b4);
    const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
            acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
}

template <int LA, int LB, int OP, bool RELU>
__global__ void __launch_bounds__(kThreads, 1) sg_kernel(Args p, int ks)
{
    extern __shared__ float4 smem4[];
    float *sm = reinterpret_cast<float *>(smem4);
    float *as = sm, *bs = sm + ks * kLd;
    float *part = sm + (2 * ks * kLd > kRed ? 2 * ks * kLd : kRed);
    float *rsum = part + kTile * kTile;
    cg::cluster_group cl = cg::this_cluster();
    const int split = (int)cl.num_blocks(), rank = (int)cl.block_rank();
    const int k0 = rank * ks;
    const int kn = p.K - k0 < ks ? (p.K - k0 > 0 ? p.K - k0 : 0) : ks;
    const int m0 = blockIdx.z * kTile, n0 = blockIdx.y * kTile;
    const int tid = threadIdx.x;

    {
        float4 va[kPer], vb[kPer];
        load<LA>(p.a, p.lda, m0, p.M, k0, kn, ks, va, tid);
        load<LB>(p.b, p.ldb, n0, p.N, k0, kn, ks, vb, tid);
        store<LA>(va, ks, as, tid);
        store<LB>(vb, ks, bs, tid);
    }
    __syncthreads();

    const int g = tid / 64, t = tid % 64, tm = (t / 8) * 4, tn = (t % 8) * 4;
    static_assert(kTile * kTile == 2 * kThreads, "the groups' sum takes two outputs a thread");
    float acc[4][4] = {};
#pragma unroll 4
    for (int k = g; k < kn; k += kGroups) {
        outer4(acc, as + k * kLd + tm, bs + k * kLd + tn);
    }
    __syncthreads(); /* the operands are read: their space takes the groups' partials */
    float *red = sm;
#pragma unroll
    for (int i = 0; i < 4; i++)
        *reinterpret_cast<float4 *>(red + g * kTile * kTile + (tm + i) * kTile + tn) =
            make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
    __syncthreads();
    {
        const int e = tid * 2; /* kTile * kTile / kThreads = 2 each */
        float2 s = *reinterpret_cast<const float2 *>(red + e);
#pragma unroll
        for (int q = 1; q < kGroups; q++) {
            const float2 u = *reinterpret_cast<const float2 *>(red + q * kTile * kTile + e);
            s.x += u.x, s.y += u.y;
        }
        *reinterpret_cast<float2 *>(part + e) = s;
    }
    cl.sync(); /* every block's partial tile is ready */
    /* Block `rank` adds the cluster's partials of its share of the tile's rows, in rank
     * order, and applies the epilogue. */
    const int rows = kTile / split;
    for (int e = tid; e < rows * kTile; e += kThreads) {
        const int r = rank * rows + e / kTile, col = e % kTile;
        const int m = m0 + r, n = n0 + col;
        float v = 0.0f;
        for (int q = 0; q < split; q++)
            v += cl.map_shared_rank(part, q)[r * kTile + col];
        if (m < p.M && n < p.N) {
            if (OP == kForward) {
                if (p.bias != nullptr)
                    v += p.bias[n];
                if (RELU)
                    v = v > 0.0f ? v : 0.0f;
            }
            if (OP == kInputGrad && RELU)
                v = p.y[(size_t)m * p.ldy + n] > 0.0f ? v : 0.0f;
            p.c[(size_t)m * p.ldc + n] = v;
        }
        if (OP == kInputGrad) /* this block's rows, for the bias gradient below */
            red[(e / kTile) * kTile + col] = m < p.M && n < p.N ? v : 0.0f;
    }
    if (OP == kInputGrad && p.dbias != nullptr) {
        /* The bias gradient: the column sums of dx. Each block adds its rows of the tile, rank
         * 0 adds the cluster's sums (rank order) into one partial row per tile, and the tile
         * that comes last in its column adds the column's partials in tile order. No atomics
         * on the values: a rerun gives the same bits. */
        __shared__ bool last;
        __syncthreads();
        if (tid < kTile) {
            float s = 0.0f;
            for (int rr = 0; rr < rows; rr++)
                s += red[rr * kTile + tid];
            rsum[tid] = s;
        }
        cl.sync();
        if (rank == 0) {
            if (tid < kTile && n0 + tid < p.N) {
                float s = 0.0f;
                for (int q = 0; q < split; q++)
                    s += cl.map_shared_rank(rsum, q)[tid];
                p.part[(size_t)blockIdx.z * p.N + n0 + tid] = s;
            }
            __threadfence();
            __syncthreads();
            if (tid == 0)
                last = atomicAdd(&p.count[blockIdx.y], 1u) == gridDim.z - 1;
            __syncthreads();
            if (last) {
                if (tid < kTile && n0 + tid < p.N) {
                    /* Eight loads in flight at a time, added in tile order. */
                    const float *col = p.part + n0 + tid;
                    const unsigned tiles = gridDim.z;
                    float s = 0.0f;
                    unsigned t = 0;
                    for (; t + 8 <= tiles; t += 8) {
                        float v[8];
#pragma unroll
                        for (int j = 0; j < 8; j++)
                            v[j] = __ldcg(col + (size_t)(t + j) * p.N);
#pragma unroll
                        for (int j = 0; j < 8; j++)
                            s += v[j];
                    }
                    for (; t < tiles; t++)
                        s += __ldcg(col + (size_t)t * p.N);
                    p.dbias[n0 + tid] = s;
                }
                if (tid == 0)
                    p.count[blockIdx.y] = 0;
            }
        }
    }
    cl.sync(); /* no block leaves while another reads its shared memory */
}

/* Above 48 KiB of dynamic shared memory a kernel must say so (per device: see prepare). */
template <int LA, int LB, int OP, bool RELU> cudaError_t allow_smem()
{
    return cudaFuncSetAttribute(sg_kernel<LA, LB, OP, RELU>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)(sizeof(float) * smem_floats(kMaxSlice)));
}

template <int LA, int LB, int OP, bool RELU>
cudaError_t go(const Args &a, int split, cudaStream_t st)
{
    const int ks = slice(a.K, split);
    const dim3 grid((unsigned)split, (unsigned)((a.N + kTile - 1) / kTile),
                    (unsigned)((a.M + kTile - 1) / kTile));
    return launch_clustered(sg_kernel<LA, LB, OP, RELU>, grid, kThreads,
                            sizeof(float) * smem_floats(ks), st, (unsigned)split, a, ks);
}

bool aligned16(const void *p)
{
    return ((uintptr_t)p & 15) == 0;
}

/* --- weight gradients, several layers' in one launch ----------------------------------------
 * dW [M x N] = dz^T . x: A(m, k) = dz[k * lda + m], B(k, n) = x[k * ldb + n], K the batch.
 * Output tiles of kWgM x kWgN, four groups of 128 threads each taking every fourth k (a thread
 * 4 x 4 outputs), the group's partials then the cluster's (the K split) added in a fixed order;
 * the tiles of every job of the group in one grid, a job's found from the tile prefix. */
constexpr int kWgM = 64, kWgN = 32;
constexpr int kWgGroups = kThreads * 16 / (kWgM * kWgN);
constexpr int kWgPerA = kWgMaxSlice * kWgM / 4 / kThreads; /* float4 loads per thread */
constexpr int kWgPerB = kWgMaxSlice * kWgN / 4 / kThreads;
static_assert(kWgGroups == 4 && kWgM * kWgN == 4 * kThreads, "four outputs a thread to add up");

__host__ __device__ constexpr int wg_smem_floats(int ks)
{
    /* the operands, or after them the groups' partials; the block's partial tile; its sums
     * of A's rows (the bias gradient) */
    return (ks * (kWgM + kWgN) > kWgGroups * kWgM * kWgN ? ks * (kWgM + kWgN)
                                                         : kWgGroups * kWgM * kWgN) +
           kWgM * kWgN + kWgM;
}

/* Rows [k0, k0 + kn) of a row-contiguous operand, columns [c0, c0 + W) (zero past C or kn):
 * float4 loads, and their stores to dst[k * W + c]. A thread issues both operands' loads
 * before storing any. */
template <int W, int PER>
__device__ __forceinline__ void wg_load(const float *__restrict__ src, int ld, int c0, int C,
                                        int k0, int kn, int ks, float4 (&v)[PER], int tid)
{
    const int items = ks * W / 4;
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const int idx = tid + i * kThreads, cq = idx % (W / 4), k = idx / (W / 4);
        v[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (idx < items && k < kn && c0 + cq * 4 < C)
            v[i] =
                __ldg(reinterpret_cast<const float4 *>(src + (size_t)(k0 + k) * ld + c0 + cq * 4));
    }
}

template <int W, int PER>
__device__ __forceinline__ void wg_store(const float4 (&v)[PER], int ks, float *dst, int tid)
{
    const int items = ks * W / 4;
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const int idx = tid + i * kThreads;
        if (idx < items)
            reinterpret_cast<float4 *>(dst)[idx] = v[i];
    }
}

/* Grid: (split, the group's tiles), clusters of (split, 1, 1). */
__global__ void __launch_bounds__(kThreads, 1) wg_kernel(Group g, int ks)
{
    extern __shared__ float4 smem4[];
    float *sm = reinterpret_cast<float *>(smem4);
    float *as = sm, *bs = sm + ks * kWgM;
    float *part = sm + (ks * (kWgM + kWgN) > kWgGroups * kWgM * kWgN ? ks * (kWgM + kWgN)
                                                                     : kWgGroups * kWgM * kWgN);
    float *rsum = part + kWgM * kWgN;
    cg::cluster_group cl = cg::this_cluster();
    const int split = (int)cl.num_blocks(), rank = (int)cl.block_rank();
    const int tid = threadIdx.x;

    /* This block's job and tile (constant indices: the jobs stay in parameter space). */
    int t = (int)blockIdx.y, base = 0;
    Job jb = g.job[0];
#pragma unroll
    for (int q = 1; q < kWgMaxJobs; q++)
        if (q < g.n && t >= g.tile0[q])
            jb = g.job[q], base = g.tile0[q];
    t -= base;
    const int tiles_n = (jb.N + kWgN - 1) / kWgN;
    const int m0 = t / tiles_n * kWgM, n0 = t % tiles_n * kWgN;
    const int k0 = rank * ks;
    const int kn = g.K - k0 < ks ? (g.K - k0 > 0 ? g.K - k0 : 0) : ks;

    {
        float4 va[kWgPerA], vb[kWgPerB];
        wg_load<kWgM>(jb.a, jb.lda, m0, jb.M, k0, kn, ks, va, tid);
        wg_load<kWgN>(jb.b, jb.ldb, n0, jb.N, k0, kn, ks, vb, tid);
        wg_store<kWgM>(va, ks, as, tid);
        wg_store<kWgN>(vb, ks, bs, tid);
    }
    __syncthreads();

    const int grp = tid / 128, tt = tid % 128, tm = tt / 8 * 4, tn = tt % 8 * 4;
    float acc[4][4] = {};
#pragma unroll 4
    for (int k = grp; k < kn; k += kWgGroups) {
        outer4(acc, as + k * kWgM + tm, bs + k * kWgN + tn);
    }
    const bool bias = jb.dbias != nullptr && n0 == 0;
    if (bias && tid < kWgM) {
        /* The bias gradient's part: this slice's sum of A's row m (dz's column). */
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
        int k = 0;
        for (; k + 4 <= kn; k += 4) {
            s0 += as[k * kWgM + tid];
            s1 += as[(k + 1) * kWgM + tid];
            s2 += as[(k + 2) * kWgM + tid];
            s3 += as[(k + 3) * kWgM + tid];
        }
        for (; k < kn; k++)
            s0 += as[k * kWgM + tid];
        rsum[tid] = (s0 + s1) + (s2 + s3);
    }
    __syncthreads(); /* the operands are read: their space takes the groups' partials */
    float *red = sm;
#pragma unroll
    for (int i = 0; i < 4; i++)
        *reinterpret_cast<float4 *>(red + grp * kWgM * kWgN + (tm + i) * kWgN + tn) =
            make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
    __syncthreads();
    {
        const int e = tid * 4;
        float4 s = *reinterpret_cast<const float4 *>(red + e);
#pragma unroll
        for (int q = 1; q < kWgGroups; q++) {
            const float4 u = *reinterpret_cast<const float4 *>(red + q * kWgM * kWgN + e);
            s.x += u.x, s.y += u.y, s.z += u.z, s.w += u.w;
        }
        *reinterpret_cast<float4 *>(part + e) = s;
    }
    cl.sync(); /* every block's partial tile is ready */
    /* Block `rank` adds the cluster's partials of its share of the tile's rows, rank order. */
    const int rows = kWgM / split;
    for (int e = tid; e < rows * kWgN; e += kThreads) {
        const int r = rank * rows + e / kWgN, col = e % kWgN;
        float v = 0.0f;
        for (int q = 0; q < split; q++)
            v += cl.map_shared_rank(part, q)[r * kWgN + col];
        if (m0 + r < jb.M && n0 + col < jb.N)
            jb.c[(size_t)(m0 + r) * jb.ldc + n0 + col] = v;
    }
    if (bias && rank == 0 && tid < kWgM && m0 + tid < jb.M) {
        float s = 0.0f;
        for (int q = 0; q < split; q++)
            s += cl.map_shared_rank(rsum, q)[tid];
        jb.dbias[m0 + tid] = s;
    }
    cl.sync(); /* no block leaves while another reads its shared memory */
}

/* The K split of `tiles` output tiles over K, a slice of at most max_slice k a block: a power of
 * two up to kMaxCluster, 0 when even that takes more blocks than multiprocessors (a second
 * wave, where cuBLAS's larger tiles are faster: measured on the H200, 13.6 against 7.8 us for
 * 256 x 784 x 256). forced (MGPU_SG_SPLIT) where it fits. Else at most a block per
 * multiprocessor (one of 512 threads, its k slice in flight at once, is the unit that hides
 * latency; a second block on some multiprocessors would make them the kernel's tail), then
 * no block without a k of its own. */
int k_split(int K, int max_slice, long tiles, int sms, int forced)
{
    const int need = (K + max_slice - 1) / max_slice;
    int split = 1;
    while (split < need)
        split *= 2;
    if (split > kMaxCluster || tiles * split > sms)
        return 0;
    if (forced >= split && forced <= kMaxCluster && (forced & (forced - 1)) == 0)
        return forced;
    while (split < kMaxCluster && tiles * split * 2 <= sms)
        split *= 2;
    while (split > need && (long)(split - 1) * slice(K, split) >= K)
        split /= 2;
    return split;
}

/* The group's K split (k_split with slices of at most kWgMaxSlice); fills in the tile
 * prefix. */
int wg_split(Group &g, int sms, int forced)
{
    long tiles = 0;
    for (int q = 0; q < g.n; q++) {
        g.tile0[q] = (int)tiles;
        tiles += (long)((g.job[q].M + kWgM - 1) / kWgM) * ((g.job[q].N + kWgN - 1) / kWgN);
    }
    return g.n < 1 || g.K < 1 ? 0 : k_split(g.K, kWgMaxSlice, tiles, sms, forced);
}

} // namespace

cudaError_t prepare()
{
    cudaError_t e;
    if ((e = allow_smem<kKc, kKc, kForward, true>()) != cudaSuccess ||
        (e = allow_smem<kKc, kKc, kForward, false>()) != cudaSuccess ||
        (e = allow_smem<kKc, kRc, kInputGrad, true>()) != cudaSuccess ||
        (e = allow_smem<kKc, kRc, kInputGrad, false>()) != cudaSuccess)
        return e;
    return cudaFuncSetAttribute(wg_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)(sizeof(float) * wg_smem_floats(kWgMaxSlice)));
}

bool job_fits(const Job &j, int K)
{
    return j.M >= 1 && j.N >= 1 && K >= 1 && 2.0 * j.M * j.N * K <= kMaxFlops && aligned16(j.a) &&
           aligned16(j.b) && j.lda % 4 == 0 && j.ldb % 4 == 0 && j.M % 4 == 0 && j.N % 4 == 0;
}

int group_split(Group &g, int sms, int forced)
{
    for (int q = 0; q < g.n; q++)
        if (!job_fits(g.job[q], g.K))
            return 0;
    return g.n <= kWgMaxJobs ? wg_split(g, sms, forced) : 0;
}

cudaError_t group_launch(Group &g, int split, cudaStream_t st)
{
    int tiles = 0;
    for (int q = 0; q < g.n; q++) {
        g.tile0[q] = tiles;
        tiles += ((g.job[q].M + kWgM - 1) / kWgM) * ((g.job[q].N + kWgN - 1) / kWgN);
    }
    const int ks = slice(g.K, split);
    return launch_clustered(wg_kernel, dim3((unsigned)split, (unsigned)tiles, 1), kThreads,
                            sizeof(float) * wg_smem_floats(ks), st, (unsigned)split, g, ks);
}

/* A weight gradient given as Args: a group of one. */
static Group alone(const Args &a)
{
    Group g{};
    g.K = a.K;
    g.n = 1;
    g.job[0] = a; /* its Job part */
    return g;
}

int split_for(Op op, const Args &a, int sms, int forced)
{
    if (op == kWeightGrad) {
        Group g = alone(a);
        return group_split(g, sms, forced);
    }
    if (a.M < 1 || a.N < 1 || a.K < 1 || 2.0 * a.M * a.N * a.K > kMaxFlops)
        return 0;
    const int la = kKc, lb = op == kForward ? kKc : kRc;
    if (!aligned16(a.a) || !aligned16(a.b) || a.lda % 4 != 0 || a.ldb % 4 != 0 ||
        (la == kKc ? a.K : a.M) % 4 != 0 || (lb == kKc ? a.K : a.N) % 4 != 0)
        return 0;
    const long tiles = (long)((a.M + kTile - 1) / kTile) * ((a.N + kTile - 1) / kTile);
    return k_split(a.K, kMaxSlice, tiles, sms, forced);
}

cudaError_t launch(Op op, const Args &a, int split, cudaStream_t st)
{
    switch (op) {
    case kForward:
        return a.relu ? go<kKc, kKc, kForward, true>(a, split, st)
                      : go<kKc, kKc, kForward, false>(a, split, st);
    case kInputGrad:
        return a.relu ? go<kKc, kRc, kInputGrad, true>(a, split, st)
                      : go<kKc, kRc, kInputGrad, false>(a, split, st);
    case kWeightGrad: {
        Group g = alone(a);
        return group_launch(g, split, st);
    }
    }
    return cudaErrorInvalidValue;
}

} // namespace mgpu_sg
