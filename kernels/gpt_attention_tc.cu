/* gpt_attention_tc.cu - the causal attention of gpt_attention.cu on tensor cores, for the
 * backend's bf16 precision: the four products of each tile (q k^T and p v forward; s, dp, then
 * ds k in the query pass; p^T dout and ds^T q in the key pass) are WMMA 16x16x16 products of
 * bf16 operands with fp32 accumulation, while the softmax (scores, running maximum and sum,
 * probabilities, D) stays fp32, as bf16 mode keeps every statistic in fp32.
 *
 * A block is four warps and owns 64 queries (or keys in the key pass), 16 a warp; the other
 * side comes in tiles of 64 rows converted to bf16 in shared memory. A warp's scores go through
 * shared memory (fp32) between the products, where lane pairs handle a row each (32 columns a
 * lane). The forward's output accumulates in shared memory, rescaled by the running maximum
 * each tile; the backward's gradients stay in WMMA accumulators. The layout rules WMMA sets:
 * fragment pointers 32-byte aligned, leading dimensions a multiple of 16 bytes (the padded
 * strides below keep both). No atomics: the sums run in a fixed order. */
#include "gpt_cuda_impl.h" /* cuda_impl, the device helpers, the ops' declarations */
#include "cuda_check.h"    /* CUDA_CHECK, CUDA_CHECK_LAUNCH */

#include <mma.h> /* nvcuda::wmma */

namespace wmma = nvcuda::wmma;

