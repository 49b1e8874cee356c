/* optimizers.c - torch.optim.SGD and AdamW updates in plain C: the CPU backend's, and the
 * reference of optimizers.cu. */
#include "cpu_ref.h" /* cpu_impl_t, VECTORIZE, the reference functions */

#include <math.h> /* pow, sqrt, sqrtf */

VECTORIZE int mgpu_cpu_sgd_step(void *impl, size_t n, float *restrict p, const float *restrict g,
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

VECTORIZE int mgpu_cpu_adamw_step(void *impl, size_t n, float *restrict p, const float *restrict g,
                                  float *restrict m, float *restrict v,
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
