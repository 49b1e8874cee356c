/* gpt_bf16.cu - the bf16 path's ops that are not products or attention (gpt_ops.h's
 * mgpu_gpt_bf16_ops_t): fp32 to bf16, LayerNorm's backward (bf16 dy, fp32 dx with an
 * optional bf16 copy; its forward is gpt_cuda.cu's kernel with a bf16 y), and the softmax
 * cross-entropy over bf16 logits (a row read once into shared memory where it fits).
 *
 * Every statistic and sum is fp32 (the loss's in double); bf16 is storage only, each value
 * rounded once (to nearest, ties to even). The reductions run in a fixed order, as
 * gpt_cuda.cu's (per-block partials in the scratch, then an ordered pass), so reruns give the
 * same bits. Nothing here allocates or synchronises: a CUDA graph may capture every op. */
#include "gpt_cuda_impl.h" /* cuda_impl, the device helpers, the ops' declarations */
#include "cuda_check.h"    /* CUDA_CHECK, CUDA_CHECK_LAUNCH */

#include <atomic>   /* std::atomic: the per-device shared memory opt-in */
#include <limits.h> /* INT_MAX */

namespace mgpu_cuda
{
namespace
{

constexpr int kLnWarps = 8;            /* rows of a LayerNorm block, a warp each */
constexpr int kLnRegChunks = 8;        /* the register backward: up to 8 * 256 channels */
constexpr int kXentRowChunk = 1 << 19; /* rows whose losses the scratch holds at once */
constexpr int kXentWarpCols = 1024;    /* up to this vocabulary a warp a row, else a block */
/* A block a row: 1024 threads and 2 blocks an SM keep about 264 rows of 50304 logits (26 MB
 * on an H200) in flight, so the gradient's second read of a row finds it in L2. */
constexpr int kXentBlockThreads = 1024;
constexpr int kXentBlocksPerSm = 2;
/* A block a row with the row in shared memory (one read of the logits): 512 threads and 2
 * blocks an SM (a 50304-logit row is 100 KB) keep 64 KB of loads an SM in flight. */
constexpr int kXentSmemThreads = 512;
constexpr int kXentSmemBatch = 4; /* 16-byte loads a thread issues before using them */
constexpr int kXentSmemRed = 256; /* bytes after the row: the block's (max, sum) per warp */
constexpr int kMaxDevices = 64;   /* devices whose smem opt-in is remembered */

inline bool is_aligned8(const void *p)
{
    return ((uintptr_t)p & 7u) == 0;
}

struct ToBf16 {
    const float *x;
    mgpu_bf16_t *y;
    __device__ void vec(size_t i) const
    {
        st_bf4(y, i, ld4(x, i));
    }
    __device__ void one(size_t i) const
    {
        y[i] = (mgpu_bf16_t)bf_bits(x[i]);
    }
};

/* GELU of a bf16 pre-activation, as the fp32 op computes it (act_f), rounded to bf16. */
struct Gelu16 {
    const mgpu_bf16_t *pre;
    mgpu_bf16_t *out;
    __device__ void vec(size_t i) const
    {
        float4 v = ld_bf4(pre, i);
        v.x = act_f<MGPU_ACT_GELU>(v.x), v.y = act_f<MGPU_ACT_GELU>(v.y);
        v.z = act_f<MGPU_ACT_GELU>(v.z), v.w = act_f<MGPU_ACT_GELU>(v.w);
        st_bf4(out, i, v);
    }
    __device__ void one(size_t i) const
    {
        out[i] = (mgpu_bf16_t)bf_bits(act_f<MGPU_ACT_GELU>(bf_f(pre[i])));
    }
};

/* --- LayerNorm ----------------------------------------------------------------------------- */

/* gpt_cuda.cu's ln_bwd_kernel on a bf16 dy: dx += rstd * (dnorm - mean(dnorm) - norm *
 * mean(dnorm * norm)), dnorm = w * dy, a warp a row, and dx16 = bf16(dx) after the add when
 * dx16 is not NULL, and y = bf16(norm * w + b) (the forward's output, the same bits as
 * layernorm_forward's from the same mean and rstd: it runs that expression in that order)
 * when y is not NULL, its rows ldy apart; dw and db summed per warp in shared memory (2c
 * floats a warp, a lane's own columns only), then the block's warps in order into
 * part[block] (2c floats), which ln16_bwd_finish_kernel adds over the blocks in order. The
 * general form: rows the register form below does not take (c not a multiple of 8 or above
 * 2048, unaligned buffers). */
template <bool VEC>
__global__ void __launch_bounds__(kLnWarps * 32)
    ln16_bwd_kernel(int n, int c, const mgpu_bf16_t *dy, const float *x, const float *w,
                    const float *b, const float *mean, const float *rstd, float *dx,
                    mgpu_bf16_t *dx16, mgpu_bf16_t *y, size_t ldy, int planes, float *part)
{
    extern __shared__ float ln16_acc[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float *acc = ln16_acc + (size_t)warp * planes * c;
    for (int j = lane; j < planes * c; j += 32)
        acc[j] = 0.0f;
    __syncwarp(); /* the float4 path adds into words other lanes zeroed */
    for (int row = blockIdx.x * nw + warp; row < n; row += gridDim.x * nw) {
        const mgpu_bf16_t *dyr = dy + (size_t)row * c;
        const float *xr = x + (size_t)row * c;
        float *dxr = dx + (size_t)row * c;
        mgpu_bf16_t *d16r = dx16 != nullptr ? dx16 + (size_t)row * c : nullptr;
        mgpu_bf16_t *yr = y != nullptr ? y + (size_t)row * ldy : nullptr;
        const float m = mean[row], s = rstd[row];
        float a = 0.0f, bn = 0.0f;
        if (VEC)
            for (int j = lane; j < c / 4; j += 32) {
                float4 d = ld_bf4(dyr, j), xv = ld4(xr, j), wv = ld4(w, j);
                a += (wv.x * d.x + wv.y * d.y) + (wv.z * d.z + wv.w * d.w);
                bn += (wv.x * d.x * ((xv.x - m) * s) + wv.y * d.y * ((xv.y - m) * s)) +
                      (wv.z * d.z * ((xv.z - m) * s) + wv.w * d.w * ((xv.w - m) * s));
            }
        else
            for (int j = lane; j < c; j += 32) {
                float dn = w[j] * bf_f(dyr[j]);
                a += dn;
                bn += dn * ((xr[j] - m) * s);
            }
        a = warp_sum(a) / c;
        bn = warp_sum(bn) / c;
        if (VEC)
            for (int j = lane; j < c / 4; j += 32) {
                float4 d = ld_bf4(dyr, j), xv = ld4(xr, j), wv = ld4(w, j), o = ld4(dxr, j);
                float nx = (xv.x - m) * s, ny = (xv.y - m) * s, nz = (xv.z - m) * s,
                      nq = (xv.w - m) * s;
                o.x += s * (wv.x * d.x - a - nx * bn);
                o.y += s * (wv.y * d.y - a - ny * bn);
                o.z += s * (wv.z * d.z - a - nz * bn);
                o.w += s * (wv.w * d.w - a - nq * bn);
                st4(dxr, j, o);
                if (d16r != nullptr)
                    st_bf4(d16r, j, o);
                if (yr != nullptr) {
                    const float4 bv = ld4(b, j);
                    st_bf4(yr, j,
                           make_float4(nx * wv.x + bv.x, ny * wv.y + bv.y, nz * wv.z + bv.z,
                                       nq * wv.w + bv.w));
                }
                if (planes == 3) {
                    float4 *as = reinterpret_cast<float4 *>(acc + 2 * c) + j;
                    float4 t3 = *as;
                    t3.x += bf_round(o.x), t3.y += bf_round(o.y), t3.z += bf_round(o.z),
                        t3.w += bf_round(o.w);
                    *as = t3;
                }
                float4 *aw = reinterpret_cast<float4 *>(acc) + j;
                float4 *ab = reinterpret_cast<float4 *>(acc + c) + j;
                float4 t = *aw;
                t.x += nx * d.x, t.y += ny * d.y, t.z += nz * d.z, t.w += nq * d.w;
                *aw = t;
                t = *ab;
                t.x += d.x, t.y += d.y, t.z += d.z, t.w += d.w;
                *ab = t;
            }
        else
            for (int j = lane; j < c; j += 32) {
                float nv = (xr[j] - m) * s, d = bf_f(dyr[j]);
                float o = dxr[j] + s * (w[j] * d - a - nv * bn);
                dxr[j] = o;
                if (d16r != nullptr)
                    d16r[j] = (mgpu_bf16_t)bf_bits(o);
                if (yr != nullptr)
                    yr[j] = (mgpu_bf16_t)bf_bits(nv * w[j] + b[j]);
                acc[j] += nv * d;
                acc[c + j] += d;
                if (planes == 3)
                    acc[2 * c + j] += bf_round(o);
            }
    }
    __syncthreads();
    for (int j = threadIdx.x; j < planes * c; j += blockDim.x) {
        float v = 0.0f;
        for (int k = 0; k < nw; k++)
            v += ln16_acc[(size_t)k * planes * c + j];
        part[(size_t)blockIdx.x * planes * c + j] = v;
    }
}

/* Eight bf16 at p + 8i (16 bytes, aligned) as floats, and eight floats stored as bf16. */
__device__ __forceinline__ void unpack_bf8(uint4 u, float f[8])
{
    f[0] = bf_lo(u.x), f[1] = bf_hi(u.x), f[2] = bf_lo(u.y), f[3] = bf_hi(u.y);
    f[4] = bf_lo(u.z), f[5] = bf_hi(u.z), f[6] = bf_lo(u.w), f[7] = bf_hi(u.w);
}

/* ln16_bwd_kernel for c a multiple of 8, at most 256 * NCH, and 16-byte aligned rows: lane l
 * of a warp owns the 8-column chunks l, l + 32, ... of every row it visits, so a row's dy (16
 * bytes a chunk), x and dx are all loaded at once into registers before the row's two sums
 * (one read of each, with every load of a row in flight together: the op is bound by memory
 * bandwidth, not by latency). The dw and db partials stay in shared memory, a warp's own,
 * laid out as four planes (dw of columns 0-3 of each chunk, dw of 4-7, db 0-3, db 4-7) of
 * c / 8 float4 each, so that a warp's 32 consecutive chunks are 32 consecutive float4 (no
 * bank conflicts). The block's warps are then added in order into part[block]. */
template <int NCH>
__global__ void __launch_bounds__(kLnWarps * 32)
    ln16_bwd_reg_kernel(int n, int c, const mgpu_bf16_t *dy, const float *x, const float *w,
                        const float *b, const float *mean, const float *rstd, float *dx,
                        mgpu_bf16_t *dx16, mgpu_bf16_t *y, size_t ldy, int planes, float *part)
{
    extern __shared__ float4 ln16_acc4[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int c8 = c / 8;
    float4 *acc = ln16_acc4 + (size_t)warp * 2 * planes * c8;
    for (int j = lane; j < 2 * planes * c8; j += 32)
        acc[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    __syncwarp(); /* a lane adds into words other lanes zeroed */
    const float4 *w4 = reinterpret_cast<const float4 *>(w);
    for (int row = blockIdx.x * nw + warp; row < n; row += gridDim.x * nw) {
        const uint4 *dyr = reinterpret_cast<const uint4 *>(dy + (size_t)row * c);
        const float4 *xr = reinterpret_cast<const float4 *>(x + (size_t)row * c);
        float4 *dxr = reinterpret_cast<float4 *>(dx + (size_t)row * c);
        uint4 d16[NCH];
        float4 xv[NCH][2], ov[NCH][2];
#pragma unroll
        for (int k = 0; k < NCH; k++) {
            const int j = lane + 32 * k;
            if (j < c8) {
                d16[k] = __ldcs(dyr + j);
                xv[k][0] = __ldcs(xr + 2 * j);
                xv[k][1] = __ldcs(xr + 2 * j + 1);
                ov[k][0] = dxr[2 * j];
                ov[k][1] = dxr[2 * j + 1];
            }
        }
        const float m = mean[row], s = rstd[row];
        float a = 0.0f, bn = 0.0f;
#pragma unroll
        for (int k = 0; k < NCH; k++) {
            const int j = lane + 32 * k;
            if (j < c8) {
                float d[8];
                unpack_bf8(d16[k], d);
                const float4 w0 = w4[2 * j], w1 = w4[2 * j + 1];
                const float wv[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
                const float xs[8] = {xv[k][0].x, xv[k][0].y, xv[k][0].z, xv[k][0].w,
                                     xv[k][1].x, xv[k][1].y, xv[k][1].z, xv[k][1].w};
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    const float dn = wv[e] * d[e];
                    a += dn;
                    bn += dn * ((xs[e] - m) * s);
                }
            }
        }
        a = warp_sum(a) / c;
        bn = warp_sum(bn) / c;
#pragma unroll
        for (int k = 0; k < NCH; k++) {
            const int j = lane + 32 * k;
            if (j < c8) {
                float d[8];
                unpack_bf8(d16[k], d);
                const float4 w0 = w4[2 * j], w1 = w4[2 * j + 1];
                const float wv[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
                const float xs[8] = {xv[k][0].x, xv[k][0].y, xv[k][0].z, xv[k][0].w,
                                     xv[k][1].x, xv[k][1].y, xv[k][1].z, xv[k][1].w};
                float o[8] = {ov[k][0].x, ov[k][0].y, ov[k][0].z, ov[k][0].w,
                              ov[k][1].x, ov[k][1].y, ov[k][1].z, ov[k][1].w};
                float nx[8];
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    nx[e] = (xs[e] - m) * s;
                    o[e] += s * (wv[e] * d[e] - a - nx[e] * bn);
                }
                dxr[2 * j] = make_float4(o[0], o[1], o[2], o[3]);
                dxr[2 * j + 1] = make_float4(o[4], o[5], o[6], o[7]);
                if (dx16 != nullptr)
                    reinterpret_cast<uint4 *>(dx16 + (size_t)row * c)[j] =
                        make_uint4(bf_pack(o[0], o[1]), bf_pack(o[2], o[3]), bf_pack(o[4], o[5]),
                                   bf_pack(o[6], o[7]));
                if (y != nullptr) {
                    const float4 b0 = reinterpret_cast<const float4 *>(b)[2 * j],
                                 b1 = reinterpret_cast<const float4 *>(b)[2 * j + 1];
                    const float bv[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
                    float yv[8];
#pragma unroll
                    for (int e = 0; e < 8; e++)
                        yv[e] = nx[e] * wv[e] + bv[e];
                    reinterpret_cast<uint4 *>(y + (size_t)row * ldy)[j] =
                        make_uint4(bf_pack(yv[0], yv[1]), bf_pack(yv[2], yv[3]),
                                   bf_pack(yv[4], yv[5]), bf_pack(yv[6], yv[7]));
                }
                float4 t = acc[j];
                t.x += nx[0] * d[0], t.y += nx[1] * d[1], t.z += nx[2] * d[2], t.w += nx[3] * d[3];
                acc[j] = t;
                t = acc[c8 + j];
                t.x += nx[4] * d[4], t.y += nx[5] * d[5], t.z += nx[6] * d[6], t.w += nx[7] * d[7];
                acc[c8 + j] = t;
                t = acc[2 * c8 + j];
                t.x += d[0], t.y += d[1], t.z += d[2], t.w += d[3];
                acc[2 * c8 + j] = t;
                t = acc[3 * c8 + j];
                t.x += d[4], t.y += d[5], t.z += d[6], t.w += d[7];
                acc[3 * c8 + j] = t;
                if (planes == 3) {
                    t = acc[4 * c8 + j];
                    t.x += bf_round(o[0]), t.y += bf_round(o[1]), t.z += bf_round(o[2]),
                        t.w += bf_round(o[3]);
                    acc[4 * c8 + j] = t;
                    t = acc[5 * c8 + j];
                    t.x += bf_round(o[4]), t.y += bf_round(o[5]), t.z += bf_round(o[6]),
                        t.w += bf_round(o[7]);
                    acc[5 * c8 + j] = t;
                }
            }
        }
    }
    __syncthreads();
    /* Column col of dw (col < c), db (col - c) or dsum (col - 2c): plane 2 * (col / c) +
     * (col % 8 >= 4), chunk (col % c) / 8, element col % 4. */
    const float *accf = reinterpret_cast<const float *>(ln16_acc4);
    for (int col = threadIdx.x; col < planes * c; col += blockDim.x) {
        const int cc = col % c;
        const int plane = 2 * (col / c) + ((cc & 7) >= 4);
        const size_t at = 4 * ((size_t)plane * c8 + cc / 8) + (cc & 3);
        float v = 0.0f;
        for (int k = 0; k < nw; k++)
            v += accf[(size_t)k * planes * c + at];
        part[(size_t)blockIdx.x * planes * c + col] = v;
    }
}

/* dw[j] += the blocks' partials of column j in block order (= with fresh); db[j] and
 * (planes 3) dsum[j] likewise. A block takes 32 columns (coalesced reads of each partial row): warp
 * k adds the partials k, k + 8, ... and the 8 warps' sums are then added in order, a fixed order
 * whatever the schedule. */
constexpr int kLnFinishWarps = 8;
__global__ void __launch_bounds__(kLnFinishWarps * 32)
    ln16_bwd_finish_kernel(int c, int planes, int blocks, const float *part, float *dw, float *db,
                           float *dsum, bool fresh)
{
    __shared__ float sum[kLnFinishWarps][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int j = blockIdx.x * 32 + lane, cols = planes * c;
    float v = 0.0f;
    if (j < cols)
        for (int k = warp; k < blocks; k += kLnFinishWarps)
            v += part[(size_t)k * cols + j];
    sum[warp][lane] = v;
    __syncthreads();
    if (warp != 0 || j >= cols)
        return;
    v = sum[0][lane];
    for (int k = 1; k < kLnFinishWarps; k++)
        v += sum[k][lane];
    float *out = j < c ? dw + j : j < 2 * c ? db + (j - c) : dsum + (j - 2 * c);
    *out = fresh ? v : *out + v;
}

/* --- softmax cross-entropy ----------------------------------------------------------------- */

/* (m, s) of a softmax's running maximum and sum, merged. */
__device__ __forceinline__ void ms_merge(float &m, float &s, float m2, float s2)
{
    float mx = fmaxf(m, m2);
    if (mx == -INFINITY)
        return;
    s = s * __expf(m - mx) + s2 * __expf(m2 - mx);
    m = mx;
}

__device__ __forceinline__ void ms_warp(float &m, float &s)
{
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        ms_merge(m, s, m2, s2);
    }
}

/* Adds the eight logits of u to (m, s): their maximum first, so that the running sum is
 * rescaled once per eight rather than once per new maximum. e^(f - m) is 2^(f log2(e) -
 * m log2(e)): one fma and one ex2 a logit. */
__device__ __forceinline__ void ms_add8(float &m, float &s, uint4 u)
{
    const float f[8] = {bf_lo(u.x), bf_hi(u.x), bf_lo(u.y), bf_hi(u.y),
                        bf_lo(u.z), bf_hi(u.z), bf_lo(u.w), bf_hi(u.w)};
    float mx = m;
    for (int k = 0; k < 8; k++)
        mx = fmaxf(mx, f[k]);
    if (mx == -INFINITY)
        return; /* every logit so far is -inf (or NaN, which the sum below would carry) */
    s = m == -INFINITY ? 0.0f : s * __expf(m - mx);
    m = mx;
    const float ml = mx * kLog2e;
    for (int k = 0; k < 8; k++)
        s += ex2(fmaf(f[k], kLog2e, -ml));
}

/* The gradient of eight logits u (columns 8 j ..), rounded to bf16: p scale = 2^(x log2(e) -
 * ml) k each, k = scale / s (NaN for a row whose target is out of range), less scale at the
 * target when it is one of them (tw == j: at t7). The target's test is once a word, so a
 * logit costs an fma, an ex2, a multiply and half a conversion. */
__device__ __forceinline__ uint4 xent_grad8(uint4 u, int j, float ml, float k, int tw, int t7,
                                            float scale)
{
    const unsigned in[4] = {u.x, u.y, u.z, u.w};
    float g[8];
#pragma unroll
    for (int e = 0; e < 4; e++) {
        g[2 * e] = ex2(fmaf(bf_lo(in[e]), kLog2e, -ml)) * k;
        g[2 * e + 1] = ex2(fmaf(bf_hi(in[e]), kLog2e, -ml)) * k;
    }
    if (j == tw) {
#pragma unroll
        for (int e = 0; e < 8; e++)
            if (e == t7)
                g[e] -= scale;
    }
    return make_uint4(pack_bf16(g[0], g[1]), pack_bf16(g[2], g[3]), pack_bf16(g[4], g[5]),
                      pack_bf16(g[6], g[7]));
}

/* One row of the softmax cross-entropy over bf16 logits with LANES threads (a warp, or the
 * block when BLOCK), in fp32: the row's maximum and sum of exponentials online in one read,
 * its loss -log p[target] into *loss_out and, with grad, a second read (from L1 or L2) that
 * overwrites the logits with bf16(scale * (p - onehot)). VEC: 16-byte accesses, eight logits
 * each (vocab a multiple of 8, the logits 16-byte aligned). An out-of-range target makes the
 * row's loss and gradient NaN (the host cannot be told without a sync). */
template <bool BLOCK, bool VEC>
__device__ __forceinline__ void xent16_row(int vocab, mgpu_bf16_t *lr, int32_t target, float scale,
                                           bool grad, float *loss_out, int tid, int lanes)
{
    float m = -INFINITY, s = 0.0f;
    if (VEC) {
        const uint4 *l4 = reinterpret_cast<const uint4 *>(lr);
#pragma unroll 4
        for (int j = tid; j < vocab / 8; j += lanes)
            ms_add8(m, s, l4[j]);
    } else {
        for (int j = tid; j < vocab; j += lanes) {
            float v = bf_f(lr[j]);
            if (v > m) {
                s = s * __expf(m - v) + 1.0f;
                m = v;
            } else {
                s += __expf(v - m);
            }
        }
    }
    ms_warp(m, s);
    if (BLOCK) {
        __shared__ float pm[32], ps[32];
        const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
        __syncthreads(); /* the previous row's readers are done */
        if (lane == 0)
            pm[w] = m, ps[w] = s;
        __syncthreads();
        m = lane < nw ? pm[lane] : -INFINITY;
        s = lane < nw ? ps[lane] : 0.0f;
        ms_warp(m, s);
    }
    const bool ok = target >= 0 && target < vocab;
    if (tid == 0)
        *loss_out = ok ? m + logf(s) - bf_f(lr[target]) : NAN;
    if (!grad)
        return;
    if (BLOCK)
        __syncthreads(); /* lr[target] is read before it is overwritten */
    else
        __syncwarp();
    const float inv = 1.0f / s;
    if (VEC) {
        uint4 *l4 = reinterpret_cast<uint4 *>(lr);
        const float ml = m * kLog2e, k = ok ? scale * inv : NAN;
        const int tw = ok ? target >> 3 : -1, t7 = target & 7;
#pragma unroll 4
        for (int j = tid; j < vocab / 8; j += lanes)
            l4[j] = xent_grad8(l4[j], j, ml, k, tw, t7, scale);
    } else {
        for (int j = tid; j < vocab; j += lanes) {
            float p = __expf(bf_f(lr[j]) - m) * inv;
            lr[j] = (mgpu_bf16_t)bf_bits(ok ? scale * (p - (j == target ? 1.0f : 0.0f)) : NAN);
        }
    }
}

template <bool VEC>
__global__ void __launch_bounds__(kXentBlockThreads)
    xent16_block_kernel(int rows, int vocab, mgpu_bf16_t *logits, const int32_t *targets,
                        float scale, bool grad, float *rowloss)
{
    for (int r = blockIdx.x; r < rows; r += gridDim.x)
        xent16_row<true, VEC>(vocab, logits + (size_t)r * vocab, targets[r], scale, grad,
                              rowloss + r, threadIdx.x, blockDim.x);
}

template <bool VEC>
__global__ void __launch_bounds__(kThreads)
    xent16_warp_kernel(int rows, int vocab, mgpu_bf16_t *logits, const int32_t *targets,
                       float scale, bool grad, float *rowloss)
{
    const int warps = blockDim.x >> 5;
    for (int r = blockIdx.x * warps + (threadIdx.x >> 5); r < rows; r += gridDim.x * warps)
        xent16_row<false, VEC>(vocab, logits + (size_t)r * vocab, targets[r], scale, grad,
                               rowloss + r, threadIdx.x & 31, 32);
}

/* xent16_row for a block a row with the row kept in shared memory: the logits are read from
 * global memory once (into the shared copy, with the running maximum and sum), and the
 * gradient is computed from the copy, so a row costs one read and one write. The dynamic
 * shared memory holds the row (rounded up to 16 bytes) and then kXentSmemRed bytes for the
 * block's per-warp (max, sum). Same sums in the same roles as xent16_row, hence the same
 * NaN behaviour: an out-of-range target or a NaN logit makes the row NaN. VEC: 16-byte
 * accesses (vocab a multiple of 8, the logits 16-byte aligned), kXentSmemBatch loads a thread
 * in flight before it uses them. */
template <bool VEC>
__global__ void __launch_bounds__(kXentSmemThreads, 2)
    xent16_smem_kernel(int rows, int vocab, mgpu_bf16_t *logits, const int32_t *targets,
                       float scale, bool grad, float *rowloss)
{
    extern __shared__ uint4 xent16_row_smem[];
    const int words = (vocab + 7) / 8, tid = threadIdx.x, lanes = blockDim.x;
    const int lane = tid & 31, wp = tid >> 5, nw = lanes >> 5;
    mgpu_bf16_t *sh = reinterpret_cast<mgpu_bf16_t *>(xent16_row_smem);
    float *pm = reinterpret_cast<float *>(xent16_row_smem + words), *ps = pm + 32;
    for (int r = blockIdx.x; r < rows; r += gridDim.x) {
        mgpu_bf16_t *lr = logits + (size_t)r * vocab;
        const int32_t target = targets[r];
        float m = -INFINITY, s = 0.0f;
        __syncthreads(); /* the previous row's readers of the copy and of pm, ps are done */
        if (VEC) {
            const uint4 *l4 = reinterpret_cast<const uint4 *>(lr);
            for (int j0 = tid; j0 < words; j0 += kXentSmemBatch * lanes) {
                uint4 u[kXentSmemBatch];
#pragma unroll
                for (int k = 0; k < kXentSmemBatch; k++)
                    if (j0 + k * lanes < words)
                        u[k] = __ldcs(l4 + j0 + k * lanes);
#pragma unroll
                for (int k = 0; k < kXentSmemBatch; k++)
                    if (j0 + k * lanes < words) {
                        xent16_row_smem[j0 + k * lanes] = u[k];
                        ms_add8(m, s, u[k]);
                    }
            }
        } else {
            for (int j = tid; j < vocab; j += lanes) {
                const mgpu_bf16_t h = lr[j];
                sh[j] = h;
                const float v = bf_f(h);
                if (v > m) {
                    s = s * __expf(m - v) + 1.0f;
                    m = v;
                } else {
                    s += __expf(v - m);
                }
            }
        }
        ms_warp(m, s);
        if (lane == 0)
            pm[wp] = m, ps[wp] = s;
        __syncthreads(); /* also: the whole row is in the copy */
        m = lane < nw ? pm[lane] : -INFINITY;
        s = lane < nw ? ps[lane] : 0.0f;
        ms_warp(m, s);
        const bool ok = target >= 0 && target < vocab;
        if (tid == 0)
            rowloss[r] = ok ? m + logf(s) - bf_f(sh[target]) : NAN;
        if (!grad)
            continue;
        const float inv = 1.0f / s;
        if (VEC) {
            uint4 *l4 = reinterpret_cast<uint4 *>(lr);
            const float ml = m * kLog2e, k = ok ? scale * inv : NAN;
            const int tw = ok ? target >> 3 : -1, t7 = target & 7;
#pragma unroll 4
            for (int j = tid; j < words; j += lanes)
                l4[j] = xent_grad8(xent16_row_smem[j], j, ml, k, tw, t7, scale);
        } else {
            for (int j = tid; j < vocab; j += lanes) {
                float p = __expf(bf_f(sh[j]) - m) * inv;
                lr[j] = (mgpu_bf16_t)bf_bits(ok ? scale * (p - (j == target ? 1.0f : 0.0f)) : NAN);
            }
        }
    }
}

/* loss[0] += scale * the sum of rowloss[0..rows) (one block, a fixed order, in double). */
__global__ void __launch_bounds__(kThreads)
    xent16_loss_kernel(int rows, const float *rowloss, double scale, float *loss)
{
    double s = 0.0;
    for (int i = threadIdx.x; i < rows; i += blockDim.x)
        s += rowloss[i];
    s = block_sum(s);
    if (threadIdx.x == 0)
        *loss = (float)((double)*loss + s * scale);
}

} /* namespace */

/* --- the ops ------------------------------------------------------------------------------- */

int gpt16_to_bf16(void *impl, size_t n, const float *x, mgpu_bf16_t *y, mgpu_err_t *err)
{
    if (n == 0)
        return 0;
    return launch_ew((cuda_impl *)impl, ToBf16{x, y}, n, aligned16(x) && is_aligned8(y),
                     "gpt16_to_bf16", err);
}

int gpt16_gelu(void *impl, size_t n, const mgpu_bf16_t *pre, mgpu_bf16_t *out, mgpu_err_t *err)
{
    if (n == 0)
        return 0;
    return launch_ew((cuda_impl *)impl, Gelu16{pre, out}, n, is_aligned8(pre) && is_aligned8(out),
                     "gpt16_gelu", err);
}

int gpt16_to_bf16_2d(void *impl, int rows, int cols, const float *x, size_t ldx, mgpu_bf16_t *y,
                     size_t ldy, mgpu_err_t *err)
{
    if (rows < 0 || cols < 0 || (rows > 1 && ldy < (size_t)cols) || ldx > (size_t)INT_MAX ||
        ldy > (size_t)INT_MAX)
        return mgpu_err_set(err, MGPU_E_RANGE,
                            "gpt16_to_bf16_2d: %d rows of %d, x's %zu and y's %zu apart: expected "
                            "rows and columns >= 0, y's rows at least a row apart, strides below "
                            "2^31",
                            rows, cols, ldx, ldy);
    if (rows == 0 || cols == 0)
        return 0;
    /* the backend's strided conversion (cublas.cu), which the fp32 ops' bf16 operands take */
    return to_bf16((cuda_impl *)impl, rows, cols, x, (int)ldx, reinterpret_cast<__nv_bfloat16 *>(y),
                   (int)ldy, err);
}

/* The block opt-in shared memory of ci's device, granted to every form of the LayerNorm
 * backward on the device's first call (outside any capture: the trainer's first step is
 * eager), then remembered: no attribute is set while a step is captured. */
static int ln_smem_limit(cuda_impl *ci, size_t *limit, mgpu_err_t *err)
{
    static std::atomic<int> granted[kMaxDevices];
    int optin = ci->device >= 0 && ci->device < kMaxDevices
                    ? granted[ci->device].load(std::memory_order_acquire)
                    : 0;
    if (optin == 0) {
        CUDA_CHECK(err, cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                               ci->device));
        const void *kerns[] = {
            (const void *)ln16_bwd_reg_kernel<1>, (const void *)ln16_bwd_reg_kernel<2>,
            (const void *)ln16_bwd_reg_kernel<3>, (const void *)ln16_bwd_reg_kernel<4>,
            (const void *)ln16_bwd_reg_kernel<6>, (const void *)ln16_bwd_reg_kernel<8>,
            (const void *)ln16_bwd_kernel<true>,  (const void *)ln16_bwd_kernel<false>};
        for (const void *k : kerns)
            CUDA_CHECK(err,
                       cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
        if (ci->device >= 0 && ci->device < kMaxDevices)
            granted[ci->device].store(optin, std::memory_order_release);
    }
    *limit = (size_t)optin;
    return 0;
}

int gpt16_layernorm_backward(void *impl, int n, int c, const mgpu_bf16_t *dy, const float *x,
                             const float *w, const float *b, const float *mean, const float *rstd,
                             float *dx, mgpu_bf16_t *dx16, float *dw, float *db, float *dsum,
                             mgpu_bf16_t *y, size_t ldy, int fresh, mgpu_err_t *err)
{
    cuda_impl *ci = (cuda_impl *)impl;
    invalidate(ci, dx, sizeof(float) * n * (size_t)c);
    invalidate(ci, dw, sizeof(float) * c);
    invalidate(ci, db, sizeof(float) * c);
    if (dsum != nullptr && dx16 == nullptr)
        return mgpu_err_set(err, MGPU_E_USAGE,
                            "layernorm_backward (cuda, bf16): dsum sums dx16, which is NULL");
    if (y != nullptr && b == nullptr)
        return mgpu_err_set(err, MGPU_E_USAGE,
                            "layernorm_backward (cuda, bf16): the output y needs the bias b, "
                            "which is NULL");
    if (y != nullptr && ldy < (size_t)c)
        return mgpu_err_set(err, MGPU_E_RANGE,
                            "layernorm_backward (cuda, bf16): y's rows %zu elements apart, "
                            "expected at least c = %d",
                            ldy, c);
    if (n == 0 && fresh && c > 0) { /* sums over no rows */
        CUDA_CHECK(err, cudaMemsetAsync(dw, 0, sizeof(float) * c, ci->stream));
        CUDA_CHECK(err, cudaMemsetAsync(db, 0, sizeof(float) * c, ci->stream));
        if (dsum != nullptr)
            CUDA_CHECK(err, cudaMemsetAsync(dsum, 0, sizeof(float) * c, ci->stream));
    }
    if (n == 0 || c == 0)
        return 0;
    /* Shared memory: planes x c floats a warp (dw, db and with dsum its sums); fewer warps a
     * block for wide rows. */
    const int planes = dsum != nullptr ? 3 : 2;
    size_t optin = 0;
    int rc = ln_smem_limit(ci, &optin, err);
    if (rc < 0)
        return rc;
    size_t per_warp = (size_t)planes * c * sizeof(float);
    int warps = (int)(optin / per_warp < (size_t)kLnWarps ? optin / per_warp : (size_t)kLnWarps);
    /* The partials (planes x c floats a block) stay below the scratch's counter word. */
    long by_scratch = (long)((kScratchFloats - 1) / ((size_t)planes * c));
    if (warps < 1 || by_scratch < 1)
        return mgpu_err_set(err, MGPU_E_RANGE,
                            "layernorm_backward (cuda, bf16): %d channels, expected at most %zu", c,
                            optin / (planes * sizeof(float)));
    size_t smem = per_warp * warps;
    const int nch = (c / 8 + 31) / 32;
    const bool reg = c % 8 == 0 && nch <= kLnRegChunks && aligned16(dy, x, w, dx) &&
                     (dx16 == nullptr || aligned16(dx16)) &&
                     (y == nullptr || (aligned16(y, b) && ldy % 8 == 0));
    bool vec = c % 4 == 0 && aligned16(x, w, dx) && is_aligned8(dy) &&
               (dx16 == nullptr || is_aligned8(dx16)) &&
               (y == nullptr || (aligned16(b) && is_aligned8(y) && ldy % 4 == 0));
    void (*kern)(int, int, const mgpu_bf16_t *, const float *, const float *, const float *,
                 const float *, const float *, float *, mgpu_bf16_t *, mgpu_bf16_t *, size_t, int,
                 float *);
    if (reg)
        kern = nch == 1   ? ln16_bwd_reg_kernel<1>
               : nch == 2 ? ln16_bwd_reg_kernel<2>
               : nch == 3 ? ln16_bwd_reg_kernel<3>
               : nch == 4 ? ln16_bwd_reg_kernel<4>
               : nch <= 6 ? ln16_bwd_reg_kernel<6>  /* 1280 and 1536 channels */
                          : ln16_bwd_reg_kernel<8>; /* 1600 */
    else
        kern = vec ? ln16_bwd_kernel<true> : ln16_bwd_kernel<false>;
    /* As many blocks as the SMs hold at once (registers and shared memory permitting): the
     * more rows in flight, the more of the memory latency is hidden. */
    int per_sm = 0;
    CUDA_CHECK(err, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, warps * 32, smem));
    long need = (n + warps - 1) / warps, cap = (long)ci->sms * (per_sm > 1 ? per_sm : 1);
    long nb = need < cap ? need : cap;
    nb = nb < by_scratch ? nb : by_scratch;
    kern<<<(unsigned)nb, warps * 32, smem, ci->stream>>>(n, c, dy, x, w, b, mean, rstd, dx, dx16, y,
                                                         ldy, planes, ci->scratch);
    CUDA_CHECK_LAUNCH(err, "ln16_bwd_kernel%s (n=%d c=%d, %ld blocks of %d warps)",
                      reg ? " (registers)" : "", n, c, nb, warps);
    ln16_bwd_finish_kernel<<<(unsigned)((planes * c + 31) / 32), kLnFinishWarps * 32, 0,
                             ci->stream>>>(c, planes, (int)nb, ci->scratch, dw, db, dsum,
                                           fresh != 0);
    CUDA_CHECK_LAUNCH(err, "ln16_bwd_finish_kernel (c=%d, %ld blocks)", c, nb);
    return 0;
}

/* The dynamic shared memory xent16_smem_kernel may use on ci's device, in bytes: the block
 * opt-in limit, granted to both of its forms on the device's first call (outside any graph
 * capture: a step is captured only after an eager one), then remembered. */
static int xent_smem_limit(cuda_impl *ci, size_t *limit, mgpu_err_t *err)
{
    static std::atomic<int> granted[kMaxDevices];
    if (ci->device < 0 || ci->device >= kMaxDevices) {
        *limit = 0; /* no record of it: the two-pass kernel */
        return 0;
    }
    int optin = granted[ci->device].load(std::memory_order_acquire);
    if (optin == 0) {
        CUDA_CHECK(err, cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                               ci->device));
        CUDA_CHECK(err, cudaFuncSetAttribute(xent16_smem_kernel<true>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
        CUDA_CHECK(err, cudaFuncSetAttribute(xent16_smem_kernel<false>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
        granted[ci->device].store(optin, std::memory_order_release);
    }
    *limit = (size_t)optin;
    return 0;
}

int gpt16_xent(void *impl, int rows, int vocab, mgpu_bf16_t *logits, const int32_t *targets,
               float scale, int grad, float *loss, mgpu_err_t *err)
{
    cuda_impl *ci = (cuda_impl *)impl;
    if (rows == 0 || vocab == 0)
        return 0;
    const bool block = vocab > kXentWarpCols;
    const bool vec = vocab % 8 == 0 && aligned16(logits);
    /* A block a row holds its row in shared memory when it fits, else reads it twice. */
    const size_t smem = 16 * (((size_t)vocab + 7) / 8) + kXentSmemRed;
    size_t limit = 0;
    int rc = block ? xent_smem_limit(ci, &limit, err) : 0;
    if (rc != 0)
        return rc;
    const bool in_smem = block && smem <= limit;
    int smem_per_sm = 0;
    if (in_smem)
        CUDA_CHECK(err,
                   cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                       &smem_per_sm, vec ? xent16_smem_kernel<true> : xent16_smem_kernel<false>,
                       kXentSmemThreads, smem));
    for (int r0 = 0; r0 < rows; r0 += kXentRowChunk) {
        int n = rows - r0 < kXentRowChunk ? rows - r0 : kXentRowChunk;
        mgpu_bf16_t *lg = logits + (size_t)r0 * vocab;
        const int32_t *tg = targets + r0;
        unsigned blocks;
        if (in_smem) {
            long cap = (long)ci->sms * (smem_per_sm > 1 ? smem_per_sm : 1);
            blocks = (unsigned)(n < cap ? n : cap);
            auto kern = vec ? xent16_smem_kernel<true> : xent16_smem_kernel<false>;
            kern<<<blocks, kXentSmemThreads, smem, ci->stream>>>(n, vocab, lg, tg, scale, grad != 0,
                                                                 ci->scratch);
        } else if (block) {
            long cap = (long)ci->sms * kXentBlocksPerSm;
            blocks = (unsigned)(n < cap ? n : cap);
            auto kern = vec ? xent16_block_kernel<true> : xent16_block_kernel<false>;
            kern<<<blocks, kXentBlockThreads, 0, ci->stream>>>(n, vocab, lg, tg, scale, grad != 0,
                                                               ci->scratch);
        } else {
            int per = kThreads / 32;
            long need = (n + per - 1) / per, cap = (long)ci->sms * 16;
            blocks = (unsigned)(need < cap ? need : cap);
            auto kern = vec ? xent16_warp_kernel<true> : xent16_warp_kernel<false>;
            kern<<<blocks, kThreads, 0, ci->stream>>>(n, vocab, lg, tg, scale, grad != 0,
                                                      ci->scratch);
        }
        CUDA_CHECK_LAUNCH(err, "xent16 %s kernel (rows=%d vocab=%d, %u blocks)",
                          in_smem ? "shared-memory"
                          : block ? "block"
                                  : "warp",
                          n, vocab, blocks);
        xent16_loss_kernel<<<1, kThreads, 0, ci->stream>>>(n, ci->scratch, (double)scale, loss);
        CUDA_CHECK_LAUNCH(err, "xent16_loss_kernel (rows=%d)", n);
    }
    return 0;
}

} /* namespace mgpu_cuda */
