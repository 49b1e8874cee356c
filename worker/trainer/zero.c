/* zero.c - ZeRO-1: the slices, the sharded step's collectives, the state between slices and
 * a checkpoint's layout, the MLP's and the GPT's sharded update. */
#include "zero.h"

#include <errno.h>  /* EINVAL, ENOMEM */
#include <stdlib.h> /* calloc */

#include "gpt_ops.h" /* mgpu_kg_sumsq, mgpu_kg_clip_factor, mgpu_kg_adamw_multi */
#include "mgpu.h"    /* mgpu_progress_phase */

void mgpu_zero_init(mgpu_zero_t *z, int rank, int world, size_t n)
{
    z->rank = rank;
    z->world = world;
    z->n = n;
    z->block = n / (size_t)world;
    mgpu_zero_slice(z, rank, &z->lo, &z->hi);
}

void mgpu_zero_slice(const mgpu_zero_t *z, int r, size_t *lo, size_t *hi)
{
    *lo = (size_t)r * z->block;
    *hi = r == z->world - 1 ? z->n : *lo + z->block;
}

int mgpu_zero_check(const char *who, mgpu_kernels_t *k, const mgpu_ddp_comm_t *comm,
                    mgpu_err_t *err)
{
    if (comm->world_size > 1 &&
        (comm->reduce_scatter_avg == NULL || comm->all_gather == NULL ||
         comm->allreduce_avg == NULL || comm->allreduce_sum == NULL || comm->broadcast == NULL))
        return mgpu_err_set(err, -EINVAL,
                            "%s: zero = 1 with world size %d needs the reduce-scatter, "
                            "all-gather, all-reduce (average and sum) and broadcast collectives",
                            who, comm->world_size);
    return 0;
}

int mgpu_zero_reduce_grads(const mgpu_zero_t *z, const mgpu_ddp_comm_t *comm, float *grads,
                           mgpu_err_t *err)
{
    size_t body = z->block * (size_t)z->world;
    int rc;
    if (z->world == 1)
        return 0;
    mgpu_progress_bucket(comm->progress, 0);
    if (z->block > 0 && (rc = comm->reduce_scatter_avg(comm->ctx, grads, z->block, err)) < 0)
        return rc;
    mgpu_progress_bucket(comm->progress, 1);
    if (body < z->n && (rc = comm->allreduce_avg(comm->ctx, grads + body, z->n - body, err)) < 0)
        return rc;
    mgpu_progress_bucket(comm->progress, -1);
    return 0;
}

int mgpu_zero_gather_params(const mgpu_zero_t *z, const mgpu_ddp_comm_t *comm, float *params,
                            mgpu_err_t *err)
{
    size_t body = z->block * (size_t)z->world;
    int rc;
    if (z->world == 1)
        return 0;
    if (z->block > 0 && (rc = comm->all_gather(comm->ctx, params, z->block, err)) < 0)
        return rc;
    if (body < z->n && (rc = comm->broadcast(comm->ctx, params + body,
                                             sizeof(float) * (z->n - body), z->world - 1, err)) < 0)
        return rc;
    return 0;
}

/* Moves each slice between its owner and rank 0 (to_root: gather into full, else scatter from
 * it), array by array, through a backend scratch of the largest slice. */
