/* rdzv.h - launchers meeting through the store: who is in the job, which global ranks each
 * node owns, and, during the run, failures and restarts agreed by every node.
 *
 * Static mode (torchrun's default): every node is started with --nnodes N --node_rank R
 * --master_addr A --master_port P. Node 0 serves the store at A:P (a thread of its own); every
 * launcher, node 0 included, connects with the blocking client, announces itself
 * (node rank, local workers, host), and waits for all N. Global ranks follow node ranks; nodes
 * may run different numbers of workers. Elastic mode (--nnodes MIN:MAX): every start of the
 * worker group is a round of its own (rdzv_round.c): nodes join in arrival order; once MIN have
 * come the round waits last_call_timeout for more (or until MAX), then closes. A restart after a
 * failure or a lost node is the next round, with the nodes that come; a node that arrives while
 * a round runs waits for the next one and, while the round has fewer than MAX nodes, asks for
 * it (a restart that counts no failure, as torchrun's).
 *
 * Heartbeats (rdzv_beat.c): every launcher keeps a lease on the store (a ping every
 * heartbeat_timeout/5, at most 1 s). A node whose connection closes (its launcher died) or
 * whose lease runs out (a host cut off, a stopped launcher) is lost: the store itself records
 * the failure and wakes every node's watcher. A launcher that cannot reach the store for
 * heartbeat_timeout gives it up as lost.
 *
 * Keys live under "mgpu/<run_id>/" so two jobs sharing a store never mix. Every key of one
 * attempt lives under "mgpu/<run_id>/attempt/<n>/", so a restarted group never reads the last
 * attempt's values.
 *
 * Single node (--nnodes 1): nobody to meet. The store listens on loopback at a free port
 * unless --master_port is given, with a generated token, before mgpu_rdzv_join returns; the
 * keys a static node 0 writes go into its table in place (no connection, no round trip, no
 * failure watch, no heartbeat), and its thread starts with mgpu_rdzv_serve, which the
 * supervisor calls once the workers are forked: a worker that connects sooner waits in the
 * listen backlog, and the launcher forks with no thread but the one that opens the workers'
 * pseudo-terminals (ptys.h), which makes system calls only.
 *
 * Ownership: mgpu_rdzv_join returns a handle that mgpu_rdzv_close frees (stopping the store
 * thread on the node that serves it). Blocking calls below run on the caller's thread; the
 * supervisor runs them on libuv's thread pool so its loop never waits on the network. */
#ifndef MGPU_RDZV_H
#define MGPU_RDZV_H

#include <stddef.h> /* size_t */

#include "error.h" /* mgpu_err_t */

typedef struct mgpu_rdzv mgpu_rdzv_t;

typedef struct mgpu_rdzv_opts {
    const char *run_id; /* --rdzv_id */
    int nnodes_min, nnodes_max;
    int node_rank; /* static mode: --node_rank; ignored in elastic mode */
    int nproc;     /* this node's workers */
    const char *hostname;
    const char *role;         /* --role: ROLE_RANK and ROLE_WORLD_SIZE count within it */
    const char *store_host;   /* where the store is: --master_addr (static) or the endpoint */
    int store_port;           /* 0 on one node: any free port */
    int serve;                /* 1: this launcher serves the store (node 0, or endpoint host) */
    const char *bind_host;    /* where to listen when serving: "127.0.0.1" for one node */
    const char *token;        /* --rdzv_token; NULL: generate one (one node only) */
    int max_conns;            /* when serving: connections expected at most (0: the default) */
    double join_timeout;      /* --rdzv_conf join_timeout (default 600 s) */
    double last_call_timeout; /* --rdzv_conf last_call_timeout (default 30 s) */
    const char *master_addr;  /* MASTER_ADDR the workers get: node 0's address as others see it */
    int master_port;          /* MASTER_PORT the workers get; 0: a free port on that node */
    int elastic;              /* ranks in arrival order (--nnodes MIN:MAX, --rdzv_backend c10d) */
    double heartbeat_timeout; /* --rdzv_conf heartbeat_timeout (default 15 s) */
    int max_restarts;         /* --max_restarts: whether a failed round is followed by another */
} mgpu_rdzv_opts_t;

typedef struct mgpu_rdzv_world {
    int nnodes, node_rank;
    int base_rank; /* global rank of this node's local rank 0 */
    int world_size;
    int role_base_rank;    /* ROLE_RANK of this node's local rank 0 */
    int role_world_size;   /* workers of this node's role, over every node */
    char master_addr[256]; /* MASTER_ADDR for workers */
    int master_port;       /* a free port on the node of global rank 0, agreed via the store */
    char store_addr[256];  /* MGPU_STORE_ADDR for workers of this node */
    int store_port;        /* MGPU_STORE_PORT */
    char token[80];        /* MGPU_STORE_TOKEN */
    int round;             /* the round (attempt) this world is for: 0, then one per restart */
    int restarts;    /* failures restarted from before this round (TORCHELASTIC_RESTART_COUNT) */
    char hosts[512]; /* the nodes' hosts in node rank order, "h0,h1,..." (for reports) */
} mgpu_rdzv_world_t;

