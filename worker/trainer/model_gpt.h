/* model_gpt.h - a GPT-2 language model: token and learned position embeddings, n_layer
 * pre-LayerNorm blocks (causal multi-head self-attention, a 4x MLP with tanh-GELU), a final
 * LayerNorm and the output layer tied to the token embedding; biases as GPT-2 has them.
 * Forward and backward run through gpt_ops.h's launchers and kernels.h's mgpu_k_gemm and
 * mgpu_k_sum_rows, so the same code runs on every backend that has a GPT table.
 *
 * Parameters live in ONE contiguous buffer and gradients in another of the same layout, in
 * nanoGPT's named_parameters() order: wte (vocab, C), wpe (context, C), then per block
 * ln_1.weight, ln_1.bias, attn.c_attn.weight (3C, C), attn.c_attn.bias, attn.c_proj.weight
 * (C, C), attn.c_proj.bias, ln_2.weight, ln_2.bias, mlp.c_fc.weight (4C, C), mlp.c_fc.bias,
 * mlp.c_proj.weight (C, 4C), mlp.c_proj.bias; then ln_f.weight, ln_f.bias (lm_head is wte).
 * So DDP's bucketed all-reduce, the parameters' broadcast and a checkpoint each see one array.
 * AdamW's moments are one buffer of 2 x n_params (m, then v) in the same layout.
 *
 * Ownership: mgpu_gpt_create returns a model freed with mgpu_gpt_destroy (before the kernels
 * object it was created with); everything it points to is backend memory it owns, allocated
 * once for batches of up to max_b sequences of up to context tokens. */
#ifndef MGPU_MODEL_GPT_H
#define MGPU_MODEL_GPT_H

#include <stddef.h> /* size_t */
#include <stdint.h> /* int32_t, uint64_t */

#include "error.h"   /* mgpu_err_t */
#include "gpt_ops.h" /* mgpu_gpt_adamw_tensor_t, mgpu_gpt_adamw_now_t */
#include "kernels.h" /* mgpu_kernels_t, mgpu_adamw_hparams_t */
#include "mgpu.h"    /* mgpu_ctx_t: progress */

typedef struct mgpu_gpt_spec {
    int n_layer, n_head, n_embd, context, vocab;
    /* 1: AdamW's moments live elsewhere (zero = 1: each rank keeps its slice's, zero.h), so
     * the model allocates none (moments NULL) and mgpu_gpt_step / _update refuse to run. */
    int sharded_optimizer;
    /* What backward makes again instead of each layer keeping it from forward (activation
     * recomputation, for memory): 0 nothing; 1 the MLP's GELU output; 2 that and both
     * LayerNorms' outputs. The layers then share one buffer of each (mgpu_gpt_t's re_*). The
     * gradients are those of 0, bit for bit, but for the bf16 path's GELU, which is made
     * again from the pre-activation kept in bf16 (gelu of mgpu_gpt_bf16_ops_t). */
    int recompute;
    /* 1: every backward follows mgpu_gpt_zero_grads and its step's update comes before the next
     * forward (no gradient accumulation, no forward between a backward and its update). The
     * bf16 path then keeps activations of each block but the first in the memory of the
     * gradients of the block below, which that block's backward writes only after the block
     * above's backward has read them (the gradients are dead from an update to the next
     * backward, the activations from that backward to the next forward): the model's memory
     * drops by about the blocks' gradients (gpt_layout.h). A backward that would add into
     * gradients an earlier one wrote is refused. 0: every activation has memory of its own. */
    int reuse_grads;
} mgpu_gpt_spec_t;

/* Offsets (in floats) of one block's tensors in params / grads. */
typedef struct mgpu_gpt_block {
    size_t ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fcp_w, fcp_b;
} mgpu_gpt_block_t;

/* One parameter tensor: where it lies, its size and its number of dimensions (weight decay
 * applies to those of two or more: mgpu_gpt_decays). */
typedef struct mgpu_gpt_tensor {
    size_t off, n;
    int ndim;
} mgpu_gpt_tensor_t;

