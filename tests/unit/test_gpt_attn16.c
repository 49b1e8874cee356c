/* test_gpt_attn16.c - the bf16 path's attention (gpt_ops.h's mgpu_gpt_bf16_ops_t: bf16 qkv,
 * out, dout and dqkv, fp32 lse) of the CUDA backend, against transformer.h's fp32 reference on
 * the same bf16-rounded values, and against the fp32-input tensor-core op (the table's
 * attention in bf16 precision) on those values.
 *
 * Shapes: GPT-2 124M's heads (12 of 64, t = 1024) for one batch row; head sizes 32 and 128;
 * lengths that are not a multiple of the 64-row tiles (100, 1) or of the 128-row blocks (130,
 * 192), and one inside the second 16 rows of a warp's 32 (150); several batch rows; head
 * sizes outside 32/64/128 (48, 10) and buffers one element off 16 bytes, which take the
 * fallback through padded planes. Outputs are poisoned with bf16 NaNs first, so an element the
 * op forgot fails.
 *
 * Tolerances, relative to the largest expected magnitude: q, k, v and dout are exact in both
 * (bf16-rounded inputs; the tensor cores multiply them exactly and add in fp32), so what is
 * left is bf16 rounding inside and at the end: out's elements rounded to bf16 (2^-9 of their
 * size) and p rounded to bf16 for p . v (2^-9 of each term, the errors averaging out over the
 * keys): 1.5e-2 holds them four times over. dqkv adds ds rounded to bf16 for its products and
 * D = rowsum(dout * out) from the rounded out: 3e-2. lse is a sum of fp32 exponentials of
 * exact scores: 1e-4. A wrong tile, mask or head exceeds these by far.
 * Against the fp32-input op (same operands, same fp32 arithmetic in the kernels): out and lse
 * agree within one bf16 rounding of the result (2^-8 relative) plus 1e-3 of the largest
 * value; dqkv within 2^-8 relative plus 4e-3 of the largest value, since D is summed in
 * another order there, which may move a ds across a bf16 rounding boundary (one rounding of
 * one term of a sum). That pins the in-place tiles to the plane path.
 * Determinism: forward and backward run twice give the same bits. The backward's two passes
 * run on two streams, forked and joined with events: queued into a CUDA graph on a fresh
 * backend (before its side stream exists: one stream), eagerly, and into a graph again (the
 * fork and join captured), it gives the same bits each time, and each capture ends whole (an
 * unjoined fork fails it). Skips without CUDA or a CUDA device. */
#include "kernels_check.h" /* env_t, buffers, close_to */
#include "transformer.h"   /* the reference, mgpu_gpt_to_bf16, mgpu_gpt_from_bf16 */

#if defined(MGPU_HAVE_CUDA) && MGPU_HAVE_CUDA
#include "gpt_cuda.h"     /* mgpu_gpt_cuda_ops */
#include "kernels_cuda.h" /* mgpu_kernels_cuda_sched_*: graph capture */
#define GOPS (&mgpu_gpt_cuda_ops)
#else
#include "gpt_ops.h" /* mgpu_gpt_ops_t */
/* Never called: env_open skips every test first in a build without CUDA. */
static const mgpu_gpt_ops_t no_ops;
#define GOPS (&no_ops)
#endif

#include <string.h> /* memcmp, memset */

#define IMPL(e) ((e)->gpu->impl)
#define BF16_NAN 0x7fc0u

typedef struct shape {
    int b, t, c, nh;
    size_t off; /* elements every bf16 buffer starts past 16 bytes (1: the fallback) */
} shape_t;

