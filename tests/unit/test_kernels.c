/* test_kernels.c - the CPU kernels against hand-computed values, PyTorch 1.13's outputs
 * (optimizers, GELU, cross-entropy: produced by the script in the comment of each test),
 * a double-precision GEMM, and central finite differences for every backward. */
#include "check.h"
#include "kernels.h"
#include "options.h" /* mgpu_kernels_options_read */

#include <errno.h> /* EINVAL */
#include <math.h>  /* fabs, NAN */

static mgpu_kernels_t *cpu(void)
{
    mgpu_kernels_t *k = NULL;
    mgpu_err_t err = {0};
    int rc = mgpu_kernels_create(MGPU_KBACKEND_CPU, -1, &k, &err);
    if (rc != 0) {
        printf("  mgpu_kernels_create: %s\n", err.msg);
        exit(1);
    }
    return k;
}

/* Compares got against want element by element with |d| <= atol + rtol*|want|; prints the
 * first mismatches and the largest difference, as llm.c's kernel tests do. */
static int close_arrays(const char *what, const float *got, const double *want, size_t n,
                        double atol, double rtol)
{
    int bad = 0;
    double worst = 0.0;
    size_t worst_i = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (d > worst || isnan(d)) {
            worst = isnan(d) ? INFINITY : d;
            worst_i = i;
        }
        if (!(d <= atol + rtol * fabs(want[i]))) {
            if (bad < 5)
                printf("  %s[%zu] = %.9g, expected %.9g\n", what, i, got[i], want[i]);
            bad++;
        }
    }
    if (bad)
        printf("  %s: %d of %zu mismatched, largest difference %.3g at [%zu]\n", what, bad, n,
               worst, worst_i);
    return bad == 0;
}

static unsigned long long lcg_state = 12345;
static float frand(void) /* uniform in [-1, 1), deterministic */
{
    lcg_state = lcg_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((lcg_state >> 40) / (double)(1ULL << 24)) * 2.0f - 1.0f;
}

static void gemm_case(int ta, int tb, int m, int n, int k, float alpha, float beta, int pad)
{
    mgpu_kernels_t *kk = cpu();
    mgpu_err_t err = {0};
    int lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
    int arows = ta ? k : m, brows = tb ? n : k;
    float *a = malloc(sizeof(float) * (size_t)arows * lda + 1);
    float *b = malloc(sizeof(float) * (size_t)brows * ldb + 1);
    float *c = malloc(sizeof(float) * (size_t)m * ldc + 1);
    double *want = malloc(sizeof(double) * (size_t)m * n + 1);
    float *got = calloc((size_t)m * n + 1, sizeof(float));

    for (size_t i = 0; i < (size_t)arows * lda; i++)
        a[i] = frand();
    for (size_t i = 0; i < (size_t)brows * ldb; i++)
        b[i] = frand();
    for (size_t i = 0; i < (size_t)m * ldc; i++)
        c[i] = beta == 0.0f ? NAN : frand(); /* beta == 0 must not read C */
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = 0.0;
            for (int p = 0; p < k; p++) {
                double av = ta ? a[(size_t)p * lda + i] : a[(size_t)i * lda + p];
                double bv = tb ? b[(size_t)j * ldb + p] : b[(size_t)p * ldb + j];
                s += av * bv;
            }
            want[(size_t)i * n + j] =
                alpha * s + (beta == 0.0f ? 0.0 : (double)beta * c[(size_t)i * ldc + j]);
        }
    CHECK_INT(mgpu_k_gemm(kk, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, &err), 0);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++)
            got[(size_t)i * n + j] = c[(size_t)i * ldc + j];
    char what[96];
    snprintf(what, sizeof what, "gemm ta=%d tb=%d %dx%dx%d", ta, tb, m, n, k);
    /* fp32 accumulation over k terms of size <= 1: error grows about like sqrt(k) ulps. */
    CHECK(close_arrays(what, got, want, (size_t)m * n, 1e-5 * (1 + k), 1e-5));
    /* Padding columns past n are untouched (ldc > n). */
    for (int i = 0; pad && i < m; i++)
        CHECK(beta == 0.0f ? isnan(c[(size_t)i * ldc + n]) : !isnan(c[(size_t)i * ldc + n]));
    free(a), free(b), free(c), free(want), free(got);
    mgpu_kernels_destroy(kk);
}

