/* test_kernels_cuda.c - the CUDA backend itself (kernels_cuda.cu, cublas.cu): cuBLAS opens,
 * memory round trips, creation errors and the stream; and GEMM (gemm.cu, small_gemm.cu), the
 * tf32 transpose and the fused linear layer.
 *
 * Every op against the plain-C reference, both called through kernels.h on the same random
 * inputs of awkward sizes, on 16-byte aligned buffers (the float4 paths) and on buffers one
 * float off (the scalar paths); GPU outputs are poisoned with NaN before each op so an element
 * the kernel forgot to write fails. Skips without CUDA or a CUDA device; run it on a GPU
 * machine. */
#include "kernels_check.h" /* env_t, buffers, close_to */

/* --- memory ---------------------------------------------------------------------------------- */

static void test_memory_round_trip(void)
{
    env_t e;
    env_open(&e);
    size_t sizes[] = {1, 3, 127, 1000, 4099, (1u << 20) + 3};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        size_t n = sizes[s];
        void *b1, *b2;
        float *h = hrand(n, 1.0f);
        float *d1 = dupd(&e, h, n, 0, &b1);
        float *d2 = dpoison(&e, n, 1, &b2);
        OK(&e, mgpu_k_copy(e.gpu, d2, d1, n * sizeof(float), &e.err));
        float *back = down(&e, d2, n);
        close_to("copy", back, h, n, 0.0, 0.0);
        OK(&e, mgpu_k_zero(e.gpu, d2, n * sizeof(float), &e.err));
        free(back);
        back = down(&e, d2, n);
        for (size_t i = 0; i < n; i++)
            h[i] = 0.0f;
        close_to("zero", back, h, n, 0.0, 0.0);
        free(back);
        free(h);
        mgpu_k_free(e.gpu, b1);
        mgpu_k_free(e.gpu, b2);
    }
    env_close(&e);
}

static void test_create_errors_and_stream(void)
{
    env_t e;
    env_open(&e);
#if defined(MGPU_HAVE_CUDA) && MGPU_HAVE_CUDA
    mgpu_kernels_t *bad = NULL;
    CHECK_INT(mgpu_kernels_create(MGPU_KBACKEND_CUDA, 1000, &bad, &e.err), MGPU_E_DEVICE);
    CHECK_CONTAINS(e.err.msg, "device 1000");
    CHECK(bad == NULL);
    CHECK(mgpu_kernels_cuda_stream(e.gpu) != NULL);
    CHECK(mgpu_kernels_cuda_stream(e.cpu) == NULL);
    CHECK_STR(e.gpu->ops->name, "cuda");
    /* An allocation no GPU can hold fails with a message naming the call and the size. */
    void *huge = NULL;
    CHECK(mgpu_k_alloc(e.gpu, (size_t)1 << 50, &huge, &e.err) < 0);
    CHECK_CONTAINS(e.err.msg, "cudaMalloc(1125899906842624 bytes)");
    CHECK(huge == NULL);
#endif
    env_close(&e);
}

/* --- GEMM --------------------------------------------------------------------------------------
 */

/* Per-element tolerance for a k-term dot product of values in [-1, 1]: rounding of the
 * operands (tf32 keeps 10 mantissa bits, bf16 7) grows like sqrt(k). Also checked: the
 * relative Frobenius error, which METHOD-style references put near 1e-7 for fp32, 3e-4 for
 * tf32 and 1e-3..1e-2 for bf16. */
