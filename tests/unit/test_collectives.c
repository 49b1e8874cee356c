/* test_collectives.c - the general collectives of libmgpu (mgpu_allreduce, mgpu_reduce_scatter,
 * mgpu_all_gather) on the CPU backend, every op x dtype x reduction, through the public API:
 * W forked ranks with torchrun's environment, as test_comm_cpu.c starts them, on one node and
 * on two nodes of one host (shared memory in each, TCP between the leaders, a store server).
 * Each rank computes the expected result itself from every rank's operands and compares bits.
 * Also: the f16/bf16 conversions' rounding, and the refusals of bad arguments. */
#include "check.h"

#include <math.h>     /* isnan */
#include <signal.h>   /* SIGKILL */
#include <stdint.h>   /* int32_t */
#include <stdlib.h>   /* setenv */
#include <sys/mman.h> /* mmap */
#include <uv.h>       /* uv_loop_t: the store server's loop */

#include "dtype.h" /* mgpu_dtype_f32_to_f16, ... */
#include "mgpu.h"
#include "ranks.h"
#include "store_child.h"  /* store_start, store_stop: a store server in a child */
#include "store_server.h" /* mgpu_store_server_start */

#define NDTYPES 6
#define NOPS 4

typedef struct job {
    int port;       /* MASTER_PORT: names the job's segments */
    int nodes;      /* > 1: ranks split into nodes, joined through a store */
    int store_port; /* the store server's, when nodes > 1 */
    int big;        /* also counts past one round of the gather (256 KiB per rank) */
} job_t;

static void job_init(job_t *j)
{
    static int counter;
    memset(j, 0, sizeof *j);
    j->port = 20000 + (int)(getpid() % 20000) + 11 * counter++;
    j->nodes = 1;
}

static void setenv_int(const char *name, int v)
{
    char s[32];
    snprintf(s, sizeof s, "%d", v);
    setenv(name, s, 1);
}

static mgpu_comm_t *job_join(const job_t *j, int rank, int size, mgpu_ctx_t **ctx)
{
    mgpu_init_opts_t o = {0, 10};
    mgpu_comm_t *comm = NULL;
    mgpu_err_t err = {0, ""};
    int local_size = size / j->nodes, rc;

    setenv_int("RANK", rank);
    setenv_int("LOCAL_RANK", rank % local_size);
    setenv_int("WORLD_SIZE", size);
    setenv_int("LOCAL_WORLD_SIZE", local_size);
    setenv_int("GROUP_RANK", rank / local_size);
    setenv_int("GROUP_WORLD_SIZE", j->nodes);
    setenv("TORCHELASTIC_RUN_ID", "test-collectives", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv_int("MASTER_PORT", j->port);
    unsetenv("MGPU_STORE_ADDR");
    unsetenv("MGPU_STORE_PORT");
    unsetenv("MGPU_STORE_TOKEN");
    unsetenv("MGPU_NODE_RANK");
    unsetenv("MGPU_NNODES");
    unsetenv("CUDA_VISIBLE_DEVICES");
    unsetenv("MGPU_SIM_GPUS");
    if (j->nodes > 1) {
        setenv("MGPU_STORE_ADDR", "127.0.0.1", 1);
        setenv_int("MGPU_STORE_PORT", j->store_port);
    }
    *ctx = NULL;
    rc = mgpu_init(&o, ctx, &err);
    if (rc == 0)
        rc = mgpu_comm_create(*ctx, MGPU_BACKEND_CPU, 20, &comm, &err);
    if (rc != 0)
        printf("  rank %d: %s\n", rank, err.msg);
    CHECK_INT(rc, 0);
    return comm;
}

/* Small integers: every sum is exact in every type, so the expected bits follow from the
 * documented rounding alone (f16/bf16: one rounding of the f32 result). */
static long ival(int rank, size_t i, int salt)
{
    return (long)((i * 7 + (size_t)rank * 13 + (size_t)salt) % 101) - 50;
}

static void store_elem(void *p, size_t i, mgpu_dtype_t dt, double v)
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
    case MGPU_DTYPE_I64:
        ((int64_t *)p)[i] = (int64_t)v;
        break;
    }
}

static void fill(void *p, size_t n, mgpu_dtype_t dt, int rank, int salt)
{
    for (size_t i = 0; i < n; i++)
        store_elem(p, i, dt, (double)ival(rank, i, salt));
}

