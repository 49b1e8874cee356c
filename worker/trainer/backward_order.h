/* backward_order.h - the order in which a training step's backward queues its work: each layer's
 * weight gradient (WGRAD), its input gradient (DGRAD, the dz of the layer below), the joins
 * of the backend's side streams (JOIN) and the per-layer hooks that launch a bucket's
 * all-reduce (HOOK). The model executes this list and decides nothing about it, so its code
 * holds no device rule; on the CPU backend JOIN is a no-op and the order changes no bits (the
 * ops of one layer write disjoint buffers).
 *
 * Why an order at all: a small weight gradient runs on a side stream of the CUDA backend
 * (kernels/schedule.cu) beside whatever is queued after it until the next JOIN. A layer
 * followed by a join queues its weight gradient first, beside its input gradient. The layer
 * whose join is skipped (layer 1 when nothing hooks the layers) queues its input gradient
 * first - the step's chain - and its weight gradients then run beside the first layer's
 * instead of delaying that chain: the first layer's weight gradient reads neither layer 1's
 * dz nor its gradients, and nothing writes that dz after it. With top_done (mgpu_k_linear_loss
 * already wrote the output layer's input gradient) the output layer's weight gradient is
 * deferred to the layer below, to run beside that layer's products, joined and hooked with
 * them (its hook first).
 *
 * Pure: no allocation, no device; the caller owns the array. */
#ifndef MGPU_BACKWARD_ORDER_H
#define MGPU_BACKWARD_ORDER_H

typedef enum {
    MGPU_BACKWARD_WGRAD,
    MGPU_BACKWARD_DGRAD,
    MGPU_BACKWARD_JOIN,
    MGPU_BACKWARD_HOOK
} mgpu_backward_op_t;

typedef struct mgpu_backward_step {
    mgpu_backward_op_t op;
    int layer; /* WGRAD, DGRAD, HOOK: the layer; JOIN: the layer whose step it ends */
} mgpu_backward_step_t;

/* At most this many steps for n layers: two weight gradients, an input gradient, a join and
 * two hooks a layer. */
#define MGPU_BACKWARD_ORDER_MAX_STEPS(n) (6 * (n))

/* The backward of n_layers layers (>= 1), from the output layer down, into steps (room for
 * MGPU_BACKWARD_ORDER_MAX_STEPS(n_layers)): top_done as above, hooked when the caller runs a hook
 * after each layer. Returns the number of steps. */
int mgpu_backward_order_build(int n_layers, int top_done, int hooked, mgpu_backward_step_t *steps);

#endif