static void gemm_case(env_t *e, mgpu_precision_t prec, int ta, int tb, int m, int n, int k,
                      float alpha, float beta, int pad)
{
    static const double elem_tol[] = {1e-5, 3e-3, 2e-2}, norm_tol[] = {1e-5, 2e-3, 1.5e-2};
    int lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
    size_t asz = (size_t)(ta ? k : m) * lda, bsz = (size_t)(tb ? n : k) * ldb,
           csz = (size_t)m * ldc;
    float *a = hrand(asz, 1.0f), *b = hrand(bsz, 1.0f), *c = hrand(csz, 1.0f);
    void *ba, *bb, *bc;
    float *da = dupd(e, a, asz, 0, &ba), *db = dupd(e, b, bsz, 0, &bb);
    /* beta == 0 must not read C: poison it then. */
    float *dc = beta == 0.0f ? dpoison(e, csz, 0, &bc) : dupd(e, c, csz, 0, &bc);

    OK(e, mgpu_kernels_set_precision(e->gpu, prec, &e->err));
    OK(e, mgpu_k_gemm(e->cpu, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, &e->err));
    OK(e, mgpu_k_gemm(e->gpu, ta, tb, m, n, k, alpha, da, lda, db, ldb, beta, dc, ldc, &e->err));
    float *got = down(e, dc, csz);

    /* Compare the m x n part only: padding columns are not the op's to write. */
    double num = 0.0, den = 0.0;
    float *g2 = hbuf((size_t)m * n), *w2 = hbuf((size_t)m * n);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            float gv = got[(size_t)i * ldc + j], wv = c[(size_t)i * ldc + j];
            g2[(size_t)i * n + j] = gv;
            w2[(size_t)i * n + j] = wv;
            num += ((double)gv - wv) * ((double)gv - wv);
            den += (double)wv * wv;
        }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    char what[128];
    snprintf(what, sizeof what, "gemm %s ta=%d tb=%d %dx%dx%d alpha=%g beta=%g pad=%d",
             mgpu_precision_name(prec), ta, tb, m, n, k, alpha, beta, pad);
    double tol = elem_tol[prec] * (sqrt((double)k) + 1.0) * (fabs(alpha) > 1 ? fabs(alpha) : 1);
    close_to(what, g2, w2, (size_t)m * n, tol, 1e-5);
    if (!(rel <= norm_tol[prec]) && k > 0) {
        printf("  %s: relative error %.3g, expected <= %.2g\n", what, rel, norm_tol[prec]);
        check_failed++;
    }
    free(a);
    free(b);
    free(c);
    free(got);
    free(g2);
    free(w2);
    mgpu_k_free(e->gpu, ba);
    mgpu_k_free(e->gpu, bb);
    mgpu_k_free(e->gpu, bc);
}

static void gemm_shapes(mgpu_precision_t prec)
{
    static const int shapes[][3] = {{1, 1, 1},        {3, 5, 7},     {127, 33, 65},
                                    {1000, 257, 129}, {64, 4099, 3}, {512, 384, 1024},
                                    {2, 3, 4099}};
    env_t e;
    env_open(&e);
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int t = 0; t < 4; t++) {
            gemm_case(&e, prec, t & 1, t >> 1, shapes[s][0], shapes[s][1], shapes[s][2], 1.0f, 0.0f,
                      0);
            gemm_case(&e, prec, t & 1, t >> 1, shapes[s][0], shapes[s][1], shapes[s][2], 0.5f, 2.0f,
                      3);
        }
    env_close(&e);
}

static void test_gemm_fp32(void)
{
    gemm_shapes(MGPU_PREC_FP32);
}

static void test_gemm_tf32(void)
{
    gemm_shapes(MGPU_PREC_TF32);
}

static void test_gemm_bf16(void)
{
    gemm_shapes(MGPU_PREC_BF16);
}

static void test_gemm_k0_alpha0(void)
{
    env_t e;
    env_open(&e);
    for (int p = 0; p < 3; p++) {
        gemm_case(&e, (mgpu_precision_t)p, 0, 0, 5, 7, 0, 1.0f, 0.0f, 1);
        gemm_case(&e, (mgpu_precision_t)p, 0, 1, 5, 7, 0, 1.0f, 3.0f, 0);
        gemm_case(&e, (mgpu_precision_t)p, 1, 0, 127, 9, 13, 0.0f, 0.5f, 2);
        gemm_case(&e, (mgpu_precision_t)p, 1, 1, 127, 9, 13, 0.0f, 0.0f, 0);
    }
    env_close(&e);
}

/* The tf32 products' operand transpose: both kernels (16-byte aligned with rows a multiple of
 * 4, and any other layout), edges that cut a 64 x 64 tile, a padded source; exact. */
