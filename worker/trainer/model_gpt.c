/* model_gpt.c - GPT-2's forward and backward over the GPT ops and the backend's GEMM. */
#include "model_gpt.h"

#include <errno.h>  /* EINVAL, ENOMEM */
#include <math.h>   /* sqrt */
#include <stdlib.h> /* calloc, malloc, free */
#include <string.h> /* memset */

#include "checkpoint.h"  /* mgpu_fnv1a */
#include "gpt_layout.h"  /* mgpu_gpt_layout_*: buffers inside others' memory */
#include "gpt_ops.h"     /* mgpu_kg_* */
#include "rng.h"         /* mgpu_rng_* */
#include "transformer.h" /* mgpu_gpt_decays */

/* Rows of the output layer per call: its logits scratch is head_rows x vocab, so a large
 * vocabulary never needs (B T) x vocab floats at once. The bf16 path takes up to
 * HEAD16_BYTES of bf16 logits a call, in equal chunks: the weight gradient's product reads
 * and writes all of dwte (fp32) once a chunk, so fewer, larger chunks save that traffic.
 * GPT-2 124M's step of 16,384 rows of 50,304 takes 2 chunks (0.8 GiB of logits): 0.4% faster
 * than 4 of half the size, measured on the H200, and still below PyTorch's peak memory. */
#define HEAD_ROWS 1024
#define HEAD16_BYTES ((size_t)1 << 30)

static int alloc_f(mgpu_gpt_t *m, size_t n, float **out, mgpu_err_t *err)
{
    void *p = NULL;
    int rc = mgpu_k_alloc(m->k, sizeof(float) * (n ? n : 1), &p, err);
    *out = p;
    return rc;
}

static int alloc_h(mgpu_gpt_t *m, size_t n, mgpu_bf16_t **out, mgpu_err_t *err)
{
    void *p = NULL;
    int rc = mgpu_k_alloc(m->k, sizeof(mgpu_bf16_t) * (n ? n : 1), &p, err);
    *out = p;
    return rc;
}

/* Whether the bf16 path puts mlp.c_fc's bias inside its product (mgpu_gpt_t's fc_kp; the
 * default, MGPU_GPT_FC_BIAS=inside) or in cuBLASLt's bias epilogue (epilogue): 1 or 0, or an
 * error for another value. */
static int fc_inside(mgpu_err_t *err)
{
    const char *e = getenv("MGPU_GPT_FC_BIAS");
    if (e == NULL || strcmp(e, "inside") == 0)
        return 1;
    if (strcmp(e, "epilogue") == 0)
        return 0;
    return mgpu_err_set(err, -EINVAL, "MGPU_GPT_FC_BIAS=%s: expected inside or epilogue", e);
}

/* A block's ln2_16: rows of C, or with fc_kp rows of fc_kp whose column C is 1 and the rest
 * past it 0 (the LayerNorm writes the first C). */
static int alloc_ln2_16(mgpu_gpt_t *m, size_t n, mgpu_bf16_t **out, mgpu_err_t *err)
{
    const int C = m->spec.n_embd, kp = m->fc_kp;
    int rc;
    if (kp == 0)
        return alloc_h(m, n * C, out, err);
    if ((rc = alloc_h(m, n * kp, out, err)) < 0 ||
        (rc = mgpu_k_zero(m->k, *out, sizeof(mgpu_bf16_t) * n * kp, err)) < 0)
        return rc;
    return m->b16->to_bf16_2d(m->k->impl, (int)n, 1, m->one, 0, *out + C, (size_t)kp, err);
}

/* Whether p is one of the buffers the layers share under spec.recompute. */
static int shared(const mgpu_gpt_t *m, const void *p)
{
    const void *re[] = {m->re_ln1,  m->re_ln2,    m->re_gelu,   m->re_mean,
                        m->re_rstd, m->re_ln1_16, m->re_ln2_16, m->re_gelu16};
    for (size_t i = 0; i < sizeof re / sizeof re[0]; i++)
        if (p == re[i])
            return 1;
    return 0;
}

/* Whether p lies inside another buffer's memory (spec.recompute's shared buffers; the
 * gradients or the logits, gpt_layout.c): then it is not freed on its own. */
static int borrowed(const mgpu_gpt_t *m, const void *p)
{
    return shared(m, p) || mgpu_gpt_layout_inside(m, p);
}

/* alloc_f and alloc_h for a pointer still NULL (one not placed inside another buffer). */
static int own_f(mgpu_gpt_t *m, size_t n, float **out, mgpu_err_t *err)
{
    return *out != NULL ? 0 : alloc_f(m, n, out, err);
}

static int own_h(mgpu_gpt_t *m, size_t n, mgpu_bf16_t **out, mgpu_err_t *err)
{
    return *out != NULL ? 0 : alloc_h(m, n, out, err);
}

/* The rows of ln2_16 and of the c_fc weights the bf16 product reads: fc_kp, or C. */
static int fc_k(const mgpu_gpt_t *m)
{
    return m->fc_kp > 0 ? m->fc_kp : m->spec.n_embd;
}

/* mlp.c_fc's weight and bias of a layer: what params16 leaves out when fc16 holds them. */
static size_t fc_gap(const mgpu_gpt_t *m)
{
    const size_t C = (size_t)m->spec.n_embd;
    return m->fc_kp > 0 ? 4 * C * C + 4 * C : 0;
}

mgpu_bf16_t *mgpu_gpt_w16(const mgpu_gpt_t *m, size_t off)
{
    /* The blocks follow wte and wpe, each stride values long, mlp.c_fc's weight and bias at
     * [fc_w, fcp_w) of each; lnf's tensors follow them. */
    const size_t gap = fc_gap(m), L = (size_t)m->spec.n_layer;
    size_t base, stride, within, gaps;

    if (m->params16 == NULL)
        return NULL;
    base = m->blocks[0].ln1_w;
    if (gap == 0 || off < base)
        return m->params16 + off;
    stride = m->lnf_w > base ? (m->lnf_w - base) / L : 0;
    if (off >= base + L * stride)
        return m->params16 + off - L * gap;
    within = (off - base) % stride;
    if (within >= m->blocks[0].fc_w - base && within < m->blocks[0].fcp_w - base)
        return NULL;
    gaps = (off - base) / stride + (within >= m->blocks[0].fcp_w - base);
    return m->params16 + off - gaps * gap;
}

/* Layer l's mlp.c_fc weight and bias in bf16: fc16's rows (fc_kp > 0) or params16's. */
static const mgpu_bf16_t *fc_w16(const mgpu_gpt_t *m, int l)
{
    return m->fc_kp > 0 ? m->fc16 + (size_t)l * 4 * m->spec.n_embd * m->fc_kp
                        : mgpu_gpt_w16(m, m->blocks[l].fc_w);
}

