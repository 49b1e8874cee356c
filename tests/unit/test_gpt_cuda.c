/* test_gpt_cuda.c - the CUDA table of a GPT's ops (gpt_cuda.h: gpt_cuda.cu, gpt_attention.cu,
 * gpt_embed.cu) against transformer.h's fp32 reference.
 *
 * Every op on the same random inputs on both sides, at awkward shapes (sequence lengths that
 * are not a multiple of the attention's tiles, row counts that are not a multiple of a block,
 * head sizes 10 to 128, widths 32 to 768, vocabularies 64 to 50304), on 16-byte aligned
 * buffers (the float4 paths) and on buffers one float off (the scalar paths). Outputs an op
 * overwrites are poisoned with NaN first, so an element it forgot fails; outputs it adds to
 * start from random values, so a write where an add was due fails. Tolerances, relative to
 * the largest expected magnitude (SCALED below):
 *   - fp32: 1e-5 (LayerNorm, GELU, AdamW, sums of squares, the output layer), 1e-4 for the
 *     attention (its softmax is online, in fp32, with the fast exponential; its products in
 *     three TF32 products each on tensor cores, and with MGPU_GPT_ATT_X3=0 on the CUDA cores);
 *   - the output layer in tf32 (10 mantissa bits in the products) 5e-3, in bf16 (7 bits) 3e-2;
 *     the attention in bf16 (tensor cores: q, k, v, p, ds rounded to bf16) 3e-2, dqkv 6e-2;
 *   - the embedding and add: exact (the same fp32 adds in the same order).
 * Determinism: embed_backward, layernorm_backward, sumsq and attention_backward run twice on
 * the same inputs give the same bits. Skips without CUDA or a CUDA device. */
#include "kernels_check.h" /* env_t, buffers, close_to */
#include "transformer.h"   /* the reference */

#if defined(MGPU_HAVE_CUDA) && MGPU_HAVE_CUDA
#include "gpt_cuda.h" /* mgpu_gpt_cuda_ops */
#define GOPS (&mgpu_gpt_cuda_ops)
#else
#include "gpt_ops.h" /* mgpu_gpt_ops_t */
/* Never called: env_open skips every test first in a build without CUDA. */
static const mgpu_gpt_ops_t no_ops;
#define GOPS (&no_ops)
#endif

#include <string.h> /* memcmp */

#define IMPL(e) ((e)->gpu->impl)

/* close_to with atol = tol * the largest |want| (sums whose terms cancel are judged against
 * the scale of the data, not of their result). */
static int close_scaled(const char *what, const float *got, const float *want, size_t n, double tol)
{
    double mx = 0.0;
    for (size_t i = 0; i < n; i++)
        mx = fabs((double)want[i]) > mx ? fabs((double)want[i]) : mx;
    return close_to(what, got, want, n, tol * (mx > 0.0 ? mx : 1.0), tol);
}

static int same_bits(const char *what, const float *a, const float *b, size_t n)
{
    if (memcmp(a, b, n * sizeof(float)) == 0)
        return 1;
    printf("  %s: two runs on the same inputs differ\n", what);
    check_failed++;
    return 0;
}

static int32_t *dints(env_t *e, const int32_t *h, size_t n, void **base)
{
    void *p = NULL;
    if (mgpu_k_alloc(e->gpu, (n + 1) * sizeof(int32_t), &p, &e->err) != 0) {
        printf("  mgpu_k_alloc(%zu ints): %s\n", n + 1, e->err.msg);
        exit(1);
    }
    OK(e, mgpu_k_copy_to_device(e->gpu, p, h, n * sizeof(int32_t), &e->err));
    *base = p;
    return (int32_t *)p;
}

static float *fdown(env_t *e, const float *d, size_t n)
{
    return down(e, d, n);
}

/* --- LayerNorm ---------------------------------------------------------------------------------
 */

