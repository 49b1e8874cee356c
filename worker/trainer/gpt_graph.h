/* gpt_graph.h - model = gpt's training step replayed from CUDA graphs (cuda_graph = true on a
 * CUDA backend). A part of the step is captured once, after an eager step of a full batch has
 * given every scratch buffer of the backend its size (a capture cannot allocate), and is then
 * replayed for every full batch: zero the gradients, forward, output layer, backward (GRADS),
 * the clip and one multi-tensor AdamW (UPDATE), or both in one graph (STEP, world size 1).
 *
 * What changes from step to step lives in device memory written before each replay, in stream
 * order: the batch (mgpu_gpt_load into the model's fixed buffers) and AdamW's learning rate and
 * step (mgpu_gpt_set_step). What a graph holds by value is fixed for the run: the shapes (a
 * full batch of max_b x context), the loss's scale, hp's betas, eps and weight decay, and
 * grad_clip.
 *
 * A world size above 1 with an all-reduce that can be queued on a stream (ddp.h's
 * allreduce_avg_stream: NCCL's) replays STEP with the gradients' average inside it, as
 * PyTorch's DDP does: the backward's hook (mgpu_gpt_loss_hooked) queues each bucket's
 * all-reduce (mgpu_gpt_buckets) on the schedule's all-reduce stream as soon as backward has
 * made the bucket, forked off the backend's stream by an event, so the all-reduces of the
 * upper layers run while the lower layers' backward computes; the all-reduce stream is joined
 * back before the clip and AdamW. Without such an all-reduce, a world size above 1 replays
 * GRADS, averages the gradients eagerly, then replays UPDATE.
 *
 * Ownership: the graphs borrow the model (destroy them first). */
#ifndef MGPU_GPT_GRAPH_H
#define MGPU_GPT_GRAPH_H

#include "error.h"     /* mgpu_err_t */
#include "kernels.h"   /* mgpu_adamw_hparams_t */
#include "model_gpt.h" /* mgpu_gpt_t */

typedef enum mgpu_gpt_graph_part {
    MGPU_GPT_GRAPH_STEP = 0, /* GRADS, the average (with a reduce), then UPDATE */
    MGPU_GPT_GRAPH_GRADS,    /* zero the gradients and the loss, forward, backward */
    MGPU_GPT_GRAPH_UPDATE,   /* the clip and AdamW, at the step mgpu_gpt_set_step wrote */
    MGPU_GPT_GRAPH_PARTS
} mgpu_gpt_graph_part_t;

typedef struct mgpu_gpt_graph mgpu_gpt_graph_t;

/* The gradients' average inside STEP. fn leaves in buf[0..count) (the backend's memory) the
 * average over all ranks, queued on stream (a cudaStream_t) without waiting for it, so that
 * a capture can hold it (ddp.h's allreduce_avg_stream). */
typedef struct mgpu_gpt_graph_reduce {
    int (*fn)(void *ctx, float *buf, size_t count, void *stream, mgpu_err_t *err);
    void *ctx;
    const mgpu_gpt_bucket_t *buckets; /* mgpu_gpt_buckets' plan (copied) */
    int n_buckets;
    int overlap; /* 0: every bucket after the whole backward, in the same order (to measure
                  * what the overlap buys: cfg's bucket_overlap) */
} mgpu_gpt_graph_reduce_t;

/* Graphs for m's steps of scale (1 / (rows x context) of a full batch), hp and grad_clip as
 * the eager step's (mgpu_gpt_loss, mgpu_gpt_update), with reduce (may be NULL: none) inside
 * STEP. *out is NULL (and 0 returned) where m's backend cannot capture: not CUDA, or a build
 * without CUDA. The bucket marks of m->progress (mgpu_progress_bucket) are set as the buckets
 * are queued: in a capture, not in its replays. */
int mgpu_gpt_graph_create(mgpu_gpt_t *m, float scale, const mgpu_adamw_hparams_t *hp,
                          float grad_clip, const mgpu_gpt_graph_reduce_t *reduce,
                          mgpu_gpt_graph_t **out, mgpu_err_t *err);
/* Waits for queued replays, then frees the graphs; NULL is a no-op. */
void mgpu_gpt_graph_destroy(mgpu_gpt_graph_t *g);

/* Queues one replay of part on the backend's stream, capturing it first when it has no
 * graph. The loaded batch must be full (m->b == m->max_b, m->t == context): MGPU_E_USAGE
 * otherwise. A capture that fails says so and how to run without graphs. */
int mgpu_gpt_graph_run(mgpu_gpt_graph_t *g, mgpu_gpt_graph_part_t part, mgpu_err_t *err);

/* Work ran eagerly on the model since the last replay (a batch that is not full, an
 * evaluation): drops every graph (after the queued replays), so the next run captures
 * again from the backend's present state. */
int mgpu_gpt_graph_drop(mgpu_gpt_graph_t *g, mgpu_err_t *err);

/* How many captures g has made. */
int mgpu_gpt_graph_captures(const mgpu_gpt_graph_t *g);
/* Whether g's STEP averages the gradients (it was given a reduce). */
int mgpu_gpt_graph_reduces(const mgpu_gpt_graph_t *g);

#endif
