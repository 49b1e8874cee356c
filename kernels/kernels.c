/* kernels.c - backend selection and the host launchers: every argument check lives here, once,
 * so the CPU reference and the CUDA backend reject exactly the same calls. */
#include "kernels.h"

#include <errno.h>   /* EINVAL */
#include <stdlib.h>  /* calloc */
#include <strings.h> /* strcasecmp */

/* The CUDA backend is linked in when kernels_cuda.cu exists: it comes with a
 * kernels_cuda.h, and a plain (strong) reference here pulls its object out of libmgpu.a,
 * which a weak reference would not do. */
#if defined(MGPU_HAVE_CUDA) && MGPU_HAVE_CUDA && defined(__has_include)
#if __has_include("kernels_cuda.h")
#include "kernels_cuda.h" /* mgpu_kernels_cuda_ops */
#define KERNELS_HAVE_CUDA 1
#endif
#endif

static const char *const act_names[MGPU_ACT_COUNT] = {"identity", "relu", "gelu", "tanh",
                                                      "sigmoid"};
static const char *const prec_names[] = {"fp32", "tf32", "bf16"};

const char *mgpu_act_name(mgpu_act_t act)
{
    return (unsigned)act < MGPU_ACT_COUNT ? act_names[act] : "?";
}

int mgpu_act_parse(const char *s)
{
    for (int i = 0; i < MGPU_ACT_COUNT; i++)
        if (strcasecmp(s, act_names[i]) == 0)
            return i;
    return -1;
}

const char *mgpu_precision_name(mgpu_precision_t p)
{
    return (unsigned)p < 3 ? prec_names[p] : "?";
}

int mgpu_precision_parse(const char *s)
{
    for (int i = 0; i < 3; i++)
        if (strcasecmp(s, prec_names[i]) == 0)
            return i;
    return -1;
}

static const mgpu_kernels_ops_t *backend_ops(mgpu_kbackend_t backend)
{
    if (backend == MGPU_KBACKEND_CPU)
        return &mgpu_kernels_cpu_ops;
#ifdef KERNELS_HAVE_CUDA
    if (backend == MGPU_KBACKEND_CUDA)
        return &mgpu_kernels_cuda_ops;
#endif
    return NULL;
}

int mgpu_kernels_available(mgpu_kbackend_t backend)
{
    return backend_ops(backend) != NULL;
}

int mgpu_kernels_create(mgpu_kbackend_t backend, int device, mgpu_kernels_t **out, mgpu_err_t *err)
{
    const mgpu_kernels_ops_t *ops = backend_ops(backend);
    mgpu_kernels_t *k;
    int rc;

    *out = NULL;
    if (ops == NULL)
        return mgpu_err_set(err, MGPU_E_DEVICE,
                            "kernels: backend %d is not in this build (CUDA kernels are built "
                            "when nvcc is found and kernels/kernels_cuda.cu exists)",
                            (int)backend);
    k = calloc(1, sizeof *k);
    if (k == NULL)
        return mgpu_err_set(err, -ENOMEM, "kernels: calloc(%zu) failed", sizeof *k);
    k->ops = ops;
    k->backend = backend;
    k->device = backend == MGPU_KBACKEND_CPU ? -1 : device;
    k->precision = MGPU_PREC_FP32;
    rc = ops->impl_create(device, &k->impl, err);
    if (rc < 0) {
        free(k);
        return rc;
    }
    *out = k;
    return 0;
}

void mgpu_kernels_destroy(mgpu_kernels_t *k)
{
    if (k == NULL)
        return;
    k->ops->impl_destroy(k->impl);
    free(k);
}

int mgpu_kernels_set_precision(mgpu_kernels_t *k, mgpu_precision_t prec, mgpu_err_t *err)
{
    int rc;
    if ((unsigned)prec > MGPU_PREC_BF16)
        return mgpu_err_set(err, -EINVAL, "kernels: precision %d, expected fp32, tf32 or bf16",
                            (int)prec);
    rc = k->ops->set_precision(k->impl, prec, err);
    if (rc == 0)
        k->precision = prec;
    return rc;
}

/* --- memory ------------------------------------------------------------------------------ */

