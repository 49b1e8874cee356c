/* ptys.c - an attempt's pseudo-terminals, opened on a thread of their own (see ptys.h). */
#include "ptys.h"

#include <signal.h> /* sigfillset, pthread_sigmask */
#include <stdlib.h> /* calloc, free */
#include <unistd.h> /* close */

#include "log.h"     /* mgpu_debug */
#include "spawner.h" /* mgpu_spawner_pty_open */

void mgpu_ptys_init(mgpu_ptys_t *p)
{
    p->pair = NULL;
    p->n = p->ready = p->threaded = 0;
}

mgpu_pty_pair_t *mgpu_ptys_ask(mgpu_ptys_t *p, int n)
{
    mgpu_ptys_init(p);
    if (n <= 0 || (p->pair = calloc((size_t)n, sizeof *p->pair)) == NULL)
        return NULL;
    p->n = n;
    for (int i = 0; i < n; i++)
        p->pair[i].master = p->pair[i].slave = -1;
    return p->pair;
}

static void open_pair(mgpu_pty_pair_t *q)
{
    q->err = mgpu_spawner_pty_open(&q->master, &q->slave, q->has_ws ? &q->ws : NULL, &q->call);
}

/* System calls only, besides the mutex (ptys.h). */
static void *opener(void *arg)
{
    mgpu_ptys_t *p = arg;

    for (int i = 0; i < p->n; i++) {
        open_pair(&p->pair[i]);
        pthread_mutex_lock(&p->mu);
        p->ready = i + 1;
        pthread_cond_signal(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    return NULL;
}

void mgpu_ptys_go(mgpu_ptys_t *p)
{
    pthread_attr_t attr;
    sigset_t all, old;
    int e;

    if (p->n < MGPU_PTYS_THREAD_MIN)
        return;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024); /* a few calls deep: no 8 MiB to map */
    /* Born with every signal blocked: the launcher's handlers run on its own thread. */
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    e = pthread_create(&p->thread, &attr, opener, p);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (e == 0) {
        p->threaded = 1;
        return;
    }
    mgpu_debug("pthread_create (pseudo-terminals): error %d; opened one by one", e);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
}

int mgpu_ptys_take(mgpu_ptys_t *p, int i, int *master, int *slave, const char **call)
{
    mgpu_pty_pair_t *q = &p->pair[i];

    if (p->threaded) {
        pthread_mutex_lock(&p->mu);
        while (p->ready <= i)
            pthread_cond_wait(&p->cv, &p->mu);
        pthread_mutex_unlock(&p->mu);
    } else if (q->err == 0 && q->master < 0) {
        open_pair(q);
    }
    *call = q->call;
    *master = q->master;
    *slave = q->slave;
    q->master = q->slave = -1;
    return q->err;
}

void mgpu_ptys_end(mgpu_ptys_t *p)
{
    if (p->threaded) {
        pthread_join(p->thread, NULL);
        pthread_cond_destroy(&p->cv);
        pthread_mutex_destroy(&p->mu);
    }
    for (int i = 0; i < p->n; i++) {
        if (p->pair[i].master >= 0)
            close(p->pair[i].master);
        if (p->pair[i].slave >= 0)
            close(p->pair[i].slave);
    }
    free(p->pair);
    mgpu_ptys_init(p);
}
