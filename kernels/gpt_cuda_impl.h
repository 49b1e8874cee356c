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

/* gpt_embed.cu */
int gpt_embed_forward(void *impl, int b, int t, int c, const int32_t *tokens, const float *wte,
                      const float *wpe, float *out, mgpu_err_t *err);
int gpt_embed_backward(void *impl, int b, int t, int c, int vocab, const int32_t *tokens,
                       const float *dout, float *dwte, float *dwpe, mgpu_err_t *err);

/* The bf16 path (gpt_ops.h's mgpu_gpt_bf16_ops_t), a family file each: */
typedef __nv_bfloat16 bf16_t;

/* gpt_bf16.cu */
int gpt16_to_bf16(void *impl, size_t n, const float *x, mgpu_bf16_t *y, mgpu_err_t *err);
int gpt16_layernorm_forward(void *impl, int n, int c, const float *x, const float *w,
                            const float *b, mgpu_bf16_t *y, float *mean, float *rstd,
                            mgpu_err_t *err);
int gpt16_layernorm_backward(void *impl, int n, int c, const mgpu_bf16_t *dy, const float *x,
                             const float *w, const float *mean, const float *rstd, float *dx,
                             mgpu_bf16_t *dx16, float *dw, float *db, float *dsum, mgpu_err_t *err);
int gpt16_xent(void *impl, int rows, int vocab, mgpu_bf16_t *logits, const int32_t *targets,
               float scale, int grad, float *loss, mgpu_err_t *err);

/* gpt_linear.cu */
int gpt16_linear(void *impl, int n, int c, int oc, const mgpu_bf16_t *inp, const mgpu_bf16_t *w,
                 const mgpu_bf16_t *bias, mgpu_bf16_t *out, mgpu_bf16_t *pre, mgpu_err_t *err);
int gpt16_linear_f32(void *impl, int n, int c, int oc, const mgpu_bf16_t *inp, const mgpu_bf16_t *w,
                     const float *bias, const float *res, float *out, mgpu_err_t *err);
int gpt16_linear_back_data(void *impl, int n, int c, int oc, const mgpu_bf16_t *dout,
                           const mgpu_bf16_t *w, const mgpu_bf16_t *pre, mgpu_bf16_t *din,
                           mgpu_err_t *err);
int gpt16_linear_back_weight(void *impl, int n, int c, int oc, const mgpu_bf16_t *dout,
                             const mgpu_bf16_t *inp, float *dw, float *dbias, mgpu_err_t *err);

/* gpt_attention_tc.cu (forward), gpt_attention_tc_bwd.cu (backward) */
int gpt16_attention_forward(void *impl, int b, int t, int c, int nh, const mgpu_bf16_t *qkv,
                            mgpu_bf16_t *out, float *lse, mgpu_err_t *err);
int gpt16_attention_backward(void *impl, int b, int t, int c, int nh, const mgpu_bf16_t *dout,
                             const mgpu_bf16_t *qkv, const mgpu_bf16_t *out, const float *lse,
                             mgpu_bf16_t *dqkv, mgpu_err_t *err);

} /* namespace mgpu_cuda */

#endif
