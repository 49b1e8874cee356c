/* report.c - the root-cause report and the JSON summary. */
#include "report.h"

#include <cjson/cJSON.h> /* error files and the summary */
#include <ctype.h>       /* isdigit */
#include <errno.h>       /* errno */
#include <signal.h>      /* SIGTERM */
#include <stdlib.h>      /* malloc */
#include <string.h>      /* strlen */
#include <time.h>        /* localtime_r */
#include <sys/uio.h>     /* struct iovec */

#include "atomic_file.h" /* mgpu_atomic_file_write */
#include "names.h"       /* mgpu_names_get */

static char *read_file(const char *path, size_t max)
{
    FILE *f = fopen(path, "re");
    char *buf;
    size_t n;

    if (f == NULL)
        return NULL;
    buf = malloc(max + 1);
    if (buf == NULL) {
        fclose(f);
        return NULL;
    }
    n = fread(buf, 1, max, f);
    fclose(f);
    buf[n] = '\0';
    return buf;
}

static char *dup_string(const cJSON *item)
{
    return cJSON_IsString(item) && item->valuestring ? strdup(item->valuestring) : NULL;
}

int mgpu_report_read_error_file(const char *path, char **msg, char **trace, long *timestamp)
{
    char *text = read_file(path, 1 << 20);
    const char *end = NULL;
    cJSON *root, *m, *extra;

    *msg = *trace = NULL;
    *timestamp = 0;
    if (text == NULL)
        return -ENOENT;
    root = cJSON_ParseWithOpts(text, &end, 0);
    free(text);
    if (root == NULL)
        return MGPU_E_PROTOCOL;
    m = cJSON_GetObjectItemCaseSensitive(root, "message");
    if (cJSON_IsObject(m)) {
        /* {"message": {"message": "...", "extraInfo": {"py_callstack": ..., "timestamp": "N"}}} */
        extra = cJSON_GetObjectItemCaseSensitive(m, "extraInfo");
        *msg = dup_string(cJSON_GetObjectItemCaseSensitive(m, "message"));
        *trace = dup_string(cJSON_GetObjectItemCaseSensitive(extra, "py_callstack"));
        cJSON *ts = cJSON_GetObjectItemCaseSensitive(extra, "timestamp");
        if (cJSON_IsString(ts))
            *timestamp = atol(ts->valuestring);
    } else {
        /* the newer layout: "message" a string, "timestamp" at the top */
        *msg = dup_string(m);
        cJSON *ts = cJSON_GetObjectItemCaseSensitive(root, "timestamp");
        if (cJSON_IsNumber(ts))
            *timestamp = (long)ts->valuedouble;
        else if (cJSON_IsString(ts))
            *timestamp = atol(ts->valuestring);
    }
    cJSON_Delete(root);
    return 0;
}

/* The module of "ModuleNotFoundError: No module named 'X'" in o's last stderr lines. */
static int missing_module(const mgpu_outcome_t *o, char *mod, size_t len)
{
    static const char key[] = "ModuleNotFoundError: No module named '";

    for (int i = o->ntail - 1; i >= 0; i--) {
        const char *p = strstr(o->tail[i], key);
        if (p != NULL) {
            p += sizeof key - 1;
            snprintf(mod, len, "%.*s", (int)strcspn(p, "'"), p);
            return 1;
        }
    }
    return 0;
}

/* When every worker that failed by itself died of the same missing module, the likely cause
 * is the interpreter (the first python3 on PATH lacks it): one line that names it. */
static void print_python_hint(const mgpu_plan_t *plan, const mgpu_run_result_t *res, FILE *out)
{
    char root_mod[128], mod[128];

    if (!plan->python[0] || res->root < 0 ||
        !missing_module(&res->outcomes[res->root], root_mod, sizeof root_mod))
        return;
    for (int k = 0; k < res->nout; k++)
        if (res->outcomes[k].state == MGPU_W_FAILED &&
            (!missing_module(&res->outcomes[k], mod, sizeof mod) || strcmp(mod, root_mod) != 0))
            return;
    fprintf(out,
            "hint: no module named '%s' for %s, the interpreter used; to choose another: "
            "PYTHON_EXEC=/path/to/python3\n",
            root_mod, plan->python);
}

