/* gpt_attention_wg.cu - the bf16 path's attention on Hopper (compute capability 9.0) at head
 * sizes of 64 and 128: the products are warpgroup MMAs (wgmma.mma_async, the
 * architecture-specific target sm_90a) instead of the mma.sync of gpt_attention_tc.cu (forward)
 * and gpt_attention_tc_bwd.cu (the backward's two passes, which keep their structure and streams
 * there: only their kernels are these). In the forward each warpgroup overlaps the products
 * with its softmax as FlashAttention-3 does within a warpgroup: the scores of key tile j and
 * the sum p . v of tile j - 1 go to the tensor cores together, the softmax of tile j runs while
 * the second is still on them.
 *
 * A block is two warpgroups (256 threads), 64 queries each, over key tiles of 64 rows; q, k
 * and v come straight from qkv's rows (row stride 3c) through cp.async into shared memory in
 * the layout wgmma reads with 128-byte swizzling (row r's 16-byte chunk ch at chunk ch ^ (r %
 * 8) of its 128-byte row, tiles 1024-byte aligned): q and k as K-major operands (the head
 * dimension contiguous), v as an MN-major one (its rows are the product's k, read transposed).
 * The probabilities go from the scores' accumulators to the second product's A operand in
 * registers, as bf16 pairs, exactly as the mma.sync kernel's fragments do (the accumulator and
 * register-operand layouts of wgmma are mma.sync's, warp by warp). Everything else (the mask,
 * the running maximum and sum in log2 units, lse, the output rounded once to bf16) is the
 * mma.sync forward's arithmetic, so the two agree but for the order of the products' sums.
 *
 * The backward's query pass (dq = scale ds . k, s = q . k^T and dp = dout . v^T from shared
 * memory, ds = p (dp - D) in registers as the third product's A operand, k read transposed)
 * and key pass (s^T = k . q^T, dp^T = v . dout^T, then dv += p^T . dout and dk += ds^T . q with
 * dout and q read transposed) take a warpgroup's 64 queries or keys over tiles of 64 of the
 * other. Sums run in a fixed order, as in the mma.sync passes: no atomics.
 *
 * Measured alone on an H200 at GPT-2 124M's shape (b 16, t 1024, 12 heads of 64;
 * gpt_kernels_bench gpt2): the forward 0.116 ms against 0.133 for the mma.sync one, the
 * backward 0.284 against 0.369 (tests/bench/GPT_RESULTS.md). Without sm_90a in the build
 * (CUDA_ARCH without compute_90), on another GPU, or with MGPU_GPT_WGMMA=0, the mma.sync
 * kernels run. */
#include "gpt_attention_tc.h" /* cp.async, View, prepare; cuda_impl */

namespace mgpu_cuda
{
namespace
{

#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || !defined(__CUDA_ARCH__)
#define MGPU_WG_BODY 1
#endif

constexpr int kWgRows = 64;  /* queries a warpgroup, keys a tile */
constexpr int kWgGroups = 2; /* warpgroups a block */
constexpr int kWgThreads = 128 * kWgGroups;
constexpr int kWgQueryRows = kWgRows * kWgGroups; /* a forward or query-pass block's queries */
constexpr int kWgStages = 3;                      /* k and v tiles: in use, next, arriving */
constexpr int kWgTileBytes = kWgRows * 128;       /* 64 rows of 64 bf16 */
/* The forward's shared memory: the q tiles of its two warpgroups, three stages of k and v. */
constexpr size_t wg_smem_fwd(int hs)
{
    return 1024 + (size_t)(kWgGroups + 2 * kWgStages) * (hs / 64) * kWgTileBytes;
}
/* The query pass: q and dout tiles of its two warpgroups, three stages of k and v. The key
 * pass: a warpgroup a block (registers: s, dp, dk, dv and two A operands), its k and v, three
 * stages of q and dout with their lse and D. */
constexpr size_t wg_smem_q(int hs)
{
    return 1024 + (size_t)(2 * kWgGroups + 2 * kWgStages) * (hs / 64) * kWgTileBytes;
}
__host__ __device__ constexpr int wg_kv_stages(int hs)
{
    return hs == 64 ? kWgStages : 2;
}
constexpr size_t wg_smem_kv(int hs)
{
    return 1024 + (size_t)(2 + 2 * wg_kv_stages(hs)) * (hs / 64) * kWgTileBytes +
           2 * wg_kv_stages(hs) * kWgRows * sizeof(float);
}

#ifdef MGPU_WG_BODY
/* A shared-memory matrix descriptor: 128-byte swizzling, the stride between groups of 8 rows
 * (sbo) and between 64-element column groups (lbo, unused at these sizes), in bytes. */
__device__ __forceinline__ uint64_t wg_desc(uint32_t addr, uint32_t lbo, uint32_t sbo)
{
    return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)((lbo >> 4) & 0x3FFF) << 16 |
           (uint64_t)((sbo >> 4) & 0x3FFF) << 32 | 1ull << 62;
}

/* A 64 x 64 fp32 accumulator: its 32 registers a thread, as asm operands %0..%31. */
#define WG_D32                                                                                     \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "  \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define WG_ACC32(d)                                                                                \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),            \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),    \
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])

