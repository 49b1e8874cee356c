/* backward_order.c - the backward's order (backward_order.h). */
#include "backward_order.h"

static void put(mgpu_backward_step_t *steps, int *n, mgpu_backward_op_t op, int layer)
{
    steps[*n].op = op;
    steps[*n].layer = layer;
    (*n)++;
}

int mgpu_backward_order_build(int n_layers, int top_done, int hooked, mgpu_backward_step_t *steps)
{
    int n = 0, deferred = -1;
    for (int l = n_layers - 1; l >= 0; l--) {
        if (top_done && l == n_layers - 1 && l > 0) {
            deferred = l; /* its input gradient is done: on to the layer below */
            continue;
        }
        const int joined = hooked || l != 1;
        if (joined && deferred >= 0)
            put(steps, &n, MGPU_BACKWARD_WGRAD, deferred);
        if (joined)
            put(steps, &n, MGPU_BACKWARD_WGRAD, l);
        if (l > 0)
            put(steps, &n, MGPU_BACKWARD_DGRAD, l);
        if (!joined && deferred >= 0)
            put(steps, &n, MGPU_BACKWARD_WGRAD, deferred);
        if (!joined)
            put(steps, &n, MGPU_BACKWARD_WGRAD, l);
        /* All of this layer's gradients are done before its hook's all-reduce reads them and
         * before its dz is overwritten. */
        if (joined)
            put(steps, &n, MGPU_BACKWARD_JOIN, l);
        if (hooked && deferred >= 0)
            put(steps, &n, MGPU_BACKWARD_HOOK, deferred);
        deferred = -1;
        if (hooked)
            put(steps, &n, MGPU_BACKWARD_HOOK, l);
    }
    return n;
}
