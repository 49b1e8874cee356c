/* store_thread.h - the launcher's store server on a thread and loop of its own.
 *
 * Why a thread: the launcher meets the other nodes through the store with the same blocking
 * client every other node uses, before its own supervision loop runs; and the store must keep
 * answering while the supervisor is busy (or blocked writing worker output to a slow
 * terminal). The thread blocks every signal, so signals reach the supervisor's loop only.
 *
 * Ownership: mgpu_store_thread_start returns a handle that mgpu_store_thread_stop joins and
 * frees. Nothing else is shared between the threads. */
#ifndef MGPU_STORE_THREAD_H
#define MGPU_STORE_THREAD_H

#include "error.h"        /* mgpu_err_t */
#include "store_server.h" /* mgpu_store_server_opts_t */

typedef struct mgpu_store_thread mgpu_store_thread_t;

/* Binds and listens before returning (a bind error comes back here, named); *port receives
 * the port it listens on. */
int mgpu_store_thread_start(const mgpu_store_server_opts_t *opts, mgpu_store_thread_t **out,
                            int *port, mgpu_err_t *err);
/* Closes the server, joins the thread, frees the handle. NULL is allowed. */
void mgpu_store_thread_stop(mgpu_store_thread_t *t);

#endif