static int state_move(const mgpu_zero_t *z, mgpu_kernels_t *k, const mgpu_ddp_comm_t *comm,
                      float *state, int arrays, float *full, int to_root, mgpu_err_t *err)
{
    const size_t mine = z->hi - z->lo;
    size_t cap = z->n - z->block * (size_t)(z->world - 1); /* the last rank's, the largest */
    void *scratch = NULL;
    int rc = 0;

    if (z->rank == 0 && full == NULL)
        return mgpu_err_set(err, -EINVAL, "zero: rank 0 has no buffer for the whole state");
    if (arrays == 0)
        return 0;
    if (z->world > 1 && cap > 0 && (rc = mgpu_k_alloc(k, sizeof(float) * cap, &scratch, err)) < 0)
        return rc;
    for (int a = 0; a < arrays && rc == 0; a++) {
        float *own = state + (size_t)a * mine;
        /* Rank 0's own slice needs no collective. */
        if (z->rank == 0 && mine > 0)
            rc = to_root ? mgpu_k_copy_to_host(k, full + (size_t)a * z->n + z->lo, own,
                                               sizeof(float) * mine, err)
                         : mgpu_k_copy_to_device(k, own, full + (size_t)a * z->n + z->lo,
                                                 sizeof(float) * mine, err);
        for (int r = 1; r < z->world && rc == 0; r++) {
            size_t lo, hi;
            mgpu_zero_slice(z, r, &lo, &hi);
            const size_t bytes = sizeof(float) * (hi - lo);
            float *part = full != NULL ? full + (size_t)a * z->n + lo : NULL;
            if (bytes == 0)
                continue;
            if (to_root) {
                if (z->rank == r && (rc = mgpu_k_copy(k, scratch, own, bytes, err)) < 0)
                    break;
                if ((rc = comm->broadcast(comm->ctx, scratch, bytes, r, err)) < 0)
                    break;
                if (z->rank == 0)
                    rc = mgpu_k_copy_to_host(k, part, scratch, bytes, err);
            } else {
                if (z->rank == 0 && (rc = mgpu_k_copy_to_device(k, scratch, part, bytes, err)) < 0)
                    break;
                if ((rc = comm->broadcast(comm->ctx, scratch, bytes, 0, err)) < 0)
                    break;
                if (z->rank == r)
                    rc = mgpu_k_copy(k, own, scratch, bytes, err);
            }
        }
    }
    if (scratch != NULL)
        mgpu_k_free(k, scratch);
    return rc;
}

int mgpu_zero_state_gather(const mgpu_zero_t *z, mgpu_kernels_t *k, const mgpu_ddp_comm_t *comm,
                           const float *state, int arrays, float *full, mgpu_err_t *err)
{
    return state_move(z, k, comm, (float *)state, arrays, full, 1, err);
}

int mgpu_zero_state_scatter(const mgpu_zero_t *z, mgpu_kernels_t *k, const mgpu_ddp_comm_t *comm,
                            const float *full, int arrays, float *state, mgpu_err_t *err)
{
    return state_move(z, k, comm, state, arrays, (float *)full, 0, err);
}

int mgpu_zero_save(const mgpu_zero_t *z, mgpu_kernels_t *k, const mgpu_ddp_comm_t *comm,
                   const float *state, int arrays, const float *params, mgpu_ckpt_t *c,
                   const char *path, mgpu_err_t *err)
{
    const size_t n_state = (size_t)arrays * z->n;
    float *full = NULL;
    int rc;
    if (z->rank == 0 && (full = malloc(sizeof(float) * (n_state + 1))) == NULL)
        return mgpu_err_set(err, -ENOMEM, "zero: malloc of %zu floats for the checkpoint's state",
                            n_state);
    rc = mgpu_zero_state_gather(z, k, comm, state, arrays, full, err);
    if (rc == 0 && z->rank == 0) {
        c->state = full;
        c->n_state = n_state;
        rc = mgpu_k_copy_to_host(k, c->params, params, sizeof(float) * c->n_params, err);
        if (rc == 0)
            rc = mgpu_ckpt_write(path, c, err);
        c->state = NULL;
    }
    free(full);
    return rc;
}

int mgpu_zero_resume(const mgpu_zero_t *z, mgpu_kernels_t *k, const mgpu_ddp_comm_t *comm,
                     void *scratch, const char *checkpoint, mgpu_run_ckpt_fits_fn fits,
                     void *fits_ctx, float *params, float *state, int arrays, mgpu_run_resume_t *h,
                     mgpu_err_t *err)
{
    const size_t n_state = (size_t)arrays * z->n;
    float *full = NULL;
    int rc;
    if (z->rank == 0 && checkpoint[0] != 0 &&
        (full = malloc(sizeof(float) * (n_state + 1))) == NULL)
        return mgpu_err_set(err, -ENOMEM, "zero: malloc of %zu floats for the checkpoint's state",
                            n_state);
    rc = mgpu_run_resume_host_state(k, comm, scratch, checkpoint, fits, fits_ctx, params, z->n,
                                    full, n_state, h, err);
    if (rc == 0 && h->status == 1)
        rc = mgpu_zero_state_scatter(z, k, comm, full, arrays, state, err);
    free(full);
    return rc;
}

/* rank's optimizer updates its slice (checked before the backward, so a wrong one fails the
 * step before any work is queued). */
