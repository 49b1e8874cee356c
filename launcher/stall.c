/* stall.c - stalled ranks and the report's first line (see stall.h). */
#include "stall.h"

#include <stdarg.h> /* va_list */
#include <stdio.h>  /* vsnprintf */
#include <string.h> /* strlen */

/* Ranks whose last progress lies this close to the oldest one are behind together: output
 * lines are timed when the launcher reads them, a few milliseconds after they were written. */
#define TIE_NS 10000000LL

static void bump(mgpu_stall_rank_t *r, int64_t t, int64_t now_ns)
{
    if (t <= 0 || t > now_ns)
        t = now_ns; /* a clock from another host or a torn read: the change is seen now */
    if (t > r->last_ns)
        r->last_ns = t;
}

void mgpu_stall_update(mgpu_stall_rank_t *r, int n, int64_t now_ns, int64_t real_ns)
{
    for (int i = 0; i < n; i++) {
        mgpu_stall_rank_t *x = &r[i];
        if (x->last_ns < x->start_ns)
            x->last_ns = x->start_ns;
        if (x->attached && x->page.moves != x->seen_moves) {
            x->seen_moves = x->page.moves;
            bump(x, x->page.moved_ns, now_ns);
        }
        /* coll_done moves on another thread of the worker, with no time of its own */
        if (x->attached && x->page.coll_done != x->seen_coll_done) {
            x->seen_coll_done = x->page.coll_done;
            bump(x, now_ns, now_ns);
        }
        if (x->heartbeat_ns != x->seen_heartbeat) {
            x->seen_heartbeat = x->heartbeat_ns;
            if (x->heartbeat_ns > 0) {
                x->heartbeats = 1;
                bump(x, now_ns - (real_ns - x->heartbeat_ns), now_ns);
            }
        }
        if (x->lines != x->seen_lines) {
            x->seen_lines = x->lines;
            bump(x, x->line_ns, now_ns);
        }
    }
}

static int in_coll(const mgpu_stall_rank_t *r)
{
    return r->alive && r->attached && r->page.coll_entered > r->page.coll_done;
}

const mgpu_progress_coll_t *mgpu_stall_coll(const mgpu_stall_rank_t *r)
{
    return in_coll(r) ? mgpu_progress_coll(&r->page, r->page.coll_entered) : NULL;
}

int mgpu_stall_detect(mgpu_stall_rank_t *r, int n, int64_t now_ns, double timeout_s)
{
    int64_t limit = (int64_t)(timeout_s * 1e9), oldest = 0;
    uint64_t wait_seq = 0;
    int stalled = 0, culprits = 0;

    for (int i = 0; i < n; i++) {
        r[i].culprit = 0;
        r[i].stalled = r[i].alive && timeout_s > 0 && now_ns - r[i].last_ns >= limit;
        stalled += r[i].stalled;
        if (in_coll(&r[i]) && r[i].page.coll_entered > wait_seq)
            wait_seq = r[i].page.coll_entered;
    }
    if (stalled == 0)
        return 0;
    /* A stopped rank holds the others up even from inside the collective they wait in. */
    for (int i = 0; i < n; i++)
        if (r[i].stalled && r[i].paused) {
            r[i].culprit = 1;
            culprits++;
        }
    if (culprits > 0)
        return stalled;
    /* Behind the others: not in the collective the most advanced ranks wait in. */
    for (int i = 0; wait_seq > 0 && i < n; i++)
        if (r[i].stalled && !(in_coll(&r[i]) && r[i].page.coll_entered == wait_seq)) {
            r[i].culprit = 1;
            culprits++;
        }
    if (culprits > 0)
        return stalled;
    /* Otherwise the ranks whose last progress is the oldest. */
    for (int i = 0; i < n; i++)
        if (r[i].stalled && (oldest == 0 || r[i].last_ns < oldest))
            oldest = r[i].last_ns;
    for (int i = 0; i < n; i++)
        r[i].culprit = r[i].stalled && r[i].last_ns <= oldest + TIE_NS;
    return stalled;
}

typedef struct text {
    char *buf;
    size_t len, used;
} text_t;

static void put(text_t *t, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (t->used + 1 >= t->len)
        return;
    va_start(ap, fmt);
    n = vsnprintf(t->buf + t->used, t->len - t->used, fmt, ap);
    va_end(ap);
    if (n > 0)
        t->used += (size_t)n < t->len - t->used ? (size_t)n : t->len - t->used - 1;
}

static double age(int64_t now_ns, int64_t t)
{
    return t > 0 && t <= now_ns ? (double)(now_ns - t) / 1e9 : 0.0;
}

static void put_bytes(text_t *t, uint64_t b)
{
    if (b >= (1u << 20))
        put(t, "%.3g MiB", (double)b / (1 << 20));
    else if (b >= 1024)
        put(t, "%.3g KiB", (double)b / 1024);
    else
        put(t, "%llu B", (unsigned long long)b);
}

