/* shm.h - collectives between the ranks of one host through a POSIX shared-memory segment.
 *
 * The CPU backend of libmgpu for ranks that share a host. Rank 0 creates the segment under a
 * name every rank derives from the job (mgpu_shm_name), the others open it (retrying until the
 * timeout), and the last to attach unlinks the name, so nothing is left in /dev/shm once the
 * job has started, even if it is killed later.
 *
 * Layout: a header, one control line per rank (a phase counter, its pid, its state) and two
 * sets of per-rank data slots used alternately, so one round's copy-in overlaps the previous
 * round's copy-out. Ranks publish progress by raising their phase counter (release) and wait
 * for the others' counters (acquire): a short spin, then sched_yield, then a futex on one
 * shared word, so oversubscribed hosts (more ranks than cores) do not burn a core spinning.
 * Every wait has the collective's deadline and checks the peers it waits for: a dead peer
 * (pidfd) or one that failed or left makes the wait fail at once (MGPU_E_PEER) naming it; a
 * deadline that passes fails with MGPU_E_TIMEOUT naming the ranks that never arrived; the
 * launcher's word that a node is lost (opts.lost, looked at every few milliseconds of a wait
 * and when a collective starts) fails it with MGPU_E_PEER and the launcher's text. After
 * any failure the communicator is broken: later calls fail with MGPU_E_CLOSED.
 *
 * Results are identical on every rank and independent of the message size: element i is
 * always summed in rank order 0, 1, ..., W-1 (then divided by W for an average).
 *
 * Ownership: mgpu_shm_open returns a handle the caller closes with mgpu_shm_close. Not
 * thread-safe: one collective at a time per handle, called in the same order on every rank. */
#ifndef MGPU_SHM_H
#define MGPU_SHM_H

#include <stddef.h> /* size_t */
#include <stdint.h> /* uint64_t */

#include "error.h"    /* mgpu_err_t */
#include "progress.h" /* mgpu_progress_page_t: the launcher's word that a peer is lost */

#define MGPU_SHM_MAX_RANKS 1024
#define MGPU_SHM_DEFAULT_CHUNK (256u << 10)

typedef struct mgpu_shm mgpu_shm_t;

typedef struct mgpu_shm_opts {
    const char *name;   /* "/mgpu-..." (see mgpu_shm_name) */
    int rank, size;     /* this rank among the ranks of this host, and their number */
    double timeout_s;   /* attaching, and each collective (mgpu_shm_set_timeout) */
    size_t chunk_bytes; /* bytes per rank slot; 0: MGPU_SHM_CHUNK, else 256 KiB,
                         * less past 64 ranks (rank 0 decides) */
    int spin_us;        /* a waiter spins this long before it yields; -1: from cores and ranks */
    /* The launcher's word that a peer is lost (progress.h; NULL: none): a collective waiting
     * when it turns non-zero, or started after, fails with MGPU_E_PEER and its text. */
    const mgpu_progress_page_t *lost;
} mgpu_shm_opts_t;

/* A segment name unique to one job and one communicator: a hash of the user id, run id,
 * restart attempt, a per-job token (store token, MASTER_PORT, ...) and the communicator's
 * index in the process. Fits NAME_MAX. */
void mgpu_shm_name(char *buf, size_t len, const char *run_id, int attempt, const char *token,
                   int comm_index);

int mgpu_shm_open(const mgpu_shm_opts_t *opts, mgpu_shm_t **out, mgpu_err_t *err);
/* Marks this rank as gone (peers waiting for it fail at once), unmaps, frees. NULL is fine. */
void mgpu_shm_close(mgpu_shm_t *s);
void mgpu_shm_set_timeout(mgpu_shm_t *s, double timeout_s);
/* Names the collective the next calls are steps of, for messages (copied; NULL clears):
 * "mgpu_allreduce_f32(count=10, sum) across 2 nodes". */
void mgpu_shm_set_context(mgpu_shm_t *s, const char *context);
/* Breaks the communicator from outside (a failure of the step between nodes): peers waiting
 * for this rank fail at once with why. */
void mgpu_shm_abort(mgpu_shm_t *s, int code, const char *why);

/* In place; avg divides the sum by the number of ranks. */
int mgpu_shm_allreduce_f32(mgpu_shm_t *s, float *buf, size_t count, int avg, mgpu_err_t *err);
int mgpu_shm_broadcast(mgpu_shm_t *s, void *buf, size_t bytes, int root, mgpu_err_t *err);
/* recv holds size * bytes; send may be recv + rank * bytes (in place). */
int mgpu_shm_allgather(mgpu_shm_t *s, const void *send, void *recv, size_t bytes, mgpu_err_t *err);
int mgpu_shm_barrier(mgpu_shm_t *s, mgpu_err_t *err);

#endif