/* Whether one of o's last stderr lines holds both a and b. */
static int tail_has(const mgpu_outcome_t *o, const char *a, const char *b)
{
    for (int i = o->ntail - 1; i >= 0; i--)
        if (strstr(o->tail[i], a) != NULL && strstr(o->tail[i], b) != NULL)
            return 1;
    return 0;
}

/* A script's argparse asking for torch.distributed.launch's --local_rank argument (--local-rank
 * since torch 2.0), or refusing the one --legacy_local_rank passed: the root cause is the
 * launch's command line, and one line says which option fixes it. */
static void print_local_rank_hint(const mgpu_plan_t *plan, const mgpu_outcome_t *o, FILE *out)
{
    static const char *const give[] = {"drop --legacy_local_rank", "give --legacy_local_rank",
                                       "give --legacy_local_rank=dash"};
    static const char *const spelled[] = {"", "--local_rank", "--local-rank"};
    const int have = plan->legacy_local_rank;
    int want = -1; /* 0 none, 1 underscore, 2 dash */

    if (tail_has(o, "arguments are required:", "--local_rank"))
        want = 1;
    else if (tail_has(o, "arguments are required:", "--local-rank"))
        want = 2;
    else if (have > 0 &&
             tail_has(o, "unrecognized arguments:", have == 1 ? "--local_rank=" : "--local-rank="))
        want = 0;
    if (want < 0 || want == have)
        return;
    if (want > 0)
        fprintf(out,
                "hint: the script wants torch.distributed.launch's %s argument: %s, or have "
                "it read LOCAL_RANK from its environment (torchrun's way)\n",
                spelled[want], give[want]);
    else
        fprintf(out,
                "hint: the script takes no %s argument: %s (LOCAL_RANK is in every worker's "
                "environment), or %s if it takes %s\n",
                spelled[have], give[0], give[3 - have], spelled[3 - have]);
}

/* Whether line names port: its digits with no digit on either side. */
static int names_port(const char *line, const char *port)
{
    size_t n = strlen(port);
    for (const char *p = strstr(line, port); p != NULL; p = strstr(p + 1, port))
        if ((p == line || !isdigit((unsigned char)p[-1])) && !isdigit((unsigned char)p[n]))
            return 1;
    return 0;
}

/* PyTorch's rank 0 could not listen on MASTER_PORT (another program holds it on that host;
 * "Address already in use" from torch 1.x, "EADDRINUSE" from 2.x's store): the port comes from
 * --master_port, and one line says so. */
static void print_master_port_hint(const mgpu_plan_t *plan, const mgpu_outcome_t *o, FILE *out)
{
    char port[16];
    int taken = 0;

    if (plan->master_port <= 0)
        return;
    snprintf(port, sizeof port, "%d", plan->master_port);
    for (int i = 0; i < o->ntail && !taken; i++)
        taken = (strstr(o->tail[i], "ddress already in use") != NULL ||
                 strstr(o->tail[i], "EADDRINUSE") != NULL) &&
                names_port(o->tail[i], port);
    if (!taken)
        return;
    fprintf(out,
            "hint: MASTER_PORT %d, where rank 0's PyTorch store listens, is taken on %s by "
            "another program%s: give another --master_port\n",
            plan->master_port, o->rank == 0 ? plan->hostname : "rank 0's host",
            plan->nnodes > 1 ? " (a job of several nodes uses --master_port + 1 for it)" : "");
}

/* A worker that asked PyTorch for NCCL where it has none (a CPU-only build of torch, or no GPU
 * visible): the backend to use on CPUs, and why there is no GPU where the plan knows. */
static void print_nccl_hint(const mgpu_plan_t *plan, const mgpu_outcome_t *o, FILE *out)
{
    if (!tail_has(o, "have NCCL built in", "") &&
        !tail_has(o, "ProcessGroupNCCL is only supported with GPUs", ""))
        return;
    fprintf(out,
            "hint: the workers asked PyTorch for NCCL, which needs GPUs and a CUDA build of "
            "torch: on CPUs, init_process_group(\"gloo\")%s%s\n",
            plan->cpu_reason[0] ? "; here: " : "", plan->cpu_reason);
}

static void fmt_time(double t, char *buf, size_t len)
{
    time_t s = (time_t)t;
    struct tm tm;
    localtime_r(&s, &tm);
    strftime(buf, len, "%Y-%m-%d_%H:%M:%S", &tm);
}

