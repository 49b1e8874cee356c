/* optimizers.cu - torch.optim.SGD and AdamW updates in one pass each (kernels/optimizers.c
 * is the reference). */
#include "cuda_impl.h"  /* cuda_impl, the device helpers, the other families' functions */
#include "cuda_check.h" /* CUDA_CHECK, CUDA_CHECK_LAUNCH, CUBLAS_CHECK */

namespace mgpu_cuda
{
namespace
{

/* The flags are uniform across the grid, so their branches cost nothing per element.
 *
 * Every operation of an update rounds on its own (__fmul_rn, __fadd_rn, ...), in the order of
 * the CPU reference, which has no fused multiply-add. Left to the compiler, the contractions
 * into FMAs differed between vec() and one(): in PTX of nvcc 13 for sm_90, AdamW's
 * b2 v + (1 - b2) g g became fma(g, (1 - b2) g, b2 v) in vec() and fma(b2, v, g (1 - b2) g) in
 * one(), and SGD's momentum likewise. So a float's update depended on whether its buffer was
 * 16-byte aligned and where the float4 part ended, and an optimizer of a slice of the
 * parameters (ZeRO-1: zero.h), whose slice starts anywhere, did not give the whole
 * optimizer's bits. */
struct Sgd {
    float *p;
    const float *g;
    float *buf;
    __nv_bfloat16 *p16; /* bf16 mode: the bf16 copy of p the GEMMs read, written in the same pass */
    float lr, mom, damp, wd; /* damp = 1 - dampening */
    bool has_mom, first, nesterov;
    __device__ __forceinline__ void upd(float &pi, float gi, float &bi) const
    {
        const float d = __fadd_rn(gi, __fmul_rn(wd, pi));
        if (!has_mom) {
            pi = __fsub_rn(pi, __fmul_rn(lr, d));
            return;
        }
        /* The first step clones d into the buffer, undamped; the old buffer is not read. */
        const float b = first ? d : __fadd_rn(__fmul_rn(mom, bi), __fmul_rn(damp, d));
        bi = b;
        pi = __fsub_rn(pi, __fmul_rn(lr, nesterov ? __fadd_rn(d, __fmul_rn(mom, b)) : b));
    }
    __device__ void vec(size_t i) const
    {
        float4 pv = ld4(p, i), gv = ld4(g, i), bv = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (has_mom && !first)
            bv = ld4(buf, i);
        upd(pv.x, gv.x, bv.x);
        upd(pv.y, gv.y, bv.y);
        upd(pv.z, gv.z, bv.z);
        upd(pv.w, gv.w, bv.w);
        st4(p, i, pv);
        if (has_mom)
            st4(buf, i, bv);
        if (p16 != nullptr) {
            __nv_bfloat162 lo = __floats2bfloat162_rn(pv.x, pv.y),
                           hi = __floats2bfloat162_rn(pv.z, pv.w);
            uint2 o;
            o.x = *reinterpret_cast<const unsigned int *>(&lo);
            o.y = *reinterpret_cast<const unsigned int *>(&hi);
            reinterpret_cast<uint2 *>(p16)[i] = o;
        }
    }
    __device__ void one(size_t i) const
    {
        float pi = p[i], bi = has_mom && !first ? buf[i] : 0.0f;
        upd(pi, g[i], bi);
        p[i] = pi;
        if (has_mom)
            buf[i] = bi;
        if (p16 != nullptr)
            p16[i] = __float2bfloat16_rn(pi);
    }
};

/* step > 0: this is update `step` (an eager call). step == 0: the next one after the stored
 * step (a graph replay). The factors in double, as the CPU reference computes them. */
__global__ void adamw_prep_kernel(AdamState *st, long long step, double beta1, double beta2,
                                  double lr)
{
    long long s = step > 0 ? step : st->step + 1;
    st->step = s;
    st->step_size = (float)(lr / (1.0 - pow(beta1, (double)s)));
    st->bc2_sqrt = (float)sqrt(1.0 - pow(beta2, (double)s));
}

struct AdamW {
    float *p;
    const float *g;
    float *m, *v;
    float b1, b2, eps, decay;
    const AdamState *st;
    __device__ __forceinline__ void upd(float &pi, float gi, float &mi, float &vi) const
    {
        const float step_size = st->step_size, bc2_sqrt = st->bc2_sqrt;
        /* m.lerp_(g, 1 - b1) */
        mi = __fadd_rn(mi, __fmul_rn(__fsub_rn(1.0f, b1), __fsub_rn(gi, mi)));
        vi = __fadd_rn(__fmul_rn(b2, vi), __fmul_rn(__fmul_rn(__fsub_rn(1.0f, b2), gi), gi));
        const float den = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), bc2_sqrt), eps);
        pi = __fsub_rn(__fmul_rn(pi, decay), __fdiv_rn(__fmul_rn(step_size, mi), den));
    }
    __device__ void vec(size_t i) const
    {
        float4 pv = ld4(p, i), gv = ld4(g, i), mv = ld4(m, i), vv = ld4(v, i);
        upd(pv.x, gv.x, mv.x, vv.x);
        upd(pv.y, gv.y, mv.y, vv.y);
        upd(pv.z, gv.z, mv.z, vv.z);
        upd(pv.w, gv.w, mv.w, vv.w);
        st4(p, i, pv);
        st4(m, i, mv);
        st4(v, i, vv);
    }
    __device__ void one(size_t i) const
    {
        float pi = p[i], mi = m[i], vi = v[i];
        upd(pi, g[i], mi, vi);
        p[i] = pi;
        m[i] = mi;
        v[i] = vi;
    }
};

} /* namespace */