/* d (64 x 64, fp32; a thread's 32 in mma.sync's accumulator order) = or += a . b, both from
 * shared memory, K-major. */
__device__ __forceinline__ void wg_ss(float (&d)[32], uint64_t da, uint64_t db, int acc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WG_D32 ", "
                 "%32, %33, p, 1, 1, 0, 0;\n}\n"
                 : WG_ACC32(d)
                 : "l"(da), "l"(db), "r"(acc));
}

/* d += a . b, a from registers (a warp's 16 rows as mma.sync's A fragment), b from shared
 * memory MN-major (transposed). */
__device__ __forceinline__ void wg_rs(float (&d)[32], const uint32_t *a, uint64_t db)
{
    asm volatile("{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WG_D32 ", "
                 "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : WG_ACC32(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

/* d (64 x 64) = a . b^T over a head of HS (the product's k): a and b 64 rows each, K-major,
 * HS / 64 swizzled tiles of 64 columns (wg_tile's layout), 16 columns a step. */
template <int HS> __device__ __forceinline__ void wg_ss_head(float (&d)[32], uint32_t a, uint32_t b)
{
#pragma unroll
    for (int kk = 0; kk < HS / 16; kk++) {
        const uint32_t at = (kk >> 2) * kWgTileBytes + (kk & 3) * 32;
        wg_ss(d, wg_desc(a + at, 16, 1024), wg_desc(b + at, 16, 1024), kk);
    }
}

/* d (64 x HS: HS / 64 accumulators of 32 registers in a row) += a . b, a 64 x 64 from
 * registers, b 64 rows of HS columns (wg_tile's layout) read transposed, a tile at a time. */
template <int HS>
__device__ __forceinline__ void wg_rs_head(float *d, const uint32_t *a, uint32_t b)
{
#pragma unroll
    for (int g = 0; g < HS / 64; g++)
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
            wg_rs(*reinterpret_cast<float(*)[32]>(d + 32 * g), a + 4 * kk,
                  wg_desc(b + g * kWgTileBytes + kk * 2048, 16, 1024));
}

__device__ __forceinline__ void wg_fence()
{
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wg_commit()
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

template <int N> __device__ __forceinline__ void wg_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

/* What cp.async wrote (the generic proxy) becomes visible to wgmma's reads (the async one). */
__device__ __forceinline__ void fence_async_smem()
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/* R rows r0.. of a head (row stride ld, HS bf16 each) into swizzled tiles; rows past t:
 * zeros. The whole block takes part. A tile is 64 rows of 64 columns (128 bytes a row): a head
 * of 128 is two, columns 0-63 then 64-127, and each 64 rows of R take HS / 64 tiles in turn
 * (for HS = 64, simply row r at byte 128 r). */
template <int R, int NT = kWgThreads, int HS = 64>
__device__ __forceinline__ void wg_tile(unsigned char *dst, const bf16 *rows, size_t ld, int r0,
                                        int t)
{
    constexpr int CH = HS / 8, CG = HS / 64; /* 16-byte chunks a row, tiles a 64 rows */
    constexpr int LCH = CH == 16 ? 4 : 3;    /* log2(CH) */
    static_assert(HS == 64 || HS == 128, "heads of 64 or 128");
    static_assert(R * CH % NT == 0, "a tile is whole 16-byte chunks a thread");
#pragma unroll
    for (int it = 0; it < R * CH / NT; it++) {
        const int i = threadIdx.x + it * NT, r = i >> LCH, ch = i & (CH - 1), c8 = ch & 7;
        const bool in = r0 + r < t;
        unsigned char *at = CG == 1
                                ? dst + r * 128
                                : dst + ((r >> 6) * CG + (ch >> 3)) * kWgTileBytes + (r & 63) * 128;
        cp_async16(reinterpret_cast<bf16 *>(at + ((c8 ^ (r & 7)) << 4)),
                   rows + (size_t)(in ? r0 + r : 0) * ld + ch * 8, in);
    }
}

/* Tile j's copies landed (tile 0 and 1 are committed as two groups, each later one alone) and
 * visible to wgmma, and the whole block past a barrier: every warpgroup is done with the
 * buffer tile j - 2 used (with two stages, tile j - 1), which tile j + 1 may now take. */
__device__ __forceinline__ void wg_arrived(int j)
{
    if (j == 0)
        cp_wait<1>();
    else
        cp_wait<0>();
    fence_async_smem();
    __syncthreads();
}

/* Key and value tile j of a head (rows 64 j..) into buffer j % kWgStages of ks and vs (HS / 64
 * tiles each). */
template <int HS = 64>
__device__ __forceinline__ void wg_kv_tile(unsigned char *ks, unsigned char *vs, const bf16 *kh,
                                           const bf16 *vh, const View &kv, const View &vv, int j,
                                           int t)
{
    const int b = j % kWgStages * (HS / 64);
    wg_tile<kWgRows, kWgThreads, HS>(ks + b * kWgTileBytes, kh, kv.ld, j * kWgRows, t);
    wg_tile<kWgRows, kWgThreads, HS>(vs + b * kWgTileBytes, vh, vv.ld, j * kWgRows, t);
}

/* Which tile i of which head h and batch row bi a block takes (i = 0: the tile with the most
 * work; a grid of tiles x heads x rows). The GPU starts blocks in the order of their linear
 * index. grp = 0: one head after another, each from its heaviest tile to its lightest, so that a
 * head's k and v stay in L2 while its tiles run. grp > 0: the heads in groups of grp (batch row
 * and head pairs), and within a group the heaviest tile of each of its heads first, then the
 * next: the grid's last blocks are light ones, so its tail is short, and a group's k and v are
 * what the blocks in flight read. */
__device__ __forceinline__ void wg_place(int grp, int &i, int &h, int &bi)
{
    if (grp <= 0) {
        i = blockIdx.x, h = blockIdx.y, bi = blockIdx.z;
        return;
    }
    const int n = gridDim.x, pairs = gridDim.y * gridDim.z;
    const int lin = blockIdx.x + n * (blockIdx.y + gridDim.y * blockIdx.z);
    const int g0 = lin / (grp * n) * grp, gs = min(grp, pairs - g0), r = lin - g0 * n;
    const int pair = g0 + r % gs;
    i = r / gs, h = pair % gridDim.y, bi = pair / gridDim.y;
}

/* Where a thread of a query block (the forward's and the query pass's, kWgGroups warpgroups of
 * 64 queries) works. Blocks are launched last queries first (they have the most keys):
 * warpgroup wg owns queries q0 + 64 wg ..; its warp's lanes hold rows qa and qa + 8 (wrow0 is
 * the warp's first), as in the mma.sync kernels. Of the ntiles key tiles up to the block's last
 * query, the first nact have keys up to the warpgroup's last. */
struct WgQueries {
    int wg, tig, h, bi, q0, wrow0, qa, ntiles, nact;
    __device__ __forceinline__ WgQueries(int t, int grp)
    {
        const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
        int i;
        wg = threadIdx.x >> 7, tig = lane & 3;
        wg_place(grp, i, h, bi);
        q0 = (gridDim.x - 1 - i) * kWgQueryRows;
        const int wfirst = q0 + wg * kWgRows;
        wrow0 = wfirst + warp * 16, qa = wrow0 + (lane >> 2);
        ntiles = (min(t, q0 + kWgQueryRows) + kWgRows - 1) / kWgRows;
        nact = min(ntiles, (wfirst + kWgRows - 1) / kWgRows + 1);
    }
};
#endif

/* The forward: a block of two warpgroups owns 128 queries (WgQueries), each warpgroup's 64
 * over the key tiles up to its last query. A head of 128 (HS) takes two tiles of 64 columns
 * for each of q, k and v: the scores' product runs over both (8 steps of 16), and o is two 64 x
 * 64 accumulators, one a tile of v; with 64 registers more a thread and 128 KB of shared
 * memory, one block an SM. */
template <int HS>
__global__ void __launch_bounds__(kWgThreads, HS == 64 ? 2 : 1)
    att_fwd_wg_kernel(int t, int c, int nh, View qv, View kv, View vv, bf16 *out, float *lse,
                      float scale, int grp)
{
#ifdef MGPU_WG_BODY
    constexpr int CG = HS / 64; /* tiles of 64 columns a row of q, k or v */
    extern __shared__ __align__(128) unsigned char tc_smem[];
    unsigned char *base = tc_smem + ((1024 - (smem_addr(tc_smem) & 1023)) & 1023);
    unsigned char *qs = base, *ks = qs + kWgGroups * CG * kWgTileBytes,
                  *vs = ks + kWgStages * CG * kWgTileBytes;
    const WgQueries w(t, grp);
    const int tig = w.tig, qa = w.qa, ntiles = w.ntiles, nact = w.nact, hs = c / nh;
    const bf16 *kh = kv.at(w.bi, w.h), *vh = vv.at(w.bi, w.h);
    const float sl2 = scale * kLog2e;

    /* q and tile 0 (one group), tile 1 (the next) */
    wg_tile<kWgQueryRows, kWgThreads, HS>(qs, qv.at(w.bi, w.h), qv.ld, w.q0, t);
    wg_kv_tile<HS>(ks, vs, kh, vh, kv, vv, 0, t);
    cp_commit();
    if (ntiles > 1)
        wg_kv_tile<HS>(ks, vs, kh, vh, kv, vv, 1, t);
    cp_commit();

    float o[32 * CG], s[32], mx0 = -INFINITY, mx1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    uint32_t p[16];
#pragma unroll
    for (int i = 0; i < 32 * CG; i++)
        o[i] = 0.0f;
    const uint32_t qaddr = smem_addr(qs + w.wg * CG * kWgTileBytes);

    auto scores = [&](int j) { /* s = q . k_j^T */
                               const uint32_t kaddr =
                                   smem_addr(ks + (j % kWgStages) * CG * kWgTileBytes);
                               wg_fence();
                               wg_ss_head<HS>(s, qaddr, kaddr);
                               wg_commit();
    };
    auto sum_pv = [&](int j) { /* o += p . v_j, a tile of v's columns at a time */
                               const uint32_t vaddr =
                                   smem_addr(vs + (j % kWgStages) * CG * kWgTileBytes);
                               wg_rs_head<HS>(o, p, vaddr);
                               wg_commit();
    };
    /* s (scores of tile j) -> probabilities, the running maximum and sum updated; returns
     * the factors that rescale what o held. */
    auto softmax = [&](int j) {
        const int k0 = j * kWgRows;
        float r0 = -INFINITY, r1 = -INFINITY;
        const bool masked = k0 + kWgRows - 1 > w.wrow0;
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = k0 + n * 8 + 2 * tig + (e & 1), q = qa + (e >> 1) * 8;
                const float v = masked && key > q ? -INFINITY : s[n * 4 + e];
                s[n * 4 + e] = v;
                if (e < 2)
                    r0 = fmaxf(r0, v);
                else
                    r1 = fmaxf(r1, v);
            }
        r0 = fmaxf(r0, __shfl_xor_sync(0xffffffffu, r0, 1));
        r0 = fmaxf(r0, __shfl_xor_sync(0xffffffffu, r0, 2));
        r1 = fmaxf(r1, __shfl_xor_sync(0xffffffffu, r1, 1));
        r1 = fmaxf(r1, __shfl_xor_sync(0xffffffffu, r1, 2));
        const float n0 = fmaxf(mx0, r0 * sl2), n1 = fmaxf(mx1, r1 * sl2);
        const float2 f = make_float2(ex2(mx0 - n0), ex2(mx1 - n1));
        float sa = 0.0f, sb = 0.0f;
#pragma unroll
        for (int n = 0; n < 8; n++) {
            s[n * 4] = ex2(fmaf(s[n * 4], sl2, -n0));
            s[n * 4 + 1] = ex2(fmaf(s[n * 4 + 1], sl2, -n0));
            s[n * 4 + 2] = ex2(fmaf(s[n * 4 + 2], sl2, -n1));
            s[n * 4 + 3] = ex2(fmaf(s[n * 4 + 3], sl2, -n1));
            sa += s[n * 4] + s[n * 4 + 1];
            sb += s[n * 4 + 2] + s[n * 4 + 3];
        }
        l0 = l0 * f.x + sa, l1 = l1 * f.y + sb;
        mx0 = n0, mx1 = n1;
        return f;
    };
    auto to_p = [&]() {
#pragma unroll
        for (int i = 0; i < 16; i++)
            p[i] = pack_bf16(s[2 * i], s[2 * i + 1]);
    };

    /* Tile 0 (every warpgroup has keys there); then, at step j, tile j + 1 is loaded into the
     * buffer tile j - 2 left (free: every warpgroup passed the barrier after its last use),
     * the scores of j and p . v of j - 1 go out together, and the softmax of j overlaps the
     * latter. A warpgroup's last step j = nact has only p . v of nact - 1. */
    wg_arrived(0);
    scores(0);
    wg_wait<0>();
    softmax(0);
    to_p();
    for (int j = 1; j <= ntiles; j++) {
        if (j < ntiles) {
            wg_arrived(j);
            if (j + 1 < ntiles)
                wg_kv_tile<HS>(ks, vs, kh, vh, kv, vv, j + 1, t);
            cp_commit();
        }
        if (j < nact) {
            scores(j);
            sum_pv(j - 1);
            wg_wait<1>();
            const float2 f = softmax(j);
            wg_wait<0>();
#pragma unroll
            for (int n = 0; n < 8 * CG; n++) {
                o[n * 4] *= f.x, o[n * 4 + 1] *= f.x;
                o[n * 4 + 2] *= f.y, o[n * 4 + 3] *= f.y;
            }
            to_p();
        } else if (j == nact) {
            wg_fence();
            sum_pv(j - 1);
            wg_wait<0>();
        }
    }

    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    store_acc<HS>(reinterpret_cast<const float(&)[HS / 8][4]>(o),
                  out + (size_t)w.bi * t * c + (size_t)w.h * hs, c, qa, t, hs, 1.0f / l0, 1.0f / l1,
                  tig);
    float *lrow = lse + ((size_t)w.bi * nh + w.h) * t;
    if (tig == 0 && qa < t)
        lrow[qa] = (mx0 + log2f(l0)) / kLog2e;
    if (tig == 0 && qa + 8 < t)
        lrow[qa + 8] = (mx1 + log2f(l1)) / kLog2e;
#endif
}

/* The backward's query pass: a block of two warpgroups owns 128 queries (WgQueries), each
 * warpgroup's 64 over the key tiles up to its last query. k and v tiles come in three
 * buffers: tile j + 1 is loaded while tile j is used. A head of 128 (HS) is two 64-column
 * tiles of each of q, dout, k and v, as in the forward: s and dp walk both, and dq is two
 * accumulators, one a tile of k; one block an SM. */
template <int HS>
__global__ void __launch_bounds__(kWgThreads, HS == 64 ? 2 : 1)
    att_bwd_q_wg_kernel(int t, int c, int nh, View qv, View kv, View vv, View dov, const float *lse,
                        const float *dsum, bf16 *dqkv, float scale, int grp)
{
#ifdef MGPU_WG_BODY
    constexpr int CG = HS / 64; /* tiles of 64 columns a row */
    constexpr int TB = CG * kWgTileBytes;
    extern __shared__ __align__(128) unsigned char tc_smem[];
    unsigned char *base = tc_smem + ((1024 - (smem_addr(tc_smem) & 1023)) & 1023);
    unsigned char *qs = base, *dos = qs + kWgGroups * TB, *ks = dos + kWgGroups * TB,
                  *vs = ks + kWgStages * TB;
    const WgQueries w(t, grp);
    const int tig = w.tig, qa = w.qa, ntiles = w.ntiles, bi = w.bi, h = w.h, hs = c / nh;
    const bf16 *kh = kv.at(bi, h), *vh = vv.at(bi, h);
    const size_t lbase = ((size_t)bi * nh + h) * t;
    const float sl2 = scale * kLog2e;

    wg_tile<kWgQueryRows, kWgThreads, HS>(qs, qv.at(bi, h), qv.ld, w.q0, t);
    wg_tile<kWgQueryRows, kWgThreads, HS>(dos, dov.at(bi, h), dov.ld, w.q0, t);
    wg_kv_tile<HS>(ks, vs, kh, vh, kv, vv, 0, t);
    cp_commit();
    if (ntiles > 1)
        wg_kv_tile<HS>(ks, vs, kh, vh, kv, vv, 1, t);
    cp_commit();
    /* rows past t: ds is not stored; any finite value does */
    const float ls0 = qa < t ? lse[lbase + qa] * kLog2e : 0.0f;
    const float ls1 = qa + 8 < t ? lse[lbase + qa + 8] * kLog2e : 0.0f;
    const float dd0 = qa < t ? dsum[lbase + qa] : 0.0f;
    const float dd1 = qa + 8 < t ? dsum[lbase + qa + 8] : 0.0f;
    float dq[32 * CG], s[32], dp[32];
    uint32_t a[16];
#pragma unroll
    for (int i = 0; i < 32 * CG; i++)
        dq[i] = 0.0f;
    const uint32_t qaddr = smem_addr(qs + w.wg * TB), daddr = smem_addr(dos + w.wg * TB);
    for (int j = 0; j < ntiles; j++) {
        wg_arrived(j);
        if (j > 0) {
            if (j + 1 < ntiles)
                wg_kv_tile<HS>(ks, vs, kh, vh, kv, vv, j + 1, t);
            cp_commit();
        }
        if (j >= w.nact)
            continue;
        const uint32_t kaddr = smem_addr(ks + (j % kWgStages) * TB),
                       vaddr = smem_addr(vs + (j % kWgStages) * TB);
        wg_fence();
        wg_ss_head<HS>(s, qaddr, kaddr);
        wg_ss_head<HS>(dp, daddr, vaddr);
        wg_commit();
        wg_wait<0>();
        const int k0 = j * kWgRows;
        const bool masked = k0 + kWgRows - 1 > w.wrow0; /* keys past the warp's first query */
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = k0 + n * 8 + 2 * tig + (e & 1), r = e >> 1;
                const float p = !masked || key <= qa + r * 8
                                    ? ex2(fmaf(s[n * 4 + e], sl2, r ? -ls1 : -ls0))
                                    : 0.0f;
                s[n * 4 + e] = p * (dp[n * 4 + e] - (r ? dd1 : dd0));
            }
#pragma unroll
        for (int i = 0; i < 16; i++)
            a[i] = pack_bf16(s[2 * i], s[2 * i + 1]);
        wg_fence();
        wg_rs_head<HS>(dq, a, kaddr);
        wg_commit();
        wg_wait<0>();
    }
    store_acc<HS>(reinterpret_cast<const float(&)[HS / 8][4]>(dq),
                  dqkv + (size_t)bi * t * 3 * c + (size_t)h * hs, 3 * (size_t)c, qa, t, hs, scale,
                  scale, tig);
#endif
}

/* The backward's key pass: a block is one warpgroup's 64 keys (first keys first: they have the
 * most queries) over the query tiles from its first key on. Queries past t read zeros (q,
 * dout, lse, D), so their p is 1 and their terms are 0. A head of 128 (HS) is two 64-column
 * tiles of each of k, v, q and dout: s^T and dp^T walk both, dk and dv are two accumulators
 * each, one a tile of q or dout; two stages of q and dout instead of three, so that two blocks
 * share an SM (98 KB of shared memory and up to 255 registers a thread each). */
template <int HS>
__global__ void __launch_bounds__(128, HS == 64 ? 3 : 2)
    att_bwd_kv_wg_kernel(int t, int c, int nh, View qv, View kv, View vv, View dov,
                         const float *lse, const float *dsum, bf16 *dqkv, float scale, int grp)
{
#ifdef MGPU_WG_BODY
    constexpr int CG = HS / 64, TB = CG * kWgTileBytes, KS = wg_kv_stages(HS);
    extern __shared__ __align__(128) unsigned char tc_smem[];
    unsigned char *base = tc_smem + ((1024 - (smem_addr(tc_smem) & 1023)) & 1023);
    unsigned char *ks = base, *vs = ks + TB, *qs = vs + TB, *dos = qs + KS * TB;
    float *lsm = reinterpret_cast<float *>(dos + KS * TB), *dsm = lsm + KS * kWgRows;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
    int i, h, bi;
    wg_place(grp, i, h, bi);
    const int hs = c / nh;
    const bf16 *qh = qv.at(bi, h), *doh = dov.at(bi, h);
    const size_t lbase = ((size_t)bi * nh + h) * t;
    const int k0 = i * kWgRows, wrow0 = k0 + warp * 16, ka = wrow0 + g;
    const float sl2 = scale * kLog2e;
    const int ntiles = (t - k0 + kWgRows - 1) / kWgRows;
    auto load_q = [&](int j) { /* query tile j, its lse and D, into buffer j % stages */
                               const int b = j % KS, q0 = k0 + j * kWgRows;
                               wg_tile<kWgRows, 128, HS>(qs + b * TB, qh, qv.ld, q0, t);
                               wg_tile<kWgRows, 128, HS>(dos + b * TB, doh, dov.ld, q0, t);
                               if (threadIdx.x < kWgRows) {
                                   const int qi = q0 + threadIdx.x;
                                   const bool in = qi < t;
                                   cp_async4(lsm + b * kWgRows + threadIdx.x,
                                             lse + lbase + (in ? qi : 0), in);
                                   cp_async4(dsm + b * kWgRows + threadIdx.x,
                                             dsum + lbase + (in ? qi : 0), in);
                               }
    };

    wg_tile<kWgRows, 128, HS>(ks, kv.at(bi, h), kv.ld, k0, t);
    wg_tile<kWgRows, 128, HS>(vs, vv.at(bi, h), vv.ld, k0, t);
    load_q(0);
    cp_commit();
    if (ntiles > 1)
        load_q(1);
    cp_commit();
    float dk[32 * CG], dv[32 * CG], s[32], dp[32];
    uint32_t ap[16], ad[16];
#pragma unroll
    for (int i = 0; i < 32 * CG; i++)
        dk[i] = dv[i] = 0.0f;
    const uint32_t kaddr = smem_addr(ks), vaddr = smem_addr(vs);
    for (int j = 0; j < ntiles; j++) {
        /* (with two stages, tile j + 1 takes the buffer of tile j - 1, free past the barrier) */
        wg_arrived(j);
        if (j > 0) {
            if (j + 1 < ntiles)
                load_q(j + 1);
            cp_commit();
        }
        const int q0 = k0 + j * kWgRows, b = j % KS;
        const uint32_t qaddr = smem_addr(qs + b * TB), daddr = smem_addr(dos + b * TB);
        const float *lt = lsm + b * kWgRows, *dt = dsm + b * kWgRows;
        wg_fence();
        wg_ss_head<HS>(s, kaddr, qaddr);  /* s^T: keys x queries */
        wg_ss_head<HS>(dp, vaddr, daddr); /* dp^T */
        wg_commit();
        wg_wait<0>();
        const bool masked = q0 < wrow0 + 15; /* queries before the warp's last key */
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int col = n * 8 + 2 * tig + (e & 1), key = ka + (e >> 1) * 8;
                const float p = !masked || key <= q0 + col
                                    ? ex2(fmaf(s[n * 4 + e], sl2, -lt[col] * kLog2e))
                                    : 0.0f;
                s[n * 4 + e] = p;
                dp[n * 4 + e] = p * (dp[n * 4 + e] - dt[col]);
            }
#pragma unroll
        for (int i = 0; i < 16; i++) {
            ap[i] = pack_bf16(s[2 * i], s[2 * i + 1]);
            ad[i] = pack_bf16(dp[2 * i], dp[2 * i + 1]);
        }
        wg_fence();
        wg_rs_head<HS>(dv, ap, daddr); /* dv += p^T . dout */
        wg_rs_head<HS>(dk, ad, qaddr); /* dk += ds^T . q */
        wg_commit();
        wg_wait<0>();
    }
    bf16 *rows = dqkv + (size_t)bi * t * 3 * c + (size_t)h * hs;
    store_acc<HS>(reinterpret_cast<const float(&)[HS / 8][4]>(dk), rows + c, 3 * (size_t)c, ka, t,
                  hs, scale, scale, tig);
    store_acc<HS>(reinterpret_cast<const float(&)[HS / 8][4]>(dv), rows + 2 * (size_t)c,
                  3 * (size_t)c, ka, t, hs, 1.0f, 1.0f, tig);
#endif
}

} /* namespace */