static void test_layernorm(void)
{
    /* rows: 1, 3 and 1001 are not a multiple of a block's 8 rows; c = 37 takes the scalar path,
     * 1536 and 1600 the forward's register path, 2056 (above 2048) its float4 path */
    static const int shapes[][2] = {{1, 32},  {3, 64},   {1001, 32}, {129, 768},
                                    {64, 37}, {5, 1600}, {7, 1536},  {2, 2056}};
    env_t e;
    env_open(&e);
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (size_t off = 0; off < 2; off++) {
            int n = shapes[s][0], c = shapes[s][1];
            size_t nc = (size_t)n * c;
            float *x = hrand(nc, 2.0f), *w = hrand(c, 1.0f), *b = hrand(c, 1.0f);
            for (size_t i = 0; i < nc; i++)
                x[i] += 0.5f; /* a mean away from zero */
            float *y = hbuf(nc), *mean = hbuf(n), *rstd = hbuf(n);
            mgpu_gpt_layernorm_forward(n, c, x, w, b, y, mean, rstd);
            void *bx, *bw, *bb, *by, *bm, *br;
            float *dx_ = dupd(&e, x, nc, off, &bx), *dw_ = dupd(&e, w, c, off, &bw);
            float *db_ = dupd(&e, b, c, off, &bb), *dy_ = dpoison(&e, nc, off, &by);
            float *dm = dpoison(&e, n, off, &bm), *dr = dpoison(&e, n, off, &br);
            OK(&e, GOPS->layernorm_forward(IMPL(&e), n, c, dx_, dw_, db_, dy_, dm, dr, &e.err));
            char what[96];
            snprintf(what, sizeof what, "layernorm_forward %dx%d off=%zu y", n, c, off);
            float *got = fdown(&e, dy_, nc);
            close_scaled(what, got, y, nc, 1e-5);
            free(got);
            got = fdown(&e, dm, n);
            close_to("layernorm_forward mean", got, mean, n, 1e-6, 1e-5);
            free(got);
            got = fdown(&e, dr, n);
            close_to("layernorm_forward rstd", got, rstd, n, 1e-6, 1e-5);
            free(got);

            /* backward: dx, dw, db start from random values (the op adds) */
            float *gy = hrand(nc, 1.0f), *gx0 = hrand(nc, 0.5f), *gw0 = hrand(c, 0.5f);
            float *gb0 = hrand(c, 0.5f);
            float *gx = hcopy(gx0, nc), *gw = hcopy(gw0, c), *gb = hcopy(gb0, c);
            mgpu_gpt_layernorm_backward(n, c, gy, x, w, mean, rstd, gx, gw, gb);
            void *bgy, *bgx, *bgw, *bgb, *bmean, *brstd;
            float *dgy = dupd(&e, gy, nc, off, &bgy), *dgx = dupd(&e, gx0, nc, off, &bgx);
            float *dgw = dupd(&e, gw0, c, off, &bgw), *dgb = dupd(&e, gb0, c, off, &bgb);
            float *dmean = dupd(&e, mean, n, off, &bmean), *drstd = dupd(&e, rstd, n, off, &brstd);
            float *runs[2][3];
            for (int r = 0; r < 2; r++) {
                OK(&e, mgpu_k_copy_to_device(e.gpu, dgx, gx0, nc * sizeof(float), &e.err));
                OK(&e, mgpu_k_copy_to_device(e.gpu, dgw, gw0, c * sizeof(float), &e.err));
                OK(&e, mgpu_k_copy_to_device(e.gpu, dgb, gb0, c * sizeof(float), &e.err));
                OK(&e, GOPS->layernorm_backward(IMPL(&e), n, c, dgy, dx_, dw_, dmean, drstd, dgx,
                                                dgw, dgb, &e.err));
                runs[r][0] = fdown(&e, dgx, nc);
                runs[r][1] = fdown(&e, dgw, c);
                runs[r][2] = fdown(&e, dgb, c);
            }
            snprintf(what, sizeof what, "layernorm_backward %dx%d off=%zu dx", n, c, off);
            close_scaled(what, runs[0][0], gx, nc, 2e-5);
            /* dw and db sum n rows in another order than the reference's */
            what[strlen(what) - 1] = 'w';
            close_scaled(what, runs[0][1], gw, c, 1e-5 * (1.0 + sqrt((double)n)));
            what[strlen(what) - 2] = 'd', what[strlen(what) - 1] = 'b';
            close_scaled(what, runs[0][2], gb, c, 1e-5 * (1.0 + sqrt((double)n)));
            same_bits("layernorm_backward dx", runs[0][0], runs[1][0], nc);
            same_bits("layernorm_backward dw", runs[0][1], runs[1][1], c);
            same_bits("layernorm_backward db", runs[0][2], runs[1][2], c);
            for (int r = 0; r < 2; r++)
                for (int k = 0; k < 3; k++)
                    free(runs[r][k]);
            void *bases[] = {bx, bw, bb, by, bm, br, bgy, bgx, bgw, bgb, bmean, brstd};
            for (size_t i = 0; i < sizeof bases / sizeof *bases; i++)
                mgpu_k_free(e.gpu, bases[i]);
            float *hs[] = {x, w, b, y, mean, rstd, gy, gx0, gw0, gb0, gx, gw, gb};
            for (size_t i = 0; i < sizeof hs / sizeof *hs; i++)
                free(hs[i]);
        }
    env_close(&e);
}

/* --- GELU and add ------------------------------------------------------------------------------
 */

static const size_t ew_sizes[] = {1, 3, 127, 4099, (1u << 20) + 3};