static const char *state_name(mgpu_wstate_t s)
{
    static const char *const names[] = {
        [MGPU_W_NEW] = "not started",     [MGPU_W_RUNNING] = "running",
        [MGPU_W_SUCCEEDED] = "succeeded", [MGPU_W_FAILED] = "failed",
        [MGPU_W_STOPPED] = "stopped",
    };
    return mgpu_names_get(names, MGPU_NAMES_COUNT(names), (int)s, "?");
}

static void describe_end(const mgpu_outcome_t *o, char *buf, size_t len)
{
    if (o->stalled)
        snprintf(buf, len, "%d (stalled: stopped by --stall_action fail with SIG%s)", o->exit_code,
                 sigabbrev_np(o->stop_signal ? o->stop_signal : SIGTERM));
    else if (o->exec_errno)
        snprintf(buf, len, "%d (could not execute %s)", o->exit_code, o->exec_reason);
    else if (o->signal)
        snprintf(buf, len, "%d (killed by SIG%s)", o->exit_code, sigabbrev_np(o->signal));
    else
        snprintf(buf, len, "%d", o->exit_code);
}

static void print_failure(const mgpu_plan_t *plan, const mgpu_outcome_t *o, int idx, FILE *out)
{
    char when[64], end[160], *msg = NULL, *trace = NULL;
    long ts = 0;
    int have_file = mgpu_report_read_error_file(o->error_file, &msg, &trace, &ts) == 0;

    fmt_time(ts ? (double)ts : o->t_end, when, sizeof when);
    describe_end(o, end, sizeof end);
    fprintf(out, "[%d]:\n", idx);
    fprintf(out, "  time      : %s\n", when);
    fprintf(out, "  host      : %s\n", plan->hostname);
    fprintf(out, "  rank      : %d (local_rank: %d)\n", o->rank, o->local_rank);
    fprintf(out, "  exitcode  : %s (pid: %d)\n", end, (int)o->pid);
    fprintf(out, "  error_file: %s\n", have_file ? o->error_file : "<N/A>");
    if (msg != NULL)
        fprintf(out, "  message   : %s\n", msg);
    if (trace != NULL) {
        fprintf(out, "  traceback :\n");
        for (char *line = strtok(trace, "\n"); line; line = strtok(NULL, "\n"))
            fprintf(out, "    %s\n", line);
    } else if (o->signal) {
        fprintf(out, "  traceback : Signal %d (SIG%s) received by PID %d\n", o->signal,
                sigabbrev_np(o->signal), (int)o->pid);
    } else {
        fprintf(out,
                "  traceback : none (a Python worker wrapped in torch's @record writes one)\n");
    }
    if (o->note[0])
        fprintf(out, "  note      : %s\n", o->note);
    if (o->ntail > 0) {
        fprintf(out, "  %s:\n", o->tail_both ? "last output lines" : "last stderr lines");
        for (int i = 0; i < o->ntail; i++)
            fprintf(out, "    %s\n", o->tail[i]);
    }
    free(msg);
    free(trace);
}

