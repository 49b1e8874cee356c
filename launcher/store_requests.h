/* store_requests.h - the store server's insides, shared by its two halves: store_server.c
 * (the listener and connections: accept, read, write, close) and store_requests.c (the key
 * table, parked waits and the request handlers). Nothing outside those two files includes it;
 * the store's interface is store_server.h.
 *
 * Ownership: the server owns the table, every connection and every waiter. A waiter belongs
 * to its connection's list and to its keys' entries until mgpu_store_requests_waiter_free. */
#ifndef MGPU_STORE_REQUESTS_H
#define MGPU_STORE_REQUESTS_H

#include <stddef.h> /* size_t */
#include <stdint.h> /* uint8_t */

#include <uv.h> /* uv_tcp_t, uv_timer_t */

#include "store_proto.h"  /* mgpu_store_dec_t, mgpu_store_frame_t */
#include "store_server.h" /* mgpu_store_server_t */

typedef struct entry entry_t;
typedef struct waiter waiter_t;
typedef struct conn conn_t;

/* One key a waiter still waits for, linked into that key's entry. */
typedef struct wnode {
    struct wnode *prev, *next;
    waiter_t *w;
    entry_t *e; /* NULL once the key was set (the node is unlinked) */
} wnode_t;

/* A key. An entry exists while the key has a value or someone waits for it. */
struct entry {
    entry_t *next; /* hash chain */
    uint32_t hash;
    uint32_t klen;
    uint8_t *val;
    size_t vlen;
    int has_value;
    wnode_t *waiters;
    uint8_t key[];
};

/* A GET or WAIT parked until its missing keys are set or its timer fires. */
struct waiter {
    waiter_t *prev, *next; /* in the connection's list */
    conn_t *c;
    mgpu_store_server_t *srv;
    uint32_t id;
    uint8_t op;
    uint32_t timeout_ms;
    uint32_t missing; /* keys not set yet */
    uint32_t nkeys;   /* keys asked for (for the timeout message) */
    int has_timer;
    uv_timer_t timer;
    uint32_t nnodes;
    wnode_t nodes[];
};

struct conn {
    uv_tcp_t tcp; /* first: the handle's address is the connection's */
    mgpu_store_server_t *srv;
    conn_t *prev, *next; /* in the server's pending list until authed, then in conns */
    mgpu_store_dec_t dec;
    mgpu_store_buf_t out;  /* responses not yet handed to the socket */
    mgpu_store_buf_t wbuf; /* the bytes of the uv_write in flight */
    uv_write_t wreq;
    uv_shutdown_t sreq;
    int writing;          /* wreq in flight */
    int reading;          /* uv_read_start in effect */
    int hello;            /* HELLO answered: nonces below are set, AUTH expected */
    int authed;           /* AUTH accepted */
    int draining;         /* answer what is queued, then shut down and close */
    int shutdown;         /* sreq in flight */
    int closing;          /* uv_close called */
    int counted;          /* counts towards max_conns (authenticated) */
    uint64_t accepted_ms; /* uv_now at accept: a peer has hello_timeout_ms to authenticate */
    uint8_t cnonce[MGPU_STORE_NONCE_LEN], snonce[MGPU_STORE_NONCE_LEN];
    waiter_t *waiters;
    uint8_t *on_close; /* ON_CLOSE's encoded key/value list, set when this one closes */
    uint32_t on_close_len, on_close_n;
    uint8_t *on_idle; /* ON_IDLE's list, set when idle_ms pass without a frame (then closed) */
    uint32_t on_idle_len, on_idle_n;
    uint64_t idle_ms; /* ON_IDLE's timeout, 0 = none */
    uint64_t rx_ms;   /* uv_now when bytes last came from the peer */
    char peer[64];
};

/* A log line budget: at most burst lines at once, refilled at one line a second; what is
 * not logged is counted and said with the next line (or by the sweep). */
typedef struct loglimit {
    double tokens;
    double burst;
    uint64_t last_ms;
    unsigned long suppressed;
    const char *what; /* "refused", "bad": named in the line that gives the count */
} loglimit_t;

struct mgpu_store_server {
    uv_loop_t *loop;
    uv_tcp_t listener;
    uv_timer_t sweep; /* closes connections that did not authenticate in time */
    uint64_t hello_timeout_ms;
    int port;
    uint8_t *token;
    size_t token_len;
    int max_conns;
    mgpu_store_limits_t lim;
    conn_t *conns; /* authenticated connections */
    int nconns;
    /* Connections not authenticated yet, oldest first: a budget of their own (max_pending),
     * so that a flood of them never takes an authenticated client's slot; when it is spent,
     * the oldest is closed to make room, and each has hello_timeout_ms to authenticate. */
    conn_t *pending, *pending_tail;
    int npending;
    int max_pending;
    loglimit_t log_refused; /* connections refused for lack of room or time */
    loglimit_t log_bad;     /* unauthenticated peers closed for what they sent */
    int handles;            /* handles whose close callback has not run yet */
    int closing;
    entry_t **buckets;
    size_t nbuckets; /* a power of two */
    size_t nentries;
    int64_t nkeys; /* entries with a value */
};

/* ---- requests (store_requests.c) ---- */

/* Answers one decoded frame of c (HELLO first, then any request). */
void mgpu_store_requests_handle(conn_t *c, const mgpu_store_frame_t *f);
/* The keys c registered with ON_CLOSE, set where they have no value (c is closing). */
void mgpu_store_requests_on_close(conn_t *c);
/* The keys c registered with ON_IDLE, set where they have no value (c was silent too long). */
void mgpu_store_requests_on_idle(conn_t *c);
/* Unlinks the waiter from its keys and its connection and frees it (after its timer closed). */
void mgpu_store_requests_waiter_free(waiter_t *w);
/* Frees every entry (the server is going away). */
void mgpu_store_requests_table_free(mgpu_store_server_t *s);

/* ---- connections (store_server.c) ---- */

/* A handle of the server finished closing; the last one frees the server once it closes. */
void mgpu_store_server_handle_closed(mgpu_store_server_t *s);
/* Closes at once: queued responses are dropped and parked waits end unanswered. */
void mgpu_store_server_conn_close(conn_t *c);
/* Hands queued responses to the socket (one write in flight at a time). */
void mgpu_store_server_conn_flush(conn_t *c);
/* Ends a response frame begun at start; a connection whose response cannot be built is
 * closed. */
void mgpu_store_server_resp_end(conn_t *c, size_t start);
/* A non-OK response: status + message. */
void mgpu_store_server_resp_status(conn_t *c, uint8_t op, uint32_t id, uint8_t status,
                                   const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* Closes a connection for lack of room or time (no slot left, its deadline passed), with an
 * error frame written only if the socket takes it at once, and a rate-limited log line. */
void mgpu_store_server_conn_refuse(conn_t *c, uint32_t id, uint8_t status, const char *why);
/* c authenticated: it leaves the pending list for the authenticated ones. */
void mgpu_store_server_conn_authed(conn_t *c);
/* Answers with an error and closes once it is written; reading stops at once. Logged (rate
 * limited when c is not authenticated). */
void mgpu_store_server_conn_fail(conn_t *c, uint8_t op, uint32_t id, uint8_t status,
                                 const char *why);

#endif
