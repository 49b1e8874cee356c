/* ddp.c - the training loop: resume or broadcast, epochs of sampler shards, bucketed gradient
 * averaging, progress, metrics, evaluation, checkpoints. */
#include "ddp.h"

#include <cjson/cJSON.h> /* metrics lines */
#include <errno.h>       /* EINVAL, ENOMEM */
#include <math.h>        /* NAN */
#include <stdint.h>      /* uint64_t */
#include <stdlib.h>      /* malloc */

#include "checkpoint.h" /* mgpu_ckpt_* */
#include "gpt_run.h"    /* mgpu_gpt_run: model = gpt */
#include "log.h"        /* mgpu_info */
#include "run_util.h"   /* mgpu_run_*: what the two loops share */
#include "sampler.h"    /* mgpu_sampler_* */
#include "train.h"      /* mgpu_trainer_* */
#include "zero.h"       /* mgpu_zero_*: zero = 1 */
#ifdef MGPU_HAVE_CUDA
#include "gpustep.h" /* mgpu_gpustep_*: the step on a GPU */
#endif

typedef struct ddp_state {
    mgpu_kernels_t *k;
    const mgpu_cfg_t *cfg;
    const mgpu_ddp_comm_t *comm;
    FILE *out;
    FILE *metrics;
    mgpu_trainer_t *t;
    struct mgpu_gpustep *g; /* the GPU's step, NULL on the CPU */
    void *scratch;          /* backend memory for small collectives: the resume header, metrics */
    float *last_loss;       /* backend memory: the last step's loss when no log line read it */
    float *h_params, *h_state; /* h_state: zero = 0's copy of the optimizer state for checkpoints */
    mgpu_zero_t z;             /* zero = 1: this rank's slice of the optimizer */
    double t0;
    long long steps_this_run;
    double samples_this_run;
} ddp_state_t;

static int world(const ddp_state_t *s)
{
    return s->comm->world_size;
}

/* The step timer: CUDA events on the step stream on a GPU (no sync at the start), the host
 * clock after a sync elsewhere. */
static int timer_start(ddp_state_t *s, double *t0, mgpu_err_t *err)
{
#ifdef MGPU_HAVE_CUDA
    if (s->g != NULL)
        return mgpu_gpustep_timer_start(s->g, err);
#endif
    int rc = mgpu_k_sync(s->k, err);
    *t0 = mgpu_run_now_s();
    return rc;
}

static int timer_stop(ddp_state_t *s, double t0, double *ms, mgpu_err_t *err)
{
#ifdef MGPU_HAVE_CUDA
    if (s->g != NULL)
        return mgpu_gpustep_timer_stop(s->g, ms, err);
#endif
    int rc = mgpu_k_sync(s->k, err);
    *ms = 1000.0 * (mgpu_run_now_s() - t0);
    return rc;
}

#ifdef MGPU_HAVE_CUDA
/* zero = 1 on a GPU: what follows the backward of each step (gpustep.h's update). */
static int zero_update(void *ctx, mgpu_err_t *err)
{
    ddp_state_t *s = ctx;
    return mgpu_zero_trainer_update(&s->z, s->comm, s->t, err);
}
#endif

/* The optimizer state of the whole model, as zero = 0 keeps it and a checkpoint holds it. */
static size_t full_state(const ddp_state_t *s)
{
    return (size_t)mgpu_optim_state_arrays(&s->t->optim->spec) * s->t->model->n_params;
}

static int save_checkpoint(ddp_state_t *s, uint64_t epoch, uint64_t batch, uint64_t step,
                           mgpu_err_t *err)
{
    mgpu_trainer_t *t = s->t;
    if (s->cfg->checkpoint[0] == 0 || (s->comm->rank != 0 && !s->cfg->zero))
        return 0;
    mgpu_progress_phase(s->comm->progress, MGPU_PHASE_CHECKPOINT);
    mgpu_ckpt_t c = {.model_hash = mgpu_model_shape_hash(t->model),
                     .epoch = epoch,
                     .batch_in_epoch = batch,
                     .step = step,
                     .optim_step = (uint64_t)t->optim->step,
                     .optim_kind = (uint32_t)t->optim->spec.kind,
                     .world_size = (uint32_t)world(s),
                     .batch_per_rank = (uint32_t)s->cfg->batch_size,
                     .seed = s->cfg->seed,
                     .n_params = t->model->n_params,
                     .params = s->h_params,
                     .n_state = full_state(s),
                     .state = s->h_state};
    if (s->cfg->zero) /* every rank hands rank 0 its slice of the state */
        return mgpu_zero_save(&s->z, s->k, s->comm, t->optim->state,
                              mgpu_optim_state_arrays(&t->optim->spec), t->model->params, &c,
                              s->cfg->checkpoint, err);
    return mgpu_run_checkpoint_write(s->k, s->cfg->checkpoint, &c, t->model->params,
                                     t->optim->state, err);
}

