/* test_comm_cpu.c - the CPU communicator through libmgpu's public API, as workers use it:
 * W forked ranks with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
 * LOCAL_WORLD_SIZE, TORCHELASTIC_RUN_ID, MASTER_PORT unique per test), mgpu_init,
 * mgpu_comm_create(CPU), collectives, failures. The algorithms' corner cases are in
 * test_shm.c; here: the API, the job's naming of its segment, and the failure paths. */
#include "check.h"

#include <signal.h>   /* SIGKILL */
#include <sys/mman.h> /* mmap */
#include <stdlib.h>   /* setenv */

#include <pthread.h> /* pthread_create */
#include <stdint.h>  /* intptr_t */
#include <uv.h>      /* uv_loop_t: the store server's loop */

#include "mgpu.h"
#include "ranks.h"
#include "store.h"        /* mgpu_store_get */
#include "store_child.h"  /* store_start, store_stop: a store server in a child */
#include "store_server.h" /* mgpu_store_server_start */

typedef struct job {
    int port;       /* MASTER_PORT: what tells two jobs with the same run id apart */
    int nodes;      /* > 1: ranks split into nodes of size / nodes, joined through a store */
    int store_port; /* the store server's, when nodes > 1 */
    double timeout; /* communicator timeout */
    int param;
    volatile int *shared;
} job_t;

static void job_init(job_t *j, double timeout)
{
    static int counter;
    memset(j, 0, sizeof *j);
    /* Not bound: only a name. Unique per test process and call. */
    j->port = 20000 + (int)(getpid() % 20000) + 7 * counter++;
    j->timeout = timeout;
    j->nodes = 1;
    j->shared = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
}

static void setenv_int(const char *name, int v)
{
    char s[32];
    snprintf(s, sizeof s, "%d", v);
    setenv(name, s, 1);
}

static void job_env(const job_t *j, int rank, int size)
{
    char v[32];
    int local_size = size / j->nodes;
    setenv_int("RANK", rank);
    setenv_int("LOCAL_RANK", rank % local_size);
    setenv_int("WORLD_SIZE", size);
    setenv_int("LOCAL_WORLD_SIZE", local_size);
    setenv_int("GROUP_RANK", rank / local_size);
    setenv_int("GROUP_WORLD_SIZE", j->nodes);
    setenv("TORCHELASTIC_RUN_ID", "test-comm", 1); /* the same for every job on purpose */
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    snprintf(v, sizeof v, "%d", j->port);
    setenv("MASTER_PORT", v, 1);
    unsetenv("MGPU_STORE_ADDR");
    unsetenv("MGPU_STORE_PORT");
    unsetenv("MGPU_STORE_TOKEN");
    unsetenv("MGPU_LAUNCHER_PID");
    unsetenv("MGPU_NODE_RANK");
    unsetenv("MGPU_NNODES");
    if (j->nodes > 1) {
        setenv("MGPU_STORE_ADDR", "127.0.0.1", 1);
        setenv_int("MGPU_STORE_PORT", j->store_port);
    }
    unsetenv("CUDA_VISIBLE_DEVICES");
    unsetenv("MGPU_SIM_GPUS");
}

/* mgpu_init + a CPU communicator; NULL (with a CHECK failure) when that fails. */
static mgpu_comm_t *job_join(const job_t *j, int rank, int size, mgpu_ctx_t **ctx)
{
    mgpu_init_opts_t o = {0, 10};
    mgpu_comm_t *comm = NULL;
    mgpu_err_t err = {0, ""};
    int rc;

    job_env(j, rank, size);
    *ctx = NULL;
    rc = mgpu_init(&o, ctx, &err);
    if (rc == 0)
        rc = mgpu_comm_create(*ctx, MGPU_BACKEND_CPU, j->timeout, &comm, &err);
    if (rc != 0)
        printf("  rank %d: %s\n", rank, err.msg);
    CHECK_INT(rc, 0);
    return comm;
}

static void job_leave(mgpu_ctx_t *ctx, mgpu_comm_t *comm)
{
    mgpu_comm_destroy(comm);
    mgpu_finalize(ctx);
}