void mgpu_report_print(const mgpu_plan_t *plan, const mgpu_run_result_t *res, FILE *out)
{
    const char *rule = "============================================================";
    const char *thin = "------------------------------------------------------------";
    int nother = 0, nstopped = 0, idx = 1;

    if (res->root < 0 && res->signal == 0 && !res->remote && !res->rdzv_error)
        return;
    fprintf(out, "%s\n%s FAILED\n%s\n", rule, plan->entrypoint, thin);
    if (res->signal)
        fprintf(out, "mgpu-launch received SIG%s and stopped the workers (exit %d)\n%s\n",
                sigabbrev_np(res->signal), res->exit_code, thin);
    fprintf(out, "Failures:\n");
    for (int k = 0; k < res->nout; k++)
        if (k != res->root && res->outcomes[k].state == MGPU_W_FAILED) {
            print_failure(plan, &res->outcomes[k], idx++, out);
            nother++;
        }
    if (nother == 0)
        fprintf(out, "  <NO_OTHER_FAILURES>\n");
    fprintf(out, "%s\nStopped by the launcher:\n", thin);
    for (int k = 0; k < res->nout; k++) {
        const mgpu_outcome_t *o = &res->outcomes[k];
        char end[160];
        if (o->state != MGPU_W_STOPPED)
            continue;
        describe_end(o, end, sizeof end);
        fprintf(out, "  rank %d (local_rank: %d, pid: %d): sent SIG%s, exitcode %s\n", o->rank,
                o->local_rank, (int)o->pid, sigabbrev_np(o->stop_signal), end);
        nstopped++;
    }
    if (nstopped == 0)
        fprintf(out, "  <NONE>\n");
    if (res->root >= 0) {
        fprintf(out, "%s\nRoot Cause (first observed failure%s):\n", thin,
                res->attempts > 1 ? ", last attempt" : "");
        if (plan->nnodes > 1)
            fprintf(out, "  node      : %d of %d\n", plan->node_rank, plan->nnodes);
        print_failure(plan, &res->outcomes[res->root], 0, out);
        if (res->outcomes[res->root].stalled && res->nstalls > 0)
            fprintf(out, "  cause     : %s\n", res->stalls[res->nstalls - 1].line);
    } else if (res->remote) {
        const mgpu_rdzv_failure_t *f = &res->remote_failure;
        fprintf(out, "%s\nRoot Cause (first observed failure, on another node):\n[0]:\n", thin);
        fprintf(out, "  node      : %d of %d\n", f->node_rank, plan->nnodes);
        fprintf(out, "  host      : %s\n", f->host);
        if (f->rank >= 0) {
            fprintf(out, "  rank      : %d (local_rank: %d)\n", f->rank, f->local_rank);
            fprintf(out, "  exitcode  : %d\n", f->exit_code);
            fprintf(out, "  details   : in the report of node %d's launcher\n", f->node_rank);
        } else if (f->how[0]) {
            fprintf(out, "  cause     : that node was %s\n", f->how);
        } else if (f->exit_code == 137) {
            fprintf(out, "  cause     : that node's launcher died (its connection to the store "
                         "closed)\n");
        } else {
            fprintf(out, "  cause     : that node's launcher received signal %d\n",
                    f->exit_code - 128);
        }
    } else if (res->rdzv_error) {
        fprintf(out, "%s\nThe nodes lost each other: see the error above.\n", thin);
    }
    if (res->attempts > 1)
        fprintf(out, "%s\nAttempts: %d (--max_restarts=%d), each failed\n", thin, res->attempts,
                plan->max_restarts);
    fprintf(out, "%s\n", rule);
    print_python_hint(plan, res, out);
    if (res->root >= 0) { /* hints read the root cause's last lines */
        print_local_rank_hint(plan, &res->outcomes[res->root], out);
        print_master_port_hint(plan, &res->outcomes[res->root], out);
        print_nccl_hint(plan, &res->outcomes[res->root], out);
    }
}

/* torchrun's layout: {"message": {"message", "extraInfo": {"py_callstack", "timestamp"}}}. */
static cJSON *generic_error(const char *msg, const mgpu_outcome_t *o, double t)
{
    cJSON *root = cJSON_CreateObject(), *m = cJSON_AddObjectToObject(root, "message");
    cJSON *extra = cJSON_CreateObject();
    char ts[32], *stack = NULL;
    size_t len = 0;

    cJSON_AddStringToObject(m, "message", msg);
    for (int i = 0; o != NULL && i < o->ntail; i++) {
        size_t l = strlen(o->tail[i]);
        char *s = realloc(stack, len + l + 2);
        if (s == NULL)
            break;
        stack = s;
        memcpy(stack + len, o->tail[i], l);
        len += l;
        stack[len++] = '\n';
        stack[len] = '\0';
    }
    cJSON_AddStringToObject(extra, "py_callstack", stack != NULL ? stack : "");
    free(stack);
    snprintf(ts, sizeof ts, "%ld", (long)t);
    cJSON_AddStringToObject(extra, "timestamp", ts);
    cJSON_AddItemToObject(m, "extraInfo", extra);
    return root;
}