void mgpu_gpt_destroy(mgpu_gpt_t *m)
{
    if (m == NULL)
        return;
    /* What lies inside the gradients or the logits first, while those are still there. */
    for (int l = 0; m->acts != NULL && l < m->spec.n_layer; l++) {
        mgpu_gpt_acts_t *a = &m->acts[l];
        float *ab[] = {a->x,    a->ln1, a->ln1_mean, a->ln1_rstd, a->qkv, a->atty,    a->lse,
                       a->res2, a->ln2, a->ln2_mean, a->ln2_rstd, a->fch, a->fch_gelu};
        for (size_t i = 0; i < sizeof ab / sizeof ab[0]; i++)
            if (ab[i] != NULL && !borrowed(m, ab[i]))
                mgpu_k_free(m->k, ab[i]);
        mgpu_bf16_t *ah[] = {a->ln1_16, a->qkv16, a->atty16, a->ln2_16, a->fch16, a->gelu16};
        for (size_t i = 0; i < sizeof ah / sizeof ah[0]; i++)
            if (ah[i] != NULL && !borrowed(m, ah[i]))
                mgpu_k_free(m->k, ah[i]);
    }
    float **sf[] = {&m->dres};
    mgpu_bf16_t **sh[] = {&m->d4_16, &m->dqkv16};
    for (size_t i = 0; i < sizeof sf / sizeof sf[0]; i++)
        if (*sf[i] != NULL && !borrowed(m, *sf[i]))
            mgpu_k_free(m->k, *sf[i]);
    for (size_t i = 0; i < sizeof sh / sizeof sh[0]; i++)
        if (*sh[i] != NULL && !borrowed(m, *sh[i]))
            mgpu_k_free(m->k, *sh[i]);
    mgpu_bf16_t **hb[] = {&m->params16, &m->lnf16, &m->logits16, &m->dres16, &m->dln16, &m->fc16};
    for (size_t i = 0; i < sizeof hb / sizeof hb[0]; i++)
        if (*hb[i] != NULL)
            mgpu_k_free(m->k, *hb[i]);
    float **bufs[] = {&m->params,   &m->grads,    &m->moments, &m->xout, &m->lnf,
                      &m->lnf_mean, &m->lnf_rstd, &m->logits,  &m->dln,  &m->d4,
                      &m->dqkv,     &m->scalars,  &m->one};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (*bufs[i] != NULL)
            mgpu_k_free(m->k, *bufs[i]);
    if (m->tokens != NULL)
        mgpu_k_free(m->k, m->tokens);
    if (m->targets != NULL)
        mgpu_k_free(m->k, m->targets);
    if (m->now != NULL)
        mgpu_k_free(m->k, m->now);
    free(m->adam);
    float *rf[] = {m->re_ln1, m->re_ln2, m->re_gelu, m->re_mean, m->re_rstd};
    for (size_t i = 0; i < sizeof rf / sizeof rf[0]; i++)
        if (rf[i] != NULL)
            mgpu_k_free(m->k, rf[i]);
    mgpu_bf16_t *rh[] = {m->re_ln1_16, m->re_ln2_16, m->re_gelu16};
    for (size_t i = 0; i < sizeof rh / sizeof rh[0]; i++)
        if (rh[i] != NULL)
            mgpu_k_free(m->k, rh[i]);
    free(m->acts);
    free(m->blocks);
    free(m->tensors);
    free(m);
}

/* Appends a tensor of n floats and ndim dimensions to the layout; returns its offset. */
static size_t place(mgpu_gpt_t *m, size_t n, int ndim)
{
    size_t off = m->n_params;
    m->tensors[m->n_tensors++] = (mgpu_gpt_tensor_t){.off = off, .n = n, .ndim = ndim};
    m->n_params += n;
    return off;
}

/* spec.recompute's buffers, one for every layer (mgpu_gpt_create sets them into the acts),
 * for batches of n rows: the GELU output with 1, the LayerNorms' outputs and statistics too
 * with 2; bf16 on the bf16 path. */
static int alloc_shared(mgpu_gpt_t *m, size_t n, mgpu_err_t *err)
{
    const size_t NC = n * m->spec.n_embd;
    const int re = m->spec.recompute;
    int rc = 0;
    if (re >= 1)
        rc = m->b16 != NULL ? alloc_h(m, 4 * NC, &m->re_gelu16, err)
                            : alloc_f(m, 4 * NC, &m->re_gelu, err);
    if (rc < 0 || re < 2)
        return rc;
    /* (the bf16 path's LayerNorm backward makes the output from the forward's statistics) */
    if (m->b16 != NULL)
        return (rc = alloc_h(m, NC, &m->re_ln1_16, err)) < 0
                   ? rc
                   : alloc_ln2_16(m, n, &m->re_ln2_16, err);
    if ((rc = alloc_f(m, n, &m->re_mean, err)) < 0 || (rc = alloc_f(m, n, &m->re_rstd, err)) < 0 ||
        (rc = alloc_f(m, NC, &m->re_ln1, err)) < 0)
        return rc;
    return alloc_f(m, NC, &m->re_ln2, err);
}

int mgpu_gpt_create(mgpu_kernels_t *k, const mgpu_gpt_spec_t *spec, int max_b, mgpu_gpt_t **out,
                    mgpu_err_t *err)
{
    const mgpu_gpt_bf16_ops_t *b16 = NULL;
    if (spec->n_embd % 8 == 0 && spec->vocab % 8 == 0)
        b16 = mgpu_kg_bf16_ops(k);
    return mgpu_gpt_create_with(k, spec, max_b, b16, out, err);
}