static void test_gemm_hand(void)
{
    /* [1 2; 3 4] x [5 6; 7 8] = [19 22; 43 50]; with A transposed [1 3; 2 4] x B = [26 30; 38
     * 44]; C = 2*AB + 1*C where C = ones. */
    mgpu_kernels_t *k = cpu();
    float a[] = {1, 2, 3, 4}, b[] = {5, 6, 7, 8}, c[4] = {1, 1, 1, 1};
    CHECK_INT(mgpu_k_gemm(k, 0, 0, 2, 2, 2, 2.0f, a, 2, b, 2, 1.0f, c, 2, NULL), 0);
    CHECK(c[0] == 39 && c[1] == 45 && c[2] == 87 && c[3] == 101);
    CHECK_INT(mgpu_k_gemm(k, 1, 0, 2, 2, 2, 1.0f, a, 2, b, 2, 0.0f, c, 2, NULL), 0);
    CHECK(c[0] == 26 && c[1] == 30 && c[2] == 38 && c[3] == 44);
    /* A x B^T = [1*5+2*6, 1*7+2*8; 3*5+4*6, 3*7+4*8] = [17 23; 39 53] */
    CHECK_INT(mgpu_k_gemm(k, 0, 1, 2, 2, 2, 1.0f, a, 2, b, 2, 0.0f, c, 2, NULL), 0);
    CHECK(c[0] == 17 && c[1] == 23 && c[2] == 39 && c[3] == 53);
    mgpu_kernels_destroy(k);
}

static void test_gemm_shapes(void)
{
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            gemm_case(ta, tb, 1, 1, 1, 1.0f, 0.0f, 0);
            gemm_case(ta, tb, 30, 2, 5, 1.0f, 0.0f, 0);     /* the article's Linear(5 -> 2) */
            gemm_case(ta, tb, 7, 13, 3, -0.5f, 0.25f, 3);   /* edges of every tile, padded ld */
            gemm_case(ta, tb, 67, 131, 300, 1.0f, 1.0f, 1); /* more than one MC and KC block */
            gemm_case(ta, tb, 5, 600, 9, 1.0f, 0.0f, 0);    /* more than one NC block */
        }
}

/* The same through the portable 4x8 kernel, which CPUs without AVX2 + FMA run (this one may
 * have taken the AVX2 kernel above). */
static void test_gemm_shapes_portable_kernel(void)
{
    setenv("MGPU_CPU_GEMM", "portable", 1);
    test_gemm_shapes();
}

static void test_gemm_k0_and_alpha0(void)
{
    mgpu_kernels_t *k = cpu();
    float c[4] = {1, 2, 3, 4}, z[4] = {NAN, NAN, NAN, NAN};
    CHECK_INT(mgpu_k_gemm(k, 0, 0, 2, 2, 0, 1.0f, NULL, 1, NULL, 1, 2.0f, c, 2, NULL), 0);
    CHECK(c[0] == 2 && c[3] == 8);
    float a[4] = {1, 1, 1, 1};
    CHECK_INT(mgpu_k_gemm(k, 0, 0, 2, 2, 2, 0.0f, a, 2, a, 2, 0.0f, z, 2, NULL), 0);
    CHECK(z[0] == 0 && z[1] == 0 && z[2] == 0 && z[3] == 0);
    mgpu_kernels_destroy(k);
}

static void test_gemm_rejects_bad_shapes(void)
{
    mgpu_kernels_t *k = cpu();
    mgpu_err_t err = {0};
    float a[6] = {0}, b[6] = {0}, c[6] = {0};
    CHECK_INT(mgpu_k_gemm(k, 0, 0, 2, 3, 3, 1.0f, a, 2, b, 3, 0.0f, c, 3, &err), -EINVAL);
    CHECK_CONTAINS(err.msg, "lda=2, expected >= 3");
    CHECK_INT(mgpu_k_gemm(k, 0, 1, 2, 3, 2, 1.0f, a, 2, b, 1, 0.0f, c, 3, &err), -EINVAL);
    CHECK_CONTAINS(err.msg, "ldb=1, expected >= 2");
    CHECK_INT(mgpu_k_gemm(k, 0, 0, 2, 3, 1, 1.0f, a, 1, b, 3, 0.0f, c, 2, &err), -EINVAL);
    CHECK_CONTAINS(err.msg, "ldc=2");
    CHECK_INT(mgpu_k_gemm(k, 0, 0, -1, 3, 1, 1.0f, a, 1, b, 3, 0.0f, c, 3, &err), -EINVAL);
    CHECK_CONTAINS(err.msg, "m=-1");
    CHECK_INT(mgpu_k_gemm(k, 0, 0, 1, 1, 1, 1.0f, NULL, 1, b, 1, 0.0f, c, 1, &err), -EINVAL);
    CHECK_CONTAINS(err.msg, "a is NULL");
    mgpu_kernels_destroy(k);
}

