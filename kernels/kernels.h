/* kernels.h - every op the trainer computes, behind one table of function pointers.
 *
 * A backend is an mgpu_kernels_ops_t: the plain-C one (kernels_cpu.c) is both the CPU backend
 * and the reference every other backend is tested against; a CUDA backend (kernels_cuda.cu
 * and the family files beside it, kernels/README.md) fills the same table with device code. This
 * header includes no CUDA header, so launcher/, common/ and CPU-only builds never see CUDA.
 *
 * The CUDA backend: kernels/kernels_cuda.cu defines, with C linkage,
 *   extern "C" const mgpu_kernels_ops_t mgpu_kernels_cuda_ops = {...};
 * and kernels/kernels_cuda.h declares it (`extern const mgpu_kernels_ops_t
 * mgpu_kernels_cuda_ops;`, plain C). kernels.c sees that header when MGPU_HAVE_CUDA is set and
 * then offers MGPU_KBACKEND_CUDA; nothing else changes. impl_create(device) selects the device
 * and makes the backend's stream and cuBLAS handle; the ops run asynchronously on that stream
 * (sync waits), and the scalar outputs (loss, sum, correct) stay in device memory. The shape
 * checks are done here before any op reaches the backend; a backend only sizes its grid and
 * checks the launch. Test a new backend against mgpu_kernels_cpu_ops op by op.
 *
 * Call the mgpu_k_* functions below, never the table directly: they are the host launchers.
 * They check shapes and arguments once for every backend (returning -EINVAL or MGPU_E_RANGE
 * with a message that names the op, the argument and what was expected), then dispatch.
 *
 * Memory: every float/int32 pointer passed to an op is backend memory ("device memory"): host
 * memory for the CPU backend, GPU memory for CUDA. Allocate it with mgpu_k_alloc and move data
 * with mgpu_k_copy_*; scalar results (loss, sum, correct count) are written to backend memory
 * too, so a GPU never synchronises inside a step; read them with mgpu_k_copy_to_host.
 *
 * Layout: matrices are row-major; "ld" is the distance in elements between two rows. Ops may
 * run asynchronously on a GPU backend; mgpu_k_sync waits for all of them.
 *
 * Ownership: mgpu_kernels_create returns an object the caller frees with
 * mgpu_kernels_destroy; memory from mgpu_k_alloc is freed with mgpu_k_free on the same
 * object, before it is destroyed. An mgpu_kernels_t is used by one thread at a time. */
#ifndef MGPU_KERNELS_H
#define MGPU_KERNELS_H

#include <stddef.h> /* size_t */
#include <stdint.h> /* int32_t */

#include "error.h" /* mgpu_err_t */

typedef enum mgpu_kbackend {
    MGPU_KBACKEND_CPU = 0, /* plain C, always present */
    MGPU_KBACKEND_CUDA = 1 /* present when a kernels_cuda.cu defines mgpu_kernels_cuda_ops */
} mgpu_kbackend_t;

/* Activation functions. GELU is the tanh approximation (PyTorch's approximate="tanh"). */
typedef enum mgpu_act {
    MGPU_ACT_IDENTITY = 0,
    MGPU_ACT_RELU,
    MGPU_ACT_GELU,
    MGPU_ACT_TANH,
    MGPU_ACT_SIGMOID,
    MGPU_ACT_COUNT
} mgpu_act_t;

/* GEMM precision: a request; the CPU backend always computes in fp32 (it accepts the others
 * so that one cfg runs everywhere, and says so through mgpu_kernels_precision_name). */
typedef enum mgpu_precision {
    MGPU_PREC_FP32 = 0,
    MGPU_PREC_TF32,
    MGPU_PREC_BF16,
} mgpu_precision_t;

/* torch.optim.SGD: weight_decay adds wd*p to the gradient; with momentum the first step
 * copies the gradient into the buffer (no dampening), later steps do
 * buf = momentum*buf + (1-dampening)*g; nesterov uses g + momentum*buf instead of buf. */
/* The losses: nn.MSELoss and nn.CrossEntropyLoss, mean reduction. */
typedef enum mgpu_loss { MGPU_LOSS_MSE = 0, MGPU_LOSS_CROSS_ENTROPY = 1 } mgpu_loss_t;

