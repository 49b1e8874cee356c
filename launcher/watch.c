/* watch.c - watching the ranks' progress on the supervisor's loop (supervisor_impl.h): a timer
 * reads every rank's progress (pages.h, output lines), stall.c decides, and a stall is
 * reported once on the console, in the log folder and in the run's result (--stall_action
 * fail then stops the group as a failure); the status socket (status_server.h) answers
 * `mgpu-launch status` with the same snapshot. */
#include "supervisor_impl.h"

#include <errno.h>  /* errno */
#include <fcntl.h>  /* open */
#include <stdio.h>  /* snprintf */
#include <stdlib.h> /* calloc */
#include <string.h> /* memchr */
#include <unistd.h> /* write */

#include <cjson/cJSON.h> /* the status reply */

#include "clock.h"         /* mgpu_clock_mono_ns */
#include "fdio.h"          /* mgpu_fdio_write_all */
#include "log.h"           /* mgpu_warn */
#include "pages.h"         /* mgpu_pages_read */
#include "spawner.h"       /* mgpu_spawner_keeper_tell_path */
#include "stacks.h"        /* mgpu_stacks_collect */
#include "stall.h"         /* mgpu_stall_detect */
#include "status_server.h" /* mgpu_status_reply */

/* The process state of a running worker: 'T' (stopped by a signal or a debugger), 'R',
 * 'S', ...; '?' when unknown. */
static char proc_state(pid_t pid)
{
    char path[64], buf[512], *p;
    FILE *f;
    size_t n;

    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    if ((f = fopen(path, "re")) == NULL)
        return '?';
    n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    p = strrchr(buf, ')'); /* the command's name may hold spaces and parentheses */
    return p != NULL && p[1] == ' ' && p[2] ? p[2] : '?';
}

/* Reads every rank's progress into s->stall (as of now_ns). */
static void snapshot(sup_t *s, int64_t now)
{
    const mgpu_pages_t *pg = s->plan->pages;
    int64_t real = (int64_t)(mgpu_clock_real() * 1e9);

    for (int k = 0; k < s->nproc; k++) {
        mgpu_stall_rank_t *x = &s->stall[k];
        proc_t *p = &s->procs[k];
        x->alive = p->running && p->pid > 0;
        x->paused = x->alive && proc_state(p->pid) == 'T';
        x->rank = p->out->rank;
        x->local_rank = k;
        x->pid = p->pid;
        x->attached = pg != NULL && mgpu_pages_read(pg, k, &x->page) == 0;
        x->heartbeat_ns = pg != NULL ? mgpu_pages_heartbeat_ns(pg, k) : 0;
        x->lines = p->lines;
        x->line_ns = p->line_ns;
        memcpy(x->last_line, p->last_line, sizeof x->last_line);
    }
    mgpu_stall_update(s->stall, s->nproc, now, real);
}

static cJSON *rank_json(const sup_t *s, int k, int64_t now)
{
    const mgpu_stall_rank_t *r = &s->stall[k];
    const mgpu_outcome_t *o = s->procs[k].out;
    const mgpu_progress_coll_t *c = mgpu_stall_coll(r);
    cJSON *j = cJSON_CreateObject();

    cJSON_AddNumberToObject(j, "rank", o->rank);
    cJSON_AddNumberToObject(j, "local_rank", k);
    cJSON_AddNumberToObject(j, "pid", o->pid);
    if (s->procs[k].running) {
        cJSON_AddStringToObject(j, "state", s->stall[k].paused ? "paused" : "running");
    } else if (o->state == MGPU_W_NEW) {
        cJSON_AddStringToObject(j, "state", "not started");
    } else {
        cJSON_AddStringToObject(j, "state", o->signal ? "killed" : "exited");
        cJSON_AddNumberToObject(j, "exit_code", o->exit_code);
        if (o->signal)
            cJSON_AddStringToObject(j, "signal", sigabbrev_np(o->signal));
    }
    if (r->attached) {
        cJSON_AddStringToObject(j, "phase", mgpu_progress_phase_name(r->page.phase));
        cJSON_AddNumberToObject(j, "step", (double)r->page.step);
    } else {
        cJSON_AddNullToObject(j, "phase");
        cJSON_AddNullToObject(j, "step");
    }
    cJSON_AddNumberToObject(j, "progress_age_s", (double)(now - r->last_ns) / 1e9);
    if (c != NULL) {
        cJSON *w = cJSON_AddObjectToObject(j, "collective");
        cJSON_AddStringToObject(w, "op", mgpu_progress_coll_name(c->op));
        cJSON_AddNumberToObject(w, "seq", (double)c->seq);
        cJSON_AddNumberToObject(w, "bytes", (double)c->bytes);
        cJSON_AddNumberToObject(w, "bucket", c->bucket);
        cJSON_AddNumberToObject(w, "for_s", (double)(now - c->since_ns) / 1e9);
    } else {
        cJSON_AddNullToObject(j, "collective");
    }
    cJSON_AddBoolToObject(j, "heartbeats", r->heartbeats);
    cJSON_AddStringToObject(j, "last_line", s->procs[k].last_line);
    return j;
}

