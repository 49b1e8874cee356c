/* test_shm.c - the shared-memory collectives (worker/runtime/shm.c) with 2, 3 and 4 forked ranks:
 * exact results for odd sizes and repeated calls, every root, timeouts naming the ranks that
 * never arrived, killed peers, mismatched calls, and the segment's name never outliving the
 * start of the job. */
#include "check.h"

#include <errno.h>    /* errno */
#include <fcntl.h>    /* O_CREAT */
#include <math.h>     /* fabsf */
#include <pthread.h>  /* pthread_create */
#include <stdint.h>   /* intptr_t */
#include <signal.h>   /* raise */
#include <stdlib.h>   /* malloc */
#include <sys/mman.h> /* mmap, shm_open */
#include <unistd.h>   /* access */

#include "ranks.h"
#include "shm.h"

typedef struct targ {
    char name[64];
    size_t chunk;
    double timeout_s;
    int param;
    volatile int *shared; /* MAP_SHARED scratch visible to all ranks */
} targ_t;

static void targ_init(targ_t *a, size_t chunk, double timeout_s)
{
    static int counter;
    memset(a, 0, sizeof *a);
    snprintf(a->name, sizeof a->name, "/mgpu-test-%d-%d", (int)getpid(), counter++);
    a->chunk = chunk;
    a->timeout_s = timeout_s;
    a->shared = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
}

static mgpu_shm_t *open_rank(const targ_t *a, int rank, int size)
{
    mgpu_shm_opts_t o = {a->name, rank, size, a->timeout_s, a->chunk, -1, NULL};
    mgpu_shm_t *s = NULL;
    mgpu_err_t err = {0, ""};
    int rc = mgpu_shm_open(&o, &s, &err);
    if (rc != 0)
        printf("  rank %d: mgpu_shm_open: %d %s\n", rank, rc, err.msg);
    CHECK_INT(rc, 0);
    return rc == 0 ? s : NULL;
}

/* Integers small enough that every partial sum is exact in float. */
static float value(int rank, size_t i)
{
    return (float)((long)((i * 7 + (size_t)rank * 13) % 1000) - 500);
}

/* Sizes around the small/large switch (8192 floats = 32 KiB), the part alignment, and the
 * round length (chunk 64 KiB = 16384 floats), plus odd ones not divisible by 2, 3 or 4. */
static const size_t sizes[] = {0,    1,    2,     3,     5,     7,     15,    16,    17,
                               63,   64,   65,    1000,  1023,  4097,  8191,  8192,  8193,
                               8208, 9999, 16383, 16384, 16385, 40000, 49153, 100003};

static void rank_allreduce(int rank, int size, void *arg)
{
    const targ_t *a = arg;
    mgpu_shm_t *s = open_rank(a, rank, size);
    size_t maxn = 100003;
    float *buf = malloc(maxn * sizeof *buf);
    mgpu_err_t err = {0, ""};

    if (s == NULL)
        return;
    for (int avg = 0; avg <= 1; avg++) {
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            size_t n = sizes[k];
            int bad = 0;
            for (size_t i = 0; i < n; i++)
                buf[i] = value(rank, i);
            int rc = mgpu_shm_allreduce_f32(s, buf, n, avg, &err);
            CHECK_INT(rc, 0);
            if (rc != 0) {
                printf("  %s\n", err.msg);
                break;
            }
            for (size_t i = 0; i < n; i++) {
                float want = 0;
                for (int q = 0; q < size; q++)
                    want += value(q, i);
                if (avg)
                    want /= (float)size;
                if (buf[i] != want && bad++ < 3)
                    printf("  rank %d n=%zu avg=%d: [%zu] = %g, expected %g\n", rank, n, avg, i,
                           (double)buf[i], (double)want);
            }
            CHECK_INT(bad, 0);
        }
    }
    free(buf);
    mgpu_shm_close(s);
}

static void allreduce_n(int size)
{
    targ_t a;
    targ_init(&a, 64 << 10, 20);
    CHECK_INT(ranks_run(size, rank_allreduce, &a, 60), 0);
}

static void test_allreduce_2(void)
{
    allreduce_n(2);
}

static void test_allreduce_3(void)
{
    allreduce_n(3);
}

static void test_allreduce_4(void)
{
    allreduce_n(4);
}

