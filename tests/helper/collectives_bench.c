/* collectives_bench.c - nccl-tests-style benchmark of libmgpu's general collectives
 * (mgpu_allreduce, mgpu_reduce_scatter, mgpu_all_gather) for every dtype and reduction, on the
 * CPU backend (host buffers) or NCCL (device buffers).
 *
 *   collectives_bench -n 4 [options]                          forks 4 CPU ranks itself
 *   mgpu-launch --nproc_per_node=N -- collectives_bench ...  or runs as one rank of a job
 *
 * options: --backend cpu|nccl (default cpu), --ops all_reduce,reduce_scatter,all_gather,
 *   --dtypes f32,f64,f16,bf16,i32,i64, --redops sum,avg,max,min (each a list or "all", the
 *   default), --min BYTES (4K), --max BYTES (16M), --step FACTOR (4), --seconds S per size
 *   (0.05). Sizes take K, M, G.
 *
 * As in nccl-tests: size is the bytes of the whole buffer (all-reduce: the buffer; reduce-
 * scatter: the send buffer; all-gather: the receive buffer), count its elements; time is the
 * slowest rank's mean per call; algbw = size / time (GB/s = 1e9 B/s); busbw what each rank's
 * link carries in a ring: algbw * 2(W-1)/W for all-reduce, algbw * (W-1)/W for the others.
 * Each size is checked after its timing: one more call on known small integers (exact in
 * every type), compared with the expected result (exactly, but for a float average on NCCL,
 * which pre-multiplies by 1/W: within a few units in the last place), and the elements that
 * differ on any rank are the #wrong column. Exit status 1 when any element is wrong or a call
 * fails, 2 for bad usage. */
#include <errno.h>    /* errno */
#include <stdint.h>   /* int32_t */
#include <stdio.h>    /* printf */
#include <stdlib.h>   /* strtoull, setenv */
#include <string.h>   /* strcmp */
#include <sys/wait.h> /* waitpid */
#include <time.h>     /* clock_gettime */
#include <unistd.h>   /* fork */

#include "dtype.h" /* mgpu_dtype_f32_to_f16, ...: operands and results on the host */
#include "mgpu.h"  /* mgpu_init, mgpu_allreduce, mgpu_reduce_scatter, mgpu_all_gather */

#if defined(MGPU_HAVE_CUDA) && MGPU_HAVE_CUDA
#include <cuda_runtime_api.h> /* cudaMalloc, cudaMemcpy */
#define HAVE_CUDA 1
#else
#define HAVE_CUDA 0
#endif

enum { OP_ALLREDUCE, OP_REDUCE_SCATTER, OP_ALL_GATHER, NOPS };
static const char *const op_names[NOPS] = {"all_reduce", "reduce_scatter", "all_gather"};
static const char *const dtype_names[] = {"f32", "f64", "f16", "bf16", "i32", "i64"};
static const char *const redop_names[] = {"sum", "avg", "max", "min"};
#define NDTYPES 6
#define NREDOPS 4

typedef struct opts {
    int nproc; /* 0: be one rank of an already launched job */
    int nccl;
    int ops[NOPS], dtypes[NDTYPES], redops[NREDOPS];
    size_t min, max, step;
    double seconds;
} opts_t;

typedef struct bench {
    mgpu_comm_t *comm;
    int rank, world, gpu;
    void *stream;
    char *d_send, *d_recv; /* the collective's buffers (device memory on NCCL) */
    char *h_a, *h_b;       /* host staging */
    double *d_scalar;      /* one value the ranks agree on (device memory on NCCL) */
} bench_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int parse_size(const char *s, size_t *out)
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
    if (*end != '\0' || v < 1)
        return -1;
    *out = (size_t)v;
    return 0;
}

