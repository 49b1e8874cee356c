/* kernels_bench.c - what the CUDA backend of kernels.h achieves on this GPU, against ceilings
 * measured in the same run: a device-to-device cudaMemcpy for the memory-bound ops (bytes read
 * plus bytes written, the fewest each op must move), and bare cuBLAS 8192^3 products for the
 * GEMMs (tf32 on fp32 data; bf16 in and out, as PyTorch's bf16 matmul). Prints two tables;
 * times are medians of CUDA-event intervals between back-to-back launches after a warm-up,
 * with the fastest run beside them to show the spread. Inputs are random, never zeros.
 *
 * Usage: build/tests/kernels_bench [floats per buffer, default 2^27 = 512 MiB]
 * Exit status: 0 measured, 1 a CUDA/cuBLAS failure (the message names the call), 77 no GPU
 * or a build without CUDA. A benchmark prints figures; tests/unit/test_kernels_cuda.c checks
 * that the same ops are right. */
#include "kernels.h"

#include <errno.h>  /* ENOMEM */
#include <stdio.h>  /* printf */
#include <stdlib.h> /* malloc, qsort, strtoull */

#if !(defined(MGPU_HAVE_CUDA) && MGPU_HAVE_CUDA)
int main(void)
{
    fprintf(stderr, "kernels_bench: built without CUDA (CUDA=0 or no nvcc): nothing to measure\n");
    return 77;
}
#else

#include "kernels_cuda.h" /* mgpu_kernels_cuda_stream, _device_count, _transpose */

#include <cublas_v2.h>        /* the bare cuBLAS reference GEMMs */
#include <cuda_runtime_api.h> /* events, cudaMemcpyAsync, device properties */
#include <math.h>             /* fabsf */
#include <stdint.h>           /* uint16_t */
#include <string.h>           /* memcpy */

#define MAX_ITERS 20
#define GEMM_N 8192

typedef struct bench {
    mgpu_kernels_t *k;
    cudaStream_t stream;
    cublasHandle_t blas; /* the bare reference, on the same stream */
    cudaEvent_t ev[MAX_ITERS + 1];
    mgpu_err_t err;
    size_t n; /* floats per buffer */
    /* Elementwise buffers of n floats each. */
    float *x, *y, *z, *g, *m, *v, *scalar;
    int32_t *labels;
    /* GEMM operands (views of x, y and z when n >= 8192^2) and bf16 copies. */
    float *ga, *gb, *gc;
    void *a16, *b16, *c16;
    int ta, tb;     /* transposes of the current backend GEMM */
    int rows, cols; /* of the current row op */
    mgpu_act_t act; /* of the current activation op */
    long long step; /* optimizer step */
    cublasComputeType_t bare_ct;
} bench_t;

