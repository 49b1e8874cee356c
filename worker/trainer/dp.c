/* dp.c - DataParallel: replicas as threads, scatter / compute / gather-on-0 / step / replicate
 * per batch, separated by barriers. */
#include "dp.h"

#include <cjson/cJSON.h> /* metrics lines */
#include <errno.h>       /* EINVAL, ENOMEM */
#include <math.h>        /* NAN */
#include <pthread.h>     /* pthread_create, pthread_barrier_t */
#include <stdatomic.h>   /* atomic_int */
#include <stdlib.h>      /* calloc */
#include <string.h>      /* memset */
#include <time.h>        /* clock_gettime */

#include "run_util.h" /* mgpu_run_last_epoch, mgpu_run_metrics_line */
#include "sampler.h"  /* mgpu_sampler_* */
#include "train.h"    /* mgpu_trainer_* */

typedef struct dp_shared {
    const mgpu_cfg_t *cfg;
    mgpu_kbackend_t backend;
    int n;
    FILE *out;
    pthread_barrier_t barrier;
    pthread_mutex_t lock; /* out, err, go */
    pthread_cond_t go_cond;
    int go; /* 0: wait, 1: start, -1: abort (not every device thread could be started) */
    atomic_int failed;
    mgpu_err_t err; /* the first failure */
    int rc;
    mgpu_dataset_t tr, ev;
    size_t n_params;
    float **h_grads;   /* per device: its weighted gradient, host memory */
    float *h_params;   /* device 0's parameters after the step */
    float *chunk_loss; /* per device: its chunk's mean loss x its share of the batch */
    FILE *metrics;
    mgpu_dp_result_t *res;
    mgpu_ctx_t *progress; /* written by device 0's thread only */
} dp_shared_t;

typedef struct dp_dev {
    dp_shared_t *sh;
    int id;
} dp_dev_t;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void fail(dp_shared_t *sh, int rc, const mgpu_err_t *e, int dev)
{
    pthread_mutex_lock(&sh->lock);
    if (!atomic_load(&sh->failed)) {
        sh->rc = rc;
        mgpu_err_set(&sh->err, rc, "dp device %d: %.990s", dev, e->msg);
        atomic_store(&sh->failed, 1);
    }
    pthread_mutex_unlock(&sh->lock);
}

/* Every device calls this at the same points; all see the same answer because nobody can set
 * the flag between the first barrier and the read (the second barrier keeps the next writer
 * waiting until everyone has read it). */
static int all_ok(dp_shared_t *sh)
{
    pthread_barrier_wait(&sh->barrier);
    int ok = !atomic_load(&sh->failed);
    pthread_barrier_wait(&sh->barrier);
    return ok;
}

static void metrics_line(dp_shared_t *sh, cJSON *o)
{
    mgpu_run_metrics_line(&sh->metrics, sh->cfg->metrics_file, o);
}

static int evaluate(dp_shared_t *sh, mgpu_trainer_t *t, long long epoch, long long step,
                    mgpu_err_t *err)
{
    double ls, c;
    int rc = mgpu_trainer_evaluate(t, &sh->ev, 0, sh->ev.n, &ls, &c, err);
    if (rc < 0)
        return rc;
    mgpu_ddp_result_t *r = &sh->res->run;
    r->eval_loss = ls / (double)sh->ev.n;
    r->eval_accuracy = sh->cfg->loss == MGPU_LOSS_CROSS_ENTROPY ? c / (double)sh->ev.n : NAN;
    pthread_mutex_lock(&sh->lock);
    if (isnan(r->eval_accuracy))
        fprintf(sh->out, "eval epoch %lld step %lld: loss %.4f on %zu samples\n", epoch + 1, step,
                r->eval_loss, sh->ev.n);
    else
        fprintf(sh->out, "eval epoch %lld step %lld: loss %.4f accuracy %.2f%% on %zu samples\n",
                epoch + 1, step, r->eval_loss, 100 * r->eval_accuracy, sh->ev.n);
    fflush(sh->out);
    pthread_mutex_unlock(&sh->lock);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "epoch", (double)epoch + 1);
    cJSON_AddNumberToObject(o, "step", (double)step);
    cJSON_AddNumberToObject(o, "eval_loss", r->eval_loss);
    if (!isnan(r->eval_accuracy))
        cJSON_AddNumberToObject(o, "eval_accuracy", r->eval_accuracy);
    metrics_line(sh, o);
    return 0;
}

