/* kernels_cuda.cu - the CUDA backend of kernels.h: its state (create, destroy), memory and
 * copies, and the op table that wires the families' functions (kernels/README.md). */
#include "cuda_impl.h"    /* cuda_impl, the device helpers, the other families' functions */
#include "kernels_cuda.h" /* mgpu_kernels_cuda_ops */
#include "cuda_check.h"   /* CUDA_CHECK, CUDA_CHECK_LAUNCH, CUBLAS_CHECK */

#include <errno.h>  /* ENOMEM */
#include <stdlib.h> /* calloc, free */

namespace mgpu_cuda
{
namespace
{

int impl_init(cuda_impl *c, mgpu_err_t *err)
{
    /* The calling thread's current device becomes c->device; ops launch on the current
     * device, so a thread that drives backends of several devices sets it between them. */
    CUDA_CHECK(err, cudaSetDevice(c->device));
    CUDA_CHECK(err, cudaDeviceGetAttribute(&c->sms, cudaDevAttrMultiProcessorCount, c->device));
    CUDA_CHECK(err, cudaDeviceGetAttribute(&c->l2_bytes, cudaDevAttrL2CacheSize, c->device));
    int major = 0, minor = 0;
    CUDA_CHECK(err, cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c->device));
    CUDA_CHECK(err, cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, c->device));
    c->cc = major * 10 + minor;
    /* Non-blocking: no implicit ordering with the legacy default stream that other code in
     * the process (a data loader's cudaMemcpy) may use. */
    CUDA_CHECK(err, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    CUBLAS_CHECK(err, B.p_cublasCreate(&c->blas));
    CUBLAS_CHECK(err, B.p_cublasSetStream(c->blas, c->stream));
    CUBLAS_CHECK(err, B.p_cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH));
    CUDA_CHECK(err, cudaMalloc(&c->blas_ws, kBlasWorkspace));
    CUBLAS_CHECK(err, B.p_cublasSetWorkspace(c->blas, c->blas_ws, kBlasWorkspace));
    CUDA_CHECK(err, cudaMalloc((void **)&c->scratch, kScratchFloats * sizeof(float)));
    CUDA_CHECK(
        err, cudaMalloc((void **)&c->head_part, (size_t)c->sms * kHeadBlocksPerSm * sizeof(float)));
    /* The last word is block_result's counter. */
    CUDA_CHECK(err, cudaMemset(c->scratch, 0, kScratchFloats * sizeof(float)));
    CUBLAS_CHECK(err, B.p_cublasLtCreate(&c->lt));
    for (cuda_impl::side_stream &sd : c->side) {
        CUDA_CHECK(err, cudaStreamCreateWithFlags(&sd.s, cudaStreamNonBlocking));
        CUDA_CHECK(err, cudaEventCreateWithFlags(&sd.done, cudaEventDisableTiming));
        CUDA_CHECK(err, cudaMalloc((void **)&sd.nw_part, kNarrowPartFloats * sizeof(float)));
        CUDA_CHECK(err, cudaMalloc((void **)&sd.nw_count, kNarrowCounters * sizeof(unsigned)));
        CUDA_CHECK(err, cudaMemset(sd.nw_count, 0, kNarrowCounters * sizeof(unsigned)));
    }
    CUDA_CHECK(err, cudaEventCreateWithFlags(&c->ev_fork, cudaEventDisableTiming));
    CUDA_CHECK(err, cudaEventCreateWithFlags(&c->ev_wg, cudaEventDisableTiming));
    CUDA_CHECK(err, cudaMalloc((void **)&c->sg_part, kSgPartFloats * sizeof(float)));
    CUDA_CHECK(err, cudaMalloc((void **)&c->sg_count, kSgCounters * sizeof(unsigned)));
    CUDA_CHECK(err, cudaMemset(c->sg_count, 0, kSgCounters * sizeof(unsigned)));
    CUDA_CHECK(err, cudaMalloc((void **)&c->adam, sizeof(AdamState)));
    CUDA_CHECK(err, cudaMemset(c->adam, 0, sizeof(AdamState)));
    CUDA_CHECK(err, cudaEventCreate(&c->ev_t0));
    CUDA_CHECK(err, cudaEventCreate(&c->ev_t1));
    /* A device that cannot give the kernel its shared memory runs cuBLAS's products. */
    if (!c->opt.sg_off && mgpu_sg::prepare() != cudaSuccess) {
        (void)cudaGetLastError();
        c->opt.sg_off = true;
    }
    c->prec = MGPU_PREC_FP32;
    return 0;
}

} /* namespace */