#define BCUDA(b, call)                                                                             \
    do {                                                                                           \
        cudaError_t bc_rc_ = (call);                                                               \
        if (bc_rc_ != cudaSuccess)                                                                 \
            return mgpu_err_set(&(b)->err, MGPU_E_CUDA, "%s:%d: %s: %s", __FILE__, __LINE__,       \
                                #call, cudaGetErrorString(bc_rc_));                                \
    } while (0)

#define BBLAS(b, call)                                                                             \
    do {                                                                                           \
        cublasStatus_t bb_rc_ = (call);                                                            \
        if (bb_rc_ != CUBLAS_STATUS_SUCCESS)                                                       \
            return mgpu_err_set(&(b)->err, MGPU_E_CUBLAS, "%s:%d: %s: %s", __FILE__, __LINE__,     \
                                #call, cublasGetStatusString(bb_rc_));                             \
    } while (0)

typedef int (*op_fn)(bench_t *b);

static int cmp_double(const void *pa, const void *pb)
{
    double a = *(const double *)pa, c = *(const double *)pb;
    return a < c ? -1 : a > c;
}

/* Median and fastest of iters back-to-back runs, in milliseconds. Events between launches
 * with no host sync in the loop, so host launch gaps do not count unless the GPU starves. */
static int time_op(bench_t *b, op_fn fn, int warmup, int iters, double *median, double *best)
{
    double t[MAX_ITERS];
    int rc;
    for (int i = 0; i < warmup; i++)
        if ((rc = fn(b)) < 0)
            return rc;
    for (int i = 0; i < iters; i++) {
        BCUDA(b, cudaEventRecord(b->ev[i], b->stream));
        if ((rc = fn(b)) < 0)
            return rc;
    }
    BCUDA(b, cudaEventRecord(b->ev[iters], b->stream));
    BCUDA(b, cudaEventSynchronize(b->ev[iters]));
    for (int i = 0; i < iters; i++) {
        float ms = 0.0f;
        BCUDA(b, cudaEventElapsedTime(&ms, b->ev[i], b->ev[i + 1]));
        t[i] = ms;
    }
    qsort(t, iters, sizeof *t, cmp_double);
    *median = iters % 2 ? t[iters / 2] : 0.5 * (t[iters / 2 - 1] + t[iters / 2]);
    *best = t[0];
    return 0;
}

/* --- memory-bound ops ---------------------------------------------------------------------- */

static int op_memcpy(bench_t *b)
{
    BCUDA(b,
          cudaMemcpyAsync(b->y, b->x, b->n * sizeof(float), cudaMemcpyDeviceToDevice, b->stream));
    return 0;
}

static int op_k_copy(bench_t *b)
{
    return mgpu_k_copy(b->k, b->y, b->x, b->n * sizeof(float), &b->err);
}

static int op_act_forward(bench_t *b)
{
    return mgpu_k_act_forward(b->k, b->act, b->n, b->x, b->y, &b->err);
}

static int op_bias_act(bench_t *b)
{
    /* z += bias on every call: z drifts by a bias per run, harmless for timing. */
    return mgpu_k_bias_act_forward(b->k, b->act, b->rows, b->cols, b->z, b->g, b->y, &b->err);
}

static int op_act_backward(bench_t *b)
{
    return mgpu_k_act_backward(b->k, b->act, b->n, b->z, b->x, b->g, b->y, &b->err);
}

static int op_scale(bench_t *b)
{
    return mgpu_k_scale(b->k, b->n, 1.0f, b->y, &b->err);
}

static int op_sum(bench_t *b)
{
    return mgpu_k_sum(b->k, b->n, b->x, b->scalar, &b->err);
}

static int op_mse(bench_t *b)
{
    return mgpu_k_mse(b->k, b->rows, b->cols, b->x, b->z, b->scalar, b->y, &b->err);
}

static int op_sgd(bench_t *b)
{
    static const mgpu_sgd_hparams_t hp = {
        .lr = 1e-3f, .momentum = 0.9f, .dampening = 0.0f, .weight_decay = 1e-4f, .nesterov = 0};
    /* step 2: the steady state, which reads the momentum buffer. */
    return mgpu_k_sgd_step(b->k, b->n, b->y, b->g, b->m, &hp, 2, &b->err);
}

static int op_sgd_plain(bench_t *b)
{
    static const mgpu_sgd_hparams_t hp = {.lr = 1e-3f};
    return mgpu_k_sgd_step(b->k, b->n, b->y, b->g, NULL, &hp, 2, &b->err);
}

static int op_adamw(bench_t *b)
{
    static const mgpu_adamw_hparams_t hp = {
        .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f};
    return mgpu_k_adamw_step(b->k, b->n, b->y, b->g, b->m, b->v, &hp, ++b->step, &b->err);
}

static int op_sum_rows(bench_t *b)
{
    return mgpu_k_sum_rows(b->k, b->rows, b->cols, b->x, 0.0f, b->scalar, &b->err);
}

static int op_xent(bench_t *b)
{
    return mgpu_k_softmax_xent(b->k, b->rows, b->cols, b->x, b->labels, b->scalar, b->y, &b->err);
}

/* The copy a tf32 product with A transposed makes first (gemm.cu's transpose). */
static int op_transpose(bench_t *b)
{
    return mgpu_kernels_cuda_transpose(b->k, b->rows, b->cols, b->x, b->cols, b->y, &b->err);
}

static int op_count_correct(bench_t *b)
{
    return mgpu_k_count_correct(b->k, b->rows, b->cols, b->x, b->labels, b->scalar, &b->err);
}

/* --- GEMMs --------------------------------------------------------------------------------- */

static int op_k_gemm(bench_t *b)
{
    return mgpu_k_gemm(b->k, b->ta, b->tb, GEMM_N, GEMM_N, GEMM_N, 1.0f, b->ga, GEMM_N, b->gb,
                       GEMM_N, 0.0f, b->gc, GEMM_N, &b->err);
}

/* fp32 operands and C, compute type b->bare_ct (32F, FAST_TF32 or FAST_16BF). */
static int op_bare_f32(bench_t *b)
{
    const float one = 1.0f, zero = 0.0f;
    BBLAS(b, cublasGemmEx(b->blas, CUBLAS_OP_N, CUBLAS_OP_N, GEMM_N, GEMM_N, GEMM_N, &one, b->gb,
                          CUDA_R_32F, GEMM_N, b->ga, CUDA_R_32F, GEMM_N, &zero, b->gc, CUDA_R_32F,
                          GEMM_N, b->bare_ct, CUBLAS_GEMM_DEFAULT));
    return 0;
}

/* bf16 operands and C, fp32 accumulation: what torch.matmul does on bf16 tensors. */
static int op_bare_bf16(bench_t *b)
{
    const float one = 1.0f, zero = 0.0f;
    BBLAS(b, cublasGemmEx(b->blas, CUBLAS_OP_N, CUBLAS_OP_N, GEMM_N, GEMM_N, GEMM_N, &one, b->b16,
                          CUDA_R_16BF, GEMM_N, b->a16, CUDA_R_16BF, GEMM_N, &zero, b->c16,
                          CUDA_R_16BF, GEMM_N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return 0;
}

/* bf16 operands, fp32 C: the backend's bf16 product without its operand conversion. */
static int op_bare_bf16_f32out(bench_t *b)
{
    const float one = 1.0f, zero = 0.0f;
    BBLAS(b, cublasGemmEx(b->blas, CUBLAS_OP_N, CUBLAS_OP_N, GEMM_N, GEMM_N, GEMM_N, &one, b->b16,
                          CUDA_R_16BF, GEMM_N, b->a16, CUDA_R_16BF, GEMM_N, &zero, b->gc,
                          CUDA_R_32F, GEMM_N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return 0;
}

/* --- the article-sized model: MLP 784-256-256-10, batch 256 (the launch-bound case) --- */

#define SB 256    /* batch */
#define SP 269322 /* its parameters: 784*256+256 + 256*256+256 + 256*10+10 */

static int op_small_gemm(bench_t *b) /* first layer forward, X[256,784] W^T[784,256] */
{
    return mgpu_k_gemm(b->k, 0, 1, SB, 256, 784, 1.0f, b->x, 784, b->g, 784, 0.0f, b->y, 256,
                       &b->err);
}

static int op_small_bias_act(bench_t *b)
{
    return mgpu_k_bias_act_forward(b->k, MGPU_ACT_RELU, SB, 256, b->z, b->g, b->y, &b->err);
}

static int op_small_xent(bench_t *b)
{
    return mgpu_k_softmax_xent(b->k, SB, 10, b->x, b->labels, b->scalar, b->y, &b->err);
}

static int op_small_sum_rows(bench_t *b)
{
    return mgpu_k_sum_rows(b->k, SB, 256, b->x, 0.0f, b->scalar, &b->err);
}

static int op_small_adamw(bench_t *b)
{
    static const mgpu_adamw_hparams_t hp = {
        .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f};
    return mgpu_k_adamw_step(b->k, SP, b->y, b->g, b->m, b->v, &hp, ++b->step, &b->err);
}

static int small_table(bench_t *b)
{
    static const struct {
        const char *name;
        op_fn fn;
    } rows[] = {
        {"gemm tf32 256x256x784 (X W^T)", op_small_gemm},
        {"bias_act_forward relu 256x256", op_small_bias_act},
        {"softmax_xent + grad 256x10", op_small_xent},
        {"sum_rows 256x256", op_small_sum_rows},
        {"adamw_step 269322 params", op_small_adamw},
    };
    int rc;
    printf("\nsmall ops of the MLP 784-256-256-10, batch 256: time per call of back-to-back calls "
           "(launch-bound: the host's launch rate, not the kernel, sets most of these)\n");
    printf("%-38s %10s %10s\n", "op", "median us", "best us");
    if ((rc = mgpu_kernels_set_precision(b->k, MGPU_PREC_TF32, &b->err)) < 0)
        return rc;
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
        double med, best;
        if ((rc = time_op(b, rows[i].fn, 5, MAX_ITERS, &med, &best)) < 0)
            return rc;
        printf("%-38s %10.2f %10.2f\n", rows[i].name, med * 1e3, best * 1e3);
    }
    return mgpu_kernels_set_precision(b->k, MGPU_PREC_FP32, &b->err);
}

/* --- setup --------------------------------------------------------------------------------- */

static unsigned long long rng = 88172645463325252ULL;
static float frand(void) /* uniform in [-1, 1) */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 40) / (double)(1ULL << 24)) * 2.0f - 1.0f;
}

static uint16_t to_bf16(float f) /* round to nearest even; inputs here are finite */
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static int fill(bench_t *b, float *d, size_t n, int positive)
{
    float *h = malloc(n * sizeof(float));
    if (h == NULL)
        return mgpu_err_set(&b->err, -ENOMEM, "malloc(%zu) failed", n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        h[i] = positive ? fabsf(frand()) + 1e-3f : frand();
    int rc = mgpu_k_copy_to_device(b->k, d, h, n * sizeof(float), &b->err);
    if (rc == 0)
        rc = mgpu_k_sync(b->k, &b->err);
    free(h);
    return rc;
}

static int setup(bench_t *b)
{
    int rc;
    float **bufs[] = {&b->x, &b->y, &b->z, &b->g, &b->m, &b->v};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) {
        if ((rc = mgpu_k_alloc(b->k, b->n * sizeof(float), (void **)bufs[i], &b->err)) < 0)
            return rc;
        if ((rc = fill(b, *bufs[i], b->n, bufs[i] == &b->v)) < 0)
            return rc;
    }
    /* Scalar results, and sum_rows' column sums (up to 8192 here). */
    if ((rc = mgpu_k_alloc(b->k, 65536 * sizeof(float), (void **)&b->scalar, &b->err)) < 0 ||
        (rc = mgpu_k_alloc(b->k, b->n / 32 * sizeof(int32_t), (void **)&b->labels, &b->err)) < 0)
        return rc;
    /* Labels in [0, 10): in range for every row width used here (10 and up). */
    int32_t *lab = malloc(b->n / 32 * sizeof(int32_t));
    if (lab == NULL)
        return mgpu_err_set(&b->err, -ENOMEM, "malloc of labels failed");
    for (size_t i = 0; i < b->n / 32; i++)
        lab[i] = (int32_t)((frand() * 0.5f + 0.5f) * 9.99f);
    rc = mgpu_k_copy_to_device(b->k, b->labels, lab, b->n / 32 * sizeof(int32_t), &b->err);
    if (rc == 0)
        rc = mgpu_k_sync(b->k, &b->err);
    free(lab);
    if (rc < 0)
        return rc;

    size_t gn = (size_t)GEMM_N * GEMM_N;
    if (b->n < gn)
        return 0; /* too small for the GEMM table */
    b->ga = b->x;
    b->gb = b->g;
    b->gc = b->y;
    BCUDA(b, cudaMalloc(&b->a16, gn * 2));
    BCUDA(b, cudaMalloc(&b->b16, gn * 2));
    BCUDA(b, cudaMalloc(&b->c16, gn * 2));
    uint16_t *h16 = malloc(gn * 2);
    float *h32 = malloc(gn * sizeof(float));
    if (h16 == NULL || h32 == NULL) {
        free(h16);
        free(h32);
        return mgpu_err_set(&b->err, -ENOMEM, "malloc of GEMM staging failed");
    }
    void *targets[2] = {b->a16, b->b16};
    const float *srcs[2] = {b->ga, b->gb};
    for (int t = 0; t < 2; t++) {
        /* The bare bf16 operands are the same numbers as the fp32 ones, rounded. */
        rc = mgpu_k_copy_to_host(b->k, h32, srcs[t], gn * sizeof(float), &b->err);
        if (rc < 0)
            break;
        for (size_t i = 0; i < gn; i++)
            h16[i] = to_bf16(h32[i]);
        if (cudaMemcpy(targets[t], h16, gn * 2, cudaMemcpyHostToDevice) != cudaSuccess) {
            rc = mgpu_err_set(&b->err, MGPU_E_CUDA, "cudaMemcpy of bf16 operand %d failed", t);
            break;
        }
    }
    free(h16);
    free(h32);
    return rc;
}

/* --- tables -------------------------------------------------------------------------------- */

typedef struct mem_row {
    const char *name;
    op_fn fn;
    mgpu_act_t act;
    int cols;              /* for row ops: rows = n / cols */
    double bytes_per_elem; /* fewest bytes moved per element of n */
} mem_row_t;

static int mem_table(bench_t *b)
{
    const mem_row_t rows[] = {
        {"cudaMemcpy D2D (peak ref)", op_memcpy, 0, 0, 8},
        {"copy (mgpu_k_copy)", op_k_copy, 0, 0, 8},
        {"act_forward relu", op_act_forward, MGPU_ACT_RELU, 0, 8},
        {"act_forward gelu", op_act_forward, MGPU_ACT_GELU, 0, 8},
        {"act_forward sigmoid", op_act_forward, MGPU_ACT_SIGMOID, 0, 8},
        {"bias_act_forward relu [n/8192,8192]", op_bias_act, MGPU_ACT_RELU, 8192, 12},
        {"bias_act_forward gelu [n/8192,8192]", op_bias_act, MGPU_ACT_GELU, 8192, 12},
        {"act_backward relu", op_act_backward, MGPU_ACT_RELU, 0, 12},
        {"act_backward gelu", op_act_backward, MGPU_ACT_GELU, 0, 12},
        {"act_backward tanh", op_act_backward, MGPU_ACT_TANH, 0, 12},
        {"scale", op_scale, 0, 0, 8},
        {"sum", op_sum, 0, 0, 4},
        {"mse + dpred [n/1024,1024]", op_mse, 0, 1024, 12},
        {"sgd_step momentum", op_sgd, 0, 0, 20},
        {"sgd_step plain", op_sgd_plain, 0, 0, 12},
        {"adamw_step", op_adamw, 0, 0, 28},
        {"sum_rows [n/8192,8192]", op_sum_rows, 0, 8192, 4},
        {"sum_rows [n/64,64]", op_sum_rows, 0, 64, 4},
        {"softmax_xent + grad [n/32,32]", op_xent, 0, 32, 8},
        {"softmax_xent + grad [n/1000,1000]", op_xent, 0, 1000, 8},
        {"softmax_xent + grad [n/4096,4096]", op_xent, 0, 4096, 8},
        {"softmax_xent + grad [n/32768,32768]", op_xent, 0, 32768, 8},
        {"count_correct [n/1000,1000]", op_count_correct, 0, 1000, 4},
        {"transpose [n/8192,8192] (tf32 operand)", op_transpose, 0, 8192, 8},
    };
    double copy_gbs = 0.0;
    int rc;
    printf("\nmemory-bound ops, n = %zu floats (%.0f MiB per buffer); GB/s = fewest bytes read + "
           "written / median time\n",
           b->n, b->n * 4.0 / (1 << 20));
    printf("%-38s %10s %10s %10s %9s %7s\n", "op", "bytes", "median us", "best us", "GB/s",
           "% copy");
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
        const mem_row_t *r = &rows[i];
        double med, best;
        size_t elems = b->n;
        b->act = r->act;
        b->cols = r->cols;
        b->rows = r->cols ? (int)(b->n / r->cols) : 0;
        if (r->cols)
            elems = (size_t)b->rows * r->cols;
        if ((rc = time_op(b, r->fn, 3, MAX_ITERS, &med, &best)) < 0)
            return rc;
        double bytes = r->bytes_per_elem * elems, gbs = bytes / (med * 1e-3) / 1e9;
        if (i == 0)
            copy_gbs = gbs;
        printf("%-38s %10.3g %10.1f %10.1f %9.0f %6.1f%%\n", r->name, bytes, med * 1e3, best * 1e3,
               gbs, 100.0 * gbs / copy_gbs);
    }
    return 0;
}

typedef struct gemm_row {
    const char *name;
    op_fn fn;
    mgpu_precision_t prec; /* backend rows */
    int ta, tb;
    cublasComputeType_t ct; /* bare fp32 rows */
    int ref;                /* index of the bare row it is compared with, -1 for none */
} gemm_row_t;

static int gemm_table(bench_t *b)
{
    const gemm_row_t rows[] = {
        /* 0 */ {"bare cublas fp32 (no tf32)", op_bare_f32, 0, 0, 0, CUBLAS_COMPUTE_32F, -1},
        /* 1 */ {"bare cublas tf32", op_bare_f32, 0, 0, 0, CUBLAS_COMPUTE_32F_FAST_TF32, -1},
        /* 2 */ {"bare cublas bf16 in/out", op_bare_bf16, 0, 0, 0, 0, -1},
        /* 3 */ {"bare cublas bf16 in, fp32 out", op_bare_bf16_f32out, 0, 0, 0, 0, 2},
        /* 4 */
        {"bare cublas fp32 FAST_16BF", op_bare_f32, 0, 0, 0, CUBLAS_COMPUTE_32F_FAST_16BF, 2},
        {"mgpu_k_gemm fp32 NN", op_k_gemm, MGPU_PREC_FP32, 0, 0, 0, 0},
        {"mgpu_k_gemm tf32 NN", op_k_gemm, MGPU_PREC_TF32, 0, 0, 0, 1},
        {"mgpu_k_gemm tf32 TN (dW = X^T dY)", op_k_gemm, MGPU_PREC_TF32, 1, 0, 0, 1},
        {"mgpu_k_gemm tf32 NT (dX = dY W^T)", op_k_gemm, MGPU_PREC_TF32, 0, 1, 0, 1},
        {"mgpu_k_gemm bf16 NN (+ conversion)", op_k_gemm, MGPU_PREC_BF16, 0, 0, 0, 2},
        {"mgpu_k_gemm bf16 TN", op_k_gemm, MGPU_PREC_BF16, 1, 0, 0, 2},
        {"mgpu_k_gemm bf16 NT", op_k_gemm, MGPU_PREC_BF16, 0, 1, 0, 2},
    };
    double tflops[sizeof rows / sizeof *rows];
    double flop = 2.0 * GEMM_N * GEMM_N * GEMM_N;
    int rc;
    printf("\nGEMM %d x %d x %d, random data; %% ref = against the bare cuBLAS row named\n", GEMM_N,
           GEMM_N, GEMM_N);
    printf("%-38s %10s %10s %9s %7s  %s\n", "gemm", "median ms", "best ms", "TFLOP/s", "% ref",
           "ref");
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
        const gemm_row_t *r = &rows[i];
        double med, best;
        b->ta = r->ta;
        b->tb = r->tb;
        b->bare_ct = r->ct;
        if ((rc = mgpu_kernels_set_precision(b->k, r->prec, &b->err)) < 0)
            return rc;
        if ((rc = time_op(b, r->fn, 2, 10, &med, &best)) < 0)
            return rc;
        tflops[i] = flop / (med * 1e-3) / 1e12;
        if (r->ref >= 0)
            printf("%-38s %10.3f %10.3f %9.1f %6.1f%%  %s\n", r->name, med, best, tflops[i],
                   100.0 * tflops[i] / tflops[r->ref], rows[r->ref].name);
        else
            printf("%-38s %10.3f %10.3f %9.1f %7s\n", r->name, med, best, tflops[i], "-");
    }
    return mgpu_kernels_set_precision(b->k, MGPU_PREC_FP32, &b->err);
}

