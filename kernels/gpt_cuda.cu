/* gpt_cuda.cu - the CUDA table of a GPT's ops (gpt_cuda.h) and the ops of its smaller
 * families: LayerNorm, GELU, add, the tied output layer, the gradient's sum of squares, the
 * clip factor and AdamW (transformer.c is the reference; attention and the embedding are in
 * gpt_attention.cu and gpt_embed.cu).
 *
 * Statistics (LayerNorm's mean and variance, the softmax's maximum and sum) are fp32 whatever
 * the backend's precision; only the products (cuda_gemm) follow it. Every reduction runs in
 * a fixed order (per-block partials, then a second pass or the last block), never with float
 * atomics, so reruns give the same bits. */
#include "gpt_cuda_impl.h" /* cuda_impl, the device helpers, the ops' declarations */
#include "cuda_check.h"    /* CUDA_CHECK, CUDA_CHECK_LAUNCH */

#include <errno.h>  /* ENOMEM */
#include <stdlib.h> /* calloc, free */

namespace mgpu_cuda
{
namespace
{

constexpr float kLnEps = 1e-5f;        /* torch.nn.LayerNorm's default */
constexpr int kLnWarps = 8;            /* rows of a LayerNorm block, a warp each */
constexpr int kLnBlocksPerSm = 2;      /* the backward's partial sums: 2 blocks an SM */
constexpr int kHeadRowChunk = 1 << 19; /* rows whose losses the scratch holds at once */
constexpr int kHeadWarpCols = 1024;    /* up to this vocabulary a warp a row, else a block */

/* --- LayerNorm ----------------------------------------------------------------------------- */

/* Where LayerNorm's y goes: fp32, or bf16 rounded once from the fp32 value (the bf16 path). */
__device__ __forceinline__ void st_y4(float *y, size_t j, float4 v)
{
    st4(y, j, v);
}
__device__ __forceinline__ void st_y4(mgpu_bf16_t *y, size_t j, float4 v)
{
    st_bf4(y, j, v);
}
__device__ __forceinline__ void st_y(float *y, size_t j, float v)
{
    y[j] = v;
}
__device__ __forceinline__ void st_y(mgpu_bf16_t *y, size_t j, float v)
{
    y[j] = (mgpu_bf16_t)bf_bits(v);
}

/* A warp a row: the mean, then the variance around it (two passes over the row, which stays
 * in L1), both in fp32; y computed in fp32 and stored as Y (fp32, or bf16 rounded once);
 * lane 0 saves mean and rstd. VEC: float4 loads of x, w, b. */
template <bool VEC, class Y>
__global__ void __launch_bounds__(kLnWarps * 32)
    ln_fwd_kernel(int n, int c, const float *x, const float *w, const float *b, Y *y, size_t ldy,
                  float *mean, float *rstd)
{
    const int lane = threadIdx.x & 31;
    for (int row = blockIdx.x * kLnWarps + (threadIdx.x >> 5); row < n;
         row += gridDim.x * kLnWarps) {
        const float *xr = x + (size_t)row * c;
        Y *yr = y + (size_t)row * ldy;
        float s = 0.0f;
        if (VEC)
            for (int j = lane; j < c / 4; j += 32) {
                float4 v = ld4(xr, j);
                s += (v.x + v.y) + (v.z + v.w);
            }
        else
            for (int j = lane; j < c; j += 32)
                s += xr[j];
        const float m = warp_sum(s) / c;
        float q = 0.0f;
        if (VEC)
            for (int j = lane; j < c / 4; j += 32) {
                float4 v = ld4(xr, j);
                float a = v.x - m, bb = v.y - m, cc = v.z - m, d = v.w - m;
                q += (a * a + bb * bb) + (cc * cc + d * d);
            }
        else
            for (int j = lane; j < c; j += 32)
                q += (xr[j] - m) * (xr[j] - m);
        const float rs = 1.0f / sqrtf(warp_sum(q) / c + kLnEps);
        if (VEC)
            for (int j = lane; j < c / 4; j += 32) {
                float4 v = ld4(xr, j), wv = ld4(w, j), bv = ld4(b, j);
                st_y4(yr, j,
                      make_float4((v.x - m) * rs * wv.x + bv.x, (v.y - m) * rs * wv.y + bv.y,
                                  (v.z - m) * rs * wv.z + bv.z, (v.w - m) * rs * wv.w + bv.w));
            }
        else
            for (int j = lane; j < c; j += 32)
                st_y(yr, j, (xr[j] - m) * rs * w[j] + b[j]);
        if (lane == 0) {
            mean[row] = m;
            rstd[row] = rs;
        }
    }
}

/* ln_fwd_kernel's VEC form with the row held in registers: lane l loads the float4s l, l + 32,
 * ... of its row (NCH of them, all in flight at once) and the three passes read registers, so
 * x is read from memory once and no pass waits on another's loads. Each lane adds its values
 * in the same order as ln_fwd_kernel, so both give the same bits. */
template <int NCH, class Y>
__global__ void __launch_bounds__(kLnWarps * 32)
    ln_fwd_reg_kernel(int n, int c, const float *x, const float *w, const float *b, Y *y,
                      size_t ldy, float *mean, float *rstd)
{
    const int lane = threadIdx.x & 31, c4 = c / 4;
    for (int row = blockIdx.x * kLnWarps + (threadIdx.x >> 5); row < n;
         row += gridDim.x * kLnWarps) {
        const float *xr = x + (size_t)row * c;
        float4 v[NCH];
#pragma unroll
        for (int k = 0; k < NCH; k++)
            if (lane + 32 * k < c4)
                v[k] = ld4(xr, lane + 32 * k);
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < NCH; k++)
            if (lane + 32 * k < c4)
                s += (v[k].x + v[k].y) + (v[k].z + v[k].w);
        const float m = warp_sum(s) / c;
        float q = 0.0f;
#pragma unroll
        for (int k = 0; k < NCH; k++)
            if (lane + 32 * k < c4) {
                float a = v[k].x - m, bb = v[k].y - m, cc = v[k].z - m, d = v[k].w - m;
                q += (a * a + bb * bb) + (cc * cc + d * d);
            }
        const float rs = 1.0f / sqrtf(warp_sum(q) / c + kLnEps);
        Y *yr = y + (size_t)row * ldy;
#pragma unroll
        for (int k = 0; k < NCH; k++) {
            const int j = lane + 32 * k;
            if (j < c4) {
                const float4 wv = ld4(w, j), bv = ld4(b, j);
                st_y4(yr, j,
                      make_float4((v[k].x - m) * rs * wv.x + bv.x, (v[k].y - m) * rs * wv.y + bv.y,
                                  (v[k].z - m) * rs * wv.z + bv.z,
                                  (v[k].w - m) * rs * wv.w + bv.w));
            }
        }
        if (lane == 0) {
            mean[row] = m;
            rstd[row] = rs;
        }
    }
}

/* dx += rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)), dnorm = w * dy, a warp a
 * row; dw and db are summed per warp in shared memory (acc: 2c floats a warp, the lane's own
 * columns only), then the block adds its warps in order into part[block] (2c floats), which
 * ln_bwd_finish_kernel adds over the blocks in order. */
template <bool VEC>
__global__ void __launch_bounds__(kLnWarps * 32)
    ln_bwd_kernel(int n, int c, const float *dy, const float *x, const float *w, const float *mean,
                  const float *rstd, float *dx, float *part)
{
    extern __shared__ float ln_acc[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float *acc = ln_acc + (size_t)warp * 2 * c;
    for (int j = lane; j < 2 * c; j += 32)
        acc[j] = 0.0f;
    __syncwarp(); /* the float4 path adds into words other lanes zeroed */
    for (int row = blockIdx.x * nw + warp; row < n; row += gridDim.x * nw) {
        const float *dyr = dy + (size_t)row * c, *xr = x + (size_t)row * c;
        float *dxr = dx + (size_t)row * c;
        const float m = mean[row], s = rstd[row];
        float a = 0.0f, bn = 0.0f;
        if (VEC)
            for (int j = lane; j < c / 4; j += 32) {
                float4 d = ld4(dyr, j), xv = ld4(xr, j), wv = ld4(w, j);
                a += (wv.x * d.x + wv.y * d.y) + (wv.z * d.z + wv.w * d.w);
                bn += (wv.x * d.x * ((xv.x - m) * s) + wv.y * d.y * ((xv.y - m) * s)) +
                      (wv.z * d.z * ((xv.z - m) * s) + wv.w * d.w * ((xv.w - m) * s));
            }
        else
            for (int j = lane; j < c; j += 32) {
                float dn = w[j] * dyr[j];
                a += dn;
                bn += dn * ((xr[j] - m) * s);
            }
        a = warp_sum(a) / c;
        bn = warp_sum(bn) / c;
        if (VEC)
            for (int j = lane; j < c / 4; j += 32) {
                float4 d = ld4(dyr, j), xv = ld4(xr, j), wv = ld4(w, j), o = ld4(dxr, j);
                float nx = (xv.x - m) * s, ny = (xv.y - m) * s, nz = (xv.z - m) * s,
                      nq = (xv.w - m) * s;
                o.x += s * (wv.x * d.x - a - nx * bn);
                o.y += s * (wv.y * d.y - a - ny * bn);
                o.z += s * (wv.z * d.z - a - nz * bn);
                o.w += s * (wv.w * d.w - a - nq * bn);
                st4(dxr, j, o);
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
                float nv = (xr[j] - m) * s, d = dyr[j];
                dxr[j] += s * (w[j] * d - a - nv * bn);
                acc[j] += nv * d;
                acc[c + j] += d;
            }
    }
    __syncthreads();
    for (int j = threadIdx.x; j < 2 * c; j += blockDim.x) {
        float v = 0.0f;
        for (int k = 0; k < nw; k++)
            v += ln_acc[(size_t)k * 2 * c + j];
        part[(size_t)blockIdx.x * 2 * c + j] = v;
    }
}

/* dw[j] += the blocks' partials of column j in block order; db[j] likewise. */
__global__ void __launch_bounds__(kThreads)
    ln_bwd_finish_kernel(int c, int blocks, const float *part, float *dw, float *db)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= 2 * c)
        return;
    float v = 0.0f;
    for (int k = 0; k < blocks; k++)
        v += part[(size_t)k * 2 * c + j];
    if (j < c)
        dw[j] += v;
    else
        db[j - c] += v;
}

