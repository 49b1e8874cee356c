/* comm_nccl.cu - the NCCL backend of mgpu_comm_*: joining through the store, collectives on the
 * caller's stream, and the watchdog that turns a hang into an error (see comm_nccl.h).
 *
 * One mutex serialises everything that touches the ncclComm_t: the caller's enqueues and the
 * watchdog's polls and abort. ncclCommAbort frees the communicator, so no call may be inside
 * NCCL with it while the watchdog aborts; enqueues in non-blocking mode do not wait for peers,
 * so holding the mutex across one never stalls the watchdog for long. Waiting for the GPU
 * (barrier, mgpu_nccl_wait) happens outside the mutex. */
#include "comm_nccl.h"

#include <errno.h>   /* ENOMEM */
#include <pthread.h> /* pthread_create, pthread_mutex_t */
#include <sched.h>   /* sched_yield */
#include <stdarg.h>  /* va_list */
#include <stdio.h>   /* snprintf */
#include <stdlib.h>  /* calloc, free */
#include <string.h>  /* strerror, memcpy */
#include <time.h>    /* clock_gettime */
#include <unistd.h>  /* usleep */

#include <cuda_runtime_api.h> /* cudaSetDevice, cudaEvent_t, cudaStreamIsCapturing */
#include <nccl.h>             /* ncclCommInitRankConfig, ncclAllReduce, ncclCommAbort */

#include "status_check.h" /* MGPU_STATUS_CHECK */
extern "C" {
#include "store.h" /* mgpu_store_set, mgpu_store_get, mgpu_store_check */
}

/* NCCL has no function that names a status; ncclGetErrorString describes it. */
static const char *nccl_status_name(ncclResult_t rc)
{
    switch (rc) {
    case ncclSuccess: return "ncclSuccess";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
    case ncclRemoteError: return "ncclRemoteError";
    case ncclInProgress: return "ncclInProgress";
    default: return "ncclResult_t";
    }
}

#define CUDA_CHECK(err, call)                                                                      \
    MGPU_STATUS_CHECK(err, MGPU_E_CUDA, cudaError_t, cudaSuccess, cudaGetErrorString,              \
                      cudaGetErrorName, call)
/* For NCCL calls that must succeed at once (never ncclInProgress). */
#define NCCL_CHECK(err, call)                                                                      \
    MGPU_STATUS_CHECK(err, MGPU_E_NCCL, ncclResult_t, ncclSuccess, ncclGetErrorString,             \
                      nccl_status_name, call)

/* Collectives the watchdog can track at once; an enqueue beyond waits for the oldest. A
 * training step enqueues a few dozen buckets, so this is never the limit in practice. */
#define MGPU_NCCL_RING 1024

typedef struct mgpu_nccl_pending {
    cudaEvent_t ev; /* created on first use of the slot, recorded after the collective */
    double t;       /* CLOCK_MONOTONIC at enqueue */
    uint64_t pseq;  /* the progress page's collectives entered when it was enqueued */
    int coll;       /* 1: a collective (its timeout names the ranks behind), 0: a watch */
    char what[192];
} mgpu_nccl_pending_t;

struct mgpu_nccl {
    pthread_mutex_t mu;
    ncclComm_t comm; /* NULL once aborted or destroyed */
    int rank, world, ordinal;
    double timeout_s;
    cudaStream_t stream; /* the barrier's */
    float *one;          /* the barrier's device float */
    pthread_t thread;
    int thread_started;
    int stop;               /* under mu: the watchdog returns */
    mgpu_err_t fail;        /* under mu: fail.code != 0 once the communicator has failed */
    unsigned long long seq; /* collectives enqueued so far: numbers them in messages */
    mgpu_beacon_t *beacon;  /* may be NULL */
    char label[64];
    size_t head, tail; /* under mu: ring[head % RING] is the oldest pending */
    mgpu_nccl_pending_t ring[MGPU_NCCL_RING];
};

static double mgpu_nccl_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static const char *mgpu_nccl_last(ncclComm_t comm)
{
    const char *s = ncclGetLastError(comm);
    return s != NULL && *s ? s : "no detail from NCCL";
}

/* Under mu. The first failure wins: it is the cause, later ones are its consequences. Aborts
 * the communicator, which also ends NCCL kernels spinning on the GPU for a peer that will
 * never come. Returns the first failure's code and copies its message into err. */
