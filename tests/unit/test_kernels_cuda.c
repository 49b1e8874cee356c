/* test_kernels_cuda.c - every op of the CUDA backend against the plain-C reference
 * (kernels_cpu.c), both called through kernels.h on the same random inputs of awkward sizes
 * (1, 3, 127, 1000, 4099, ...), on 16-byte aligned buffers (the float4 paths) and on buffers
 * one float off (the scalar paths). GPU outputs are poisoned with NaN before each op so an
 * element the kernel forgot to write fails. Mismatches print the first few elements and the
 * largest difference. Tolerances per op and per GEMM precision are given where they are used.
 *
 * Skips when the build has no CUDA or the machine has no CUDA device (CI, laptops); run it on
 * a GPU machine: build/tests/test_kernels_cuda. */
#include "check.h"
#include "kernels.h"

#if defined(MGPU_HAVE_CUDA) && MGPU_HAVE_CUDA
#include "kernels_cuda.h" /* mgpu_kernels_cuda_device_count, _stream, _transpose */
#endif

/* small_gemm.cu's launches on k so far (0 without CUDA). */
static long long small_gemms(const mgpu_kernels_t *k)
{
#if defined(MGPU_HAVE_CUDA) && MGPU_HAVE_CUDA
    return mgpu_kernels_cuda_small_gemms(k);
#else
    (void)k;
    return 0;
#endif
}

#include <math.h>   /* fabs, sqrt, NAN, isnan */
#include <stdarg.h> /* va_list: close_to_dev's message */
#include <stdint.h> /* int32_t */
#include <stdlib.h> /* aligned_alloc, free */

typedef struct env {
    mgpu_kernels_t *cpu, *gpu;
    mgpu_err_t err;
} env_t;

/* Fails the test (not the binary) with the backend's message when call returns non-zero. */
#define OK(e, call)                                                                                \
    do {                                                                                           \
        int ok_rc_ = (call);                                                                       \
        if (ok_rc_ != 0) {                                                                         \
            printf("  %s:%d: %s = %d: %s\n", __FILE__, __LINE__, #call, ok_rc_, (e)->err.msg);     \
            check_failed++;                                                                        \
        }                                                                                          \
    } while (0)

static void env_open(env_t *e)
{
    e->cpu = e->gpu = NULL;
    e->err.msg[0] = '\0';
#if !(defined(MGPU_HAVE_CUDA) && MGPU_HAVE_CUDA)
    SKIP("built without CUDA (CUDA=0 or no nvcc)");
#else
    /* Initialises CUDA here, in the test's own forked process, never in the parent. */
    if (mgpu_kernels_cuda_device_count(&e->err) <= 0)
        SKIP("no CUDA device%s%s", e->err.msg[0] ? ": " : "", e->err.msg);
    if (mgpu_kernels_create(MGPU_KBACKEND_CPU, -1, &e->cpu, &e->err) != 0 ||
        mgpu_kernels_create(MGPU_KBACKEND_CUDA, 0, &e->gpu, &e->err) != 0) {
        printf("  mgpu_kernels_create: %s\n", e->err.msg);
        exit(1);
    }
#endif
}

static void env_close(env_t *e)
{
    OK(e, mgpu_k_sync(e->gpu, &e->err));
    mgpu_kernels_destroy(e->gpu);
    mgpu_kernels_destroy(e->cpu);
}

static const char *mgpu_loss_name_k(mgpu_loss_t l)
{
    return l == MGPU_LOSS_CROSS_ENTROPY ? "cross_entropy" : "mse";
}

static unsigned long long rng_state = 0x9e3779b97f4a7c15ULL;
static float frand(void) /* uniform in [-1, 1) */
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((rng_state >> 40) / (double)(1ULL << 24)) * 2.0f - 1.0f;
}

static float *hbuf(size_t n)
{
    size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
    float *p = aligned_alloc(64, bytes ? bytes : 64);
    if (p == NULL) {
        printf("  aligned_alloc(%zu) failed\n", bytes);
        exit(1);
    }
    return p;
}

static float *hrand(size_t n, float scale)
{
    float *p = hbuf(n);
    for (size_t i = 0; i < n; i++)
        p[i] = frand() * scale;
    return p;
}

static float *hcopy(const float *src, size_t n)
{
    float *p = hbuf(n);
    for (size_t i = 0; i < n; i++)
        p[i] = src[i];
    return p;
}

/* A GPU buffer of n + off floats; returns its base in *base (to free) and base + off. */
static float *dalloc(env_t *e, size_t n, size_t off, void **base)
{
    void *p = NULL;
    if (mgpu_k_alloc(e->gpu, (n + off + 1) * sizeof(float), &p, &e->err) != 0) {
        printf("  mgpu_k_alloc(%zu floats): %s\n", n + off + 1, e->err.msg);
        exit(1);
    }
    *base = p;
    return (float *)p + off;
}

/* GPU copy of h[0..n) at offset off. */
static float *dupd(env_t *e, const float *h, size_t n, size_t off, void **base)
{
    float *d = dalloc(e, n, off, base);
    OK(e, mgpu_k_copy_to_device(e->gpu, d, h, n * sizeof(float), &e->err));
    return d;
}

