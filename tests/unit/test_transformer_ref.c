/* test_transformer_ref.c - the GPT ops' C reference (kernels/transformer.c): each backward
 * against central finite differences of its forward, hand-computed values, and the optimizer's
 * parts. With --dump FILE it instead runs a tiny GPT (2 layers, 32 wide, 2 heads, context 16,
 * vocab 64) forward and backward, then one clipped AdamW step, and writes the weights, tokens,
 * loss, gradients and updated weights to FILE for tests/unit/transformer_ref_torch.py, which
 * recomputes them with PyTorch (tests/integration/test_transformer_ref.sh runs the pair). */
#include "check.h"
#include "transformer.h"

#include <math.h>   /* fabs, sqrt */
#include <stdint.h> /* uint64_t */
#include <stdio.h>  /* fopen, fwrite */
#include <stdlib.h> /* calloc, free */
#include <string.h> /* memcpy, strcmp */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

/* uniform in [-1, 1) */
static float urand(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

static float *rand_buf(size_t n, float scale, float offset)
{
    float *p = calloc(n, sizeof(float));
    for (size_t i = 0; i < n; i++)
        p[i] = offset + scale * urand();
    return p;
}

/* A finite-difference check: loss() runs the forward from the current inputs and returns a
 * scalar in double; the analytic gradient of that scalar with respect to x (n floats) is
 * grad. Each element's central difference with step h is compared with grad, relative to the
 * largest gradient of the tensor (fp32 forwards make the difference noisy near zero). */
typedef double (*loss_fn)(void *ctx);

static double fd_check(const char *what, float *x, size_t n, const float *grad, loss_fn loss,
                       void *ctx, float h)
{
    double gmax = 1e-12, worst = 0.0;
    size_t at = 0;

    for (size_t i = 0; i < n; i++)
        gmax = fabs(grad[i]) > gmax ? fabs(grad[i]) : gmax;
    for (size_t i = 0; i < n; i++) {
        float keep = x[i];
        x[i] = keep + h;
        double up = loss(ctx);
        x[i] = keep - h;
        double down = loss(ctx);
        x[i] = keep;
        double fd = (up - down) / (2.0 * h), err = fabs(fd - grad[i]) / gmax;
        if (err > worst) {
            worst = err;
            at = i;
        }
    }
    printf("  %-14s %6zu elements: largest difference %.2e of the largest gradient (at %zu)\n",
           what, n, worst, at);
    return worst;
}

/* sum(out * r) in double: the scalar whose gradient with respect to out is r */
static double dot_r(size_t n, const float *out, const float *r)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)out[i] * r[i];
    return s;
}

#define FD_TOL 2e-3 /* fp32 forwards, step 1e-2 or 1e-3: the difference's own noise is ~1e-4 */

typedef struct {
    int n, c;
    float *x, *w, *b, *y, *mean, *rstd, *r;
} ln_ctx;

static double ln_loss(void *p)
{
    ln_ctx *t = p;
    mgpu_gpt_layernorm_forward(t->n, t->c, t->x, t->w, t->b, t->y, t->mean, t->rstd);
    return dot_r((size_t)t->n * t->c, t->y, t->r);
}

static void test_layernorm_backward(void)
{
    ln_ctx t = {.n = 5, .c = 24};
    size_t nc = (size_t)t.n * t.c;
    t.x = rand_buf(nc, 2.0f, 0.5f);
    t.w = rand_buf(t.c, 0.5f, 1.0f);
    t.b = rand_buf(t.c, 0.5f, 0.0f);
    t.r = rand_buf(nc, 1.0f, 0.0f);
    t.y = calloc(nc, sizeof(float));
    t.mean = calloc(t.n, sizeof(float));
    t.rstd = calloc(t.n, sizeof(float));
    float *dx = calloc(nc, sizeof(float)), *dw = calloc(t.c, sizeof(float)),
          *db = calloc(t.c, sizeof(float));

    ln_loss(&t);
    /* each row's output has mean b and (biased) variance of w's spread: check row 0 by hand */
    double m = 0.0;
    for (int j = 0; j < t.c; j++)
        m += t.x[j];
    CHECK(fabs(t.mean[0] - m / t.c) < 1e-5);
    mgpu_gpt_layernorm_backward(t.n, t.c, t.r, t.x, t.w, t.mean, t.rstd, dx, dw, db);
    CHECK(fd_check("dx", t.x, nc, dx, ln_loss, &t, 1e-2f) < FD_TOL);
    CHECK(fd_check("dgamma", t.w, t.c, dw, ln_loss, &t, 1e-2f) < FD_TOL);
    CHECK(fd_check("dbeta", t.b, t.c, db, ln_loss, &t, 1e-2f) < FD_TOL);
}

