/* ddp.h - the DistributedDataParallel training loop of mgpu-worker, over any communicator.
 *
 * mgpu_ddp_run does what a PyTorch DDP script does, rank by rank: build the cfg's data set
 * (the same on every rank, from data_seed), resume from the checkpoint if there is one (rank 0
 * reads it and broadcasts it) or broadcast rank 0's initial parameters, then per epoch draw the
 * DistributedSampler's shard, and per batch forward, backward, all-reduce (average) the
 * gradient in buckets, step. Rank 0 prints progress lines, writes metrics_file (JSON lines)
 * and checkpoints; evaluation is sharded over the ranks and reduced. With zero = 1 (zero.h)
 * each rank keeps the optimizer state of its slice of the parameters only: the gradients are
 * reduce-scattered instead of all-reduced, and the updated slices all-gathered.
 *
 * The collectives are callbacks, so the loop runs over libmgpu's communicator (mgpu.h:
 * mgpu_allreduce_f32 / mgpu_broadcast, wired by main.c), over threads standing in for
 * ranks (tests), or alone (world_size 1, callbacks may be NULL). Buffers passed to them are
 * backend memory (the kernels object's): device memory for NCCL, host memory for the CPU.
 *
 * Wiring to libmgpu (main.c), one line each:
 *   static int avg(void *c, float *b, size_t n, mgpu_err_t *e)
 *   { return mgpu_allreduce_f32(c, b, n, MGPU_AVG, NULL, e); }
 *   static int sum(void *c, float *b, size_t n, mgpu_err_t *e)
 *   { return mgpu_allreduce_f32(c, b, n, MGPU_SUM, NULL, e); }
 *   static int bcast(void *c, void *b, size_t n, int root, mgpu_err_t *e)
 *   { return mgpu_broadcast(c, b, n, root, NULL, e); }
 *   mgpu_ddp_comm_t dc = {rank, world, comm, avg, sum, bcast};
 * (a CUDA backend passes its stream instead of NULL).
 *
 * Every rank must call mgpu_ddp_run with the same cfg; ranks run the same sequence of
 * collectives, so a rank that fails makes the others fail in their next collective (the
 * communicator's timeout / peer-failure detection), never hang. */
#ifndef MGPU_DDP_H
#define MGPU_DDP_H

#include <stddef.h> /* size_t */
#include <stdio.h>  /* FILE */

#include "cfg.h"     /* mgpu_cfg_t */
#include "error.h"   /* mgpu_err_t */
#include "kernels.h" /* mgpu_kernels_t */
#include "mgpu.h"    /* mgpu_ctx_t: progress */

typedef struct mgpu_ddp_comm {
    int rank, world_size;
    void *ctx;
    /* In place over all ranks: the average (gradients) and the sum (metrics). */
    int (*allreduce_avg)(void *ctx, float *buf, size_t count, mgpu_err_t *err);
    int (*allreduce_sum)(void *ctx, float *buf, size_t count, mgpu_err_t *err);
    int (*broadcast)(void *ctx, void *buf, size_t bytes, int root, mgpu_err_t *err);
    /* A CUDA kernels backend with world size > 1: the gradient average queued on stream (a
     * cudaStream_t) without waiting, so buckets overlap backward (gpustep.h for the MLP,
     * gpt_graph.h for the GPT), also inside a CUDA graph's capture. */
    int (*allreduce_avg_stream)(void *ctx, float *buf, size_t count, void *stream, mgpu_err_t *err);
    /* zero = 1 (zero.h), in place over world_size blocks of count floats (buf holds
     * world_size x count): the average of block r left in block r of rank r (a reduce-scatter
     * of the gradients), and every rank's block r set to rank r's (an all-gather of the
     * parameters). May be NULL when zero = 0. */
    int (*reduce_scatter_avg)(void *ctx, float *buf, size_t count, mgpu_err_t *err);
    int (*all_gather)(void *ctx, float *buf, size_t count, mgpu_err_t *err);
    /* May be NULL: called with "first_step" once the first step has finished (libmgpu's
     * startup timeline, mgpu_timeline_mark). */
    void (*mark)(void *mark_ctx, const char *event);
    void *mark_ctx;
    /* May be NULL: the context whose progress page gets the step and phases
     * (mgpu_progress_step, _phase). */
    mgpu_ctx_t *progress;
} mgpu_ddp_comm_t;

typedef struct mgpu_ddp_result {
    long long steps;        /* optimizer steps done in all (resumed ones included) */
    long long resumed_step; /* the step a checkpoint resumed from (-1: a fresh start) */
    double loss;            /* the last logged training loss, averaged over ranks (NAN when
                             * no step ran: a resumed run with none left) */
    double eval_loss;       /* the last evaluation (NAN when there is no eval split) */
    double eval_accuracy;   /* cross_entropy only (NAN otherwise) */
    double samples_per_s;   /* global training samples per second of this run */
    double seconds;         /* wall time of the training loop */
    double step_us;         /* timing_warmup > 0: mean step time after the warm-up (else 0) */
    long long timed_steps;  /* steps behind step_us */
    int graphed;            /* 1: a GPU replayed the steps from a CUDA graph */
    int in_place; /* 1: its last step read the data set in place (mgpu_gpustep_in_place) */
    size_t n_params;
    float *params; /* the final parameters (host copy, malloc'd; the caller frees) */
} mgpu_ddp_result_t;

/* out (may be NULL: stdout) receives rank 0's progress lines and, with demo_prints, every
 * rank's "In Model: ..." / "Outside: ..." lines. result may be NULL. */
int mgpu_ddp_run(mgpu_kernels_t *k, const mgpu_cfg_t *cfg, const mgpu_ddp_comm_t *comm, FILE *out,
                 mgpu_ddp_result_t *result, mgpu_err_t *err);

#endif
