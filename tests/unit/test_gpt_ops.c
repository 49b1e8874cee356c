/* test_gpt_ops.c - the GPT ops' launchers (kernels/gpt_ops.c) on the CPU table
 * (kernels/gpt_cpu.c): each against transformer.h's reference under the table's conventions
 * (activation gradients overwritten, the loss accumulated with a scale, lse kept instead of
 * the probabilities), and the launchers' argument errors. */
#include "check.h"
#include "gpt_ops.h"
#include "transformer.h"

#include <math.h>   /* fabs, exp, log */
#include <stdint.h> /* uint64_t */
#include <stdlib.h> /* calloc, free */
#include <string.h> /* memcpy */

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static float urand(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

static float *rnd(size_t n)
{
    float *p = calloc(n, sizeof(float));
    for (size_t i = 0; i < n; i++)
        p[i] = urand();
    return p;
}

static float *zeros(size_t n)
{
    return calloc(n, sizeof(float));
}

static float *copy(const float *a, size_t n)
{
    float *p = calloc(n, sizeof(float));
    memcpy(p, a, sizeof(float) * n);
    return p;
}

/* Largest |a - b| over the largest |b| (1 when b is all zero). */
static double rel(const float *a, const float *b, size_t n)
{
    double d = 0, m = 1e-30;
    for (size_t i = 0; i < n; i++) {
        d = fabs((double)a[i] - b[i]) > d ? fabs((double)a[i] - b[i]) : d;
        m = fabs((double)b[i]) > m ? fabs((double)b[i]) : m;
    }
    return d / m;
}

static mgpu_kernels_t *cpu(void)
{
    mgpu_kernels_t *k = NULL;
    mgpu_err_t err = {0};
    if (mgpu_kernels_create(MGPU_KBACKEND_CPU, -1, &k, &err) < 0)
        printf("  %s\n", err.msg);
    return k;
}

static void test_layernorm_matches_reference(void)
{
    mgpu_kernels_t *k = cpu();
    mgpu_err_t err = {0};
    int n = 6, c = 40;
    float *x = rnd(n * c), *w = rnd(c), *b = rnd(c), *dy = rnd(n * c);
    float *y = zeros(n * c), *m = zeros(n), *r = zeros(n), *y0 = zeros(n * c), *m0 = zeros(n),
          *r0 = zeros(n);
    CHECK_INT(mgpu_kg_layernorm_forward(k, n, c, x, w, b, y, m, r, &err), 0);
    mgpu_gpt_layernorm_forward(n, c, x, w, b, y0, m0, r0);
    CHECK(rel(y, y0, n * c) == 0 && rel(m, m0, n) == 0 && rel(r, r0, n) == 0);
    /* Gradients add: start from the same non-zero values. */
    float *dx = rnd(n * c), *dw = rnd(c), *db = rnd(c);
    float *dx0 = copy(dx, n * c), *dw0 = copy(dw, c), *db0 = copy(db, c);
    CHECK_INT(mgpu_kg_layernorm_backward(k, n, c, dy, x, w, m, r, dx, dw, db, &err), 0);
    mgpu_gpt_layernorm_backward(n, c, dy, x, w, m0, r0, dx0, dw0, db0);
    CHECK(rel(dx, dx0, n * c) == 0 && rel(dw, dw0, c) == 0 && rel(db, db0, c) == 0);
    mgpu_kernels_destroy(k);
}

/* Largest |a - b| / (|b| + |s| / 10) element by element: 1e-6 of it is 1e-6 of each value,
 * or 1e-7 of s where the value is far smaller than s. */
static double rel_each(const float *a, const float *b, const float *s, size_t n)
{
    double w = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]) / (fabs((double)b[i]) + 0.1 * fabs((double)s[i]));
        w = d > w ? d : w;
    }
    return w;
}

/* The table's fp32 GELU against the reference's double one, element by element, over the
 * whole range: both tails (where tanh is +-1 in fp32 and the exponential is clamped), zero,
 * tiny and ordinary inputs; a NaN stays NaN. In the negative tail GELU is x e^{2u}, far below
 * x, and fp32's rounding of u alone moves it by |2u| ulp: there the bound is 1e-7 of x (of
 * dy for the gradient), as PyTorch's fp32 GELU, whose 1 + tanh u cancels, does not meet. */