/* The expected element i of the reduction over W ranks, written independently of the
 * library: the exact integer result, then the type's rounding of it. */
static void expect_elem(void *p, size_t at, mgpu_dtype_t dt, mgpu_redop_t op, int W, size_t i,
                        int salt)
{
    long s = 0, mx = -1000, mn = 1000;
    for (int q = 0; q < W; q++) {
        long v = ival(q, i, salt);
        s += v;
        mx = v > mx ? v : mx;
        mn = v < mn ? v : mn;
    }
    if (op == MGPU_MAX || op == MGPU_MIN)
        store_elem(p, at, dt, (double)(op == MGPU_MAX ? mx : mn));
    else if (op == MGPU_SUM)
        store_elem(p, at, dt, (double)s);
    else if (dt == MGPU_DTYPE_I32 || dt == MGPU_DTYPE_I64)
        store_elem(p, at, dt, (double)(s / W)); /* truncated toward zero */
    else if (dt == MGPU_DTYPE_F64)
        store_elem(p, at, dt, (double)s / W);
    else
        store_elem(p, at, dt, (double)((float)s / (float)W)); /* f32 division, then rounding */
}

/* Compares n elements; prints the first mismatches. */
static int compare(const void *got, const void *want, size_t n, mgpu_dtype_t dt, const char *what)
{
    size_t esz = mgpu_dtype_size(dt);
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (memcmp((const char *)got + i * esz, (const char *)want + i * esz, esz) != 0 &&
            bad++ < 3) {
            unsigned long long g = 0, w = 0;
            memcpy(&g, (const char *)got + i * esz, esz);
            memcpy(&w, (const char *)want + i * esz, esz);
            printf("  %s: element %zu is 0x%llx, expected 0x%llx\n", what, i, g, w);
        }
    }
    CHECK_INT(bad, 0);
    return bad;
}

static void rank_all_ops(int rank, int size, void *arg)
{
    const job_t *j = arg;
    static const size_t counts[] = {1, 7, 1001, 140001};
    size_t ncounts = j->big ? 4 : 3, maxn = 2 * 140001 * (size_t)size;
    mgpu_err_t err = {0, ""};
    mgpu_ctx_t *ctx;
    mgpu_comm_t *comm = job_join(j, rank, size, &ctx);
    char *buf = malloc(maxn * 8), *want = malloc(maxn * 8), *send = malloc(maxn * 8);
    char what[128];
    int salt = 0;

    if (comm == NULL || buf == NULL || want == NULL || send == NULL)
        _exit(1);
    for (int d = 0; d < NDTYPES; d++) {
        mgpu_dtype_t dt = (mgpu_dtype_t)d;
        size_t esz = mgpu_dtype_size(dt);
        for (size_t c = 0; c < ncounts; c++) {
            size_t n = counts[c];
            for (int o = 0; o < NOPS; o++) {
                mgpu_redop_t op = (mgpu_redop_t)o;
                /* all-reduce, in place, any count */
                salt++;
                fill(buf, n, dt, rank, salt);
                for (size_t i = 0; i < n; i++)
                    expect_elem(want, i, dt, op, size, i, salt);
                snprintf(what, sizeof what, "rank %d of %d: all-reduce %s %s n=%zu", rank, size,
                         mgpu_dtype_name(dt), mgpu_redop_name(op), n);
                if (mgpu_allreduce(comm, buf, n, dt, op, NULL, &err) != 0) {
                    printf("  %s: %s\n", what, err.msg);
                    CHECK(0);
                    fflush(stdout);
                    _exit(1);
                }
                compare(buf, want, n, dt, what);

                /* reduce-scatter out of place (send intact), then in place */
                salt++;
                fill(send, n * (size_t)size, dt, rank, salt);
                memcpy(buf, send, n * (size_t)size * esz);
                for (size_t i = 0; i < n; i++)
                    expect_elem(want, i, dt, op, size, (size_t)rank * n + i, salt);
                snprintf(what, sizeof what, "rank %d of %d: reduce-scatter %s %s recvcount=%zu",
                         rank, size, mgpu_dtype_name(dt), mgpu_redop_name(op), n);
                CHECK_INT(mgpu_reduce_scatter(comm, send, buf + n * (size_t)size * esz, n, dt, op,
                                              NULL, &err),
                          0);
                compare(buf + n * (size_t)size * esz, want, n, dt, what);
                compare(send, buf, n * (size_t)size, dt, "reduce-scatter left send intact");
                CHECK_INT(mgpu_reduce_scatter(comm, send, send + (size_t)rank * n * esz, n, dt, op,
                                              NULL, &err),
                          0);
                compare(send + (size_t)rank * n * esz, want, n, dt, "in-place reduce-scatter");
            }
            /* all-gather out of place, then in place */
            salt++;
            fill(send, n, dt, rank, salt);
            for (int q = 0; q < size; q++)
                fill(want + (size_t)q * n * esz, n, dt, q, salt);
            snprintf(what, sizeof what, "rank %d of %d: all-gather %s sendcount=%zu", rank, size,
                     mgpu_dtype_name(dt), n);
            memset(buf, 0x5a, n * (size_t)size * esz);
            CHECK_INT(mgpu_all_gather(comm, send, buf, n, dt, NULL, &err), 0);
            compare(buf, want, n * (size_t)size, dt, what);
            memset(buf, 0x5a, n * (size_t)size * esz);
            fill(buf + (size_t)rank * n * esz, n, dt, rank, salt);
            CHECK_INT(mgpu_all_gather(comm, buf + (size_t)rank * n * esz, buf, n, dt, NULL, &err),
                      0);
            compare(buf, want, n * (size_t)size, dt, "in-place all-gather");
        }
    }
    free(buf);
    free(want);
    free(send);
    mgpu_comm_destroy(comm);
    mgpu_finalize(ctx);
    fflush(stdout);
    _exit(check_failed ? 1 : 0);
}

