/* shm.c - collectives between the ranks of one host in a POSIX shared-memory segment.
 *
 * Progress protocol. Every rank owns one 64-bit phase counter (its own cache line) and all
 * ranks go through the same sequence of phases, because collectives are called in the same
 * order everywhere and every round of every collective makes every rank publish the same
 * number of times. "Rank q finished phase p" is then just seq[q] >= p. A rank writes its data
 * into the segment, then publishes (a seq_cst store, so a release); a reader loads seq with
 * acquire before it reads the data behind it.
 *
 * Buffer reuse. Data slots come in two sets used by alternate rounds. A set may be rewritten
 * once every rank has finished reading it; after reading, the next thing a rank does is
 * publish, so "all seq >= (phase after that round) + 1" (free_at[set]) proves the set free.
 * The check at the start of a round almost never waits: it only holds back a rank that runs
 * two rounds ahead of the slowest.
 *
 * Sleeping. A waiter spins for a few microseconds (when there is a core per rank), yields,
 * then sleeps on one shared futex word, gen, that every publish increments. The waiter
 * registers in sleepers before it reads gen and rechecks its condition; the publisher stores
 * seq, increments gen, then reads sleepers (all seq_cst). Either the publisher sees the
 * sleeper and wakes it, or the waiter's read of gen comes after the increment and its recheck
 * sees the new seq; if gen moved between the read and FUTEX_WAIT, the kernel returns EAGAIN.
 * So a wake-up is never lost, and a publish costs no system call when nobody sleeps. */
#include "shm.h"

#include "shm_head.h" /* mgpu_shm_head_t: the head mgpu-launch reads too */

#include <errno.h>       /* errno */
#include <fcntl.h>       /* O_* */
#include <limits.h>      /* INT_MAX */
#include <linux/futex.h> /* FUTEX_WAIT, FUTEX_WAKE */
#include <poll.h>        /* poll */
#include <sched.h>       /* sched_yield, sched_getaffinity */
#include <signal.h>      /* kill */
#include <stdarg.h>      /* va_list */
#include <stdatomic.h>   /* atomics on the shared lines */
#include <stdint.h>      /* uint64_t */
#include <stdio.h>       /* snprintf */
#include <stdlib.h>      /* calloc, getenv */
#include <string.h>      /* memcpy */
#include <sys/mman.h>    /* shm_open, mmap */
#include <sys/stat.h>    /* fstat */
#include <sys/syscall.h> /* SYS_futex, SYS_pidfd_open */
#include <time.h>        /* clock_gettime, nanosleep */
#include <unistd.h>      /* close, ftruncate, getpid */

#define SHM_LINE 128 /* two cache lines: adjacent-line prefetch would couple neighbours */
#define SHM_DESC_RING 8
#define SHM_SLICE_NS 5000000L       /* a sleeper wakes this often to check deadline and peers */
#define SHM_PEER_CHECK_S 0.002      /* pidfds are polled at most this often while waiting */
#define SHM_SMALL_BYTES (32u << 10) /* up to this, every rank reduces the whole round */

enum { RS_EMPTY = 0, RS_ATTACHED = 1, RS_LEFT = 2, RS_FAILED = 3 };
enum { OP_ALLREDUCE = 1, OP_BROADCAST, OP_ALLGATHER, OP_BARRIER };
static const char *const op_names[] = {"?", "mgpu_allreduce_f32", "mgpu_broadcast",
                                       "mgpu_allgather", "mgpu_barrier"};

/* What a rank is doing as its op-th collective: checked by peers so that ranks calling
 * different collectives fail with a message instead of corrupting each other's data. */
struct shm_desc {
    uint64_t op;
    uint32_t kind;
    int32_t root;
    uint64_t n;
};

struct shm_hdr {
    mgpu_shm_head_t head;     /* what mgpu-launch reads too (shm_head.h) */
    _Atomic uint32_t ready;   /* set last by rank 0: the fields above are valid */
    _Atomic int32_t attached; /* ranks that have attached; the last one unlinks the name */
    _Alignas(SHM_LINE) _Atomic uint32_t gen; /* the futex word, see the top of the file */
    _Atomic uint32_t sleepers;
};

struct shm_rank {
    _Alignas(SHM_LINE) _Atomic uint64_t seq; /* the last phase this rank finished */
    _Atomic int32_t pid;
    _Atomic int32_t cpu;    /* where it last published: a hint for waiters, see shm_wait */
    _Atomic uint32_t state; /* RS_*; FAILED is stored after reason (release) */
    int32_t fail_code;      /* with reason: the code this rank failed with */
    struct shm_desc desc[SHM_DESC_RING];
    char reason[256];
};

