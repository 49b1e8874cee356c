/* transformer.h - the plain-C fp32 reference of the ops a GPT-2 block needs, forward and
 * backward: LayerNorm, tanh-GELU, the linear layer, causal multi-head self-attention from a
 * fused qkv buffer, token + position embedding, the residual add, the output layer tied to the
 * token embedding with softmax cross-entropy, and the optimizer's parts (AdamW per tensor with
 * a weight-decay flag, global-norm clipping, the learning-rate schedule).
 *
 * Layouts are row-major, activations (B, T, C) with N = B*T rows; a linear layer's weight is
 * (OC, C) as torch.nn.Linear's, so out = inp @ W^T + bias. The caller owns every buffer.
 * Backward functions ADD into the gradients they write (dx += ..., dw += ...), so that a
 * tensor read by two ops (the residual stream, the tied embedding) gets both contributions:
 * zero the gradients before a step's backward. Every sum runs in a fixed order, so results
 * are the same from run to run. Functions that read user data (token ids) check it and return
 * 0 or a negative code with a message; the others cannot fail. */
#ifndef MGPU_TRANSFORMER_H
#define MGPU_TRANSFORMER_H

#include "kernels.h" /* mgpu_err_t, mgpu_adamw_hparams_t */

#include <stddef.h> /* size_t */
#include <stdint.h> /* int32_t, uint16_t */

/* LayerNorm over the last dimension (eps 1e-5, as torch.nn.LayerNorm): y = (x - mean) * rstd
 * * w + b for each of n rows of c; saves mean and rstd (n each) for the backward. */
void mgpu_gpt_layernorm_forward(int n, int c, const float *x, const float *w, const float *b,
                                float *y, float *mean, float *rstd);
/* dx += ..., dw += ..., db += ... from dy and the forward's x, w, mean, rstd. */
void mgpu_gpt_layernorm_backward(int n, int c, const float *dy, const float *x, const float *w,
                                 const float *mean, const float *rstd, float *dx, float *dw,
                                 float *db);

/* GELU, tanh approximation (torch's approximate="tanh", GPT-2's). */
void mgpu_gpt_gelu_forward(size_t n, const float *x, float *y);
/* dx += dy * gelu'(x); x is the forward's input. */
void mgpu_gpt_gelu_backward(size_t n, const float *x, const float *dy, float *dx);

/* out (n, oc) = inp (n, c) @ w^T + bias, w (oc, c); bias may be NULL. */
void mgpu_gpt_linear_forward(int n, int c, int oc, const float *inp, const float *w,
                             const float *bias, float *out);
/* dinp += dout @ w, dw += dout^T @ inp, dbias += column sums of dout; dinp or dbias may be
 * NULL (the first layer's input, a layer without bias). */
void mgpu_gpt_linear_backward(int n, int c, int oc, const float *dout, const float *inp,
                              const float *w, float *dinp, float *dw, float *dbias);

/* Causal self-attention of nh heads over qkv (b, t, 3c): q, k, v side by side in each row,
 * head h at columns h*hs..(h+1)*hs of each, hs = c / nh. Scores scaled by 1/sqrt(hs),
 * positions after the query masked, softmax with its maximum subtracted, its sums in double
 * and its probabilities stored in fp32.
 * preatt and att are (b, nh, t, t): the scaled scores and the probabilities, saved for the
 * backward (only the causal half is written); out is (b, t, c). */
void mgpu_gpt_attention_forward(int b, int t, int c, int nh, const float *qkv, float *preatt,
                                float *att, float *out);
/* dqkv += ... from dout (b, t, c) and the forward's qkv and att; datt and dpreatt are
 * (b, nh, t, t) scratch the function zeroes and fills. */
void mgpu_gpt_attention_backward(int b, int t, int c, int nh, const float *dout, const float *qkv,
                                 const float *att, float *datt, float *dpreatt, float *dqkv);

/* out (b, t, c) = wte[tokens[b, t]] + wpe[t]; wte (vocab, c), wpe (>= t, c). A token outside
 * 0..vocab-1 is refused (MGPU_E_RANGE, naming its position). */
int mgpu_gpt_embed_forward(int b, int t, int c, int vocab, const int32_t *tokens, const float *wte,
                           const float *wpe, float *out, mgpu_err_t *err);
/* dwte[tokens[b, t]] += dout[b, t], dwpe[t] += dout[b, t], in the order of b then t: no
 * scatter race to make the sum order vary. Tokens were checked by the forward. */
void mgpu_gpt_embed_backward(int b, int t, int c, const int32_t *tokens, const float *dout,
                             float *dwte, float *dwpe);

/* out = a + b (out may alias a or b). Its backward is an add of dout into both gradients:
 * mgpu_gpt_accumulate. */
void mgpu_gpt_residual_forward(size_t n, const float *a, const float *b, float *out);
/* dst += src. */
void mgpu_gpt_accumulate(size_t n, float *dst, const float *src);

/* The output layer tied to the token embedding: logits (n, vocab) = x (n, c) @ wte^T, then
 * softmax cross-entropy against targets, *loss = mean over the n positions. With dx non-NULL
 * it also does the backward: dx += dlogits @ wte and dwte += dlogits^T @ x, where dlogits =
 * (softmax - onehot) / n is written over logits. A target outside 0..vocab-1 is refused. */
int mgpu_gpt_tied_head(int n, int c, int vocab, const float *x, const float *wte,
                       const int32_t *targets, float *logits, float *loss, float *dx, float *dwte,
                       mgpu_err_t *err);

/* Weight decay follows GPT-2/nanoGPT: every tensor of two or more dimensions decays (the
 * linear layers' weights and both embeddings, the token one being the output layer too);
 * one-dimensional tensors (biases, LayerNorm's gains and shifts) do not. */
int mgpu_gpt_decays(int ndim);

/* One torch.optim.AdamW step (step counts from 1) on a tensor of n, with hp's weight decay
 * when decay is non-zero and none otherwise. */
void mgpu_gpt_adamw_tensor(size_t n, float *p, const float *g, float *m, float *v,
                           const mgpu_adamw_hparams_t *hp, int decay, long long step);

/* The global L2 norm over ntensors gradients (g[i] of n[i] floats), summed in double. */
double mgpu_gpt_grad_norm(int ntensors, float *const *g, const size_t *n);
/* torch.nn.utils.clip_grad_norm_: when norm > max_norm, scales every gradient by
 * max_norm / (norm + 1e-6); returns the scale applied (1 when none). */
float mgpu_gpt_clip_grads(int ntensors, float *const *g, const size_t *n, double norm,
                          float max_norm);

/* x rounded to bfloat16 (to nearest, ties to even; NaN stays NaN), as its bits, and back:
 * the bf16 path's storage, for references and tests on the host. */
uint16_t mgpu_gpt_to_bf16(float x);
float mgpu_gpt_from_bf16(uint16_t h);

/* The learning rate at step (counting from 0): linear warm-up from lr_max/warmup to lr_max
 * over warmup steps, then cosine decay to lr_min at total steps, lr_min after. */
float mgpu_gpt_lr(long long step, long long warmup, long long total, float lr_max, float lr_min);

#endif