typedef struct {
    size_t n;
    float *x, *y, *r;
} gelu_ctx;

static double gelu_loss(void *p)
{
    gelu_ctx *t = p;
    mgpu_gpt_gelu_forward(t->n, t->x, t->y);
    return dot_r(t->n, t->y, t->r);
}

static void test_gelu(void)
{
    gelu_ctx t = {.n = 301};
    t.x = rand_buf(t.n, 4.0f, 0.0f);
    t.r = rand_buf(t.n, 1.0f, 0.0f);
    t.y = calloc(t.n, sizeof(float));
    float *dx = calloc(t.n, sizeof(float));
    float v[3] = {0.0f, 1.0f, -2.0f}, gv[3];

    /* torch.nn.functional.gelu(torch.tensor([0., 1., -2.]), approximate="tanh") */
    mgpu_gpt_gelu_forward(3, v, gv);
    CHECK(gv[0] == 0.0f);
    CHECK(fabs(gv[1] - 0.8411920f) < 1e-6);
    CHECK(fabs(gv[2] - -0.0454023f) < 1e-6);
    gelu_loss(&t);
    mgpu_gpt_gelu_backward(t.n, t.x, t.r, dx);
    CHECK(fd_check("dx", t.x, t.n, dx, gelu_loss, &t, 1e-3f) < FD_TOL);
}

typedef struct {
    int n, c, oc;
    float *x, *w, *b, *y, *r;
} lin_ctx;

static double lin_loss(void *p)
{
    lin_ctx *t = p;
    mgpu_gpt_linear_forward(t->n, t->c, t->oc, t->x, t->w, t->b, t->y);
    return dot_r((size_t)t->n * t->oc, t->y, t->r);
}

static void test_linear(void)
{
    lin_ctx t = {.n = 6, .c = 7, .oc = 5};
    t.x = rand_buf((size_t)t.n * t.c, 1.0f, 0.0f);
    t.w = rand_buf((size_t)t.oc * t.c, 1.0f, 0.0f);
    t.b = rand_buf(t.oc, 1.0f, 0.0f);
    t.r = rand_buf((size_t)t.n * t.oc, 1.0f, 0.0f);
    t.y = calloc((size_t)t.n * t.oc, sizeof(float));
    float *dx = calloc((size_t)t.n * t.c, sizeof(float)),
          *dw = calloc((size_t)t.oc * t.c, sizeof(float)), *db = calloc(t.oc, sizeof(float));

    lin_loss(&t);
    double y01 = t.b[1];
    for (int j = 0; j < t.c; j++)
        y01 += (double)t.x[j] * t.w[t.c + j];
    CHECK(fabs(t.y[1] - y01) < 1e-5);
    mgpu_gpt_linear_backward(t.n, t.c, t.oc, t.r, t.x, t.w, dx, dw, db);
    CHECK(fd_check("dinp", t.x, (size_t)t.n * t.c, dx, lin_loss, &t, 1e-2f) < FD_TOL);
    CHECK(fd_check("dweight", t.w, (size_t)t.oc * t.c, dw, lin_loss, &t, 1e-2f) < FD_TOL);
    CHECK(fd_check("dbias", t.b, t.oc, db, lin_loss, &t, 1e-2f) < FD_TOL);
}

typedef struct {
    int b, t, c, nh;
    float *qkv, *pre, *att, *out, *r;
} att_ctx;

static double att_loss(void *p)
{
    att_ctx *a = p;
    mgpu_gpt_attention_forward(a->b, a->t, a->c, a->nh, a->qkv, a->pre, a->att, a->out);
    return dot_r((size_t)a->b * a->t * a->c, a->out, a->r);
}