/* GPU buffer of n NaNs at offset off: what a kernel leaves unwritten stays NaN. */
static float *dpoison(env_t *e, size_t n, size_t off, void **base)
{
    float *h = hbuf(n);
    for (size_t i = 0; i < n; i++)
        h[i] = NAN;
    float *d = dupd(e, h, n, off, base);
    free(h);
    return d;
}

static float *down(env_t *e, const float *d, size_t n)
{
    float *h = hbuf(n);
    OK(e, mgpu_k_copy_to_host(e->gpu, h, d, n * sizeof(float), &e->err));
    return h;
}

/* |got - want| <= atol + rtol * |want| element by element (NaN never passes); prints the
 * first mismatches and the largest difference. */
static int close_to(const char *what, const float *got, const float *want, size_t n, double atol,
                    double rtol)
{
    size_t bad = 0, worst_i = 0;
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        if (isnan(got[i]) != isnan(want[i]))
            d = INFINITY;
        else if (isnan(got[i]))
            d = 0.0; /* both NaN: the reference says NaN too */
        if (d > worst) {
            worst = d;
            worst_i = i;
        }
        if (!(d <= atol + rtol * fabs((double)want[i]))) {
            if (bad < 5)
                printf("  %s[%zu] = %.9g, expected %.9g (diff %.3g)\n", what, i, got[i], want[i],
                       d);
            bad++;
        }
    }
    if (bad) {
        printf("  %s: %zu of %zu mismatched (atol %.2g, rtol %.2g), largest difference %.3g at "
               "[%zu]\n",
               what, bad, n, atol, rtol, worst, worst_i);
        check_failed++;
    }
    return bad == 0;
}

/* close_to on n floats of the GPU buffer d, named by a printf format. */
static int __attribute__((format(printf, 7, 8)))
close_to_dev(env_t *e, const float *d, const float *want, size_t n, double atol, double rtol,
             const char *fmt, ...)
{
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    float *got = down(e, d, n);
    int ok = close_to(what, got, want, n, atol, rtol);
    free(got);
    return ok;
}

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

/* --- activations ------------------------------------------------------------------------------ */

/* Transcendentals differ by a few ulp between glibc and CUDA's libdevice. */
#define ACT_ATOL 2e-6
#define ACT_RTOL 1e-5

static const size_t ew_sizes[] = {1, 3, 127, 1000, 4099, (1u << 20) + 3};

static void test_act_forward(void)
{
    env_t e;
    env_open(&e);
    for (int act = 0; act < MGPU_ACT_COUNT; act++)
        for (size_t s = 0; s < sizeof ew_sizes / sizeof *ew_sizes; s++)
            for (size_t off = 0; off < 2; off++) {
                size_t n = ew_sizes[s];
                void *bx, *by;
                float *x = hrand(n, 6.0f), *want = hbuf(n);
                float *dx = dupd(&e, x, n, off, &bx), *dy = dpoison(&e, n, off, &by);
                OK(&e, mgpu_k_act_forward(e.cpu, act, n, x, want, &e.err));
                OK(&e, mgpu_k_act_forward(e.gpu, act, n, dx, dy, &e.err));
                float *got = down(&e, dy, n);
                char what[96];
                snprintf(what, sizeof what, "act_forward %s n=%zu off=%zu", mgpu_act_name(act), n,
                         off);
                close_to(what, got, want, n, ACT_ATOL, ACT_RTOL);
                free(got);
                /* In place: y == x. */
                OK(&e, mgpu_k_act_forward(e.gpu, act, n, dx, dx, &e.err));
                got = down(&e, dx, n);
                close_to(what, got, want, n, ACT_ATOL, ACT_RTOL);
                free(got);
                free(x);
                free(want);
                mgpu_k_free(e.gpu, bx);
                mgpu_k_free(e.gpu, by);
            }
    env_close(&e);
}

static void test_bias_act_forward(void)
{
    static const int shapes[][2] = {{1, 1}, {3, 5}, {127, 33}, {7, 128}, {1000, 4099}, {4099, 4}};
    env_t e;
    env_open(&e);
    for (int act = 0; act < MGPU_ACT_COUNT; act++)
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
            for (int variant = 0; variant < 3; variant++) {
                /* 0: aligned with bias; 1: one float off with bias; 2: no bias. */
                int rows = shapes[s][0], cols = shapes[s][1];
                size_t n = (size_t)rows * cols, off = variant == 1;
                int has_bias = variant != 2;
                void *bz, *bb = NULL, *by;
                float *z = hrand(n, 4.0f), *bias = hrand(cols, 1.0f), *y = hbuf(n);
                float *dz = dupd(&e, z, n, off, &bz), *dy = dpoison(&e, n, off, &by);
                float *dbias = has_bias ? dupd(&e, bias, cols, off, &bb) : NULL;
                OK(&e, mgpu_k_bias_act_forward(e.cpu, act, rows, cols, z, has_bias ? bias : NULL, y,
                                               &e.err));
                OK(&e, mgpu_k_bias_act_forward(e.gpu, act, rows, cols, dz, dbias, dy, &e.err));
                float *gz = down(&e, dz, n), *gy = down(&e, dy, n);
                char what[112];
                snprintf(what, sizeof what, "bias_act_forward %s %dx%d variant %d z",
                         mgpu_act_name(act), rows, cols, variant);
                close_to(what, gz, z, n, 0.0, 0.0); /* one fp32 add: exact */
                what[strlen(what) - 1] = 'y';
                close_to(what, gy, y, n, ACT_ATOL, ACT_RTOL);
                free(gz);
                free(gy);
                if (act == MGPU_ACT_IDENTITY && has_bias) {
                    /* y == z is allowed for identity: z gets the bias once, in place. */
                    float *z2 = hrand(n, 4.0f), *w = hcopy(z2, n);
                    OK(&e, mgpu_k_copy_to_device(e.gpu, dz, z2, n * sizeof(float), &e.err));
                    OK(&e, mgpu_k_bias_act_forward(e.cpu, act, rows, cols, w, bias, w, &e.err));
                    OK(&e, mgpu_k_bias_act_forward(e.gpu, act, rows, cols, dz, dbias, dz, &e.err));
                    gz = down(&e, dz, n);
                    close_to("bias_act_forward identity in place", gz, w, n, 0.0, 0.0);
                    free(gz);
                    free(z2);
                    free(w);
                }
                free(z);
                free(bias);
                free(y);
                mgpu_k_free(e.gpu, bz);
                mgpu_k_free(e.gpu, bb);
                mgpu_k_free(e.gpu, by);
            }
    env_close(&e);
}