static float value(int rank, size_t i, int salt)
{
    return (float)((long)((i * 7 + (size_t)rank * 13 + (size_t)salt) % 1000) - 500);
}

/* All four collectives; param salts the data so concurrent jobs have different sums. */
static void rank_all_ops(int rank, int size, void *arg)
{
    const job_t *j = arg;
    mgpu_ctx_t *ctx;
    mgpu_comm_t *comm = job_join(j, rank, size, &ctx);
    static const size_t sizes[] = {1, 3, 1001, 8193, 65537, 300001};
    mgpu_err_t err = {0, ""};
    float *buf = malloc(300001 * sizeof *buf), *all = malloc((size_t)size * 300001 * sizeof *all);

    if (comm == NULL)
        return;
    CHECK(mgpu_comm_backend(comm) == MGPU_BACKEND_CPU);
    /* The startup timeline: in ctx, and in the store as "timeline/<rank>" when there is one. */
    {
        char t[1024];
        const char *p;
        mgpu_timeline_get(ctx, t, sizeof t);
        CHECK_CONTAINS(t, "init=");
        CHECK_CONTAINS(t, ";device=");
        CHECK_CONTAINS(t, ";comm=");
        mgpu_timeline_mark(ctx, "first_step");
        mgpu_timeline_mark(ctx, "first_step"); /* kept once */
        mgpu_timeline_get(ctx, t, sizeof t);
        p = strstr(t, "first_step=");
        CHECK(p != NULL && strstr(p + 1, "first_step=") == NULL);
        CHECK(atof(strstr(t, "init=") + 5) > 1.7e9); /* wall-clock seconds */
        CHECK(atof(strstr(t, "init=") + 5) <= atof(strstr(t, "comm=") + 5));
        if (j->nodes > 1) {
            char key[32];
            void *v = NULL;
            size_t vl = 0;
            snprintf(key, sizeof key, "timeline/%d", rank);
            CHECK_INT(mgpu_store_get(mgpu_ctx_store(ctx), key, 5, &v, &vl, &err), 0);
            CHECK_INT(vl, strlen(t));
            CHECK(v != NULL && memcmp(v, t, vl) == 0);
            CHECK_CONTAINS(t, ";store=");
            free(v);
        } else {
            CHECK(strstr(t, "store=") == NULL);
        }
    }
    CHECK_STR(mgpu_rank(ctx)->source, j->nodes > 1 ? "mgpu-launch" : "torchrun");
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = sizes[k];
        for (int op = MGPU_SUM; op <= MGPU_AVG; op++) {
            int bad = 0;
            for (size_t i = 0; i < n; i++)
                buf[i] = value(rank, i, j->param);
            CHECK_INT(mgpu_allreduce_f32(comm, buf, n, (mgpu_redop_t)op, NULL, &err), 0);
            for (size_t i = 0; i < n; i++) {
                float want = 0;
                for (int q = 0; q < size; q++)
                    want += value(q, i, j->param);
                if (op == MGPU_AVG)
                    want /= (float)size;
                bad += buf[i] != want;
            }
            if (bad)
                printf("  rank %d n=%zu op=%d: %d wrong\n", rank, n, op, bad);
            CHECK_INT(bad, 0);
        }
        for (int root = 0; root < size; root++) {
            int bad = 0;
            for (size_t i = 0; i < n; i++)
                buf[i] = rank == root ? value(root, i, j->param) : -1.0f;
            CHECK_INT(mgpu_broadcast(comm, buf, n * sizeof *buf, root, NULL, &err), 0);
            for (size_t i = 0; i < n; i++)
                bad += buf[i] != value(root, i, j->param);
            if (bad)
                printf("  rank %d: broadcast of %zu floats from %d: %d wrong, [0] = %g\n", rank, n,
                       root, bad, (double)buf[0]);
            CHECK_INT(bad, 0);
        }
        for (size_t i = 0; i < n; i++)
            buf[i] = value(rank, i, j->param);
        CHECK_INT(mgpu_allgather(comm, buf, all, n * sizeof *buf, NULL, &err), 0);
        int bad = 0;
        for (int q = 0; q < size; q++)
            for (size_t i = 0; i < n; i++)
                bad += all[(size_t)q * n + i] != value(q, i, j->param);
        CHECK_INT(bad, 0);
        CHECK_INT(mgpu_barrier(comm, &err), 0);
    }
    free(buf);
    free(all);
    job_leave(ctx, comm);
}

