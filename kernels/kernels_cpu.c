/* kernels_cpu.c - the plain-C backend (its state, memory and op table; the ops are in one
 * file per family, kernels/README.md): what CPU workers compute with, and the reference every
 * CUDA kernel is tested against. Single-threaded on purpose: CPU ranks are processes (or DP
 * threads) already, and a threaded GEMM would oversubscribe the cores they share.
 *
 * Arguments arrive checked by the launchers in kernels.c. Reductions accumulate in double so
 * the reference is more accurate than the kernels it judges. */
#include "cpu_ref.h" /* cpu_impl_t, the reference functions */
#include "options.h" /* mgpu_kernels_options_read: MGPU_CPU_GEMM */

#include <errno.h>  /* ENOMEM */
#include <stdlib.h> /* aligned_alloc, free */
#include <string.h> /* memmove, memset */

static int cpu_impl_create(int device, void **impl, mgpu_err_t *err)
{
    mgpu_kernels_options_t opt;
    int rc = mgpu_kernels_options_read(&opt, err);
    if (rc < 0)
        return rc;
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
    if (opt.cpu_gemm_portable)
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
    free(c->gpt_scratch);
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
    .gemm = mgpu_cpu_gemm,
    .bias_act_forward = mgpu_cpu_bias_act_forward,
    .act_forward = mgpu_cpu_act_forward,
    .act_backward = mgpu_cpu_act_backward,
    .sum_rows = mgpu_cpu_sum_rows,
    .softmax_xent = mgpu_cpu_softmax_xent,
    .mse = mgpu_cpu_mse,
    .sgd_step = mgpu_cpu_sgd_step,
    .adamw_step = mgpu_cpu_adamw_step,
    .scale = mgpu_cpu_scale,
    .sum = mgpu_cpu_sum,
    .argmax_rows = mgpu_cpu_argmax_rows,
    .count_correct = mgpu_cpu_count_correct,
};
