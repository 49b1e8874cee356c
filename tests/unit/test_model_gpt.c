/* test_model_gpt.c - the trainer's GPT (worker/trainer/model_gpt.c) on the CPU backend: its
 * layout, initialisation, gradients against finite differences, gradient accumulation, the
 * checks of its spec, and DDP's gradient buckets: each launched from the backward's hook only
 * once its gradients are final, on the fp32 path and in the bf16 path's order of work. With --dump
 * FILE it instead runs a tiny GPT (2 layers, 32 wide, 2 heads, context 16, vocab 64): the loss and
 * every gradient of one batch, then 20 AdamW steps with clipping, warm-up and cosine decay over
 * fixed batches (no shuffle: the batches are in the file), and writes weights, tokens, loss,
 * gradients and the 20 losses to FILE for tests/unit/gpt_torch_ref.py, which recomputes them with
 * PyTorch (tests/integration/test_gpt.sh runs the pair). */
#include "check.h"
#include "model_gpt.h"
#include "transformer.h" /* mgpu_gpt_lr */

#include <math.h>   /* fabs, sqrt */
#include <stdint.h> /* uint64_t */
#include <stdio.h>  /* fopen, fwrite */
#include <stdlib.h> /* calloc, free */
#include <string.h> /* strcmp */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t urand32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}

static mgpu_kernels_t *cpu(void)
{
    mgpu_kernels_t *k = NULL;
    mgpu_err_t err = {0};
    if (mgpu_kernels_create(MGPU_KBACKEND_CPU, -1, &k, &err) < 0)
        printf("  %s\n", err.msg);
    return k;
}

static const mgpu_gpt_spec_t tiny = {
    .n_layer = 2, .n_head = 2, .n_embd = 32, .context = 16, .vocab = 64};

/* b x t random tokens and their targets (the next token of one stream per row). */
static void batch(int b, int t, int vocab, int32_t *tok, int32_t *tgt)
{
    for (int i = 0; i < b; i++) {
        int32_t s[1024];
        for (int j = 0; j <= t; j++)
            s[j] = (int32_t)(urand32() % (uint32_t)vocab);
        memcpy(tok + (size_t)i * t, s, sizeof(int32_t) * t);
        memcpy(tgt + (size_t)i * t, s + 1, sizeof(int32_t) * t);
    }
}

static float loss_of(mgpu_gpt_t *m, int b, int backward)
{
    mgpu_err_t err = {0};
    float l = -1;
    if (mgpu_gpt_zero_grads(m, &err) < 0 ||
        mgpu_gpt_loss(m, 1.0f / ((float)b * m->spec.context), backward, &err) < 0)
        printf("  %s\n", err.msg);
    l = m->scalars[0];
    return l;
}

static void test_layout_is_nanogpt_order(void)
{
    mgpu_kernels_t *k = cpu();
    mgpu_gpt_t *m = NULL;
    mgpu_err_t err = {0};
    CHECK_INT(mgpu_gpt_create(k, &tiny, 2, &m, &err), 0);
    size_t C = 32, V = 64, T = 16;
    size_t block =
        2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + 4 * C * C + 4 * C + 4 * C * C + C;
    CHECK_INT(m->n_params, V * C + T * C + 2 * block + 2 * C);
    CHECK_INT(m->wte, 0);
    CHECK_INT(m->wpe, V * C);
    CHECK_INT(m->blocks[0].ln1_w, V * C + T * C);
    CHECK_INT(m->blocks[0].qkv_w, V * C + T * C + 2 * C);
    CHECK_INT(m->blocks[1].ln1_w, V * C + T * C + block);
    CHECK_INT(m->lnf_b, m->n_params - C);
    CHECK_INT(m->n_tensors, 2 + 12 * 2 + 2);
    mgpu_gpt_destroy(m);
    mgpu_kernels_destroy(k);
}

static void test_init_is_gpt2s(void)
{
    mgpu_kernels_t *k = cpu();
    mgpu_gpt_t *m = NULL, *m2 = NULL;
    mgpu_err_t err = {0};
    mgpu_gpt_spec_t s = {.n_layer = 4, .n_head = 4, .n_embd = 64, .context = 32, .vocab = 256};
    CHECK_INT(mgpu_gpt_create(k, &s, 1, &m, &err), 0);
    CHECK_INT(mgpu_gpt_create(k, &s, 1, &m2, &err), 0);
    CHECK_INT(mgpu_gpt_init(m, 7, &err), 0);
    CHECK_INT(mgpu_gpt_init(m2, 7, &err), 0);
    CHECK(memcmp(m->params, m2->params, sizeof(float) * m->n_params) == 0);
    double ss = 0;
    size_t n = 256 * 64;
    for (size_t i = 0; i < n; i++)
        ss += (double)m->params[m->wte + i] * m->params[m->wte + i];
    CHECK(fabs(sqrt(ss / n) - 0.02) < 0.001);
    ss = 0;
    n = 64 * 64;
    for (size_t i = 0; i < n; i++)
        ss += (double)m->params[m->blocks[2].proj_w + i] * m->params[m->blocks[2].proj_w + i];
    CHECK(fabs(sqrt(ss / n) - 0.02 / sqrt(8.0)) < 0.0005);
    CHECK(m->params[m->blocks[1].ln2_w] == 1.0f && m->params[m->blocks[1].ln2_b] == 0.0f);
    CHECK(m->params[m->blocks[3].fc_b + 5] == 0.0f && m->params[m->lnf_w + 63] == 1.0f);
    mgpu_gpt_destroy(m);
    mgpu_gpt_destroy(m2);
    mgpu_kernels_destroy(k);
}

