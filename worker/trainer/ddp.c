/* ddp.c - the training loop: resume or broadcast, epochs of sampler shards, bucketed gradient
 * averaging, progress, metrics, evaluation, checkpoints. */
#include "ddp.h"

#include <cjson/cJSON.h> /* metrics lines */
#include <errno.h>       /* ENOENT */
#include <math.h>        /* NAN */
#include <stdint.h>      /* uint64_t */
#include <stdlib.h>      /* malloc */
#include <string.h>      /* memset */
#include <time.h>        /* clock_gettime */

#include "checkpoint.h" /* mgpu_ckpt_* */
#include "gpt_run.h"    /* mgpu_gpt_run: model = gpt */
#include "log.h"        /* mgpu_info */
#include "sampler.h"    /* mgpu_sampler_* */
#include "train.h"      /* mgpu_trainer_* */
#ifdef MGPU_HAVE_CUDA
#include "gpustep.h" /* mgpu_gpustep_*: the step on a GPU */
#endif

/* What rank 0 tells everyone about the checkpoint before anything else. */
typedef struct resume_hdr {
    int32_t status; /* 1: resume, 0: fresh start, -1: rank 0 failed (message follows) */
    int32_t pad;
    uint64_t epoch, batch, step, optim_step;
    char msg[1024];
} resume_hdr_t;

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
    float *h_params, *h_state;
    double t0;
    long long steps_this_run;
    double samples_this_run;
} ddp_state_t;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double realtime_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

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
    *t0 = now_s();
    return rc;
}

static int timer_stop(ddp_state_t *s, double t0, double *ms, mgpu_err_t *err)
{
#ifdef MGPU_HAVE_CUDA
    if (s->g != NULL)
        return mgpu_gpustep_timer_stop(s->g, ms, err);
#endif
    int rc = mgpu_k_sync(s->k, err);
    *ms = 1000.0 * (now_s() - t0);
    return rc;
}

/* Broadcast of host bytes from rank 0 through backend memory. */
static int bcast_host(ddp_state_t *s, void *host, size_t bytes, mgpu_err_t *err)
{
    int rc;
    if (world(s) == 1)
        return 0;
    if ((rc = mgpu_k_copy_to_device(s->k, s->scratch, host, bytes, err)) < 0 ||
        (rc = s->comm->broadcast(s->comm->ctx, s->scratch, bytes, 0, err)) < 0)
        return rc;
    return mgpu_k_copy_to_host(s->k, host, s->scratch, bytes, err);
}

/* Sum (or average) of a few host floats over the ranks, through backend memory. */
static int reduce_host(ddp_state_t *s, float *v, size_t n, int average, mgpu_err_t *err)
{
    int rc;
    if (world(s) == 1)
        return 0;
    if ((rc = mgpu_k_copy_to_device(s->k, s->scratch, v, sizeof(float) * n, err)) < 0 ||
        (rc = (average ? s->comm->allreduce_avg : s->comm->allreduce_sum)(s->comm->ctx, s->scratch,
                                                                          n, err)) < 0)
        return rc;
    return mgpu_k_copy_to_host(s->k, v, s->scratch, sizeof(float) * n, err);
}

static void metrics_line(ddp_state_t *s, cJSON *obj)
{
    if (s->metrics != NULL) {
        char *line = cJSON_PrintUnformatted(obj);
        if (line != NULL) {
            fputs(line, s->metrics);
            fputc('\n', s->metrics);
            fflush(s->metrics);
            cJSON_free(line);
        }
    }
    cJSON_Delete(obj);
}

