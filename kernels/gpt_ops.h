/* gpt_ops.h - the ops of a GPT-2 model that kernels.h's table does not have, behind a second
 * table of function pointers per backend: LayerNorm, GELU, causal attention, the embedding,
 * the output layer tied to the token embedding, the gradient norm and AdamW under a clip.
 *
 * The products (qkv, attention projection, MLP) and bias sums are kernels.h's mgpu_k_gemm and
 * mgpu_k_sum_rows, which already follow the backend's precision. A backend's table runs on the
 * same impl as its kernels.h table (the CUDA one on its stream), every pointer is backend
 * memory, and scalar results (loss, sums of squares, the clip factor) stay in backend memory,
 * so a GPU step never waits for the host. The CPU table (gpt_cpu.c) is the reference the CUDA
 * one (gpt_cuda.cu) is tested against; it computes through transformer.h's functions.
 *
 * Call the mgpu_kg_* launchers, never the table: they check shapes and arguments for every
 * backend (MGPU_E_USAGE / MGPU_E_RANGE naming the op and the argument), then dispatch.
 *
 * Gradient conventions: parameter gradients (dw, db, dwte, dwpe) are ADDED to (a step zeroes
 * them once, and gradient accumulation keeps adding); a gradient of an activation is ADDED
 * where the activation is read twice (dx of LayerNorm and of the head, which feed the
 * residual stream) and OVERWRITTEN where it is not (GELU's dx, attention's dqkv), as each
 * function says.
 *
 * AdamW comes twice: adamw takes one tensor and its step's values by value; adamw_multi takes
 * every tensor at once (one launch on a GPU) and reads what changes from step to step (the
 * learning rate, the step number and the factors made of them) from an mgpu_gpt_adamw_now_t
 * in backend memory, so that a CUDA graph captured around it replays each step's values. */
#ifndef MGPU_GPT_OPS_H
#define MGPU_GPT_OPS_H

#include <stddef.h> /* size_t */
#include <stdint.h> /* int32_t */

#include "error.h"   /* mgpu_err_t */
#include "kernels.h" /* mgpu_kernels_t, mgpu_adamw_hparams_t */

/* A bfloat16 in backend memory, as its bits (a float's upper half): the storage of the bf16
 * path's activations and of the parameters' bf16 copy. */
typedef uint16_t mgpu_bf16_t;

/* One tensor of an adamw_multi step (every pointer backend memory): p, g, m, v of n floats;
 * weight decay applies when decay is non-zero; p16, when not NULL, receives the updated p
 * rounded to bf16 (to nearest, ties to even): the bf16 path's copy of the weights. With
 * p16_cols > 0 that copy is rows of p16_cols elements p16_ld apart (element j at
 * p16[j / p16_cols * p16_ld + j % p16_cols]: a weight matrix, or with p16_cols 1 a bias as a
 * column, inside a wider matrix); 0: n consecutive elements. */
typedef struct mgpu_gpt_adamw_tensor {
    float *p;
    const float *g;
    float *m, *v;
    mgpu_bf16_t *p16;
    size_t n;
    int decay;
    int p16_cols;
    size_t p16_ld;
} mgpu_gpt_adamw_tensor_t;

/* What changes from one AdamW step to the next, in backend memory, written by the host before
 * the step's work runs (mgpu_kg_adamw_now fills it): the learning rate and the step (from 1),
 * and the factors made of them as torch.optim.AdamW (and optimizers.c) computes them on the
 * host in double, so a table never computes a power of beta itself. */
typedef struct mgpu_gpt_adamw_now {
    float lr;
    float step_size; /* lr / (1 - beta1^step) */
    float bc2_sqrt;  /* sqrt(1 - beta2^step) */
    float decay;     /* 1 - lr * weight_decay: what a decaying tensor's p is multiplied by */
    long long step;
} mgpu_gpt_adamw_now_t;

