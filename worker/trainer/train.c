/* train.c - from a cfg to data, model, optimizer and steps. */
#include "train.h"

#include <errno.h>  /* EINVAL, ENOMEM */
#include <stdio.h>  /* snprintf */
#include <stdlib.h> /* calloc, malloc */
#include <string.h> /* memset */

int mgpu_train_load_data(const mgpu_cfg_t *cfg, mgpu_dataset_t *train, mgpu_dataset_t *eval,
                         mgpu_err_t *err)
{
    mgpu_dataset_t all;
    int rc, xent = cfg->loss == MGPU_LOSS_CROSS_ENTROPY;

    memset(train, 0, sizeof *train);
    memset(eval, 0, sizeof *eval);
    switch (cfg->dataset) {
    case MGPU_DATASET_RANDOM:
        rc = mgpu_data_random(&all, (size_t)cfg->samples, cfg->features, cfg->classes,
                              cfg->data_seed, err);
        break;
    case MGPU_DATASET_SYNTHETIC:
        rc = mgpu_data_synthetic(&all, (size_t)cfg->samples, cfg->features, cfg->classes,
                                 cfg->clusters_per_class, cfg->class_sep, cfg->cluster_std,
                                 cfg->data_seed, err);
        break;
    case MGPU_DATASET_NPY:
        rc = mgpu_data_load_npy(&all, cfg->data_x, cfg->data_y, xent, cfg->classes, err);
        break;
    default:
        rc = mgpu_err_set(err, -EINVAL, "train: dataset %d unknown", (int)cfg->dataset);
    }
    if (rc < 0)
        return rc;
    rc = mgpu_data_split(&all, cfg->eval_fraction, cfg->data_seed, train, eval, err);
    mgpu_data_free(&all);
    return rc;
}

void mgpu_train_model_spec(const mgpu_cfg_t *cfg, const mgpu_dataset_t *ds, mgpu_model_spec_t *spec)
{
    memset(spec, 0, sizeof *spec);
    spec->inputs = ds->features;
    spec->loss = cfg->loss;
    spec->outputs = cfg->loss == MGPU_LOSS_CROSS_ENTROPY ? ds->classes : ds->target_dim;
    spec->activation = cfg->activation;
    spec->n_hidden = cfg->model == MGPU_MODEL_MLP ? cfg->n_hidden : 0;
    for (int i = 0; i < spec->n_hidden; i++)
        spec->hidden[i] = cfg->hidden[i];
}

void mgpu_train_optim_spec(const mgpu_cfg_t *cfg, mgpu_optim_spec_t *spec)
{
    memset(spec, 0, sizeof *spec);
    spec->kind = cfg->optimizer;
    spec->lr = (float)cfg->lr;
    spec->weight_decay = (float)cfg->weight_decay;
    spec->momentum = (float)cfg->momentum;
    spec->dampening = (float)cfg->dampening;
    spec->nesterov = cfg->nesterov;
    spec->beta1 = (float)cfg->beta1;
    spec->beta2 = (float)cfg->beta2;
    spec->eps = (float)cfg->eps;
}

int mgpu_train_buckets(const mgpu_model_t *m, double bucket_mb, mgpu_bucket_t **out, int *n,
                       mgpu_err_t *err)
{
    /* At most one bucket per parameter tensor. */
    mgpu_bucket_t *b = calloc((size_t)m->n_layers * 2, sizeof *b);
    size_t cap = (size_t)(bucket_mb * 1024 * 1024 / sizeof(float));
    size_t first_cap = (size_t)1024 * 1024 / sizeof(float);
    int nb = 0;

    *out = NULL;
    *n = 0;
    if (!(bucket_mb > 0))
        return mgpu_err_set(err, -EINVAL, "train: bucket_mb %g, expected > 0", bucket_mb);
    if (b == NULL)
        return mgpu_err_set(err, -ENOMEM, "train: calloc for buckets failed");
    if (cap < 1)
        cap = 1;
    if (first_cap > cap)
        first_cap = cap;
    /* Walk the tensors backwards: bias of the last layer, its weight, ...; the layout puts
     * them in ascending order, so each bucket is one contiguous slice [end - count, end). */
    size_t end = m->n_params, open = 0;
    for (int l = m->n_layers - 1; l >= 0; l--) {
        const mgpu_layer_t *ly = &m->layers[l];
        size_t sizes[2] = {(size_t)ly->out, (size_t)ly->out * ly->in}; /* bias, weight */
        for (int t = 0; t < 2; t++) {
            open += sizes[t];
            if (open >= (nb == 0 ? first_cap : cap)) {
                b[nb++] = (mgpu_bucket_t){.offset = end - open, .count = open};
                end -= open;
                open = 0;
            }
        }
    }
    if (open > 0)
        b[nb++] = (mgpu_bucket_t){.offset = end - open, .count = open};
    *out = b;
    *n = nb;
    return 0;
}