bool gpt16_attention_wg_ok(const cuda_impl *ci, int hs)
{
#ifdef MGPU_HAVE_WGMMA
    return (hs == 64 || hs == 128) && ci->cc == 90 && !ci->opt.wgmma_off;
#else
    (void)ci, (void)hs;
    return false;
#endif
}

/* wg_place's grp for a launch over pairs (batch row, head) pairs. The forward runs its tiles
 * longest first over all heads at a head size of 64 (measured on an H100 at GPT-2 124M's
 * shape: 0.107 ms against 0.117 head by head; at context 2048 0.183 against 0.207) and in
 * groups of 16 heads at 128 (0.104 against 0.114, and 0.112 over all heads); the backward's
 * passes, which run side by side, keep one head after another (longest first over all heads:
 * 0.306 ms against 0.292). MGPU_GPT_ATT_GROUP_FWD and MGPU_GPT_ATT_GROUP_BWD set the group
 * (options.h; 0: head by head). */
static int wg_group(const cuda_impl *ci, bool fwd, int hs, int pairs)
{
    const int e = fwd ? ci->opt.att_group_fwd : ci->opt.att_group_bwd;
    const int grp = e >= 0 ? e : !fwd ? 0 : hs == 64 ? pairs : 16;
    return grp < pairs ? grp : pairs;
}

