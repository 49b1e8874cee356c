/* store_server.h - the key-value store served by mgpu-launch (node 0) on a libuv loop.
 *
 * One event loop, never blocked by a client: responses are buffered and written as the socket
 * accepts them, a GET or WAIT on missing keys parks a waiter that the SET (or ADD, COMPARE_SET)
 * of its last key completes, and a uv_timer ends it at its deadline. Speaks the protocol of
 * common/store_proto.h; the blocking client is common/store.h.
 *
 * A client must authenticate first: HELLO with the right protocol version, then AUTH with a
 * proof that it knows the token (a challenge and response: the token never crosses the wire;
 * store_proto.h), or it gets an error status and is closed. A malformed or oversized frame
 * closes that connection only, with a log line.
 *
 * Unauthenticated connections cannot lock out the job's own clients: they have a budget of
 * their own (max_pending; when it is spent the oldest is closed to make room), a deadline
 * (hello_timeout_ms to complete the handshake), and no buffers beyond a HELLO's size. Only
 * authenticated connections take one of the max_conns slots; an AUTH that finds them all taken
 * is answered ST_BUSY, which the client retries. Lines about refused connections are rate
 * limited (one a second, with a count of those not logged), and so are lines about peers closed
 * for what they sent before authenticating (after a first burst).
 *
 * Signals: the server writes with write(2), which raises SIGPIPE when a client has gone away;
 * the process must ignore SIGPIPE (signal(SIGPIPE, SIG_IGN) in main, as libuv programs do) and
 * restore its default in children before exec, since an ignored disposition is inherited.
 *
 * Ownership: the caller owns the loop; the server owns its handles. mgpu_store_server_close
 * starts closing them and the server frees itself once their close callbacks have run, so the
 * caller runs the loop after close (until uv_run returns) before uv_loop_close. */
#ifndef MGPU_STORE_SERVER_H
#define MGPU_STORE_SERVER_H

#include <stddef.h> /* size_t */
#include <stdint.h> /* int64_t */

#include <uv.h> /* uv_loop_t */

#include "error.h" /* mgpu_err_t */

typedef struct mgpu_store_server mgpu_store_server_t;

typedef struct mgpu_store_server_opts {
    const char *bind_host; /* numeric address or host name; NULL = "127.0.0.1" */
    int port;              /* 0 = any free port (see mgpu_store_server_port) */
    const char *token;     /* NULL or "" = no token required (a warning when not on loopback) */
    int max_conns;         /* authenticated connections; 0 = 4096 */
    int max_pending;       /* connections not authenticated yet; 0 = 1024 */
    size_t max_key;        /* 0 = 4 KiB */
    size_t max_value;      /* 0 = 64 MiB */
    int hello_timeout_ms;  /* a connection not authenticated by then is closed; 0 = 2 s */
} mgpu_store_server_opts_t;

/* Binds, listens and returns the running server in *out. Raises the process's soft limit on
 * descriptors (RLIMIT_NOFILE) towards max_conns when it is lower, as far as the hard limit
 * allows (a warning when that is short); max_pending counts too. Errors name the call, e.g.
 * "bind(127.0.0.1:29500): Address already in use". o may be NULL for all defaults. */
int mgpu_store_server_start(uv_loop_t *loop, const mgpu_store_server_opts_t *o,
                            mgpu_store_server_t **out, mgpu_err_t *err);
/* The port it listens on (the one chosen by the kernel when opts.port was 0). */
int mgpu_store_server_port(const mgpu_store_server_t *s);
/* Open authenticated client connections now. */
int mgpu_store_server_num_conns(const mgpu_store_server_t *s);
/* Writes a fresh random token (32 hex digits from getrandom) and a NUL into buf, for a store
 * reachable from other hosts; size must be at least 33. */
int mgpu_store_server_token_generate(char *buf, size_t size, mgpu_err_t *err);
/* In-process access to the key table, for the process that serves it (a launcher of one node
 * needs no connection to its own store). put and get run only on the thread that runs the
 * loop, or while no thread runs it (before its thread starts, after it stopped): put completes
 * the waits the key was the last missing one of, as a SET would. get copies the value (NUL
 * added, not counted; the caller frees it): -ENOENT when the key has none. num_keys, the count
 * NUM_KEYS answers, may be read from any thread. */
int mgpu_store_server_put(mgpu_store_server_t *s, const void *key, size_t klen, const void *val,
                          size_t vlen);
int mgpu_store_server_get(mgpu_store_server_t *s, const void *key, size_t klen, void **val,
                          size_t *vlen);
int64_t mgpu_store_server_num_keys(const mgpu_store_server_t *s);
/* Closes the listener and every connection (pending waits end without a reply); the server
 * frees itself once their close callbacks have run. NULL is allowed. */
void mgpu_store_server_close(mgpu_store_server_t *s);

#endif