/* Rank 0's check that the checkpoint was written by a run like this one. */
static int ckpt_fits(void *ctx, const mgpu_ckpt_t *c, char *msg, size_t cap)
{
    const ddp_state_t *s = ctx;
    const mgpu_trainer_t *t = s->t;
    const mgpu_cfg_t *cfg = s->cfg;
    if (c->model_hash == mgpu_model_shape_hash(t->model) && c->n_params == t->model->n_params &&
        c->n_state == full_state(s) && c->seed == cfg->seed)
        return 1;
    snprintf(msg, cap,
             "checkpoint %.400s was written by another run (%zu params, %zu optimizer "
             "floats, seed %llu; this run has %zu, %zu, seed %llu): remove it or "
             "point checkpoint elsewhere",
             cfg->checkpoint, c->n_params, c->n_state, (unsigned long long)c->seed,
             t->model->n_params, full_state(s), (unsigned long long)cfg->seed);
    return 0;
}

/* Rank 0 reads the checkpoint and checks that it fits this run; everyone learns the outcome,
 * then the parameters and optimizer state (or, on a fresh start, rank 0's initial
 * parameters, as DDP's constructor broadcasts them). */
static int resume_or_broadcast(ddp_state_t *s, mgpu_run_resume_t *h, mgpu_err_t *err)
{
    mgpu_trainer_t *t = s->t;
    int rc;
    if (s->cfg->zero) /* rank 0 reads the whole state, each rank receives its slice */
        rc = mgpu_zero_resume(&s->z, s->k, s->comm, s->scratch, s->cfg->checkpoint, ckpt_fits, s,
                              t->model->params, t->optim->state,
                              mgpu_optim_state_arrays(&t->optim->spec), h, err);
    else
        rc = mgpu_run_resume_or_broadcast(s->k, s->comm, s->scratch, s->cfg->checkpoint, ckpt_fits,
                                          s, t->model->params, t->model->n_params, t->optim->state,
                                          t->optim->n_state, h, err);
    if (rc < 0)
        return rc;
    if (h->status == 1)
        t->optim->step = (long long)h->optim_step;
    return 0;
}

/* Sharded evaluation: rank r takes rows [r n / W, (r + 1) n / W) of the held-out set. */
static int evaluate(ddp_state_t *s, const mgpu_dataset_t *ev, double *loss, double *acc,
                    mgpu_err_t *err)
{
    int W = world(s), r = s->comm->rank, rc;
    size_t lo = ev->n * (size_t)r / (size_t)W, hi = ev->n * (size_t)(r + 1) / (size_t)W;
    double ls, c;
    if ((rc = mgpu_trainer_evaluate(s->t, ev, lo, hi - lo, &ls, &c, err)) < 0)
        return rc;
    float v[3] = {(float)ls, (float)c, (float)(hi - lo)};
    if ((rc = mgpu_run_reduce_host(s->k, s->comm, s->scratch, v, 3, 0, err)) < 0)
        return rc;
    *loss = v[0] / v[2];
    *acc = s->cfg->loss == MGPU_LOSS_CROSS_ENTROPY ? v[1] / v[2] : NAN;
    return 0;
}