static const shape_t shapes[] = {
    {1, 1024, 768, 12, 0}, /* GPT-2 124M, one batch row: 16 tiles of keys */
    {2, 100, 128, 4, 0},   /* hs 32, two batch rows, t past a tile */
    {1, 100, 256, 2, 0},   /* hs 128 */
    {2, 300, 512, 4, 0},   /* hs 128: three blocks of 128 queries, the last past t */
    {3, 1, 64, 2, 0},      /* hs 32, one query */
    {3, 130, 384, 6, 0},   /* the small model's heads (64), three batch rows */
    {1, 192, 128, 2, 0},   /* hs 64, half a block of 128 rows past t, whole tiles */
    {2, 150, 128, 2, 0},   /* hs 64: t inside a warp's second tile of 16 rows */
    {2, 9, 128, 2, 0},     /* hs 64: fewer queries than a tile */
    {1, 1, 128, 2, 0},     /* hs 64, one query */
    {2, 77, 96, 2, 0},     /* hs 48: the fallback */
    {1, 33, 40, 4, 0},     /* hs 10: the fallback, odd pairs of columns */
    {2, 70, 128, 2, 1},    /* hs 64 on buffers 2 bytes off: the fallback, scalar stores */
};

static float scaled_max(const float *x, size_t n)
{
    double mx = 0.0;
    for (size_t i = 0; i < n; i++)
        mx = fabs((double)x[i]) > mx ? fabs((double)x[i]) : mx;
    return mx > 0.0 ? (float)mx : 1.0f;
}

/* n bf16 of GPU memory at element offset off (16-byte aligned base + off). */
static uint16_t *d16(env_t *e, size_t n, size_t off, void **base)
{
    void *p = NULL;
    if (mgpu_k_alloc(e->gpu, (n + off + 8) * sizeof(uint16_t), &p, &e->err) != 0) {
        printf("  mgpu_k_alloc(%zu bf16): %s\n", n + off + 8, e->err.msg);
        exit(1);
    }
    *base = p;
    return (uint16_t *)p + off;
}

/* bf16 of h, or NaNs when h is NULL, into d. */
static void up16(env_t *e, uint16_t *d, const float *h, size_t n)
{
    uint16_t *t = malloc((n ? n : 1) * sizeof *t);
    if (t == NULL)
        exit(1);
    for (size_t i = 0; i < n; i++)
        t[i] = h != NULL ? mgpu_gpt_to_bf16(h[i]) : (uint16_t)BF16_NAN;
    OK(e, mgpu_k_copy_to_device(e->gpu, d, t, n * sizeof *t, &e->err));
    free(t);
}

static uint16_t *down16(env_t *e, const uint16_t *d, size_t n)
{
    uint16_t *h = malloc((n ? n : 1) * sizeof *h);
    if (h == NULL)
        exit(1);
    OK(e, mgpu_k_copy_to_host(e->gpu, h, d, n * sizeof *h, &e->err));
    return h;
}

static float *widen(const uint16_t *h, size_t n)
{
    float *f = hbuf(n);
    for (size_t i = 0; i < n; i++)
        f[i] = mgpu_gpt_from_bf16(h[i]);
    return f;
}

/* uniform in [-a, a), rounded to bf16: the values both sides compute on */
static float *hrand16(size_t n, float a)
{
    float *p = hrand(n, a);
    for (size_t i = 0; i < n; i++)
        p[i] = mgpu_gpt_from_bf16(mgpu_gpt_to_bf16(p[i]));
    return p;
}

static void same16(const char *what, const uint16_t *a, const uint16_t *b, size_t n)
{
    if (memcmp(a, b, n * sizeof *a) != 0) {
        printf("  %s: two runs on the same inputs differ\n", what);
        check_failed++;
    }
}