int mgpu_train_bucket_layers(const mgpu_model_t *m, const mgpu_bucket_t *b, int nb, int *ready,
                             mgpu_err_t *err)
{
    for (int i = 0; i < nb; i++) {
        if (b[i].count == 0 || b[i].offset + b[i].count > m->n_params)
            return mgpu_err_set(err, -EINVAL,
                                "train: bucket %d covers [%zu, %zu) of %zu parameters", i,
                                b[i].offset, b[i].offset + b[i].count, m->n_params);
        /* The layer whose weight or bias holds the bucket's first float. */
        int l = m->n_layers - 1;
        while (l > 0 && m->layers[l].w_off > b[i].offset)
            l--;
        ready[i] = l;
    }
    return 0;
}

int mgpu_train_graph_eligible(const mgpu_cfg_t *cfg, size_t rank_samples, char *why, size_t why_len)
{
    char tmp[8];
    size_t B = (size_t)cfg->batch_size;
    if (why == NULL) {
        why = tmp;
        why_len = sizeof tmp;
    }
    why[0] = 0;
    if (!cfg->cuda_graph) {
        snprintf(why, why_len, "cuda_graph = false");
        return 0;
    }
    if (rank_samples < B) {
        snprintf(why, why_len, "%zu samples per rank, fewer than batch_size %zu", rank_samples, B);
        return 0;
    }
    if (!cfg->drop_last_batch && rank_samples % B != 0) {
        snprintf(why, why_len,
                 "%zu samples per rank leave a last batch of %zu rows (set drop_last_batch)",
                 rank_samples, rank_samples % B);
        return 0;
    }
    return 1;
}

void mgpu_trainer_destroy(mgpu_trainer_t *t)
{
    if (t == NULL)
        return;
    mgpu_optim_destroy(t->optim);
    mgpu_model_destroy(t->model);
    free(t->buckets);
    free(t->bucket_layer);
    free(t->h_x);
    free(t->h_t);
    free(t->h_l);
    mgpu_k_free(t->k, t->d_x);
    mgpu_k_free(t->k, t->d_t);
    mgpu_k_free(t->k, t->d_l);
    free(t);
}

int mgpu_trainer_create(mgpu_kernels_t *k, const mgpu_cfg_t *cfg, const mgpu_dataset_t *ds,
                        int max_batch, uint64_t seed, mgpu_trainer_t **out, mgpu_err_t *err)
{
    mgpu_model_spec_t ms;
    mgpu_optim_spec_t os;
    mgpu_trainer_t *t;
    int rc;
    size_t nx = (size_t)max_batch * ds->features;
    size_t nt = (size_t)max_batch * (ds->target_dim > 0 ? ds->target_dim : 1);

    *out = NULL;
    t = calloc(1, sizeof *t);
    if (t == NULL)
        return mgpu_err_set(err, -ENOMEM, "train: calloc failed");
    t->k = k;
    t->max_batch = max_batch;
    t->bucket_overlap = cfg->bucket_overlap;
    mgpu_train_model_spec(cfg, ds, &ms);
    mgpu_train_optim_spec(cfg, &os);
    if ((rc = mgpu_model_create(k, &ms, max_batch, &t->model, err)) < 0 ||
        (rc = mgpu_model_init(t->model, seed, err)) < 0 ||
        (cfg->zero == 0 &&
         (rc = mgpu_optim_create(k, &os, t->model->n_params, &t->optim, err)) < 0) ||
        (rc = mgpu_train_buckets(t->model, cfg->bucket_mb, &t->buckets, &t->n_buckets, err)) < 0)
        goto fail;
    t->bucket_layer = malloc(sizeof(int) * (size_t)t->n_buckets);
    if (t->bucket_layer == NULL) {
        rc = mgpu_err_set(err, -ENOMEM, "train: malloc for %d bucket layers failed", t->n_buckets);
        goto fail;
    }
    if ((rc = mgpu_train_bucket_layers(t->model, t->buckets, t->n_buckets, t->bucket_layer, err)) <
        0)
        goto fail;
    t->h_x = malloc(sizeof(float) * nx);
    t->h_t = malloc(sizeof(float) * nt);
    t->h_l = malloc(sizeof(int32_t) * (size_t)max_batch);
    if (t->h_x == NULL || t->h_t == NULL || t->h_l == NULL) {
        rc = mgpu_err_set(err, -ENOMEM, "train: cannot allocate batch buffers of %d rows",
                          max_batch);
        goto fail;
    }
    void *p;
    if ((rc = mgpu_k_alloc(k, sizeof(float) * nx, &p, err)) < 0)
        goto fail;
    t->d_x = p;
    if ((rc = mgpu_k_alloc(k, sizeof(float) * nt, &p, err)) < 0)
        goto fail;
    t->d_t = p;
    if ((rc = mgpu_k_alloc(k, sizeof(int32_t) * (size_t)max_batch, &p, err)) < 0)
        goto fail;
    t->d_l = p;
    *out = t;
    return 0;
fail:
    mgpu_trainer_destroy(t);
    return rc;
}

