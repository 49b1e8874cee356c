/* test_progress.c - the progress page as libmgpu writes it: attached to a shared file made as
 * mgpu-launch makes it (a memfd, reached through /proc/<pid>/fd/<n>), the calls and the
 * collectives read back with mgpu_progress_read, a reader that never sees a torn page,
 * MGPU_PROGRESS=0, bad variables that warn and never fail, and the naming of the ranks that
 * never entered a collective (beacon.c) on pages filled by hand. */
#include "check.h"

#include <signal.h>   /* kill, SIGKILL */
#include <stdint.h>   /* intptr_t */
#include <stdio.h>    /* snprintf */
#include <stdlib.h>   /* setenv, unsetenv */
#include <string.h>   /* memset, memcmp */
#include <sys/mman.h> /* memfd_create, mmap */
#include <unistd.h>   /* ftruncate, dup2 */

#if defined(MGPU_HAVE_CUDA) && MGPU_HAVE_CUDA
#include <cuda_runtime_api.h> /* cudaMalloc, cudaLaunchHostFunc */
#define HAVE_CUDA 1
#else
#define HAVE_CUDA 0
#endif

#include "beacon.h"   /* mgpu_beacon_absent */
#include "mgpu.h"     /* mgpu_init, mgpu_progress_* */
#include "progress.h" /* mgpu_progress_read */

/* A shared file of n pages, as the launcher makes it; its path goes into the environment. */
static mgpu_progress_page_t *make_pages(int n, int slot)
{
    char path[64], s[16];
    int fd = memfd_create("mgpu-progress-test", MFD_CLOEXEC);
    void *m;

    if (fd < 0 || ftruncate(fd, (off_t)n * MGPU_PROGRESS_PAGE) < 0)
        return NULL;
    m = mmap(NULL, (size_t)n * MGPU_PROGRESS_PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED)
        return NULL;
    snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)getpid(), fd);
    snprintf(s, sizeof s, "%d", slot);
    setenv(MGPU_PROGRESS_ENV_FILE, path, 1);
    setenv(MGPU_PROGRESS_ENV_SLOT, s, 1);
    return m;
}

static mgpu_progress_page_t *page_at(mgpu_progress_page_t *pages, int slot)
{
    return (mgpu_progress_page_t *)((char *)pages + (size_t)slot * MGPU_PROGRESS_PAGE);
}

static mgpu_ctx_t *init_cpu(void)
{
    mgpu_init_opts_t o = {0, 10};
    mgpu_ctx_t *ctx = NULL;
    mgpu_err_t err;

    if (mgpu_init(&o, &ctx, &err) < 0) {
        printf("  mgpu_init: %s\n", err.msg);
        return NULL;
    }
    return ctx;
}

/* stderr into a file, read back by stderr_text. */
static FILE *capture_stderr(void)
{
    FILE *f = tmpfile();
    fflush(stderr);
    dup2(fileno(f), 2);
    return f;
}

static const char *stderr_text(FILE *f, char *buf, size_t len)
{
    size_t n;
    fflush(stderr);
    rewind(f);
    n = fread(buf, 1, len - 1, f);
    buf[n] = '\0';
    return buf;
}