static void attn16_case(env_t *e, const shape_t *s)
{
    const int b = s->b, t = s->t, c = s->c, nh = s->nh;
    const size_t nq = (size_t)b * t * 3 * c, no = (size_t)b * t * c, nl = (size_t)b * nh * t;
    const size_t tt = (size_t)b * nh * t * t, off = s->off;
    const mgpu_gpt_bf16_ops_t *o16 = GOPS->bf16;
    char what[128];
    snprintf(what, sizeof what, "attention16 b=%d t=%d c=%d nh=%d off=%zu", b, t, c, nh, off);

    /* the reference on the bf16-rounded values */
    float *qkv = hrand16(nq, 1.5f), *dout = hrand16(no, 1.0f);
    float *out = hbuf(no), *lse = hbuf(nl), *dqkv = hbuf(nq);
    float *preatt = hbuf(tt), *att = hbuf(tt), *datt = hbuf(tt), *dpre = hbuf(tt);
    memset(dqkv, 0, nq * sizeof(float));
    memset(preatt, 0, tt * sizeof(float));
    mgpu_gpt_attention_forward(b, t, c, nh, qkv, preatt, att, out);
    mgpu_gpt_attention_backward(b, t, c, nh, dout, qkv, att, datt, dpre, dqkv);
    for (size_t r = 0; r < nl; r++) { /* lse from the reference's scaled scores */
        const float *pre = preatt + r * t;
        int q = (int)(r % t);
        double mx = -INFINITY, sum = 0.0;
        for (int k = 0; k <= q; k++)
            mx = pre[k] > mx ? pre[k] : mx;
        for (int k = 0; k <= q; k++)
            sum += exp((double)pre[k] - mx);
        lse[r] = (float)(mx + log(sum));
    }

    void *bq, *bo, *bd, *bg, *bl;
    uint16_t *g_qkv = d16(e, nq, off, &bq), *g_out = d16(e, no, off, &bo);
    uint16_t *g_dout = d16(e, no, off, &bd), *g_dqkv = d16(e, nq, off, &bg);
    float *g_lse = dpoison(e, nl, 0, &bl);
    up16(e, g_qkv, qkv, nq);
    up16(e, g_dout, dout, no);
    up16(e, g_out, NULL, no);
    up16(e, g_dqkv, NULL, nq);

    /* forward, twice */
    uint16_t *runs[2][2];
    for (int r = 0; r < 2; r++) {
        OK(e, o16->attention_forward(IMPL(e), b, t, c, nh, g_qkv, g_out, g_lse, &e->err));
        runs[r][0] = down16(e, g_out, no);
    }
    float *got = widen(runs[0][0], no), *got_lse = down(e, g_lse, nl);
    char w2[160];
    const double mo = scaled_max(out, no);
    snprintf(w2, sizeof w2, "%s out", what);
    close_to(w2, got, out, no, 1.5e-2 * mo, 1.5e-2);
    snprintf(w2, sizeof w2, "%s lse", what);
    close_to(w2, got_lse, lse, nl, 1e-4, 1e-4);
    snprintf(w2, sizeof w2, "%s forward", what);
    same16(w2, runs[0][0], runs[1][0], no);

    /* backward, twice, over poison and then over the first run's result (overwritten) */
    for (int r = 0; r < 2; r++) {
        OK(e, o16->attention_backward(IMPL(e), b, t, c, nh, g_dout, g_qkv, g_out, g_lse, g_dqkv,
                                      &e->err));
        runs[r][1] = down16(e, g_dqkv, nq);
    }
    float *got_d = widen(runs[0][1], nq);
    const double md = scaled_max(dqkv, nq);
    snprintf(w2, sizeof w2, "%s dqkv", what);
    close_to(w2, got_d, dqkv, nq, 3e-2 * md, 3e-2);
    snprintf(w2, sizeof w2, "%s backward", what);
    same16(w2, runs[0][1], runs[1][1], nq);

    /* the fp32-input tensor-core op on the same values: its out and lse, and its dqkv from
     * the bf16 op's out and lse (so that both backwards see the same D) */
    void *fq, *fo, *fl, *fd, *fg, *fo16;
    float *f_qkv = dupd(e, qkv, nq, 0, &fq), *f_out = dpoison(e, no, 0, &fo);
    float *f_lse = dpoison(e, nl, 0, &fl), *f_dout = dupd(e, dout, no, 0, &fd);
    float *f_dqkv = dpoison(e, nq, 0, &fg), *f_out16 = dupd(e, got, no, 0, &fo16);
    OK(e, mgpu_kernels_set_precision(e->gpu, MGPU_PREC_BF16, &e->err));
    OK(e, GOPS->attention_forward(IMPL(e), b, t, c, nh, f_qkv, f_out, f_lse, &e->err));
    OK(e, GOPS->attention_backward(IMPL(e), b, t, c, nh, f_dout, f_qkv, f_out16, g_lse, f_dqkv,
                                   &e->err));
    float *tc_out = down(e, f_out, no), *tc_lse = down(e, f_lse, nl), *tc_d = down(e, f_dqkv, nq);
    snprintf(w2, sizeof w2, "%s out vs the fp32-input op", what);
    close_to(w2, got, tc_out, no, 1e-3 * mo, 1.0 / 256);
    snprintf(w2, sizeof w2, "%s lse vs the fp32-input op", what);
    close_to(w2, got_lse, tc_lse, nl, 1e-5, 1e-5);
    snprintf(w2, sizeof w2, "%s dqkv vs the fp32-input op", what);
    close_to(w2, got_d, tc_d, nq, 4e-3 * scaled_max(tc_d, nq), 1.0 / 256);
    OK(e, mgpu_kernels_set_precision(e->gpu, MGPU_PREC_FP32, &e->err));

    void *bs[] = {bq, bo, bd, bg, bl, fq, fo, fl, fd, fg, fo16};
    for (size_t i = 0; i < sizeof bs / sizeof *bs; i++)
        mgpu_k_free(e->gpu, bs[i]);
    void *hs[] = {qkv,  dout,       out,        lse,        dqkv,      preatt, att,
                  datt, dpre,       got,        got_lse,    got_d,     tc_out, tc_lse,
                  tc_d, runs[0][0], runs[1][0], runs[0][1], runs[1][1]};
    for (size_t i = 0; i < sizeof hs / sizeof *hs; i++)
        free(hs[i]);
}

