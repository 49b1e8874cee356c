/* rdzv_round.c - elastic rounds (--nnodes MIN:MAX, --rdzv_backend c10d): every start of the
 * worker group is a round, numbered as the attempt it starts. See rdzv.h.
 *
 * Keys, under "mgpu/<run_id>/":
 *   round/<R>/arrivals  ADD counter: a node's slot in the round is the value it got, less 1
 *   round/<R>/node/<s>  the announcement of slot s: "nproc host pid prev role"
 *   round/<R>/closed    "n restarts": slots below n are the round's nodes; set once, by the
 *                       first node that sees the round complete (COMPARE_SET), so every node
 *                       reads the same verdict whoever decided it
 *   round/<R>/waiting   ADD counter: nodes that came after R closed and wait for R + 1 (the
 *                       heartbeat thread of R's nodes asks for a restart while R has room)
 *   round/<R>/master    "port addr" of MASTER_ADDR/MASTER_PORT, set by R's node 0
 *   over                the job ended: nodes waiting for a round go home
 *
 * A round closes when MAX nodes came; or, once MIN are there, when every node expected came
 * (the previous round's nodes that were not lost, and those that waited for this one), or
 * last_call_timeout after MIN were first seen (torchrun's last call, for nodes nobody knows of
 * yet). Every node of the round polls the same keys and may close it, so no single node's death
 * can leave the others waiting. Node ranks keep the previous round's order (new nodes after
 * it, in arrival order), so the node that was 0 stays 0 while it lives. */
#include <errno.h>  /* ENOMEM */
#include <stdio.h>  /* snprintf */
#include <stdlib.h> /* calloc, qsort */
#include <string.h> /* strlen */
#include <time.h>   /* nanosleep */
#include <unistd.h> /* getpid */

#include "clock.h"     /* mgpu_clock_mono */
#include "log.h"       /* mgpu_warn */
#include "rdzv_impl.h" /* struct mgpu_rdzv */

#define POLL_S 0.05       /* a round's keys are read this often while it is open */
#define NOTICE_AFTER_S 10 /* a round still short of MIN says so once, after this long */

static void pause_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static int key_exists(mgpu_rdzv_t *r, const char *key, mgpu_err_t *err)
{
    const char *k1[1] = {key};
    int ready = 0, rc = mgpu_store_check(r->client, k1, 1, &ready, err);
    return rc < 0 ? rc : ready;
}

/* A key's value as a string (at most len - 1 bytes); 0 or a negative code. */
static int get_str(mgpu_rdzv_t *r, const char *key, char *buf, size_t len, mgpu_err_t *err)
{
    void *v = NULL;
    size_t n = 0;
    int rc = mgpu_store_get(r->client, key, r->o.join_timeout, &v, &n, err);
    if (rc == 0)
        snprintf(buf, len, "%.*s", (int)(n < len ? n : len - 1), (char *)v);
    free(v);
    return rc;
}

/* The nodes round R expects, R > 0: those of R - 1 that were not lost, and those that waited. */
static int expected_nodes(mgpu_rdzv_t *r, int round)
{
    char key[96], val[64];
    int n = 0, expected = 0;
    int64_t waiting = 0;

    snprintf(key, sizeof key, "round/%d/closed", round - 1);
    if (get_str(r, key, val, sizeof val, NULL) < 0)
        return 0;
    n = atoi(val);
    for (int k = 0; k < n; k++) {
        snprintf(key, sizeof key, "attempt/%d/lost/%d", round - 1, k);
        expected += key_exists(r, key, NULL) == 0;
    }
    snprintf(key, sizeof key, "round/%d/waiting", round - 1);
    if (mgpu_store_add(r->client, key, 0, &waiting, NULL) == 0)
        expected += (int)waiting;
    return expected;
}

/* The restart count of round R: R - 1's, plus one unless R - 1 ended for an arrival. */
static int restarts_of(mgpu_rdzv_t *r, int round)
{
    char key[96], val[700];
    mgpu_rdzv_failure_t f;
    int prev = 0;

    if (round == 0)
        return 0;
    snprintf(key, sizeof key, "round/%d/closed", round - 1);
    if (get_str(r, key, val, sizeof val, NULL) == 0) {
        char *sp = strchr(val, ' ');
        prev = sp ? atoi(sp + 1) : 0;
    }
    snprintf(key, sizeof key, "attempt/%d/failure", round - 1);
    if (key_exists(r, key, NULL) > 0 && get_str(r, key, val, sizeof val, NULL) == 0 &&
        mgpu_rdzv_failure_parse(val, strlen(val), &f) == 0 && f.rank == MGPU_RDZV_ARRIVAL)
        return prev;
    return prev + 1;
}