static void test_all_ops_2_3_4(void)
{
    for (int size = 2; size <= 4; size++) {
        job_t j;
        job_init(&j, 20);
        CHECK_INT(ranks_run(size, rank_all_ops, &j, 60), 0);
    }
}

/* Two jobs at once on one host with the same run id: MASTER_PORT keeps them apart. */
static void test_two_jobs_do_not_meet(void)
{
    job_t a, b;
    pid_t pa, pb;
    int sa, sb;
    job_init(&a, 20);
    job_init(&b, 20);
    a.param = 1;
    b.param = 2;
    fflush(stdout);
    if ((pa = fork()) == 0)
        _exit(ranks_run(2, rank_all_ops, &a, 60) ? 1 : 0);
    if ((pb = fork()) == 0)
        _exit(ranks_run(2, rank_all_ops, &b, 60) ? 1 : 0);
    CHECK(waitpid(pa, &sa, 0) == pa && WIFEXITED(sa) && WEXITSTATUS(sa) == 0);
    CHECK(waitpid(pb, &sb, 0) == pb && WIFEXITED(sb) && WEXITSTATUS(sb) == 0);
}

static void test_world_of_one(void)
{
    job_t j;
    mgpu_ctx_t *ctx;
    mgpu_comm_t *comm;
    mgpu_err_t err = {0, ""};
    float x[3] = {1, 2, 3}, g[3];
    job_init(&j, 5);
    comm = job_join(&j, 0, 1, &ctx);
    if (comm == NULL)
        return;
    CHECK_INT(mgpu_allreduce_f32(comm, x, 3, MGPU_AVG, NULL, &err), 0);
    CHECK(x[0] == 1 && x[1] == 2 && x[2] == 3);
    CHECK_INT(mgpu_broadcast(comm, x, sizeof x, 0, NULL, &err), 0);
    CHECK_INT(mgpu_allgather(comm, x, g, sizeof x, NULL, &err), 0);
    CHECK(memcmp(x, g, sizeof x) == 0);
    CHECK_INT(mgpu_barrier(comm, &err), 0);
    CHECK_INT(mgpu_broadcast(comm, x, sizeof x, 1, NULL, &err), MGPU_E_RANGE);
    CHECK_CONTAINS(err.msg, "root=1");
    CHECK_INT(mgpu_allreduce_f32(comm, NULL, 3, MGPU_SUM, NULL, &err), MGPU_E_USAGE);
    CHECK_CONTAINS(err.msg, "buf is NULL");
    job_leave(ctx, comm);
}

static void test_refusals(void)
{
    job_t j;
    mgpu_ctx_t *ctx = NULL;
    mgpu_comm_t *comm = NULL;
    mgpu_err_t err = {0, ""};
    int rc;
    mgpu_init_opts_t o = {0, 5};
    job_init(&j, 5);
    /* Two nodes without mgpu's store: no way to find each other, said at once. */
    j.nodes = 2;
    job_env(&j, 1, 4);
    unsetenv("MGPU_STORE_ADDR");
    CHECK_INT(mgpu_init(&o, &ctx, &err), 0);
    if (ctx == NULL)
        return;
    CHECK_INT(mgpu_comm_create(ctx, MGPU_BACKEND_CPU, 5, &comm, &err), MGPU_E_USAGE);
    CHECK_CONTAINS(err.msg, "2 nodes need mgpu's store");
    mgpu_finalize(ctx);
    /* Ranks not numbered node by node. */
    job_env(&j, 1, 4);
    unsetenv("MGPU_STORE_ADDR");
    setenv("GROUP_RANK", "1", 1);
    CHECK_INT(mgpu_init(&o, &ctx, &err), 0);
    if (ctx == NULL)
        return;
    CHECK_INT(mgpu_comm_create(ctx, MGPU_BACKEND_CPU, 5, &comm, &err), MGPU_E_USAGE);
    CHECK_CONTAINS(err.msg, "numbered node by node");
    /* No GPU here (want_gpu = 0): NCCL is refused, by a CUDA build for want of a GPU, by a
     * build without CUDA for want of the backend (test_comm_nccl.c checks both messages). */
    rc = mgpu_comm_create(ctx, MGPU_BACKEND_NCCL, 5, &comm, &err);
    CHECK(rc == MGPU_E_DEVICE || rc == MGPU_E_USAGE);
    CHECK_CONTAINS(err.msg, "mgpu_comm_create(NCCL)");
    mgpu_finalize(ctx);
}

