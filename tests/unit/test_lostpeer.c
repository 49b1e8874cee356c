/* test_lostpeer.c - the launcher's word that a node is lost, on both sides of the progress
 * pages: mgpu_pages_set_lost (launcher/pages.c) writes it into every local rank's page, and
 * libmgpu's CPU collectives waiting in shared memory or on the TCP ring between nodes fail
 * with it within a few milliseconds instead of at their deadline; those started after it fail
 * at once. Ranks are forked processes with torchrun's environment and a page each in a memfd
 * the test made as the launcher makes it; a thread of the test plays the launcher. */
#include "check.h"

#include <pthread.h>  /* pthread_create: the launcher's thread */
#include <signal.h>   /* SIGKILL */
#include <stddef.h>   /* offsetof */
#include <stdlib.h>   /* setenv */
#include <sys/mman.h> /* mmap */
#include <uv.h>       /* uv_loop_t: the store server's loop */

#include "mgpu.h"
#include "pages.h" /* mgpu_pages_open, mgpu_pages_set_lost: the launcher's side */
#include "progress.h"
#include "ranks.h"
#include "store_child.h"  /* store_start, store_stop: a store server in a child */
#include "store_server.h" /* mgpu_store_server_start */

#define LOST_TEXT "ranks 2-3 (node 1, host h1) lost: heartbeat missed for 15.0 s"

/* What the ranks and the launcher's thread share (an anonymous shared mapping). */
typedef struct shared {
    int ready;      /* ranks about to wait, or with their communicator */
    int done;       /* ranks that finished their checks */
    int lost_set;   /* the launcher wrote the pages */
    double lost_at; /* when (CLOCK_MONOTONIC s, the same clock in every process) */
} shared_t;

typedef struct job {
    int port;              /* MASTER_PORT: keeps this job's segments apart from other tests' */
    int nodes;             /* ranks split into nodes of size / nodes; > 1: through a store */
    int store_port;        /* the store server's, when nodes > 1 */
    double timeout;        /* communicator timeout: far above what the checks allow */
    mgpu_pages_t pages[2]; /* one launcher's pages per node */
    int lost_node;         /* whose launcher says a node is lost; -1: every node's */
    int wait_for;          /* the launcher sets the word once this many ranks are ready */
    int delay_ms;          /* ... and this long after */
    int launcher_up;       /* the launcher's thread runs (atomic) */
    shared_t *sh;
} job_t;

static void job_init(job_t *j, int nodes, int size, double timeout)
{
    static int counter;
    mgpu_err_t err = {0, ""};

    memset(j, 0, sizeof *j);
    j->port = 20000 + (int)(getpid() % 20000) + 11 * counter++;
    j->nodes = nodes;
    j->timeout = timeout;
    j->sh = mmap(NULL, sizeof *j->sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    for (int n = 0; n < nodes; n++)
        CHECK_INT(mgpu_pages_open(&j->pages[n], size / nodes, &err), 0);
}

static void job_free(job_t *j)
{
    for (int n = 0; n < j->nodes; n++)
        mgpu_pages_close(&j->pages[n]);
}

static void setenv_int(const char *name, int v)
{
    char s[32];
    snprintf(s, sizeof s, "%d", v);
    setenv(name, s, 1);
}

/* torchrun's variables, mgpu-launch's store (several nodes) and the node's progress pages. */
static void job_env(const job_t *j, int rank, int size)
{
    int local_size = size / j->nodes, node = rank / local_size;
    char path[64];

    setenv_int("RANK", rank);
    setenv_int("LOCAL_RANK", rank % local_size);
    setenv_int("WORLD_SIZE", size);
    setenv_int("LOCAL_WORLD_SIZE", local_size);
    setenv_int("GROUP_RANK", node);
    setenv_int("GROUP_WORLD_SIZE", j->nodes);
    setenv("TORCHELASTIC_RUN_ID", "test-lostpeer", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv_int("MASTER_PORT", j->port);
    unsetenv("MGPU_STORE_ADDR");
    unsetenv("MGPU_STORE_PORT");
    unsetenv("MGPU_STORE_TOKEN");
    unsetenv("MGPU_PROGRESS");
    unsetenv("CUDA_VISIBLE_DEVICES");
    unsetenv("MGPU_SIM_GPUS");
    if (j->nodes > 1) {
        setenv("MGPU_STORE_ADDR", "127.0.0.1", 1);
        setenv_int("MGPU_STORE_PORT", j->store_port);
    }
    /* As mgpu-launch hands them out: its memfd through /proc, the slot of the local rank. */
    snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)getppid(), j->pages[node].fd);
    setenv(MGPU_PROGRESS_ENV_FILE, path, 1);
    setenv_int(MGPU_PROGRESS_ENV_SLOT, rank % local_size);
}

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

