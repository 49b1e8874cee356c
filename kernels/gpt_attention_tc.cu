/* gpt_attention_tc.cu - the causal attention of gpt_attention.cu on tensor cores, for the
 * backend's bf16 precision, in FlashAttention-2's structure: every product is an
 * mma.sync.m16n8k16 of bf16 operands with fp32 accumulation whose fragments stay in registers
 * (a product's accumulator becomes the next product's A operand without leaving the warp),
 * while the softmax (scores, running maximum and sum, probabilities, D) stays fp32, as bf16
 * mode keeps every statistic in fp32. Exponentials are exp2f with log2(e) folded into the
 * scale.
 *
 * A block is four warps and owns 64 rows (queries, or keys in the key pass), 16 a warp, whose
 * A operands the warp loads once into registers; the other side comes in tiles of 64 rows,
 * read as fp32 from memory and stored in shared memory as bf16 (converted once a tile, with
 * no scratch buffer), row-major and, where a product needs the tile as its B operand the
 * other way round, transposed. Within each group of 16 columns a tile's columns are permuted
 * so that the two registers of a B fragment (columns 2i, 2i+1 and 2i+8, 2i+9) are one 8-byte
 * word; a row stride of 8 words modulo 32 banks keeps those loads free of bank conflicts.
 *
 * The backward is two kernels: the query pass (D = rowsum(dout * out), then dq over the key
 * tiles) and the key pass (dk, dv over the query tiles), each recomputing the probabilities
 * from lse. dq has its own pass so that no sum needs atomics: every sum runs in a fixed order
 * and results are the same from run to run. */
#include "gpt_cuda_impl.h" /* cuda_impl, the device helpers, the ops' declarations */
#include "cuda_check.h"    /* CUDA_CHECK, CUDA_CHECK_LAUNCH */

#include <cuda_bf16.h> /* __nv_bfloat16, __floats2bfloat162_rn */
#include <stdint.h>    /* uint32_t */

namespace mgpu_cuda
{
namespace
{

constexpr int kTcWarps = 4;
constexpr int kTcRows = 16 * kTcWarps; /* rows a block owns, and rows of a tile */
constexpr float kLog2e = 1.4426950408889634f;

/* Row strides (bf16 elements) of a row-major tile (HS columns) and a transposed one (kTcRows
 * columns): 16 past the width, 8 words modulo 32 for every HS of 32, 64, 128. */
template <int HS> struct Tc {
    static constexpr int LD = HS + 16;
    static constexpr int LDT = kTcRows + 16;
    static constexpr size_t TILE = (size_t)kTcRows * LD * 2; /* bytes */
    static constexpr size_t TILET = (size_t)HS * LDT * 2;
};

/* Position of column x in its group of 16: i = (x % 8) / 2 first, then x / 8, then x % 2. */
__device__ __forceinline__ int perm16(int x)
{
    return (x & ~15) + ((x & 7) >> 1) * 4 + ((x >> 3) & 1) * 2 + (x & 1);
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi); /* lo in the low half */
    return *reinterpret_cast<uint32_t *>(&v);
}

/* d += a . b, a 16x16 (row-major fragment), b 16x8 (column-major fragment). */
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint2 b)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.x), "r"(b.y));
}

__device__ __forceinline__ uint2 lds64(const __nv_bfloat16 *p)
{
    return *reinterpret_cast<const uint2 *>(p);
}

/* kTcRows rows of src from row r0 (row stride ld floats, hs columns) into a bf16 tile, zeros
 * past hs and t: row-major with permuted columns (T false, stride Tc::LD), or transposed
 * (dst[column][perm16(row)], stride Tc::LDT). The whole block takes part, in two steps:
 * fetch_tile brings a thread's part into registers, every load issued before the first is
 * needed (one trip to memory, not one per element), store_tile writes it, so that a tile can be
 * fetched while the previous one is used. In the transposed tile consecutive lanes take
 * consecutive rows, so that their bf16 values land side by side (no bank conflict) rather
 * than a row apart. */