/* Large messages in many rounds of the default slot size, with a last round of any length. */
static void rank_allreduce_rounds(int rank, int size, void *arg)
{
    const targ_t *a = arg;
    mgpu_shm_t *s = open_rank(a, rank, size);
    static const size_t big[] = {524288, 600001, 3000017};
    float *buf = malloc(3000017 * sizeof *buf);
    mgpu_err_t err = {0, ""};

    if (s == NULL)
        return;
    for (size_t k = 0; k < sizeof big / sizeof big[0]; k++) {
        size_t n = big[k], bad = 0;
        for (size_t i = 0; i < n; i++)
            buf[i] = value(rank, i);
        CHECK_INT(mgpu_shm_allreduce_f32(s, buf, n, k == 1, &err), 0);
        for (size_t i = 0; i < n; i++) {
            float want = 0;
            for (int q = 0; q < size; q++)
                want += value(q, i);
            if (k == 1)
                want /= (float)size;
            bad += buf[i] != want;
        }
        if (bad)
            printf("  rank %d n=%zu: %zu wrong\n", rank, n, bad);
        CHECK_INT(bad, 0);
    }
    free(buf);
    mgpu_shm_close(s);
}

static void test_allreduce_large_rounds(void)
{
    targ_t a;
    targ_init(&a, 0, 20); /* default slot */
    CHECK_INT(ranks_run(3, rank_allreduce_rounds, &a, 60), 0);
}

/* Non-integers: the sum order is fixed (rank 0 first), so every rank gets the same bits. */
static void rank_allreduce_bits(int rank, int size, void *arg)
{
    const targ_t *a = arg;
    mgpu_shm_t *s = open_rank(a, rank, size);
    size_t n = 50001;
    float *buf = malloc(n * sizeof *buf);
    float *all = (float *)(a->shared + 16);
    mgpu_err_t err = {0, ""};

    if (s == NULL)
        return;
    for (size_t i = 0; i < n; i++)
        buf[i] = 1.0f / (float)(i + 1 + (size_t)rank) + (float)rank * 1e-3f;
    CHECK_INT(mgpu_shm_allreduce_f32(s, buf, n, 1, &err), 0);
    /* Publish a few elements; rank 0 compares after the barrier. */
    for (int k = 0; k < 8; k++)
        all[rank * 8 + k] = buf[(size_t)k * 6151];
    CHECK_INT(mgpu_shm_barrier(s, &err), 0);
    for (int k = 0; k < 8; k++) {
        float want = 0;
        for (int q = 0; q < size; q++)
            want += 1.0f / (float)((size_t)k * 6151 + 1 + (size_t)q) + (float)q * 1e-3f;
        want /= (float)size;
        CHECK(memcmp(&all[rank * 8 + k], &all[k], sizeof(float)) == 0);
        CHECK(fabsf(all[k] - want) <= 1e-6f * fabsf(want));
    }
    free(buf);
    mgpu_shm_close(s);
}

static void test_allreduce_identical_bits(void)
{
    targ_t a;
    targ_init(&a, 64 << 10, 20);
    CHECK_INT(ranks_run(3, rank_allreduce_bits, &a, 60), 0);
}

static void rank_broadcast(int rank, int size, void *arg)
{
    const targ_t *a = arg;
    mgpu_shm_t *s = open_rank(a, rank, size);
    static const size_t bsizes[] = {0, 1, 3, 4095, 4096, 4097, 12289, 70001};
    unsigned char *buf = malloc(70001);
    mgpu_err_t err = {0, ""};

    if (s == NULL)
        return;
    for (int root = 0; root < size; root++) {
        for (size_t k = 0; k < sizeof bsizes / sizeof bsizes[0]; k++) {
            size_t n = bsizes[k];
            int bad = 0;
            for (size_t i = 0; i < n; i++)
                buf[i] = rank == root ? (unsigned char)(i * 31 + (size_t)root) : 0xee;
            CHECK_INT(mgpu_shm_broadcast(s, buf, n, root, &err), 0);
            for (size_t i = 0; i < n; i++)
                bad += buf[i] != (unsigned char)(i * 31 + (size_t)root);
            if (bad)
                printf("  rank %d root %d n=%zu: %d wrong bytes\n", rank, root, n, bad);
            CHECK_INT(bad, 0);
        }
    }
    free(buf);
    mgpu_shm_close(s);
}

static void test_broadcast_every_root(void)
{
    targ_t a;
    targ_init(&a, 4096, 20);
    CHECK_INT(ranks_run(3, rank_broadcast, &a, 60), 0);
    targ_init(&a, 4096, 20);
    CHECK_INT(ranks_run(4, rank_broadcast, &a, 60), 0);
}

