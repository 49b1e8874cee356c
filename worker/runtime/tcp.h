/* tcp.h - collectives over a TCP ring, between the leaders (local rank 0) of the nodes.
 *
 * The CPU backend's transport between hosts. Member m listens on a free port, publishes
 * "host:port:nonce" in the store under <key>/<m>, connects to member m+1 and accepts member
 * m-1 (the connector proves itself with the listener's nonce, so a stray connection is
 * refused). Data moves one way round the ring: all-reduce is a reduce-scatter then an
 * all-gather (each member sends 2(n-1)/n of the data), all-gather n-1 steps, broadcast a
 * chunked relay from the root.
 *
 * Every call has the communicator's deadline; a neighbour whose connection closes or resets
 * fails the call at once with MGPU_E_PEER naming its node and rank, one that sends nothing in
 * time fails it with MGPU_E_TIMEOUT. A node that is lost without closing its connections (a
 * host that hangs, a cable pulled) is named by the launcher (opts.lost): a waiting call looks
 * at it every TCP_LOST_SLICE_MS and fails with MGPU_E_PEER and the launcher's text, as does a
 * call started after. After a failure the ring is broken (MGPU_E_CLOSED).
 *
 * Ownership: mgpu_tcp_open returns a ring the caller closes with mgpu_tcp_close. The store is
 * only used during mgpu_tcp_open. Not thread-safe; collectives in the same order everywhere. */
#ifndef MGPU_TCP_H
#define MGPU_TCP_H

#include <stddef.h> /* size_t */

#include "error.h"    /* mgpu_err_t */
#include "progress.h" /* mgpu_progress_page_t: the launcher's word that a peer is lost */
#include "store.h"    /* mgpu_store_t */

typedef struct mgpu_tcp mgpu_tcp_t;

typedef struct mgpu_tcp_opts {
    mgpu_store_t *store;
    const char *key;        /* store key prefix of this ring, e.g. "mgpu/cpu/0/ring" */
    int member, n;          /* this node, and the number of nodes */
    int ranks_per_member;   /* member m's leader is global rank m * ranks_per_member */
    const char *advertise;  /* address peers connect to; NULL: this host's address on the
                             * route to route_host (the store's host) */
    const char *route_host; /* e.g. MGPU_STORE_ADDR */
    double timeout_s;
    /* The launcher's word that a peer is lost (progress.h; NULL: none): a collective waiting
     * when it turns non-zero, or started after, fails with MGPU_E_PEER and its text. */
    const mgpu_progress_page_t *lost;
} mgpu_tcp_opts_t;

int mgpu_tcp_open(const mgpu_tcp_opts_t *opts, mgpu_tcp_t **out, mgpu_err_t *err);
void mgpu_tcp_close(mgpu_tcp_t *t);

/* what names the collective in messages ("mgpu_allreduce_f32(count=10, sum)"). */
int mgpu_tcp_allreduce_sum_f32(mgpu_tcp_t *t, float *buf, size_t count, const char *what,
                               mgpu_err_t *err);
int mgpu_tcp_broadcast(mgpu_tcp_t *t, void *buf, size_t bytes, int root_member, const char *what,
                       mgpu_err_t *err);
/* buf holds n blocks of block bytes; this member's block is in place at member * block. */
int mgpu_tcp_allgather(mgpu_tcp_t *t, void *buf, size_t block, const char *what, mgpu_err_t *err);
int mgpu_tcp_barrier(mgpu_tcp_t *t, const char *what, mgpu_err_t *err);

#endif
