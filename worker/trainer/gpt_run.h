/* gpt_run.h - mgpu-worker's loop for model = gpt, over the same communicator callbacks as the
 * MLP's DDP loop (ddp.h): every rank reads the token file and splits it the same way (the
 * held-out split is the tail), builds the model from seed, resumes from the checkpoint or
 * takes rank 0's parameters, then per epoch draws the DistributedSampler's shard of training
 * windows (context + 1 tokens at stride context) and per optimizer step runs grad_accum
 * micro-batches of batch_size windows, all-reduces (averages) the gradient in buckets once,
 * after the last micro-batch (DDP's no_sync), clips it to grad_clip and takes an AdamW step
 * at the warm-up + cosine learning rate. Rank 0 prints progress lines with tokens/s, writes
 * metrics_file and checkpoints; evaluation (loss and perplexity) is sharded and reduced; with
 * generate = N rank 0 finally prints N sampled tokens.
 *
 * W ranks with batch_size B see what one rank with batch_size W x B sees, and grad_accum = k
 * what a k times larger batch sees: every step's gradient is the mean over its windows. */
#ifndef MGPU_GPT_RUN_H
#define MGPU_GPT_RUN_H

#include <stdio.h> /* FILE */

#include "cfg.h"     /* mgpu_cfg_t */
#include "ddp.h"     /* mgpu_ddp_comm_t, mgpu_ddp_result_t */
#include "error.h"   /* mgpu_err_t */
#include "kernels.h" /* mgpu_kernels_t */

/* As mgpu_ddp_run, for cfg->model == MGPU_MODEL_GPT. result->eval_accuracy stays NAN;
 * result->samples_per_s counts tokens. */
int mgpu_gpt_run(mgpu_kernels_t *k, const mgpu_cfg_t *cfg, const mgpu_ddp_comm_t *comm, FILE *out,
                 mgpu_ddp_result_t *result, mgpu_err_t *err);

#endif
