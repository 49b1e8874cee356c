/* progress.h - where each worker is, on a shared-memory page the launcher reads: the contract
 * between libmgpu (the only writer of a rank's page) and mgpu-launch (its reader).
 *
 * The launcher creates one anonymous shared-memory file (memfd) per group of local workers,
 * MGPU_PROGRESS_PAGE bytes per local rank, and hands every worker its path and slot:
 *     MGPU_PROGRESS_FILE=/proc/<launcher pid>/fd/<fd>    MGPU_PROGRESS_SLOT=<local rank>
 * A worker opens the path, maps the whole file (so a rank can also read its local peers' pages,
 * as the NCCL watchdog does to name the ranks that never entered a collective) and writes its
 * own slot only. A memfd goes away with the last process holding it: nothing is left behind
 * after a kill -9. Workers started by another launcher have no such variables and publish
 * nothing.
 *
 * Writes to the seqlocked part go between mgpu_progress_write_begin and _end (seq is odd
 * meanwhile); mgpu_progress_read copies a page and retries until it saw an even, unchanged
 * seq, so a reader never blocks the writer and the writer never waits. coll_done is written
 * outside the seqlock (an atomic store) because another thread of the worker (the NCCL
 * watchdog, which sees collectives finish on the GPU) advances it. Times are CLOCK_MONOTONIC
 * nanoseconds, the same clock in every process of a host.
 *
 * The page's tail goes the other way: the launcher writes it (mgpu_progress_set_lost, through
 * mgpu_pages_set_lost: every local rank's page) when it learns that a node of the job is lost,
 * and libmgpu reads it. lost_seq is 0 while no peer is lost; the writer makes it odd, writes
 * lost_text, then makes it even again (a release store), so it has moved past 0 for good and
 * a text read between two equal, even values is whole. A collective loads lost_seq (one
 * relaxed load when it starts, and every 5 to 50 ms while it waits) and, once it is not
 * 0, fails naming the collective with lost_text (mgpu_progress_lost copies it). The launcher zeroes the pages at
 * the start of each attempt, the worker never clears the tail, so a restarted worker starts
 * with no lost peer and a worker that attaches after the loss still sees it. */
#ifndef MGPU_PROGRESS_H
#define MGPU_PROGRESS_H

#include <stddef.h> /* size_t */
#include <stdint.h> /* uint64_t, int64_t */

#define MGPU_PROGRESS_MAGIC 0x4d475055u /* "MGPU" */
#define MGPU_PROGRESS_VERSION 1u
#define MGPU_PROGRESS_PAGE 4096
#define MGPU_PROGRESS_RING 16 /* the last collectives entered, kept for the report */
#define MGPU_PROGRESS_ENV_FILE "MGPU_PROGRESS_FILE"
#define MGPU_PROGRESS_ENV_SLOT "MGPU_PROGRESS_SLOT"

/* What a rank is doing. The names (mgpu_progress_phase_name) are what reports print. */
typedef enum mgpu_phase {
    MGPU_PHASE_NONE = 0, /* attached, nothing said yet */
    MGPU_PHASE_INIT,     /* mgpu_init, communicator creation */
    MGPU_PHASE_DATA,     /* reading or preparing a batch */
    MGPU_PHASE_FORWARD,
    MGPU_PHASE_BACKWARD,
    MGPU_PHASE_ALLREDUCE, /* waiting for the gradients' all-reduce */
    MGPU_PHASE_OPTIMIZER,
    MGPU_PHASE_CHECKPOINT,
    MGPU_PHASE_EVAL,
    MGPU_PHASE_DONE, /* finished training, shutting down */
    MGPU_PHASE_COUNT
} mgpu_phase_t;

/* The collective operations libmgpu runs (mgpu_progress_coll_name: "all-reduce", ...). */
typedef enum mgpu_coll_op {
    MGPU_COLL_NONE = 0,
    MGPU_COLL_ALLREDUCE,
    MGPU_COLL_BROADCAST,
    MGPU_COLL_ALLGATHER,
    MGPU_COLL_REDUCE_SCATTER,
    MGPU_COLL_BARRIER,
    MGPU_COLL_COUNT
} mgpu_coll_op_t;

