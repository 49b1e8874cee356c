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
    uv_async_t halt; /* from the caller's thread: the loop returns */
    mgpu_store_server_t *server;
    pthread_t tid;
    int running; /* tid runs the loop */
    int halting; /* it was told to stop */
};

static void on_halt(uv_async_t *a)
{
    uv_stop(a->loop);
}

static void *thread_main(void *arg)
{
    mgpu_store_thread_t *t = arg;
    uv_run(&t->loop, UV_RUN_DEFAULT);
    return NULL;
}

int mgpu_store_thread_open(const mgpu_store_server_opts_t *opts, mgpu_store_thread_t **out,
                           int *port, mgpu_err_t *err)
{
    mgpu_store_thread_t *t = calloc(1, sizeof *t);
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
    uv_async_init(&t->loop, &t->halt, on_halt);
    *port = mgpu_store_server_port(t->server);
    *out = t;
    return 0;
}

int mgpu_store_thread_run(mgpu_store_thread_t *t, mgpu_err_t *err)
{
    sigset_t all, old;
    int rc;

    if (t->running)
        return 0;
    /* The thread inherits this mask: all signals stay with the supervisor's thread. */
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    rc = pthread_create(&t->tid, NULL, thread_main, t);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0)
        return mgpu_err_set(err, -rc, "pthread_create: %s", strerror(rc));
    t->running = 1;
    t->halting = 0;
    return 0;
}

int mgpu_store_thread_start(const mgpu_store_server_opts_t *opts, mgpu_store_thread_t **out,
                            int *port, mgpu_err_t *err)
{
    int rc = mgpu_store_thread_open(opts, out, port, err);
    if (rc == 0 && (rc = mgpu_store_thread_run(*out, err)) < 0) {
        mgpu_store_thread_stop(*out);
        *out = NULL;
    }
    return rc;
}

int mgpu_store_thread_put(mgpu_store_thread_t *t, const char *key, const void *val, size_t vlen)
{
    return t->running ? -EBUSY : mgpu_store_server_put(t->server, key, strlen(key), val, vlen);
}

int mgpu_store_thread_get(mgpu_store_thread_t *t, const char *key, void **val, size_t *vlen)
{
    *val = NULL;
    *vlen = 0;
    return t->running ? -EBUSY : mgpu_store_server_get(t->server, key, strlen(key), val, vlen);
}

long long mgpu_store_thread_num_keys(const mgpu_store_thread_t *t)
{
    return (long long)mgpu_store_server_num_keys(t->server);
}

void mgpu_store_thread_halt_begin(mgpu_store_thread_t *t)
{
    if (t == NULL || !t->running || t->halting)
        return;
    uv_async_send(&t->halt);
    t->halting = 1;
}

void mgpu_store_thread_halt(mgpu_store_thread_t *t)
{
    if (t == NULL || !t->running)
        return;
    mgpu_store_thread_halt_begin(t);
    pthread_join(t->tid, NULL);
    t->running = 0;
}

void mgpu_store_thread_stop(mgpu_store_thread_t *t)
{
    if (t == NULL)
        return;
    mgpu_store_thread_halt(t);
    /* The loop is this thread's now: its handles close here. */
    mgpu_store_server_close(t->server);
    uv_close((uv_handle_t *)&t->halt, NULL);
    uv_run(&t->loop, UV_RUN_DEFAULT);
    uv_loop_close(&t->loop);
    free(t);
}
