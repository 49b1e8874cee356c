/* gpustep.cu - one training step on the GPU, eager or replayed from a CUDA graph (gpustep.h).
 *
 * Ordering, and why it is enough:
 * - Everything of a step is queued on the kernels backend's stream s (mgpu_kernels_cuda_stream),
 *   so gather -> forward -> backward -> update need no events between them.
 * - Bucket b's all-reduce must start after backward wrote its gradients and must finish before
 *   the update reads them: the schedule (kernels_cuda.h, mgpu_kernels_cuda_sched_t) forks it
 *   off s after the layer that completes the bucket (the model's backward hook) and joins the
 *   all-reduce stream back into s after the last bucket, before the update. The all-reduce
 *   stream therefore runs while s computes the lower layers' backward.
 * - The next step's backward overwrites the gradients an all-reduce may still be reading only
 *   after this step's update, which waited for the all-reduces: no extra event.
 * - In a capture the same forks and join become the graph's edges (schedule.cu says how).
 * - A step with an update of its own (zero = 1: mgpu_gpustep_set_update) has no bucket and no
 *   graph: its collectives are queued on s after the backward (side streams joined first), so
 *   they too need no event.
 * - The index ring's slot is rewritten only after an event recorded behind the steps of the
 *   epoch that last used it has completed (mgpu_gpustep_epoch).
 * - A step over the whole data set in its own order (full-batch training without shuffling)
 *   reads the data set in place: no gather, and the model is told that its input does not
 *   change between steps (m->x_kept), so bf16 mode keeps the input's bf16 copy as well. */
#include "gpustep.h"

#include "cuda_check.h"   /* CUDA_CHECK, CUDA_CHECK_LAUNCH */
#include "kernels_cuda.h" /* mgpu_kernels_cuda_stream, mgpu_kernels_cuda_sched_* */

#include <cuda_runtime.h> /* memory, copies, the index ring's events, the gather's launch */

#include <errno.h>  /* EINVAL, ENOMEM */
#include <stdint.h> /* int32_t, INT32_MAX */
#include <stdio.h>  /* snprintf */
#include <stdlib.h> /* calloc, free */

namespace
{

constexpr int kRing = 4;               /* epochs of indices the host may run ahead of the device */
constexpr int kThreads = 256;          /* gather block size */
constexpr int kMaxGatherBlocks = 2048; /* enough to fill the chip; each adds one atomic */

/* Row r of the batch is row ring[*cursor + r] of the data set: x [F], targets [T], label. A
 * 2-D grid: y walks rows, x walks columns, so no thread divides; with V4 the columns are
 * float4s (F and T multiples of 4). The grid is capped (kMaxGatherBlocks), the blocks loop
 * over the rest. The block that finishes last (a counter in device memory) advances the
 * cursor by count and resets the counter: every block has read the cursor before it counts
 * itself, so this saves the step a launch. */
template <bool V4>
__global__ void gather_kernel(const float *__restrict__ x, int F, const float *__restrict__ tg,
                              int T, const int32_t *__restrict__ lab,
                              const int32_t *__restrict__ ring, int *cursor, unsigned *done,
                              int count, float *__restrict__ bx, float *__restrict__ bt,
                              int32_t *__restrict__ bl)
{
    __shared__ bool last;
    const int base = *(volatile int *)cursor;
    const int f = V4 ? F / 4 : F, t = V4 ? T / 4 : T; /* in elements of the loads */
    const int wide = f > t ? f : t;
    for (int r = blockIdx.y; r < count; r += gridDim.y) {
        const size_t src = (size_t)ring[base + r];
        for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < wide; c += gridDim.x * blockDim.x) {
            if (V4) {
                if (c < f)
                    reinterpret_cast<float4 *>(bx)[(size_t)r * f + c] =
                        reinterpret_cast<const float4 *>(x)[src * f + c];
                if (c < t)
                    reinterpret_cast<float4 *>(bt)[(size_t)r * t + c] =
                        reinterpret_cast<const float4 *>(tg)[src * t + c];
            } else {
                if (c < f)
                    bx[(size_t)r * F + c] = x[src * F + c];
                if (c < t)
                    bt[(size_t)r * T + c] = tg[src * T + c];
            }
            if (c == 0 && lab != nullptr)
                bl[r] = lab[src];
        }
    }
    __syncthreads(); /* every thread of this block has read the cursor */
    if (threadIdx.x == 0) {
        __threadfence();
        const unsigned total = gridDim.x * gridDim.y;
        last = atomicAdd(done, 1u) == total - 1;
    }
    __syncthreads();
    if (last && threadIdx.x == 0) {
        *cursor = base + count;
        *done = 0;
        __threadfence();
    }
}

