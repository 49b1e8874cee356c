/* gpt_attention_x3.cu - the fp32 and tf32 precisions' causal attention (gpt_attention.cu's
 * ops, the same arguments and results) on tensor cores, each product in three TF32 products
 * (3xTF32): an operand x is split into big = tf32(x) and small = x - big (of which the tensor
 * cores read 10 bits of mantissa), and a . b is a_small . b_big + a_big . b_small + a_big . b_big,
 * accumulated in fp32. The term left out (a_small . b_small) is about 2^-20 of the product:
 * the result is within the rounding an fp32 sum of 64 products has anyway, at tensor-core speed (PyTorch's fp32 attention does the same:
 * its memory-efficient kernel multiplies fp32 with CUTLASS's OpMultiplyAddFastF32, 3xTF32,
 * from compute capability 8.0 on).
 *
 * FlashAttention-2's structure, as gpt_attention_tc.cu's: a block of four warps owns 64 rows
 * (queries; keys in the key pass), 16 a warp, and walks the other side in tiles of T rows in
 * fp32 in shared memory, two buffers brought by cp.async (the next tile arrives while the warps
 * work on this one). Operands are split as their fragments are loaded, with integer operations
 * (split() below). Rows are padded to LD = HS + 4 floats: the fragment loads of m16n8k8 (a
 * row's word t, or word g of row 2t) then fall on 32 different banks.
 *
 * The second product of each pair takes the first's result as its A operand straight from the
 * accumulator registers: a lane holds the scores (row g, keys 2t and 2t + 1) and A's layout
 * wants (row g, k = t and t + 4), so k = t stands for key 2t and k = t + 4 for key 2t + 1, and
 * the B operand's rows are read in that order (word g of rows 2t and 2t + 1 of the tile).
 *
 * The backward is two kernels as gpt_attention.cu's: the query pass (D = rowsum(dout * out),
 * then dq) and the key pass (dk, dv), each recomputing the probabilities from q, k and lse.
 * Every sum has a fixed order (no atomics): results are the same from run to run. */
#include "gpt_cuda_impl.h" /* cuda_impl, ex2, kLog2e, the ops' declarations */
#include "cuda_check.h"    /* CUDA_CHECK, CUDA_CHECK_LAUNCH */

#include <stdint.h>    /* uint32_t */
#include <type_traits> /* std::integral_constant */