int mgpu_gpt_create_with(mgpu_kernels_t *k, const mgpu_gpt_spec_t *spec, int max_b,
                         const mgpu_gpt_bf16_ops_t *b16, mgpu_gpt_t **out, mgpu_err_t *err)
{
    const mgpu_gpt_spec_t *s = spec;
    int rc;

    *out = NULL;
    if (s->n_layer < 1 || s->n_head < 1 || s->n_embd < 1 || s->context < 1 || s->vocab < 1 ||
        max_b < 1)
        return mgpu_err_set(err, -EINVAL,
                            "gpt: n_layer %d, n_head %d, n_embd %d, context %d, vocab %d, batch "
                            "%d: expected each >= 1",
                            s->n_layer, s->n_head, s->n_embd, s->context, s->vocab, max_b);
    if (s->n_embd % s->n_head != 0)
        return mgpu_err_set(err, -EINVAL, "gpt: n_embd %d is not a multiple of n_head %d",
                            s->n_embd, s->n_head);
    if (s->recompute < 0 || s->recompute > 2)
        return mgpu_err_set(err, -EINVAL,
                            "gpt: recompute %d, expected 0 (nothing), 1 (GELU) or 2 (GELU and "
                            "LayerNorms)",
                            s->recompute);
    if (b16 != NULL && (s->n_embd % 8 != 0 || s->vocab % 8 != 0))
        return mgpu_err_set(err, -EINVAL,
                            "gpt: n_embd %d and vocab %d on the bf16 path, expected multiples of 8",
                            s->n_embd, s->vocab);
    mgpu_gpt_t *m = calloc(1, sizeof *m);
    if (m == NULL)
        return mgpu_err_set(err, -ENOMEM, "gpt: calloc failed");
    m->k = k;
    m->spec = *s;
    m->max_b = max_b;
    m->blocks = calloc((size_t)s->n_layer, sizeof *m->blocks);
    m->tensors = calloc((size_t)s->n_layer * 12 + 4, sizeof *m->tensors);
    m->acts = calloc((size_t)s->n_layer, sizeof *m->acts);
    if (m->blocks == NULL || m->tensors == NULL || m->acts == NULL) {
        mgpu_gpt_destroy(m);
        return mgpu_err_set(err, -ENOMEM, "gpt: calloc for %d blocks failed", s->n_layer);
    }
    size_t C = (size_t)s->n_embd, V = (size_t)s->vocab;
    m->wte = place(m, V * C, 2);
    m->wpe = place(m, (size_t)s->context * C, 2);
    for (int l = 0; l < s->n_layer; l++) {
        mgpu_gpt_block_t *b = &m->blocks[l];
        b->ln1_w = place(m, C, 1);
        b->ln1_b = place(m, C, 1);
        b->qkv_w = place(m, 3 * C * C, 2);
        b->qkv_b = place(m, 3 * C, 1);
        b->proj_w = place(m, C * C, 2);
        b->proj_b = place(m, C, 1);
        b->ln2_w = place(m, C, 1);
        b->ln2_b = place(m, C, 1);
        b->fc_w = place(m, 4 * C * C, 2);
        b->fc_b = place(m, 4 * C, 1);
        b->fcp_w = place(m, 4 * C * C, 2);
        b->fcp_b = place(m, C, 1);
    }
    m->lnf_w = place(m, C, 1);
    m->lnf_b = place(m, C, 1);

    size_t N = (size_t)max_b * s->context, NC = N * C, NH = (size_t)max_b * s->n_head * s->context;
    m->b16 = b16;
    if ((rc = alloc_f(m, m->n_params, &m->params, err)) < 0 ||
        (rc = alloc_f(m, m->n_params, &m->grads, err)) < 0 ||
        (!s->sharded_optimizer && (rc = alloc_f(m, 2 * m->n_params, &m->moments, err)) < 0) ||
        (rc = alloc_f(m, NC, &m->xout, err)) < 0 || (rc = alloc_f(m, N, &m->lnf_mean, err)) < 0 ||
        (rc = alloc_f(m, N, &m->lnf_rstd, err)) < 0 || (rc = alloc_f(m, 4, &m->scalars, err)) < 0)
        goto fail;
    if (m->b16 != NULL) {
        size_t cap = HEAD16_BYTES / (sizeof(mgpu_bf16_t) * V), chunks;
        cap = cap < 1 ? 1 : cap;
        chunks = (N + cap - 1) / cap;
        m->head_rows = (int)((N + chunks - 1) / chunks);
        if ((rc = fc_inside(err)) < 0)
            goto fail;
        m->fc_kp = rc > 0 ? (int)((C + 1 + 63) / 64 * 64) : 0;
        m->n_params16 = m->n_params - (size_t)s->n_layer * fc_gap(m);
        if ((rc = alloc_h(m, m->n_params16, &m->params16, err)) < 0 ||
            (rc = alloc_h(m, NC, &m->lnf16, err)) < 0 ||
            (rc = alloc_h(m, (size_t)m->head_rows * V, &m->logits16, err)) < 0)
            goto fail;
        mgpu_gpt_layout_scratch(m, N); /* inside logits16 where it fits */
        if ((rc = alloc_f(m, V, &m->logits, err)) < 0 ||
            (rc = alloc_h(m, NC, &m->dres16, err)) < 0 ||
            (rc = alloc_h(m, NC, &m->dln16, err)) < 0 || (rc = own_f(m, NC, &m->dres, err)) < 0 ||
            (rc = own_h(m, 4 * NC, &m->d4_16, err)) < 0 ||
            (rc = own_h(m, 3 * NC, &m->dqkv16, err)) < 0)
            goto fail;
        if (m->fc_kp > 0) {
            const float one = 1.0f;
            const size_t nfc = (size_t)s->n_layer * 4 * C * m->fc_kp;
            if ((rc = alloc_h(m, nfc, &m->fc16, err)) < 0 ||
                (rc = mgpu_k_zero(k, m->fc16, sizeof(mgpu_bf16_t) * nfc, err)) < 0 ||
                (rc = alloc_f(m, 1, &m->one, err)) < 0 ||
                (rc = mgpu_k_copy_to_device(k, m->one, &one, sizeof one, err)) < 0)
                goto fail;
        }
    } else {
        m->head_rows = N < HEAD_ROWS ? (int)N : HEAD_ROWS;
        if ((rc = alloc_f(m, NC, &m->lnf, err)) < 0 || (rc = alloc_f(m, NC, &m->dres, err)) < 0 ||
            (rc = alloc_f(m, (size_t)m->head_rows * V, &m->logits, err)) < 0 ||
            (rc = alloc_f(m, NC, &m->dln, err)) < 0 || (rc = alloc_f(m, 4 * NC, &m->d4, err)) < 0 ||
            (rc = alloc_f(m, 3 * NC, &m->dqkv, err)) < 0)
            goto fail;
    }
    const int re = s->recompute, w16 = m->b16 != NULL;
    if ((rc = alloc_shared(m, N, err)) < 0)
        goto fail;
    for (int l = 0; l < s->n_layer; l++) {
        mgpu_gpt_acts_t *a = &m->acts[l];
        a->ln1 = m->re_ln1, a->ln2 = m->re_ln2, a->fch_gelu = m->re_gelu;
        a->ln1_16 = m->re_ln1_16, a->ln2_16 = m->re_ln2_16, a->gelu16 = m->re_gelu16;
    }
    if (w16 && s->reuse_grads)
        mgpu_gpt_layout_acts(m, N);
    for (int l = 0; l < s->n_layer; l++) {
        mgpu_gpt_acts_t *a = &m->acts[l];
        if ((rc = own_f(m, NC, &a->x, err)) < 0 || (rc = own_f(m, N, &a->ln1_mean, err)) < 0 ||
            (rc = own_f(m, N, &a->ln1_rstd, err)) < 0 || (rc = own_f(m, NH, &a->lse, err)) < 0 ||
            (rc = own_f(m, NC, &a->res2, err)) < 0 || (rc = own_f(m, N, &a->ln2_mean, err)) < 0 ||
            (rc = own_f(m, N, &a->ln2_rstd, err)) < 0)
            goto fail;
        if (w16 ? (re < 2 && (rc = own_h(m, NC, &a->ln1_16, err)) < 0) ||
                      (rc = own_h(m, 3 * NC, &a->qkv16, err)) < 0 ||
                      (rc = own_h(m, NC, &a->atty16, err)) < 0 ||
                      (re < 2 && a->ln2_16 == NULL &&
                       (rc = alloc_ln2_16(m, N, &a->ln2_16, err)) < 0) ||
                      (rc = own_h(m, 4 * NC, &a->fch16, err)) < 0 ||
                      (re < 1 && (rc = own_h(m, 4 * NC, &a->gelu16, err)) < 0)
                : (re < 2 && (rc = alloc_f(m, NC, &a->ln1, err)) < 0) ||
                      (rc = alloc_f(m, 3 * NC, &a->qkv, err)) < 0 ||
                      (rc = alloc_f(m, NC, &a->atty, err)) < 0 ||
                      (re < 2 && (rc = alloc_f(m, NC, &a->ln2, err)) < 0) ||
                      (rc = alloc_f(m, 4 * NC, &a->fch, err)) < 0 ||
                      (re < 1 && (rc = alloc_f(m, 4 * NC, &a->fch_gelu, err)) < 0))
            goto fail;
    }
    void *p = NULL;
    if ((rc = mgpu_k_alloc(k, sizeof(int32_t) * N, &p, err)) < 0)
        goto fail;
    m->tokens = p;
    if ((rc = mgpu_k_alloc(k, sizeof(int32_t) * N, &p, err)) < 0)
        goto fail;
    m->targets = p;
    if ((rc = mgpu_k_alloc(k, sizeof *m->now, &p, err)) < 0)
        goto fail;
    m->now = p;
    m->adam = calloc((size_t)m->n_tensors, sizeof *m->adam);
    if (m->adam == NULL) {
        rc = mgpu_err_set(err, -ENOMEM, "gpt: calloc for %d tensors failed", m->n_tensors);
        goto fail;
    }
    for (int i = 0; i < m->n_tensors; i++) {
        const mgpu_gpt_tensor_t *t = &m->tensors[i];
        m->adam[i] = (mgpu_gpt_adamw_tensor_t){
            .p = m->params + t->off,
            .g = m->grads + t->off,
            .m = m->moments != NULL ? m->moments + t->off : NULL,
            .v = m->moments != NULL ? m->moments + m->n_params + t->off : NULL,
            .p16 = mgpu_gpt_w16(m, t->off), /* NULL for mlp.c_fc's: set below */
            .n = t->n,
            .decay = mgpu_gpt_decays(t->ndim)};
        for (int l = 0; m->fc_kp > 0 && l < s->n_layer; l++) { /* into fc16's rows */
            mgpu_bf16_t *row0 = (mgpu_bf16_t *)fc_w16(m, l);
            if (t->off == m->blocks[l].fc_w)
                m->adam[i].p16 = row0, m->adam[i].p16_cols = (int)C;
            else if (t->off == m->blocks[l].fc_b)
                m->adam[i].p16 = row0 + C, m->adam[i].p16_cols = 1;
            else
                continue;
            m->adam[i].p16_ld = (size_t)m->fc_kp;
        }
    }
    if ((rc = mgpu_k_zero(k, m->params, sizeof(float) * m->n_params, err)) < 0 ||
        (m->moments != NULL &&
         (rc = mgpu_k_zero(k, m->moments, sizeof(float) * 2 * m->n_params, err)) < 0) ||
        (rc = mgpu_k_zero(k, m->scalars, sizeof(float) * 4, err)) < 0)
        goto fail;
    *out = m;
    return 0;
fail:
    mgpu_gpt_destroy(m);
    return rc;
}