/* Seconds the stack tools get: a few, and a little more per rank (they run at once, on a host
 * that may have fewer cores than ranks). The report waits no longer. */
static double stacks_timeout(int n)
{
    return 5.0 + 0.05 * n;
}

/* The status answer: the job and where each rank is (stacks[k]: rank k's stack, or NULL). */
static char *status_json(sup_t *s, char **stacks)
{
    const mgpu_plan_t *plan = s->plan;
    int64_t now = mgpu_clock_mono_ns();
    cJSON *j = cJSON_CreateObject(), *argv, *ranks;
    char *text;

    if (j == NULL)
        return NULL;
    snapshot(s, now);
    cJSON_AddNumberToObject(j, "launcher_pid", (double)getpid());
    cJSON_AddStringToObject(j, "host", plan->hostname);
    cJSON_AddStringToObject(j, "run_id", plan->run_id);
    cJSON_AddStringToObject(j, "entrypoint", plan->entrypoint);
    argv = cJSON_AddArrayToObject(j, "argv");
    for (char **a = plan->nproc > 0 ? plan->workers[0].argv : NULL; a != NULL && *a; a++)
        cJSON_AddItemToArray(argv, cJSON_CreateString(*a));
    cJSON_AddNumberToObject(j, "start_time", s->res->t_start);
    cJSON_AddNumberToObject(j, "attempt", s->attempt);
    cJSON_AddNumberToObject(j, "max_restarts", plan->max_restarts);
    cJSON_AddNumberToObject(j, "node_rank", plan->node_rank);
    cJSON_AddNumberToObject(j, "nnodes", plan->nnodes);
    cJSON_AddNumberToObject(j, "world_size", plan->world_size);
    cJSON_AddNumberToObject(j, "stall_timeout", plan->stall_timeout);
    cJSON_AddNumberToObject(j, "stalls", s->res->nstalls);
    ranks = cJSON_AddArrayToObject(j, "ranks");
    for (int k = 0; k < s->nproc; k++) {
        cJSON *r = rank_json(s, k, now);
        if (stacks != NULL && stacks[k] != NULL)
            cJSON_AddStringToObject(r, "stack", stacks[k]);
        cJSON_AddItemToArray(ranks, r);
    }
    text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    return text;
}

static void status_send(sup_t *s, mgpu_status_conn_t *c, char **stacks)
{
    char *text = status_json(s, stacks);
    mgpu_status_reply(c, text != NULL ? text : "{\"error\": \"out of memory\"}");
    cJSON_free(text);
}

/* A `status --stacks` request waiting for its stacks. */
typedef struct status_pending {
    sup_t *s;
    mgpu_status_conn_t *c;
    int n;
    int ks[]; /* local rank of each pid asked */
} status_pending_t;

static void on_status_stacks(void *arg, char **texts, int n)
{
    status_pending_t *sp = arg;
    char **stacks = calloc((size_t)sp->s->nproc, sizeof *stacks);

    for (int i = 0; stacks != NULL && i < n && i < sp->n; i++)
        stacks[sp->ks[i]] = texts[i];
    status_send(sp->s, sp->c, stacks);
    for (int i = 0; i < n; i++)
        free(texts[i]);
    free(texts);
    free(stacks);
    free(sp);
}