static void test_act_backward(void)
{
    env_t e;
    env_open(&e);
    for (int act = 0; act < MGPU_ACT_COUNT; act++)
        for (size_t s = 0; s < sizeof ew_sizes / sizeof *ew_sizes; s++)
            for (size_t off = 0; off < 2; off++) {
                size_t n = ew_sizes[s];
                void *bz, *by, *bdy, *bdz;
                float *z = hrand(n, 6.0f), *y = hbuf(n), *dy = hrand(n, 1.0f), *want = hbuf(n);
                OK(&e, mgpu_k_act_forward(e.cpu, act, n, z, y, &e.err));
                OK(&e, mgpu_k_act_backward(e.cpu, act, n, z, y, dy, want, &e.err));
                float *dz_ = dupd(&e, z, n, off, &bz), *dy_ = dupd(&e, y, n, off, &by);
                float *ddy = dupd(&e, dy, n, off, &bdy), *ddz = dpoison(&e, n, off, &bdz);
                OK(&e, mgpu_k_act_backward(e.gpu, act, n, dz_, dy_, ddy, ddz, &e.err));
                float *got = down(&e, ddz, n);
                char what[96];
                snprintf(what, sizeof what, "act_backward %s n=%zu off=%zu", mgpu_act_name(act), n,
                         off);
                close_to(what, got, want, n, ACT_ATOL, ACT_RTOL);
                free(got);
                /* In place: dz == dy. */
                OK(&e, mgpu_k_act_backward(e.gpu, act, n, dz_, dy_, ddy, ddy, &e.err));
                got = down(&e, ddy, n);
                close_to(what, got, want, n, ACT_ATOL, ACT_RTOL);
                free(got);
                free(z);
                free(y);
                free(dy);
                free(want);
                mgpu_k_free(e.gpu, bz);
                mgpu_k_free(e.gpu, by);
                mgpu_k_free(e.gpu, bdy);
                mgpu_k_free(e.gpu, bdz);
            }
    env_close(&e);
}

/* --- reductions and losses ---------------------------------------------------------------------
 */

