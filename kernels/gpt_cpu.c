/* gpt_cpu.c - the CPU table of a GPT's ops (gpt_ops.h): transformer.h's reference functions
 * adapted to the table's conventions (gradients of activations overwritten where the table
 * says so, the loss accumulated with a scale), with the backend's GEMM for the output layer's
 * products, which dominate a small model's step.
 *
 * GELU and attention are this file's own, in fp32 with loops the compiler vectorises, as
 * PyTorch's CPU kernels compute them: the reference's double-precision libm calls and dot
 * products took over half of a small model's step. They are checked against the reference
 * (tests/unit/test_gpt_ops.c).
 *
 * Attention keeps only lse between forward and backward: the backward recomputes one head's
 * probabilities at a time from qkv, in scratch that the backend's state owns
 * (cpu_impl_t.gpt_scratch: grown when a larger shape comes, freed with the backend). The
 * recomputation runs the same code on the same inputs, so it gives the forward's
 * probabilities bit for bit. */
#include "cpu_ref.h"     /* cpu_impl_t, mgpu_cpu_gemm, mgpu_cpu_softmax_xent, ... */
#include "gpt_ops.h"     /* mgpu_gpt_ops_t */
#include "transformer.h" /* the reference functions */

#include <errno.h>  /* ENOMEM */
#include <math.h>   /* sqrt, log */
#include <stdint.h> /* INT32_MAX, int32_t, uint32_t */
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

/* e^x in fp32 for x <= 0 (below -80 as at -80: 2e-35), within 2 ulp: Cody-Waite reduction to
 * r in [-ln2/2, ln2/2], Cephes' degree-6 polynomial of e^r, then 2^n put in the exponent.
 * Written without calls so that a loop of it vectorises (libmvec's vector expf is declared
 * to GCC only under -ffast-math, which would also reorder the sums here). Only x <= 0 is
 * needed, so there is one clamp and nothing overflows: GCC evaluates a clamp's constant case
 * for every lane, and a case near e^88 made denormals, each a slow microcode assist. */
static inline __attribute__((always_inline)) float exp_neg(float x)
{
    const float xc = x >= -80.0f ? x : -80.0f; /* a NaN too: n must be a number */
    /* n = round(xc / ln2): adding 1.5 * 2^23 leaves no fraction bits */
    const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = xc - n * 0.693359375f; /* ln2's leading bits: n * it is exact */
    r = r + n * 2.12194440e-4f;      /* ln2's rest */
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const uint32_t bits = (uint32_t)((int32_t)n + 127) << 23; /* 2^n, n in [-116, 0] */
    float two_n;
    memcpy(&two_n, &bits, sizeof two_n);
    return x != x ? x : p * two_n; /* a NaN stays one */
}

/* VECTORIZE for loops of exp_neg: its clamp becomes a vector select only when the compiler
 * may assume that comparisons raise no floating-point exception that anyone reads (nothing
 * here reads them). */
#if defined(__GNUC__) && !defined(__clang__)
#define VECTORIZE_EXP                                                                              \
    __attribute__((optimize("tree-vectorize", "vect-cost-model=dynamic", "no-trapping-math")))
#else
#define VECTORIZE_EXP
#endif

/* tanh-GELU as x s(2u), u = sqrt(2/pi) (x + 0.044715 x^3): 0.5 (1 + tanh u) is the sigmoid
 * s(2u), which loses nothing where tanh u is near -1. With e = exp(-2|u|) <= 1, s(2u) is
 * 1 / (1 + e) for u >= 0 and e / (1 + e) below, and s (1 - s) is e / (1 + e)^2 for both. */

VECTORIZE_EXP static int gelu_forward(void *impl, size_t n, const float *x, float *y,
                                      mgpu_err_t *err)
{
    for (size_t i = 0; i < n; i++) {
        const float xi = x[i], u = GELU_K * (xi + GELU_C * xi * xi * xi);
        const float e = exp_neg(-2.0f * (u < 0.0f ? -u : u));
        y[i] = xi * ((u < 0.0f ? e : 1.0f) / (1.0f + e));
    }
    return 0;
}

/* d/dx x s(2u) = s + 2 x u' s (1 - s). dx may be dy: each element is read before it is
 * written. */
VECTORIZE_EXP static int gelu_backward(void *impl, size_t n, const float *x, const float *dy,
                                       float *dx, mgpu_err_t *err)
{
    for (size_t i = 0; i < n; i++) {
        const float xi = x[i], u = GELU_K * (xi + GELU_C * xi * xi * xi);
        const float e = exp_neg(-2.0f * (u < 0.0f ? -u : u)), inv = 1.0f / (1.0f + e);
        const float sg = (u < 0.0f ? e : 1.0f) * inv;
        const float du = GELU_K * (1.0f + 3.0f * GELU_C * xi * xi);
        dx[i] = (sg + 2.0f * xi * du * (e * inv * inv)) * dy[i];
    }
    return 0;
}