static void test_attention16(void)
{
    env_t e;
    env_open(&e);
    if (GOPS->bf16 == NULL) {
        printf("  the CUDA table has no bf16 path\n");
        check_failed++;
        env_close(&e);
        return;
    }
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        attn16_case(&e, &shapes[s]);
    env_close(&e);
}

/* A head size past the kernels' 128 is refused with a message, not computed wrong. */
static void test_attention16_refuses_wide_heads(void)
{
    env_t e;
    env_open(&e);
    void *bq, *bo, *bl;
    uint16_t *g_qkv = d16(&e, 3 * 256, 0, &bq), *g_out = d16(&e, 256, 0, &bo);
    float *g_lse = dalloc(&e, 1, 0, &bl);
    int rc = GOPS->bf16->attention_forward(IMPL(&e), 1, 1, 256, 1, g_qkv, g_out, g_lse, &e.err);
    CHECK_INT(rc, MGPU_E_RANGE);
    CHECK_CONTAINS(e.err.msg, "head size");
    mgpu_k_free(e.gpu, bq);
    mgpu_k_free(e.gpu, bo);
    mgpu_k_free(e.gpu, bl);
    env_close(&e);
}

#if defined(MGPU_HAVE_CUDA) && MGPU_HAVE_CUDA
/* The backward into dqkv (poisoned first), queued into a CUDA graph and replayed once (graph
 * != NULL) or queued eagerly; dqkv read back. */