static void *device_main(void *arg)
{
    dp_dev_t *d = arg;
    dp_shared_t *sh = d->sh;
    const mgpu_cfg_t *cfg = sh->cfg;
    mgpu_dp_device_stats_t *st = &sh->res->dev[d->id];
    mgpu_kernels_t *k = NULL;
    mgpu_trainer_t *t = NULL;
    mgpu_sampler_t samp;
    mgpu_err_t e = {0};
    size_t *idx = NULL, B = (size_t)cfg->batch_size;
    size_t chunk_max = (B + (size_t)sh->n - 1) / (size_t)sh->n;
    int rc, n = sh->n, id = d->id;

    /* Nobody enters the barriers before every device thread exists: a barrier waiting for a
     * thread that was never created could not be left. */
    pthread_mutex_lock(&sh->lock);
    while (sh->go == 0)
        pthread_cond_wait(&sh->go_cond, &sh->lock);
    pthread_mutex_unlock(&sh->lock);
    if (sh->go < 0)
        return NULL;

    /* Setup: every device builds its replica; device 0's parameters are copied to all. */
    if ((rc = mgpu_kernels_create(sh->backend, id, &k, &e)) < 0 ||
        (rc = mgpu_kernels_set_precision(k, cfg->precision, &e)) < 0 ||
        (rc = mgpu_trainer_create(k, cfg, &sh->tr, (int)chunk_max, cfg->seed, &t, &e)) < 0 ||
        (rc = mgpu_sampler_init(&samp, sh->tr.n, 1, 0, cfg->shuffle, cfg->seed, cfg->drop_last,
                                &e)) < 0)
        fail(sh, rc, &e, id);
    else if (t->model->n_params != sh->n_params)
        fail(sh, -EINVAL, &(mgpu_err_t){.msg = "replica and gradient buffers disagree in size"},
             id);
    else if ((idx = malloc(sizeof *idx * samp.num_samples)) == NULL)
        fail(sh, -ENOMEM, &(mgpu_err_t){.msg = "cannot allocate the sample indices"}, id);
    else if (id == 0 && (rc = mgpu_k_copy_to_host(k, sh->h_params, t->model->params,
                                                  sizeof(float) * sh->n_params, &e)) < 0)
        fail(sh, rc, &e, id);
    if (!all_ok(sh))
        goto out;
    if (id == 0)
        t->progress = sh->progress; /* its chunk's data and forward */
    if (id != 0 && (rc = mgpu_k_copy_to_device(k, t->model->params, sh->h_params,
                                               sizeof(float) * sh->n_params, &e)) < 0)
        fail(sh, rc, &e, id);
    if (!all_ok(sh))
        goto out;

    size_t nb = mgpu_sampler_num_batches(&samp, B, cfg->drop_last_batch);
    long long planned = cfg->epochs * (long long)nb, step = 0, evaluated_at = -1;
    if (cfg->max_steps > 0 && cfg->max_steps < planned)
        planned = cfg->max_steps;
    double t0 = now_s(), samples = 0;
    int stop = 0;
    long long epoch, stop_e = 0, stop_b = 0; /* the epoch and batch max_steps stopped at */
    for (epoch = 0; epoch < cfg->epochs && !stop; epoch++) {
        if ((rc = mgpu_sampler_indices(&samp, (uint64_t)epoch, idx, &e)) < 0)
            fail(sh, rc, &e, id);
        if (!all_ok(sh))
            goto out;
        for (size_t b = 0; b < nb; b++) {
            if (cfg->max_steps > 0 && step >= cfg->max_steps) {
                stop = 1;
                stop_e = epoch;
                stop_b = (long long)b;
                break;
            }
            size_t start, count;
            mgpu_sampler_batch(&samp, B, b, &start, &count);
            if (id == 0)
                mgpu_progress_step(sh->progress, step + 1);
            /* Scatter: torch.chunk pieces of ceil(count / n) rows; trailing devices may idle. */
            size_t cs = (count + (size_t)n - 1) / (size_t)n;
            size_t lo = (size_t)id * cs < count ? (size_t)id * cs : count;
            size_t hi = lo + cs < count ? lo + cs : count;
            double w = (double)(hi - lo) / (double)count;
            double c0 = now_s();
            sh->chunk_loss[id] = 0;
            if (hi > lo) {
                float l = 0;
                if ((rc = mgpu_trainer_grads(t, &sh->tr, idx + start + lo, hi - lo, &e)) < 0 ||
                    (rc = mgpu_k_scale(k, sh->n_params, (float)w, t->model->grads, &e)) < 0 ||
                    (rc = mgpu_k_copy_to_host(k, sh->h_grads[id], t->model->grads,
                                              sizeof(float) * sh->n_params, &e)) < 0 ||
                    (rc = mgpu_model_read_scalars(t->model, &l, NULL, &e)) < 0)
                    fail(sh, rc, &e, id);
                sh->chunk_loss[id] = (float)(l * w);
                st->samples += (long long)(hi - lo);
                st->compute_s += now_s() - c0;
                c0 = now_s(); /* the print below is not compute */
                if (cfg->demo_prints) {
                    pthread_mutex_lock(&sh->lock);
                    fprintf(sh->out, "\tIn Model: input size [%zu, %d] output size [%zu, %d]\n",
                            hi - lo, t->model->spec.inputs, hi - lo, t->model->spec.outputs);
                    fflush(sh->out);
                    pthread_mutex_unlock(&sh->lock);
                }
            } else {
                memset(sh->h_grads[id], 0, sizeof(float) * sh->n_params);
                c0 = now_s();
            }
            if (!all_ok(sh))
                goto out;
            step++;
            samples += (double)count;
            if (id == 0) {
                /* Gather onto device 0: the sum of the weighted gradients, in device order. */
                double x0 = now_s();
                mgpu_progress_phase(sh->progress, MGPU_PHASE_OPTIMIZER);
                float *g = sh->h_grads[0];
                for (int q = 1; q < n; q++)
                    for (size_t i = 0; i < sh->n_params; i++)
                        g[i] += sh->h_grads[q][i];
                double loss = 0;
                for (int q = 0; q < n; q++)
                    loss += sh->chunk_loss[q];
                if ((rc = mgpu_k_copy_to_device(k, t->model->grads, g, sizeof(float) * sh->n_params,
                                                &e)) < 0 ||
                    (rc = mgpu_optim_step(t->optim, t->model->params, t->model->grads, &e)) < 0 ||
                    (rc = mgpu_k_copy_to_host(k, sh->h_params, t->model->params,
                                              sizeof(float) * sh->n_params, &e)) < 0)
                    fail(sh, rc, &e, id);
                if (cfg->demo_prints) {
                    pthread_mutex_lock(&sh->lock);
                    fprintf(sh->out, "Outside: input size [%zu, %d] output_size [%zu, %d]\n", count,
                            t->model->spec.inputs, count, t->model->spec.outputs);
                    fflush(sh->out);
                    pthread_mutex_unlock(&sh->lock);
                }
                if (cfg->log_interval > 0 && step % cfg->log_interval == 0) {
                    double el = now_s() - t0, sps = samples / (el > 0 ? el : 1e-9);
                    sh->res->run.loss = loss;
                    pthread_mutex_lock(&sh->lock);
                    fprintf(sh->out,
                            "epoch %lld/%lld step %lld/%lld loss %.4f samples/s %.0f eta %.1fs\n",
                            epoch + 1, cfg->epochs, step, planned, loss, sps,
                            (double)(planned - step) * el / (double)step);
                    fflush(sh->out);
                    pthread_mutex_unlock(&sh->lock);
                    cJSON *o = cJSON_CreateObject();
                    cJSON_AddNumberToObject(o, "epoch", (double)epoch + 1);
                    cJSON_AddNumberToObject(o, "step", (double)step);
                    cJSON_AddNumberToObject(o, "loss", loss);
                    cJSON_AddNumberToObject(o, "samples_per_s", sps);
                    cJSON_AddNumberToObject(o, "elapsed_s", el);
                    metrics_line(sh, o);
                }
                st->extra_s += now_s() - x0;
            }
            if (!all_ok(sh))
                goto out;
            /* Replicate. */
            if (id != 0 && (rc = mgpu_k_copy_to_device(k, t->model->params, sh->h_params,
                                                       sizeof(float) * sh->n_params, &e)) < 0)
                fail(sh, rc, &e, id);
            if (!all_ok(sh))
                goto out;
        }
        if (!stop && id == 0 && sh->ev.n > 0 && cfg->eval_interval > 0 &&
            (epoch + 1) % cfg->eval_interval == 0) {
            double x0 = now_s();
            mgpu_progress_phase(sh->progress, MGPU_PHASE_EVAL);
            if ((rc = evaluate(sh, t, epoch, step, &e)) < 0)
                fail(sh, rc, &e, id);
            evaluated_at = step;
            st->extra_s += now_s() - x0;
        }
        if (!all_ok(sh))
            goto out;
    }
    if (id == 0) {
        mgpu_ddp_result_t *r = &sh->res->run;
        r->seconds = now_s() - t0;
        r->steps = step;
        r->samples_per_s = samples / (r->seconds > 0 ? r->seconds : 1e-9);
        if (sh->ev.n > 0 && evaluated_at != step)
            mgpu_progress_phase(sh->progress, MGPU_PHASE_EVAL);
        if (sh->ev.n > 0 && evaluated_at != step &&
            (rc = evaluate(sh, t, mgpu_run_last_epoch(stop, stop ? stop_e : epoch, stop_b), step,
                           &e)) < 0)
            fail(sh, rc, &e, id);
        r->n_params = sh->n_params;
        r->params = malloc(sizeof(float) * sh->n_params);
        if (r->params != NULL)
            memcpy(r->params, sh->h_params, sizeof(float) * sh->n_params);
        else
            fail(sh, -ENOMEM, &(mgpu_err_t){.msg = "cannot allocate the result"}, id);
        mgpu_progress_phase(sh->progress, MGPU_PHASE_DONE);
    }
out:
    free(idx);
    mgpu_trainer_destroy(t);
    mgpu_kernels_destroy(k);
    return NULL;
}