static void test_gelu(void)
{
    env_t e;
    env_open(&e);
    for (size_t s = 0; s < sizeof ew_sizes / sizeof *ew_sizes; s++)
        for (size_t off = 0; off < 2; off++) {
            size_t n = ew_sizes[s];
            float *x = hrand(n, 6.0f), *y = hbuf(n), *dy = hrand(n, 1.0f), *dx = hbuf(n);
            memset(dx, 0, n * sizeof(float));
            mgpu_gpt_gelu_forward(n, x, y);
            mgpu_gpt_gelu_backward(n, x, dy, dx); /* adds into zeros */
            void *bx, *by, *bdy, *bdx;
            float *d_x = dupd(&e, x, n, off, &bx), *d_y = dpoison(&e, n, off, &by);
            float *d_dy = dupd(&e, dy, n, off, &bdy), *d_dx = dpoison(&e, n, off, &bdx);
            char what[80];
            OK(&e, GOPS->gelu_forward(IMPL(&e), n, d_x, d_y, &e.err));
            snprintf(what, sizeof what, "gelu_forward n=%zu off=%zu", n, off);
            close_to_dev(&e, d_y, y, n, 2e-6, 1e-5, "%s", what);
            OK(&e, GOPS->gelu_backward(IMPL(&e), n, d_x, d_dy, d_dx, &e.err));
            snprintf(what, sizeof what, "gelu_backward n=%zu off=%zu", n, off);
            close_to_dev(&e, d_dx, dx, n, 2e-6, 1e-5, "%s", what);
            /* in place: dx == dy, y == x */
            OK(&e, GOPS->gelu_backward(IMPL(&e), n, d_x, d_dy, d_dy, &e.err));
            close_to_dev(&e, d_dy, dx, n, 2e-6, 1e-5, "%s in place", what);
            OK(&e, GOPS->gelu_forward(IMPL(&e), n, d_x, d_x, &e.err));
            close_to_dev(&e, d_x, y, n, 2e-6, 1e-5, "gelu_forward n=%zu in place", n);
            mgpu_k_free(e.gpu, bx);
            mgpu_k_free(e.gpu, by);
            mgpu_k_free(e.gpu, bdy);
            mgpu_k_free(e.gpu, bdx);
            free(x);
            free(y);
            free(dy);
            free(dx);
        }
    env_close(&e);
}

static void test_add(void)
{
    env_t e;
    env_open(&e);
    for (size_t s = 0; s < sizeof ew_sizes / sizeof *ew_sizes; s++)
        for (size_t off = 0; off < 2; off++) {
            size_t n = ew_sizes[s];
            float *a = hrand(n, 3.0f), *b = hrand(n, 3.0f), *want = hbuf(n);
            mgpu_gpt_residual_forward(n, a, b, want);
            void *ba, *bb, *bo;
            float *da = dupd(&e, a, n, off, &ba), *db = dupd(&e, b, n, off, &bb);
            float *dout = dpoison(&e, n, off, &bo);
            OK(&e, GOPS->add(IMPL(&e), n, da, db, dout, &e.err));
            close_to_dev(&e, dout, want, n, 0.0, 0.0, "add n=%zu off=%zu", n, off);
            OK(&e, GOPS->add(IMPL(&e), n, da, db, da, &e.err)); /* out == a */
            close_to_dev(&e, da, want, n, 0.0, 0.0, "add n=%zu off=%zu in place", n, off);
            mgpu_k_free(e.gpu, ba);
            mgpu_k_free(e.gpu, bb);
            mgpu_k_free(e.gpu, bo);
            free(a);
            free(b);
            free(want);
        }
    env_close(&e);
}

/* --- attention ---------------------------------------------------------------------------------
 */

typedef struct att_shape {
    int b, t, c, nh;
} att_shape_t;

/* head sizes 32, 32, 64, 64, 24, 128, 10 (scalar loads), 16 (the tiny GPT's), 64, 64, 40;
 * lengths that are and are not multiples of the tiles (32 keys, 64 in bf16) and of a block's
 * rows, one as long as GPT-2's context (16 tiles of the online softmax's rescaling in bf16),
 * and several batch rows and heads over several tiles (each head's bf16 plane in its place) */
static const att_shape_t att_shapes[] = {
    {1, 1, 32, 1},     {2, 37, 64, 2},   {1, 257, 768, 12}, {2, 65, 64, 1},   {2, 19, 48, 2},
    {1, 70, 256, 2},   {1, 20, 40, 4},   {3, 16, 32, 2},    {1, 64, 768, 24}, {1, 130, 128, 1},
    {1, 1024, 128, 2}, {3, 150, 192, 3}, {2, 129, 120, 3}};

/* Every shape in prec (fp32: the CUDA-core kernels; bf16: the tensor-core ones), out and dqkv
 * to tol of their largest value, lse to tol. */