static void put_coll(text_t *t, const mgpu_stall_rank_t *r)
{
    const mgpu_progress_coll_t *c = mgpu_stall_coll(r);

    if (c == NULL) {
        put(t, "collective #%llu", (unsigned long long)r->page.coll_entered);
        return;
    }
    put(t, "%s #%llu (", mgpu_progress_coll_name(c->op), (unsigned long long)c->seq);
    if (c->bucket >= 0)
        put(t, "bucket %d, ", (int)c->bucket);
    put_bytes(t, c->bytes);
    put(t, ")");
}

/* "rank 3" or "ranks 0, 1, 2": the ranks i with pick(i) true. */
static int put_ranks(text_t *t, const mgpu_stall_rank_t *r, int n, const char *mark)
{
    int count = 0, k = 0;

    for (int i = 0; i < n; i++)
        count += mark[i];
    put(t, count == 1 ? "rank" : "ranks");
    for (int i = 0; i < n; i++)
        if (mark[i])
            put(t, "%s%d", k++ ? ", " : " ", r[i].rank);
    return count;
}

static void put_culprit(text_t *t, const mgpu_stall_rank_t *r, int64_t now_ns, const char *host)
{
    put(t, "rank %d (local %d, pid %d, host %s) ", r->rank, r->local_rank, (int)r->pid, host);
    if (r->paused)
        put(t, "is stopped (SIGSTOP, Ctrl-Z or a debugger) and ");
    if (r->attached && r->page.phase != MGPU_PHASE_NONE) {
        put(t, "has been in %s", mgpu_progress_phase_name(r->page.phase));
        if (r->page.step >= 0)
            put(t, " of step %lld", (long long)r->page.step);
        if (in_coll(r)) {
            put(t, " (in ");
            put_coll(t, r);
            put(t, ")");
        }
        put(t, " for %.0f s", age(now_ns, r->page.phase_ns > 0 ? r->page.phase_ns : r->last_ns));
        return;
    }
    put(t, "has printed nothing and sent no heartbeat for %.0f s", age(now_ns, r->last_ns));
    if (r->last_line[0])
        put(t, " (its last line: \"%s\")", r->last_line);
}

void mgpu_stall_describe(const mgpu_stall_rank_t *r, int n, int64_t now_ns, const char *host,
                         char *buf, size_t len)
{
    text_t t = {buf, len, 0};
    char mark[n > 0 ? n : 1];
    int first = 1, quiet = -1;
    double quiet_age = 0;

    buf[0] = '\0';
    put(&t, "stall: ");
    for (int i = 0; i < n; i++)
        if (r[i].culprit) {
            put(&t, first ? "" : "; ");
            put_culprit(&t, &r[i], now_ns, host);
            first = 0;
        }
    /* The others, grouped by the collective they wait in. */
    for (int i = 0; i < n; i++) {
        int64_t since = 0;
        if (r[i].culprit || !in_coll(&r[i]))
            continue;
        int seen = 0;
        for (int j = 0; j < i; j++)
            seen |=
                !r[j].culprit && in_coll(&r[j]) && r[j].page.coll_entered == r[i].page.coll_entered;
        if (seen)
            continue;
        for (int j = 0; j < n; j++) {
            mark[j] =
                !r[j].culprit && in_coll(&r[j]) && r[j].page.coll_entered == r[i].page.coll_entered;
            const mgpu_progress_coll_t *c = mark[j] ? mgpu_stall_coll(&r[j]) : NULL;
            int64_t s = c != NULL ? c->since_ns : r[j].last_ns;
            if (mark[j] && (since == 0 || s < since))
                since = s;
        }
        put(&t, "; ");
        int count = put_ranks(&t, r, n, mark);
        put(&t, " %s waited in ", count == 1 ? "has" : "have");
        put_coll(&t, &r[i]);
        put(&t, " for %.0f s", age(now_ns, since));
    }
    /* Ranks with a page, not in a collective: where they are. */
    for (int i = 0; i < n; i++)
        if (!r[i].culprit && r[i].alive && r[i].attached && !in_coll(&r[i])) {
            put(&t, "; rank %d is in %s", r[i].rank, mgpu_progress_phase_name(r[i].page.phase));
            if (r[i].page.step >= 0)
                put(&t, " of step %lld", (long long)r[i].page.step);
            put(&t, " (last progress %.0f s ago)", age(now_ns, r[i].last_ns));
        }
    /* Ranks without a page: when they last printed or sent a heartbeat. */
    for (int i = 0; i < n; i++) {
        mark[i] = !r[i].culprit && r[i].alive && !r[i].attached;
        if (mark[i] && (quiet < 0 || age(now_ns, r[i].last_ns) < quiet_age)) {
            quiet = i;
            quiet_age = age(now_ns, r[i].last_ns);
        }
    }
    if (quiet >= 0) {
        put(&t, "; ");
        int count = put_ranks(&t, r, n, mark);
        put(&t, " %s been quiet for %.0f s", count == 1 ? "has" : "have", quiet_age);
        if (r[quiet].last_line[0])
            put(&t, " (last line of rank %d: \"%s\")", r[quiet].rank, r[quiet].last_line);
    }
}
