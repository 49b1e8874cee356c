/* kernels_cuda.h - the CUDA backend of kernels.h (kernels_cuda.cu), for C and C++ callers. No
 * CUDA header is included here: a stream travels as void * (a cudaStream_t).
 *
 * kernels.c includes this header when it exists in a CUDA build, which links the backend in.
 * Everything else goes through kernels.h; the two functions below are for code that must meet
 * the backend's stream (NCCL, CUDA graphs, benchmarks' event timing) and for tests that must
 * know whether a GPU is there before they try one. */
#ifndef MGPU_KERNELS_CUDA_H
#define MGPU_KERNELS_CUDA_H

#ifdef __cplusplus
extern "C" {
#endif

/* Inside the linkage block: kernels.h and error.h are C headers with none of their own. */
#include "kernels.h" /* mgpu_kernels_ops_t, mgpu_kernels_t */

extern const mgpu_kernels_ops_t mgpu_kernels_cuda_ops;

/* Number of CUDA devices this process sees; 0 when the driver or the device is missing (the
 * runtime's reason goes into err when err is not NULL). Initialises the CUDA runtime: a
 * program that forks must call it in the child, not before the fork. */
int mgpu_kernels_cuda_device_count(mgpu_err_t *err);

/* Opens cuBLAS and cuBLASLt (dlopen, once per process; creating a CUDA backend does it):
 * 0, or MGPU_E_DEVICE naming the library or symbol that is missing. Needs no GPU. */
int mgpu_kernels_cuda_blas_load(mgpu_err_t *err);

/* The cudaStream_t every op of k runs on, in order; NULL when k is not a CUDA backend. Work
 * queued on it by others (an all-reduce, an event record) is ordered with k's ops. */
void *mgpu_kernels_cuda_stream(const mgpu_kernels_t *k);

/* dst (cols x rows, leading dimension rows) = src (rows x cols, leading dimension lds)
 * transposed, queued on k's stream: the copy a tf32 product with A transposed makes first
 * (exposed for its test and benchmark). MGPU_E_USAGE when k is not a CUDA backend. */
int mgpu_kernels_cuda_transpose(mgpu_kernels_t *k, int rows, int cols, const float *src, int lds,
                                float *dst, mgpu_err_t *err);

/* How many products small_gemm.cu has run on k (0 for another backend): the tests' way to
 * know that a shape took that path. */
long long mgpu_kernels_cuda_small_gemms(const mgpu_kernels_t *k);

/* small_gemm.cu's rule, which needs no GPU: the K split it would use for op (0 forward, 1
 * input gradient, 2 weight gradient) of m x n outputs over k, with operands a (leading
 * dimension lda) and b (ldb) on a device of sms multiprocessors, forced: MGPU_SG_SPLIT's value
 * (0: none); 0 when it declines. */
int mgpu_kernels_cuda_small_gemm_split(int op, int m, int n, int k, const void *a, int lda,
                                       const void *b, int ldb, int sms, int forced);

#ifdef __cplusplus
}
#endif

#endif
