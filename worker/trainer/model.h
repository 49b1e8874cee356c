/* model.h - the trainer's networks: a stack of linear layers (one for "linear", several with
 * an activation between them for "mlp"), their loss, forward and backward through kernels.h.
 *
 * Parameters live in ONE contiguous buffer and gradients in another of the same layout, in
 * PyTorch's parameters() order: layer 0 weight [out, in] row-major, layer 0 bias [out],
 * layer 1 weight, ... So a gradient bucket for the all-reduce is a slice (offset, count) of
 * the gradient buffer, a broadcast of the parameters is one call, and a checkpoint is one
 * array. Both buffers, the activations and the scratch space are backend memory, allocated
 * once for at most max_batch rows; nothing allocates during a step.
 *
 * Ownership: mgpu_model_create returns a model the caller frees with mgpu_model_destroy
 * (before the kernels object it was created with). Pointers returned by the model stay valid
 * until the next forward on it or its destruction. */
#ifndef MGPU_MODEL_H
#define MGPU_MODEL_H

#include <stddef.h> /* size_t */
#include <stdint.h> /* int32_t, uint64_t */

#include "error.h"   /* mgpu_err_t */
#include "kernels.h" /* mgpu_kernels_t, mgpu_act_t, mgpu_loss_t */
#include "mgpu.h"    /* mgpu_ctx_t: progress */

#define MGPU_MODEL_MAX_LAYERS 17 /* 16 hidden layers and the output layer */

typedef struct mgpu_model_spec {
    int inputs;   /* features per sample */
    int outputs;  /* classes (cross-entropy) or target size (mse) */
    int n_hidden; /* 0: one Linear(inputs -> outputs) */
    int hidden[MGPU_MODEL_MAX_LAYERS - 1];
    mgpu_act_t activation; /* between layers; the output layer has none (logits) */
    mgpu_loss_t loss;
} mgpu_model_spec_t;

typedef struct mgpu_layer {
    int in, out;
    size_t w_off, b_off; /* offsets of weight [out, in] and bias [out] in params/grads */
    mgpu_act_t act;      /* after this layer: the spec's activation, identity for the last */
} mgpu_layer_t;

typedef struct mgpu_model {
    mgpu_kernels_t *k;
    mgpu_model_spec_t spec;
    int n_layers;
    mgpu_layer_t layers[MGPU_MODEL_MAX_LAYERS];
    size_t n_params;
    float *params, *grads; /* n_params floats each, backend memory */
    int max_batch;
    /* z[l]: layer l's pre-activation; y[l]: its output (== z[l] when act is identity). */
    float *z[MGPU_MODEL_MAX_LAYERS], *y[MGPU_MODEL_MAX_LAYERS];
    /* aux[l]: what a fused backend keeps from layer l's forward for backward (a relu mask;
     * mgpu_k_linear_forward). With a fused backend z[l] may stay unwritten for relu. */
    void *aux[MGPU_MODEL_MAX_LAYERS];
    float *dy_a, *dy_b; /* backward scratch, max_batch * widest layer each */
    float *dy_top;      /* dLoss/dlogits, max_batch * outputs (mgpu_model_grads_hooked) */
    float *scalars;     /* [0] loss, [1] correct count */
    int last_batch;     /* rows of the last forward */
    /* An input its owner never writes after setting this (the GPU step's data set when a step
     * reads it in place): forward does not call mgpu_k_written for it, so a backend may keep
     * what it derived from it (bf16 mode's copy) from one step to the next. NULL: none. */
    const float *x_kept;
    /* Where the gradient's pass says its backward began (after the output layer, whose forward
     * is fused with its loss and gradient); NULL: nowhere. The CPU step sets it; the GPU step
     * leaves it NULL, as its host only queues the work. */
    mgpu_ctx_t *progress;
} mgpu_model_t;

const char *mgpu_loss_name(mgpu_loss_t loss);
int mgpu_loss_parse(const char *s); /* "mse", "cross_entropy"; -1 when unknown */

