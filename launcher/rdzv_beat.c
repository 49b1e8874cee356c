/* rdzv_beat.c - heartbeats: every launcher of a job of several nodes keeps a lease on the
 * store, on a connection of its own, so that a lost node is known within heartbeat_timeout
 * however it was lost. See rdzv.h.
 *
 * For each attempt the launcher registers, on that connection, the keys that say "node k is
 * lost" (the attempt's failure record, every node's watch key, node k's end of the attempt, its
 * lost mark and its leave mark) twice: with ON_CLOSE (its launcher died: the kernel closes the
 * connection) and with ON_IDLE (no ping for heartbeat_timeout: a host cut off, a launcher
 * stopped or hung). The store itself then records the loss and wakes every node, even when no
 * other launcher is looking, and the values tell the two apart. A thread pings every
 * heartbeat_timeout / 5 (at most every second); a ping that gets no answer within
 * heartbeat_timeout, or a connection the store closed, means this node lost the store: it gives
 * it up (mgpu_rdzv_give_up), which wakes the supervisor's watcher.
 *
 * Elastic jobs: the same thread sees nodes waiting to join (round/<R>/waiting) while the round
 * has room, and asks for a restart by recording an arrival as the attempt's failure. */
#include <errno.h>  /* ETIMEDOUT */
#include <stdio.h>  /* snprintf */
#include <stdlib.h> /* calloc */
#include <string.h> /* strlen */
#include <time.h>   /* clock_gettime */

#include "log.h"       /* mgpu_warn */
#include "rdzv_impl.h" /* struct mgpu_rdzv */

/* Called with hb_lock held. A no-op when nothing changes. */
static int lease_locked(mgpu_rdzv_t *r, int attempt, mgpu_err_t *err)
{
    int n = r->nnodes + 4, k = 0, rc;
    char **keys, idle[700], closed[700], lost_idle[128], lost_closed[128];
    const char **vi, **vc;
    mgpu_rdzv_failure_t f = {.node_rank = r->node_rank,
                             .rank = MGPU_RDZV_NODE,
                             .local_rank = MGPU_RDZV_NODE,
                             .exit_code = 137};

    if (attempt == r->hb_attempt)
        return 0;
    if (attempt < 0) {
        r->hb_attempt = -1;
        rc = mgpu_store_on_idle(r->hb, 0, NULL, NULL, 0, err);
        if (rc == 0)
            rc = mgpu_store_on_close(r->hb, NULL, NULL, 0, err);
        return rc;
    }
    snprintf(f.host, sizeof f.host, "%s", r->host);
    snprintf(lost_idle, sizeof lost_idle, "lost: heartbeat missed for %g s (heartbeat_timeout)",
             r->o.heartbeat_timeout);
    snprintf(lost_closed, sizeof lost_closed, "lost: its launcher's connection closed");
    snprintf(f.how, sizeof f.how, "%s", lost_idle);
    mgpu_rdzv_failure_text(&f, idle, sizeof idle);
    snprintf(f.how, sizeof f.how, "%s", lost_closed);
    mgpu_rdzv_failure_text(&f, closed, sizeof closed);

    keys = calloc((size_t)n, sizeof *keys);
    vi = calloc((size_t)n, sizeof *vi);
    vc = calloc((size_t)n, sizeof *vc);
    if (keys == NULL || vi == NULL || vc == NULL) {
        free(keys);
        free(vi);
        free(vc);
        return mgpu_err_set(err, -ENOMEM, "out of memory");
    }
    /* The failure record first: a watcher woken by its key reads it at once. */
    if (asprintf(&keys[k], "attempt/%d/failure", attempt) >= 0)
        vi[k] = idle, vc[k] = closed, k++;
    if (asprintf(&keys[k], "attempt/%d/lost/%d", attempt, r->node_rank) >= 0)
        vi[k] = lost_idle + 6, vc[k] = lost_closed + 6, k++;
    if (asprintf(&keys[k], "attempt/%d/end/%d", attempt, r->node_rank) >= 0)
        vi[k] = idle, vc[k] = closed, k++;
    if (asprintf(&keys[k], "left/%d/%d", attempt, r->node_rank) >= 0)
        vi[k] = idle, vc[k] = closed, k++;
    /* Every watcher, this node's own too: a launcher that was stopped and goes on learns that
     * the others gave it up. */
    for (int i = 0; i < r->nnodes; i++)
        if (asprintf(&keys[k], "attempt/%d/watch/%d", attempt, i) >= 0)
            vi[k] = idle, vc[k] = closed, k++;
    rc = mgpu_store_on_close(r->hb, (const char *const *)keys, vc, (size_t)k, err);
    if (rc == 0)
        rc = mgpu_store_on_idle(r->hb, r->o.heartbeat_timeout, (const char *const *)keys, vi,
                                (size_t)k, err);
    if (rc == 0)
        r->hb_attempt = r->attempt = attempt;
    for (int i = 0; i < k; i++)
        free(keys[i]);
    free(keys);
    free(vi);
    free(vc);
    return rc;
}

