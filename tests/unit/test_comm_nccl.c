/* test_comm_nccl.c - the NCCL communicator and the startup timeline through libmgpu's public
 * API, as a worker uses them.
 *
 * Everywhere: the timeline's text form, its keys in a real store (a store server on a thread of
 * the test), and the refusal of NCCL where it cannot run (no real GPU in a CUDA build; "NCCL
 * backend not built" in a build without CUDA). On a machine with a CUDA device (the H200; the
 * rest skip): collectives on device buffers at world size 1, an init that times out because
 * rank 1 never comes, and a collective stuck behind other work on its stream that the
 * watchdog aborts, and one pending when the launcher says a node is lost. Run there:
 * build/tests/test_comm_nccl. */
#include "check.h"

#include <stdint.h> /* int64_t */
#include <stdlib.h> /* setenv, strtod */
#include <time.h>   /* clock_gettime */

#include "dtype.h" /* mgpu_dtype_f32_to_f16, ...: operands and results on the host */
#include "mgpu.h"
#include "pages.h"        /* mgpu_pages_open, mgpu_pages_set_lost: the launcher's side */
#include "store.h"        /* mgpu_store_connect, mgpu_store_get */
#include "store_thread.h" /* mgpu_store_thread_start */
#include "timeline.h"     /* mgpu_timeline_add, mgpu_timeline_format */

#if defined(MGPU_HAVE_CUDA) && MGPU_HAVE_CUDA
#include <cuda_runtime_api.h> /* cudaMalloc, cudaLaunchHostFunc */
#include <nccl.h>             /* ncclCommCount: the handle mgpu_comm_nccl returns */
#define HAVE_CUDA 1
#else
#define HAVE_CUDA 0
#endif

