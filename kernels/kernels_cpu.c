/* kernels_cpu.c - the plain-C backend: what CPU workers compute with, and the reference every
 * CUDA kernel is tested against. Single-threaded on purpose: CPU ranks are processes (or DP
 * threads) already, and a threaded GEMM would oversubscribe the cores they share.
 *
 * Arguments arrive checked by the launchers in kernels.c. Reductions accumulate in double so
 * the reference is more accurate than the kernels it judges. */
#include "kernels.h"

#include <errno.h>  /* ENOMEM */
#include <math.h>   /* expf, tanhf, sqrt */
#include <stdlib.h> /* aligned_alloc, free */
#include <string.h> /* memcpy, memset */

/* GCC 12 at -O2 leaves plain elementwise loops scalar (its "very cheap" vectoriser gives up
 * on them); these functions ask for the vectoriser explicitly. Not on the GEMM, whose
 * micro-kernel is vectorised by hand and measured slower with it (packing loops). */
#if defined(__GNUC__) && !defined(__clang__)
#define VECTORIZE __attribute__((optimize("tree-vectorize", "vect-cost-model=dynamic")))
#else
#define VECTORIZE
#endif

/* GEMM blocking: C is computed in MR x NR register tiles from packed panels of op(A) (MC x KC)
 * and op(B) (KC x NC). KC x NR floats of B (8-16 KiB) stay in L1 while a panel of A streams
 * by; the MC x KC block of A (64 KiB) stays in L2. NR is 16 with AVX2 + FMA (about 70-80
 * GFLOP/s on one core of the dev machine's EPYC), else 8 with SSE (about 30 GFLOP/s). */
#define MR 4
#define NR_MAX 16 /* the AVX2 kernel's panel width; the portable one uses 8 */
#define MC 64
#define KC 256
#define NC 512

/* GCC/Clang vector extension: four floats, one SSE register on any x86-64 (two halves of a
 * NEON pair on arm64), so the micro-kernel vectorises at -O2 without intrinsics. */
typedef float v4f __attribute__((vector_size(16)));

typedef struct cpu_impl {
    float *apack; /* MC x KC, panels of MR rows */
    float *bpack; /* KC x NC, panels of nr columns */
    int nr;       /* panel width of the micro-kernel this CPU runs: 16 (AVX2 + FMA) or 8 */
} cpu_impl_t;

static int cpu_impl_create(int device, void **impl, mgpu_err_t *err)
{
    cpu_impl_t *c = calloc(1, sizeof *c);
    if (c == NULL)
        return mgpu_err_set(err, -ENOMEM, "kernels(cpu): calloc failed");
    c->apack = aligned_alloc(64, sizeof(float) * MC * KC);
    c->bpack = aligned_alloc(64, sizeof(float) * KC * NC);
    if (c->apack == NULL || c->bpack == NULL) {
        free(c->apack);
        free(c->bpack);
        free(c);
        return mgpu_err_set(err, -ENOMEM, "kernels(cpu): aligned_alloc of %zu bytes failed",
                            sizeof(float) * (MC * KC + KC * NC));
    }
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    c->nr = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 16 : 8;
#else
    c->nr = 8;
#endif
    /* MGPU_CPU_GEMM=portable forces the 4x8 kernel (to compare the two paths). */
    const char *force = getenv("MGPU_CPU_GEMM");
    if (force != NULL && strcmp(force, "portable") == 0)
        c->nr = 8;
    *impl = c;
    return 0;
}

static void cpu_impl_destroy(void *impl)
{
    cpu_impl_t *c = impl;
    if (c == NULL)
        return;
    free(c->apack);
    free(c->bpack);
    free(c);
}

static int cpu_set_precision(void *impl, mgpu_precision_t prec, mgpu_err_t *err)
{
    /* Accepted and ignored: the CPU computes fp32 whatever the cfg asks for the GPU. */
    return 0;
}