/* The output layer, its loss and the gradient of the layer's input, in one (see
 * mgpu_k_linear_loss): what the last layer of a network computes in a training step. */
typedef struct mgpu_k_head {
    mgpu_loss_t loss;
    int rows, out, in;
    const float *x, *w, *bias; /* x [rows, in], W [out, in], bias [out] (may be NULL) */
    float *y;                  /* [rows, out]: the output (logits or predictions) */
    const int32_t *labels;     /* [rows]: cross-entropy's classes */
    const float *targets;      /* [rows, out]: mse's targets */
    float *loss_out;           /* one float: the mean loss */
    float *dy;                 /* [rows, out]: dLoss/dy */
    /* The input's gradient, when dx is not NULL: x = act_in(z_in) is the output of the layer
     * below (z_in, aux_in: its pre-activation and the mask its linear_forward kept), and
     * dbias_in (may be NULL) that layer's bias gradient, unless the op leaves it (below). */
    mgpu_act_t act_in;
    const float *z_in;
    const void *aux_in;
    float *dx, *dbias_in;
} mgpu_k_head_t;

typedef struct mgpu_sgd_hparams {
    float lr, momentum, dampening, weight_decay;
    int nesterov;
} mgpu_sgd_hparams_t;

/* torch.optim.AdamW (amsgrad off): p *= 1 - lr*wd (decoupled), m and v moving averages,
 * p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps). */
typedef struct mgpu_adamw_hparams {
    float lr, beta1, beta2, eps, weight_decay;
} mgpu_adamw_hparams_t;

/* The backend table. impl is the backend's own state (a cuBLAS handle and a stream for CUDA,
 * NULL for the CPU). Arguments reach it already checked by the mgpu_k_* launchers. */
typedef struct mgpu_kernels_ops {
    const char *name;
    int (*impl_create)(int device, void **impl, mgpu_err_t *err);
    void (*impl_destroy)(void *impl);
    int (*set_precision)(void *impl, mgpu_precision_t prec, mgpu_err_t *err);

    int (*alloc)(void *impl, size_t bytes, void **out, mgpu_err_t *err);
    void (*free)(void *impl, void *p);
    int (*copy_to_device)(void *impl, void *dst, const void *src, size_t bytes, mgpu_err_t *err);
    int (*copy_to_host)(void *impl, void *dst, const void *src, size_t bytes, mgpu_err_t *err);
    int (*copy)(void *impl, void *dst, const void *src, size_t bytes, mgpu_err_t *err);
    int (*zero)(void *impl, void *dst, size_t bytes, mgpu_err_t *err);
    int (*sync)(void *impl, mgpu_err_t *err);

    int (*gemm)(void *impl, int trans_a, int trans_b, int m, int n, int k, float alpha,
                const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc,
                mgpu_err_t *err);
    int (*bias_act_forward)(void *impl, mgpu_act_t act, int rows, int cols, float *z,
                            const float *bias, float *y, mgpu_err_t *err);
    int (*act_forward)(void *impl, mgpu_act_t act, size_t n, const float *x, float *y,
                       mgpu_err_t *err);
    int (*act_backward)(void *impl, mgpu_act_t act, size_t n, const float *z, const float *y,
                        const float *dy, float *dz, mgpu_err_t *err);
    int (*sum_rows)(void *impl, int rows, int cols, const float *x, float beta, float *out,
                    mgpu_err_t *err);
    int (*softmax_xent)(void *impl, int rows, int cols, const float *logits, const int32_t *labels,
                        float *loss, float *dlogits, mgpu_err_t *err);
    int (*mse)(void *impl, int rows, int cols, const float *pred, const float *target, float *loss,
               float *dpred, mgpu_err_t *err);
    int (*sgd_step)(void *impl, size_t n, float *p, const float *g, float *buf,
                    const mgpu_sgd_hparams_t *hp, long long step, mgpu_err_t *err);
    int (*adamw_step)(void *impl, size_t n, float *p, const float *g, float *m, float *v,
                      const mgpu_adamw_hparams_t *hp, long long step, mgpu_err_t *err);
    int (*scale)(void *impl, size_t n, float alpha, float *x, mgpu_err_t *err);
    int (*sum)(void *impl, size_t n, const float *x, float *out, mgpu_err_t *err);
    int (*argmax_rows)(void *impl, int rows, int cols, const float *x, int32_t *out,
                       mgpu_err_t *err);
    int (*count_correct)(void *impl, int rows, int cols, const float *logits, const int32_t *labels,
                         float *out, mgpu_err_t *err);
    /* Fused linear-layer ops (see mgpu_k_linear_forward and below). Optional: NULL, or a
     * return of MGPU_K_DECLINED, makes the launcher compose them from the ops above, which is
     * also their reference (the CPU table leaves them NULL). */
    int (*linear_forward)(void *impl, mgpu_act_t act, int rows, int out, int in, const float *x,
                          const float *w, const float *bias, float *z, float *y, void *aux,
                          mgpu_err_t *err);
    int (*linear_backward_data)(void *impl, mgpu_act_t act, int rows, int out, int in,
                                const float *dz, const float *w, const float *z_in,
                                const float *y_in, const void *aux_in, float *dx, float *dbias,
                                mgpu_err_t *err);
    int (*linear_backward_weight)(void *impl, int rows, int out, int in, const float *dz,
                                  const float *x, float *dw, float *dbias, mgpu_err_t *err);
    /* Optional (NULL: nothing to wait for): see mgpu_k_join. */
    int (*join)(void *impl, mgpu_err_t *err);
    /* Optional (NULL: the backend keeps no copies): see mgpu_k_written. */
    int (*written)(void *impl, const void *p, size_t bytes, mgpu_err_t *err);
    /* Optional, as the fused linear ops: see mgpu_k_linear_loss. */
    int (*linear_loss)(void *impl, const mgpu_k_head_t *h, mgpu_err_t *err);
} mgpu_kernels_ops_t;