static int save_checkpoint(ddp_state_t *s, uint64_t epoch, uint64_t batch, uint64_t step,
                           mgpu_err_t *err)
{
    mgpu_trainer_t *t = s->t;
    int rc;
    if (s->comm->rank != 0 || s->cfg->checkpoint[0] == 0)
        return 0;
    mgpu_progress_phase(s->comm->progress, MGPU_PHASE_CHECKPOINT);
    if ((rc = mgpu_k_copy_to_host(s->k, s->h_params, t->model->params,
                                  sizeof(float) * t->model->n_params, err)) < 0 ||
        (rc = mgpu_k_copy_to_host(s->k, s->h_state, t->optim->state,
                                  sizeof(float) * t->optim->n_state, err)) < 0)
        return rc;
    mgpu_ckpt_t c = {.model_hash = mgpu_model_shape_hash(t->model),
                     .epoch = epoch,
                     .batch_in_epoch = batch,
                     .step = step,
                     .optim_step = (uint64_t)t->optim->step,
                     .optim_kind = (uint32_t)t->optim->spec.kind,
                     .world_size = (uint32_t)world(s),
                     .seed = s->cfg->seed,
                     .n_params = t->model->n_params,
                     .params = s->h_params,
                     .n_state = t->optim->n_state,
                     .state = s->h_state};
    return mgpu_ckpt_write(s->cfg->checkpoint, &c, err);
}

/* Rank 0 reads the checkpoint and checks that it fits this run; everyone learns the outcome,
 * then the parameters and optimizer state (or, on a fresh start, rank 0's initial
 * parameters, as DDP's constructor broadcasts them). */
static int resume_or_broadcast(ddp_state_t *s, resume_hdr_t *h, mgpu_err_t *err)
{
    mgpu_trainer_t *t = s->t;
    const mgpu_cfg_t *cfg = s->cfg;
    int rc;

    memset(h, 0, sizeof *h);
    if (s->comm->rank == 0 && cfg->checkpoint[0] != 0) {
        mgpu_ckpt_t c;
        mgpu_err_t e = {0};
        rc = mgpu_ckpt_read(cfg->checkpoint, &c, &e);
        if (rc == -ENOENT) {
            h->status = 0;
        } else if (rc < 0) {
            h->status = -1;
            snprintf(h->msg, sizeof h->msg, "%.1000s", e.msg);
        } else if (c.model_hash != mgpu_model_shape_hash(t->model) ||
                   c.n_params != t->model->n_params || c.n_state != t->optim->n_state ||
                   c.seed != cfg->seed) {
            h->status = -1;
            snprintf(h->msg, sizeof h->msg,
                     "checkpoint %.400s was written by another run (%zu params, %zu optimizer "
                     "floats, seed %llu; this run has %zu, %zu, seed %llu): remove it or "
                     "point checkpoint elsewhere",
                     cfg->checkpoint, c.n_params, c.n_state, (unsigned long long)c.seed,
                     t->model->n_params, t->optim->n_state, (unsigned long long)cfg->seed);
        } else {
            h->status = 1;
            h->epoch = c.epoch;
            h->batch = c.batch_in_epoch;
            h->step = c.step;
            h->optim_step = c.optim_step;
            rc = mgpu_k_copy_to_device(s->k, t->model->params, c.params, sizeof(float) * c.n_params,
                                       &e);
            if (rc == 0)
                rc = mgpu_k_copy_to_device(s->k, t->optim->state, c.state,
                                           sizeof(float) * c.n_state, &e);
            if (rc < 0) {
                h->status = -1;
                snprintf(h->msg, sizeof h->msg, "%.1000s", e.msg);
            }
        }
        mgpu_ckpt_free(&c); /* zeroed by a failed read: always safe */
    }
    if ((rc = bcast_host(s, h, sizeof *h, err)) < 0)
        return rc;
    if (h->status < 0)
        return mgpu_err_set(err, MGPU_E_CONFIG, "%s%s",
                            s->comm->rank == 0 ? "" : "rank 0 cannot resume: ", h->msg);
    if (world(s) > 1) {
        if ((rc = s->comm->broadcast(s->comm->ctx, t->model->params,
                                     sizeof(float) * t->model->n_params, 0, err)) < 0)
            return rc;
        if (h->status == 1 && t->optim->n_state > 0 &&
            (rc = s->comm->broadcast(s->comm->ctx, t->optim->state,
                                     sizeof(float) * t->optim->n_state, 0, err)) < 0)
            return rc;
    }
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
    if ((rc = reduce_host(s, v, 3, 0, err)) < 0)
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
    metrics_line(s, o);
    return 0;
}