/* --- elementwise --------------------------------------------------------------------------- */

struct GeluFwd {
    const float *x;
    float *y;
    __device__ void vec(size_t i) const
    {
        st4(y, i, act4<MGPU_ACT_GELU>(ld4(x, i)));
    }
    __device__ void one(size_t i) const
    {
        y[i] = act_f<MGPU_ACT_GELU>(x[i]);
    }
};

struct GeluBwd {
    const float *x, *dy;
    float *dx;
    __device__ void vec(size_t i) const
    {
        float4 a = ld4(x, i), d = ld4(dy, i);
        st4(dx, i,
            make_float4(act_b<MGPU_ACT_GELU>(a.x, 0.0f, d.x), act_b<MGPU_ACT_GELU>(a.y, 0.0f, d.y),
                        act_b<MGPU_ACT_GELU>(a.z, 0.0f, d.z),
                        act_b<MGPU_ACT_GELU>(a.w, 0.0f, d.w)));
    }
    __device__ void one(size_t i) const
    {
        dx[i] = act_b<MGPU_ACT_GELU>(x[i], 0.0f, dy[i]);
    }
};

struct Add {
    const float *a, *b;
    float *out;
    __device__ void vec(size_t i) const
    {
        float4 u = ld4(a, i), v = ld4(b, i);
        st4(out, i, make_float4(u.x + v.x, u.y + v.y, u.z + v.z, u.w + v.w));
    }
    __device__ void one(size_t i) const
    {
        out[i] = a[i] + b[i];
    }
};