/* Joins round R: *slot is this node's slot, *n the round's size once closed (this node is in
 * it when *slot < *n). */
static int join_one(mgpu_rdzv_t *r, int round, int prev, int *slot, int *n, mgpu_err_t *err)
{
    const mgpu_rdzv_opts_t *o = &r->o;
    char key[96], me[700], val[700];
    int64_t arrival, arrivals;
    double t0 = mgpu_clock_mono(), t_min = -1, t_expected = 0;
    int rc, noticed = 0, said_last_call = 0, expected = 0;
    int64_t expected_at = -1;

    snprintf(key, sizeof key, "round/%d/arrivals", round);
    if ((rc = mgpu_store_add(r->client, key, 1, &arrival, err)) < 0)
        return rc;
    *slot = (int)(arrival - 1);
    if (*slot < o->nnodes_max) {
        snprintf(me, sizeof me, "%d %s %d %d %s", o->nproc, r->host, (int)getpid(), prev, r->role);
        snprintf(key, sizeof key, "round/%d/node/%d", round, *slot);
        if ((rc = mgpu_store_set(r->client, key, me, strlen(me), err)) < 0)
            return rc;
    }
    for (;;) {
        int close_at = -1;
        if (r->cancel)
            return mgpu_err_set(err, MGPU_E_CLOSED, "rendezvous '%s': cancelled", o->run_id);
        snprintf(key, sizeof key, "round/%d/closed", round);
        if ((rc = key_exists(r, key, err)) < 0)
            return rc;
        if (rc > 0) {
            if ((rc = get_str(r, key, val, sizeof val, err)) < 0)
                return rc;
            *n = atoi(val);
            return 0;
        }
        if ((rc = key_exists(r, "over", err)) < 0)
            return rc;
        if (rc > 0) {
            int64_t seen;
            get_str(r, "over", val, sizeof val, NULL);
            mgpu_store_add(r->client, "over_seen", 1, &seen, NULL); /* the store may go now */
            return mgpu_err_set(err, MGPU_E_PEER,
                                "rendezvous '%s' at %s: the job ended before this node could join "
                                "it (%s)",
                                o->run_id, r->where, val);
        }
        snprintf(key, sizeof key, "round/%d/arrivals", round);
        if ((rc = mgpu_store_add(r->client, key, 0, &arrivals, err)) < 0)
            return rc;
        double now = mgpu_clock_mono();
        if (round > 0) {
            /* Round R starts when attempt R - 1 has ended (its failure record says why): until
             * then the nodes that wait for it wait as long as the job runs. */
            snprintf(key, sizeof key, "attempt/%d/failure", round - 1);
            if ((rc = key_exists(r, key, err)) < 0)
                return rc;
            if (rc == 0) {
                t0 = now;
                pause_s(POLL_S * 4);
                continue;
            }
        }
        if (arrivals >= o->nnodes_max) {
            close_at = o->nnodes_max;
        } else if (arrivals >= o->nnodes_min) {
            /* Reading the expected nodes costs a request a node of the last round: twice a
             * second, or when someone came, is often enough. */
            if (round > 0 && (arrivals != expected_at || now - t_expected >= 0.5)) {
                expected = expected_nodes(r, round);
                expected_at = arrivals;
                t_expected = now;
            }
            if (t_min < 0)
                t_min = now;
            if (round > 0 && arrivals >= expected)
                close_at = (int)arrivals;
            else if (now - t_min >= o->last_call_timeout)
                close_at = (int)arrivals;
            else if (!said_last_call && o->last_call_timeout >= 1.0) {
                /* The last call can be long (30 s by default): a silent launcher looks hung. */
                mgpu_warn("rendezvous '%s' at %s: %lld nodes joined (at least %d, at most %d); "
                          "waiting up to %g s (last_call_timeout) for more nodes",
                          o->run_id, r->where, (long long)arrivals, o->nnodes_min, o->nnodes_max,
                          o->last_call_timeout);
                said_last_call = 1;
            }
        } else if (now - t0 >= o->join_timeout) {
            return mgpu_err_set(err, MGPU_E_TIMEOUT,
                                "rendezvous '%s' at %s: %lld of at least %d nodes joined within "
                                "%g s",
                                o->run_id, r->where, (long long)arrivals, o->nnodes_min,
                                o->join_timeout);
        } else if (!noticed && now - t0 >= NOTICE_AFTER_S) {
            mgpu_warn("rendezvous '%s' at %s: %lld of at least %d nodes joined; waiting for the "
                      "others (up to %g s more)",
                      o->run_id, r->where, (long long)arrivals, o->nnodes_min,
                      o->join_timeout - (now - t0));
            noticed = 1;
        }
        if (close_at >= 0) {
            char verdict[64];
            snprintf(verdict, sizeof verdict, "%d %d", close_at, restarts_of(r, round));
            snprintf(key, sizeof key, "round/%d/closed", round);
            rc = mgpu_store_compare_set(r->client, key, "", 0, verdict, strlen(verdict), NULL, NULL,
                                        err);
            if (rc < 0)
                return rc;
            continue; /* read back whichever verdict won */
        }
        pause_s(POLL_S);
    }
}