static int cpu_alloc(void *impl, size_t bytes, void **out, mgpu_err_t *err)
{
    /* 64-byte aligned and rounded up so vector loops may read whole cache lines. */
    size_t rounded = (bytes + 63) / 64 * 64;
    *out = aligned_alloc(64, rounded ? rounded : 64);
    if (*out == NULL)
        return mgpu_err_set(err, -ENOMEM, "kernels(cpu): aligned_alloc(%zu) failed", bytes);
    return 0;
}

static void cpu_free(void *impl, void *p)
{
    free(p);
}

static int cpu_copy(void *impl, void *dst, const void *src, size_t bytes, mgpu_err_t *err)
{
    if (dst != src)
        memmove(dst, src, bytes);
    return 0;
}

static int cpu_zero(void *impl, void *dst, size_t bytes, mgpu_err_t *err)
{
    memset(dst, 0, bytes);
    return 0;
}

static int cpu_sync(void *impl, mgpu_err_t *err)
{
    return 0;
}

/* --- GEMM -------------------------------------------------------------------------------- */

/* Packs op(A)[i0 .. i0+mc, p0 .. p0+kc) as panels of MR rows: panel[p * MR + r], zero rows
 * past mc so the micro-kernel never branches. */
static void pack_a(int trans, const float *restrict a, int lda, int i0, int mc, int p0, int kc,
                   float *restrict dst)
{
    for (int ip = 0; ip < mc; ip += MR) {
        int mr = mc - ip < MR ? mc - ip : MR;
        for (int p = 0; p < kc; p++) {
            for (int r = 0; r < mr; r++) {
                int i = i0 + ip + r, kk = p0 + p;
                dst[p * MR + r] = trans ? a[(size_t)kk * lda + i] : a[(size_t)i * lda + kk];
            }
            for (int r = mr; r < MR; r++)
                dst[p * MR + r] = 0.0f;
        }
        dst += (size_t)kc * MR;
    }
}

/* Packs op(B)[p0 .. p0+kc, j0 .. j0+nc) as panels of NR columns: panel[p * NR + c]. */
static void pack_b(int trans, const float *restrict b, int ldb, int p0, int kc, int j0, int nc,
                   int NR, float *restrict dst)
{
    for (int jp = 0; jp < nc; jp += NR) {
        int nr = nc - jp < NR ? nc - jp : NR;
        for (int p = 0; p < kc; p++) {
            int kk = p0 + p;
            if (!trans && nr == NR) {
                memcpy(dst + p * NR, b + (size_t)kk * ldb + j0 + jp, sizeof(float) * NR);
                continue;
            }
            for (int c = 0; c < nr; c++) {
                int j = j0 + jp + c;
                dst[p * NR + c] = trans ? b[(size_t)j * ldb + kk] : b[(size_t)kk * ldb + j];
            }
            for (int c = nr; c < NR; c++)
                dst[p * NR + c] = 0.0f;
        }
        dst += (size_t)kc * NR;
    }
}

/* acc = sum over p of a[p][r] * b[p][:], for an MR x 8 tile (panels of 8 columns). */
static void micro_kernel_4x8(int kc, const float *restrict a, const float *restrict b,
                             float acc[MR][NR_MAX])
{
    v4f c00 = {0}, c01 = {0}, c10 = {0}, c11 = {0}, c20 = {0}, c21 = {0}, c30 = {0}, c31 = {0};
    for (int p = 0; p < kc; p++) {
        v4f b0, b1;
        memcpy(&b0, b + p * 8, sizeof b0);
        memcpy(&b1, b + p * 8 + 4, sizeof b1);
        const float *ap = a + p * MR;
        c00 += ap[0] * b0;
        c01 += ap[0] * b1;
        c10 += ap[1] * b0;
        c11 += ap[1] * b1;
        c20 += ap[2] * b0;
        c21 += ap[2] * b1;
        c30 += ap[3] * b0;
        c31 += ap[3] * b1;
    }
    memcpy(&acc[0][0], &c00, sizeof c00);
    memcpy(&acc[0][4], &c01, sizeof c01);
    memcpy(&acc[1][0], &c10, sizeof c10);
    memcpy(&acc[1][4], &c11, sizeof c11);
    memcpy(&acc[2][0], &c20, sizeof c20);
    memcpy(&acc[2][4], &c21, sizeof c21);
    memcpy(&acc[3][0], &c30, sizeof c30);
    memcpy(&acc[3][4], &c31, sizeof c31);
}