static void test_attach_write_read(void)
{
    mgpu_progress_page_t *pages = make_pages(2, 1), got;
    mgpu_ctx_t *ctx;
    uint64_t moves;

    CHECK(pages != NULL);
    ctx = init_cpu();
    CHECK(ctx != NULL);
    CHECK_INT(mgpu_progress_read(page_at(pages, 1), &got), 0);
    CHECK_INT(got.magic, MGPU_PROGRESS_MAGIC);
    CHECK_INT(got.version, MGPU_PROGRESS_VERSION);
    CHECK_INT(got.pid, getpid());
    CHECK_INT(got.rank, 0);
    CHECK_INT(got.step, -1);
    CHECK_INT(got.phase, MGPU_PHASE_INIT);
    CHECK_INT(got.coll_entered, 0);
    CHECK(got.moved_ns > 0);
    moves = got.moves;
    /* Only the rank's own slot is written. */
    CHECK_INT(mgpu_progress_read(page_at(pages, 0), &got), -1);
    CHECK_INT(page_at(pages, 0)->magic, 0);

    mgpu_progress_step(ctx, 7);
    mgpu_progress_phase(ctx, MGPU_PHASE_FORWARD);
    mgpu_progress_label(ctx, "epoch 3");
    CHECK_INT(mgpu_progress_read(page_at(pages, 1), &got), 0);
    CHECK_INT(got.step, 7);
    CHECK_STR(mgpu_progress_phase_name(got.phase), "forward");
    CHECK_STR(got.label, "epoch 3");
    CHECK_INT(got.moves, moves + 3);
    CHECK(got.phase_ns <= got.moved_ns);
    /* A label is cut to what the page holds, NUL-terminated; NULL clears it. */
    char longer[100];
    memset(longer, 'x', sizeof longer - 1);
    longer[sizeof longer - 1] = '\0';
    mgpu_progress_label(ctx, longer);
    CHECK_INT(mgpu_progress_read(page_at(pages, 1), &got), 0);
    CHECK_INT(strlen(got.label), sizeof got.label - 1);
    mgpu_progress_label(ctx, NULL);
    CHECK_INT(mgpu_progress_read(page_at(pages, 1), &got), 0);
    CHECK_STR(got.label, "");
    /* A NULL context writes nothing and does not crash. */
    mgpu_progress_step(NULL, 1);
    mgpu_progress_phase(NULL, MGPU_PHASE_DATA);
    mgpu_progress_label(NULL, "x");
    mgpu_finalize(ctx);
}

/* Every collective of the API once, those made of others counted once, with its operation,
 * bytes and bucket; on the CPU backend each is done when it returns. */
static void test_collectives_recorded(void)
{
    mgpu_progress_page_t *pages = make_pages(1, 0), got;
    const mgpu_progress_coll_t *c;
    mgpu_ctx_t *ctx = init_cpu();
    mgpu_comm_t *comm = NULL;
    mgpu_err_t err;
    float f[4] = {1, 2, 3, 4}, g[4];
    double d[2] = {1, 2};

    CHECK(pages != NULL && ctx != NULL);
    CHECK_INT(mgpu_comm_create(ctx, MGPU_BACKEND_CPU, 10, &comm, &err), 0);
    mgpu_comm_set_label(comm, "bucket 3");
    CHECK_INT(mgpu_allreduce_f32(comm, f, 4, MGPU_AVG, NULL, &err), 0); /* 1 */
    mgpu_comm_set_label(comm, NULL);
    CHECK_INT(mgpu_allreduce(comm, d, 2, MGPU_DTYPE_F64, MGPU_MAX, NULL, &err), 0);         /* 2 */
    CHECK_INT(mgpu_broadcast(comm, f, sizeof f, 0, NULL, &err), 0);                         /* 3 */
    CHECK_INT(mgpu_allgather(comm, f, g, sizeof f, NULL, &err), 0);                         /* 4 */
    CHECK_INT(mgpu_reduce_scatter(comm, f, g, 4, MGPU_DTYPE_F32, MGPU_SUM, NULL, &err), 0); /* 5 */
    CHECK_INT(mgpu_all_gather(comm, f, g, 4, MGPU_DTYPE_F32, NULL, &err), 0);               /* 6 */
    CHECK_INT(mgpu_barrier(comm, &err), 0);                                                 /* 7 */
    mgpu_progress_bucket(ctx, 5);
    CHECK_INT(mgpu_allreduce(comm, f, 4, MGPU_DTYPE_F32, MGPU_SUM, NULL, &err), 0); /* 8 */
    CHECK_INT(mgpu_progress_read(pages, &got), 0);
    CHECK_INT(got.coll_entered, 8);
    CHECK_INT(got.coll_done, 8);
    c = mgpu_progress_coll(&got, 1);
    CHECK(c != NULL);
    if (c != NULL) {
        CHECK_STR(mgpu_progress_coll_name(c->op), "all-reduce");
        CHECK_INT(c->bucket, 3);
        CHECK_INT(c->bytes, 16);
        CHECK(c->since_ns > 0);
    }
    /* By sequence number (the comments above). */
    static const char *const ops[] = {"",           "all-reduce", "all-reduce",
                                      "broadcast",  "all-gather", "reduce-scatter",
                                      "all-gather", "barrier",    "all-reduce"};
    for (uint64_t s = 2; s <= 8; s++) {
        c = mgpu_progress_coll(&got, s);
        CHECK(c != NULL);
        if (c != NULL)
            CHECK_STR(mgpu_progress_coll_name(c->op), ops[s]);
    }
    c = mgpu_progress_coll(&got, 2);
    CHECK(c != NULL && c->bucket == -1 && c->bytes == 16);
    c = mgpu_progress_coll(&got, 5);
    CHECK(c != NULL && c->bytes == 16); /* this rank's send: world (1) x 4 floats */
    c = mgpu_progress_coll(&got, 8);
    CHECK(c != NULL && c->bucket == 5);
    /* A failed call (a usage error) is entered but never done. */
    CHECK(mgpu_allreduce(comm, f, 4, (mgpu_dtype_t)99, MGPU_SUM, NULL, &err) < 0);
    CHECK_INT(mgpu_progress_read(pages, &got), 0);
    CHECK_INT(got.coll_entered, 9);
    CHECK_INT(got.coll_done, 8);
    mgpu_comm_destroy(comm);
    mgpu_finalize(ctx);
}