/* `mgpu-launch status`: answered at once, or once every running rank's stack is in. */
static void on_status(void *arg, mgpu_status_conn_t *c, int stacks)
{
    sup_t *s = arg;
    status_pending_t *sp;
    pid_t *pids;
    mgpu_err_t err = {0};

    if (!stacks) {
        status_send(s, c, NULL);
        return;
    }
    sp = calloc(1, sizeof *sp + (size_t)s->nproc * sizeof(int));
    pids = calloc((size_t)s->nproc + 1, sizeof *pids);
    if (sp == NULL || pids == NULL) {
        free(sp);
        free(pids);
        status_send(s, c, NULL);
        return;
    }
    sp->s = s;
    sp->c = c;
    for (int k = 0; k < s->nproc; k++)
        if (s->procs[k].running && s->procs[k].pid > 0) {
            sp->ks[sp->n] = k;
            pids[sp->n++] = s->procs[k].pid;
        }
    if (sp->n == 0 || mgpu_stacks_collect(&s->loop, pids, sp->n, stacks_timeout(sp->n),
                                          on_status_stacks, sp, &err) < 0) {
        if (sp->n > 0)
            mgpu_warn("status: no stacks: %s", err.msg);
        status_send(s, c, NULL);
        free(sp);
    }
    free(pids);
}

int mgpu_watch_init(sup_t *s, mgpu_err_t *err)
{
    uv_timer_init(&s->loop, &s->stall_timer);
    s->stall_timer.data = s;
    s->stall = calloc((size_t)s->nproc, sizeof *s->stall);
    if (s->stall == NULL)
        return mgpu_err_set(err, -ENOMEM, "out of memory");
    return 0;
}

void mgpu_watch_serve(sup_t *s)
{
    mgpu_err_t serr = {0};

    if (mgpu_status_server_start(&s->status, &s->loop, on_status, s, &serr) < 0)
        mgpu_warn("`mgpu-launch status` will not see this job: %s", serr.msg);
    else
        mgpu_spawner_keeper_tell_path(&s->keeper, s->status.path);
}

void mgpu_watch_close(sup_t *s)
{
    uv_close((uv_handle_t *)&s->stall_timer, NULL);
    mgpu_status_server_close(&s->status);
}

void mgpu_watch_lines(proc_t *p, const char *raw, size_t n)
{
    const char *end = raw + n, *line = NULL;
    size_t len = 0;

    for (const char *q = raw; q < end;) {
        const char *nl = memchr(q, '\n', (size_t)(end - q));
        size_t l = nl ? (size_t)(nl - q) : (size_t)(end - q);
        while (l > 0 && (q[l - 1] == '\r' || q[l - 1] == ' '))
            l--;
        if (l > 0) {
            line = q;
            len = l;
        }
        p->lines++;
        q += (nl ? (size_t)(nl - q) : l) + 1;
    }
    p->line_ns = mgpu_clock_mono_ns();
    if (line != NULL) {
        size_t max = sizeof p->last_line - 1;
        memcpy(p->last_line, line, len < max ? len : max);
        p->last_line[len < max ? len : max] = '\0';
        for (char *c = p->last_line; *c; c++)
            if ((unsigned char)*c < 0x20 || *c == '"')
                *c = '?'; /* the report quotes it on one line */
    }
}

/* One line per rank under the report's first line: where it is and what it last did. */
static void rank_line(const mgpu_stall_rank_t *r, int64_t now_ns, char *buf, size_t len)
{
    size_t u = 0;
    const mgpu_progress_coll_t *c = mgpu_stall_coll(r);

#define PUT(...)                                                                                   \
    do {                                                                                           \
        if (u < len)                                                                               \
            u += (size_t)snprintf(buf + u, len - u, __VA_ARGS__);                                  \
    } while (0)
    PUT("  rank %d (local %d, pid %d)%s: ", r->rank, r->local_rank, (int)r->pid,
        r->culprit ? " [stalled]" : "");
    if (r->paused)
        PUT("stopped, ");
    if (!r->alive)
        PUT("exited");
    else if (r->attached)
        PUT("%s of step %lld", mgpu_progress_phase_name(r->page.phase), (long long)r->page.step);
    else
        PUT("no progress page");
    if (c != NULL)
        PUT(", in %s #%llu for %.1f s", mgpu_progress_coll_name(c->op), (unsigned long long)c->seq,
            (double)(now_ns - c->since_ns) / 1e9);
    if (r->alive)
        PUT(", last progress %.1f s ago", (double)(now_ns - r->last_ns) / 1e9);
    if (r->heartbeats)
        PUT(", sends heartbeats");
    if (r->last_line[0])
        PUT(", last line: \"%s\"", r->last_line);
#undef PUT
}

