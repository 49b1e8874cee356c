/* nccl_bench: all-reduce through mgpu_allreduce_f32 (libmgpu's NCCL backend, with its watchdog
 * bookkeeping) against ncclAllReduce called directly on a communicator of its own, 8 B to
 * 1 GiB (or MGPU_BENCH_MAX bytes), in place, float32 sum, on one stream per path. Prints, per
 * size, the time of one call (mean over the iterations, CUDA events), the algorithm and bus
 * bandwidth as nccl-tests defines them (bus = alg * 2(n-1)/n: 0 at world size 1, where the
 * time is the call's overhead) and a #wrong column: after the timing, each path reduces
 * rank+1 once and every element must equal n(n+1)/2.
 *
 * Every rank runs it, under mgpu-launch (or alone: world size 1):
 *     mgpu-launch --nproc_per_node=N -- build/tests/nccl_bench
 * Exit status: 0, 1 on a failure or a wrong element, 2 in a build without CUDA. */
#include <stdint.h> /* int64_t */
#include <stdio.h>  /* printf */
#include <stdlib.h> /* getenv, strtoull */
#include <string.h> /* strcmp */

#include "mgpu.h"  /* mgpu_init, mgpu_comm_create, mgpu_allreduce_f32 */
#include "store.h" /* mgpu_store_set, mgpu_store_get: the direct communicator's unique id */

#if defined(MGPU_HAVE_CUDA) && MGPU_HAVE_CUDA
#include <cuda_runtime_api.h> /* cudaEvent_t, cudaMalloc */
#include <nccl.h>             /* ncclCommInitRank, ncclAllReduce */

typedef struct bench {
    mgpu_comm_t *comm;
    ncclComm_t nccl;
    cudaStream_t st;
    cudaEvent_t e0, e1;
    float *buf;
    int rank, world;
    mgpu_err_t err;
} bench_t;

static int fail_cuda(const char *call, cudaError_t e)
{
    fprintf(stderr, "nccl_bench: %s: %s\n", call, cudaGetErrorString(e));
    return -1;
}