template <int HS> struct Part {
    static constexpr int N = kTcRows * HS / 4 / (kTcWarps * 32); /* groups of 4 a thread */
    float4 v[N];
};

template <int HS, bool T> __device__ __forceinline__ void part_rc(int it, int &r, int &d)
{
    constexpr int Q = HS / 4; /* groups of 4 columns a row */
    const int i = threadIdx.x + it * kTcWarps * 32;
    r = T ? i % kTcRows : i / Q;
    d = T ? i / kTcRows * 4 : i % Q * 4;
}

template <int HS, bool T>
__device__ __forceinline__ void fetch_tile(Part<HS> &pt, const float *src, size_t ld, int r0, int t,
                                           int hs, bool vec)
{
#pragma unroll
    for (int it = 0; it < Part<HS>::N; it++) {
        int r, d;
        part_rc<HS, T>(it, r, d);
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (r0 + r < t) {
            const float *p = src + (size_t)(r0 + r) * ld + d;
            if (vec && d < hs) {
                v = *reinterpret_cast<const float4 *>(p);
            } else {
                v.x = d < hs ? p[0] : 0.0f;
                v.y = d + 1 < hs ? p[1] : 0.0f;
                v.z = d + 2 < hs ? p[2] : 0.0f;
                v.w = d + 3 < hs ? p[3] : 0.0f;
            }
        }
        pt.v[it] = v;
    }
}

template <int HS, bool T>
__device__ __forceinline__ void store_tile(__nv_bfloat16 *dst, const Part<HS> &pt)
{
#pragma unroll
    for (int it = 0; it < Part<HS>::N; it++) {
        int r, d;
        part_rc<HS, T>(it, r, d);
        const float4 v = pt.v[it];
        if (!T) {
            uint32_t *row = reinterpret_cast<uint32_t *>(dst + r * Tc<HS>::LD);
            row[perm16(d) >> 1] = pack_bf16(v.x, v.y);
            row[perm16(d + 2) >> 1] = pack_bf16(v.z, v.w);
        } else {
            __nv_bfloat16 *col = dst + d * Tc<HS>::LDT + perm16(r);
            col[0] = __float2bfloat16(v.x);
            col[Tc<HS>::LDT] = __float2bfloat16(v.y);
            col[2 * Tc<HS>::LDT] = __float2bfloat16(v.z);
            col[3 * Tc<HS>::LDT] = __float2bfloat16(v.w);
        }
    }
}

template <int HS, bool T>
__device__ __forceinline__ void load_tile(__nv_bfloat16 *dst, const float *src, size_t ld, int r0,
                                          int t, int hs, bool vec)
{
    Part<HS> pt;
    fetch_tile<HS, T>(pt, src, ld, r0, t, hs, vec);
    store_tile<HS, T>(dst, pt);
}

/* The A fragments of the warp's 16 rows (from row w0 of a row-major tile). */
template <int HS>
__device__ __forceinline__ void load_a(uint32_t (&a)[HS / 16][4], const __nv_bfloat16 *tile, int w0,
                                       int g, int tig)
{
#pragma unroll
    for (int k = 0; k < HS / 16; k++) {
        uint2 lo = lds64(tile + (w0 + g) * Tc<HS>::LD + k * 16 + tig * 4);
        uint2 hi = lds64(tile + (w0 + g + 8) * Tc<HS>::LD + k * 16 + tig * 4);
        a[k][0] = lo.x, a[k][1] = hi.x, a[k][2] = lo.y, a[k][3] = hi.y;
    }
}

/* s (16 x 64) = a . tile^T, tile row-major (64 rows of HS). */
template <int HS>
__device__ __forceinline__ void rows_by_tile(float (&s)[kTcRows / 8][4],
                                             const uint32_t (&a)[HS / 16][4],
                                             const __nv_bfloat16 *tile, int g, int tig)
{
#pragma unroll
    for (int n = 0; n < kTcRows / 8; n++)
        s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int k = 0; k < HS / 16; k++)