static void attention_cases(mgpu_precision_t prec, double tol)
{
    env_t e;
    env_open(&e);
    OK(&e, mgpu_kernels_set_precision(e.gpu, prec, &e.err));
    const char *pn = mgpu_precision_name(prec);
    for (size_t s = 0; s < sizeof att_shapes / sizeof *att_shapes; s++) {
        const int b = att_shapes[s].b, t = att_shapes[s].t, c = att_shapes[s].c;
        const int nh = att_shapes[s].nh;
        const size_t nq = (size_t)b * t * 3 * c, no = (size_t)b * t * c, nl = (size_t)b * nh * t;
        const size_t tt = (size_t)b * nh * t * t;
        float *qkv = hrand(nq, 1.5f), *out = hbuf(no), *lse = hbuf(nl), *dout = hrand(no, 1.0f);
        float *preatt = hbuf(tt), *att = hbuf(tt), *datt = hbuf(tt), *dpre = hbuf(tt);
        float *dqkv = hbuf(nq);
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
        void *bq, *bo, *bl, *bd, *bg;
        float *d_qkv = dupd(&e, qkv, nq, 0, &bq), *d_out = dpoison(&e, no, 0, &bo);
        float *d_lse = dpoison(&e, nl, 0, &bl), *d_dout = dupd(&e, dout, no, 0, &bd);
        float *d_dqkv = dpoison(&e, nq, 0, &bg);
        char what[112];
        OK(&e, GOPS->attention_forward(IMPL(&e), b, t, c, nh, d_qkv, d_out, d_lse, &e.err));
        float *got = fdown(&e, d_out, no);
        snprintf(what, sizeof what, "attention_forward %s b=%d t=%d c=%d nh=%d out", pn, b, t, c,
                 nh);
        close_scaled(what, got, out, no, tol);
        free(got);
        close_to_dev(&e, d_lse, lse, nl, tol, tol, "attention_forward %s b=%d t=%d c=%d nh=%d lse",
                     pn, b, t, c, nh);
        OK(&e, GOPS->attention_backward(IMPL(&e), b, t, c, nh, d_dout, d_qkv, d_out, d_lse, d_dqkv,
                                        &e.err));
        got = fdown(&e, d_dqkv, nq);
        snprintf(what, sizeof what, "attention_backward %s b=%d t=%d c=%d nh=%d dqkv", pn, b, t, c,
                 nh);
        close_scaled(what, got, dqkv, nq, 2.0 * tol);
        /* overwritten, not added: a second run over the first run's result gives the same */
        OK(&e, GOPS->attention_backward(IMPL(&e), b, t, c, nh, d_dout, d_qkv, d_out, d_lse, d_dqkv,
                                        &e.err));
        float *again = fdown(&e, d_dqkv, nq);
        same_bits(what, got, again, nq);
        free(got);
        free(again);
        mgpu_k_free(e.gpu, bq);
        mgpu_k_free(e.gpu, bo);
        mgpu_k_free(e.gpu, bl);
        mgpu_k_free(e.gpu, bd);
        mgpu_k_free(e.gpu, bg);
        float *hs[] = {qkv, out, lse, dout, preatt, att, datt, dpre, dqkv};
        for (size_t i = 0; i < sizeof hs / sizeof *hs; i++)
            free(hs[i]);
    }
    env_close(&e);
}

/* fp32 and tf32: 3xTF32 products on tensor cores (gpt_attention_x3.cu) from compute
 * capability 8.0 on, held to the CUDA-core kernels' 1e-4 (dqkv 2e-4). */
static void test_attention(void)
{
    attention_cases(MGPU_PREC_FP32, 1e-4);
}

/* The same on the CUDA cores (gpt_attention.cu's own kernels: older GPUs, MGPU_GPT_ATT_X3=0),
 * which the options read when the backend is made. */
static void test_attention_cuda_cores(void)
{
    setenv("MGPU_GPT_ATT_X3", "0", 1);
    attention_cases(MGPU_PREC_FP32, 1e-4);
    unsetenv("MGPU_GPT_ATT_X3");
}

static void test_attention_tf32(void)
{
    attention_cases(MGPU_PREC_TF32, 1e-4);
}

/* bf16: q, k, v, p and ds rounded to bf16 (8 bits) for the tensor cores, about 3e-3 of the
 * largest value; held to 3e-2 (dqkv 6e-2), which a wrong tile or mask exceeds by far. */
static void test_attention_bf16(void)
{
    attention_cases(MGPU_PREC_BF16, 3e-2);
}

/* A head size past 128 is refused with a message, not computed wrong. */
static void test_attention_refuses_wide_heads(void)
{
    env_t e;
    env_open(&e);
    void *bq, *bo, *bl;
    float *d_qkv = dalloc(&e, 3 * 256, 0, &bq), *d_out = dalloc(&e, 256, 0, &bo);
    float *d_lse = dalloc(&e, 1, 0, &bl);
    int rc = GOPS->attention_forward(IMPL(&e), 1, 1, 256, 1, d_qkv, d_out, d_lse, &e.err);
    CHECK_INT(rc, MGPU_E_RANGE);
    CHECK_CONTAINS(e.err.msg, "head size");
    mgpu_k_free(e.gpu, bq);
    mgpu_k_free(e.gpu, bo);
    mgpu_k_free(e.gpu, bl);
    env_close(&e);
}

/* --- embedding ---------------------------------------------------------------------------------
 */