static void test_sum_rows(void)
{
    static const int shapes[][2] = {{1, 1},    {3, 5},      {127, 33}, {1000, 257},
                                    {4099, 3}, {8192, 130}, {0, 5},    {2, 4099}};
    env_t e;
    env_open(&e);
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int with_beta = 0; with_beta < 2; with_beta++) {
            int rows = shapes[s][0], cols = shapes[s][1];
            size_t n = (size_t)rows * cols;
            float beta = with_beta ? 0.5f : 0.0f;
            void *bx, *bo;
            float *x = hrand(n, 1.0f), *out = hrand(cols, 1.0f);
            float *dx = dupd(&e, x, n, 0, &bx);
            float *dout = with_beta ? dupd(&e, out, cols, 0, &bo) : dpoison(&e, cols, 0, &bo);
            OK(&e, mgpu_k_sum_rows(e.cpu, rows, cols, x, beta, out, &e.err));
            OK(&e, mgpu_k_sum_rows(e.gpu, rows, cols, dx, beta, dout, &e.err));
            float *got = down(&e, dout, cols);
            char what[80];
            snprintf(what, sizeof what, "sum_rows %dx%d beta=%g", rows, cols, beta);
            /* fp32 partial sums against the reference's double: error ~ eps * sqrt(rows). */
            close_to(what, got, out, cols, 1e-6 * (sqrt((double)rows) + 1.0), 1e-6);
            free(got);
            free(x);
            free(out);
            mgpu_k_free(e.gpu, bx);
            mgpu_k_free(e.gpu, bo);
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

static void test_softmax_xent(void)
{
    /* Every path: 1, 2, 4 or 8 lanes per row for rows of up to 4, 8, 16, 32 (one and two rows
     * a lane group: many rows), a warp per row with 2..32 values per lane (up to 64, 128, 256,
     * 512, 1024), a block per row with 8, 16, 32 values per thread (up to 8192), a cluster of
     * 1, 2, 4 or 8 blocks with 16 or 32 values per thread (up to 65536; staged through shared
     * memory when the rows are a multiple of 4 floats: 10000, 32768, 20000 with more rows than
     * clusters; not for 8193, 16385, 20001), and the two-pass kernel for wider rows. */
    static const int shapes[][2] = {
        {1, 1},       {3, 5},     {127, 10},  {4099, 3},  {140000, 3}, {1000, 7},    {999, 13},
        {20000, 32},  {77, 50},   {9, 100},   {65, 200},  {31, 300},   {1000, 1000}, {5, 1025},
        {33, 4099},   {2, 8192},  {1, 8193},  {3, 10000}, {5, 16385},  {3, 32768},   {300, 20000},
        {200, 20001}, {4, 40000}, {2, 65536}, {2, 70000}};
    env_t e;
    env_open(&e);
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int variant = 0; variant < 3; variant++) {
            /* 0: separate dlogits; 1: no dlogits; 2: dlogits == logits. Logits up to +-20
             * so the max subtraction matters. */
            int rows = shapes[s][0], cols = shapes[s][1];
            size_t n = (size_t)rows * cols;
            void *bl, *blab, *bloss, *bd = NULL;
            float *l = hrand(n, 20.0f), *dl = hbuf(n), loss = 0.0f;
            int32_t *lab = malloc(sizeof(int32_t) * rows);
            for (int r = 0; r < rows; r++)
                lab[r] = (int32_t)((frand() * 0.5f + 0.5f) * cols) % cols;
            OK(&e, mgpu_k_softmax_xent(e.cpu, rows, cols, l, lab, &loss, dl, &e.err));
            float *dlog = dupd(&e, l, n, 0, &bl), *dloss = dpoison(&e, 1, 0, &bloss);
            int32_t *dlab = (int32_t *)dalloc(&e, rows, 0, &blab);
            OK(&e, mgpu_k_copy_to_device(e.gpu, dlab, lab, sizeof(int32_t) * rows, &e.err));
            float *ddl = variant == 0 ? dpoison(&e, n, 0, &bd) : variant == 2 ? dlog : NULL;
            OK(&e, mgpu_k_softmax_xent(e.gpu, rows, cols, dlog, dlab, dloss, ddl, &e.err));
            float *gl = down(&e, dloss, 1);
            char what[80];
            snprintf(what, sizeof what, "softmax_xent %dx%d variant %d loss", rows, cols, variant);
            close_to(what, gl, &loss, 1, 1e-5, 1e-5);
            if (ddl != NULL) {
                float *gd = down(&e, ddl, n);
                snprintf(what, sizeof what, "softmax_xent %dx%d variant %d dlogits", rows, cols,
                         variant);
                /* The float log-sum-exp (|lse| <= ~25) is off by up to ~2e-6, which moves every
                 * probability by that much relative: up to ~3e-6 / rows where p is near 1. */
                close_to(what, gd, dl, n, 5e-6 / rows, 2e-5);
                free(gd);
            }
            free(gl);
            free(l);
            free(dl);
            free(lab);
            mgpu_k_free(e.gpu, bl);
            mgpu_k_free(e.gpu, blab);
            mgpu_k_free(e.gpu, bloss);
            mgpu_k_free(e.gpu, bd);
        }
    env_close(&e);
}

/* The GPU cannot report a bad label without a sync: that row's loss and gradient are NaN. */
static void test_softmax_xent_bad_label_is_nan(void)
{
    env_t e;
    env_open(&e);
    float l[6] = {1, 2, 3, 4, 5, 6};
    int32_t lab[2] = {1, 3}; /* 3 is out of range for 3 classes */
    void *bl, *blab, *bloss;
    float *dl = dupd(&e, l, 6, 0, &bl), *dloss = dalloc(&e, 1, 0, &bloss);
    int32_t *dlab = (int32_t *)dalloc(&e, 2, 0, &blab);
    OK(&e, mgpu_k_copy_to_device(e.gpu, dlab, lab, sizeof lab, &e.err));
    OK(&e, mgpu_k_softmax_xent(e.gpu, 2, 3, dl, dlab, dloss, dl, &e.err));
    float *loss = down(&e, dloss, 1), *grad = down(&e, dl, 6);
    CHECK(isnan(loss[0]));
    CHECK(!isnan(grad[0]) && !isnan(grad[2]));
    CHECK(isnan(grad[3]) && isnan(grad[5]));
    free(loss);
    free(grad);
    mgpu_k_free(e.gpu, bl);
    mgpu_k_free(e.gpu, blab);
    mgpu_k_free(e.gpu, bloss);
    env_close(&e);
}