/* What a fused op of the table returns when it leaves the work to the launcher's composition
 * (an activation it does not fuse, a shape or precision its library declines). */
#define MGPU_K_DECLINED 1
/* What mgpu_k_linear_loss returns when it left dbias_in unwritten (see there). */
#define MGPU_K_BIAS_LEFT 2

typedef struct mgpu_kernels {
    const mgpu_kernels_ops_t *ops;
    void *impl;
    mgpu_kbackend_t backend;
    mgpu_precision_t precision;
    int device; /* CUDA ordinal, -1 for the CPU */
} mgpu_kernels_t;

/* The CPU backend: single-threaded; its GEMM runs an AVX2 + FMA micro-kernel when the CPU has
 * them (results then differ from the portable kernel's in the last bits) unless the
 * environment says MGPU_CPU_GEMM=portable. */
extern const mgpu_kernels_ops_t mgpu_kernels_cpu_ops;

/* Creates a backend. device is the CUDA ordinal (ignored for the CPU). Asking for CUDA in a
 * build without kernels_cuda.cu fails with MGPU_E_DEVICE saying so. */
int mgpu_kernels_create(mgpu_kbackend_t backend, int device, mgpu_kernels_t **out, mgpu_err_t *err);
void mgpu_kernels_destroy(mgpu_kernels_t *k);
/* 1 when this build has the backend. */
int mgpu_kernels_available(mgpu_kbackend_t backend);
int mgpu_kernels_set_precision(mgpu_kernels_t *k, mgpu_precision_t prec, mgpu_err_t *err);

/* Names used by the cfg and in messages: "identity", "relu", "gelu", "tanh", "sigmoid";
 * "fp32", "tf32", "bf16". Parse functions return the enum value or -1. */
const char *mgpu_act_name(mgpu_act_t act);
int mgpu_act_parse(const char *s);
const char *mgpu_precision_name(mgpu_precision_t p);
int mgpu_precision_parse(const char *s);

/* --- memory ------------------------------------------------------------------------------ */
int mgpu_k_alloc(mgpu_kernels_t *k, size_t bytes, void **out, mgpu_err_t *err);
void mgpu_k_free(mgpu_kernels_t *k, void *p);
int mgpu_k_copy_to_device(mgpu_kernels_t *k, void *dst, const void *host_src, size_t bytes,
                          mgpu_err_t *err);
int mgpu_k_copy_to_host(mgpu_kernels_t *k, void *host_dst, const void *src, size_t bytes,
                        mgpu_err_t *err);
