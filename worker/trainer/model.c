/* model.c - linear/MLP forward and backward as a sequence of kernels.h calls: per layer one
 * fused linear forward (GEMM, bias, activation); backward per layer a weight-gradient GEMM
 * with the bias gradient, and an input-gradient GEMM with the activation backward of the layer
 * below and that layer's bias gradient (mgpu_k_linear_*: one cuBLASLt call each on a GPU,
 * the same GEMM + elementwise + column-sum ops as before on the CPU). */
#include "model.h"

#include <errno.h>   /* EINVAL, ENOMEM */
#include <math.h>    /* sqrt */
#include <stdlib.h>  /* calloc, free */
#include <strings.h> /* strcasecmp */

#include "rng.h"            /* mgpu_rng_seed2, mgpu_rng_uniform */
#include "backward_order.h" /* mgpu_backward_order_build: the order of the backward's ops */

/* Streams of mgpu_rng_seed2 for one user seed: parameter init draws from its own. */
#define RNG_STREAM_INIT 2

const char *mgpu_loss_name(mgpu_loss_t loss)
{
    return loss == MGPU_LOSS_MSE ? "mse" : loss == MGPU_LOSS_CROSS_ENTROPY ? "cross_entropy" : "?";
}

int mgpu_loss_parse(const char *s)
{
    if (strcasecmp(s, "mse") == 0)
        return MGPU_LOSS_MSE;
    if (strcasecmp(s, "cross_entropy") == 0)
        return MGPU_LOSS_CROSS_ENTROPY;
    return -1;
}

static int check_spec(const mgpu_model_spec_t *s, int max_batch, mgpu_err_t *err)
{
    if (s->inputs < 1 || s->outputs < 1)
        return mgpu_err_set(err, -EINVAL, "model: %d inputs and %d outputs, expected >= 1 each",
                            s->inputs, s->outputs);
    if (s->n_hidden < 0 || s->n_hidden > MGPU_MODEL_MAX_LAYERS - 1)
        return mgpu_err_set(err, -EINVAL, "model: %d hidden layers, expected 0..%d", s->n_hidden,
                            MGPU_MODEL_MAX_LAYERS - 1);
    for (int i = 0; i < s->n_hidden; i++)
        if (s->hidden[i] < 1)
            return mgpu_err_set(err, -EINVAL, "model: hidden layer %d has %d units, expected >= 1",
                                i, s->hidden[i]);
    if ((unsigned)s->activation >= MGPU_ACT_COUNT)
        return mgpu_err_set(err, -EINVAL, "model: activation %d unknown", (int)s->activation);
    if (s->loss != MGPU_LOSS_MSE && s->loss != MGPU_LOSS_CROSS_ENTROPY)
        return mgpu_err_set(err, -EINVAL, "model: loss %d, expected mse or cross_entropy",
                            (int)s->loss);
    if (s->loss == MGPU_LOSS_CROSS_ENTROPY && s->outputs < 2)
        return mgpu_err_set(
            err, -EINVAL, "model: cross_entropy over %d class, expected >= 2 classes", s->outputs);
    if (max_batch < 1)
        return mgpu_err_set(err, -EINVAL, "model: max_batch %d, expected >= 1", max_batch);
    return 0;
}

void mgpu_model_destroy(mgpu_model_t *m)
{
    if (m == NULL)
        return;
    for (int l = 0; l < m->n_layers; l++) {
        if (m->y[l] != m->z[l])
            mgpu_k_free(m->k, m->y[l]);
        mgpu_k_free(m->k, m->z[l]);
        mgpu_k_free(m->k, m->aux[l]);
    }
    mgpu_k_free(m->k, m->params);
    mgpu_k_free(m->k, m->grads);
    mgpu_k_free(m->k, m->dy_a);
    mgpu_k_free(m->k, m->dy_b);
    mgpu_k_free(m->k, m->dy_top);
    mgpu_k_free(m->k, m->scalars);
    free(m);
}