static void test_embed(void)
{
    /* b, t, c, vocab; a third of the tokens are one id (a long bucket), the rest random */
    static const int shapes[][4] = {
        {2, 5, 32, 64}, {3, 37, 64, 256}, {4, 100, 768, 256}, {2, 300, 64, 50304}, {2, 9, 37, 64}};
    env_t e;
    env_open(&e);
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (size_t off = 0; off < 2; off++) {
            const int b = shapes[s][0], t = shapes[s][1], c = shapes[s][2], vocab = shapes[s][3];
            const size_t n = (size_t)b * t, nv = (size_t)vocab * c, np = (size_t)t * c;
            int32_t *tok = malloc(n * sizeof *tok);
            for (size_t i = 0; i < n; i++) {
                float r = frand();
                tok[i] =
                    r < -0.33f ? 7 % vocab : (int32_t)((r + 1.0f) * 0.5f * (float)vocab) % vocab;
            }
            float *wte = hrand(nv, 1.0f), *wpe = hrand(np, 1.0f), *out = hbuf(n * c);
            OK(&e, mgpu_gpt_embed_forward(b, t, c, vocab, tok, wte, wpe, out, &e.err));
            void *bt, *bw, *bp, *bo;
            int32_t *d_tok = dints(&e, tok, n, &bt);
            float *d_wte = dupd(&e, wte, nv, off, &bw), *d_wpe = dupd(&e, wpe, np, off, &bp);
            float *d_out = dpoison(&e, n * c, off, &bo);
            OK(&e, GOPS->embed_forward(IMPL(&e), b, t, c, d_tok, d_wte, d_wpe, d_out, &e.err));
            close_to_dev(&e, d_out, out, n * c, 0.0, 0.0, "embed_forward b=%d t=%d c=%d off=%zu", b,
                         t, c, off);
            /* backward: the same adds in the same order as the reference, so the same bits */
            float *dout = hrand(n * c, 1.0f), *gte0 = hrand(nv, 0.5f), *gpe0 = hrand(np, 0.5f);
            float *gte = hcopy(gte0, nv), *gpe = hcopy(gpe0, np);
            mgpu_gpt_embed_backward(b, t, c, tok, dout, gte, gpe);
            void *bd, *bgt, *bgp;
            float *d_dout = dupd(&e, dout, n * c, off, &bd);
            float *d_gte = dalloc(&e, nv, off, &bgt), *d_gpe = dalloc(&e, np, off, &bgp);
            float *runs[2][2];
            for (int r = 0; r < 2; r++) {
                OK(&e, mgpu_k_copy_to_device(e.gpu, d_gte, gte0, nv * sizeof(float), &e.err));
                OK(&e, mgpu_k_copy_to_device(e.gpu, d_gpe, gpe0, np * sizeof(float), &e.err));
                OK(&e, GOPS->embed_backward(IMPL(&e), b, t, c, vocab, d_tok, d_dout, d_gte, d_gpe,
                                            &e.err));
                runs[r][0] = fdown(&e, d_gte, nv);
                runs[r][1] = fdown(&e, d_gpe, np);
            }
            char what[96];
            snprintf(what, sizeof what, "embed_backward b=%d t=%d c=%d vocab=%d off=%zu dwte", b, t,
                     c, vocab, off);
            close_to(what, runs[0][0], gte, nv, 0.0, 0.0);
            snprintf(what, sizeof what, "embed_backward b=%d t=%d c=%d vocab=%d off=%zu dwpe", b, t,
                     c, vocab, off);
            close_to(what, runs[0][1], gpe, np, 0.0, 0.0);
            same_bits("embed_backward dwte", runs[0][0], runs[1][0], nv);
            same_bits("embed_backward dwpe", runs[0][1], runs[1][1], np);
            for (int r = 0; r < 2; r++) {
                free(runs[r][0]);
                free(runs[r][1]);
            }
            void *bases[] = {bt, bw, bp, bo, bd, bgt, bgp};
            for (size_t i = 0; i < sizeof bases / sizeof *bases; i++)
                mgpu_k_free(e.gpu, bases[i]);
            float *hs[] = {wte, wpe, out, dout, gte0, gpe0, gte, gpe};
            for (size_t i = 0; i < sizeof hs / sizeof *hs; i++)
                free(hs[i]);
            free(tok);
        }
    env_close(&e);
}

/* --- the tied output layer ---------------------------------------------------------------------
 */