static void test_attention(void)
{
    att_ctx a = {.b = 2, .t = 5, .c = 8, .nh = 2};
    size_t nqkv = (size_t)a.b * a.t * 3 * a.c, ntt = (size_t)a.b * a.nh * a.t * a.t;
    a.qkv = rand_buf(nqkv, 1.5f, 0.0f);
    a.r = rand_buf((size_t)a.b * a.t * a.c, 1.0f, 0.0f);
    a.pre = calloc(ntt, sizeof(float));
    a.att = calloc(ntt, sizeof(float));
    a.out = calloc((size_t)a.b * a.t * a.c, sizeof(float));
    float *datt = calloc(ntt, sizeof(float)), *dpre = calloc(ntt, sizeof(float)),
          *dqkv = calloc(nqkv, sizeof(float));

    att_loss(&a);
    /* causal: the first position attends to itself alone, so its output is its own v */
    for (int i = 0; i < a.c; i++)
        CHECK(fabs(a.out[i] - a.qkv[2 * a.c + i]) < 1e-6);
    /* each probability row sums to 1 over the positions up to the query */
    for (int q = 0; q < a.t; q++) {
        double s = 0.0;
        for (int k = 0; k <= q; k++)
            s += a.att[(size_t)q * a.t + k];
        CHECK(fabs(s - 1.0) < 1e-6);
    }
    mgpu_gpt_attention_backward(a.b, a.t, a.c, a.nh, a.r, a.qkv, a.att, datt, dpre, dqkv);
    CHECK(fd_check("dqkv", a.qkv, nqkv, dqkv, att_loss, &a, 1e-2f) < FD_TOL);
}

typedef struct {
    int b, t, c, v;
    int32_t *tok;
    float *wte, *wpe, *out, *r;
} emb_ctx;

static double emb_loss(void *p)
{
    emb_ctx *e = p;
    CHECK_INT(mgpu_gpt_embed_forward(e->b, e->t, e->c, e->v, e->tok, e->wte, e->wpe, e->out, NULL),
              0);
    return dot_r((size_t)e->b * e->t * e->c, e->out, e->r);
}

static void test_embedding(void)
{
    int32_t tok[6] = {3, 1, 3, 0, 3, 2}; /* a repeated token: its rows must add */
    emb_ctx e = {.b = 2, .t = 3, .c = 4, .v = 5, .tok = tok};
    size_t nout = (size_t)e.b * e.t * e.c;
    e.wte = rand_buf((size_t)e.v * e.c, 1.0f, 0.0f);
    e.wpe = rand_buf((size_t)e.t * e.c, 1.0f, 0.0f);
    e.r = rand_buf(nout, 1.0f, 0.0f);
    e.out = calloc(nout, sizeof(float));
    float *dwte = calloc((size_t)e.v * e.c, sizeof(float)),
          *dwpe = calloc((size_t)e.t * e.c, sizeof(float));
    mgpu_err_t err = {0};

    emb_loss(&e);
    CHECK(e.out[5 * e.c + 1] == e.wte[2 * e.c + 1] + e.wpe[2 * e.c + 1]);
    mgpu_gpt_embed_backward(e.b, e.t, e.c, tok, e.r, dwte, dwpe);
    /* the exact sums, in the order b then t */
    for (int j = 0; j < e.c; j++) {
        CHECK(dwte[4 * e.c + j] == 0.0f); /* token 4 never appears */
        CHECK(dwte[3 * e.c + j] == (e.r[0 * e.c + j] + e.r[2 * e.c + j]) + e.r[4 * e.c + j]);
        CHECK(dwpe[1 * e.c + j] == e.r[1 * e.c + j] + e.r[4 * e.c + j]);
    }
    CHECK(fd_check("dwte", e.wte, (size_t)e.v * e.c, dwte, emb_loss, &e, 1e-2f) < FD_TOL);
    CHECK(fd_check("dwpe", e.wpe, (size_t)e.t * e.c, dwpe, emb_loss, &e, 1e-2f) < FD_TOL);

    tok[4] = 5;
    CHECK(mgpu_gpt_embed_forward(e.b, e.t, e.c, e.v, tok, e.wte, e.wpe, e.out, &err) ==
          MGPU_E_RANGE);
    CHECK_CONTAINS(err.msg, "token 5 at batch row 1 position 1, expected 0..4");
}

static void test_residual(void)
{
    float a[3] = {1, 2, 3}, b[3] = {0.5f, -2, 4}, d[3] = {1, 1, 1};

    mgpu_gpt_residual_forward(3, a, b, a); /* in place, as the residual stream is */
    CHECK(a[0] == 1.5f && a[1] == 0.0f && a[2] == 7.0f);
    mgpu_gpt_accumulate(3, d, b);
    CHECK(d[0] == 1.5f && d[1] == -1.0f && d[2] == 5.0f);
}