static int alloc_floats(mgpu_kernels_t *k, size_t n, float **out, mgpu_err_t *err)
{
    void *p = NULL;
    int rc = mgpu_k_alloc(k, n * sizeof(float), &p, err);
    *out = p;
    if (rc == 0)
        rc = mgpu_k_zero(k, p, n * sizeof(float), err);
    return rc;
}

int mgpu_model_create(mgpu_kernels_t *k, const mgpu_model_spec_t *spec, int max_batch,
                      mgpu_model_t **out, mgpu_err_t *err)
{
    mgpu_model_t *m;
    int rc, widest;
    size_t off = 0;

    *out = NULL;
    if ((rc = check_spec(spec, max_batch, err)) < 0)
        return rc;
    m = calloc(1, sizeof *m);
    if (m == NULL)
        return mgpu_err_set(err, -ENOMEM, "model: calloc(%zu) failed", sizeof *m);
    m->k = k;
    m->spec = *spec;
    m->max_batch = max_batch;
    m->n_layers = spec->n_hidden + 1;
    widest = spec->inputs;
    for (int l = 0; l < m->n_layers; l++) {
        mgpu_layer_t *ly = &m->layers[l];
        ly->in = l == 0 ? spec->inputs : spec->hidden[l - 1];
        ly->out = l == spec->n_hidden ? spec->outputs : spec->hidden[l];
        ly->act = l == spec->n_hidden ? MGPU_ACT_IDENTITY : spec->activation;
        ly->w_off = off;
        off += (size_t)ly->out * ly->in;
        ly->b_off = off;
        off += (size_t)ly->out;
        widest = ly->out > widest ? ly->out : widest;
    }
    m->n_params = off;
    if ((rc = alloc_floats(k, off, &m->params, err)) < 0 ||
        (rc = alloc_floats(k, off, &m->grads, err)) < 0 ||
        (rc = alloc_floats(k, (size_t)max_batch * widest, &m->dy_a, err)) < 0 ||
        (rc = alloc_floats(k, (size_t)max_batch * widest, &m->dy_b, err)) < 0 ||
        (rc = alloc_floats(k, (size_t)max_batch * spec->outputs, &m->dy_top, err)) < 0 ||
        (rc = alloc_floats(k, 2, &m->scalars, err)) < 0)
        goto fail;
    for (int l = 0; l < m->n_layers; l++) {
        size_t n = (size_t)max_batch * m->layers[l].out;
        if ((rc = alloc_floats(k, n, &m->z[l], err)) < 0)
            goto fail;
        m->y[l] = m->z[l];
        if (m->layers[l].act != MGPU_ACT_IDENTITY && (rc = alloc_floats(k, n, &m->y[l], err)) < 0)
            goto fail;
        /* Only a GPU backend fuses, and only a hidden layer's mask is read back. */
        if (k->backend != MGPU_KBACKEND_CPU && m->layers[l].act != MGPU_ACT_IDENTITY &&
            (rc = mgpu_k_alloc(k, mgpu_k_linear_aux_bytes(max_batch, m->layers[l].out), &m->aux[l],
                               err)) < 0)
            goto fail;
    }
    *out = m;
    return 0;
fail:
    mgpu_model_destroy(m);
    return rc;
}

int mgpu_model_init(mgpu_model_t *m, uint64_t seed, mgpu_err_t *err)
{
    mgpu_rng_t rng;
    float *host = malloc(sizeof(float) * m->n_params);
    int rc;

    if (host == NULL)
        return mgpu_err_set(err, -ENOMEM, "model: malloc(%zu) for init failed",
                            sizeof(float) * m->n_params);
    mgpu_rng_seed2(&rng, seed, RNG_STREAM_INIT);
    for (int l = 0; l < m->n_layers; l++) {
        const mgpu_layer_t *ly = &m->layers[l];
        /* kaiming_uniform_(a=sqrt(5)): gain sqrt(2 / (1 + 5)), bound gain * sqrt(3 / fan_in)
         * = 1 / sqrt(fan_in); the bias uses the same bound. */
        double bound = 1.0 / sqrt((double)ly->in);
        for (size_t i = 0; i < (size_t)ly->out * ly->in; i++)
            host[ly->w_off + i] = (float)((2.0 * mgpu_rng_uniform(&rng) - 1.0) * bound);
        for (int i = 0; i < ly->out; i++)
            host[ly->b_off + i] = (float)((2.0 * mgpu_rng_uniform(&rng) - 1.0) * bound);
    }
    rc = mgpu_k_copy_to_device(m->k, m->params, host, sizeof(float) * m->n_params, err);
    free(host);
    return rc;
}