int mgpu_report_write_parent_error(const mgpu_plan_t *plan, const mgpu_run_result_t *res,
                                   const char *path, mgpu_err_t *err)
{
    const mgpu_outcome_t *o = res->root >= 0 ? &res->outcomes[res->root] : NULL;
    int code = o != NULL && !res->signal ? o->exit_code : res->exit_code, rc;
    cJSON *root = NULL, *m;
    char msg[1024], end[700], *text;
    struct iovec iov;
    mgpu_err_t aerr = {0};

    if (res->exit_code == 0)
        return 0;
    if (o != NULL && !res->signal) {
        char *file = read_file(o->error_file, 1 << 20);
        if (file != NULL)
            root = cJSON_ParseWithOpts(file, NULL, 0);
        free(file);
    }
    if (root == NULL) {
        const mgpu_rdzv_failure_t *f = &res->remote_failure;
        if (res->signal) {
            snprintf(msg, sizeof msg, "mgpu-launch received SIG%s and stopped the workers",
                     sigabbrev_np(res->signal));
        } else if (o != NULL) {
            describe_end(o, end, sizeof end);
            snprintf(msg, sizeof msg, "%s failed: rank %d (local_rank: %d) on %s, exitcode %s",
                     plan->entrypoint, o->rank, o->local_rank, plan->hostname, end);
        } else if (res->remote && f->rank >= 0) {
            snprintf(msg, sizeof msg,
                     "%s failed: rank %d (local_rank: %d) on node %d (%s), exitcode %d",
                     plan->entrypoint, f->rank, f->local_rank, f->node_rank, f->host, f->exit_code);
        } else if (res->remote && f->how[0]) {
            snprintf(msg, sizeof msg, "%s failed: node %d (%s) was %s", plan->entrypoint,
                     f->node_rank, f->host, f->how);
        } else if (res->remote) {
            snprintf(msg, sizeof msg, "%s failed: the launcher of node %d (%s) died or was stopped",
                     plan->entrypoint, f->node_rank, f->host);
        } else {
            snprintf(msg, sizeof msg, "%s failed: the launchers lost each other", plan->entrypoint);
        }
        root = generic_error(msg, o, o != NULL ? o->t_end : res->t_end);
    }
    /* torch's @record: the exit code, which a worker killed by a signal could not write */
    m = cJSON_GetObjectItemCaseSensitive(root, "message");
    if (cJSON_IsObject(m)) {
        cJSON_DeleteItemFromObjectCaseSensitive(m, "errorCode");
        cJSON_AddNumberToObject(m, "errorCode", code);
    }
    text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (text == NULL)
        return mgpu_err_set(err, -ENOMEM, "out of memory");
    iov.iov_base = text;
    iov.iov_len = strlen(text);
    if ((rc = mgpu_atomic_file_write(path, &iov, 1, 0, &aerr)) < 0)
        mgpu_err_set(err, rc, "TORCHELASTIC_ERROR_FILE: %s", aerr.msg);
    cJSON_free(text);
    return rc;
}

/* Calls fn for each "event=seconds" of a published timeline. */
static void timeline_each(const char *t, void (*fn)(void *, const char *, double), void *arg)
{
    char buf[512], *save = NULL;
    snprintf(buf, sizeof buf, "%s", t);
    for (char *kv = strtok_r(buf, ";", &save); kv; kv = strtok_r(NULL, ";", &save)) {
        char *eq = strchr(kv, '=');
        if (eq != NULL) {
            *eq = '\0';
            fn(arg, kv, atof(eq + 1));
        }
    }
}

typedef struct tl_cols {
    char names[12][32];
    int n;
    const mgpu_outcome_t *o;
    FILE *out;
} tl_cols_t;

static void tl_header(void *arg, const char *name, double t)
{
    tl_cols_t *c = arg;
    if (strcmp(name, "exec") == 0)
        return; /* the launcher's own exec time is exact; /proc's start time is in 10 ms ticks */
    for (int i = 0; i < c->n; i++)
        if (strcmp(c->names[i], name) == 0)
            return;
    if (c->n < 12)
        snprintf(c->names[c->n++], sizeof c->names[0], "%s", name);
}

static void tl_cell(void *arg, const char *name, double t)
{
    tl_cols_t *c = arg;
    if (strcmp(name, "exec") != 0)
        fprintf(c->out, " %11.1f", (t - c->o->t_start) * 1e3);
}

void mgpu_report_timeline(const mgpu_plan_t *plan, const mgpu_run_result_t *res, FILE *out)
{
    tl_cols_t c = {.out = out};
    for (int k = 0; k < res->nout; k++)
        timeline_each(res->outcomes[k].timeline, tl_header, &c);
    if (c.n == 0)
        return;
    fprintf(out, "startup timeline (ms after mgpu-launch spawned each worker):\n  rank %11s",
            "exec");
    for (int i = 0; i < c.n; i++)
        fprintf(out, " %11s", c.names[i]);
    fprintf(out, "\n");
    for (int k = 0; k < res->nout; k++) {
        if (!res->outcomes[k].timeline[0])
            continue;
        c.o = &res->outcomes[k];
        fprintf(out, "  %4d %11.1f", res->outcomes[k].rank,
                (res->outcomes[k].t_exec - res->outcomes[k].t_start) * 1e3);
        timeline_each(res->outcomes[k].timeline, tl_cell, &c);
        fprintf(out, "\n");
    }
}