static int check_slice(const mgpu_zero_t *z, const mgpu_trainer_t *t, mgpu_err_t *err)
{
    if (t->optim == NULL || t->optim->off != z->lo || t->optim->n != z->hi - z->lo)
        return mgpu_err_set(err, -EINVAL,
                            "zero: rank %d's optimizer does not update its slice [%zu, %zu)",
                            z->rank, z->lo, z->hi);
    return 0;
}

int mgpu_zero_trainer_update(const mgpu_zero_t *z, const mgpu_ddp_comm_t *comm, mgpu_trainer_t *t,
                             mgpu_err_t *err)
{
    mgpu_model_t *m = t->model;
    int rc;

    if ((rc = check_slice(z, t, err)) < 0)
        return rc;
    /* Weight gradients a GPU backend still computes beside its stream are joined first: the
     * reduce-scatter queued on the stream must see them whole (kernels.h: mgpu_k_join). */
    mgpu_progress_phase(t->progress, MGPU_PHASE_ALLREDUCE);
    if ((rc = mgpu_k_join(t->k, err)) < 0 ||
        (rc = mgpu_zero_reduce_grads(z, comm, m->grads, err)) < 0)
        return rc;
    /* The all-gather completes the update: the phase stays "optimizer" through it. */
    mgpu_progress_phase(t->progress, MGPU_PHASE_OPTIMIZER);
    if ((rc = mgpu_optim_step(t->optim, m->params, m->grads, err)) < 0 ||
        (rc = mgpu_zero_gather_params(z, comm, m->params, err)) < 0)
        return rc;
    /* The all-gather wrote the other slices behind the backend's back: a GPU's bf16 copies of
     * them (its products' operands) must be made again. */
    return mgpu_k_written(t->k, m->params, sizeof(float) * m->n_params, err);
}

int mgpu_zero_trainer_step(const mgpu_zero_t *z, const mgpu_ddp_comm_t *comm, mgpu_trainer_t *t,
                           const mgpu_dataset_t *ds, const size_t *idx, size_t count, float *loss,
                           mgpu_err_t *err)
{
    int rc;
    if ((rc = check_slice(z, t, err)) < 0 ||
        (rc = mgpu_trainer_grads(t, ds, idx, count, err)) < 0 ||
        (rc = mgpu_zero_trainer_update(z, comm, t, err)) < 0)
        return rc;
    return loss != NULL ? mgpu_model_read_scalars(t->model, loss, NULL, err) : 0;
}

void mgpu_zero_gpt_destroy(mgpu_zero_gpt_t *zg)
{
    if (zg == NULL)
        return;
    if (zg->moments != NULL)
        mgpu_k_free(zg->k, zg->moments);
    free(zg->adam);
    free(zg);
}

int mgpu_zero_gpt_create(mgpu_gpt_t *m, int rank, int world, mgpu_zero_gpt_t **out, mgpu_err_t *err)
{
    mgpu_zero_gpt_t *zg;
    int rc = 0;

    *out = NULL;
    if (m->moments != NULL)
        return mgpu_err_set(err, -EINVAL,
                            "zero: the GPT must be made with sharded_optimizer (it has moments "
                            "of its own)");
    zg = calloc(1, sizeof *zg);
    if (zg == NULL || (zg->adam = calloc((size_t)m->n_tensors, sizeof *zg->adam)) == NULL) {
        free(zg);
        return mgpu_err_set(err, -ENOMEM, "zero: calloc for %d tensors failed", m->n_tensors);
    }
    zg->k = m->k;
    mgpu_zero_init(&zg->z, rank, world, m->n_params);
    const size_t lo = zg->z.lo, hi = zg->z.hi, len = hi - lo;
    if (len > 0) {
        void *p = NULL;
        if ((rc = mgpu_k_alloc(m->k, sizeof(float) * 2 * len, &p, err)) < 0)
            goto fail;
        zg->moments = p;
        zg->n_moments = 2 * len;
        if ((rc = mgpu_k_zero(m->k, p, sizeof(float) * 2 * len, err)) < 0)
            goto fail;
    }
    for (int i = 0; i < m->n_tensors; i++) {
        const mgpu_gpt_tensor_t *t = &m->tensors[i];
        size_t a = t->off > lo ? t->off : lo, b = t->off + t->n < hi ? t->off + t->n : hi;
        if (a >= b)
            continue;
        /* No bf16 copy here (p16 NULL): a slice may cut a row of a copy that lies inside a
         * wider matrix (fc16), and the all-gather brings the other slices' fp32 values only,
         * so the step makes the whole copy after it. */
        zg->adam[zg->n_tensors++] = (mgpu_gpt_adamw_tensor_t){.p = m->params + a,
                                                              .g = m->grads + a,
                                                              .m = zg->moments + (a - lo),
                                                              .v = zg->moments + len + (a - lo),
                                                              .n = b - a,
                                                              .decay = m->adam[i].decay};
    }
    *out = zg;
    return 0;
fail:
    mgpu_zero_gpt_destroy(zg);
    return rc;
}