/* The forward of layers 0 .. n - 1. */
static int forward_layers(mgpu_model_t *m, const float *x, int batch, int n, mgpu_err_t *err)
{
    const float *in = x;
    int rc;

    if (batch < 1 || batch > m->max_batch)
        return mgpu_err_set(err, -EINVAL, "model: batch of %d rows, expected 1..%d", batch,
                            m->max_batch);
    /* The batch comes from outside the backend's ops (the step's gather, a copy). */
    if (x != m->x_kept &&
        (rc = mgpu_k_written(m->k, x, sizeof(float) * (size_t)batch * m->spec.inputs, err)) < 0)
        return rc;
    for (int l = 0; l < n; l++) {
        const mgpu_layer_t *ly = &m->layers[l];
        /* z = in . W^T (W is [out, in] as nn.Linear stores it), then z += b, y = act(z). */
        rc = mgpu_k_linear_forward(m->k, ly->act, batch, ly->out, ly->in, in, m->params + ly->w_off,
                                   m->params + ly->b_off, m->z[l], m->y[l], m->aux[l], err);
        if (rc < 0)
            return rc;
        in = m->y[l];
    }
    m->last_batch = batch;
    return 0;
}

int mgpu_model_forward(mgpu_model_t *m, const float *x, int batch, const float **out,
                       mgpu_err_t *err)
{
    int rc = forward_layers(m, x, batch, m->n_layers, err);
    if (rc == 0 && out != NULL)
        *out = m->y[m->n_layers - 1];
    return rc;
}

static int check_loss_inputs(const mgpu_model_t *m, const int32_t *labels, const float *targets,
                             mgpu_err_t *err)
{
    if (m->spec.loss == MGPU_LOSS_CROSS_ENTROPY && labels == NULL)
        return mgpu_err_set(err, -EINVAL, "model: cross_entropy needs labels, got NULL");
    if (m->spec.loss == MGPU_LOSS_MSE && targets == NULL)
        return mgpu_err_set(err, -EINVAL, "model: mse needs targets, got NULL");
    return 0;
}

static int loss_forward(mgpu_model_t *m, const int32_t *labels, const float *targets, float *dout,
                        mgpu_err_t *err)
{
    const float *logits = m->y[m->n_layers - 1];
    int batch = m->last_batch;

    if (batch < 1)
        return mgpu_err_set(err, -EINVAL, "model: loss before any forward");
    int rc = check_loss_inputs(m, labels, targets, err);
    if (rc < 0)
        return rc;
    if (m->spec.loss == MGPU_LOSS_CROSS_ENTROPY)
        return mgpu_k_softmax_xent(m->k, batch, m->spec.outputs, logits, labels, &m->scalars[0],
                                   dout, err);
    return mgpu_k_mse(m->k, batch, m->spec.outputs, logits, targets, &m->scalars[0], dout, err);
}

int mgpu_model_eval_loss(mgpu_model_t *m, const int32_t *labels, const float *targets,
                         mgpu_err_t *err)
{
    int rc = loss_forward(m, labels, targets, NULL, err);
    if (rc == 0 && m->spec.loss == MGPU_LOSS_CROSS_ENTROPY)
        rc = mgpu_k_count_correct(m->k, m->last_batch, m->spec.outputs, m->y[m->n_layers - 1],
                                  labels, &m->scalars[1], err);
    return rc;
}

int mgpu_model_backward(mgpu_model_t *m, const float *x, const int32_t *labels,
                        const float *targets, mgpu_err_t *err)
{
    return mgpu_model_backward_hooked(m, x, labels, targets, NULL, NULL, err);
}