static void report(dp_shared_t *sh)
{
    const mgpu_dp_result_t *r = sh->res;
    double total = 0;
    for (int i = 0; i < sh->n; i++)
        total += r->dev[i].compute_s + r->dev[i].extra_s;
    fprintf(sh->out, "dp: %d devices, %lld steps, batch %lld scattered in chunks of %lld\n", sh->n,
            r->run.steps, sh->cfg->batch_size, (sh->cfg->batch_size + sh->n - 1) / sh->n);
    for (int i = 0; i < sh->n; i++) {
        const mgpu_dp_device_stats_t *d = &r->dev[i];
        fprintf(sh->out,
                "dp: device %d: %lld samples, compute %.3f ms%s%.3f ms: %.0f%% of all device "
                "time\n",
                i, d->samples, 1e3 * d->compute_s,
                i == 0 ? ", gather + step + replicate + eval " : ", extra ", 1e3 * d->extra_s,
                total > 0 ? 100 * (d->compute_s + d->extra_s) / total : 0.0);
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "final", 1);
    cJSON_AddStringToObject(o, "mode", "dp");
    if (!isnan(r->run.loss))
        cJSON_AddNumberToObject(o, "loss", r->run.loss);
    if (!isnan(r->run.eval_accuracy))
        cJSON_AddNumberToObject(o, "eval_accuracy", r->run.eval_accuracy);
    if (!isnan(r->run.eval_loss))
        cJSON_AddNumberToObject(o, "eval_loss", r->run.eval_loss);
    cJSON_AddNumberToObject(o, "steps", (double)r->run.steps);
    cJSON_AddNumberToObject(o, "samples_per_s", r->run.samples_per_s);
    cJSON_AddNumberToObject(o, "seconds", r->run.seconds);
    cJSON_AddNumberToObject(o, "world_size", 1);
    cJSON_AddNumberToObject(o, "devices", sh->n);
    cJSON *shares = cJSON_AddArrayToObject(o, "device_share");
    for (int i = 0; i < sh->n; i++)
        cJSON_AddItemToArray(
            shares, cJSON_CreateNumber(total > 0 ? (r->dev[i].compute_s + r->dev[i].extra_s) / total
                                                 : 0.0));
    metrics_line(sh, o);
}