#define CU(call)                                                                                   \
    do {                                                                                           \
        cudaError_t cu_ = (call);                                                                  \
        if (cu_ != cudaSuccess)                                                                    \
            return fail_cuda(#call, cu_);                                                          \
    } while (0)

#define NC(call)                                                                                   \
    do {                                                                                           \
        ncclResult_t nc_ = (call);                                                                 \
        if (nc_ != ncclSuccess) {                                                                  \
            fprintf(stderr, "nccl_bench: %s: %s\n", #call, ncclGetErrorString(nc_));               \
            return -1;                                                                             \
        }                                                                                          \
    } while (0)

/* One all-reduce of count floats by path 0 (mgpu) or 1 (NCCL directly). */
static int bench_one(bench_t *b, int path, size_t count)
{
    if (path == 0) {
        if (mgpu_allreduce_f32(b->comm, b->buf, count, MGPU_SUM, b->st, &b->err) < 0) {
            fprintf(stderr, "nccl_bench: %s\n", b->err.msg);
            return -1;
        }
        return 0;
    }
    NC(ncclAllReduce(b->buf, b->buf, count, ncclFloat32, ncclSum, b->nccl, b->st));
    return 0;
}

/* Mean seconds per call over iters calls, after warm-up. */
static int bench_time(bench_t *b, int path, size_t count, int iters, double *sec)
{
    float ms = 0;
    for (int i = 0; i < 3; i++)
        if (bench_one(b, path, count) < 0)
            return -1;
    CU(cudaStreamSynchronize(b->st));
    CU(cudaEventRecord(b->e0, b->st));
    for (int i = 0; i < iters; i++)
        if (bench_one(b, path, count) < 0)
            return -1;
    CU(cudaEventRecord(b->e1, b->st));
    if (path == 0 && mgpu_comm_wait(b->comm, b->st, &b->err) < 0) {
        fprintf(stderr, "nccl_bench: %s\n", b->err.msg);
        return -1;
    }
    CU(cudaEventSynchronize(b->e1));
    CU(cudaEventElapsedTime(&ms, b->e0, b->e1));
    *sec = (double)ms * 1e-3 / iters;
    return 0;
}

/* Elements that differ from n(n+1)/2 after one all-reduce of rank+1, or -1. */
static long long bench_check(bench_t *b, int path, size_t count, float *host)
{
    float want = (float)b->world * (float)(b->world + 1) / 2;
    long long wrong = 0;
    for (size_t i = 0; i < count; i++)
        host[i] = (float)(b->rank + 1);
    CU(cudaMemcpyAsync(b->buf, host, count * sizeof *host, cudaMemcpyHostToDevice, b->st));
    if (bench_one(b, path, count) < 0)
        return -1;
    CU(cudaMemcpyAsync(host, b->buf, count * sizeof *host, cudaMemcpyDeviceToHost, b->st));
    CU(cudaStreamSynchronize(b->st));
    for (size_t i = 0; i < count; i++)
        wrong += host[i] != want;
    return wrong;
}

/* The direct communicator: its own unique id, through mgpu's store when there are peers. */
static int bench_direct(bench_t *b, mgpu_ctx_t *ctx)
{
    ncclUniqueId id;
    mgpu_store_t *s = mgpu_ctx_store(ctx);
    void *v = NULL;
    size_t vl = 0;

    if (b->rank == 0) {
        NC(ncclGetUniqueId(&id));
        if (b->world > 1 && mgpu_store_set(s, "bench/nccl_id", &id, sizeof id, &b->err) < 0)
            goto store_fail;
    } else {
        if (mgpu_store_get(s, "bench/nccl_id", 120, &v, &vl, &b->err) < 0)
            goto store_fail;
        if (vl != sizeof id) {
            fprintf(stderr, "nccl_bench: bench/nccl_id holds %zu bytes\n", vl);
            free(v);
            return -1;
        }
        memcpy(&id, v, sizeof id);
        free(v);
    }
    NC(ncclCommInitRank(&b->nccl, b->world, id, b->rank));
    return 0;
store_fail:
    fprintf(stderr, "nccl_bench: %s\n", b->err.msg);
    return -1;
}

static int bench_run(mgpu_ctx_t *ctx, size_t max_bytes)
{
    bench_t b;
    float *host = NULL;
    int rc = -1;

    memset(&b, 0, sizeof b);
    b.rank = mgpu_rank(ctx)->rank;
    b.world = mgpu_rank(ctx)->world_size;
    if (mgpu_comm_create(ctx, MGPU_BACKEND_NCCL, 120, &b.comm, &b.err) < 0) {
        fprintf(stderr, "nccl_bench: %s\n", b.err.msg);
        return -1;
    }
    if (bench_direct(&b, ctx) < 0)
        goto out;
    if (cudaStreamCreateWithFlags(&b.st, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreate(&b.e0) != cudaSuccess || cudaEventCreate(&b.e1) != cudaSuccess ||
        cudaMalloc((void **)&b.buf, max_bytes) != cudaSuccess ||
        (host = malloc(max_bytes)) == NULL) {
        fprintf(stderr, "nccl_bench: allocating %zu bytes on device %d and host failed\n",
                max_bytes, mgpu_device(ctx)->ordinal);
        goto out;
    }
    if (b.rank == 0) {
        printf("# all-reduce, float32 sum, in place, %d rank%s, device %s (%s)\n", b.world,
               b.world > 1 ? "s" : "", mgpu_device(ctx)->name, mgpu_device(ctx)->bus_id);
        printf("# time per call in us (mean); algbw, busbw in GB/s; ratio = mgpu time / nccl "
               "time\n");
        printf("%12s %10s | %10s %8s %8s %6s | %10s %8s %8s %6s | %6s\n", "bytes", "count",
               "mgpu_us", "algbw", "busbw", "#wrong", "nccl_us", "algbw", "busbw", "#wrong",
               "ratio");
    }
    for (size_t bytes = 8; bytes <= max_bytes; bytes *= 2) {
        size_t count = bytes / sizeof(float);
        /* Enough calls that the small sizes measure the per-call cost, not one launch. */
        int iters = bytes <= (1 << 20) ? 200 : bytes <= (64 << 20) ? 50 : 10;
        double t[2], bus = b.world > 1 ? 2.0 * (b.world - 1) / b.world : 0;
        long long wrong[2];
        for (int path = 0; path < 2; path++) {
            if (bench_time(&b, path, count, iters, &t[path]) < 0 ||
                (wrong[path] = bench_check(&b, path, count, host)) < 0)
                goto out;
            if (wrong[path] > 0)
                rc = 1;
        }
        if (b.rank == 0)
            printf("%12zu %10zu | %10.2f %8.2f %8.2f %6lld | %10.2f %8.2f %8.2f %6lld | %6.2f\n",
                   bytes, count, t[0] * 1e6, bytes / t[0] / 1e9, bytes / t[0] / 1e9 * bus, wrong[0],
                   t[1] * 1e6, bytes / t[1] / 1e9, bytes / t[1] / 1e9 * bus, wrong[1], t[0] / t[1]);
        fflush(stdout);
    }
    if (rc < 0)
        rc = 0;
out:
    if (b.nccl != NULL)
        ncclCommDestroy(b.nccl);
    mgpu_comm_destroy(b.comm);
    cudaFree(b.buf);
    free(host);
    return rc;
}
#endif

int main(void)
{
#if defined(MGPU_HAVE_CUDA) && MGPU_HAVE_CUDA
    const char *max_env = getenv("MGPU_BENCH_MAX");
    size_t max_bytes = max_env != NULL ? (size_t)strtoull(max_env, NULL, 0) : (size_t)1 << 30;
    mgpu_err_t err = {0, ""};
    mgpu_ctx_t *ctx = NULL;
    int rc;

    if (max_bytes < 8) {
        fprintf(stderr, "nccl_bench: MGPU_BENCH_MAX=%s: at least 8 bytes\n", max_env);
        return 2;
    }
    if (mgpu_init(NULL, &ctx, &err) < 0) {
        fprintf(stderr, "nccl_bench: %s\n", err.msg);
        return 1;
    }
    rc = bench_run(ctx, max_bytes);
    mgpu_finalize(ctx);
    return rc == 0 ? 0 : 1;
#else
    fprintf(stderr, "nccl_bench: built without CUDA (CUDA=0 or no nvcc): nothing to measure\n");
    return 2;
#endif
}