/* Checks the spec (sizes >= 1, activation and loss known), lays out the parameters and
 * allocates everything for batches up to max_batch rows. Parameters start at zero: call
 * mgpu_model_init. */
int mgpu_model_create(mgpu_kernels_t *k, const mgpu_model_spec_t *spec, int max_batch,
                      mgpu_model_t **out, mgpu_err_t *err);
void mgpu_model_destroy(mgpu_model_t *m);

/* nn.Linear's default init from seed: weights kaiming_uniform_(a=sqrt(5)), i.e. uniform in
 * +-1/sqrt(fan_in), and biases uniform in +-1/sqrt(fan_in), drawn with mgpu_rng (the same
 * distributions as PyTorch, not the same bits). Every rank given one seed gets the same
 * parameters, before the broadcast from rank 0 makes sure of it. */
int mgpu_model_init(mgpu_model_t *m, uint64_t seed, mgpu_err_t *err);

/* Forward of batch rows of x [batch, inputs] (backend memory); *out receives the output
 * [batch, outputs] (backend memory owned by the model). */
int mgpu_model_forward(mgpu_model_t *m, const float *x, int batch, const float **out,
                       mgpu_err_t *err);

/* Loss of the last forward and its gradient, then backward into m->grads (overwritten, not
 * accumulated). labels [batch] int32 for cross-entropy, targets [batch, outputs] for mse
 * (backend memory; the other may be NULL). The loss is the mean over the batch, as PyTorch's
 * default reduction; it stays in backend memory at m->scalars[0] (read it with
 * mgpu_model_read_scalars, which synchronises). */
int mgpu_model_backward(mgpu_model_t *m, const float *x, const int32_t *labels,
                        const float *targets, mgpu_err_t *err);

/* Called by mgpu_model_backward_hooked once layer `layer`'s weight and bias gradients are
 * queued (layers go last to first): DDP starts the all-reduce of every bucket that layer
 * completes, so communication overlaps the backward of the layers below it. */
typedef int (*mgpu_model_layer_hook)(void *ctx, int layer, mgpu_err_t *err);

/* mgpu_model_backward, calling hook (may be NULL) after each layer's gradients. */
int mgpu_model_backward_hooked(mgpu_model_t *m, const float *x, const int32_t *labels,
                               const float *targets, mgpu_model_layer_hook hook, void *hook_ctx,
                               mgpu_err_t *err);

/* Loss (and, for cross-entropy, the number of correct predictions into m->scalars[1]) of the
 * last forward, without gradients: evaluation. */
int mgpu_model_eval_loss(mgpu_model_t *m, const int32_t *labels, const float *targets,
                         mgpu_err_t *err);

/* Copies m->scalars to the host: loss and correct count. */
int mgpu_model_read_scalars(mgpu_model_t *m, float *loss, float *correct, mgpu_err_t *err);

/* forward + loss + backward of batch rows: the training step's gradient, calling hook (may be
 * NULL) after each layer's gradients, as mgpu_model_backward_hooked. The output layer, the
 * loss and the output layer's input gradient are one mgpu_k_linear_loss (one kernel on a GPU
 * for narrow outputs); that layer's weight gradient then runs beside the layer below's
 * products, and its hook comes right before that layer's. Afterwards, as after forward and
 * backward: the logits in the last layer's y, the loss in m->scalars[0]. */
int mgpu_model_grads_hooked(mgpu_model_t *m, const float *x, const int32_t *labels,
                            const float *targets, int batch, mgpu_model_layer_hook hook,
                            void *hook_ctx, mgpu_err_t *err);

/* forward + backward: the gradient of one batch, the unit DDP averages
 * (mgpu_model_grads_hooked without a hook). */
int mgpu_model_compute_grads(mgpu_model_t *m, const float *x, const int32_t *labels,
                             const float *targets, int batch, mgpu_err_t *err);

/* FNV-1a over the layer shapes, activation and loss: a checkpoint records it so a run never
 * resumes into a different network. */
uint64_t mgpu_model_shape_hash(const mgpu_model_t *m);

#endif