typedef struct {
    int n, c, v;
    int32_t *tgt;
    float *x, *wte, *logits;
} head_ctx;

static double head_loss(void *p)
{
    head_ctx *h = p;
    float loss = 0.0f;
    CHECK_INT(mgpu_gpt_tied_head(h->n, h->c, h->v, h->x, h->wte, h->tgt, h->logits, &loss, NULL,
                                 NULL, NULL),
              0);
    return loss;
}

static void test_tied_head(void)
{
    int32_t tgt[4] = {0, 6, 2, 6};
    head_ctx h = {.n = 4, .c = 5, .v = 7, .tgt = tgt};
    h.x = rand_buf((size_t)h.n * h.c, 1.0f, 0.0f);
    h.wte = rand_buf((size_t)h.v * h.c, 1.0f, 0.0f);
    h.logits = calloc((size_t)h.n * h.v, sizeof(float));
    float *dx = calloc((size_t)h.n * h.c, sizeof(float)),
          *dwte = calloc((size_t)h.v * h.c, sizeof(float)), loss = 0.0f;
    mgpu_err_t err = {0};

    /* the mean over the positions, computed here from the logits in double */
    double want = 0.0;
    for (int i = 0; i < h.n; i++) {
        double z[7], mx = -1e30, s = 0.0;
        for (int k = 0; k < h.v; k++) {
            z[k] = 0.0;
            for (int j = 0; j < h.c; j++)
                z[k] += (double)h.x[i * h.c + j] * h.wte[k * h.c + j];
            mx = z[k] > mx ? z[k] : mx;
        }
        for (int k = 0; k < h.v; k++)
            s += exp(z[k] - mx);
        want += (mx + log(s) - z[tgt[i]]) / h.n;
    }
    CHECK_INT(mgpu_gpt_tied_head(h.n, h.c, h.v, h.x, h.wte, tgt, h.logits, &loss, dx, dwte, NULL),
              0);
    CHECK(fabs(loss - want) < 1e-5);
    CHECK(fd_check("dx", h.x, (size_t)h.n * h.c, dx, head_loss, &h, 1e-2f) < FD_TOL);
    CHECK(fd_check("dwte", h.wte, (size_t)h.v * h.c, dwte, head_loss, &h, 1e-2f) < FD_TOL);
    tgt[2] = 7;
    CHECK(mgpu_gpt_tied_head(h.n, h.c, h.v, h.x, h.wte, tgt, h.logits, &loss, dx, dwte, &err) ==
          MGPU_E_RANGE);
    CHECK_CONTAINS(err.msg, "label 7 in row 2, expected 0..6");
}

static void test_optimizer_parts(void)
{
    float g1[2] = {3, 0}, g2[1] = {4}, *g[2] = {g1, g2};
    size_t n[2] = {2, 1};
    mgpu_adamw_hparams_t hp = {
        .lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.5f};
    float p[2] = {1, 1}, gp[2] = {0, 0}, m[2] = {0}, v[2] = {0};

    CHECK(fabs(mgpu_gpt_grad_norm(2, g, n) - 5.0) < 1e-12);
    CHECK(mgpu_gpt_clip_grads(2, g, n, 5.0, 10.0f) == 1.0f); /* below the limit: untouched */
    CHECK(g1[0] == 3.0f);
    float s = mgpu_gpt_clip_grads(2, g, n, 5.0, 1.0f);
    CHECK(fabs(s - 1.0 / (5.0 + 1e-6)) < 1e-7);
    CHECK(fabs(g1[0] - 0.6f) < 1e-6 && fabs(g2[0] - 0.8f) < 1e-6);

    /* zero gradient: the decayed tensor shrinks by lr * wd, the other stays */
    mgpu_gpt_adamw_tensor(1, &p[0], &gp[0], &m[0], &v[0], &hp, 1, 1);
    mgpu_gpt_adamw_tensor(1, &p[1], &gp[1], &m[1], &v[1], &hp, 0, 1);
    CHECK(fabs(p[0] - 0.95f) < 1e-7);
    CHECK(p[1] == 1.0f);
    CHECK(mgpu_gpt_decays(2) && mgpu_gpt_decays(3) && !mgpu_gpt_decays(1));

    /* warm-up from lr/warmup, the peak, cosine's middle, lr_min at and after the end */
    CHECK(fabs(mgpu_gpt_lr(0, 10, 110, 1.0f, 0.1f) - 0.1f) < 1e-7);
    CHECK(fabs(mgpu_gpt_lr(9, 10, 110, 1.0f, 0.1f) - 1.0f) < 1e-7);
    CHECK(fabs(mgpu_gpt_lr(10, 10, 110, 1.0f, 0.1f) - 1.0f) < 1e-7);
    CHECK(fabs(mgpu_gpt_lr(60, 10, 110, 1.0f, 0.1f) - 0.55f) < 1e-6);
    CHECK(fabs(mgpu_gpt_lr(110, 10, 110, 1.0f, 0.1f) - 0.1f) < 1e-7);
    CHECK(fabs(mgpu_gpt_lr(500, 10, 110, 1.0f, 0.1f) - 0.1f) < 1e-7);
    CHECK(fabs(mgpu_gpt_lr(0, 0, 100, 1.0f, 0.0f) - 1.0f) < 1e-7); /* no warm-up */
}

