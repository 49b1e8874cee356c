/* gpt_ops.c - the table of a GPT's ops per backend and its launchers: every argument check
 * lives here, once, so that each backend's table rejects exactly the same calls. */
#include "gpt_ops.h"

#include <math.h>   /* pow, sqrt */
#include <stddef.h> /* NULL */

#if defined(MGPU_HAVE_CUDA) && MGPU_HAVE_CUDA && defined(__has_include)
#if __has_include("gpt_cuda.h")
#include "gpt_cuda.h" /* mgpu_gpt_cuda_ops */
#define GPT_HAVE_CUDA 1
#endif
#endif

const mgpu_gpt_ops_t *mgpu_kg_ops(const mgpu_kernels_t *k)
{
    if (k != NULL && k->backend == MGPU_KBACKEND_CPU)
        return &mgpu_gpt_cpu_ops;
#ifdef GPT_HAVE_CUDA
    if (k != NULL && k->backend == MGPU_KBACKEND_CUDA)
        return &mgpu_gpt_cuda_ops;
#endif
    return NULL;
}

const mgpu_gpt_bf16_ops_t *mgpu_kg_bf16_ops(const mgpu_kernels_t *k)
{
    const mgpu_gpt_ops_t *g = mgpu_kg_ops(k);
    if (g == NULL || k->precision != MGPU_PREC_BF16)
        return NULL;
    return g->bf16;
}

/* The table of k, or an error naming the op. */
static int table(mgpu_kernels_t *k, const char *op, const mgpu_gpt_ops_t **out, mgpu_err_t *err)
{
    if (k == NULL)
        return mgpu_err_set(err, MGPU_E_USAGE, "gpt %s: kernels object is NULL", op);
    *out = mgpu_kg_ops(k);
    if (*out == NULL)
        return mgpu_err_set(err, MGPU_E_DEVICE, "gpt %s: GPT ops are not available on backend %s",
                            op, k->ops->name);
    return 0;
}

static int positive(const char *op, const char *arg, long long v, mgpu_err_t *err)
{
    if (v < 1)
        return mgpu_err_set(err, MGPU_E_RANGE, "gpt %s: %s = %lld, expected >= 1", op, arg, v);
    return 0;
}

static int present(const char *op, const char *arg, const void *p, mgpu_err_t *err)
{
    if (p == NULL)
        return mgpu_err_set(err, MGPU_E_USAGE, "gpt %s: %s is NULL", op, arg);
    return 0;
}

/* Checks of the attention's shape: b, t, c, nh >= 1 and nh dividing c. */
static int attention_shape(const char *op, int b, int t, int c, int nh, mgpu_err_t *err)
{
    int rc;
    if ((rc = positive(op, "b", b, err)) < 0 || (rc = positive(op, "t", t, err)) < 0 ||
        (rc = positive(op, "c", c, err)) < 0 || (rc = positive(op, "nh", nh, err)) < 0)
        return rc;
    if (c % nh != 0)
        return mgpu_err_set(err, MGPU_E_RANGE,
                            "gpt %s: c = %d is not a multiple of nh = %d (head size c / nh)", op, c,
                            nh);
    return 0;
}

int mgpu_kg_layernorm_forward(mgpu_kernels_t *k, int n, int c, const float *x, const float *w,
                              const float *b, float *y, float *mean, float *rstd, mgpu_err_t *err)
{
    static const char op[] = "layernorm_forward";
    const mgpu_gpt_ops_t *g;
    int rc;
    if ((rc = table(k, op, &g, err)) < 0 || (rc = positive(op, "n", n, err)) < 0 ||
        (rc = positive(op, "c", c, err)) < 0 || (rc = present(op, "x", x, err)) < 0 ||
        (rc = present(op, "w", w, err)) < 0 || (rc = present(op, "b", b, err)) < 0 ||
        (rc = present(op, "y", y, err)) < 0 || (rc = present(op, "mean", mean, err)) < 0 ||
        (rc = present(op, "rstd", rstd, err)) < 0)
        return rc;
    return g->layernorm_forward(k->impl, n, c, x, w, b, y, mean, rstd, err);
}

