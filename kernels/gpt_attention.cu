/* gpt_attention.cu - causal multi-head self-attention over a fused qkv buffer, forward and
 * backward, FlashAttention-style: tiles of keys and values (or queries and output gradients)
 * in shared memory, the softmax online with a running maximum and sum in fp32, and no (t, t)
 * matrix anywhere. The forward keeps each query's log-sum-exp (lse); the backward recomputes
 * the probabilities from q, k and lse, with D = rowsum(dout * out) (transformer.c's
 * mgpu_gpt_attention_* is the reference).
 *
 * The layout of the work: a row (a query, or in the key pass a key) belongs to G = HS / 16
 * lanes of a warp, each holding 16 of its dimensions in registers (four float4 chunks,
 * interleaved so that the G lanes read consecutive 16-byte words of a shared row: no bank
 * conflict, and the 32 / G rows of a warp read the same words: a broadcast). A dot product
 * is 16 FMAs a lane and log2(G) shuffles; a shared float4 feeds four FMAs. HS is the head
 * size rounded up to 32, 64 or 128 (dimensions past hs are zeros).
 *
 * Every sum runs in a fixed order (no atomics), so results are the same from run to run. The
 * backward is two kernels: the query pass (dq, and D for the key pass) and the key pass (dk,
 * dv); each recomputes the probabilities it needs rather than sharing them through memory. */
#include "gpt_cuda_impl.h" /* cuda_impl, the device helpers, the ops' declarations */
#include "cuda_check.h"    /* CUDA_CHECK_LAUNCH */

namespace mgpu_cuda
{
namespace
{

constexpr int kAttWarps = 8; /* a block: 256 threads */
constexpr int kAttTile = 32; /* rows of the shared tiles (keys, or queries in the key pass) */
constexpr int kAttChunk = 8; /* rows whose dot products are in flight together (forward) */
/* The backward's: two dot products a row, whose shared rows the compiler keeps in registers
 * for the accumulations after the shuffles (fewer shared loads, more registers). */
constexpr int kAttQChunk = 4;
constexpr int kAttKvChunk = 2;
constexpr int kAttMaxHs = 128; /* registers and shared memory are sized for this */

template <int HS> struct Geom {
    static constexpr int G = HS / 16;          /* lanes a row */
    static constexpr int R = 32 / G;           /* rows a warp */
    static constexpr int ROWS = kAttWarps * R; /* rows a block */
};

/* The lane's dimensions: chunk k is dims 4 * (g + G * k) .. + 3. */
template <int HS> __device__ __forceinline__ int dim0(int g, int k)
{
    return 4 * (g + Geom<HS>::G * k);
}

/* r = mul * row[lane's dims] (zeros past hs); vec: hs % 4 == 0 and the row 16-byte aligned. */
template <int HS>
__device__ __forceinline__ void load_row(const float *row, int hs, bool vec, int g, float mul,
                                         float (&r)[16])
{
#pragma unroll
    for (int k = 0; k < 4; k++) {
        int d = dim0<HS>(g, k);
        if (vec && d < hs) {
            float4 v = *reinterpret_cast<const float4 *>(row + d);
            r[4 * k] = v.x * mul, r[4 * k + 1] = v.y * mul;
            r[4 * k + 2] = v.z * mul, r[4 * k + 3] = v.w * mul;
        } else {
#pragma unroll
            for (int e = 0; e < 4; e++)
                r[4 * k + e] = d + e < hs ? row[d + e] * mul : 0.0f;
        }
    }
}

template <int HS>
__device__ __forceinline__ void store_row(float *row, int hs, bool vec, int g, float mul,
                                          const float (&r)[16])
{
#pragma unroll
    for (int k = 0; k < 4; k++) {
        int d = dim0<HS>(g, k);
        if (vec && d < hs) {
            *reinterpret_cast<float4 *>(row + d) = make_float4(
                r[4 * k] * mul, r[4 * k + 1] * mul, r[4 * k + 2] * mul, r[4 * k + 3] * mul);
        } else {
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (d + e < hs)
                    row[d + e] = r[4 * k + e] * mul;
        }
    }
}

/* The lane's part of a . s, s a shared row of HS floats. */
template <int HS>
__device__ __forceinline__ float dot_part(const float (&a)[16], const float *s, int g)
{
    const float4 *s4 = reinterpret_cast<const float4 *>(s);
    float acc0 = 0.0f, acc1 = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float4 v = s4[g + Geom<HS>::G * k];
        acc0 = fmaf(a[4 * k], v.x, acc0);
        acc1 = fmaf(a[4 * k + 1], v.y, acc1);
        acc0 = fmaf(a[4 * k + 2], v.z, acc0);
        acc1 = fmaf(a[4 * k + 3], v.w, acc1);
    }
    return acc0 + acc1;
}

/* acc += p * s[lane's dims] */
template <int HS>
__device__ __forceinline__ void axpy(float (&acc)[16], float p, const float *s, int g)
{
    const float4 *s4 = reinterpret_cast<const float4 *>(s);
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float4 v = s4[g + Geom<HS>::G * k];
        acc[4 * k] = fmaf(p, v.x, acc[4 * k]);
        acc[4 * k + 1] = fmaf(p, v.y, acc[4 * k + 1]);
        acc[4 * k + 2] = fmaf(p, v.z, acc[4 * k + 2]);
        acc[4 * k + 3] = fmaf(p, v.w, acc[4 * k + 3]);
    }
}

