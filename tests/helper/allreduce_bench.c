/* allreduce_bench.c - latency and bandwidth of libmgpu's CPU all-reduce (float32, sum).
 *
 *   allreduce_bench -n 4 [--min 4K] [--max 64M] [--seconds 0.3]   forks 4 ranks itself
 *   mgpu-launch --nproc_per_node=4 -- allreduce_bench ...           or runs as one rank
 *
 * Each rank goes through the public API (mgpu_init, mgpu_comm_create(CPU)). Per size: two
 * warm-up calls, then enough timed calls to fill about --seconds; the time reported is the
 * slowest rank's mean. Like nccl-tests, it checks its own results: one more call on known
 * integer data, compared exactly, counted in the #wrong column. Rank 0 prints one line per
 * size: bytes, iterations, microseconds per call, algorithm bandwidth (bytes / time, GB/s =
 * 1e9 B/s) and bus bandwidth (algbw * 2(W-1)/W, what each rank's link carries in a ring). */
#include <errno.h>    /* errno */
#include <sched.h>    /* sched_setaffinity */
#include <stdio.h>    /* printf */
#include <stdlib.h>   /* strtoull, setenv */
#include <string.h>   /* strcmp */
#include <sys/wait.h> /* waitpid */
#include <unistd.h>   /* fork */

#include "clock.h" /* mgpu_clock_mono */
#include "mgpu.h"  /* mgpu_init, mgpu_allreduce_f32 */

typedef struct bench_opts {
    int nproc; /* 0: be one rank of an already launched job */
    size_t min, max;
    double seconds;
} bench_opts_t;

static int bench_size(const char *s, size_t *out)
{
    char *end;
    unsigned long long v;

    errno = 0;
    v = strtoull(s, &end, 10);
    if (end == s || errno)
        return -1;
    if (*end == 'K' || *end == 'k')
        v <<= 10, end++;
    else if (*end == 'M' || *end == 'm')
        v <<= 20, end++;
    else if (*end == 'G' || *end == 'g')
        v <<= 30, end++;
    if (*end != '\0' || v < 4)
        return -1;
    *out = (size_t)v;
    return 0;
}

static float bench_value(int rank, size_t i)
{
    return (float)((long)((i * 7 + (size_t)rank * 13) % 1000) - 500);
}

static int bench_fail(int rank, const char *what, const mgpu_err_t *err)
{
    fprintf(stderr, "allreduce_bench: rank %d: %s: %s\n", rank, what, err->msg);
    return 1;
}

static int bench_rank(const bench_opts_t *o)
{
    mgpu_init_opts_t io = {0, 60};
    mgpu_ctx_t *ctx = NULL;
    mgpu_comm_t *comm = NULL;
    mgpu_err_t err = {0, ""};
    const mgpu_rank_info_t *ri;
    float *buf;
    double *times;
    int rank, world, rc = 0;

    if (mgpu_init(&io, &ctx, &err) < 0)
        return bench_fail(-1, "mgpu_init", &err);
    ri = mgpu_rank(ctx);
    rank = ri->rank;
    world = ri->world_size;
    if (mgpu_comm_create(ctx, MGPU_BACKEND_CPU, 60, &comm, &err) < 0) {
        mgpu_finalize(ctx);
        return bench_fail(rank, "mgpu_comm_create", &err);
    }
    buf = malloc(o->max);
    times = malloc((size_t)world * sizeof *times);
    if (buf == NULL || times == NULL) {
        fprintf(stderr, "allreduce_bench: out of memory\n");
        return 1;
    }
    if (rank == 0)
        printf("# mgpu CPU all-reduce (%s), float32 sum, %d ranks on %d node%s (%s)\n"
               "# %12s %8s %12s %10s %10s %7s\n",
               ri->nnodes > 1 ? "shared memory + TCP between nodes" : "shared memory", world,
               ri->nnodes, ri->nnodes > 1 ? "s" : "", ri->source, "bytes", "iters", "time_us",
               "algbw_GB/s", "busbw_GB/s", "#wrong");
    for (size_t bytes = o->min; bytes <= o->max && rc == 0; bytes *= 4) {
        size_t n = bytes / sizeof(float);
        long iters, wrong = 0;
        double t, tmax = 0;

        for (size_t i = 0; i < n; i++)
            buf[i] = bench_value(rank, i);
        /* Warm-up; the first call also faults the pages in. Its duration, agreed on by all
         * ranks (the slowest), sizes the timed loop so every rank runs the same count. */
        t = mgpu_clock_mono();
        for (int w = 0; w < 2 && rc == 0; w++)
            rc = mgpu_allreduce_f32(comm, buf, n, MGPU_SUM, NULL, &err);
        t = (mgpu_clock_mono() - t) / 2;
        if (rc == 0)
            rc = mgpu_allgather(comm, &t, times, sizeof t, NULL, &err);
        if (rc < 0)
            break;
        for (int q = 0; q < world; q++)
            tmax = times[q] > tmax ? times[q] : tmax;
        iters = (long)(o->seconds / (tmax > 1e-7 ? tmax : 1e-7));
        iters = iters < 5 ? 5 : iters > 20000 ? 20000 : iters;
        if ((rc = mgpu_barrier(comm, &err)) < 0)
            break;
        t = mgpu_clock_mono();
        for (long it = 0; it < iters && rc == 0; it++)
            rc = mgpu_allreduce_f32(comm, buf, n, MGPU_SUM, NULL, &err);
        t = (mgpu_clock_mono() - t) / (double)iters;
        if (rc == 0)
            rc = mgpu_allgather(comm, &t, times, sizeof t, NULL, &err);
        if (rc < 0)
            break;
        tmax = 0;
        for (int q = 0; q < world; q++)
            tmax = times[q] > tmax ? times[q] : tmax;
        /* Check: integers, so the exact sum is known. */
        for (size_t i = 0; i < n; i++)
            buf[i] = bench_value(rank, i);
        if ((rc = mgpu_allreduce_f32(comm, buf, n, MGPU_SUM, NULL, &err)) < 0)
            break;
        for (size_t i = 0; i < n; i++) {
            float want = 0;
            for (int q = 0; q < world; q++)
                want += bench_value(q, i);
            wrong += buf[i] != want;
        }
        {
            double lw = (double)wrong, sum_wrong = 0;
            double *all = times;
            if ((rc = mgpu_allgather(comm, &lw, all, sizeof lw, NULL, &err)) < 0)
                break;
            for (int q = 0; q < world; q++)
                sum_wrong += all[q];
            wrong = (long)sum_wrong;
        }
        if (rank == 0) {
            double algbw = (double)bytes / tmax / 1e9;
            printf("  %12zu %8ld %12.1f %10.3f %10.3f %7ld\n", bytes, iters, tmax * 1e6, algbw,
                   algbw * 2.0 * (world - 1) / world, wrong);
            fflush(stdout);
        }
    }
    if (rc < 0)
        bench_fail(rank, "collective", &err);
    free(buf);
    free(times);
    mgpu_comm_destroy(comm);
    mgpu_finalize(ctx);
    return rc < 0 ? 1 : 0;
}