/* A few parameters of every kind against central differences of the loss. */
static void test_gradients_match_finite_differences(void)
{
    mgpu_kernels_t *k = cpu();
    mgpu_gpt_t *m = NULL;
    mgpu_err_t err = {0};
    int b = 2, t = 16;
    int32_t tok[32], tgt[32];
    CHECK_INT(mgpu_gpt_create(k, &tiny, b, &m, &err), 0);
    CHECK_INT(mgpu_gpt_init(m, 3, &err), 0);
    batch(b, t, 64, tok, tgt);
    CHECK_INT(mgpu_gpt_load(m, tok, tgt, b, t, &err), 0);
    loss_of(m, b, 1);
    float *g = calloc(m->n_params, sizeof(float));
    memcpy(g, m->grads, sizeof(float) * m->n_params);
    size_t at[] = {m->wte + 5,
                   m->wpe + 40,
                   m->blocks[0].ln1_w + 3,
                   m->blocks[0].qkv_w + 900,
                   m->blocks[1].qkv_b + 70,
                   m->blocks[1].proj_w + 11,
                   m->blocks[0].fc_w + 2000,
                   m->blocks[1].fcp_w + 77,
                   m->blocks[1].ln2_b + 4,
                   m->lnf_w + 9,
                   m->lnf_b + 31};
    double gmax = 0;
    for (size_t i = 0; i < m->n_params; i++)
        gmax = fabs(g[i]) > gmax ? fabs(g[i]) : gmax;
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
        float keep = m->params[at[i]], h = 1e-2f;
        m->params[at[i]] = keep + h;
        double lp = loss_of(m, b, 0);
        m->params[at[i]] = keep - h;
        double lm = loss_of(m, b, 0);
        m->params[at[i]] = keep;
        double fd = (lp - lm) / (2 * h);
        if (fabs(fd - g[at[i]]) > 2e-3 * gmax + 1e-2 * fabs(fd)) {
            printf("  parameter %zu: gradient %g, finite difference %g\n", at[i], g[at[i]], fd);
            CHECK(0);
        }
    }
    free(g);
    mgpu_gpt_destroy(m);
    mgpu_kernels_destroy(k);
}

/* Two micro-batches with scale 1/(2b) add up to the gradient of one batch of 2b rows. */
static void test_accumulation_equals_larger_batch(void)
{
    mgpu_kernels_t *k = cpu();
    mgpu_gpt_t *m = NULL;
    mgpu_err_t err = {0};
    int32_t tok[64], tgt[64];
    CHECK_INT(mgpu_gpt_create(k, &tiny, 4, &m, &err), 0);
    CHECK_INT(mgpu_gpt_init(m, 5, &err), 0);
    batch(4, 16, 64, tok, tgt);
    CHECK_INT(mgpu_gpt_load(m, tok, tgt, 4, 16, &err), 0);
    float whole = loss_of(m, 4, 1);
    float *g = calloc(m->n_params, sizeof(float));
    memcpy(g, m->grads, sizeof(float) * m->n_params);
    CHECK_INT(mgpu_gpt_zero_grads(m, &err), 0);
    for (int h = 0; h < 2; h++) {
        CHECK_INT(mgpu_gpt_load(m, tok + 32 * h, tgt + 32 * h, 2, 16, &err), 0);
        CHECK_INT(mgpu_gpt_loss(m, 1.0f / 64, 1, &err), 0);
    }
    CHECK(fabs(m->scalars[0] - whole) < 1e-6 * whole);
    double d = 0, mx = 0;
    for (size_t i = 0; i < m->n_params; i++) {
        d = fabs(m->grads[i] - g[i]) > d ? fabs(m->grads[i] - g[i]) : d;
        mx = fabs(g[i]) > mx ? fabs(g[i]) : mx;
    }
    CHECK(d < 1e-5 * mx);
    free(g);
    mgpu_gpt_destroy(m);
    mgpu_kernels_destroy(k);
}

static void test_bad_spec_and_batch_refused(void)
{
    mgpu_kernels_t *k = cpu();
    mgpu_gpt_t *m = NULL;
    mgpu_err_t err = {0};
    mgpu_gpt_spec_t s = tiny;
    s.n_head = 5;
    CHECK(mgpu_gpt_create(k, &s, 1, &m, &err) < 0);
    CHECK_CONTAINS(err.msg, "n_embd 32 is not a multiple of n_head 5");
    s = tiny;
    s.context = 0;
    CHECK(mgpu_gpt_create(k, &s, 1, &m, &err) < 0);
    CHECK_CONTAINS(err.msg, "context 0");
    CHECK_INT(mgpu_gpt_create(k, &tiny, 2, &m, &err), 0);
    int32_t tok[64] = {0};
    CHECK(mgpu_gpt_load(m, tok, tok, 3, 16, &err) < 0);
    CHECK_CONTAINS(err.msg, "batch of 3 x 16 tokens, expected 1..2 x 1..16");
    CHECK(mgpu_gpt_load(m, tok, tok, 1, 17, &err) < 0);
    mgpu_gpt_spec_t s2 = tiny;
    s2.vocab = 65;
    CHECK(mgpu_gpt_shape_hash(&s2) != mgpu_gpt_shape_hash(&tiny));
    mgpu_gpt_destroy(m);
    mgpu_kernels_destroy(k);
}

/* --- DDP's buckets and the backward's hook ------------------------------------------------- */

/* A stand-in for the bf16 path's ops on the CPU (it has none): products and attention do
 * nothing, and every op that adds into a gradient adds 1 to each float it touches (the
 * LayerNorm backward also to dx, so the embeddings' backward, the CPU's own, adds something
 * too). Enough to run backward16's order of writes: any write after a bucket's launch
 * changes the bucket's values. */