static void test_mse(void)
{
    static const int shapes[][2] = {{1, 1}, {3, 5}, {127, 1}, {1000, 2}, {4099, 7}, {1024, 1025}};
    env_t e;
    env_open(&e);
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int variant = 0; variant < 3; variant++) {
            /* 0: aligned with dpred; 1: one float off with dpred; 2: no dpred. */
            int rows = shapes[s][0], cols = shapes[s][1];
            size_t n = (size_t)rows * cols, off = variant == 1;
            void *bp, *bt, *bloss, *bd = NULL;
            float *p = hrand(n, 3.0f), *t = hrand(n, 3.0f), *dp = hbuf(n), loss = 0.0f;
            OK(&e, mgpu_k_mse(e.cpu, rows, cols, p, t, &loss, dp, &e.err));
            float *gp = dupd(&e, p, n, off, &bp), *gt = dupd(&e, t, n, off, &bt);
            float *gloss = dpoison(&e, 1, 0, &bloss);
            float *gd = variant == 2 ? NULL : dpoison(&e, n, off, &bd);
            OK(&e, mgpu_k_mse(e.gpu, rows, cols, gp, gt, gloss, gd, &e.err));
            float *hl = down(&e, gloss, 1);
            char what[80];
            snprintf(what, sizeof what, "mse %dx%d variant %d loss", rows, cols, variant);
            close_to(what, hl, &loss, 1, 0.0, 1e-5);
            if (gd != NULL) {
                float *hd = down(&e, gd, n);
                snprintf(what, sizeof what, "mse %dx%d variant %d dpred", rows, cols, variant);
                close_to(what, hd, dp, n, 0.0, 1e-6);
                free(hd);
            }
            free(hl);
            free(p);
            free(t);
            free(dp);
            mgpu_k_free(e.gpu, bp);
            mgpu_k_free(e.gpu, bt);
            mgpu_k_free(e.gpu, bloss);
            mgpu_k_free(e.gpu, bd);
        }
    env_close(&e);
}

static void test_scale_and_sum(void)
{
    static const size_t sizes[] = {0, 1, 3, 127, 1000, 4099, (1u << 22) + 3};
    env_t e;
    env_open(&e);
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
        for (size_t off = 0; off < 2; off++) {
            size_t n = sizes[s];
            void *bx, *bs;
            float *x = hrand(n, 1.0f), sum = 0.0f;
            float *dx = dupd(&e, x, n, off, &bx), *ds = dpoison(&e, 1, 0, &bs);
            double abs_sum = 0.0;
            for (size_t i = 0; i < n; i++)
                abs_sum += fabs(x[i]);
            OK(&e, mgpu_k_sum(e.cpu, n, x, &sum, &e.err));
            OK(&e, mgpu_k_sum(e.gpu, n, dx, ds, &e.err));
            float *got = down(&e, ds, 1);
            char what[64];
            snprintf(what, sizeof what, "sum n=%zu off=%zu", n, off);
            /* Float partials against double: bounded by a few eps of the sum of |x|. */
            close_to(what, got, &sum, 1, 1e-6 * abs_sum + 1e-7, 0.0);
            free(got);
            if (n > 0) {
                OK(&e, mgpu_k_scale(e.cpu, n, -0.375f, x, &e.err));
                OK(&e, mgpu_k_scale(e.gpu, n, -0.375f, dx, &e.err));
                got = down(&e, dx, n);
                snprintf(what, sizeof what, "scale n=%zu off=%zu", n, off);
                close_to(what, got, x, n, 0.0, 0.0);
                free(got);
            }
            free(x);
            mgpu_k_free(e.gpu, bx);
            mgpu_k_free(e.gpu, bs);
        }
    env_close(&e);
}

static void test_argmax_and_count_correct(void)
{
    static const int shapes[][2] = {{1, 1},     {3, 5},     {127, 10}, {1000, 1000},
                                    {17, 4099}, {4099, 33}, {0, 4}};
    env_t e;
    env_open(&e);
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int ties = 0; ties < 2; ties++) {
            int rows = shapes[s][0], cols = shapes[s][1];
            size_t n = (size_t)rows * cols;
            /* ties: values from {-2, -1, 0, 1}, so most rows hold their maximum more than once
             * and only "the first index" decides. */
            float *x = hrand(n, 2.0f);
            if (ties)
                for (size_t i = 0; i < n; i++)
                    x[i] = floorf(x[i]);
            int32_t *lab = malloc(sizeof(int32_t) * (rows + 1)),
                    *want = malloc(sizeof(int32_t) * (rows + 1));
            for (int r = 0; r < rows; r++)
                lab[r] = (int32_t)((frand() * 0.5f + 0.5f) * cols) % cols;
            float count = -1.0f;
            void *bx, *blab, *bout, *bc;
            float *dx = dupd(&e, x, n, 0, &bx);
            int32_t *dlab = (int32_t *)dalloc(&e, rows, 0, &blab);
            int32_t *dout = (int32_t *)dalloc(&e, rows, 0, &bout);
            float *dcount = dpoison(&e, 1, 0, &bc);
            OK(&e, mgpu_k_copy_to_device(e.gpu, dlab, lab, sizeof(int32_t) * rows, &e.err));
            OK(&e, mgpu_k_argmax_rows(e.cpu, rows, cols, x, want, &e.err));
            OK(&e, mgpu_k_count_correct(e.cpu, rows, cols, x, lab, &count, &e.err));
            OK(&e, mgpu_k_argmax_rows(e.gpu, rows, cols, dx, dout, &e.err));
            OK(&e, mgpu_k_count_correct(e.gpu, rows, cols, dx, dlab, dcount, &e.err));
            if (rows > 0) {
                int32_t *got = malloc(sizeof(int32_t) * rows);
                OK(&e, mgpu_k_copy_to_host(e.gpu, got, dout, sizeof(int32_t) * rows, &e.err));
                int bad = 0;
                for (int r = 0; r < rows; r++)
                    if (got[r] != want[r] && bad++ < 5)
                        printf("  argmax_rows %dx%d ties=%d: row %d = %d, expected %d\n", rows,
                               cols, ties, r, got[r], want[r]);
                CHECK_INT(bad, 0);
                free(got);
            }
            float *gc = down(&e, dcount, 1);
            char what[80];
            snprintf(what, sizeof what, "count_correct %dx%d ties=%d", rows, cols, ties);
            close_to(what, gc, &count, 1, 0.0, 0.0);
            free(gc);
            free(x);
            free(lab);
            free(want);
            mgpu_k_free(e.gpu, bx);
            mgpu_k_free(e.gpu, blab);
            mgpu_k_free(e.gpu, bout);
            mgpu_k_free(e.gpu, bc);
        }
    env_close(&e);
}

