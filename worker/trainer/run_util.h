/* run_util.h - the pieces both training loops (the MLP's, ddp.c, and the GPT's, gpt_run.c)
 * share: the clocks, small host-side collectives through backend memory, the metrics_file,
 * the checkpoint's resume-or-broadcast exchange and its write, the progress line's rates.
 *
 * Nothing here owns memory: scratch, the parameters and the optimizer state are the caller's
 * backend memory (the kernels object's), host buffers are the caller's. */
#ifndef MGPU_RUN_UTIL_H
#define MGPU_RUN_UTIL_H

#include <stddef.h> /* size_t */
#include <stdint.h> /* int32_t, uint64_t */
#include <stdio.h>  /* FILE */

#include "cfg.h"        /* mgpu_cfg_t */
#include "checkpoint.h" /* mgpu_ckpt_t */
#include "ddp.h"        /* mgpu_ddp_comm_t, mgpu_ddp_result_t */
#include "error.h"      /* mgpu_err_t */
#include "kernels.h"    /* mgpu_kernels_t */

struct cJSON; /* a metrics line: the callers build it with cJSON, this header needs no more */

/* What rank 0 tells everyone about the checkpoint before anything else. */
typedef struct mgpu_run_resume {
    int32_t status;         /* 1: resume, 0: fresh start, -1: rank 0 failed (message follows) */
    int32_t world_size;     /* of the run that wrote the checkpoint (0: unknown) */
    int32_t batch_per_rank; /* its samples a rank a batch (0: unknown) */
    uint64_t epoch, batch, step, optim_step;
    char msg[1024];
} mgpu_run_resume_t;

/* Rank 0's check that checkpoint c was written by a run like this one: 1 if it was, else 0
 * with the reason in msg (cap bytes). */
typedef int (*mgpu_run_ckpt_fits_fn)(void *ctx, const mgpu_ckpt_t *c, char *msg, size_t cap);

/* Seconds on the monotonic clock (intervals) and on the wall clock (timestamps). */
double mgpu_run_now_s(void);
double mgpu_run_realtime_s(void);

/* who ("ddp", "gpt") names the loop in messages: rank and world size in range, and the three
 * collectives present when the world size is above 1. */
int mgpu_run_check_comm(const char *who, const mgpu_ddp_comm_t *comm, mgpu_err_t *err);

/* A result before the loop: zeroed, no evaluation (NAN), no resume. */
void mgpu_run_result_init(mgpu_ddp_result_t *res);

/* Broadcast of host bytes from rank 0, and the sum (average != 0: average) of n host floats
 * over the ranks, in place, through scratch (backend memory of at least that size). Nothing
 * to do in a world of one. */
int mgpu_run_bcast_host(mgpu_kernels_t *k, const mgpu_ddp_comm_t *comm, void *scratch, void *host,
                        size_t bytes, mgpu_err_t *err);
int mgpu_run_reduce_host(mgpu_kernels_t *k, const mgpu_ddp_comm_t *comm, void *scratch, float *v,
                         size_t n, int average, mgpu_err_t *err);

/* Rank 0 with a metrics_file opens it: a fresh run (resumed_step -1) starts it anew, a resumed
 * one continues the log of the run it resumes, less the lines of steps after resumed_step
 * (logged after the checkpoint by a run that was then killed: the steps run again) and final
 * records. *f stays NULL elsewhere. The caller fcloses *f. */
int mgpu_run_metrics_open(const char *who, const mgpu_cfg_t *cfg, int rank, long long resumed_step,
                          FILE **f, mgpu_err_t *err);
/* One JSON line into *f (NULL: nothing written); obj is deleted either way. A line that cannot
 * be written (a full disk) is warned of once, naming path, and cut off the file, which is
 * closed (*f NULL): the run goes on without it. */
void mgpu_run_metrics_line(FILE **f, const char *path, struct cJSON *obj);

/* Rank 0 reads cfg->checkpoint and, if it fits (fits), loads its parameters and optimizer
 * state into params and state (backend memory, n_params and n_state floats); everyone learns
 * the outcome in h (through scratch, sizeof *h), then rank 0's parameters and, on a resume,
 * its optimizer state (on a fresh start, its initial parameters, as DDP's constructor
 * broadcasts them). A rank 0 failure fails every rank with rank 0's message. */