int mgpu_k_copy(mgpu_kernels_t *k, void *dst, const void *src, size_t bytes, mgpu_err_t *err);
int mgpu_k_zero(mgpu_kernels_t *k, void *dst, size_t bytes, mgpu_err_t *err);
int mgpu_k_sync(mgpu_kernels_t *k, mgpu_err_t *err);

/* --- math -------------------------------------------------------------------------------- */
/* C[m,n] = alpha * op(A) op(B) + beta * C, row-major; op(A) is m x k (A is k x m when
 * trans_a), op(B) is k x n (B is n x k when trans_b). beta == 0 never reads C (NaN-safe). */
int mgpu_k_gemm(mgpu_kernels_t *k, int trans_a, int trans_b, int m, int n, int kk, float alpha,
                const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc,
                mgpu_err_t *err);
/* Linear layer epilogue, fused: z[r,c] += bias[c] (bias may be NULL), then y = act(z).
 * y may equal z only for MGPU_ACT_IDENTITY (backward needs the pre-activation z). */
int mgpu_k_bias_act_forward(mgpu_kernels_t *k, mgpu_act_t act, int rows, int cols, float *z,
                            const float *bias, float *y, mgpu_err_t *err);
/* y[i] = act(x[i]); y may equal x. */
int mgpu_k_act_forward(mgpu_kernels_t *k, mgpu_act_t act, size_t n, const float *x, float *y,
                       mgpu_err_t *err);
/* dz[i] = dy[i] * act'(z[i]); y = act(z) as the forward wrote it (relu, tanh and sigmoid use
 * it, gelu uses z). dz may equal dy. */
int mgpu_k_act_backward(mgpu_kernels_t *k, mgpu_act_t act, size_t n, const float *z, const float *y,
                        const float *dy, float *dz, mgpu_err_t *err);
/* out[c] = beta * out[c] + sum over r of x[r,c] (the bias gradient). beta == 0 never reads
 * out. */
int mgpu_k_sum_rows(mgpu_kernels_t *k, int rows, int cols, const float *x, float beta, float *out,
                    mgpu_err_t *err);
/* Softmax cross-entropy over rows of logits[rows, cols] with integer labels in [0, cols):
 * *loss = mean over rows of -log softmax(logits)[label]; dlogits (may be NULL, may equal
 * logits) = (softmax - onehot) / rows, the gradient of that mean. A label out of range is
 * MGPU_E_RANGE (the CPU checks each; the data module checks labels at load time for GPUs). */
int mgpu_k_softmax_xent(mgpu_kernels_t *k, int rows, int cols, const float *logits,
                        const int32_t *labels, float *loss, float *dlogits, mgpu_err_t *err);
/* Mean squared error, nn.MSELoss(reduction="mean"): *loss = mean over all rows*cols elements
 * of (pred - target)^2; dpred (may be NULL) = 2 (pred - target) / (rows*cols). */
int mgpu_k_mse(mgpu_kernels_t *k, int rows, int cols, const float *pred, const float *target,
               float *loss, float *dpred, mgpu_err_t *err);
/* One optimizer update of n parameters in place; step counts from 1 (the first update). */
int mgpu_k_sgd_step(mgpu_kernels_t *k, size_t n, float *p, const float *g, float *momentum_buf,
                    const mgpu_sgd_hparams_t *hp, long long step, mgpu_err_t *err);
int mgpu_k_adamw_step(mgpu_kernels_t *k, size_t n, float *p, const float *g, float *m, float *v,
                      const mgpu_adamw_hparams_t *hp, long long step, mgpu_err_t *err);
/* x[i] *= alpha (gradient scaling, e.g. 1/world_size after a sum all-reduce). */
int mgpu_k_scale(mgpu_kernels_t *k, size_t n, float alpha, float *x, mgpu_err_t *err);
/* *out = sum of x[0..n) (accumulated in double on the CPU). */
int mgpu_k_sum(mgpu_kernels_t *k, size_t n, const float *x, float *out, mgpu_err_t *err);
/* out[r] = the first index of the largest value of row r (as torch.argmax). */
int mgpu_k_argmax_rows(mgpu_kernels_t *k, int rows, int cols, const float *x, int32_t *out,
                       mgpu_err_t *err);
/* *out = number of rows whose argmax equals the label (a float, so it all-reduces with the
 * other metrics). */
int mgpu_k_count_correct(mgpu_kernels_t *k, int rows, int cols, const float *logits,
                         const int32_t *labels, float *out, mgpu_err_t *err);