static void head_case(env_t *e, mgpu_precision_t prec, int n, int c, int vocab, int cut)
{
    static const double tol[] = {
        [MGPU_PREC_FP32] = 1e-5, [MGPU_PREC_TF32] = 5e-3, [MGPU_PREC_BF16] = 3e-2};
    const size_t nx = (size_t)n * c, nw = (size_t)vocab * c, nlg = (size_t)n * vocab;
    float *x = hrand(nx, 1.0f), *wte = hrand(nw, 0.5f), *logits = hbuf(nlg);
    float *dx0 = hrand(nx, 0.1f), *dw0 = hrand(nw, 0.1f);
    float *dx = hcopy(dx0, nx), *dw = hcopy(dw0, nw), loss = 0.0f;
    int32_t *tg = malloc((size_t)n * sizeof *tg);
    for (int i = 0; i < n; i++)
        tg[i] = (int32_t)((frand() + 1.0f) * 0.5f * (float)vocab) % vocab;
    OK(e, mgpu_gpt_tied_head(n, c, vocab, x, wte, tg, logits, &loss, dx, dw, &e->err));
    OK(e, mgpu_kernels_set_precision(e->gpu, prec, &e->err));
    void *bx, *bw, *bl, *bdx, *bdw, *bt, *bloss;
    float *d_x = dupd(e, x, nx, 0, &bx), *d_w = dupd(e, wte, nw, 0, &bw);
    float *d_lg = dpoison(e, nlg, 0, &bl), *d_dx = dupd(e, dx0, nx, 0, &bdx);
    float *d_dw = dupd(e, dw0, nw, 0, &bdw), loss0 = 0.25f;
    float *d_loss = dupd(e, &loss0, 1, 0, &bloss);
    int32_t *d_tg = dints(e, tg, n, &bt);
    /* the rows cut in two calls at `cut`, each scaled by 1/n: the mean over all of them */
    const float scale = 1.0f / (float)n;
    int r0 = 0;
    for (int part = 0; part < 2; part++) {
        int rows = part == 0 ? cut : n - cut;
        if (rows > 0)
            OK(e, GOPS->tied_head(IMPL(e), rows, c, vocab, d_x + (size_t)r0 * c, d_w, d_tg + r0,
                                  scale, d_lg + (size_t)r0 * vocab, d_loss, d_dx + (size_t)r0 * c,
                                  d_dw, &e->err));
        r0 += rows;
    }
    const char *pn = mgpu_precision_name(prec);
    float want_loss = loss0 + loss;
    close_to_dev(e, d_loss, &want_loss, 1, 0.0, tol[prec], "tied_head %s n=%d vocab=%d loss", pn, n,
                 vocab);
    float *got = fdown(e, d_lg, nlg);
    char what[96];
    snprintf(what, sizeof what, "tied_head %s n=%d c=%d vocab=%d dlogits", pn, n, c, vocab);
    close_scaled(what, got, logits, nlg, tol[prec]);
    free(got);
    got = fdown(e, d_dx, nx);
    snprintf(what, sizeof what, "tied_head %s n=%d c=%d vocab=%d dx", pn, n, c, vocab);
    close_scaled(what, got, dx, nx, tol[prec]);
    free(got);
    got = fdown(e, d_dw, nw);
    snprintf(what, sizeof what, "tied_head %s n=%d c=%d vocab=%d dwte", pn, n, c, vocab);
    close_scaled(what, got, dw, nw, tol[prec]);
    free(got);
    /* without dx: the loss alone, the gradients untouched */
    OK(e, mgpu_k_copy_to_device(e->gpu, d_loss, &loss0, sizeof loss0, &e->err));
    OK(e, GOPS->tied_head(IMPL(e), n, c, vocab, d_x, d_w, d_tg, scale, d_lg, d_loss, NULL, NULL,
                          &e->err));
    close_to_dev(e, d_loss, &want_loss, 1, 0.0, tol[prec], "tied_head %s n=%d loss only", pn, n);
    void *bases[] = {bx, bw, bl, bdx, bdw, bt, bloss};
    for (size_t i = 0; i < sizeof bases / sizeof *bases; i++)
        mgpu_k_free(e->gpu, bases[i]);
    float *hs[] = {x, wte, logits, dx0, dw0, dx, dw};
    for (size_t i = 0; i < sizeof hs / sizeof *hs; i++)
        free(hs[i]);
    free(tg);
}

static void test_tied_head(void)
{
    /* n, c, vocab, where the rows are cut: warp rows (64, 256), block rows (1030, 50304) */
    static const int shapes[][4] = {
        {5, 32, 64, 5}, {37, 64, 256, 20}, {130, 64, 1030, 67}, {48, 32, 50304, 17}};
    env_t e;
    env_open(&e);
    for (int p = MGPU_PREC_FP32; p <= MGPU_PREC_BF16; p++)
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
            head_case(&e, (mgpu_precision_t)p, shapes[s][0], shapes[s][1], shapes[s][2],
                      shapes[s][3]);
    env_close(&e);
}

/* --- the optimizer's parts ---------------------------------------------------------------------
 */

static void test_sumsq(void)
{
    env_t e;
    env_open(&e);
    for (size_t s = 0; s < sizeof ew_sizes / sizeof *ew_sizes; s++)
        for (size_t off = 0; off < 2; off++) {
            size_t n = ew_sizes[s];
            float *x = hrand(n, 2.0f);
            double want = 0.5;
            for (size_t i = 0; i < n; i++)
                want += (double)x[i] * x[i];
            float wantf = (float)want, acc0 = 0.5f, got[2];
            void *bx, *ba;
            float *d_x = dupd(&e, x, n, off, &bx), *d_acc = dalloc(&e, 1, 0, &ba);
            for (int r = 0; r < 2; r++) {
                OK(&e, mgpu_k_copy_to_device(e.gpu, d_acc, &acc0, sizeof acc0, &e.err));
                OK(&e, GOPS->sumsq(IMPL(&e), n, d_x, d_acc, &e.err));
                OK(&e, mgpu_k_copy_to_host(e.gpu, &got[r], d_acc, sizeof(float), &e.err));
            }
            char what[64];
            snprintf(what, sizeof what, "sumsq n=%zu off=%zu", n, off);
            close_to(what, got, &wantf, 1, 0.0, 1e-5);
            same_bits(what, &got[0], &got[1], 1);
            mgpu_k_free(e.gpu, bx);
            mgpu_k_free(e.gpu, ba);
            free(x);
        }
    env_close(&e);
}