__global__ void cursor_set_kernel(int *cursor, int value)
{
    *cursor = value;
}

} // namespace

struct mgpu_gpustep {
    mgpu_trainer_t *t;
    cudaStream_t s; /* the kernels backend's */
    /* The all-reduce stream (only with a reduce callback), the buckets' events, the graph, the
     * timer. */
    mgpu_kernels_cuda_sched_t *sched;
    mgpu_gpustep_reduce_fn reduce;
    void *reduce_ctx;
    /* In place of the buckets and the optimizer (mgpu_gpustep_set_update), or NULL. */
    mgpu_gpustep_update_fn update;
    void *update_ctx;
    /* The data set in device memory. */
    float *x, *tg;
    int32_t *lab;
    int F, T;
    bool want_targets, want_labels; /* what the loss reads (see mgpu_gpustep_create) */
    size_t n;
    /* The index ring: kRing slots of slot_len indices, a pinned host copy, the cursor. */
    int32_t *ring, *h_ring;
    size_t slot_len;
    long long epochs;
    cudaEvent_t slot_free[kRing];
    int *cursor;
    unsigned *done;  /* gather's count of finished blocks (0 between steps) */
    bool whole;      /* this epoch's rows are the data set's, in order */
    int next_bucket; /* the next bucket to launch in this step's backward */
    /* The graph. */
    int use_graph;
    long long eager_steps;
    bool exec_in_place; /* the graph reads the data set in place (no gather) */
    bool last_in_place; /* so did the last step */
};

extern "C" void mgpu_gpustep_destroy(mgpu_gpustep_t *g)
{
    if (g == NULL)
        return;
    /* Queued work may still read what is freed below. */
    (void)cudaStreamSynchronize(g->s);
    mgpu_kernels_cuda_sched_destroy(g->sched);
    for (int i = 0; i < kRing; i++)
        if (g->slot_free[i] != nullptr)
            (void)cudaEventDestroy(g->slot_free[i]);
    (void)cudaFree(g->x);
    (void)cudaFree(g->tg);
    (void)cudaFree(g->lab);
    (void)cudaFree(g->ring);
    (void)cudaFree(g->cursor);
    (void)cudaFree(g->done);
    (void)cudaFreeHost(g->h_ring);
    free(g);
}

static int create(mgpu_gpustep_t *g, const mgpu_dataset_t *ds, size_t epoch_rows, mgpu_err_t *err)
{
    const size_t xb = sizeof(float) * ds->n * (size_t)ds->features;
    const size_t tb = sizeof(float) * ds->n * (size_t)ds->target_dim;
    /* Timing-free events: recording them costs less, and these only order work. */
    const unsigned ev_flags = cudaEventDisableTiming;

    CUDA_CHECK(err, cudaMalloc((void **)&g->x, xb));
    CUDA_CHECK(err, cudaMemcpyAsync(g->x, ds->x, xb, cudaMemcpyHostToDevice, g->s));
    if (g->want_targets && tb > 0) {
        CUDA_CHECK(err, cudaMalloc((void **)&g->tg, tb));
        CUDA_CHECK(err, cudaMemcpyAsync(g->tg, ds->targets, tb, cudaMemcpyHostToDevice, g->s));
    }
    if (g->want_labels) {
        CUDA_CHECK(err, cudaMalloc((void **)&g->lab, sizeof(int32_t) * ds->n));
        CUDA_CHECK(err, cudaMemcpyAsync(g->lab, ds->labels, sizeof(int32_t) * ds->n,
                                        cudaMemcpyHostToDevice, g->s));
    }
    g->slot_len = epoch_rows;
    CUDA_CHECK(err, cudaMalloc((void **)&g->ring, sizeof(int32_t) * kRing * epoch_rows));
    CUDA_CHECK(err, cudaMallocHost((void **)&g->h_ring, sizeof(int32_t) * kRing * epoch_rows));
    CUDA_CHECK(err, cudaMalloc((void **)&g->cursor, sizeof(int)));
    CUDA_CHECK(err, cudaMemsetAsync(g->cursor, 0, sizeof(int), g->s));
    CUDA_CHECK(err, cudaMalloc((void **)&g->done, sizeof(unsigned)));
    CUDA_CHECK(err, cudaMemsetAsync(g->done, 0, sizeof(unsigned), g->s));
    for (int i = 0; i < kRing; i++)
        CUDA_CHECK(err, cudaEventCreateWithFlags(&g->slot_free[i], ev_flags));
    /* An all-reduce stream with an event per bucket only where there is an all-reduce. */
    int rc = mgpu_kernels_cuda_sched_create(g->t->k, g->reduce != NULL ? g->t->n_buckets : 0,
                                            &g->sched, err);
    if (rc < 0)
        return rc;
    /* The host copy of ds may be freed by the caller once this returns. */
    CUDA_CHECK(err, cudaStreamSynchronize(g->s));
    return 0;
}