static void test_act_forward_values(void)
{
    /* GELU from torch.nn.functional.gelu(x, approximate="tanh") in PyTorch 1.13. */
    mgpu_kernels_t *k = cpu();
    float x[6] = {-2.0f, -0.5f, 0.0f, 0.7f, 1.0f, 3.0f}, y[6];
    double gelu[6] = {-0.04540228843688965, -0.1542859971523285, 0.0,
                      0.5305701494216919,   0.8411920070648193,  2.9963626861572266};
    double relu[6] = {0, 0, 0, 0.7, 1.0, 3.0};
    double tanh_[6], sig[6];
    for (int i = 0; i < 6; i++) {
        tanh_[i] = tanh((double)x[i]);
        sig[i] = 1.0 / (1.0 + exp(-(double)x[i]));
    }
    CHECK_INT(mgpu_k_act_forward(k, MGPU_ACT_GELU, 6, x, y, NULL), 0);
    CHECK(close_arrays("gelu", y, gelu, 6, 1e-6, 1e-6));
    CHECK_INT(mgpu_k_act_forward(k, MGPU_ACT_RELU, 6, x, y, NULL), 0);
    CHECK(close_arrays("relu", y, relu, 6, 0, 1e-7));
    CHECK_INT(mgpu_k_act_forward(k, MGPU_ACT_TANH, 6, x, y, NULL), 0);
    CHECK(close_arrays("tanh", y, tanh_, 6, 1e-7, 1e-6));
    CHECK_INT(mgpu_k_act_forward(k, MGPU_ACT_SIGMOID, 6, x, y, NULL), 0);
    CHECK(close_arrays("sigmoid", y, sig, 6, 1e-7, 1e-6));
    /* No overflow at the extremes. */
    float big[2] = {-200.0f, 200.0f}, sb[2];
    CHECK_INT(mgpu_k_act_forward(k, MGPU_ACT_SIGMOID, 2, big, sb, NULL), 0);
    CHECK(sb[0] == 0.0f && sb[1] == 1.0f);
    /* In place. */
    CHECK_INT(mgpu_k_act_forward(k, MGPU_ACT_RELU, 6, x, x, NULL), 0);
    CHECK(close_arrays("relu in place", x, relu, 6, 0, 1e-7));
    mgpu_kernels_destroy(k);
}

static void test_act_backward_finite_differences(void)
{
    mgpu_kernels_t *k = cpu();
    /* Points away from relu's kink at 0, where the derivative is not defined. */
    float z[8] = {-3.0f, -1.2f, -0.3f, 0.05f, 0.4f, 1.1f, 2.5f, 4.0f};
    float y[8], dy[8], dz[8];
    double want[8];
    for (int a = 0; a < MGPU_ACT_COUNT; a++) {
        for (int i = 0; i < 8; i++)
            dy[i] = 0.5f + 0.1f * i;
        CHECK_INT(mgpu_k_act_forward(k, a, 8, z, y, NULL), 0);
        CHECK_INT(mgpu_k_act_backward(k, a, 8, z, y, dy, dz, NULL), 0);
        for (int i = 0; i < 8; i++) {
            double h = 1e-3;
            float zp = (float)(z[i] + h), zm = (float)(z[i] - h), fp, fm;
            CHECK_INT(mgpu_k_act_forward(k, a, 1, &zp, &fp, NULL), 0);
            CHECK_INT(mgpu_k_act_forward(k, a, 1, &zm, &fm, NULL), 0);
            want[i] = dy[i] * ((double)fp - fm) / ((double)zp - zm);
        }
        char what[32];
        snprintf(what, sizeof what, "d%s", mgpu_act_name(a));
        CHECK(close_arrays(what, dz, want, 8, 2e-3, 2e-3));
        /* dz may alias dy. */
        CHECK_INT(mgpu_k_act_backward(k, a, 8, z, y, dy, dy, NULL), 0);
        CHECK(close_arrays(what, dy, want, 8, 2e-3, 2e-3));
    }
    mgpu_kernels_destroy(k);
}

static void test_bias_act_forward(void)
{
    mgpu_kernels_t *k = cpu();
    mgpu_err_t err = {0};
    float z[6] = {1, -2, 3, -4, 5, -6}, bias[3] = {0.5f, 1.0f, -1.0f}, y[6];
    double zw[6] = {1.5, -1, 2, -3.5, 6, -7}, yw[6] = {1.5, 0, 2, 0, 6, 0};
    CHECK_INT(mgpu_k_bias_act_forward(k, MGPU_ACT_RELU, 2, 3, z, bias, y, &err), 0);
    CHECK(close_arrays("z + bias", z, zw, 6, 0, 1e-7));
    CHECK(close_arrays("relu(z + bias)", y, yw, 6, 0, 1e-7));
    /* Identity in place, no bias. */
    CHECK_INT(mgpu_k_bias_act_forward(k, MGPU_ACT_IDENTITY, 2, 3, z, NULL, z, &err), 0);
    CHECK(close_arrays("identity", z, zw, 6, 0, 1e-7));
    /* In place with a real activation loses the pre-activation: refused. */
    CHECK_INT(mgpu_k_bias_act_forward(k, MGPU_ACT_TANH, 2, 3, z, bias, z, &err), -EINVAL);
    CHECK_CONTAINS(err.msg, "y == z with activation tanh");
    CHECK_INT(mgpu_k_act_forward(k, (mgpu_act_t)42, 6, z, y, &err), -EINVAL);
    CHECK_CONTAINS(err.msg, "activation 42");
    mgpu_kernels_destroy(k);
}