/* The tiny GPT: GPT-2's layout (pre-LayerNorm blocks, 4x MLP, final LayerNorm, output layer
 * tied to the token embedding), composed from the ops the way the trainer will. Parameters in
 * one buffer, in the order transformer_ref_torch.py reads them. */
enum { GB = 2, GT = 16, GC = 32, GNH = 2, GV = 64, GL = 2 };
enum {
    P_LN1W,
    P_LN1B,
    P_QKVW,
    P_QKVB,
    P_PROJW,
    P_PROJB,
    P_LN2W,
    P_LN2B,
    P_FCW,
    P_FCB,
    P_FCPW,
    P_FCPB,
    P_PER_LAYER
};
#define G_NT (2 + GL * P_PER_LAYER + 2) /* wte, wpe, the layers', lnf w and b */

typedef struct {
    float *t[G_NT]; /* into buf */
    size_t n[G_NT];
    int ndim[G_NT];
    float *buf;
    size_t total;
} gpt_params;

static void gpt_params_init(gpt_params *p)
{
    static const int layer_rows[P_PER_LAYER] = {1, 1, 3 * GC, 1, GC, 1, 1, 1, 4 * GC, 1, GC, 1};
    static const int layer_cols[P_PER_LAYER] = {GC, GC, GC, 3 * GC, GC,     GC,
                                                GC, GC, GC, 4 * GC, 4 * GC, GC};
    int k = 0;

    p->n[k] = (size_t)GV * GC, p->ndim[k++] = 2;
    p->n[k] = (size_t)GT * GC, p->ndim[k++] = 2;
    for (int l = 0; l < GL; l++)
        for (int i = 0; i < P_PER_LAYER; i++, k++) {
            p->n[k] = (size_t)layer_rows[i] * layer_cols[i];
            p->ndim[k] = layer_rows[i] > 1 ? 2 : 1;
        }
    p->n[k] = GC, p->ndim[k++] = 1;
    p->n[k] = GC, p->ndim[k++] = 1;
    p->total = 0;
    for (k = 0; k < G_NT; k++)
        p->total += p->n[k];
    p->buf = calloc(p->total, sizeof(float));
    float *q = p->buf;
    for (k = 0; k < G_NT; k++) {
        p->t[k] = q;
        q += p->n[k];
    }
}

#define LP(p, l, i) ((p)->t[2 + (l)*P_PER_LAYER + (i)])

typedef struct { /* the activations one backward needs, per layer where it says so */
    float res[GL + 1][GB * GT * GC]; /* the residual stream entering each layer, and leaving */
    float ln1[GL][GB * GT * GC], ln1_mean[GL][GB * GT], ln1_rstd[GL][GB * GT];
    float qkv[GL][GB * GT * 3 * GC], att[GL][GB * GNH * GT * GT], atty[GL][GB * GT * GC];
    float res2[GL][GB * GT * GC]; /* after the attention's residual add */
    float ln2[GL][GB * GT * GC], ln2_mean[GL][GB * GT], ln2_rstd[GL][GB * GT];
    float fch[GL][GB * GT * 4 * GC], gelu[GL][GB * GT * 4 * GC];
    float lnf[GB * GT * GC], lnf_mean[GB * GT], lnf_rstd[GB * GT];
    float tmp[GB * GT * 4 * GC], pre[GB * GNH * GT * GT], dpre[GB * GNH * GT * GT];
    float logits[GB * GT * GV];
    float d_res[GB * GT * GC], d_a[GB * GT * 4 * GC], d_b[GB * GT * 4 * GC];
    float d_qkv[GB * GT * 3 * GC];
} gpt_acts;