/* A reader in another process copies the page while the worker rewrites it as fast as it
 * can: every copy it accepts is one whole write (a label of one letter throughout, the last
 * ring entry matching coll_entered), never half of two. */
static void test_reader_never_sees_torn_page(void)
{
    mgpu_progress_page_t *pages = make_pages(1, 0), got;
    long accepted = 0, changes = 0;
    uint64_t last_moves = 0;
    pid_t writer;

    CHECK(pages != NULL);
    writer = fork();
    if (writer == 0) {
        mgpu_ctx_t *ctx = init_cpu();
        mgpu_comm_t *comm = NULL;
        mgpu_err_t err;
        char label[64];
        float x = 1;
        if (ctx == NULL || mgpu_comm_create(ctx, MGPU_BACKEND_CPU, 10, &comm, &err) < 0)
            _exit(1);
        for (unsigned i = 0;; i++) {
            memset(label, 'a' + (int)(i % 26), sizeof label - 1);
            label[sizeof label - 1] = '\0';
            mgpu_progress_label(ctx, label);
            mgpu_progress_step(ctx, (long long)i);
            mgpu_allreduce_f32(comm, &x, 1, MGPU_SUM, NULL, &err);
        }
    }
    CHECK(writer > 0);
    /* Until the writer has started. */
    for (int i = 0; i < 5000 && mgpu_progress_read(pages, &got) < 0; i++)
        usleep(1000);
    /* Until many changes were seen, or 3 s (two cores shared with a busy machine). */
    int64_t end = mgpu_beacon_now_ns() + 3000000000LL;
    for (long i = 0; changes < 20000 && ((i & 1023) != 0 || mgpu_beacon_now_ns() < end); i++) {
        if (mgpu_progress_read(pages, &got) < 0)
            continue;
        accepted++;
        if (got.moves != last_moves)
            changes++;
        last_moves = got.moves;
        int uniform = got.label[0] == '\0' || strlen(got.label) == sizeof got.label - 1;
        for (size_t k = 1; uniform && got.label[0] != '\0' && k < sizeof got.label - 1; k++)
            uniform = got.label[k] == got.label[0];
        if (!uniform) {
            printf("  torn label: \"%s\"\n", got.label);
            CHECK(uniform);
            break;
        }
        if (got.coll_entered > 0) {
            const mgpu_progress_coll_t *c = mgpu_progress_coll(&got, got.coll_entered);
            if (c == NULL) {
                printf("  torn ring: entered %llu, its entry missing\n",
                       (unsigned long long)got.coll_entered);
                CHECK(c != NULL);
                break;
            }
        }
    }
    kill(writer, SIGKILL);
    waitpid(writer, NULL, 0);
    printf("  %ld consistent copies, %ld of them after a change\n", accepted, changes);
    CHECK(accepted > 1000);
    CHECK(changes > 100); /* the writer really was writing meanwhile */
}