static void test_sum_rows(void)
{
    mgpu_kernels_t *k = cpu();
    float x[6] = {1, 2, 3, 4, 5, 6}, out[3] = {10, 20, 30};
    double w1[3] = {5, 7, 9}, w2[3] = {7.5, 10.5, 13.5};
    CHECK_INT(mgpu_k_sum_rows(k, 2, 3, x, 0.0f, out, NULL), 0);
    CHECK(close_arrays("sum_rows", out, w1, 3, 0, 1e-7));
    CHECK_INT(mgpu_k_sum_rows(k, 2, 3, x, 0.5f, out, NULL), 0); /* 0.5*[5 7 9] + [5 7 9] */
    CHECK(close_arrays("sum_rows beta", out, w2, 3, 0, 1e-7));
    /* Wide rows take the heap path. */
    float *wide = malloc(sizeof(float) * 3 * 300), wout[300];
    for (int i = 0; i < 900; i++)
        wide[i] = (float)(i % 300);
    CHECK_INT(mgpu_k_sum_rows(k, 3, 300, wide, 0.0f, wout, NULL), 0);
    CHECK(wout[0] == 0 && wout[299] == 897);
    free(wide);
    mgpu_kernels_destroy(k);
}

static void test_softmax_xent_torch_values(void)
{
    /* F.cross_entropy([[1,2,3],[0.5,-1,2]], [2,0]) = 1.0744585990905762 and its gradient. */
    mgpu_kernels_t *k = cpu();
    mgpu_err_t err = {0};
    float l[6] = {1, 2, 3, 0.5f, -1, 2}, d[6], loss = 0;
    int32_t y[2] = {2, 0};
    double gw[6] = {0.04501529037952423,  0.12236424535512924,  -0.1673794984817505,
                    -0.41235479712486267, 0.019556285813450813, 0.392798513174057};
    CHECK_INT(mgpu_k_softmax_xent(k, 2, 3, l, y, &loss, d, &err), 0);
    CHECK(fabs(loss - 1.0744585990905762) < 1e-6);
    CHECK(close_arrays("dlogits", d, gw, 6, 1e-7, 1e-6));
    /* Two equal logits: ln 2. Loss only (dlogits NULL). */
    float e[2] = {0.3f, 0.3f};
    int32_t y0 = 0;
    CHECK_INT(mgpu_k_softmax_xent(k, 1, 2, e, &y0, &loss, NULL, &err), 0);
    CHECK(fabs(loss - 0.6931471805599453) < 1e-7);
    /* Huge logits do not overflow. */
    float h[2] = {1000.0f, 0.0f};
    CHECK_INT(mgpu_k_softmax_xent(k, 1, 2, h, &y0, &loss, h, &err), 0);
    CHECK(loss == 0.0f && h[0] == 0.0f && h[1] == 0.0f);
    /* In place. */
    CHECK_INT(mgpu_k_softmax_xent(k, 2, 3, l, y, &loss, l, &err), 0);
    CHECK(close_arrays("dlogits in place", l, gw, 6, 1e-7, 1e-6));
    int32_t bad[2] = {0, 3};
    CHECK_INT(mgpu_k_softmax_xent(k, 2, 3, l, bad, &loss, d, &err), MGPU_E_RANGE);
    CHECK_CONTAINS(err.msg, "label 3 in row 1, expected 0..2");
    mgpu_kernels_destroy(k);
}

static void test_softmax_xent_finite_differences(void)
{
    mgpu_kernels_t *k = cpu();
    enum { R = 4, C = 5 };
    float l[R * C], d[R * C], loss;
    int32_t y[R] = {0, 4, 2, 2};
    double want[R * C];
    for (int i = 0; i < R * C; i++)
        l[i] = 2.0f * frand();
    CHECK_INT(mgpu_k_softmax_xent(k, R, C, l, y, &loss, d, NULL), 0);
    for (int i = 0; i < R * C; i++) {
        float keep = l[i], lp, lm, h = 1e-2f;
        l[i] = keep + h;
        CHECK_INT(mgpu_k_softmax_xent(k, R, C, l, y, &lp, NULL, NULL), 0);
        l[i] = keep - h;
        CHECK_INT(mgpu_k_softmax_xent(k, R, C, l, y, &lm, NULL, NULL), 0);
        l[i] = keep;
        want[i] = ((double)lp - lm) / (2.0 * h);
    }
    CHECK(close_arrays("dxent", d, want, R * C, 2e-4, 1e-3));
    mgpu_kernels_destroy(k);
}