static void test_clip_factor(void)
{
    static const float sums[] = {0.0f, 0.25f, 1.0f, 100.0f, 1e6f};
    static const float norms[] = {1.0f, 0.0f, -1.0f, 5.0f};
    env_t e;
    env_open(&e);
    void *bs, *bf;
    float *d_s = dalloc(&e, 1, 0, &bs), *d_f = dalloc(&e, 1, 0, &bf);
    for (size_t i = 0; i < sizeof sums / sizeof *sums; i++)
        for (size_t j = 0; j < sizeof norms / sizeof *norms; j++) {
            double coef = (double)norms[j] / (sqrt((double)sums[i]) + 1e-6);
            float want = norms[j] > 0.0f && coef < 1.0 ? (float)coef : 1.0f, got = NAN;
            OK(&e, mgpu_k_copy_to_device(e.gpu, d_s, &sums[i], sizeof(float), &e.err));
            OK(&e, GOPS->clip_factor(IMPL(&e), d_s, norms[j], d_f, &e.err));
            OK(&e, mgpu_k_copy_to_host(e.gpu, &got, d_f, sizeof got, &e.err));
            char what[64];
            snprintf(what, sizeof what, "clip_factor sumsq=%g max_norm=%g", sums[i], norms[j]);
            close_to(what, &got, &want, 1, 0.0, 1e-6);
        }
    mgpu_k_free(e.gpu, bs);
    mgpu_k_free(e.gpu, bf);
    env_close(&e);
}