void mgpu_rdzv_wait_over_seen(mgpu_rdzv_t *r, double timeout)
{
    char key[96];
    int64_t waiting = 0, seen = 0;
    double end = mgpu_clock_mono() + timeout;

    snprintf(key, sizeof key, "round/%d/arrivals", r->round + 1);
    while (mgpu_store_add(r->client, key, 0, &waiting, NULL) == 0 && waiting > 0 &&
           mgpu_store_add(r->client, "over_seen", 0, &seen, NULL) == 0 && seen < waiting &&
           mgpu_clock_mono() < end)
        pause_s(POLL_S);
}

typedef struct order {
    int slot, prev;
} order_t;

static int by_prev(const void *a, const void *b)
{
    const order_t *x = a, *y = b;
    unsigned px = (unsigned)x->prev, py = (unsigned)y->prev; /* -1 (new) sorts last */
    if (px != py)
        return px < py ? -1 : 1;
    return x->slot - y->slot;
}

int mgpu_rdzv_join_rounds(mgpu_rdzv_t *r, int round, mgpu_rdzv_world_t *w, mgpu_err_t *err)
{
    int prev = r->joined && round == r->round + 1 ? r->node_rank : -1;
    int slot = 0, n = 0, rc;
    char key[96], val[64];

    for (;;) {
        if ((rc = join_one(r, round, prev, &slot, &n, err)) < 0)
            return rc;
        if (slot < n)
            break;
        /* Too late for this round: wait for the next, and let this one's nodes know. */
        int64_t waiting = 0;
        snprintf(key, sizeof key, "round/%d/waiting", round);
        if ((rc = mgpu_store_add(r->client, key, 1, &waiting, err)) < 0)
            return rc;
        mgpu_warn("rendezvous '%s' at %s: the job runs with %d node%s (at most %d); this node "
                  "waits to join at its next restart%s",
                  r->run_id, r->where, n, n == 1 ? "" : "s", r->o.nnodes_max,
                  n < r->o.nnodes_max ? ", which its nodes start now to let it in"
                                      : " (it has its maximum of nodes now)");
        round++;
        prev = -1;
    }

    /* The round's nodes, ranked: the previous round's order, then new nodes by arrival. */
    order_t *ord = calloc((size_t)n, sizeof *ord);
    char **vals = calloc((size_t)n, sizeof *vals);
    size_t *lens = calloc((size_t)n, sizeof *lens);
    if (ord == NULL || vals == NULL || lens == NULL)
        rc = mgpu_err_set(err, -ENOMEM, "out of memory");
    for (int i = 0; rc == 0 && i < n; i++) {
        void *v = NULL;
        rdzv_node_t nd;
        snprintf(key, sizeof key, "round/%d/node/%d", round, i);
        if ((rc = mgpu_store_get(r->client, key, r->o.join_timeout, &v, &lens[i], err)) < 0)
            break;
        ord[i].slot = i;
        if (mgpu_rdzv_parse_node(v, lens[i], 4, &nd, &ord[i].prev, r->role, NULL) < 0)
            ord[i].prev = -1;
        vals[i] = v;
    }
    if (rc == 0) {
        char **sorted = calloc((size_t)n, sizeof *sorted);
        size_t *slens = calloc((size_t)n, sizeof *slens);
        qsort(ord, (size_t)n, sizeof *ord, by_prev);
        for (int i = 0; sorted != NULL && slens != NULL && i < n; i++) {
            sorted[i] = vals[ord[i].slot];
            slens[i] = lens[ord[i].slot];
            if (ord[i].slot == slot)
                r->node_rank = i;
        }
        snprintf(key, sizeof key, "round/%d/closed", round);
        if (sorted == NULL || slens == NULL)
            rc = mgpu_err_set(err, -ENOMEM, "out of memory");
        else if ((rc = get_str(r, key, val, sizeof val, err)) == 0) {
            char *sp = strchr(val, ' ');
            r->restarts = sp ? atoi(sp + 1) : 0;
            r->round = round;
            r->nnodes = n;
            snprintf(key, sizeof key, "round/%d/master", round);
            rc = mgpu_rdzv_world_fill(r, sorted, slens, 4, key, w, err);
        }
        free(sorted);
        free(slens);
    }
    for (int i = 0; vals != NULL && i < n; i++)
        free(vals[i]);
    free(vals);
    free(lens);
    free(ord);
    return rc;
}