static int report_eval(ddp_state_t *s, const mgpu_dataset_t *ev, long long epoch, long long step,
                       mgpu_ddp_result_t *res, mgpu_err_t *err)
{
    double loss, acc;
    int rc;

    mgpu_progress_phase(s->comm->progress, MGPU_PHASE_EVAL);
    rc = evaluate(s, ev, &loss, &acc, err);
    if (rc < 0)
        return rc;
    res->eval_loss = loss;
    res->eval_accuracy = acc;
    if (s->comm->rank != 0)
        return 0;
    if (isnan(acc))
        fprintf(s->out, "eval epoch %lld step %lld: loss %.4f on %zu samples\n", epoch + 1, step,
                loss, ev->n);
    else
        fprintf(s->out, "eval epoch %lld step %lld: loss %.4f accuracy %.2f%% on %zu samples\n",
                epoch + 1, step, loss, 100 * acc, ev->n);
    fflush(s->out);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "epoch", (double)epoch + 1);
    cJSON_AddNumberToObject(o, "step", (double)step);
    cJSON_AddNumberToObject(o, "eval_loss", loss);
    if (!isnan(acc))
        cJSON_AddNumberToObject(o, "eval_accuracy", acc);
    mgpu_run_metrics_line(&s->metrics, s->cfg->metrics_file, o);
    return 0;
}