/* -n W: start W ranks here with the torchrun environment, as a launcher would. */
static int bench_spawn(const bench_opts_t *o)
{
    pid_t pids[256];
    char run_id[64];
    int bad = 0;

    snprintf(run_id, sizeof run_id, "allreduce-bench-%d", (int)getpid());
    fflush(stdout);
    for (int r = 0; r < o->nproc; r++) {
        pids[r] = fork();
        if (pids[r] < 0) {
            perror("allreduce_bench: fork");
            return 1;
        }
        if (pids[r] == 0) {
            char v[32];
            snprintf(v, sizeof v, "%d", r);
            setenv("RANK", v, 1);
            setenv("LOCAL_RANK", v, 1);
            snprintf(v, sizeof v, "%d", o->nproc);
            setenv("WORLD_SIZE", v, 1);
            setenv("LOCAL_WORLD_SIZE", v, 1);
            setenv("GROUP_RANK", "0", 1);
            setenv("TORCHELASTIC_RUN_ID", run_id, 1);
            if (getenv("BENCH_PIN") != NULL) {
                cpu_set_t set;
                CPU_ZERO(&set);
                CPU_SET(r % (int)sysconf(_SC_NPROCESSORS_ONLN), &set);
                sched_setaffinity(0, sizeof set, &set);
            }
            fflush(stdout);
            _exit(bench_rank(o));
        }
    }
    for (int r = 0; r < o->nproc; r++) {
        int st;
        if (waitpid(pids[r], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
            bad = 1;
    }
    return bad;
}

int main(int argc, char **argv)
{
    bench_opts_t o = {0, 4 << 10, 64 << 20, 0.3};

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = v != NULL;
        if (strcmp(a, "-n") == 0 && ok)
            ok = (o.nproc = atoi(v)) >= 1 && o.nproc <= 256;
        else if (strcmp(a, "--min") == 0 && ok)
            ok = bench_size(v, &o.min) == 0;
        else if (strcmp(a, "--max") == 0 && ok)
            ok = bench_size(v, &o.max) == 0;
        else if (strcmp(a, "--seconds") == 0 && ok)
            ok = (o.seconds = atof(v)) > 0;
        else
            ok = 0;
        if (!ok) {
            fprintf(stderr, "usage: allreduce_bench [-n RANKS] [--min BYTES] [--max BYTES] "
                            "[--seconds S]   (sizes take K, M, G)\n");
            return 2;
        }
        i++;
    }
    return o.nproc > 0 ? bench_spawn(&o) : bench_rank(&o);
}