#pragma unroll
        for (int n = 0; n < kTcRows / 8; n++)
            mma16816(s[n], a[k], lds64(tile + (n * 8 + g) * Tc<HS>::LD + k * 16 + tig * 4));
}

/* acc (16 x HS) += p . tile, p 16 x 64 as accumulators, the tile transposed (HS rows of 64). */
template <int HS>
__device__ __forceinline__ void acc_by_tile(float (&acc)[HS / 8][4],
                                            const float (&p)[kTcRows / 8][4],
                                            const __nv_bfloat16 *tilet, int g, int tig)
{
#pragma unroll
    for (int k = 0; k < kTcRows / 16; k++) {
        const uint32_t a[4] = {pack_bf16(p[2 * k][0], p[2 * k][1]),
                               pack_bf16(p[2 * k][2], p[2 * k][3]),
                               pack_bf16(p[2 * k + 1][0], p[2 * k + 1][1]),
                               pack_bf16(p[2 * k + 1][2], p[2 * k + 1][3])};
#pragma unroll
        for (int n = 0; n < HS / 8; n++)
            mma16816(acc[n], a, lds64(tilet + (n * 8 + g) * Tc<HS>::LDT + k * 16 + tig * 4));
    }
}

/* row[d] = mul * acc's element for rows g / g + 8 (rows r0, r0 + 8 of memory; valid below t). */
template <int HS>
__device__ __forceinline__ void store_acc(const float (&acc)[HS / 8][4], float *base, size_t ld,
                                          int r0, int t, int hs, float mul0, float mul1, int tig)
{
#pragma unroll
    for (int n = 0; n < HS / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = r0 + (e >> 1) * 8, d = n * 8 + 2 * tig + (e & 1);
            if (r < t && d < hs)
                base[(size_t)r * ld + d] = acc[n][e] * (e >> 1 ? mul1 : mul0);
        }
}

/* Forward: the warp's rows g and g + 8 keep their running maximum (log2 units) and sum in
 * the four lanes of a row (a row's columns are spread over them: shuffles 1 and 2). Blocks
 * are launched last queries first (they have the most keys). */