static void rank_allgather(int rank, int size, void *arg)
{
    const targ_t *a = arg;
    mgpu_shm_t *s = open_rank(a, rank, size);
    static const size_t gsizes[] = {0, 1, 5, 4096, 4099, 20000};
    unsigned char *send = malloc(20000), *recv = malloc(20000 * (size_t)size);
    mgpu_err_t err = {0, ""};

    if (s == NULL)
        return;
    for (int inplace = 0; inplace <= 1; inplace++) {
        for (size_t k = 0; k < sizeof gsizes / sizeof gsizes[0]; k++) {
            size_t n = gsizes[k];
            unsigned char *src = inplace ? recv + (size_t)rank * n : send;
            int bad = 0;
            memset(recv, 0xee, n * (size_t)size);
            for (size_t i = 0; i < n; i++)
                src[i] = (unsigned char)(i * 7 + (size_t)rank * 101);
            CHECK_INT(mgpu_shm_allgather(s, src, recv, n, &err), 0);
            for (int q = 0; q < size; q++)
                for (size_t i = 0; i < n; i++)
                    bad += recv[(size_t)q * n + i] != (unsigned char)(i * 7 + (size_t)q * 101);
            if (bad)
                printf("  rank %d n=%zu inplace=%d: %d wrong bytes\n", rank, n, inplace, bad);
            CHECK_INT(bad, 0);
        }
    }
    free(send);
    free(recv);
    mgpu_shm_close(s);
}

static void test_allgather(void)
{
    targ_t a;
    targ_init(&a, 4096, 20);
    CHECK_INT(ranks_run(2, rank_allgather, &a, 60), 0);
    targ_init(&a, 4096, 20);
    CHECK_INT(ranks_run(3, rank_allgather, &a, 60), 0);
}

/* Everyone counts itself in before the barrier (late ranks later); nobody may leave it
 * before the count is complete. */
static void rank_barrier(int rank, int size, void *arg)
{
    const targ_t *a = arg;
    mgpu_shm_t *s = open_rank(a, rank, size);
    mgpu_err_t err = {0, ""};

    if (s == NULL)
        return;
    for (int round = 1; round <= 5; round++) {
        ranks_sleep_ms(((rank + round) % size) * 15);
        __atomic_fetch_add(&a->shared[0], 1, __ATOMIC_SEQ_CST);
        CHECK_INT(mgpu_shm_barrier(s, &err), 0);
        CHECK_INT(__atomic_load_n(&a->shared[0], __ATOMIC_SEQ_CST) >= round * size, 1);
        CHECK_INT(mgpu_shm_barrier(s, &err), 0); /* nobody counts round+1 before we checked */
    }
    /* The name is gone once everyone attached: a crash from here on leaks nothing. */
    char path[128];
    snprintf(path, sizeof path, "/dev/shm%s", a->name);
    CHECK(access(path, F_OK) != 0 && errno == ENOENT);
    mgpu_shm_close(s);
}

static void test_barrier_and_unlinked(void)
{
    targ_t a;
    targ_init(&a, 4096, 20);
    CHECK_INT(ranks_run(4, rank_barrier, &a, 60), 0);
}

/* Rank size-1 never comes: the others time out naming it, quickly. */
static void rank_absent(int rank, int size, void *arg)
{
    const targ_t *a = arg;
    mgpu_shm_t *s = open_rank(a, rank, size);
    mgpu_err_t err = {0, ""};
    float buf[100] = {0};
    double t0 = ranks_now();
    int rc;

    if (s == NULL)
        return;
    if (rank == size - 1) {
        ranks_stay_until(&a->shared[0], size - 1); /* alive, just not calling */
        mgpu_shm_close(s);
        return;
    }
    rc = mgpu_shm_allreduce_f32(s, buf, 100, 0, &err);
    CHECK_INT(rc, MGPU_E_TIMEOUT);
    CHECK_INT(err.code, MGPU_E_TIMEOUT);
    CHECK_CONTAINS(err.msg, "mgpu_allreduce_f32(count=100, sum)");
    CHECK_CONTAINS(err.msg, "never arrived: 2");
    CHECK(ranks_now() - t0 < RANKS_FAST_S);
    /* Broken for good: the next call says so at once. */
    rc = mgpu_shm_barrier(s, &err);
    CHECK_INT(rc, MGPU_E_CLOSED);
    CHECK_CONTAINS(err.msg, "never arrived");
    __atomic_fetch_add(&a->shared[0], 1, __ATOMIC_SEQ_CST);
    mgpu_shm_close(s);
}