/* torch.optim.AdamW (optimizers.c's formula) on g * factor[0]. Every operation rounds on its
 * own, as the CPU reference's (which has no fused multiply-add): left to the compiler, the
 * contractions into FMAs depend on the kernel the update is inlined in, and gpt_adamw and
 * adamw_multi_kernel gave different bits for the same step. p16, when not NULL (and 8-byte
 * aligned on the float4 path), receives bf16(new p) in the same pass. */
struct AdamWF {
    float *p;
    const float *g;
    float *m, *v;
    const float *factor;
    float b1, b2, eps, decay, step_size, bc2_sqrt;
    mgpu_bf16_t *p16 = nullptr;
    int c16 = 0; /* p16's rows: c16 elements, ld16 apart (0: p16 is flat) */
    size_t ld16 = 0;
    __device__ __forceinline__ size_t at16(size_t j) const
    {
        return c16 == 0 ? j : j / c16 * ld16 + j % c16;
    }
    __device__ __forceinline__ void upd(float &pi, float gi, float &mi, float &vi, float f) const
    {
        gi = __fmul_rn(gi, f);
        /* m.lerp_(g, 1 - b1) */
        mi = __fadd_rn(mi, __fmul_rn(__fsub_rn(1.0f, b1), __fsub_rn(gi, mi)));
        vi = __fadd_rn(__fmul_rn(b2, vi), __fmul_rn(__fmul_rn(__fsub_rn(1.0f, b2), gi), gi));
        const float den = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), bc2_sqrt), eps);
        pi = __fsub_rn(__fmul_rn(pi, decay), __fdiv_rn(__fmul_rn(step_size, mi), den));
    }
    __device__ void vec(size_t i) const
    {
        const float f = factor != nullptr ? *factor : 1.0f;
        float4 pv = ld4(p, i), gv = ld4(g, i), mv = ld4(m, i), vv = ld4(v, i);
        upd(pv.x, gv.x, mv.x, vv.x, f);
        upd(pv.y, gv.y, mv.y, vv.y, f);
        upd(pv.z, gv.z, mv.z, vv.z, f);
        upd(pv.w, gv.w, mv.w, vv.w, f);
        st4(p, i, pv);
        st4(m, i, mv);
        st4(v, i, vv);
        if (p16 != nullptr) /* c16 a multiple of 4 here: the four in one row */
            *reinterpret_cast<ushort4 *>(p16 + at16(4 * i)) =
                make_ushort4((mgpu_bf16_t)bf_bits(pv.x), (mgpu_bf16_t)bf_bits(pv.y),
                             (mgpu_bf16_t)bf_bits(pv.z), (mgpu_bf16_t)bf_bits(pv.w));
    }
    __device__ void one(size_t i) const
    {
        float pi = p[i], mi = m[i], vi = v[i];
        upd(pi, g[i], mi, vi, factor != nullptr ? *factor : 1.0f);
        p[i] = pi;
        m[i] = mi;
        v[i] = vi;
        if (p16 != nullptr)
            p16[at16(i)] = (mgpu_bf16_t)bf_bits(pi);
    }
};