/* The bf16 path of a GPU backend in bf16 precision: activations stored in bf16 between ops
 * (halving their memory and traffic), every product on bf16 operands with fp32 accumulation
 * (the weights from their bf16 copy, which adamw_multi's p16 keeps), LayerNorm's statistics,
 * the softmax and every gradient sum in fp32, the residual stream and the parameters'
 * gradients in fp32. Bias, GELU and residual add run in the products' epilogues. This is
 * what torch.autocast(bfloat16) computes: a product's output is rounded to bf16 once, and
 * GELU is applied to the rounded pre-activation.
 *
 * Row-major as above; a linear layer's w is (oc, c). mgpu_kg_bf16_ops(k) is NULL when k's
 * backend has no such path (the CPU, a GPU in fp32 or tf32). */
typedef struct mgpu_gpt_bf16_ops {
    /* y[i] = bf16(x[i]) for n elements. */
    int (*to_bf16)(void *impl, size_t n, const float *x, mgpu_bf16_t *y, mgpu_err_t *err);
    /* y[r * ldy + j] = bf16(x[r * ldx + j]) for rows r and columns j below cols (ldx 0: every
     * row from x's first). */
    int (*to_bf16_2d)(void *impl, int rows, int cols, const float *x, size_t ldx, mgpu_bf16_t *y,
                      size_t ldy, mgpu_err_t *err);
    /* LayerNorm as the fp32 op, y written in bf16, its rows ldy elements apart (ldy >= c; the
     * columns past c are left as they are). */
    int (*layernorm_forward)(void *impl, int n, int c, const float *x, const float *w,
                             const float *b, mgpu_bf16_t *y, size_t ldy, float *mean, float *rstd,
                             mgpu_err_t *err);
    /* LayerNorm's backward from a bf16 dy: dx (fp32) += ..., dw += ..., db += ..., and when
     * dx16 is not NULL, dx16 = bf16 of the updated dx (what the products below read); when
     * dsum (c floats) is not NULL, dsum += the column sums of dx16 as stored (the bias
     * gradient of the linear layer that reads dx16 next, in the same pass; needs dx16). With
     * fresh, dw, db and dsum are overwritten instead (their first write of a step: no zeroing
     * before it); dx is always added to. When y is not NULL, the forward's output is written
     * there as well, rows ldy apart (ldy >= c), from b (the bias, then needed) and the same
     * mean and rstd: layernorm_forward's bits, made again in the pass that reads x anyway. */
    int (*layernorm_backward)(void *impl, int n, int c, const mgpu_bf16_t *dy, const float *x,
                              const float *w, const float *b, const float *mean, const float *rstd,
                              float *dx, mgpu_bf16_t *dx16, float *dw, float *db, float *dsum,
                              mgpu_bf16_t *y, size_t ldy, int fresh, mgpu_err_t *err);
    /* out (n, oc) = inp (n, c) @ w^T + bias (bf16, oc; NULL: none). With pre not NULL: pre =
     * that sum and out = gelu(pre) (tanh approximation). */
    int (*linear)(void *impl, int n, int c, int oc, const mgpu_bf16_t *inp, const mgpu_bf16_t *w,
                  const mgpu_bf16_t *bias, mgpu_bf16_t *out, mgpu_bf16_t *pre, mgpu_err_t *err);
    /* out (n, oc, fp32) = inp @ w^T + bias (fp32, NULL: none) + res (fp32 (n, oc), NULL:
     * none); out may be res. */
    int (*linear_f32)(void *impl, int n, int c, int oc, const mgpu_bf16_t *inp,
                      const mgpu_bf16_t *w, const float *bias, const float *res, float *out,
                      mgpu_err_t *err);
    /* din (n, c) = dout (n, oc) @ w (oc, c; its rows ldw apart, ldw >= c), times gelu'(pre)
     * (pre: (n, c)) when pre is not NULL; overwritten. */
    int (*linear_back_data)(void *impl, int n, int c, int oc, const mgpu_bf16_t *dout,
                            const mgpu_bf16_t *w, size_t ldw, const mgpu_bf16_t *pre,
                            mgpu_bf16_t *din, mgpu_err_t *err);
    /* dw (oc, c, fp32) += dout^T @ inp (n, c; its rows ldi apart, ldi >= c); dbias (oc, fp32;
     * NULL: none) += the column sums of dout, in a fixed order. With fresh, both are
     * overwritten instead. */
    int (*linear_back_weight)(void *impl, int n, int c, int oc, const mgpu_bf16_t *dout,
                              const mgpu_bf16_t *inp, size_t ldi, float *dw, float *dbias,
                              int fresh, mgpu_err_t *err);
    /* Causal attention as the fp32 op's, over bf16 qkv (b, t, 3c), out (b, t, c) in bf16,
     * lse fp32; the backward's dqkv (bf16) overwritten. */
    int (*attention_forward)(void *impl, int b, int t, int c, int nh, const mgpu_bf16_t *qkv,
                             mgpu_bf16_t *out, float *lse, mgpu_err_t *err);
    int (*attention_backward)(void *impl, int b, int t, int c, int nh, const mgpu_bf16_t *dout,
                              const mgpu_bf16_t *qkv, const mgpu_bf16_t *out, const float *lse,
                              mgpu_bf16_t *dqkv, mgpu_err_t *err);
    /* Softmax cross-entropy of rows of bf16 logits (rows, vocab), in fp32: loss[0] += scale *
     * the sum of -log p[target]; with grad, each row's logits are overwritten with
     * bf16(scale * (p - onehot(target))). */
    int (*xent)(void *impl, int rows, int vocab, mgpu_bf16_t *logits, const int32_t *targets,
                float scale, int grad, float *loss, mgpu_err_t *err);
    /* out[i] = bf16(gelu(pre[i])) for n elements (tanh approximation): linear's out made again
     * from the pre it kept, for a backward that keeps pre alone. */
    int (*gelu)(void *impl, size_t n, const mgpu_bf16_t *pre, mgpu_bf16_t *out, mgpu_err_t *err);
    /* linear_back_weight, free to run beside the ops called after it until the next join
     * (NULL: the caller uses linear_back_weight): until then nothing may write dout or inp,
     * nor read or write dw and dbias. Those queued run one after another, in the order called. */
    int (*linear_back_weight_beside)(void *impl, int n, int c, int oc, const mgpu_bf16_t *dout,
                                     const mgpu_bf16_t *inp, size_t ldi, float *dw, float *dbias,
                                     int fresh, mgpu_err_t *err);
    /* The ops called after it see every linear_back_weight_beside called before it done. */
    int (*join)(void *impl, mgpu_err_t *err);
} mgpu_gpt_bf16_ops_t;