static void test_mse(void)
{
    /* pred [1 2; 3 4], target [0 2; 5 1]: diffs [1 0 -2 3], loss (1+0+4+9)/4 = 3.5,
     * grad 2*d/4 = [0.5 0 -1 1.5]. */
    mgpu_kernels_t *k = cpu();
    float p[4] = {1, 2, 3, 4}, t[4] = {0, 2, 5, 1}, d[4], loss = 0;
    double dw[4] = {0.5, 0, -1, 1.5};
    CHECK_INT(mgpu_k_mse(k, 2, 2, p, t, &loss, d, NULL), 0);
    CHECK(loss == 3.5f);
    CHECK(close_arrays("dmse", d, dw, 4, 0, 1e-7));
    /* Finite differences on random values. */
    float pr[12], tr[12], dr[12];
    double want[12];
    for (int i = 0; i < 12; i++)
        pr[i] = frand(), tr[i] = frand();
    CHECK_INT(mgpu_k_mse(k, 3, 4, pr, tr, &loss, dr, NULL), 0);
    for (int i = 0; i < 12; i++) {
        float keep = pr[i], lp, lm, h = 1e-2f;
        pr[i] = keep + h;
        CHECK_INT(mgpu_k_mse(k, 3, 4, pr, tr, &lp, NULL, NULL), 0);
        pr[i] = keep - h;
        CHECK_INT(mgpu_k_mse(k, 3, 4, pr, tr, &lm, NULL, NULL), 0);
        pr[i] = keep;
        want[i] = ((double)lp - lm) / (2.0 * h);
    }
    CHECK(close_arrays("dmse fd", dr, want, 12, 1e-4, 1e-3));
    mgpu_kernels_destroy(k);
}

/* PyTorch 1.13: p = [1, -2, 0.5, 3], three steps with these gradients, then
 * torch.optim.SGD / AdamW with the hyper-parameters of each case; parameters after each step. */
static const float opt_grads[3][4] = {
    {0.5f, -1.0f, 0.25f, 2.0f}, {0.1f, 0.3f, -0.7f, 1.5f}, {-0.4f, 0.2f, 0.9f, -1.0f}};

static void run_sgd(const mgpu_sgd_hparams_t *hp, const double want[3][4], const char *name)
{
    mgpu_kernels_t *k = cpu();
    mgpu_err_t err = {0};
    float p[4] = {1.0f, -2.0f, 0.5f, 3.0f}, buf[4] = {99, 99, 99, 99}; /* step 1 overwrites */
    for (int s = 0; s < 3; s++) {
        CHECK_INT(mgpu_k_sgd_step(k, 4, p, opt_grads[s], buf, hp, s + 1, &err), 0);
        char what[64];
        snprintf(what, sizeof what, "%s step %d", name, s + 1);
        CHECK(close_arrays(what, p, want[s], 4, 2e-7, 2e-6));
    }
    mgpu_kernels_destroy(k);
}

static void test_sgd_torch_values(void)
{
    static const double plain[3][4] = {{0.949999988, -1.89999998, 0.474999994, 2.79999995},
                                       {0.939999998, -1.92999995, 0.545000017, 2.64999986},
                                       {0.980000019, -1.94999993, 0.455000013, 2.74999976}};
    static const double mom_wd[3][4] = {{0.949000001, -1.898, 0.4745, 2.79699993},
                                        {0.892150998, -1.83430195, 0.521075487, 2.46150303},
                                        {0.880094767, -1.79513943, 0.47247237, 2.25709414}};
    static const double damp[3][4] = {{0.975000024, -1.95000005, 0.487500012, 2.9000001},
                                      {0.951499999, -1.92050004, 0.502000034, 2.76750016},
                                      {0.946699977, -1.90390003, 0.48210004, 2.69650006}};
    static const double nest[3][4] = {{0.895500004, -1.79100001, 0.447750002, 2.59150004},
                                      {0.823442757, -1.74188554, 0.554221392, 2.10773087},
                                      {0.839798272, -1.70019412, 0.412795395, 1.98897684}};
    run_sgd(&(mgpu_sgd_hparams_t){.lr = 0.1f}, plain, "sgd");
    run_sgd(&(mgpu_sgd_hparams_t){.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.01f}, mom_wd,
            "sgd momentum wd");
    run_sgd(&(mgpu_sgd_hparams_t){.lr = 0.05f, .momentum = 0.8f, .dampening = 0.3f}, damp,
            "sgd dampening");
    run_sgd(
        &(mgpu_sgd_hparams_t){.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.05f, .nesterov = 1},
        nest, "sgd nesterov");
}

static void run_adamw(const mgpu_adamw_hparams_t *hp, const double want[3][4], const char *name)
{
    mgpu_kernels_t *k = cpu();
    float p[4] = {1.0f, -2.0f, 0.5f, 3.0f}, m[4] = {0}, v[4] = {0};
    for (int s = 0; s < 3; s++) {
        CHECK_INT(mgpu_k_adamw_step(k, 4, p, opt_grads[s], m, v, hp, s + 1, NULL), 0);
        char what[64];
        snprintf(what, sizeof what, "%s step %d", name, s + 1);
        CHECK(close_arrays(what, p, want[s], 4, 5e-7, 2e-6));
    }
    mgpu_kernels_destroy(k);
}