int mgpu_ddp_run(mgpu_kernels_t *k, const mgpu_cfg_t *cfg, const mgpu_ddp_comm_t *comm, FILE *out,
                 mgpu_ddp_result_t *result, mgpu_err_t *err)
{
    ddp_state_t s = {.k = k, .cfg = cfg, .comm = comm, .out = out ? out : stdout};
    mgpu_ddp_result_t res_local, *res = result ? result : &res_local;
    mgpu_dataset_t tr = {0}, ev = {0};
    mgpu_sampler_t samp;
    mgpu_run_resume_t h;
    size_t *idx = NULL;
    int rc, W = comm->world_size, rank = comm->rank;
    size_t B = (size_t)cfg->batch_size;

    /* A language model has a loop of its own over the same collectives. */
    if (cfg->model == MGPU_MODEL_GPT)
        return mgpu_gpt_run(k, cfg, comm, out, result, err);
    mgpu_run_result_init(res);
    if ((rc = mgpu_run_check_comm("ddp", comm, err)) < 0 ||
        (cfg->zero && (rc = mgpu_zero_check("ddp", k, comm, err)) < 0))
        return rc;
    if ((rc = mgpu_kernels_set_precision(k, cfg->precision, err)) < 0 ||
        (rc = mgpu_train_load_data(cfg, &tr, &ev, err)) < 0)
        return rc;
    if ((rc = mgpu_trainer_create(k, cfg, &tr, (int)B, cfg->seed, &s.t, err)) < 0 ||
        (rc = mgpu_sampler_init(&samp, tr.n, W, rank, cfg->shuffle, cfg->seed, cfg->drop_last,
                                err)) < 0 ||
        (rc = mgpu_k_alloc(k, sizeof h, &s.scratch, err)) < 0)
        goto out;
    s.t->progress = comm->progress;
    if (cfg->zero) {
        mgpu_optim_spec_t os;
        mgpu_train_optim_spec(cfg, &os);
        mgpu_zero_init(&s.z, rank, W, s.t->model->n_params);
        if ((rc = mgpu_optim_create_slice(k, &os, s.z.lo, s.z.hi - s.z.lo, &s.t->optim, err)) < 0)
            goto out;
    }
    void *p_loss = NULL;
    rc = mgpu_k_alloc(k, sizeof(float), &p_loss, err);
    s.last_loss = p_loss;
    if (rc < 0)
        goto out;
    idx = malloc(sizeof *idx * samp.num_samples);
    s.h_params = malloc(sizeof(float) * s.t->model->n_params);
    /* zero = 1 keeps no copy of the whole state: rank 0 makes one only to write it. */
    s.h_state = cfg->zero ? NULL : malloc(sizeof(float) * (s.t->optim->n_state + 1));
    if (idx == NULL || s.h_params == NULL || (!cfg->zero && s.h_state == NULL)) {
        rc = mgpu_err_set(err, -ENOMEM, "ddp: cannot allocate the index and host buffers");
        goto out;
    }
    if ((rc = resume_or_broadcast(&s, &h, err)) < 0)
        goto out;
    if (k->backend == MGPU_KBACKEND_CUDA) {
#ifdef MGPU_HAVE_CUDA
        char why[256] = "zero = 1 (its update runs eagerly)";
        /* zero = 1: the sharded update follows the backward eagerly, without buckets. */
        int graph = !cfg->zero && mgpu_train_graph_eligible(cfg, samp.num_samples, why, sizeof why);
        if (W > 1 && !cfg->zero && comm->allreduce_avg_stream == NULL) {
            rc = mgpu_err_set(err, -EINVAL,
                              "ddp: world size %d on a GPU needs allreduce_avg_stream", W);
            goto out;
        }
        if ((rc = mgpu_gpustep_create(s.t, &tr, samp.num_samples, graph,
                                      W > 1 && !cfg->zero ? comm->allreduce_avg_stream : NULL,
                                      comm->ctx, &s.g, err)) < 0 ||
            (cfg->zero && (rc = mgpu_gpustep_set_update(s.g, zero_update, &s, err)) < 0))
            goto out;
        if (cfg->zero && cfg->cuda_graph && rank == 0)
            mgpu_zero_print_eager(s.out, "ddp");
        else if (!graph && rank == 0)
            mgpu_info("ddp: eager GPU steps, no CUDA graph: %s", why);
#else
        rc =
            mgpu_err_set(err, MGPU_E_DEVICE, "ddp: a CUDA kernels backend in a build without CUDA");
        goto out;
#endif
    }
    if ((rc = mgpu_run_metrics_open("ddp", cfg, rank, h.status == 1 ? (long long)h.step : -1,
                                    &s.metrics, err)) < 0)
        goto out;
    if (rank == 0)
        mgpu_zero_print_state(s.out, "ddp", cfg->zero, W, s.t->optim->n_state, full_state(&s));

    size_t nb = mgpu_sampler_num_batches(&samp, B, cfg->drop_last_batch);
    long long step = (long long)h.step, epoch = (long long)h.epoch;
    long long batch = (long long)h.batch;
    long long planned = cfg->epochs * (long long)nb;
    if (cfg->max_steps > 0 && cfg->max_steps < planned)
        planned = cfg->max_steps;
    if (h.status == 1) {
        res->resumed_step = step;
        if (rank == 0)
            mgpu_run_print_resumed(s.out, cfg->checkpoint, epoch, step);
        const mgpu_run_place_t then = {h.world_size, h.batch_per_rank},
                               now = {comm->world_size, (long long)B};
        mgpu_run_rescale_position(rank == 0 ? s.out : NULL, &then, &now, (long long)nb, &epoch,
                                  &batch);
    }
    long long evaluated_at = -1;
    int stopped = 0;
    double first_step_unix = 0, timer_t0 = 0;
    int last_loss_kept = 0;
    s.t0 = mgpu_run_now_s();
    for (; epoch < cfg->epochs && !stopped; epoch++, batch = 0) {
        if ((rc = mgpu_sampler_indices(&samp, (uint64_t)epoch, idx, err)) < 0)
            goto out;
#ifdef MGPU_HAVE_CUDA
        if (s.g != NULL && batch < (long long)nb) {
            /* The rows this epoch's remaining steps consume, in order. */
            size_t first, last, c0, c1;
            mgpu_sampler_batch(&samp, B, (size_t)batch, &first, &c0);
            mgpu_sampler_batch(&samp, B, nb - 1, &last, &c1);
            if ((rc = mgpu_gpustep_epoch(s.g, idx + first, last + c1 - first, err)) < 0)
                goto out;
        }
#endif
        for (; batch < (long long)nb; batch++) {
            size_t start, count;
            if (cfg->max_steps > 0 && step >= cfg->max_steps) {
                stopped = 1;
                break;
            }
            mgpu_sampler_batch(&samp, B, (size_t)batch, &start, &count);
            /* Numbered as the progress lines number them: the first step is step 1. */
            mgpu_progress_step(comm->progress, step + 1);
            int log = cfg->log_interval > 0 && (step + 1) % cfg->log_interval == 0;
            float loss = 0;
#ifdef MGPU_HAVE_CUDA
            if (s.g != NULL) {
                rc = mgpu_gpustep_step(s.g, count, err);
                if (rc == 0 && log)
                    rc = mgpu_model_read_scalars(s.t->model, &loss, NULL, err);
            } else
#endif
                rc = cfg->zero ? mgpu_zero_trainer_step(&s.z, comm, s.t, &tr, idx + start, count,
                                                        log ? &loss : NULL, err)
                               : mgpu_trainer_step(s.t, &tr, idx + start, count,
                                                   W > 1 ? comm->allreduce_avg : NULL, comm->ctx,
                                                   log ? &loss : NULL, err);
            if (rc < 0)
                goto out;
            if (cfg->demo_prints) {
                /* The article's two lines: the model's view, then the loop's. */
                int in = s.t->model->spec.inputs, o = s.t->model->spec.outputs;
                fprintf(s.out, "\tIn Model: input size [%zu, %d] output size [%zu, %d]\n", count,
                        in, count, o);
                fprintf(s.out, "Outside: input size [%zu, %d] output_size [%zu, %d]\n", count, in,
                        count, o);
                fflush(s.out);
            }
            step++;
            s.steps_this_run++;
            s.samples_this_run += (double)count * W;
            if (s.steps_this_run == 1) {
                /* Start to first step: the step has finished, not merely been queued. */
                if ((rc = mgpu_k_sync(k, err)) < 0)
                    goto out;
                first_step_unix = mgpu_run_realtime_s();
                if (comm->mark != NULL)
                    comm->mark(comm->mark_ctx, "first_step");
            }
            if (step == planned && !log) {
                /* Kept aside without a sync: an evaluation overwrites the model's scalars. */
                if ((rc = mgpu_k_copy(k, s.last_loss, s.t->model->scalars, sizeof(float), err)) < 0)
                    goto out;
                last_loss_kept = 1;
            }
            if (cfg->timing_warmup > 0 && s.steps_this_run == cfg->timing_warmup &&
                (rc = timer_start(&s, &timer_t0, err)) < 0)
                goto out;
            if (log) {
                if ((rc = mgpu_run_reduce_host(k, comm, s.scratch, &loss, 1, 1, err)) < 0)
                    goto out;
                res->loss = loss;
                if (rank == 0) {
                    double el, sps, eta;
                    mgpu_run_pace(s.t0, s.samples_this_run, planned, step, s.steps_this_run, &el,
                                  &sps, &eta);
                    fprintf(s.out,
                            "epoch %lld/%lld step %lld/%lld loss %.4f samples/s %.0f eta %.1fs\n",
                            epoch + 1, cfg->epochs, step, planned, loss, sps, eta);
                    fflush(s.out);
                    cJSON *o = cJSON_CreateObject();
                    cJSON_AddNumberToObject(o, "epoch", (double)epoch + 1);
                    cJSON_AddNumberToObject(o, "step", (double)step);
                    cJSON_AddNumberToObject(o, "loss", loss);
                    cJSON_AddNumberToObject(o, "samples_per_s", sps);
                    cJSON_AddNumberToObject(o, "elapsed_s", el);
                    mgpu_run_metrics_line(&s.metrics, cfg->metrics_file, o);
                }
            }
            if (cfg->checkpoint_interval > 0 && step % cfg->checkpoint_interval == 0 &&
                (rc = save_checkpoint(&s, (uint64_t)epoch, (uint64_t)batch + 1, (uint64_t)step,
                                      err)) < 0)
                goto out;
            if (mgpu_run_signal_checkpoint(s.out, cfg, rank, step) &&
                (rc = save_checkpoint(&s, (uint64_t)epoch, (uint64_t)batch + 1, (uint64_t)step,
                                      err)) < 0)
                goto out;
        }
        /* The run's end is saved too (where checkpoint_interval's steps did not just save
         * it): a run that max_steps ends mid-epoch can be continued with a larger max_steps. */
        const int saved = cfg->checkpoint_interval > 0 && step % cfg->checkpoint_interval == 0;
        if (stopped) {
            if (!saved && (rc = save_checkpoint(&s, (uint64_t)epoch, (uint64_t)batch,
                                                (uint64_t)step, err)) < 0)
                goto out;
            break;
        }
        if ((cfg->checkpoint_interval == 0 || (!saved && epoch + 1 == cfg->epochs)) &&
            (rc = save_checkpoint(&s, (uint64_t)epoch + 1, 0, (uint64_t)step, err)) < 0)
            goto out;
        if (ev.n > 0 && cfg->eval_interval > 0 && (epoch + 1) % cfg->eval_interval == 0) {
            if ((rc = report_eval(&s, &ev, epoch, step, res, err)) < 0)
                goto out;
            evaluated_at = step;
        }
    }
    if (cfg->timing_warmup > 0 && s.steps_this_run > cfg->timing_warmup) {
        double ms;
        if ((rc = timer_stop(&s, timer_t0, &ms, err)) < 0)
            goto out;
        res->timed_steps = s.steps_this_run - cfg->timing_warmup;
        res->step_us = 1000.0 * ms / (double)res->timed_steps;
    }
    res->seconds = mgpu_run_now_s() - s.t0;
    if (last_loss_kept) {
        /* The last step's loss, so that the final metrics never report a loss of 0 that no
         * step had (read after the timer stopped: it waits for the device). */
        float loss = 0;
        if ((rc = mgpu_k_copy_to_host(k, &loss, s.last_loss, sizeof loss, err)) < 0 ||
            (rc = mgpu_run_reduce_host(k, comm, s.scratch, &loss, 1, 1, err)) < 0)
            goto out;
        res->loss = loss;
    }
#ifdef MGPU_HAVE_CUDA
    res->graphed = s.g != NULL && mgpu_gpustep_graphed(s.g);
    res->in_place = s.g != NULL && mgpu_gpustep_in_place(s.g);
#endif
    if (rank == 0 && res->timed_steps > 0) {
        fprintf(s.out, "step time: %.2f us per step over %lld steps (%s, %s%s)\n", res->step_us,
                res->timed_steps, s.g != NULL ? "cuda events" : "host clock after a sync",
                s.g == NULL    ? "cpu"
                : res->graphed ? "cuda graph replay"
                               : "eager cuda",
                res->in_place ? ", the data set read in place" : "");
        fflush(s.out);
    }
    /* The final evaluation, unless the last epoch's already saw these parameters, reported
     * in the epoch of the last step. */
    if (ev.n > 0 && evaluated_at != step &&
        (rc = report_eval(&s, &ev, mgpu_run_last_epoch(stopped, epoch, batch), step, res, err)) < 0)
        goto out;
    res->steps = step;
    res->samples_per_s = mgpu_run_rate(s.samples_this_run, res->seconds);
    if (rank == 0) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddBoolToObject(o, "final", 1);
        if (!isnan(res->loss)) /* a resumed run with no step left has none */
            cJSON_AddNumberToObject(o, "loss", res->loss);
        if (!isnan(res->eval_accuracy))
            cJSON_AddNumberToObject(o, "eval_accuracy", res->eval_accuracy);
        if (!isnan(res->eval_loss))
            cJSON_AddNumberToObject(o, "eval_loss", res->eval_loss);
        cJSON_AddNumberToObject(o, "steps", (double)step);
        cJSON_AddNumberToObject(o, "samples_per_s", res->samples_per_s);
        cJSON_AddNumberToObject(o, "seconds", res->seconds);
        cJSON_AddNumberToObject(o, "world_size", W);
        cJSON_AddNumberToObject(o, "zero", cfg->zero);
        cJSON_AddNumberToObject(o, "optimizer_state_floats", (double)s.t->optim->n_state);
        if (res->timed_steps > 0) {
            cJSON_AddNumberToObject(o, "step_us", res->step_us);
            cJSON_AddNumberToObject(o, "timed_steps", (double)res->timed_steps);
        }
        if (first_step_unix > 0)
            cJSON_AddNumberToObject(o, "first_step_unix_s", first_step_unix);
        cJSON_AddBoolToObject(o, "cuda_graph", res->graphed);
        cJSON_AddBoolToObject(o, "data_in_place", res->in_place);
        cJSON_AddStringToObject(o, "backend", k->ops->name);
        mgpu_run_metrics_line(&s.metrics, cfg->metrics_file, o);
    }
    rc = mgpu_run_result_params(k, "ddp", s.t->model->params, s.t->model->n_params, res, err);
    if (rc == 0)
        mgpu_progress_phase(comm->progress, MGPU_PHASE_DONE);
out:
#ifdef MGPU_HAVE_CUDA
    mgpu_gpustep_destroy(s.g);
#endif
    if (s.metrics != NULL)
        fclose(s.metrics);
    if (s.scratch != NULL)
        mgpu_k_free(k, s.scratch);
    if (s.last_loss != NULL)
        mgpu_k_free(k, s.last_loss);
    free(idx);
    free(s.h_params);
    free(s.h_state);
    mgpu_trainer_destroy(s.t);
    mgpu_data_free(&tr);
    mgpu_data_free(&ev);
    if (rc < 0 && result != NULL) {
        free(res->params);
        res->params = NULL;
    }
    if (result == NULL)
        free(res_local.params);
    return rc;
}