template <int HS>
__global__ void __launch_bounds__(kTcWarps * 32)
    att_fwd_tc_kernel(int t, int c, int nh, const float *qkv, float *out, float *lse, float scale,
                      bool vec)
{
    using L = Tc<HS>;
    extern __shared__ __align__(128) unsigned char tc_smem[];
    __nv_bfloat16 *ks = (__nv_bfloat16 *)tc_smem;
    __nv_bfloat16 *vts = (__nv_bfloat16 *)(tc_smem + L::TILE);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
    const int h = blockIdx.y, bi = blockIdx.z, hs = c / nh;
    const size_t c3 = 3 * (size_t)c;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * kTcRows;
    const int qa = q0 + warp * 16 + g, qb = qa + 8; /* the lane's two rows */
    const int wlast = q0 + warp * 16 + 15;
    const float *base = qkv + (size_t)bi * t * c3 + (size_t)h * hs;
    const float sl2 = scale * kLog2e;

    uint32_t qf[HS / 16][4];
    load_tile<HS, false>(ks, base, c3, q0, t, hs, vec); /* q, through the key tile */
    __syncthreads();
    load_a<HS>(qf, ks, warp * 16, g, tig);
    float o[HS / 8][4];
#pragma unroll
    for (int n = 0; n < HS / 8; n++)
        o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float ma = -INFINITY, mb = -INFINITY, la = 0.0f, lb = 0.0f;

    /* The next tile's k and v are fetched into registers while this one is used. */
    const int kend = min(t, q0 + kTcRows);
    Part<HS> kp, vp;
    fetch_tile<HS, false>(kp, base + c, c3, 0, t, hs, vec);
    fetch_tile<HS, true>(vp, base + 2 * (size_t)c, c3, 0, t, hs, vec);
    for (int k0 = 0; k0 < kend; k0 += kTcRows) {
        __syncthreads(); /* every warp is done with the previous tile (and with q) */
        store_tile<HS, false>(ks, kp);
        store_tile<HS, true>(vts, vp);
        __syncthreads();
        if (k0 + kTcRows < kend) {
            fetch_tile<HS, false>(kp, base + c, c3, k0 + kTcRows, t, hs, vec);
            fetch_tile<HS, true>(vp, base + 2 * (size_t)c, c3, k0 + kTcRows, t, hs, vec);
        }
        if (k0 > wlast)
            continue; /* every key of the tile comes after the warp's queries */
        float s[kTcRows / 8][4];
        rows_by_tile<HS>(s, qf, ks, g, tig);
        float mxa = ma, mxb = mb;
#pragma unroll
        for (int n = 0; n < kTcRows / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = k0 + n * 8 + 2 * tig + (e & 1);
                /* causal mask; keys past t come after every query below t */
                float v = key <= (e >> 1 ? qb : qa) ? s[n][e] * sl2 : -INFINITY;
                s[n][e] = v;
                if (e >> 1)
                    mxb = fmaxf(mxb, v);
                else
                    mxa = fmaxf(mxa, v);
            }
        mxa = fmaxf(mxa, __shfl_xor_sync(0xffffffffu, mxa, 1));
        mxa = fmaxf(mxa, __shfl_xor_sync(0xffffffffu, mxa, 2));
        mxb = fmaxf(mxb, __shfl_xor_sync(0xffffffffu, mxb, 1));
        mxb = fmaxf(mxb, __shfl_xor_sync(0xffffffffu, mxb, 2));
        /* Key 0 is in the first tile of every row: the maxima are finite from then on. */
        const float ca = exp2f(ma - mxa), cb = exp2f(mb - mxb);
        float sa = 0.0f, sb = 0.0f;
#pragma unroll
        for (int n = 0; n < kTcRows / 8; n++) {
            s[n][0] = exp2f(s[n][0] - mxa);
            s[n][1] = exp2f(s[n][1] - mxa);
            s[n][2] = exp2f(s[n][2] - mxb);
            s[n][3] = exp2f(s[n][3] - mxb);
            sa += s[n][0] + s[n][1];
            sb += s[n][2] + s[n][3];
        }
        la = la * ca + sa; /* the lane's part of the sum; the row's is summed at the end */
        lb = lb * cb + sb;
        ma = mxa, mb = mxb;
#pragma unroll
        for (int n = 0; n < HS / 8; n++) {
            o[n][0] *= ca, o[n][1] *= ca;
            o[n][2] *= cb, o[n][3] *= cb;
        }
        acc_by_tile<HS>(o, s, vts, g, tig);
    }
    la += __shfl_xor_sync(0xffffffffu, la, 1);
    la += __shfl_xor_sync(0xffffffffu, la, 2);
    lb += __shfl_xor_sync(0xffffffffu, lb, 1);
    lb += __shfl_xor_sync(0xffffffffu, lb, 2);
    store_acc<HS>(o, out + (size_t)bi * t * c + (size_t)h * hs, c, qa, t, hs, 1.0f / la, 1.0f / lb,
                  tig);
    float *lrow = lse + ((size_t)bi * nh + h) * t;
    if (tig == 0 && qa < t)
        lrow[qa] = (ma + log2f(la)) / kLog2e;
    if (tig == 0 && qb < t)
        lrow[qb] = (mb + log2f(lb)) / kLog2e;
}

/* Backward, query pass: dq = scale * ds . k over the key tiles, ds = p * (dp - D), p =
 * exp(scale * s - lse), s = q . k^T and dp = dout . v^T; D = rowsum(dout * out) in fp32 from
 * memory, written for the key pass. */