int gpt16_attention_forward_wg(cuda_impl *ci, int b, int t, int c, int nh, const bf16 *qkv,
                               bf16 *out, float *lse, float scale, mgpu_err_t *err)
{
    const int hs = c / nh;
    const size_t smem = wg_smem_fwd(hs), ld = 3 * (size_t)c;
    auto kern = hs == 128 ? att_fwd_wg_kernel<128> : att_fwd_wg_kernel<64>;
    int rc = prepare(kern, smem, err);
    if (rc < 0)
        return rc;
    dim3 grid((unsigned)((t + kWgQueryRows - 1) / kWgQueryRows), (unsigned)nh, (unsigned)b);
    kern<<<grid, kWgThreads, smem, ci->stream>>>(
        t, c, nh, row_view(qkv, t, ld, hs), row_view(qkv + c, t, ld, hs),
        row_view(qkv + 2 * (size_t)c, t, ld, hs), out, lse, scale, wg_group(ci, true, hs, b * nh));
    CUDA_CHECK_LAUNCH(err, "att_fwd_wg_kernel (b=%d t=%d c=%d nh=%d)", b, t, c, nh);
    return 0;
}

template <int HS> static int backward_wg_prepare(mgpu_err_t *err)
{
    int rc = prepare(att_bwd_q_wg_kernel<HS>, wg_smem_q(HS), err);
    return rc < 0 ? rc : prepare(att_bwd_kv_wg_kernel<HS>, wg_smem_kv(HS), err);
}