int mgpu_gpt_init(mgpu_gpt_t *m, uint64_t seed, mgpu_err_t *err)
{
    float *h = malloc(sizeof(float) * m->n_params);
    mgpu_rng_t r;
    const double proj_std = 0.02 / sqrt(2.0 * m->spec.n_layer);

    if (h == NULL)
        return mgpu_err_set(err, -ENOMEM, "gpt: malloc of %zu floats for the init failed",
                            m->n_params);
    mgpu_rng_seed(&r, seed);
    for (int i = 0; i < m->n_tensors; i++) {
        const mgpu_gpt_tensor_t *t = &m->tensors[i];
        int residual = 0;
        for (int l = 0; l < m->spec.n_layer; l++)
            residual |= t->off == m->blocks[l].proj_w || t->off == m->blocks[l].fcp_w;
        int ln_weight = t->off == m->lnf_w;
        for (int l = 0; l < m->spec.n_layer; l++)
            ln_weight |= t->off == m->blocks[l].ln1_w || t->off == m->blocks[l].ln2_w;
        for (size_t j = 0; j < t->n; j++) {
            if (t->ndim >= 2)
                h[t->off + j] = (float)(mgpu_rng_normal(&r) * (residual ? proj_std : 0.02));
            else
                h[t->off + j] = ln_weight ? 1.0f : 0.0f;
        }
    }
    int rc = mgpu_k_copy_to_device(m->k, m->params, h, sizeof(float) * m->n_params, err);
    free(h);
    return rc < 0 ? rc : mgpu_gpt_params_changed(m, err);
}

int mgpu_gpt_load(mgpu_gpt_t *m, const int32_t *tokens, const int32_t *targets, int b, int t,
                  mgpu_err_t *err)
{
    int rc;
    if (b < 1 || b > m->max_b || t < 1 || t > m->spec.context)
        return mgpu_err_set(err, -EINVAL, "gpt: batch of %d x %d tokens, expected 1..%d x 1..%d", b,
                            t, m->max_b, m->spec.context);
    size_t n = (size_t)b * t;
    if ((rc = mgpu_k_copy_to_device(m->k, m->tokens, tokens, sizeof(int32_t) * n, err)) < 0)
        return rc;
    if (targets != NULL &&
        (rc = mgpu_k_copy_to_device(m->k, m->targets, targets, sizeof(int32_t) * n, err)) < 0)
        return rc;
    m->b = b;
    m->t = t;
    return 0;
}

/* A GPT op wrote n floats at p that a GEMM reads next: a backend that keeps derived copies of
 * GEMM operands (CUDA's bf16 copies) must drop the old one (mgpu_k_written; the CPU keeps
 * none). */
static int fresh(mgpu_gpt_t *m, const float *p, size_t n, mgpu_err_t *err)
{
    return mgpu_k_written(m->k, p, sizeof(float) * n, err);
}

/* out (n, oc) = inp (n, c) @ w^T + bias */
static int linear(mgpu_gpt_t *m, int n, int c, int oc, const float *inp, size_t w, size_t bias,
                  float *out, mgpu_err_t *err)
{
    int rc = mgpu_k_gemm(m->k, 0, 1, n, oc, c, 1.0f, inp, c, m->params + w, c, 0.0f, out, oc, err);
    if (rc < 0)
        return rc;
    return mgpu_k_bias_act_forward(m->k, MGPU_ACT_IDENTITY, n, oc, out, m->params + bias, out, err);
}

/* dinp = dout @ w (overwritten; NULL: skipped), dw += dout^T @ inp, dbias += column sums */
static int linear_back(mgpu_gpt_t *m, int n, int c, int oc, const float *dout, const float *inp,
                       size_t w, size_t bias, float *dinp, mgpu_err_t *err)
{
    int rc;
    if (dinp != NULL && (rc = mgpu_k_gemm(m->k, 0, 0, n, c, oc, 1.0f, dout, oc, m->params + w, c,
                                          0.0f, dinp, c, err)) < 0)
        return rc;
    if ((rc = mgpu_k_gemm(m->k, 1, 0, oc, c, n, 1.0f, dout, oc, inp, c, 1.0f, m->grads + w, c,
                          err)) < 0)
        return rc;
    return mgpu_k_sum_rows(m->k, n, oc, dout, 1.0f, m->grads + bias, err);
}

/* Tells hook (may be NULL) that backward has made layer's gradients final (mgpu_gpt_hook_fn). */
static int reached(mgpu_gpt_hook_fn hook, void *ctx, int layer, mgpu_err_t *err)
{
    return hook != NULL ? hook(ctx, layer, err) : 0;
}

/* --- the bf16 path -------------------------------------------------------------------------- */