/* torchrun's environment for one rank of one node (local rank = rank), a store or none. */
static void rank_env(int rank, int world, int store_port)
{
    char v[32];
    static const char *const unset[] = {
        "MGPU_STORE_ADDR", "MGPU_STORE_PORT",  "MGPU_STORE_TOKEN",     "MGPU_SIM_GPUS",
        "GROUP_RANK",      "GROUP_WORLD_SIZE", "CUDA_VISIBLE_DEVICES", "MGPU_ALLOW_GPU_SHARING",
        "MASTER_PORT",     "SLURM_PROCID",     "OMPI_COMM_WORLD_RANK", "MGPU_NODE_RANK",
        "MGPU_NNODES",     "MGPU_LAUNCHER_PID"};
    for (size_t i = 0; i < sizeof unset / sizeof unset[0]; i++)
        unsetenv(unset[i]);
    snprintf(v, sizeof v, "%d", rank);
    setenv("RANK", v, 1);
    setenv("LOCAL_RANK", v, 1);
    snprintf(v, sizeof v, "%d", world);
    setenv("WORLD_SIZE", v, 1);
    setenv("LOCAL_WORLD_SIZE", v, 1);
    setenv("TORCHELASTIC_RUN_ID", "nccl-test", 1);
    setenv("TORCHELASTIC_RESTART_COUNT", "2", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    if (store_port > 0) {
        setenv("MGPU_STORE_ADDR", "127.0.0.1", 1);
        snprintf(v, sizeof v, "%d", store_port);
        setenv("MGPU_STORE_PORT", v, 1);
    }
}

static mgpu_store_thread_t *store_start(int *port)
{
    mgpu_store_server_opts_t so;
    mgpu_store_thread_t *t = NULL;
    mgpu_err_t err = {0, ""};

    memset(&so, 0, sizeof so);
    if (mgpu_store_thread_start(&so, &t, port, &err) != 0) {
        printf("  mgpu_store_thread_start: %s\n", err.msg);
        exit(1);
    }
    return t;
}

/* The seconds of event in a timeline text, -1 when absent. */
static double event_time(const char *text, const char *event)
{
    char pat[64];
    const char *p;
    snprintf(pat, sizeof pat, "%s=", event);
    for (p = text; (p = strstr(p, pat)) != NULL; p++)
        if (p == text || p[-1] == ';')
            return strtod(p + strlen(pat), NULL);
    return -1;
}

static void test_timeline_text(void)
{
    mgpu_timeline_t tl;
    char buf[256], small[12];
    int64_t start = mgpu_timeline_process_start_us(), now = mgpu_timeline_now_us();

    memset(&tl, 0, sizeof tl);
    CHECK_INT(mgpu_timeline_add(&tl, "exec", 1764433367120000LL), 1);
    CHECK_INT(mgpu_timeline_add(&tl, "first_step", 1764433368000042LL), 1);
    CHECK_INT(mgpu_timeline_add(&tl, "first_step", 1764433399000000LL), 0); /* first time stays */
    CHECK_INT(mgpu_timeline_add(&tl, "a=b", 1), MGPU_E_USAGE);
    CHECK_INT(mgpu_timeline_add(&tl, "a;b", 1), MGPU_E_USAGE);
    CHECK_INT(mgpu_timeline_add(&tl, "", 1), MGPU_E_USAGE);
    CHECK_INT(mgpu_timeline_add(&tl, "0123456789012345678901234567890123", 1), MGPU_E_USAGE);
    CHECK_INT(mgpu_timeline_format(&tl, buf, sizeof buf), 51);
    CHECK_STR(buf, "exec=1764433367.120000;first_step=1764433368.000042");
    CHECK_INT(mgpu_timeline_format(&tl, small, sizeof small), 51); /* needs 51, cut to fit */
    CHECK_STR(small, "exec=176443");
    for (int i = 2; i < MGPU_TIMELINE_MAX; i++) {
        snprintf(buf, sizeof buf, "e%d", i);
        CHECK_INT(mgpu_timeline_add(&tl, buf, i), 1);
    }
    CHECK_INT(mgpu_timeline_add(&tl, "one_more", 1), MGPU_E_RANGE);
    /* This process started before now, and not a day ago (10 ms ticks: allow for rounding). */
    CHECK(start > 0);
    CHECK(start <= now + 10000);
    CHECK(start > now - 86400LL * 1000000);
}

/* mgpu_init publishes exec/init/device/store under "<run id>/<attempt>/timeline/<rank>", a CPU
 * communicator adds "comm", and the program's mark adds "first_step", each in one SET. */
static void test_timeline_in_store(void)
{
    mgpu_init_opts_t o = {0, 10};
    mgpu_store_thread_t *t;
    mgpu_store_t *s = NULL;
    mgpu_ctx_t *ctx = NULL;
    mgpu_comm_t *comm = NULL;
    mgpu_err_t err = {0, ""};
    void *v = NULL;
    size_t vl = 0;
    int port = 0;
    char mine[512];

    t = store_start(&port);
    rank_env(0, 1, port);
    CHECK_INT(mgpu_init(&o, &ctx, &err), 0);
    if (ctx == NULL) {
        printf("  mgpu_init: %s\n", err.msg);
        return;
    }
    CHECK_INT(mgpu_store_connect("127.0.0.1", port, NULL, 5, &s, &err), 0);
    if (s == NULL)
        return;
    CHECK_INT(mgpu_store_get(s, "nccl-test/2/timeline/0", 0, &v, &vl, &err), 0);
    if (v != NULL) {
        double exec = event_time(v, "exec"), init = event_time(v, "init"),
               device = event_time(v, "device"), store = event_time(v, "store");
        printf("  after mgpu_init: %s\n", (char *)v);
        CHECK(exec > 1.7e9);
        CHECK(init >= exec - 0.011); /* exec is to 10 ms */
        CHECK(device >= init && store >= device && store - init < 10);
        CHECK_INT(strlen(v), vl);
        free(v);
        v = NULL;
    }
    CHECK_INT(mgpu_comm_create(ctx, MGPU_BACKEND_CPU, 10, &comm, &err), 0);
    mgpu_timeline_mark(ctx, "first_step");
    mgpu_timeline_mark(ctx, "bad=name"); /* logged, ignored */
    CHECK_INT(mgpu_store_get(s, "nccl-test/2/timeline/0", 0, &v, &vl, &err), 0);
    if (v != NULL) {
        printf("  after first_step: %s\n", (char *)v);
        CHECK(event_time(v, "comm") >= event_time(v, "store"));
        CHECK(event_time(v, "first_step") >= event_time(v, "comm"));
        CHECK(strstr(v, "bad") == NULL);
        mgpu_timeline_get(ctx, mine, sizeof mine);
        CHECK_STR(v, mine); /* the published text is the whole timeline */
        free(v);
    }
    mgpu_store_close(s);
    mgpu_comm_destroy(comm);
    mgpu_finalize(ctx);
    mgpu_store_thread_stop(t);
}

/* NCCL where it cannot run: said at once, and AUTO falls back to the CPU. */
static void test_nccl_refused(void)
{
    mgpu_init_opts_t o = {1, 10};
    mgpu_ctx_t *ctx = NULL;
    mgpu_comm_t *comm = NULL;
    mgpu_err_t err = {0, ""};
    int rc;

    rank_env(0, 1, 0);
    setenv("MGPU_SIM_GPUS", "1", 1); /* a GPU that is only simulated: the rank computes on CPU */
    CHECK_INT(mgpu_init(&o, &ctx, &err), 0);
    if (ctx == NULL) {
        printf("  mgpu_init: %s\n", err.msg);
        return;
    }
    CHECK_INT(mgpu_device(ctx)->is_gpu, 0);
    rc = mgpu_comm_create(ctx, MGPU_BACKEND_NCCL, 5, &comm, &err);
    printf("  %s\n", err.msg);
#if HAVE_CUDA
    CHECK_INT(rc, MGPU_E_DEVICE);
    CHECK_CONTAINS(err.msg, "mgpu_comm_create(NCCL): rank 0 (LOCAL_RANK=0) has no real (only a "
                            "simulated) GPU");
#else
    CHECK_INT(rc, MGPU_E_USAGE);
    CHECK_CONTAINS(err.msg, "NCCL backend not built");
#endif
    CHECK(comm == NULL);
    CHECK_INT(mgpu_comm_create(ctx, MGPU_BACKEND_AUTO, 5, &comm, &err), 0);
    if (comm != NULL)
        CHECK(mgpu_comm_backend(comm) == MGPU_BACKEND_CPU);
    mgpu_comm_destroy(comm);
    mgpu_finalize(ctx);
}

#if HAVE_CUDA
static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Skips unless a CUDA device is there; called in the test's own process (CUDA must not be
 * initialised before the harness forks). */
