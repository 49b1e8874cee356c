/* store.h - the blocking client of mgpu's key-value store (served by mgpu-launch on node 0).
 *
 * Used by launchers of other nodes and by every worker (libmgpu). One mgpu_store_t is one TCP
 * connection; it is not thread-safe (one caller at a time). Keys are strings (<= 4 KiB by
 * default), values are bytes (<= 64 MiB by default). Every key passes through the client's
 * prefix (mgpu_store_set_prefix), which namespaces them by run id and restart attempt so a
 * restarted group never reads the last attempt's values.
 *
 * Ownership: values returned through void ** are malloc'd and owned by the caller (free());
 * one NUL byte follows them (not counted in the length) so string values can be used as is.
 * Every call returns 0 or a negative code and fills err. A call that times out returns
 * MGPU_E_TIMEOUT; a wrong token MGPU_E_AUTH; ADD on a value that is not a decimal int64 -EINVAL.
 * A connection that breaks is reconnected transparently: always before a request is sent, and
 * once more after, for operations whose repetition cannot change the outcome (set, get, wait,
 * check, num_keys, ping). add, compare_set and delete return MGPU_E_PEER instead, since the
 * server may have applied them.
 *
 * Timeouts: timeout_s of connect (<= 0: 30 s) bounds the connection attempts, retried with
 * exponential backoff (10 ms doubling to 1 s) while the server cannot be reached or is busy (no
 * slot free, or our connection pushed out by a flood of others); a server that refuses the
 * token or the protocol version, or cannot prove it knows the token, is not retried. It also
 * bounds, afterwards, every call that does not wait for keys and each reconnection. The
 * timeout_s of get, wait and barrier bounds their wait (0 = do not wait, < 0 = no deadline).
 * The protocol is documented in store_proto.h. */
#ifndef MGPU_STORE_H
#define MGPU_STORE_H

#include <stddef.h> /* size_t */
#include <stdint.h> /* int64_t */

#include "error.h" /* mgpu_err_t */

typedef struct mgpu_store mgpu_store_t;

/* Environment given to workers by mgpu-launch. */
#define MGPU_ENV_STORE_ADDR "MGPU_STORE_ADDR"   /* host the store listens on */
#define MGPU_ENV_STORE_PORT "MGPU_STORE_PORT"   /* its port */
#define MGPU_ENV_STORE_TOKEN "MGPU_STORE_TOKEN" /* shared secret for the handshake ("" = none) */

/* Connects (retrying with backoff until timeout_s) and performs the handshake, which proves
 * knowledge of the token both ways without sending it (store_proto.h). token may be NULL or ""
 * when the server requires none. */
int mgpu_store_connect(const char *host, int port, const char *token, double timeout_s,
                       mgpu_store_t **out, mgpu_err_t *err);
/* From MGPU_STORE_ADDR/PORT/TOKEN; the prefix becomes "<TORCHELASTIC_RUN_ID>/<attempt>/". */
int mgpu_store_connect_env(double timeout_s, mgpu_store_t **out, mgpu_err_t *err);
void mgpu_store_close(mgpu_store_t *s);

/* The prefix added to every key (copied). "" for none. */
void mgpu_store_set_prefix(mgpu_store_t *s, const char *prefix);

int mgpu_store_set(mgpu_store_t *s, const char *key, const void *val, size_t len, mgpu_err_t *err);
/* Waits up to timeout_s for the key to exist, then returns its value. */
int mgpu_store_get(mgpu_store_t *s, const char *key, double timeout_s, void **val, size_t *len,
                   mgpu_err_t *err);
/* Atomic: the key holds a decimal int64 (missing = 0); adds delta; *result = the new value. */
int mgpu_store_add(mgpu_store_t *s, const char *key, int64_t delta, int64_t *result,
                   mgpu_err_t *err);
/* Atomic: if the current value equals expected (a missing key equals an empty expected), set
 * desired. *current (may be NULL) receives the value after the operation. */
int mgpu_store_compare_set(mgpu_store_t *s, const char *key, const void *expected, size_t elen,
                           const void *desired, size_t dlen, void **current, size_t *clen,
                           mgpu_err_t *err);
/* Waits until all n keys exist. */
int mgpu_store_wait(mgpu_store_t *s, const char *const *keys, size_t n, double timeout_s,
                    mgpu_err_t *err);
/* *ready = 1 when all n keys exist now. */
int mgpu_store_check(mgpu_store_t *s, const char *const *keys, size_t n, int *ready,
                     mgpu_err_t *err);
/* *deleted = 1 when the key existed. */
int mgpu_store_delete(mgpu_store_t *s, const char *key, int *deleted, mgpu_err_t *err);
int mgpu_store_num_keys(mgpu_store_t *s, int64_t *n, mgpu_err_t *err);
/* One round trip that changes nothing (liveness, latency). */
int mgpu_store_ping(mgpu_store_t *s, mgpu_err_t *err);
/* on = 0: a connection that breaks is not replaced, and every later call fails at once with
 * MGPU_E_CLOSED. For a connection whose loss is the news (a watch on a peer that serves the
 * store): reconnecting would hide it. */
void mgpu_store_set_reconnect(mgpu_store_t *s, int on);

/* The I/O timeout of calls that do not wait for keys, and of reconnecting, from now on (the
 * connect's timeout_s until then): once a peer has been reached, a store gone for this long is
 * gone. */
void mgpu_store_set_io_timeout(mgpu_store_t *s, double timeout_s);

/* When this connection closes for any reason but the server's shutdown (the caller died, say),
 * the server sets keys[i] = vals[i] for every key that has no value then (keys get the prefix,
 * values do not). A new call replaces the last; n = 0 clears it. Not retried on a new
 * connection: a broken connection has fired it already. */
int mgpu_store_on_close(mgpu_store_t *s, const char *const *keys, const char *const *vals, size_t n,
                        mgpu_err_t *err);
/* ON_CLOSE's counterpart for a silent peer: when the server has had no request from this
 * connection for timeout_s, it sets keys[i] = vals[i] where they have no value, then closes the
 * connection (which fires ON_CLOSE's keys still missing). Any call keeps the lease (ping). n = 0
 * clears it. */
int mgpu_store_on_idle(mgpu_store_t *s, double timeout_s, const char *const *keys,
                       const char *const *vals, size_t n, mgpu_err_t *err);
/* From another thread: the call blocked on this connection returns MGPU_E_CLOSED at once, and so
 * does every later one (no reconnection). For a store given up as lost. */
void mgpu_store_interrupt(mgpu_store_t *s);
/* All world_size callers using the same name meet here (reusable: each use of a name is a new
 * round; a name keeps its world_size). On timeout the message says how many arrived. */
int mgpu_store_barrier(mgpu_store_t *s, const char *name, int world_size, double timeout_s,
                       mgpu_err_t *err);

#endif