/* Copies rows of ds into the device batch buffers. */
static int load_batch(mgpu_trainer_t *t, const mgpu_dataset_t *ds, const size_t *idx, size_t start,
                      size_t count, mgpu_err_t *err)
{
    int rc;
    if (count < 1 || count > (size_t)t->max_batch)
        return mgpu_err_set(err, -EINVAL, "train: batch of %zu rows, expected 1..%d", count,
                            t->max_batch);
    if (idx != NULL) {
        mgpu_data_gather(ds, idx, count, t->h_x, t->h_l, t->h_t);
        rc = mgpu_k_copy_to_device(t->k, t->d_x, t->h_x, sizeof(float) * count * ds->features, err);
        if (rc == 0 && ds->labels)
            rc = mgpu_k_copy_to_device(t->k, t->d_l, t->h_l, sizeof(int32_t) * count, err);
        if (rc == 0 && ds->targets)
            rc = mgpu_k_copy_to_device(t->k, t->d_t, t->h_t, sizeof(float) * count * ds->target_dim,
                                       err);
        return rc;
    }
    /* Contiguous rows need no gather. */
    rc = mgpu_k_copy_to_device(t->k, t->d_x, ds->x + start * ds->features,
                               sizeof(float) * count * ds->features, err);
    if (rc == 0 && ds->labels)
        rc = mgpu_k_copy_to_device(t->k, t->d_l, ds->labels + start, sizeof(int32_t) * count, err);
    if (rc == 0 && ds->targets)
        rc = mgpu_k_copy_to_device(t->k, t->d_t, ds->targets + start * ds->target_dim,
                                   sizeof(float) * count * ds->target_dim, err);
    return rc;
}

int mgpu_trainer_grads(mgpu_trainer_t *t, const mgpu_dataset_t *ds, const size_t *idx, size_t count,
                       mgpu_err_t *err)
{
    int rc;
    if (idx == NULL)
        return mgpu_err_set(err, -EINVAL, "train: step without sample indices");
    mgpu_progress_phase(t->progress, MGPU_PHASE_DATA);
    if ((rc = load_batch(t, ds, idx, 0, count, err)) < 0)
        return rc;
    /* The model says where its backward begins (the output layer's forward is fused with its
     * loss and gradient, so that is after it). */
    t->model->progress = t->progress;
    mgpu_progress_phase(t->progress, MGPU_PHASE_FORWARD);
    return mgpu_model_compute_grads(t->model, t->d_x, ds->labels ? t->d_l : NULL,
                                    ds->targets ? t->d_t : NULL, (int)count, err);
}

int mgpu_trainer_step(mgpu_trainer_t *t, const mgpu_dataset_t *ds, const size_t *idx, size_t count,
                      mgpu_reduce_fn reduce, void *ctx, float *loss, mgpu_err_t *err)
{
    mgpu_model_t *m = t->model;
    int rc;

    if ((rc = mgpu_trainer_grads(t, ds, idx, count, err)) < 0)
        return rc;
    /* Buckets in order; a GPU backend overlaps these with backward (gpustep.cu), the CPU runs
     * them after it. */
    if (reduce != NULL)
        mgpu_progress_phase(t->progress, MGPU_PHASE_ALLREDUCE);
    for (int b = 0; reduce != NULL && b < t->n_buckets; b++) {
        mgpu_progress_bucket(t->progress, b);
        if ((rc = reduce(ctx, m->grads + t->buckets[b].offset, t->buckets[b].count, err)) < 0)
            return rc;
    }
    mgpu_progress_bucket(t->progress, -1);
    mgpu_progress_phase(t->progress, MGPU_PHASE_OPTIMIZER);
    if ((rc = mgpu_optim_step(t->optim, m->params, m->grads, err)) < 0)
        return rc;
    return loss != NULL ? mgpu_model_read_scalars(m, loss, NULL, err) : 0;
}

int mgpu_trainer_evaluate(mgpu_trainer_t *t, const mgpu_dataset_t *ds, size_t start, size_t count,
                          double *loss_sum, double *correct, mgpu_err_t *err)
{
    mgpu_model_t *m = t->model;
    int rc;

    *loss_sum = 0;
    *correct = 0;
    if (start + count > ds->n)
        return mgpu_err_set(err, -EINVAL, "train: evaluate rows [%zu, %zu) of %zu", start,
                            start + count, ds->n);
    for (size_t s = start; s < start + count; s += (size_t)t->max_batch) {
        size_t b =
            start + count - s < (size_t)t->max_batch ? start + count - s : (size_t)t->max_batch;
        float l, c;
        if ((rc = load_batch(t, ds, NULL, s, b, err)) < 0 ||
            (rc = mgpu_model_forward(m, t->d_x, (int)b, NULL, err)) < 0 ||
            (rc = mgpu_model_eval_loss(m, ds->labels ? t->d_l : NULL, ds->targets ? t->d_t : NULL,
                                       err)) < 0 ||
            (rc = mgpu_model_read_scalars(m, &l, &c, err)) < 0)
            return rc;
        *loss_sum += (double)l * (double)b;
        if (m->spec.loss == MGPU_LOSS_CROSS_ENTROPY)
            *correct += c;
    }
    return 0;
}
