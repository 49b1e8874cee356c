/* store_thread.c - see store_thread.h. */
#include "store_thread.h"

#include <errno.h>   /* ENOMEM */
#include <pthread.h> /* pthread_create */
#include <signal.h>  /* pthread_sigmask */
#include <stdlib.h>  /* calloc */
#include <string.h>  /* strerror */
#include <uv.h>      /* uv_loop_t */

struct mgpu_store_thread {
    uv_loop_t loop;
    uv_async_t stop;
    mgpu_store_server_t *server;
    pthread_t tid;
};

static void on_stop(uv_async_t *a)
{
    mgpu_store_thread_t *t = a->data;
    mgpu_store_server_close(t->server);
    uv_close((uv_handle_t *)&t->stop, NULL);
}

static void *thread_main(void *arg)
{
    mgpu_store_thread_t *t = arg;
    uv_run(&t->loop, UV_RUN_DEFAULT);
    return NULL;
}

int mgpu_store_thread_start(const mgpu_store_server_opts_t *opts, mgpu_store_thread_t **out,
                            int *port, mgpu_err_t *err)
{
    mgpu_store_thread_t *t = calloc(1, sizeof *t);
    sigset_t all, old;
    int rc;

    *out = NULL;
    if (t == NULL)
        return mgpu_err_set(err, -ENOMEM, "out of memory");
    if ((rc = uv_loop_init(&t->loop)) < 0) {
        free(t);
        return mgpu_err_set(err, rc, "uv_loop_init: %s", uv_strerror(rc));
    }
    /* Bind on this thread, so the caller learns of a taken port at once. */
    rc = mgpu_store_server_start(&t->loop, opts, &t->server, err);
    if (rc < 0) {
        uv_run(&t->loop, UV_RUN_DEFAULT);
        uv_loop_close(&t->loop);
        free(t);
        return rc;
    }
    uv_async_init(&t->loop, &t->stop, on_stop);
    t->stop.data = t;
    *port = mgpu_store_server_port(t->server);
    /* The thread inherits this mask: all signals stay with the supervisor's thread. */
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    rc = pthread_create(&t->tid, NULL, thread_main, t);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        mgpu_store_server_close(t->server);
        uv_close((uv_handle_t *)&t->stop, NULL);
        uv_run(&t->loop, UV_RUN_DEFAULT);
        uv_loop_close(&t->loop);
        free(t);
        return mgpu_err_set(err, -rc, "pthread_create: %s", strerror(rc));
    }
    *out = t;
    return 0;
}

void mgpu_store_thread_stop(mgpu_store_thread_t *t)
{
    if (t == NULL)
        return;
    uv_async_send(&t->stop);
    pthread_join(t->tid, NULL);
    uv_loop_close(&t->loop);
    free(t);
}