int mgpu_ddp_run(mgpu_kernels_t *k, const mgpu_cfg_t *cfg, const mgpu_ddp_comm_t *comm, FILE *out,
                 mgpu_ddp_result_t *result, mgpu_err_t *err)
{
    ddp_state_t s = {.k = k, .cfg = cfg, .comm = comm, .out = out ? out : stdout};
    mgpu_ddp_result_t res_local, *res = result ? result : &res_local;
    mgpu_dataset_t tr = {0}, ev = {0};
    mgpu_sampler_t samp;
    resume_hdr_t h;
    size_t *idx = NULL;
    int rc, W = comm->world_size, rank = comm->rank;
    size_t B = (size_t)cfg->batch_size;

    /* A language model has a loop of its own over the same collectives. */
    if (cfg->model == MGPU_MODEL_GPT)
        return mgpu_gpt_run(k, cfg, comm, out, result, err);
    memset(res, 0, sizeof *res);
    res->eval_loss = res->eval_accuracy = NAN;
    res->resumed_step = -1;
    if (W < 1 || rank < 0 || rank >= W)
        return mgpu_err_set(err, -EINVAL, "ddp: rank %d of world size %d", rank, W);
    if (W > 1 &&
        (comm->allreduce_avg == NULL || comm->allreduce_sum == NULL || comm->broadcast == NULL))
        return mgpu_err_set(err, -EINVAL, "ddp: world size %d needs all three collectives", W);
    if ((rc = mgpu_kernels_set_precision(k, cfg->precision, err)) < 0 ||
        (rc = mgpu_train_load_data(cfg, &tr, &ev, err)) < 0)
        return rc;
    if ((rc = mgpu_trainer_create(k, cfg, &tr, (int)B, cfg->seed, &s.t, err)) < 0 ||
        (rc = mgpu_sampler_init(&samp, tr.n, W, rank, cfg->shuffle, cfg->seed, cfg->drop_last,
                                err)) < 0 ||
        (rc = mgpu_k_alloc(k, sizeof h, &s.scratch, err)) < 0)
        goto out;
    s.t->progress = comm->progress;
    void *p_loss = NULL;
    rc = mgpu_k_alloc(k, sizeof(float), &p_loss, err);
    s.last_loss = p_loss;
    if (rc < 0)
        goto out;
    idx = malloc(sizeof *idx * samp.num_samples);
    s.h_params = malloc(sizeof(float) * s.t->model->n_params);
    s.h_state = malloc(sizeof(float) * (s.t->optim->n_state + 1));
    if (idx == NULL || s.h_params == NULL || s.h_state == NULL) {
        rc = mgpu_err_set(err, -ENOMEM, "ddp: cannot allocate the index and host buffers");
        goto out;
    }
    if ((rc = resume_or_broadcast(&s, &h, err)) < 0)
        goto out;
    if (k->backend == MGPU_KBACKEND_CUDA) {
#ifdef MGPU_HAVE_CUDA
        char why[256];
        int graph = mgpu_train_graph_eligible(cfg, samp.num_samples, why, sizeof why);
        if (W > 1 && comm->allreduce_avg_stream == NULL) {
            rc = mgpu_err_set(err, -EINVAL,
                              "ddp: world size %d on a GPU needs allreduce_avg_stream", W);
            goto out;
        }
        if ((rc = mgpu_gpustep_create(s.t, &tr, samp.num_samples, graph,
                                      W > 1 ? comm->allreduce_avg_stream : NULL, comm->ctx, &s.g,
                                      err)) < 0)
            goto out;
        if (!graph && rank == 0)
            mgpu_info("ddp: eager GPU steps, no CUDA graph: %s", why);
#else
        rc =
            mgpu_err_set(err, MGPU_E_DEVICE, "ddp: a CUDA kernels backend in a build without CUDA");
        goto out;
#endif
    }
    if (rank == 0 && cfg->metrics_file[0] != 0) {
        /* A resumed run continues the log of the run it resumes. */
        s.metrics = fopen(cfg->metrics_file, h.status == 1 ? "a" : "w");
        if (s.metrics == NULL) {
            rc =
                mgpu_err_set(err, -errno, "ddp: fopen(%s): %s", cfg->metrics_file, strerror(errno));
            goto out;
        }
    }

    size_t nb = mgpu_sampler_num_batches(&samp, B, cfg->drop_last_batch);
    long long step = (long long)h.step, epoch = (long long)h.epoch;
    long long batch = (long long)h.batch;
    long long planned = cfg->epochs * (long long)nb;
    if (cfg->max_steps > 0 && cfg->max_steps < planned)
        planned = cfg->max_steps;
    if (h.status == 1) {
        res->resumed_step = step;
        if (rank == 0) {
            fprintf(s.out, "resumed from %s at epoch %lld, step %lld\n", cfg->checkpoint, epoch + 1,
                    step);
            fflush(s.out);
        }
    }
    long long evaluated_at = -1;
    int stopped = 0;
    double first_step_unix = 0, timer_t0 = 0;
    int last_loss_kept = 0;
    s.t0 = now_s();
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
                rc = mgpu_trainer_step(s.t, &tr, idx + start, count,
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
                first_step_unix = realtime_s();
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
                if ((rc = reduce_host(&s, &loss, 1, 1, err)) < 0)
                    goto out;
                res->loss = loss;
                if (rank == 0) {
                    double el = now_s() - s.t0, sps = s.samples_this_run / (el > 0 ? el : 1e-9);
                    double eta = (double)(planned - step) * el / (double)s.steps_this_run;
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
                    metrics_line(&s, o);
                }
            }
            if (cfg->checkpoint_interval > 0 && step % cfg->checkpoint_interval == 0 &&
                (rc = save_checkpoint(&s, (uint64_t)epoch, (uint64_t)batch + 1, (uint64_t)step,
                                      err)) < 0)
                goto out;
        }
        if (stopped)
            break;
        if (cfg->checkpoint_interval == 0 &&
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
    res->seconds = now_s() - s.t0;
    if (last_loss_kept) {
        /* The last step's loss, so that the final metrics never report a loss of 0 that no
         * step had (read after the timer stopped: it waits for the device). */
        float loss = 0;
        if ((rc = mgpu_k_copy_to_host(k, &loss, s.last_loss, sizeof loss, err)) < 0 ||
            (rc = reduce_host(&s, &loss, 1, 1, err)) < 0)
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
    /* The final evaluation, unless the last epoch's already saw these parameters; a run
     * stopped by max_steps reports the epoch it stopped in. */
    if (ev.n > 0 && evaluated_at != step &&
        (rc = report_eval(&s, &ev, stopped || epoch == 0 ? epoch : epoch - 1, step, res, err)) < 0)
        goto out;
    res->steps = step;
    res->samples_per_s = s.samples_this_run / (res->seconds > 0 ? res->seconds : 1e-9);
    if (rank == 0) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddBoolToObject(o, "final", 1);
        cJSON_AddNumberToObject(o, "loss", res->loss);
        if (!isnan(res->eval_accuracy))
            cJSON_AddNumberToObject(o, "eval_accuracy", res->eval_accuracy);
        if (!isnan(res->eval_loss))
            cJSON_AddNumberToObject(o, "eval_loss", res->eval_loss);
        cJSON_AddNumberToObject(o, "steps", (double)step);
        cJSON_AddNumberToObject(o, "samples_per_s", res->samples_per_s);
        cJSON_AddNumberToObject(o, "seconds", res->seconds);
        cJSON_AddNumberToObject(o, "world_size", W);
        if (res->timed_steps > 0) {
            cJSON_AddNumberToObject(o, "step_us", res->step_us);
            cJSON_AddNumberToObject(o, "timed_steps", (double)res->timed_steps);
        }
        if (first_step_unix > 0)
            cJSON_AddNumberToObject(o, "first_step_unix_s", first_step_unix);
        cJSON_AddBoolToObject(o, "cuda_graph", res->graphed);
        cJSON_AddBoolToObject(o, "data_in_place", res->in_place);
        cJSON_AddStringToObject(o, "backend", k->ops->name);
        metrics_line(&s, o);
    }
    res->n_params = s.t->model->n_params;
    res->params = malloc(sizeof(float) * res->n_params);
    if (res->params == NULL) {
        rc = mgpu_err_set(err, -ENOMEM, "ddp: cannot allocate the result's parameters");
        goto out;
    }
    rc =
        mgpu_k_copy_to_host(k, res->params, s.t->model->params, sizeof(float) * res->n_params, err);
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
