/* dp.h - mode = dp: torch.nn.DataParallel, the article's Method 1, in one process.
 *
 * One thread per device (on a CPU the threads stand in for devices). Every step, as
 * DataParallel does: the batch of batch_size samples (one DataLoader over the whole data set,
 * shuffled with seed + epoch) is scattered in torch.chunk pieces of ceil(B / n) rows (so
 * B = 30 on 4 devices gives 8, 8, 8, 6, and B = 2 leaves devices 2 and 3 idle), each replica
 * runs forward and backward on its piece, the gradients are gathered and summed on device 0
 * (each weighted by its share of the batch, so the result is the gradient of the mean loss over
 * the whole batch), device 0 steps the optimizer and replicates the parameters to the others.
 * Device 0 also evaluates. The report shows how much more device 0 does: the imbalance the
 * article describes.
 *
 * Gradients and parameters travel through host memory between devices (the portable path of
 * kernels.h); a CUDA backend would use peer copies. Checkpoints are not written in
 * this mode: a cfg with checkpoint set is refused rather than silently not saved. */
#ifndef MGPU_DP_H
#define MGPU_DP_H

#include <stdio.h> /* FILE */

#include "cfg.h"     /* mgpu_cfg_t */
#include "ddp.h"     /* mgpu_ddp_result_t */
#include "error.h"   /* mgpu_err_t */
#include "kernels.h" /* mgpu_kbackend_t */

#define MGPU_DP_MAX_DEVICES 64

typedef struct mgpu_dp_device_stats {
    long long samples; /* rows of all its chunks */
    double compute_s;  /* forward + backward of its chunks */
    double extra_s;    /* device 0 only: gather + sum, optimizer step, replicate, evaluate */
} mgpu_dp_device_stats_t;

typedef struct mgpu_dp_result {
    mgpu_ddp_result_t run; /* steps, losses, accuracy, samples/s, final parameters */
    int n_devices;
    mgpu_dp_device_stats_t dev[MGPU_DP_MAX_DEVICES];
} mgpu_dp_result_t;

/* Runs cfg on n_devices devices of backend (device i is ordinal i); prints rank 0-style
 * progress, the article's demo lines (every replica's "In Model", then "Outside") and the
 * per-device report to out (NULL: stdout). progress (may be NULL) gets the steps and phases
 * of device 0, whose thread drives the step (mgpu_progress_step). result may be NULL;
 * result->run.params is malloc'd for the caller. */
int mgpu_dp_run(mgpu_kbackend_t backend, const mgpu_cfg_t *cfg, int n_devices, FILE *out,
                mgpu_ctx_t *progress, mgpu_dp_result_t *result, mgpu_err_t *err);

#endif