typedef struct mgpu_progress_coll {
    uint64_t seq;   /* 1, 2, ...: the rank's collective count when it entered this one */
    uint32_t op;    /* mgpu_coll_op_t */
    int32_t bucket; /* gradient bucket, -1 when not a bucket */
    uint64_t bytes;
    int64_t since_ns; /* entered at */
} mgpu_progress_coll_t;

typedef struct mgpu_progress_page {
    uint32_t magic;   /* MGPU_PROGRESS_MAGIC once the worker attached (written last) */
    uint32_t version; /* MGPU_PROGRESS_VERSION */
    int32_t pid;      /* the worker's */
    int32_t rank;     /* global rank */
    uint64_t seq;     /* seqlock: odd while the worker writes */
    /* --- under the seqlock --- */
    uint64_t moves;        /* +1 on every change below: a rank that moved has another value */
    int64_t moved_ns;      /* when moves last changed */
    int64_t step;          /* the step in progress, -1 before the first */
    uint32_t phase;        /* mgpu_phase_t */
    uint32_t pad0;         /* keeps the fields below 8-byte aligned */
    int64_t phase_ns;      /* when the phase (or step) was entered */
    uint64_t coll_entered; /* collectives entered so far; the last is ring[(n-1) % RING] */
    mgpu_progress_coll_t ring[MGPU_PROGRESS_RING];
    char label[64]; /* free text of the program's, NUL-terminated ("epoch 3", "") */
    /* --- outside the seqlock, atomic --- */
    uint64_t coll_done; /* collectives finished (on the GPU for NCCL); <= coll_entered */
    /* --- written by the launcher (mgpu_pages_set_lost), read by the worker --- */
    uint32_t lost_seq;   /* 0: no peer lost; odd while lost_text is written, then even (release) */
    uint32_t pad1;       /* keeps lost_text 8-byte aligned */
    char lost_text[256]; /* NUL-terminated, e.g. "ranks 2-3 (node 1, host h1) lost: heartbeat
                          * missed for 15.0 s" */
} mgpu_progress_page_t;

#ifdef __cplusplus
static_assert(sizeof(mgpu_progress_page_t) <= MGPU_PROGRESS_PAGE, "a page holds one rank");
#else
_Static_assert(sizeof(mgpu_progress_page_t) <= MGPU_PROGRESS_PAGE, "a page holds one rank");
#endif

/* The writer's side, for the worker's own page (one writing thread). */
static inline void mgpu_progress_write_begin(mgpu_progress_page_t *p)
{
    __atomic_store_n(&p->seq, p->seq + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
}
static inline void mgpu_progress_write_end(mgpu_progress_page_t *p)
{
    __atomic_store_n(&p->seq, p->seq + 1, __ATOMIC_RELEASE);
}

/* Copies page into out consistently (retrying while the writer is in the middle, at most
 * 1000 times). Returns 0, or -1 when the page is not attached (magic or version wrong) or
 * stayed in the middle of a write (a worker stopped inside one: the copy is then the
 * best-effort last state). */
int mgpu_progress_read(const mgpu_progress_page_t *page, mgpu_progress_page_t *out);

/* The launcher's side: text (cut to 255 bytes) into lost_text, then lost_seq bumped past the
 * odd value it held meanwhile. One writer per page (the launcher's loop). */
void mgpu_progress_set_lost(mgpu_progress_page_t *page, const char *text);

/* The worker's check, for waits: not 0 once a peer is lost. One relaxed load; page may be NULL
 * (no launcher's page: never lost). */
static inline uint32_t mgpu_progress_lost_seq(const mgpu_progress_page_t *page)
{
    return page != NULL ? __atomic_load_n(&page->lost_seq, __ATOMIC_RELAXED) : 0;
}

/* 0 when no peer is lost (text is ""), else 1 with lost_text copied whole into text
 * (NUL-terminated; len > 0). A text that keeps changing under the copy (a launcher stopped
 * in the middle of writing it) is replaced by a message that says so. */
int mgpu_progress_lost(const mgpu_progress_page_t *page, char *text, size_t len);

/* "forward", "all-reduce", ...; "?" for a value out of range. */
const char *mgpu_progress_phase_name(uint32_t phase);
const char *mgpu_progress_coll_name(uint32_t op);

/* The ring entry of collective seq (1-based), or NULL when it is no longer (or not yet) in
 * the ring of a page read with mgpu_progress_read. */
const mgpu_progress_coll_t *mgpu_progress_coll(const mgpu_progress_page_t *p, uint64_t seq);

#endif