static void print_device(bench_t *b)
{
    struct cudaDeviceProp p;
    int drv = 0, rt = 0, blas = 0;
    char line[256] = "";
    FILE *f = fopen("/proc/driver/nvidia/version", "r");
    if (f != NULL) {
        if (fgets(line, sizeof line, f) == NULL)
            line[0] = '\0';
        fclose(f);
        line[strcspn(line, "\n")] = '\0';
    }
    (void)cudaDriverGetVersion(&drv);
    (void)cudaRuntimeGetVersion(&rt);
    (void)cublasGetVersion(b->blas, &blas);
    if (cudaGetDeviceProperties(&p, 0) == cudaSuccess)
        printf("device: %s, sm_%d%d, %d SMs, %.1f GiB, L2 %.0f MiB\n", p.name, p.major, p.minor,
               p.multiProcessorCount, p.totalGlobalMem / 1073741824.0, p.l2CacheSize / 1048576.0);
    printf("CUDA driver API %d.%d, runtime %d.%d, cuBLAS %d\n", drv / 1000, drv % 1000 / 10,
           rt / 1000, rt % 1000 / 10, blas);
    if (line[0])
        printf("kernel module: %s\n", line);
}

int main(int argc, char **argv)
{
    bench_t b;
    int rc;
    memset(&b, 0, sizeof b);
    b.n = argc > 1 ? strtoull(argv[1], NULL, 0) : (size_t)1 << 27;
    if (b.n < 1 << 16) {
        fprintf(stderr, "kernels_bench: %zu floats per buffer, expected >= 65536\n", b.n);
        return 2;
    }
    if (mgpu_kernels_cuda_device_count(&b.err) <= 0) {
        fprintf(stderr, "kernels_bench: no CUDA device: %s\n", b.err.msg);
        return 77;
    }
    if ((rc = mgpu_kernels_create(MGPU_KBACKEND_CUDA, 0, &b.k, &b.err)) < 0) {
        fprintf(stderr, "kernels_bench: %s\n", b.err.msg);
        return 1;
    }
    b.stream = (cudaStream_t)mgpu_kernels_cuda_stream(b.k);
    rc = cublasCreate(&b.blas) == CUBLAS_STATUS_SUCCESS &&
                 cublasSetStream(b.blas, b.stream) == CUBLAS_STATUS_SUCCESS
             ? 0
             : mgpu_err_set(&b.err, MGPU_E_CUBLAS, "cublasCreate/cublasSetStream failed");
    for (int i = 0; rc == 0 && i <= MAX_ITERS; i++)
        if (cudaEventCreate(&b.ev[i]) != cudaSuccess)
            rc = mgpu_err_set(&b.err, MGPU_E_CUDA, "cudaEventCreate failed");
    if (rc == 0) {
        print_device(&b);
        rc = setup(&b);
    }
    if (rc == 0)
        rc = small_table(&b);
    if (rc == 0)
        rc = mem_table(&b);
    if (rc == 0 && b.ga != NULL)
        rc = gemm_table(&b);
    if (rc < 0)
        fprintf(stderr, "kernels_bench: %s\n", b.err.msg);
    /* Process exit frees the device memory; the backend is destroyed for its sync. */
    mgpu_kernels_destroy(b.k);
    return rc < 0 ? 1 : 0;
}
#endif