/* The same for an MR x 16 tile with 8-float AVX vectors and fused multiply-adds: compiled for
 * AVX2 + FMA whatever the build flags, called only when the CPU has them. FMA rounds once
 * where the portable kernel rounds twice, so results differ in the last bits between the two
 * paths (never between ranks of one host, which all take the same one). */
typedef float v8f __attribute__((vector_size(32)));

__attribute__((target("avx2,fma"))) static void
micro_kernel_4x16(int kc, const float *restrict a, const float *restrict b, float acc[MR][NR_MAX])
{
    v8f c00 = {0}, c01 = {0}, c10 = {0}, c11 = {0}, c20 = {0}, c21 = {0}, c30 = {0}, c31 = {0};
    for (int p = 0; p < kc; p++) {
        v8f b0, b1;
        memcpy(&b0, b + p * 16, sizeof b0);
        memcpy(&b1, b + p * 16 + 8, sizeof b1);
        const float *ap = a + p * MR;
        c00 += ap[0] * b0;
        c01 += ap[0] * b1;
        c10 += ap[1] * b0;
        c11 += ap[1] * b1;
        c20 += ap[2] * b0;
        c21 += ap[2] * b1;
        c30 += ap[3] * b0;
        c31 += ap[3] * b1;
    }
    memcpy(&acc[0][0], &c00, sizeof c00);
    memcpy(&acc[0][8], &c01, sizeof c01);
    memcpy(&acc[1][0], &c10, sizeof c10);
    memcpy(&acc[1][8], &c11, sizeof c11);
    memcpy(&acc[2][0], &c20, sizeof c20);
    memcpy(&acc[2][8], &c21, sizeof c21);
    memcpy(&acc[3][0], &c30, sizeof c30);
    memcpy(&acc[3][8], &c31, sizeof c31);
}

static int cpu_gemm(void *impl, int trans_a, int trans_b, int m, int n, int k, float alpha,
                    const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc,
                    mgpu_err_t *err)
{
    cpu_impl_t *ci = impl;
    const int NR = ci->nr;

    if (k == 0 || alpha == 0.0f) {
        /* Only the beta * C part is left; beta == 0 writes zeros without reading C. */
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++)
                c[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[(size_t)i * ldc + j];
        return 0;
    }
    for (int jc = 0; jc < n; jc += NC) {
        int nc = n - jc < NC ? n - jc : NC;
        for (int pc = 0; pc < k; pc += KC) {
            int kc = k - pc < KC ? k - pc : KC;
            /* The first K block applies beta; later ones accumulate into C. */
            int first = pc == 0;
            pack_b(trans_b, b, ldb, pc, kc, jc, nc, NR, ci->bpack);
            for (int ic = 0; ic < m; ic += MC) {
                int mc = m - ic < MC ? m - ic : MC;
                pack_a(trans_a, a, lda, ic, mc, pc, kc, ci->apack);
                for (int jr = 0; jr < nc; jr += NR) {
                    int nr = nc - jr < NR ? nc - jr : NR;
                    const float *bp = ci->bpack + (size_t)jr * kc;
                    for (int ir = 0; ir < mc; ir += MR) {
                        int mr = mc - ir < MR ? mc - ir : MR;
                        float acc[MR][NR_MAX];
                        if (NR == 16)
                            micro_kernel_4x16(kc, ci->apack + (size_t)ir * kc, bp, acc);
                        else
                            micro_kernel_4x8(kc, ci->apack + (size_t)ir * kc, bp, acc);
                        for (int r = 0; r < mr; r++) {
                            float *crow = c + (size_t)(ic + ir + r) * ldc + jc + jr;
                            for (int q = 0; q < nr; q++) {
                                float prev = !first ? crow[q] : beta == 0 ? 0.0f : beta * crow[q];
                                crow[q] = prev + alpha * acc[r][q];
                            }
                        }
                    }
                }
            }
        }
    }
    return 0;
}

