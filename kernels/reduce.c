/* reduce.c - sums, column sums, mean squared error, argmax and the count of correct rows in
 * plain C, accumulated in double: the CPU backend's, and the reference of reduce.cu. */
#include "cpu_ref.h" /* cpu_impl_t, VECTORIZE, the reference functions */

#include <errno.h>  /* ENOMEM */
#include <stdlib.h> /* malloc, free */

VECTORIZE int mgpu_cpu_sum_rows(void *impl, int rows, int cols, const float *x, float beta,
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

VECTORIZE int mgpu_cpu_mse(void *impl, int rows, int cols, const float *pred, const float *target,
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

int mgpu_cpu_sum(void *impl, size_t n, const float *x, float *out, mgpu_err_t *err)
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

int mgpu_cpu_argmax_rows(void *impl, int rows, int cols, const float *x, int32_t *out,
                         mgpu_err_t *err)
{
    for (int r = 0; r < rows; r++)
        out[r] = row_argmax(cols, x + (size_t)r * cols);
    return 0;
}

int mgpu_cpu_count_correct(void *impl, int rows, int cols, const float *logits,
                           const int32_t *labels, float *out, mgpu_err_t *err)
{
    long n = 0;
    for (int r = 0; r < rows; r++)
        n += row_argmax(cols, logits + (size_t)r * cols) == labels[r];
    *out = (float)n;
    return 0;
}