static void test_timeout_names_absent_rank(void)
{
    targ_t a;
    targ_init(&a, 4096, 0.5);
    CHECK_INT(ranks_run(3, rank_absent, &a, 30), 0);
}

/* Kills this whole process after ms, from another thread, while the main thread is blocked
 * inside a collective: a crash in the middle of an operation. */
static void *killer(void *arg)
{
    ranks_sleep_ms((int)(intptr_t)arg);
    raise(SIGKILL);
    return NULL;
}

/* Rank 2 is killed inside a large all-reduce it joined alone (param 0), or before calling it
 * while the others already wait (param 1); the others must fail at once naming it, not after
 * the 30 s timeout. */
static void rank_killed(int rank, int size, void *arg)
{
    const targ_t *a = arg;
    mgpu_shm_t *s = open_rank(a, rank, size);
    size_t n = 1 << 18;
    float *buf = calloc(n, sizeof *buf);
    mgpu_err_t err = {0, ""};
    pthread_t th;
    double t0;
    int rc;

    if (s == NULL)
        return;
    CHECK_INT(mgpu_shm_barrier(s, &err), 0);
    if (rank == 2 && a->param == 1) {
        ranks_sleep_ms(300);
        raise(SIGKILL); /* before it calls */
    }
    if (rank == 2) {
        pthread_create(&th, NULL, killer, (void *)(intptr_t)300);
        mgpu_shm_allreduce_f32(s, buf, n, 0, &err); /* killed in here */
        printf("  rank 2 returned from allreduce: %s\n", err.msg);
        CHECK(0);
        return;
    }
    if (a->param == 0)
        ranks_sleep_ms(1500); /* rank 2 is dead by now */
    t0 = ranks_now();
    rc = mgpu_shm_allreduce_f32(s, buf, n, 0, &err);
    CHECK_INT(rc, MGPU_E_PEER);
    CHECK_CONTAINS(err.msg, "rank 2 (pid ");
    CHECK_CONTAINS(err.msg, a->param == 0 ? "died during the operation" : "died before joining");
    CHECK_CONTAINS(err.msg, "mgpu_allreduce_f32(count=262144, sum)");
    CHECK(ranks_now() - t0 < RANKS_FAST_S);
    free(buf);
    mgpu_shm_close(s);
}

static void test_peer_killed_fails_fast(void)
{
    for (int p = 0; p <= 1; p++) {
        targ_t a;
        ranks_result_t res;
        targ_init(&a, 64 << 10, 30);
        a.param = p;
        ranks_run_kill(p == 0 ? 4 : 3, rank_killed, &a, 25, -1, 0, &res);
        CHECK(WIFSIGNALED(res.status[2]) && WTERMSIG(res.status[2]) == SIGKILL);
        for (int r = 0; r < (p == 0 ? 4 : 3); r++)
            if (r != 2)
                CHECK(WIFEXITED(res.status[r]) && WEXITSTATUS(res.status[r]) == 0);
    }
}

/* A rank that dies before it ever calls: named as dead before joining. */
static void rank_dies_early(int rank, int size, void *arg)
{
    const targ_t *a = arg;
    mgpu_shm_t *s = open_rank(a, rank, size);
    mgpu_err_t err = {0, ""};

    if (s == NULL)
        return;
    if (rank == 1)
        raise(SIGKILL);
    CHECK_INT(mgpu_shm_barrier(s, &err), MGPU_E_PEER);
    CHECK_CONTAINS(err.msg, "mgpu_barrier() #1 on rank");
    CHECK_CONTAINS(err.msg, "rank 1 (pid");
    CHECK_CONTAINS(err.msg, "died before joining it");
    mgpu_shm_close(s);
}

static void test_peer_dead_before_joining(void)
{
    targ_t a;
    ranks_result_t res;
    targ_init(&a, 4096, 30);
    ranks_run_kill(3, rank_dies_early, &a, 20, -1, 0, &res);
    CHECK(WIFEXITED(res.status[0]) && WEXITSTATUS(res.status[0]) == 0);
    CHECK(WIFEXITED(res.status[2]) && WEXITSTATUS(res.status[2]) == 0);
}

/* A rank that destroys its communicator while the others wait in a collective. */
static void rank_leaves(int rank, int size, void *arg)
{
    const targ_t *a = arg;
    mgpu_shm_t *s = open_rank(a, rank, size);
    mgpu_err_t err = {0, ""};

    if (s == NULL)
        return;
    if (rank == 0) {
        ranks_sleep_ms(100);
        mgpu_shm_close(s);
        ranks_sleep_ms(1000); /* alive: only the state tells the others */
        return;
    }
    CHECK_INT(mgpu_shm_barrier(s, &err), MGPU_E_PEER);
    CHECK_CONTAINS(err.msg, "rank 0 closed the communicator");
    mgpu_shm_close(s);
}