/* Appends "mgpu-launch: " + each line of text to *buf (grown). */
static void append_lines(char **buf, size_t *len, const char *head, const char *text)
{
    size_t add = strlen(head) + 1, u = *len;
    char *nb;

    for (const char *p = text; *p; p++)
        add += *p == '\n' ? 24 : 1;
    add += strlen(text) + 32;
    if ((nb = realloc(*buf, u + add + 1)) == NULL)
        return;
    *buf = nb;
    u += (size_t)sprintf(nb + u, "%s\n", head);
    for (const char *p = text; *p;) {
        size_t l = strcspn(p, "\n");
        u += (size_t)sprintf(nb + u, "mgpu-launch:     %.*s\n", (int)l, p);
        p += l + (p[l] == '\n');
    }
    *len = u;
}

/* A stall report on its way: the stacks are being collected. */
typedef struct pending {
    sup_t *s;
    int attempt, count, rec; /* rec: index into res->stalls, -1 */
    int culprit;             /* local rank stopped by --stall_action fail, -1 */
    int n;
    int ks[]; /* local rank of each pid asked */
} pending_t;

static void report_end(pending_t *pd, char **texts, int ntexts);

static void on_report_stacks(void *arg, char **texts, int n)
{
    report_end(arg, texts, n);
}

static void report(sup_t *s, int64_t now_ns)
{
    mgpu_run_result_t *res = s->res;
    mgpu_stall_record_t *recs = realloc(res->stalls, (size_t)(res->nstalls + 1) * sizeof *recs);
    char line[2048];
    pending_t *pd = calloc(1, sizeof *pd + (size_t)s->nproc * sizeof(int));
    pid_t *pids = calloc((size_t)s->nproc, sizeof *pids);
    mgpu_err_t err = {0};

    mgpu_stall_describe(s->stall, s->nproc, now_ns, s->plan->hostname, line, sizeof line);
    if (recs != NULL) {
        mgpu_stall_record_t *r = &recs[res->nstalls];
        res->stalls = recs;
        memset(r, 0, sizeof *r);
        r->attempt = s->attempt;
        r->time = mgpu_clock_real();
        r->now_ns = now_ns;
        snprintf(r->line, sizeof r->line, "%s", line);
        r->ranks = malloc((size_t)s->nproc * sizeof *r->ranks);
        r->stacks = calloc((size_t)s->nproc, sizeof *r->stacks);
        if (r->ranks != NULL) {
            memcpy(r->ranks, s->stall, (size_t)s->nproc * sizeof *r->ranks);
            r->n = s->nproc;
        }
        res->nstalls++;
    }
    s->stall_count++;
    if (pd == NULL || pids == NULL) {
        free(pd);
        free(pids);
        mgpu_error("%s", line);
        return;
    }
    pd->s = s;
    pd->attempt = s->attempt;
    pd->count = s->stall_count;
    pd->rec = recs != NULL ? res->nstalls - 1 : -1;
    pd->culprit = -1;
    for (int k = 0; k < s->nproc; k++) {
        if (pd->culprit < 0 && s->stall[k].culprit)
            pd->culprit = k;
        if (s->stall[k].alive) {
            pd->ks[pd->n] = k;
            pids[pd->n++] = s->stall[k].pid;
        }
    }
    s->stall_pending++;
    if (pd->n == 0 || mgpu_stacks_collect(&s->loop, pids, pd->n, stacks_timeout(pd->n),
                                          on_report_stacks, pd, &err) < 0) {
        if (pd->n > 0)
            mgpu_warn("stall report without stacks: %s", err.msg);
        report_end(pd, NULL, 0);
    }
    free(pids);
}

/* The stacks are in (texts NULL: none could be collected): the report goes out in one block,
 * and --stall_action fail stops the group now that the stacks were taken. */