/* Sum over the G lanes of a row (consecutive lanes). */
template <int G> __device__ __forceinline__ float row_sum(float v)
{
#pragma unroll
    for (int o = G / 2; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* tile[i][0..HS) = src row (r0 + i) (row stride ld), zeros past hs and for rows >= t; the
 * whole block takes part. */
template <int HS>
__device__ __forceinline__ void load_tile(float *tile, const float *src, size_t ld, int r0, int t,
                                          int hs, bool vec)
{
    constexpr int Q = HS / 4; /* float4 slots a row */
    for (int i = threadIdx.x; i < kAttTile * Q; i += blockDim.x) {
        int r = i / Q, d = (i % Q) * 4;
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
        reinterpret_cast<float4 *>(tile)[i] = v;
    }
}

/* Forward: a block owns ROWS consecutive queries of one (batch row, head) and walks the key
 * tiles up to its last query; blocks are launched last queries first (they have the most
 * keys), so the short ones fill the tail of the grid. */
template <int HS>
__global__ void __launch_bounds__(kAttWarps * 32)
    att_fwd_kernel(int t, int c, int nh, const float *qkv, float *out, float *lse, float scale,
                   bool vec)
{
    using Gm = Geom<HS>;
    __shared__ __align__(16) float ks[kAttTile * HS];
    __shared__ __align__(16) float vs[kAttTile * HS];
    const int h = blockIdx.y, bi = blockIdx.z, hs = c / nh;
    const size_t c3 = 3 * (size_t)c;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * Gm::ROWS;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane % Gm::G, qi = q0 + warp * Gm::R + lane / Gm::G;
    const int wlast = q0 + warp * Gm::R + Gm::R - 1;
    const float *base = qkv + (size_t)bi * t * c3 + (size_t)h * hs;

    float q[16], o[16];
    if (qi < t)
        load_row<HS>(base + qi * c3, hs, vec, g, scale, q);
    else
#pragma unroll
        for (int i = 0; i < 16; i++)
            q[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; i++)
        o[i] = 0.0f;
    float m = -INFINITY, l = 0.0f;

    const int kend = min(t, q0 + Gm::ROWS);
    for (int k0 = 0; k0 < kend; k0 += kAttTile) {
        __syncthreads(); /* the previous tile is read by every warp */
        load_tile<HS>(ks, base + c, c3, k0, t, hs, vec);
        load_tile<HS>(vs, base + 2 * (size_t)c, c3, k0, t, hs, vec);
        __syncthreads();
        for (int j0 = 0; j0 < kAttTile && k0 + j0 <= wlast; j0 += kAttChunk) {
            float s[kAttChunk];
#pragma unroll
            for (int u = 0; u < kAttChunk; u++)
                s[u] = dot_part<HS>(q, ks + (j0 + u) * HS, g);
            float mx = m;
#pragma unroll
            for (int u = 0; u < kAttChunk; u++) {
                s[u] = row_sum<Gm::G>(s[u]);
                if (k0 + j0 + u > qi)
                    s[u] = -INFINITY; /* causal mask (and keys past t) */
                mx = fmaxf(mx, s[u]);
            }
            /* A query whose keys so far are all masked keeps m = -inf and l = 0. */
            const float mu = mx == -INFINITY ? 0.0f : mx;
            const float corr = __expf(m - mu);
            l *= corr;
#pragma unroll
            for (int i = 0; i < 16; i++)
                o[i] *= corr;
#pragma unroll
            for (int u = 0; u < kAttChunk; u++) {
                float p = __expf(s[u] - mu);
                l += p;
                axpy<HS>(o, p, vs + (j0 + u) * HS, g);
            }
            m = mx;
        }
    }
    if (qi < t) {
        /* Key 0 is never masked: l >= 1. */
        store_row<HS>(out + ((size_t)bi * t + qi) * c + (size_t)h * hs, hs, vec, g, 1.0f / l, o);
        if (g == 0)
            lse[((size_t)bi * nh + h) * t + qi] = m + logf(l);
    }
}

/* Backward, query pass: a block owns ROWS queries as the forward does; dq = scale * sum over
 * keys of ds * k with ds = p * (dout . v - D), p = exp(scale * q . k - lse). Writes D for the
 * key pass. */
template <int HS>
__global__ void __launch_bounds__(kAttWarps * 32, 2)
    att_bwd_q_kernel(int t, int c, int nh, const float *dout, const float *qkv, const float *out,
                     const float *lse, float *dqkv, float *dsum, float scale, bool vec)
{
    using Gm = Geom<HS>;
    __shared__ __align__(16) float ks[kAttTile * HS];
    __shared__ __align__(16) float vs[kAttTile * HS];
    const int h = blockIdx.y, bi = blockIdx.z, hs = c / nh;
    const size_t c3 = 3 * (size_t)c;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * Gm::ROWS;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane % Gm::G, qi = q0 + warp * Gm::R + lane / Gm::G;
    const int wlast = q0 + warp * Gm::R + Gm::R - 1;
    const float *base = qkv + (size_t)bi * t * c3 + (size_t)h * hs;
    const size_t orow = ((size_t)bi * t + qi) * c + (size_t)h * hs;
    const size_t lrow = ((size_t)bi * nh + h) * t + qi;

    float q[16], dq[16], dov[16];
    float dd = 0.0f, lq = 0.0f;
    if (qi < t) {
        float ov[16];
        load_row<HS>(base + qi * c3, hs, vec, g, 1.0f, q);
        load_row<HS>(dout + orow, hs, vec, g, 1.0f, dov);
        load_row<HS>(out + orow, hs, vec, g, 1.0f, ov);
        for (int i = 0; i < 16; i++)
            dd = fmaf(dov[i], ov[i], dd);
        lq = lse[lrow];
    } else {
#pragma unroll
        for (int i = 0; i < 16; i++)
            q[i] = dov[i] = 0.0f;
    }
    dd = row_sum<Gm::G>(dd);
    if (qi < t && g == 0)
        dsum[lrow] = dd;
#pragma unroll
    for (int i = 0; i < 16; i++)
        dq[i] = 0.0f;

    const int kend = min(t, q0 + Gm::ROWS);
    for (int k0 = 0; k0 < kend; k0 += kAttTile) {
        __syncthreads();
        load_tile<HS>(ks, base + c, c3, k0, t, hs, vec);
        load_tile<HS>(vs, base + 2 * (size_t)c, c3, k0, t, hs, vec);
        __syncthreads();
        for (int j0 = 0; j0 < kAttTile && k0 + j0 <= wlast; j0 += kAttQChunk) {
            float s[kAttQChunk], dp[kAttQChunk];
#pragma unroll
            for (int u = 0; u < kAttQChunk; u++) {
                s[u] = dot_part<HS>(q, ks + (j0 + u) * HS, g);
                dp[u] = dot_part<HS>(dov, vs + (j0 + u) * HS, g);
            }
#pragma unroll
            for (int u = 0; u < kAttQChunk; u++) {
                s[u] = row_sum<Gm::G>(s[u]);
                dp[u] = row_sum<Gm::G>(dp[u]);
            }
#pragma unroll
            for (int u = 0; u < kAttQChunk; u++) {
                float p = k0 + j0 + u <= qi ? __expf(s[u] * scale - lq) : 0.0f;
                axpy<HS>(dq, p * (dp[u] - dd), ks + (j0 + u) * HS, g);
            }
        }
    }
    if (qi < t)
        store_row<HS>(dqkv + ((size_t)bi * t + qi) * c3 + (size_t)h * hs, hs, vec, g, scale, dq);
}

/* Backward, key pass: a block owns ROWS consecutive keys and walks the query tiles from its
 * first key on (earlier queries never see these keys): dv = sum over queries of p * dout,
 * dk = scale * sum of ds * q. Launched first keys first (they have the most queries). */
template <int HS>
__global__ void __launch_bounds__(kAttWarps * 32, 2)
    att_bwd_kv_kernel(int t, int c, int nh, const float *dout, const float *qkv, const float *lse,
                      const float *dsum, float *dqkv, float scale, bool vec)
{
    using Gm = Geom<HS>;
    __shared__ __align__(16) float qs[kAttTile * HS];
    __shared__ __align__(16) float ds[kAttTile * HS];
    __shared__ float ls[kAttTile], dd[kAttTile];
    const int h = blockIdx.y, bi = blockIdx.z, hs = c / nh;
    const size_t c3 = 3 * (size_t)c;
    const int k0 = blockIdx.x * Gm::ROWS;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane % Gm::G, kj = k0 + warp * Gm::R + lane / Gm::G;
    const int wfirst = k0 + warp * Gm::R;
    const float *base = qkv + (size_t)bi * t * c3 + (size_t)h * hs;
    const float *dbase = dout + (size_t)bi * t * c + (size_t)h * hs;
    const size_t lbase = ((size_t)bi * nh + h) * t;

    float kr[16], vr[16], dk[16], dv[16];
    if (kj < t) {
        load_row<HS>(base + c + kj * c3, hs, vec, g, 1.0f, kr);
        load_row<HS>(base + 2 * (size_t)c + kj * c3, hs, vec, g, 1.0f, vr);
    } else {
#pragma unroll
        for (int i = 0; i < 16; i++)
            kr[i] = vr[i] = 0.0f;
    }
#pragma unroll
    for (int i = 0; i < 16; i++)
        dk[i] = dv[i] = 0.0f;

    for (int q0 = k0; q0 < t; q0 += kAttTile) {
        __syncthreads();
        load_tile<HS>(qs, base, c3, q0, t, hs, vec);
        load_tile<HS>(ds, dbase, c, q0, t, hs, vec);
        for (int i = threadIdx.x; i < kAttTile; i += blockDim.x) {
            bool in = q0 + i < t;
            ls[i] = in ? lse[lbase + q0 + i] : INFINITY;
            dd[i] = in ? dsum[lbase + q0 + i] : 0.0f;
        }
        __syncthreads();
        for (int i0 = 0; i0 < kAttTile && q0 + i0 < t; i0 += kAttKvChunk) {
            if (q0 + i0 + kAttKvChunk - 1 < wfirst)
                continue; /* these queries come before every key of the warp */
            float s[kAttKvChunk], dp[kAttKvChunk];
#pragma unroll
            for (int u = 0; u < kAttKvChunk; u++) {
                s[u] = dot_part<HS>(kr, qs + (i0 + u) * HS, g);
                dp[u] = dot_part<HS>(vr, ds + (i0 + u) * HS, g);
            }
#pragma unroll
            for (int u = 0; u < kAttKvChunk; u++) {
                s[u] = row_sum<Gm::G>(s[u]);
                dp[u] = row_sum<Gm::G>(dp[u]);
            }
#pragma unroll
            for (int u = 0; u < kAttKvChunk; u++) {
                const int qi = q0 + i0 + u;
                /* rows past t have lse = inf: p = 0 */
                float p = kj <= qi ? __expf(s[u] * scale - ls[i0 + u]) : 0.0f;
                axpy<HS>(dv, p, ds + (i0 + u) * HS, g);
                axpy<HS>(dk, p * (dp[u] - dd[i0 + u]), qs + (i0 + u) * HS, g);
            }
        }
    }
    if (kj < t) {
        float *row = dqkv + ((size_t)bi * t + kj) * c3 + (size_t)h * hs;
        store_row<HS>(row + c, hs, vec, g, scale, dk);
        store_row<HS>(row + 2 * (size_t)c, hs, vec, g, 1.0f, dv);
    }
}

/* fn(std::integral_constant<int, HS>) with HS the head size rounded up to 32, 64 or 128. */
template <class Fn> int with_hs(int hs, Fn fn)
{
    if (hs <= 32)
        return fn(std::integral_constant<int, 32>());
    if (hs <= 64)
        return fn(std::integral_constant<int, 64>());
    return fn(std::integral_constant<int, 128>());
}

int check_shape(const char *op, int b, int t, int c, int nh, mgpu_err_t *err)
{
    if (nh <= 0 || c % nh != 0 || c / nh > kAttMaxHs)
        return mgpu_err_set(err, MGPU_E_RANGE,
                            "%s (cuda): %d heads of %d channels, expected a head size c/nh of "
                            "1..%d",
                            op, nh, c, kAttMaxHs);
    if (nh > 65535 || b > 65535)
        return mgpu_err_set(err, MGPU_E_RANGE,
                            "%s (cuda): batch %d, %d heads, expected at most 65535 of each", op, b,
                            nh);
    return 0;
}

} /* namespace */

int gpt_attention_forward(void *impl, int b, int t, int c, int nh, const float *qkv, float *out,
                          float *lse, mgpu_err_t *err)
{
    cuda_impl *ci = (cuda_impl *)impl;
    int rc = check_shape("attention_forward", b, t, c, nh, err);
    if (rc < 0)
        return rc;
    invalidate(ci, out, sizeof(float) * b * (size_t)t * c);
    invalidate(ci, lse, sizeof(float) * b * (size_t)nh * t);
    if (b == 0 || t == 0)
        return 0;
    const int hs = c / nh;
    const bool vec = hs % 4 == 0 && aligned16(qkv, out);
    const float scale = (float)(1.0 / sqrt((double)hs));
    if (ci->prec == MGPU_PREC_BF16) /* bf16 operands on tensor cores, fp32 softmax */
        return gpt_attention_forward_tc(ci, b, t, c, nh, qkv, out, lse, scale, err);
    if (gpt_attention_x3_ok(ci)) /* fp32 products in three TF32 ones, on tensor cores */
        return gpt_attention_forward_x3(ci, b, t, c, nh, qkv, out, lse, scale, vec, err);
    return with_hs(hs, [&](auto hc) {
        constexpr int HS = decltype(hc)::value;
        dim3 grid((unsigned)((t + Geom<HS>::ROWS - 1) / Geom<HS>::ROWS), (unsigned)nh, (unsigned)b);
        att_fwd_kernel<HS>
            <<<grid, kAttWarps * 32, 0, ci->stream>>>(t, c, nh, qkv, out, lse, scale, vec);
        CUDA_CHECK_LAUNCH(err, "att_fwd_kernel<%d> (b=%d t=%d c=%d nh=%d)", HS, b, t, c, nh);
        return 0;
    });
}

int gpt_attention_backward(void *impl, int b, int t, int c, int nh, const float *dout,
                           const float *qkv, const float *out, const float *lse, float *dqkv,
                           mgpu_err_t *err)
{
    cuda_impl *ci = (cuda_impl *)impl;
    int rc = check_shape("attention_backward", b, t, c, nh, err);
    if (rc < 0)
        return rc;
    invalidate(ci, dqkv, sizeof(float) * b * (size_t)t * 3 * c);
    if (b == 0 || t == 0)
        return 0;
    /* D = rowsum(dout * out), one float a (batch row, head, query): in the backend's scratch
     * when it fits below the reductions' counter (the GPT-2 shapes: 16 x 12 x 1024 = 196608
     * floats of 2^20), else in the operand workspace, grown on a first eager call. */
    const size_t nd = (size_t)b * nh * t;
    float *dsum = ci->scratch;
    if (nd > kScratchFloats - 1) {
        /* (after the side streams, which may read a bf16 copy in the workspace) */
        if ((rc = cuda_join(impl, err)) < 0 || (rc = ensure_ws(ci, nd * sizeof(float), err)) < 0)
            return rc;
        dsum = (float *)ci->ws;
    }
    const int hs = c / nh;
    const bool vec = hs % 4 == 0 && aligned16(qkv, out, dout, dqkv);
    const float scale = (float)(1.0 / sqrt((double)hs));
    if (ci->prec == MGPU_PREC_BF16)
        return gpt_attention_backward_tc(ci, b, t, c, nh, dout, qkv, out, lse, dqkv, dsum, scale,
                                         err);
    if (gpt_attention_x3_ok(ci))
        return gpt_attention_backward_x3(ci, b, t, c, nh, dout, qkv, out, lse, dqkv, dsum, scale,
                                         vec, err);
    return with_hs(hs, [&](auto hc) {
        constexpr int HS = decltype(hc)::value;
        dim3 grid((unsigned)((t + Geom<HS>::ROWS - 1) / Geom<HS>::ROWS), (unsigned)nh, (unsigned)b);
        att_bwd_q_kernel<HS><<<grid, kAttWarps * 32, 0, ci->stream>>>(t, c, nh, dout, qkv, out, lse,
                                                                      dqkv, dsum, scale, vec);
        CUDA_CHECK_LAUNCH(err, "att_bwd_q_kernel<%d> (b=%d t=%d c=%d nh=%d)", HS, b, t, c, nh);
        att_bwd_kv_kernel<HS><<<grid, kAttWarps * 32, 0, ci->stream>>>(t, c, nh, dout, qkv, lse,
                                                                       dsum, dqkv, scale, vec);
        CUDA_CHECK_LAUNCH(err, "att_bwd_kv_kernel<%d> (b=%d t=%d c=%d nh=%d)", HS, b, t, c, nh);
        return 0;
    });
}

} /* namespace mgpu_cuda */