int cuda_sgd_step(void *impl, size_t n, float *p, const float *g, float *buf,
                  const mgpu_sgd_hparams_t *hp, long long step, mgpu_err_t *err)
{
    cuda_impl *c = (cuda_impl *)impl;
    bool has_mom = hp->momentum != 0.0f;
    invalidate(c, p, sizeof(float) * n);
    /* bf16 mode: the update also writes the bf16 mirror of p that the GEMMs read (one pass,
     * no conversion of the weights in any GEMM). Made on the first update of bf16 mode, which
     * runs eagerly (a capture cannot allocate); a mirror of another range is replaced. */
    __nv_bfloat16 *p16 = nullptr;
    if (c->prec == MGPU_PREC_BF16 && !c->opt.shadow_off && !c->opt.lt_off && n > 0) {
        if (c->mir == nullptr || c->mir_src != p || c->mir_n != n) {
            cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
            CUDA_CHECK(err, cudaStreamIsCapturing(c->stream, &cs));
            if (cs == cudaStreamCaptureStatusNone) {
                CUDA_CHECK(err, cudaStreamSynchronize(c->stream));
                CUDA_CHECK(err, cudaFree(c->mir));
                c->mir = nullptr;
                CUDA_CHECK(err, cudaMalloc((void **)&c->mir, (n + 8) * sizeof(__nv_bfloat16)));
                c->mir_src = p;
                c->mir_n = n;
            }
        }
        if (c->mir != nullptr && c->mir_src == p && c->mir_n == n)
            p16 = c->mir;
    }
    Sgd f{p,
          g,
          has_mom ? buf : nullptr,
          p16,
          hp->lr,
          hp->momentum,
          1.0f - hp->dampening,
          hp->weight_decay,
          has_mom,
          step == 1,
          hp->nesterov != 0};
    bool vec = aligned16(p, g, f.buf);
    int rc = launch_ew(c, f, n, vec, "sgd_step", err);
    if (rc == 0 && p16 != nullptr)
        c->mir_valid = true;
    return rc;
}

int cuda_adamw_step(void *impl, size_t n, float *p, const float *g, float *m, float *v,
                    const mgpu_adamw_hparams_t *hp, long long step, mgpu_err_t *err)
{
    cuda_impl *c = (cuda_impl *)impl;
    invalidate(c, p, sizeof(float) * n);
    if (n == 0)
        return 0;
    /* Inside a capture the step number comes from device memory, so that every replay of
     * the graph is the next update; eager calls set it. */
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    CUDA_CHECK(err, cudaStreamIsCapturing(c->stream, &cs));
    adamw_prep_kernel<<<1, 1, 0, c->stream>>>(c->adam, cs == cudaStreamCaptureStatusNone ? step : 0,
                                              hp->beta1, hp->beta2, hp->lr);
    CUDA_CHECK_LAUNCH(err, "adamw_prep_kernel");
    AdamW f{p, g, m, v, hp->beta1, hp->beta2, hp->eps, 1.0f - hp->lr * hp->weight_decay, c->adam};
    bool vec = aligned16(p, g, m, v);
    return launch_ew(c, f, n, vec, "adamw_step", err);
}

} /* namespace mgpu_cuda */