static void test_off(void)
{
    mgpu_progress_page_t *pages = make_pages(1, 0), zero;
    mgpu_ctx_t *ctx;
    mgpu_comm_t *comm = NULL;
    mgpu_err_t err;
    float x = 1;

    setenv("MGPU_PROGRESS", "0", 1);
    ctx = init_cpu();
    CHECK(pages != NULL && ctx != NULL);
    mgpu_progress_step(ctx, 3);
    mgpu_progress_phase(ctx, MGPU_PHASE_EVAL);
    mgpu_progress_label(ctx, "off");
    CHECK_INT(mgpu_comm_create(ctx, MGPU_BACKEND_CPU, 10, &comm, &err), 0);
    CHECK_INT(mgpu_allreduce_f32(comm, &x, 1, MGPU_SUM, NULL, &err), 0);
    memset(&zero, 0, sizeof zero);
    CHECK(memcmp(pages, &zero, sizeof zero) == 0);
    mgpu_comm_destroy(comm);
    mgpu_finalize(ctx);
}

/* A bad slot, a slot past the file, a file that cannot be opened, one variable without the
 * other: a warning naming the variable, and a worker that runs on (on its private page). */
static void bad_env_case(const char *file, const char *slot, const char *want)
{
    char buf[2048];
    FILE *cap = capture_stderr();
    mgpu_ctx_t *ctx;
    mgpu_comm_t *comm = NULL;
    mgpu_err_t err;
    float x = 1;

    if (file != NULL)
        setenv(MGPU_PROGRESS_ENV_FILE, file, 1);
    else
        unsetenv(MGPU_PROGRESS_ENV_FILE);
    if (slot != NULL)
        setenv(MGPU_PROGRESS_ENV_SLOT, slot, 1);
    else
        unsetenv(MGPU_PROGRESS_ENV_SLOT);
    ctx = init_cpu();
    CHECK(ctx != NULL);
    mgpu_progress_step(ctx, 1);
    mgpu_progress_phase(ctx, MGPU_PHASE_FORWARD);
    CHECK_INT(mgpu_comm_create(ctx, MGPU_BACKEND_CPU, 10, &comm, &err), 0);
    CHECK_INT(mgpu_allreduce_f32(comm, &x, 1, MGPU_SUM, NULL, &err), 0);
    mgpu_comm_destroy(comm);
    mgpu_finalize(ctx);
    CHECK_CONTAINS(stderr_text(cap, buf, sizeof buf), want);
}

static void test_bad_env_warns(void)
{
    mgpu_progress_page_t *pages = make_pages(2, 0);
    char path[64];

    CHECK(pages != NULL);
    snprintf(path, sizeof path, "%s", getenv(MGPU_PROGRESS_ENV_FILE));
    bad_env_case(path, "x", "MGPU_PROGRESS_SLOT=\"x\": expected a local rank");
    bad_env_case(path, "-1", "MGPU_PROGRESS_SLOT=\"-1\"");
    bad_env_case(path, "2", "MGPU_PROGRESS_SLOT=2: ");
    bad_env_case("/nonexistent/progress", "0", "MGPU_PROGRESS_FILE: open(/nonexistent/progress)");
    bad_env_case(path, NULL, "MGPU_PROGRESS_FILE is set but MGPU_PROGRESS_SLOT is not");
    bad_env_case(NULL, "0", "MGPU_PROGRESS_SLOT is set but MGPU_PROGRESS_FILE is not");
    /* None of them wrote the shared pages. */
    CHECK_INT(pages->magic, 0);
    CHECK_INT(page_at(pages, 1)->magic, 0);
}