static void need_gpu(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
        SKIP("no CUDA device (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
}

#define CU(call)                                                                                   \
    do {                                                                                           \
        cudaError_t cu_ = (call);                                                                  \
        if (cu_ != cudaSuccess) {                                                                  \
            printf("  %s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(cu_));       \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define OK(call)                                                                                   \
    do {                                                                                           \
        int ok_ = (call);                                                                          \
        if (ok_ != 0)                                                                              \
            printf("  %s:%d: %s = %d: %s\n", __FILE__, __LINE__, #call, ok_, err.msg);             \
        CHECK_INT(ok_, 0);                                                                         \
    } while (0)

static mgpu_comm_t *nccl_world1(mgpu_ctx_t **ctx, double timeout_s)
{
    mgpu_init_opts_t o = {1, 10};
    mgpu_comm_t *comm = NULL;
    mgpu_err_t err = {0, ""};

    rank_env(0, 1, 0);
    *ctx = NULL;
    if (mgpu_init(&o, ctx, &err) != 0 ||
        mgpu_comm_create(*ctx, MGPU_BACKEND_AUTO, timeout_s, &comm, &err) != 0) {
        printf("  %s\n", err.msg);
        exit(1);
    }
    return comm;
}

static int compare(const float *got, const float *want, size_t n, const char *what)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i] && bad++ < 3)
            printf("  %s[%zu] = %g, expected %g\n", what, i, got[i], want[i]);
    if (bad)
        printf("  %s: %zu of %zu wrong\n", what, bad, n);
    return bad == 0;
}

/* World size 1 on the GPU: each collective through NCCL on device buffers and a stream. With
 * one rank the sum, the average and the broadcast leave the values as they are, and the
 * gather copies; a collective that touched the wrong bytes or never ran is caught. */
static void test_nccl_world1_collectives(void)
{
    static const size_t sizes[] = {1, 3, 1000, 65537, (1 << 20) + 3};
    mgpu_ctx_t *ctx;
    mgpu_comm_t *comm;
    mgpu_err_t err = {0, ""};
    cudaStream_t st;
    float *d, *d2, *h, *want, *got;
    size_t max = (1 << 20) + 3;
    char tl[512];

    need_gpu();
    comm = nccl_world1(&ctx, 30);
    CHECK(mgpu_comm_backend(comm) == MGPU_BACKEND_NCCL);
    CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CU(cudaMalloc((void **)&d, max * sizeof *d));
    CU(cudaMalloc((void **)&d2, max * sizeof *d2));
    h = malloc(max * sizeof *h);
    want = malloc(max * sizeof *want);
    got = malloc(max * sizeof *got);
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = sizes[k];
        for (size_t i = 0; i < n; i++)
            want[i] = (float)((long)((i * 7919 + k) % 2001) - 1000) * 0.25f;
        for (int op = MGPU_SUM; op <= MGPU_AVG; op++) {
            CU(cudaMemcpy(d, want, n * sizeof *d, cudaMemcpyHostToDevice));
            OK(mgpu_allreduce_f32(comm, d, n, (mgpu_redop_t)op, st, &err));
            OK(mgpu_comm_wait(comm, st, &err));
            CU(cudaMemcpy(got, d, n * sizeof *d, cudaMemcpyDeviceToHost));
            CHECK(compare(got, want, n, op == MGPU_SUM ? "all-reduce sum" : "all-reduce avg"));
        }
        CU(cudaMemcpy(d, want, n * sizeof *d, cudaMemcpyHostToDevice));
        OK(mgpu_broadcast(comm, d, n * sizeof *d, 0, st, &err));
        OK(mgpu_comm_wait(comm, st, &err));
        CU(cudaMemcpy(got, d, n * sizeof *d, cudaMemcpyDeviceToHost));
        CHECK(compare(got, want, n, "broadcast"));
        /* Out of place: recv starts poisoned, so a gather that did nothing fails. */
        CU(cudaMemset(d2, 0xff, n * sizeof *d2));
        OK(mgpu_allgather(comm, d, d2, n * sizeof *d, st, &err));
        OK(mgpu_comm_wait(comm, st, &err));
        CU(cudaMemcpy(got, d2, n * sizeof *d2, cudaMemcpyDeviceToHost));
        CHECK(compare(got, want, n, "all-gather"));
    }
    /* The default stream (NULL) works too. */
    CU(cudaMemcpy(d, want, 3 * sizeof *d, cudaMemcpyHostToDevice));
    OK(mgpu_allreduce_f32(comm, d, 3, MGPU_SUM, NULL, &err));
    OK(mgpu_comm_wait(comm, NULL, &err));
    CU(cudaMemcpy(got, d, 3 * sizeof *d, cudaMemcpyDeviceToHost));
    CHECK(compare(got, want, 3, "all-reduce on the default stream"));
    for (int i = 0; i < 3; i++)
        OK(mgpu_barrier(comm, &err));
    CHECK_INT(mgpu_broadcast(comm, d, 4, 1, st, &err), MGPU_E_RANGE);
    CHECK_CONTAINS(err.msg, "root=1");
    mgpu_timeline_get(ctx, tl, sizeof tl);
    printf("  timeline: %s\n", tl);
    CHECK(event_time(tl, "cuda") >= event_time(tl, "device"));
    CHECK(event_time(tl, "comm") >= event_time(tl, "cuda"));
    OK(mgpu_barrier(comm, &err)); /* still usable after a refused call */
    cudaFree(d);
    cudaFree(d2);
    cudaStreamDestroy(st);
    free(h);
    free(want);
    free(got);
    mgpu_comm_destroy(comm);
    mgpu_finalize(ctx);
}

/* Rank 0 of a world of 2 whose rank 1 never comes: the non-blocking init gives up at the
 * communicator's timeout, aborts, and names rank 1. */