static int f_none(void)
{
    return 0;
}

static void add1(float *p, size_t n)
{
    for (size_t i = 0; p != NULL && i < n; i++)
        p[i] += 1.0f;
}

/* add1, or with fresh p[i] = 1 (the ops' first write of a step). */
static void put1(float *p, size_t n, int fresh)
{
    for (size_t i = 0; p != NULL && i < n; i++)
        p[i] = fresh ? 1.0f : p[i] + 1.0f;
}

/* The gradients' memory the backward has written (rd.m's, from the test's reset), and the
 * reads by the stand-in ops of memory already so written: a read of an activation that an
 * earlier gradient write overwrote (spec.reuse_grads). Off while rd.m is NULL. */
static struct {
    const mgpu_gpt_t *m;
    uintptr_t lo[256], hi[256];
    int n, stale;
} rd;

static void wrote(const void *p, size_t bytes)
{
    const uintptr_t a = (uintptr_t)p, g = rd.m != NULL ? (uintptr_t)rd.m->grads : 0;
    if (rd.m == NULL || p == NULL || a < g || a >= g + sizeof(float) * rd.m->n_params ||
        rd.n == 256)
        return;
    rd.lo[rd.n] = a, rd.hi[rd.n++] = a + bytes;
}

static void reads(const void *p, size_t bytes)
{
    const uintptr_t a = (uintptr_t)p;
    for (int i = 0; p != NULL && i < rd.n; i++)
        rd.stale += a < rd.hi[i] && rd.lo[i] < a + bytes;
}

static int f_to_bf16(void *impl, size_t n, const float *x, mgpu_bf16_t *y, mgpu_err_t *err)
{
    return f_none();
}

static int f_to_bf16_2d(void *impl, int rows, int cols, const float *x, size_t ldx, mgpu_bf16_t *y,
                        size_t ldy, mgpu_err_t *err)
{
    return f_none();
}

static int f_ln_fwd(void *impl, int n, int c, const float *x, const float *w, const float *b,
                    mgpu_bf16_t *y, size_t ldy, float *mean, float *rstd, mgpu_err_t *err)
{
    return f_none();
}

static int f_ln_back(void *impl, int n, int c, const mgpu_bf16_t *dy, const float *x,
                     const float *w, const float *b, const float *mean, const float *rstd,
                     float *dx, mgpu_bf16_t *dx16, float *dw, float *db, float *dsum,
                     mgpu_bf16_t *y, size_t ldy, int fresh, mgpu_err_t *err)
{
    reads(dy, sizeof(mgpu_bf16_t) * n * c);
    reads(x, sizeof(float) * n * c);
    reads(mean, sizeof(float) * n);
    reads(rstd, sizeof(float) * n);
    wrote(dw, sizeof(float) * c);
    wrote(db, sizeof(float) * c);
    wrote(dsum, sizeof(float) * c);
    add1(dx, (size_t)n * c);
    put1(dw, (size_t)c, fresh);
    put1(db, (size_t)c, fresh);
    put1(dsum, (size_t)c, fresh);
    return 0;
}

static int f_linear(void *impl, int n, int c, int oc, const mgpu_bf16_t *inp, const mgpu_bf16_t *w,
                    const mgpu_bf16_t *bias, mgpu_bf16_t *out, mgpu_bf16_t *pre, mgpu_err_t *err)
{
    return f_none();
}

static int f_linear_f32(void *impl, int n, int c, int oc, const mgpu_bf16_t *inp,
                        const mgpu_bf16_t *w, const float *bias, const float *res, float *out,
                        mgpu_err_t *err)
{
    return f_none();
}

static int f_back_data(void *impl, int n, int c, int oc, const mgpu_bf16_t *dout,
                       const mgpu_bf16_t *w, size_t ldw, const mgpu_bf16_t *pre, mgpu_bf16_t *din,
                       mgpu_err_t *err)
{
    reads(dout, sizeof(mgpu_bf16_t) * n * oc);
    reads(pre, sizeof(mgpu_bf16_t) * n * c);
    return f_none();
}

static int f_back_weight(void *impl, int n, int c, int oc, const mgpu_bf16_t *dout,
                         const mgpu_bf16_t *inp, size_t ldi, float *dw, float *dbias, int fresh,
                         mgpu_err_t *err)
{
    reads(dout, sizeof(mgpu_bf16_t) * n * oc);
    reads(inp, sizeof(mgpu_bf16_t) * ((size_t)(n - 1) * ldi + c));
    wrote(dw, sizeof(float) * oc * c);
    wrote(dbias, sizeof(float) * oc);
    put1(dw, (size_t)oc * c, fresh);
    put1(dbias, (size_t)oc, fresh);
    return 0;
}

static int f_attn_fwd(void *impl, int b, int t, int c, int nh, const mgpu_bf16_t *qkv,
                      mgpu_bf16_t *out, float *lse, mgpu_err_t *err)
{
    return f_none();
}

static int f_attn_back(void *impl, int b, int t, int c, int nh, const mgpu_bf16_t *dout,
                       const mgpu_bf16_t *qkv, const mgpu_bf16_t *out, const float *lse,
                       mgpu_bf16_t *dqkv, mgpu_err_t *err)
{
    reads(dout, sizeof(mgpu_bf16_t) * b * t * c);
    reads(qkv, sizeof(mgpu_bf16_t) * b * t * 3 * c);
    reads(out, sizeof(mgpu_bf16_t) * b * t * c);
    reads(lse, sizeof(float) * b * nh * t);
    return f_none();
}