namespace mgpu_cuda
{
namespace
{

constexpr int kX3Warps = 4;
constexpr int kX3Threads = 32 * kX3Warps;
constexpr int kX3Rows = 16 * kX3Warps; /* rows a block owns */

/* LD: a tile's row stride in floats. TF, TB: the tile of the other side in the forward and in
 * the backward (keys; queries in the key pass), in two buffers (the next arrives by cp.async
 * while the warps work on this one). At heads of 128 the backward's tiles are half the
 * forward's, so that two of its blocks fit an SM's shared memory and registers. QREG:
 * the forward keeps q's split fragments in registers (HS / 2 words a lane) instead of a tile. */
template <int HS> struct X3 {
    static constexpr int LD = HS + 4;
    static constexpr int TF = HS <= 64 ? 64 : 32;
    static constexpr int TB = HS <= 64 ? 64 : 16;
    static constexpr bool QREG = HS <= 64;
    __host__ __device__ static constexpr int tile(int rows) { return rows * LD; } /* floats */
};

/* Blocks an SM is asked to hold (ptxas's register budget): what shared memory allows. */
template <int HS> constexpr int kX3FwdBlocks = HS <= 64 ? 3 : 2;
template <int HS> constexpr int kX3BwdBlocks = 2;

/* x = big + small: big is x rounded to TF32's 10 bits of mantissa (to nearest, ties away from
 * zero: add half of the dropped part, then clear it), small the rest, exact in fp32, of which
 * the tensor cores read the top 10 bits (they ignore the low 13 of a TF32 operand). Integer
 * operations at full rate, where cvt.rna.tf32.f32 runs on the slower conversion unit: with the
 * operands split as they are loaded, that unit was the backward's bottleneck. Finite x only
 * (scores past the causal mask are never split). */
__device__ __forceinline__ void split(float x, uint32_t &big, uint32_t &small)
{
    big = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
    small = __float_as_uint(x - __uint_as_float(big));
}

__device__ __forceinline__ void mma1688(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* An operand split: [0] big, [1] small. */
struct FragA {
    uint32_t v[2][4];
};
struct FragB {
    uint32_t v[2][2];
};

__device__ __forceinline__ void split_a(FragA &f, float x0, float x1, float x2, float x3)
{
    split(x0, f.v[0][0], f.v[1][0]);
    split(x1, f.v[0][1], f.v[1][1]);
    split(x2, f.v[0][2], f.v[1][2]);
    split(x3, f.v[0][3], f.v[1][3]);
}

__device__ __forceinline__ void split_b(FragB &f, float x0, float x1)
{
    split(x0, f.v[0][0], f.v[1][0]);
    split(x1, f.v[0][1], f.v[1][1]);
}

/* d += a . b in three products, the small terms first. */
__device__ __forceinline__ void mma3(float (&d)[4], const FragA &a, const FragB &b)
{
    mma1688(d, a.v[1], b.v[0][0], b.v[0][1]);
    mma1688(d, a.v[0], b.v[1][0], b.v[1][1]);
    mma1688(d, a.v[0], b.v[0][0], b.v[0][1]);
}

/* A's fragment of a tile's rows r0 .. r0 + 15, columns k0 .. k0 + 7. */
template <int HS>
__device__ __forceinline__ void frag_a(FragA &f, const float *tile, int r0, int k0, int g,
                                       int tig)
{
    constexpr int LD = X3<HS>::LD;
    const float *s = tile + (r0 + g) * LD + k0 + tig;
    split_a(f, s[0], s[8 * LD], s[4], s[8 * LD + 4]);
}

/* The same from global memory: rows r0 + g (+ 8) of src (row stride ld), zeros past t and hs. */
__device__ __forceinline__ void frag_a_global(FragA &f, const float *src, size_t ld, int r0,
                                              int k0, int t, int hs, int g, int tig)
{
    float x[4];
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const int r = r0 + g + (e & 1) * 8, d = k0 + tig + (e >> 1) * 4;
        x[e] = r < t && d < hs ? src[(size_t)r * ld + d] : 0.0f;
    }
    split_a(f, x[0], x[1], x[2], x[3]);
}

/* B's fragment for B = tile^T: columns n0 .. n0 + 7 are the tile's rows, k0 .. k0 + 7 its
 * columns. */
template <int HS>
__device__ __forceinline__ void frag_bt(FragB &f, const float *tile, int n0, int k0, int g,
                                        int tig)
{
    constexpr int LD = X3<HS>::LD;
    const float *s = tile + (n0 + g) * LD + k0 + tig;
    split_b(f, s[0], s[4]);
}

/* B's fragment for B = the tile's rows 8j .. 8j + 7 (in the order above: k = t is row 2t,
 * k = t + 4 row 2t + 1), columns n0 .. n0 + 7. */
template <int HS>
__device__ __forceinline__ void frag_bp(FragB &f, const float *tile, int j, int n0, int g, int tig)
{
    constexpr int LD = X3<HS>::LD;
    const float *s = tile + (8 * j + 2 * tig) * LD + n0 + g;
    split_b(f, s[0], s[LD]);
}

/* A's fragment from an accumulator's registers (rows g, g + 8; columns 2t, 2t + 1). */
__device__ __forceinline__ void frag_acc(FragA &f, const float (&c)[4])
{
    split_a(f, c[0], c[2], c[1], c[3]);
}

__device__ __forceinline__ void cp16(float *dst, const float *src, bool valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(
                     (unsigned)__cvta_generic_to_shared(dst)),
                 "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}

__device__ __forceinline__ void cp_commit_x3()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

__device__ __forceinline__ void cp_wait_x3_1()
{
    asm volatile("cp.async.wait_group 1;\n" ::: "memory");
}

/* Rows r0 .. r0 + ROWS - 1 of src (row stride ld, hs floats a row) into a tile: zeros past hs
 * and for rows >= t. The whole block takes part. vec (hs % 4 == 0, 16-byte rows): by cp.async,
 * whose group the caller commits and waits for; else by plain loads. */
template <int HS, int ROWS>
__device__ __forceinline__ void load_tile(float *tile, const float *src, size_t ld, int r0, int t,
                                          int hs, bool vec)
{
    constexpr int Q = HS / 4, LD = X3<HS>::LD;
    for (int i = threadIdx.x; i < ROWS * Q; i += kX3Threads) {
        const int r = i / Q, d = (i % Q) * 4;
        float *dst = tile + r * LD + d;
        const bool in = r0 + r < t && d < hs;
        const float *p = in ? src + (size_t)(r0 + r) * ld + d : src;
        if (vec) {
            cp16(dst, p, in);
        } else {
#pragma unroll
            for (int e = 0; e < 4; e++)
                dst[e] = in && d + e < hs ? p[e] : 0.0f;
        }
    }
}

/* acc (rows g and g + 8 of 16 from r0, HS / 8 tiles of 8 columns) * mul into dst's rows, the
 * first hs columns, rows below t only. */
template <int HS>
__device__ __forceinline__ void store_rows(const float (&acc)[HS / 8][4], float *dst, size_t ld,
                                           int r0, int t, int hs, float mul_a, float mul_b, int g,
                                           int tig)
{
#pragma unroll
    for (int n = 0; n < HS / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = r0 + g + (e >> 1) * 8, d = n * 8 + 2 * tig + (e & 1);
            if (r < t && d < hs)
                dst[(size_t)r * ld + d] = acc[n][e] * ((e >> 1) ? mul_b : mul_a);
        }
}

template <int N> __device__ __forceinline__ void zero(float (&a)[N][4])
{
#pragma unroll
    for (int n = 0; n < N; n++)
        a[n][0] = a[n][1] = a[n][2] = a[n][3] = 0.0f;
}

/* k's and v's rows r0 .. r0 + T - 1 of a (batch row, head)'s qkv rows (base: its q columns)
 * into buffer b: k, then v. */
template <int HS, int T>
__device__ __forceinline__ void load_kv(float *b, const float *base, int c, size_t c3, int r0,
                                        int t, int hs, bool vec)
{
    load_tile<HS, T>(b, base + c, c3, r0, t, hs, vec);
    load_tile<HS, T>(b + X3<HS>::tile(T), base + 2 * (size_t)c, c3, r0, t, hs, vec);
}

/* The forward's and the query pass's walk over k and v, two buffers at smem: starts tile j + 1
 * into the other buffer, waits for tile j (the previous call's) and the block; returns tile
 * j's buffer (k, then v). */
template <int HS, int T>
__device__ __forceinline__ const float *kv_next(float *smem, const float *base, int c, size_t c3,
                                                int j, int ntiles, int t, int hs, bool vec)
{
    if (j + 1 < ntiles)
        load_kv<HS, T>(smem + ((j + 1) & 1) * 2 * X3<HS>::tile(T), base, c, c3, (j + 1) * T, t,
                       hs, vec);
    cp_commit_x3();
    cp_wait_x3_1(); /* tile j is in */
    __syncthreads();
    return smem + (j & 1) * 2 * X3<HS>::tile(T);
}

/* The backward's two products of a tile, 16 rows from w0 of a1 and a2 against the tile's T
 * rows of b1 and b2, over HS columns: s = a1 . b1^T and dp = a2 . b2^T (the query pass: q
 * and dout against k and v; the key pass: k and v against q and dout). */
template <int HS, int T>
__device__ __forceinline__ void two_products(float (&s)[T / 8][4], float (&dp)[T / 8][4],
                                             const float *a1, const float *a2, const float *b1,
                                             const float *b2, int w0, int g, int tig)
{
    zero(s);
    zero(dp);
#pragma unroll
    for (int kk = 0; kk < HS / 8; kk++) {
        FragA x1, x2;
        frag_a<HS>(x1, a1, w0, 8 * kk, g, tig);
        frag_a<HS>(x2, a2, w0, 8 * kk, g, tig);
#pragma unroll
        for (int n = 0; n < T / 8; n++) {
            FragB y1, y2;
            frag_bt<HS>(y1, b1, 8 * n, 8 * kk, g, tig);
            frag_bt<HS>(y2, b2, 8 * n, 8 * kk, g, tig);
            mma3(s[n], x1, y1);
            mma3(dp[n], x2, y2);
        }
    }
}

/* Forward: blocks launched last queries first (they have the most keys). */
template <int HS>
__global__ void __launch_bounds__(kX3Threads, kX3FwdBlocks<HS>)
    att_fwd_x3_kernel(int t, int c, int nh, const float *qkv, float *out, float *lse, float scale,
                      bool vec)
{
    using L = X3<HS>;
    constexpr int T = L::TF;
    extern __shared__ __align__(16) float x3_smem[];
    float *qt = x3_smem + 4 * L::tile(T); /* k and v of buffer i at 2 i tiles; q's (!QREG) */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
    const int h = blockIdx.y, bi = blockIdx.z, hs = c / nh;
    const size_t c3 = 3 * (size_t)c;
    const float *base = qkv + (size_t)bi * t * c3 + (size_t)h * hs;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * kX3Rows;
    const int w0 = warp * 16, wfirst = q0 + w0, wlast = wfirst + 15;
    const float sl2 = scale * kLog2e;
    const int ntiles = (min(t, q0 + kX3Rows) + T - 1) / T;

    load_kv<HS, T>(x3_smem, base, c, c3, 0, t, hs, vec);
    cp_commit_x3();
    FragA qf[L::QREG ? HS / 8 : 1];
    if constexpr (L::QREG) {
#pragma unroll
        for (int kk = 0; kk < HS / 8; kk++)
            frag_a_global(qf[kk], base, c3, wfirst, 8 * kk, t, hs, g, tig);
    } else {
        load_tile<HS, kX3Rows>(qt, base, c3, q0, t, hs, false);
    }
    float o[HS / 8][4];
    zero(o);
    float mx[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}; /* rows g, g + 8 */

    for (int j = 0; j < ntiles; j++) {
        const int k0 = j * T;
        const float *kt = kv_next<HS, T>(x3_smem, base, c, c3, j, ntiles, t, hs, vec);
        const float *vt = kt + L::tile(T);
        if (k0 <= wlast) { /* else every key of the tile comes after the warp's queries */
            float s[T / 8][4];
            zero(s);
#pragma unroll
            for (int kk = 0; kk < HS / 8; kk++) {
                FragA a;
                if constexpr (L::QREG)
                    a = qf[kk];
                else
                    frag_a<HS>(a, qt, w0, 8 * kk, g, tig);
#pragma unroll
                for (int n = 0; n < T / 8; n++) {
                    FragB bk;
                    frag_bt<HS>(bk, kt, 8 * n, 8 * kk, g, tig);
                    mma3(s[n], a, bk);
                }
            }
            /* causal mask (only where the tile has keys past the warp's first query); the
             * scores stay unscaled until the exponent's fma. Key 0 is in every row's first
             * tile: the maxima are finite from then on. */
            float rx[2] = {-INFINITY, -INFINITY};
            const bool masked = k0 + T - 1 > wfirst;
#pragma unroll
            for (int n = 0; n < T / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int key = k0 + n * 8 + 2 * tig + (e & 1), q = wfirst + g + (e >> 1) * 8;
                    if (masked && key > q)
                        s[n][e] = -INFINITY;
                    rx[e >> 1] = fmaxf(rx[e >> 1], s[n][e]);
                }
            float nx[2], cr[2];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                rx[r] = fmaxf(rx[r], __shfl_xor_sync(0xffffffffu, rx[r], 1));
                rx[r] = fmaxf(rx[r], __shfl_xor_sync(0xffffffffu, rx[r], 2));
                nx[r] = fmaxf(mx[r], rx[r] * sl2);
                cr[r] = ex2(mx[r] - nx[r]);
                mx[r] = nx[r];
            }
            float sa = 0.0f, sb = 0.0f;
#pragma unroll
            for (int n = 0; n < T / 8; n++) {
                s[n][0] = ex2(fmaf(s[n][0], sl2, -nx[0]));
                s[n][1] = ex2(fmaf(s[n][1], sl2, -nx[0]));
                s[n][2] = ex2(fmaf(s[n][2], sl2, -nx[1]));
                s[n][3] = ex2(fmaf(s[n][3], sl2, -nx[1]));
                sa += s[n][0] + s[n][1];
                sb += s[n][2] + s[n][3];
            }
            l[0] = l[0] * cr[0] + sa; /* the lane's part; the row's is summed at the end */
            l[1] = l[1] * cr[1] + sb;
#pragma unroll
            for (int n = 0; n < HS / 8; n++) {
                o[n][0] *= cr[0], o[n][1] *= cr[0];
                o[n][2] *= cr[1], o[n][3] *= cr[1];
            }
#pragma unroll
            for (int jj = 0; jj < T / 8; jj++) {
                if (k0 + 8 * jj > wlast)
                    break; /* keys past every query of the warp: p is 0 */
                FragA p;
                frag_acc(p, s[jj]);
#pragma unroll
                for (int n = 0; n < HS / 8; n++) {
                    FragB bv;
                    frag_bp<HS>(bv, vt, jj, 8 * n, g, tig);
                    mma3(o[n], p, bv);
                }
            }
        }
        __syncthreads(); /* every warp is done with buffer j & 1, which tile j + 2 takes */
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    store_rows<HS>(o, out + (size_t)bi * t * c + (size_t)h * hs, c, wfirst, t, hs, 1.0f / l[0],
                   1.0f / l[1], g, tig);
    float *lrow = lse + ((size_t)bi * nh + h) * t;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int q = wfirst + g + 8 * r;
        if (tig == 0 && q < t)
            lrow[q] = (mx[r] + log2f(l[r])) / kLog2e;
    }
}

/* The query pass: D of the block's rows, then dq = scale * sum over keys of ds k, with
 * ds = p (dp - D), dp = dout v^T. */
template <int HS>
__global__ void __launch_bounds__(kX3Threads, kX3BwdBlocks<HS>)
    att_bwd_q_x3_kernel(int t, int c, int nh, const float *dout, const float *qkv,
                        const float *out, const float *lse, float *dqkv, float *dsum, float scale,
                        bool vec)
{
    using L = X3<HS>;
    constexpr int T = L::TB;
    extern __shared__ __align__(16) float x3_smem[];
    float *qt = x3_smem + 4 * L::tile(T), *dt = qt + L::tile(kX3Rows);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
    const int h = blockIdx.y, bi = blockIdx.z, hs = c / nh;
    const size_t c3 = 3 * (size_t)c;
    const float *base = qkv + (size_t)bi * t * c3 + (size_t)h * hs;
    const float *dbase = dout + (size_t)bi * t * c + (size_t)h * hs;
    const float *obase = out + (size_t)bi * t * c + (size_t)h * hs;
    const size_t lbase = ((size_t)bi * nh + h) * t;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * kX3Rows;
    const int w0 = warp * 16, wfirst = q0 + w0, wlast = wfirst + 15;
    const float sl2 = scale * kLog2e;
    const int ntiles = (min(t, q0 + kX3Rows) + T - 1) / T;

    load_tile<HS, kX3Rows>(qt, base, c3, q0, t, hs, vec);
    load_tile<HS, kX3Rows>(dt, dbase, c, q0, t, hs, vec);
    load_kv<HS, T>(x3_smem, base, c, c3, 0, t, hs, vec);
    cp_commit_x3();
    /* D: two threads a row, then the pair's sum */
    {
        const int r = threadIdx.x >> 1, q = q0 + r;
        float d = 0.0f;
        if (q < t)
            for (int i = threadIdx.x & 1; i < hs; i += 2)
                d = fmaf(dbase[(size_t)q * c + i], obase[(size_t)q * c + i], d);
        d += __shfl_xor_sync(0xffffffffu, d, 1);
        if ((threadIdx.x & 1) == 0 && q < t)
            dsum[lbase + q] = d;
    }
    __syncthreads(); /* D's writes: each lane reads its own rows' back */
    float ll[2], dd[2]; /* rows g, g + 8: lse in log2 units (inf past t: p = 0), D */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int q = wfirst + g + 8 * r;
        ll[r] = q < t ? lse[lbase + q] * kLog2e : INFINITY;
        dd[r] = q < t ? dsum[lbase + q] : 0.0f;
    }
    float dq[HS / 8][4];
    zero(dq);
    for (int j = 0; j < ntiles; j++) {
        const int k0 = j * T;
        const float *kt = kv_next<HS, T>(x3_smem, base, c, c3, j, ntiles, t, hs, vec);
        const float *vt = kt + L::tile(T);
        if (k0 <= wlast) {
            float s[T / 8][4], dp[T / 8][4];
            two_products<HS, T>(s, dp, qt, dt, kt, vt, w0, g, tig);
#pragma unroll
            for (int n = 0; n < T / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int key = k0 + n * 8 + 2 * tig + (e & 1), q = wfirst + g + (e >> 1) * 8;
                    const float p = key <= q ? ex2(fmaf(s[n][e], sl2, -ll[e >> 1])) : 0.0f;
                    s[n][e] = p * (dp[n][e] - dd[e >> 1]); /* ds */
                }
#pragma unroll
            for (int jj = 0; jj < T / 8; jj++) {
                if (k0 + 8 * jj > wlast)
                    break;
                FragA a;
                frag_acc(a, s[jj]);
#pragma unroll
                for (int n = 0; n < HS / 8; n++) {
                    FragB bk;
                    frag_bp<HS>(bk, kt, jj, 8 * n, g, tig);
                    mma3(dq[n], a, bk);
                }
            }
        }
        __syncthreads();
    }
    store_rows<HS>(dq, dqkv + (size_t)bi * t * c3 + (size_t)h * hs, c3, wfirst, t, hs, scale,
                   scale, g, tig);
}

/* The key pass: blocks first keys first (they have the most queries); dv = sum over queries
 * of p^T dout, dk = scale * sum of ds^T q. A buffer: q's tile, dout's, then lse (log2 units)
 * and D of its queries. */
template <int HS>
__global__ void __launch_bounds__(kX3Threads, kX3BwdBlocks<HS>)
    att_bwd_kv_x3_kernel(int t, int c, int nh, const float *dout, const float *qkv,
                         const float *lse, const float *dsum, float *dqkv, float scale, bool vec)
{
    using L = X3<HS>;
    constexpr int T = L::TB, BUF = 2 * L::tile(T) + 2 * T;
    extern __shared__ __align__(16) float x3_smem[];
    float *kt = x3_smem + 2 * BUF, *vt = kt + L::tile(kX3Rows);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
    const int h = blockIdx.y, bi = blockIdx.z, hs = c / nh;
    const size_t c3 = 3 * (size_t)c;
    const float *base = qkv + (size_t)bi * t * c3 + (size_t)h * hs;
    const float *dbase = dout + (size_t)bi * t * c + (size_t)h * hs;
    const size_t lbase = ((size_t)bi * nh + h) * t;
    const int k0 = blockIdx.x * kX3Rows;
    const int w0 = warp * 16, wfirst = k0 + w0; /* the warp's first key */
    const float sl2 = scale * kLog2e;
    const int ntiles = (t - k0 + T - 1) / T;

    auto load_buf = [&](int i, int qs) {
        float *b = x3_smem + (i & 1) * BUF;
        load_tile<HS, T>(b, base, c3, qs, t, hs, vec);
        load_tile<HS, T>(b + L::tile(T), dbase, c, qs, t, hs, vec);
        for (int r = threadIdx.x; r < T; r += kX3Threads) {
            const bool in = qs + r < t;
            b[2 * L::tile(T) + r] = in ? lse[lbase + qs + r] * kLog2e : INFINITY;
            b[2 * L::tile(T) + T + r] = in ? dsum[lbase + qs + r] : 0.0f;
        }
    };
    load_tile<HS, kX3Rows>(kt, base + c, c3, k0, t, hs, vec);
    load_tile<HS, kX3Rows>(vt, base + 2 * (size_t)c, c3, k0, t, hs, vec);
    load_buf(0, k0);
    cp_commit_x3();
    float dk[HS / 8][4], dv[HS / 8][4];
    zero(dk);
    zero(dv);
    for (int j = 0; j < ntiles; j++) {
        const int qs = k0 + j * T;
        if (j + 1 < ntiles)
            load_buf(j + 1, qs + T);
        cp_commit_x3();
        cp_wait_x3_1();
        __syncthreads();
        const float *qt = x3_smem + (j & 1) * BUF, *dt = qt + L::tile(T);
        const float *ls = dt + L::tile(T), *ds = ls + T;
        if (qs + T - 1 >= wfirst) { /* else every query of the tile comes before the keys */
            float s[T / 8][4], dp[T / 8][4];
            two_products<HS, T>(s, dp, kt, vt, qt, dt, w0, g, tig);
            /* s[n] = p^T and dp[n] = ds^T: rows keys (g, g + 8), columns queries */
#pragma unroll
            for (int n = 0; n < T / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int qi = n * 8 + 2 * tig + (e & 1), key = wfirst + g + (e >> 1) * 8;
                    const float p = qs + qi >= key ? ex2(fmaf(s[n][e], sl2, -ls[qi])) : 0.0f;
                    s[n][e] = p;
                    dp[n][e] = p * (dp[n][e] - ds[qi]);
                }
#pragma unroll
            for (int jj = 0; jj < T / 8; jj++) {
                if (qs + 8 * jj + 7 < wfirst)
                    continue; /* queries before every key of the warp: p is 0 */
                FragA ap, ad;
                frag_acc(ap, s[jj]);
                frag_acc(ad, dp[jj]);
#pragma unroll
                for (int n = 0; n < HS / 8; n++) {
                    FragB bd, bq;
                    frag_bp<HS>(bd, dt, jj, 8 * n, g, tig);
                    frag_bp<HS>(bq, qt, jj, 8 * n, g, tig);
                    mma3(dv[n], ap, bd);
                    mma3(dk[n], ad, bq);
                }
            }
        }
        __syncthreads();
    }
    float *row = dqkv + (size_t)bi * t * c3 + (size_t)h * hs;
    store_rows<HS>(dk, row + c, c3, wfirst, t, hs, scale, scale, g, tig);
    store_rows<HS>(dv, row + 2 * (size_t)c, c3, wfirst, t, hs, 1.0f, 1.0f, g, tig);
}

template <class Fn> int with_x3_hs(int hs, Fn fn)
{
    if (hs <= 32)
        return fn(std::integral_constant<int, 32>());
    if (hs <= 64)
        return fn(std::integral_constant<int, 64>());
    return fn(std::integral_constant<int, 128>());
}

template <class K> int x3_prepare(K kern, size_t smem, mgpu_err_t *err)
{
    /* more than the default 48 KiB of dynamic shared memory must be asked for */
    if (smem > 48 * 1024)
        CUDA_CHECK(err, cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)smem));
    return 0;
}

} /* namespace */