static void test_peer_left(void)
{
    targ_t a;
    targ_init(&a, 4096, 30);
    CHECK_INT(ranks_run(2, rank_leaves, &a, 20), 0);
}

/* Ranks calling different collectives fail with a message, not with garbage. */
static void rank_mismatch(int rank, int size, void *arg)
{
    const targ_t *a = arg;
    mgpu_shm_t *s = open_rank(a, rank, size);
    mgpu_err_t err = {0, ""};
    float buf[64] = {0};
    int rc;

    if (s == NULL)
        return;
    if (a->param == 0)
        rc = rank == 1 ? mgpu_shm_broadcast(s, buf, sizeof buf, 0, &err)
                       : mgpu_shm_allreduce_f32(s, buf, 64, 0, &err);
    else
        rc = mgpu_shm_allreduce_f32(s, buf, rank == 1 ? 63 : 64, 0, &err);
    /* Each rank either sees the mismatch itself or sees a peer fail because of it. */
    CHECK(rc == MGPU_E_PROTOCOL || rc == MGPU_E_PEER);
    if (rc == MGPU_E_PROTOCOL)
        CHECK_CONTAINS(err.msg, "ranks must call the same collectives");
    a->shared[rank] = rc;
    mgpu_shm_close(s);
}

static void test_mismatched_calls(void)
{
    for (int p = 0; p <= 1; p++) {
        targ_t a;
        targ_init(&a, 4096, 5);
        a.param = p;
        CHECK_INT(ranks_run(3, rank_mismatch, &a, 20), 0);
        CHECK(a.shared[0] == MGPU_E_PROTOCOL || a.shared[1] == MGPU_E_PROTOCOL);
    }
}

/* A segment left by a crashed job under the same name (its creator is gone) is replaced. */
static void rank_plain(int rank, int size, void *arg)
{
    const targ_t *a = arg;
    mgpu_shm_t *s = open_rank(a, rank, size);
    float x = 1;
    mgpu_err_t err = {0, ""};

    if (s == NULL)
        return;
    CHECK_INT(mgpu_shm_allreduce_f32(s, &x, 1, 0, &err), 0);
    CHECK(x == (float)size);
    mgpu_shm_close(s);
}

static void test_stale_segment_replaced(void)
{
    targ_t a;
    int fd;
    targ_init(&a, 4096, 10);
    fd = shm_open(a.name, O_RDWR | O_CREAT | O_EXCL, 0600);
    CHECK(fd >= 0);
    CHECK_INT(ftruncate(fd, 1 << 16), 0); /* zeros: no live creator */
    close(fd);
    CHECK_INT(ranks_run(3, rank_plain, &a, 20), 0);
    CHECK(shm_unlink(a.name) != 0);
}

/* Rank 0 never comes: the others give up at the deadline, saying what they waited for. */
static void rank_no_creator(int rank, int size, void *arg)
{
    const targ_t *a = arg;
    mgpu_shm_opts_t o = {a->name, rank, size, a->timeout_s, a->chunk, -1, NULL};
    mgpu_shm_t *s = NULL;
    mgpu_err_t err = {0, ""};

    if (rank == 0)
        return;
    CHECK_INT(mgpu_shm_open(&o, &s, &err), MGPU_E_TIMEOUT);
    CHECK_CONTAINS(err.msg, "did not appear");
}

static void test_attach_timeout(void)
{
    targ_t a;
    targ_init(&a, 4096, 0.3);
    CHECK_INT(ranks_run(2, rank_no_creator, &a, 20), 0);
}

int main(void)
{
    RUN(test_allreduce_2);
    RUN(test_allreduce_3);
    RUN(test_allreduce_4);
    RUN(test_allreduce_large_rounds);
    RUN(test_allreduce_identical_bits);
    RUN(test_broadcast_every_root);
    RUN(test_allgather);
    RUN(test_barrier_and_unlinked);
    RUN(test_timeout_names_absent_rank);
    RUN(test_peer_killed_fails_fast);
    RUN(test_peer_dead_before_joining);
    RUN(test_peer_left);
    RUN(test_mismatched_calls);
    RUN(test_stale_segment_replaced);
    RUN(test_attach_timeout);
    return check_done();
}