int mgpu_rdzv_beat_lease(mgpu_rdzv_t *r, int attempt, mgpu_err_t *err)
{
    int rc = 0;
    if (r->hb == NULL || r->lost)
        return 0;
    pthread_mutex_lock(&r->hb_lock);
    rc = lease_locked(r, attempt, err);
    pthread_mutex_unlock(&r->hb_lock);
    return rc;
}

/* Elastic: nodes wait to join while the running round has room: ask every node to restart
 * (an arrival recorded as the attempt's failure, which wakes every watcher). Once per attempt. */
static void admit_waiting(mgpu_rdzv_t *r, int attempt)
{
    char key[96], text[700];
    int64_t waiting = 0;
    mgpu_rdzv_failure_t f = {.node_rank = r->node_rank,
                             .rank = MGPU_RDZV_ARRIVAL,
                             .local_rank = MGPU_RDZV_ARRIVAL,
                             .exit_code = 0};

    snprintf(key, sizeof key, "round/%d/waiting", attempt);
    if (mgpu_store_add(r->hb, key, 0, &waiting, NULL) < 0 || waiting <= 0)
        return;
    snprintf(f.host, sizeof f.host, "%s", r->host);
    snprintf(f.how, sizeof f.how, "%lld node%s waiting to join", (long long)waiting,
             waiting == 1 ? "" : "s");
    mgpu_rdzv_failure_text(&f, text, sizeof text);
    snprintf(key, sizeof key, "attempt/%d/failure", attempt);
    if (mgpu_store_compare_set(r->hb, key, "", 0, text, strlen(text), NULL, NULL, NULL) < 0)
        return;
    for (int i = 0; i < r->nnodes; i++) {
        snprintf(key, sizeof key, "attempt/%d/watch/%d", attempt, i);
        mgpu_store_compare_set(r->hb, key, "", 0, text, strlen(text), NULL, NULL, NULL);
    }
}

static void *beat_main(void *arg)
{
    mgpu_rdzv_t *r = arg;
    double every = r->o.heartbeat_timeout / 5 < 1.0 ? r->o.heartbeat_timeout / 5 : 1.0;
    int admitted = -1;
    char why[600];

    pthread_mutex_lock(&r->hb_lock);
    while (!r->hb_stop) {
        struct timespec until;
        mgpu_err_t err = {0};
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += (time_t)every;
        until.tv_nsec += (long)((every - (double)(time_t)every) * 1e9);
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        while (!r->hb_stop &&
               pthread_cond_timedwait(&r->hb_cond, &r->hb_lock, &until) != ETIMEDOUT) {
        }
        if (r->hb_stop)
            break;
        if (mgpu_store_ping(r->hb, &err) < 0) {
            if (err.code == MGPU_E_TIMEOUT)
                snprintf(why, sizeof why,
                         "this node lost the store at %s (the launcher on %s): no answer for %g s "
                         "(heartbeat_timeout)",
                         r->where, r->store_host, r->o.heartbeat_timeout);
            else
                snprintf(why, sizeof why,
                         "this node lost the store at %s (the launcher on %s): %s (its launcher "
                         "died, or it gave this node up after %g s without a heartbeat)",
                         r->where, r->store_host, err.msg, r->o.heartbeat_timeout);
            r->hb_attempt = -1;
            pthread_mutex_unlock(&r->hb_lock);
            mgpu_rdzv_give_up(r, why);
            return NULL;
        }
        if (r->elastic && r->hb_attempt >= 0 && r->hb_attempt != admitted &&
            r->nnodes < r->o.nnodes_max) {
            int a = r->hb_attempt;
            admit_waiting(r, a);
            char key[96];
            const char *k1[1] = {key};
            int ready = 0;
            snprintf(key, sizeof key, "attempt/%d/failure", a);
            if (mgpu_store_check(r->hb, k1, 1, &ready, NULL) == 0 && ready)
                admitted = a; /* one failure record an attempt: no need to look again */
        }
    }
    pthread_mutex_unlock(&r->hb_lock);
    return NULL;
}

int mgpu_rdzv_beat_start(mgpu_rdzv_t *r, mgpu_err_t *err)
{
    pthread_condattr_t ca;
    int rc;

    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_destroy(&r->hb_cond);
    pthread_cond_init(&r->hb_cond, &ca);
    pthread_condattr_destroy(&ca);
    if ((rc = pthread_create(&r->hb_thread, NULL, beat_main, r)) != 0)
        return mgpu_err_set(err, -rc, "pthread_create(heartbeat): %s", strerror(rc));
    r->hb_started = 1;
    return 0;
}

void mgpu_rdzv_beat_stop(mgpu_rdzv_t *r)
{
    if (r->hb_started) {
        pthread_mutex_lock(&r->hb_lock);
        r->hb_stop = 1;
        pthread_cond_signal(&r->hb_cond);
        pthread_mutex_unlock(&r->hb_lock);
        pthread_join(r->hb_thread, NULL);
        r->hb_started = 0;
    }
    if (r->hb != NULL && !r->lost) {
        /* A normal end is no loss: the leases go before the connection does. */
        mgpu_store_on_idle(r->hb, 0, NULL, NULL, 0, NULL);
        mgpu_store_on_close(r->hb, NULL, NULL, 0, NULL);
    }
    mgpu_store_close(r->hb);
    r->hb = NULL;
}