/* Forward to m->lnf16: each product's bias, GELU and residual add in its epilogue. */
static int forward16(mgpu_gpt_t *m, mgpu_err_t *err)
{
    const mgpu_gpt_bf16_ops_t *o = m->b16;
    void *ki = m->k->impl;
    const int B = m->b, T = m->t, C = m->spec.n_embd, NH = m->spec.n_head, N = B * T;
    const float *P = m->params;
    int rc;

    if ((rc = mgpu_kg_embed_forward(m->k, B, T, C, m->tokens, P + m->wte, P + m->wpe, m->acts[0].x,
                                    err)) < 0)
        return rc;
    for (int l = 0; l < m->spec.n_layer; l++) {
        const mgpu_gpt_block_t *w = &m->blocks[l];
        mgpu_gpt_acts_t *a = &m->acts[l];
        float *next = l + 1 < m->spec.n_layer ? m->acts[l + 1].x : m->xout;
        if ((rc = o->layernorm_forward(ki, N, C, a->x, P + w->ln1_w, P + w->ln1_b, a->ln1_16,
                                       (size_t)C, a->ln1_mean, a->ln1_rstd, err)) < 0 ||
            (rc = o->linear(ki, N, C, 3 * C, a->ln1_16, mgpu_gpt_w16(m, w->qkv_w),
                            mgpu_gpt_w16(m, w->qkv_b), a->qkv16, NULL, err)) < 0 ||
            (rc = o->attention_forward(ki, B, T, C, NH, a->qkv16, a->atty16, a->lse, err)) < 0 ||
            (rc = o->linear_f32(ki, N, C, C, a->atty16, mgpu_gpt_w16(m, w->proj_w), P + w->proj_b,
                                a->x, a->res2, err)) < 0 ||
            (rc = o->layernorm_forward(ki, N, C, a->res2, P + w->ln2_w, P + w->ln2_b, a->ln2_16,
                                       (size_t)fc_k(m), a->ln2_mean, a->ln2_rstd, err)) < 0 ||
            (rc = o->linear(ki, N, fc_k(m), 4 * C, a->ln2_16, fc_w16(m, l),
                            mgpu_gpt_w16(m, w->fc_b), a->gelu16, a->fch16, err)) < 0 ||
            (rc = o->linear_f32(ki, N, 4 * C, C, a->gelu16, mgpu_gpt_w16(m, w->fcp_w), P + w->fcp_b,
                                a->res2, next, err)) < 0)
            return rc;
    }
    return o->layernorm_forward(ki, N, C, m->xout, P + m->lnf_w, P + m->lnf_b, m->lnf16, (size_t)C,
                                m->lnf_mean, m->lnf_rstd, err);
}

/* The output layer over the rows in chunks of head_rows: logits, loss and, with backward,
 * dlogits written over the logits, then dln16 (the rows' d lnf) and dwte. */
static int head16(mgpu_gpt_t *m, float scale, int backward, mgpu_err_t *err)
{
    const mgpu_gpt_bf16_ops_t *o = m->b16;
    void *ki = m->k->impl;
    const int N = m->b * m->t, C = m->spec.n_embd, V = m->spec.vocab;
    const mgpu_bf16_t *wte = m->params16 + m->wte;
    int rc;

    for (int r = 0; r < N; r += m->head_rows) {
        const int n = N - r < m->head_rows ? N - r : m->head_rows;
        const mgpu_bf16_t *x = m->lnf16 + (size_t)r * C;
        if ((rc = o->linear(ki, n, C, V, x, wte, NULL, m->logits16, NULL, err)) < 0 ||
            (rc = o->xent(ki, n, V, m->logits16, m->targets + r, scale, backward, m->scalars,
                          err)) < 0)
            return rc;
        /* The tied embedding's gradient: overwritten by the first chunk after a zeroing. */
        if (backward &&
            ((rc = o->linear_back_data(ki, n, C, V, m->logits16, wte, (size_t)C, NULL,
                                       m->dln16 + (size_t)r * C, err)) < 0 ||
             (rc = o->linear_back_weight(ki, n, C, V, m->logits16, x, (size_t)C, m->grads + m->wte,
                                         NULL, m->grads_fresh && r == 0, err)) < 0))
            return rc;
    }
    return 0;
}

/* Joins the weight gradients queued beside the backward's chain (gpt_ops.h: join). */
static int join16(const mgpu_gpt_t *m, mgpu_err_t *err)
{
    return m->b16->join != NULL ? m->b16->join(m->k->impl, err) : 0;
}

/* A weight gradient that may run beside the ops after it (gpt_ops.h: the ops' _beside). */
static int wg16(const mgpu_gpt_t *m, int n, int c, int oc, const mgpu_bf16_t *dout,
                const mgpu_bf16_t *inp, size_t ldi, float *dw, float *dbias, int fresh,
                mgpu_err_t *err)
{
    const mgpu_gpt_bf16_ops_t *o = m->b16;
    if (o->linear_back_weight_beside != NULL)
        return o->linear_back_weight_beside(m->k->impl, n, c, oc, dout, inp, ldi, dw, dbias, fresh,
                                            err);
    return o->linear_back_weight(m->k->impl, n, c, oc, dout, inp, ldi, dw, dbias, fresh, err);
}

/* The blocks' backward from dln16 (d lnf): dres (fp32) is the residual stream's gradient and
 * dres16 its bf16 copy, which the products read. The LayerNorm backward that writes dres16
 * also sums its columns into the bias gradient of the projection that reads it next
 * (mlp.c_proj of the block below, or attn.c_proj of the same block). With spec.recompute 2
 * the LayerNorm's backward also writes its forward's output again (the pass reads x anyway),
 * so the weight gradient that reads that output comes after it.
 * The weight gradients (wg16) may run beside the chain of input gradients: each is
 * joined before the next write of what it reads (dres16 by a LayerNorm backward; d4_16,
 * dqkv16, the recomputed outputs and, with spec.reuse_grads, the activations inside the
 * gradients of the block below, by ops after the next join), before a hook reads the
 * gradients, and at the end. */