void cuda_impl_destroy(void *impl)
{
    cuda_impl *c = (cuda_impl *)impl;
    if (c == NULL)
        return;
    /* Errors here have nowhere to go: destroy cannot fail. Work still queued finishes first
     * so that nothing in flight reads freed memory. */
    if (c->stream != NULL)
        (void)cudaStreamSynchronize(c->stream);
    for (cuda_impl::side_stream &sd : c->side) {
        if (sd.s != NULL) {
            (void)cudaStreamSynchronize(sd.s);
            (void)cudaStreamDestroy(sd.s);
        }
        if (sd.done != NULL)
            (void)cudaEventDestroy(sd.done);
        (void)cudaFree(sd.ws);
        (void)cudaFree(sd.nw_part);
        (void)cudaFree(sd.nw_count);
    }
    if (c->att_side != NULL) {
        (void)cudaStreamSynchronize(c->att_side);
        (void)cudaStreamDestroy(c->att_side);
    }
    if (c->att_fork != NULL)
        (void)cudaEventDestroy(c->att_fork);
    if (c->att_join != NULL)
        (void)cudaEventDestroy(c->att_join);
    (void)cudaFree(c->adam);
    (void)cudaFree(c->sg_part);
    (void)cudaFree(c->sg_count);
    cudaEvent_t evs[] = {c->ev_fork, c->ev_wg, c->ev_t0, c->ev_t1};
    for (cudaEvent_t ev : evs)
        if (ev != NULL)
            (void)cudaEventDestroy(ev);
    if (c->blas != NULL)
        (void)B.p_cublasDestroy(c->blas);
    for (int i = 0; i < c->n_shadows; i++)
        (void)cudaFree(c->shadows[i].bf);
    (void)cudaFree(c->mir);
    for (int i = 0; i < c->n_plans; i++)
        lt_plan_release(&c->plans[i]);
    if (c->lt != NULL)
        (void)B.p_cublasLtDestroy(c->lt);
    (void)cudaFree(c->ws);
    (void)cudaFree(c->scratch);
    (void)cudaFree(c->head_part);
    (void)cudaFree(c->blas_ws);
    (void)cudaFree(c->gws);
    if (c->stream != NULL)
        (void)cudaStreamDestroy(c->stream);
    free(c);
}

int cuda_impl_create(int device, void **out, mgpu_err_t *err)
{
    int count = 0, rc;
    cudaError_t crc = cudaGetDeviceCount(&count);
    if (crc != cudaSuccess || count == 0)
        return mgpu_err_set(err, MGPU_E_DEVICE, "kernels(cuda): no CUDA device (%s)",
                            crc != cudaSuccess ? cudaGetErrorString(crc)
                                               : "cudaGetDeviceCount returned 0");
    if (device < 0 || device >= count)
        return mgpu_err_set(err, MGPU_E_DEVICE,
                            "kernels(cuda): device %d, expected 0..%d (this process sees %d)",
                            device, count - 1, count);
    mgpu_kernels_options_t opt;
    if ((rc = mgpu_kernels_options_read(&opt, err)) < 0 || (rc = blas_load(err)) < 0)
        return rc;
    cuda_impl *c = (cuda_impl *)calloc(1, sizeof *c);
    if (c == NULL)
        return mgpu_err_set(err, -ENOMEM, "kernels(cuda): calloc(%zu) failed", sizeof *c);
    c->device = device;
    c->opt = opt;
    if ((rc = impl_init(c, err)) < 0) {
        cuda_impl_destroy(c);
        return rc;
    }
    *out = c;
    return 0;
}