typedef struct mgpu_gpt_ops {
    /* y = (x - mean) * rstd * w + b over each of n rows of c (eps 1e-5); mean and rstd (n
     * floats each) are saved for the backward. Statistics in fp32 or wider. */
    int (*layernorm_forward)(void *impl, int n, int c, const float *x, const float *w,
                             const float *b, float *y, float *mean, float *rstd, mgpu_err_t *err);
    /* dx += ..., dw += ..., db += ... */
    int (*layernorm_backward)(void *impl, int n, int c, const float *dy, const float *x,
                              const float *w, const float *mean, const float *rstd, float *dx,
                              float *dw, float *db, mgpu_err_t *err);
    /* y = gelu(x), tanh approximation; y may alias x. */
    int (*gelu_forward)(void *impl, size_t n, const float *x, float *y, mgpu_err_t *err);
    /* dx = dy * gelu'(x) (overwritten; dx may alias dy). */
    int (*gelu_backward)(void *impl, size_t n, const float *x, const float *dy, float *dx,
                         mgpu_err_t *err);
    /* Causal self-attention of nh heads over qkv (b, t, 3c) (q, k, v side by side in a row,
     * head h at columns h*hs.. of each, hs = c/nh), scale 1/sqrt(hs): out (b, t, c), and lse
     * (b, nh, t), each query's log-sum-exp of its scaled scores, which is all the backward
     * needs besides qkv and out: no (t, t) matrix outlives the call. */
    int (*attention_forward)(void *impl, int b, int t, int c, int nh, const float *qkv, float *out,
                             float *lse, mgpu_err_t *err);
    /* dqkv (b, t, 3c) = the gradient from dout (overwritten). */
    int (*attention_backward)(void *impl, int b, int t, int c, int nh, const float *dout,
                              const float *qkv, const float *out, const float *lse, float *dqkv,
                              mgpu_err_t *err);
    /* out (b, t, c) = wte[tokens] + wpe[position]. Tokens are in 0..vocab-1: the data
     * loader checks every token of a file when it reads it. */
    int (*embed_forward)(void *impl, int b, int t, int c, const int32_t *tokens, const float *wte,
                         const float *wpe, float *out, mgpu_err_t *err);
    /* dwte[tokens[i]] += dout[i], dwpe[t] += dout[b, t]: each sum in the order of the rows
     * (deterministic: no race decides the order of a token's contributions). */
    int (*embed_backward)(void *impl, int b, int t, int c, int vocab, const int32_t *tokens,
                          const float *dout, float *dwte, float *dwpe, mgpu_err_t *err);
    /* out = a + b (out may alias either). */
    int (*add)(void *impl, size_t n, const float *a, const float *b, float *out, mgpu_err_t *err);
    /* The output layer tied to the token embedding, for n rows of x (n, c): logits = x @ wte^T
     * (n, vocab; logits is scratch of n*vocab floats the backend may use as it likes), p =
     * softmax(logits), loss[0] += scale * sum over rows of -log p[target]. When dx is not NULL,
     * also the backward of that loss: with dlogits = scale * (p - onehot(target)), dx +=
     * dlogits @ wte and dwte += dlogits^T @ x. scale is 1/(rows of the whole batch) for a mean,
     * so a batch may be cut into chunks of rows. Targets are in 0..vocab-1 (as tokens). */
    int (*tied_head)(void *impl, int n, int c, int vocab, const float *x, const float *wte,
                     const int32_t *targets, float scale, float *logits, float *loss, float *dx,
                     float *dwte, mgpu_err_t *err);
    /* acc[0] += sum of x[i]^2 (accumulated in fp32 or wider). */
    int (*sumsq)(void *impl, size_t n, const float *x, float *acc, mgpu_err_t *err);
    /* factor[0] = max_norm / (sqrt(sumsq[0]) + 1e-6) when that norm exceeds max_norm, else 1
     * (torch.nn.utils.clip_grad_norm_); max_norm <= 0: 1. */
    int (*clip_factor)(void *impl, const float *sumsq, float max_norm, float *factor,
                       mgpu_err_t *err);
    /* One torch.optim.AdamW step (step counts from 1) on n parameters with the gradient g
     * multiplied by factor[0] first (factor NULL: 1); hp->weight_decay applies as given (0 for
     * the tensors that do not decay). */
    int (*adamw)(void *impl, size_t n, float *p, const float *g, float *m, float *v,
                 const mgpu_adamw_hparams_t *hp, long long step, const float *factor,
                 mgpu_err_t *err);
    /* The same step on n_tensors tensors (t: a host array, read during the call): hp's betas,
     * eps and weight_decay (its lr is not read: now's is), now (backend memory) read when the
     * step runs, not when it is queued; factor as adamw's. Each tensor gets exactly adamw's
     * result for the step's values. */
    int (*adamw_multi)(void *impl, int n_tensors, const mgpu_gpt_adamw_tensor_t *t,
                       const mgpu_adamw_hparams_t *hp, const mgpu_gpt_adamw_now_t *now,
                       const float *factor, mgpu_err_t *err);
    /* The bf16 path (above), NULL where the backend has none. */
    const mgpu_gpt_bf16_ops_t *bf16;
} mgpu_gpt_ops_t;