static void test_transpose(void)
{
    env_t e;
    env_open(&e);
#if defined(MGPU_HAVE_CUDA) && MGPU_HAVE_CUDA /* (mgpu_kernels_cuda_transpose) */
    /* rows, cols, lds padding, source offset in floats */
    static const int cases[][4] = {{1, 1, 0, 0},      {3, 5, 0, 0},     {64, 64, 0, 0},
                                   {100, 37, 3, 0},   {128, 130, 2, 0}, {260, 67, 1, 0},
                                   {100, 37, 0, 1},   {7, 9, 4, 1},     {2052, 517, 0, 0},
                                   {517, 2052, 4, 2}, {2052, 516, 4, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const int rows = cases[i][0], cols = cases[i][1], lds = cols + cases[i][2];
        const size_t off = (size_t)cases[i][3], n = (size_t)rows * lds;
        float *h = hrand(n, 1.0f), *want = hbuf((size_t)rows * cols);
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < cols; c++)
                want[(size_t)c * rows + r] = h[(size_t)r * lds + c];
        void *bs, *bd;
        float *ds = dupd(&e, h, n, off, &bs), *dd = dpoison(&e, (size_t)rows * cols, 0, &bd);
        OK(&e, mgpu_kernels_cuda_transpose(e.gpu, rows, cols, ds, lds, dd, &e.err));
        float *got = down(&e, dd, (size_t)rows * cols);
        char what[80];
        snprintf(what, sizeof what, "transpose %dx%d ld %d offset %zu", rows, cols, lds, off);
        close_to(what, got, want, (size_t)rows * cols, 0.0, 0.0);
        free(h), free(want), free(got);
        mgpu_k_free(e.gpu, bs);
        mgpu_k_free(e.gpu, bd);
    }
    mgpu_err_t err;
    CHECK(mgpu_kernels_cuda_transpose(e.cpu, 2, 2, NULL, 2, NULL, &err) == MGPU_E_USAGE);
    CHECK(mgpu_kernels_cuda_transpose(e.gpu, 2, 3, NULL, 2, NULL, &err) == MGPU_E_RANGE);
#endif
    env_close(&e);
}

/* --- fused linear layer ------------------------------------------------------------------------
 * mgpu_k_linear_* on the GPU (cuBLASLt epilogues where it takes them) against the CPU, which
 * composes the same ops (GEMM, bias + activation, activation backward, column sums). The
 * layer below's output comes from the GPU's own fused forward (its relu mask is what the GPU
 * backward reads), copied to the CPU, so that both sides see the same mask whatever the
 * precision's rounding did near zero. */
