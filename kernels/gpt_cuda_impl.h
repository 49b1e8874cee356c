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

/* gpt_attention_tc.cu: the same on tensor cores (bf16 operands, fp32 softmax), for bf16
 * precision; shapes are checked by the callers above, dsum is D's buffer (b, nh, t). */
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

} /* namespace mgpu_cuda */

#endif