extern "C" int mgpu_gpustep_create(mgpu_trainer_t *t, const mgpu_dataset_t *ds, size_t epoch_rows,
                                   int use_graph, mgpu_gpustep_reduce_fn reduce, void *reduce_ctx,
                                   mgpu_gpustep_t **out, mgpu_err_t *err)
{
    *out = NULL;
    cudaStream_t s = (cudaStream_t)mgpu_kernels_cuda_stream(t->k);
    if (s == nullptr)
        return mgpu_err_set(err, -EINVAL, "gpustep: the kernels backend is %s, expected cuda",
                            t->k->ops->name);
    /* The ring holds int32 row numbers and the cursor is an int. */
    if (ds->n == 0 || ds->n > (size_t)INT32_MAX || epoch_rows == 0 ||
        epoch_rows * kRing > (size_t)INT32_MAX)
        return mgpu_err_set(err, -EINVAL,
                            "gpustep: %zu samples and epochs of %zu rows, expected 1..%d each",
                            ds->n, epoch_rows, INT32_MAX / kRing);
    mgpu_gpustep_t *g = (mgpu_gpustep_t *)calloc(1, sizeof *g);
    if (g == NULL)
        return mgpu_err_set(err, -ENOMEM, "gpustep: calloc failed");
    g->t = t;
    g->s = s;
    g->reduce = reduce;
    g->reduce_ctx = reduce_ctx;
    g->F = ds->features;
    /* Only what the loss reads is uploaded and gathered: a data set may carry both (the
     * random one does), and cross-entropy's gather then moves float4s of x alone. */
    g->want_targets = t->model->spec.loss == MGPU_LOSS_MSE && ds->targets != NULL;
    g->want_labels = t->model->spec.loss == MGPU_LOSS_CROSS_ENTROPY && ds->labels != NULL;
    g->T = g->want_targets ? ds->target_dim : 0;
    g->n = ds->n;
    g->use_graph = use_graph;
    int rc = create(g, ds, epoch_rows, err);
    if (rc < 0) {
        mgpu_gpustep_destroy(g);
        return rc;
    }
    *out = g;
    return 0;
}

extern "C" int mgpu_gpustep_set_update(mgpu_gpustep_t *g, mgpu_gpustep_update_fn update, void *ctx,
                                       mgpu_err_t *err)
{
    if (g->reduce != NULL || g->use_graph)
        return mgpu_err_set(err, -EINVAL,
                            "gpustep: an update of its own needs a step without bucket "
                            "all-reduces and without a CUDA graph");
    g->update = update;
    g->update_ctx = ctx;
    return 0;
}

extern "C" int mgpu_gpustep_epoch(mgpu_gpustep_t *g, const size_t *idx, size_t n, mgpu_err_t *err)
{
    if (n > g->slot_len)
        return mgpu_err_set(err, -EINVAL, "gpustep: an epoch of %zu rows, the ring holds %zu", n,
                            g->slot_len);
    const int slot = (int)(g->epochs % kRing);
    mgpu_progress_phase(g->t->progress, MGPU_PHASE_DATA); /* may wait for the ring's slot */
    int32_t *h = g->h_ring + (size_t)slot * g->slot_len;
    /* Everything queued so far belongs to the previous epoch: its slot is free once that is
     * done. The slot this epoch takes was last used kRing epochs ago. */
    if (g->epochs > 0)
        CUDA_CHECK(err, cudaEventRecord(g->slot_free[(g->epochs - 1) % kRing], g->s));
    CUDA_CHECK(err, cudaEventSynchronize(g->slot_free[slot]));
    bool whole = n == g->n;
    for (size_t i = 0; i < n; i++) {
        if (idx[i] >= g->n)
            return mgpu_err_set(err, MGPU_E_RANGE, "gpustep: index %zu is row %zu of %zu", i,
                                idx[i], g->n);
        h[i] = (int32_t)idx[i];
        whole = whole && idx[i] == i;
    }
    g->whole = whole;
    CUDA_CHECK(err, cudaMemcpyAsync(g->ring + (size_t)slot * g->slot_len, h, sizeof(int32_t) * n,
                                    cudaMemcpyHostToDevice, g->s));
    cursor_set_kernel<<<1, 1, 0, g->s>>>(g->cursor, (int)((size_t)slot * g->slot_len));
    CUDA_CHECK_LAUNCH(err, "cursor_set_kernel");
    g->epochs++;
    return 0;
}