static void test_nccl_init_timeout(void)
{
    mgpu_init_opts_t o = {1, 10};
    mgpu_store_thread_t *t;
    mgpu_ctx_t *ctx = NULL;
    mgpu_comm_t *comm = NULL;
    mgpu_err_t err = {0, ""};
    double t0, took;
    int port = 0, rc;

    need_gpu();
    alarm(120); /* a hang inside NCCL's abort must fail the test, not the run */
    t = store_start(&port);
    rank_env(0, 2, port);
    OK(mgpu_init(&o, &ctx, &err));
    if (ctx == NULL)
        return;
    t0 = now_s();
    rc = mgpu_comm_create(ctx, MGPU_BACKEND_NCCL, 3, &comm, &err);
    took = now_s() - t0;
    printf("  after %.2f s: %s\n", took, err.msg);
    CHECK_INT(rc, MGPU_E_TIMEOUT);
    CHECK(comm == NULL);
    CHECK_CONTAINS(err.msg, "rank 0: ncclCommInitRank(nranks=2, device 0) did not finish in 3 s");
    CHECK_CONTAINS(err.msg, "rank 1 never reached mgpu_comm_create");
    CHECK_CONTAINS(err.msg, "aborted the communicator");
    CHECK(took >= 2.9 && took < 30);
    mgpu_finalize(ctx);
    mgpu_store_thread_stop(t);
}

/* The other side: rank 1 waits for the unique id that rank 0 never publishes. */
static void test_nccl_id_timeout(void)
{
    mgpu_init_opts_t o = {1, 10};
    mgpu_store_thread_t *t;
    mgpu_ctx_t *ctx = NULL;
    mgpu_comm_t *comm = NULL;
    mgpu_err_t err = {0, ""};
    int port = 0;

    need_gpu();
    alarm(60);
    t = store_start(&port);
    rank_env(1, 2, port);
    /* Rank 1 alone on a second node, so its LOCAL_RANK 0 has the one GPU. */
    setenv("LOCAL_RANK", "0", 1);
    setenv("LOCAL_WORLD_SIZE", "1", 1);
    setenv("GROUP_RANK", "1", 1);
    setenv("GROUP_WORLD_SIZE", "2", 1);
    OK(mgpu_init(&o, &ctx, &err));
    if (ctx == NULL)
        return;
    CHECK_INT(mgpu_comm_create(ctx, MGPU_BACKEND_NCCL, 2, &comm, &err), MGPU_E_TIMEOUT);
    printf("  %s\n", err.msg);
    CHECK_CONTAINS(err.msg, "rank 1: NCCL unique id (store key \"mgpu/nccl/0/id\") not published "
                            "by rank 0 within 2 s");
    mgpu_finalize(ctx);
    mgpu_store_thread_stop(t);
}

static void CUDART_CB sleep_on_stream(void *arg)
{
    usleep((useconds_t)(intptr_t)arg);
}

/* A collective that cannot finish within the timeout (here: queued behind 4 s of other work
 * on its stream) is aborted by the watchdog; mgpu_comm_wait and every later call say which
 * one, with the label the trainer gave it. */
static void test_nccl_collective_timeout(void)
{
    mgpu_ctx_t *ctx;
    mgpu_comm_t *comm;
    mgpu_err_t err = {0, ""};
    cudaStream_t st;
    float *d;
    double t0, took;

    need_gpu();
    alarm(120);
    comm = nccl_world1(&ctx, 1);
    CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CU(cudaMalloc((void **)&d, 1024 * sizeof *d));
    OK(mgpu_allreduce_f32(comm, d, 1024, MGPU_SUM, st, &err)); /* a good one first */
    OK(mgpu_comm_wait(comm, st, &err));
    CU(cudaLaunchHostFunc(st, sleep_on_stream, (void *)(intptr_t)4000000));
    mgpu_comm_set_label(comm, "bucket 3");
    t0 = now_s();
    OK(mgpu_allreduce_f32(comm, d, 1024, MGPU_SUM, st, &err)); /* enqueued: fine so far */
    CHECK_INT(mgpu_comm_wait(comm, st, &err), MGPU_E_TIMEOUT);
    took = now_s() - t0;
    printf("  after %.2f s: %s\n", took, err.msg);
    CHECK_CONTAINS(err.msg, "rank 0: all-reduce (sum) of 1024 floats (bucket 3), collective #2 "
                            "of rank 0 of 1 did not finish in 1 s");
    CHECK_CONTAINS(err.msg, "aborted the communicator");
    CHECK(took >= 0.9 && took < 60);
    /* Failed for good: every call says why. */
    CHECK_INT(mgpu_allreduce_f32(comm, d, 1024, MGPU_SUM, st, &err), MGPU_E_TIMEOUT);
    CHECK_CONTAINS(err.msg, "(bucket 3), collective #2");
    CHECK_INT(mgpu_barrier(comm, &err), MGPU_E_TIMEOUT);
    cudaStreamSynchronize(st); /* the sleeper ends; what NCCL left queued may fail: not ours */
    mgpu_comm_destroy(comm);
    mgpu_finalize(ctx);
}

/* The launcher's word that a node is lost (mgpu_pages_set_lost on the rank's progress page)
 * while a collective is pending on the GPU (queued behind 2 s of other work; the deadline is
 * 60 s): the watchdog aborts the communicator, and mgpu_comm_wait and every later call fail
 * with MGPU_E_PEER naming the collective and carrying the launcher's text. ncclCommAbort
 * returns only once the sleeping host function has ended (tests/bench/NCCL_RESULTS.md), so
 * the bound on the time tells the word from the deadline, not the watchdog's poll. */