int mgpu_run_resume_or_broadcast(mgpu_kernels_t *k, const mgpu_ddp_comm_t *comm, void *scratch,
                                 const char *checkpoint, mgpu_run_ckpt_fits_fn fits, void *fits_ctx,
                                 float *params, size_t n_params, float *state, size_t n_state,
                                 mgpu_run_resume_t *h, mgpu_err_t *err);

/* The same, but on a resume rank 0 copies the optimizer state (n_state floats) into
 * state_host, its host memory (NULL elsewhere), and nothing broadcasts it: zero = 1 hands each
 * rank its slice of it (zero.h). The parameters are broadcast as above. */
int mgpu_run_resume_host_state(mgpu_kernels_t *k, const mgpu_ddp_comm_t *comm, void *scratch,
                               const char *checkpoint, mgpu_run_ckpt_fits_fn fits, void *fits_ctx,
                               float *params, size_t n_params, float *state_host, size_t n_state,
                               mgpu_run_resume_t *h, mgpu_err_t *err);

/* Copies the parameters and optimizer state (backend memory) into c->params and c->state
 * (host buffers of c->n_params and c->n_state floats) and writes c to path. */
int mgpu_run_checkpoint_write(mgpu_kernels_t *k, const char *path, mgpu_ckpt_t *c,
                              const float *params, const float *state, mgpu_err_t *err);

/* Rank 0's "resumed from ..." line (epoch counted from 0). */
void mgpu_run_print_resumed(FILE *out, const char *checkpoint, long long epoch, long long step);

/* A progress line's figures at step (of planned) after steps_run steps of this run since t0
 * (mgpu_run_now_s) that processed amount samples or tokens: the seconds elapsed, amount per
 * second and the seconds left at this pace. */
void mgpu_run_pace(double t0, double amount, long long planned, long long step, long long steps_run,
                   double *elapsed, double *rate, double *eta);

/* amount per second over seconds (a zero duration counts as a nanosecond). */
double mgpu_run_rate(double amount, double seconds);

/* Where a run's batches come from: its ranks, and the samples (windows) one rank takes in
 * one of the batches a checkpoint's place counts (its batch size times grad_accum; 0 in a
 * checkpoint's: unknown, taken as this run's). */
typedef struct mgpu_run_place {
    int ranks;
    long long batch_per_rank;
} mgpu_run_place_t;

/* A checkpoint's place in its epoch (batch batches done, of then's ranks and batches) as
 * batches of this run (now): as many samples seen, rounded down (a few are seen again, none
 * skipped), with the epoch's end rolling over to the next epoch (per_epoch batches now).
 * Prints what it did on rank 0's out, and leaves the place as it is when a batch of both
 * takes as many samples, or then's ranks are unknown (0). Returns 1 if it moved. */
int mgpu_run_rescale_position(FILE *out, const mgpu_run_place_t *then, const mgpu_run_place_t *now,
                              long long per_epoch, long long *epoch, long long *batch);

/* The epoch (from 0) of a loop's last step, after the loop: the one max_steps stopped in
 * (stopped, at batch of epoch), or the one before epoch where the loop ended at an epoch's
 * end, as when max_steps falls on it and stops the loop at the next epoch's batch 0. */
long long mgpu_run_last_epoch(int stopped, long long epoch, long long batch);

/* The final parameters (backend memory) into a malloc'd host copy in res. */
int mgpu_run_result_params(mgpu_kernels_t *k, const char *who, const float *params, size_t n_params,
                           mgpu_ddp_result_t *res, mgpu_err_t *err);

/* SIGUSR1 and SIGUSR2 (Slurm's --signal=USR1@60 before a time limit; mgpu-launch passes them
 * on) are held pending in every thread of the process (call before any thread starts), so
 * that they neither end the worker nor interrupt a system call: the training loop takes them
 * between steps. */
void mgpu_run_signals_hold(void);
/* After step: whether one of them came since the last call, and rank 0 is to write a
 * checkpoint now (cfg's checkpoint set, zero = 0, whose checkpoint is rank 0's alone, and
 * none just written by checkpoint_interval). Rank 0 says on out what it does; the run goes on
 * either way. 0 when none came. */
int mgpu_run_signal_checkpoint(FILE *out, const mgpu_cfg_t *cfg, int rank, long long step);

#endif