/* A block's activations, kept from forward for backward. The residual stream (x, res2),
 * LayerNorm's statistics and lse are fp32 on every path; the others are fp32 on the fp32 path
 * and bf16 (the *16 ones, the fp32 ones then NULL) on the bf16 path. */
typedef struct mgpu_gpt_acts {
    float *x; /* the block's input (the residual stream) (B, T, C) */
    float *ln1, *ln1_mean, *ln1_rstd;
    float *qkv;        /* (B, T, 3C) */
    float *atty, *lse; /* attention's output (B, T, C) and lse (B, nh, T) */
    float *res2;       /* x + attention's projection (B, T, C) */
    float *ln2, *ln2_mean, *ln2_rstd;
    float *fch, *fch_gelu; /* (B, T, 4C): the MLP's pre-activation and its GELU */
    mgpu_bf16_t *ln1_16, *qkv16, *atty16, *ln2_16, *fch16, *gelu16;
} mgpu_gpt_acts_t;

typedef struct mgpu_gpt {
    mgpu_kernels_t *k;
    mgpu_ctx_t *progress; /* may be NULL: where mgpu_gpt_loss says forward and backward begin */
    mgpu_gpt_spec_t spec;
    int max_b;
    size_t n_params;
    float *params, *grads, *moments; /* moments: AdamW's m then v, 2 x n_params */
    size_t wte, wpe, lnf_w, lnf_b;
    mgpu_gpt_block_t *blocks;
    int n_tensors;
    mgpu_gpt_tensor_t *tensors; /* in the layout's order */
    mgpu_gpt_acts_t *acts;      /* n_layer of them */
    float *xout;                /* the last block's output (B, T, C) */
    float *lnf, *lnf_mean, *lnf_rstd;
    float *logits; /* head_rows x vocab: the output layer's scratch */
    int head_rows;
    float *dres, *dln, *d4, *dqkv; /* backward scratch (dres only, on the bf16 path) */
    /* The bf16 path (see gpt_ops.h; NULL: the fp32 path, every activation fp32): its ops,
     * the parameters' bf16 copy (AdamW writes it with the parameters), and its bf16 buffers
     * in place of lnf, logits, dln, d4 and dqkv (logits then holds one row's fp32 logits for
     * mgpu_gpt_last_logits). params16 holds n_params16 values: every tensor's copy in the
     * layout's order, less mlp.c_fc's weight and bias when fc16 holds them (fc_kp > 0);
     * mgpu_gpt_w16 finds a tensor's copy. */
    const mgpu_gpt_bf16_ops_t *b16;
    mgpu_bf16_t *params16, *lnf16, *logits16, *dres16, *dln16, *d4_16, *dqkv16;
    size_t n_params16;
    /* The bf16 path's MLP input product with its bias inside (fc_kp > 0): ln2_16's rows are
     * fc_kp wide, the LayerNorm's C values then a 1 and zeros, and fc16 holds each layer's
     * mlp.c_fc weight (4C, C) and bias as rows of fc_kp, [w | b | 0...] (AdamW writes them
     * there), so that one product without a bias epilogue adds the bias: cuBLASLt's GELU
     * epilogue with the pre-activation kept runs markedly slower with a bias than without. */
    int fc_kp;
    mgpu_bf16_t *fc16;
    float *one; /* a 1.0f in backend memory, for those columns of 1 */
    /* spec.recompute: the one buffer every layer's acts point to for what backward makes again
     * (NULL where each layer keeps its own), and the statistics its LayerNorms write then
     * (the fp32 path's; the bf16 path's LayerNorm backward writes the output again from the
     * forward's own). */
    float *re_ln1, *re_ln2, *re_gelu, *re_mean, *re_rstd;
    mgpu_bf16_t *re_ln1_16, *re_ln2_16, *re_gelu16;
    /* The bf16 path's buffers that lie inside others' memory instead of their own, in bytes:
     * the blocks' backward scratch (dres, d4_16, dqkv16) inside logits16, whose logits are dead
     * once the head's backward has read them (in_logits; always, where it fits), and with
     * spec.reuse_grads block l's activations inside block l - 1's gradients (in_grads). */
    size_t in_logits, in_grads;
    /* The bf16 path after mgpu_gpt_zero_grads, until a backward has run: grads holds none of
     * the step's sums, and each gradient's first write overwrites it (the ops' fresh). */
    int grads_fresh;
    int32_t *tokens, *targets;     /* the batch (B, T) each */
    float *scalars;                /* [0] loss, [1] sum of squared gradients, [2] the clip factor */
    mgpu_gpt_adamw_now_t *now;     /* backend memory: the next AdamW step's lr and step */
    mgpu_gpt_adamw_tensor_t *adam; /* host: the n_tensors tensors AdamW updates, with decay */
    int b, t;                      /* the shape of the last forward */
} mgpu_gpt_t;