static void report_end(pending_t *pd, char **texts, int ntexts)
{
    sup_t *s = pd->s;
    mgpu_run_result_t *res = s->res;
    mgpu_stall_record_t *rec =
        pd->rec >= 0 && pd->rec < res->nstalls ? &res->stalls[pd->rec] : NULL;
    const mgpu_stall_rank_t *ranks = rec != NULL && rec->ranks != NULL ? rec->ranks : s->stall;
    char *block = NULL;
    size_t u = 0;

    s->stall_pending--;
    block = malloc(8192);
    if (block != NULL) {
        u = (size_t)snprintf(block, 8192, "mgpu-launch: %s\n",
                             rec != NULL ? rec->line : "stall (report lost: out of memory)");
        for (int k = 0; k < s->nproc && u < 8192; k++) {
            char rl[512];
            rank_line(&ranks[k], rec != NULL ? rec->now_ns : mgpu_clock_mono_ns(), rl, sizeof rl);
            u += (size_t)snprintf(block + u, 8192 - u, "mgpu-launch: %s\n", rl);
        }
        if (u >= 8192)
            u = 8191;
    }
    for (int i = 0; i < pd->n; i++) {
        int k = pd->ks[i];
        char head[160];
        const char *text =
            texts != NULL && i < ntexts && texts[i] != NULL ? texts[i] : "stack unavailable";
        snprintf(head, sizeof head,
                 "mgpu-launch: stack of rank %d (local %d, pid %d):", ranks[k].rank, k,
                 (int)ranks[k].pid);
        if (block != NULL)
            append_lines(&block, &u, head, text);
        if (rec != NULL && rec->stacks != NULL && texts != NULL && i < ntexts) {
            rec->stacks[k] = texts[i];
            texts[i] = NULL;
        }
    }
    for (int i = 0; texts != NULL && i < ntexts; i++)
        free(texts[i]);
    free(texts);
    if (block != NULL) {
        /* One write: the block is not torn by the workers' lines on the same console. */
        mgpu_fdio_write_all(2, block, u);
        if (res->log_root[0] && s->plan->output.log_dir[0]) {
            char path[2300];
            int fd;
            snprintf(path, sizeof path, "%s/stall-%d-%d.txt", res->log_root, pd->attempt,
                     pd->count);
            fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
            if (fd < 0 || mgpu_fdio_write_all(fd, block, u) < 0)
                mgpu_warn("stall report: open(%s): %s", path, strerror(errno));
            if (fd >= 0)
                close(fd);
        }
        free(block);
    }
    if (s->plan->stall_fail && pd->culprit >= 0 && pd->attempt == s->attempt && !s->finished &&
        s->procs[pd->culprit].running) {
        mgpu_warn("--stall_action fail: stopping the workers (rank %d stalled)",
                  s->procs[pd->culprit].out->rank);
        s->procs[pd->culprit].out->stalled = 1;
        mgpu_sup_fail(s, pd->culprit, 124);
    }
    free(pd);
}

static void on_stall_timer(uv_timer_t *t)
{
    sup_t *s = t->data;
    int64_t now = mgpu_clock_mono_ns();
    int n;

    if (s->stopping || s->finished)
        return;
    snapshot(s, now);
    n = mgpu_stall_detect(s->stall, s->nproc, now, s->plan->stall_timeout);
    if (n == 0)
        s->stall_active = 0; /* progress resumed: a later stall is a new one */
    else if (!s->stall_active) {
        s->stall_active = 1;
        report(s, now);
    }
}

void mgpu_watch_attempt(sup_t *s)
{
    const mgpu_pages_t *pg = s->plan->pages;
    int64_t now = mgpu_clock_mono_ns();
    double period = s->plan->stall_timeout / 4;

    s->stall_active = 0;
    s->stall_count = 0;
    if (pg != NULL)
        mgpu_pages_reset(pg);
    for (int k = 0; k < s->nproc; k++) {
        mgpu_stall_rank_t *x = &s->stall[k];
        memset(x, 0, sizeof *x);
        x->start_ns = x->last_ns = now;
        /* The last attempt's touches are not this one's heartbeats. */
        x->seen_heartbeat = pg != NULL ? mgpu_pages_heartbeat_ns(pg, k) : 0;
        s->procs[k].lines = 0;
        s->procs[k].line_ns = 0;
        s->procs[k].last_line[0] = '\0';
    }
    if (s->plan->stall_timeout <= 0)
        return;
    if (period > 1.0)
        period = 1.0;
    uv_timer_start(&s->stall_timer, on_stall_timer, (uint64_t)(period * 1000),
                   (uint64_t)(period * 1000) > 0 ? (uint64_t)(period * 1000) : 1);
}