/* Rank 1 never calls: the others' all-reduce times out naming it. */
static void rank_absent(int rank, int size, void *arg)
{
    const job_t *j = arg;
    mgpu_ctx_t *ctx;
    mgpu_comm_t *comm = job_join(j, rank, size, &ctx);
    mgpu_err_t err = {0, ""};
    float buf[10] = {0};

    if (comm == NULL)
        return;
    if (rank == 1) {
        ranks_stay_until(&j->shared[0], size - 1);
    } else {
        double t0 = ranks_now();
        CHECK_INT(mgpu_allreduce_f32(comm, buf, 10, MGPU_SUM, NULL, &err), MGPU_E_TIMEOUT);
        CHECK_CONTAINS(err.msg, "mgpu_allreduce_f32(count=10, sum)");
        CHECK_CONTAINS(err.msg, "timed out after 0.4 s; ranks that never arrived: 1");
        CHECK(ranks_now() - t0 < RANKS_FAST_S);
        __atomic_fetch_add(&j->shared[0], 1, __ATOMIC_SEQ_CST);
    }
    job_leave(ctx, comm);
}

static void test_timeout(void)
{
    job_t j;
    job_init(&j, 0.4);
    CHECK_INT(ranks_run(3, rank_absent, &j, 30), 0);
}

/* Rank 0 is SIGKILLed while the others wait in a broadcast from it. */
static void rank_root_killed(int rank, int size, void *arg)
{
    const job_t *j = arg;
    mgpu_ctx_t *ctx;
    mgpu_comm_t *comm = job_join(j, rank, size, &ctx);
    mgpu_err_t err = {0, ""};
    char buf[100];
    double t0;

    if (comm == NULL)
        return;
    CHECK_INT(mgpu_barrier(comm, &err), 0);
    if (rank == 0) {
        ranks_sleep_ms(300);
        raise(SIGKILL); /* the others wait in the broadcast by now */
    }
    t0 = ranks_now();
    CHECK_INT(mgpu_broadcast(comm, buf, sizeof buf, 0, NULL, &err), MGPU_E_PEER);
    CHECK_CONTAINS(err.msg, "mgpu_broadcast(bytes=100, root=0)");
    CHECK_CONTAINS(err.msg, "rank 0 (pid");
    CHECK(ranks_now() - t0 < RANKS_FAST_S);
    job_leave(ctx, comm);
}

static void test_peer_killed(void)
{
    job_t j;
    ranks_result_t res;
    job_init(&j, 30);
    ranks_run_kill(3, rank_root_killed, &j, 25, -1, 0, &res);
    CHECK(WIFSIGNALED(res.status[0]) && WTERMSIG(res.status[0]) == SIGKILL);
    for (int r = 1; r < 3; r++)
        CHECK(WIFEXITED(res.status[r]) && WEXITSTATUS(res.status[r]) == 0);
}

/* ---- several nodes on this host: shared memory per node, TCP between leaders --------- */

static void nodes_all_ops(int nodes, int size)
{
    job_t j;
    pid_t st;
    job_init(&j, 20);
    j.nodes = nodes;
    st = store_start(&j.store_port);
    CHECK_INT(ranks_run(size, rank_all_ops, &j, 60), 0);
    store_stop(st);
}