/* forward, and the backward into g (zeroed here) when g is not NULL; the loss */
static double gpt_run(const gpt_params *p, const int32_t *tok, const int32_t *tgt, gpt_acts *a,
                      gpt_params *g)
{
    const int n = GB * GT;
    const size_t nc = (size_t)n * GC;
    float loss = 0.0f;

    CHECK_INT(mgpu_gpt_embed_forward(GB, GT, GC, GV, tok, p->t[0], p->t[1], a->res[0], NULL), 0);
    for (int l = 0; l < GL; l++) {
        mgpu_gpt_layernorm_forward(n, GC, a->res[l], LP(p, l, P_LN1W), LP(p, l, P_LN1B), a->ln1[l],
                                   a->ln1_mean[l], a->ln1_rstd[l]);
        mgpu_gpt_linear_forward(n, GC, 3 * GC, a->ln1[l], LP(p, l, P_QKVW), LP(p, l, P_QKVB),
                                a->qkv[l]);
        mgpu_gpt_attention_forward(GB, GT, GC, GNH, a->qkv[l], a->pre, a->att[l], a->atty[l]);
        mgpu_gpt_linear_forward(n, GC, GC, a->atty[l], LP(p, l, P_PROJW), LP(p, l, P_PROJB),
                                a->tmp);
        mgpu_gpt_residual_forward(nc, a->res[l], a->tmp, a->res2[l]);
        mgpu_gpt_layernorm_forward(n, GC, a->res2[l], LP(p, l, P_LN2W), LP(p, l, P_LN2B), a->ln2[l],
                                   a->ln2_mean[l], a->ln2_rstd[l]);
        mgpu_gpt_linear_forward(n, GC, 4 * GC, a->ln2[l], LP(p, l, P_FCW), LP(p, l, P_FCB),
                                a->fch[l]);
        mgpu_gpt_gelu_forward(nc * 4, a->fch[l], a->gelu[l]);
        mgpu_gpt_linear_forward(n, 4 * GC, GC, a->gelu[l], LP(p, l, P_FCPW), LP(p, l, P_FCPB),
                                a->tmp);
        mgpu_gpt_residual_forward(nc, a->res2[l], a->tmp, a->res[l + 1]);
    }
    mgpu_gpt_layernorm_forward(n, GC, a->res[GL], p->t[G_NT - 2], p->t[G_NT - 1], a->lnf,
                               a->lnf_mean, a->lnf_rstd);
    if (g == NULL) {
        CHECK_INT(
            mgpu_gpt_tied_head(n, GC, GV, a->lnf, p->t[0], tgt, a->logits, &loss, NULL, NULL, NULL),
            0);
        return loss;
    }

    memset(g->buf, 0, g->total * sizeof(float));
    memset(a->d_a, 0, sizeof(a->d_a));
    CHECK_INT(mgpu_gpt_tied_head(n, GC, GV, a->lnf, p->t[0], tgt, a->logits, &loss, a->d_a, g->t[0],
                                 NULL),
              0);
    memset(a->d_res, 0, sizeof(a->d_res));
    mgpu_gpt_layernorm_backward(n, GC, a->d_a, a->res[GL], p->t[G_NT - 2], a->lnf_mean, a->lnf_rstd,
                                a->d_res, g->t[G_NT - 2], g->t[G_NT - 1]);
    /* d_res is the residual stream's gradient: each branch adds its input gradient into it */
    for (int l = GL - 1; l >= 0; l--) {
        memset(a->d_a, 0, sizeof(a->d_a));
        memset(a->d_b, 0, sizeof(a->d_b));
        mgpu_gpt_linear_backward(n, 4 * GC, GC, a->d_res, a->gelu[l], LP(p, l, P_FCPW), a->d_a,
                                 LP(g, l, P_FCPW), LP(g, l, P_FCPB));
        mgpu_gpt_gelu_backward(nc * 4, a->fch[l], a->d_a, a->d_b);
        memset(a->d_a, 0, sizeof(a->d_a));
        mgpu_gpt_linear_backward(n, GC, 4 * GC, a->d_b, a->ln2[l], LP(p, l, P_FCW), a->d_a,
                                 LP(g, l, P_FCW), LP(g, l, P_FCB));
        mgpu_gpt_layernorm_backward(n, GC, a->d_a, a->res2[l], LP(p, l, P_LN2W), a->ln2_mean[l],
                                    a->ln2_rstd[l], a->d_res, LP(g, l, P_LN2W), LP(g, l, P_LN2B));
        memset(a->d_a, 0, sizeof(a->d_a));
        mgpu_gpt_linear_backward(n, GC, GC, a->d_res, a->atty[l], LP(p, l, P_PROJW), a->d_a,
                                 LP(g, l, P_PROJW), LP(g, l, P_PROJB));
        memset(a->d_qkv, 0, sizeof(a->d_qkv));
        mgpu_gpt_attention_backward(GB, GT, GC, GNH, a->d_a, a->qkv[l], a->att[l], a->d_b, a->dpre,
                                    a->d_qkv);
        memset(a->d_a, 0, sizeof(a->d_a));
        mgpu_gpt_linear_backward(n, GC, 3 * GC, a->d_qkv, a->ln1[l], LP(p, l, P_QKVW), a->d_a,
                                 LP(g, l, P_QKVW), LP(g, l, P_QKVB));
        mgpu_gpt_layernorm_backward(n, GC, a->d_a, a->res[l], LP(p, l, P_LN1W), a->ln1_mean[l],
                                    a->ln1_rstd[l], a->d_res, LP(g, l, P_LN1W), LP(g, l, P_LN1B));
    }
    mgpu_gpt_embed_backward(GB, GT, GC, tok, a->d_res, g->t[0], g->t[1]);
    return loss;
}