static void test_adamw_torch_values(void)
{
    static const double a1[3][4] = {{0.989899993, -1.98979998, 0.489950001, 2.98970008},
                                    {0.981770575, -1.98532248, 0.494656593, 2.9795754},
                                    {0.980735421, -1.98307872, 0.492020667, 2.97460032}};
    static const double a2[3][4] = {{0.85019958, -1.80009985, 0.375398397, 2.75004983},
                                    {0.728929281, -1.67166615, 0.408337861, 2.51445389},
                                    {0.692482829, -1.57412195, 0.358395576, 2.34886456}};
    run_adamw(
        &(mgpu_adamw_hparams_t){
            .lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f},
        a1, "adamw");
    run_adamw(
        &(mgpu_adamw_hparams_t){
            .lr = 0.1f, .beta1 = 0.8f, .beta2 = 0.9f, .eps = 1e-3f, .weight_decay = 0.5f},
        a2, "adamw betas");
}

static void test_optimizer_argument_checks(void)
{
    mgpu_kernels_t *k = cpu();
    mgpu_err_t err = {0};
    float p[1] = {0}, g[1] = {0}, m[1] = {0}, v[1] = {0};
    mgpu_sgd_hparams_t sgd = {.lr = 0.1f, .momentum = 0.9f};
    CHECK_INT(mgpu_k_sgd_step(k, 1, p, g, NULL, &sgd, 1, &err), -EINVAL);
    CHECK_CONTAINS(err.msg, "momentum_buf is NULL");
    CHECK_INT(mgpu_k_sgd_step(k, 1, p, g, m, &sgd, 0, &err), MGPU_E_RANGE);
    CHECK_CONTAINS(err.msg, "step=0");
    sgd.nesterov = 1;
    sgd.dampening = 0.5f;
    CHECK_INT(mgpu_k_sgd_step(k, 1, p, g, m, &sgd, 1, &err), MGPU_E_RANGE);
    CHECK_CONTAINS(err.msg, "nesterov");
    mgpu_adamw_hparams_t ad = {.lr = 0.1f, .beta1 = 1.0f, .beta2 = 0.9f, .eps = 1e-8f};
    CHECK_INT(mgpu_k_adamw_step(k, 1, p, g, m, v, &ad, 1, &err), MGPU_E_RANGE);
    CHECK_CONTAINS(err.msg, "betas=(1, 0.9)");
    mgpu_kernels_destroy(k);
}

/* mgpu_k_linear_loss: its arguments are checked before anything runs, and its composition
 * equals the ops it is made of, called one by one. */
static void test_linear_loss_checks_and_composition(void)
{
    mgpu_kernels_t *k = cpu();
    mgpu_err_t err = {0};
    float x[3 * 4], w[2 * 4], b[2] = {0.1f, -0.2f}, z[3 * 4], y[3 * 2], dy[3 * 2], dx[3 * 4];
    float db[4], loss = 0, y2[3 * 2], dy2[3 * 2], dx2[3 * 4], db2[4], loss2 = 0;
    int32_t lab[3] = {1, 0, 1};
    for (int i = 0; i < 12; i++)
        z[i] = (float)((i * 7) % 5) - 2.0f, x[i] = z[i] > 0 ? z[i] : 0; /* relu(z) */
    for (int i = 0; i < 8; i++)
        w[i] = (float)((i * 3) % 4) * 0.25f - 0.4f;
    mgpu_k_head_t h = {.loss = MGPU_LOSS_CROSS_ENTROPY,
                       .rows = 3,
                       .out = 2,
                       .in = 4,
                       .x = x,
                       .w = w,
                       .bias = b,
                       .y = y,
                       .labels = lab,
                       .loss_out = &loss,
                       .dy = dy,
                       .act_in = MGPU_ACT_RELU,
                       .z_in = z,
                       .dx = dx,
                       .dbias_in = db};
    CHECK_INT(mgpu_k_linear_loss(k, &h, &err), 0);
    CHECK_INT(mgpu_k_linear_forward(k, MGPU_ACT_IDENTITY, 3, 2, 4, x, w, b, y2, y2, NULL, &err), 0);
    CHECK_INT(mgpu_k_softmax_xent(k, 3, 2, y2, lab, &loss2, dy2, &err), 0);
    CHECK_INT(
        mgpu_k_linear_backward_data(k, MGPU_ACT_RELU, 3, 2, 4, dy2, w, z, x, NULL, dx2, db2, &err),
        0);
    CHECK(loss == loss2 && memcmp(y, y2, sizeof y) == 0 && memcmp(dy, dy2, sizeof dy) == 0 &&
          memcmp(dx, dx2, sizeof dx) == 0 && memcmp(db, db2, sizeof db) == 0);

    mgpu_k_head_t bad = h;
    bad.labels = NULL;
    CHECK_INT(mgpu_k_linear_loss(k, &bad, &err), -EINVAL);
    CHECK_CONTAINS(err.msg, "labels is NULL");
    bad = h;
    bad.loss = MGPU_LOSS_MSE; /* mse reads targets, and there are none */
    CHECK_INT(mgpu_k_linear_loss(k, &bad, &err), -EINVAL);
    CHECK_CONTAINS(err.msg, "targets is NULL");
    bad = h;
    bad.loss = (mgpu_loss_t)7;
    CHECK_INT(mgpu_k_linear_loss(k, &bad, &err), -EINVAL);
    CHECK_CONTAINS(err.msg, "loss 7 unknown");
    bad = h;
    bad.rows = 0;
    CHECK_INT(mgpu_k_linear_loss(k, &bad, &err), -EINVAL);
    CHECK_CONTAINS(err.msg, "rows=0");
    bad = h;
    bad.z_in = NULL;
    CHECK_INT(mgpu_k_linear_loss(k, &bad, &err), -EINVAL);
    CHECK_CONTAINS(err.msg, "z_in is NULL");
    CHECK_INT(mgpu_k_linear_loss(k, NULL, &err), -EINVAL);
    mgpu_kernels_destroy(k);
}