int gpt16_attention_backward_wg_prepare(int hs, mgpu_err_t *err)
{
    return hs == 128 ? backward_wg_prepare<128>(err) : backward_wg_prepare<64>(err);
}

cudaError_t gpt16_attention_backward_wg_launch(const cuda_impl *ci, bool key_pass,
                                               cudaStream_t stream, int b, int t, int c, int nh,
                                               const bf16 *qkv, const bf16 *dout, const float *lse,
                                               const float *dsum, bf16 *dqkv, float scale)
{
    const size_t ld = 3 * (size_t)c;
    const int hs = c / nh, grp = wg_group(ci, false, hs, b * nh);
    const View qv = row_view(qkv, t, ld, hs), kv = row_view(qkv + c, t, ld, hs),
               vv = row_view(qkv + 2 * (size_t)c, t, ld, hs),
               dov = row_view(dout, t, (size_t)c, hs);
    if (key_pass) {
        dim3 grid((unsigned)((t + kWgRows - 1) / kWgRows), (unsigned)nh, (unsigned)b);
        auto kern = hs == 128 ? att_bwd_kv_wg_kernel<128> : att_bwd_kv_wg_kernel<64>;
        kern<<<grid, 128, wg_smem_kv(hs), stream>>>(t, c, nh, qv, kv, vv, dov, lse, dsum, dqkv,
                                                    scale, grp);
    } else {
        dim3 grid((unsigned)((t + kWgQueryRows - 1) / kWgQueryRows), (unsigned)nh, (unsigned)b);
        auto kern = hs == 128 ? att_bwd_q_wg_kernel<128> : att_bwd_q_wg_kernel<64>;
        kern<<<grid, kWgThreads, wg_smem_q(hs), stream>>>(t, c, nh, qv, kv, vv, dov, lse, dsum,
                                                          dqkv, scale, grp);
    }
    return cudaGetLastError();
}

} /* namespace mgpu_cuda */