/* --- AdamW over many tensors in one launch ------------------------------------------------- */

/* The tensors of one launch travel as its argument (sm_90 with CUDA 12.1 or later takes up
 * to 32 KB of them): no copy of a list into device memory, which a graph would have to
 * capture too. Contiguous tensors with the same decay are one segment (a GPT's 148 tensors
 * of GPT-2 124M are 97: 1 + 8 a layer), so one launch covers a model of up to 19 layers; more
 * segments take more launches. */
constexpr int kMultiSegs = 160;
/* Floats a block takes at a time: 4 float4s per thread. */
constexpr size_t kMultiChunk = 4 * 4 * kThreads;

struct MultiSeg {
    float *p;
    const float *g;
    float *m, *v;
    mgpu_bf16_t *p16; /* the bf16 copy of p, or NULL */
    size_t start, n;  /* start: in the launch's index space, a multiple of 4 */
    int decay, vec;   /* vec: the four pointers are 16-byte aligned, p16 8-byte */
    int c16;          /* p16's geometry (mgpu_gpt_adamw_tensor_t's p16_cols, p16_ld) */
    size_t ld16;
};

struct MultiArgs {
    MultiSeg seg[kMultiSegs];
    int n_seg;
    size_t total; /* the index space: the last segment's start + n */
    float b1, b2, eps;
    const float *factor;
    const mgpu_gpt_adamw_now_t *now;
};

/* Block b takes chunks b, b + grid, ... of the index space and, in each, the part of every
 * segment that lies in it; a segment starts at a multiple of 4, so a chunk's part of it
 * starts at one too and its float4s stay aligned. The update is AdamWF's, with now's factors:
 * the same bits as gpt_adamw for the same step. */
__global__ void __launch_bounds__(kThreads) adamw_multi_kernel(const __grid_constant__ MultiArgs a)
{
    const mgpu_gpt_adamw_now_t now = *a.now;
    for (size_t c0 = (size_t)blockIdx.x * kMultiChunk; c0 < a.total;
         c0 += (size_t)gridDim.x * kMultiChunk) {
        const size_t c1 = c0 + kMultiChunk < a.total ? c0 + kMultiChunk : a.total;
        int lo = 0, hi = a.n_seg - 1; /* the last segment starting at or before c0 */
        while (lo < hi) {
            int mid = (lo + hi + 1) / 2;
            if (a.seg[mid].start <= c0)
                lo = mid;
            else
                hi = mid - 1;
        }
        for (int s = lo; s < a.n_seg && a.seg[s].start < c1; s++) {
            const MultiSeg &sg = a.seg[s];
            const size_t end = sg.start + sg.n;
            if (end <= c0)
                continue;
            const size_t b = (c0 > sg.start ? c0 : sg.start) - sg.start;
            const size_t e = (c1 < end ? c1 : end) - sg.start;
            const AdamWF f{sg.p,          sg.g,         sg.m,
                           sg.v,          a.factor,     a.b1,
                           a.b2,          a.eps,        sg.decay ? now.decay : 1.0f,
                           now.step_size, now.bc2_sqrt, sg.p16,
                           sg.c16,        sg.ld16};
            if (sg.vec) {
                for (size_t i = b + 4 * threadIdx.x; i < e; i += 4 * blockDim.x) {
                    if (i + 4 <= e)
                        f.vec(i / 4);
                    else
                        for (size_t j = i; j < e; j++)
                            f.one(j);
                }
            } else {
                for (size_t i = b + threadIdx.x; i < e; i += blockDim.x)
                    f.one(i);
            }
        }
    }
}

/* --- reductions ---------------------------------------------------------------------------- */

/* block_result (cuda_impl.h) that adds: *acc += the grid's sum, the partials added in double
 * by the last block in block order. */
