/* run_util.c - what the MLP's and the GPT's training loops share: clocks, host-side
 * collectives, metrics lines, the checkpoint's exchange and write, progress rates. */
#include "run_util.h"

#include <cjson/cJSON.h> /* metrics lines */
#include <errno.h>       /* ENOENT, EINVAL, ENOMEM */
#include <math.h>        /* NAN */
#include <signal.h>      /* sigprocmask, sigpending, sigtimedwait */
#include <stdlib.h>      /* malloc */
#include <string.h>      /* memset, strerror */
#include <sys/stat.h>    /* fstat */
#include <sys/uio.h>     /* struct iovec */
#include <time.h>        /* clock_gettime */
#include <unistd.h>      /* dup, ftruncate, close */

#include "atomic_file.h" /* mgpu_atomic_file_write */
#include "log.h"         /* mgpu_warn */

double mgpu_run_now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

double mgpu_run_realtime_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int mgpu_run_check_comm(const char *who, const mgpu_ddp_comm_t *comm, mgpu_err_t *err)
{
    int W = comm->world_size, rank = comm->rank;
    if (W < 1 || rank < 0 || rank >= W)
        return mgpu_err_set(err, -EINVAL, "%s: rank %d of world size %d", who, rank, W);
    if (W > 1 &&
        (comm->allreduce_avg == NULL || comm->allreduce_sum == NULL || comm->broadcast == NULL))
        return mgpu_err_set(err, -EINVAL, "%s: world size %d needs all three collectives", who, W);
    return 0;
}

void mgpu_run_result_init(mgpu_ddp_result_t *res)
{
    memset(res, 0, sizeof *res);
    res->loss = res->eval_loss = res->eval_accuracy = NAN; /* NAN: no step ran */
    res->resumed_step = -1;
}

int mgpu_run_bcast_host(mgpu_kernels_t *k, const mgpu_ddp_comm_t *comm, void *scratch, void *host,
                        size_t bytes, mgpu_err_t *err)
{
    int rc;
    if (comm->world_size == 1)
        return 0;
    if ((rc = mgpu_k_copy_to_device(k, scratch, host, bytes, err)) < 0 ||
        (rc = comm->broadcast(comm->ctx, scratch, bytes, 0, err)) < 0)
        return rc;
    return mgpu_k_copy_to_host(k, host, scratch, bytes, err);
}

int mgpu_run_reduce_host(mgpu_kernels_t *k, const mgpu_ddp_comm_t *comm, void *scratch, float *v,
                         size_t n, int average, mgpu_err_t *err)
{
    int rc;
    if (comm->world_size == 1)
        return 0;
    if ((rc = mgpu_k_copy_to_device(k, scratch, v, sizeof(float) * n, err)) < 0 ||
        (rc = (average ? comm->allreduce_avg : comm->allreduce_sum)(comm->ctx, scratch, n, err)) <
            0)
        return rc;
    return mgpu_k_copy_to_host(k, v, scratch, sizeof(float) * n, err);
}

/* A resumed run's metrics file as the checkpoint left the run: the lines of steps after
 * resumed_step (a run killed after its last checkpoint logged them, and the run goes over
 * them again) and final records go, so that every step is in the file once. */