static void test_adamw(void)
{
    static const mgpu_adamw_hparams_t hp = {
        .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
    env_t e;
    env_open(&e);
    for (size_t s = 0; s < sizeof ew_sizes / sizeof *ew_sizes; s++)
        for (size_t off = 0; off < 2; off++)
            for (int with_factor = 0; with_factor < 2; with_factor++) {
                size_t n = ew_sizes[s];
                const float factor = 0.375f;
                float *p = hrand(n, 1.0f), *m = hbuf(n), *v = hbuf(n);
                memset(m, 0, n * sizeof(float));
                memset(v, 0, n * sizeof(float));
                void *bp, *bg, *bm, *bv, *bf;
                float *d_p = dupd(&e, p, n, off, &bp), *d_g = dalloc(&e, n, off, &bg);
                float *d_m = dupd(&e, m, n, off, &bm), *d_v = dupd(&e, v, n, off, &bv);
                float *d_f = with_factor ? dupd(&e, &factor, 1, 0, &bf) : NULL;
                for (long long step = 1; step <= 3; step++) {
                    float *g = hrand(n, 1.0f);
                    OK(&e, mgpu_k_copy_to_device(e.gpu, d_g, g, n * sizeof(float), &e.err));
                    if (with_factor)
                        for (size_t i = 0; i < n; i++)
                            g[i] *= factor;
                    mgpu_gpt_adamw_tensor(n, p, g, m, v, &hp, 1, step);
                    OK(&e, GOPS->adamw(IMPL(&e), n, d_p, d_g, d_m, d_v, &hp, step, d_f, &e.err));
                    free(g);
                }
                close_to_dev(&e, d_p, p, n, 1e-6, 1e-5, "adamw n=%zu off=%zu factor=%d p", n, off,
                             with_factor);
                close_to_dev(&e, d_m, m, n, 1e-6, 1e-5, "adamw n=%zu off=%zu factor=%d m", n, off,
                             with_factor);
                close_to_dev(&e, d_v, v, n, 1e-6, 1e-5, "adamw n=%zu off=%zu factor=%d v", n, off,
                             with_factor);
                mgpu_k_free(e.gpu, bp);
                mgpu_k_free(e.gpu, bg);
                mgpu_k_free(e.gpu, bm);
                mgpu_k_free(e.gpu, bv);
                if (with_factor)
                    mgpu_k_free(e.gpu, bf);
                free(p);
                free(m);
                free(v);
            }
    env_close(&e);
}

/* adamw_multi on the GPU: a model-like list of 301 tensors (sizes 1 to 4099 and one of 2^20
 * + 3; decay off for every third, so pairs of neighbours merge into one segment and about 200
 * segments remain, more than one launch takes), aligned and one
 * float off, at a learning rate and step read from device memory, against the CUDA per-tensor
 * adamw (the same bits) and the CPU reference (1e-5), with and without the clip factor. */
static void test_adamw_multi(void)
{
    enum { NT = 301 };
    static const size_t sizes[] = {1, 3, 127, 4099, 64, 768};
    mgpu_adamw_hparams_t hp = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
    env_t e;
    env_open(&e);
    size_t n_of[NT], total = 0;
    for (int i = 0; i < NT; i++) {
        n_of[i] = i == NT / 2 ? (1u << 20) + 3 : sizes[i % (sizeof sizes / sizeof *sizes)];
        total += n_of[i];
    }
    for (size_t off = 0; off < 2; off++)
        for (int with_factor = 0; with_factor < 2; with_factor++) {
            const float factor = 0.375f;
            float *p = hrand(total, 1.0f), *m = hbuf(total), *v = hbuf(total);
            memset(m, 0, total * sizeof(float));
            memset(v, 0, total * sizeof(float));
            void *b[9] = {0};
            float *d_p = dupd(&e, p, total, off, &b[0]), *d_g = dalloc(&e, total, off, &b[1]);
            float *d_m = dupd(&e, m, total, off, &b[2]), *d_v = dupd(&e, v, total, off, &b[3]);
            /* the per-tensor run's copies */
            float *d_p1 = dupd(&e, p, total, off, &b[4]), *d_m1 = dupd(&e, m, total, off, &b[5]);
            float *d_v1 = dupd(&e, v, total, off, &b[6]);
            float *d_f = with_factor ? dupd(&e, &factor, 1, 0, &b[7]) : NULL;
            mgpu_gpt_adamw_now_t *d_now = NULL;
            OK(&e, mgpu_k_alloc(e.gpu, sizeof *d_now, &b[8], &e.err));
            d_now = b[8];
            mgpu_gpt_adamw_tensor_t t[NT];
            size_t o = 0;
            for (int i = 0; i < NT; i++) {
                t[i] = (mgpu_gpt_adamw_tensor_t){.p = d_p + o,
                                                 .g = d_g + o,
                                                 .m = d_m + o,
                                                 .v = d_v + o,
                                                 .n = n_of[i],
                                                 .decay = i % 3 != 0};
                o += n_of[i];
            }
            for (long long step = 1; step <= 3; step++) {
                float *g = hrand(total, 1.0f);
                OK(&e, mgpu_k_copy_to_device(e.gpu, d_g, g, total * sizeof(float), &e.err));
                if (with_factor)
                    for (size_t i = 0; i < total; i++)
                        g[i] *= factor;
                mgpu_adamw_hparams_t h = hp;
                h.lr = 1e-3f * (float)step; /* each step its own lr, as a warm-up */
                mgpu_gpt_adamw_now_t now;
                mgpu_kg_adamw_now(&h, step, &now);
                OK(&e, mgpu_k_copy_to_device(e.gpu, d_now, &now, sizeof now, &e.err));
                OK(&e, GOPS->adamw_multi(IMPL(&e), NT, t, &hp, d_now, d_f, &e.err));
                /* a later write of the block is not seen by the queued step */
                now.lr = NAN, now.step_size = NAN;
                OK(&e, mgpu_k_copy_to_device(e.gpu, d_now, &now, sizeof now, &e.err));
                o = 0;
                for (int i = 0; i < NT; i++) {
                    mgpu_adamw_hparams_t hi = h;
                    hi.weight_decay = i % 3 != 0 ? hp.weight_decay : 0.0f;
                    mgpu_gpt_adamw_tensor(n_of[i], p + o, g + o, m + o, v + o, &hi, 1, step);
                    OK(&e, GOPS->adamw(IMPL(&e), n_of[i], d_p1 + o, d_g + o, d_m1 + o, d_v1 + o,
                                       &hi, step, d_f, &e.err));
                    o += n_of[i];
                }
                free(g);
            }
            close_to_dev(&e, d_p, p, total, 1e-6, 1e-5, "adamw_multi off=%zu factor=%d p", off,
                         with_factor);
            close_to_dev(&e, d_m, m, total, 1e-6, 1e-5, "adamw_multi off=%zu factor=%d m", off,
                         with_factor);
            close_to_dev(&e, d_v, v, total, 1e-6, 1e-5, "adamw_multi off=%zu factor=%d v", off,
                         with_factor);
            float *got[3] = {down(&e, d_p, total), down(&e, d_m, total), down(&e, d_v, total)};
            float *per[3] = {down(&e, d_p1, total), down(&e, d_m1, total), down(&e, d_v1, total)};
            for (int j = 0; j < 3; j++) {
                char what[64];
                snprintf(what, sizeof what, "adamw_multi off=%zu factor=%d %s vs adamw", off,
                         with_factor,
                         j == 0   ? "p"
                         : j == 1 ? "m"
                                  : "v");
                same_bits(what, got[j], per[j], total);
                free(got[j]);
                free(per[j]);
            }
            for (int j = 0; j < 9; j++)
                if (b[j] != NULL)
                    mgpu_k_free(e.gpu, b[j]);
            free(p);
            free(m);
            free(v);
        }
    env_close(&e);
}

int main(void)
{
    RUN(test_layernorm);
    RUN(test_gelu);
    RUN(test_add);
    RUN(test_attention);
    RUN(test_attention_cuda_cores);
    RUN(test_attention_tf32);
    RUN(test_attention_bf16);
    RUN(test_attention_refuses_wide_heads);
    RUN(test_embed);
    RUN(test_tied_head);
    RUN(test_sumsq);
    RUN(test_clip_factor);
    RUN(test_adamw);
    RUN(test_adamw_multi);
    return check_done();
}