__device__ __forceinline__ void block_add(float v, float *part, float *acc)
{
    __shared__ bool last;
    if (gridDim.x == 1) {
        if (threadIdx.x == 0)
            *acc += v;
        return;
    }
    unsigned *done = reinterpret_cast<unsigned *>(part + kScratchFloats - 1);
    if (threadIdx.x == 0) {
        part[blockIdx.x] = v;
        __threadfence(); /* the partial is visible before the count says so */
        last = atomicAdd(done, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last)
        return;
    __threadfence();
    double s = 0.0;
    for (unsigned i = threadIdx.x; i < gridDim.x; i += blockDim.x)
        s += __ldcg(part + i);
    s = block_sum(s);
    if (threadIdx.x == 0) {
        *acc = (float)((double)*acc + s);
        *done = 0;
    }
}

template <bool VEC>
__global__ void __launch_bounds__(kThreads)
    sumsq_kernel(size_t n, const float *x, float *part, float *acc)
{
    size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x, head = 0;
    float s = 0.0f;
    if (VEC) {
        for (size_t i = tid; i < n / 4; i += stride) {
            float4 v = ld4(x, i);
            s += (v.x * v.x + v.y * v.y) + (v.z * v.z + v.w * v.w);
        }
        head = n / 4 * 4;
    }
    for (size_t i = head + tid; i < n; i += stride)
        s += x[i] * x[i];
    block_add(block_sum(s), part, acc);
}

__global__ void clip_factor_kernel(const float *sumsq, float max_norm, float *factor)
{
    /* clip_grad_norm_: clamp(max_norm / (norm + 1e-6), max=1) */
    double norm = sqrt((double)*sumsq), coef = (double)max_norm / (norm + 1e-6);
    *factor = max_norm > 0.0f && coef < 1.0 ? (float)coef : 1.0f;
}

/* --- the tied output layer's softmax cross-entropy ----------------------------------------- */

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

/* One row of the softmax cross-entropy with LANES threads (a warp, or the block when BLOCK):
 * the row's maximum and sum of exponentials online in one pass, then its loss -log p[target]
 * into rowloss[row] and, with grad, dlogits = scale * (p - onehot) over the logits. An
 * out-of-range target makes the row's loss NaN (the host cannot be told without a sync). */
template <bool BLOCK>
__device__ __forceinline__ void xent_row(int vocab, float *lr, int32_t target, float scale,
                                         bool grad, float *loss_out, int tid, int lanes)
{
    float m = -INFINITY, s = 0.0f;
    for (int j = tid; j < vocab; j += lanes) {
        float v = lr[j];
        if (v > m) {
            s = s * __expf(m - v) + 1.0f;
            m = v;
        } else {
            s += __expf(v - m);
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
    const float lse = m + logf(s);
    if (tid == 0)
        *loss_out = ok ? lse - lr[target] : NAN;
    if (!grad)
        return;
    if (BLOCK)
        __syncthreads(); /* lr[target] is read before it is overwritten */
    else
        __syncwarp();
    const float inv = 1.0f / s;
    for (int j = tid; j < vocab; j += lanes) {
        float p = __expf(lr[j] - m) * inv;
        lr[j] = ok ? scale * (p - (j == target ? 1.0f : 0.0f)) : NAN;
    }
}

template <bool BLOCK>
__global__ void __launch_bounds__(kThreads)
    head_xent_kernel(int rows, int vocab, float *logits, const int32_t *targets, float scale,
                     bool grad, float *rowloss)
{
    if (BLOCK) {
        for (int r = blockIdx.x; r < rows; r += gridDim.x)
            xent_row<true>(vocab, logits + (size_t)r * vocab, targets[r], scale, grad, rowloss + r,
                           threadIdx.x, blockDim.x);
    } else {
        const int warps = blockDim.x >> 5;
        for (int r = blockIdx.x * warps + (threadIdx.x >> 5); r < rows; r += gridDim.x * warps)
            xent_row<false>(vocab, logits + (size_t)r * vocab, targets[r], scale, grad, rowloss + r,
                            threadIdx.x & 31, 32);
    }
}

/* loss[0] += scale * the sum of rowloss[0..rows) (one block, a fixed order, in double). */
__global__ void __launch_bounds__(kThreads)
    head_loss_kernel(int rows, const float *rowloss, double scale, float *loss)
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

/* The LayerNorm forward of both paths: y of n rows of c, ldy apart, as Y (float4 stores of
 * an fp32 y, 8-byte ones of a bf16 y, when c % 4 == 0 and the rows are aligned). */
template <class Y>
static int layernorm_forward(cuda_impl *ci, int n, int c, const float *x, const float *w,
                             const float *b, Y *y, size_t ldy, float *mean, float *rstd,
                             mgpu_err_t *err)
{
    invalidate(ci, y, sizeof(Y) * n * ldy);
    invalidate(ci, mean, sizeof(float) * n);
    invalidate(ci, rstd, sizeof(float) * n);
    if (n == 0 || c == 0)
        return 0;
    bool vec =
        c % 4 == 0 && ldy % 4 == 0 && aligned16(x, w, b) && (uintptr_t)y % (4 * sizeof(Y)) == 0;
    long need = (n + kLnWarps - 1) / kLnWarps, cap = (long)ci->sms * 16;
    unsigned blocks = (unsigned)(need < cap ? need : cap);
    /* Rows of up to 2048 channels are held in registers (GPT-2's 768: 6 float4s a lane; the
     * widths of GPT-2's larger models, 1280 and 1600, and 1536 take 12 or 16 a lane, with the
     * lanes past the row idle in the last). */
    const int nch = vec ? (c / 4 + 31) / 32 : 0;
    void (*reg)(int, int, const float *, const float *, const float *, Y *, size_t, float *,
                float *) = nch < 1     ? nullptr
                           : nch == 1  ? ln_fwd_reg_kernel<1, Y>
                           : nch == 2  ? ln_fwd_reg_kernel<2, Y>
                           : nch == 3  ? ln_fwd_reg_kernel<3, Y>
                           : nch == 4  ? ln_fwd_reg_kernel<4, Y>
                           : nch <= 6  ? ln_fwd_reg_kernel<6, Y>
                           : nch <= 8  ? ln_fwd_reg_kernel<8, Y>
                           : nch <= 12 ? ln_fwd_reg_kernel<12, Y>
                           : nch <= 16 ? ln_fwd_reg_kernel<16, Y>
                                       : nullptr;
    if (reg != nullptr)
        reg<<<blocks, kLnWarps * 32, 0, ci->stream>>>(n, c, x, w, b, y, ldy, mean, rstd);
    else if (vec)
        ln_fwd_kernel<true, Y>
            <<<blocks, kLnWarps * 32, 0, ci->stream>>>(n, c, x, w, b, y, ldy, mean, rstd);
    else
        ln_fwd_kernel<false, Y>
            <<<blocks, kLnWarps * 32, 0, ci->stream>>>(n, c, x, w, b, y, ldy, mean, rstd);
    CUDA_CHECK_LAUNCH(err, "ln_fwd_kernel (n=%d c=%d, %s y)", n, c,
                      sizeof(Y) == 2 ? "bf16" : "fp32");
    return 0;
}

int gpt_layernorm_forward(void *impl, int n, int c, const float *x, const float *w, const float *b,
                          float *y, float *mean, float *rstd, mgpu_err_t *err)
{
    return layernorm_forward((cuda_impl *)impl, n, c, x, w, b, y, (size_t)c, mean, rstd, err);
}

int gpt16_layernorm_forward(void *impl, int n, int c, const float *x, const float *w,
                            const float *b, mgpu_bf16_t *y, size_t ldy, float *mean, float *rstd,
                            mgpu_err_t *err)
{
    if (ldy < (size_t)c)
        return mgpu_err_set(err, MGPU_E_RANGE,
                            "gpt bf16 layernorm_forward: y's rows %zu elements apart, expected at "
                            "least c = %d",
                            ldy, c);
    return layernorm_forward((cuda_impl *)impl, n, c, x, w, b, y, ldy, mean, rstd, err);
}

int gpt_layernorm_backward(void *impl, int n, int c, const float *dy, const float *x,
                           const float *w, const float *mean, const float *rstd, float *dx,
                           float *dw, float *db, mgpu_err_t *err)
{
    cuda_impl *ci = (cuda_impl *)impl;
    invalidate(ci, dx, sizeof(float) * n * (size_t)c);
    invalidate(ci, dw, sizeof(float) * c);
    invalidate(ci, db, sizeof(float) * c);
    if (n == 0 || c == 0)
        return 0;
    /* Shared memory: 2c floats a warp; fewer warps a block for wide rows. */
    int optin = 0;
    CUDA_CHECK(err,
               cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, ci->device));
    size_t per_warp = 2 * (size_t)c * sizeof(float);
    int warps = (int)((size_t)optin / per_warp < (size_t)kLnWarps ? (size_t)optin / per_warp
                                                                  : (size_t)kLnWarps);
    /* The partials (2c floats a block) stay below the scratch's counter word. */
    long by_scratch = (long)((kScratchFloats - 1) / (2 * (size_t)c));
    if (warps < 1 || by_scratch < 1)
        return mgpu_err_set(err, MGPU_E_RANGE,
                            "layernorm_backward (cuda): %d channels, expected at most %zu", c,
                            (size_t)optin / (2 * sizeof(float)));
    long need = (n + warps - 1) / warps, cap = (long)ci->sms * kLnBlocksPerSm;
    long nb = need < cap ? need : cap;
    nb = nb < by_scratch ? nb : by_scratch;
    size_t smem = per_warp * warps;
    bool vec = c % 4 == 0 && aligned16(dy, x, w, dx);
    auto kern = vec ? ln_bwd_kernel<true> : ln_bwd_kernel<false>;
    if (smem > 48 * 1024)
        CUDA_CHECK(err, cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)smem));
    kern<<<(unsigned)nb, warps * 32, smem, ci->stream>>>(n, c, dy, x, w, mean, rstd, dx,
                                                         ci->scratch);
    CUDA_CHECK_LAUNCH(err, "ln_bwd_kernel (n=%d c=%d, %ld blocks of %d warps)", n, c, nb, warps);
    ln_bwd_finish_kernel<<<(unsigned)((2 * c + kThreads - 1) / kThreads), kThreads, 0,
                           ci->stream>>>(c, (int)nb, ci->scratch, dw, db);
    CUDA_CHECK_LAUNCH(err, "ln_bwd_finish_kernel (c=%d, %ld blocks)", c, nb);
    return 0;
}

