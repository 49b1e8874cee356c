/* rdzv_impl.h - the rendezvous's state, shared by rdzv.c (joining, failures, attempt ends),
 * rdzv_round.c (elastic rounds) and rdzv_beat.c (heartbeats). Private to those files.
 *
 * Connections to the store, one per use, since a blocking client serves one call at a time
 * (none on one node: the launcher writes and reads its own store's table in place):
 *   client: the rendezvous, failure reports, attempt ends (under lock);
 *   watch:  blocked in mgpu_rdzv_wait_failure;
 *   hb:     the heartbeat thread's pings, and the leases that name this node lost (hb_lock). */
#ifndef MGPU_RDZV_IMPL_H
#define MGPU_RDZV_IMPL_H

#include <pthread.h> /* pthread_mutex_t */

#include "rdzv.h"
#include "store.h"        /* mgpu_store_t */
#include "store_thread.h" /* mgpu_store_thread_t */

/* One node of the current world, in node rank order. */
typedef struct rdzv_node {
    int nproc;
    int base; /* global rank of its local rank 0 */
    char host[256];
} rdzv_node_t;

struct mgpu_rdzv {
    mgpu_store_thread_t *server; /* this node serves the store */
    int local;                   /* one node: no connection, its keys written in place */
    mgpu_store_t *client;        /* rendezvous, failures, attempt ends: under lock */
    pthread_mutex_t lock;        /* report and end may run on two pool threads at once */
    mgpu_store_t *watch;         /* blocked in mgpu_rdzv_wait_failure */
    int nnodes, node_rank;
    int joined;        /* every node met: leaving is agreed too (mgpu_rdzv_close) */
    char host[256];    /* this node's name, for the others' reports */
    volatile int lost; /* the store went away: no call may wait on it again */
    char where[300];   /* "host:port" for messages */
    char prefix[300];  /* "mgpu/<run_id>/" */
    /* the options, with their strings copied (the rounds after the first need them) */
    mgpu_rdzv_opts_t o;
    char run_id[128], role[128], master_addr[256], store_host[256];
    char token[80]; /* MGPU_STORE_TOKEN of every world */
    int store_port;
    int elastic;
    int round;           /* the round of the current world (0 when static) */
    int restarts;        /* restart count of the current world */
    rdzv_node_t *nodes;  /* nnodes of them */
    volatile int cancel; /* mgpu_rdzv_cancel */
    /* heartbeats (rdzv_beat.c) */
    mgpu_store_t *hb;
    pthread_mutex_t hb_lock;
    pthread_cond_t hb_cond;
    pthread_t hb_thread;
    int hb_started, hb_stop;
    int hb_attempt; /* the attempt whose leases are registered, -1 none (under hb_lock) */
    int attempt;    /* the last attempt this node watched (its leave mark is left/<attempt>/<k>) */
    char lost_why[512];
};

/* rdzv.c: a node's announcement "nproc host pid [prev] role" into n (fields is 3 or 4). */
int mgpu_rdzv_parse_node(const char *val, size_t len, int fields, rdzv_node_t *n, int *prev,
                         const char *role, int *same_role);
/* rdzv.c: fills the world's ranks from r->nodes and the announcements' roles (vals[i], lens[i])
 * then MASTER_ADDR/PORT from key "<master_key>" (node 0 sets it). */
int mgpu_rdzv_world_fill(mgpu_rdzv_t *r, char **vals, size_t *lens, int fields,
                         const char *master_key, mgpu_rdzv_world_t *w, mgpu_err_t *err);
/* rdzv.c: "a b c d host how" of a failure, and back. */
void mgpu_rdzv_failure_text(const mgpu_rdzv_failure_t *f, char *buf, size_t len);
int mgpu_rdzv_failure_parse(const char *v, size_t len, mgpu_rdzv_failure_t *f);
/* rdzv.c: gives the store up: every blocked call returns, no new one waits. */
void mgpu_rdzv_give_up(mgpu_rdzv_t *r, const char *why);

/* rdzv_round.c: joins elastic round `round` (and later ones if this node came too late),
 * setting r->round, r->restarts, r->nnodes, r->node_rank, r->nodes and world. */
int mgpu_rdzv_join_rounds(mgpu_rdzv_t *r, int round, mgpu_rdzv_world_t *w, mgpu_err_t *err);

/* rdzv_round.c: the serving node, leaving: nodes that wait for a next round read "over" before
 * the store goes (at most timeout s). */
void mgpu_rdzv_wait_over_seen(mgpu_rdzv_t *r, double timeout);

/* rdzv_beat.c: the heartbeat thread (after the first rendezvous), its leases for an attempt,
 * and its end. */
int mgpu_rdzv_beat_start(mgpu_rdzv_t *r, mgpu_err_t *err);
int mgpu_rdzv_beat_lease(mgpu_rdzv_t *r, int attempt, mgpu_err_t *err);
void mgpu_rdzv_beat_stop(mgpu_rdzv_t *r);

#endif
