/* gpt_cpu.c - the CPU table of a GPT's ops (gpt_ops.h): transformer.h's reference functions
 * adapted to the table's conventions (gradients of activations overwritten where the table
 * says so, the loss accumulated with a scale), with the backend's GEMM for the output layer's
 * products, which dominate a small model's step.
 *
 * Attention keeps only lse between forward and backward: the backward recomputes one batch
 * row's probabilities at a time from qkv, in scratch that the backend's state owns
 * (cpu_impl_t.gpt_scratch: grown when a larger shape comes, freed with the backend). The
 * recomputation runs the same code on the same inputs, so it gives the forward's
 * probabilities bit for bit. */
#include "cpu_ref.h"     /* cpu_impl_t, mgpu_cpu_gemm, mgpu_cpu_softmax_xent, ... */
#include "gpt_ops.h"     /* mgpu_gpt_ops_t */
#include "transformer.h" /* the reference functions */

#include <errno.h>  /* ENOMEM */
#include <math.h>   /* sqrt, log */
#include <stdint.h> /* INT32_MAX */
#include <stdlib.h> /* realloc */
#include <string.h> /* memset, memcpy */

/* Elementwise ops whose reference adds into its output run over chunks of this many floats
 * through a zeroed stack buffer, so that the output may alias an input. */
#define CHUNK 1024

/* At least n floats of the backend's scratch. */
static int scratch(void *impl, size_t n, float **out, mgpu_err_t *err)
{
    cpu_impl_t *c = impl;
    if (c->gpt_scratch_n < n) {
        float *p = realloc(c->gpt_scratch, sizeof(float) * n);
        if (p == NULL)
            return mgpu_err_set(err, -ENOMEM, "gpt(cpu): realloc of %zu floats of scratch failed",
                                n);
        c->gpt_scratch = p;
        c->gpt_scratch_n = n;
    }
    *out = c->gpt_scratch;
    return 0;
}

static int ln_forward(void *impl, int n, int c, const float *x, const float *w, const float *b,
                      float *y, float *mean, float *rstd, mgpu_err_t *err)
{
    mgpu_gpt_layernorm_forward(n, c, x, w, b, y, mean, rstd);
    return 0;
}

static int ln_backward(void *impl, int n, int c, const float *dy, const float *x, const float *w,
                       const float *mean, const float *rstd, float *dx, float *dw, float *db,
                       mgpu_err_t *err)
{
    mgpu_gpt_layernorm_backward(n, c, dy, x, w, mean, rstd, dx, dw, db);
    return 0;
}

static int gelu_forward(void *impl, size_t n, const float *x, float *y, mgpu_err_t *err)
{
    mgpu_gpt_gelu_forward(n, x, y);
    return 0;
}

static int gelu_backward(void *impl, size_t n, const float *x, const float *dy, float *dx,
                         mgpu_err_t *err)
{
    float tmp[CHUNK];
    for (size_t i = 0; i < n; i += CHUNK) {
        size_t m = n - i < CHUNK ? n - i : CHUNK;
        memset(tmp, 0, sizeof(float) * m);
        mgpu_gpt_gelu_backward(m, x + i, dy + i, tmp);
        memcpy(dx + i, tmp, sizeof(float) * m);
    }
    return 0;
}

static int attention_forward(void *impl, int b, int t, int c, int nh, const float *qkv, float *out,
                             float *lse, mgpu_err_t *err)
{
    size_t tt = (size_t)nh * t * t;
    float *pre = NULL;
    int rc = scratch(impl, 2 * tt, &pre, err);
    if (rc < 0)
        return rc;
    for (int bi = 0; bi < b; bi++) {
        mgpu_gpt_attention_forward(1, t, c, nh, qkv + (size_t)bi * t * 3 * c, pre, pre + tt,
                                   out + (size_t)bi * t * c);
        /* lse of each query's causal row of scaled scores, as the backward of a fused kernel
         * needs it. */
        for (int h = 0; h < nh; h++)
            for (int q = 0; q < t; q++) {
                const float *row = pre + ((size_t)h * t + q) * t;
                double mx = row[0], s = 0.0;
                for (int k = 1; k <= q; k++)
                    mx = row[k] > mx ? row[k] : mx;
                for (int k = 0; k <= q; k++)
                    s += exp((double)row[k] - mx);
                lse[((size_t)bi * nh + h) * t + q] = (float)(mx + log(s));
            }
    }
    return 0;
}

static int attention_backward(void *impl, int b, int t, int c, int nh, const float *dout,
                              const float *qkv, const float *out, const float *lse, float *dqkv,
                              mgpu_err_t *err)
{
    size_t tt = (size_t)nh * t * t;
    float *s = NULL;
    int rc = scratch(impl, 4 * tt + (size_t)t * c, &s, err);
    if (rc < 0)
        return rc;
    memset(dqkv, 0, sizeof(float) * (size_t)b * t * 3 * c);
    for (int bi = 0; bi < b; bi++) {
        const float *q = qkv + (size_t)bi * t * 3 * c;
        /* The probabilities again (pre, att), then their gradients (datt, dpre); the
         * recomputed output goes to the scratch's tail, out itself is the caller's. */
        mgpu_gpt_attention_forward(1, t, c, nh, q, s, s + tt, s + 4 * tt);
        mgpu_gpt_attention_backward(1, t, c, nh, dout + (size_t)bi * t * c, q, s + tt, s + 2 * tt,
                                    s + 3 * tt, dqkv + (size_t)bi * t * 3 * c);
    }
    return 0;
}