/* The launcher: once wait_for ranks are ready (and delay_ms more), a node is lost. */
static void *launcher(void *arg)
{
    job_t *j = arg;

    __atomic_store_n(&j->launcher_up, 1, __ATOMIC_SEQ_CST);
    for (int ms = 0; ms < 20000 && __atomic_load_n(&j->sh->ready, __ATOMIC_SEQ_CST) < j->wait_for;
         ms++)
        ranks_sleep_ms(1);
    ranks_sleep_ms(j->delay_ms);
    j->sh->lost_at = ranks_now();
    for (int n = 0; n < j->nodes; n++)
        if (j->lost_node < 0 || n == j->lost_node)
            mgpu_pages_set_lost(&j->pages[n], LOST_TEXT);
    __atomic_store_n(&j->sh->lost_set, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

static int job_run(job_t *j, int size, ranks_fn fn)
{
    pthread_t th;
    int bad;

    fflush(stdout);
    j->launcher_up = 0;
    pthread_create(&th, NULL, launcher, j);
    /* The ranks are forked once the thread runs: a fork while it is still being set up (the
     * sanitizer's allocator locked for its state) leaves a child that waits on that lock. */
    while (!__atomic_load_n(&j->launcher_up, __ATOMIC_SEQ_CST))
        ranks_sleep_ms(1);
    bad = ranks_run(size, fn, j, 25);
    pthread_join(th, NULL);
    return bad;
}

/* A rank's failure: the code, the collective, the launcher's text, and how soon after it. */
static void check_lost(const job_t *j, int rank, int rc, const mgpu_err_t *err, const char *what)
{
    double now = ranks_now();

    CHECK_INT(rc, MGPU_E_PEER);
    CHECK_CONTAINS(err->msg, what);
    CHECK_CONTAINS(err->msg, LOST_TEXT);
    CHECK(__atomic_load_n(&j->sh->lost_set, __ATOMIC_SEQ_CST));
    printf("  rank %d: failed %.4f s after the launcher's word: %s\n", rank, now - j->sh->lost_at,
           err->msg);
    CHECK(now - j->sh->lost_at < 1.0);
}

/* ---- the pages ------------------------------------------------------------------------ */

/* Written into every page, attached or not; bumped again by a second word; cut to the page;
 * gone after mgpu_pages_reset; a worker attaching after the word still sees it. */
static void test_pages_set_lost(void)
{
    mgpu_pages_t pg;
    mgpu_err_t err = {0, ""};
    char text[300], longer[400], path[64];
    const mgpu_progress_page_t *p;
    uint32_t seq;

    /* tests/integration/test_lostpeer.sh writes the word from Python at these offsets. */
    CHECK_INT(offsetof(mgpu_progress_page_t, lost_seq), 656);
    CHECK_INT(offsetof(mgpu_progress_page_t, lost_text), 664);
    CHECK_INT(mgpu_pages_open(&pg, 3, &err), 0);
    for (int k = 0; k < 3; k++) {
        p = (const mgpu_progress_page_t *)((char *)pg.map + (size_t)k * MGPU_PROGRESS_PAGE);
        CHECK_INT(mgpu_progress_lost_seq(p), 0);
        CHECK_INT(mgpu_progress_lost(p, text, sizeof text), 0);
        CHECK_STR(text, "");
    }
    mgpu_pages_set_lost(&pg, LOST_TEXT);
    for (int k = 0; k < 3; k++) {
        p = (const mgpu_progress_page_t *)((char *)pg.map + (size_t)k * MGPU_PROGRESS_PAGE);
        seq = mgpu_progress_lost_seq(p);
        CHECK(seq != 0 && (seq & 1) == 0);
        CHECK_INT(mgpu_progress_lost(p, text, sizeof text), 1);
        CHECK_STR(text, LOST_TEXT);
        CHECK_INT(p->magic, 0); /* the worker's part is untouched */
    }
    p = (const mgpu_progress_page_t *)pg.map;
    seq = mgpu_progress_lost_seq(p);
    memset(longer, 'x', sizeof longer - 1);
    longer[sizeof longer - 1] = '\0';
    mgpu_pages_set_lost(&pg, longer);
    CHECK(mgpu_progress_lost_seq(p) > seq && (mgpu_progress_lost_seq(p) & 1) == 0);
    CHECK_INT(mgpu_progress_lost(p, text, sizeof text), 1);
    CHECK_INT(strlen(text), 255);
    CHECK_INT(mgpu_progress_lost(p, text, 8), 1); /* a short buffer gets the start */
    CHECK_STR(text, "xxxxxxx");
    mgpu_pages_set_lost(&pg, "");
    CHECK_INT(mgpu_progress_lost(p, text, sizeof text), 1);
    CHECK_CONTAINS(text, "a peer was lost");
    /* A worker that attaches after the word keeps it: attaching writes its own part only. */
    mgpu_pages_set_lost(&pg, LOST_TEXT);
    snprintf(path, sizeof path, "/proc/self/fd/%d", pg.fd);
    setenv(MGPU_PROGRESS_ENV_FILE, path, 1);
    setenv(MGPU_PROGRESS_ENV_SLOT, "1", 1);
    setenv("RANK", "1", 1);
    setenv("WORLD_SIZE", "3", 1);
    setenv("LOCAL_RANK", "1", 1);
    setenv("LOCAL_WORLD_SIZE", "3", 1);
    unsetenv("MGPU_STORE_ADDR");
    unsetenv("MGPU_PROGRESS");
    {
        mgpu_init_opts_t o = {0, 5};
        mgpu_ctx_t *ctx = NULL;
        CHECK_INT(mgpu_init(&o, &ctx, &err), 0);
        p = (const mgpu_progress_page_t *)((char *)pg.map + MGPU_PROGRESS_PAGE);
        CHECK_INT(p->magic, MGPU_PROGRESS_MAGIC);
        CHECK_INT(mgpu_progress_lost(p, text, sizeof text), 1);
        CHECK_STR(text, LOST_TEXT);
        mgpu_finalize(ctx);
    }
    mgpu_pages_reset(&pg);
    CHECK_INT(mgpu_progress_lost_seq(p), 0);
    CHECK_INT(mgpu_progress_lost(p, text, sizeof text), 0);
    mgpu_pages_close(&pg);
}

/* A reader never gets half of one text and half of another while the launcher rewrites it. */
typedef struct flip {
    mgpu_progress_page_t *page;
    volatile int stop;
} flip_t;

static void *flipper(void *arg)
{
    flip_t *f = arg;
    char a[256], b[256];

    memset(a, 'a', 255);
    memset(b, 'b', 255);
    a[255] = b[255] = '\0';
    for (int i = 0; !f->stop; i++)
        mgpu_progress_set_lost(f->page, i & 1 ? a : b);
    return NULL;
}

static void test_lost_text_never_torn(void)
{
    mgpu_progress_page_t *page = calloc(1, sizeof *page);
    flip_t f = {page, 0};
    char text[256];
    pthread_t th;
    int torn = 0, seen = 0;

    mgpu_progress_set_lost(page, "first");
    pthread_create(&th, NULL, flipper, &f);
    for (int i = 0; i < 20000; i++) {
        CHECK_INT(mgpu_progress_lost(page, text, sizeof text), 1);
        if (strcmp(text, "first") == 0 || strstr(text, "still being written") != NULL)
            continue;
        seen++;
        for (size_t k = 1; k < 255; k++)
            torn += text[k] != text[0];
        torn += strlen(text) != 255;
    }
    f.stop = 1;
    pthread_join(th, NULL);
    if (torn)
        printf("  %d torn characters in %d texts read\n", torn, seen);
    CHECK_INT(torn, 0);
    free(page);
}

/* ---- collectives waiting when the word comes ----------------------------------------- */

/* One node of 3: rank 2 never calls (it hangs, as far as the others can tell); ranks 0 and 1
 * wait in a shared-memory all-reduce until the launcher's word, then fail with it. */
static void rank_shm_wait(int rank, int size, void *arg)
{
    job_t *j = arg;
    mgpu_ctx_t *ctx;
    mgpu_comm_t *comm = job_join(j, rank, size, &ctx);
    mgpu_err_t err = {0, ""};
    float buf[1000] = {0};
    int rc;

    if (comm == NULL)
        return;
    if (rank == 2) {
        ranks_stay_until(&j->sh->done, 2);
    } else {
        __atomic_fetch_add(&j->sh->ready, 1, __ATOMIC_SEQ_CST);
        rc = mgpu_allreduce_f32(comm, buf, 1000, MGPU_SUM, NULL, &err);
        check_lost(j, rank, rc, &err, "mgpu_allreduce_f32(count=1000, sum)");
        /* Broken for good, still saying why. */
        CHECK_INT(mgpu_barrier(comm, &err), MGPU_E_CLOSED);
        CHECK_CONTAINS(err.msg, LOST_TEXT);
        __atomic_fetch_add(&j->sh->done, 1, __ATOMIC_SEQ_CST);
    }
    mgpu_comm_destroy(comm);
    mgpu_finalize(ctx);
}

static void test_shm_wait_ends_on_lost(void)
{
    job_t j;
    job_init(&j, 1, 3, 30);
    j.wait_for = 2;
    j.delay_ms = 300; /* they wait by then */
    CHECK_INT(job_run(&j, 3, rank_shm_wait), 0);
    job_free(&j);
}

/* Two nodes of 2: node 1 (ranks 2, 3) hangs without closing anything. Node 0's leader waits
 * on the TCP ring, rank 1 in shared memory for its leader; node 0's launcher says node 1 is
 * lost, and both fail with its text within the second, not at the 30 s deadline. */
static void rank_tcp_wait(int rank, int size, void *arg)
{
    job_t *j = arg;
    mgpu_ctx_t *ctx;
    mgpu_comm_t *comm = job_join(j, rank, size, &ctx);
    mgpu_err_t err = {0, ""};
    float buf[1000] = {0};
    int rc;

    if (comm == NULL)
        return;
    if (rank >= 2) {
        ranks_stay_until(&j->sh->done, 2);
    } else {
        __atomic_fetch_add(&j->sh->ready, 1, __ATOMIC_SEQ_CST);
        rc = mgpu_allreduce_f32(comm, buf, 1000, MGPU_SUM, NULL, &err);
        check_lost(j, rank, rc, &err, "mgpu_allreduce_f32(count=1000, sum) across 2 nodes");
        if (rank == 0) /* the leader's own wait on the ring, not a peer's word */
            CHECK_CONTAINS(err.msg, "across 2 nodes, rank 0: " LOST_TEXT);
        __atomic_fetch_add(&j->sh->done, 1, __ATOMIC_SEQ_CST);
    }
    mgpu_comm_destroy(comm);
    mgpu_finalize(ctx);
}

static void test_tcp_wait_ends_on_lost(void)
{
    job_t j;
    pid_t st;
    job_init(&j, 2, 4, 30);
    j.wait_for = 2;
    j.delay_ms = 300;
    st = store_start(&j.store_port);
    CHECK_INT(job_run(&j, 4, rank_tcp_wait), 0);
    store_stop(st);
    job_free(&j);
}

/* ---- collectives started after the word ---------------------------------------------- */

/* Every rank has its communicator, then the word comes: each collective called after it fails
 * at once, though every peer is there and would answer. */
static void rank_after(int rank, int size, void *arg)
{
    job_t *j = arg;
    mgpu_ctx_t *ctx;
    mgpu_comm_t *comm = job_join(j, rank, size, &ctx);
    mgpu_err_t err = {0, ""};
    double t0;
    int rc;

    if (comm == NULL)
        return;
    __atomic_fetch_add(&j->sh->ready, 1, __ATOMIC_SEQ_CST);
    for (int ms = 0; ms < 20000 && !__atomic_load_n(&j->sh->lost_set, __ATOMIC_SEQ_CST); ms++)
        ranks_sleep_ms(1);
    t0 = ranks_now();
    rc = mgpu_barrier(comm, &err);
    CHECK(ranks_now() - t0 < 1.0);
    check_lost(j, rank, rc, &err, "mgpu_barrier(");
    mgpu_comm_destroy(comm);
    mgpu_finalize(ctx);
}

static void test_shm_started_after_lost(void)
{
    job_t j;
    job_init(&j, 1, 2, 30);
    j.wait_for = 2;
    CHECK_INT(job_run(&j, 2, rank_after), 0);
    job_free(&j);
}

/* Two nodes of one rank each (the ring alone), both launchers saying it. */
static void test_tcp_started_after_lost(void)
{
    job_t j;
    pid_t st;
    job_init(&j, 2, 2, 30);
    j.wait_for = 2;
    j.lost_node = -1;
    st = store_start(&j.store_port);
    CHECK_INT(job_run(&j, 2, rank_after), 0);
    store_stop(st);
    job_free(&j);
}

int main(void)
{
    RUN(test_pages_set_lost);
    RUN(test_lost_text_never_torn);
    RUN(test_shm_wait_ends_on_lost);
    RUN(test_tcp_wait_ends_on_lost);
    RUN(test_shm_started_after_lost);
    RUN(test_tcp_started_after_lost);
    return check_done();
}