static int backward16(mgpu_gpt_t *m, mgpu_gpt_hook_fn hook, void *hook_ctx, mgpu_err_t *err)
{
    const mgpu_gpt_bf16_ops_t *o = m->b16;
    void *ki = m->k->impl;
    const int B = m->b, T = m->t, C = m->spec.n_embd, NH = m->spec.n_head, N = B * T;
    const float *P = m->params;
    float *G = m->grads;
    /* Each block gradient below is written once here, the bias gradients of the projections
     * by the LayerNorm backward above them (dsum): all overwritten after a zeroing. */
    const int f = m->grads_fresh, re2 = m->spec.recompute >= 2;
    int rc;

    m->grads_fresh = 0;
    if ((rc = mgpu_k_zero(m->k, m->dres, sizeof(float) * (size_t)N * C, err)) < 0 ||
        (rc = o->layernorm_backward(ki, N, C, m->dln16, m->xout, P + m->lnf_w, NULL, m->lnf_mean,
                                    m->lnf_rstd, m->dres, m->dres16, G + m->lnf_w, G + m->lnf_b,
                                    G + m->blocks[m->spec.n_layer - 1].fcp_b, NULL, 0, f, err)) <
            0 ||
        (rc = reached(hook, hook_ctx, m->spec.n_layer, err)) < 0)
        return rc;
    for (int l = m->spec.n_layer - 1; l >= 0; l--) {
        const mgpu_gpt_block_t *w = &m->blocks[l];
        mgpu_gpt_acts_t *a = &m->acts[l];
        /* x_{l+1} = res2 + fcp(gelu(fc(ln2(res2)))): GELU's derivative in the epilogue. */
        const size_t kp = (size_t)fc_k(m);
        if ((rc = o->linear_back_data(ki, N, 4 * C, C, m->dres16, mgpu_gpt_w16(m, w->fcp_w),
                                      4 * (size_t)C, a->fch16, m->d4_16, err)) < 0 ||
            (m->spec.recompute >= 1 &&
             (rc = o->gelu(ki, 4 * (size_t)N * C, a->fch16, a->gelu16, err)) < 0) ||
            (rc = wg16(m, N, 4 * C, C, m->dres16, a->gelu16, 4 * (size_t)C, G + w->fcp_w, NULL, f,
                       err)) < 0 ||
            (rc = o->linear_back_data(ki, N, C, 4 * C, m->d4_16, fc_w16(m, l), kp, NULL, m->dln16,
                                      err)) < 0 ||
            (rc = join16(m, err)) < 0 ||
            (rc = o->layernorm_backward(ki, N, C, m->dln16, a->res2, P + w->ln2_w, P + w->ln2_b,
                                        a->ln2_mean, a->ln2_rstd, m->dres, m->dres16, G + w->ln2_w,
                                        G + w->ln2_b, G + w->proj_b, re2 ? a->ln2_16 : NULL, kp, f,
                                        err)) < 0 ||
            (rc = wg16(m, N, C, 4 * C, m->d4_16, a->ln2_16, kp, G + w->fc_w, G + w->fc_b, f, err)) <
                0)
            return rc;
        /* res2 = x + proj(attention(qkv(ln1(x)))) */
        if ((rc = o->linear_back_data(ki, N, C, C, m->dres16, mgpu_gpt_w16(m, w->proj_w), (size_t)C,
                                      NULL, m->dln16, err)) < 0 ||
            (rc = wg16(m, N, C, C, m->dres16, a->atty16, (size_t)C, G + w->proj_w, NULL, f, err)) <
                0 ||
            (rc = o->attention_backward(ki, B, T, C, NH, m->dln16, a->qkv16, a->atty16, a->lse,
                                        m->dqkv16, err)) < 0 ||
            (rc = o->linear_back_data(ki, N, C, 3 * C, m->dqkv16, mgpu_gpt_w16(m, w->qkv_w),
                                      (size_t)C, NULL, m->dln16, err)) < 0 ||
            (rc = join16(m, err)) < 0 ||
            (rc = o->layernorm_backward(ki, N, C, m->dln16, a->x, P + w->ln1_w, P + w->ln1_b,
                                        a->ln1_mean, a->ln1_rstd, m->dres, l > 0 ? m->dres16 : NULL,
                                        G + w->ln1_w, G + w->ln1_b,
                                        l > 0 ? G + m->blocks[l - 1].fcp_b : NULL,
                                        re2 ? a->ln1_16 : NULL, (size_t)C, f, err)) < 0 ||
            (rc = wg16(m, N, C, 3 * C, m->dqkv16, a->ln1_16, (size_t)C, G + w->qkv_w, G + w->qkv_b,
                       f, err)) < 0 ||
            (hook != NULL && (rc = join16(m, err)) < 0) ||
            (rc = reached(hook, hook_ctx, l, err)) < 0)
            return rc;
    }
    if ((rc = join16(m, err)) < 0 ||
        (rc = mgpu_kg_embed_backward(m->k, B, T, C, m->spec.vocab, m->tokens, m->dres, G + m->wte,
                                     G + m->wpe, err)) < 0)
        return rc;
    return reached(hook, hook_ctx, MGPU_GPT_EMBEDDINGS, err);
}

/* --- the fp32 path -------------------------------------------------------------------------- */

static int forward32(mgpu_gpt_t *m, mgpu_err_t *err)
{
    const int B = m->b, T = m->t, C = m->spec.n_embd, NH = m->spec.n_head, N = B * T;
    const size_t NC = (size_t)N * C;
    float *P = m->params;
    int rc;

    if ((rc = mgpu_kg_embed_forward(m->k, B, T, C, m->tokens, P + m->wte, P + m->wpe, m->acts[0].x,
                                    err)) < 0)
        return rc;
    for (int l = 0; l < m->spec.n_layer; l++) {
        const mgpu_gpt_block_t *w = &m->blocks[l];
        mgpu_gpt_acts_t *a = &m->acts[l];
        float *next = l + 1 < m->spec.n_layer ? m->acts[l + 1].x : m->xout;
        if ((rc = mgpu_kg_layernorm_forward(m->k, N, C, a->x, P + w->ln1_w, P + w->ln1_b, a->ln1,
                                            a->ln1_mean, a->ln1_rstd, err)) < 0 ||
            (rc = fresh(m, a->ln1, NC, err)) < 0 ||
            (rc = linear(m, N, C, 3 * C, a->ln1, w->qkv_w, w->qkv_b, a->qkv, err)) < 0 ||
            (rc = mgpu_kg_attention_forward(m->k, B, T, C, NH, a->qkv, a->atty, a->lse, err)) < 0 ||
            (rc = fresh(m, a->atty, NC, err)) < 0 ||
            (rc = linear(m, N, C, C, a->atty, w->proj_w, w->proj_b, a->res2, err)) < 0 ||
            (rc = mgpu_kg_add(m->k, NC, a->res2, a->x, a->res2, err)) < 0 ||
            (rc = mgpu_kg_layernorm_forward(m->k, N, C, a->res2, P + w->ln2_w, P + w->ln2_b, a->ln2,
                                            a->ln2_mean, a->ln2_rstd, err)) < 0 ||
            (rc = fresh(m, a->ln2, NC, err)) < 0 ||
            (rc = linear(m, N, C, 4 * C, a->ln2, w->fc_w, w->fc_b, a->fch, err)) < 0 ||
            (rc = mgpu_kg_gelu_forward(m->k, 4 * NC, a->fch, a->fch_gelu, err)) < 0 ||
            (rc = fresh(m, a->fch_gelu, 4 * NC, err)) < 0 ||
            (rc = linear(m, N, 4 * C, C, a->fch_gelu, w->fcp_w, w->fcp_b, next, err)) < 0 ||
            (rc = mgpu_kg_add(m->k, NC, next, a->res2, next, err)) < 0)
            return rc;
    }
    if ((rc = mgpu_kg_layernorm_forward(m->k, N, C, m->xout, P + m->lnf_w, P + m->lnf_b, m->lnf,
                                        m->lnf_mean, m->lnf_rstd, err)) < 0)
        return rc;
    return fresh(m, m->lnf, NC, err);
}

int mgpu_gpt_forward(mgpu_gpt_t *m, mgpu_err_t *err)
{
    if (m->b16 != NULL)
        return forward16(m, err);
    return forward32(m, err);
}

/* spec.recompute: a LayerNorm's output y made again from its input x, weight w and bias b
 * (offsets), as forward32 made it. */
