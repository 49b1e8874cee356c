/* streams.cu - the side streams: fork and join, the weight gradients that run beside the main
 * stream, and small_gemm.cu's queued group of them. */
#include "cuda_impl.h"  /* cuda_impl, the device helpers, the other families' functions */
#include "cuda_check.h" /* CUDA_CHECK, CUDA_CHECK_LAUNCH, CUBLAS_CHECK */

namespace mgpu_cuda
{
namespace
{

/* Launches the queued weight gradients (cuda_impl::wg) as one group on the next side stream. */
int wg_flush(cuda_impl *c, mgpu_err_t *err)
{
    if (c->wg.n == 0)
        return 0;
    mgpu_sg::Group g = c->wg;
    c->wg.n = 0;
    const int split = mgpu_sg::group_split(g, c->sms, c->opt.sg_split);
    const int i = c->side_next;
    c->side_next = (i + 1) % (int)(sizeof c->side / sizeof c->side[0]);
    CUDA_CHECK(err, cudaStreamWaitEvent(c->side[i].s, c->ev_wg, 0));
    cudaError_t ce =
        split > 0 ? mgpu_sg::group_launch(g, split, c->side[i].s) : cudaErrorInvalidConfiguration;
    /* Joined even when it failed: a side stream that joined a capture must leave it. */
    CUDA_CHECK(err, cudaEventRecord(c->side[i].done, c->side[i].s));
    c->side[i].pending = true;
    if (ce != cudaSuccess)
        return mgpu_err_set(err, MGPU_E_CUDA,
                            "small_gemm weight gradients (%d layers, K %d, split %d): %s", g.n, g.K,
                            split, cudaGetErrorString(ce));
    c->sg_launches++;
    return 0;
}

/* Queues a weight gradient for small_gemm.cu's group launch (MGPU_K_DECLINED: not for it, where
 * the op is off, the job does not fit, or alone it would need a second wave of blocks). */
int wg_queue(cuda_impl *c, const mgpu_sg::Job &j, int K, mgpu_err_t *err)
{
    const int ops = c->prec == MGPU_PREC_FP32   ? c->opt.sg_ops_fp32
                    : c->prec == MGPU_PREC_TF32 ? c->opt.sg_ops_tf32
                                                : 0;
    if (c->opt.sg_off || !(ops & (1 << (int)mgpu_sg::kWeightGrad)) || !mgpu_sg::job_fits(j, K))
        return MGPU_K_DECLINED;
    for (int pass = 0; pass < 2; pass++) {
        mgpu_sg::Group g = c->wg;
        if (g.n == mgpu_sg::kWgMaxJobs || (g.n > 0 && g.K != K))
            g.n = -1; /* full, or another K: launch those first */
        else {
            g.K = K;
            g.job[g.n++] = j;
        }
        if (g.n > 0 && mgpu_sg::group_split(g, c->sms, c->opt.sg_split) > 0) {
            c->wg = g;
            CUDA_CHECK(err, cudaEventRecord(c->ev_wg, c->stream));
            invalidate(c, j.c, sizeof(float) * (size_t)j.M * j.ldc);
            return 0;
        }
        if (c->wg.n == 0)
            return MGPU_K_DECLINED; /* alone it needs more than a wave */
        int rc = wg_flush(c, err);
        if (rc < 0)
            return rc;
    }
    return MGPU_K_DECLINED;
}

} /* namespace */

/* Takes the next side stream (cuda_impl::side) and makes it wait for ev_fork: the main stream
 * as it was when the caller recorded it. */
int side_fork(cuda_impl *c, int *i, mgpu_err_t *err)
{
    *i = c->side_next;
    c->side_next = (*i + 1) % (int)(sizeof c->side / sizeof c->side[0]);
    CUDA_CHECK(err, cudaStreamWaitEvent(c->side[*i].s, c->ev_fork, 0));
    return 0;
}

/* What side stream i was given is for cuda_join to wait for (also after a failed launch: a
 * side stream that joined a capture must leave it). */
int side_queued(cuda_impl *c, int i, mgpu_err_t *err)
{
    CUDA_CHECK(err, cudaEventRecord(c->side[i].done, c->side[i].s));
    c->side[i].pending = true;
    return 0;
}

int cuda_linear_backward_weight(void *impl, int rows, int out, int in, const float *dz,
                                const float *x, float *dw, float *dbias, mgpu_err_t *err)
{
    cuda_impl *c = (cuda_impl *)impl;
    /* Large tf32 products keep cuda_gemm's transposed copy of dz (see there). */
    double flops = 2.0 * rows * out * in;
    const bool narrow = narrow_dw(c, rows, out, in);
    if (!narrow && flops <= kSideMaxFlops) {
        int rc = wg_queue(c, mgpu_sg::Job{out, in, dz, out, x, in, dw, in, dbias}, rows, err);
        if (rc != MGPU_K_DECLINED)
            return rc;
    }
    if (!narrow &&
        (!(c->opt.lt_epi & 4) || (c->prec == MGPU_PREC_TF32 && flops > 2.0 * (1u << 27))))
        return MGPU_K_DECLINED;
    cublasLtEpilogue_t epi =
        dbias != nullptr ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_DEFAULT;
    /* bf16 converts its operands on c->stream: no fork there. */
    if (!narrow && (c->prec == MGPU_PREC_BF16 || flops > kSideMaxFlops))
        return lt_matmul(c, c->stream, c->blas_ws, CUBLAS_OP_N, CUBLAS_OP_T, in, out, rows, x, in,
                         dz, out, dw, in, epi, dbias, nullptr, 0, kReuse, kFresh, err);
    /* The side stream's previous GEMM was joined (cuda_join) or is ordered before this fork
     * by its own stream; the join after this layer's input gradient waits for this one. */
    CUDA_CHECK(err, cudaEventRecord(c->ev_fork, c->stream));
    int i, j, rc;
    if ((rc = side_fork(c, &i, err)) < 0)
        return rc;
    /* cuBLASLt's bias gradient (BGRADB) is a kernel of its own after the product's (2 us at
     * the launch-bound MLP's sizes, the last of the step's chain): the column sums of dz run on the
     * next side stream instead, beside the product, in one pass (no partials); only once the
     * product is queued (a declined one leaves both to the launcher's composition). */
    const bool side_bias = !narrow && dbias != nullptr && rows <= kSideBiasRows;
    if (side_bias)
        epi = CUBLASLT_EPILOGUE_DEFAULT;
    rc = narrow ? launch_narrow_dw(c, i, rows, out, in, dz, x, dw, dbias, err)
                : lt_matmul(c, c->side[i].s, c->side[i].ws, CUBLAS_OP_N, CUBLAS_OP_T, in, out, rows,
                            x, in, dz, out, dw, in, epi, side_bias ? nullptr : dbias, nullptr, 0,
                            kReuse, kFresh, err);
    const int qc = side_queued(c, i, err); /* even when declined */
    if (qc < 0)
        return qc;
    if (rc != 0 || !side_bias)
        return rc;
    if ((rc = side_fork(c, &j, err)) < 0)
        return rc;
    cudaError_t le = sum_rows_on(c->side[j].s, rows, out, dz, dbias);
    if ((rc = side_queued(c, j, err)) < 0)
        return rc;
    if (le != cudaSuccess)
        return mgpu_err_set(err, MGPU_E_CUDA, "launch of sum_rows_kernel (%d x %d): %s", rows, out,
                            cudaGetErrorString(le));
    return 0;
}

/* Memory written outside this backend's ops (the training step's gather into the batch):
 * copies of it are stale. */
int cuda_written(void *impl, const void *p, size_t bytes, mgpu_err_t *err)
{
    invalidate((cuda_impl *)impl, p, bytes);
    return 0;
}

/* The main stream waits for the side stream's work (a no-op when none is pending). */
int cuda_join(void *impl, mgpu_err_t *err)
{
    cuda_impl *c = (cuda_impl *)impl;
    int rc = wg_flush(c, err);
    if (rc < 0)
        return rc;
    for (cuda_impl::side_stream &sd : c->side)
        if (sd.pending) {
            CUDA_CHECK(err, cudaStreamWaitEvent(c->stream, sd.done, 0));
            sd.pending = false;
        }
    c->side_next = 0;
    return 0;
}

} /* namespace mgpu_cuda */