static int mgpu_nccl_fail_locked(mgpu_nccl_t *n, mgpu_err_t *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int mgpu_nccl_fail_locked(mgpu_nccl_t *n, mgpu_err_t *err, int code, const char *fmt, ...)
{
    if (n->fail.code == 0) {
        va_list ap;
        int len;
        va_start(ap, fmt);
        len = vsnprintf(n->fail.msg, sizeof n->fail.msg, fmt, ap);
        va_end(ap);
        n->fail.code = code;
        if (n->comm != NULL) {
            ncclResult_t r = ncclCommAbort(n->comm);
            n->comm = NULL;
            if (len >= 0 && (size_t)len < sizeof n->fail.msg)
                snprintf(n->fail.msg + len, sizeof n->fail.msg - (size_t)len,
                         r == ncclSuccess ? ": aborted the communicator"
                                          : ": aborting the communicator failed too (%s)",
                         ncclGetErrorString(r));
        }
    }
    return mgpu_err_set(err, n->fail.code, "%s", n->fail.msg);
}

static int mgpu_nccl_failed_locked(mgpu_nccl_t *n, mgpu_err_t *err)
{
    return n->fail.code != 0 ? mgpu_err_set(err, n->fail.code, "%s", n->fail.msg) : 0;
}

/* Under mu. The launcher's word that a node of the job is lost (the tail of this rank's
 * progress page): NCCL would wait for the lost ranks until the collective's deadline, inside
 * kernels that spin for ever, so the communicator is aborted now with the launcher's text,
 * which names them. Returns 0, or the failure (into err). One relaxed load while nothing is
 * lost. */
static int mgpu_nccl_lost_locked(mgpu_nccl_t *n, mgpu_err_t *err)
{
    const mgpu_progress_page_t *lost = n->beacon != NULL ? n->beacon->lost : NULL;
    char text[sizeof lost->lost_text];
    const char *what;

    if (n->comm == NULL || mgpu_progress_lost_seq(lost) == 0)
        return 0;
    mgpu_progress_lost(lost, text, sizeof text);
    what = n->head != n->tail ? n->ring[n->head % MGPU_NCCL_RING].what
                              : "the communicator (no collective pending)";
    return mgpu_nccl_fail_locked(n, err, MGPU_E_PEER, "rank %d: %s: %s", n->rank, what, text);
}

/* Under mu: one look at the communicator and the pending collectives, oldest first. */
static void mgpu_nccl_poll_locked(mgpu_nccl_t *n)
{
    ncclResult_t st = ncclSuccess, r;

    if (n->comm == NULL || mgpu_nccl_lost_locked(n, NULL) < 0)
        return;
    r = ncclCommGetAsyncError(n->comm, &st);
    if (r != ncclSuccess) {
        mgpu_nccl_fail_locked(n, NULL, MGPU_E_NCCL, "rank %d: ncclCommGetAsyncError: %s", n->rank,
                              ncclGetErrorString(r));
        return;
    }
    if (st != ncclSuccess && st != ncclInProgress) {
        const char *what =
            n->head != n->tail ? n->ring[n->head % MGPU_NCCL_RING].what : "the communicator";
        mgpu_nccl_fail_locked(n, NULL, MGPU_E_NCCL, "rank %d: %s failed: NCCL reports %s (%s)",
                              n->rank, what, ncclGetErrorString(st), mgpu_nccl_last(n->comm));
        return;
    }
    while (n->head != n->tail) {
        mgpu_nccl_pending_t *p = &n->ring[n->head % MGPU_NCCL_RING];
        cudaError_t q = cudaEventQuery(p->ev);
        double age;
        if (q == cudaSuccess) {
            /* Atomic: the page's coll_done is this thread's, the rest is the caller's. */
            if (n->beacon != NULL)
                mgpu_beacon_coll_done(n->beacon->page, p->pseq);
            n->head++;
            continue;
        }
        if (q != cudaErrorNotReady) {
            mgpu_nccl_fail_locked(n, NULL, MGPU_E_CUDA, "rank %d: %s: cudaEventQuery: %s (%s)",
                                  n->rank, p->what, cudaGetErrorString(q), cudaGetErrorName(q));
            return;
        }
        age = mgpu_nccl_now() - p->t;
        if (age > n->timeout_s) {
            /* The peers' pages say who never came: "ranks 3, 5 never entered all-reduce
             * #4593"; those on other nodes cannot be seen from here. */
            char absent[400] = "";
            if (n->beacon != NULL && p->coll)
                mgpu_beacon_name_absent(n->beacon, p->pseq, n->beacon->npages < n->world, absent,
                                        sizeof absent);
            mgpu_nccl_fail_locked(n, NULL, MGPU_E_TIMEOUT,
                                  "rank %d: %s did not finish in %g s (pending for %.1f s)%s%s",
                                  n->rank, p->what, n->timeout_s, age, absent[0] ? "; " : "",
                                  absent);
        }
        return; /* the rest were enqueued later */
    }
}

static void *mgpu_nccl_watchdog(void *arg)
{
    mgpu_nccl_t *n = (mgpu_nccl_t *)arg;
    /* The runtime's current device is per thread. Relaxed capture mode: a cudaEventQuery here
     * must not invalidate a CUDA graph that the trainer's thread is capturing meanwhile (in
     * the default global mode it would; PyTorch's NCCL watchdog met the same). */
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaError_t ce = cudaSetDevice(n->ordinal);

    if (ce == cudaSuccess)
        ce = cudaThreadExchangeStreamCaptureMode(&mode);
    pthread_mutex_lock(&n->mu);
    if (ce != cudaSuccess)
        mgpu_nccl_fail_locked(n, NULL, MGPU_E_CUDA, "rank %d: watchdog: cudaSetDevice(%d): %s",
                              n->rank, n->ordinal, cudaGetErrorString(ce));
    while (!n->stop && n->comm != NULL) {
        mgpu_nccl_poll_locked(n);
        pthread_mutex_unlock(&n->mu);
        usleep(MGPU_NCCL_POLL_US);
        pthread_mutex_lock(&n->mu);
    }
    pthread_mutex_unlock(&n->mu);
    return NULL;
}

/* Under mu, after an NCCL call that may answer ncclInProgress (non-blocking mode): waits until
 * the communicator has taken it, within the timeout. */
static int mgpu_nccl_settle_locked(mgpu_nccl_t *n, ncclResult_t r, const char *call,
                                   const char *what, int line, mgpu_err_t *err)
{
    double deadline = mgpu_nccl_now() + n->timeout_s;
    int spins = 0;

    while (r == ncclInProgress) {
        ncclResult_t q = ncclCommGetAsyncError(n->comm, &r);
        if (q != ncclSuccess)
            r = q;
        else if (r == ncclInProgress) {
            if (mgpu_nccl_now() > deadline)
                return mgpu_nccl_fail_locked(n, err, MGPU_E_TIMEOUT,
                                             "rank %d: %s: %s was still in progress after %g s",
                                             n->rank, what, call, n->timeout_s);
            /* Usually a matter of microseconds (NCCL connecting lazily takes longer). */
            if (spins++ < 1000)
                sched_yield();
            else
                usleep(100);
        }
    }
    if (r != ncclSuccess)
        return mgpu_nccl_fail_locked(n, err, MGPU_E_NCCL, "%s:%d: rank %d: %s for %s: %s (%s)",
                                     __FILE__, line, n->rank, call, what, ncclGetErrorString(r),
                                     mgpu_nccl_last(n->comm));
    return 0;
}

/* Under mu: records the event after the collective just enqueued on s, for the watchdog. */
static int mgpu_nccl_watch_locked(mgpu_nccl_t *n, cudaStream_t s, const char *what, int coll,
                                  mgpu_err_t *err)
{
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    mgpu_nccl_pending_t *p;
    cudaError_t ce;

    if ((ce = cudaStreamIsCapturing(s, &cs)) != cudaSuccess)
        return mgpu_nccl_fail_locked(n, err, MGPU_E_CUDA, "rank %d: %s: cudaStreamIsCapturing: %s",
                                     n->rank, what, cudaGetErrorString(ce));
    if (cs != cudaStreamCaptureStatusNone)
        return 0; /* in a graph: see comm_nccl.h */
    /* Full: wait for the oldest here (the watchdog would only time it out). */
    while (n->tail - n->head == MGPU_NCCL_RING) {
        mgpu_nccl_poll_locked(n);
        if (n->fail.code != 0)
            return mgpu_nccl_failed_locked(n, err);
        if (n->tail - n->head == MGPU_NCCL_RING) {
            pthread_mutex_unlock(&n->mu);
            usleep(100);
            pthread_mutex_lock(&n->mu);
        }
    }
    p = &n->ring[n->tail % MGPU_NCCL_RING];
    if (p->ev == NULL &&
        (ce = cudaEventCreateWithFlags(&p->ev, cudaEventDisableTiming)) != cudaSuccess)
        return mgpu_nccl_fail_locked(n, err, MGPU_E_CUDA, "rank %d: %s: cudaEventCreate: %s",
                                     n->rank, what, cudaGetErrorString(ce));
    if ((ce = cudaEventRecord(p->ev, s)) != cudaSuccess)
        return mgpu_nccl_fail_locked(n, err, MGPU_E_CUDA, "rank %d: %s: cudaEventRecord: %s",
                                     n->rank, what, cudaGetErrorString(ce));
    p->t = mgpu_nccl_now();
    /* The caller's thread writes coll_entered (mgpu.c entered this collective just before):
     * reading it here, on that thread, needs no lock. */
    p->pseq = n->beacon != NULL && n->beacon->page != NULL ? n->beacon->page->coll_entered : 0;
    p->coll = coll;
    snprintf(p->what, sizeof p->what, "%s", what);
    n->tail++;
    return 0;
}

/* "all-reduce (sum) of 1048576 floats (bucket 3), collective #12 of rank 0 of 2" */
static void mgpu_nccl_describe(mgpu_nccl_t *n, char *what, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void mgpu_nccl_describe(mgpu_nccl_t *n, char *what, size_t len, const char *fmt, ...)
{
    va_list ap;
    int k;
    va_start(ap, fmt);
    k = vsnprintf(what, len, fmt, ap);
    va_end(ap);
    if (k >= 0 && (size_t)k < len)
        snprintf(what + k, len - (size_t)k, "%s%s%s, collective #%llu of rank %d of %d",
                 n->label[0] ? " (" : "", n->label, n->label[0] ? ")" : "", n->seq + 1, n->rank,
                 n->world);
}

typedef enum { MGPU_NCCL_AR, MGPU_NCCL_BC, MGPU_NCCL_AG, MGPU_NCCL_RS } mgpu_nccl_op_t;

typedef struct mgpu_nccl_call {
    mgpu_nccl_op_t op;
    const void *send;
    void *recv;
    size_t count; /* elements of dtype for all-reduce and reduce-scatter, bytes otherwise */
    mgpu_dtype_t dtype;
    mgpu_redop_t redop;
    int root;
    cudaStream_t stream;
} mgpu_nccl_call_t;

/* mgpu.c checked dtype and op before they came here. */
static ncclDataType_t mgpu_nccl_dtype(mgpu_dtype_t dt)
{
    switch (dt) {
    case MGPU_DTYPE_F64:
        return ncclFloat64;
    case MGPU_DTYPE_F16:
        return ncclFloat16;
    case MGPU_DTYPE_BF16:
        return ncclBfloat16;
    case MGPU_DTYPE_I32:
        return ncclInt32;
    case MGPU_DTYPE_I64:
        return ncclInt64;
    default:
        return ncclFloat32;
    }
}

static ncclRedOp_t mgpu_nccl_redop(mgpu_redop_t op)
{
    switch (op) {
    case MGPU_AVG:
        return ncclAvg;
    case MGPU_MAX:
        return ncclMax;
    case MGPU_MIN:
        return ncclMin;
    default:
        return ncclSum;
    }
}

/* "floats" as before for f32 (messages and tests name them so), "bf16 elements" otherwise. */
static const char *mgpu_nccl_elems(mgpu_dtype_t dt)
{
    return dt == MGPU_DTYPE_F32 ? "floats" : dt == MGPU_DTYPE_F64 ? "doubles" : NULL;
}

static int mgpu_nccl_enqueue(mgpu_nccl_t *n, const mgpu_nccl_call_t *c, mgpu_err_t *err)
{
    const char *call;
    char what[192];
    ncclResult_t r;
    int rc, line = 0;

    pthread_mutex_lock(&n->mu);
    /* A collective enqueued after the loss fails at once, before the watchdog's next look. */
    if ((rc = mgpu_nccl_failed_locked(n, err)) < 0 || (rc = mgpu_nccl_lost_locked(n, err)) < 0)
        goto out;
    switch (c->op) {
    case MGPU_NCCL_AR:
        mgpu_nccl_describe(n, what, sizeof what, "all-reduce (%s) of %zu %s%s",
                           mgpu_redop_name(c->redop), c->count,
                           mgpu_nccl_elems(c->dtype) ? "" : mgpu_dtype_name(c->dtype),
                           mgpu_nccl_elems(c->dtype) ? mgpu_nccl_elems(c->dtype) : " elements");
        call = "ncclAllReduce";
        line = __LINE__ + 1;
        r = ncclAllReduce(c->send, c->recv, c->count, mgpu_nccl_dtype(c->dtype),
                          mgpu_nccl_redop(c->redop), n->comm, c->stream);
        break;
    case MGPU_NCCL_RS:
        mgpu_nccl_describe(n, what, sizeof what, "reduce-scatter (%s) of %zu %s elements per rank",
                           mgpu_redop_name(c->redop), c->count, mgpu_dtype_name(c->dtype));
        call = "ncclReduceScatter";
        line = __LINE__ + 1;
        r = ncclReduceScatter(c->send, c->recv, c->count, mgpu_nccl_dtype(c->dtype),
                              mgpu_nccl_redop(c->redop), n->comm, c->stream);
        break;
    case MGPU_NCCL_BC:
        mgpu_nccl_describe(n, what, sizeof what, "broadcast of %zu bytes from rank %d", c->count,
                           c->root);
        call = "ncclBroadcast";
        line = __LINE__ + 1;
        r = ncclBroadcast(c->send, c->recv, c->count, ncclUint8, c->root, n->comm, c->stream);
        break;
    default:
        mgpu_nccl_describe(n, what, sizeof what, "all-gather of %zu bytes per rank", c->count);
        call = "ncclAllGather";
        line = __LINE__ + 1;
        r = ncclAllGather(c->send, c->recv, c->count, ncclUint8, n->comm, c->stream);
        break;
    }
    n->seq++;
    if ((rc = mgpu_nccl_settle_locked(n, r, call, what, line, err)) < 0)
        goto out;
    rc = mgpu_nccl_watch_locked(n, c->stream, what, 1, err);
out:
    pthread_mutex_unlock(&n->mu);
    return rc;
}

void mgpu_nccl_set_label(mgpu_nccl_t *n, const char *label)
{
    pthread_mutex_lock(&n->mu);
    snprintf(n->label, sizeof n->label, "%s", label != NULL ? label : "");
    pthread_mutex_unlock(&n->mu);
}

int mgpu_nccl_allreduce_f32(mgpu_nccl_t *n, float *buf, size_t count, int average, void *stream,
                            mgpu_err_t *err)
{
    mgpu_nccl_call_t c = {
        MGPU_NCCL_AR,        buf, buf, count, MGPU_DTYPE_F32, average ? MGPU_AVG : MGPU_SUM, 0,
        (cudaStream_t)stream};
    return mgpu_nccl_enqueue(n, &c, err);
}

int mgpu_nccl_allreduce(mgpu_nccl_t *n, const void *send, void *recv, size_t count,
                        mgpu_dtype_t dtype, mgpu_redop_t op, void *stream, mgpu_err_t *err)
{
    mgpu_nccl_call_t c = {MGPU_NCCL_AR, send, recv, count, dtype, op, 0, (cudaStream_t)stream};
    return mgpu_nccl_enqueue(n, &c, err);
}

int mgpu_nccl_reduce_scatter(mgpu_nccl_t *n, const void *send, void *recv, size_t recvcount,
                             mgpu_dtype_t dtype, mgpu_redop_t op, void *stream, mgpu_err_t *err)
{
    mgpu_nccl_call_t c = {MGPU_NCCL_RS, send, recv, recvcount, dtype, op, 0, (cudaStream_t)stream};
    return mgpu_nccl_enqueue(n, &c, err);
}

void *mgpu_nccl_comm(mgpu_nccl_t *n)
{
    void *comm;
    pthread_mutex_lock(&n->mu);
    comm = (void *)n->comm;
    pthread_mutex_unlock(&n->mu);
    return comm;
}

void *mgpu_nccl_stream(mgpu_nccl_t *n)
{
    return (void *)n->stream;
}

int mgpu_nccl_broadcast(mgpu_nccl_t *n, void *buf, size_t bytes, int root, void *stream,
                        mgpu_err_t *err)
{
    mgpu_nccl_call_t c = {MGPU_NCCL_BC,   buf,      buf,  bytes,
                          MGPU_DTYPE_F32, MGPU_SUM, root, (cudaStream_t)stream};
    return mgpu_nccl_enqueue(n, &c, err);
}

int mgpu_nccl_allgather(mgpu_nccl_t *n, const void *send, void *recv, size_t bytes, void *stream,
                        mgpu_err_t *err)
{
    mgpu_nccl_call_t c = {MGPU_NCCL_AG,   send,     recv, bytes,
                          MGPU_DTYPE_F32, MGPU_SUM, 0,    (cudaStream_t)stream};
    return mgpu_nccl_enqueue(n, &c, err);
}

int mgpu_nccl_watch(mgpu_nccl_t *n, void *stream, const char *what, mgpu_err_t *err)
{
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    char desc[192];
    int rc;

    /* Checked here, where the watch would otherwise be skipped without a word. */
    if (cudaStreamIsCapturing((cudaStream_t)stream, &cs) == cudaSuccess &&
        cs != cudaStreamCaptureStatusNone)
        return mgpu_err_set(err, MGPU_E_USAGE,
                            "mgpu_comm_watch(\"%s\"): the stream is being captured; call it "
                            "after launching the graph",
                            what != NULL ? what : "");
    pthread_mutex_lock(&n->mu);
    snprintf(desc, sizeof desc, "%s (rank %d of %d)", what != NULL && *what ? what : "work",
             n->rank, n->world);
    if ((rc = mgpu_nccl_failed_locked(n, err)) == 0)
        rc = mgpu_nccl_watch_locked(n, (cudaStream_t)stream, desc, 0, err);
    pthread_mutex_unlock(&n->mu);
    return rc;
}

int mgpu_nccl_status(mgpu_nccl_t *n, mgpu_err_t *err)
{
    int rc;
    pthread_mutex_lock(&n->mu);
    rc = mgpu_nccl_failed_locked(n, err);
    pthread_mutex_unlock(&n->mu);
    return rc;
}

int mgpu_nccl_wait(mgpu_nccl_t *n, void *stream, mgpu_err_t *err)
{
    int spins = 0, rc;

    for (;;) {
        cudaError_t q;
        if ((rc = mgpu_nccl_status(n, err)) < 0)
            return rc;
        q = cudaStreamQuery((cudaStream_t)stream);
        if (q == cudaSuccess)
            return mgpu_nccl_status(n, err); /* it may have finished because it was aborted */
        if (q != cudaErrorNotReady)
            return mgpu_err_set(err, MGPU_E_CUDA, "%s:%d: rank %d: cudaStreamQuery: %s (%s)",
                                __FILE__, __LINE__, n->rank, cudaGetErrorString(q),
                                cudaGetErrorName(q));
        /* A barrier is usually over in microseconds: yield first, then sleep. */
        if (spins++ < 1000)
            sched_yield();
        else
            usleep(100);
    }
}

int mgpu_nccl_barrier(mgpu_nccl_t *n, mgpu_err_t *err)
{
    mgpu_nccl_call_t c = {MGPU_NCCL_AR, n->one, n->one, 1, MGPU_DTYPE_F32, MGPU_SUM, 0, n->stream};
    int rc;

    if ((rc = mgpu_nccl_enqueue(n, &c, err)) < 0)
        return rc;
    return mgpu_nccl_wait(n, n->stream, err);
}

/* On an init timeout, into buf: which ranks never set their joined key (they never reached
 * mgpu_comm_create, or died before). Best effort: the store may be gone too; "" then. */
static void mgpu_nccl_absent(const mgpu_nccl_opts_t *o, char *buf, size_t len)
{
    char list[200];
    size_t used = 0;
    int missing = 0;

    buf[0] = list[0] = '\0';
    if (o->store == NULL)
        return;
    for (int r = 0; r < o->world; r++) {
        char key[256];
        const char *keys[1] = {key};
        int ready = 0;
        snprintf(key, sizeof key, "%s/joined/%d", o->id_key, r);
        if (mgpu_store_check(o->store, keys, 1, &ready, NULL) < 0)
            return;
        if (ready)
            continue;
        if (missing++ < 16 && used < sizeof list)
            used += (size_t)snprintf(list + used, sizeof list - used, "%s%d",
                                     missing > 1 ? ", " : "", r);
    }
    if (missing > 16 && used < sizeof list)
        snprintf(list + used, sizeof list - used, " and %d more", missing - 16);
    if (missing == 0)
        snprintf(buf, len,
                 ": every rank reached mgpu_comm_create, NCCL's own bootstrap is stuck "
                 "(NCCL_DEBUG=INFO shows where; NCCL_SOCKET_IFNAME picks the network)");
    else
        snprintf(buf, len, ": rank%s %s never reached mgpu_comm_create", missing > 1 ? "s" : "",
                 list);
}

/* The unique id: rank 0 draws it and publishes it; the others wait for it. */
static int mgpu_nccl_exchange_id(const mgpu_nccl_opts_t *o, ncclUniqueId *id, double deadline,
                                 mgpu_err_t *err)
{
    char key[256];
    void *v = NULL;
    size_t vl = 0;
    int rc;

    if (o->store != NULL) {
        snprintf(key, sizeof key, "%s/joined/%d", o->id_key, o->rank);
        if ((rc = mgpu_store_set(o->store, key, "1", 1, err)) < 0)
            return rc;
    }
    if (o->rank == 0) {
        NCCL_CHECK(err, ncclGetUniqueId(id));
        return o->store == NULL ? 0 : mgpu_store_set(o->store, o->id_key, id, sizeof *id, err);
    }
    double left = deadline - mgpu_nccl_now();
    if ((rc = mgpu_store_get(o->store, o->id_key, left > 0 ? left : 0, &v, &vl, err)) < 0) {
        if (rc == MGPU_E_TIMEOUT)
            return mgpu_err_set(err, rc,
                                "rank %d: NCCL unique id (store key \"%s\") not published by "
                                "rank 0 within %g s: rank 0 never reached mgpu_comm_create",
                                o->rank, o->id_key, o->timeout_s);
        return rc;
    }
    if (vl != sizeof *id) {
        free(v);
        return mgpu_err_set(err, MGPU_E_PROTOCOL,
                            "rank %d: store key \"%s\" holds %zu bytes, not an ncclUniqueId "
                            "(%zu bytes)",
                            o->rank, o->id_key, vl, sizeof *id);
    }
    memcpy(id, v, sizeof *id);
    free(v);
    return 0;
}

/* ncclCommInitRankConfig in non-blocking mode, polled against the deadline: a rank that never
 * comes would otherwise keep the others inside NCCL's bootstrap for ever. */
static int mgpu_nccl_init_comm(mgpu_nccl_t *n, const mgpu_nccl_opts_t *o, ncclUniqueId id,
                               double deadline, mgpu_err_t *err)
{
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    ncclResult_t r, st = ncclInProgress;
    char absent[256];

    cfg.blocking = 0;
    cfg.commName = o->id_key; /* in NCCL_DEBUG output */
    r = ncclCommInitRankConfig(&n->comm, o->world, id, o->rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        int rc = mgpu_err_set(err, MGPU_E_NCCL,
                              "%s:%d: rank %d: ncclCommInitRankConfig(nranks=%d, rank=%d, device "
                              "%d): %s (%s)",
                              __FILE__, __LINE__, o->rank, o->world, o->rank, o->ordinal,
                              ncclGetErrorString(r), mgpu_nccl_last(n->comm));
        if (n->comm != NULL)
            ncclCommAbort(n->comm);
        n->comm = NULL;
        return rc;
    }
    for (;;) {
        ncclResult_t q = ncclCommGetAsyncError(n->comm, &st);
        if (q != ncclSuccess)
            st = q;
        if (st != ncclInProgress || mgpu_nccl_now() > deadline)
            break;
        usleep(1000);
    }
    if (st == ncclSuccess)
        return 0;
    if (st == ncclInProgress) {
        mgpu_nccl_absent(o, absent, sizeof absent);
        ncclCommAbort(n->comm);
        n->comm = NULL;
        return mgpu_err_set(err, MGPU_E_TIMEOUT,
                            "rank %d: ncclCommInitRank(nranks=%d, device %d) did not finish in %g "
                            "s%s: aborted the communicator",
                            o->rank, o->world, o->ordinal, o->timeout_s, absent);
    }
    int rc = mgpu_err_set(err, MGPU_E_NCCL,
                          "%s:%d: rank %d: ncclCommInitRankConfig(nranks=%d, rank=%d, device %d): "
                          "%s (%s)",
                          __FILE__, __LINE__, o->rank, o->world, o->rank, o->ordinal,
                          ncclGetErrorString(st), mgpu_nccl_last(n->comm));
    ncclCommAbort(n->comm);
    n->comm = NULL;
    return rc;
}

/* Everything mgpu_nccl_open may have made, in reverse; the communicator is already finalized,
 * aborted or NULL. */
static void mgpu_nccl_free(mgpu_nccl_t *n)
{
    for (size_t i = 0; i < MGPU_NCCL_RING; i++)
        if (n->ring[i].ev != NULL)
            cudaEventDestroy(n->ring[i].ev);
    if (n->one != NULL)
        cudaFree(n->one);
    if (n->stream != NULL)
        cudaStreamDestroy(n->stream);
    pthread_mutex_destroy(&n->mu);
    free(n);
}

static int mgpu_nccl_device(mgpu_nccl_t *n, mgpu_err_t *err)
{
    CUDA_CHECK(err, cudaSetDevice(n->ordinal));
    /* Creates the context now, so the timeline's "cuda" mark says what it cost. */
    CUDA_CHECK(err, cudaFree(0));
    CUDA_CHECK(err, cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking));
    CUDA_CHECK(err, cudaMalloc((void **)&n->one, sizeof *n->one));
    CUDA_CHECK(err, cudaMemsetAsync(n->one, 0, sizeof *n->one, n->stream));
    CUDA_CHECK(err, cudaStreamSynchronize(n->stream));
    return 0;
}

int mgpu_nccl_open(const mgpu_nccl_opts_t *o, mgpu_nccl_t **out, mgpu_err_t *err)
{
    double deadline = mgpu_nccl_now() + o->timeout_s;
    ncclUniqueId id;
    mgpu_nccl_t *n;
    int rc;

    *out = NULL;
    if (o->world < 1 || o->rank < 0 || o->rank >= o->world || o->ordinal < 0 || o->timeout_s <= 0)
        return mgpu_err_set(err, MGPU_E_USAGE,
                            "mgpu_nccl_open(rank=%d, world=%d, ordinal=%d, timeout=%g s): out of "
                            "range",
                            o->rank, o->world, o->ordinal, o->timeout_s);
    if (o->world > 1 && (o->store == NULL || o->id_key == NULL))
        return mgpu_err_set(err, MGPU_E_USAGE,
                            "NCCL communicator of %d ranks: the ranks exchange NCCL's unique id "
                            "through mgpu's store (MGPU_STORE_ADDR, set by mgpu-launch), which "
                            "this rank (%d) is not connected to",
                            o->world, o->rank);
    n = (mgpu_nccl_t *)calloc(1, sizeof *n);
    if (n == NULL)
        return mgpu_err_set(err, -ENOMEM, "mgpu_nccl_open: out of memory");
    pthread_mutex_init(&n->mu, NULL);
    n->rank = o->rank;
    n->world = o->world;
    n->ordinal = o->ordinal;
    n->timeout_s = o->timeout_s;
    n->beacon = o->beacon;
    if ((rc = mgpu_nccl_device(n, err)) < 0)
        goto fail;
    if (o->ctx != NULL)
        mgpu_timeline_mark(o->ctx, "cuda");
    if ((rc = mgpu_nccl_exchange_id(o, &id, deadline, err)) < 0 ||
        (rc = mgpu_nccl_init_comm(n, o, id, deadline, err)) < 0)
        goto fail;
    if ((rc = pthread_create(&n->thread, NULL, mgpu_nccl_watchdog, n)) != 0) {
        rc = mgpu_err_set(err, -rc, "pthread_create(NCCL watchdog): %s", strerror(rc));
        ncclCommAbort(n->comm);
        n->comm = NULL;
        goto fail;
    }
    n->thread_started = 1;
    *out = n;
    return 0;
fail:
    mgpu_nccl_free(n);
    return rc;
}

void mgpu_nccl_close(mgpu_nccl_t *n)
{
    ncclComm_t comm;

    if (n == NULL)
        return;
    pthread_mutex_lock(&n->mu);
    n->stop = 1;
    pthread_mutex_unlock(&n->mu);
    if (n->thread_started)
        pthread_join(n->thread, NULL);
    comm = n->comm;
    n->comm = NULL;
    if (comm != NULL) {
        /* Finalize flushes what is still enqueued; a peer that is gone can make it hang, so it
         * gets the communicator's timeout and then the abort. */
        double deadline = mgpu_nccl_now() + n->timeout_s;
        ncclResult_t st = ncclCommFinalize(comm);
        while (st == ncclInProgress && mgpu_nccl_now() < deadline) {
            usleep(1000);
            if (ncclCommGetAsyncError(comm, &st) != ncclSuccess)
                st = ncclInternalError;
        }
        if (st == ncclSuccess)
            ncclCommDestroy(comm);
        else
            ncclCommAbort(comm);
    }
    mgpu_nccl_free(n);
}