template <int HS>
__global__ void __launch_bounds__(kTcWarps * 32)
    att_bwd_q_tc_kernel(int t, int c, int nh, const float *dout, const float *qkv, const float *out,
                        const float *lse, float *dqkv, float *dsum, float scale, bool vec)
{
    using L = Tc<HS>;
    extern __shared__ __align__(128) unsigned char tc_smem[];
    __nv_bfloat16 *ks = (__nv_bfloat16 *)tc_smem;
    __nv_bfloat16 *vs = (__nv_bfloat16 *)(tc_smem + L::TILE);
    __nv_bfloat16 *kts = (__nv_bfloat16 *)(tc_smem + 2 * L::TILE);
    float *ls = (float *)(tc_smem + 2 * L::TILE + L::TILET), *dd = ls + kTcRows;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
    const int h = blockIdx.y, bi = blockIdx.z, hs = c / nh;
    const size_t c3 = 3 * (size_t)c;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * kTcRows;
    const int qa = q0 + warp * 16 + g, qb = qa + 8;
    const int wlast = q0 + warp * 16 + 15;
    const float *base = qkv + (size_t)bi * t * c3 + (size_t)h * hs;
    const float *dbase = dout + (size_t)bi * t * c + (size_t)h * hs;
    const size_t lbase = ((size_t)bi * nh + h) * t;
    const float sl2 = scale * kLog2e;

    load_tile<HS, false>(ks, base, c3, q0, t, hs, vec);
    load_tile<HS, false>(vs, dbase, c, q0, t, hs, vec);
    {
        /* D of the warp's rows, a lane pair a row */
        const int r = warp * 16 + (lane >> 1), qi = q0 + r;
        float sum = 0.0f, l2 = 0.0f;
        if (qi < t) {
            const float *orow = out + ((size_t)bi * t + qi) * c + (size_t)h * hs;
            const float *drow = dbase + (size_t)qi * c;
            for (int d = lane & 1; d < hs; d += 2)
                sum += drow[d] * orow[d];
            l2 = lse[lbase + qi] * kLog2e;
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        if ((lane & 1) == 0) {
            dd[r] = sum;
            ls[r] = l2;
            if (qi < t)
                dsum[lbase + qi] = sum;
        }
    }
    __syncthreads();
    uint32_t qf[HS / 16][4], df[HS / 16][4];
    load_a<HS>(qf, ks, warp * 16, g, tig);
    load_a<HS>(df, vs, warp * 16, g, tig);
    const float da = dd[warp * 16 + g], db = dd[warp * 16 + g + 8];
    const float lsa = ls[warp * 16 + g], lsb = ls[warp * 16 + g + 8];
    float dq[HS / 8][4];
#pragma unroll
    for (int n = 0; n < HS / 8; n++)
        dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;

    const int kend = min(t, q0 + kTcRows);
    for (int k0 = 0; k0 < kend; k0 += kTcRows) {
        __syncthreads();
        load_tile<HS, false>(ks, base + c, c3, k0, t, hs, vec);
        load_tile<HS, true>(kts, base + c, c3, k0, t, hs, vec);
        load_tile<HS, false>(vs, base + 2 * (size_t)c, c3, k0, t, hs, vec);
        __syncthreads();
        if (k0 > wlast)
            continue;
        float s[kTcRows / 8][4], dp[kTcRows / 8][4];
        rows_by_tile<HS>(s, qf, ks, g, tig);
        rows_by_tile<HS>(dp, df, vs, g, tig);
#pragma unroll
        for (int n = 0; n < kTcRows / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = k0 + n * 8 + 2 * tig + (e & 1);
                const bool b2 = e >> 1;
                float p = key <= (b2 ? qb : qa) ? exp2f(s[n][e] * sl2 - (b2 ? lsb : lsa)) : 0.0f;
                s[n][e] = p * (dp[n][e] - (b2 ? db : da));
            }
        acc_by_tile<HS>(dq, s, kts, g, tig);
    }
    store_acc<HS>(dq, dqkv + (size_t)bi * t * c3 + (size_t)h * hs, c3, qa, t, hs, scale, scale,
                  tig);
}

/* Backward, key pass: a warp owns 16 keys; over the query tiles from the block's first key
 * on, dv += p^T . dout and dk += ds^T . q, with s^T = k . q^T and dp^T = v . dout^T computed
 * keys by queries, so that p^T and ds^T are accumulators ready to be A operands; dk is scaled
 * at the end. Blocks are launched first keys first (they have the most queries). */
template <int HS>
__global__ void __launch_bounds__(kTcWarps * 32)
    att_bwd_kv_tc_kernel(int t, int c, int nh, const float *dout, const float *qkv,
                         const float *lse, const float *dsum, float *dqkv, float scale, bool vec)
{
    using L = Tc<HS>;
    extern __shared__ __align__(128) unsigned char tc_smem[];
    __nv_bfloat16 *qs = (__nv_bfloat16 *)tc_smem;
    __nv_bfloat16 *dos = (__nv_bfloat16 *)(tc_smem + L::TILE);
    __nv_bfloat16 *qts = (__nv_bfloat16 *)(tc_smem + 2 * L::TILE);
    __nv_bfloat16 *dots = (__nv_bfloat16 *)(tc_smem + 2 * L::TILE + L::TILET);
    float *ls = (float *)(tc_smem + 2 * L::TILE + 2 * L::TILET), *dd = ls + kTcRows;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
    const int h = blockIdx.y, bi = blockIdx.z, hs = c / nh;
    const size_t c3 = 3 * (size_t)c;
    const int k0 = blockIdx.x * kTcRows;
    const int ka = k0 + warp * 16 + g, kb = ka + 8;
    const int wfirst = k0 + warp * 16;
    const float *base = qkv + (size_t)bi * t * c3 + (size_t)h * hs;
    const float *dbase = dout + (size_t)bi * t * c + (size_t)h * hs;
    const size_t lbase = ((size_t)bi * nh + h) * t;
    const float sl2 = scale * kLog2e;

    load_tile<HS, false>(qs, base + c, c3, k0, t, hs, vec); /* k and v, through q's tiles */
    load_tile<HS, false>(dos, base + 2 * (size_t)c, c3, k0, t, hs, vec);
    __syncthreads();
    uint32_t kf[HS / 16][4], vf[HS / 16][4];
    load_a<HS>(kf, qs, warp * 16, g, tig);
    load_a<HS>(vf, dos, warp * 16, g, tig);
    float dk[HS / 8][4], dv[HS / 8][4];
#pragma unroll
    for (int n = 0; n < HS / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            dk[n][e] = dv[n][e] = 0.0f;

    for (int q0 = k0; q0 < t; q0 += kTcRows) {
        __syncthreads(); /* (the first time: k and v are in registers) */
        load_tile<HS, false>(qs, base, c3, q0, t, hs, vec);
        load_tile<HS, true>(qts, base, c3, q0, t, hs, vec);
        load_tile<HS, false>(dos, dbase, c, q0, t, hs, vec);
        load_tile<HS, true>(dots, dbase, c, q0, t, hs, vec);
        for (int i = threadIdx.x; i < kTcRows; i += blockDim.x) {
            const bool in = q0 + i < t;
            ls[i] = in ? lse[lbase + q0 + i] * kLog2e : INFINITY; /* p = 0 past t */
            dd[i] = in ? dsum[lbase + q0 + i] : 0.0f;
        }
        __syncthreads();
        if (q0 + kTcRows - 1 < wfirst)
            continue; /* every query of the tile comes before the warp's keys */
        float s[kTcRows / 8][4], dp[kTcRows / 8][4];
        rows_by_tile<HS>(s, kf, qs, g, tig);   /* s^T: keys x queries */
        rows_by_tile<HS>(dp, vf, dos, g, tig); /* dp^T */
#pragma unroll
        for (int n = 0; n < kTcRows / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int col = n * 8 + 2 * tig + (e & 1);
                const float p =
                    (e >> 1 ? kb : ka) <= q0 + col ? exp2f(s[n][e] * sl2 - ls[col]) : 0.0f;
                s[n][e] = p;
                dp[n][e] = p * (dp[n][e] - dd[col]);
            }
        acc_by_tile<HS>(dv, s, dots, g, tig);
        acc_by_tile<HS>(dk, dp, qts, g, tig);
    }
    float *rows = dqkv + (size_t)bi * t * c3 + (size_t)h * hs;
    store_acc<HS>(dk, rows + c, c3, ka, t, hs, scale, scale, tig);
    store_acc<HS>(dv, rows + 2 * (size_t)c, c3, ka, t, hs, 1.0f, 1.0f, tig);
}

template <class K> int prepare(K kern, size_t smem, mgpu_err_t *err)
{
    /* More than the default 48 KiB of dynamic shared memory must be asked for. */
    if (smem > 48 * 1024)
        CUDA_CHECK(err, cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)smem));
    return 0;
}