/* Pages as four local ranks left them, filled by hand. */
static void fill(mgpu_progress_page_t *p, int rank, uint64_t entered)
{
    memset(p, 0, sizeof *p);
    p->magic = MGPU_PROGRESS_MAGIC;
    p->version = MGPU_PROGRESS_VERSION;
    p->rank = rank;
    p->pid = 1000 + rank;
    p->coll_entered = entered;
    for (uint64_t s = entered > MGPU_PROGRESS_RING ? entered - MGPU_PROGRESS_RING + 1 : 1;
         s <= entered; s++) {
        mgpu_progress_coll_t *c = &p->ring[(s - 1) % MGPU_PROGRESS_RING];
        c->seq = s;
        c->op = MGPU_COLL_ALLREDUCE;
        c->bucket = s == 4593 ? 3 : -1;
        c->bytes = 4194304;
    }
}

static void test_absent_names_ranks(void)
{
    static char pages[4 * MGPU_PROGRESS_PAGE];
    mgpu_progress_page_t *p = (mgpu_progress_page_t *)pages;
    char buf[512];

    /* Ranks 8..11 of a job with other nodes; 10 and 11 never entered #4593. */
    fill(page_at(p, 0), 8, 4593);
    fill(page_at(p, 1), 9, 4594);
    fill(page_at(p, 2), 10, 4592);
    fill(page_at(p, 3), 11, 4580);
    CHECK_INT(mgpu_beacon_absent(p, 4, 0, 4593, 1, buf, sizeof buf), 2);
    CHECK_STR(buf, "ranks 10, 11 never entered all-reduce #4593 (bucket 3, 4194304 bytes); "
                   "ranks on other nodes: unknown");
    /* One node: nothing is said of other nodes. */
    CHECK_INT(mgpu_beacon_absent(p, 4, 0, 4593, 0, buf, sizeof buf), 2);
    CHECK_STR(buf, "ranks 10, 11 never entered all-reduce #4593 (bucket 3, 4194304 bytes)");
    /* Seen from rank 9, for its collective #4594: everyone else is behind. */
    CHECK_INT(mgpu_beacon_absent(p, 4, 1, 4594, 0, buf, sizeof buf), 3);
    CHECK_STR(buf, "ranks 8, 10, 11 never entered all-reduce #4594 (4194304 bytes)");
    /* Everyone came: the collective hangs elsewhere (another node, the network). */
    CHECK_INT(mgpu_beacon_absent(p, 4, 3, 4580, 1, buf, sizeof buf), 0);
    CHECK_STR(buf, "every local rank entered all-reduce #4580 (4194304 bytes); ranks on other "
                   "nodes: unknown");
    /* One rank alone behind; a slot nobody attached is named by its local rank. */
    page_at(p, 3)->magic = 0;
    CHECK_INT(mgpu_beacon_absent(p, 4, 0, 4593, 0, buf, sizeof buf), 1);
    CHECK_STR(buf, "rank 10 never entered all-reduce #4593 (bucket 3, 4194304 bytes); local "
                   "rank 3 published no progress");
    /* A page whose writer stopped in the middle of a write still counts (its last state). */
    fill(page_at(p, 3), 11, 4580);
    page_at(p, 3)->seq = 7;
    CHECK_INT(mgpu_beacon_absent(p, 4, 0, 4593, 0, buf, sizeof buf), 2);
    CHECK_STR(buf, "ranks 10, 11 never entered all-reduce #4593 (bucket 3, 4194304 bytes)");
    /* A collective no longer in the ring is named by its number alone. */
    CHECK_INT(mgpu_beacon_absent(p, 4, 0, 4500, 0, buf, sizeof buf), 0);
    CHECK_STR(buf, "every local rank entered collective #4500");
    /* Nothing to say without pages (a private page) or a collective. */
    CHECK_INT(mgpu_beacon_absent(NULL, 0, 0, 4593, 1, buf, sizeof buf), 0);
    CHECK_STR(buf, "");
    CHECK_INT(mgpu_beacon_absent(p, 4, 0, 0, 1, buf, sizeof buf), 0);
    CHECK_STR(buf, "");
    /* A short buffer is cut, NUL-terminated. */
    CHECK_INT(mgpu_beacon_absent(p, 4, 0, 4593, 1, buf, 12), 2);
    CHECK_STR(buf, "ranks 10, 1");
}