static int f_xent(void *impl, int rows, int vocab, mgpu_bf16_t *logits, const int32_t *targets,
                  float scale, int grad, float *loss, mgpu_err_t *err)
{
    loss[0] += 1.0f;
    return 0;
}

static int f_gelu(void *impl, size_t n, const mgpu_bf16_t *pre, mgpu_bf16_t *out, mgpu_err_t *err)
{
    reads(pre, sizeof(mgpu_bf16_t) * n);
    return f_none();
}

static const mgpu_gpt_bf16_ops_t writes16 = {
    .to_bf16 = f_to_bf16,
    .to_bf16_2d = f_to_bf16_2d,
    .layernorm_forward = f_ln_fwd,
    .layernorm_backward = f_ln_back,
    .linear = f_linear,
    .linear_f32 = f_linear_f32,
    .linear_back_data = f_back_data,
    .linear_back_weight = f_back_weight,
    .attention_forward = f_attn_fwd,
    .attention_backward = f_attn_back,
    .xent = f_xent,
    .gelu = f_gelu,
};

/* The hook of a DDP step on a synchronous backend: launches every bucket whose layer this is,
 * in the plan's order, recording each and comparing its slice, as it is at the launch, with
 * the final gradients (want). */
typedef struct launcher {
    const mgpu_gpt_t *m;
    const mgpu_gpt_bucket_t *b;
    int nb, next, calls, last_layer;
    const float *want;
    size_t early;            /* floats that a launch saw before their final value */
    mgpu_gpt_bucket_t *sent; /* what was launched, in order */
} launcher_t;

static int launch(void *ctx, int layer, mgpu_err_t *err)
{
    launcher_t *h = ctx;
    /* Called once per layer, top down, the embeddings last. */
    if (layer != h->last_layer - 1)
        printf("  hook for layer %d after layer %d\n", layer, h->last_layer);
    CHECK_INT(layer, h->last_layer - 1);
    h->last_layer = layer;
    h->calls++;
    while (h->next < h->nb && h->b[h->next].layer == layer) {
        const mgpu_gpt_bucket_t *b = &h->b[h->next];
        for (size_t i = b->off; i < b->off + b->n; i++)
            h->early += memcmp(&h->m->grads[i], &h->want[i], sizeof(float)) != 0;
        h->sent[h->next++] = *b;
    }
    return 0;
}

/* NaN in every gradient, as the memory a step finds (the last step's sums, or garbage):
 * mgpu_gpt_zero_grads and the backward's first writes must leave none (m on the CPU). */
static void poison(mgpu_gpt_t *m)
{
    for (size_t i = 0; i < m->n_params; i++)
        m->grads[i] = NAN;
}

/* One backward of m's loaded batch with the plan's buckets launched from its hook: returns
 * the floats seen before their final value; *launched the buckets launched. */
static size_t run_plan(mgpu_gpt_t *m, int b, const mgpu_gpt_bucket_t *plan, int nb,
                       const float *want, mgpu_gpt_bucket_t *sent, int *launched)
{
    mgpu_err_t err = {0};
    launcher_t h = {
        .m = m, .b = plan, .nb = nb, .want = want, .sent = sent, .last_layer = m->spec.n_layer + 1};
    poison(m);
    CHECK_INT(mgpu_gpt_zero_grads(m, &err), 0);
    CHECK_INT(mgpu_gpt_loss_hooked(m, 1.0f / ((float)b * m->spec.context), 1, launch, &h, &err), 0);
    CHECK_INT(h.calls, m->spec.n_layer + 2);
    CHECK_INT(h.last_layer, MGPU_GPT_EMBEDDINGS);
    *launched = h.next;
    return h.early;
}

/* The bucket plan on both paths (fp32, and the bf16 path's order of writes through writes16),
 * at bucket sizes from one float (a bucket per layer) through a few layers to the whole
 * model: the buckets tile the parameters top down, close at the hooks' boundaries once full,
 * and each one's launch from the backward's hook sees its final gradients (those of a run
 * without the hook). A plan launched one layer early is caught. */
/* recompute 1 and 2 give recompute 0's loss and gradients bit for bit (the fp32 path makes
 * the GELU and LayerNorm outputs again with forward's kernels), over two steps with an update
 * between them, from layers that share one buffer of each: a layer's backward reading
 * another layer's activations would change them. */