static void linear_case(env_t *e, mgpu_precision_t prec, int rows, int out, int in, int in0,
                        int sg_on)
{
    static const double elem_tol[] = {1e-5, 3e-3, 2e-2};
    char what[160];
    void *b[16];
    int nb = 0;
    float *x0 = hrand((size_t)rows * in0, 1.0f), *w0 = hrand((size_t)in * in0, 1.0f),
          *b0 = hrand((size_t)in, 1.0f), *w = hrand((size_t)out * in, 1.0f),
          *bias = hrand((size_t)out, 1.0f), *dz = hrand((size_t)rows * out, 1.0f);
    OK(e, mgpu_kernels_set_precision(e->gpu, prec, &e->err));
    float *dx0 = dupd(e, x0, (size_t)rows * in0, 0, &b[nb++]);
    float *dw0 = dupd(e, w0, (size_t)in * in0, 0, &b[nb++]);
    float *db0 = dupd(e, b0, (size_t)in, 0, &b[nb++]);
    float *dw = dupd(e, w, (size_t)out * in, 0, &b[nb++]);
    float *dbias = dupd(e, bias, (size_t)out, 0, &b[nb++]);
    float *ddz = dupd(e, dz, (size_t)rows * out, 0, &b[nb++]);
    float *dz0 = dpoison(e, (size_t)rows * in, 0, &b[nb++]);
    float *dy0 = dpoison(e, (size_t)rows * in, 0, &b[nb++]);
    float *dz1 = dpoison(e, (size_t)rows * out, 0, &b[nb++]);
    float *dy1 = dpoison(e, (size_t)rows * out, 0, &b[nb++]);
    float *ddx = dpoison(e, (size_t)rows * in, 0, &b[nb++]);
    float *ddb0 = dpoison(e, (size_t)in, 0, &b[nb++]);
    float *ddw = dpoison(e, (size_t)out * in, 0, &b[nb++]);
    float *ddb = dpoison(e, (size_t)out, 0, &b[nb++]);
    void *aux0 = NULL;
    OK(e, mgpu_k_alloc(e->gpu, mgpu_k_linear_aux_bytes(rows, in), &aux0, &e->err));
    b[nb++] = aux0;

    /* The layer below: relu, with its mask kept in aux0. */
    OK(e, mgpu_k_linear_forward(e->gpu, MGPU_ACT_RELU, rows, in, in0, dx0, dw0, db0, dz0, dy0, aux0,
                                &e->err));
    float *y0 = down(e, dy0, (size_t)rows * in);
    float *cz0 = hbuf((size_t)rows * in), *cy0 = hbuf((size_t)rows * in);
    OK(e, mgpu_k_linear_forward(e->cpu, MGPU_ACT_RELU, rows, in, in0, x0, w0, b0, cz0, cy0, NULL,
                                &e->err));
    double tol0 = elem_tol[prec] * (sqrt((double)in0) + 1.0) * 2.0;
    snprintf(what, sizeof what, "linear_forward relu %s %dx%dx%d", mgpu_precision_name(prec), rows,
             in, in0);
    close_to(what, y0, cy0, (size_t)rows * in, tol0, 1e-5);

    /* This layer: identity (an output layer) forward. */
    float *cz1 = hbuf((size_t)rows * out), *cy1 = hbuf((size_t)rows * out);
    OK(e, mgpu_k_linear_forward(e->gpu, MGPU_ACT_IDENTITY, rows, out, in, dy0, dw, dbias, dz1, dz1,
                                NULL, &e->err));
    OK(e, mgpu_k_linear_forward(e->cpu, MGPU_ACT_IDENTITY, rows, out, in, y0, w, bias, cz1, cz1,
                                NULL, &e->err));
    double tol1 = elem_tol[prec] * (sqrt((double)in) + 1.0) * 4.0;
    close_to_dev(e, dz1, cz1, (size_t)rows * out, tol1, 1e-4, "linear_forward identity %s %dx%dx%d",
                 mgpu_precision_name(prec), rows, out, in);
    (void)dy1;
    (void)cy1;

    /* Weight gradient with the bias gradient (the output layer's), then the input gradient
     * through the layer below's relu with its bias gradient. */
    float *cdw = hbuf((size_t)out * in), *cdb = hbuf((size_t)out);
    OK(e, mgpu_k_linear_backward_weight(e->gpu, rows, out, in, ddz, dy0, ddw, ddb, &e->err));
    OK(e, mgpu_k_linear_backward_weight(e->cpu, rows, out, in, dz, y0, cdw, cdb, &e->err));
    double tolw = elem_tol[prec] * (sqrt((double)rows) + 1.0) * 4.0;
    close_to_dev(e, ddw, cdw, (size_t)out * in, tolw, 1e-4, "linear_backward_weight dW %s %dx%dx%d",
                 mgpu_precision_name(prec), rows, out, in);
    /* cuBLASLt's BGRADB sums the GEMM's operand, which bf16 mode has rounded to bf16. */
    close_to_dev(e, ddb, cdb, (size_t)out, 2.0 * elem_tol[prec] * sqrt((double)rows) + 1e-5, 1e-4,
                 "linear_backward_weight db %s %dx%dx%d", mgpu_precision_name(prec), rows, out, in);

    float *cdx = hbuf((size_t)rows * in), *cdb0 = hbuf((size_t)in);
    /* small_gemm.cu's input gradient (fp32 and tf32 with all its ops on, float4-aligned widths,
     * launch-bound sizes, one wave of blocks), with the bias gradient inside: sure to run for
     * up to 64 tiles of 32 x 32 and a K of 512, which needs no split. */
    const long long sg_before = small_gemms(e->gpu);
    OK(e, mgpu_k_linear_backward_data(e->gpu, MGPU_ACT_RELU, rows, out, in, ddz, dw, dz0, dy0, aux0,
                                      ddx, ddb0, &e->err));
    const int sg_may = sg_on && prec != MGPU_PREC_BF16 && out % 4 == 0 && in % 4 == 0 &&
                       2.0 * rows * out * in <= 2.7e8 && out <= 4096;
    const int sg_sure = sg_may && out <= 512 && ((rows + 31) / 32) * ((in + 31) / 32) <= 64;
    if (sg_sure || !sg_may)
        CHECK_INT(small_gemms(e->gpu) - sg_before, sg_sure);
    OK(e, mgpu_k_linear_backward_data(e->cpu, MGPU_ACT_RELU, rows, out, in, dz, w, y0, y0, NULL,
                                      cdx, cdb0, &e->err));
    double tolx = elem_tol[prec] * (sqrt((double)out) + 1.0) * 4.0;
    close_to_dev(e, ddx, cdx, (size_t)rows * in, tolx, 1e-4, "linear_backward_data dx %s %dx%dx%d",
                 mgpu_precision_name(prec), rows, out, in);
    close_to_dev(e, ddb0, cdb0, (size_t)in, tolx * sqrt((double)rows), 1e-3,
                 "linear_backward_data db %s %dx%dx%d", mgpu_precision_name(prec), rows, out, in);

    free(x0), free(w0), free(b0), free(w), free(bias), free(dz), free(y0), free(cz0), free(cy0);
    free(cz1), free(cy1), free(cdw), free(cdb), free(cdx), free(cdb0);
    for (int i = 0; i < nb; i++)
        mgpu_k_free(e->gpu, b[i]);
}