template <class Fn> int with_tc_hs(int hs, Fn fn)
{
    if (hs <= 32)
        return fn(std::integral_constant<int, 32>());
    if (hs <= 64)
        return fn(std::integral_constant<int, 64>());
    return fn(std::integral_constant<int, 128>());
}

} /* namespace */

int gpt_attention_forward_tc(cuda_impl *ci, int b, int t, int c, int nh, const float *qkv,
                             float *out, float *lse, float scale, mgpu_err_t *err)
{
    const bool vec = (c / nh) % 4 == 0 && aligned16(qkv, out);
    return with_tc_hs(c / nh, [&](auto hc) {
        constexpr int HS = decltype(hc)::value;
        using L = Tc<HS>;
        const size_t smem = L::TILE + L::TILET;
        int rc = prepare(att_fwd_tc_kernel<HS>, smem, err);
        if (rc < 0)
            return rc;
        dim3 grid((unsigned)((t + kTcRows - 1) / kTcRows), (unsigned)nh, (unsigned)b);
        att_fwd_tc_kernel<HS>
            <<<grid, kTcWarps * 32, smem, ci->stream>>>(t, c, nh, qkv, out, lse, scale, vec);
        CUDA_CHECK_LAUNCH(err, "att_fwd_tc_kernel<%d> (b=%d t=%d c=%d nh=%d)", HS, b, t, c, nh);
        return 0;
    });
}