static void test_nccl_lost_aborts(void)
{
    static const char lost[] = "ranks 2-3 (node 1, host h1) lost: heartbeat missed for 15.0 s";
    mgpu_ctx_t *ctx;
    mgpu_comm_t *comm;
    mgpu_err_t err = {0, ""};
    mgpu_pages_t pg;
    cudaStream_t st;
    char path[64];
    float *d;
    double t0, took;

    need_gpu();
    alarm(120);
    CHECK_INT(mgpu_pages_open(&pg, 1, &err), 0);
    snprintf(path, sizeof path, "/proc/self/fd/%d", pg.fd);
    setenv("MGPU_PROGRESS_FILE", path, 1);
    setenv("MGPU_PROGRESS_SLOT", "0", 1);
    comm = nccl_world1(&ctx, 60);
    CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CU(cudaMalloc((void **)&d, 1024 * sizeof *d));
    OK(mgpu_allreduce_f32(comm, d, 1024, MGPU_SUM, st, &err)); /* a good one first */
    OK(mgpu_comm_wait(comm, st, &err));
    CU(cudaLaunchHostFunc(st, sleep_on_stream, (void *)(intptr_t)2000000));
    mgpu_comm_set_label(comm, "bucket 0");
    OK(mgpu_allreduce_f32(comm, d, 1024, MGPU_SUM, st, &err)); /* pending behind the sleep */
    usleep(300000);
    t0 = now_s();
    mgpu_pages_set_lost(&pg, lost);
    CHECK_INT(mgpu_comm_wait(comm, st, &err), MGPU_E_PEER);
    took = now_s() - t0;
    printf("  after %.3f s: %s\n", took, err.msg);
    CHECK_CONTAINS(err.msg, "rank 0: all-reduce (sum) of 1024 floats (bucket 0), collective #2 "
                            "of rank 0 of 1: ");
    CHECK_CONTAINS(err.msg, lost);
    CHECK_CONTAINS(err.msg, "aborted the communicator");
    CHECK(took < 10.0);
    CHECK(mgpu_comm_nccl(comm) == NULL);
    /* Failed for good: every call says why. */
    CHECK_INT(mgpu_allreduce_f32(comm, d, 1024, MGPU_SUM, st, &err), MGPU_E_PEER);
    CHECK_CONTAINS(err.msg, lost);
    CHECK_INT(mgpu_barrier(comm, &err), MGPU_E_PEER);
    cudaStreamSynchronize(st); /* the sleeper ends; what NCCL left queued may fail: not ours */
    mgpu_comm_destroy(comm);
    mgpu_finalize(ctx);
    /* A communicator made after the word fails its first collective at once. */
    comm = nccl_world1(&ctx, 60);
    CHECK_INT(mgpu_allreduce_f32(comm, d, 1024, MGPU_SUM, st, &err), MGPU_E_PEER);
    CHECK_CONTAINS(err.msg, lost);
    mgpu_comm_destroy(comm);
    mgpu_finalize(ctx);
    cudaFree(d);
    cudaStreamDestroy(st);
    mgpu_pages_close(&pg);
}

/* A CUDA graph holding an all-reduce: captured (not watched then), replayed, and its replay put
 * under the watchdog's deadline by mgpu_comm_watch; a replay stuck behind 3 s of other work
 * times out under the name the caller gave. */
static void test_nccl_graph_watch(void)
{
    mgpu_ctx_t *ctx;
    mgpu_comm_t *comm;
    mgpu_err_t err = {0, ""};
    cudaStream_t st;
    cudaGraph_t g;
    cudaGraphExec_t ge;
    float *d, h[256], got[256];

    need_gpu();
    alarm(120);
    comm = nccl_world1(&ctx, 1);
    CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CU(cudaMalloc((void **)&d, sizeof h));
    for (int i = 0; i < 256; i++)
        h[i] = (float)i - 100.5f;
    CU(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    OK(mgpu_allreduce_f32(comm, d, 256, MGPU_AVG, st, &err));
    CHECK_INT(mgpu_comm_watch(comm, st, "inside the capture", &err), MGPU_E_USAGE);
    CHECK_CONTAINS(err.msg, "the stream is being captured");
    CU(cudaStreamEndCapture(st, &g));
    CU(cudaGraphInstantiate(&ge, g, 0));
    CU(cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice));
    for (int i = 0; i < 3; i++) {
        CU(cudaGraphLaunch(ge, st));
        OK(mgpu_comm_watch(comm, st, "graph replay", &err));
    }
    OK(mgpu_comm_wait(comm, st, &err));
    CU(cudaMemcpy(got, d, sizeof got, cudaMemcpyDeviceToHost));
    CHECK(compare(got, h, 256, "graph replay of an all-reduce"));
    CU(cudaLaunchHostFunc(st, sleep_on_stream, (void *)(intptr_t)3000000));
    CU(cudaGraphLaunch(ge, st));
    OK(mgpu_comm_watch(comm, st, "replay of step 7", &err));
    CHECK_INT(mgpu_comm_wait(comm, st, &err), MGPU_E_TIMEOUT);
    printf("  %s\n", err.msg);
    CHECK_CONTAINS(err.msg, "rank 0: replay of step 7 (rank 0 of 1) did not finish in 1 s");
    cudaStreamSynchronize(st);
    mgpu_comm_destroy(comm);
    mgpu_finalize(ctx);
}