bool gpt_attention_x3_ok(const cuda_impl *ci)
{
    return ci->cc >= 80 && !ci->opt.x3_off;
}

int gpt_attention_forward_x3(cuda_impl *ci, int b, int t, int c, int nh, const float *qkv,
                             float *out, float *lse, float scale, bool vec, mgpu_err_t *err)
{
    return with_x3_hs(c / nh, [&](auto hc) {
        constexpr int HS = decltype(hc)::value;
        using L = X3<HS>;
        const size_t smem = sizeof(float) * (4 * L::tile(L::TF) + (L::QREG ? 0 : L::tile(kX3Rows)));
        int rc = x3_prepare(att_fwd_x3_kernel<HS>, smem, err);
        if (rc < 0)
            return rc;
        dim3 grid((unsigned)((t + kX3Rows - 1) / kX3Rows), (unsigned)nh, (unsigned)b);
        att_fwd_x3_kernel<HS>
            <<<grid, kX3Threads, smem, ci->stream>>>(t, c, nh, qkv, out, lse, scale, vec);
        CUDA_CHECK_LAUNCH(err, "att_fwd_x3_kernel<%d> (b=%d t=%d c=%d nh=%d)", HS, b, t, c, nh);
        return 0;
    });
}

int gpt_attention_backward_x3(cuda_impl *ci, int b, int t, int c, int nh, const float *dout,
                              const float *qkv, const float *out, const float *lse, float *dqkv,
                              float *dsum, float scale, bool vec, mgpu_err_t *err)
{
    return with_x3_hs(c / nh, [&](auto hc) {
        constexpr int HS = decltype(hc)::value;
        using L = X3<HS>;
        const size_t smem_q = sizeof(float) * (4 * L::tile(L::TB) + 2 * L::tile(kX3Rows));
        const size_t smem_kv = smem_q + sizeof(float) * 4 * L::TB;
        int rc;
        if ((rc = x3_prepare(att_bwd_q_x3_kernel<HS>, smem_q, err)) < 0 ||
            (rc = x3_prepare(att_bwd_kv_x3_kernel<HS>, smem_kv, err)) < 0)
            return rc;
        dim3 grid((unsigned)((t + kX3Rows - 1) / kX3Rows), (unsigned)nh, (unsigned)b);
        att_bwd_q_x3_kernel<HS><<<grid, kX3Threads, smem_q, ci->stream>>>(
            t, c, nh, dout, qkv, out, lse, dqkv, dsum, scale, vec);
        CUDA_CHECK_LAUNCH(err, "att_bwd_q_x3_kernel<%d> (b=%d t=%d c=%d nh=%d)", HS, b, t, c, nh);
        att_bwd_kv_x3_kernel<HS><<<grid, kX3Threads, smem_kv, ci->stream>>>(
            t, c, nh, dout, qkv, lse, dsum, dqkv, scale, vec);
        CUDA_CHECK_LAUNCH(err, "att_bwd_kv_x3_kernel<%d> (b=%d t=%d c=%d nh=%d)", HS, b, t, c, nh);
        return 0;
    });
}

} /* namespace mgpu_cuda */