static int metrics_cut(const char *who, const char *path, long long resumed_step, mgpu_err_t *err)
{
    FILE *in = fopen(path, "r");
    char *line = NULL, *kept = NULL;
    size_t cap = 0, n = 0;
    ssize_t len;
    int rc = 0;
    if (in == NULL)
        return errno == ENOENT
                   ? 0
                   : mgpu_err_set(err, -errno, "%s: fopen(%s): %s", who, path, strerror(errno));
    FILE *out = open_memstream(&kept, &n);
    if (out == NULL) {
        fclose(in);
        return mgpu_err_set(err, -ENOMEM, "%s: open_memstream failed", who);
    }
    while ((len = getline(&line, &cap, in)) > 0) {
        cJSON *o = cJSON_Parse(line);
        const cJSON *step = cJSON_GetObjectItemCaseSensitive(o, "step");
        int drop = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "final")) ||
                   (cJSON_IsNumber(step) && step->valuedouble > (double)resumed_step);
        cJSON_Delete(o);
        if (!drop)
            fwrite(line, 1, (size_t)len, out);
    }
    free(line);
    fclose(in);
    fclose(out);
    struct iovec iov = {.iov_base = kept, .iov_len = n};
    rc = mgpu_atomic_file_write(path, &iov, 1, MGPU_ATOMIC_FILE_NO_SYNC, err);
    free(kept);
    return rc;
}

int mgpu_run_metrics_open(const char *who, const mgpu_cfg_t *cfg, int rank, long long resumed_step,
                          FILE **f, mgpu_err_t *err)
{
    int rc;
    *f = NULL;
    if (rank != 0 || cfg->metrics_file[0] == 0)
        return 0;
    if (resumed_step >= 0 && (rc = metrics_cut(who, cfg->metrics_file, resumed_step, err)) < 0)
        return rc;
    *f = fopen(cfg->metrics_file, resumed_step >= 0 ? "a" : "w");
    if (*f == NULL)
        return mgpu_err_set(err, -errno, "%s: fopen(%s): %s", who, cfg->metrics_file,
                            strerror(errno));
    return 0;
}

void mgpu_run_metrics_line(FILE **f, const char *path, cJSON *obj)
{
    char *line = *f != NULL ? cJSON_PrintUnformatted(obj) : NULL;
    struct stat st;

    cJSON_Delete(obj);
    if (line == NULL)
        return;
    /* every line before this one was flushed whole: the file ends where it starts */
    off_t at = fstat(fileno(*f), &st) == 0 ? st.st_size : -1;
    errno = 0;
    if ((fputs(line, *f) < 0 || fputc('\n', *f) == EOF || fflush(*f) != 0) && errno != 0) {
        /* A full disk, a quota: said once; the file keeps its whole lines only, and the run
         * goes on without it. */
        int e = errno, fd = dup(fileno(*f));
        fclose(*f); /* which may write what the buffer still held: cut after it */
        *f = NULL;
        if (at >= 0 && (fd < 0 || ftruncate(fd, at) != 0))
            at = -1;
        if (fd >= 0)
            close(fd);
        mgpu_warn("metrics_file %s: %s; the records from here on are not in it%s", path,
                  strerror(e), at >= 0 ? "" : " (its last line may be cut)");
    }
    cJSON_free(line);
}