static void test_gelu_overwrites_and_may_alias(void)
{
    mgpu_kernels_t *k = cpu();
    mgpu_err_t err = {0};
    size_t n = 3000; /* more than one of the old chunks of 1024 */
    float *x = rnd(n), *dy = rnd(n), *y = zeros(n), *y0 = zeros(n), *dx = rnd(n), *dx0 = zeros(n);
    static const float special[] = {0.0f,   -0.0f, 1e-20f, -1e-20f, 1e-4f,  -1e-4f,
                                    -3.0f,  3.0f,  -9.0f,  9.0f,    -30.0f, 30.0f,
                                    -88.0f, 88.0f, -1e4f,  1e4f,    NAN};
    const size_t ns = sizeof special / sizeof special[0];
    for (size_t i = 0; i < n; i++)
        x[i] = i < ns ? special[i] : 8.0f * x[i];
    CHECK_INT(mgpu_kg_gelu_forward(k, n, x, y, &err), 0);
    mgpu_gpt_gelu_forward(n, x, y0);
    CHECK(isnan(y[ns - 1]));
    CHECK_INT(mgpu_kg_gelu_backward(k, n, x, dy, dx, &err), 0);
    CHECK(isnan(dx[ns - 1]));
    x[ns - 1] = 0.5f; /* the NaN checked: the rest compares numbers */
    CHECK_INT(mgpu_kg_gelu_forward(k, n, x, y, &err), 0);
    mgpu_gpt_gelu_forward(n, x, y0);
    double e = rel_each(y, y0, x, n);
    printf("  gelu forward: %.2g\n", e);
    CHECK(e < 1e-6);
    CHECK_INT(mgpu_kg_gelu_backward(k, n, x, dy, dx, &err), 0); /* dx held garbage */
    mgpu_gpt_gelu_backward(n, x, dy, dx0);
    e = rel_each(dx, dx0, dy, n);
    printf("  gelu backward: %.2g\n", e);
    CHECK(e < 1e-6);
    float *dy2 = copy(dy, n);
    CHECK_INT(mgpu_kg_gelu_backward(k, n, x, dy2, dy2, &err), 0); /* in place */
    CHECK(rel(dy2, dx, n) == 0);
    mgpu_kernels_destroy(k);
}

static void test_attention_matches_reference(void)
{
    mgpu_kernels_t *k = cpu();
    mgpu_err_t err = {0};
    int b = 3, t = 7, c = 12, nh = 3;
    size_t nq = (size_t)b * t * 3 * c, no = (size_t)b * t * c, tt = (size_t)b * nh * t * t;
    float *qkv = rnd(nq), *dout = rnd(no), *out = zeros(no), *lse = zeros((size_t)b * nh * t);
    float *pre = zeros(tt), *att = zeros(tt), *out0 = zeros(no), *da = zeros(tt), *dp = zeros(tt);
    float *dqkv = rnd(nq), *dqkv0 = zeros(nq);
    CHECK_INT(mgpu_kg_attention_forward(k, b, t, c, nh, qkv, out, lse, &err), 0);
    mgpu_gpt_attention_forward(b, t, c, nh, qkv, pre, att, out0);
    printf("  attention forward: %.2g of the largest\n", rel(out, out0, no));
    CHECK(rel(out, out0, no) < 1e-6);
    double worst = 0;
    for (int r = 0; r < b * nh; r++)
        for (int q = 0; q < t; q++) {
            /* exp(pre - lse) is the probability: check it against the reference's */
            for (int j = 0; j <= q; j++) {
                size_t i = ((size_t)r * t + q) * t + j;
                double p = exp((double)pre[i] - lse[(size_t)r * t + q]);
                worst = fabs(p - att[i]) > worst ? fabs(p - att[i]) : worst;
            }
        }
    CHECK(worst < 1e-6);
    CHECK_INT(mgpu_kg_attention_backward(k, b, t, c, nh, dout, qkv, out, lse, dqkv, &err), 0);
    mgpu_gpt_attention_backward(b, t, c, nh, dout, qkv, att, da, dp, dqkv0);
    printf("  attention backward: %.2g of the largest\n", rel(dqkv, dqkv0, nq));
    CHECK(rel(dqkv, dqkv0, nq) < 1e-6);
    /* A second, larger shape grows the scratch: heads 37 wide, 70 long (the vector loops'
     * remainders), against the reference too. */
    int t2 = 70, c2 = 2 * 37, b2 = 2, nh2 = 2;
    size_t nq2 = (size_t)b2 * t2 * 3 * c2, no2 = (size_t)b2 * t2 * c2;
    size_t tt2 = (size_t)b2 * nh2 * t2 * t2;
    float *q2 = rnd(nq2), *o2 = zeros(no2), *l2 = zeros((size_t)b2 * nh2 * t2);
    float *g2 = rnd(no2), *d2 = zeros(nq2), *o20 = zeros(no2), *d20 = zeros(nq2);
    float *pre2 = zeros(tt2), *att2 = zeros(tt2), *da2 = zeros(tt2), *dp2 = zeros(tt2);
    CHECK_INT(mgpu_kg_attention_forward(k, b2, t2, c2, nh2, q2, o2, l2, &err), 0);
    CHECK_INT(mgpu_kg_attention_backward(k, b2, t2, c2, nh2, g2, q2, o2, l2, d2, &err), 0);
    mgpu_gpt_attention_forward(b2, t2, c2, nh2, q2, pre2, att2, o20);
    mgpu_gpt_attention_backward(b2, t2, c2, nh2, g2, q2, att2, da2, dp2, d20);
    printf("  attention 70 x 37: forward %.2g, backward %.2g of the largest\n", rel(o2, o20, no2),
           rel(d2, d20, nq2));
    CHECK(rel(o2, o20, no2) < 1e-6);
    CHECK(rel(d2, d20, nq2) < 1e-6);
    mgpu_kernels_destroy(k);
}