#if HAVE_CUDA
static void CUDART_CB sleep_on_stream(void *arg)
{
    usleep((useconds_t)(intptr_t)arg);
}
#endif

/* On a GPU (skipped elsewhere): the NCCL backend's collectives are done when the GPU has
 * finished them (the watchdog says so), and its timeout names the local rank whose page never
 * entered the collective - here a peer's page filled by hand beside a world of one, whose
 * all-reduce waits behind 4 s of other work on its stream. */
static void test_nccl_done_and_timeout_names_ranks(void)
{
#if HAVE_CUDA
    mgpu_progress_page_t *pages = make_pages(2, 0), got;
    mgpu_init_opts_t o = {1, 10};
    mgpu_ctx_t *ctx = NULL;
    mgpu_comm_t *comm = NULL;
    mgpu_err_t err = {0, ""};
    cudaStream_t st;
    float *d;
    int n = 0;

    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0)
        SKIP("no CUDA device");
    alarm(120);
    CHECK(pages != NULL);
    fill(page_at(pages, 1), 1, 1); /* "rank 1" entered collective #1 only */
    if (mgpu_init(&o, &ctx, &err) < 0 ||
        mgpu_comm_create(ctx, MGPU_BACKEND_NCCL, 1, &comm, &err) < 0) {
        printf("  %s\n", err.msg);
        CHECK(0);
        return;
    }
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(cudaMalloc((void **)&d, 1024 * sizeof *d) == cudaSuccess);
    CHECK_INT(mgpu_allreduce_f32(comm, d, 1024, MGPU_SUM, st, &err), 0);
    CHECK_INT(mgpu_comm_wait(comm, st, &err), 0);
    /* Done once the watchdog's next poll has seen it finish. */
    for (int i = 0; i < 2000; i++) {
        CHECK_INT(mgpu_progress_read(pages, &got), 0);
        if (got.coll_done == 1)
            break;
        usleep(1000);
    }
    CHECK_INT(got.coll_entered, 1);
    CHECK_INT(got.coll_done, 1);
    CHECK(cudaLaunchHostFunc(st, sleep_on_stream, (void *)(intptr_t)4000000) == cudaSuccess);
    mgpu_comm_set_label(comm, "bucket 3");
    CHECK_INT(mgpu_allreduce_f32(comm, d, 1024, MGPU_SUM, st, &err), 0);
    CHECK_INT(mgpu_progress_read(pages, &got), 0);
    CHECK_INT(got.coll_entered, 2);
    CHECK_INT(got.coll_done, 1); /* on the GPU, not finished */
    CHECK_INT(mgpu_comm_wait(comm, st, &err), MGPU_E_TIMEOUT);
    printf("  %s\n", err.msg);
    CHECK_CONTAINS(err.msg, "did not finish in 1 s");
    CHECK_CONTAINS(err.msg, "; rank 1 never entered all-reduce #2 (bucket 3, 4096 bytes)");
    CHECK(strstr(err.msg, "other nodes") == NULL);
    cudaStreamSynchronize(st);
    mgpu_comm_destroy(comm);
    mgpu_finalize(ctx);
#else
    SKIP("built without CUDA");
#endif
}

int main(void)
{
    /* Each test runs in its own process; none inherits a launcher's variables. */
    unsetenv("MGPU_PROGRESS");
    unsetenv(MGPU_PROGRESS_ENV_FILE);
    unsetenv(MGPU_PROGRESS_ENV_SLOT);
    unsetenv("MGPU_STORE_ADDR");
    RUN(test_attach_write_read);
    RUN(test_collectives_recorded);
    RUN(test_reader_never_sees_torn_page);
    RUN(test_off);
    RUN(test_bad_env_warns);
    RUN(test_absent_names_ranks);
    RUN(test_nccl_done_and_timeout_names_ranks);
    return check_done();
}