static int relayernorm(mgpu_gpt_t *m, const float *x, size_t w, size_t b, float *y, mgpu_err_t *err)
{
    const int N = m->b * m->t, C = m->spec.n_embd;
    int rc = mgpu_kg_layernorm_forward(m->k, N, C, x, m->params + w, m->params + b, y, m->re_mean,
                                       m->re_rstd, err);
    return rc < 0 ? rc : fresh(m, y, (size_t)N * C, err);
}

static int backward(mgpu_gpt_t *m, mgpu_gpt_hook_fn hook, void *hook_ctx, mgpu_err_t *err)
{
    const int B = m->b, T = m->t, C = m->spec.n_embd, NH = m->spec.n_head, N = B * T;
    float *P = m->params, *G = m->grads;
    int rc;

    /* dln holds d(lnf) from the head; dres becomes d(residual stream). */
    if ((rc = mgpu_k_zero(m->k, m->dres, sizeof(float) * (size_t)N * C, err)) < 0 ||
        (rc = mgpu_kg_layernorm_backward(m->k, N, C, m->dln, m->xout, P + m->lnf_w, m->lnf_mean,
                                         m->lnf_rstd, m->dres, G + m->lnf_w, G + m->lnf_b, err)) <
            0 ||
        (rc = reached(hook, hook_ctx, m->spec.n_layer, err)) < 0)
        return rc;
    const size_t NC = (size_t)N * C;
    for (int l = m->spec.n_layer - 1; l >= 0; l--) {
        const mgpu_gpt_block_t *w = &m->blocks[l];
        mgpu_gpt_acts_t *a = &m->acts[l];
        /* x_{l+1} = res2 + mlp(res2): the MLP's output gradient is dres. */
        if ((rc = fresh(m, m->dres, NC, err)) < 0 ||
            (m->spec.recompute >= 1 &&
             ((rc = mgpu_kg_gelu_forward(m->k, 4 * NC, a->fch, a->fch_gelu, err)) < 0 ||
              (rc = fresh(m, a->fch_gelu, 4 * NC, err)) < 0)) ||
            (rc = linear_back(m, N, 4 * C, C, m->dres, a->fch_gelu, w->fcp_w, w->fcp_b, m->d4,
                              err)) < 0 ||
            (rc = mgpu_kg_gelu_backward(m->k, (size_t)N * 4 * C, a->fch, m->d4, m->d4, err)) < 0 ||
            (rc = fresh(m, m->d4, 4 * NC, err)) < 0 ||
            (m->spec.recompute >= 2 &&
             (rc = relayernorm(m, a->res2, w->ln2_w, w->ln2_b, a->ln2, err)) < 0) ||
            (rc = linear_back(m, N, C, 4 * C, m->d4, a->ln2, w->fc_w, w->fc_b, m->dln, err)) < 0 ||
            (rc = mgpu_kg_layernorm_backward(m->k, N, C, m->dln, a->res2, P + w->ln2_w, a->ln2_mean,
                                             a->ln2_rstd, m->dres, G + w->ln2_w, G + w->ln2_b,
                                             err)) < 0)
            return rc;
        /* res2 = x + proj(attention(ln1(x))): dres is now d(res2). */
        if ((rc = fresh(m, m->dres, NC, err)) < 0 ||
            (rc = linear_back(m, N, C, C, m->dres, a->atty, w->proj_w, w->proj_b, m->dln, err)) <
                0 ||
            (rc = mgpu_kg_attention_backward(m->k, B, T, C, NH, m->dln, a->qkv, a->atty, a->lse,
                                             m->dqkv, err)) < 0 ||
            (rc = fresh(m, m->dqkv, 3 * NC, err)) < 0 ||
            (m->spec.recompute >= 2 &&
             (rc = relayernorm(m, a->x, w->ln1_w, w->ln1_b, a->ln1, err)) < 0) ||
            (rc = linear_back(m, N, C, 3 * C, m->dqkv, a->ln1, w->qkv_w, w->qkv_b, m->dln, err)) <
                0 ||
            (rc = mgpu_kg_layernorm_backward(m->k, N, C, m->dln, a->x, P + w->ln1_w, a->ln1_mean,
                                             a->ln1_rstd, m->dres, G + w->ln1_w, G + w->ln1_b,
                                             err)) < 0 ||
            (rc = reached(hook, hook_ctx, l, err)) < 0)
            return rc;
    }
    if ((rc = mgpu_kg_embed_backward(m->k, B, T, C, m->spec.vocab, m->tokens, m->dres, G + m->wte,
                                     G + m->wpe, err)) < 0)
        return rc;
    return reached(hook, hook_ctx, MGPU_GPT_EMBEDDINGS, err);
}

int mgpu_gpt_loss(mgpu_gpt_t *m, float scale, int do_backward, mgpu_err_t *err)
{
    return mgpu_gpt_loss_hooked(m, scale, do_backward, NULL, NULL, err);
}

int mgpu_gpt_loss_hooked(mgpu_gpt_t *m, float scale, int do_backward, mgpu_gpt_hook_fn hook,
                         void *hook_ctx, mgpu_err_t *err)
{
    const int N = m->b * m->t, C = m->spec.n_embd, V = m->spec.vocab;
    int rc;

    if (do_backward) /* (evaluation keeps its own phase) */
        mgpu_progress_phase(m->progress, MGPU_PHASE_FORWARD);
    if (m->b16 != NULL && do_backward && m->spec.reuse_grads && !m->grads_fresh)
        return mgpu_err_set(err, -EINVAL,
                            "gpt: a backward adding into gradients an earlier backward wrote, "
                            "with reuse_grads (the forward writes activations into the "
                            "gradients' memory): zero the gradients before each backward");
    if ((rc = mgpu_gpt_forward(m, err)) < 0)
        return rc;
    if (m->b16 != NULL) {
        if ((rc = head16(m, scale, do_backward, err)) < 0 || !do_backward)
            return rc;
        mgpu_progress_phase(m->progress, MGPU_PHASE_BACKWARD);
        return backward16(m, hook, hook_ctx, err);
    }
    if (do_backward && (rc = mgpu_k_zero(m->k, m->dln, sizeof(float) * (size_t)N * C, err)) < 0)
        return rc;
    for (int r = 0; r < N; r += m->head_rows) {
        int n = N - r < m->head_rows ? N - r : m->head_rows;
        size_t o = (size_t)r * C;
        if ((rc = mgpu_kg_tied_head(m->k, n, C, V, m->lnf + o, m->params + m->wte, m->targets + r,
                                    scale, m->logits, m->scalars, do_backward ? m->dln + o : NULL,
                                    do_backward ? m->grads + m->wte : NULL, err)) < 0)
            return rc;
    }
    if (!do_backward)
        return 0;
    /* The output layer's backward ran with its forward; the blocks' is what follows. */
    mgpu_progress_phase(m->progress, MGPU_PHASE_BACKWARD);
    return backward(m, hook, hook_ctx, err);
}