int gpt_gelu_forward(void *impl, size_t n, const float *x, float *y, mgpu_err_t *err)
{
    invalidate((cuda_impl *)impl, y, sizeof(float) * n);
    return launch_ew((cuda_impl *)impl, GeluFwd{x, y}, n, aligned16(x, y), "gelu_forward", err);
}

int gpt_gelu_backward(void *impl, size_t n, const float *x, const float *dy, float *dx,
                      mgpu_err_t *err)
{
    invalidate((cuda_impl *)impl, dx, sizeof(float) * n);
    return launch_ew((cuda_impl *)impl, GeluBwd{x, dy, dx}, n, aligned16(x, dy, dx),
                     "gelu_backward", err);
}

int gpt_add(void *impl, size_t n, const float *a, const float *b, float *out, mgpu_err_t *err)
{
    invalidate((cuda_impl *)impl, out, sizeof(float) * n);
    return launch_ew((cuda_impl *)impl, Add{a, b, out}, n, aligned16(a, b, out), "add", err);
}

int gpt_tied_head(void *impl, int n, int c, int vocab, const float *x, const float *wte,
                  const int32_t *targets, float scale, float *logits, float *loss, float *dx,
                  float *dwte, mgpu_err_t *err)
{
    cuda_impl *ci = (cuda_impl *)impl;
    if (n == 0)
        return 0;
    int rc;
    /* logits (n, vocab) = x @ wte^T, in the backend's precision */
    if ((rc = cuda_gemm(impl, 0, 1, n, vocab, c, 1.0f, x, c, wte, c, 0.0f, logits, vocab, err)) < 0)
        return rc;
    const bool grad = dx != NULL;
    const bool block = vocab > kHeadWarpCols;
    for (int r0 = 0; r0 < n; r0 += kHeadRowChunk) {
        int rows = n - r0 < kHeadRowChunk ? n - r0 : kHeadRowChunk;
        float *lg = logits + (size_t)r0 * vocab;
        unsigned blocks;
        if (block) {
            blocks = (unsigned)(rows < ci->sms * 8 ? rows : ci->sms * 8);
            head_xent_kernel<true><<<blocks, kThreads, 0, ci->stream>>>(
                rows, vocab, lg, targets + r0, scale, grad, ci->scratch);
        } else {
            int per = kThreads / 32;
            long need = (rows + per - 1) / per, cap = (long)ci->sms * 16;
            blocks = (unsigned)(need < cap ? need : cap);
            head_xent_kernel<false><<<blocks, kThreads, 0, ci->stream>>>(
                rows, vocab, lg, targets + r0, scale, grad, ci->scratch);
        }
        CUDA_CHECK_LAUNCH(err, "head_xent_kernel (rows=%d vocab=%d, %u blocks)", rows, vocab,
                          blocks);
        head_loss_kernel<<<1, kThreads, 0, ci->stream>>>(rows, ci->scratch, (double)scale, loss);
        CUDA_CHECK_LAUNCH(err, "head_loss_kernel (rows=%d)", rows);
    }
    invalidate(ci, logits, sizeof(float) * n * (size_t)vocab);
    if (!grad)
        return 0;
    /* dx += dlogits @ wte; dwte += dlogits^T @ x */
    if ((rc = cuda_gemm(impl, 0, 0, n, c, vocab, 1.0f, logits, vocab, wte, c, 1.0f, dx, c, err)) <
        0)
        return rc;
    return cuda_gemm(impl, 1, 0, vocab, c, n, 1.0f, logits, vocab, x, c, 1.0f, dwte, c, err);
}