/* dW [out, in] of layer l = dz^T [out, batch] . in [batch, in]; db [out] = column sums of dz,
 * here only for the output layer (the input gradient of the layer above writes the others)
 * and for the layer below it when mgpu_k_linear_loss left that (bias_left). */
static int weight_grad(mgpu_model_t *m, int l, const float *dz, const float *x, int bias_left,
                       mgpu_err_t *err)
{
    const mgpu_layer_t *ly = &m->layers[l];
    int top = l == m->n_layers - 1 && ly->act == MGPU_ACT_IDENTITY;
    int bias_here = top || (bias_left && l == m->n_layers - 2);
    return mgpu_k_linear_backward_weight(m->k, m->last_batch, ly->out, ly->in, dz,
                                         l > 0 ? m->y[l - 1] : x, m->grads + ly->w_off,
                                         bias_here ? m->grads + ly->b_off : NULL, err);
}

/* The backward from the output layer down, d holding dz of the output layer, in the order
 * backward_order.h gives (where the joins and hooks go is decided there, not here). With top_done,
 * the output layer's input gradient is already in dy_a (mgpu_k_linear_loss); with bias_left
 * too, mgpu_k_linear_loss left the layer below's bias gradient to that layer's weight-gradient
 * op. */
static int backward_layers(mgpu_model_t *m, const float *x, float *d, int top_done, int bias_left,
                           mgpu_model_layer_hook hook, void *hook_ctx, mgpu_err_t *err)
{
    int batch = m->last_batch, rc = 0, top = m->n_layers - 1;
    const mgpu_layer_t *lt = &m->layers[top];
    /* (never for the models built here: the output layer is identity) */
    if (lt->act != MGPU_ACT_IDENTITY) {
        rc = mgpu_k_act_backward(m->k, lt->act, (size_t)batch * lt->out, m->z[top], m->y[top], d, d,
                                 err);
        if (rc == 0)
            rc = mgpu_k_sum_rows(m->k, batch, lt->out, d, 0.0f, m->grads + lt->b_off, err);
        if (rc < 0)
            return rc;
    }
    /* dz[l]: dz of layer l, the two buffers taken in turn down the layers (the output layer's
     * input gradient, with top_done, already in dy_a). dz[l - 1] is what layer l's input
     * gradient writes. */
    float *dz[MGPU_MODEL_MAX_LAYERS];
    float *other = top_done ? m->dy_a : m->dy_b;
    for (int l = top; l >= 0; l--) {
        dz[l] = d;
        if (top_done && l == top && l > 0) {
            d = other;
            other = m->dy_b;
            continue;
        }
        float *t = d;
        d = other;
        other = t;
    }
    mgpu_backward_step_t steps[MGPU_BACKWARD_ORDER_MAX_STEPS(MGPU_MODEL_MAX_LAYERS)];
    int n = mgpu_backward_order_build(m->n_layers, top_done, hook != NULL, steps);
    for (int i = 0; i < n && rc == 0; i++) {
        const int l = steps[i].layer;
        const mgpu_layer_t *ly = &m->layers[l];
        switch (steps[i].op) {
        case MGPU_BACKWARD_WGRAD:
            rc = weight_grad(m, l, dz[l], x, bias_left, err);
            break;
        case MGPU_BACKWARD_DGRAD: {
            /* dz of the layer below [batch, in] = (dz [batch, out] . W [out, in]) *
             * act'(below), and the layer below's bias gradient. */
            const mgpu_layer_t *lb = &m->layers[l - 1];
            rc = mgpu_k_linear_backward_data(m->k, lb->act, batch, ly->out, ly->in, dz[l],
                                             m->params + ly->w_off, m->z[l - 1], m->y[l - 1],
                                             m->aux[l - 1], dz[l - 1], m->grads + lb->b_off, err);
            break;
        }
        case MGPU_BACKWARD_JOIN:
            rc = mgpu_k_join(m->k, err);
            break;
        case MGPU_BACKWARD_HOOK:
            rc = hook(hook_ctx, l, err);
            break;
        }
    }
    return rc;
}

