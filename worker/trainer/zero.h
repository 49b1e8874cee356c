/* zero.h - ZeRO stage 1 (cfg zero = 1): the optimizer's state sharded over the ranks.
 *
 * Each rank keeps the optimizer state (AdamW's exp_avg and exp_avg_sq, SGD's momentum) of one
 * slice of the flat parameters only. A step reduce-scatters the gradients (each rank receives
 * the average of its own slice), updates its slice, and all-gathers the parameters, so every
 * rank ends the step with the full parameters, as after DDP's all-reduce, while it holds
 * 1 / world of the optimizer state. The parameters and gradients stay whole on every rank
 * (stage 1 shards the optimizer only); the fp32 parameters are the master weights on every
 * backend.
 *
 * On a GPU the same steps run on the kernels' stream, the collectives on device memory (NCCL
 * queues them on that stream). The GPT's bf16 path keeps a bf16 copy of the weights that its
 * products read; the slice's AdamW writes the fp32 slice only, and once the all-gather has
 * brought every slice, the whole copy is made again from the fp32 parameters
 * (mgpu_gpt_params_changed): bf16 rounding to nearest even of the same fp32 values, so the
 * same bits as zero = 0's AdamW writes into it. A sharded step runs eagerly: the CUDA graphs
 * capture zero = 0's step only (mgpu_zero_print_eager says so).
 *
 * The slices: block = n / world floats; rank r owns [r block, (r + 1) block), and the last
 * rank also the n % world floats of the tail [world block, n), averaged with an all-reduce
 * and sent to the others with a broadcast (fewer than world floats: not worth a collective
 * of their own shape). The CPU communicator sums each element in rank order whatever the
 * message, so the gradients are bit for bit those of zero = 0's bucketed all-reduce, and an
 * update on a slice is the update of those elements.
 *
 * Checkpoints keep zero = 0's layout (each state array of n floats): rank 0 gathers the
 * slices into it before it writes and scatters them after it reads, each slice through a
 * broadcast from its owner, so a checkpoint resumes at another world size and with zero = 0
 * or 1 alike.
 *
 * Ownership: the layout is a value; an mgpu_zero_gpt_t (mgpu_zero_gpt_create) owns its
 * moments (backend memory) and is freed with mgpu_zero_gpt_destroy before the kernels object.
 * Everything else is the caller's: buffers named "backend" are the kernels object's memory,
 * those named "host" plain memory. */
#ifndef MGPU_ZERO_H
#define MGPU_ZERO_H

#include <stddef.h> /* size_t */

#include "data.h"       /* mgpu_dataset_t */
#include "ddp.h"        /* mgpu_ddp_comm_t */
#include "error.h"      /* mgpu_err_t */
#include "kernels.h"    /* mgpu_kernels_t */
#include "checkpoint.h" /* mgpu_ckpt_t */
#include "model_gpt.h"  /* mgpu_gpt_t */
#include "run_util.h"   /* mgpu_run_resume_t, mgpu_run_ckpt_fits_fn */
#include "train.h"      /* mgpu_trainer_t */

typedef struct mgpu_zero {
    int rank, world;
    size_t n;      /* parameters */
    size_t block;  /* n / world: each rank's block of the reduce-scatter and the all-gather */
    size_t lo, hi; /* this rank's slice [lo, hi) */
} mgpu_zero_t;

/* The layout of n parameters over world ranks, seen from rank. */
void mgpu_zero_init(mgpu_zero_t *z, int rank, int world, size_t n);
/* Rank r's slice [*lo, *hi). */
void mgpu_zero_slice(const mgpu_zero_t *z, int r, size_t *lo, size_t *hi);

/* Checks that comm has what zero = 1 needs (reduce_scatter_avg, all_gather, allreduce_avg,
 * allreduce_sum, broadcast with more than one rank): who names the loop. k may be of any
 * backend; on a GPU the collectives must take device memory (the NCCL communicator's do). */
int mgpu_zero_check(const char *who, mgpu_kernels_t *k, const mgpu_ddp_comm_t *comm,
                    mgpu_err_t *err);

/* grads (backend, n floats): this rank's slice becomes the average over the ranks (the other
 * floats are left partly reduced: only the slice is read afterwards). */
int mgpu_zero_reduce_grads(const mgpu_zero_t *z, const mgpu_ddp_comm_t *comm, float *grads,
                           mgpu_err_t *err);
/* params (backend, n floats): every rank's slice from its owner. */
int mgpu_zero_gather_params(const mgpu_zero_t *z, const mgpu_ddp_comm_t *comm, float *params,
                            mgpu_err_t *err);