int gpt_sumsq(void *impl, size_t n, const float *x, float *acc, mgpu_err_t *err)
{
    cuda_impl *ci = (cuda_impl *)impl;
    if (n == 0)
        return 0;
    bool vec = aligned16(x);
    unsigned blocks = grid_for(ci, vec ? (n + 3) / 4 : n, kRedBlocksPerSm);
    if (vec)
        sumsq_kernel<true><<<blocks, kThreads, 0, ci->stream>>>(n, x, ci->scratch, acc);
    else
        sumsq_kernel<false><<<blocks, kThreads, 0, ci->stream>>>(n, x, ci->scratch, acc);
    CUDA_CHECK_LAUNCH(err, "sumsq_kernel (n=%zu, %u blocks)", n, blocks);
    return 0;
}

int gpt_clip_factor(void *impl, const float *sumsq, float max_norm, float *factor, mgpu_err_t *err)
{
    clip_factor_kernel<<<1, 1, 0, ((cuda_impl *)impl)->stream>>>(sumsq, max_norm, factor);
    CUDA_CHECK_LAUNCH(err, "clip_factor_kernel");
    return 0;
}

int gpt_adamw(void *impl, size_t n, float *p, const float *g, float *m, float *v,
              const mgpu_adamw_hparams_t *hp, long long step, const float *factor, mgpu_err_t *err)
{
    cuda_impl *ci = (cuda_impl *)impl;
    invalidate(ci, p, sizeof(float) * n);
    if (n == 0)
        return 0;
    /* The bias corrections as optimizers.c computes them, in double on the host. They and
     * hp's learning rate become the kernel's arguments, so a CUDA graph captured around this
     * call replays that step's values: a step that changes them is captured again (unlike
     * cuda_adamw_step, whose step lives in device memory, the table passes them by value). */
    const double bc1 = 1.0 - pow(hp->beta1, (double)step), bc2 = 1.0 - pow(hp->beta2, (double)step);
    AdamWF f{p,
             g,
             m,
             v,
             factor,
             hp->beta1,
             hp->beta2,
             hp->eps,
             1.0f - hp->lr * hp->weight_decay,
             (float)(hp->lr / bc1),
             (float)sqrt(bc2)};
    return launch_ew(ci, f, n, aligned16(p, g, m, v), "gpt_adamw", err);
}