static void test_recompute_gives_the_same_gradients(void)
{
    mgpu_kernels_t *k = cpu();
    mgpu_err_t err = {0};
    mgpu_gpt_spec_t s = {.n_layer = 3, .n_head = 2, .n_embd = 32, .context = 16, .vocab = 64};
    const int b = 2, t = 16;
    const mgpu_adamw_hparams_t hp = {
        .lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
    int32_t tok[32], tgt[32];
    float loss[3][2], *grads[3] = {NULL};
    batch(b, t, s.vocab, tok, tgt);
    for (int re = 0; re <= 2; re++) {
        mgpu_gpt_t *m = NULL;
        s.recompute = re;
        CHECK_INT(mgpu_gpt_create(k, &s, b, &m, &err), 0);
        if (m == NULL) {
            printf("  %s\n", err.msg);
            continue;
        }
        const mgpu_gpt_acts_t *a = m->acts;
        CHECK((a[0].fch_gelu == a[2].fch_gelu) == (re >= 1));
        CHECK((a[0].ln1 == a[1].ln1 && a[0].ln2 == a[2].ln2) == (re >= 2));
        CHECK(a[0].fch != a[1].fch && a[0].x != a[1].x);
        CHECK_INT(mgpu_gpt_init(m, 7, &err), 0);
        CHECK_INT(mgpu_gpt_load(m, tok, tgt, b, t, &err), 0);
        loss[re][0] = loss_of(m, b, 1);
        CHECK_INT(mgpu_gpt_step(m, &hp, 1, 1.0f, NULL, &err), 0);
        loss[re][1] = loss_of(m, b, 1);
        grads[re] = malloc(sizeof(float) * m->n_params);
        memcpy(grads[re], m->grads, sizeof(float) * m->n_params);
        if (re > 0 && grads[0] != NULL) {
            size_t diff = 0;
            for (size_t i = 0; i < m->n_params; i++)
                diff += memcmp(&grads[re][i], &grads[0][i], sizeof(float)) != 0;
            if (diff > 0)
                printf("  recompute %d: %zu gradients differ from recompute 0's\n", re, diff);
            CHECK_INT(diff, 0);
            CHECK(memcmp(loss[re], loss[0], sizeof loss[0]) == 0);
        }
        mgpu_gpt_destroy(m);
    }
    for (int re = 0; re <= 2; re++)
        free(grads[re]);
    s.recompute = 3;
    mgpu_gpt_t *m = NULL;
    CHECK(mgpu_gpt_create(k, &s, b, &m, &err) < 0);
    CHECK_CONTAINS(err.msg, "recompute 3, expected 0");
    mgpu_kernels_destroy(k);
}

static void test_buckets_follow_backward(void)
{
    mgpu_kernels_t *k = cpu();
    mgpu_err_t err = {0};
    mgpu_gpt_spec_t s = {.n_layer = 3, .n_head = 2, .n_embd = 32, .context = 16, .vocab = 64};
    const int b = 2, t = 16;
    int32_t tok[32], tgt[32];
    batch(b, t, s.vocab, tok, tgt);
    /* Each path, keeping every activation and recomputing all it can. */
    for (int run = 0; run < 4; run++) {
        const int path = run % 2;
        mgpu_gpt_t *m = NULL;
        s.recompute = run < 2 ? 0 : 2;
        CHECK_INT(mgpu_gpt_create_with(k, &s, b, path ? &writes16 : NULL, &m, &err), 0);
        if (m == NULL) {
            printf("  %s\n", err.msg);
            continue;
        }
        CHECK(path ? m->b16 == &writes16 : m->b16 == NULL);
        CHECK_INT(mgpu_gpt_init(m, 11, &err), 0);
        CHECK_INT(mgpu_gpt_load(m, tok, tgt, b, t, &err), 0);
        float *want = malloc(sizeof(float) * m->n_params);
        poison(m);
        CHECK_INT(mgpu_gpt_zero_grads(m, &err), 0);
        CHECK_INT(mgpu_gpt_loss(m, 1.0f / ((float)b * t), 1, &err), 0);
        memcpy(want, m->grads, sizeof(float) * m->n_params);
        size_t nz = 0, nan = 0;
        for (size_t i = 0; i < m->n_params; i++)
            nz += want[i] != 0.0f, nan += want[i] != want[i];
        /* Every gradient zeroed or first written whole (the bf16 path's fresh). */
        CHECK_INT(nan, 0);
        /* Every float written: a launch too early sees a difference. */
        CHECK(nz > m->n_params * 9 / 10);
        const size_t block = m->blocks[1].ln1_w - m->blocks[0].ln1_w;
        const double mib = 1024.0 * 1024.0 / sizeof(float);
        const double sizes[] = {1.0 / mib, (block + 1) / mib, 25.0};
        const int counts[] = {s.n_layer + 2, 3, 1};
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
            mgpu_gpt_bucket_t *plan = NULL, sent[8];
            int nb = 0, launched = 0;
            const size_t cap = (size_t)(sizes[si] * mib);
            CHECK_INT(mgpu_gpt_buckets(m, sizes[si], &plan, &nb, &err), 0);
            CHECK_INT(nb, counts[si]);
            size_t top = m->n_params;
            for (int i = 0; i < nb; i++) {
                const mgpu_gpt_bucket_t *p = &plan[i];
                /* Contiguous, top down, the embeddings' last. */
                CHECK(p->n > 0 && p->off + p->n == top);
                top = p->off;
                CHECK(i == 0 || p->layer < plan[i - 1].layer);
                CHECK(i == nb - 1 ? p->layer == MGPU_GPT_EMBEDDINGS : p->n >= cap);
                /* Its lower end is where its layer starts. */
                size_t lo = p->layer == s.n_layer ? m->lnf_w
                            : p->layer >= 0       ? m->blocks[p->layer].ln1_w
                                                  : 0;
                CHECK_INT(p->off, lo);
            }
            CHECK_INT(top, 0);
            size_t early = run_plan(m, b, plan, nb, want, sent, &launched);
            if (early > 0)
                printf("  %s path, bucket_mb %g: %zu floats launched before they were final\n",
                       path ? "bf16" : "fp32", sizes[si], early);
            CHECK_INT(early, 0);
            CHECK_INT(launched, nb);
            CHECK(memcmp(sent, plan, sizeof(mgpu_gpt_bucket_t) * (size_t)nb) == 0);
            CHECK(memcmp(m->grads, want, sizeof(float) * m->n_params) == 0);
            if (si == 0) {
                /* The plan one layer early (block l's bucket at block l + 1's hook, the
                 * embeddings' at block 0's): the check must see it. */
                for (int i = 1; i < nb; i++)
                    plan[i].layer = plan[i].layer + 1;
                early = run_plan(m, b, plan, nb, want, sent, &launched);
                CHECK(early > 0);
                CHECK_INT(launched, nb);
            }
            free(plan);
        }
        free(want);
        mgpu_gpt_destroy(m);
    }
    mgpu_kernels_destroy(k);
}