static void test_scale_sum_argmax_correct(void)
{
    mgpu_kernels_t *k = cpu();
    float x[6] = {1, 5, 5, -1, -3, -2}, s = 0, correct = -1;
    int32_t am[2], labels[2] = {1, 2};
    CHECK_INT(mgpu_k_sum(k, 6, x, &s, NULL), 0);
    CHECK(s == 5.0f);
    CHECK_INT(mgpu_k_argmax_rows(k, 2, 3, x, am, NULL), 0);
    CHECK_INT(am[0], 1); /* the first of two equal maxima, as torch.argmax */
    CHECK_INT(am[1], 0);
    CHECK_INT(mgpu_k_count_correct(k, 2, 3, x, labels, &correct, NULL), 0);
    CHECK(correct == 1.0f);
    CHECK_INT(mgpu_k_scale(k, 6, 0.5f, x, NULL), 0);
    CHECK(x[1] == 2.5f && x[4] == -1.5f);
    CHECK_INT(mgpu_k_sum(k, 0, NULL, &s, NULL), 0);
    CHECK(s == 0.0f);
    mgpu_kernels_destroy(k);
}

static void test_memory_and_backends(void)
{
    mgpu_kernels_t *k = cpu();
    mgpu_err_t err = {0};
    float host[5] = {1, 2, 3, 4, 5}, back[5] = {0};
    void *d = NULL, *d2 = NULL;
    CHECK_INT(mgpu_k_alloc(k, sizeof host, &d, &err), 0);
    CHECK_INT(mgpu_k_alloc(k, sizeof host, &d2, &err), 0);
    CHECK_INT(mgpu_k_copy_to_device(k, d, host, sizeof host, &err), 0);
    CHECK_INT(mgpu_k_copy(k, d2, d, sizeof host, &err), 0);
    CHECK_INT(mgpu_k_copy_to_host(k, back, d2, sizeof host, &err), 0);
    CHECK(memcmp(host, back, sizeof host) == 0);
    CHECK_INT(mgpu_k_zero(k, d2, sizeof host, &err), 0);
    CHECK_INT(mgpu_k_copy_to_host(k, back, d2, sizeof host, &err), 0);
    CHECK(back[0] == 0 && back[4] == 0);
    CHECK_INT(mgpu_k_sync(k, &err), 0);
    mgpu_k_free(k, d);
    mgpu_k_free(k, d2);
    CHECK_INT(mgpu_kernels_set_precision(k, MGPU_PREC_TF32, &err), 0);
    CHECK_INT(mgpu_kernels_set_precision(k, (mgpu_precision_t)7, &err), -EINVAL);
    mgpu_kernels_destroy(k);

    CHECK_INT(mgpu_act_parse("GELU"), MGPU_ACT_GELU);
    CHECK_INT(mgpu_act_parse("swish"), -1);
    CHECK_INT(mgpu_precision_parse("bf16"), MGPU_PREC_BF16);
    CHECK_STR(mgpu_act_name(MGPU_ACT_SIGMOID), "sigmoid");
    CHECK(mgpu_kernels_available(MGPU_KBACKEND_CPU));
    if (!mgpu_kernels_available(MGPU_KBACKEND_CUDA)) {
        mgpu_kernels_t *none = NULL;
        CHECK_INT(mgpu_kernels_create(MGPU_KBACKEND_CUDA, 0, &none, &err), MGPU_E_DEVICE);
        CHECK_CONTAINS(err.msg, "not in this build");
        CHECK(none == NULL);
    }
}

/* The knobs: defaults when unset, today's values accepted, a value that would have been
 * misread (atoi's "7x", a split that is not a power of two, a typo) refused with its name; a
 * backend does not start on a bad one. (Each test runs in its own process: setenv is local.) */
