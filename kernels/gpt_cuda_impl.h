/* gpt_cuda_impl.h - what the CUDA files of a GPT's ops share (C++ only, kernels/ only): the ops
 * each family file defines for the table in gpt_cuda.cu, with the table's arguments
 * (gpt_ops.h says what each computes). */
#ifndef MGPU_GPT_CUDA_IMPL_H
#define MGPU_GPT_CUDA_IMPL_H

#include "cuda_impl.h" /* cuda_impl, the device helpers */
#include "gpt_cuda.h"  /* gpt_ops.h's types */

namespace mgpu_cuda
{

/* gpt_attention.cu */
int gpt_attention_forward(void *impl, int b, int t, int c, int nh, const float *qkv, float *out,
                          float *lse, mgpu_err_t *err);
int gpt_attention_backward(void *impl, int b, int t, int c, int nh, const float *dout,
                           const float *qkv, const float *out, const float *lse, float *dqkv,
                           mgpu_err_t *err);

/* gpt_attention_tc.cu (forward), gpt_attention_tc_bwd.cu (backward): the same on tensor
 * cores (bf16 operands, fp32 softmax), for bf16 precision; shapes are checked by the callers
 * above, dsum is D's buffer (b, nh, t). */
int gpt_attention_forward_tc(cuda_impl *ci, int b, int t, int c, int nh, const float *qkv,
                             float *out, float *lse, float scale, mgpu_err_t *err);
int gpt_attention_backward_tc(cuda_impl *ci, int b, int t, int c, int nh, const float *dout,
                              const float *qkv, const float *out, const float *lse, float *dqkv,
                              float *dsum, float scale, mgpu_err_t *err);

/* gpt_attention_x3.cu: the same for fp32 and tf32 precision on tensor cores, each product in
 * three TF32 ones (about fp32's accuracy), where the device has TF32 MMAs (compute capability
 * 8.0 on) and MGPU_GPT_ATT_X3 is not 0; arguments as the _tc ones', vec as gpt_attention.cu's
 * (head size a multiple of 4, every buffer 16-byte aligned). */
bool gpt_attention_x3_ok(const cuda_impl *ci);
int gpt_attention_forward_x3(cuda_impl *ci, int b, int t, int c, int nh, const float *qkv,
                             float *out, float *lse, float scale, bool vec, mgpu_err_t *err);
int gpt_attention_backward_x3(cuda_impl *ci, int b, int t, int c, int nh, const float *dout,
                              const float *qkv, const float *out, const float *lse, float *dqkv,
                              float *dsum, float scale, bool vec, mgpu_err_t *err);

/* gpt_embed.cu */
int gpt_embed_forward(void *impl, int b, int t, int c, const int32_t *tokens, const float *wte,
                      const float *wpe, float *out, mgpu_err_t *err);
int gpt_embed_backward(void *impl, int b, int t, int c, int vocab, const int32_t *tokens,
                       const float *dout, float *dwte, float *dwpe, mgpu_err_t *err);

/* --- bf16 storage, for the GPT kernels' files ------------------------------------------------ */

/* v rounded to bf16, as its bits: the hardware's round to nearest even, except that a NaN
 * keeps its sign and upper payload (quieted), as mgpu_gpt_to_bf16 on the host does, where
 * the conversion instruction would give the canonical NaN. */
__device__ __forceinline__ unsigned bf_bits(float v)
{
    if (isnan(v))
        return (__float_as_uint(v) >> 16) | 0x40u;
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

/* lo and hi as bf_bits gives them (lo in the low half): the host's bits, NaN included, for
 * what is checked bit for bit against it (a tensor's bf16 copy). pack_bf16 below is one
 * instruction where a NaN need not keep its payload. */
__device__ __forceinline__ unsigned bf_pack(float lo, float hi)
{
    return bf_bits(lo) | (bf_bits(hi) << 16);
}

__device__ __forceinline__ float bf_lo(unsigned u)
{
    return __uint_as_float(u << 16);
}

__device__ __forceinline__ float bf_hi(unsigned u)
{
    return __uint_as_float(u & 0xffff0000u);
}

/* log2(e): e^x is 2^(x log2(e)), as ex2 below takes it. */
constexpr float kLog2e = 1.4426950408889634f;

/* 2^x, one instruction of the special-function unit (ex2.approx.ftz). exp2f without fast math
 * wraps the same instruction in a range test and two multiplies, to return results below
 * 2^-126 unflushed; a softmax's probabilities and rescaling factors never need those (they
 * are added to sums of at least 1, or scale such sums); in the attention the three
 * instructions were a third of the work a score costs besides the products. 2^-inf is 0. */
__device__ __forceinline__ float ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* lo and hi rounded to bf16 in one instruction (lo in the low half; a NaN becomes the
 * canonical NaN): the attention's operands and the cross-entropy's gradient. */
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<unsigned *>(&v);
}

/* Four bf16 at p + 4i (8 bytes, aligned) as floats, and back. */
__device__ __forceinline__ float4 ld_bf4(const mgpu_bf16_t *p, size_t i)
{
    uint2 u = reinterpret_cast<const uint2 *>(p)[i];
    return make_float4(bf_lo(u.x), bf_hi(u.x), bf_lo(u.y), bf_hi(u.y));
}

__device__ __forceinline__ void st_bf4(mgpu_bf16_t *p, size_t i, float4 v)
{
    reinterpret_cast<uint2 *>(p)[i] = make_uint2(bf_pack(v.x, v.y), bf_pack(v.z, v.w));
}

/* v as the bf16 it is stored as, back in fp32. */
__device__ __forceinline__ float bf_round(float v)
{
    return __uint_as_float(bf_bits(v) << 16);
}

__device__ __forceinline__ float bf_f(mgpu_bf16_t h)
{
    return __uint_as_float((unsigned)h << 16);
}

/* The bf16 path (gpt_ops.h's mgpu_gpt_bf16_ops_t), a family file each: */
typedef __nv_bfloat16 bf16_t;

/* gpt_bf16.cu (layernorm_forward: gpt_cuda.cu, beside the fp32 one) */
int gpt16_to_bf16(void *impl, size_t n, const float *x, mgpu_bf16_t *y, mgpu_err_t *err);
int gpt16_to_bf16_2d(void *impl, int rows, int cols, const float *x, size_t ldx, mgpu_bf16_t *y,
                     size_t ldy, mgpu_err_t *err);
int gpt16_layernorm_forward(void *impl, int n, int c, const float *x, const float *w,
                            const float *b, mgpu_bf16_t *y, size_t ldy, float *mean, float *rstd,
                            mgpu_err_t *err);
int gpt16_layernorm_backward(void *impl, int n, int c, const mgpu_bf16_t *dy, const float *x,
                             const float *w, const float *b, const float *mean, const float *rstd,
                             float *dx, mgpu_bf16_t *dx16, float *dw, float *db, float *dsum,
                             mgpu_bf16_t *y, size_t ldy, int fresh, mgpu_err_t *err);
int gpt16_xent(void *impl, int rows, int vocab, mgpu_bf16_t *logits, const int32_t *targets,
               float scale, int grad, float *loss, mgpu_err_t *err);
int gpt16_gelu(void *impl, size_t n, const mgpu_bf16_t *pre, mgpu_bf16_t *out, mgpu_err_t *err);

/* gpt_linear.cu */
int gpt16_linear(void *impl, int n, int c, int oc, const mgpu_bf16_t *inp, const mgpu_bf16_t *w,
                 const mgpu_bf16_t *bias, mgpu_bf16_t *out, mgpu_bf16_t *pre, mgpu_err_t *err);
int gpt16_linear_f32(void *impl, int n, int c, int oc, const mgpu_bf16_t *inp, const mgpu_bf16_t *w,
                     const float *bias, const float *res, float *out, mgpu_err_t *err);
int gpt16_linear_back_data(void *impl, int n, int c, int oc, const mgpu_bf16_t *dout,
                           const mgpu_bf16_t *w, size_t ldw, const mgpu_bf16_t *pre,
                           mgpu_bf16_t *din, mgpu_err_t *err);
int gpt16_linear_back_weight(void *impl, int n, int c, int oc, const mgpu_bf16_t *dout,
                             const mgpu_bf16_t *inp, size_t ldi, float *dw, float *dbias, int fresh,
                             mgpu_err_t *err);
int gpt16_linear_back_weight_beside(void *impl, int n, int c, int oc, const mgpu_bf16_t *dout,
                                    const mgpu_bf16_t *inp, size_t ldi, float *dw, float *dbias,
                                    int fresh, mgpu_err_t *err);

/* gpt_attention_tc.cu (forward), gpt_attention_tc_bwd.cu (backward) */
int gpt16_attention_forward(void *impl, int b, int t, int c, int nh, const mgpu_bf16_t *qkv,
                            mgpu_bf16_t *out, float *lse, mgpu_err_t *err);
int gpt16_attention_backward(void *impl, int b, int t, int c, int nh, const mgpu_bf16_t *dout,
                             const mgpu_bf16_t *qkv, const mgpu_bf16_t *out, const float *lse,
                             mgpu_bf16_t *dqkv, mgpu_err_t *err);

} /* namespace mgpu_cuda */

#endif