int cuda_set_precision(void *impl, mgpu_precision_t prec, mgpu_err_t *err)
{
    ((cuda_impl *)impl)->prec = prec;
    return 0;
}

int cuda_alloc(void *impl, size_t bytes, void **out, mgpu_err_t *err)
{
    cuda_impl *c = (cuda_impl *)impl;
    /* Never managed memory: oversubscribing it can hang the GPU for every user of it. */
    cudaError_t rc = cudaMalloc(out, bytes ? bytes : 1);
    if (rc != cudaSuccess) {
        size_t free_b = 0, total_b = 0;
        (void)cudaGetLastError(); /* an allocation failure is not sticky; clear it */
        (void)cudaMemGetInfo(&free_b, &total_b);
        *out = NULL;
        return mgpu_err_set(err, rc == cudaErrorMemoryAllocation ? -ENOMEM : MGPU_E_CUDA,
                            "kernels(cuda): cudaMalloc(%zu bytes) on device %d: %s (%zu of %zu "
                            "bytes free)",
                            bytes, c->device, cudaGetErrorString(rc), free_b, total_b);
    }
    return 0;
}

void cuda_free(void *impl, void *p)
{
    /* cudaFree waits for the device, so no queued op still reads p. */
    (void)cudaFree(p);
}

/* Copies are ordered on the stream with the ops. A copy from pageable host memory has taken
 * its source by the time it returns; from pinned memory the source must stay unchanged until
 * the next sync, as for any asynchronous op. */
/* The copies and the fill join the side streams first (cuda_join): a weight gradient still
 * running there is never read before it is written, nor its operands overwritten. */

int cuda_copy_to_device(void *impl, void *dst, const void *src, size_t bytes, mgpu_err_t *err)
{
    int rc = cuda_join(impl, err);
    if (rc < 0)
        return rc;
    invalidate((cuda_impl *)impl, dst, bytes);
    CUDA_CHECK(
        err, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ((cuda_impl *)impl)->stream));
    return 0;
}

int cuda_copy_to_host(void *impl, void *dst, const void *src, size_t bytes, mgpu_err_t *err)
{
    cuda_impl *c = (cuda_impl *)impl;
    int rc = cuda_join(impl, err);
    if (rc < 0)
        return rc;
    /* The caller reads dst right after: this is the one op that waits. */
    CUDA_CHECK(err, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream));
    CUDA_CHECK(err, cudaStreamSynchronize(c->stream));
    return 0;
}

int cuda_copy(void *impl, void *dst, const void *src, size_t bytes, mgpu_err_t *err)
{
    int rc = cuda_join(impl, err);
    if (rc < 0)
        return rc;
    invalidate((cuda_impl *)impl, dst, bytes);
    if (dst == src)
        return 0;
    CUDA_CHECK(err, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
                                    ((cuda_impl *)impl)->stream));
    return 0;
}

int cuda_zero(void *impl, void *dst, size_t bytes, mgpu_err_t *err)
{
    int rc = cuda_join(impl, err);
    if (rc < 0)
        return rc;
    invalidate((cuda_impl *)impl, dst, bytes);
    CUDA_CHECK(err, cudaMemsetAsync(dst, 0, bytes, ((cuda_impl *)impl)->stream));
    return 0;
}

int cuda_sync(void *impl, mgpu_err_t *err)
{
    /* Also where a fault of an earlier kernel (an illegal address) surfaces. */
    cuda_impl *c = (cuda_impl *)impl;
    int rc = cuda_join(impl, err);
    if (rc < 0)
        return rc;
    CUDA_CHECK(err, cudaStreamSynchronize(c->stream));
    for (const cuda_impl::side_stream &sd : c->side)
        CUDA_CHECK(err, cudaStreamSynchronize(sd.s));
    return 0;
}

} /* namespace mgpu_cuda */

using namespace mgpu_cuda;