/* The model's backward hook: launch every bucket that `layer` completes. */
static int on_layer(void *ctx, int layer, mgpu_err_t *err)
{
    mgpu_gpustep_t *g = (mgpu_gpustep_t *)ctx;
    mgpu_trainer_t *t = g->t;
    while (g->next_bucket < t->n_buckets && t->bucket_layer[g->next_bucket] == layer) {
        const int b = g->next_bucket++;
        const mgpu_bucket_t *bk = &t->buckets[b];
        int rc = mgpu_kernels_cuda_sched_bucket(g->sched, b, err);
        mgpu_progress_bucket(t->progress, b);
        if (rc == 0)
            rc = g->reduce(g->reduce_ctx, t->model->grads + bk->offset, bk->count,
                           mgpu_kernels_cuda_sched_comm_stream(g->sched), err);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* A step of count rows reads the data set in place: this epoch is the whole data set in
 * order and the step takes all of it. */
static bool in_place(const mgpu_gpustep_t *g, int count)
{
    return g->whole && (size_t)count == g->n;
}

/* Queues the gather of the next count rows into the trainer's batch buffers. */
static int gather(mgpu_gpustep_t *g, int count, mgpu_err_t *err)
{
    mgpu_trainer_t *t = g->t;
    /* cudaMalloc'd rows start 16-byte aligned when F and T are multiples of 4. */
    const bool v4 = g->F % 4 == 0 && g->T % 4 == 0;
    const int wide = (g->F > g->T ? g->F : g->T) / (v4 ? 4 : 1);
    dim3 grid((unsigned)((wide + kThreads - 1) / kThreads), 1);
    if (grid.x > 32)
        grid.x = 32; /* the kernel loops over the rest of a row */
    const int ry = kMaxGatherBlocks / (int)grid.x;
    grid.y = (unsigned)(count < ry ? count : ry);
    if (v4)
        gather_kernel<true><<<grid, kThreads, 0, g->s>>>(g->x, g->F, g->tg, g->T, g->lab, g->ring,
                                                         g->cursor, g->done, count, t->d_x, t->d_t,
                                                         t->d_l);
    else
        gather_kernel<false><<<grid, kThreads, 0, g->s>>>(g->x, g->F, g->tg, g->T, g->lab, g->ring,
                                                          g->cursor, g->done, count, t->d_x, t->d_t,
                                                          t->d_l);
    CUDA_CHECK_LAUNCH(err, "gather_kernel(%d rows of %d + %d)", count, g->F, g->T);
    return 0;
}

/* Queues one step on g->s (also while capturing). */
static int queue_step(mgpu_gpustep_t *g, int count, mgpu_err_t *err)
{
    mgpu_trainer_t *t = g->t;
    mgpu_model_t *m = t->model;
    int rc;
    const float *x = t->d_x, *tg = t->d_t;
    const int32_t *lab = t->d_l;

    if (in_place(g, count)) {
        /* The cursor stays: this step ends the epoch, and the next epoch sets it. */
        x = g->x, tg = g->tg, lab = g->lab;
        m->x_kept = g->x;
    } else if ((rc = gather(g, count, err)) < 0)
        return rc;
    g->next_bucket = 0;
    if ((rc = mgpu_model_grads_hooked(
             m, x, g->lab != nullptr ? lab : NULL, g->tg != nullptr ? tg : NULL, count,
             g->reduce != NULL && t->bucket_overlap ? on_layer : NULL, g, err)) < 0)
        return rc;
    /* bucket_overlap = false: every bucket after the whole backward, in the same order. */
    while (g->reduce != NULL && !t->bucket_overlap && g->next_bucket < t->n_buckets)
        if ((rc = on_layer(g, t->bucket_layer[g->next_bucket], err)) < 0)
            return rc;
    if (g->reduce != NULL) {
        if (g->next_bucket != t->n_buckets)
            return mgpu_err_set(err, -EINVAL, "gpustep: backward launched %d of %d buckets",
                                g->next_bucket, t->n_buckets);
        if ((rc = mgpu_kernels_cuda_sched_comm_join(g->sched, err)) < 0)
            return rc;
        mgpu_progress_bucket(t->progress, -1);
    }
    if (g->update != NULL)
        return g->update(g->update_ctx, err);
    mgpu_progress_phase(t->progress, MGPU_PHASE_OPTIMIZER);
    return mgpu_optim_step(t->optim, m->params, m->grads, err);
}

/* Captures one step of count rows into g->sched's graph. The capture queues nothing: the
 * caller launches the graph for this step. */
static int capture(mgpu_gpustep_t *g, int count, mgpu_err_t *err)
{
    long long step_before = g->t->optim->step;
    int rc = mgpu_kernels_cuda_sched_capture_begin(g->sched, err);
    if (rc < 0)
        return rc;
    rc = queue_step(g, count, err);
    /* Ended also when the step failed (what was captured is then dropped, err kept). */
    const int ce = mgpu_kernels_cuda_sched_capture_end(g->sched, rc == 0, err);
    /* Nothing captured has run: the step is not done. */
    g->t->optim->step = step_before;
    char msg[sizeof err->msg];
    if (rc < 0) {
        /* Something in the step (an all-reduce that synchronises, say) cannot be captured:
         * say how to run without a graph. */
        snprintf(msg, sizeof msg, "%s", err->msg);
        return mgpu_err_set(err, rc,
                            "gpustep: capturing the step in a CUDA graph: %s (set "
                            "cuda_graph = false to run eagerly)",
                            msg);
    }
    if (ce < 0) {
        /* err: "cudaStreamEndCapture: <the runtime's reason>". */
        snprintf(msg, sizeof msg, "%s", err->msg);
        return mgpu_err_set(err, ce, "gpustep: %s (set cuda_graph = false to run eagerly)", msg);
    }
    g->exec_in_place = in_place(g, count);
    /* queue_step counted the captured update (undone above); the launch performs it. */
    return mgpu_kernels_cuda_sched_graph_instantiate(g->sched, err);
}

extern "C" int mgpu_gpustep_step(mgpu_gpustep_t *g, size_t count, mgpu_err_t *err)
{
    mgpu_trainer_t *t = g->t;
    int rc;
    if (count < 1 || count > (size_t)t->max_batch)
        return mgpu_err_set(err, -EINVAL, "gpustep: a step of %zu rows, expected 1..%d", count,
                            t->max_batch);
    g->last_in_place = in_place(g, (int)count);
    /* The host queues the step (or launches its graph) and goes on: "forward" is where the
     * host is, the GPU's work is in the collectives' records. */
    mgpu_progress_phase(t->progress, MGPU_PHASE_FORWARD);
    /* One eager step first: it sizes the backend's GEMM workspaces (a capture cannot
     * allocate) and does the optimizer's first update, the one whose arguments differ. */
    if (g->use_graph && count == (size_t)t->max_batch && g->eager_steps > 0) {
        /* An epoch in another order than the captured step's (a sampler that shuffles some
         * epochs only): capture again. */
        if (mgpu_kernels_cuda_sched_graphed(g->sched) && g->exec_in_place != g->last_in_place &&
            (rc = mgpu_kernels_cuda_sched_graph_drop(g->sched, err)) < 0)
            return rc;
        if (!mgpu_kernels_cuda_sched_graphed(g->sched) && (rc = capture(g, (int)count, err)) < 0)
            return rc;
        if ((rc = mgpu_kernels_cuda_sched_graph_launch(g->sched, err)) < 0)
            return rc;
        t->optim->step++;
        t->model->last_batch = (int)count;
        return 0;
    }
    if ((rc = queue_step(g, (int)count, err)) < 0)
        return rc;
    g->eager_steps++;
    return 0;
}

extern "C" int mgpu_gpustep_graphed(const mgpu_gpustep_t *g)
{
    return mgpu_kernels_cuda_sched_graphed(g->sched);
}

extern "C" int mgpu_gpustep_in_place(const mgpu_gpustep_t *g)
{
    return g->last_in_place;
}

extern "C" int mgpu_gpustep_timer_start(mgpu_gpustep_t *g, mgpu_err_t *err)
{
    return mgpu_kernels_cuda_sched_timer_start(g->sched, err);
}

extern "C" int mgpu_gpustep_timer_stop(mgpu_gpustep_t *g, double *ms, mgpu_err_t *err)
{
    return mgpu_kernels_cuda_sched_timer_stop(g->sched, ms, err);
}
