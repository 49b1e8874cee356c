/* attempts.c - the end of an attempt on a node: agreed with the other nodes through the store
 * (failures, ends, elastic rounds: their blocking calls run on libuv's thread pool), restarted
 * or finished, and recorded with the world it ran in. Shares the supervisor's state
 * (supervisor_impl.h). */
#include "supervisor_impl.h"

#include <signal.h> /* SIGTERM */
#include <stdarg.h> /* va_list */
#include <stdio.h>  /* snprintf */
#include <stdlib.h> /* calloc, realloc */
#include <string.h> /* memset */
#include <uv.h>     /* uv_queue_work */

#include "clock.h" /* mgpu_clock_real */
#include "log.h"   /* mgpu_warn */
#include "pages.h" /* mgpu_pages_set_lost */

/* This attempt's world, for the summary (one record per start of the group). */
void mgpu_sup_record_world(sup_t *s)
{
    mgpu_run_result_t *r = s->res;
    mgpu_attempt_record_t *w = realloc(r->worlds, (size_t)(r->nworlds + 1) * sizeof *w);
    if (w == NULL)
        return;
    r->worlds = w;
    w += r->nworlds++;
    memset(w, 0, sizeof *w);
    w->attempt = s->attempt;
    w->restarts = s->restarts;
    w->nnodes = s->plan->nnodes;
    w->node_rank = s->plan->node_rank;
    w->world_size = s->plan->world_size;
    w->base_rank = s->plan->base_rank;
    snprintf(w->hosts, sizeof w->hosts, "%s", s->plan->world_hosts);
    w->t_start = mgpu_clock_real();
}