/* On the bf16 path mgpu_gpt_zero_grads leaves the gradients to the backward's first writes; an
 * update with no backward since must still see zeros (here NaN before the zeroing): the
 * parameters stay finite, and with no decay and zero gradients AdamW leaves them as they were. */
static void test_update_without_backward_sees_zeros(void)
{
    mgpu_kernels_t *k = cpu();
    mgpu_gpt_t *m = NULL;
    mgpu_err_t err = {0};
    const mgpu_adamw_hparams_t hp = {
        .lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.0f};
    CHECK_INT(mgpu_gpt_create_with(k, &tiny, 1, &writes16, &m, &err), 0);
    if (m == NULL) {
        printf("  %s\n", err.msg);
        mgpu_kernels_destroy(k);
        return;
    }
    CHECK_INT(mgpu_gpt_init(m, 5, &err), 0);
    float *before = malloc(sizeof(float) * m->n_params);
    memcpy(before, m->params, sizeof(float) * m->n_params);
    poison(m);
    CHECK_INT(mgpu_gpt_zero_grads(m, &err), 0);
    CHECK_INT(m->grads_fresh, 1);
    CHECK_INT(mgpu_gpt_step(m, &hp, 1, 1.0f, NULL, &err), 0);
    CHECK_INT(m->grads_fresh, 0);
    CHECK(memcmp(before, m->params, sizeof(float) * m->n_params) == 0);
    free(before);
    mgpu_gpt_destroy(m);
    mgpu_kernels_destroy(k);
}

/* The bf16 path's MLP input product with its bias inside (MGPU_GPT_FC_BIAS, inside by
 * default): fc_kp is C + 1 rounded up to 64, and AdamW writes each layer's c_fc weight and
 * bias as rows of fc16 ([w | b | 0...]); with epilogue, neither; another value is refused. */
/* The bf16 copy of the parameters: with fc16 (the bias inside) params16 leaves out
 * mlp.c_fc's weight and bias, so it holds n_params less n_layer (4C^2 + 4C) values; every
 * other tensor's copy lies in it, in the layout's order, one after the other, and AdamW's
 * pointers are those copies. Without fc16 (epilogue) the copy is the whole layout. Layers 1
 * and 3 check one block and several. */
static void test_bf16_copy_leaves_fc16_tensors_out(void)
{
    mgpu_kernels_t *k = cpu();
    mgpu_err_t err = {0};
    for (int layers = 1; layers <= 3; layers += 2)
        for (int inside = 1; inside >= 0; inside--) {
            mgpu_gpt_spec_t s = tiny;
            mgpu_gpt_t *m = NULL;
            s.n_layer = layers;
            if (inside)
                unsetenv("MGPU_GPT_FC_BIAS");
            else
                setenv("MGPU_GPT_FC_BIAS", "epilogue", 1);
            CHECK_INT(mgpu_gpt_create_with(k, &s, 2, &writes16, &m, &err), 0);
            if (m == NULL)
                continue;
            const size_t C = (size_t)s.n_embd, gap = inside ? 4 * C * C + 4 * C : 0;
            CHECK_INT(m->n_params16, m->n_params - (size_t)layers * gap);
            size_t next = 0, left_out = 0, bad = 0;
            for (int i = 0; i < m->n_tensors; i++) {
                const mgpu_gpt_tensor_t *t = &m->tensors[i];
                int fc = 0;
                for (int l = 0; l < layers; l++)
                    fc |= t->off == m->blocks[l].fc_w || t->off == m->blocks[l].fc_b;
                for (size_t j = 0; j < t->n; j++) {
                    const mgpu_bf16_t *w = mgpu_gpt_w16(m, t->off + j);
                    if (fc && inside) {
                        left_out += w == NULL;
                        continue;
                    }
                    bad += w != m->params16 + next++;
                }
                if (!(fc && inside))
                    bad += m->adam[i].p16 != mgpu_gpt_w16(m, t->off);
            }
            CHECK_INT(bad, 0);
            CHECK_INT(next, m->n_params16);
            CHECK_INT(left_out, (size_t)layers * gap);
            mgpu_gpt_destroy(m);
        }
    unsetenv("MGPU_GPT_FC_BIAS");
    mgpu_kernels_destroy(k);
}

static void test_fc_bias_inside(void)
{
    mgpu_kernels_t *k = cpu();
    mgpu_err_t err = {0};
    mgpu_gpt_t *m = NULL;
    unsetenv("MGPU_GPT_FC_BIAS");
    CHECK_INT(mgpu_gpt_create_with(k, &tiny, 2, &writes16, &m, &err), 0);
    if (m != NULL) {
        const int C = tiny.n_embd;
        CHECK_INT(m->fc_kp, 64);
        CHECK(m->fc16 != NULL);
        int seen = 0;
        for (int i = 0; i < m->n_tensors; i++)
            for (int l = 0; l < tiny.n_layer; l++) {
                const mgpu_bf16_t *row0 = m->fc16 + (size_t)l * 4 * C * m->fc_kp;
                if (m->tensors[i].off == m->blocks[l].fc_w)
                    seen += m->adam[i].p16 == row0 && m->adam[i].p16_cols == C &&
                            m->adam[i].p16_ld == 64;
                if (m->tensors[i].off == m->blocks[l].fc_b)
                    seen += m->adam[i].p16 == row0 + C && m->adam[i].p16_cols == 1 &&
                            m->adam[i].p16_ld == 64;
            }
        CHECK_INT(seen, 2 * tiny.n_layer);
        mgpu_gpt_destroy(m);
    }
    setenv("MGPU_GPT_FC_BIAS", "epilogue", 1);
    m = NULL;
    CHECK_INT(mgpu_gpt_create_with(k, &tiny, 2, &writes16, &m, &err), 0);
    if (m != NULL) {
        CHECK_INT(m->fc_kp, 0);
        CHECK(m->fc16 == NULL);
        mgpu_gpt_destroy(m);
    }
    setenv("MGPU_GPT_FC_BIAS", "fused", 1);
    m = NULL;
    CHECK(mgpu_gpt_create_with(k, &tiny, 2, &writes16, &m, &err) < 0 && m == NULL);
    CHECK_CONTAINS(err.msg, "MGPU_GPT_FC_BIAS=fused: expected inside or epilogue");
    unsetenv("MGPU_GPT_FC_BIAS");
    mgpu_kernels_destroy(k);
}