/* Weights as GPT-2 starts them but wider (normal-like 0.02 gives gradients too small to
 * test well), LayerNorm gains near 1, and random tokens and targets. */
static void gpt_setup(gpt_params *p, gpt_params *g, int32_t *tok, int32_t *tgt)
{
    gpt_params_init(p);
    gpt_params_init(g);
    for (int k = 0; k < G_NT; k++) {
        int gain = k >= 2 && k < G_NT - 2
                       ? ((k - 2) % P_PER_LAYER == P_LN1W || (k - 2) % P_PER_LAYER == P_LN2W)
                       : k == G_NT - 2;
        for (size_t i = 0; i < p->n[k]; i++)
            p->t[k][i] = gain ? 1.0f + 0.1f * urand() : 0.2f * urand();
    }
    for (int i = 0; i < GB * GT; i++) {
        tok[i] = (int32_t)((urand() + 1.0f) * 0.5f * GV) % GV;
        tgt[i] = (int32_t)((urand() + 1.0f) * 0.5f * GV) % GV;
    }
}

typedef struct {
    gpt_params *p;
    const int32_t *tok, *tgt;
    gpt_acts *a;
} gpt_ctx;

static double gpt_loss(void *c)
{
    gpt_ctx *x = c;
    return gpt_run(x->p, x->tok, x->tgt, x->a, NULL);
}

/* The composition's gradients, a sample of each tensor's elements against finite differences
 * of the whole model's loss. */
static void test_tiny_gpt_backward(void)
{
    gpt_params p, g;
    int32_t tok[GB * GT], tgt[GB * GT];
    gpt_acts *a = calloc(1, sizeof(*a));
    gpt_ctx ctx = {&p, tok, tgt, a};

    gpt_setup(&p, &g, tok, tgt);
    double loss = gpt_run(&p, tok, tgt, a, &g);
    CHECK(loss > 3.0 && loss < 6.0); /* about log(64) = 4.16 from random weights */
    for (int k = 0; k < G_NT; k++) {
        double gmax = 1e-12, worst = 0.0;
        for (size_t i = 0; i < p.n[k]; i++)
            gmax = fabs(g.t[k][i]) > gmax ? fabs(g.t[k][i]) : gmax;
        for (size_t s = 0; s < 6; s++) {
            size_t i = (s * 7919 + 13) % p.n[k];
            float keep = p.t[k][i], h = 1e-2f;
            p.t[k][i] = keep + h;
            double up = gpt_loss(&ctx);
            p.t[k][i] = keep - h;
            double down = gpt_loss(&ctx);
            p.t[k][i] = keep;
            double err = fabs((up - down) / (2.0 * h) - g.t[k][i]) / gmax;
            worst = err > worst ? err : worst;
        }
        if (worst > 2e-2)
            printf("  tensor %d: largest difference %.2e of its largest gradient\n", k, worst);
        CHECK(worst < 2e-2);
    }
}