static void tl_json(void *arg, const char *name, double t)
{
    cJSON_AddNumberToObject(arg, name, t);
}

static cJSON *outcome_json(const mgpu_plan_t *plan, const mgpu_outcome_t *o)
{
    cJSON *j = cJSON_CreateObject();
    const mgpu_worker_plan_t *w = &plan->workers[o->local_rank];
    char *msg = NULL, *trace = NULL;
    long ts = 0;

    cJSON_AddNumberToObject(j, "rank", o->rank);
    cJSON_AddNumberToObject(j, "local_rank", o->local_rank);
    cJSON_AddStringToObject(j, "host", plan->hostname);
    cJSON_AddNumberToObject(j, "pid", o->pid);
    cJSON_AddStringToObject(j, "state", state_name(o->state));
    cJSON_AddNumberToObject(j, "exit_code", o->exit_code);
    if (o->signal)
        cJSON_AddStringToObject(j, "signal", sigabbrev_np(o->signal));
    else
        cJSON_AddNullToObject(j, "signal");
    if (o->stop_signal)
        cJSON_AddStringToObject(j, "stopped_with", sigabbrev_np(o->stop_signal));
    if (o->exec_errno)
        cJSON_AddStringToObject(j, "exec_error", o->exec_reason);
    if (o->stalled)
        cJSON_AddBoolToObject(j, "stalled", 1);
    cJSON_AddNumberToObject(j, "start_time", o->t_start);
    cJSON_AddNumberToObject(j, "end_time", o->t_end);
    if (w->physical >= 0) {
        cJSON_AddNumberToObject(j, "cuda_ordinal", w->ordinal);
        cJSON_AddNumberToObject(j, "physical_gpu", w->physical);
        cJSON_AddStringToObject(j, "gpu_uuid", plan->gpus.gpus[w->physical].uuid);
        cJSON_AddBoolToObject(j, "simulated", plan->gpus.gpus[w->physical].simulated);
    } else {
        cJSON_AddStringToObject(j, "device", "cpu");
    }
    if (mgpu_report_read_error_file(o->error_file, &msg, &trace, &ts) == 0) {
        cJSON *e = cJSON_AddObjectToObject(j, "error_file");
        cJSON_AddStringToObject(e, "path", o->error_file);
        if (msg)
            cJSON_AddStringToObject(e, "message", msg);
        if (trace)
            cJSON_AddStringToObject(e, "traceback", trace);
        if (ts)
            cJSON_AddNumberToObject(e, "timestamp", (double)ts);
    }
    free(msg);
    free(trace);
    if (o->timeline[0]) {
        cJSON *t = cJSON_AddObjectToObject(j, "timeline");
        cJSON_AddNumberToObject(t, "spawn", o->t_start);
        timeline_each(o->timeline, tl_json, t);
        cJSON_DeleteItemFromObject(t, "exec");
        cJSON_AddNumberToObject(t, "exec", o->t_exec);
    }
    if (o->ntail) {
        cJSON *t = cJSON_AddArrayToObject(j, "stderr_tail");
        for (int i = 0; i < o->ntail; i++)
            cJSON_AddItemToArray(t, cJSON_CreateString(o->tail[i]));
        if (o->tail_both) /* one terminal carried stdout and stderr: their lines mixed */
            cJSON_AddBoolToObject(j, "stderr_tail_with_stdout", 1);
    }
    return j;
}

/* Seconds from t (CLOCK_MONOTONIC ns) to the report's now_ns. */
static double ago(const mgpu_stall_record_t *s, int64_t t)
{
    return t > 0 && t <= s->now_ns ? (double)(s->now_ns - t) / 1e9 : 0.0;
}

