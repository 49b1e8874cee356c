/* beacon.h - this process's side of the progress page (common/progress.h): where the rank is
 * (step, phase, label, the collectives it entered and finished), written where the launcher
 * can read it.
 *
 * mgpu_beacon_attach maps the page mgpu-launch made for the rank (MGPU_PROGRESS_FILE, slot
 * MGPU_PROGRESS_SLOT: the whole file, so the local peers' pages can be read too). Without
 * those variables (torchrun, srun, mpirun, no launcher), or when attaching fails (a warning
 * naming the variable, never an error), the beacon writes to a private page of its own: the
 * writes cost the same either way and never ask whether anyone reads them. MGPU_PROGRESS=0
 * leaves page NULL, and every write returns at its first test (for measuring the cost).
 *
 * The launcher writes the tail of the rank's page when a node of the job is lost; lost points
 * at it, and the communicators watch it while they wait (lost stays NULL on a private page and
 * with MGPU_PROGRESS=0: then nothing tells a worker that a peer is lost but its timeouts).
 *
 * Threads: the thread that calls the collectives writes the page (under its seqlock); only
 * coll_done is written by another thread too (the NCCL watchdog), with an atomic maximum.
 * Ownership: the beacon lives in the caller's memory (mgpu_ctx_t); mgpu_beacon_detach unmaps
 * the file. C and C++ (comm_nccl.cu reads it). */
#ifndef MGPU_BEACON_H
#define MGPU_BEACON_H

#include <stddef.h> /* size_t */
#include <stdint.h> /* uint64_t */
#include <time.h>   /* clock_gettime */

#include "progress.h" /* mgpu_progress_page_t, mgpu_progress_write_begin/_end */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mgpu_beacon {
    mgpu_progress_page_t *page;  /* this rank's; NULL when MGPU_PROGRESS=0 */
    mgpu_progress_page_t *pages; /* the mapped file (the local ranks' pages); NULL if private */
    /* This rank's page in the launcher's file, whose tail says when a peer is lost
     * (progress.h, mgpu_progress_lost_seq); NULL without one (private page, MGPU_PROGRESS=0). */
    const mgpu_progress_page_t *lost;
    int npages;
    int slot;   /* this rank's page in pages */
    int bucket; /* of the collectives entered from now on; -1: none */
    size_t map_len;
    mgpu_progress_page_t own; /* the private page */
} mgpu_beacon_t;

/* Reads MGPU_PROGRESS, MGPU_PROGRESS_FILE and MGPU_PROGRESS_SLOT and starts the page: pid,
 * rank, step -1, phase INIT, then magic and version last. Never fails: a problem is a
 * warning naming the variable, and the beacon writes its private page. */
void mgpu_beacon_attach(mgpu_beacon_t *b, int rank);
void mgpu_beacon_detach(mgpu_beacon_t *b);

/* CLOCK_MONOTONIC in nanoseconds (the vDSO: no system call). */
static inline int64_t mgpu_beacon_now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* The writes of mgpu_progress_step/_phase (mgpu.h); p is not NULL. */
static inline void mgpu_beacon_step(mgpu_progress_page_t *p, long long step)
{
    int64_t now = mgpu_beacon_now_ns();
    mgpu_progress_write_begin(p);
    p->moves++;
    p->moved_ns = now;
    p->step = step;
    p->phase_ns = now;
    mgpu_progress_write_end(p);
}

static inline void mgpu_beacon_phase(mgpu_progress_page_t *p, uint32_t phase)
{
    int64_t now = mgpu_beacon_now_ns();
    mgpu_progress_write_begin(p);
    p->moves++;
    p->moved_ns = now;
    p->phase = phase;
    p->phase_ns = now;
    mgpu_progress_write_end(p);
}

/* A collective entered: its sequence number (coll_entered after it), or 0 when publishing is
 * off. bytes: this rank's payload. */
static inline uint64_t mgpu_beacon_coll_enter(mgpu_beacon_t *b, uint32_t op, uint64_t bytes)
{
    mgpu_progress_page_t *p = b->page;
    mgpu_progress_coll_t *c;
    int64_t now;
    uint64_t seq;

    if (p == NULL)
        return 0;
    now = mgpu_beacon_now_ns();
    mgpu_progress_write_begin(p);
    seq = ++p->coll_entered;
    c = &p->ring[(seq - 1) % MGPU_PROGRESS_RING];
    c->seq = seq;
    c->op = op;
    c->bucket = b->bucket;
    c->bytes = bytes;
    c->since_ns = now;
    p->moves++;
    p->moved_ns = now;
    mgpu_progress_write_end(p);
    return seq;
}

/* Collectives up to seq have finished. A maximum, so that a late report of an older one (the
 * watchdog of another communicator) never moves coll_done back. */
static inline void mgpu_beacon_coll_done(mgpu_progress_page_t *p, uint64_t seq)
{
    uint64_t cur;

    if (p == NULL)
        return;
    cur = __atomic_load_n(&p->coll_done, __ATOMIC_RELAXED);
    while (cur < seq && !__atomic_compare_exchange_n(&p->coll_done, &cur, seq, 1, __ATOMIC_RELEASE,
                                                     __ATOMIC_RELAXED))
        ;
}

/* Names the local ranks that never entered collective seq of the rank on pages[self]: into
 * buf, e.g. "ranks 3, 5 never entered all-reduce #4593 (bucket 3, 4194304 bytes)", "every
 * local rank entered all-reduce #12", then "; ranks on other nodes: unknown" when remote
 * (ranks of the job live on other nodes, whose pages cannot be seen). A slot nobody attached
 * is named by its local rank ("local rank 2 published no progress"). Pages are read with
 * mgpu_progress_read (a stopped writer's last state counts). Returns how many ranks were
 * named as behind; buf is "" (and 0 returned) without pages or when seq is 0. */
int mgpu_beacon_absent(const mgpu_progress_page_t *pages, int npages, int self, uint64_t seq,
                       int remote, char *buf, size_t len);

/* The same over a beacon's mapped file; "" for a private page. */
int mgpu_beacon_name_absent(const mgpu_beacon_t *b, uint64_t seq, int remote, char *buf,
                            size_t len);

#ifdef __cplusplus
}
#endif

#endif