/* Two processes, one GPU (MGPU_ALLOW_GPU_SHARING=1): the unique id travels through the store
 * from rank 0 to rank 1, both reach ncclCommInitRank together, and NCCL refuses two ranks of
 * one communicator on one device (seen with NCCL 2.28.3: "Duplicate GPU detected"): both ranks
 * must fail at once with NCCL's reason, neither hang nor time out. */
static void rank_shared_gpu(int rank, int size, void *arg)
{
    mgpu_init_opts_t o = {1, 10};
    mgpu_ctx_t *ctx = NULL;
    mgpu_comm_t *comm = NULL;
    mgpu_err_t err = {0, ""};
    double t0;
    int rc;

    rank_env(rank, size, *(const int *)arg);
    setenv("MGPU_ALLOW_GPU_SHARING", "1", 1);
    OK(mgpu_init(&o, &ctx, &err));
    if (ctx == NULL)
        return;
    t0 = now_s();
    rc = mgpu_comm_create(ctx, MGPU_BACKEND_NCCL, 30, &comm, &err);
    printf("  rank %d after %.2f s: %s\n", rank, now_s() - t0, err.msg);
    CHECK_INT(rc, MGPU_E_NCCL);
    CHECK(comm == NULL);
    CHECK(now_s() - t0 < 25); /* NCCL's refusal, not the 30 s timeout */
    CHECK_CONTAINS(err.msg, "ncclCommInitRankConfig(nranks=2");
    CHECK_CONTAINS(err.msg, "Duplicate GPU detected");
    mgpu_finalize(ctx);
}

