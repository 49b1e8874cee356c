/* cuda_check.h - CUDA_CHECK, CUDA_CHECK_LAUNCH and CUBLAS_CHECK for CUDA sources (.cu) of
 * libmgpu: on failure they fill the caller's mgpu_err_t with file:line, the call as written
 * and the library's own name and text for the status, then return the negative code from the
 * enclosing function (which must return int). No exit, no abort: only main decides that.
 *
 * Each takes the mgpu_err_t pointer explicitly, so a reader sees where the message goes. */
#ifndef MGPU_CUDA_CHECK_H
#define MGPU_CUDA_CHECK_H

#include <cublas_v2.h>        /* cublasStatus_t */
#include <cuda_runtime_api.h> /* cudaError_t, cudaGetErrorName/String, cudaGetLastError */

#include "status_check.h" /* MGPU_STATUS_CHECK, mgpu_err_set */

#define CUDA_CHECK(err, call)                                                                      \
    MGPU_STATUS_CHECK(err, MGPU_E_CUDA, cudaError_t, cudaSuccess, cudaGetErrorString,              \
                      cudaGetErrorName, call)

/* After a <<<...>>> launch: a bad configuration is reported here, at the launch, rather than
 * by whatever call next touches the stream. what names the kernel and its sizes. */
#define CUDA_CHECK_LAUNCH(err, what, ...)                                                          \
    do {                                                                                           \
        cudaError_t cc_rc_ = cudaGetLastError();                                                   \
        if (cc_rc_ != cudaSuccess)                                                                 \
            return mgpu_err_set((err), MGPU_E_CUDA, "%s:%d: launch of " what ": %s (%s)",          \
                                __FILE__, __LINE__, ##__VA_ARGS__, cudaGetErrorString(cc_rc_),     \
                                cudaGetErrorName(cc_rc_));                                         \
    } while (0)

/* cuBLAS's own words for a status (cublas.cu: cuBLAS is opened at run time). */
const char *mgpu_cublas_status_string(cublasStatus_t rc);
const char *mgpu_cublas_status_name(cublasStatus_t rc);

#define CUBLAS_CHECK(err, call)                                                                    \
    MGPU_STATUS_CHECK(err, MGPU_E_CUBLAS, cublasStatus_t, CUBLAS_STATUS_SUCCESS,                   \
                      mgpu_cublas_status_string, mgpu_cublas_status_name, call)

#endif