static int dump_floats(FILE *f, const float *x, size_t n)
{
    return fwrite(x, sizeof(float), n, f) == n ? 0 : -1;
}

/* The file transformer_ref_torch.py reads, in native (little-endian) order:
 * "GPTREF1\0"; int32 B, T, C, NH, V, L; the parameters (wte, wpe, per layer ln1 w b, qkv w b,
 * attention projection w b, ln2 w b, fc w b, fc projection w b; lnf w b; weights (out, in));
 * int32 tokens and targets (B*T each); float32 loss; the gradients in the parameters' order;
 * float32 lr, beta1, beta2, eps, weight_decay, max_norm, the gradients' norm; int32 AdamW's
 * step; the parameters after clipping and that AdamW step. */
static int gpt_tiny_dump(const char *path)
{
    gpt_params p, g;
    int32_t tok[GB * GT], tgt[GB * GT], dims[6] = {GB, GT, GC, GNH, GV, GL}, step = 1;
    gpt_acts *a = calloc(1, sizeof(*a));
    FILE *f = fopen(path, "wb");

    if (f == NULL) {
        perror(path);
        return 1;
    }
    gpt_setup(&p, &g, tok, tgt);
    float loss = (float)gpt_run(&p, tok, tgt, a, &g);
    /* warm-up 2, 10 steps to lr_min 1e-3: step 5 is on the cosine */
    float lr = mgpu_gpt_lr(5, 2, 10, 1e-2f, 1e-3f);
    mgpu_adamw_hparams_t hp = {
        .lr = lr, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
    float max_norm = 0.5f;
    double norm = mgpu_gpt_grad_norm(G_NT, g.t, g.n);
    int rc = fwrite("GPTREF1", 1, 8, f) == 8 ? 0 : -1;
    rc |= fwrite(dims, sizeof(int32_t), 6, f) == 6 ? 0 : -1;
    rc |= dump_floats(f, p.buf, p.total);
    rc |= fwrite(tok, sizeof(int32_t), GB * GT, f) == GB * GT ? 0 : -1;
    rc |= fwrite(tgt, sizeof(int32_t), GB * GT, f) == GB * GT ? 0 : -1;
    rc |= dump_floats(f, &loss, 1);
    rc |= dump_floats(f, g.buf, g.total);

    float *m = calloc(p.total, sizeof(float)), *v = calloc(p.total, sizeof(float));
    mgpu_gpt_clip_grads(G_NT, g.t, g.n, norm, max_norm);
    for (int k = 0; k < G_NT; k++) {
        size_t off = (size_t)(p.t[k] - p.buf);
        mgpu_gpt_adamw_tensor(p.n[k], p.t[k], g.t[k], m + off, v + off, &hp,
                              mgpu_gpt_decays(p.ndim[k]), step);
    }
    float hps[7] = {lr, hp.beta1, hp.beta2, hp.eps, hp.weight_decay, max_norm, (float)norm};
    rc |= dump_floats(f, hps, 7);
    rc |= fwrite(&step, sizeof(int32_t), 1, f) == 1 ? 0 : -1;
    rc |= dump_floats(f, p.buf, p.total);
    rc |= fclose(f);
    free(m);
    free(v);
    free(a);
    free(p.buf);
    free(g.buf);
    if (rc != 0) {
        perror(path);
        return 1;
    }
    if (check_failed) { /* a forward or backward call refused its input: the file is no use */
        fprintf(stderr, "%s: the model's calls failed %d check(s)\n", path, check_failed);
        return 1;
    }
    printf("wrote %s: loss %.6f, %zu parameters\n", path, loss, p.total);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--dump") == 0)
        return gpt_tiny_dump(argv[2]);
    RUN(test_layernorm_backward);
    RUN(test_gelu);
    RUN(test_linear);
    RUN(test_attention);
    RUN(test_embedding);
    RUN(test_residual);
    RUN(test_tied_head);
    RUN(test_optimizer_parts);
    RUN(test_tiny_gpt_backward);
    return check_done();
}