static void test_embed_and_add(void)
{
    mgpu_kernels_t *k = cpu();
    mgpu_err_t err = {0};
    int b = 2, t = 5, c = 8, v = 11;
    int32_t tok[10] = {1, 3, 3, 10, 0, 7, 1, 1, 2, 9};
    float *wte = rnd((size_t)v * c), *wpe = rnd((size_t)t * c), *out = zeros((size_t)b * t * c);
    float *out0 = zeros((size_t)b * t * c);
    CHECK_INT(mgpu_kg_embed_forward(k, b, t, c, tok, wte, wpe, out, &err), 0);
    CHECK_INT(mgpu_gpt_embed_forward(b, t, c, v, tok, wte, wpe, out0, &err), 0);
    CHECK(rel(out, out0, (size_t)b * t * c) == 0);
    float *dwte = rnd((size_t)v * c), *dwpe = rnd((size_t)t * c);
    float *dwte0 = copy(dwte, (size_t)v * c), *dwpe0 = copy(dwpe, (size_t)t * c);
    CHECK_INT(mgpu_kg_embed_backward(k, b, t, c, v, tok, out, dwte, dwpe, &err), 0);
    mgpu_gpt_embed_backward(b, t, c, tok, out, dwte0, dwpe0);
    CHECK(rel(dwte, dwte0, (size_t)v * c) == 0 && rel(dwpe, dwpe0, (size_t)t * c) == 0);
    float *s = zeros((size_t)b * t * c);
    CHECK_INT(mgpu_kg_add(k, (size_t)b * t * c, out, wte, s, &err), 0);
    CHECK(fabs(s[3] - (out[3] + wte[3])) < 1e-7);
    mgpu_kernels_destroy(k);
}

/* The head over a batch cut in two chunks with scale 1/n equals the reference's mean. */
static void test_tied_head_chunks_match_reference(void)
{
    mgpu_kernels_t *k = cpu();
    mgpu_err_t err = {0};
    int n = 10, c = 16, v = 37, h = 4;
    int32_t tgt[10] = {0, 36, 5, 5, 12, 1, 30, 2, 8, 19};
    float *x = rnd((size_t)n * c), *wte = rnd((size_t)v * c), *logits = zeros((size_t)n * v);
    float *dx = rnd((size_t)n * c), *dwte = rnd((size_t)v * c);
    float *dx0 = copy(dx, (size_t)n * c), *dwte0 = copy(dwte, (size_t)v * c);
    float loss = 0, loss0 = 0;
    CHECK_INT(mgpu_kg_tied_head(k, h, c, v, x, wte, tgt, 1.0f / n, logits, &loss, dx, dwte, &err),
              0);
    CHECK_INT(mgpu_kg_tied_head(k, n - h, c, v, x + (size_t)h * c, wte, tgt + h, 1.0f / n, logits,
                                &loss, dx + (size_t)h * c, dwte, &err),
              0);
    float *l0 = zeros((size_t)n * v);
    CHECK_INT(mgpu_gpt_tied_head(n, c, v, x, wte, tgt, l0, &loss0, dx0, dwte0, &err), 0);
    CHECK(fabs(loss - loss0) < 1e-5 * fabs(loss0));
    CHECK(rel(dx, dx0, (size_t)n * c) < 1e-5);
    CHECK(rel(dwte, dwte0, (size_t)v * c) < 1e-5);
    /* Without dx: the loss alone. */
    float l2 = 0;
    CHECK_INT(mgpu_kg_tied_head(k, n, c, v, x, wte, tgt, 1.0f / n, logits, &l2, NULL, NULL, &err),
              0);
    CHECK(fabs(l2 - loss0) < 1e-5 * fabs(loss0));
    mgpu_kernels_destroy(k);
}

