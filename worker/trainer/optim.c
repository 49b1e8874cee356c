/* optim.c - optimizer state and dispatch to the fused update kernels. */
#include "optim.h"

#include <errno.h>   /* EINVAL, ENOMEM */
#include <stdlib.h>  /* calloc */
#include <strings.h> /* strcasecmp */

const char *mgpu_optim_name(mgpu_optim_kind_t kind)
{
    return kind == MGPU_OPTIM_SGD ? "sgd" : kind == MGPU_OPTIM_ADAMW ? "adamw" : "?";
}

int mgpu_optim_parse(const char *s)
{
    if (strcasecmp(s, "sgd") == 0)
        return MGPU_OPTIM_SGD;
    if (strcasecmp(s, "adamw") == 0)
        return MGPU_OPTIM_ADAMW;
    return -1;
}

static mgpu_sgd_hparams_t sgd_hp(const mgpu_optim_spec_t *s)
{
    return (mgpu_sgd_hparams_t){.lr = s->lr,
                                .momentum = s->momentum,
                                .dampening = s->dampening,
                                .weight_decay = s->weight_decay,
                                .nesterov = s->nesterov};
}

static mgpu_adamw_hparams_t adamw_hp(const mgpu_optim_spec_t *s)
{
    return (mgpu_adamw_hparams_t){.lr = s->lr,
                                  .beta1 = s->beta1,
                                  .beta2 = s->beta2,
                                  .eps = s->eps,
                                  .weight_decay = s->weight_decay};
}

int mgpu_optim_state_arrays(const mgpu_optim_spec_t *spec)
{
    return spec->kind == MGPU_OPTIM_ADAMW ? 2 : spec->momentum != 0.0f ? 1 : 0;
}

int mgpu_optim_create(mgpu_kernels_t *k, const mgpu_optim_spec_t *spec, size_t n,
                      mgpu_optim_t **out, mgpu_err_t *err)
{
    return mgpu_optim_create_slice(k, spec, 0, n, out, err);
}

int mgpu_optim_create_slice(mgpu_kernels_t *k, const mgpu_optim_spec_t *spec, size_t off, size_t n,
                            mgpu_optim_t **out, mgpu_err_t *err)
{
    mgpu_optim_t *o;
    int rc;

    *out = NULL;
    /* Validate through the launchers with n = 0: same messages as a real step, no work. */
    if (spec->kind == MGPU_OPTIM_SGD) {
        mgpu_sgd_hparams_t hp = sgd_hp(spec);
        rc = mgpu_k_sgd_step(k, 0, NULL, NULL, NULL, &hp, 1, err);
    } else if (spec->kind == MGPU_OPTIM_ADAMW) {
        mgpu_adamw_hparams_t hp = adamw_hp(spec);
        rc = mgpu_k_adamw_step(k, 0, NULL, NULL, NULL, NULL, &hp, 1, err);
    } else {
        rc = mgpu_err_set(err, -EINVAL, "optim: kind %d, expected sgd or adamw", (int)spec->kind);
    }
    if (rc < 0)
        return rc;
    o = calloc(1, sizeof *o);
    if (o == NULL)
        return mgpu_err_set(err, -ENOMEM, "optim: calloc failed");
    o->k = k;
    o->spec = *spec;
    o->off = off;
    o->n = n;
    o->n_state = (size_t)mgpu_optim_state_arrays(spec) * n;
    if (o->n_state > 0) {
        void *p = NULL;
        rc = mgpu_k_alloc(k, o->n_state * sizeof(float), &p, err);
        o->state = p;
        if (rc == 0)
            rc = mgpu_k_zero(k, p, o->n_state * sizeof(float), err);
        if (rc < 0) {
            mgpu_optim_destroy(o);
            return rc;
        }
    }
    *out = o;
    return 0;
}

void mgpu_optim_destroy(mgpu_optim_t *o)
{
    if (o == NULL)
        return;
    mgpu_k_free(o->k, o->state);
    free(o);
}

int mgpu_optim_step(mgpu_optim_t *o, float *params, const float *grads, mgpu_err_t *err)
{
    int rc;
    params += o->off;
    grads += o->off;
    if (o->spec.kind == MGPU_OPTIM_SGD) {
        mgpu_sgd_hparams_t hp = sgd_hp(&o->spec);
        rc = mgpu_k_sgd_step(o->k, o->n, params, grads, o->state, &hp, o->step + 1, err);
    } else {
        mgpu_adamw_hparams_t hp = adamw_hp(&o->spec);
        rc = mgpu_k_adamw_step(o->k, o->n, params, grads, o->state, o->state + o->n, &hp,
                               o->step + 1, err);
    }
    if (rc == 0)
        o->step++;
    return rc;
}