int mgpu_k_alloc(mgpu_kernels_t *k, size_t bytes, void **out, mgpu_err_t *err)
{
    *out = NULL;
    return k->ops->alloc(k->impl, bytes, out, err);
}

void mgpu_k_free(mgpu_kernels_t *k, void *p)
{
    if (p != NULL)
        k->ops->free(k->impl, p);
}

#define NEED_PTR(op, p)                                                                            \
    do {                                                                                           \
        if ((p) == NULL)                                                                           \
            return mgpu_err_set(err, -EINVAL, "%s: %s is NULL", op, #p);                           \
    } while (0)

int mgpu_k_copy_to_device(mgpu_kernels_t *k, void *dst, const void *host_src, size_t bytes,
                          mgpu_err_t *err)
{
    if (bytes == 0)
        return 0;
    NEED_PTR("copy_to_device", dst);
    NEED_PTR("copy_to_device", host_src);
    return k->ops->copy_to_device(k->impl, dst, host_src, bytes, err);
}

int mgpu_k_copy_to_host(mgpu_kernels_t *k, void *host_dst, const void *src, size_t bytes,
                        mgpu_err_t *err)
{
    if (bytes == 0)
        return 0;
    NEED_PTR("copy_to_host", host_dst);
    NEED_PTR("copy_to_host", src);
    return k->ops->copy_to_host(k->impl, host_dst, src, bytes, err);
}

int mgpu_k_copy(mgpu_kernels_t *k, void *dst, const void *src, size_t bytes, mgpu_err_t *err)
{
    if (bytes == 0)
        return 0;
    NEED_PTR("copy", dst);
    NEED_PTR("copy", src);
    return k->ops->copy(k->impl, dst, src, bytes, err);
}

int mgpu_k_zero(mgpu_kernels_t *k, void *dst, size_t bytes, mgpu_err_t *err)
{
    if (bytes == 0)
        return 0;
    NEED_PTR("zero", dst);
    return k->ops->zero(k->impl, dst, bytes, err);
}

int mgpu_k_sync(mgpu_kernels_t *k, mgpu_err_t *err)
{
    return k->ops->sync(k->impl, err);
}

int mgpu_k_join(mgpu_kernels_t *k, mgpu_err_t *err)
{
    return k->ops->join != NULL ? k->ops->join(k->impl, err) : 0;
}

int mgpu_k_written(mgpu_kernels_t *k, const void *p, size_t bytes, mgpu_err_t *err)
{
    return k->ops->written != NULL ? k->ops->written(k->impl, p, bytes, err) : 0;
}

/* --- math -------------------------------------------------------------------------------- */

static int check_act(const char *op, mgpu_act_t act, mgpu_err_t *err)
{
    if ((unsigned)act >= MGPU_ACT_COUNT)
        return mgpu_err_set(err, -EINVAL,
                            "%s: activation %d, expected identity, relu, gelu, tanh or sigmoid", op,
                            (int)act);
    return 0;
}

static int check_dims(const char *op, int rows, int cols, mgpu_err_t *err)
{
    if (rows < 0 || cols < 0)
        return mgpu_err_set(err, -EINVAL, "%s: shape [%d, %d], expected non-negative sizes", op,
                            rows, cols);
    return 0;
}

int mgpu_k_gemm(mgpu_kernels_t *k, int trans_a, int trans_b, int m, int n, int kk, float alpha,
                const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc,
                mgpu_err_t *err)
{
    /* Stored shapes: A is m x k (k x m transposed), B is k x n (n x k transposed). */
    int a_cols = trans_a ? m : kk, b_cols = trans_b ? kk : n;

    if (m < 0 || n < 0 || kk < 0)
        return mgpu_err_set(err, -EINVAL, "gemm: m=%d n=%d k=%d, expected non-negative sizes", m, n,
                            kk);
    if (m == 0 || n == 0)
        return 0;
    NEED_PTR("gemm", c);
    if (ldc < n)
        return mgpu_err_set(err, -EINVAL, "gemm: ldc=%d, expected >= n=%d", ldc, n);
    if (kk > 0) {
        NEED_PTR("gemm", a);
        NEED_PTR("gemm", b);
        if (lda < (a_cols > 0 ? a_cols : 1))
            return mgpu_err_set(err, -EINVAL,
                                "gemm: lda=%d, expected >= %d (A is %d x %d stored%s)", lda, a_cols,
                                trans_a ? kk : m, a_cols, trans_a ? ", transposed" : "");
        if (ldb < (b_cols > 0 ? b_cols : 1))
            return mgpu_err_set(err, -EINVAL,
                                "gemm: ldb=%d, expected >= %d (B is %d x %d stored%s)", ldb, b_cols,
                                trans_b ? n : kk, b_cols, trans_b ? ", transposed" : "");
    }
    return k->ops->gemm(k->impl, trans_a != 0, trans_b != 0, m, n, kk, alpha, a, lda, b, ldb, beta,
                        c, ldc, err);
}

int mgpu_k_bias_act_forward(mgpu_kernels_t *k, mgpu_act_t act, int rows, int cols, float *z,
                            const float *bias, float *y, mgpu_err_t *err)
{
    int rc;
    if ((rc = check_act("bias_act_forward", act, err)) < 0 ||
        (rc = check_dims("bias_act_forward", rows, cols, err)) < 0)
        return rc;
    if (rows == 0 || cols == 0)
        return 0;
    NEED_PTR("bias_act_forward", z);
    NEED_PTR("bias_act_forward", y);
    if (y == z && act != MGPU_ACT_IDENTITY)
        return mgpu_err_set(err, -EINVAL,
                            "bias_act_forward: y == z with activation %s, expected separate "
                            "buffers (backward needs the pre-activation)",
                            mgpu_act_name(act));
    return k->ops->bias_act_forward(k->impl, act, rows, cols, z, bias, y, err);
}

int mgpu_k_act_forward(mgpu_kernels_t *k, mgpu_act_t act, size_t n, const float *x, float *y,
                       mgpu_err_t *err)
{
    int rc = check_act("act_forward", act, err);
    if (rc < 0 || n == 0)
        return rc;
    NEED_PTR("act_forward", x);
    NEED_PTR("act_forward", y);
    return k->ops->act_forward(k->impl, act, n, x, y, err);
}

int mgpu_k_act_backward(mgpu_kernels_t *k, mgpu_act_t act, size_t n, const float *z, const float *y,
                        const float *dy, float *dz, mgpu_err_t *err)
{
    int rc = check_act("act_backward", act, err);
    if (rc < 0 || n == 0)
        return rc;
    NEED_PTR("act_backward", dy);
    NEED_PTR("act_backward", dz);
    if (act == MGPU_ACT_GELU)
        NEED_PTR("act_backward", z);
    if (act == MGPU_ACT_RELU || act == MGPU_ACT_TANH || act == MGPU_ACT_SIGMOID)
        NEED_PTR("act_backward", y);
    return k->ops->act_backward(k->impl, act, n, z, y, dy, dz, err);
}

int mgpu_k_sum_rows(mgpu_kernels_t *k, int rows, int cols, const float *x, float beta, float *out,
                    mgpu_err_t *err)
{
    int rc = check_dims("sum_rows", rows, cols, err);
    if (rc < 0 || cols == 0)
        return rc;
    NEED_PTR("sum_rows", out);
    if (rows > 0)
        NEED_PTR("sum_rows", x);
    return k->ops->sum_rows(k->impl, rows, cols, x, beta, out, err);
}

int mgpu_k_softmax_xent(mgpu_kernels_t *k, int rows, int cols, const float *logits,
                        const int32_t *labels, float *loss, float *dlogits, mgpu_err_t *err)
{
    int rc = check_dims("softmax_xent", rows, cols, err);
    if (rc < 0)
        return rc;
    if (rows == 0)
        return mgpu_err_set(err, -EINVAL, "softmax_xent: 0 rows, expected a non-empty batch");
    if (cols < 1)
        return mgpu_err_set(err, -EINVAL, "softmax_xent: %d classes, expected >= 1", cols);
    NEED_PTR("softmax_xent", logits);
    NEED_PTR("softmax_xent", labels);
    NEED_PTR("softmax_xent", loss);
    return k->ops->softmax_xent(k->impl, rows, cols, logits, labels, loss, dlogits, err);
}

int mgpu_k_mse(mgpu_kernels_t *k, int rows, int cols, const float *pred, const float *target,
               float *loss, float *dpred, mgpu_err_t *err)
{
    int rc = check_dims("mse", rows, cols, err);
    if (rc < 0)
        return rc;
    if (rows == 0 || cols == 0)
        return mgpu_err_set(err, -EINVAL, "mse: shape [%d, %d], expected a non-empty batch", rows,
                            cols);
    NEED_PTR("mse", pred);
    NEED_PTR("mse", target);
    NEED_PTR("mse", loss);
    return k->ops->mse(k->impl, rows, cols, pred, target, loss, dpred, err);
}

int mgpu_k_sgd_step(mgpu_kernels_t *k, size_t n, float *p, const float *g, float *momentum_buf,
                    const mgpu_sgd_hparams_t *hp, long long step, mgpu_err_t *err)
{
    NEED_PTR("sgd_step", hp);
    if (!(hp->lr >= 0.0f) || !(hp->momentum >= 0.0f) || !(hp->weight_decay >= 0.0f) ||
        !(hp->dampening >= 0.0f && hp->dampening <= 1.0f))
        return mgpu_err_set(err, MGPU_E_RANGE,
                            "sgd_step: lr=%g momentum=%g weight_decay=%g dampening=%g, expected "
                            "lr, momentum, weight_decay >= 0 and dampening in [0, 1]",
                            hp->lr, hp->momentum, hp->weight_decay, hp->dampening);
    if (hp->nesterov && (hp->momentum <= 0.0f || hp->dampening != 0.0f))
        return mgpu_err_set(err, MGPU_E_RANGE,
                            "sgd_step: nesterov needs momentum > 0 and dampening 0 (as "
                            "torch.optim.SGD), got momentum=%g dampening=%g",
                            hp->momentum, hp->dampening);
    if (step < 1)
        return mgpu_err_set(err, MGPU_E_RANGE, "sgd_step: step=%lld, expected >= 1", step);
    if (n == 0)
        return 0;
    NEED_PTR("sgd_step", p);
    NEED_PTR("sgd_step", g);
    if (hp->momentum != 0.0f)
        NEED_PTR("sgd_step", momentum_buf);
    return k->ops->sgd_step(k->impl, n, p, g, momentum_buf, hp, step, err);
}

int mgpu_k_adamw_step(mgpu_kernels_t *k, size_t n, float *p, const float *g, float *m, float *v,
                      const mgpu_adamw_hparams_t *hp, long long step, mgpu_err_t *err)
{
    NEED_PTR("adamw_step", hp);
    if (!(hp->lr >= 0.0f) || !(hp->beta1 >= 0.0f && hp->beta1 < 1.0f) ||
        !(hp->beta2 >= 0.0f && hp->beta2 < 1.0f) || !(hp->eps > 0.0f) ||
        !(hp->weight_decay >= 0.0f))
        return mgpu_err_set(err, MGPU_E_RANGE,
                            "adamw_step: lr=%g betas=(%g, %g) eps=%g weight_decay=%g, expected "
                            "lr >= 0, betas in [0, 1), eps > 0, weight_decay >= 0",
                            hp->lr, hp->beta1, hp->beta2, hp->eps, hp->weight_decay);
    if (step < 1)
        return mgpu_err_set(err, MGPU_E_RANGE, "adamw_step: step=%lld, expected >= 1", step);
    if (n == 0)
        return 0;
    NEED_PTR("adamw_step", p);
    NEED_PTR("adamw_step", g);
    NEED_PTR("adamw_step", m);
    NEED_PTR("adamw_step", v);
    return k->ops->adamw_step(k->impl, n, p, g, m, v, hp, step, err);
}

int mgpu_k_scale(mgpu_kernels_t *k, size_t n, float alpha, float *x, mgpu_err_t *err)
{
    if (n == 0)
        return 0;
    NEED_PTR("scale", x);
    return k->ops->scale(k->impl, n, alpha, x, err);
}

int mgpu_k_sum(mgpu_kernels_t *k, size_t n, const float *x, float *out, mgpu_err_t *err)
{
    NEED_PTR("sum", out);
    if (n > 0)
        NEED_PTR("sum", x);
    return k->ops->sum(k->impl, n, x, out, err);
}

int mgpu_k_argmax_rows(mgpu_kernels_t *k, int rows, int cols, const float *x, int32_t *out,
                       mgpu_err_t *err)
{
    int rc = check_dims("argmax_rows", rows, cols, err);
    if (rc < 0 || rows == 0)
        return rc;
    if (cols < 1)
        return mgpu_err_set(err, -EINVAL, "argmax_rows: %d columns, expected >= 1", cols);
    NEED_PTR("argmax_rows", x);
    NEED_PTR("argmax_rows", out);
    return k->ops->argmax_rows(k->impl, rows, cols, x, out, err);
}

int mgpu_k_count_correct(mgpu_kernels_t *k, int rows, int cols, const float *logits,
                         const int32_t *labels, float *out, mgpu_err_t *err)
{
    int rc = check_dims("count_correct", rows, cols, err);
    if (rc < 0)
        return rc;
    if (cols < 1)
        return mgpu_err_set(err, -EINVAL, "count_correct: %d columns, expected >= 1", cols);
    NEED_PTR("count_correct", out);
    if (rows > 0) {
        NEED_PTR("count_correct", logits);
        NEED_PTR("count_correct", labels);
    }
    return k->ops->count_correct(k->impl, rows, cols, logits, labels, out, err);
}

/* --- fused linear layer -------------------------------------------------------------------- */

size_t mgpu_k_linear_aux_bytes(int rows, int out)
{
    /* cuBLASLt's relu bit mask: one bit per element, columns (our rows) of a leading dimension
     * rounded up to 128 bits; 256 bytes of slack keep the end aligned. */
    if (rows < 0 || out < 0)
        return 0;
    return (size_t)(out + 127) / 128 * 16 * (size_t)rows + 256;
}

static int check_linear(const char *op, int rows, int out, int in, mgpu_err_t *err)
{
    if (rows < 1 || out < 1 || in < 1)
        return mgpu_err_set(err, -EINVAL, "%s: rows=%d out=%d in=%d, expected >= 1 each", op, rows,
                            out, in);
    return 0;
}

int mgpu_k_linear_forward(mgpu_kernels_t *k, mgpu_act_t act, int rows, int out, int in,
                          const float *x, const float *w, const float *bias, float *z, float *y,
                          void *aux, mgpu_err_t *err)
{
    int rc;
    if ((rc = check_linear("linear_forward", rows, out, in, err)) < 0)
        return rc;
    NEED_PTR("linear_forward", x);
    NEED_PTR("linear_forward", w);
    NEED_PTR("linear_forward", z);
    NEED_PTR("linear_forward", y);
    if ((unsigned)act >= MGPU_ACT_COUNT)
        return mgpu_err_set(err, -EINVAL, "linear_forward: activation %d unknown", (int)act);
    if (y == z && act != MGPU_ACT_IDENTITY)
        return mgpu_err_set(err, -EINVAL,
                            "linear_forward: y == z with activation %s, expected separate "
                            "buffers (backward needs the pre-activation)",
                            mgpu_act_name(act));
    if (k->ops->linear_forward != NULL) {
        rc = k->ops->linear_forward(k->impl, act, rows, out, in, x, w, bias, z, y, aux, err);
        if (rc != MGPU_K_DECLINED)
            return rc;
    }
    rc = mgpu_k_gemm(k, 0, 1, rows, out, in, 1.0f, x, in, w, in, 0.0f, z, out, err);
    return rc < 0 ? rc : mgpu_k_bias_act_forward(k, act, rows, out, z, bias, y, err);
}

int mgpu_k_linear_backward_data(mgpu_kernels_t *k, mgpu_act_t act, int rows, int out, int in,
                                const float *dz, const float *w, const float *z_in,
                                const float *y_in, const void *aux_in, float *dx, float *dbias,
                                mgpu_err_t *err)
{
    int rc;
    if ((rc = check_linear("linear_backward_data", rows, out, in, err)) < 0)
        return rc;
    NEED_PTR("linear_backward_data", dz);
    NEED_PTR("linear_backward_data", w);
    NEED_PTR("linear_backward_data", dx);
    if ((unsigned)act >= MGPU_ACT_COUNT)
        return mgpu_err_set(err, -EINVAL, "linear_backward_data: activation %d unknown", (int)act);
    if (act != MGPU_ACT_IDENTITY) {
        NEED_PTR("linear_backward_data", z_in);
        NEED_PTR("linear_backward_data", y_in);
    }
    if (k->ops->linear_backward_data != NULL) {
        rc = k->ops->linear_backward_data(k->impl, act, rows, out, in, dz, w, z_in, y_in, aux_in,
                                          dx, dbias, err);
        if (rc != MGPU_K_DECLINED)
            return rc;
    }
    rc = mgpu_k_gemm(k, 0, 0, rows, in, out, 1.0f, dz, out, w, in, 0.0f, dx, in, err);
    if (rc == 0 && act != MGPU_ACT_IDENTITY)
        rc = mgpu_k_act_backward(k, act, (size_t)rows * in, z_in, y_in, dx, dx, err);
    if (rc == 0 && dbias != NULL)
        rc = mgpu_k_sum_rows(k, rows, in, dx, 0.0f, dbias, err);
    return rc;
}

int mgpu_k_linear_loss(mgpu_kernels_t *k, const mgpu_k_head_t *h, mgpu_err_t *err)
{
    int rc;
    NEED_PTR("linear_loss", h);
    if ((rc = check_linear("linear_loss", h->rows, h->out, h->in, err)) < 0)
        return rc;
    NEED_PTR("linear_loss", h->x);
    NEED_PTR("linear_loss", h->w);
    NEED_PTR("linear_loss", h->y);
    NEED_PTR("linear_loss", h->loss_out);
    NEED_PTR("linear_loss", h->dy);
    if (h->loss == MGPU_LOSS_CROSS_ENTROPY)
        NEED_PTR("linear_loss", h->labels);
    else if (h->loss == MGPU_LOSS_MSE)
        NEED_PTR("linear_loss", h->targets);
    else
        return mgpu_err_set(err, -EINVAL,
                            "linear_loss: loss %d unknown, expected mse or "
                            "cross_entropy",
                            (int)h->loss);
    if (h->dx != NULL) {
        if ((unsigned)h->act_in >= MGPU_ACT_COUNT)
            return mgpu_err_set(err, -EINVAL, "linear_loss: activation %d unknown", (int)h->act_in);
        if (h->act_in != MGPU_ACT_IDENTITY)
            NEED_PTR("linear_loss", h->z_in);
    }
    if (k->ops->linear_loss != NULL) {
        rc = k->ops->linear_loss(k->impl, h, err);
        if (rc != MGPU_K_DECLINED)
            return rc;
    }
    rc = mgpu_k_linear_forward(k, MGPU_ACT_IDENTITY, h->rows, h->out, h->in, h->x, h->w, h->bias,
                               h->y, h->y, NULL, err);
    if (rc == 0)
        rc = h->loss == MGPU_LOSS_CROSS_ENTROPY
                 ? mgpu_k_softmax_xent(k, h->rows, h->out, h->y, h->labels, h->loss_out, h->dy, err)
                 : mgpu_k_mse(k, h->rows, h->out, h->y, h->targets, h->loss_out, h->dy, err);
    if (rc == 0 && h->dx != NULL)
        rc = mgpu_k_linear_backward_data(k, h->act_in, h->rows, h->out, h->in, h->dy, h->w, h->z_in,
                                         h->x, h->aux_in, h->dx, h->dbias_in, err);
    return rc;
}

int mgpu_k_linear_backward_weight(mgpu_kernels_t *k, int rows, int out, int in, const float *dz,
                                  const float *x, float *dw, float *dbias, mgpu_err_t *err)
{
    int rc;
    if ((rc = check_linear("linear_backward_weight", rows, out, in, err)) < 0)
        return rc;
    NEED_PTR("linear_backward_weight", dz);
    NEED_PTR("linear_backward_weight", x);
    NEED_PTR("linear_backward_weight", dw);
    if (k->ops->linear_backward_weight != NULL) {
        rc = k->ops->linear_backward_weight(k->impl, rows, out, in, dz, x, dw, dbias, err);
        if (rc != MGPU_K_DECLINED)
            return rc;
    }
    rc = mgpu_k_gemm(k, 1, 0, out, in, rows, 1.0f, dz, out, x, in, 0.0f, dw, in, err);
    if (rc == 0 && dbias != NULL)
        rc = mgpu_k_sum_rows(k, rows, out, dz, 0.0f, dbias, err);
    return rc;
}