static void test_conversions(void)
{
    float nan = __builtin_nanf("");
    /* bf16: 1 + 2^-8 is the tie between 1 and 1 + 2^-7: even (1); 1 + 3*2^-9 rounds up. */
    CHECK_INT(mgpu_dtype_f32_to_bf16(1.0f), 0x3f80);
    CHECK_INT(mgpu_dtype_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    CHECK_INT(mgpu_dtype_f32_to_bf16(1.0f + 0x3p-8f), 0x3f82); /* tie, 0x3f81 odd: up */
    CHECK_INT(mgpu_dtype_f32_to_bf16(1.0f + 0x3p-9f), 0x3f81);
    CHECK_INT(mgpu_dtype_f32_to_bf16(-2.0f), 0xc000);
    CHECK(isnan(mgpu_dtype_bf16_to_f32(mgpu_dtype_f32_to_bf16(nan))));
    CHECK(mgpu_dtype_bf16_to_f32(0x3f81) == 1.0f + 0x1p-7f);
    /* f16: 2049 is the tie between 2048 and 2050: even (2048); 2051 -> 2052; 65519 -> 65504;
     * 65520 (the tie, 65504 odd) -> inf; subnormals: 2^-25 is the tie 0 / 2^-24 -> 0,
     * 3*2^-25 -> 2*2^-24 (even). */
    CHECK(mgpu_dtype_f16_to_f32(mgpu_dtype_f32_to_f16(2049.0f)) == 2048.0f);
    CHECK(mgpu_dtype_f16_to_f32(mgpu_dtype_f32_to_f16(2051.0f)) == 2052.0f);
    CHECK(mgpu_dtype_f16_to_f32(mgpu_dtype_f32_to_f16(65519.0f)) == 65504.0f);
    CHECK_INT(mgpu_dtype_f32_to_f16(65520.0f), 0x7c00);
    CHECK_INT(mgpu_dtype_f32_to_f16(-1e9f), 0xfc00);
    CHECK_INT(mgpu_dtype_f32_to_f16(0x1p-25f), 0x0000);
    CHECK_INT(mgpu_dtype_f32_to_f16(0x3p-25f), 0x0002);
    CHECK_INT(mgpu_dtype_f32_to_f16(0x1p-14f), 0x0400);     /* the smallest normal */
    CHECK_INT(mgpu_dtype_f32_to_f16(0x1.ffcp-15f), 0x0400); /* rounds up into it */
    CHECK_INT(mgpu_dtype_f32_to_f16(1.0f), 0x3c00);
    CHECK_INT(mgpu_dtype_f32_to_f16(-0.0f), 0x8000);
    CHECK(isnan(mgpu_dtype_f16_to_f32(mgpu_dtype_f32_to_f16(nan))));
    /* Every f16 survives the round trip through f32. */
    for (unsigned h = 0; h < 0x10000u; h++) {
        float f = mgpu_dtype_f16_to_f32((uint16_t)h);
        if (!isnan(f) && mgpu_dtype_f32_to_f16(f) != h) {
            printf("  f16 0x%04x -> %g -> 0x%04x\n", h, (double)f, mgpu_dtype_f32_to_f16(f));
            CHECK(0);
            break;
        }
    }
}

/* Integer sums wrap, integer averages truncate toward zero, float max keeps the larger. */
static void test_reduce_edges(void)
{
    int32_t a[2] = {INT32_MAX, -7}, b[2] = {1, 2}, out[2];
    const void *src[2] = {a, b};
    mgpu_dtype_reduce(out, src, 2, 2, MGPU_DTYPE_I32, MGPU_SUM);
    CHECK_INT(out[0], INT32_MIN);
    CHECK_INT(out[1], -5);
    mgpu_dtype_reduce(out, src, 2, 2, MGPU_DTYPE_I32, MGPU_AVG);
    CHECK_INT(out[1], -2); /* -5 / 2 */
    int64_t c[1] = {-9}, d[1] = {2}, e[1] = {0}, o64[1];
    const void *s3[3] = {c, d, e};
    mgpu_dtype_reduce(o64, s3, 3, 1, MGPU_DTYPE_I64, MGPU_AVG);
    CHECK_INT(o64[0], -2); /* -7 / 3 */
    mgpu_dtype_reduce(o64, s3, 3, 1, MGPU_DTYPE_I64, MGPU_MIN);
    CHECK_INT(o64[0], -9);
    /* bf16 sums in f32, rounded once: 256 + 1 + 1 is 258 (each step in bf16 would stay 256). */
    uint16_t x[1] = {mgpu_dtype_f32_to_bf16(256.0f)}, y[1] = {mgpu_dtype_f32_to_bf16(1.0f)}, ob[1];
    const void *s4[3] = {x, y, y};
    mgpu_dtype_reduce(ob, s4, 3, 1, MGPU_DTYPE_BF16, MGPU_SUM);
    CHECK(mgpu_dtype_bf16_to_f32(ob[0]) == 258.0f);
    CHECK_INT(mgpu_dtype_size(MGPU_DTYPE_BF16), 2);
    CHECK_INT(mgpu_dtype_size((mgpu_dtype_t)42), 0);
    CHECK_STR(mgpu_dtype_name(MGPU_DTYPE_I64), "i64");
    CHECK_STR(mgpu_redop_name(MGPU_MIN), "min");
}

static void test_world_of_one(void)
{
    job_t j;
    job_init(&j);
    j.big = 1;
    CHECK_INT(ranks_run(1, rank_all_ops, &j, 120), 0);
}

static void test_ranks_2_3_4(void)
{
    for (int w = 2; w <= 4; w++) {
        job_t j;
        job_init(&j);
        j.big = w == 2; /* several rounds of the gather */
        printf("  %d ranks\n", w);
        CHECK_INT(ranks_run(w, rank_all_ops, &j, 240), 0);
    }
}

static void test_two_nodes(void)
{
    job_t j;
    pid_t st;
    job_init(&j);
    j.nodes = 2;
    st = store_start(&j.store_port);
    CHECK_INT(ranks_run(4, rank_all_ops, &j, 240), 0);
    kill(st, SIGKILL);
    waitpid(st, NULL, 0);
}

/* Bad arguments are refused before anything is exchanged, naming the argument, and the
 * communicator stays usable. */
static void rank_refusals(int rank, int size, void *arg)
{
    const job_t *j = arg;
    mgpu_err_t err = {0, ""};
    mgpu_ctx_t *ctx;
    mgpu_comm_t *comm = job_join(j, rank, size, &ctx);
    float f[8] = {1, 2, 3, 4, 5, 6, 7, 8}, g[16];

    if (comm == NULL)
        _exit(1);
    CHECK_INT(mgpu_allreduce(comm, f, 8, (mgpu_dtype_t)99, MGPU_SUM, NULL, &err), MGPU_E_USAGE);
    CHECK_CONTAINS(err.msg, "mgpu_allreduce(count=8): dtype 99 is not an mgpu_dtype_t");
    CHECK_INT(mgpu_allreduce(comm, f, 8, (mgpu_dtype_t)-1, MGPU_SUM, NULL, &err), MGPU_E_USAGE);
    CHECK_CONTAINS(err.msg, "dtype -1 is not");
    CHECK_INT(mgpu_allreduce(comm, f, 8, MGPU_DTYPE_F32, (mgpu_redop_t)7, NULL, &err),
              MGPU_E_USAGE);
    CHECK_CONTAINS(err.msg, "mgpu_allreduce(count=8, f32): op 7 is not an mgpu_redop_t");
    CHECK_INT(mgpu_allreduce_f32(comm, f, 8, (mgpu_redop_t)7, NULL, &err), MGPU_E_USAGE);
    CHECK_CONTAINS(err.msg, "op 7 is not an mgpu_redop_t");
    CHECK_INT(mgpu_allreduce(comm, NULL, 8, MGPU_DTYPE_BF16, MGPU_MAX, NULL, &err), MGPU_E_USAGE);
    CHECK_CONTAINS(err.msg, "mgpu_allreduce(count=8, bf16): buf is NULL");
    CHECK_INT(mgpu_allreduce(NULL, f, 8, MGPU_DTYPE_F32, MGPU_SUM, NULL, &err), MGPU_E_USAGE);
    CHECK_CONTAINS(err.msg, "comm is NULL");
    CHECK_INT(mgpu_reduce_scatter(comm, f, NULL, 4, MGPU_DTYPE_F32, MGPU_SUM, NULL, &err),
              MGPU_E_USAGE);
    CHECK_CONTAINS(err.msg, "mgpu_reduce_scatter(count=4, f32): recv is NULL");
    CHECK_INT(mgpu_reduce_scatter(comm, NULL, g, 4, MGPU_DTYPE_I32, MGPU_SUM, NULL, &err),
              MGPU_E_USAGE);
    CHECK_CONTAINS(err.msg, "send is NULL");
    CHECK_INT(mgpu_reduce_scatter(comm, f, g, 4, (mgpu_dtype_t)6, MGPU_SUM, NULL, &err),
              MGPU_E_USAGE);
    CHECK_CONTAINS(err.msg, "dtype 6 is not an mgpu_dtype_t");
    CHECK_INT(mgpu_all_gather(comm, f, NULL, 8, MGPU_DTYPE_F64, NULL, &err), MGPU_E_USAGE);
    CHECK_CONTAINS(err.msg, "mgpu_all_gather(count=8, f64): recv is NULL");
    CHECK_INT(mgpu_all_gather(comm, f, g, 8, (mgpu_dtype_t)17, NULL, &err), MGPU_E_USAGE);
    CHECK_CONTAINS(err.msg, "dtype 17");
    CHECK_INT(mgpu_allreduce(comm, f, SIZE_MAX / 2, MGPU_DTYPE_F64, MGPU_SUM, NULL, &err),
              MGPU_E_USAGE);
    CHECK_CONTAINS(err.msg, "overflow");
    /* CPU communicators have no NCCL handle or stream. */
    CHECK(mgpu_comm_nccl(comm) == NULL);
    CHECK(mgpu_comm_stream(comm) == NULL);
    /* Still usable: nothing was exchanged. */
    CHECK_INT(mgpu_allreduce(comm, f, 8, MGPU_DTYPE_F32, MGPU_MAX, NULL, &err), 0);
    CHECK(f[7] == 8.0f);
    mgpu_comm_destroy(comm);
    mgpu_finalize(ctx);
    fflush(stdout);
    _exit(check_failed ? 1 : 0);
}

static void test_refusals(void)
{
    job_t j;
    job_init(&j);
    CHECK_INT(ranks_run(2, rank_refusals, &j, 60), 0);
}

int main(void)
{
    (void)ranks_stay_until; /* ranks.h's helpers for failure tests, not needed here */
    (void)ranks_now;
    RUN(test_conversions);
    RUN(test_reduce_edges);
    RUN(test_world_of_one);
    RUN(test_ranks_2_3_4);
    RUN(test_two_nodes);
    RUN(test_refusals);
    return check_done();
}