/* --- optimizers ------------------------------------------------------------------------------ */

/* FMA contraction on the GPU and separate rounding on the CPU differ by an ulp or so a step. */
#define OPT_ATOL 1e-6
#define OPT_RTOL 1e-5

static void test_sgd(void)
{
    static const mgpu_sgd_hparams_t hps[] = {
        {.lr = 0.1f, .momentum = 0.0f, .dampening = 0.0f, .weight_decay = 0.01f, .nesterov = 0},
        {.lr = 0.05f, .momentum = 0.9f, .dampening = 0.1f, .weight_decay = 0.0f, .nesterov = 0},
        {.lr = 0.05f, .momentum = 0.9f, .dampening = 0.0f, .weight_decay = 1e-3f, .nesterov = 1},
    };
    static const size_t sizes[] = {1, 3, 127, 4099, (1u << 20) + 1};
    env_t e;
    env_open(&e);
    for (size_t h = 0; h < sizeof hps / sizeof *hps; h++)
        for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
            for (size_t off = 0; off < 2; off++) {
                size_t n = sizes[s];
                void *bp, *bg, *bb;
                float *p = hrand(n, 1.0f), *buf = hbuf(n);
                float *dp = dupd(&e, p, n, off, &bp), *dg = dalloc(&e, n, off, &bg);
                /* The first step must not read the buffer: NaN there must not leak. */
                float *dbuf = dpoison(&e, n, off, &bb);
                for (long long step = 1; step <= 3; step++) {
                    float *g = hrand(n, 1.0f);
                    OK(&e, mgpu_k_copy_to_device(e.gpu, dg, g, n * sizeof(float), &e.err));
                    OK(&e, mgpu_k_sgd_step(e.cpu, n, p, g, buf, &hps[h], step, &e.err));
                    OK(&e, mgpu_k_sgd_step(e.gpu, n, dp, dg, dbuf, &hps[h], step, &e.err));
                    free(g);
                }
                float *gp = down(&e, dp, n);
                char what[80];
                snprintf(what, sizeof what, "sgd hp%zu n=%zu off=%zu p", h, n, off);
                close_to(what, gp, p, n, OPT_ATOL, OPT_RTOL);
                if (hps[h].momentum != 0.0f) {
                    float *gb = down(&e, dbuf, n);
                    what[strlen(what) - 1] = 'b';
                    close_to(what, gb, buf, n, OPT_ATOL, OPT_RTOL);
                    free(gb);
                }
                free(gp);
                free(p);
                free(buf);
                mgpu_k_free(e.gpu, bp);
                mgpu_k_free(e.gpu, bg);
                mgpu_k_free(e.gpu, bb);
            }
    env_close(&e);
}