static void test_nodes_2x2(void)
{
    nodes_all_ops(2, 4);
}

static void test_nodes_3x1_and_2x3(void)
{
    nodes_all_ops(3, 3); /* leaders only: no shared memory */
    nodes_all_ops(2, 6);
}

/* Node 1 (ranks 2, 3) never calls: node 0's ranks time out, the leader naming node 1. */
static void rank_node_absent(int rank, int size, void *arg)
{
    const job_t *j = arg;
    mgpu_ctx_t *ctx;
    mgpu_comm_t *comm = job_join(j, rank, size, &ctx);
    mgpu_err_t err = {0, ""};
    float buf[1000] = {0};
    double t0;

    if (comm == NULL)
        return;
    if (rank >= 2) {
        ranks_stay_until(&j->shared[0], 2);
        job_leave(ctx, comm);
        return;
    }
    t0 = ranks_now();
    CHECK_INT(mgpu_allreduce_f32(comm, buf, 1000, MGPU_SUM, NULL, &err), MGPU_E_TIMEOUT);
    CHECK_CONTAINS(err.msg, "mgpu_allreduce_f32(count=1000, sum) across 2 nodes");
    CHECK_CONTAINS(err.msg, "waiting for data from node 1 (rank 2)");
    if (rank == 1)
        CHECK_CONTAINS(err.msg, "rank 0 failed: "); /* its leader, which saw it first */
    CHECK(ranks_now() - t0 < RANKS_FAST_S);
    __atomic_fetch_add(&j->shared[0], 1, __ATOMIC_SEQ_CST);
    job_leave(ctx, comm);
}

/* Node 1 never creates its communicator: creation fails on node 0, naming node 1. */
static void rank_node_never_joins(int rank, int size, void *arg)
{
    const job_t *j = arg;
    mgpu_init_opts_t o = {0, 10};
    mgpu_ctx_t *ctx = NULL;
    mgpu_comm_t *comm = NULL;
    mgpu_err_t err = {0, ""};
    double t0;
    int rc;

    job_env(j, rank, size);
    CHECK_INT(mgpu_init(&o, &ctx, &err), 0);
    if (ctx == NULL)
        return;
    if (rank >= 2) {
        ranks_stay_until(&j->shared[0], 2);
        mgpu_finalize(ctx);
        return;
    }
    t0 = ranks_now();
    rc = mgpu_comm_create(ctx, MGPU_BACKEND_CPU, j->timeout, &comm, &err);
    CHECK(rc < 0);
    CHECK(comm == NULL);
    CHECK_CONTAINS(err.msg, "node 1 (rank 2) never published its address");
    if (rank == 1)
        CHECK_CONTAINS(err.msg, "rank 0 failed: ");
    CHECK(ranks_now() - t0 < RANKS_FAST_S);
    __atomic_fetch_add(&j->shared[0], 1, __ATOMIC_SEQ_CST);
    mgpu_finalize(ctx);
}

static void test_nodes_creation_fails_together(void)
{
    job_t j;
    pid_t st;
    job_init(&j, 0.5);
    j.nodes = 2;
    st = store_start(&j.store_port);
    CHECK_INT(ranks_run(4, rank_node_never_joins, &j, 30), 0);
    store_stop(st);
}

/* Node 1 reduces a different count: the leaders see it at once, the others learn it from
 * their leader or a peer; nobody reads the other node's data as its own or waits for the
 * deadline (30 s). */
static void rank_node_mismatch(int rank, int size, void *arg)
{
    const job_t *j = arg;
    mgpu_ctx_t *ctx;
    mgpu_comm_t *comm = job_join(j, rank, size, &ctx);
    mgpu_err_t err = {0, ""};
    float buf[200] = {0};
    double t0;
    int rc;

    if (comm == NULL)
        return;
    t0 = ranks_now();
    rc = mgpu_allreduce_f32(comm, buf, rank < 2 ? 100 : 200, MGPU_SUM, NULL, &err);
    CHECK(rc == MGPU_E_PROTOCOL || rc == MGPU_E_PEER);
    if (rc == MGPU_E_PROTOCOL && (rank == 0 || rank == 2))
        CHECK_CONTAINS(err.msg, "called all-reduce(n=");
    CHECK(ranks_now() - t0 < RANKS_FAST_S);
    j->shared[rank] = rc;
    job_leave(ctx, comm);
}