struct mgpu_shm {
    struct shm_hdr *hdr;
    struct shm_rank *ranks;
    char *data;
    size_t map_len, chunk;
    int rank, size;
    uint64_t phase;      /* the last phase this rank published */
    uint64_t round;      /* rounds done: selects the data set */
    uint64_t free_at[2]; /* all seq >= free_at[set]: nobody reads that set any more */
    uint64_t ops;        /* collectives started */
    double timeout_s;
    const mgpu_progress_page_t *lost; /* the launcher's word that a peer is lost, or NULL */
    double spin_s;
    int yields;
    int *pidfd; /* per rank, -1 where pidfd_open was not possible */
    int broken; /* the code of the failure that broke the communicator, 0 while sound */
    char broken_msg[512];
    char name[64];
    /* The collective in progress, for messages and deadlines. */
    int kind;
    char what[320];
    uint64_t op_base; /* the phase before it started */
    double deadline, last_peer_check;
    int desc_checked;
    char context[160]; /* the public collective this one is a step of, or "" */
};

static double shm_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void shm_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void shm_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Process-shared futex (not _PRIVATE): the word lives in a mapping shared by processes. */
static void shm_futex_wait(_Atomic uint32_t *addr, uint32_t val, long ns)
{
    struct timespec ts = {0, ns};
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT, val, &ts, NULL, 0);
}