static void test_adamw(void)
{
    static const mgpu_adamw_hparams_t hp = {
        .lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f};
    static const size_t sizes[] = {1, 3, 127, 4099, (1u << 20) + 1};
    env_t e;
    env_open(&e);
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
        for (size_t off = 0; off < 2; off++) {
            size_t n = sizes[s];
            void *bp, *bg, *bm, *bv;
            float *p = hrand(n, 1.0f), *m = hbuf(n), *v = hbuf(n);
            for (size_t i = 0; i < n; i++)
                m[i] = v[i] = 0.0f;
            float *dp = dupd(&e, p, n, off, &bp), *dg = dalloc(&e, n, off, &bg);
            float *dm = dupd(&e, m, n, off, &bm), *dv = dupd(&e, v, n, off, &bv);
            for (long long step = 1; step <= 3; step++) {
                float *g = hrand(n, 1.0f);
                OK(&e, mgpu_k_copy_to_device(e.gpu, dg, g, n * sizeof(float), &e.err));
                OK(&e, mgpu_k_adamw_step(e.cpu, n, p, g, m, v, &hp, step, &e.err));
                OK(&e, mgpu_k_adamw_step(e.gpu, n, dp, dg, dm, dv, &hp, step, &e.err));
                free(g);
            }
            float *gp = down(&e, dp, n), *gm = down(&e, dm, n), *gv = down(&e, dv, n);
            char what[80];
            snprintf(what, sizeof what, "adamw n=%zu off=%zu p", n, off);
            close_to(what, gp, p, n, OPT_ATOL, OPT_RTOL);
            what[strlen(what) - 1] = 'm';
            close_to(what, gm, m, n, OPT_ATOL, OPT_RTOL);
            what[strlen(what) - 1] = 'v';
            close_to(what, gv, v, n, OPT_ATOL, OPT_RTOL);
            free(gp);
            free(gm);
            free(gv);
            free(p);
            free(m);
            free(v);
            mgpu_k_free(e.gpu, bp);
            mgpu_k_free(e.gpu, bg);
            mgpu_k_free(e.gpu, bm);
            mgpu_k_free(e.gpu, bv);
        }
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

/* mgpu_k_linear_loss: the CUDA backend's one-kernel output layer (and, for outputs wider than a
 * warp, its composition) against the CPU's composition
 * of the same ops. The input x is act_in of a random z_in, as the layer below leaves it. */
static void linear_loss_case(env_t *e, mgpu_precision_t prec, mgpu_loss_t loss, mgpu_act_t act,
                             int rows, int out, int in, int with_dx, int with_bias)
{
    static const double elem_tol[] = {1e-5, 3e-3, 2e-2};
    const size_t nx = (size_t)rows * in, ny = (size_t)rows * out;
    char what[200];
    void *b[16];
    int nb = 0;
    float *z = hrand(nx, 2.0f), *x = hbuf(nx), *w = hrand((size_t)out * in, 0.5f),
          *bias = hrand((size_t)out, 0.5f), *tg = hrand(ny, 1.0f);
    int32_t *lab = malloc(sizeof(int32_t) * (size_t)rows);
    for (int r = 0; r < rows; r++)
        lab[r] = (int32_t)((unsigned)((frand() + 1.0f) * 0.5f * (float)out) % (unsigned)out);
    OK(e, mgpu_k_act_forward(e->cpu, act, nx, z, x, &e->err));
    OK(e, mgpu_kernels_set_precision(e->gpu, prec, &e->err));
    void *lab_base = NULL;
    OK(e, mgpu_k_alloc(e->gpu, sizeof(int32_t) * (size_t)rows, &lab_base, &e->err));
    OK(e, mgpu_k_copy_to_device(e->gpu, lab_base, lab, sizeof(int32_t) * (size_t)rows, &e->err));
    mgpu_k_head_t g = {.loss = loss, .rows = rows, .out = out, .in = in, .act_in = act};
    g.x = dupd(e, x, nx, 0, &b[nb++]);
    g.w = dupd(e, w, (size_t)out * in, 0, &b[nb++]);
    g.bias = with_bias ? dupd(e, bias, (size_t)out, 0, &b[nb++]) : NULL;
    g.y = dpoison(e, ny, 0, &b[nb++]);
    g.labels = lab_base;
    g.targets = dupd(e, tg, ny, 0, &b[nb++]);
    g.loss_out = dpoison(e, 1, 0, &b[nb++]);
    g.dy = dpoison(e, ny, 0, &b[nb++]);
    g.z_in = dupd(e, z, nx, 0, &b[nb++]);
    g.dx = with_dx ? dpoison(e, nx, 0, &b[nb++]) : NULL;
    g.dbias_in = with_dx > 1 ? dpoison(e, (size_t)in, 0, &b[nb++]) : NULL;
    mgpu_k_head_t c = g;
    c.x = x, c.w = w, c.bias = with_bias ? bias : NULL, c.labels = lab, c.targets = tg, c.z_in = z;
    c.y = hbuf(ny), c.loss_out = hbuf(1), c.dy = hbuf(ny);
    c.dx = with_dx ? hbuf(nx) : NULL;
    c.dbias_in = with_dx > 1 ? hbuf((size_t)in) : NULL;
    OK(e, mgpu_k_linear_loss(e->cpu, &c, &e->err));
    /* The one-kernel version leaves the bias gradient below to the caller, and says so. */
    const int grc = mgpu_k_linear_loss(e->gpu, &g, &e->err);
    const int fused = prec != MGPU_PREC_BF16 && out <= 32;
    CHECK_INT(grc, fused && with_dx > 1 ? MGPU_K_BIAS_LEFT : 0);

    /* The kernel multiplies in fp32 whatever the precision; its composition uses the GEMMs. */
    const double et = elem_tol[fused ? 0 : prec];
    snprintf(what, sizeof what, "linear_loss %s %s act_in %s %dx%d->%d%s%s", mgpu_loss_name_k(loss),
             mgpu_precision_name(prec), mgpu_act_name(act), rows, in, out,
             with_bias ? "" : " no bias", with_dx ? (with_dx > 1 ? " dx db" : " dx") : "");
    const double ty = et * (sqrt((double)in) + 1.0) * 4.0;
    close_to_dev(e, g.y, c.y, ny, ty, 1e-4, "%s: y", what);
    close_to_dev(e, g.loss_out, c.loss_out, 1, ty, 1e-4, "%s: loss", what);
    close_to_dev(e, g.dy, c.dy, ny, ty / rows, 1e-3, "%s: dy", what);
    if (with_dx)
        close_to_dev(e, g.dx, c.dx, nx,
                     et * (sqrt((double)in) + sqrt((double)out) + 1.0) * 8.0 / rows, 1e-3, "%s: dx",
                     what);
    if (with_dx > 1) {
        float *got = down(e, g.dbias_in, (size_t)in);
        if (grc == MGPU_K_BIAS_LEFT) {
            size_t written = 0;
            for (int i = 0; i < in; i++)
                written += !isnan(got[i]);
            if (written) {
                printf("  %s: dbias_in left to the caller, yet %zu of %d written\n", what, written,
                       in);
                check_failed++;
            }
        } else {
            double tb =
                et * (sqrt((double)in) + sqrt((double)out) + 1.0) * 8.0 / sqrt((double)rows);
            char part[240];
            snprintf(part, sizeof part, "%s: dbias_in", what);
            close_to(part, got, c.dbias_in, (size_t)in, tb, 1e-3);
        }
        free(got);
    }
    /* Again: the same bits (the loss's partial sums are added in a fixed order). */
    float *loss1 = down(e, g.loss_out, 1);
    CHECK_INT(mgpu_k_linear_loss(e->gpu, &g, &e->err), grc);
    float *loss2 = down(e, g.loss_out, 1);
    if (memcmp(loss1, loss2, sizeof(float)) != 0) {
        printf("  %s: a second run differs (loss %.9g then %.9g)\n", what, loss1[0], loss2[0]);
        check_failed++;
    }
    free(loss1), free(loss2);
    free(z), free(x), free(w), free(bias), free(tg), free(lab);
    free(c.y), free(c.loss_out), free(c.dy), free(c.dx), free(c.dbias_in);
    for (int i = 0; i < nb; i++)
        mgpu_k_free(e->gpu, b[i]);
    mgpu_k_free(e->gpu, lab_base);
}

static void test_linear_loss(void)
{
    /* rows, out, in: the article's MLP head, one row, a partial block, more rows than warps
     * in the grid, one output, a full warp of outputs, a composed one (33 outputs), a wide
     * input. */
    static const int shapes[][3] = {{256, 10, 256}, {1, 3, 5},       {9, 2, 37},   {3000, 7, 130},
                                    {70, 1, 64},    {129, 32, 1024}, {40, 33, 20}, {20, 4, 3000}};
    env_t e;
    env_open(&e);
    for (int p = 0; p < 2; p++)
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
            for (int l = 0; l < 2; l++) {
                const int *sh = shapes[s];
                if (l == MGPU_LOSS_CROSS_ENTROPY && sh[1] < 2)
                    continue;
                linear_loss_case(&e, (mgpu_precision_t)p, (mgpu_loss_t)l, MGPU_ACT_RELU, sh[0],
                                 sh[1], sh[2], 2, 1);
                linear_loss_case(&e, (mgpu_precision_t)p, (mgpu_loss_t)l,
                                 (mgpu_act_t)(s % MGPU_ACT_COUNT), sh[0], sh[1], sh[2],
                                 (int)(s % 3), (int)(s % 2));
            }
    /* bf16 composes it. */
    linear_loss_case(&e, MGPU_PREC_BF16, MGPU_LOSS_CROSS_ENTROPY, MGPU_ACT_RELU, 256, 10, 256, 2,
                     1);
    env_close(&e);
}

/* A label out of range: the kernel's loss is NaN, as softmax_xent's (the CPU refuses it). */
static void test_linear_loss_bad_label_is_nan(void)
{
    env_t e;
    env_open(&e);
    OK(&e, mgpu_kernels_set_precision(e.gpu, MGPU_PREC_FP32, &e.err));
    const int rows = 40, out = 10, in = 16;
    void *b[8];
    int nb = 0;
    float *x = hrand((size_t)rows * in, 1.0f), *w = hrand((size_t)out * in, 1.0f);
    int32_t lab[40];
    for (int r = 0; r < rows; r++)
        lab[r] = r % out;
    lab[17] = out; /* one past the last class */
    mgpu_k_head_t g = {.loss = MGPU_LOSS_CROSS_ENTROPY, .rows = rows, .out = out, .in = in};
    g.x = dupd(&e, x, (size_t)rows * in, 0, &b[nb++]);
    g.w = dupd(&e, w, (size_t)out * in, 0, &b[nb++]);
    g.y = dpoison(&e, (size_t)rows * out, 0, &b[nb++]);
    g.dy = dpoison(&e, (size_t)rows * out, 0, &b[nb++]);
    g.loss_out = dpoison(&e, 1, 0, &b[nb++]);
    void *dl = NULL;
    OK(&e, mgpu_k_alloc(e.gpu, sizeof lab, &dl, &e.err));
    b[nb++] = dl;
    OK(&e, mgpu_k_copy_to_device(e.gpu, dl, lab, sizeof lab, &e.err));
    g.labels = dl;
    OK(&e, mgpu_k_linear_loss(e.gpu, &g, &e.err));
    float *loss = down(&e, g.loss_out, 1), *dy = down(&e, g.dy, (size_t)rows * out);
    CHECK(isnan(loss[0]));
    CHECK(isnan(dy[17 * out]) && !isnan(dy[16 * out]));
    free(loss), free(dy), free(x), free(w);
    for (int i = 0; i < nb; i++)
        mgpu_k_free(e.gpu, b[i]);
    env_close(&e);
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
    RUN(test_act_forward);
    RUN(test_bias_act_forward);
    RUN(test_act_backward);
    RUN(test_sum_rows);
    RUN(test_transpose);
    RUN(test_softmax_xent);
    RUN(test_softmax_xent_bad_label_is_nan);
    RUN(test_mse);
    RUN(test_scale_and_sum);
    RUN(test_argmax_and_count_correct);
    RUN(test_sgd);
    RUN(test_adamw);
    RUN(test_small_gemm_rule);
    RUN(test_weight_grad_grouped);
    RUN(test_linear_fused);
    RUN(test_linear_loss);
    RUN(test_linear_loss_bad_label_is_nan);
    return check_done();
}