static void test_nodes_mismatch(void)
{
    job_t j;
    pid_t st;
    job_init(&j, 30);
    j.nodes = 2;
    st = store_start(&j.store_port);
    CHECK_INT(ranks_run(4, rank_node_mismatch, &j, 30), 0);
    CHECK(j.shared[0] == MGPU_E_PROTOCOL || j.shared[2] == MGPU_E_PROTOCOL);
    store_stop(st);
}

static void test_nodes_timeout(void)
{
    job_t j;
    pid_t st;
    job_init(&j, 0.5);
    j.nodes = 2;
    st = store_start(&j.store_port);
    CHECK_INT(ranks_run(4, rank_node_absent, &j, 30), 0);
    store_stop(st);
}

/* Node 1's leader (rank 2) dies inside an all-reduce: everyone else fails fast. */
static void *killer(void *arg)
{
    ranks_sleep_ms((int)(intptr_t)arg);
    raise(SIGKILL);
    return NULL;
}

static void rank_node_leader_killed(int rank, int size, void *arg)
{
    const job_t *j = arg;
    mgpu_ctx_t *ctx;
    mgpu_comm_t *comm = job_join(j, rank, size, &ctx);
    mgpu_err_t err = {0, ""};
    size_t n = 1 << 16;
    float *buf = calloc(n, sizeof *buf);
    pthread_t th;
    double t0;
    int rc;

    if (comm == NULL)
        return;
    CHECK_INT(mgpu_barrier(comm, &err), 0);
    if (rank == 2) {
        pthread_create(&th, NULL, killer, (void *)(intptr_t)300);
        mgpu_allreduce_f32(comm, buf, n, MGPU_SUM, NULL, &err); /* killed in here */
        CHECK(0);
        return;
    }
    if (rank < 2)
        ranks_sleep_ms(1000); /* node 0 arrives after the death */
    t0 = ranks_now();
    rc = mgpu_allreduce_f32(comm, buf, n, MGPU_SUM, NULL, &err);
    CHECK_INT(rc, MGPU_E_PEER);
    if (rank == 0)
        CHECK_CONTAINS(err.msg, "node 1 (rank 2) went away");
    else if (rank == 3)
        CHECK_CONTAINS(err.msg, "rank 0 (pid"); /* its leader: local rank 0 of node 1 */
    CHECK(ranks_now() - t0 < RANKS_FAST_S);
    free(buf);
    job_leave(ctx, comm);
}

static void test_nodes_leader_killed(void)
{
    job_t j;
    pid_t st;
    ranks_result_t res;
    job_init(&j, 30);
    j.nodes = 2;
    st = store_start(&j.store_port);
    ranks_run_kill(4, rank_node_leader_killed, &j, 25, -1, 0, &res);
    CHECK(WIFSIGNALED(res.status[2]) && WTERMSIG(res.status[2]) == SIGKILL);
    for (int r = 0; r < 4; r++)
        if (r != 2)
            CHECK(WIFEXITED(res.status[r]) && WEXITSTATUS(res.status[r]) == 0);
    store_stop(st);
}

int main(void)
{
    RUN(test_all_ops_2_3_4);
    RUN(test_two_jobs_do_not_meet);
    RUN(test_world_of_one);
    RUN(test_refusals);
    RUN(test_timeout);
    RUN(test_peer_killed);
    RUN(test_nodes_2x2);
    RUN(test_nodes_3x1_and_2x3);
    RUN(test_nodes_timeout);
    RUN(test_nodes_mismatch);
    RUN(test_nodes_creation_fails_together);
    RUN(test_nodes_leader_killed);
    return check_done();
}