/* Checks the spec (every size >= 1, n_embd a multiple of n_head), lays out the parameters and
 * allocates everything for batches of up to max_b sequences. Parameters start at zero: call
 * mgpu_gpt_init. The bf16 path is taken when k's backend has one and is in bf16 precision,
 * and n_embd and vocab are multiples of 8 (its products' alignment); else the fp32 one. */
int mgpu_gpt_create(mgpu_kernels_t *k, const mgpu_gpt_spec_t *spec, int max_b, mgpu_gpt_t **out,
                    mgpu_err_t *err);
/* mgpu_gpt_create with the bf16 path's ops given (borrowed; NULL: the fp32 path) whatever k's
 * backend and precision, n_embd and vocab still multiples of 8: a test runs the bf16 path's
 * order of work on the CPU with a table of its own. */
int mgpu_gpt_create_with(mgpu_kernels_t *k, const mgpu_gpt_spec_t *spec, int max_b,
                         const mgpu_gpt_bf16_ops_t *b16, mgpu_gpt_t **out, mgpu_err_t *err);
void mgpu_gpt_destroy(mgpu_gpt_t *m);

/* GPT-2's initialisation from seed: weights and both embeddings normal(0, 0.02), the two
 * residual projections (attn.c_proj, mlp.c_proj) normal(0, 0.02 / sqrt(2 n_layer)), biases 0,
 * LayerNorm weights 1 and biases 0. The same seed gives the same parameters on every rank. */
int mgpu_gpt_init(mgpu_gpt_t *m, uint64_t seed, mgpu_err_t *err);

/* Copies b sequences of t tokens (host, b x t, t <= context) and, when targets is not NULL,
 * their targets into the model's batch buffers. */
int mgpu_gpt_load(mgpu_gpt_t *m, const int32_t *tokens, const int32_t *targets, int b, int t,
                  mgpu_err_t *err);

/* Forward of the loaded batch up to the final LayerNorm (m->lnf, or m->lnf16 on the bf16
 * path). */
int mgpu_gpt_forward(mgpu_gpt_t *m, mgpu_err_t *err);

/* The loaded batch's loss times scale (a mean over rows when scale is 1 / rows) added to
 * m->scalars[0], and with backward set its gradient added to m->grads: forward, output layer,
 * backward. Zero m->grads and m->scalars[0] before the first micro-batch of a step. */
int mgpu_gpt_loss(mgpu_gpt_t *m, float scale, int backward, mgpu_err_t *err);

/* Where backward has got to, for DDP's buckets: called with layer = n_layer once the final
 * LayerNorm's gradients are final, with layer = l (n_layer - 1 down to 0) once block l's are,
 * and with layer = MGPU_GPT_EMBEDDINGS once the embeddings' are (all of them). "Final" means
 * that nothing later in this backward writes them; the work that wrote them is queued on the
 * backend's stream (on a GPU it may not have run yet). A negative return ends the backward
 * with it. On the bf16 path the LayerNorm backward of block l also adds into block l - 1's
 * mlp.c_proj bias gradient, so block l - 1 is final only after its own layer, as here. */
#define MGPU_GPT_EMBEDDINGS (-1)
typedef int (*mgpu_gpt_hook_fn)(void *ctx, int layer, mgpu_err_t *err);

