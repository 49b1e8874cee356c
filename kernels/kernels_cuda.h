/* kernels_cuda.h - the CUDA backend of kernels.h (kernels_cuda.cu), for C and C++ callers. No
 * CUDA header is included here: a stream travels as void * (a cudaStream_t).
 *
 * kernels.c includes this header when it exists in a CUDA build, which links the backend in.
 * Everything else goes through kernels.h; the functions below are for code that must meet
 * the backend's stream (NCCL, CUDA graphs, benchmarks' event timing), for the GPU step's
 * schedule (mgpu_kernels_cuda_sched_t) and for tests that must know whether a GPU is there
 * before they try one. */
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

/* The memsets of products' own workspaces that the last graph capture on k replaced by one
 * (cuda_impl::gws): 0 before any capture, with MGPU_GRAPH_SLICES=0, when cuBLASLt queued
 * none, or for another backend. */
int mgpu_kernels_cuda_graph_memsets_replaced(const mgpu_kernels_t *k);

/* dst (cols x rows, leading dimension rows) = src (rows x cols, leading dimension lds)
 * transposed, queued on k's stream: the copy a tf32 product with A transposed makes first
 * (exposed for its test and benchmark). MGPU_E_USAGE when k is not a CUDA backend. */
int mgpu_kernels_cuda_transpose(mgpu_kernels_t *k, int rows, int cols, const float *src, int lds,
                                float *dst, mgpu_err_t *err);

/* How many products small_gemm.cu has run on k (0 for another backend): the tests' way to
 * know that a shape took that path. */
long long mgpu_kernels_cuda_small_gemms(const mgpu_kernels_t *k);

/* How many bf16 GPT weight gradients k has queued beside its stream (gpt_ops.h:
 * linear_back_weight_beside; 0 for another backend): the tests' way to know that they did. */
long long mgpu_kernels_cuda_beside_products(const mgpu_kernels_t *k);

/* small_gemm.cu's rule, which needs no GPU: the K split it would use for op (0 forward, 1
 * input gradient, 2 weight gradient) of m x n outputs over k, with operands a (leading
 * dimension lda) and b (ldb) on a device of sms multiprocessors, forced: MGPU_SG_SPLIT's value
 * (0: none); 0 when it declines. */
int mgpu_kernels_cuda_small_gemm_split(int op, int m, int n, int k, const void *a, int lda,
                                       const void *b, int ldb, int sms, int forced);

/* --- the GPU step's schedule (schedule.cu) ------------------------------------------------
 * The CUDA mechanics of a training step's schedule around the backend's stream (the main
 * stream): a stream for the gradient buckets' all-reduces, forked off the main stream by an
 * event per bucket and joined back by one event; the capture of a step in a CUDA graph, its
 * replay and its release; two timing events. The caller decides what a step is and when each
 * of these runs (the trainer's gpustep.cu); each function queues exactly the CUDA calls it
 * names, on the streams it names, so the caller's order is the device's.
 *
 * Ownership: the schedule borrows k (destroy it before k); one thread uses it at a time. */
typedef struct mgpu_kernels_cuda_sched mgpu_kernels_cuda_sched_t;

/* A schedule on k's stream, with the timing events and, for n_buckets > 0, the all-reduce
 * stream (non-blocking), n_buckets bucket events and the join's event. MGPU_E_USAGE when k is
 * not a CUDA backend. */
int mgpu_kernels_cuda_sched_create(mgpu_kernels_t *k, int n_buckets,
                                   mgpu_kernels_cuda_sched_t **out, mgpu_err_t *err);
/* Waits for the main and all-reduce streams, then frees everything; NULL is a no-op. */
void mgpu_kernels_cuda_sched_destroy(mgpu_kernels_cuda_sched_t *sc);

/* The all-reduce stream (a cudaStream_t; NULL without buckets): where the caller queues each
 * bucket's all-reduce, after mgpu_kernels_cuda_sched_bucket. */
void *mgpu_kernels_cuda_sched_comm_stream(const mgpu_kernels_cuda_sched_t *sc);

/* Forks bucket's all-reduce off the main stream: an event recorded on the main stream (after
 * the work that wrote the bucket's gradients), waited on by the all-reduce stream. */
int mgpu_kernels_cuda_sched_bucket(mgpu_kernels_cuda_sched_t *sc, int bucket, mgpu_err_t *err);

/* Joins the all-reduce stream back: an event recorded on it (after the last bucket's
 * all-reduce), waited on by the main stream (before the update reads the gradients). */
int mgpu_kernels_cuda_sched_comm_join(mgpu_kernels_cuda_sched_t *sc, mgpu_err_t *err);

/* Graph capture of what the caller queues on the main stream (and, through the buckets'
 * events, on the all-reduce stream) between begin and end; thread-local capture mode.
 * end with keep = 0 (the queued work failed): ends the capture, drops what was captured,
 * leaves err as it is and returns 0; keep = 1: keeps the graph for instantiate. */
int mgpu_kernels_cuda_sched_capture_begin(mgpu_kernels_cuda_sched_t *sc, mgpu_err_t *err);
int mgpu_kernels_cuda_sched_capture_end(mgpu_kernels_cuda_sched_t *sc, int keep, mgpu_err_t *err);
int mgpu_kernels_cuda_sched_graph_instantiate(mgpu_kernels_cuda_sched_t *sc, mgpu_err_t *err);
/* Queues one replay of the instantiated graph on the main stream. */
int mgpu_kernels_cuda_sched_graph_launch(mgpu_kernels_cuda_sched_t *sc, mgpu_err_t *err);
/* Waits for the main stream (queued replays), then frees the graph, so that the next step can
 * be captured again; a no-op without a graph. */
int mgpu_kernels_cuda_sched_graph_drop(mgpu_kernels_cuda_sched_t *sc, mgpu_err_t *err);
/* 1 when a graph is instantiated (launch replays it). */
int mgpu_kernels_cuda_sched_graphed(const mgpu_kernels_cuda_sched_t *sc);

/* A timing event recorded on the main stream (start), then another and the milliseconds
 * between them (stop, which waits for the second). */
int mgpu_kernels_cuda_sched_timer_start(mgpu_kernels_cuda_sched_t *sc, mgpu_err_t *err);
int mgpu_kernels_cuda_sched_timer_stop(mgpu_kernels_cuda_sched_t *sc, double *ms, mgpu_err_t *err);

#ifdef __cplusplus
}
#endif

#endif
