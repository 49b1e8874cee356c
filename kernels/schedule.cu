/* schedule.cu - the GPU step's schedule, its CUDA mechanics in one place:
 * - the backend's side streams: fork and join, the weight gradients that run beside the main
 *   stream, and small_gemm.cu's queued group of them (the op table's linear_backward_weight
 *   and join);
 * - the step's all-reduce stream, the buckets' events that fork it off the main stream and the
 *   event that joins it back, the capture of a step in a CUDA graph (begin, end, instantiate,
 *   replay, drop for a re-capture) and the step's timing events (mgpu_kernels_cuda_sched_t,
 *   kernels_cuda.h).
 * What a step is made of, and when to capture it again, is the trainer's
 * (worker/trainer/gpustep.cu); the order of the backward's ops is the model's
 * (worker/trainer/backward_order.h), which reaches this file through the op table's join. */
#include "cuda_impl.h"  /* cuda_impl, the device helpers, the other families' functions */
#include "cuda_check.h" /* CUDA_CHECK, CUDA_CHECK_LAUNCH, CUBLAS_CHECK */

#include <errno.h>  /* ENOMEM */
#include <stdio.h>  /* fprintf */
#include <stdlib.h> /* calloc, free, malloc */

namespace mgpu_cuda
{
namespace
{

/* A graph node's predecessors (dependents false) or successors, into a malloc'd array (NULL
 * when there are none or on an error). */
int graph_edges(cudaGraphNode_t n, bool dependents, cudaGraphNode_t **out, size_t *count,
                mgpu_err_t *err)
{
    *out = nullptr;
    *count = 0;
    if (dependents)
        CUDA_CHECK(err, cudaGraphNodeGetDependentNodes(n, nullptr, nullptr, count));
    else
        CUDA_CHECK(err, cudaGraphNodeGetDependencies(n, nullptr, nullptr, count));
    if (*count == 0)
        return 0;
    *out = (cudaGraphNode_t *)malloc(*count * sizeof **out);
    if (*out == nullptr)
        return mgpu_err_set(err, -ENOMEM, "schedule: malloc of %zu graph edges failed", *count);
    const cudaError_t ce = dependents ? cudaGraphNodeGetDependentNodes(n, *out, nullptr, count)
                                      : cudaGraphNodeGetDependencies(n, *out, nullptr, count);
    if (ce != cudaSuccess) {
        free(*out);
        *out = nullptr;
        return mgpu_err_set(err, MGPU_E_CUDA, "schedule: a graph node's edges: %s",
                            cudaGetErrorString(ce));
    }
    return 0;
}

/* from -> to, unless the graph has that edge already. */
int graph_link(cudaGraph_t g, cudaGraphNode_t from, cudaGraphNode_t to, mgpu_err_t *err)
{
    cudaGraphNode_t *pre;
    size_t n;
    int rc = graph_edges(to, false, &pre, &n, err);
    if (rc < 0)
        return rc;
    bool have = false;
    for (size_t i = 0; i < n && !have; i++)
        have = pre[i] == from;
    free(pre);
    if (!have)
        CUDA_CHECK(err, cudaGraphAddDependencies(g, &from, &to, nullptr, 1));
    return 0;
}

/* Takes memset node m out of g, its predecessors then preceding its successors. */
int graph_bypass(cudaGraph_t g, cudaGraphNode_t m, mgpu_err_t *err)
{
    cudaGraphNode_t *pre = nullptr, *suc = nullptr;
    size_t np = 0, ns = 0;
    int rc = graph_edges(m, false, &pre, &np, err);
    if (rc == 0)
        rc = graph_edges(m, true, &suc, &ns, err);
    if (rc == 0 && cudaGraphDestroyNode(m) != cudaSuccess)
        rc = mgpu_err_set(err, MGPU_E_CUDA, "schedule: cudaGraphDestroyNode of a memset failed");
    for (size_t i = 0; rc == 0 && i < np; i++)
        for (size_t j = 0; rc == 0 && j < ns; j++)
            rc = graph_link(g, pre[i], suc[j], err);
    free(pre);
    free(suc);
    return rc;
}

/* The end of a capture (cuda_impl::gws): every memset of zeros within the products' slices is
 * taken out of g, and one memset of all the slices taken comes before g's first nodes. A
 * slice is its product's alone, so what cuBLASLt zeroed just before the product is still
 * zero when the product runs. */
int gws_hoist(cuda_impl *c, cudaGraph_t g, mgpu_err_t *err)
{
    c->gws_replaced = 0;
    if (c->gws_used == 0)
        return 0;
    size_t n = 0;
    CUDA_CHECK(err, cudaGraphGetNodes(g, nullptr, &n));
    cudaGraphNode_t *nodes = (cudaGraphNode_t *)malloc((n + 1) * sizeof *nodes);
    if (nodes == nullptr)
        return mgpu_err_set(err, -ENOMEM, "schedule: malloc of %zu graph nodes failed", n);
    int rc = 0, hoisted = 0;
    if (cudaGraphGetNodes(g, nodes, &n) != cudaSuccess)
        rc = mgpu_err_set(err, MGPU_E_CUDA, "schedule: cudaGraphGetNodes failed");
    const char *lo = c->gws, *hi = c->gws + c->gws_used;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        cudaGraphNodeType t;
        cudaMemsetParams mp;
        if (cudaGraphNodeGetType(nodes[i], &t) != cudaSuccess || t != cudaGraphNodeTypeMemset ||
            cudaGraphMemsetNodeGetParams(nodes[i], &mp) != cudaSuccess)
            continue;
        const char *d = (const char *)mp.dst;
        const size_t rows = mp.height > 0 ? mp.height : 1;
        const size_t span = (rows - 1) * mp.pitch + mp.width * mp.elementSize;
        if (mp.value != 0 || d < lo || d + span > hi)
            continue;
        if ((rc = graph_bypass(g, nodes[i], err)) == 0)
            hoisted++;
    }
    size_t roots = n;
    if (rc == 0 && hoisted > 0 && cudaGraphGetRootNodes(g, nodes, &roots) != cudaSuccess)
        rc = mgpu_err_set(err, MGPU_E_CUDA, "schedule: cudaGraphGetRootNodes failed");
    if (rc == 0 && hoisted > 0) {
        cudaMemsetParams all = {};
        all.dst = c->gws, all.value = 0, all.elementSize = 1, all.width = c->gws_used;
        all.height = 1;
        cudaGraphNode_t z;
        if (cudaGraphAddMemsetNode(&z, g, nullptr, 0, &all) != cudaSuccess)
            rc = mgpu_err_set(err, MGPU_E_CUDA, "schedule: cudaGraphAddMemsetNode failed");
        for (size_t i = 0; rc == 0 && i < roots; i++)
            if (cudaGraphAddDependencies(g, &z, &nodes[i], nullptr, 1) != cudaSuccess)
                rc = mgpu_err_set(err, MGPU_E_CUDA, "schedule: cudaGraphAddDependencies failed");
    }
    free(nodes);
    c->gws_replaced = hoisted;
    if (rc == 0 && c->opt.lt_verbose)
        fprintf(stderr,
                "kernels(cuda): capture: %d product workspace memsets replaced by one of %zu "
                "bytes\n",
                hoisted, c->gws_used);
    return rc;
}

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

int side_ws(cuda_impl *c, int i, void **ws, mgpu_err_t *err)
{
    if (c->side[i].ws == nullptr)
        for (cuda_impl::side_stream &sd : c->side)
            if (sd.ws == nullptr)
                CUDA_CHECK(err, cudaMalloc(&sd.ws, kBlasWorkspace));
    *ws = c->side[i].ws;
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
    void *ws = nullptr;
    rc = narrow ? launch_narrow_dw(c, i, rows, out, in, dz, x, dw, dbias, err)
                : side_ws(c, i, &ws, err);
    if (!narrow && rc == 0)
        rc = lt_matmul(c, c->side[i].s, ws, CUBLAS_OP_N, CUBLAS_OP_T, in, out, rows, x, in, dz, out,
                       dw, in, epi, side_bias ? nullptr : dbias, nullptr, 0, kReuse, kFresh, err);
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

/* --- the step: all-reduce stream, buckets' events, graph, timer ---------------------------- */

/* Everything here is ordered by events on two streams:
 * - bucket b's all-reduce starts after the backward wrote its gradients and finishes before
 *   the update reads them: an event recorded on the main stream after the layer that completes
 *   the bucket, waited on by the all-reduce stream (mgpu_kernels_cuda_sched_bucket), and one
 *   event recorded on the all-reduce stream after the last bucket, waited on by the main
 *   stream (mgpu_kernels_cuda_sched_comm_join).
 *   The all-reduce stream therefore runs while the main stream computes the lower layers'
 *   backward.
 * - In a capture the same record/wait pairs become the graph's edges: the all-reduce stream
 *   joins the capture through its first wait and is joined back into the main stream, as
 *   the end of a capture requires, by the main stream's wait on the join's event. */
struct mgpu_kernels_cuda_sched {
    mgpu_cuda::cuda_impl *ci; /* the backend (borrowed) */
    cudaStream_t stream;      /* its stream */
    cudaStream_t comm;        /* the all-reduce stream; none without buckets */
    cudaEvent_t *bucket_ev;
    int n_buckets;
    cudaEvent_t comm_done;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    cudaEvent_t t0, t1;
};

static int sched_init(mgpu_kernels_cuda_sched_t *sc, int n_buckets, mgpu_err_t *err)
{
    /* The buckets' and the join's events are timing-free: recording them costs less, and
     * they only order work. */
    const unsigned ev_flags = cudaEventDisableTiming;
    CUDA_CHECK(err, cudaEventCreate(&sc->t0));
    CUDA_CHECK(err, cudaEventCreate(&sc->t1));
    if (n_buckets == 0)
        return 0;
    sc->bucket_ev = (cudaEvent_t *)calloc((size_t)n_buckets, sizeof(cudaEvent_t));
    if (sc->bucket_ev == NULL)
        return mgpu_err_set(err, -ENOMEM, "schedule: calloc of %d bucket events failed", n_buckets);
    sc->n_buckets = n_buckets;
    CUDA_CHECK(err, cudaStreamCreateWithFlags(&sc->comm, cudaStreamNonBlocking));
    for (int b = 0; b < n_buckets; b++)
        CUDA_CHECK(err, cudaEventCreateWithFlags(&sc->bucket_ev[b], ev_flags));
    CUDA_CHECK(err, cudaEventCreateWithFlags(&sc->comm_done, ev_flags));
    return 0;
}

extern "C" int mgpu_kernels_cuda_sched_create(mgpu_kernels_t *k, int n_buckets,
                                              mgpu_kernels_cuda_sched_t **out, mgpu_err_t *err)
{
    *out = NULL;
    if (k == NULL || k->backend != MGPU_KBACKEND_CUDA || k->impl == NULL)
        return mgpu_err_set(err, MGPU_E_USAGE, "schedule: the kernels backend is %s, expected cuda",
                            k != NULL && k->ops != NULL ? k->ops->name : "none");
    if (n_buckets < 0)
        return mgpu_err_set(err, MGPU_E_RANGE, "schedule: %d buckets, expected 0 or more",
                            n_buckets);
    mgpu_kernels_cuda_sched_t *sc = (mgpu_kernels_cuda_sched_t *)calloc(1, sizeof *sc);
    if (sc == NULL)
        return mgpu_err_set(err, -ENOMEM, "schedule: calloc(%zu) failed", sizeof *sc);
    sc->ci = (mgpu_cuda::cuda_impl *)k->impl;
    sc->stream = sc->ci->stream;
    int rc = sched_init(sc, n_buckets, err);
    if (rc < 0) {
        mgpu_kernels_cuda_sched_destroy(sc);
        return rc;
    }
    *out = sc;
    return 0;
}

extern "C" void mgpu_kernels_cuda_sched_destroy(mgpu_kernels_cuda_sched_t *sc)
{
    if (sc == NULL)
        return;
    /* Queued work may still wait for these events, or replay the graph. */
    (void)cudaStreamSynchronize(sc->stream);
    if (sc->comm != nullptr) {
        (void)cudaStreamSynchronize(sc->comm);
        (void)cudaStreamDestroy(sc->comm);
    }
    if (sc->exec != nullptr)
        (void)cudaGraphExecDestroy(sc->exec);
    if (sc->graph != nullptr)
        (void)cudaGraphDestroy(sc->graph);
    for (int b = 0; b < sc->n_buckets; b++)
        if (sc->bucket_ev[b] != nullptr)
            (void)cudaEventDestroy(sc->bucket_ev[b]);
    free(sc->bucket_ev);
    cudaEvent_t evs[] = {sc->comm_done, sc->t0, sc->t1};
    for (cudaEvent_t ev : evs)
        if (ev != nullptr)
            (void)cudaEventDestroy(ev);
    free(sc);
}

extern "C" void *mgpu_kernels_cuda_sched_comm_stream(const mgpu_kernels_cuda_sched_t *sc)
{
    return (void *)sc->comm;
}

extern "C" int mgpu_kernels_cuda_sched_bucket(mgpu_kernels_cuda_sched_t *sc, int bucket,
                                              mgpu_err_t *err)
{
    if (bucket < 0 || bucket >= sc->n_buckets)
        return mgpu_err_set(err, MGPU_E_RANGE, "schedule: bucket %d, expected 0..%d", bucket,
                            sc->n_buckets - 1);
    CUDA_CHECK(err, cudaEventRecord(sc->bucket_ev[bucket], sc->stream));
    CUDA_CHECK(err, cudaStreamWaitEvent(sc->comm, sc->bucket_ev[bucket], 0));
    return 0;
}

extern "C" int mgpu_kernels_cuda_sched_comm_join(mgpu_kernels_cuda_sched_t *sc, mgpu_err_t *err)
{
    if (sc->comm == nullptr)
        return mgpu_err_set(err, MGPU_E_USAGE,
                            "schedule: a join of the all-reduce stream, but none was created "
                            "(0 buckets)");
    CUDA_CHECK(err, cudaEventRecord(sc->comm_done, sc->comm));
    CUDA_CHECK(err, cudaStreamWaitEvent(sc->stream, sc->comm_done, 0));
    return 0;
}

extern "C" int mgpu_kernels_cuda_sched_capture_begin(mgpu_kernels_cuda_sched_t *sc, mgpu_err_t *err)
{
    mgpu_cuda::cuda_impl *c = sc->ci;
    bool g16 = false; /* a bf16 path's product has run: its products will be captured */
    for (int i = 0; i < c->n_plans && !g16; i++)
        g16 = c->plans[i].g16;
    if (c->gws == nullptr && g16 && !c->opt.slices_off)
        CUDA_CHECK(err, cudaMalloc((void **)&c->gws, mgpu_cuda::kBlasWorkspace));
    /* ThreadLocal: another thread's unrelated CUDA calls (a watchdog's query) must not
     * invalidate this capture, and this thread makes no unsafe call during it. */
    CUDA_CHECK(err, cudaStreamBeginCapture(sc->stream, cudaStreamCaptureModeThreadLocal));
    c->gws_used = 0;
    c->gws_on = c->gws != nullptr;
    return 0;
}

extern "C" int mgpu_kernels_cuda_sched_capture_end(mgpu_kernels_cuda_sched_t *sc, int keep,
                                                   mgpu_err_t *err)
{
    cudaGraph_t graph = nullptr;
    /* Ended whatever happened since the begin: the stream must leave capture mode. */
    cudaError_t ce = cudaStreamEndCapture(sc->stream, &graph);
    sc->ci->gws_on = false;
    if (!keep) {
        /* err holds why the captured work failed: the end's own status matters less. */
        if (graph != nullptr)
            (void)cudaGraphDestroy(graph);
        return 0;
    }
    if (ce != cudaSuccess)
        return mgpu_err_set(err, MGPU_E_CUDA, "cudaStreamEndCapture: %s (%s)",
                            cudaGetErrorString(ce), cudaGetErrorName(ce));
    int rc = mgpu_cuda::gws_hoist(sc->ci, graph, err);
    if (rc < 0) {
        (void)cudaGraphDestroy(graph);
        return rc;
    }
    sc->graph = graph;
    return 0;
}

extern "C" int mgpu_kernels_cuda_sched_graph_instantiate(mgpu_kernels_cuda_sched_t *sc,
                                                         mgpu_err_t *err)
{
    if (sc->graph == nullptr)
        return mgpu_err_set(err, MGPU_E_USAGE, "schedule: no captured graph to instantiate");
    CUDA_CHECK(err, cudaGraphInstantiate(&sc->exec, sc->graph, 0));
    return 0;
}

extern "C" int mgpu_kernels_cuda_sched_graph_launch(mgpu_kernels_cuda_sched_t *sc, mgpu_err_t *err)
{
    if (sc->exec == nullptr)
        return mgpu_err_set(err, MGPU_E_USAGE, "schedule: no instantiated graph to launch");
    CUDA_CHECK(err, cudaGraphLaunch(sc->exec, sc->stream));
    return 0;
}

extern "C" int mgpu_kernels_cuda_sched_graph_drop(mgpu_kernels_cuda_sched_t *sc, mgpu_err_t *err)
{
    if (sc->exec == nullptr && sc->graph == nullptr)
        return 0;
    /* Replays still queued use the executable graph. */
    CUDA_CHECK(err, cudaStreamSynchronize(sc->stream));
    /* Each handle is forgotten before its destroy, so that a failure leaves none that the
     * next drop or mgpu_kernels_cuda_sched_destroy would destroy twice. */
    cudaGraphExec_t exec = sc->exec;
    cudaGraph_t graph = sc->graph;
    sc->exec = nullptr, sc->graph = nullptr;
    if (exec != nullptr)
        CUDA_CHECK(err, cudaGraphExecDestroy(exec));
    if (graph != nullptr)
        CUDA_CHECK(err, cudaGraphDestroy(graph));
    return 0;
}

extern "C" int mgpu_kernels_cuda_sched_graphed(const mgpu_kernels_cuda_sched_t *sc)
{
    return sc->exec != nullptr;
}

extern "C" int mgpu_kernels_cuda_sched_timer_start(mgpu_kernels_cuda_sched_t *sc, mgpu_err_t *err)
{
    CUDA_CHECK(err, cudaEventRecord(sc->t0, sc->stream));
    return 0;
}

extern "C" int mgpu_kernels_cuda_sched_timer_stop(mgpu_kernels_cuda_sched_t *sc, double *ms,
                                                  mgpu_err_t *err)
{
    float f = 0;
    CUDA_CHECK(err, cudaEventRecord(sc->t1, sc->stream));
    CUDA_CHECK(err, cudaEventSynchronize(sc->t1));
    CUDA_CHECK(err, cudaEventElapsedTime(&f, sc->t0, sc->t1));
    *ms = f;
    return 0;
}