static void test_options(void)
{
    mgpu_kernels_options_t o;
    mgpu_err_t err = {0};
    CHECK_INT(mgpu_kernels_options_read(&o, &err), 0);
    CHECK_INT(o.lt_epi, 7);
    CHECK_INT(o.sg_ops_fp32, 7);
    CHECK_INT(o.sg_ops_tf32, 2);
    CHECK_INT(o.sg_split, 0);
    CHECK(!o.lt_off && !o.sg_off && !o.head_off && !o.cpu_gemm_portable);
    setenv("MGPU_CUDA_LT", "0", 1);
    setenv("MGPU_LT_EPI", "3", 1);
    setenv("MGPU_SG_SPLIT", "4", 1);
    setenv("MGPU_CPU_GEMM", "portable", 1);
    CHECK_INT(mgpu_kernels_options_read(&o, &err), 0);
    CHECK(o.lt_off && o.cpu_gemm_portable);
    CHECK_INT(o.lt_epi, 3);
    CHECK_INT(o.sg_split, 4);
    setenv("MGPU_LT_EPI", "7x", 1);
    CHECK_INT(mgpu_kernels_options_read(&o, &err), MGPU_E_USAGE);
    CHECK_CONTAINS(err.msg, "MGPU_LT_EPI=\"7x\"");
    setenv("MGPU_LT_EPI", "7", 1);
    setenv("MGPU_SG_SPLIT", "3", 1);
    CHECK_INT(mgpu_kernels_options_read(&o, &err), MGPU_E_USAGE);
    CHECK_CONTAINS(err.msg, "MGPU_SG_SPLIT");
    setenv("MGPU_SG_SPLIT", "0", 1);
    CHECK_INT(mgpu_kernels_options_read(&o, &err), 0);
    CHECK_INT(o.att_group_fwd, -1); /* unset: the kernel's own default */
    CHECK_INT(o.att_group_bwd, -1);
    setenv("MGPU_GPT_ATT_GROUP_FWD", "16", 1);
    setenv("MGPU_GPT_ATT_GROUP_BWD", "0", 1);
    CHECK_INT(mgpu_kernels_options_read(&o, &err), 0);
    CHECK_INT(o.att_group_fwd, 16);
    CHECK_INT(o.att_group_bwd, 0);
    setenv("MGPU_GPT_ATT_GROUP_BWD", "all", 1);
    CHECK_INT(mgpu_kernels_options_read(&o, &err), MGPU_E_USAGE);
    CHECK_CONTAINS(err.msg, "MGPU_GPT_ATT_GROUP_BWD=\"all\", expected a number of heads >= 0");
    unsetenv("MGPU_GPT_ATT_GROUP_FWD");
    unsetenv("MGPU_GPT_ATT_GROUP_BWD");
    CHECK_INT(mgpu_kernels_options_read(&o, &err), 0);
    CHECK_INT(o.wg_beside, -1); /* unset: gpt_linear.cu's rule by rows */
    setenv("MGPU_GPT_WG_BESIDE", "1", 1);
    CHECK_INT(mgpu_kernels_options_read(&o, &err), 0);
    CHECK_INT(o.wg_beside, 1);
    setenv("MGPU_GPT_WG_BESIDE", "yes", 1);
    CHECK_INT(mgpu_kernels_options_read(&o, &err), MGPU_E_USAGE);
    CHECK_CONTAINS(err.msg, "MGPU_GPT_WG_BESIDE=\"yes\", expected 0 or 1");
    unsetenv("MGPU_GPT_WG_BESIDE");
    setenv("MGPU_CPU_GEMM", "portabel", 1);
    mgpu_kernels_t *k = NULL;
    CHECK_INT(mgpu_kernels_create(MGPU_KBACKEND_CPU, -1, &k, &err), MGPU_E_USAGE);
    CHECK_CONTAINS(err.msg, "MGPU_CPU_GEMM");
    CHECK(k == NULL);
}

int main(void)
{
    RUN(test_options);
    RUN(test_gemm_hand);
    RUN(test_gemm_shapes);
    RUN(test_gemm_shapes_portable_kernel);
    RUN(test_gemm_k0_and_alpha0);
    RUN(test_gemm_rejects_bad_shapes);
    RUN(test_act_forward_values);
    RUN(test_act_backward_finite_differences);
    RUN(test_bias_act_forward);
    RUN(test_sum_rows);
    RUN(test_softmax_xent_torch_values);
    RUN(test_softmax_xent_finite_differences);
    RUN(test_mse);
    RUN(test_sgd_torch_values);
    RUN(test_adamw_torch_values);
    RUN(test_optimizer_argument_checks);
    RUN(test_linear_loss_checks_and_composition);
    RUN(test_scale_sum_argmax_correct);
    RUN(test_memory_and_backends);
    return check_done();
}