/* Serves the store if asked, connects, announces this node, waits for the others. A node
 * that never comes fails after join_timeout with a message naming who is missing. */
int mgpu_rdzv_join(const mgpu_rdzv_opts_t *opts, mgpu_rdzv_t **out, mgpu_rdzv_world_t *world,
                   mgpu_err_t *err);

/* Starts serving the store (one node: see above); nothing on several nodes, whose store
 * serves from mgpu_rdzv_join on. NULL is allowed. */
int mgpu_rdzv_serve(mgpu_rdzv_t *r, mgpu_err_t *err);

/* One node, every worker ended: the store stops answering (its thread is told now and joined
 * by the first call that needs its table, or by mgpu_rdzv_close). Nothing on several nodes,
 * whose store serves the others until mgpu_rdzv_close. NULL is allowed. */
void mgpu_rdzv_quiesce(mgpu_rdzv_t *r);

/* The first failure of an attempt, as every node sees it. rank >= 0: that worker failed;
 * MGPU_RDZV_NODE: the node as a whole (its launcher died, was cut off or stopped, or left by a
 * signal; how says which); MGPU_RDZV_ARRIVAL: nodes wait to join (elastic: a restart that counts
 * no failure). */
#define MGPU_RDZV_NODE (-1)
#define MGPU_RDZV_ARRIVAL (-2)
typedef struct mgpu_rdzv_failure {
    int node_rank, rank, local_rank, exit_code;
    char host[256];
    char how[256]; /* "" for a worker's failure; "lost: heartbeat missed for 15 s", ... */
} mgpu_rdzv_failure_t;

/* Records a failure of attempt n; the first one recorded by any node wins. *first = 1 when
 * this call's failure is that first one. This call and the next three are for several nodes
 * (MGPU_E_USAGE on one). */
int mgpu_rdzv_report_failure(mgpu_rdzv_t *r, int attempt, const mgpu_rdzv_failure_t *f, int *first,
                             mgpu_err_t *err);
/* Blocks until some node records a failure of attempt n (returns 0 with *f filled), or until
 * this node ends the attempt (mgpu_rdzv_end_attempt, from another thread: returns
 * MGPU_E_CLOSED). Uses a connection of its own. */
int mgpu_rdzv_wait_failure(mgpu_rdzv_t *r, int attempt, mgpu_rdzv_failure_t *f, mgpu_err_t *err);
/* The end of attempt n on this node: waits until every node has ended it, then says whether
 * any failed (*failed, *f = the first failure). All nodes then restart together or all finish.
 * No deadline while the others run (they hold their leases; the store ends a lost node's
 * attempt); after_failure seconds once a failure is recorded. MGPU_E_CLOSED after
 * mgpu_rdzv_cancel; MGPU_E_PEER, naming the store, when this node lost it. */
int mgpu_rdzv_end_attempt(mgpu_rdzv_t *r, int attempt, double after_failure, int *failed,
                          mgpu_rdzv_failure_t *f, mgpu_err_t *err);
/* The startup timeline a libmgpu worker of global rank `rank` published in attempt n (key
 * "<run_id>/<attempt>/timeline/<rank>", text "event=seconds;event=seconds..."), into buf.
 * Returns 0, or a negative code when there is none. Does not wait. One node: for after the
 * workers ended; the first call stops the store, whose table is then read in place. */
int mgpu_rdzv_read_timeline(mgpu_rdzv_t *r, const char *run_id, int attempt, int rank, char *buf,
                            size_t len);
/* Elastic: the next round after attempt `attempt` ended (in a failure, a lost node or an
 * arrival): joins it with the nodes that come and fills world. Blocks up to join_timeout;
 * MGPU_E_CLOSED when mgpu_rdzv_cancel was called, MGPU_E_PEER when the job ended without this
 * node. */
int mgpu_rdzv_next_round(mgpu_rdzv_t *r, int attempt, mgpu_rdzv_world_t *world, mgpu_err_t *err);
/* From any thread: a rendezvous in progress gives up (the launcher is stopping). */
void mgpu_rdzv_cancel(mgpu_rdzv_t *r);
/* Elastic: this node leaves for good (no restart left, or it was stopped): nodes waiting for a
 * next round hear that the job is over. */
void mgpu_rdzv_leave(mgpu_rdzv_t *r, const char *why);
/* The global ranks of node `node` in the current world ("ranks 2-3", "rank 4"), for messages. */
void mgpu_rdzv_node_ranks(const mgpu_rdzv_t *r, int node, char *buf, size_t len);
/* Why this launcher gave the store up, "" while it has not. */
const char *mgpu_rdzv_lost_why(const mgpu_rdzv_t *r);
/* How many keys the store holds now, of every prefix: taken before the workers start and
 * after they end, it says whether any of them wrote one (a worker that deletes as many keys
 * as it writes aside), so that the timelines need not be asked for one by one when none did.
 * Returns 0, or a negative code. Does not wait. */
int mgpu_rdzv_num_keys(mgpu_rdzv_t *r, long long *n);
void mgpu_rdzv_close(mgpu_rdzv_t *r);

#endif
