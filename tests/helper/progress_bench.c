/* progress_bench.c - what libmgpu's progress calls cost: nanoseconds per mgpu_progress_step,
 * _phase, _label and _bucket, and per collective recorded (a one-float all-reduce at world
 * size 1, where the collective itself is nothing but the record), each with the page attached
 * to a shared file (as under mgpu-launch), on the private page (any other launcher) and off
 * (MGPU_PROGRESS=0). Medians of ROUNDS rounds of N calls.
 *
 *   progress_bench [N (default 2000000)] [ROUNDS (default 7)]
 *
 * Run by tests/bench/progress_bench.sh. */
#include <stdio.h>    /* printf */
#include <stdlib.h>   /* atol, qsort, setenv */
#include <sys/mman.h> /* memfd_create */
#include <time.h>     /* clock_gettime */
#include <unistd.h>   /* ftruncate, getpid */

#include "mgpu.h"     /* mgpu_init, mgpu_progress_* */
#include "progress.h" /* MGPU_PROGRESS_PAGE */

#define ROUNDS_MAX 101

enum { STEP, PHASE, LABEL, BUCKET, COLL, CALLS };
static const char *const names[CALLS] = {"mgpu_progress_step", "mgpu_progress_phase",
                                         "mgpu_progress_label", "mgpu_progress_bucket",
                                         "collective record"};

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return 1e9 * (double)t.tv_sec + (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* ns per call of `call` on ctx/comm, one round of n calls. */
static double round_ns(int call, mgpu_ctx_t *ctx, mgpu_comm_t *comm, long n)
{
    static const char *const labels[2] = {"epoch 1", "epoch 2"};
    mgpu_err_t err;
    float x = 1;
    double t0 = now_ns();

    switch (call) {
    case STEP:
        for (long i = 0; i < n; i++)
            mgpu_progress_step(ctx, i);
        break;
    case PHASE:
        for (long i = 0; i < n; i++)
            mgpu_progress_phase(ctx, (mgpu_phase_t)(MGPU_PHASE_DATA + (i & 3)));
        break;
    case LABEL:
        for (long i = 0; i < n; i++)
            mgpu_progress_label(ctx, labels[i & 1]);
        break;
    case BUCKET:
        for (long i = 0; i < n; i++)
            mgpu_progress_bucket(ctx, (int)(i & 7));
        break;
    default:
        for (long i = 0; i < n; i++)
            if (mgpu_allreduce_f32(comm, &x, 1, MGPU_SUM, NULL, &err) < 0) {
                fprintf(stderr, "progress_bench: %s\n", err.msg);
                return -1;
            }
        break;
    }
    return (now_ns() - t0) / (double)n;
}

/* One column: the medians of every call in the mode the environment sets now. */
static int column(long n, int rounds, double med[CALLS])
{
    mgpu_init_opts_t o = {0, 10};
    mgpu_ctx_t *ctx = NULL;
    mgpu_comm_t *comm = NULL;
    mgpu_err_t err;
    double r[ROUNDS_MAX];

    if (mgpu_init(&o, &ctx, &err) < 0 ||
        mgpu_comm_create(ctx, MGPU_BACKEND_CPU, 30, &comm, &err) < 0) {
        fprintf(stderr, "progress_bench: %s\n", err.msg);
        return -1;
    }
    for (int c = 0; c < CALLS; c++) {
        round_ns(c, ctx, comm, n / 10); /* warm */
        for (int k = 0; k < rounds; k++)
            if ((r[k] = round_ns(c, ctx, comm, n)) < 0)
                return -1;
        qsort(r, (size_t)rounds, sizeof *r, cmp);
        med[c] = r[rounds / 2];
    }
    mgpu_comm_destroy(comm);
    mgpu_finalize(ctx);
    return 0;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 2000000;
    int rounds = argc > 2 ? atoi(argv[2]) : 7, fd;
    double attached[CALLS], priv[CALLS], off[CALLS];
    char path[64];

    if (n < 10 || rounds < 1 || rounds > ROUNDS_MAX) {
        fprintf(stderr, "usage: progress_bench [N >= 10] [ROUNDS (1 to %d)]\n", ROUNDS_MAX);
        return 2;
    }
    unsetenv("MGPU_STORE_ADDR");
    if ((fd = memfd_create("mgpu-progress-bench", MFD_CLOEXEC)) < 0 ||
        ftruncate(fd, MGPU_PROGRESS_PAGE) < 0) {
        perror("progress_bench: memfd_create");
        return 1;
    }
    snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)getpid(), fd);
    setenv("MGPU_PROGRESS", "1", 1);
    setenv(MGPU_PROGRESS_ENV_FILE, path, 1);
    setenv(MGPU_PROGRESS_ENV_SLOT, "0", 1);
    if (column(n, rounds, attached) < 0)
        return 1;
    unsetenv(MGPU_PROGRESS_ENV_FILE);
    unsetenv(MGPU_PROGRESS_ENV_SLOT);
    if (column(n, rounds, priv) < 0)
        return 1;
    setenv("MGPU_PROGRESS", "0", 1);
    if (column(n, rounds, off) < 0)
        return 1;
    printf("ns per call, median of %d rounds of %ld calls\n", rounds, n);
    printf("%-22s %10s %10s %10s\n", "call", "attached", "private", "off");
    for (int c = 0; c < CALLS; c++)
        printf("%-22s %10.1f %10.1f %10.1f\n", names[c], attached[c], priv[c], off[c]);
    return 0;
}