static int launch_multi(cuda_impl *ci, MultiArgs &a, mgpu_err_t *err)
{
    size_t chunks = (a.total + kMultiChunk - 1) / kMultiChunk, cap = (size_t)ci->sms * 8;
    unsigned blocks = (unsigned)(chunks < cap ? chunks : cap);
    adamw_multi_kernel<<<blocks, kThreads, 0, ci->stream>>>(a);
    CUDA_CHECK_LAUNCH(err, "adamw_multi_kernel (%d segments, %zu floats, %u blocks)", a.n_seg,
                      a.total, blocks);
    a.n_seg = 0;
    a.total = 0;
    return 0;
}

int gpt_adamw_multi(void *impl, int n_tensors, const mgpu_gpt_adamw_tensor_t *t,
                    const mgpu_adamw_hparams_t *hp, const mgpu_gpt_adamw_now_t *now,
                    const float *factor, mgpu_err_t *err)
{
    cuda_impl *ci = (cuda_impl *)impl;
    /* The gradients may come from weight-gradient products still on a side stream. */
    int rc = cuda_join(impl, err);
    if (rc < 0)
        return rc;
    /* About 10 KB: on the heap rather than the stack. */
    MultiArgs *a = (MultiArgs *)calloc(1, sizeof *a);
    if (a == nullptr)
        return mgpu_err_set(err, -ENOMEM, "gpt adamw_multi: calloc of %zu bytes", sizeof *a);
    a->b1 = hp->beta1, a->b2 = hp->beta2, a->eps = hp->eps;
    a->factor = factor;
    a->now = now;
    for (int i = 0; i < n_tensors && rc == 0; i++) {
        const mgpu_gpt_adamw_tensor_t &x = t[i];
        if (x.n == 0)
            continue;
        invalidate(ci, x.p, sizeof(float) * x.n);
        MultiSeg *last = a->n_seg > 0 ? &a->seg[a->n_seg - 1] : nullptr;
        /* p16 must continue the segment's too: both NULL, or the next bf16s of one array. */
        const bool p16_next =
            last != nullptr && last->c16 == 0 && x.p16_cols == 0 &&
            (last->p16 == nullptr ? x.p16 == nullptr
                                  : x.p16 != nullptr && last->p16 + last->n == x.p16);
        if (last != nullptr && (last->decay != 0) == (x.decay != 0) && last->p + last->n == x.p &&
            last->g + last->n == x.g && last->m + last->n == x.m && last->v + last->n == x.v &&
            p16_next) {
            last->n += x.n; /* the next floats of the same arrays */
            a->total = last->start + last->n;
            continue;
        }
        if (a->n_seg == kMultiSegs && (rc = launch_multi(ci, *a, err)) < 0)
            break;
        const size_t start = (a->total + 3) / 4 * 4;
        const bool vec = aligned16(x.p, x.g, x.m, x.v) && ((uintptr_t)x.p16 & 7u) == 0 &&
                         x.p16_cols % 4 == 0 && x.p16_ld % 4 == 0;
        a->seg[a->n_seg++] =
            MultiSeg{x.p,     x.g, x.m,          x.v, x.p16,
                     start,   x.n, x.decay != 0, vec, x.p16 != nullptr ? x.p16_cols : 0,
                     x.p16_ld};
        a->total = start + x.n;
    }
    if (rc == 0 && a->n_seg > 0)
        rc = launch_multi(ci, *a, err);
    free(a);
    return rc;
}

} /* namespace mgpu_cuda */

using namespace mgpu_cuda;

/* Positional, in the order of mgpu_gpt_bf16_ops_t. */
static const mgpu_gpt_bf16_ops_t gpt_bf16_ops = {
    gpt16_to_bf16,
    gpt16_to_bf16_2d,
    gpt16_layernorm_forward,
    gpt16_layernorm_backward,
    gpt16_linear,
    gpt16_linear_f32,
    gpt16_linear_back_data,
    gpt16_linear_back_weight,
    gpt16_attention_forward,
    gpt16_attention_backward,
    gpt16_xent,
    gpt16_gelu,
    gpt16_linear_back_weight_beside,
    cuda_join,
};

/* Positional, in the order of mgpu_gpt_ops_t (C++17 has no designated initialisers). */
extern "C" const mgpu_gpt_ops_t mgpu_gpt_cuda_ops = {
    gpt_layernorm_forward,
    gpt_layernorm_backward,
    gpt_gelu_forward,
    gpt_gelu_backward,
    gpt_attention_forward,
    gpt_attention_backward,
    gpt_embed_forward,
    gpt_embed_backward,
    gpt_add,
    gpt_tied_head,
    gpt_sumsq,
    gpt_clip_factor,
    gpt_adamw,
    gpt_adamw_multi,
    &gpt_bf16_ops,
};