/* "a,b" or "all" against names: sets on[i] for each name given; -1 on an unknown name. */
static int parse_list(const char *s, const char *const *names, int n, int *on, const char *what)
{
    char buf[256], *tok, *save = NULL;

    for (int i = 0; i < n; i++)
        on[i] = strcmp(s, "all") == 0;
    if (strcmp(s, "all") == 0)
        return 0;
    snprintf(buf, sizeof buf, "%s", s);
    for (tok = strtok_r(buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        int i = 0;
        while (i < n && strcmp(tok, names[i]) != 0)
            i++;
        if (i == n) {
            fprintf(stderr, "collectives_bench: %s \"%s\": expected one of", what, tok);
            for (int k = 0; k < n; k++)
                fprintf(stderr, " %s", names[k]);
            fprintf(stderr, " (a comma-separated list) or all\n");
            return -1;
        }
        on[i] = 1;
    }
    return 0;
}

static int fail(int rank, const char *what, const mgpu_err_t *err)
{
    fprintf(stderr, "collectives_bench: rank %d: %s: %s\n", rank, what, err->msg);
    return -1;
}

/* Buffers and copies on the backend's side: device memory for NCCL, host memory otherwise. */
static void *buf_alloc(const bench_t *b, size_t bytes)
{
#if HAVE_CUDA
    if (b->gpu) {
        void *p = NULL;
        return cudaMalloc(&p, bytes) == cudaSuccess ? p : NULL;
    }
#endif
    return malloc(bytes);
}

static void buf_free(const bench_t *b, void *p)
{
#if HAVE_CUDA
    if (b->gpu) {
        cudaFree(p);
        return;
    }
#endif
    free(p);
}

static int buf_copy(const bench_t *b, void *dst, const void *src, size_t bytes, int to_dev)
{
#if HAVE_CUDA
    /* On the communicator's stream and waited for: a plain cudaMemcpy from pageable memory may
     * return before its DMA lands, and the collectives' stream (non-blocking) is not ordered
     * after the legacy default stream, so the collective could read the old contents. */
    if (b->gpu)
        return cudaMemcpyAsync(dst, src, bytes,
                               to_dev ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
                               (cudaStream_t)b->stream) == cudaSuccess &&
                       cudaStreamSynchronize((cudaStream_t)b->stream) == cudaSuccess
                   ? 0
                   : -1;
#endif
    memcpy(dst, src, bytes);
    return 0;
}

/* The ranks agree on one value (the max, or the sum), through the library itself. */
static int agree(bench_t *b, double *v, mgpu_redop_t op, mgpu_err_t *err)
{
    if (buf_copy(b, b->d_scalar, v, sizeof *v, 1) < 0 ||
        mgpu_allreduce(b->comm, b->d_scalar, 1, MGPU_DTYPE_F64, op, b->stream, err) < 0 ||
        mgpu_comm_wait(b->comm, b->stream, err) < 0 ||
        buf_copy(b, v, b->d_scalar, sizeof *v, 0) < 0)
        return -1;
    return 0;
}

static long ival(int rank, size_t i)
{
    return (long)((i * 7 + (size_t)rank * 13) % 17);
}

static void put(void *p, size_t i, int dt, double v)
{
    switch (dt) {
    case MGPU_DTYPE_F32:
        ((float *)p)[i] = (float)v;
        break;
    case MGPU_DTYPE_F64:
        ((double *)p)[i] = v;
        break;
    case MGPU_DTYPE_F16:
        ((uint16_t *)p)[i] = mgpu_dtype_f32_to_f16((float)v);
        break;
    case MGPU_DTYPE_BF16:
        ((uint16_t *)p)[i] = mgpu_dtype_f32_to_bf16((float)v);
        break;
    case MGPU_DTYPE_I32:
        ((int32_t *)p)[i] = (int32_t)v;
        break;
    default:
        ((int64_t *)p)[i] = (int64_t)v;
        break;
    }
}

static double get(const void *p, size_t i, int dt)
{
    switch (dt) {
    case MGPU_DTYPE_F32:
        return ((const float *)p)[i];
    case MGPU_DTYPE_F64:
        return ((const double *)p)[i];
    case MGPU_DTYPE_F16:
        return mgpu_dtype_f16_to_f32(((const uint16_t *)p)[i]);
    case MGPU_DTYPE_BF16:
        return mgpu_dtype_bf16_to_f32(((const uint16_t *)p)[i]);
    case MGPU_DTYPE_I32:
        return ((const int32_t *)p)[i];
    default:
        return (double)((const int64_t *)p)[i];
    }
}

/* The expected reduction of element i over the ranks, from small integers: exact. */
static double expect(int dt, int redop, int world, size_t i)
{
    long s = 0, mx = -1, mn = 1000;
    for (int q = 0; q < world; q++) {
        long v = ival(q, i);
        s += v;
        mx = v > mx ? v : mx;
        mn = v < mn ? v : mn;
    }
    if (redop == MGPU_MAX || redop == MGPU_MIN)
        return (double)(redop == MGPU_MAX ? mx : mn);
    if (redop == MGPU_SUM)
        return (double)s;
    if (dt == MGPU_DTYPE_I32 || dt == MGPU_DTYPE_I64)
        return (double)(s / world);
    /* The CPU backend divides in the accumulator's type and rounds once. */
    if (dt == MGPU_DTYPE_F64)
        return (double)s / world;
    return (double)((float)s / (float)world);
}

static int run_one(bench_t *b, const opts_t *o, int op, int dt, int redop, size_t bytes,
                   mgpu_err_t *err)
{
    size_t esz = mgpu_dtype_size((mgpu_dtype_t)dt), w = (size_t)b->world;
    size_t count = bytes / esz, per, nin, nout;
    double t, tmax, wrong = 0, tol = 0;
    long iters;
    int rc = 0;

    if (op != OP_ALLREDUCE)
        count -= count % w; /* whole blocks per rank */
    if (count == 0)
        return 0;
    per = op == OP_ALLREDUCE ? count : count / w;
    nin = op == OP_ALL_GATHER ? per : count; /* elements this rank sends */
    nout = op == OP_REDUCE_SCATTER ? per : count;
#define CALL()                                                                                     \
    (op == OP_ALLREDUCE ? mgpu_allreduce(b->comm, b->d_send, count, (mgpu_dtype_t)dt,              \
                                         (mgpu_redop_t)redop, b->stream, err)                      \
     : op == OP_REDUCE_SCATTER                                                                     \
         ? mgpu_reduce_scatter(b->comm, b->d_send, b->d_recv, per, (mgpu_dtype_t)dt,               \
                               (mgpu_redop_t)redop, b->stream, err)                                \
         : mgpu_all_gather(b->comm, b->d_send, b->d_recv, per, (mgpu_dtype_t)dt, b->stream, err))

    /* Operands that keep every sum exact however often an in-place all-reduce runs: the
     * timing repeats it on its own result, so zeros (the timed data) stay zeros. */
    memset(b->h_a, 0, nin * esz);
    if (buf_copy(b, b->d_send, b->h_a, nin * esz, 1) < 0)
        return fail(b->rank, "copy to the buffer", &(mgpu_err_t){-1, "cudaMemcpy failed"});
    t = now_s();
    for (int k = 0; k < 2 && rc == 0; k++)
        rc = CALL();
    if (rc == 0)
        rc = mgpu_comm_wait(b->comm, b->stream, err);
    t = (now_s() - t) / 2;
    if (rc < 0 || agree(b, &t, MGPU_MAX, err) < 0)
        return fail(b->rank, op_names[op], err);
    iters = (long)(o->seconds / (t > 1e-7 ? t : 1e-7));
    iters = iters < 3 ? 3 : iters > 10000 ? 10000 : iters;
    if (mgpu_barrier(b->comm, err) < 0)
        return fail(b->rank, "mgpu_barrier", err);
    t = now_s();
    for (long k = 0; k < iters && rc == 0; k++)
        rc = CALL();
    if (rc == 0)
        rc = mgpu_comm_wait(b->comm, b->stream, err);
    t = (now_s() - t) / (double)iters;
    tmax = t;
    if (rc < 0 || agree(b, &tmax, MGPU_MAX, err) < 0)
        return fail(b->rank, op_names[op], err);

    /* The check. */
    for (size_t i = 0; i < nin; i++)
        put(b->h_a, i, dt, (double)ival(b->rank, i));
    if (buf_copy(b, b->d_send, b->h_a, nin * esz, 1) < 0 || (rc = CALL()) < 0 ||
        mgpu_comm_wait(b->comm, b->stream, err) < 0 ||
        buf_copy(b, b->h_b, op == OP_ALLREDUCE ? b->d_send : b->d_recv, nout * esz, 0) < 0)
        return fail(b->rank, op_names[op], err);
    if (b->gpu && redop == MGPU_AVG)
        tol = dt == MGPU_DTYPE_F32    ? 1e-6
              : dt == MGPU_DTYPE_F64  ? 1e-12
              : dt == MGPU_DTYPE_F16  ? 2e-3
              : dt == MGPU_DTYPE_BF16 ? 2e-2
                                      : 0;
    for (size_t i = 0; i < nout; i++) {
        double g = get(b->h_b, i, dt), want, d;
        if (op == OP_ALL_GATHER)
            want = (double)ival((int)(i / per), i % per);
        else
            want = expect(dt, redop, b->world,
                          op == OP_REDUCE_SCATTER ? (size_t)b->rank * per + i : i);
        if (!b->gpu || redop != MGPU_AVG || tol == 0) {
            /* Exact: the expected value in the type's own rounding. */
            char tmp[8];
            put(tmp, 0, dt, want);
            want = get(tmp, 0, dt);
        }
        d = g > want ? g - want : want - g;
        wrong += d > tol * (want > 1 ? want : 1);
    }
    if (agree(b, &wrong, MGPU_SUM, err) < 0)
        return fail(b->rank, op_names[op], err);
    if (b->rank == 0) {
        double algbw = (double)(count * esz) / tmax / 1e9;
        double factor =
            op == OP_ALLREDUCE ? 2.0 * (double)(w - 1) / (double)w : (double)(w - 1) / (double)w;
        printf("  %12zu %12zu %6s %6s %10.1f %10.3f %10.3f %7.0f\n", count * esz, count,
               dtype_names[dt], op == OP_ALL_GATHER ? "none" : redop_names[redop], tmax * 1e6,
               algbw, algbw * factor, wrong);
        fflush(stdout);
    }
    return wrong > 0 ? 1 : 0;
#undef CALL
}

static int bench_rank(const opts_t *o)
{
    mgpu_init_opts_t io = {o->nccl, 60};
    mgpu_ctx_t *ctx = NULL;
    mgpu_err_t err = {0, ""};
    const mgpu_rank_info_t *ri;
    bench_t b;
    size_t cap;
    int bad = 0, rc = 0;

    memset(&b, 0, sizeof b);
    if (mgpu_init(&io, &ctx, &err) < 0) {
        fail(-1, "mgpu_init", &err);
        return 1;
    }
    ri = mgpu_rank(ctx);
    b.rank = ri->rank;
    b.world = ri->world_size;
    if (mgpu_comm_create(ctx, o->nccl ? MGPU_BACKEND_NCCL : MGPU_BACKEND_CPU, 120, &b.comm, &err) <
        0) {
        fail(b.rank, "mgpu_comm_create", &err);
        mgpu_finalize(ctx);
        return 1;
    }
    b.gpu = o->nccl;
    b.stream = mgpu_comm_stream(b.comm);
    /* The largest buffer: all-gather receives W times its send, all-reduce works in place. */
    cap = o->max + 64;
    b.d_send = buf_alloc(&b, cap);
    b.d_recv = buf_alloc(&b, cap);
    b.d_scalar = buf_alloc(&b, sizeof(double));
    b.h_a = malloc(cap);
    b.h_b = malloc(cap);
    if (b.d_send == NULL || b.d_recv == NULL || b.d_scalar == NULL || b.h_a == NULL ||
        b.h_b == NULL) {
        fprintf(stderr, "collectives_bench: rank %d: out of memory (%zu bytes)\n", b.rank, cap);
        return 1;
    }
    if (b.rank == 0)
        printf("# mgpu collectives, %s backend (%s), %d ranks on %d node%s (%s)\n",
               o->nccl ? "NCCL" : "CPU",
               o->nccl          ? "device buffers"
               : ri->nnodes > 1 ? "shared memory + TCP between nodes"
                                : "shared memory",
               b.world, ri->nnodes, ri->nnodes > 1 ? "s" : "", ri->source);
    for (int op = 0; op < NOPS && rc >= 0; op++) {
        if (!o->ops[op])
            continue;
        if (b.rank == 0)
            printf("# %s\n# %12s %12s %6s %6s %10s %10s %10s %7s\n", op_names[op], "size", "count",
                   "type", "redop", "time_us", "algbw_GB/s", "busbw_GB/s", "#wrong");
        for (int dt = 0; dt < NDTYPES && rc >= 0; dt++) {
            if (!o->dtypes[dt])
                continue;
            for (int r = 0; r < NREDOPS && rc >= 0; r++) {
                if (!o->redops[r] || (op == OP_ALL_GATHER && r > 0))
                    continue; /* all-gather reduces nothing: once per dtype */
                for (size_t bytes = o->min; bytes <= o->max && rc >= 0; bytes *= o->step) {
                    rc = run_one(&b, o, op, dt, r, bytes, &err);
                    bad += rc != 0;
                }
            }
        }
    }
    buf_free(&b, b.d_send);
    buf_free(&b, b.d_recv);
    buf_free(&b, b.d_scalar);
    free(b.h_a);
    free(b.h_b);
    mgpu_comm_destroy(b.comm);
    mgpu_finalize(ctx);
    return bad ? 1 : 0;
}

/* -n W: W CPU ranks here with torchrun's environment, as a launcher would start them. */
static int bench_spawn(const opts_t *o)
{
    pid_t pids[64];
    char run_id[64];
    int bad = 0;

    snprintf(run_id, sizeof run_id, "collectives-bench-%d", (int)getpid());
    fflush(stdout);
    for (int r = 0; r < o->nproc; r++) {
        if ((pids[r] = fork()) < 0) {
            perror("collectives_bench: fork");
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

static int usage(FILE *to)
{
    fprintf(to, "usage: collectives_bench [-n RANKS] [--backend cpu|nccl] [--ops LIST] [--dtypes "
                "LIST]\n"
                "                         [--redops LIST] [--min BYTES] [--max BYTES] [--step N] "
                "[--seconds S]\n"
                "  LIST: comma-separated names or all; ops all_reduce,reduce_scatter,all_gather;\n"
                "  dtypes f32,f64,f16,bf16,i32,i64; redops sum,avg,max,min. Sizes take K, M, G.\n");
    return to == stdout ? 0 : 2;
}

int main(int argc, char **argv)
{
    opts_t o;

    memset(&o, 0, sizeof o);
    o.min = 4 << 10;
    o.max = 16 << 20;
    o.step = 4;
    o.seconds = 0.05;
    for (int i = 0; i < NOPS; i++)
        o.ops[i] = 1;
    for (int i = 0; i < NDTYPES; i++)
        o.dtypes[i] = 1;
    for (int i = 0; i < NREDOPS; i++)
        o.redops[i] = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = v != NULL;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0)
            return usage(stdout);
        if (strcmp(a, "-n") == 0 && ok)
            ok = (o.nproc = atoi(v)) >= 1 && o.nproc <= 64;
        else if (strcmp(a, "--backend") == 0 && ok)
            ok = strcmp(v, "cpu") == 0 || (o.nccl = strcmp(v, "nccl") == 0);
        else if (strcmp(a, "--ops") == 0 && ok)
            ok = parse_list(v, op_names, NOPS, o.ops, "--ops") == 0;
        else if (strcmp(a, "--dtypes") == 0 && ok)
            ok = parse_list(v, dtype_names, NDTYPES, o.dtypes, "--dtypes") == 0;
        else if (strcmp(a, "--redops") == 0 && ok)
            ok = parse_list(v, redop_names, NREDOPS, o.redops, "--redops") == 0;
        else if (strcmp(a, "--min") == 0 && ok)
            ok = parse_size(v, &o.min) == 0;
        else if (strcmp(a, "--max") == 0 && ok)
            ok = parse_size(v, &o.max) == 0;
        else if (strcmp(a, "--step") == 0 && ok)
            ok = parse_size(v, &o.step) == 0 && o.step >= 2;
        else if (strcmp(a, "--seconds") == 0 && ok)
            ok = (o.seconds = atof(v)) > 0;
        else
            ok = 0;
        if (!ok) {
            fprintf(stderr, "collectives_bench: bad argument %s%s%s\n", a, v ? " " : "",
                    v ? v : "");
            return usage(stderr);
        }
        i++;
    }
    if (o.min > o.max) {
        fprintf(stderr, "collectives_bench: --min %zu is above --max %zu\n", o.min, o.max);
        return 2;
    }
    if (o.nccl && !HAVE_CUDA) {
        fprintf(stderr, "collectives_bench: --backend nccl: built without CUDA\n");
        return 2;
    }
    if (o.nccl && o.nproc > 0) {
        fprintf(stderr, "collectives_bench: -n starts CPU ranks only; run NCCL ranks under "
                        "mgpu-launch --nproc_per_node=gpu\n");
        return 2;
    }
    return o.nproc > 0 ? bench_spawn(&o) : bench_rank(&o);
}