/* One head of one sequence, gathered out of qkv's rows (3c wide) into contiguous blocks, so
 * that every inner loop below runs over consecutive floats: over keys for the scores and
 * the probabilities' gradients, over the head's width for the products with values, keys
 * and queries. */
typedef struct {
    int t, hs;
    float *q, *k, *v;    /* t x hs */
    float *kt, *vt;      /* hs x t: keys and values transposed */
    float *p;            /* t x t: row i's first i + 1 are query i's probabilities */
    float *dq, *dk, *dv; /* t x hs, backward only */
    float *dp;           /* t, backward only: one row's gradient of the probabilities */
} head_t;

/* Floats of scratch a head needs: forward (q, kt, v, p) or backward (all of head_t). */
static size_t head_floats(int t, int hs, int backward)
{
    size_t th = (size_t)t * hs;
    return (size_t)t * t + (backward ? 8 * th + (size_t)t : 3 * th);
}

static void head_init(head_t *hd, float *s, int t, int hs, int backward)
{
    size_t th = (size_t)t * hs;
    hd->t = t;
    hd->hs = hs;
    hd->p = s;
    s += (size_t)t * t;
    hd->q = s;
    hd->kt = s + th;
    hd->v = s + 2 * th;
    hd->k = hd->vt = hd->dq = hd->dk = hd->dv = hd->dp = NULL;
    if (backward) {
        hd->k = s + 3 * th;
        hd->vt = s + 4 * th;
        hd->dq = s + 5 * th;
        hd->dk = s + 6 * th;
        hd->dv = s + 7 * th;
        hd->dp = s + 8 * th;
    }
}

/* Head h of the sequence whose qkv rows start at rows (t rows of 3c). */
static void head_gather(head_t *hd, const float *rows, int c, int h)
{
    const int t = hd->t, hs = hd->hs;
    for (int j = 0; j < t; j++) {
        const float *r = rows + (size_t)j * 3 * c + (size_t)h * hs;
        for (int i = 0; i < hs; i++) {
            hd->q[(size_t)j * hs + i] = r[i];
            hd->kt[(size_t)i * t + j] = r[c + i];
            hd->v[(size_t)j * hs + i] = r[2 * c + i];
            if (hd->k != NULL) {
                hd->k[(size_t)j * hs + i] = r[c + i];
                hd->vt[(size_t)i * t + j] = r[2 * c + i];
            }
        }
    }
}

/* The causal probabilities softmax(q k^T / sqrt(hs)) into p, and each row's log-sum-exp of
 * the scaled scores into lse (when not NULL). */
VECTORIZE_EXP static void head_probs(const head_t *hd, float *lse)
{
    const int t = hd->t, hs = hd->hs;
    const float scale = (float)(1.0 / sqrt((double)hs));
    for (int qi = 0; qi < t; qi++) {
        float *s = hd->p + (size_t)qi * t;
        const int n = qi + 1;
        for (int j = 0; j < n; j++)
            s[j] = 0.0f;
        for (int i = 0; i < hs; i++) {
            const float a = hd->q[(size_t)qi * hs + i], *kr = hd->kt + (size_t)i * t;
            for (int j = 0; j < n; j++)
                s[j] += a * kr[j];
        }
        float mx = -INFINITY;
        for (int j = 0; j < n; j++) {
            s[j] *= scale;
            mx = s[j] > mx ? s[j] : mx;
        }
        for (int j = 0; j < n; j++)
            s[j] = exp_neg(s[j] - mx);
        double sum = 0.0;
        for (int j = 0; j < n; j++)
            sum += s[j];
        const float inv = (float)(1.0 / sum);
        for (int j = 0; j < n; j++)
            s[j] *= inv;
        if (lse != NULL)
            lse[qi] = (float)((double)mx + log(sum));
    }
}

/* out's rows (c wide) for head h: each query's probabilities times the values. */
VECTORIZE static void head_out(const head_t *hd, float *out, int c, int h)
{
    const int t = hd->t, hs = hd->hs;
    for (int qi = 0; qi < t; qi++) {
        float *o = out + (size_t)qi * c + (size_t)h * hs;
        const float *pr = hd->p + (size_t)qi * t;
        for (int i = 0; i < hs; i++)
            o[i] = 0.0f;
        for (int j = 0; j <= qi; j++) {
            const float a = pr[j], *vr = hd->v + (size_t)j * hs;
            for (int i = 0; i < hs; i++)
                o[i] += a * vr[i];
        }
    }
}