/* host_state: state is rank 0's host memory, which only rank 0 fills (zero = 1 scatters it). */
static int resume_or_broadcast(mgpu_kernels_t *k, const mgpu_ddp_comm_t *comm, void *scratch,
                               const char *checkpoint, mgpu_run_ckpt_fits_fn fits, void *fits_ctx,
                               float *params, size_t n_params, float *state, size_t n_state,
                               int host_state, mgpu_run_resume_t *h, mgpu_err_t *err)
{
    int rc;

    memset(h, 0, sizeof *h);
    if (comm->rank == 0 && checkpoint[0] != 0) {
        mgpu_ckpt_t c;
        mgpu_err_t e = {0};
        rc = mgpu_ckpt_read(checkpoint, &c, &e);
        if (rc == -ENOENT) {
            h->status = 0;
        } else if (rc < 0) {
            h->status = -1;
            snprintf(h->msg, sizeof h->msg, "%.1000s", e.msg);
        } else if (!fits(fits_ctx, &c, h->msg, sizeof h->msg)) {
            h->status = -1;
        } else {
            h->status = 1;
            h->epoch = c.epoch;
            h->batch = c.batch_in_epoch;
            h->step = c.step;
            h->optim_step = c.optim_step;
            h->world_size = (int32_t)c.world_size;
            h->batch_per_rank = (int32_t)c.batch_per_rank;
            if (host_state && c.n_state > 0)
                memcpy(state, c.state, sizeof(float) * c.n_state);
            if ((rc = mgpu_k_copy_to_device(k, params, c.params, sizeof(float) * c.n_params, &e)) <
                    0 ||
                (!host_state && (rc = mgpu_k_copy_to_device(k, state, c.state,
                                                            sizeof(float) * c.n_state, &e)) < 0)) {
                h->status = -1;
                snprintf(h->msg, sizeof h->msg, "%.1000s", e.msg);
            }
        }
        mgpu_ckpt_free(&c); /* zeroed by a failed read: always safe */
    }
    if ((rc = mgpu_run_bcast_host(k, comm, scratch, h, sizeof *h, err)) < 0)
        return rc;
    if (h->status < 0)
        return mgpu_err_set(err, MGPU_E_CONFIG, "%s%s",
                            comm->rank == 0 ? "" : "rank 0 cannot resume: ", h->msg);
    if (comm->world_size > 1) {
        if ((rc = comm->broadcast(comm->ctx, params, sizeof(float) * n_params, 0, err)) < 0)
            return rc;
        if (!host_state && h->status == 1 && n_state > 0 &&
            (rc = comm->broadcast(comm->ctx, state, sizeof(float) * n_state, 0, err)) < 0)
            return rc;
    }
    return 0;
}

int mgpu_run_resume_or_broadcast(mgpu_kernels_t *k, const mgpu_ddp_comm_t *comm, void *scratch,
                                 const char *checkpoint, mgpu_run_ckpt_fits_fn fits, void *fits_ctx,
                                 float *params, size_t n_params, float *state, size_t n_state,
                                 mgpu_run_resume_t *h, mgpu_err_t *err)
{
    return resume_or_broadcast(k, comm, scratch, checkpoint, fits, fits_ctx, params, n_params,
                               state, n_state, 0, h, err);
}

int mgpu_run_resume_host_state(mgpu_kernels_t *k, const mgpu_ddp_comm_t *comm, void *scratch,
                               const char *checkpoint, mgpu_run_ckpt_fits_fn fits, void *fits_ctx,
                               float *params, size_t n_params, float *state_host, size_t n_state,
                               mgpu_run_resume_t *h, mgpu_err_t *err)
{
    return resume_or_broadcast(k, comm, scratch, checkpoint, fits, fits_ctx, params, n_params,
                               state_host, n_state, 1, h, err);
}

int mgpu_run_checkpoint_write(mgpu_kernels_t *k, const char *path, mgpu_ckpt_t *c,
                              const float *params, const float *state, mgpu_err_t *err)
{
    int rc;
    if ((rc = mgpu_k_copy_to_host(k, c->params, params, sizeof(float) * c->n_params, err)) < 0 ||
        (rc = mgpu_k_copy_to_host(k, c->state, state, sizeof(float) * c->n_state, err)) < 0)
        return rc;
    return mgpu_ckpt_write(path, c, err);
}

void mgpu_run_print_resumed(FILE *out, const char *checkpoint, long long epoch, long long step)
{
    fprintf(out, "resumed from %s at epoch %lld, step %lld\n", checkpoint, epoch + 1, step);
    fflush(out);
}

double mgpu_run_rate(double amount, double seconds)
{
    return amount / (seconds > 0 ? seconds : 1e-9);
}

