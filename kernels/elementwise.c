/* elementwise.c - activations and scale in plain C: the CPU backend's, and the reference of
 * elementwise.cu. */
#include "cpu_ref.h" /* cpu_impl_t, VECTORIZE, GELU_K, the reference functions */

#include <math.h>   /* expf, tanhf */
#include <string.h> /* memcpy */

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
VECTORIZE int mgpu_cpu_bias_act_forward(void *impl, mgpu_act_t act, int rows, int cols, float *z,
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

VECTORIZE int mgpu_cpu_act_forward(void *impl, mgpu_act_t act, size_t n, const float *x, float *y,
                                   mgpu_err_t *err)
{
    for (size_t i = 0; i < n; i++)
        y[i] = act_f(act, x[i]);
    return 0;
}

VECTORIZE int mgpu_cpu_act_backward(void *impl, mgpu_act_t act, size_t n, const float *z,
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

VECTORIZE int mgpu_cpu_scale(void *impl, size_t n, float alpha, float *restrict x, mgpu_err_t *err)
{
    for (size_t i = 0; i < n; i++)
        x[i] *= alpha;
    return 0;
}
