/* optim.h - the optimizers over one flat parameter buffer: torch.optim.SGD (momentum,
 * dampening, nesterov, weight decay) and torch.optim.AdamW, through kernels.h.
 *
 * State is one contiguous buffer of n_state floats in backend memory (SGD with momentum: the
 * momentum buffer, n floats; AdamW: exp_avg then exp_avg_sq, 2n floats; plain SGD: none),
 * plus the step count, so a checkpoint saves it as one array.
 *
 * An optimizer may own a slice of the parameters only (ZeRO-1, zero.h): it then updates
 * params[off, off + n) from grads[off, off + n) and its state holds that slice's values (its
 * arrays n floats each), so each rank keeps 1 / world of the state.
 *
 * Ownership: mgpu_optim_create returns an object freed with mgpu_optim_destroy, before the
 * kernels object. */
#ifndef MGPU_OPTIM_H
#define MGPU_OPTIM_H

#include <stddef.h> /* size_t */

#include "error.h"   /* mgpu_err_t */
#include "kernels.h" /* mgpu_kernels_t */

typedef enum mgpu_optim_kind { MGPU_OPTIM_SGD = 0, MGPU_OPTIM_ADAMW = 1 } mgpu_optim_kind_t;

typedef struct mgpu_optim_spec {
    mgpu_optim_kind_t kind;
    float lr, weight_decay;
    float momentum, dampening; /* SGD */
    int nesterov;              /* SGD */
    float beta1, beta2, eps;   /* AdamW */
} mgpu_optim_spec_t;

typedef struct mgpu_optim {
    mgpu_kernels_t *k;
    mgpu_optim_spec_t spec;
    size_t off;     /* the first parameter it updates (0 unless a slice) */
    size_t n;       /* parameters it updates, from off */
    size_t n_state; /* floats in state: mgpu_optim_state_arrays x n */
    float *state;   /* backend memory, zeroed at creation */
    long long step; /* updates done so far */
} mgpu_optim_t;

const char *mgpu_optim_name(mgpu_optim_kind_t kind);
int mgpu_optim_parse(const char *s); /* "sgd", "adamw"; -1 when unknown */

/* Checks the hyper-parameters (the same rules as the kernels, reported before the first
 * step) and allocates the state for n parameters. */
int mgpu_optim_create(mgpu_kernels_t *k, const mgpu_optim_spec_t *spec, size_t n,
                      mgpu_optim_t **out, mgpu_err_t *err);
/* The same for the slice [off, off + n) of the parameters: state for those n only. */
int mgpu_optim_create_slice(mgpu_kernels_t *k, const mgpu_optim_spec_t *spec, size_t off, size_t n,
                            mgpu_optim_t **out, mgpu_err_t *err);
void mgpu_optim_destroy(mgpu_optim_t *o);
/* The arrays of state per parameter: AdamW 2 (exp_avg, exp_avg_sq), SGD with momentum 1,
 * plain SGD 0. State is that many arrays of n floats, one after the other. */
int mgpu_optim_state_arrays(const mgpu_optim_spec_t *spec);
/* One update of params from grads (the whole buffers, backend memory: a slice updates its
 * floats [off, off + n) only); step becomes step + 1. */
int mgpu_optim_step(mgpu_optim_t *o, float *params, const float *grads, mgpu_err_t *err);

#endif