/* The state of `arrays` arrays, between the slices (state: backend, arrays x (hi - lo) floats
 * of this rank, array after array) and zero = 0's layout on rank 0 (full: host, arrays x n
 * floats; NULL on the other ranks). Every rank calls them together. */
int mgpu_zero_state_gather(const mgpu_zero_t *z, mgpu_kernels_t *k, const mgpu_ddp_comm_t *comm,
                           const float *state, int arrays, float *full, mgpu_err_t *err);
int mgpu_zero_state_scatter(const mgpu_zero_t *z, mgpu_kernels_t *k, const mgpu_ddp_comm_t *comm,
                            const float *full, int arrays, float *state, mgpu_err_t *err);

/* A checkpoint of sharded state: every rank calls it; rank 0 fills c->state with the whole
 * state in zero = 0's layout (a buffer of that size only while it writes), c->params from
 * params (backend, c->params a host buffer of c->n_params floats) and writes c to path. */
int mgpu_zero_save(const mgpu_zero_t *z, mgpu_kernels_t *k, const mgpu_ddp_comm_t *comm,
                   const float *state, int arrays, const float *params, mgpu_ckpt_t *c,
                   const char *path, mgpu_err_t *err);
/* mgpu_run_resume_or_broadcast for sharded state: rank 0 reads the whole state (arrays x n
 * floats, checked by fits), every rank receives its slice of it into state. */
int mgpu_zero_resume(const mgpu_zero_t *z, mgpu_kernels_t *k, const mgpu_ddp_comm_t *comm,
                     void *scratch, const char *checkpoint, mgpu_run_ckpt_fits_fn fits,
                     void *fits_ctx, float *params, float *state, int arrays, mgpu_run_resume_t *h,
                     mgpu_err_t *err);

/* The MLP's step with t->optim an optimizer of this rank's slice (mgpu_optim_create_slice):
 * gather rows idx[0..count) of ds, forward, backward, then mgpu_zero_trainer_update. *loss
 * (may be NULL) receives this rank's batch loss. */
int mgpu_zero_trainer_step(const mgpu_zero_t *z, const mgpu_ddp_comm_t *comm, mgpu_trainer_t *t,
                           const mgpu_dataset_t *ds, const size_t *idx, size_t count, float *loss,
                           mgpu_err_t *err);
/* After the MLP's backward (the GPU step calls it too, gpustep.h): the reduce-scatter, the
 * update of the slice, the all-gather, and the backend told that the parameters changed. */
int mgpu_zero_trainer_update(const mgpu_zero_t *z, const mgpu_ddp_comm_t *comm, mgpu_trainer_t *t,
                             mgpu_err_t *err);

/* The GPT's AdamW over this rank's slice: the model's tensors cut to it, with their weight
 * decay, and the slice's moments. */
typedef struct mgpu_zero_gpt {
    mgpu_zero_t z;
    mgpu_kernels_t *k;
    float *moments;   /* backend: exp_avg then exp_avg_sq of the slice */
    size_t n_moments; /* floats allocated there: 2 (hi - lo) */
    int n_tensors;
    mgpu_gpt_adamw_tensor_t *adam; /* host: the parts of the model's tensors in the slice */
} mgpu_zero_gpt_t;

/* For a model made with spec.sharded_optimizer, on either path: the slice's tensors carry no
 * bf16 copy (p16 NULL); mgpu_zero_gpt_step makes the whole copy after the all-gather. */
int mgpu_zero_gpt_create(mgpu_gpt_t *m, int rank, int world, mgpu_zero_gpt_t **out,
                         mgpu_err_t *err);
void mgpu_zero_gpt_destroy(mgpu_zero_gpt_t *zg);
/* After the backward: the reduce-scatter, the global gradient norm (the slices' sums of
 * squares summed over the ranks) and its clip to grad_clip (0: none), AdamW on the slice at
 * step (from 1), the all-gather, and the bf16 copy made again on the bf16 path:
 * mgpu_gpt_step's work, sharded. */
int mgpu_zero_gpt_step(mgpu_zero_gpt_t *zg, const mgpu_ddp_comm_t *comm, mgpu_gpt_t *m,
                       const mgpu_adamw_hparams_t *hp, long long step, float grad_clip,
                       mgpu_err_t *err);

/* Rank 0's startup line: the optimizer state this rank holds (floats, the measured size of
 * its allocation) beside what zero = 0 holds per rank (full, floats). */
void mgpu_zero_print_state(FILE *out, const char *who, int zero, int world, size_t floats,
                           size_t full);
/* Rank 0's line when zero = 1 trains on a GPU with cuda_graph on: its steps run eagerly. */
void mgpu_zero_print_eager(FILE *out, const char *who);

#endif