int mgpu_kg_layernorm_backward(mgpu_kernels_t *k, int n, int c, const float *dy, const float *x,
                               const float *w, const float *mean, const float *rstd, float *dx,
                               float *dw, float *db, mgpu_err_t *err)
{
    static const char op[] = "layernorm_backward";
    const mgpu_gpt_ops_t *g;
    int rc;
    if ((rc = table(k, op, &g, err)) < 0 || (rc = positive(op, "n", n, err)) < 0 ||
        (rc = positive(op, "c", c, err)) < 0 || (rc = present(op, "dy", dy, err)) < 0 ||
        (rc = present(op, "x", x, err)) < 0 || (rc = present(op, "w", w, err)) < 0 ||
        (rc = present(op, "mean", mean, err)) < 0 || (rc = present(op, "rstd", rstd, err)) < 0 ||
        (rc = present(op, "dx", dx, err)) < 0 || (rc = present(op, "dw", dw, err)) < 0 ||
        (rc = present(op, "db", db, err)) < 0)
        return rc;
    return g->layernorm_backward(k->impl, n, c, dy, x, w, mean, rstd, dx, dw, db, err);
}

int mgpu_kg_gelu_forward(mgpu_kernels_t *k, size_t n, const float *x, float *y, mgpu_err_t *err)
{
    static const char op[] = "gelu_forward";
    const mgpu_gpt_ops_t *g;
    int rc;
    if ((rc = table(k, op, &g, err)) < 0 || (rc = present(op, "x", x, err)) < 0 ||
        (rc = present(op, "y", y, err)) < 0)
        return rc;
    return n == 0 ? 0 : g->gelu_forward(k->impl, n, x, y, err);
}

int mgpu_kg_gelu_backward(mgpu_kernels_t *k, size_t n, const float *x, const float *dy, float *dx,
                          mgpu_err_t *err)
{
    static const char op[] = "gelu_backward";
    const mgpu_gpt_ops_t *g;
    int rc;
    if ((rc = table(k, op, &g, err)) < 0 || (rc = present(op, "x", x, err)) < 0 ||
        (rc = present(op, "dy", dy, err)) < 0 || (rc = present(op, "dx", dx, err)) < 0)
        return rc;
    return n == 0 ? 0 : g->gelu_backward(k->impl, n, x, dy, dx, err);
}

int mgpu_kg_attention_forward(mgpu_kernels_t *k, int b, int t, int c, int nh, const float *qkv,
                              float *out, float *lse, mgpu_err_t *err)
{
    static const char op[] = "attention_forward";
    const mgpu_gpt_ops_t *g;
    int rc;
    if ((rc = table(k, op, &g, err)) < 0 || (rc = attention_shape(op, b, t, c, nh, err)) < 0 ||
        (rc = present(op, "qkv", qkv, err)) < 0 || (rc = present(op, "out", out, err)) < 0 ||
        (rc = present(op, "lse", lse, err)) < 0)
        return rc;
    return g->attention_forward(k->impl, b, t, c, nh, qkv, out, lse, err);
}

int mgpu_kg_attention_backward(mgpu_kernels_t *k, int b, int t, int c, int nh, const float *dout,
                               const float *qkv, const float *out, const float *lse, float *dqkv,
                               mgpu_err_t *err)
{
    static const char op[] = "attention_backward";
    const mgpu_gpt_ops_t *g;
    int rc;
    if ((rc = table(k, op, &g, err)) < 0 || (rc = attention_shape(op, b, t, c, nh, err)) < 0 ||
        (rc = present(op, "dout", dout, err)) < 0 || (rc = present(op, "qkv", qkv, err)) < 0 ||
        (rc = present(op, "out", out, err)) < 0 || (rc = present(op, "lse", lse, err)) < 0 ||
        (rc = present(op, "dqkv", dqkv, err)) < 0)
        return rc;
    return g->attention_backward(k->impl, b, t, c, nh, dout, qkv, out, lse, dqkv, err);
}

