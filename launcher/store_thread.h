/* store_thread.h - the launcher's store server on a thread and loop of its own.
 *
 * Why a thread: the launcher meets the other nodes through the store with the same blocking
 * client every other node uses, before its own supervision loop runs; and the store must keep
 * answering while the supervisor is busy (or blocked writing worker output to a slow
 * terminal). The thread blocks every signal, so signals reach the supervisor's loop only.
 *
 * In two steps when the caller has keys to write first (a launcher of one node, which needs
 * no connection to its own store): mgpu_store_thread_open binds and listens, and clients that
 * connect then wait in the listen backlog; the caller writes its keys into the table in place
 * (mgpu_store_thread_put) and starts the thread when it likes (mgpu_store_thread_run), e.g.
 * once its workers are forked. mgpu_store_thread_start does both at once.
 *
 * Ownership: mgpu_store_thread_open (or _start) returns a handle that mgpu_store_thread_stop
 * joins and frees. Nothing else is shared between the threads: the table is the loop thread's
 * while it runs, the caller's before and after (mgpu_store_thread_halt). */
#ifndef MGPU_STORE_THREAD_H
#define MGPU_STORE_THREAD_H

#include <stddef.h> /* size_t */

#include "error.h"        /* mgpu_err_t */
#include "store_server.h" /* mgpu_store_server_opts_t */

typedef struct mgpu_store_thread mgpu_store_thread_t;

/* Binds and listens before returning (a bind error comes back here, named); *port receives
 * the port it listens on. No thread runs yet: nothing is answered before mgpu_store_thread_run. */
int mgpu_store_thread_open(const mgpu_store_server_opts_t *opts, mgpu_store_thread_t **out,
                           int *port, mgpu_err_t *err);
/* Starts the thread that serves the store; nothing when it runs already. */
int mgpu_store_thread_run(mgpu_store_thread_t *t, mgpu_err_t *err);
/* open, then run; on failure nothing is left. */
int mgpu_store_thread_start(const mgpu_store_server_opts_t *opts, mgpu_store_thread_t **out,
                            int *port, mgpu_err_t *err);
/* The key table in place (store_server.h), while no thread serves it: before
 * mgpu_store_thread_run or after mgpu_store_thread_halt. */
int mgpu_store_thread_put(mgpu_store_thread_t *t, const char *key, const void *val, size_t vlen);
int mgpu_store_thread_get(mgpu_store_thread_t *t, const char *key, void **val, size_t *vlen);
/* The keys that hold a value, from any thread. */
long long mgpu_store_thread_num_keys(const mgpu_store_thread_t *t);
/* Stops serving (clients are left unanswered until mgpu_store_thread_stop closes them) and
 * joins the thread: the table is the caller's again. Nothing when no thread runs. _begin only
 * tells the thread, without waiting: its end then overlaps the caller's work until halt. */
void mgpu_store_thread_halt_begin(mgpu_store_thread_t *t);
void mgpu_store_thread_halt(mgpu_store_thread_t *t);
/* Closes the server, joins the thread, frees the handle. NULL is allowed. */
void mgpu_store_thread_stop(mgpu_store_thread_t *t);

#endif
