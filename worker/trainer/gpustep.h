/* gpustep.h - the trainer's step on a GPU (gpustep.cu, built when nvcc is found): the
 * data set in device memory, batches gathered on the device, forward and backward on the CUDA
 * kernels backend's stream, each gradient bucket's all-reduce launched on a stream of its own
 * as soon as backward has produced it, the optimizer update, and the whole step captured in a
 * CUDA graph and replayed when its shapes are static. Nothing here waits for the device but
 * mgpu_gpustep_epoch (for a slot of the index ring four epochs old) and the timer's stop.
 * The streams, events and graph calls that order a step are the kernels' schedule
 * (mgpu_kernels_cuda_sched_t in kernels_cuda.h); this module decides what a step is and when
 * it is captured.
 *
 * How a step finds its rows without the host: each epoch's sample indices go, in the order
 * the steps consume them, into one slot of a ring of four slots in device memory, and a cursor
 * in device memory says where the next batch starts; the gather kernel reads it and the step
 * advances it. So a captured step replays unchanged, and the host only uploads an epoch's
 * indices (asynchronously, from pinned memory) at the start of each epoch.
 *
 * The all-reduce is a callback that queues on a stream (NCCL: mgpu_allreduce_f32(comm, buf,
 * count, MGPU_AVG, stream, err)); with world size 1 it is NULL and no collective runs.
 *
 * Ownership: mgpu_gpustep_create borrows the trainer (its model, optimizer, buckets, batch
 * buffers and kernels object, which must be CUDA) and copies the data set; destroy it before
 * the trainer. One thread uses it at a time. No CUDA header is included here. */
#ifndef MGPU_GPUSTEP_H
#define MGPU_GPUSTEP_H

#ifdef __cplusplus
extern "C" {
#endif

#include <stddef.h> /* size_t */

#include "data.h"  /* mgpu_dataset_t */
#include "error.h" /* mgpu_err_t */
#include "train.h" /* mgpu_trainer_t */

/* In place, the average over all ranks of buf[0..count) (device memory), queued on stream (a
 * cudaStream_t); returns once queued. */
typedef int (*mgpu_gpustep_reduce_fn)(void *ctx, float *buf, size_t count, void *stream,
                                      mgpu_err_t *err);

typedef struct mgpu_gpustep mgpu_gpustep_t;

/* Copies ds to the device, sizes the index ring for epochs of up to epoch_rows rows, creates
 * the all-reduce stream and events. use_graph: capture and replay steps of t->max_batch rows
 * (mgpu_train_graph_eligible decides). reduce may be NULL only for a single process. */
int mgpu_gpustep_create(mgpu_trainer_t *t, const mgpu_dataset_t *ds, size_t epoch_rows,
                        int use_graph, mgpu_gpustep_reduce_fn reduce, void *reduce_ctx,
                        mgpu_gpustep_t **out, mgpu_err_t *err);
void mgpu_gpustep_destroy(mgpu_gpustep_t *g);

/* After the backward, in place of the buckets' all-reduces and the optimizer's update: queues
 * the rest of the step on the kernels' stream (zero = 1: the reduce-scatter, the update of
 * the rank's slice and the all-gather, zero.h's mgpu_zero_trainer_update). */
typedef int (*mgpu_gpustep_update_fn)(void *ctx, mgpu_err_t *err);

/* Every later step ends with update(ctx) after its backward. Only for a step created without a
 * reduce callback and without use_graph: such an update runs eagerly (its collectives need
 * not be capturable). */
int mgpu_gpustep_set_update(mgpu_gpustep_t *g, mgpu_gpustep_update_fn update, void *ctx,
                            mgpu_err_t *err);

/* The indices of the rows the coming steps consume, in order (n <= epoch_rows, each < the
 * data set's size): uploaded into the next ring slot, the cursor set to its start. */
int mgpu_gpustep_epoch(mgpu_gpustep_t *g, const size_t *idx, size_t n, mgpu_err_t *err);

/* Queues one step over the next count rows: gather, forward, backward with the buckets'
 * all-reduces, update. The first step of t->max_batch rows after a warm-up (eager) step is
 * captured and every later one replays the graph. The loss stays on the device
 * (t->model->scalars[0]; mgpu_model_read_scalars reads it and synchronises). */
int mgpu_gpustep_step(mgpu_gpustep_t *g, size_t count, mgpu_err_t *err);

/* 1 when steps are replayed from a graph (after the capture). */
int mgpu_gpustep_graphed(const mgpu_gpustep_t *g);

/* 1 when the last step read the data set in place: its epoch was every row in the data set's
 * order (no shuffle) and the step took all of them (full-batch training), so nothing was
 * gathered and the input stayed the same from step to step. */
int mgpu_gpustep_in_place(const mgpu_gpustep_t *g);

/* A CUDA event on the step stream (start), then another and the milliseconds between them
 * (stop, which waits for the device). */
int mgpu_gpustep_timer_start(mgpu_gpustep_t *g, mgpu_err_t *err);
int mgpu_gpustep_timer_stop(mgpu_gpustep_t *g, double *ms, mgpu_err_t *err);

#ifdef __cplusplus
}
#endif

#endif