/* The summary's "stalls": every stall report, each rank as it was then. */
static cJSON *stalls_json(const mgpu_plan_t *plan, const mgpu_run_result_t *res)
{
    cJSON *arr = cJSON_CreateArray();

    for (int i = 0; arr != NULL && i < res->nstalls; i++) {
        const mgpu_stall_record_t *s = &res->stalls[i];
        cJSON *o = cJSON_CreateObject(), *ranks;
        cJSON_AddNumberToObject(o, "attempt", s->attempt);
        cJSON_AddNumberToObject(o, "time", s->time);
        cJSON_AddStringToObject(o, "report", s->line);
        ranks = cJSON_AddArrayToObject(o, "ranks");
        for (int k = 0; k < s->n; k++) {
            const mgpu_stall_rank_t *r = &s->ranks[k];
            const mgpu_progress_coll_t *c = mgpu_stall_coll(r);
            cJSON *j = cJSON_CreateObject();
            cJSON_AddNumberToObject(j, "rank", r->rank);
            cJSON_AddNumberToObject(j, "local_rank", r->local_rank);
            cJSON_AddNumberToObject(j, "pid", r->pid);
            cJSON_AddStringToObject(j, "host", plan->hostname);
            cJSON_AddBoolToObject(j, "running", r->alive);
            cJSON_AddBoolToObject(j, "paused", r->paused);
            cJSON_AddBoolToObject(j, "stalled", r->stalled);
            cJSON_AddBoolToObject(j, "culprit", r->culprit);
            if (r->attached) {
                cJSON_AddStringToObject(j, "phase", mgpu_progress_phase_name(r->page.phase));
                cJSON_AddNumberToObject(j, "step", (double)r->page.step);
                cJSON_AddNumberToObject(j, "phase_s", ago(s, r->page.phase_ns));
            } else {
                cJSON_AddNullToObject(j, "phase");
                cJSON_AddNullToObject(j, "step");
            }
            cJSON_AddNumberToObject(j, "since_s", ago(s, r->last_ns));
            if (c != NULL) {
                cJSON *w = cJSON_AddObjectToObject(j, "waiting_in");
                cJSON_AddStringToObject(w, "op", mgpu_progress_coll_name(c->op));
                cJSON_AddNumberToObject(w, "seq", (double)c->seq);
                cJSON_AddNumberToObject(w, "bytes", (double)c->bytes);
                cJSON_AddNumberToObject(w, "bucket", c->bucket);
                cJSON_AddNumberToObject(w, "for_s", ago(s, c->since_ns));
            } else {
                cJSON_AddNullToObject(j, "waiting_in");
            }
            cJSON_AddNumberToObject(j, "lines", (double)r->lines);
            cJSON_AddStringToObject(j, "last_line", r->last_line);
            cJSON_AddBoolToObject(j, "heartbeats", r->heartbeats);
            if (s->stacks != NULL && s->stacks[k] != NULL)
                cJSON_AddStringToObject(j, "stack", s->stacks[k]);
            else
                cJSON_AddNullToObject(j, "stack");
            cJSON_AddItemToArray(ranks, j);
        }
        cJSON_AddItemToArray(arr, o);
    }
    return arr;
}

