/* train.h - the trainer's building blocks between a cfg and the math: the data sets a cfg
 * describes, the model and optimizer it asks for, DDP's gradient buckets, one training step
 * and an evaluation pass. mgpu-worker's loop (DDP over libmgpu's collectives, DP over
 * threads) is made of these; tests drive them single-process or with simulated ranks.
 *
 * The gradient all-reduce is a callback, so this module does not depend on a communicator:
 * DDP passes one that calls mgpu_allreduce_f32(comm, buf, count, MGPU_AVG, ...), a single
 * process passes NULL.
 *
 * Ownership: mgpu_trainer_create returns an object freed with mgpu_trainer_destroy; it owns
 * its model, optimizer and batch buffers, not the kernels object or the data sets. */
#ifndef MGPU_TRAIN_H
#define MGPU_TRAIN_H

#include <stddef.h> /* size_t */
#include <stdint.h> /* int32_t */

#include "cfg.h"     /* mgpu_cfg_t */
#include "data.h"    /* mgpu_dataset_t */
#include "error.h"   /* mgpu_err_t */
#include "kernels.h" /* mgpu_kernels_t */
#include "mgpu.h"    /* mgpu_ctx_t, mgpu_progress_phase */
#include "model.h"   /* mgpu_model_t */
#include "optim.h"   /* mgpu_optim_t */

/* Leaves in buf[0..count) the average of buf over all ranks (backend memory). */
typedef int (*mgpu_reduce_fn)(void *ctx, float *buf, size_t count, mgpu_err_t *err);

/* A slice of the flat gradient buffer that is all-reduced as one message. */
typedef struct mgpu_bucket {
    size_t offset, count; /* in floats */
} mgpu_bucket_t;

typedef struct mgpu_trainer {
    mgpu_kernels_t *k;
    mgpu_model_t *model;
    mgpu_optim_t *optim;
    int max_batch;
    int n_buckets;
    mgpu_bucket_t *buckets; /* in all-reduce order: last parameters first */
    int *bucket_layer;      /* per bucket: the layer whose backward completes it */
    int bucket_overlap;     /* cfg's: launch buckets from backward's hooks (GPU) */
    float *h_x, *h_t;       /* host staging for one batch */
    int32_t *h_l;
    float *d_x, *d_t; /* the batch in backend memory */
    int32_t *d_l;
    mgpu_ctx_t *progress; /* the phases of a step are published there; NULL: nowhere */
} mgpu_trainer_t;

/* The data sets of the cfg: generated (random, synthetic) or loaded (npy), then split into
 * train and eval by eval_fraction with data_seed (eval is empty when it is 0). */
int mgpu_train_load_data(const mgpu_cfg_t *cfg, mgpu_dataset_t *train, mgpu_dataset_t *eval,
                         mgpu_err_t *err);
/* The model the cfg asks for over data shaped like ds. */
void mgpu_train_model_spec(const mgpu_cfg_t *cfg, const mgpu_dataset_t *ds,
                           mgpu_model_spec_t *spec);
void mgpu_train_optim_spec(const mgpu_cfg_t *cfg, mgpu_optim_spec_t *spec);

/* DDP's buckets over n_params floats: parameters in reverse order (the order backward makes
 * their gradients), each layer's weight and bias kept whole, a bucket closed once it reaches
 * bucket_mb MiB; the first one closes at 1 MiB, as PyTorch's first bucket does
 * (dist._DEFAULT_FIRST_BUCKET_BYTES), so the first all-reduce starts early. *out is malloc'd. */
int mgpu_train_buckets(const mgpu_model_t *m, double bucket_mb, mgpu_bucket_t **out, int *n,
                       mgpu_err_t *err);

/* For each of the nb buckets, the layer after whose backward it is complete (layers run last
 * to first, so that is the lowest layer owning any of its floats): ready[b]. The values never
 * increase along the buckets, which is what lets DDP launch bucket b's all-reduce from the
 * backward hook of layer ready[b] while the layers below are still computing. */
int mgpu_train_bucket_layers(const mgpu_model_t *m, const mgpu_bucket_t *b, int nb, int *ready,
                             mgpu_err_t *err);

/* Whether a GPU may capture the whole step in a CUDA graph and replay it: 1 yes, 0 no (why,
 * when not NULL, says which condition failed). A replay repeats the captured launches with
 * their arguments frozen, so: cuda_graph on, every step a full batch of batch_size rows
 * (drop_last_batch, or a batch size dividing rank_samples, this rank's samples per epoch).
 * Both optimizers qualify: SGD's arguments are the same after the first step (which runs
 * eagerly), and the CUDA backend keeps AdamW's step number in device memory. */
int mgpu_train_graph_eligible(const mgpu_cfg_t *cfg, size_t rank_samples, char *why,
                              size_t why_len);

/* Model (initialised from seed), optimizer, buckets and batch buffers for batches up to
 * max_batch rows of data shaped like ds. With cfg->zero the optimizer is left NULL: the caller
 * makes the one of its rank's slice (zero.h). */
int mgpu_trainer_create(mgpu_kernels_t *k, const mgpu_cfg_t *cfg, const mgpu_dataset_t *ds,
                        int max_batch, uint64_t seed, mgpu_trainer_t **out, mgpu_err_t *err);
void mgpu_trainer_destroy(mgpu_trainer_t *t);

/* Gather rows idx[0..count) of ds into the batch buffers, forward and backward: the batch
 * gradient in t->model->grads, its loss in t->model->scalars[0]. */
int mgpu_trainer_grads(mgpu_trainer_t *t, const mgpu_dataset_t *ds, const size_t *idx, size_t count,
                       mgpu_err_t *err);

/* One step: gather rows idx[0..count) of ds, forward, backward, the all-reduce of each
 * bucket through reduce (NULL: a single process), optimizer update. *loss (may be NULL)
 * receives this rank's batch loss; reading it synchronises a GPU. */
int mgpu_trainer_step(mgpu_trainer_t *t, const mgpu_dataset_t *ds, const size_t *idx, size_t count,
                      mgpu_reduce_fn reduce, void *ctx, float *loss, mgpu_err_t *err);

/* Forward over rows [start, start + count) of ds: *loss_sum = sum of per-sample losses
 * (batch mean x batch rows), *correct = correct predictions (cross-entropy; 0 for mse).
 * Sums, so ranks can all-reduce them and divide by the total count. */
int mgpu_trainer_evaluate(mgpu_trainer_t *t, const mgpu_dataset_t *ds, size_t start, size_t count,
                          double *loss_sum, double *correct, mgpu_err_t *err);

#endif