int mgpu_model_backward_hooked(mgpu_model_t *m, const float *x, const int32_t *labels,
                               const float *targets, mgpu_model_layer_hook hook, void *hook_ctx,
                               mgpu_err_t *err)
{
    /* d = dLoss/dlogits (the output layer has no activation). */
    int rc = loss_forward(m, labels, targets, m->dy_a, err);
    return rc < 0 ? rc : backward_layers(m, x, m->dy_a, 0, 0, hook, hook_ctx, err);
}

int mgpu_model_grads_hooked(mgpu_model_t *m, const float *x, const int32_t *labels,
                            const float *targets, int batch, mgpu_model_layer_hook hook,
                            void *hook_ctx, mgpu_err_t *err)
{
    const int top = m->n_layers - 1;
    const mgpu_layer_t *ly = &m->layers[top], *lb = top > 0 ? &m->layers[top - 1] : NULL;
    int rc;

    if ((rc = check_loss_inputs(m, labels, targets, err)) < 0 ||
        (rc = forward_layers(m, x, batch, top, err)) < 0)
        return rc;
    if (ly->act != MGPU_ACT_IDENTITY) { /* (never for the models built here) */
        rc = forward_layers(m, x, batch, m->n_layers, err);
        return rc < 0 ? rc : mgpu_model_backward_hooked(m, x, labels, targets, hook, hook_ctx, err);
    }
    mgpu_k_head_t h = {
        .loss = m->spec.loss,
        .rows = batch,
        .out = ly->out,
        .in = ly->in,
        .x = lb != NULL ? m->y[top - 1] : x,
        .w = m->params + ly->w_off,
        .bias = m->params + ly->b_off,
        .y = m->y[top],
        .labels = labels,
        .targets = targets,
        .loss_out = &m->scalars[0],
        .dy = m->dy_top,
        .act_in = lb != NULL ? lb->act : MGPU_ACT_IDENTITY,
        .z_in = lb != NULL ? m->z[top - 1] : NULL,
        .aux_in = lb != NULL ? m->aux[top - 1] : NULL,
        .dx = lb != NULL ? m->dy_a : NULL,
        .dbias_in = lb != NULL ? m->grads + lb->b_off : NULL,
    };
    if ((rc = mgpu_k_linear_loss(m->k, &h, err)) < 0)
        return rc;
    mgpu_progress_phase(m->progress, MGPU_PHASE_BACKWARD);
    m->last_batch = batch;
    /* MGPU_K_BIAS_LEFT: the layer below's weight-gradient op writes its bias gradient. */
    return backward_layers(m, x, m->dy_top, 1, rc == MGPU_K_BIAS_LEFT, hook, hook_ctx, err);
}

int mgpu_model_compute_grads(mgpu_model_t *m, const float *x, const int32_t *labels,
                             const float *targets, int batch, mgpu_err_t *err)
{
    return mgpu_model_grads_hooked(m, x, labels, targets, batch, NULL, NULL, err);
}

int mgpu_model_read_scalars(mgpu_model_t *m, float *loss, float *correct, mgpu_err_t *err)
{
    float s[2];
    int rc = mgpu_k_copy_to_host(m->k, s, m->scalars, sizeof s, err);
    if (rc < 0)
        return rc;
    if (loss != NULL)
        *loss = s[0];
    if (correct != NULL)
        *correct = s[1];
    return 0;
}

uint64_t mgpu_model_shape_hash(const mgpu_model_t *m)
{
    uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a 64 */
    int words[3 * MGPU_MODEL_MAX_LAYERS + 2];
    int n = 0;
    for (int l = 0; l < m->n_layers; l++) {
        words[n++] = m->layers[l].in;
        words[n++] = m->layers[l].out;
        words[n++] = (int)m->layers[l].act;
    }
    words[n++] = (int)m->spec.loss;
    words[n++] = m->n_layers;
    for (int i = 0; i < n; i++)
        for (int b = 0; b < 4; b++) {
            h ^= (uint64_t)(((unsigned)words[i] >> (8 * b)) & 0xff);
            h *= 0x100000001b3ULL;
        }
    return h;
}