extern "C" int mgpu_kernels_cuda_device_count(mgpu_err_t *err)
{
    int n = 0;
    cudaError_t rc = cudaGetDeviceCount(&n);
    if (rc != cudaSuccess) {
        mgpu_err_set(err, MGPU_E_DEVICE, "cudaGetDeviceCount: %s (%s)", cudaGetErrorString(rc),
                     cudaGetErrorName(rc));
        return 0;
    }
    return n;
}

extern "C" int mgpu_kernels_cuda_transpose(mgpu_kernels_t *k, int rows, int cols, const float *src,
                                           int lds, float *dst, mgpu_err_t *err)
{
    if (k == NULL || k->backend != MGPU_KBACKEND_CUDA || k->impl == NULL)
        return mgpu_err_set(err, MGPU_E_USAGE, "transpose: not a CUDA backend");
    if (rows < 0 || cols < 0 || lds < cols)
        return mgpu_err_set(err, MGPU_E_RANGE, "transpose: %d x %d with ld %d, expected ld >= cols",
                            rows, cols, lds);
    if (rows == 0 || cols == 0)
        return 0;
    invalidate((cuda_impl *)k->impl, dst, sizeof(float) * (size_t)rows * cols);
    return transpose((cuda_impl *)k->impl, rows, cols, src, lds, dst, err);
}

extern "C" void *mgpu_kernels_cuda_stream(const mgpu_kernels_t *k)
{
    if (k == NULL || k->backend != MGPU_KBACKEND_CUDA || k->impl == NULL)
        return NULL;
    return (void *)((const cuda_impl *)k->impl)->stream;
}

extern "C" int mgpu_kernels_cuda_graph_memsets_replaced(const mgpu_kernels_t *k)
{
    if (k == NULL || k->backend != MGPU_KBACKEND_CUDA || k->impl == NULL)
        return 0;
    return ((const cuda_impl *)k->impl)->gws_replaced;
}

/* Positional, in the order of mgpu_kernels_ops_t (C++17 has no designated initialisers). */
extern "C" const mgpu_kernels_ops_t mgpu_kernels_cuda_ops = {
    "cuda",
    cuda_impl_create,
    cuda_impl_destroy,
    cuda_set_precision,
    cuda_alloc,
    cuda_free,
    cuda_copy_to_device,
    cuda_copy_to_host,
    cuda_copy,
    cuda_zero,
    cuda_sync,
    cuda_gemm,
    cuda_bias_act_forward,
    cuda_act_forward,
    cuda_act_backward,
    cuda_sum_rows,
    cuda_softmax_xent,
    cuda_mse,
    cuda_sgd_step,
    cuda_adamw_step,
    cuda_scale,
    cuda_sum,
    cuda_argmax_rows,
    cuda_count_correct,
    cuda_linear_forward,
    cuda_linear_backward_data,
    cuda_linear_backward_weight,
    cuda_join,
    cuda_written,
    cuda_linear_loss,
};

extern "C" long long mgpu_kernels_cuda_small_gemms(const mgpu_kernels_t *k)
{
    if (k == NULL || k->backend != MGPU_KBACKEND_CUDA || k->impl == NULL)
        return 0;
    return ((const cuda_impl *)k->impl)->sg_launches;
}

extern "C" long long mgpu_kernels_cuda_beside_products(const mgpu_kernels_t *k)
{
    if (k == NULL || k->backend != MGPU_KBACKEND_CUDA || k->impl == NULL)
        return 0;
    return ((const cuda_impl *)k->impl)->beside_products;
}

extern "C" int mgpu_kernels_cuda_small_gemm_split(int op, int m, int n, int k, const void *a,
                                                  int lda, const void *b, int ldb, int sms,
                                                  int forced)
{
    if (op < mgpu_sg::kForward || op > mgpu_sg::kWeightGrad)
        return 0;
    mgpu_sg::Args g{};
    g.M = m, g.N = n, g.K = k, g.a = (const float *)a, g.lda = lda, g.b = (const float *)b;
    g.ldb = ldb;
    return mgpu_sg::split_for((mgpu_sg::Op)op, g, sms, forced);
}