/* How this attempt ended, on its record. */
static void record_end(sup_t *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void record_end(sup_t *s, const char *fmt, ...)
{
    mgpu_attempt_record_t *w;
    va_list ap;
    if (s->res->nworlds == 0)
        return;
    w = &s->res->worlds[s->res->nworlds - 1];
    if (w->t_end > 0)
        return;
    w->t_end = mgpu_clock_real();
    va_start(ap, fmt);
    vsnprintf(w->end, sizeof w->end, fmt, ap);
    va_end(ap);
}

/* Why the attempt ended, in words, for its record and the restart's message. */
static void describe_end(sup_t *s, int failed, const mgpu_rdzv_failure_t *rf, char *buf, size_t len)
{
    const mgpu_run_result_t *r = s->res;
    if (!failed)
        snprintf(buf, len, "succeeded");
    else if (rf != NULL && rf->rank == MGPU_RDZV_ARRIVAL)
        snprintf(buf, len, "stopped to admit nodes (%s)", rf->how);
    else if (rf != NULL && rf->rank == MGPU_RDZV_NODE && rf->how[0])
        snprintf(buf, len, "node %d (%s) %s", rf->node_rank, rf->host, rf->how);
    else if (rf != NULL && rf->rank == MGPU_RDZV_NODE)
        snprintf(buf, len, "node %d (%s) stopped", rf->node_rank, rf->host);
    else if (rf != NULL)
        snprintf(buf, len, "failed: rank %d on node %d (%s) exited with %d", rf->rank,
                 rf->node_rank, rf->host, rf->exit_code);
    else if (s->root >= 0)
        snprintf(buf, len, "failed: rank %d exited with %d", r->outcomes[s->root].rank,
                 r->outcomes[s->root].exit_code);
    else if (s->user_signal)
        snprintf(buf, len, "stopped by SIG%s", sigabbrev_np(s->user_signal));
    else
        snprintf(buf, len, "failed: %s",
                 s->rdzv && mgpu_rdzv_lost_why(s->rdzv)[0] ? mgpu_rdzv_lost_why(s->rdzv)
                                                           : "the nodes lost each other");
}

/* The run ends here: no restart. An elastic job tells nodes waiting to join that it is over
 * (unless only this node leaves: the others may go on). */
static void finish(sup_t *s, const char *why)
{
    if (s->elastic && !s->user_signal && !s->res->rdzv_error)
        mgpu_rdzv_leave(s->rdzv, why);
    s->finished = 1;
    mgpu_sup_close_handles(s);
}

/* The attempt is over everywhere: restart it, or end the run. failed says whether any node
 * failed; rf (may be NULL) is the first failure when it happened on another node (or was a
 * node lost, or an arrival). */
void mgpu_sup_attempt_done(sup_t *s, int failed, const mgpu_rdzv_failure_t *rf)
{
    mgpu_run_result_t *r = s->res;
    mgpu_err_t err;
    int arrival = rf != NULL && rf->rank == MGPU_RDZV_ARRIVAL;
    int node_gone = rf != NULL && rf->rank == MGPU_RDZV_NODE;
    /* A static job stops everywhere when a node stops or is lost; an elastic one goes on
     * with the nodes left, unless this is the node that left or was given up. */
    int self_gone = node_gone && rf->node_rank == s->plan->node_rank;
    int stopped_by_user = s->user_signal || (node_gone && (!s->elastic || self_gone));
    char end[320];

    describe_end(s, failed, rf, end, sizeof end);
    record_end(s, "%s", end);
    if (!failed) {
        r->root = r->root_attempt = -1;
        r->remote = 0;
    } else if (!arrival) {
        mgpu_outcome_t *h = realloc(r->history, (size_t)(r->nhistory + 1) * sizeof *h);
        r->root = rf == NULL ? s->root : -1;
        r->remote = rf != NULL;
        if (rf != NULL) {
            mgpu_rdzv_failure_t *rh =
                realloc(r->remote_history, (size_t)(r->nremote_history + 1) * sizeof *rh);
            r->remote_failure = *rf;
            if (rh != NULL) {
                r->remote_history = rh;
                r->remote_history[r->nremote_history++] = *rf;
            }
        }
        r->root_attempt = s->attempt;
        if (h != NULL && r->root >= 0) {
            r->history = h;
            r->history[r->nhistory++] = r->outcomes[r->root];
        } else if (h != NULL) {
            r->history = h;
        }
    }
    if (failed && !stopped_by_user && !r->rdzv_error &&
        (arrival || s->restarts < s->plan->max_restarts)) {
        int left = s->plan->max_restarts - s->restarts - !arrival;
        if (s->elastic) {
            /* A new rendezvous round: the nodes that come make the next world. */
            mgpu_warn("worker group stopped: %s; restarting with the nodes that rejoin (at least "
                      "%d, at most %d): %d restart%s left after it",
                      end, s->plan->rdzv.nnodes_min, s->plan->rdzv.nnodes_max, left,
                      left == 1 ? "" : "s");
            s->in_round = 1;
            mgpu_sup_rdzv_work(s, MGPU_SUP_RW_ROUND, NULL);
            return;
        }
        if (rf != NULL)
            mgpu_warn("worker group failed (node %d, rank %d exited with %d); restarting: "
                      "attempt %d, %d restart%s left after it",
                      rf->node_rank, rf->rank, rf->exit_code, s->attempt + 1, left,
                      left == 1 ? "" : "s");
        else
            mgpu_warn("worker group failed (rank %d exited with %d); restarting: attempt %d, "
                      "%d restart%s left after it",
                      r->outcomes[s->root].rank, r->outcomes[s->root].exit_code, s->attempt + 1,
                      left, left == 1 ? "" : "s");
        s->attempt++;
        s->restarts++;
        if (mgpu_sup_start_attempt(s, &err) == 0)
            return;
        mgpu_error("restart failed: %s", err.msg);
    }
    if (self_gone && !s->user_signal) {
        r->rdzv_error = 1;
        mgpu_error("the other nodes gave this node up (%s): it leaves the job", rf->how);
    }
    finish(s, failed ? end : "succeeded");
}

/* An elastic round is over (rwork_done): the new world, then its attempt. */
static void round_done(sup_t *s, int rc, const mgpu_rdzv_world_t *w, const mgpu_err_t *e)
{
    mgpu_err_t err;

    s->in_round = 0;
    if (rc < 0 || s->user_signal) {
        if (rc < 0 && rc != MGPU_E_CLOSED) {
            mgpu_error("%s", e->msg);
            s->res->rdzv_error = 1;
        }
        s->finished = 1;
        mgpu_sup_close_handles(s);
        return;
    }
    mgpu_plan_set_world(s->plan, w);
    s->attempt = w->round;
    s->restarts = w->restarts;
    mgpu_warn("attempt %d: %d node%s (%s), world size %d; this node is node %d, ranks %d-%d "
              "(TORCHELASTIC_RESTART_COUNT=%d)",
              w->round, w->nnodes, w->nnodes == 1 ? "" : "s", w->hosts, w->world_size, w->node_rank,
              w->base_rank, w->base_rank + s->nproc - 1, w->restarts);
    if (mgpu_sup_start_attempt(s, &err) == 0)
        return;
    mgpu_error("restart failed: %s", err.msg);
    finish(s, "a restart failed");
}

/* Work on libuv's thread pool: the rendezvous calls block on the network. */
typedef struct rwork {
    uv_work_t req;
    sup_t *s;
    int kind, attempt, rc, failed, first;
    mgpu_rdzv_failure_t f;
    mgpu_rdzv_world_t world; /* MGPU_SUP_RW_ROUND */
    mgpu_err_t err;
} rwork_t;

static void rwork_run(uv_work_t *req)
{
    rwork_t *w = req->data;
    sup_t *s = w->s;
    switch (w->kind) {
    case MGPU_SUP_RW_WATCH:
        w->rc = mgpu_rdzv_wait_failure(s->rdzv, w->attempt, &w->f, &w->err);
        break;
    case MGPU_SUP_RW_REPORT:
        w->rc = mgpu_rdzv_report_failure(s->rdzv, w->attempt, &w->f, &w->first, &w->err);
        break;
    case MGPU_SUP_RW_END:
        w->rc = mgpu_rdzv_end_attempt(s->rdzv, w->attempt, s->plan->grace_period + 30.0, &w->failed,
                                      &w->f, &w->err);
        break;
    case MGPU_SUP_RW_ROUND:
        w->rc = mgpu_rdzv_next_round(s->rdzv, w->attempt, &w->world, &w->err);
        break;
    }
}

static void rwork_done(uv_work_t *req, int status)
{
    rwork_t *w = req->data;
    sup_t *s = w->s;

    s->pending_work--;
    if (w->kind == MGPU_SUP_RW_WATCH && w->rc == 0 && w->attempt == s->attempt && !s->finished &&
        w->f.node_rank == s->plan->node_rank && w->f.rank == MGPU_RDZV_NODE && !s->user_signal &&
        s->root < 0) {
        /* This launcher was silent past heartbeat_timeout (stopped, starved, cut off) and the
         * others gave it up: its workers' peers are gone. */
        mgpu_error("the other nodes gave this node up (%s); stopping its workers", w->f.how);
        s->res->rdzv_error = 1;
        mgpu_sup_stop_group(s, SIGTERM);
    } else if (w->kind == MGPU_SUP_RW_WATCH && w->rc == 0 && w->attempt == s->attempt &&
               !s->finished &&
               (w->f.node_rank != s->plan->node_rank || w->f.rank == MGPU_RDZV_ARRIVAL) &&
               s->root < 0) {
        char ranks[64], lost[600];
        if (w->f.rank >= 0) {
            mgpu_warn("node %d (%s): rank %d failed with exit code %d; stopping this node's "
                      "workers",
                      w->f.node_rank, w->f.host, w->f.rank, w->f.exit_code);
        } else if (w->f.rank == MGPU_RDZV_ARRIVAL) {
            mgpu_warn("%s; stopping this node's workers to admit them", w->f.how);
        } else {
            mgpu_rdzv_node_ranks(s->rdzv, w->f.node_rank, ranks, sizeof ranks);
            if (w->f.how[0])
                snprintf(lost, sizeof lost, "%s (node %d, host %s) %s", ranks, w->f.node_rank,
                         w->f.host, w->f.how);
            else if (w->f.exit_code > 128 && w->f.exit_code != 137)
                snprintf(lost, sizeof lost,
                         "%s (node %d, host %s): its launcher was stopped by "
                         "signal %d",
                         ranks, w->f.node_rank, w->f.host, w->f.exit_code - 128);
            else
                snprintf(lost, sizeof lost, "%s (node %d, host %s): its launcher died", ranks,
                         w->f.node_rank, w->f.host);
            /* The workers hear it first: a collective waiting on those ranks returns now,
             * naming them, rather than at its own timeout. */
            if (s->plan->pages != NULL)
                mgpu_pages_set_lost(s->plan->pages, lost);
            mgpu_warn("%s; stopping this node's workers", lost);
        }
        mgpu_sup_stop_group(s, SIGTERM);
    } else if (w->kind == MGPU_SUP_RW_WATCH && w->rc < 0 && w->rc != MGPU_E_CLOSED &&
               w->attempt == s->attempt && !s->finished && !s->ending) {
        mgpu_error("lost the other nodes: %s; stopping this node's workers", w->err.msg);
        s->res->rdzv_error = 1;
        mgpu_sup_stop_group(s, SIGTERM);
    } else if (w->kind == MGPU_SUP_RW_REPORT) {
        if (w->rc < 0)
            mgpu_error("could not tell the other nodes of the failure: %s", w->err.msg);
        /* The end of the attempt waited for this report, so every node reads the failure. */
        if (--s->reports_pending == 0)
            mgpu_sup_maybe_finish(s);
    } else if (w->kind == MGPU_SUP_RW_ROUND) {
        round_done(s, w->rc, &w->world, &w->err);
    } else if (w->kind == MGPU_SUP_RW_END && w->attempt == s->attempt && !s->finished) {
        if (w->rc == MGPU_E_CLOSED && s->user_signal && !mgpu_rdzv_lost_why(s->rdzv)[0]) {
            /* Stopped by its user while it waited for the others: they hear it as this node
             * stopped, as during the run. */
            mgpu_sup_report_failure(s, -1, -1, 128 + s->user_signal);
            mgpu_sup_attempt_done(s, s->root >= 0, NULL);
        } else if (w->rc < 0) {
            mgpu_error("%s", w->err.msg);
            s->res->rdzv_error = 1;
            mgpu_sup_attempt_done(s, 1, NULL);
        } else {
            /* Another node's failure; or this node's own record when it asked to admit nodes
             * or was given up (not when it was stopped by its own user). */
            int own = w->f.node_rank == s->plan->node_rank;
            int pass = w->failed && (!own || w->f.rank == MGPU_RDZV_ARRIVAL ||
                                     (w->f.rank == MGPU_RDZV_NODE && !s->user_signal));
            mgpu_sup_attempt_done(s, w->failed || s->root >= 0, pass ? &w->f : NULL);
        }
    }
    free(w);
}

void mgpu_sup_rdzv_work(sup_t *s, int kind, const mgpu_rdzv_failure_t *f)
{
    rwork_t *w = calloc(1, sizeof *w);
    if (w == NULL)
        return;
    w->req.data = w;
    w->s = s;
    w->kind = kind;
    w->attempt = s->attempt;
    if (f != NULL)
        w->f = *f;
    s->pending_work++;
    uv_queue_work(&s->loop, &w->req, rwork_run, rwork_done);
}

void mgpu_sup_report_failure(sup_t *s, int rank, int local_rank, int code)
{
    mgpu_rdzv_failure_t f = {
        .node_rank = s->plan->node_rank, .rank = rank, .local_rank = local_rank, .exit_code = code};
    if (!s->multi)
        return;
    snprintf(f.host, sizeof f.host, "%s", s->plan->hostname);
    s->reports_pending++;
    mgpu_sup_rdzv_work(s, MGPU_SUP_RW_REPORT, &f);
}