static int attention_forward(void *impl, int b, int t, int c, int nh, const float *qkv, float *out,
                             float *lse, mgpu_err_t *err)
{
    const int hs = c / nh;
    float *s = NULL;
    int rc = scratch(impl, head_floats(t, hs, 0), &s, err);
    if (rc < 0)
        return rc;
    head_t hd;
    head_init(&hd, s, t, hs, 0);
    for (int bi = 0; bi < b; bi++)
        for (int h = 0; h < nh; h++) {
            head_gather(&hd, qkv + (size_t)bi * t * 3 * c, c, h);
            head_probs(&hd, lse + ((size_t)bi * nh + h) * t);
            head_out(&hd, out + (size_t)bi * t * c, c, h);
        }
    return 0;
}

/* The backward of one head from its recomputed probabilities: per query, the probabilities'
 * gradient (dout . v), dv, the softmax's backward, then dq and dk; the three into dqkv's
 * rows (overwritten). */
VECTORIZE static void head_backward(head_t *hd, const float *dout, float *dqkv, int c, int h)
{
    const int t = hd->t, hs = hd->hs;
    const size_t th = (size_t)t * hs;
    const float scale = (float)(1.0 / sqrt((double)hs));
    for (size_t i = 0; i < th; i++)
        hd->dq[i] = hd->dk[i] = hd->dv[i] = 0.0f;
    for (int qi = 0; qi < t; qi++) {
        const int n = qi + 1;
        const float *pr = hd->p + (size_t)qi * t, *g = dout + (size_t)qi * c + (size_t)h * hs;
        float *dp = hd->dp;
        for (int j = 0; j < n; j++)
            dp[j] = 0.0f;
        for (int i = 0; i < hs; i++) {
            const float a = g[i], *vr = hd->vt + (size_t)i * t;
            for (int j = 0; j < n; j++)
                dp[j] += a * vr[j];
        }
        for (int j = 0; j < n; j++) {
            const float a = pr[j];
            float *dvr = hd->dv + (size_t)j * hs;
            for (int i = 0; i < hs; i++)
                dvr[i] += a * g[i];
        }
        /* softmax: ds = p (dp - sum(p dp)), times the scores' scale */
        double dot = 0.0;
        for (int j = 0; j < n; j++)
            dot += (double)pr[j] * dp[j];
        const float d = (float)dot;
        for (int j = 0; j < n; j++)
            dp[j] = pr[j] * (dp[j] - d) * scale;
        const float *qr = hd->q + (size_t)qi * hs;
        float *dqr = hd->dq + (size_t)qi * hs;
        for (int j = 0; j < n; j++) {
            const float a = dp[j], *kr = hd->k + (size_t)j * hs;
            float *dkr = hd->dk + (size_t)j * hs;
            for (int i = 0; i < hs; i++) {
                dqr[i] += a * kr[i];
                dkr[i] += a * qr[i];
            }
        }
    }
    for (int j = 0; j < t; j++) {
        float *r = dqkv + (size_t)j * 3 * c + (size_t)h * hs;
        for (int i = 0; i < hs; i++) {
            r[i] = hd->dq[(size_t)j * hs + i];
            r[c + i] = hd->dk[(size_t)j * hs + i];
            r[2 * c + i] = hd->dv[(size_t)j * hs + i];
        }
    }
}

static int attention_backward(void *impl, int b, int t, int c, int nh, const float *dout,
                              const float *qkv, const float *out, const float *lse, float *dqkv,
                              mgpu_err_t *err)
{
    const int hs = c / nh;
    float *s = NULL;
    int rc = scratch(impl, head_floats(t, hs, 1), &s, err);
    if (rc < 0)
        return rc;
    head_t hd;
    head_init(&hd, s, t, hs, 1);
    for (int bi = 0; bi < b; bi++)
        for (int h = 0; h < nh; h++) {
            head_gather(&hd, qkv + (size_t)bi * t * 3 * c, c, h);
            head_probs(&hd, NULL);
            head_backward(&hd, dout + (size_t)bi * t * c, dqkv + (size_t)bi * t * 3 * c, c, h);
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
        const size_t cols = t[i].p16_cols > 0 ? (size_t)t[i].p16_cols : t[i].n;
        for (size_t j = 0; t[i].p16 != NULL && j < t[i].n; j++)
            t[i].p16[j / cols * t[i].p16_ld + j % cols] = mgpu_gpt_to_bf16(t[i].p[j]);
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