int mgpu_report_write_summary(const mgpu_plan_t *plan, const mgpu_run_result_t *res,
                              const char *path, mgpu_err_t *err)
{
    cJSON *root = cJSON_CreateObject(), *workers, *history;
    char *text;
    int rc = 0;
    size_t len;
    struct iovec iov;
    mgpu_err_t aerr = {0};

    if (root == NULL)
        return mgpu_err_set(err, -ENOMEM, "out of memory");
    cJSON_AddStringToObject(root, "version", MGPU_VERSION);
    cJSON_AddStringToObject(root, "entrypoint", plan->entrypoint);
    cJSON_AddStringToObject(root, "host", plan->hostname);
    cJSON_AddStringToObject(root, "run_id", plan->run_id);
    cJSON_AddStringToObject(root, "result", res->exit_code == 0 ? "succeeded" : "failed");
    cJSON_AddNumberToObject(root, "exit_code", res->exit_code);
    if (res->signal)
        cJSON_AddStringToObject(root, "launcher_signal", sigabbrev_np(res->signal));
    cJSON_AddNumberToObject(root, "node_rank", plan->node_rank);
    cJSON_AddNumberToObject(root, "nnodes", plan->nnodes);
    cJSON_AddNumberToObject(root, "nproc_per_node", plan->nproc);
    cJSON_AddNumberToObject(root, "world_size", plan->world_size);
    cJSON_AddNumberToObject(root, "attempts", res->attempts);
    cJSON_AddNumberToObject(root, "max_restarts", plan->max_restarts);
    cJSON_AddBoolToObject(root, "simulated_gpus", plan->gpus.simulated);
    cJSON_AddNumberToObject(root, "start_time", res->t_start);
    cJSON_AddNumberToObject(root, "end_time", res->t_end);
    cJSON_AddNumberToObject(root, "duration_s", res->t_end - res->t_start);
    if (res->keep_logs)
        cJSON_AddStringToObject(root, "log_dir", res->log_root);
    if (res->root >= 0) {
        cJSON *cause = outcome_json(plan, &res->outcomes[res->root]);
        cJSON_AddNumberToObject(cause, "node_rank", plan->node_rank);
        cJSON_AddItemToObject(root, "root_cause", cause);
    } else if (res->remote) {
        cJSON *cause = cJSON_AddObjectToObject(root, "root_cause");
        cJSON_AddNumberToObject(cause, "node_rank", res->remote_failure.node_rank);
        cJSON_AddStringToObject(cause, "host", res->remote_failure.host);
        cJSON_AddNumberToObject(cause, "rank", res->remote_failure.rank);
        cJSON_AddNumberToObject(cause, "local_rank", res->remote_failure.local_rank);
        cJSON_AddNumberToObject(cause, "exit_code", res->remote_failure.exit_code);
        if (res->remote_failure.how[0])
            cJSON_AddStringToObject(cause, "how", res->remote_failure.how);
    } else {
        cJSON_AddNullToObject(root, "root_cause");
    }
    workers = cJSON_AddArrayToObject(root, "workers");
    for (int k = 0; k < res->nout; k++)
        cJSON_AddItemToArray(workers, outcome_json(plan, &res->outcomes[k]));
    history = cJSON_AddArrayToObject(root, "failed_attempts");
    for (int i = 0; i < res->nhistory; i++)
        cJSON_AddItemToArray(history, outcome_json(plan, &res->history[i]));
    for (int i = 0; i < res->nremote_history; i++) {
        const mgpu_rdzv_failure_t *f = &res->remote_history[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "node_rank", f->node_rank);
        cJSON_AddStringToObject(o, "host", f->host);
        cJSON_AddNumberToObject(o, "rank", f->rank);
        cJSON_AddNumberToObject(o, "local_rank", f->local_rank);
        cJSON_AddNumberToObject(o, "exit_code", f->exit_code);
        if (f->how[0])
            cJSON_AddStringToObject(o, "how", f->how);
        cJSON_AddItemToArray(history, o);
    }
    /* Every start of the group and its world (an elastic job's changes). */
    cJSON *worlds = cJSON_AddArrayToObject(root, "worlds");
    for (int i = 0; i < res->nworlds; i++) {
        const mgpu_attempt_record_t *w = &res->worlds[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "attempt", w->attempt);
        cJSON_AddNumberToObject(o, "restart_count", w->restarts);
        cJSON_AddNumberToObject(o, "nnodes", w->nnodes);
        cJSON_AddNumberToObject(o, "node_rank", w->node_rank);
        cJSON_AddNumberToObject(o, "world_size", w->world_size);
        cJSON_AddNumberToObject(o, "base_rank", w->base_rank);
        cJSON_AddStringToObject(o, "hosts", w->hosts);
        cJSON_AddNumberToObject(o, "start_time", w->t_start);
        if (w->t_first_exec > 0)
            cJSON_AddNumberToObject(o, "first_exec_time", w->t_first_exec);
        cJSON_AddNumberToObject(o, "end_time", w->t_end);
        cJSON_AddStringToObject(o, "end", w->end[0] ? w->end : "running");
        cJSON_AddItemToArray(worlds, o);
    }

    cJSON_AddItemToObject(root, "stalls", stalls_json(plan, res));

    text = cJSON_Print(root);
    cJSON_Delete(root);
    if (text == NULL)
        return mgpu_err_set(err, -ENOMEM, "out of memory");
    len = strlen(text);
    text[len] = '\n';
    iov.iov_base = text;
    iov.iov_len = len + 1;
    if ((rc = mgpu_atomic_file_write(path, &iov, 1, 0, &aerr)) < 0)
        mgpu_err_set(err, rc, "--summary: %s", aerr.msg);
    cJSON_free(text);
    return rc;
}