int mgpu_run_rescale_position(FILE *out, const mgpu_run_place_t *then, const mgpu_run_place_t *now,
                              long long per_epoch, long long *epoch, long long *batch)
{
    const long long b_then = then->batch_per_rank > 0 ? then->batch_per_rank : now->batch_per_rank;
    const long long seen = (long long)then->ranks * b_then,
                    step = (long long)now->ranks * now->batch_per_rank;
    if (then->ranks <= 0 || seen == step || *batch == 0)
        return 0;
    long long was = *batch, at = was * seen / step;
    if (at >= per_epoch)
        (*epoch)++, at = 0;
    *batch = at;
    if (out == NULL)
        return 1;
    if (b_then == now->batch_per_rank)
        fprintf(out,
                "the checkpoint was written by %d ranks, this run has %d: epoch %lld goes on from "
                "batch %lld of %lld (as many samples as %lld batches of %d ranks, rounded down)\n",
                then->ranks, now->ranks, *epoch + 1, at, per_epoch, was, then->ranks);
    else
        fprintf(out,
                "the checkpoint was written by %d ranks of %lld samples a batch, this run has %d "
                "of %lld: epoch %lld goes on from batch %lld of %lld (as many samples as %lld "
                "batches of %lld, rounded down)\n",
                then->ranks, b_then, now->ranks, now->batch_per_rank, *epoch + 1, at, per_epoch,
                was, seen);
    fflush(out);
    return 1;
}

long long mgpu_run_last_epoch(int stopped, long long epoch, long long batch)
{
    if (stopped && batch > 0)
        return epoch;
    return epoch > 0 ? epoch - 1 : 0;
}

void mgpu_run_pace(double t0, double amount, long long planned, long long step, long long steps_run,
                   double *elapsed, double *rate, double *eta)
{
    double el = mgpu_run_now_s() - t0;
    *elapsed = el;
    *rate = mgpu_run_rate(amount, el);
    *eta = (double)(planned - step) * el / (double)steps_run;
}

int mgpu_run_result_params(mgpu_kernels_t *k, const char *who, const float *params, size_t n_params,
                           mgpu_ddp_result_t *res, mgpu_err_t *err)
{
    res->n_params = n_params;
    res->params = malloc(sizeof(float) * n_params);
    if (res->params == NULL)
        return mgpu_err_set(err, -ENOMEM, "%s: cannot allocate the result's parameters", who);
    return mgpu_k_copy_to_host(k, res->params, params, sizeof(float) * n_params, err);
}

static void user_signals(sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, SIGUSR1);
    sigaddset(set, SIGUSR2);
}

void mgpu_run_signals_hold(void)
{
    sigset_t set;
    user_signals(&set);
    sigprocmask(SIG_BLOCK, &set, NULL);
}

int mgpu_run_signal_checkpoint(FILE *out, const mgpu_cfg_t *cfg, int rank, long long step)
{
    sigset_t set, pending;
    const struct timespec now = {0, 0};
    int sig, got = 0;
    user_signals(&set);
    if (sigpending(&pending) != 0 ||
        (!sigismember(&pending, SIGUSR1) && !sigismember(&pending, SIGUSR2)))
        return 0;
    while ((sig = sigtimedwait(&set, NULL, &now)) > 0)
        got = sig;
    if (got == 0)
        return 0;
    const char *name = got == SIGUSR1 ? "SIGUSR1" : "SIGUSR2";
    const int just_written = cfg->checkpoint_interval > 0 && step % cfg->checkpoint_interval == 0;
    const int write = cfg->checkpoint[0] != 0 && !cfg->zero && !just_written;
    if (rank == 0 && out != NULL) {
        if (cfg->checkpoint[0] == 0)
            fprintf(out, "%s after step %lld: no checkpoint file is set; the run goes on\n", name,
                    step);
        else if (cfg->zero)
            fprintf(out,
                    "%s after step %lld: with zero = 1 a checkpoint needs every rank at one step, "
                    "so only checkpoint_interval's steps write one; the run goes on\n",
                    name, step);
        else
            fprintf(out, "%s after step %lld: checkpoint %s%s; the run goes on\n", name, step,
                    cfg->checkpoint, just_written ? " (just written)" : "");
        fflush(out);
    }
    return write;
}