/* One buffer of a block's activations or of the backward's scratch: where and how long. */
typedef struct span {
    uintptr_t lo, hi;
} span_t;

static int spans_apart(const span_t *s, int n)
{
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (s[i].lo < s[j].hi && s[j].lo < s[i].hi)
                return 0;
    return 1;
}

/* The bf16 path with reuse_grads, for each recompute level and both places of c_fc's bias:
 * the activations of block l >= 1 that lie inside the gradients lie inside block l - 1's, whole,
 * 256-byte aligned, apart from each other (block 0's, and ln2_16 with its column of ones, never);
 * in_grads counts them; the backward's scratch (dres, d4_16, dqkv16) lies inside the logits
 * where they are large enough (vocabulary 1024), apart, and in_logits counts it. Then a
 * backward over the stand-in ops never reads memory that an earlier gradient write of the same
 * backward overwrote; a second backward without a zeroing is refused. Without reuse_grads no
 * activation lies in the gradients. */
static void test_activations_inside_gradients(void)
{
    mgpu_kernels_t *k = cpu();
    mgpu_err_t err = {0};
    const int b = 2, t = 16;
    int32_t tok[32], tgt[32];
    for (int run = 0; run < 12; run++) {
        const int re = run % 3, inside = (run / 3) % 2, reuse = run < 6 ? 1 : run % 2;
        mgpu_gpt_spec_t s = {.n_layer = 3, .n_head = 2, .n_embd = 32, .context = 16,
                             .vocab = 1024, .recompute = re, .reuse_grads = reuse};
        mgpu_gpt_t *m = NULL;
        batch(b, t, s.vocab, tok, tgt);
        if (inside)
            unsetenv("MGPU_GPT_FC_BIAS");
        else
            setenv("MGPU_GPT_FC_BIAS", "epilogue", 1);
        CHECK_INT(mgpu_gpt_create_with(k, &s, b, &writes16, &m, &err), 0);
        if (m == NULL)
            continue;
        const size_t N = (size_t)b * t, NC = N * s.n_embd, F = sizeof(float), H = 2;
        const uintptr_t g = (uintptr_t)m->grads, h = (uintptr_t)m->logits16;
        span_t sp[64];
        int n = 0, misplaced = 0;
        size_t in_grads = 0;
        for (int l = 0; l < s.n_layer; l++) {
            const mgpu_gpt_acts_t *a = &m->acts[l];
            const struct {
                const void *p;
                size_t bytes;
            } bufs[] = {{a->x, F * NC},         {a->res2, F * NC},        {a->lse, F * N * 2},
                        {a->ln1_mean, F * N},   {a->ln1_rstd, F * N},     {a->ln2_mean, F * N},
                        {a->ln2_rstd, F * N},   {a->qkv16, H * 3 * NC},   {a->atty16, H * NC},
                        {a->fch16, H * 4 * NC}, {a->ln1_16, H * NC},      {a->ln2_16, H * NC},
                        {a->gelu16, H * 4 * NC}};
            for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
                const uintptr_t p = (uintptr_t)bufs[i].p;
                if (bufs[i].p == NULL || p < g || p >= g + F * m->n_params)
                    continue;
                const uintptr_t lo = g + F * m->blocks[l > 0 ? l - 1 : 0].ln1_w,
                                hi = g + F * m->blocks[l].ln1_w;
                misplaced += l == 0 || p < lo || p + bufs[i].bytes > hi || p % 256 != 0 ||
                             (bufs[i].p == a->ln2_16 && m->fc_kp > 0);
                sp[n++] = (span_t){p, p + bufs[i].bytes};
                in_grads += bufs[i].bytes;
            }
        }
        CHECK_INT(misplaced, 0);
        CHECK(spans_apart(sp, n));
        CHECK_INT(m->in_grads, in_grads);
        CHECK(reuse ? in_grads > 0 : in_grads == 0);
        const uintptr_t sc[] = {(uintptr_t)m->dres, (uintptr_t)m->d4_16, (uintptr_t)m->dqkv16};
        const size_t sb[] = {F * NC, H * 4 * NC, H * 3 * NC};
        const size_t hb = H * (size_t)m->head_rows * s.vocab;
        span_t ss[3];
        for (int i = 0; i < 3; i++) {
            CHECK(sc[i] >= h && sc[i] + sb[i] <= h + hb);
            ss[i] = (span_t){sc[i], sc[i] + sb[i]};
        }
        CHECK(spans_apart(ss, 3));
        CHECK_INT(m->in_logits, sb[0] + sb[1] + sb[2]);
        CHECK_INT(mgpu_gpt_init(m, 11, &err), 0);
        CHECK_INT(mgpu_gpt_load(m, tok, tgt, b, t, &err), 0);
        memset(&rd, 0, sizeof rd);
        rd.m = m;
        CHECK_INT(mgpu_gpt_zero_grads(m, &err), 0);
        CHECK_INT(mgpu_gpt_loss(m, 1.0f / ((float)b * t), 1, &err), 0);
        if (reuse)
            CHECK(rd.n > 0);
        CHECK_INT(rd.stale, 0);
        rd.m = NULL;
        int again = mgpu_gpt_loss(m, 1.0f / ((float)b * t), 1, &err);
        if (reuse) {
            CHECK(again < 0);
            CHECK_CONTAINS(err.msg, "zero the gradients before each backward");
        } else {
            CHECK_INT(again, 0);
        }
        mgpu_gpt_destroy(m);
    }
    unsetenv("MGPU_GPT_FC_BIAS");
    mgpu_kernels_destroy(k);
}