/* --- fused linear layer (nn.Linear + activation), row-major, W [out, in] as nn.Linear ----- */
/* Bytes of the aux buffer linear_forward may keep for backward (a bit mask of act' > 0): at
 * least this much backend memory per layer, for up to `rows` rows of `out` features. */
size_t mgpu_k_linear_aux_bytes(int rows, int out);
/* z = x[rows, in] . W^T + bias (bias may be NULL), y = act(z). Equals mgpu_k_gemm(0, 1) into
 * z then mgpu_k_bias_act_forward(act, z, bias, y), which is what the launcher runs when the
 * backend has no fused version. y may equal z only for identity. A fused backend may leave z
 * unwritten for relu and identity (their backward reads only y), and may write a mask into aux
 * (NULL: none kept) that linear_backward_data then reads. */
int mgpu_k_linear_forward(mgpu_kernels_t *k, mgpu_act_t act, int rows, int out, int in,
                          const float *x, const float *w, const float *bias, float *z, float *y,
                          void *aux, mgpu_err_t *err);
/* The gradient of the layer's input, through the activation `act` that produced that input:
 * dx[rows, in] = (dz[rows, out] . W) * act'(z_in) (z_in, y_in: the pre-activation and the
 * output of the layer below, aux_in: the aux its linear_forward kept), then dbias[in] = column
 * sums of dx when dbias is not NULL (the layer below's bias gradient). Equals mgpu_k_gemm(0, 0),
 * mgpu_k_act_backward in place (skipped for identity), mgpu_k_sum_rows. */
int mgpu_k_linear_backward_data(mgpu_kernels_t *k, mgpu_act_t act, int rows, int out, int in,
                                const float *dz, const float *w, const float *z_in,
                                const float *y_in, const void *aux_in, float *dx, float *dbias,
                                mgpu_err_t *err);
/* dW[out, in] = dz^T . x[rows, in]; dbias[out] = column sums of dz when dbias is not NULL.
 * Equals mgpu_k_gemm(1, 0) then mgpu_k_sum_rows. */
int mgpu_k_linear_backward_weight(mgpu_kernels_t *k, int rows, int out, int in, const float *dz,
                                  const float *x, float *dw, float *dbias, mgpu_err_t *err);
/* The output layer in a training step: y = x . W^T + bias (no activation), the loss of y
 * (h->loss: mse against targets, or cross-entropy against labels, as mgpu_k_mse and
 * mgpu_k_softmax_xent) into *loss_out and its gradient into dy, then, when dx is not NULL,
 * dx = (dy . W) * act_in'(z_in), and dbias_in = column sums of dx when not NULL. Equals
 * mgpu_k_linear_forward(identity, z = y = h->y), the loss, then
 * mgpu_k_linear_backward_data(act_in, z_in, y_in = x, aux_in, dx, dbias_in), which is what the
 * launcher runs when the backend has no fused version; returns 0 then. The CUDA backend runs
 * it as one kernel for outputs up to 32 wide (a launch-bound classifier's logits), so the step
 * waits on one launch instead of four; that kernel leaves dbias_in to the caller and returns
 * MGPU_K_BIAS_LEFT (mgpu_k_linear_backward_weight of the layer below computes it, on a side
 * stream, off the step's critical path). */
int mgpu_k_linear_loss(mgpu_kernels_t *k, const mgpu_k_head_t *h, mgpu_err_t *err);
/* A backend may run linear_backward_weight concurrently with the ops queued after it (CUDA:
 * small products on a second stream, beside the layer's input-gradient GEMM). Everything
 * queued after mgpu_k_join is ordered after it; call it before dw or dbias is read (the
 * optimizer, an all-reduce) and before dz or x is written again. mgpu_k_sync, the copies and
 * mgpu_k_zero join too. */
int mgpu_k_join(mgpu_kernels_t *k, mgpu_err_t *err);
/* Tells the backend that [p, p + bytes) of its memory was written by something other than
 * its own ops (a kernel of the caller's, a library): a backend that keeps derived copies of
 * operands (CUDA's bf16 copies) drops them. The model calls it for its input batch. */
int mgpu_k_written(mgpu_kernels_t *k, const void *p, size_t bytes, mgpu_err_t *err);

#endif