extern const mgpu_gpt_ops_t mgpu_gpt_cpu_ops;

/* The table of k's backend (the CUDA one when this build has it and k is CUDA). */
const mgpu_gpt_ops_t *mgpu_kg_ops(const mgpu_kernels_t *k);

/* k's bf16 path when its backend has one and k's precision is bf16, else NULL. Its ops are
 * called directly (the model checks its shapes once, at creation). */
const mgpu_gpt_bf16_ops_t *mgpu_kg_bf16_ops(const mgpu_kernels_t *k);

/* The launchers, one per op, with the table's arguments after k (see above). */
int mgpu_kg_layernorm_forward(mgpu_kernels_t *k, int n, int c, const float *x, const float *w,
                              const float *b, float *y, float *mean, float *rstd, mgpu_err_t *err);
int mgpu_kg_layernorm_backward(mgpu_kernels_t *k, int n, int c, const float *dy, const float *x,
                               const float *w, const float *mean, const float *rstd, float *dx,
                               float *dw, float *db, mgpu_err_t *err);
int mgpu_kg_gelu_forward(mgpu_kernels_t *k, size_t n, const float *x, float *y, mgpu_err_t *err);
int mgpu_kg_gelu_backward(mgpu_kernels_t *k, size_t n, const float *x, const float *dy, float *dx,
                          mgpu_err_t *err);