int mgpu_kg_embed_forward(mgpu_kernels_t *k, int b, int t, int c, const int32_t *tokens,
                          const float *wte, const float *wpe, float *out, mgpu_err_t *err)
{
    static const char op[] = "embed_forward";
    const mgpu_gpt_ops_t *g;
    int rc;
    if ((rc = table(k, op, &g, err)) < 0 || (rc = positive(op, "b", b, err)) < 0 ||
        (rc = positive(op, "t", t, err)) < 0 || (rc = positive(op, "c", c, err)) < 0 ||
        (rc = present(op, "tokens", tokens, err)) < 0 || (rc = present(op, "wte", wte, err)) < 0 ||
        (rc = present(op, "wpe", wpe, err)) < 0 || (rc = present(op, "out", out, err)) < 0)
        return rc;
    return g->embed_forward(k->impl, b, t, c, tokens, wte, wpe, out, err);
}

int mgpu_kg_embed_backward(mgpu_kernels_t *k, int b, int t, int c, int vocab, const int32_t *tokens,
                           const float *dout, float *dwte, float *dwpe, mgpu_err_t *err)
{
    static const char op[] = "embed_backward";
    const mgpu_gpt_ops_t *g;
    int rc;
    if ((rc = table(k, op, &g, err)) < 0 || (rc = positive(op, "b", b, err)) < 0 ||
        (rc = positive(op, "t", t, err)) < 0 || (rc = positive(op, "c", c, err)) < 0 ||
        (rc = positive(op, "vocab", vocab, err)) < 0 ||
        (rc = present(op, "tokens", tokens, err)) < 0 ||
        (rc = present(op, "dout", dout, err)) < 0 || (rc = present(op, "dwte", dwte, err)) < 0 ||
        (rc = present(op, "dwpe", dwpe, err)) < 0)
        return rc;
    return g->embed_backward(k->impl, b, t, c, vocab, tokens, dout, dwte, dwpe, err);
}

int mgpu_kg_add(mgpu_kernels_t *k, size_t n, const float *a, const float *b, float *out,
                mgpu_err_t *err)
{
    static const char op[] = "add";
    const mgpu_gpt_ops_t *g;
    int rc;
    if ((rc = table(k, op, &g, err)) < 0 || (rc = present(op, "a", a, err)) < 0 ||
        (rc = present(op, "b", b, err)) < 0 || (rc = present(op, "out", out, err)) < 0)
        return rc;
    return n == 0 ? 0 : g->add(k->impl, n, a, b, out, err);
}

int mgpu_kg_tied_head(mgpu_kernels_t *k, int n, int c, int vocab, const float *x, const float *wte,
                      const int32_t *targets, float scale, float *logits, float *loss, float *dx,
                      float *dwte, mgpu_err_t *err)
{
    static const char op[] = "tied_head";
    const mgpu_gpt_ops_t *g;
    int rc;
    if ((rc = table(k, op, &g, err)) < 0 || (rc = positive(op, "n", n, err)) < 0 ||
        (rc = positive(op, "c", c, err)) < 0 || (rc = positive(op, "vocab", vocab, err)) < 0 ||
        (rc = present(op, "x", x, err)) < 0 || (rc = present(op, "wte", wte, err)) < 0 ||
        (rc = present(op, "targets", targets, err)) < 0 ||
        (rc = present(op, "logits", logits, err)) < 0 || (rc = present(op, "loss", loss, err)) < 0)
        return rc;
    if (!(scale > 0))
        return mgpu_err_set(err, MGPU_E_RANGE, "gpt %s: scale = %g, expected > 0", op,
                            (double)scale);
    if ((dx == NULL) != (dwte == NULL))
        return mgpu_err_set(err, MGPU_E_USAGE,
                            "gpt %s: dx is %s but dwte is %s: the backward needs both or neither",
                            op, dx ? "set" : "NULL", dwte ? "set" : "NULL");
    return g->tied_head(k->impl, n, c, vocab, x, wte, targets, scale, logits, loss, dx, dwte, err);
}

int mgpu_kg_sumsq(mgpu_kernels_t *k, size_t n, const float *x, float *acc, mgpu_err_t *err)
{
    static const char op[] = "sumsq";
    const mgpu_gpt_ops_t *g;
    int rc;
    if ((rc = table(k, op, &g, err)) < 0 || (rc = present(op, "x", x, err)) < 0 ||
        (rc = present(op, "acc", acc, err)) < 0)
        return rc;
    return n == 0 ? 0 : g->sumsq(k->impl, n, x, acc, err);
}