static void shm_futex_wake(_Atomic uint32_t *addr)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static uint64_t shm_fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) {
        h ^= c[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

void mgpu_shm_name(char *buf, size_t len, const char *run_id, int attempt, const char *token,
                   int comm_index)
{
    uint64_t h = 0xcbf29ce484222325ull;
    unsigned uid = (unsigned)getuid();

    /* Fields are hashed with their terminating NUL so ("ab","c") and ("a","bc") differ. */
    h = shm_fnv(h, &uid, sizeof uid);
    h = shm_fnv(h, run_id ? run_id : "", strlen(run_id ? run_id : "") + 1);
    h = shm_fnv(h, &attempt, sizeof attempt);
    h = shm_fnv(h, token ? token : "", strlen(token ? token : "") + 1);
    h = shm_fnv(h, &comm_index, sizeof comm_index);
    snprintf(buf, len, "/mgpu-%u-%016llx", uid, (unsigned long long)h);
}

static struct shm_rank *shm_me(mgpu_shm_t *s)
{
    return &s->ranks[s->rank];
}

static char *shm_slot(mgpu_shm_t *s, int set, int q)
{
    return s->data + ((size_t)set * (size_t)s->size + (size_t)q) * s->chunk;
}

static void shm_publish(mgpu_shm_t *s)
{
    s->phase++;
    atomic_store_explicit(&shm_me(s)->cpu, sched_getcpu(), memory_order_relaxed);
    atomic_store_explicit(&shm_me(s)->seq, s->phase, memory_order_seq_cst);
    atomic_fetch_add_explicit(&s->hdr->gen, 1, memory_order_seq_cst);
    if (atomic_load_explicit(&s->hdr->sleepers, memory_order_seq_cst) != 0)
        shm_futex_wake(&s->hdr->gen);
}

/* Wakes sleepers without publishing progress (a state change they must notice). */
static void shm_poke(mgpu_shm_t *s)
{
    atomic_fetch_add_explicit(&s->hdr->gen, 1, memory_order_seq_cst);
    shm_futex_wake(&s->hdr->gen);
}

static int shm_reached(mgpu_shm_t *s, int q, uint64_t target)
{
    return atomic_load_explicit(&s->ranks[q].seq, memory_order_acquire) >= target;
}

/* The first rank (from *from on) that has not reached target, or -1. who: a rank, or -1 for
 * all. */
static int shm_pending(mgpu_shm_t *s, uint64_t target, int who, int *from)
{
    if (who >= 0)
        return shm_reached(s, who, target) ? -1 : who;
    for (int q = *from; q < s->size; q++) {
        if (q != s->rank && !shm_reached(s, q, target)) {
            *from = q;
            return q;
        }
    }
    return -1;
}

static int shm_dead(mgpu_shm_t *s, int q)
{
    int pid = atomic_load_explicit(&s->ranks[q].pid, memory_order_relaxed);

    if (s->pidfd[q] >= 0) {
        /* A pidfd turns readable when the process exits, zombie or not: kill(pid, 0) would
         * still succeed on a zombie its parent has not reaped yet. */
        struct pollfd p = {s->pidfd[q], POLLIN, 0};
        return poll(&p, 1, 0) > 0;
    }
    return pid > 0 && kill(pid, 0) < 0 && errno == ESRCH;
}

/* Called while waiting: a failed, departed or dead peer, or the deadline. */
static int shm_check(mgpu_shm_t *s, uint64_t target, int who, int full, mgpu_err_t *err)
{
    double now;

    /* What peers said first: a peer that failed (and maybe exited since) left its reason,
     * which names the root cause when that was another peer's death. */
    for (int q = 0; q < s->size; q++) {
        uint32_t st;
        if (q == s->rank || (who >= 0 && q != who) || shm_reached(s, q, target))
            continue;
        st = atomic_load_explicit(&s->ranks[q].state, memory_order_acquire);
        /* A peer that timed out means this collective timed out: keep that code, so a
         * caller can tell a slow job from a crashed one whichever rank noticed first. */
        if (st == RS_FAILED)
            return mgpu_err_set(
                err, s->ranks[q].fail_code == MGPU_E_TIMEOUT ? MGPU_E_TIMEOUT : MGPU_E_PEER,
                "%s: rank %d failed: %.400s", s->what, q, s->ranks[q].reason);
        if (st == RS_LEFT)
            return mgpu_err_set(err, MGPU_E_PEER,
                                "%s: rank %d closed the communicator without joining this "
                                "operation",
                                s->what, q);
    }
    /* Then deaths: a process gone without saying why. */
    for (int q = 0; full && q < s->size; q++) {
        if (q == s->rank || (who >= 0 && q != who) || shm_reached(s, q, target))
            continue;
        if (shm_dead(s, q))
            return mgpu_err_set(err, MGPU_E_PEER, "%s: rank %d (pid %d) died %s", s->what, q,
                                (int)atomic_load(&s->ranks[q].pid),
                                atomic_load(&s->ranks[q].seq) > s->op_base ? "during the operation"
                                                                           : "before joining it");
    }
    now = shm_now();
    if (now >= s->deadline) {
        char never[256], stalled[256];
        size_t a = 0, b = 0;
        never[0] = stalled[0] = '\0';
        for (int q = 0; q < s->size; q++) {
            uint64_t seq;
            if (q == s->rank || (who >= 0 && q != who) || shm_reached(s, q, target))
                continue;
            seq = atomic_load(&s->ranks[q].seq);
            if (seq <= s->op_base && a < sizeof never)
                a += (size_t)snprintf(never + a, sizeof never - a, "%s%d", a ? ", " : "", q);
            else if (seq > s->op_base && b < sizeof stalled)
                b += (size_t)snprintf(stalled + b, sizeof stalled - b, "%s%d", b ? ", " : "", q);
        }
        return mgpu_err_set(err, MGPU_E_TIMEOUT,
                            "%s: timed out after %.1f s; ranks that never arrived: %s%s%s", s->what,
                            s->timeout_s, a ? never : "none",
                            b ? "; ranks that joined but stalled: " : "", b ? stalled : "");
    }
    return 0;
}

/* The launcher says a node is lost (its lost_seq is not 0): the collective fails with its
 * text, which names the ranks, instead of waiting for its deadline. */
static int shm_lost(mgpu_shm_t *s, mgpu_err_t *err)
{
    char text[sizeof s->lost->lost_text];

    mgpu_progress_lost(s->lost, text, sizeof text);
    return mgpu_err_set(err, MGPU_E_PEER, "%s: %s", s->what, text);
}

/* Breaks the communicator: peers waiting for this rank fail at once with its reason. */
static int shm_fail(mgpu_shm_t *s, int rc, mgpu_err_t *err)
{
    s->broken = rc;
    snprintf(s->broken_msg, sizeof s->broken_msg, "%.*s", (int)sizeof s->broken_msg - 1,
             err ? err->msg : mgpu_strerror(rc));
    snprintf(shm_me(s)->reason, sizeof shm_me(s)->reason, "%.*s", (int)sizeof shm_me(s)->reason - 1,
             s->broken_msg);
    shm_me(s)->fail_code = rc;
    atomic_store_explicit(&shm_me(s)->state, RS_FAILED, memory_order_release);
    shm_poke(s);
    return rc;
}

static int shm_desc_check(mgpu_shm_t *s, int q, mgpu_err_t *err)
{
    const struct shm_desc *mine = &shm_me(s)->desc[s->ops % SHM_DESC_RING];
    const struct shm_desc *d = &s->ranks[q].desc[s->ops % SHM_DESC_RING];

    /* Read after an acquire load showed q past this op's first phase, so q wrote its
     * descriptor for this op (if it is at this op at all) before we read it. */
    if (d->op != s->ops)
        return mgpu_err_set(err, MGPU_E_PROTOCOL,
                            "%s: rank %d is at a different collective (its call #%llu, ours "
                            "#%llu): ranks must call collectives in the same order",
                            s->what, q, (unsigned long long)d->op, (unsigned long long)s->ops);
    if (d->kind != mine->kind || d->n != mine->n || d->root != mine->root)
        return mgpu_err_set(err, MGPU_E_PROTOCOL,
                            "%s: rank %d called %s(n=%llu, root=%d) as collective #%llu: "
                            "ranks must call the same collectives with the same sizes",
                            s->what, q, op_names[d->kind <= OP_BARRIER ? d->kind : 0],
                            (unsigned long long)d->n, d->root, (unsigned long long)s->ops);
    return 0;
}

/* Waits until rank who (or every rank, who = -1) has finished phase target. */
static int shm_wait(mgpu_shm_t *s, uint64_t target, int who, mgpu_err_t *err)
{
    int from = 0, q, rc;

    if ((q = shm_pending(s, target, who, &from)) >= 0) {
        /* Spin only while it can pay: with a core per rank the peer is running right now.
         * Not when the peer last ran on this very CPU: the scheduler's wake-affine logic
         * often stacks two ranks that wake each other on one CPU, and a spinner there only
         * delays the peer it waits for (seen on 2 cores: 4 KiB all-reduces went from
         * 1.5 us to 55 us, the length of the spin). Yielding lets the peer run. */
        if (s->spin_s > 0 &&
            atomic_load_explicit(&s->ranks[q].cpu, memory_order_relaxed) != sched_getcpu()) {
            double until = shm_now() + s->spin_s;
            for (int i = 1;; i++) {
                shm_cpu_relax();
                if ((q = shm_pending(s, target, who, &from)) < 0)
                    break;
                if ((i & 63) == 0 && (shm_now() >= until || mgpu_progress_lost_seq(s->lost)))
                    break;
            }
        }
        for (int i = 0; q >= 0 && i < s->yields; i++) {
            sched_yield();
            q = shm_pending(s, target, who, &from);
        }
        while (q >= 0) {
            uint32_t g;
            double now;
            atomic_fetch_add_explicit(&s->hdr->sleepers, 1, memory_order_seq_cst);
            g = atomic_load_explicit(&s->hdr->gen, memory_order_seq_cst);
            if ((q = shm_pending(s, target, who, &from)) >= 0)
                shm_futex_wait(&s->hdr->gen, g, SHM_SLICE_NS);
            atomic_fetch_sub_explicit(&s->hdr->sleepers, 1, memory_order_seq_cst);
            if (q < 0 || (q = shm_pending(s, target, who, &from)) < 0)
                break;
            /* Every slice (5 ms): a lost node is known here long before any deadline. */
            if (mgpu_progress_lost_seq(s->lost) != 0)
                return shm_fail(s, shm_lost(s, err), err);
            now = shm_now();
            rc = shm_check(s, target, who, now - s->last_peer_check >= SHM_PEER_CHECK_S, err);
            if (now - s->last_peer_check >= SHM_PEER_CHECK_S)
                s->last_peer_check = now;
            if (rc < 0)
                return shm_fail(s, rc, err);
        }
    }
    if (!s->desc_checked && target > s->op_base) {
        for (int r = 0; r < s->size; r++) {
            if (r == s->rank || (who >= 0 && r != who))
                continue;
            if ((rc = shm_desc_check(s, r, err)) < 0)
                return shm_fail(s, rc, err);
        }
        s->desc_checked = 1;
    }
    return 0;
}

static int shm_begin(mgpu_shm_t *s, int kind, uint64_t n, int root, mgpu_err_t *err,
                     const char *fmt, ...) __attribute__((format(printf, 6, 7)));

static int shm_begin(mgpu_shm_t *s, int kind, uint64_t n, int root, mgpu_err_t *err,
                     const char *fmt, ...)
{
    struct shm_desc *d;
    va_list ap;
    int len;

    len = snprintf(s->what, sizeof s->what, "%s%s%s(", s->context, s->context[0] ? ": step " : "",
                   op_names[kind]);
    va_start(ap, fmt);
    vsnprintf(s->what + len, sizeof s->what - (size_t)len, fmt, ap);
    va_end(ap);
    len = (int)strlen(s->what);
    snprintf(s->what + len, sizeof s->what - (size_t)len, ") #%llu on rank %d",
             (unsigned long long)s->ops + 1, s->rank);
    if (s->broken)
        return mgpu_err_set(err, MGPU_E_CLOSED,
                            "%s: the communicator is unusable after an earlier failure (%.400s)",
                            s->what, s->broken_msg);
    /* One load: a collective started after the loss fails at once, even one whose local
     * peers are all here (only the step between nodes would wait). */
    if (mgpu_progress_lost_seq(s->lost) != 0)
        return shm_fail(s, shm_lost(s, err), err);
    s->ops++;
    s->kind = kind;
    s->op_base = s->phase;
    s->desc_checked = 0;
    s->deadline = shm_now() + s->timeout_s;
    s->last_peer_check = 0;
    /* Peers read it only after they see our first publish of this op (release). */
    d = &shm_me(s)->desc[s->ops % SHM_DESC_RING];
    d->op = s->ops;
    d->kind = (uint32_t)kind;
    d->n = n;
    d->root = root;
    return 0;
}

/* Sums src[0..n-1] element-wise in rank order into out1 (and out2 when not NULL); out1 may
 * alias a source, as every element is read before it is written. */
typedef float shm_v4 __attribute__((vector_size(16)));

static void shm_reduce(float *out1, float *out2, const float *const *src, int n, size_t m, int avg)
{
    const float div = (float)n;
    const shm_v4 dv = {div, div, div, div};
    size_t i = 0;

    for (; i + 8 <= m; i += 8) {
        shm_v4 a, b, c;
        memcpy(&a, src[0] + i, sizeof a);
        memcpy(&b, src[0] + i + 4, sizeof b);
        for (int q = 1; q < n; q++) {
            memcpy(&c, src[q] + i, sizeof c);
            a += c;
            memcpy(&c, src[q] + i + 4, sizeof c);
            b += c;
        }
        if (avg) {
            a /= dv;
            b /= dv;
        }
        memcpy(out1 + i, &a, sizeof a);
        memcpy(out1 + i + 4, &b, sizeof b);
        if (out2 != NULL) {
            memcpy(out2 + i, &a, sizeof a);
            memcpy(out2 + i + 4, &b, sizeof b);
        }
    }
    for (; i < m; i++) {
        float a = src[0][i];
        for (int q = 1; q < n; q++)
            a += src[q][i];
        if (avg)
            a /= div;
        out1[i] = a;
        if (out2 != NULL)
            out2[i] = a;
    }
}

/* Makes set the current one: waits until nobody reads it any more. */
static int shm_round(mgpu_shm_t *s, int *set, mgpu_err_t *err)
{
    *set = (int)(s->round & 1);
    s->round++;
    return shm_wait(s, s->free_at[*set], -1, err);
}

static void shm_round_done(mgpu_shm_t *s, int set)
{
    s->free_at[set] = s->phase + 1;
}

int mgpu_shm_allreduce_f32(mgpu_shm_t *s, float *buf, size_t count, int avg, mgpu_err_t *err)
{
    const size_t chunk_elems = s->chunk / sizeof(float);
    const float *src[MGPU_SHM_MAX_RANKS];
    int rc, set;

    if ((rc = shm_begin(s, OP_ALLREDUCE, count, -1, err, "count=%zu, %s", count,
                        avg ? "avg" : "sum")) < 0)
        return rc;
    for (size_t off = 0; off < count; off += chunk_elems) {
        size_t m = count - off < chunk_elems ? count - off : chunk_elems;
        float *mine = buf + off;

        if ((rc = shm_round(s, &set, err)) < 0)
            return rc;
        if (m * sizeof(float) <= SHM_SMALL_BYTES) {
            /* Small: one synchronisation; every rank sums the whole round itself. */
            memcpy(shm_slot(s, set, s->rank), mine, m * sizeof(float));
            shm_publish(s);
            if ((rc = shm_wait(s, s->phase, -1, err)) < 0)
                return rc;
            for (int q = 0; q < s->size; q++)
                src[q] = q == s->rank ? mine : (const float *)shm_slot(s, set, q);
            shm_reduce(mine, NULL, src, s->size, m, avg);
        } else {
            /* Large: reduce-scatter then all-gather. Rank q reduces part q; a rank copies in
             * only the parts others reduce and reads its own part from its buffer, and the
             * reduced part goes straight into its buffer and into its slot for the others. */
            size_t part = (m + (size_t)s->size - 1) / (size_t)s->size;
            size_t lo, hi;
            float *slot = (float *)shm_slot(s, set, s->rank);

            part = (part + 15) & ~(size_t)15; /* whole cache lines per part */
            for (int q = 0; q < s->size; q++) {
                lo = (size_t)q * part;
                hi = lo + part < m ? lo + part : m;
                if (q != s->rank && lo < hi)
                    memcpy(slot + lo, mine + lo, (hi - lo) * sizeof(float));
            }
            shm_publish(s);
            if ((rc = shm_wait(s, s->phase, -1, err)) < 0)
                return rc;
            lo = (size_t)s->rank * part;
            hi = lo + part < m ? lo + part : m;
            if (lo < hi) {
                for (int q = 0; q < s->size; q++)
                    src[q] = q == s->rank ? mine + lo : (const float *)shm_slot(s, set, q) + lo;
                shm_reduce(mine + lo, slot + lo, src, s->size, hi - lo, avg);
            }
            shm_publish(s);
            /* Gather each part as soon as its owner has reduced it. */
            for (int q = 0; q < s->size; q++) {
                int r = (s->rank + 1 + q) % s->size;
                lo = (size_t)r * part;
                hi = lo + part < m ? lo + part : m;
                if (r == s->rank || lo >= hi)
                    continue;
                if ((rc = shm_wait(s, s->phase, r, err)) < 0)
                    return rc;
                memcpy(mine + lo, (const float *)shm_slot(s, set, r) + lo,
                       (hi - lo) * sizeof(float));
            }
        }
        shm_round_done(s, set);
    }
    return 0;
}

int mgpu_shm_broadcast(mgpu_shm_t *s, void *buf, size_t bytes, int root, mgpu_err_t *err)
{
    int rc, set;

    if (root < 0 || root >= s->size)
        return mgpu_err_set(err, MGPU_E_RANGE,
                            "mgpu_broadcast(bytes=%zu, root=%d): root is not "
                            "a rank of this communicator of %d",
                            bytes, root, s->size);
    if ((rc = shm_begin(s, OP_BROADCAST, bytes, root, err, "bytes=%zu, root=%d", bytes, root)) < 0)
        return rc;
    for (size_t off = 0; off < bytes; off += s->chunk) {
        size_t m = bytes - off < s->chunk ? bytes - off : s->chunk;
        char *p = (char *)buf + off;

        if (s->rank == root) {
            if ((rc = shm_round(s, &set, err)) < 0)
                return rc;
            memcpy(shm_slot(s, set, root), p, m);
            shm_publish(s);
        } else {
            /* Readers need no free set: they only read, after the root's publish. */
            set = (int)(s->round & 1);
            s->round++;
            shm_publish(s);
            if ((rc = shm_wait(s, s->phase, root, err)) < 0)
                return rc;
            memcpy(p, shm_slot(s, set, root), m);
        }
        shm_round_done(s, set);
    }
    return 0;
}

int mgpu_shm_allgather(mgpu_shm_t *s, const void *send, void *recv, size_t bytes, mgpu_err_t *err)
{
    char *own = (char *)recv + (size_t)s->rank * bytes;
    int rc, set;

    if ((rc = shm_begin(s, OP_ALLGATHER, bytes, -1, err, "bytes=%zu", bytes)) < 0)
        return rc;
    if (send != own)
        memmove(own, send, bytes);
    for (size_t off = 0; off < bytes; off += s->chunk) {
        size_t m = bytes - off < s->chunk ? bytes - off : s->chunk;

        if ((rc = shm_round(s, &set, err)) < 0)
            return rc;
        memcpy(shm_slot(s, set, s->rank), own + off, m);
        shm_publish(s);
        for (int q = 1; q < s->size; q++) {
            int r = (s->rank + q) % s->size;
            if ((rc = shm_wait(s, s->phase, r, err)) < 0)
                return rc;
            memcpy((char *)recv + (size_t)r * bytes + off, shm_slot(s, set, r), m);
        }
        shm_round_done(s, set);
    }
    return 0;
}

int mgpu_shm_barrier(mgpu_shm_t *s, mgpu_err_t *err)
{
    int rc;

    if ((rc = shm_begin(s, OP_BARRIER, 0, -1, err, "%s", "")) < 0)
        return rc;
    shm_publish(s);
    return shm_wait(s, s->phase, -1, err);
}

void mgpu_shm_set_timeout(mgpu_shm_t *s, double timeout_s)
{
    s->timeout_s = timeout_s;
}

void mgpu_shm_set_context(mgpu_shm_t *s, const char *context)
{
    snprintf(s->context, sizeof s->context, "%s", context ? context : "");
}

void mgpu_shm_abort(mgpu_shm_t *s, int code, const char *why)
{
    mgpu_err_t e;
    if (s->broken)
        return;
    mgpu_err_set(&e, code, "%s", why);
    shm_fail(s, code, &e);
}

/* ---- attaching ---------------------------------------------------------------------- */

static size_t shm_round_up(size_t n, size_t to)
{
    return (n + to - 1) / to * to;
}

static size_t shm_data_offset(int size)
{
    return shm_round_up(sizeof(struct shm_hdr) + (size_t)size * sizeof(struct shm_rank), 4096);
}

/* A size from the environment (K and M suffixes), def when unset. */
static int shm_env_size(const char *name, size_t def, size_t *out, size_t lo, size_t hi,
                        mgpu_err_t *err)
{
    const char *v = getenv(name);
    char *end;
    unsigned long long n;

    *out = def;
    if (v == NULL || *v == '\0')
        return 0;
    n = strtoull(v, &end, 10);
    if (end == v)
        return mgpu_err_set(err, MGPU_E_USAGE, "%s=\"%s\" is not a size", name, v);
    if (*end == 'K' || *end == 'k')
        n <<= 10, end++;
    else if (*end == 'M' || *end == 'm')
        n <<= 20, end++;
    if (*end != '\0' || n < lo || n > hi)
        return mgpu_err_set(err, MGPU_E_RANGE, "%s=\"%s\" must be %zu..%zu (K, M suffixes)", name,
                            v, lo, hi);
    *out = (size_t)n;
    return 0;
}

/* Rank 0: creates the segment. A leftover of a crashed job with the same name (its creator
 * is dead) is removed; one whose creator lives belongs to another job and is an error. */
static int shm_create(mgpu_shm_t *s, size_t chunk, mgpu_err_t *err)
{
    size_t total = shm_data_offset(s->size) + 2 * (size_t)s->size * chunk;
    int fd = -1;

    for (int tries = 0; fd < 0; tries++) {
        fd = shm_open(s->name, O_RDWR | O_CREAT | O_EXCL, 0600);
        if (fd >= 0)
            break;
        if (errno != EEXIST || tries > 0)
            return mgpu_err_set(err, -errno, "shm_open(%s, O_CREAT|O_EXCL): %s", s->name,
                                strerror(errno));
        fd = shm_open(s->name, O_RDONLY, 0);
        if (fd >= 0) {
            int pid = mgpu_shm_head_creator(fd);
            close(fd);
            fd = -1;
            if (pid != getpid() && mgpu_shm_pid_alive(pid))
                return mgpu_err_set(err, -EEXIST,
                                    "shm_open(%s): the segment exists and its creator (pid %d) "
                                    "is alive: another job with the same run id and port "
                                    "(MASTER_PORT / MGPU_STORE_TOKEN)?",
                                    s->name, pid);
        }
        shm_unlink(s->name); /* stale: its creator died before everyone attached */
    }
    if (ftruncate(fd, (off_t)total) < 0) {
        int e = errno;
        close(fd);
        shm_unlink(s->name);
        return mgpu_err_set(err, -e, "ftruncate(%s, %zu): %s (is /dev/shm large enough?)", s->name,
                            total, strerror(e));
    }
    s->hdr = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (s->hdr == MAP_FAILED) {
        int e = errno;
        s->hdr = NULL;
        shm_unlink(s->name);
        return mgpu_err_set(err, -e, "mmap(%s, %zu): %s", s->name, total, strerror(e));
    }
    s->map_len = total;
    s->hdr->head.magic = MGPU_SHM_MAGIC;
    s->hdr->head.version = MGPU_SHM_VERSION;
    s->hdr->head.size = (uint32_t)s->size;
    s->hdr->head.chunk = chunk;
    s->hdr->head.total = total;
    s->hdr->head.creator_pid = getpid();
    /* Release: a rank that sees ready = 1 sees every field above. */
    atomic_store_explicit(&s->hdr->ready, 1, memory_order_release);
    return 0;
}

/* Other ranks: open the segment rank 0 creates, retrying until it exists, is sized and is
 * ready. Returns 1 to retry (not there yet, or a stale one), 0 when mapped, < 0 on error. */
static int shm_try_open(mgpu_shm_t *s, mgpu_err_t *err)
{
    struct shm_hdr *h;
    struct stat st;
    size_t total;
    int fd = shm_open(s->name, O_RDWR, 0);

    if (fd < 0)
        return errno == ENOENT
                   ? 1
                   : mgpu_err_set(err, -errno, "shm_open(%s): %s", s->name, strerror(errno));
    if (fstat(fd, &st) < 0 || (size_t)st.st_size < sizeof *h) {
        close(fd); /* rank 0 has not sized it yet */
        return 1;
    }
    h = mmap(NULL, sizeof *h, PROT_READ, MAP_SHARED, fd, 0);
    if (h == MAP_FAILED) {
        close(fd);
        return mgpu_err_set(err, -errno, "mmap(%s): %s", s->name, strerror(errno));
    }
    if (!atomic_load_explicit(&h->ready, memory_order_acquire) ||
        !mgpu_shm_pid_alive(h->head.creator_pid)) {
        munmap(h, sizeof *h);
        close(fd);
        return 1; /* not initialised yet, or a stale one rank 0 will replace */
    }
    if (h->head.magic != MGPU_SHM_MAGIC || h->head.version != MGPU_SHM_VERSION ||
        h->head.size != (uint32_t)s->size) {
        int hs = (int)h->head.size;
        munmap(h, sizeof *h);
        close(fd);
        return mgpu_err_set(err, MGPU_E_PROTOCOL,
                            "shm segment %s was made for %d ranks (version %u), this rank "
                            "expects %d: ranks disagree on LOCAL_WORLD_SIZE?",
                            s->name, hs, MGPU_SHM_VERSION, s->size);
    }
    total = h->head.total;
    s->chunk = h->head.chunk;
    munmap(h, sizeof *h);
    if ((size_t)st.st_size < total) {
        close(fd);
        return 1;
    }
    s->hdr = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (s->hdr == MAP_FAILED) {
        s->hdr = NULL;
        return mgpu_err_set(err, -errno, "mmap(%s, %zu): %s", s->name, total, strerror(errno));
    }
    s->map_len = total;
    return 0;
}

static void shm_unmap(mgpu_shm_t *s)
{
    if (s->hdr != NULL)
        munmap(s->hdr, s->map_len);
    s->hdr = NULL;
}

static int shm_attach(mgpu_shm_t *s, size_t chunk, mgpu_err_t *err)
{
    double deadline = shm_now() + s->timeout_s;
    int rc, expect = 0, me = getpid();

    if (s->rank == 0) {
        if ((rc = shm_create(s, chunk, err)) < 0)
            return rc;
        s->chunk = chunk;
    } else {
        for (int ms = 1; (rc = shm_try_open(s, err)) == 1; ms = ms < 20 ? ms * 2 : 20) {
            if (shm_now() >= deadline)
                return mgpu_err_set(err, MGPU_E_TIMEOUT,
                                    "rank %d: shared memory segment %s of rank 0 did not appear "
                                    "within %.1f s (rank 0 not started or failed?)",
                                    s->rank, s->name, s->timeout_s);
            shm_sleep_ms(ms);
        }
        if (rc < 0)
            return rc;
    }
    /* sizeof(struct shm_hdr) is a multiple of SHM_LINE (its _Alignas member), so the rank
     * lines that follow are aligned too. */
    s->ranks = (struct shm_rank *)((char *)s->hdr + sizeof(struct shm_hdr));
    s->data = (char *)s->hdr + shm_data_offset(s->size);
    if (!atomic_compare_exchange_strong(&shm_me(s)->pid, &expect, me)) {
        rc = mgpu_err_set(err, MGPU_E_USAGE,
                          "shm segment %s: rank %d is already taken by pid %d: two processes "
                          "were given the same rank",
                          s->name, s->rank, expect);
        shm_unmap(s);
        return rc;
    }
    atomic_store_explicit(&shm_me(s)->state, RS_ATTACHED, memory_order_release);
    /* The last rank to attach removes the name: from then on only the mappings hold the
     * memory, and the kernel frees it when the last process exits, however it exits. */
    if (atomic_fetch_add(&s->hdr->attached, 1) + 1 == s->size)
        shm_unlink(s->name);
    shm_poke(s);
    for (int ms = 1; atomic_load(&s->hdr->attached) < s->size; ms = ms < 10 ? ms * 2 : 10) {
        if (shm_now() >= deadline) {
            char missing[256];
            size_t n = 0;
            missing[0] = '\0';
            for (int q = 0; q < s->size && n < sizeof missing; q++)
                if (atomic_load(&s->ranks[q].pid) == 0)
                    n +=
                        (size_t)snprintf(missing + n, sizeof missing - n, "%s%d", n ? ", " : "", q);
            if (s->rank == 0)
                shm_unlink(s->name);
            rc = mgpu_err_set(err, MGPU_E_TIMEOUT,
                              "rank %d: ranks %s did not attach to shared memory segment %s "
                              "within %.1f s",
                              s->rank, missing, s->name, s->timeout_s);
            atomic_store(&shm_me(s)->state, RS_LEFT);
            shm_unmap(s);
            return rc;
        }
        shm_sleep_ms(ms);
    }
    for (int q = 0; q < s->size; q++) {
        int pid = atomic_load(&s->ranks[q].pid);
        s->pidfd[q] = q == s->rank ? -1 : (int)syscall(SYS_pidfd_open, pid, 0);
        if (s->pidfd[q] >= 0)
            fcntl(s->pidfd[q], F_SETFD, FD_CLOEXEC);
    }
    return 0;
}

static int shm_cpus(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        return CPU_COUNT(&set);
    return (int)sysconf(_SC_NPROCESSORS_ONLN);
}

int mgpu_shm_open(const mgpu_shm_opts_t *o, mgpu_shm_t **out, mgpu_err_t *err)
{
    mgpu_shm_t *s;
    size_t chunk = o->chunk_bytes, spin_us, yields;
    int rc;

    if (o->size < 1 || o->size > MGPU_SHM_MAX_RANKS || o->rank < 0 || o->rank >= o->size)
        return mgpu_err_set(err, MGPU_E_RANGE, "shm communicator: rank %d of %d (at most %d)",
                            o->rank, o->size, MGPU_SHM_MAX_RANKS);
    /* The default slot, halved while the segment (2 sets of a slot per rank) would pass
     * 32 MiB: containers often give /dev/shm only 64 MiB. */
    size_t def_chunk = MGPU_SHM_DEFAULT_CHUNK;
    while (def_chunk > (64u << 10) && 2 * (size_t)o->size * def_chunk > (32u << 20))
        def_chunk /= 2;
    if (chunk == 0 &&
        (rc = shm_env_size("MGPU_SHM_CHUNK", def_chunk, &chunk, 4096, 1u << 30, err)) < 0)
        return rc;
    chunk = shm_round_up(chunk, 4096);
    s = calloc(1, sizeof *s);
    if (s == NULL || (s->pidfd = calloc((size_t)o->size, sizeof(int))) == NULL) {
        free(s);
        return mgpu_err_set(err, -ENOMEM, "shm communicator: out of memory");
    }
    snprintf(s->name, sizeof s->name, "%s", o->name);
    s->rank = o->rank;
    s->size = o->size;
    s->timeout_s = o->timeout_s > 0 ? o->timeout_s : 300;
    s->lost = o->lost;
    /* Spinning helps only while every rank has a core; oversubscribed, a spinning waiter
     * steals the core from the very rank it waits for. Measured on 2 cores: see
     * tests/bench/ALLREDUCE_RESULTS.md. */
    if (o->spin_us >= 0)
        spin_us = (size_t)o->spin_us;
    else if ((rc = shm_env_size("MGPU_SHM_SPIN_US", o->size <= shm_cpus() ? 50 : 0, &spin_us, 0,
                                1000000, err)) < 0)
        goto fail;
    s->spin_s = (double)spin_us * 1e-6;
    if ((rc = shm_env_size("MGPU_SHM_YIELDS", o->size <= shm_cpus() ? 4 : 2, &yields, 0, 100000,
                           err)) < 0)
        goto fail;
    s->yields = (int)yields;
    for (int q = 0; q < o->size; q++)
        s->pidfd[q] = -1;
    if ((rc = shm_attach(s, chunk, err)) < 0)
        goto fail;
    *out = s;
    return 0;
fail:
    free(s->pidfd);
    free(s);
    return rc;
}

void mgpu_shm_close(mgpu_shm_t *s)
{
    if (s == NULL)
        return;
    if (s->hdr != NULL && !s->broken) {
        atomic_store_explicit(&shm_me(s)->state, RS_LEFT, memory_order_release);
        shm_poke(s);
    }
    for (int q = 0; q < s->size; q++)
        if (s->pidfd[q] >= 0)
            close(s->pidfd[q]);
    shm_unmap(s);
    free(s->pidfd);
    free(s);
}