int mgpu_zero_gpt_step(mgpu_zero_gpt_t *zg, const mgpu_ddp_comm_t *comm, mgpu_gpt_t *m,
                       const mgpu_adamw_hparams_t *hp, long long step, float grad_clip,
                       mgpu_err_t *err)
{
    const mgpu_zero_t *z = &zg->z;
    float *ss = m->scalars + 1, *factor = m->scalars + 2;
    int rc;

    mgpu_progress_phase(comm->progress, MGPU_PHASE_ALLREDUCE);
    /* The bf16 path's gradients after mgpu_gpt_zero_grads and no backward: never written, so
     * zeroed now, as mgpu_gpt_step does. */
    if (m->grads_fresh) {
        if ((rc = mgpu_k_zero(m->k, m->grads, sizeof(float) * m->n_params, err)) < 0)
            return rc;
        m->grads_fresh = 0;
    }
    /* Weight gradients still computed beside the stream are joined before the collective
     * reads them (kernels.h: mgpu_k_join). */
    if ((rc = mgpu_k_join(m->k, err)) < 0 ||
        (rc = mgpu_zero_reduce_grads(z, comm, m->grads, err)) < 0)
        return rc;
    mgpu_progress_phase(comm->progress, MGPU_PHASE_OPTIMIZER);
    if ((rc = mgpu_gpt_set_step(m, hp, step, err)) < 0)
        return rc;
    /* The norm of the whole gradient: each slice's sum of squares, summed over the ranks (in
     * another order than one rank's sum: equal to float rounding, and AdamW's m / sqrt(v) is
     * all but blind to the factor's last bits). */
    if (grad_clip > 0 &&
        ((rc = mgpu_k_zero(m->k, ss, sizeof(float), err)) < 0 ||
         (rc = mgpu_kg_sumsq(m->k, z->hi - z->lo, m->grads + z->lo, ss, err)) < 0 ||
         (z->world > 1 && (rc = comm->allreduce_sum(comm->ctx, ss, 1, err)) < 0) ||
         (rc = mgpu_kg_clip_factor(m->k, ss, grad_clip, factor, err)) < 0))
        return rc;
    if ((rc = mgpu_kg_adamw_multi(m->k, zg->n_tensors, zg->adam, hp, m->now,
                                  grad_clip > 0 ? factor : NULL, err)) < 0 ||
        (rc = mgpu_zero_gather_params(z, comm, m->params, err)) < 0)
        return rc;
    /* The other slices came through the collective, not through the backend's ops: it drops
     * what it derived from them, and the bf16 path's copy of the weights is made again from
     * the fp32 parameters, rounded to nearest even as AdamW's own writes of it are. */
    if ((rc = mgpu_k_written(m->k, m->params, sizeof(float) * m->n_params, err)) < 0)
        return rc;
    return mgpu_gpt_params_changed(m, err);
}

void mgpu_zero_print_state(FILE *out, const char *who, int zero, int world, size_t floats,
                           size_t full)
{
    if (zero)
        fprintf(out,
                "%s: optimizer state %zu floats (%.3f MiB) on rank 0, sharded over %d ranks "
                "(zero = 1); unsharded %zu floats (%.3f MiB) per rank\n",
                who, floats, (double)floats * 4 / 1048576.0, world, full,
                (double)full * 4 / 1048576.0);
    else
        fprintf(out, "%s: optimizer state %zu floats (%.3f MiB) per rank (zero = 0)\n", who, floats,
                (double)floats * 4 / 1048576.0);
    fflush(out);
}

void mgpu_zero_print_eager(FILE *out, const char *who)
{
    fprintf(out,
            "%s: zero = 1 runs its GPU steps eagerly: the CUDA graphs capture zero = 0's step "
            "only (cuda_graph applies to zero = 0)\n",
            who);
    fflush(out);
}