/* --- activations --------------------------------------------------------------------------- */

#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_C 0.044715f

static inline float sigmoidf(float x)
{
    /* Never exponentiates a large positive number: no overflow to inf for any x. */
    if (x >= 0.0f)
        return 1.0f / (1.0f + expf(-x));
    float e = expf(x);
    return e / (1.0f + e);
}

static inline float act_f(mgpu_act_t act, float x)
{
    switch (act) {
    case MGPU_ACT_RELU:
        return x > 0.0f ? x : 0.0f;
    case MGPU_ACT_GELU:
        return 0.5f * x * (1.0f + tanhf(GELU_K * (x + GELU_C * x * x * x)));
    case MGPU_ACT_TANH:
        return tanhf(x);
    case MGPU_ACT_SIGMOID:
        return sigmoidf(x);
    default:
        return x;
    }
}

/* act'(z) from the pre-activation z and the output y = act(z). */
static inline float act_df(mgpu_act_t act, float z, float y)
{
    switch (act) {
    case MGPU_ACT_RELU:
        return y > 0.0f ? 1.0f : 0.0f; /* PyTorch: 0 at 0 */
    case MGPU_ACT_GELU: {
        float u = GELU_K * (z + GELU_C * z * z * z);
        float t = tanhf(u);
        return 0.5f * (1.0f + t) +
               0.5f * z * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * GELU_C * z * z);
    }
    case MGPU_ACT_TANH:
        return 1.0f - y * y;
    case MGPU_ACT_SIGMOID:
        return y * (1.0f - y);
    default:
        return 1.0f;
    }
}

/* The loops below are written with restrict pointers that really do not alias (the launcher
 * allows y == z only for identity, handled apart), so that GCC's -O2 vectoriser, which will
 * not add run-time alias checks, turns them into SIMD loops. */
VECTORIZE static int cpu_bias_act_forward(void *impl, mgpu_act_t act, int rows, int cols, float *z,
                                          const float *bias, float *y, mgpu_err_t *err)
{
    const float *restrict b = bias;
    for (int r = 0; r < rows; r++) {
        float *restrict zr = z + (size_t)r * cols;
        if (b != NULL)
            for (int c = 0; c < cols; c++)
                zr[c] += b[c];
        if (act == MGPU_ACT_IDENTITY) {
            if (y != z)
                memcpy(y + (size_t)r * cols, zr, sizeof(float) * cols);
        } else if (act == MGPU_ACT_RELU) {
            float *restrict yr = y + (size_t)r * cols;
            for (int c = 0; c < cols; c++)
                yr[c] = zr[c] > 0.0f ? zr[c] : 0.0f;
        } else {
            float *restrict yr = y + (size_t)r * cols;
            for (int c = 0; c < cols; c++)
                yr[c] = act_f(act, zr[c]);
        }
    }
    return 0;
}

VECTORIZE static int cpu_act_forward(void *impl, mgpu_act_t act, size_t n, const float *x, float *y,
                                     mgpu_err_t *err)
{
    for (size_t i = 0; i < n; i++)
        y[i] = act_f(act, x[i]);
    return 0;
}