int mgpu_kg_clip_factor(mgpu_kernels_t *k, const float *sumsq, float max_norm, float *factor,
                        mgpu_err_t *err)
{
    static const char op[] = "clip_factor";
    const mgpu_gpt_ops_t *g;
    int rc;
    if ((rc = table(k, op, &g, err)) < 0 || (rc = present(op, "sumsq", sumsq, err)) < 0 ||
        (rc = present(op, "factor", factor, err)) < 0)
        return rc;
    if (max_norm != max_norm)
        return mgpu_err_set(err, MGPU_E_RANGE, "gpt %s: max_norm is NaN", op);
    return g->clip_factor(k->impl, sumsq, max_norm, factor, err);
}

int mgpu_kg_adamw(mgpu_kernels_t *k, size_t n, float *p, const float *g_, float *m, float *v,
                  const mgpu_adamw_hparams_t *hp, long long step, const float *factor,
                  mgpu_err_t *err)
{
    static const char op[] = "adamw";
    const mgpu_gpt_ops_t *g;
    int rc;
    if ((rc = table(k, op, &g, err)) < 0 || (rc = present(op, "p", p, err)) < 0 ||
        (rc = present(op, "g", g_, err)) < 0 || (rc = present(op, "m", m, err)) < 0 ||
        (rc = present(op, "v", v, err)) < 0 || (rc = present(op, "hp", hp, err)) < 0 ||
        (rc = positive(op, "step", step, err)) < 0)
        return rc;
    return n == 0 ? 0 : g->adamw(k->impl, n, p, g_, m, v, hp, step, factor, err);
}

int mgpu_kg_adamw_multi(mgpu_kernels_t *k, int n_tensors, const mgpu_gpt_adamw_tensor_t *t,
                        const mgpu_adamw_hparams_t *hp, const mgpu_gpt_adamw_now_t *now,
                        const float *factor, mgpu_err_t *err)
{
    static const char op[] = "adamw_multi";
    const mgpu_gpt_ops_t *g;
    int rc;
    if ((rc = table(k, op, &g, err)) < 0 || (rc = present(op, "t", t, err)) < 0 ||
        (rc = present(op, "hp", hp, err)) < 0 || (rc = present(op, "now", now, err)) < 0)
        return rc;
    if (n_tensors < 0)
        return mgpu_err_set(err, MGPU_E_RANGE, "gpt %s: n_tensors = %d, expected >= 0", op,
                            n_tensors);
    for (int i = 0; i < n_tensors; i++) {
        if (t[i].n > 0 && (t[i].p == NULL || t[i].g == NULL || t[i].m == NULL || t[i].v == NULL))
            return mgpu_err_set(err, MGPU_E_USAGE,
                                "gpt %s: tensor %d of %zu floats has a NULL p, g, m or v", op, i,
                                t[i].n);
        if (t[i].p16 != NULL && t[i].p16_cols != 0 &&
            (t[i].p16_cols < 0 || t[i].n % (size_t)t[i].p16_cols != 0 ||
             t[i].p16_ld < (size_t)t[i].p16_cols))
            return mgpu_err_set(err, MGPU_E_RANGE,
                                "gpt %s: tensor %d of %zu floats, its bf16 copy in rows of %d "
                                "elements %zu apart: expected whole rows, at least a row apart",
                                op, i, t[i].n, t[i].p16_cols, t[i].p16_ld);
    }
    return n_tensors == 0 ? 0 : g->adamw_multi(k->impl, n_tensors, t, hp, now, factor, err);
}

void mgpu_kg_adamw_now(const mgpu_adamw_hparams_t *hp, long long step, mgpu_gpt_adamw_now_t *now)
{
    /* optimizers.c's mgpu_cpu_adamw_step, term for term, so both paths get the same bits. */
    const double bc1 = 1.0 - pow(hp->beta1, (double)step), bc2 = 1.0 - pow(hp->beta2, (double)step);
    now->lr = hp->lr;
    now->step_size = (float)(hp->lr / bc1);
    now->bc2_sqrt = (float)sqrt(bc2);
    now->decay = 1.0f - hp->lr * hp->weight_decay;
    now->step = step;
}