int mgpu_kg_attention_forward(mgpu_kernels_t *k, int b, int t, int c, int nh, const float *qkv,
                              float *out, float *lse, mgpu_err_t *err);
int mgpu_kg_attention_backward(mgpu_kernels_t *k, int b, int t, int c, int nh, const float *dout,
                               const float *qkv, const float *out, const float *lse, float *dqkv,
                               mgpu_err_t *err);
int mgpu_kg_embed_forward(mgpu_kernels_t *k, int b, int t, int c, const int32_t *tokens,
                          const float *wte, const float *wpe, float *out, mgpu_err_t *err);
int mgpu_kg_embed_backward(mgpu_kernels_t *k, int b, int t, int c, int vocab, const int32_t *tokens,
                           const float *dout, float *dwte, float *dwpe, mgpu_err_t *err);
int mgpu_kg_add(mgpu_kernels_t *k, size_t n, const float *a, const float *b, float *out,
                mgpu_err_t *err);
int mgpu_kg_tied_head(mgpu_kernels_t *k, int n, int c, int vocab, const float *x, const float *wte,
                      const int32_t *targets, float scale, float *logits, float *loss, float *dx,
                      float *dwte, mgpu_err_t *err);
int mgpu_kg_sumsq(mgpu_kernels_t *k, size_t n, const float *x, float *acc, mgpu_err_t *err);
int mgpu_kg_clip_factor(mgpu_kernels_t *k, const float *sumsq, float max_norm, float *factor,
                        mgpu_err_t *err);
int mgpu_kg_adamw(mgpu_kernels_t *k, size_t n, float *p, const float *g, float *m, float *v,
                  const mgpu_adamw_hparams_t *hp, long long step, const float *factor,
                  mgpu_err_t *err);
int mgpu_kg_adamw_multi(mgpu_kernels_t *k, int n_tensors, const mgpu_gpt_adamw_tensor_t *t,
                        const mgpu_adamw_hparams_t *hp, const mgpu_gpt_adamw_now_t *now,
                        const float *factor, mgpu_err_t *err);

/* Fills *now (host memory) for step (from 1) at hp->lr, hp's betas and weight_decay: the
 * host's side of adamw_multi, to copy into backend memory. */
void mgpu_kg_adamw_now(const mgpu_adamw_hparams_t *hp, long long step, mgpu_gpt_adamw_now_t *now);

#endif
