/* kernels_check.h - what the tests of the CUDA backend share (test_kernels_cuda*.c): the skip
 * without a CUDA device (need_gpu, which the GPU training tests use too), the two
 * backends side by side (env_t), random and poisoned buffers at 16-byte aligned and one-float-off
 * offsets, and close_to / close_to_dev, which print the first mismatches and the largest
 * difference. Each test file includes it once; its functions are static. */
#ifndef MGPU_KERNELS_CHECK_H
#define MGPU_KERNELS_CHECK_H

#include "check.h"
#include "kernels.h"

#if defined(MGPU_HAVE_CUDA) && MGPU_HAVE_CUDA
#include "kernels_cuda.h" /* mgpu_kernels_cuda_device_count, _stream, _transpose */
#endif

/* Weight-gradient products queued beside the main stream on k so far (0 without CUDA). */
static inline long long beside_products(const mgpu_kernels_t *k)
{
#if defined(MGPU_HAVE_CUDA) && MGPU_HAVE_CUDA
    return mgpu_kernels_cuda_beside_products(k);
#else
    (void)k;
    return 0;
#endif
}

/* small_gemm.cu's launches on k so far (0 without CUDA). */
static inline long long small_gemms(const mgpu_kernels_t *k)
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

/* Skips the test in a build without CUDA or on a machine without a CUDA device. Initialises
 * CUDA here, in the test's own forked process, never in the parent. */
static inline void need_gpu(void)
{
#if !(defined(MGPU_HAVE_CUDA) && MGPU_HAVE_CUDA)
    SKIP("built without CUDA (CUDA=0 or no nvcc)");
#else
    mgpu_err_t err = {0};
    if (mgpu_kernels_cuda_device_count(&err) <= 0)
        SKIP("no CUDA device%s%s", err.msg[0] ? ": " : "", err.msg);
#endif
}

static inline void env_open(env_t *e)
{
    e->cpu = e->gpu = NULL;
    e->err.msg[0] = '\0';
    need_gpu();
#if defined(MGPU_HAVE_CUDA) && MGPU_HAVE_CUDA
    if (mgpu_kernels_create(MGPU_KBACKEND_CPU, -1, &e->cpu, &e->err) != 0 ||
        mgpu_kernels_create(MGPU_KBACKEND_CUDA, 0, &e->gpu, &e->err) != 0) {
        printf("  mgpu_kernels_create: %s\n", e->err.msg);
        exit(1);
    }
#endif
}

static inline void env_close(env_t *e)
{
    OK(e, mgpu_k_sync(e->gpu, &e->err));
    mgpu_kernels_destroy(e->gpu);
    mgpu_kernels_destroy(e->cpu);
}

static inline const char *mgpu_loss_name_k(mgpu_loss_t l)
{
    return l == MGPU_LOSS_CROSS_ENTROPY ? "cross_entropy" : "mse";
}

static unsigned long long rng_state = 0x9e3779b97f4a7c15ULL;
static inline float frand(void) /* uniform in [-1, 1) */
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((rng_state >> 40) / (double)(1ULL << 24)) * 2.0f - 1.0f;
}

static inline float *hbuf(size_t n)
{
    size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
    float *p = aligned_alloc(64, bytes ? bytes : 64);
    if (p == NULL) {
        printf("  aligned_alloc(%zu) failed\n", bytes);
        exit(1);
    }
    return p;
}

static inline float *hrand(size_t n, float scale)
{
    float *p = hbuf(n);
    for (size_t i = 0; i < n; i++)
        p[i] = frand() * scale;
    return p;
}

static inline float *hcopy(const float *src, size_t n)
{
    float *p = hbuf(n);
    for (size_t i = 0; i < n; i++)
        p[i] = src[i];
    return p;
}

/* A GPU buffer of n + off floats; returns its base in *base (to free) and base + off. */
static inline float *dalloc(env_t *e, size_t n, size_t off, void **base)
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
static inline float *dupd(env_t *e, const float *h, size_t n, size_t off, void **base)
{
    float *d = dalloc(e, n, off, base);
    OK(e, mgpu_k_copy_to_device(e->gpu, d, h, n * sizeof(float), &e->err));
    return d;
}

/* GPU buffer of n NaNs at offset off: what a kernel leaves unwritten stays NaN. */
static inline float *dpoison(env_t *e, size_t n, size_t off, void **base)
{
    float *h = hbuf(n);
    for (size_t i = 0; i < n; i++)
        h[i] = NAN;
    float *d = dupd(e, h, n, off, base);
    free(h);
    return d;
}

static inline float *down(env_t *e, const float *d, size_t n)
{
    float *h = hbuf(n);
    OK(e, mgpu_k_copy_to_host(e->gpu, h, d, n * sizeof(float), &e->err));
    return h;
}

/* |got - want| <= atol + rtol * |want| element by element (NaN never passes); prints the
 * first mismatches and the largest difference. */
static inline int close_to(const char *what, const float *got, const float *want, size_t n,
                           double atol, double rtol)
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
static inline int __attribute__((format(printf, 7, 8)))
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

#endif
