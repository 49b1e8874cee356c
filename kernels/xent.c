/* xent.c - softmax cross-entropy in plain C, in double: the CPU backend's, and the reference
 * of xent.cu. */
#include "cpu_ref.h" /* cpu_impl_t, VECTORIZE, the reference functions */

#include <math.h> /* exp, log */

int mgpu_cpu_softmax_xent(void *impl, int rows, int cols, const float *logits,
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