static uint16_t *backward16(env_t *e, mgpu_kernels_cuda_sched_t *graph, const shape_t *s,
                            const uint16_t *g_dout, const uint16_t *g_qkv, const uint16_t *g_out,
                            const float *g_lse, uint16_t *g_dqkv, size_t nq)
{
    up16(e, g_dqkv, NULL, nq);
    if (graph != NULL)
        OK(e, mgpu_kernels_cuda_sched_capture_begin(graph, &e->err));
    int rc = GOPS->bf16->attention_backward(IMPL(e), s->b, s->t, s->c, s->nh, g_dout, g_qkv, g_out,
                                            g_lse, g_dqkv, &e->err);
    OK(e, rc);
    if (graph != NULL) {
        OK(e, mgpu_kernels_cuda_sched_capture_end(graph, rc == 0, &e->err));
        OK(e, mgpu_kernels_cuda_sched_graph_instantiate(graph, &e->err));
        OK(e, mgpu_kernels_cuda_sched_graph_launch(graph, &e->err));
    }
    OK(e, mgpu_k_sync(e->gpu, &e->err));
    uint16_t *h = down16(e, g_dqkv, nq);
    if (graph != NULL)
        OK(e, mgpu_kernels_cuda_sched_graph_drop(graph, &e->err));
    return h;
}
#endif

/* Shapes whose tiles are read in place (no workspace to grow, which a capture cannot), each
 * on a fresh backend so that its first backward is the captured one. */
static void test_attention16_backward_in_graph(void)
{
    static const shape_t gshapes[] = {{1, 1024, 768, 12, 0}, {3, 130, 384, 6, 0}};
    for (size_t i = 0; i < sizeof gshapes / sizeof *gshapes; i++) {
        env_t e;
        env_open(&e);
#if defined(MGPU_HAVE_CUDA) && MGPU_HAVE_CUDA
        const shape_t *s = &gshapes[i];
        const size_t nq = (size_t)s->b * s->t * 3 * s->c, no = (size_t)s->b * s->t * s->c;
        const size_t nl = (size_t)s->b * s->nh * s->t;
        mgpu_kernels_cuda_sched_t *graph = NULL;
        OK(&e, mgpu_kernels_cuda_sched_create(e.gpu, 0, &graph, &e.err));
        float *qkv = hrand16(nq, 1.5f), *dout = hrand16(no, 1.0f);
        void *bq, *bo, *bd, *bg, *bl;
        uint16_t *g_qkv = d16(&e, nq, 0, &bq), *g_out = d16(&e, no, 0, &bo);
        uint16_t *g_dout = d16(&e, no, 0, &bd), *g_dqkv = d16(&e, nq, 0, &bg);
        float *g_lse = dpoison(&e, nl, 0, &bl);
        up16(&e, g_qkv, qkv, nq);
        up16(&e, g_dout, dout, no);
        OK(&e, GOPS->bf16->attention_forward(IMPL(&e), s->b, s->t, s->c, s->nh, g_qkv, g_out, g_lse,
                                             &e.err));
        uint16_t *first = backward16(&e, graph, s, g_dout, g_qkv, g_out, g_lse, g_dqkv, nq);
        uint16_t *eager = backward16(&e, NULL, s, g_dout, g_qkv, g_out, g_lse, g_dqkv, nq);
        uint16_t *again = backward16(&e, graph, s, g_dout, g_qkv, g_out, g_lse, g_dqkv, nq);
        char what[128];
        snprintf(what, sizeof what, "attention16 b=%d t=%d c=%d nh=%d: graph on one stream, eager",
                 s->b, s->t, s->c, s->nh);
        same16(what, first, eager, nq);
        snprintf(what, sizeof what, "attention16 b=%d t=%d c=%d nh=%d: graph on two streams, eager",
                 s->b, s->t, s->c, s->nh);
        same16(what, again, eager, nq);
        mgpu_kernels_cuda_sched_destroy(graph);
        void *bs[] = {bq, bo, bd, bg, bl};
        for (size_t j = 0; j < sizeof bs / sizeof *bs; j++)
            mgpu_k_free(e.gpu, bs[j]);
        void *hs[] = {qkv, dout, first, eager, again};
        for (size_t j = 0; j < sizeof hs / sizeof *hs; j++)
            free(hs[j]);
#endif
        env_close(&e);
    }
}

int main(void)
{
    RUN(test_attention16);
    RUN(test_attention16_refuses_wide_heads);
    RUN(test_attention16_backward_in_graph);
    return check_done();
}