static void test_clip_and_adamw_match_reference(void)
{
    mgpu_kernels_t *k = cpu();
    mgpu_err_t err = {0};
    size_t n = 2500;
    float *p = rnd(n), *g = rnd(n), *m = zeros(n), *v = zeros(n);
    float *p0 = copy(p, n), *g0 = copy(g, n), *m0 = zeros(n), *v0 = zeros(n);
    float ss = 0, f = 0;
    CHECK_INT(mgpu_kg_sumsq(k, n, g, &ss, &err), 0);
    float *gs[1] = {g0};
    size_t ns[1] = {n};
    double norm = mgpu_gpt_grad_norm(1, gs, ns);
    CHECK(fabs(sqrt(ss) - norm) < 1e-5 * norm);
    CHECK_INT(mgpu_kg_clip_factor(k, &ss, 1.0f, &f, &err), 0);
    float f0 = mgpu_gpt_clip_grads(1, gs, ns, norm, 1.0f);
    CHECK(fabs(f - f0) < 1e-6 * f0 && f < 1);
    float big = 0;
    CHECK_INT(mgpu_kg_clip_factor(k, &ss, 1e9f, &big, &err), 0);
    CHECK(big == 1.0f);
    CHECK_INT(mgpu_kg_clip_factor(k, &ss, 0.0f, &big, &err), 0);
    CHECK(big == 1.0f);
    mgpu_adamw_hparams_t hp = {
        .lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
    for (int s = 1; s <= 3; s++) {
        CHECK_INT(mgpu_kg_adamw(k, n, p, g, m, v, &hp, s, &f, &err), 0);
        mgpu_gpt_adamw_tensor(n, p0, g0, m0, v0, &hp, 1, s); /* g0 is already clipped */
    }
    CHECK(rel(p, p0, n) < 1e-6);
    mgpu_kernels_destroy(k);
}

/* adamw_multi over tensors laid out as a model's (some contiguous, one empty, one apart, decay
 * flags mixed) gives exactly the per-tensor adamw's bits at now's lr and step, with and
 * without the clip factor. */
static void test_adamw_multi_matches_per_tensor(void)
{
    mgpu_kernels_t *k = cpu();
    mgpu_err_t err = {0};
    enum { NT = 6 };
    const size_t sizes[NT] = {96, 7, 0, 1030, 5, 300};
    const int decays[NT] = {1, 0, 1, 1, 0, 1};
    size_t total = 0;
    for (int i = 0; i < NT; i++)
        total += sizes[i];
    total += 3; /* the last tensor lies 3 floats apart from the others */
    for (int with_factor = 0; with_factor < 2; with_factor++) {
        float *p = rnd(total), *g = rnd(total), *m = zeros(total), *v = zeros(total);
        float *p1 = copy(p, total), *m1 = zeros(total), *v1 = zeros(total);
        float factor = 0.375f;
        mgpu_gpt_adamw_tensor_t t[NT];
        size_t off = 0;
        for (int i = 0; i < NT; i++) {
            if (i == NT - 1)
                off += 3;
            t[i] = (mgpu_gpt_adamw_tensor_t){.p = p + off,
                                             .g = g + off,
                                             .m = m + off,
                                             .v = v + off,
                                             .n = sizes[i],
                                             .decay = decays[i]};
            off += sizes[i];
        }
        mgpu_adamw_hparams_t hp = {
            .lr = 0, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
        for (long long s = 1; s <= 3; s++) {
            mgpu_adamw_hparams_t h = hp;
            h.lr = 1e-2f / (float)s; /* a schedule: each step its own lr */
            mgpu_gpt_adamw_now_t now;
            mgpu_kg_adamw_now(&h, s, &now);
            CHECK(now.step == s && now.lr == h.lr);
            /* hp's own lr is not read: now's is. */
            CHECK_INT(mgpu_kg_adamw_multi(k, NT, t, &hp, &now, with_factor ? &factor : NULL, &err),
                      0);
            off = 0;
            for (int i = 0; i < NT; i++) {
                mgpu_adamw_hparams_t hi = h;
                if (i == NT - 1)
                    off += 3;
                if (!decays[i])
                    hi.weight_decay = 0.0f;
                if (sizes[i] > 0)
                    CHECK_INT(mgpu_kg_adamw(k, sizes[i], p1 + off, g + off, m1 + off, v1 + off, &hi,
                                            s, with_factor ? &factor : NULL, &err),
                              0);
                off += sizes[i];
            }
        }
        CHECK(memcmp(p, p1, sizeof(float) * total) == 0);
        CHECK(memcmp(m, m1, sizeof(float) * total) == 0);
        CHECK(memcmp(v, v1, sizeof(float) * total) == 0);
        /* The gap between the tensors is nobody's: untouched. */
        CHECK(m[total - sizes[NT - 1] - 1] == 0.0f && m[total - sizes[NT - 1] - 3] == 0.0f);
        free(p), free(g), free(m), free(v), free(p1), free(m1), free(v1);
    }
    mgpu_kernels_destroy(k);
}

/* adamw_multi's bf16 copy as rows inside a wider matrix: a (4, 3) weight in the first 3
 * columns of rows 8 apart and a bias of 4 as column 3 (p16_cols 1), the rest untouched. */
static void test_adamw_multi_p16_rows(void)
{
    mgpu_kernels_t *k = cpu();
    mgpu_err_t err = {0};
    float *p = rnd(16), *g = rnd(16), *m = zeros(16), *v = zeros(16);
    uint16_t p16[32];
    for (int i = 0; i < 32; i++)
        p16[i] = 0x7fc1;
    mgpu_gpt_adamw_tensor_t t[2] = {{.p = p,
                                     .g = g,
                                     .m = m,
                                     .v = v,
                                     .p16 = p16,
                                     .n = 12,
                                     .decay = 1,
                                     .p16_cols = 3,
                                     .p16_ld = 8},
                                    {.p = p + 12,
                                     .g = g + 12,
                                     .m = m + 12,
                                     .v = v + 12,
                                     .p16 = p16 + 3,
                                     .n = 4,
                                     .p16_cols = 1,
                                     .p16_ld = 8}};
    mgpu_adamw_hparams_t hp = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
    hp.lr = 1e-2f;
    mgpu_gpt_adamw_now_t now;
    mgpu_kg_adamw_now(&hp, 1, &now);
    CHECK_INT(mgpu_kg_adamw_multi(k, 2, t, &hp, &now, NULL, &err), 0);
    int bad = 0;
    for (int r = 0; r < 4; r++)
        for (int j = 0; j < 8; j++) {
            const uint16_t want = j < 3    ? mgpu_gpt_to_bf16(p[r * 3 + j])
                                  : j == 3 ? mgpu_gpt_to_bf16(p[12 + r])
                                           : 0x7fc1;
            bad += p16[r * 8 + j] != want;
        }
    CHECK_INT(bad, 0);
    free(p), free(g), free(m), free(v);
    mgpu_kernels_destroy(k);
}

static void test_launchers_refuse_bad_arguments(void)
{
    mgpu_kernels_t *k = cpu();
    mgpu_err_t err = {0};
    float buf[64] = {0};
    int32_t tok[4] = {0};
    CHECK_INT(mgpu_kg_attention_forward(k, 1, 4, 10, 3, buf, buf, buf, &err), MGPU_E_RANGE);
    CHECK_CONTAINS(err.msg, "gpt attention_forward: c = 10 is not a multiple of nh = 3");
    CHECK_INT(mgpu_kg_layernorm_forward(k, 0, 4, buf, buf, buf, buf, buf, buf, &err), MGPU_E_RANGE);
    CHECK_CONTAINS(err.msg, "gpt layernorm_forward: n = 0, expected >= 1");
    CHECK_INT(mgpu_kg_embed_backward(k, 1, 2, 2, 4, tok, buf, NULL, buf, &err), MGPU_E_USAGE);
    CHECK_CONTAINS(err.msg, "gpt embed_backward: dwte is NULL");
    CHECK_INT(mgpu_kg_tied_head(k, 1, 2, 4, buf, buf, tok, 0.0f, buf, buf, NULL, NULL, &err),
              MGPU_E_RANGE);
    CHECK_CONTAINS(err.msg, "gpt tied_head: scale = 0");
    CHECK_INT(mgpu_kg_tied_head(k, 1, 2, 4, buf, buf, tok, 1.0f, buf, buf, buf, NULL, &err),
              MGPU_E_USAGE);
    CHECK_CONTAINS(err.msg, "dx is set but dwte is NULL");
    CHECK_INT(mgpu_kg_adamw(k, 4, buf, buf, buf, buf, NULL, 1, NULL, &err), MGPU_E_USAGE);
    CHECK_CONTAINS(err.msg, "gpt adamw: hp is NULL");
    mgpu_adamw_hparams_t hp = {.beta1 = 0.9f, .beta2 = 0.95f};
    mgpu_gpt_adamw_tensor_t t1 = {.p = buf, .g = buf, .m = buf, .v = NULL, .n = 4};
    mgpu_gpt_adamw_now_t now = {.step = 1};
    CHECK_INT(mgpu_kg_adamw_multi(k, 1, &t1, &hp, NULL, NULL, &err), MGPU_E_USAGE);
    CHECK_CONTAINS(err.msg, "gpt adamw_multi: now is NULL");
    CHECK_INT(mgpu_kg_adamw_multi(k, 1, &t1, &hp, &now, NULL, &err), MGPU_E_USAGE);
    CHECK_CONTAINS(err.msg, "gpt adamw_multi: tensor 0 of 4 floats has a NULL p, g, m or v");
    CHECK_INT(mgpu_kg_adamw_multi(k, -1, &t1, &hp, &now, NULL, &err), MGPU_E_RANGE);
    CHECK_CONTAINS(err.msg, "gpt adamw_multi: n_tensors = -1, expected >= 0");
    uint16_t b16[8];
    mgpu_gpt_adamw_tensor_t t2 = {
        .p = buf, .g = buf, .m = buf, .v = buf, .p16 = b16, .n = 4, .p16_cols = 3, .p16_ld = 4};
    CHECK_INT(mgpu_kg_adamw_multi(k, 1, &t2, &hp, &now, NULL, &err), MGPU_E_RANGE);
    CHECK_CONTAINS(err.msg, "tensor 0 of 4 floats, its bf16 copy in rows of 3 elements 4 apart");
    t2.p16_cols = 2, t2.p16_ld = 1;
    CHECK_INT(mgpu_kg_adamw_multi(k, 1, &t2, &hp, &now, NULL, &err), MGPU_E_RANGE);
    int32_t bad[2] = {1, 99};
    CHECK_INT(mgpu_kg_tied_head(k, 2, 2, 4, buf, buf, bad, 1.0f, buf, buf, NULL, NULL, &err),
              MGPU_E_RANGE);
    /* A backend without a GPT table (one this build does not know). */
    mgpu_kernels_ops_t ops = mgpu_kernels_cpu_ops;
    ops.name = "other";
    mgpu_kernels_t fake = {.ops = &ops, .backend = (mgpu_kbackend_t)7, .device = 0};
    CHECK(mgpu_kg_ops(&fake) == NULL);
    CHECK_INT(mgpu_kg_add(&fake, 4, buf, buf, buf, &err), MGPU_E_DEVICE);
    CHECK_CONTAINS(err.msg, "gpt add: GPT ops are not available on backend other");
    CHECK(mgpu_kg_ops(k) == &mgpu_gpt_cpu_ops);
    mgpu_kernels_destroy(k);
}

int main(void)
{
    RUN(test_layernorm_matches_reference);
    RUN(test_gelu_overwrites_and_may_alias);
    RUN(test_attention_matches_reference);
    RUN(test_embed_and_add);
    RUN(test_tied_head_chunks_match_reference);
    RUN(test_clip_and_adamw_match_reference);
    RUN(test_adamw_multi_matches_per_tensor);
    RUN(test_adamw_multi_p16_rows);
    RUN(test_launchers_refuse_bad_arguments);
    return check_done();
}