int mgpu_dp_run(mgpu_kbackend_t backend, const mgpu_cfg_t *cfg, int n_devices, FILE *out,
                mgpu_ctx_t *progress, mgpu_dp_result_t *result, mgpu_err_t *err)
{
    mgpu_dp_result_t local, *res = result ? result : &local;
    dp_shared_t sh = {.cfg = cfg,
                      .backend = backend,
                      .n = n_devices,
                      .out = out ? out : stdout,
                      .progress = progress};
    pthread_t th[MGPU_DP_MAX_DEVICES];
    dp_dev_t devs[MGPU_DP_MAX_DEVICES];
    int rc, started = 0;

    memset(res, 0, sizeof *res);
    res->n_devices = n_devices;
    res->run.eval_loss = res->run.eval_accuracy = NAN;
    res->run.resumed_step = -1;
    if (n_devices < 1 || n_devices > MGPU_DP_MAX_DEVICES)
        return mgpu_err_set(err, -EINVAL, "dp: %d devices, expected 1..%d", n_devices,
                            MGPU_DP_MAX_DEVICES);
    if (cfg->checkpoint[0] != 0)
        return mgpu_err_set(err, MGPU_E_CONFIG,
                            "%s: checkpoint is not supported with mode = dp; use mode = ddp or "
                            "remove checkpoint",
                            cfg->file);
    sh.res = res;
    if ((rc = mgpu_train_load_data(cfg, &sh.tr, &sh.ev, err)) < 0)
        return rc;
    {
        /* The parameter count, from the spec alone (no backend needed). */
        mgpu_model_spec_t ms;
        mgpu_train_model_spec(cfg, &sh.tr, &ms);
        size_t np = 0;
        int in = ms.inputs;
        for (int l = 0; l <= ms.n_hidden; l++) {
            int o = l == ms.n_hidden ? ms.outputs : ms.hidden[l];
            np += (size_t)o * in + o;
            in = o;
        }
        sh.n_params = np;
    }
    sh.h_grads = calloc((size_t)n_devices, sizeof *sh.h_grads);
    sh.h_params = malloc(sizeof(float) * sh.n_params);
    sh.chunk_loss = calloc((size_t)n_devices, sizeof(float));
    rc = sh.h_grads && sh.h_params && sh.chunk_loss ? 0 : -ENOMEM;
    for (int i = 0; rc == 0 && i < n_devices; i++)
        if ((sh.h_grads[i] = malloc(sizeof(float) * sh.n_params)) == NULL)
            rc = -ENOMEM;
    if (rc < 0) {
        mgpu_err_set(err, rc, "dp: cannot allocate gradient buffers for %d devices", n_devices);
        goto out;
    }
    if (cfg->metrics_file[0] != 0 && (sh.metrics = fopen(cfg->metrics_file, "w")) == NULL) {
        rc = mgpu_err_set(err, -errno, "dp: fopen(%s): %s", cfg->metrics_file, strerror(errno));
        goto out;
    }
    pthread_barrier_init(&sh.barrier, NULL, (unsigned)n_devices);
    pthread_mutex_init(&sh.lock, NULL);
    pthread_cond_init(&sh.go_cond, NULL);
    for (; started < n_devices; started++) {
        devs[started] = (dp_dev_t){.sh = &sh, .id = started};
        if (pthread_create(&th[started], NULL, device_main, &devs[started]) != 0)
            break;
    }
    pthread_mutex_lock(&sh.lock);
    sh.go = started == n_devices ? 1 : -1;
    pthread_cond_broadcast(&sh.go_cond);
    pthread_mutex_unlock(&sh.lock);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    pthread_cond_destroy(&sh.go_cond);
    pthread_barrier_destroy(&sh.barrier);
    pthread_mutex_destroy(&sh.lock);
    if (started < n_devices) {
        rc = mgpu_err_set(err, -EAGAIN, "dp: pthread_create for device %d failed", started);
    } else if (atomic_load(&sh.failed)) {
        rc = sh.rc;
        if (err != NULL)
            *err = sh.err;
    } else {
        report(&sh);
        rc = 0;
    }
out:
    if (sh.metrics != NULL)
        fclose(sh.metrics);
    for (int i = 0; sh.h_grads && i < n_devices; i++)
        free(sh.h_grads[i]);
    free(sh.h_grads);
    free(sh.h_params);
    free(sh.chunk_loss);
    mgpu_data_free(&sh.tr);
    mgpu_data_free(&sh.ev);
    if (rc < 0 || result == NULL) {
        free(res->run.params);
        res->run.params = NULL;
    }
    return rc;
}
