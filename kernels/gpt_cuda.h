/* gpt_cuda.h - the CUDA table of a GPT's ops (gpt_ops.h's mgpu_gpt_ops_t), for C and C++
 * callers. Its impl is the CUDA backend's (kernels_cuda.h): every op runs on that backend's
 * stream, in order with its kernels.h ops, never synchronises and never allocates inside a
 * step (its scratch is the backend's, grown on a first eager call with a larger shape), so a
 * step made of these ops can be captured in a CUDA graph after one eager step.
 *
 * The files: gpt_cuda.cu (the table, LayerNorm, GELU, add, the tied output layer, the
 * gradient's sum of squares, the clip factor, AdamW), gpt_attention.cu (causal attention,
 * FlashAttention-style, fp32), gpt_attention_tc.cu (the same on tensor cores, for bf16
 * precision), gpt_embed.cu (the embedding). kernels/README.md describes each. */
#ifndef MGPU_GPT_CUDA_H
#define MGPU_GPT_CUDA_H

#ifdef __cplusplus
extern "C" {
#endif

/* Inside the linkage block: gpt_ops.h and its headers are C headers with none of their own. */
#include "gpt_ops.h" /* mgpu_gpt_ops_t */

extern const mgpu_gpt_ops_t mgpu_gpt_cuda_ops;

#ifdef __cplusplus
}
#endif

#endif