int mgpu_gpt_buckets(const mgpu_gpt_t *m, double bucket_mb, mgpu_gpt_bucket_t **out, int *n,
                     mgpu_err_t *err)
{
    const int L = m->spec.n_layer;
    *out = NULL;
    *n = 0;
    if (!(bucket_mb > 0))
        return mgpu_err_set(err, -EINVAL, "gpt: bucket_mb %g, expected > 0", bucket_mb);
    mgpu_gpt_bucket_t *b = calloc((size_t)L + 2, sizeof *b);
    if (b == NULL)
        return mgpu_err_set(err, -ENOMEM, "gpt: calloc for %d buckets failed", L + 2);
    size_t cap = (size_t)(bucket_mb * 1024 * 1024 / sizeof(float)), top = m->n_params;
    int nb = 0;
    cap = cap < 1 ? 1 : cap;
    /* The units backward finishes, in its order, each [lo, the start of the one before it);
     * top is where the open bucket ends (the start of the last one closed). */
    for (int u = L; u >= MGPU_GPT_EMBEDDINGS; u--) {
        size_t lo = u == L ? m->lnf_w : u >= 0 ? m->blocks[u].ln1_w : 0;
        if (top - lo >= cap || u == MGPU_GPT_EMBEDDINGS) {
            b[nb++] = (mgpu_gpt_bucket_t){.off = lo, .n = top - lo, .layer = u};
            top = lo;
        }
    }
    *out = b;
    *n = nb;
    return 0;
}

int mgpu_gpt_zero_grads(mgpu_gpt_t *m, mgpu_err_t *err)
{
    int rc;
    if (m->b16 != NULL) {
        /* The embedding backward adds into the position embedding's gradient. */
        m->grads_fresh = 1;
        rc = mgpu_k_zero(m->k, m->grads + m->wpe,
                         sizeof(float) * (size_t)m->spec.context * m->spec.n_embd, err);
    } else {
        rc = mgpu_k_zero(m->k, m->grads, sizeof(float) * m->n_params, err);
    }
    return rc < 0 ? rc : mgpu_k_zero(m->k, m->scalars, sizeof(float), err);
}

int mgpu_gpt_set_step(mgpu_gpt_t *m, const mgpu_adamw_hparams_t *hp, long long step,
                      mgpu_err_t *err)
{
    mgpu_gpt_adamw_now_t now;
    if (step < 1)
        return mgpu_err_set(err, -EINVAL, "gpt: AdamW step %lld, expected >= 1", step);
    mgpu_kg_adamw_now(hp, step, &now);
    /* A copy from pageable memory has taken its source when it returns (kernels.h). */
    return mgpu_k_copy_to_device(m->k, m->now, &now, sizeof now, err);
}

/* The clip (when grad_clip > 0, or sumsq_too for the caller's norm) and the update. */
static int update(mgpu_gpt_t *m, const mgpu_adamw_hparams_t *hp, float grad_clip, int sumsq_too,
                  mgpu_err_t *err)
{
    float *ss = m->scalars + 1, *factor = m->scalars + 2;
    int rc;

    if (m->moments == NULL)
        return mgpu_err_set(err, -EINVAL,
                            "gpt: AdamW step on a model without moments (sharded_optimizer: the "
                            "slice's optimizer, zero.h, updates it)");

    /* Zeroed on the bf16 path and no backward since: the gradients were never written. */
    if (m->grads_fresh) {
        if ((rc = mgpu_k_zero(m->k, m->grads, sizeof(float) * m->n_params, err)) < 0)
            return rc;
        m->grads_fresh = 0;
    }
    if ((grad_clip > 0 || sumsq_too) &&
        ((rc = mgpu_k_zero(m->k, ss, sizeof(float), err)) < 0 ||
         (rc = mgpu_kg_sumsq(m->k, m->n_params, m->grads, ss, err)) < 0 ||
         (rc = mgpu_kg_clip_factor(m->k, ss, grad_clip, factor, err)) < 0))
        return rc;
    if ((rc = mgpu_kg_adamw_multi(m->k, m->n_tensors, m->adam, hp, m->now,
                                  grad_clip > 0 ? factor : NULL, err)) < 0)
        return rc;
    return fresh(m, m->params, m->n_params, err);
}

int mgpu_gpt_update(mgpu_gpt_t *m, const mgpu_adamw_hparams_t *hp, float grad_clip, mgpu_err_t *err)
{
    return update(m, hp, grad_clip, 0, err);
}

int mgpu_gpt_params_changed(mgpu_gpt_t *m, mgpu_err_t *err)
{
    if (m->b16 == NULL)
        return fresh(m, m->params, m->n_params, err);
    /* where AdamW writes each tensor's bf16 copy: params16, or rows inside a wider matrix.
     * params16 is the layout less the fc16 tensors: one conversion a run between them. */
    int rc = 0;
    size_t from = 0;
    for (int l = 0; rc == 0; l++) {
        const int last = fc_gap(m) == 0 || l == m->spec.n_layer;
        const size_t to = last ? m->n_params : m->blocks[l].fc_w;
        rc = m->b16->to_bf16(m->k->impl, to - from, m->params + from, mgpu_gpt_w16(m, from), err);
        if (last)
            break;
        from = m->blocks[l].fcp_w;
    }
    for (int i = 0; rc == 0 && i < m->n_tensors; i++) {
        const mgpu_gpt_adamw_tensor_t *t = &m->adam[i];
        if (t->p16_cols > 0)
            rc = m->b16->to_bf16_2d(m->k->impl, (int)(t->n / (size_t)t->p16_cols), t->p16_cols,
                                    t->p, (size_t)t->p16_cols, t->p16, t->p16_ld, err);
    }
    return rc;
}

int mgpu_gpt_step(mgpu_gpt_t *m, const mgpu_adamw_hparams_t *hp, long long step, float grad_clip,
                  float *norm, mgpu_err_t *err)
{
    int rc;
    if ((rc = mgpu_gpt_set_step(m, hp, step, err)) < 0 ||
        (rc = update(m, hp, grad_clip, norm != NULL, err)) < 0)
        return rc;
    if (norm != NULL) {
        float s;
        if ((rc = mgpu_k_copy_to_host(m->k, &s, m->scalars + 1, sizeof s, err)) < 0)
            return rc;
        *norm = sqrtf(s);
    }
    return 0;
}

int mgpu_gpt_last_logits(mgpu_gpt_t *m, float *host, mgpu_err_t *err)
{
    const int C = m->spec.n_embd, V = m->spec.vocab;
    if (m->b16 != NULL) {
        int rc = m->b16->linear_f32(m->k->impl, 1, C, V, m->lnf16 + (size_t)(m->t - 1) * C,
                                    m->params16 + m->wte, NULL, NULL, m->logits, err);
        return rc < 0 ? rc : mgpu_k_copy_to_host(m->k, host, m->logits, sizeof(float) * V, err);
    }
    const float *x = m->lnf + (size_t)(m->t - 1) * C;
    int rc = mgpu_k_gemm(m->k, 0, 1, 1, V, C, 1.0f, x, C, m->params + m->wte, C, 0.0f, m->logits, V,
                         err);
    return rc < 0 ? rc : mgpu_k_copy_to_host(m->k, host, m->logits, sizeof(float) * V, err);
}

uint64_t mgpu_gpt_shape_hash(const mgpu_gpt_spec_t *s)
{
    int32_t words[5] = {s->n_layer, s->n_head, s->n_embd, s->context, s->vocab};
    uint64_t h = mgpu_fnv1a(MGPU_FNV_OFFSET, "gpt", 3);
    return mgpu_fnv1a(h, words, sizeof words);
}