static void test_bucket_size_refused(void)
{
    mgpu_kernels_t *k = cpu();
    mgpu_gpt_t *m = NULL;
    mgpu_gpt_bucket_t *b = NULL;
    mgpu_err_t err = {0};
    int n = -1;
    CHECK_INT(mgpu_gpt_create(k, &tiny, 1, &m, &err), 0);
    CHECK(mgpu_gpt_buckets(m, 0.0, &b, &n, &err) < 0);
    CHECK_CONTAINS(err.msg, "bucket_mb 0, expected > 0");
    CHECK(b == NULL && n == 0);
    mgpu_gpt_spec_t s = tiny;
    s.n_embd = 36;
    s.n_head = 2;
    CHECK(mgpu_gpt_create_with(k, &s, 1, &writes16, &m, &err) < 0);
    CHECK_CONTAINS(err.msg, "expected multiples of 8");
    mgpu_gpt_destroy(m);
    mgpu_kernels_destroy(k);
}

/* The file gpt_torch_ref.py reads (native little-endian order): "GPTRUN1\0"; int32 B, T, C,
 * heads, vocab, layers, steps, warmup, total; float32 lr, lr_min, beta1, beta2, eps,
 * weight_decay, grad_clip; the initial parameters; the gradient batch's tokens and targets
 * (B x T int32 each), its loss and gradients; then per step its tokens, targets and loss. */
static int dump(const char *path)
{
    mgpu_kernels_t *k = cpu();
    mgpu_gpt_t *m = NULL;
    mgpu_err_t err = {0};
    const int B = 4, T = tiny.context, steps = 20, warmup = 5, total = 20;
    const float lr = 3e-3f, lr_min = 3e-4f, clip = 1.0f;
    mgpu_adamw_hparams_t hp = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
    int32_t tok[64], tgt[64];
    FILE *f = fopen(path, "wb");
    if (f == NULL || k == NULL || mgpu_gpt_create(k, &tiny, B, &m, &err) < 0 ||
        mgpu_gpt_init(m, 1, &err) < 0) {
        fprintf(stderr, "test_model_gpt --dump %s: %s\n", path, err.msg);
        return 1;
    }
    int32_t head[9] = {B,     T,      tiny.n_embd, tiny.n_head, tiny.vocab, tiny.n_layer,
                       steps, warmup, total};
    float hpv[7] = {lr, lr_min, hp.beta1, hp.beta2, hp.eps, hp.weight_decay, clip};
    fwrite("GPTRUN1", 1, 8, f);
    fwrite(head, sizeof head, 1, f);
    fwrite(hpv, sizeof hpv, 1, f);
    fwrite(m->params, sizeof(float), m->n_params, f);
    batch(B, T, tiny.vocab, tok, tgt);
    mgpu_gpt_load(m, tok, tgt, B, T, &err);
    float l = loss_of(m, B, 1);
    fwrite(tok, sizeof(int32_t), (size_t)B * T, f);
    fwrite(tgt, sizeof(int32_t), (size_t)B * T, f);
    fwrite(&l, sizeof l, 1, f);
    fwrite(m->grads, sizeof(float), m->n_params, f);
    for (int s = 0; s < steps; s++) {
        batch(B, T, tiny.vocab, tok, tgt);
        hp.lr = mgpu_gpt_lr(s, warmup, total, lr, lr_min);
        if (mgpu_gpt_load(m, tok, tgt, B, T, &err) < 0)
            break;
        l = loss_of(m, B, 1);
        if (mgpu_gpt_step(m, &hp, s + 1, clip, NULL, &err) < 0)
            break;
        fwrite(tok, sizeof(int32_t), (size_t)B * T, f);
        fwrite(tgt, sizeof(int32_t), (size_t)B * T, f);
        fwrite(&l, sizeof l, 1, f);
    }
    if (err.msg[0] != 0 || fclose(f) != 0) {
        fprintf(stderr, "test_model_gpt --dump %s: %s\n", path, err.msg);
        return 1;
    }
    mgpu_gpt_destroy(m);
    mgpu_kernels_destroy(k);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--dump") == 0)
        return dump(argv[2]);
    RUN(test_layout_is_nanogpt_order);
    RUN(test_init_is_gpt2s);
    RUN(test_gradients_match_finite_differences);
    RUN(test_accumulation_equals_larger_batch);
    RUN(test_bad_spec_and_batch_refused);
    RUN(test_recompute_gives_the_same_gradients);
    RUN(test_buckets_follow_backward);
    RUN(test_update_without_backward_sees_zeros);
    RUN(test_bucket_size_refused);
    RUN(test_fc_bias_inside);
    RUN(test_activations_inside_gradients);
    RUN(test_bf16_copy_leaves_fc16_tensors_out);
    return check_done();
}