VECTORIZE static int cpu_act_backward(void *impl, mgpu_act_t act, size_t n, const float *z,
                                      const float *y, const float *dy, float *dz, mgpu_err_t *err)
{
    switch (act) {
    case MGPU_ACT_IDENTITY:
        if (dz != dy)
            memcpy(dz, dy, sizeof(float) * n);
        break;
    case MGPU_ACT_RELU: {
        const float *restrict yr = y;
        if (dz == dy) { /* in place: one pointer, so restrict holds */
            float *restrict d = dz;
            for (size_t i = 0; i < n; i++)
                d[i] = yr[i] > 0.0f ? d[i] : 0.0f;
        } else {
            float *restrict d = dz;
            const float *restrict g = dy;
            for (size_t i = 0; i < n; i++)
                d[i] = yr[i] > 0.0f ? g[i] : 0.0f;
        }
        break;
    }
    default:
        for (size_t i = 0; i < n; i++)
            dz[i] = dy[i] * act_df(act, z ? z[i] : 0.0f, y ? y[i] : 0.0f);
    }
    return 0;
}

/* --- reductions and losses ----------------------------------------------------------------- */

VECTORIZE static int cpu_sum_rows(void *impl, int rows, int cols, const float *x, float beta,
                                  float *out, mgpu_err_t *err)
{
    double stack[256];
    double *acc = cols <= 256 ? stack : malloc(sizeof(double) * cols);
    if (acc == NULL)
        return mgpu_err_set(err, -ENOMEM, "sum_rows: malloc(%zu) failed", sizeof(double) * cols);
    for (int c = 0; c < cols; c++)
        acc[c] = beta == 0.0f ? 0.0 : (double)beta * out[c];
    /* Row by row, so x is read in memory order. */
    for (int r = 0; r < rows; r++) {
        const float *restrict xr = x + (size_t)r * cols;
        double *restrict a = acc;
        for (int c = 0; c < cols; c++)
            a[c] += xr[c];
    }
    for (int c = 0; c < cols; c++)
        out[c] = (float)acc[c];
    if (acc != stack)
        free(acc);
    return 0;
}

static int cpu_softmax_xent(void *impl, int rows, int cols, const float *logits,
                            const int32_t *labels, float *loss, float *dlogits, mgpu_err_t *err)
{
    double total = 0.0;
    float inv_rows = 1.0f / (float)rows;

    for (int r = 0; r < rows; r++) {
        const float *l = logits + (size_t)r * cols;
        int32_t y = labels[r];
        if (y < 0 || y >= cols)
            return mgpu_err_set(err, MGPU_E_RANGE,
                                "softmax_xent: label %d in row %d, expected 0..%d", (int)y, r,
                                cols - 1);
        float mx = l[0];
        for (int c = 1; c < cols; c++)
            mx = l[c] > mx ? l[c] : mx;
        double s = 0.0;
        for (int c = 0; c < cols; c++)
            s += exp((double)l[c] - mx);
        double lse = mx + log(s);
        total += lse - l[y];
        if (dlogits != NULL) {
            /* Written after the row is fully read: dlogits may alias logits. */
            float *d = dlogits + (size_t)r * cols;
            for (int c = 0; c < cols; c++) {
                float p = (float)exp((double)l[c] - lse);
                d[c] = (p - (c == y ? 1.0f : 0.0f)) * inv_rows;
            }
        }
    }
    *loss = (float)(total / rows);
    return 0;
}

VECTORIZE static int cpu_mse(void *impl, int rows, int cols, const float *pred, const float *target,
                             float *loss, float *dpred, mgpu_err_t *err)
{
    size_t n = (size_t)rows * cols;
    double total = 0.0;
    float g = 2.0f / (float)n;
    for (size_t i = 0; i < n; i++) {
        float d = pred[i] - target[i];
        total += (double)d * d;
        if (dpred != NULL)
            dpred[i] = g * d;
    }
    *loss = (float)(total / (double)n);
    return 0;
}

/* --- optimizers ---------------------------------------------------------------------------- */