/* small_gemm.cu's choice of shapes and K split (host code: runs without a GPU). */
static void test_small_gemm_rule(void)
{
#if !(defined(MGPU_HAVE_CUDA) && MGPU_HAVE_CUDA)
    SKIP("built without CUDA (CUDA=0 or no nvcc)");
#else
    static float buf[64] __attribute__((aligned(16)));
    const void *al = buf, *odd = buf + 1;
    /* want: the split, 0 declined, -1 any split (> 0). */
    static const struct {
        int op, m, n, k, a_odd, lda, ldb, sms, forced, want;
    } cases[] = {
        /* The MLP of (b) on 132 multiprocessors: 64 tiles of 32 x 32, one block per
         * multiprocessor at most, a K slice of at most 512. */
        {0, 256, 256, 784, 0, 784, 784, 132, 0, 2},
        {0, 256, 256, 256, 0, 256, 256, 132, 0, 2},
        {1, 256, 256, 256, 0, 256, 256, 132, 0, 2},
        /* The weight gradient's tiles are 64 x 32 (M x N): 100 for 256 x 784, one wave
         * unsplit; 200 tiles of 32 x 32 are a second wave, declined; so are 64 tiles split
         * in two on 100. */
        {2, 256, 784, 256, 0, 256, 784, 132, 0, 1},
        {2, 256, 784, 256, 0, 256, 784, 64, 0, 0},
        {2, 256, 256, 256, 0, 256, 256, 132, 0, 4},
        {0, 256, 784, 256, 0, 256, 256, 132, 0, 0},
        {0, 256, 256, 784, 0, 784, 784, 100, 0, 0},
        {0, 256, 256, 256, 0, 256, 256, 100, 0, 1},
        /* K of 2000 over a cluster of 8; more than 8 slices of 512 declined. */
        {0, 64, 68, 2000, 0, 2000, 2000, 132, 0, 8},
        {0, 8, 8, 4100, 0, 4100, 4100, 132, 0, 0},
        /* No block without a k of its own (slices are multiples of 8): K = 16 keeps a split
         * of 2, K = 8 takes one block. */
        {0, 32, 32, 16, 0, 16, 16, 132, 0, 2},
        {0, 32, 32, 8, 0, 8, 8, 132, 0, 1},
        /* Misaligned float4 loads: a pointer, a leading dimension, k for k-contiguous
         * operands, m or n for the others; batch rows need no alignment in the weight
         * gradient (its K). */
        {0, 256, 256, 256, 1, 256, 256, 132, 0, 0},
        {0, 256, 256, 254, 0, 254, 254, 132, 0, 0},
        {1, 256, 258, 256, 0, 256, 258, 132, 0, 0},
        {2, 10, 256, 256, 0, 10, 256, 132, 0, 0},
        {2, 64, 256, 30, 0, 64, 256, 132, 0, -1},
        /* Too many flops for a launch-bound kernel; an unknown op. */
        {0, 512, 512, 1024, 0, 1024, 1024, 132, 0, 0},
        {3, 32, 32, 32, 0, 32, 32, 132, 0, 0},
        /* MGPU_SG_SPLIT forces a power of two that fits. */
        {0, 256, 256, 256, 0, 256, 256, 132, 4, 4},
        {0, 256, 256, 256, 0, 256, 256, 132, 3, 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int got = mgpu_kernels_cuda_small_gemm_split(
            cases[i].op, cases[i].m, cases[i].n, cases[i].k, cases[i].a_odd ? odd : al,
            cases[i].lda, al, cases[i].ldb, cases[i].sms, cases[i].forced);
        if (cases[i].want < 0 ? got <= 0 : got != cases[i].want) {
            printf("  case %zu: op %d %dx%dx%d on %d: split %d, expected %d\n", i, cases[i].op,
                   cases[i].m, cases[i].n, cases[i].k, cases[i].sms, got, cases[i].want);
            check_failed++;
        }
    }
#endif
}

/* small_gemm.cu's weight gradients, several layers' queued and launched as one group at the
 * join: (b)'s two hidden layers (one wave of 64 x 32 tiles on an H200), a third that no longer
 * fits that wave (the group launches, the third starts another), odd batches, a bias gradient
 * on some; each against the CPU, in fp32 and tf32 (both full fp32 math here). */
static void test_weight_grad_grouped(void)
{
    static const int layers[][3] = {{256, 784, 1}, {256, 256, 0}, {64, 128, 1}, {12, 20, 1}};
    static const int batches[] = {256, 30, 517};
    enum { L = sizeof layers / sizeof *layers };
    env_t e;
    setenv("MGPU_SG_FP32", "7", 1);
    setenv("MGPU_SG_TF32", "7", 1);
    env_open(&e);
    unsetenv("MGPU_SG_FP32");
    unsetenv("MGPU_SG_TF32");
    for (int p = 0; p < 2; p++)
        for (size_t bi = 0; bi < sizeof batches / sizeof *batches; bi++) {
            const int rows = batches[bi];
            void *b[4 * L];
            int nb = 0;
            float *hdz[L], *hx[L], *ddw[L], *ddb[L];
            OK(&e, mgpu_kernels_set_precision(e.gpu, (mgpu_precision_t)p, &e.err));
            const long long before = small_gemms(e.gpu);
            for (int l = 0; l < L; l++) {
                const int out = layers[l][0], in = layers[l][1];
                hdz[l] = hrand((size_t)rows * out, 1.0f);
                hx[l] = hrand((size_t)rows * in, 1.0f);
                float *ddz = dupd(&e, hdz[l], (size_t)rows * out, 0, &b[nb++]);
                float *dx = dupd(&e, hx[l], (size_t)rows * in, 0, &b[nb++]);
                ddw[l] = dpoison(&e, (size_t)out * in, 0, &b[nb++]);
                ddb[l] = layers[l][2] ? dpoison(&e, (size_t)out, 0, &b[nb++]) : NULL;
                OK(&e, mgpu_k_linear_backward_weight(e.gpu, rows, out, in, ddz, dx, ddw[l], ddb[l],
                                                     &e.err));
            }
            OK(&e, mgpu_k_join(e.gpu, &e.err));
            const long long groups = small_gemms(e.gpu) - before;
            if (groups < 1 || groups > L) {
                printf("  %s, batch %d: %lld small_gemm launches for %d weight gradients\n",
                       mgpu_precision_name((mgpu_precision_t)p), rows, groups, L);
                check_failed++;
            }
            for (int l = 0; l < L; l++) {
                const int out = layers[l][0], in = layers[l][1];
                float *cdw = hbuf((size_t)out * in), *cdb = hbuf((size_t)out);
                OK(&e, mgpu_k_linear_backward_weight(e.cpu, rows, out, in, hdz[l], hx[l], cdw,
                                                     layers[l][2] ? cdb : NULL, &e.err));
                /* Products over a wave, or over kSideMaxFlops, are cuBLAS's: tf32 there. */
                const double tol =
                    (p == MGPU_PREC_TF32 ? 3e-3 : 1e-5) * (sqrt((double)rows) + 1.0) * 4.0;
                close_to_dev(&e, ddw[l], cdw, (size_t)out * in, tol, 1e-4, "grouped dW %s %dx%dx%d",
                             mgpu_precision_name((mgpu_precision_t)p), rows, out, in);
                if (layers[l][2])
                    close_to_dev(&e, ddb[l], cdb, (size_t)out, tol, 1e-4, "grouped db %s %dx%dx%d",
                                 mgpu_precision_name((mgpu_precision_t)p), rows, out, in);
                free(cdw), free(cdb), free(hdz[l]), free(hx[l]);
            }
            for (int i = 0; i < nb; i++)
                mgpu_k_free(e.gpu, b[i]);
        }
    env_close(&e);
}

static void test_linear_fused(void)
{
    /* rows, out, in, in0: the article's MLP, odd sizes, a mask wider than 128 bits, output
     * layers (out <= 32) with many rows and columns for narrow_dw_kernel's splits, and for
     * small_gemm.cu: a batch that is no multiple of 4 with wide layers, an input of 2000
     * (its forward split over a cluster of 8 blocks) and a tile that sticks out of N; and a
     * layer of 1024 x 1024 outputs, which tf32 composes (lt_epilogue_slower). */
    static const int shapes[][4] = {{256, 10, 256, 784},  {256, 256, 256, 784}, {3, 5, 7, 9},
                                    {127, 33, 130, 65},   {64, 300, 257, 128},  {3000, 7, 130, 20},
                                    {100, 32, 1000, 16},  {30, 64, 2000, 12},   {64, 40, 68, 2000},
                                    {256, 256, 784, 256}, {1024, 16, 1024, 64}};
    /* Twice: the backend's own kernels (the output layers' weight gradients, all three of
     * small_gemm.cu's products in fp32 and tf32, more than a step uses by default), then
     * cuBLASLt's (MGPU_CUDA_HEAD=0 and MGPU_SMALL_GEMM=0, read when the backend is created). */
    for (int own = 1; own >= 0; own--) {
        env_t e;
        setenv("MGPU_CUDA_HEAD", own ? "1" : "0", 1);
        setenv("MGPU_SMALL_GEMM", own ? "1" : "0", 1);
        setenv("MGPU_SG_FP32", "7", 1);
        setenv("MGPU_SG_TF32", "7", 1);
        env_open(&e);
        for (int p = 0; p < 3; p++)
            for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
                linear_case(&e, (mgpu_precision_t)p, shapes[s][0], shapes[s][1], shapes[s][2],
                            shapes[s][3], own);
        env_close(&e);
    }
    unsetenv("MGPU_CUDA_HEAD");
    unsetenv("MGPU_SMALL_GEMM");
    unsetenv("MGPU_SG_FP32");
    unsetenv("MGPU_SG_TF32");
}

/* cuBLAS and cuBLASLt are dlopen'ed, not linked: every function the backend calls must
 * resolve in the libraries this build was compiled against. Needs no GPU, only the CUDA
 * libraries (present wherever this was built with CUDA). */
static void test_blas_opens(void)
{
#if !(defined(MGPU_HAVE_CUDA) && MGPU_HAVE_CUDA)
    SKIP("built without CUDA (CUDA=0 or no nvcc)");
#else
    mgpu_err_t err = {0};
    CHECK_INT(mgpu_kernels_cuda_blas_load(&err), 0);
    if (err.msg[0])
        printf("  %s\n", err.msg);
    /* Twice: once per process, the same answer. */
    CHECK_INT(mgpu_kernels_cuda_blas_load(&err), 0);
#endif
}

int main(void)
{
    RUN(test_blas_opens);
    RUN(test_memory_round_trip);
    RUN(test_create_errors_and_stream);
    RUN(test_gemm_fp32);
    RUN(test_gemm_tf32);
    RUN(test_gemm_bf16);
    RUN(test_gemm_k0_alpha0);
    RUN(test_transpose);
    RUN(test_small_gemm_rule);
    RUN(test_weight_grad_grouped);
    RUN(test_linear_fused);
    return check_done();
}