static int embed_forward(void *impl, int b, int t, int c, const int32_t *tokens, const float *wte,
                         const float *wpe, float *out, mgpu_err_t *err)
{
    /* The launcher has no vocab to pass: tokens were checked when the data was read, and
     * the reference still refuses a negative one. */
    return mgpu_gpt_embed_forward(b, t, c, INT32_MAX, tokens, wte, wpe, out, err);
}

static int embed_backward(void *impl, int b, int t, int c, int vocab, const int32_t *tokens,
                          const float *dout, float *dwte, float *dwpe, mgpu_err_t *err)
{
    mgpu_gpt_embed_backward(b, t, c, tokens, dout, dwte, dwpe);
    return 0;
}

static int add(void *impl, size_t n, const float *a, const float *b, float *out, mgpu_err_t *err)
{
    mgpu_gpt_residual_forward(n, a, b, out);
    return 0;
}

static int tied_head(void *impl, int n, int c, int vocab, const float *x, const float *wte,
                     const int32_t *targets, float scale, float *logits, float *loss, float *dx,
                     float *dwte, mgpu_err_t *err)
{
    float mean;
    int rc;

    /* logits = x @ wte^T with the backend's GEMM (the reference's loops are 10x slower). */
    if ((rc = mgpu_cpu_gemm(impl, 0, 1, n, vocab, c, 1.0f, x, c, wte, c, 0.0f, logits, vocab,
                            err)) < 0 ||
        (rc = mgpu_cpu_softmax_xent(impl, n, vocab, logits, targets, &mean,
                                    dx != NULL ? logits : NULL, err)) < 0)
        return rc;
    loss[0] += scale * (float)n * mean;
    if (dx == NULL)
        return 0;
    /* softmax_xent's gradient is (p - onehot) / n; the caller's mean is over scale's rows. */
    float g = scale * (float)n;
    if ((rc = mgpu_cpu_gemm(impl, 0, 0, n, c, vocab, g, logits, vocab, wte, c, 1.0f, dx, c, err)) <
        0)
        return rc;
    return mgpu_cpu_gemm(impl, 1, 0, vocab, c, n, g, logits, vocab, x, c, 1.0f, dwte, c, err);
}

static int sumsq(void *impl, size_t n, const float *x, float *acc, mgpu_err_t *err)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    acc[0] = (float)((double)acc[0] + s);
    return 0;
}

static int clip_factor(void *impl, const float *ss, float max_norm, float *factor, mgpu_err_t *err)
{
    double norm = sqrt((double)ss[0]);
    /* clip_grad_norm_'s clamp(max_norm / (norm + 1e-6), max=1) */
    double coef = max_norm > 0 ? (double)max_norm / (norm + 1e-6) : 1.0;
    factor[0] = coef < 1.0 ? (float)coef : 1.0f;
    return 0;
}

static int adamw(void *impl, size_t n, float *p, const float *g, float *m, float *v,
                 const mgpu_adamw_hparams_t *hp, long long step, const float *factor,
                 mgpu_err_t *err)
{
    float tmp[CHUNK];
    if (factor == NULL || factor[0] == 1.0f) {
        mgpu_gpt_adamw_tensor(n, p, g, m, v, hp, 1, step);
        return 0;
    }
    /* The gradient is the caller's: scale a chunk at a time (AdamW is elementwise). */
    for (size_t i = 0; i < n; i += CHUNK) {
        size_t k = n - i < CHUNK ? n - i : CHUNK;
        for (size_t j = 0; j < k; j++)
            tmp[j] = g[i + j] * factor[0];
        mgpu_gpt_adamw_tensor(k, p + i, tmp, m + i, v + i, hp, 1, step);
    }
    return 0;
}

/* The per-tensor step on each tensor in turn, at now's learning rate and step. */
static int adamw_multi(void *impl, int n_tensors, const mgpu_gpt_adamw_tensor_t *t,
                       const mgpu_adamw_hparams_t *hp, const mgpu_gpt_adamw_now_t *now,
                       const float *factor, mgpu_err_t *err)
{
    int rc;
    for (int i = 0; i < n_tensors; i++) {
        mgpu_adamw_hparams_t h = *hp;
        h.lr = now->lr;
        if (!t[i].decay)
            h.weight_decay = 0.0f;
        if (t[i].n > 0 && (rc = adamw(impl, t[i].n, t[i].p, t[i].g, t[i].m, t[i].v, &h, now->step,
                                      factor, err)) < 0)
            return rc;
        for (size_t j = 0; t[i].p16 != NULL && j < t[i].n; j++)
            t[i].p16[j] = mgpu_gpt_to_bf16(t[i].p[j]);
    }
    return 0;
}

const mgpu_gpt_ops_t mgpu_gpt_cpu_ops = {
    .layernorm_forward = ln_forward,
    .layernorm_backward = ln_backward,
    .gelu_forward = gelu_forward,
    .gelu_backward = gelu_backward,
    .attention_forward = attention_forward,
    .attention_backward = attention_backward,
    .embed_forward = embed_forward,
    .embed_backward = embed_backward,
    .add = add,
    .tied_head = tied_head,
    .sumsq = sumsq,
    .clip_factor = clip_factor,
    .adamw = adamw,
    .adamw_multi = adamw_multi,
};