static void test_nccl_two_ranks_one_gpu(void)
{
    mgpu_init_opts_t o = {1, 10};
    mgpu_store_thread_t *t;
    mgpu_ctx_t *ctx = NULL;
    mgpu_err_t err = {0, ""};
    int port = 0, gpu;

    /* Is there a GPU? Asked without initialising CUDA, which the ranks forked below do. */
    rank_env(0, 1, 0);
    OK(mgpu_init(&o, &ctx, &err));
    gpu = ctx != NULL && mgpu_device(ctx)->is_gpu;
    mgpu_finalize(ctx);
    if (!gpu)
        SKIP("no CUDA device");
    t = store_start(&port);
    pid_t pid[2];
    fflush(stdout);
    for (int r = 0; r < 2; r++)
        if ((pid[r] = fork()) == 0) {
            alarm(90); /* a hang is a failure of this rank, not of the run */
            rank_shared_gpu(r, 2, &port);
            fflush(stdout);
            _exit(check_failed ? 1 : 0);
        }
    for (int r = 0; r < 2; r++) {
        int st = 0;
        CHECK(pid[r] > 0 && waitpid(pid[r], &st, 0) == pid[r]);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            printf("  rank %d: %s %d\n", r, WIFEXITED(st) ? "exit" : "signal",
                   WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    mgpu_store_thread_stop(t);
}

/* ---- the general collectives: every op x dtype x reduction on device buffers ---------- */

/* Operands are small non-negative integers, so sums, maxima and minima are exact in every
 * type and whatever order NCCL reduces in (|sum| <= 16 * 8 < 256, exact in bf16), and an
 * integer average is unambiguous. A float average is compared with a tolerance: NCCL
 * multiplies each operand by 1/W before summing (ncclAvg's pre-multiplication). */
static long gval(int rank, size_t i, int salt)
{
    return (long)((i * 7 + (size_t)rank * 13 + (size_t)salt) % 17);
}

static void gstore(void *p, size_t i, mgpu_dtype_t dt, double v)
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

static double gload(const void *p, size_t i, mgpu_dtype_t dt)
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

static double gexpect(mgpu_dtype_t dt, mgpu_redop_t op, int W, size_t i, int salt)
{
    long s = 0, mx = -1, mn = 1000;
    for (int q = 0; q < W; q++) {
        long v = gval(q, i, salt);
        s += v;
        mx = v > mx ? v : mx;
        mn = v < mn ? v : mn;
    }
    if (op == MGPU_MAX || op == MGPU_MIN)
        return (double)(op == MGPU_MAX ? mx : mn);
    if (op == MGPU_SUM)
        return (double)s;
    if (dt == MGPU_DTYPE_I32 || dt == MGPU_DTYPE_I64)
        return (double)(s / W);
    return (double)s / W;
}

/* n elements of got against the expected reduction of elements first.. ; 0 when all match. */
static size_t gcheck(const void *got, size_t n, mgpu_dtype_t dt, mgpu_redop_t op, int W,
                     size_t first, int salt, const char *what)
{
    double tol = 0;
    size_t bad = 0;
    if (op == MGPU_AVG)
        tol = dt == MGPU_DTYPE_F32    ? 1e-6
              : dt == MGPU_DTYPE_F64  ? 1e-12
              : dt == MGPU_DTYPE_F16  ? 2e-3
              : dt == MGPU_DTYPE_BF16 ? 2e-2
                                      : 0;
    for (size_t i = 0; i < n; i++) {
        double g = gload(got, i, dt), w = gexpect(dt, op, W, first + i, salt);
        double d = g > w ? g - w : w - g;
        if (d > tol * (w > 1 ? w : 1) && bad++ < 3)
            printf("  %s: element %zu is %.9g, expected %.9g\n", what, i, g, w);
    }
    if (bad)
        printf("  %s: %zu of %zu wrong\n", what, bad, n);
    return bad;
}

/* One rank of W, each on GPU LOCAL_RANK: all-reduce, reduce-scatter (out of place and in
 * place) and all-gather (both) for every dtype and reduction, results checked on the host. */
static void rank_general(int rank, int W, int store_port)
{
    static const size_t counts[] = {1, 7, 1001, 65537};
    size_t maxn = 65537 * (size_t)W * 8;
    mgpu_init_opts_t o = {1, 10};
    mgpu_ctx_t *ctx = NULL;
    mgpu_comm_t *comm = NULL;
    mgpu_err_t err = {0, ""};
    cudaStream_t st;
    char *h, *g, *d, *d2, what[128];
    int salt = 0, nranks = 0;

    rank_env(rank, W, store_port);
    if (mgpu_init(&o, &ctx, &err) != 0 ||
        mgpu_comm_create(ctx, MGPU_BACKEND_NCCL, 60, &comm, &err) != 0) {
        printf("  rank %d: %s\n", rank, err.msg);
        CHECK(0);
        return;
    }
    /* The handle and stream for a program's own NCCL calls and kernels. */
    CHECK(mgpu_comm_nccl(comm) != NULL);
    CHECK(mgpu_comm_stream(comm) != NULL);
    CHECK_INT(ncclCommCount((ncclComm_t)mgpu_comm_nccl(comm), &nranks), ncclSuccess);
    CHECK_INT(nranks, W);
    st = (cudaStream_t)mgpu_comm_stream(comm);
    h = malloc(maxn);
    g = malloc(maxn);
    CU(cudaMalloc((void **)&d, maxn));
    CU(cudaMalloc((void **)&d2, maxn));
    /* cudaMemcpy from pageable memory and cudaMemset may return before they land, on the
     * legacy default stream, which the communicator's non-blocking stream does not wait for:
     * each collective below starts after a device-wide synchronisation. */
    for (int t = 0; t <= MGPU_DTYPE_I64; t++) {
        mgpu_dtype_t dt = (mgpu_dtype_t)t;
        size_t esz = mgpu_dtype_size(dt);
        for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
            size_t n = counts[k], all = n * (size_t)W;
            for (int op = MGPU_SUM; op <= MGPU_MIN; op++) {
                mgpu_redop_t r = (mgpu_redop_t)op;
                salt++;
                for (size_t i = 0; i < n; i++)
                    gstore(h, i, dt, (double)gval(rank, i, salt));
                CU(cudaMemcpy(d, h, n * esz, cudaMemcpyHostToDevice));
                CU(cudaDeviceSynchronize()); /* the copies and memsets above: legacy stream */
                OK(mgpu_allreduce(comm, d, n, dt, r, st, &err));
                OK(mgpu_comm_wait(comm, st, &err));
                CU(cudaMemcpy(g, d, n * esz, cudaMemcpyDeviceToHost));
                snprintf(what, sizeof what, "rank %d: all-reduce %s %s n=%zu", rank,
                         mgpu_dtype_name(dt), mgpu_redop_name(r), n);
                CHECK_INT(gcheck(g, n, dt, r, W, 0, salt, what), 0);

                salt++;
                for (size_t i = 0; i < all; i++)
                    gstore(h, i, dt, (double)gval(rank, i, salt));
                CU(cudaMemcpy(d, h, all * esz, cudaMemcpyHostToDevice));
                CU(cudaMemset(d2, 0xff, n * esz));
                CU(cudaDeviceSynchronize()); /* the copies and memsets above: legacy stream */
                OK(mgpu_reduce_scatter(comm, d, d2, n, dt, r, st, &err));
                OK(mgpu_comm_wait(comm, st, &err));
                CU(cudaMemcpy(g, d2, n * esz, cudaMemcpyDeviceToHost));
                snprintf(what, sizeof what, "rank %d: reduce-scatter %s %s recvcount=%zu", rank,
                         mgpu_dtype_name(dt), mgpu_redop_name(r), n);
                CHECK_INT(gcheck(g, n, dt, r, W, (size_t)rank * n, salt, what), 0);
                CU(cudaDeviceSynchronize()); /* the copies and memsets above: legacy stream */
                OK(mgpu_reduce_scatter(comm, d, d + (size_t)rank * n * esz, n, dt, r, st, &err));
                OK(mgpu_comm_wait(comm, st, &err));
                CU(cudaMemcpy(g, d + (size_t)rank * n * esz, n * esz, cudaMemcpyDeviceToHost));
                CHECK_INT(gcheck(g, n, dt, r, W, (size_t)rank * n, salt, "in place"), 0);
            }
            /* all-gather: out of place into a poisoned buffer, then in place */
            salt++;
            for (size_t i = 0; i < n; i++)
                gstore(h, i, dt, (double)gval(rank, i, salt));
            CU(cudaMemcpy(d, h, n * esz, cudaMemcpyHostToDevice));
            CU(cudaMemset(d2, 0xff, all * esz));
            CU(cudaDeviceSynchronize()); /* the copies and memsets above: legacy stream */
            OK(mgpu_all_gather(comm, d, d2, n, dt, st, &err));
            OK(mgpu_comm_wait(comm, st, &err));
            CU(cudaMemcpy(g, d2, all * esz, cudaMemcpyDeviceToHost));
            for (int q = 0; q < W; q++)
                for (size_t i = 0; i < n; i++)
                    gstore(h, (size_t)q * n + i, dt, (double)gval(q, i, salt));
            if (memcmp(g, h, all * esz) != 0) {
                printf("  rank %d: all-gather %s n=%zu differs\n", rank, mgpu_dtype_name(dt), n);
                CHECK(0);
            }
            CU(cudaMemset(d2, 0xff, all * esz));
            CU(cudaMemcpy(d2 + (size_t)rank * n * esz, h + (size_t)rank * n * esz, n * esz,
                          cudaMemcpyHostToDevice));
            CU(cudaDeviceSynchronize()); /* the copies and memsets above: legacy stream */
            OK(mgpu_all_gather(comm, d2 + (size_t)rank * n * esz, d2, n, dt, st, &err));
            OK(mgpu_comm_wait(comm, st, &err));
            CU(cudaMemcpy(g, d2, all * esz, cudaMemcpyDeviceToHost));
            if (memcmp(g, h, all * esz) != 0) {
                printf("  rank %d: in-place all-gather %s n=%zu differs\n", rank,
                       mgpu_dtype_name(dt), n);
                CHECK(0);
            }
        }
    }
    /* Bad arguments are refused before NCCL sees them; the communicator stays usable. */
    CHECK_INT(mgpu_allreduce(comm, d, 4, (mgpu_dtype_t)9, MGPU_SUM, st, &err), MGPU_E_USAGE);
    CHECK_CONTAINS(err.msg, "dtype 9 is not an mgpu_dtype_t");
    CHECK_INT(mgpu_reduce_scatter(comm, d, NULL, 4, MGPU_DTYPE_F16, MGPU_SUM, st, &err),
              MGPU_E_USAGE);
    CHECK_CONTAINS(err.msg, "recv is NULL");
    CHECK_INT(mgpu_allreduce(comm, d, 4, MGPU_DTYPE_I32, (mgpu_redop_t)5, st, &err), MGPU_E_USAGE);
    CHECK_CONTAINS(err.msg, "op 5 is not an mgpu_redop_t");
    /* The program's own work on the communicator's stream, waited for through libmgpu. */
    CU(cudaMemsetAsync(d, 0, 16, st));
    OK(mgpu_comm_wait(comm, st, &err));
    OK(mgpu_barrier(comm, &err));
    cudaFree(d);
    cudaFree(d2);
    free(h);
    free(g);
    mgpu_comm_destroy(comm);
    mgpu_finalize(ctx);
}

static void test_nccl_general_world1(void)
{
    need_gpu();
    rank_general(0, 1, 0);
}

/* One rank per visible GPU, up to 4 (skips below 2 GPUs). */
static void test_nccl_general_gpus(void)
{
    mgpu_init_opts_t o = {1, 10};
    mgpu_store_thread_t *t;
    mgpu_ctx_t *ctx = NULL;
    mgpu_err_t err = {0, ""};
    int port = 0, W;
    pid_t pid[4];

    /* Counted without initialising CUDA, which the ranks forked below do. */
    rank_env(0, 1, 0);
    OK(mgpu_init(&o, &ctx, &err));
    W = ctx != NULL && mgpu_device(ctx)->is_gpu && !mgpu_device(ctx)->simulated
            ? mgpu_device(ctx)->visible_count
            : 0;
    mgpu_finalize(ctx);
    if (W < 2)
        SKIP("fewer than 2 CUDA devices (%d)", W);
    W = W > 4 ? 4 : W;
    printf("  %d ranks\n", W);
    t = store_start(&port);
    fflush(stdout);
    for (int r = 0; r < W; r++)
        if ((pid[r] = fork()) == 0) {
            alarm(240); /* a hang is a failure of this rank, not of the run */
            rank_general(r, W, port);
            fflush(stdout);
            _exit(check_failed ? 1 : 0);
        }
    for (int r = 0; r < W; r++) {
        int st = 0;
        CHECK(pid[r] > 0 && waitpid(pid[r], &st, 0) == pid[r]);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    mgpu_store_thread_stop(t);
}
#else
/* Listed in every build, so a CPU build says what it did not run. */
#define NO_CUDA_TEST(name)                                                                         \
    static void name(void)                                                                         \
    {                                                                                              \
        SKIP("no CUDA device: built without CUDA (CUDA=0 or no nvcc)");                            \
    }
NO_CUDA_TEST(test_nccl_world1_collectives)
NO_CUDA_TEST(test_nccl_init_timeout)
NO_CUDA_TEST(test_nccl_id_timeout)
NO_CUDA_TEST(test_nccl_collective_timeout)
NO_CUDA_TEST(test_nccl_graph_watch)
NO_CUDA_TEST(test_nccl_two_ranks_one_gpu)
NO_CUDA_TEST(test_nccl_general_world1)
NO_CUDA_TEST(test_nccl_general_gpus)
NO_CUDA_TEST(test_nccl_lost_aborts)
#endif

int main(void)
{
    RUN(test_timeline_text);
    RUN(test_timeline_in_store);
    RUN(test_nccl_refused);
    RUN(test_nccl_world1_collectives);
    RUN(test_nccl_init_timeout);
    RUN(test_nccl_id_timeout);
    RUN(test_nccl_collective_timeout);
    RUN(test_nccl_graph_watch);
    RUN(test_nccl_two_ranks_one_gpu);
    RUN(test_nccl_general_world1);
    RUN(test_nccl_general_gpus);
    RUN(test_nccl_lost_aborts);
    return check_done();
}