/* mgpu_gpt_loss with hook (NULL: none) called from the backward as above. */
int mgpu_gpt_loss_hooked(mgpu_gpt_t *m, float scale, int backward, mgpu_gpt_hook_fn hook,
                         void *hook_ctx, mgpu_err_t *err);

/* A slice of the gradients that DDP all-reduces as one message, and the hook's layer after
 * which it is final (n_layer, ..., 0, MGPU_GPT_EMBEDDINGS). */
typedef struct mgpu_gpt_bucket {
    size_t off, n; /* grads[off, off + n), in floats */
    int layer;
} mgpu_gpt_bucket_t;

/* DDP's gradient buckets in backward's order, as PyTorch's bucket_cap_mb makes them: from the
 * end of the parameters down, the final LayerNorm, then block n_layer - 1 down to block 0,
 * then the embeddings (last: the output layer tied to wte adds into it first, the embedding's
 * backward last); a bucket closes at the first of these boundaries where it holds at least
 * bucket_mb MiB, and the embeddings close the last one whatever its size. So each bucket is
 * one contiguous slice, the buckets cover the parameters once, and bucket i + 1 lies below
 * bucket i. *out (malloc'd, the caller frees) receives *n of them, at most n_layer + 2. */
int mgpu_gpt_buckets(const mgpu_gpt_t *m, double bucket_mb, mgpu_gpt_bucket_t **out, int *n,
                     mgpu_err_t *err);

/* Zeroes the gradients and the loss (the start of an optimizer step). On the bf16 path only
 * the position embedding's gradient is zeroed now: the next backward's first write of every
 * other gradient overwrites it (grads_fresh), and an update with no backward since zeroes
 * them all first. */
int mgpu_gpt_zero_grads(mgpu_gpt_t *m, mgpu_err_t *err);

/* One AdamW step (step counts from 1) at learning rate lr, weight decay on the tensors of two
 * or more dimensions, with the gradient first clipped to a global norm of grad_clip (0: no
 * clip); *norm (may be NULL) receives the norm before the clip. mgpu_gpt_set_step then
 * mgpu_gpt_update. */
int mgpu_gpt_step(mgpu_gpt_t *m, const mgpu_adamw_hparams_t *hp, long long step, float grad_clip,
                  float *norm, mgpu_err_t *err);

/* The two halves of mgpu_gpt_step, for a step replayed from a CUDA graph: set_step writes
 * hp->lr and step into m->now (queued on the backend's stream, in order with the work before
 * and after it); update queues the clip and ONE multi-tensor AdamW (mgpu_kg_adamw_multi) that
 * read m->now when they run, so a graph captured around update replays the step it is told.
 * update reads hp's betas, eps and weight_decay (fixed over a run), not its lr. */
int mgpu_gpt_set_step(mgpu_gpt_t *m, const mgpu_adamw_hparams_t *hp, long long step,
                      mgpu_err_t *err);
int mgpu_gpt_update(mgpu_gpt_t *m, const mgpu_adamw_hparams_t *hp, float grad_clip,
                    mgpu_err_t *err);

/* The parameters changed (or will, in each replay of a graph about to be captured): the
 * backend drops what it derived from them (bf16 copies), so the next product converts them;
 * on the bf16 path the parameters' bf16 copy is made again from them. Call it after writing
 * m->params other than through mgpu_gpt_init and the AdamW step (a checkpoint, a broadcast). */
int mgpu_gpt_params_changed(mgpu_gpt_t *m, mgpu_err_t *err);

/* On the bf16 path, the copy in params16 of the parameter at off (an offset into params);
 * NULL for mlp.c_fc's weight and bias when fc16 holds them. */
mgpu_bf16_t *mgpu_gpt_w16(const mgpu_gpt_t *m, size_t off);

/* The logits (vocab floats, host) of position t - 1 of row 0 of the last forward. */
int mgpu_gpt_last_logits(mgpu_gpt_t *m, float *host, mgpu_err_t *err);

/* FNV-1a over "gpt" and the spec: a checkpoint records it so a run never resumes into another
 * shape. */
uint64_t mgpu_gpt_shape_hash(const mgpu_gpt_spec_t *spec);

#endif