int gpt_attention_backward_tc(cuda_impl *ci, int b, int t, int c, int nh, const float *dout,
                              const float *qkv, const float *out, const float *lse, float *dqkv,
                              float *dsum, float scale, mgpu_err_t *err)
{
    const bool vec = (c / nh) % 4 == 0 && aligned16(qkv, out, dout, dqkv);
    return with_tc_hs(c / nh, [&](auto hc) {
        constexpr int HS = decltype(hc)::value;
        using L = Tc<HS>;
        const size_t stats = 2 * kTcRows * sizeof(float);
        const size_t smem_q = 2 * L::TILE + L::TILET + stats;
        const size_t smem_kv = 2 * L::TILE + 2 * L::TILET + stats;
        int rc;
        if ((rc = prepare(att_bwd_q_tc_kernel<HS>, smem_q, err)) < 0 ||
            (rc = prepare(att_bwd_kv_tc_kernel<HS>, smem_kv, err)) < 0)
            return rc;
        dim3 grid((unsigned)((t + kTcRows - 1) / kTcRows), (unsigned)nh, (unsigned)b);
        att_bwd_q_tc_kernel<HS><<<grid, kTcWarps * 32, smem_q, ci->stream>>>(
            t, c, nh, dout, qkv, out, lse, dqkv, dsum, scale, vec);
        CUDA_CHECK_LAUNCH(err, "att_bwd_q_tc_kernel<%d> (b=%d t=%d c=%d nh=%d)", HS, b, t, c, nh);
        att_bwd_kv_tc_kernel<HS><<<grid, kTcWarps * 32, smem_kv, ci->stream>>>(
            t, c, nh, dout, qkv, lse, dsum, dqkv, scale, vec);
        CUDA_CHECK_LAUNCH(err, "att_bwd_kv_tc_kernel<%d> (b=%d t=%d c=%d nh=%d)", HS, b, t, c, nh);
        return 0;
    });
}

} /* namespace mgpu_cuda */
