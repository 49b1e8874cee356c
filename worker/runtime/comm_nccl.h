/* comm_nccl.h - the NCCL backend of mgpu_comm_* (comm_nccl.cu), for C and C++ callers; no CUDA
 * or NCCL type appears here (a stream travels as void *, a cudaStream_t).
 *
 * Joining: rank 0 draws the ncclUniqueId and SETs it in the store under id_key (the store
 * client's prefix namespaces it by run id and attempt); the others GET it. Every rank also
 * SETs "<id_key>/joined/<rank>" first, so a rank whose init times out can name the ranks that
 * never came. The device is set (cudaSetDevice(ordinal)) on the calling thread, then
 * ncclCommInitRankConfig in non-blocking mode, polled until it is ready or timeout_s passes.
 *
 * Watchdog: a thread per communicator polls ncclCommGetAsyncError and the oldest collective
 * still pending on the GPU (an event recorded after each enqueued one) every
 * MGPU_NCCL_POLL_US. On an asynchronous error, or a collective older than timeout_s (counted
 * from its enqueueing), it aborts the communicator (ncclCommAbort, which also makes NCCL's
 * spinning kernels return) and keeps the reason; every later call returns that code
 * (MGPU_E_NCCL, MGPU_E_TIMEOUT or MGPU_E_CUDA) with a message naming the operation. The
 * communicator is then only good for mgpu_nccl_close. The watchdog (and each enqueue) also
 * looks at the launcher's word that a node is lost (beacon->lost, progress.h): once it is set
 * the communicator is aborted the same way, and calls fail with MGPU_E_PEER naming the oldest
 * pending collective and carrying the launcher's text. A timeout's message also names the
 * local ranks that never entered the collective, from their progress pages (beacon.h). Collectives
 * enqueued while the stream is being captured into a CUDA graph are not watched (an event query is
 * not allowed on a capturing stream); mgpu_nccl_watch after each launch of the graph puts its
 * replay under the same deadline.
 *
 * Threads: one thread calls the functions of a communicator (as with every mgpu_comm_t); the
 * watchdog is internal. Ownership: mgpu_nccl_open returns a handle that mgpu_nccl_close frees
 * (also after an abort). The store is borrowed during open only. */
#ifndef MGPU_COMM_NCCL_H
#define MGPU_COMM_NCCL_H

#include <stddef.h> /* size_t */

#ifdef __cplusplus
extern "C" {
#endif

/* Inside the linkage block: these are C headers with none of their own. */
#include "error.h"  /* mgpu_err_t */
#include "beacon.h" /* mgpu_beacon_t: the progress page */
#include "mgpu.h"   /* mgpu_ctx_t, mgpu_store_t, mgpu_timeline_mark */

#define MGPU_NCCL_POLL_US 2000 /* the watchdog's period */

typedef struct mgpu_nccl mgpu_nccl_t;

typedef struct mgpu_nccl_opts {
    mgpu_ctx_t *ctx;     /* timeline marks ("cuda" once the device is set); may be NULL */
    mgpu_store_t *store; /* needed when world > 1 */
    const char *id_key;  /* e.g. "mgpu/nccl/0/id" */
    int rank, world;
    int ordinal;      /* CUDA ordinal among the visible devices */
    double timeout_s; /* init and every collective; > 0 */
    /* May be NULL. Its page's last collective entered is the one an enqueue watches; the
     * watchdog advances coll_done as they finish on the GPU, and a timeout names the local
     * ranks whose pages never entered it. Must outlive the communicator. */
    mgpu_beacon_t *beacon;
} mgpu_nccl_opts_t;

int mgpu_nccl_open(const mgpu_nccl_opts_t *o, mgpu_nccl_t **out, mgpu_err_t *err);
/* Finalizes and destroys the communicator (aborts it when that does not finish within its
 * timeout), stops the watchdog, frees everything. NULL is allowed. */
void mgpu_nccl_close(mgpu_nccl_t *n);

/* Labels the collectives enqueued from now on in messages (e.g. "bucket 3"); NULL or "" for
 * none. Copied. */
void mgpu_nccl_set_label(mgpu_nccl_t *n, const char *label);

/* Enqueue on stream (NULL: the legacy default stream) and return; buffers are device memory. */
int mgpu_nccl_allreduce_f32(mgpu_nccl_t *n, float *buf, size_t count, int average, void *stream,
                            mgpu_err_t *err);
/* The general all-reduce (in place when send == recv) and reduce-scatter; mgpu.c checked
 * dtype and op. */
int mgpu_nccl_allreduce(mgpu_nccl_t *n, const void *send, void *recv, size_t count,
                        mgpu_dtype_t dtype, mgpu_redop_t op, void *stream, mgpu_err_t *err);
int mgpu_nccl_reduce_scatter(mgpu_nccl_t *n, const void *send, void *recv, size_t recvcount,
                             mgpu_dtype_t dtype, mgpu_redop_t op, void *stream, mgpu_err_t *err);
int mgpu_nccl_broadcast(mgpu_nccl_t *n, void *buf, size_t bytes, int root, void *stream,
                        mgpu_err_t *err);
int mgpu_nccl_allgather(mgpu_nccl_t *n, const void *send, void *recv, size_t bytes, void *stream,
                        mgpu_err_t *err);
/* Puts the work enqueued on stream so far under the watchdog's deadline, named what, as each
 * collective is: for collectives the watchdog cannot see, those inside a CUDA graph (call it
 * after cudaGraphLaunch). MGPU_E_USAGE while stream is capturing. */
int mgpu_nccl_watch(mgpu_nccl_t *n, void *stream, const char *what, mgpu_err_t *err);
/* A one-float all-reduce on the communicator's own stream, waited for (the watchdog's deadline
 * applies): returns when every rank has called it. */
int mgpu_nccl_barrier(mgpu_nccl_t *n, mgpu_err_t *err);
/* Waits until everything enqueued on stream so far has finished, or the communicator fails:
 * unlike cudaStreamSynchronize, a hung collective surfaces as the watchdog's error. */
int mgpu_nccl_wait(mgpu_nccl_t *n, void *stream, mgpu_err_t *err);
/* The ncclComm_t (NULL once aborted) and the communicator's own cudaStream_t, as void *. */
void *mgpu_nccl_comm(mgpu_nccl_t *n);
void *mgpu_nccl_stream(mgpu_nccl_t *n);
/* 0, or the error that aborted the communicator (its message copied into err). */
int mgpu_nccl_status(mgpu_nccl_t *n, mgpu_err_t *err);

#ifdef __cplusplus
}
#endif

#endif