VECTORIZE static int cpu_sgd_step(void *impl, size_t n, float *restrict p, const float *restrict g,
                                  float *restrict buf, const mgpu_sgd_hparams_t *hp, long long step,
                                  mgpu_err_t *err)
{
    const float lr = hp->lr, mom = hp->momentum, wd = hp->weight_decay;
    const float damp = 1.0f - hp->dampening;

    if (mom == 0.0f) {
        for (size_t i = 0; i < n; i++)
            p[i] -= lr * (g[i] + wd * p[i]);
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        float d = g[i] + wd * p[i];
        /* torch.optim.SGD: the first step clones d into the buffer, undamped. */
        float b = step == 1 ? d : mom * buf[i] + damp * d;
        buf[i] = b;
        p[i] -= lr * (hp->nesterov ? d + mom * b : b);
    }
    return 0;
}

VECTORIZE static int cpu_adamw_step(void *impl, size_t n, float *restrict p,
                                    const float *restrict g, float *restrict m, float *restrict v,
                                    const mgpu_adamw_hparams_t *hp, long long step, mgpu_err_t *err)
{
    const float b1 = hp->beta1, b2 = hp->beta2, eps = hp->eps;
    const float decay = 1.0f - hp->lr * hp->weight_decay;
    const double bc1 = 1.0 - pow(b1, (double)step), bc2 = 1.0 - pow(b2, (double)step);
    const float step_size = (float)(hp->lr / bc1);
    const float bc2_sqrt = (float)sqrt(bc2);

    for (size_t i = 0; i < n; i++) {
        float gi = g[i];
        float mi = m[i] + (1.0f - b1) * (gi - m[i]); /* m.lerp_(g, 1 - b1) */
        float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = p[i] * decay - step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
    }
    return 0;
}

VECTORIZE static int cpu_scale(void *impl, size_t n, float alpha, float *restrict x,
                               mgpu_err_t *err)
{
    for (size_t i = 0; i < n; i++)
        x[i] *= alpha;
    return 0;
}

static int cpu_sum(void *impl, size_t n, const float *x, float *out, mgpu_err_t *err)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += x[i];
    *out = (float)s;
    return 0;
}

static int32_t row_argmax(int cols, const float *x)
{
    int32_t best = 0;
    for (int c = 1; c < cols; c++)
        if (x[c] > x[best])
            best = c;
    return best;
}

static int cpu_argmax_rows(void *impl, int rows, int cols, const float *x, int32_t *out,
                           mgpu_err_t *err)
{
    for (int r = 0; r < rows; r++)
        out[r] = row_argmax(cols, x + (size_t)r * cols);
    return 0;
}

static int cpu_count_correct(void *impl, int rows, int cols, const float *logits,
                             const int32_t *labels, float *out, mgpu_err_t *err)
{
    long n = 0;
    for (int r = 0; r < rows; r++)
        n += row_argmax(cols, logits + (size_t)r * cols) == labels[r];
    *out = (float)n;
    return 0;
}

const mgpu_kernels_ops_t mgpu_kernels_cpu_ops = {
    .name = "cpu",
    .impl_create = cpu_impl_create,
    .impl_destroy = cpu_impl_destroy,
    .set_precision = cpu_set_precision,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy_to_device = cpu_copy,
    .copy_to_host = cpu_copy,
    .copy = cpu_copy,
    .zero = cpu_zero,
    .sync = cpu_sync,
    .gemm = cpu_gemm,
    .bias_act_forward = cpu_bias_act_forward,
    .act_forward = cpu_act_forward,
    .act_backward = cpu_act_backward,
    .sum_rows = cpu_sum_rows,
    .softmax_xent = cpu_softmax_xent,
    .mse = cpu_mse,
    .sgd_step = cpu_sgd_step,
    .adamw_step = cpu_adamw_step,
    .scale = cpu_scale,
    .sum = cpu_sum,
    .argmax_rows = cpu_argmax_rows,
    .count_correct = cpu_count_correct,
};