namespace mgpu_cuda
{
namespace
{

constexpr int kTcWarps = 4;
constexpr int kTcRows = 16 * kTcWarps; /* rows a block owns */
constexpr int kTcTile = 64;            /* rows of the other side a tile */

template <int HS> struct Tc {
    static constexpr int LDB = HS + 8;                        /* bf16 tiles' row stride, elements */
    static constexpr int LDS = kTcTile + 4;                   /* fp32 score rows */
    static constexpr int LDP = kTcTile + 8;                   /* bf16 probability rows */
    static constexpr int LDO = HS + 4;                        /* fp32 accumulator rows */
    static constexpr size_t TILE = (size_t)kTcTile * LDB * 2; /* bytes of a bf16 tile */
    static constexpr size_t SCORE = (size_t)16 * LDS * 4;     /* a warp's fp32 scores */
    static constexpr size_t PROB = (size_t)16 * LDP * 2;      /* a warp's bf16 probabilities */
    static constexpr size_t ACC = (size_t)16 * LDO * 4;       /* a warp's fp32 accumulator */
};

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> FragA;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> FragBt;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> FragB;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> FragC;

/* dst[r][d] = bf16(src row r0 + r, column d) for kTcTile rows, zeros past hs and t; the whole
 * block takes part. */
template <int HS>
__device__ __forceinline__ void load_bf16(__nv_bfloat16 *dst, const float *src, size_t ld, int r0,
                                          int t, int hs)
{
    for (int i = threadIdx.x; i < kTcTile * HS; i += blockDim.x) {
        int r = i / HS, d = i % HS;
        float v = r0 + r < t && d < hs ? src[(size_t)(r0 + r) * ld + d] : 0.0f;
        dst[r * Tc<HS>::LDB + d] = __float2bfloat16(v);
    }
}

/* out (16 x 64, fp32, row stride LDS) = a (16 x HS rows of a bf16 tile) . b^T, b the 64 rows
 * of another bf16 tile: a warp's scores against a tile. */
template <int HS>
__device__ __forceinline__ void scores(const __nv_bfloat16 *a, const __nv_bfloat16 *b, float *out)
{
    for (int n = 0; n < kTcTile / 16; n++) {
        FragC acc;
        wmma::fill_fragment(acc, 0.0f);
#pragma unroll
        for (int k = 0; k < HS / 16; k++) {
            FragA fa;
            FragBt fb;
            wmma::load_matrix_sync(fa, a + k * 16, Tc<HS>::LDB);
            wmma::load_matrix_sync(fb, b + n * 16 * Tc<HS>::LDB + k * 16, Tc<HS>::LDB);
            wmma::mma_sync(acc, fa, fb, acc);
        }
        wmma::store_matrix_sync(out + n * 16, acc, Tc<HS>::LDS, wmma::mem_row_major);
    }
}

/* acc[d] += p (16 x 64 bf16, row stride LDP) . v (a bf16 tile of 64 rows), column block d. */
template <int HS>
__device__ __forceinline__ void accumulate(FragC (&acc)[HS / 16], const __nv_bfloat16 *p,
                                           const __nv_bfloat16 *v)
{
#pragma unroll
    for (int k = 0; k < kTcTile / 16; k++) {
        FragA fa;
        wmma::load_matrix_sync(fa, p + k * 16, Tc<HS>::LDP);
#pragma unroll
        for (int d = 0; d < HS / 16; d++) {
            FragB fb;
            wmma::load_matrix_sync(fb, v + k * 16 * Tc<HS>::LDB + d * 16, Tc<HS>::LDB);
            wmma::mma_sync(acc[d], fa, fb, acc[d]);
        }
    }
}

/* dst[d] = mul * acc's row r (the lane's half of the columns, d < hs) when valid, through the
 * warp's shared accumulator ow. */
template <int HS>
__device__ __forceinline__ void store_rows(FragC (&acc)[HS / 16], float *ow, float *dst, float mul,
                                           bool valid, int r, int half, int hs)
{
    __syncwarp(); /* ow's previous readers are done */
#pragma unroll
    for (int d = 0; d < HS / 16; d++)
        wmma::store_matrix_sync(ow + d * 16, acc[d], Tc<HS>::LDO, wmma::mem_row_major);
    __syncwarp();
    if (valid)
        for (int d = half * (HS / 2); d < (half + 1) * (HS / 2) && d < hs; d++)
            dst[d] = ow[r * Tc<HS>::LDO + d] * mul;
}

/* Forward: lane pair (r, half) of a warp keeps row r's running maximum and sum; the output
 * rows live in the warp's shared accumulator, rescaled there each tile. */
template <int HS>
__global__ void __launch_bounds__(kTcWarps * 32)
    att_fwd_tc_kernel(int t, int c, int nh, const float *qkv, float *out, float *lse, float scale)
{
    using L = Tc<HS>;
    extern __shared__ __align__(128) unsigned char tc_smem[];
    __nv_bfloat16 *qs = (__nv_bfloat16 *)tc_smem;
    __nv_bfloat16 *ks = (__nv_bfloat16 *)(tc_smem + L::TILE);
    __nv_bfloat16 *vs = (__nv_bfloat16 *)(tc_smem + 2 * L::TILE);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float *sw = (float *)(tc_smem + 3 * L::TILE + warp * L::SCORE);
    __nv_bfloat16 *pw =
        (__nv_bfloat16 *)(tc_smem + 3 * L::TILE + kTcWarps * L::SCORE + warp * L::PROB);
    float *ow = (float *)(tc_smem + 3 * L::TILE + kTcWarps * (L::SCORE + L::PROB) + warp * L::ACC);
    const int h = blockIdx.y, bi = blockIdx.z, hs = c / nh;
    const size_t c3 = 3 * (size_t)c;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * kTcRows;
    const int r = lane >> 1, half = lane & 1, qi = q0 + warp * 16 + r;
    const int wlast = q0 + warp * 16 + 15;
    const float *base = qkv + (size_t)bi * t * c3 + (size_t)h * hs;

    load_bf16<HS>(qs, base, c3, q0, t, hs);
    for (int i = lane; i < 16 * L::LDO; i += 32)
        ow[i] = 0.0f;
    float m = -INFINITY, l = 0.0f;

    const int kend = min(t, q0 + kTcRows);
    for (int k0 = 0; k0 < kend; k0 += kTcTile) {
        __syncthreads(); /* every warp is done with the previous tile (and qs is written) */
        load_bf16<HS>(ks, base + c, c3, k0, t, hs);
        load_bf16<HS>(vs, base + 2 * (size_t)c, c3, k0, t, hs);
        __syncthreads();
        if (k0 > wlast)
            continue; /* every key of the tile comes after the warp's queries */
        scores<HS>(qs + warp * 16 * L::LDB, ks, sw);
        __syncwarp();
        float *srow = sw + r * L::LDS + half * 32;
        __nv_bfloat16 *prow = pw + r * L::LDP + half * 32;
        float mx = -INFINITY;
        for (int j = 0; j < 32; j++) {
            float v = k0 + half * 32 + j <= qi ? srow[j] * scale : -INFINITY;
            srow[j] = v;
            mx = fmaxf(mx, v);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        const float mn = fmaxf(m, mx), mu = mn == -INFINITY ? 0.0f : mn;
        const float corr = __expf(m - mu);
        float sum = 0.0f;
        for (int j = 0; j < 32; j++) {
            float p = __expf(srow[j] - mu);
            prow[j] = __float2bfloat16(p);
            sum += p;
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        l = l * corr + sum;
        m = mn;
        float *orow = ow + r * L::LDO + half * (HS / 2);
        for (int d = 0; d < HS / 2; d++)
            orow[d] *= corr;
        __syncwarp();
        FragC acc[HS / 16];
#pragma unroll
        for (int d = 0; d < HS / 16; d++)
            wmma::load_matrix_sync(acc[d], ow + d * 16, L::LDO, wmma::mem_row_major);
        accumulate<HS>(acc, pw, vs);
#pragma unroll
        for (int d = 0; d < HS / 16; d++)
            wmma::store_matrix_sync(ow + d * 16, acc[d], L::LDO, wmma::mem_row_major);
        __syncwarp();
    }
    __syncwarp();
    if (qi < t) {
        /* Key 0 is never masked: l >= 1. */
        const float inv = 1.0f / l;
        float *orow = out + ((size_t)bi * t + qi) * c + (size_t)h * hs;
        for (int d = half * (HS / 2); d < (half + 1) * (HS / 2) && d < hs; d++)
            orow[d] = ow[r * L::LDO + d] * inv;
        if (half == 0)
            lse[((size_t)bi * nh + h) * t + qi] = m + logf(l);
    }
}

/* Backward, query pass: dq = scale * ds . k over the key tiles, ds = p * (dp - D), p =
 * exp(scale * s - lse), s = q . k^T and dp = dout . v^T; D = rowsum(dout * out) in fp32 from
 * memory, written for the key pass. */
template <int HS>
__global__ void __launch_bounds__(kTcWarps * 32)
    att_bwd_q_tc_kernel(int t, int c, int nh, const float *dout, const float *qkv, const float *out,
                        const float *lse, float *dqkv, float *dsum, float scale)
{
    using L = Tc<HS>;
    extern __shared__ __align__(128) unsigned char tc_smem[];
    __nv_bfloat16 *qs = (__nv_bfloat16 *)tc_smem;
    __nv_bfloat16 *dos = (__nv_bfloat16 *)(tc_smem + L::TILE);
    __nv_bfloat16 *ks = (__nv_bfloat16 *)(tc_smem + 2 * L::TILE);
    __nv_bfloat16 *vs = (__nv_bfloat16 *)(tc_smem + 3 * L::TILE);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    unsigned char *wbase = tc_smem + 4 * L::TILE + warp * (2 * L::SCORE + L::PROB + L::ACC);
    float *sw = (float *)wbase, *dpw = (float *)(wbase + L::SCORE);
    __nv_bfloat16 *dsw = (__nv_bfloat16 *)(wbase + 2 * L::SCORE);
    float *ow = (float *)(wbase + 2 * L::SCORE + L::PROB);
    const int h = blockIdx.y, bi = blockIdx.z, hs = c / nh;
    const size_t c3 = 3 * (size_t)c;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * kTcRows;
    const int r = lane >> 1, half = lane & 1, qi = q0 + warp * 16 + r;
    const int wlast = q0 + warp * 16 + 15;
    const float *base = qkv + (size_t)bi * t * c3 + (size_t)h * hs;
    const float *dbase = dout + (size_t)bi * t * c + (size_t)h * hs;
    const size_t lrow = ((size_t)bi * nh + h) * t + qi;

    load_bf16<HS>(qs, base, c3, q0, t, hs);
    load_bf16<HS>(dos, dbase, c, q0, t, hs);
    float dd = 0.0f, lq = 0.0f;
    if (qi < t) {
        const float *orow = out + ((size_t)bi * t + qi) * c + (size_t)h * hs;
        const float *drow = dbase + (size_t)qi * c;
        for (int d = half; d < hs; d += 2)
            dd += drow[d] * orow[d];
        lq = lse[lrow];
    }
    dd += __shfl_xor_sync(0xffffffffu, dd, 1);
    if (qi < t && half == 0)
        dsum[lrow] = dd;
    FragC acc[HS / 16];
#pragma unroll
    for (int d = 0; d < HS / 16; d++)
        wmma::fill_fragment(acc[d], 0.0f);

    const int kend = min(t, q0 + kTcRows);
    for (int k0 = 0; k0 < kend; k0 += kTcTile) {
        __syncthreads();
        load_bf16<HS>(ks, base + c, c3, k0, t, hs);
        load_bf16<HS>(vs, base + 2 * (size_t)c, c3, k0, t, hs);
        __syncthreads();
        if (k0 > wlast)
            continue;
        scores<HS>(qs + warp * 16 * L::LDB, ks, sw);
        scores<HS>(dos + warp * 16 * L::LDB, vs, dpw);
        __syncwarp();
        const float *srow = sw + r * L::LDS + half * 32, *dprow = dpw + r * L::LDS + half * 32;
        __nv_bfloat16 *dsrow = dsw + r * L::LDP + half * 32;
        for (int j = 0; j < 32; j++) {
            float p = k0 + half * 32 + j <= qi ? __expf(srow[j] * scale - lq) : 0.0f;
            dsrow[j] = __float2bfloat16(p * (dprow[j] - dd));
        }
        __syncwarp();
        accumulate<HS>(acc, dsw, ks);
        __syncwarp();
    }
    store_rows<HS>(acc, ow, dqkv + ((size_t)bi * t + qi) * c3 + (size_t)h * hs, scale, qi < t, r,
                   half, hs);
}

/* Backward, key pass: a warp owns 16 keys; over the query tiles from the block's first key on,
 * dv += p^T . dout and dk += ds^T . q, with p^T and ds^T (keys x queries) through shared
 * memory; dk is scaled at the end. */
template <int HS>
__global__ void __launch_bounds__(kTcWarps * 32)
    att_bwd_kv_tc_kernel(int t, int c, int nh, const float *dout, const float *qkv,
                         const float *lse, const float *dsum, float *dqkv, float scale)
{
    using L = Tc<HS>;
    extern __shared__ __align__(128) unsigned char tc_smem[];
    __nv_bfloat16 *ks = (__nv_bfloat16 *)tc_smem;
    __nv_bfloat16 *vs = (__nv_bfloat16 *)(tc_smem + L::TILE);
    __nv_bfloat16 *qs = (__nv_bfloat16 *)(tc_smem + 2 * L::TILE);
    __nv_bfloat16 *dos = (__nv_bfloat16 *)(tc_smem + 3 * L::TILE);
    float *ls = (float *)(tc_smem + 4 * L::TILE), *ds = ls + kTcTile;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    unsigned char *wbase = tc_smem + 4 * L::TILE + 2 * kTcTile * sizeof(float) +
                           warp * (2 * L::SCORE + 2 * L::PROB + L::ACC);
    float *stw = (float *)wbase, *dptw = (float *)(wbase + L::SCORE);
    __nv_bfloat16 *ptw = (__nv_bfloat16 *)(wbase + 2 * L::SCORE);
    __nv_bfloat16 *dstw = (__nv_bfloat16 *)(wbase + 2 * L::SCORE + L::PROB);
    float *ow = (float *)(wbase + 2 * L::SCORE + 2 * L::PROB);
    const int h = blockIdx.y, bi = blockIdx.z, hs = c / nh;
    const size_t c3 = 3 * (size_t)c;
    const int k0 = blockIdx.x * kTcRows;
    const int r = lane >> 1, half = lane & 1, kj = k0 + warp * 16 + r;
    const int wfirst = k0 + warp * 16;
    const float *base = qkv + (size_t)bi * t * c3 + (size_t)h * hs;
    const float *dbase = dout + (size_t)bi * t * c + (size_t)h * hs;
    const size_t lbase = ((size_t)bi * nh + h) * t;

    load_bf16<HS>(ks, base + c, c3, k0, t, hs);
    load_bf16<HS>(vs, base + 2 * (size_t)c, c3, k0, t, hs);
    FragC dk[HS / 16], dv[HS / 16];
#pragma unroll
    for (int d = 0; d < HS / 16; d++) {
        wmma::fill_fragment(dk[d], 0.0f);
        wmma::fill_fragment(dv[d], 0.0f);
    }

    for (int q0 = k0; q0 < t; q0 += kTcTile) {
        __syncthreads(); /* (the first time: ks and vs are written) */
        load_bf16<HS>(qs, base, c3, q0, t, hs);
        load_bf16<HS>(dos, dbase, c, q0, t, hs);
        for (int i = threadIdx.x; i < kTcTile; i += blockDim.x) {
            bool in = q0 + i < t;
            ls[i] = in ? lse[lbase + q0 + i] : INFINITY;
            ds[i] = in ? dsum[lbase + q0 + i] : 0.0f;
        }
        __syncthreads();
        if (q0 + kTcTile - 1 < wfirst)
            continue; /* every query of the tile comes before the warp's keys */
        scores<HS>(ks + warp * 16 * L::LDB, qs, stw);   /* s^T: keys x queries */
        scores<HS>(vs + warp * 16 * L::LDB, dos, dptw); /* dp^T */
        __syncwarp();
        const float *srow = stw + r * L::LDS + half * 32, *dprow = dptw + r * L::LDS + half * 32;
        __nv_bfloat16 *prow = ptw + r * L::LDP + half * 32, *dsrow = dstw + r * L::LDP + half * 32;
        for (int j = 0; j < 32; j++) {
            const int col = half * 32 + j, qi = q0 + col;
            /* queries past t have lse = inf: p = 0 */
            float p = kj <= qi ? __expf(srow[j] * scale - ls[col]) : 0.0f;
            prow[j] = __float2bfloat16(p);
            dsrow[j] = __float2bfloat16(p * (dprow[j] - ds[col]));
        }
        __syncwarp();
        accumulate<HS>(dv, ptw, dos);
        accumulate<HS>(dk, dstw, qs);
        __syncwarp();
    }
    float *row = dqkv + ((size_t)bi * t + kj) * c3 + (size_t)h * hs;
    store_rows<HS>(dk, ow, row + c, scale, kj < t, r, half, hs);
    store_rows<HS>(dv, ow, row + 2 * (size_t)c, 1.0f, kj < t, r, half, hs);
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
    return with_tc_hs(c / nh, [&](auto hc) {
        constexpr int HS = decltype(hc)::value;
        using L = Tc<HS>;
        const size_t smem = 3 * L::TILE + kTcWarps * (L::SCORE + L::PROB + L::ACC);
        int rc = prepare(att_fwd_tc_kernel<HS>, smem, err);
        if (rc < 0)
            return rc;
        dim3 grid((unsigned)((t + kTcRows - 1) / kTcRows), (unsigned)nh, (unsigned)b);
        att_fwd_tc_kernel<HS>
            <<<grid, kTcWarps * 32, smem, ci->stream>>>(t, c, nh, qkv, out, lse, scale);
        CUDA_CHECK_LAUNCH(err, "att_fwd_tc_kernel<%d> (b=%d t=%d c=%d nh=%d)", HS, b, t, c, nh);
        return 0;
    });
}

int gpt_attention_backward_tc(cuda_impl *ci, int b, int t, int c, int nh, const float *dout,
                              const float *qkv, const float *out, const float *lse, float *dqkv,
                              float *dsum, float scale, mgpu_err_t *err)
{
    return with_tc_hs(c / nh, [&](auto hc) {
        constexpr int HS = decltype(hc)::value;
        using L = Tc<HS>;
        const size_t smem_q = 4 * L::TILE + kTcWarps * (2 * L::SCORE + L::PROB + L::ACC);
        const size_t smem_kv = 4 * L::TILE + 2 * kTcTile * sizeof(float) +
                               kTcWarps * (2 * L::SCORE + 2 * L::PROB + L::ACC);
        int rc;
        if ((rc = prepare(att_bwd_q_tc_kernel<HS>, smem_q, err)) < 0 ||
            (rc = prepare(att_bwd_kv_tc_kernel<HS>, smem_kv, err)) < 0)
            return rc;
        dim3 grid((unsigned)((t + kTcRows - 1) / kTcRows), (unsigned)nh, (unsigned)b);
        att_bwd_q_tc_kernel<HS><<<grid, kTcWarps * 32, smem_q, ci->stream>>>(
            t, c, nh, dout, qkv, out, lse, dqkv, dsum, scale);
        CUDA_CHECK_LAUNCH(err, "att_bwd_q_tc_kernel<%d> (b=%d t=%d c=%d nh=%d)", HS, b, t, c, nh);
        att_bwd_kv_tc_kernel<HS><<<grid, kTcWarps * 32, smem_kv, ci->stream>>>(
            t, c, nh, dout, qkv, lse, dsum, dqkv, scale);
        CUDA_CHECK_LAUNCH(err, "att_bwd_kv_tc_kernel<%d> (b=%d t=%d c=%d nh=%d)", HS, b, t, c, nh);
        return 0;
    });
}

} /* namespace mgpu_cuda */
