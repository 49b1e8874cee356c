/* filetimer.c - torchrun's expiration timers on the launcher's loop (see filetimer.h). */
#include "filetimer.h"

#include <cjson/cJSON.h> /* cJSON_ParseWithOpts */
#include <errno.h>       /* errno */
#include <fcntl.h>       /* open, O_RDWR */
#include <limits.h>      /* PATH_MAX, PIPE_BUF */
#include <math.h>        /* isfinite */
#include <signal.h>      /* kill */
#include <stdio.h>       /* snprintf */
#include <stdlib.h>      /* malloc, free, mkdtemp */
#include <string.h>      /* strlen, strncmp */
#include <sys/stat.h>    /* mkfifo, lstat */
#include <unistd.h>      /* read, unlink, rmdir */

#include "clock.h" /* mgpu_clock_real */
#include "log.h"   /* mgpu_warn, mgpu_error */

#define SCOPE_MAX 256

typedef struct scope {
    pid_t pid;
    char id[SCOPE_MAX];
    double expires;  /* wall-clock seconds */
    double received; /* when the acquire came: "expired after N s" */
    int sig;
} scope_t;

struct mgpu_filetimer {
    uv_loop_t *loop;
    mgpu_filetimer_hooks_t hooks;
    uv_poll_t poll;
    uv_timer_t timer;
    int fd;
    int nopen;
    char path[PATH_MAX];
    char dir[PATH_MAX]; /* the private folder made for the FIFO, "" when the user named it */
    char **env;
    char *env_entry;
    scope_t *scopes;
    int nscopes, cap;
    char line[PIPE_BUF + 2]; /* a request in the making */
    size_t len;
    int overlong; /* the current line is past PIPE_BUF: dropped up to its newline */
};

static const char *env_get(char **env, const char *key)
{
    size_t kl = strlen(key);
    for (char **e = env; e && *e; e++)
        if (strncmp(*e, key, kl) == 0 && (*e)[kl] == '=')
            return *e + kl + 1;
    return NULL;
}

/* The local index of the worker pid is, or descends from (through /proc's parent links). */
static int owner(mgpu_filetimer_t *ft, pid_t pid, int *rank)
{
    for (int depth = 0; pid > 1 && depth < 64; depth++) {
        char path[64], buf[512], *p;
        ssize_t r;
        int fd, k = ft->hooks.worker_of(ft->hooks.arg, pid, rank);
        if (k >= 0)
            return k;
        snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
        if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
            return -1;
        r = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (r <= 0)
            return -1;
        buf[r] = '\0';
        /* "pid (comm) S ppid ...": comm may hold spaces and parentheses. */
        if ((p = strrchr(buf, ')')) == NULL || sscanf(p + 1, " %*c %d", &pid) != 1)
            return -1;
    }
    return -1;
}

static void rearm(mgpu_filetimer_t *ft);

static void drop_scope(mgpu_filetimer_t *ft, int i)
{
    ft->scopes[i] = ft->scopes[--ft->nscopes];
}

/* Every expired scope: its pid gets the signal of its earliest expired scope with one, and all
 * its scopes go (torchrun's FileTimerServer does the same). */
static void on_timer(uv_timer_t *t)
{
    mgpu_filetimer_t *ft = t->data;
    double now = mgpu_clock_real();

    for (;;) {
        int first = -1, pick = -1;
        for (int i = 0; i < ft->nscopes; i++)
            if (ft->scopes[i].expires <= now &&
                (first < 0 || ft->scopes[i].expires < ft->scopes[first].expires))
                first = i;
        if (first < 0)
            break;
        pid_t pid = ft->scopes[first].pid;
        for (int i = 0; i < ft->nscopes; i++)
            if (ft->scopes[i].pid == pid && ft->scopes[i].expires <= now && ft->scopes[i].sig > 0 &&
                (pick < 0 || ft->scopes[i].expires < ft->scopes[pick].expires))
                pick = i;
        scope_t sc = ft->scopes[pick >= 0 ? pick : first];
        int rank = -1, k = owner(ft, pid, &rank);
        char line[600], who[96];
        double after = now - sc.received;

        if (k < 0)
            snprintf(who, sizeof who, "pid %d", (int)pid);
        else
            snprintf(who, sizeof who, "rank %d (local %d, pid %d)", rank, k, (int)pid);
        if (kill(pid, 0) != 0 && errno == ESRCH) {
            mgpu_debug("timer: scope '%s' of pid %d expired; the process is gone", sc.id, (int)pid);
        } else if (k < 0) {
            mgpu_warn("timer: scope '%s' of pid %d expired, but pid %d is not a process of this "
                      "job: not signalled",
                      sc.id, (int)pid, (int)pid);
        } else if (pick < 0) {
            snprintf(line, sizeof line,
                     "timer: %s scope '%s' expired after %.1f s; no signal requested", who, sc.id,
                     after < 0 ? 0 : after);
            mgpu_warn("%s", line);
            ft->hooks.expired(ft->hooks.arg, k, line);
        } else {
            int rc = kill(pid, sc.sig);
            const char *name = sigabbrev_np(sc.sig);
            char sname[32];
            if (name != NULL)
                snprintf(sname, sizeof sname, "SIG%s", name);
            else
                snprintf(sname, sizeof sname, "signal %d", sc.sig);
            if (rc == 0)
                snprintf(line, sizeof line, "timer: %s scope '%s' expired after %.1f s; sent %s",
                         who, sc.id, after < 0 ? 0 : after, sname);
            else
                snprintf(line, sizeof line,
                         "timer: %s scope '%s' expired after %.1f s; kill(%s): %s", who, sc.id,
                         after < 0 ? 0 : after, sname, strerror(errno));
            mgpu_warn("%s", line);
            ft->hooks.expired(ft->hooks.arg, k, line);
        }
        for (int i = ft->nscopes - 1; i >= 0; i--)
            if (ft->scopes[i].pid == pid)
                drop_scope(ft, i);
    }
    rearm(ft);
}

/* The timer fires at the earliest expiry. */
static void rearm(mgpu_filetimer_t *ft)
{
    double first = 0, now = mgpu_clock_real();
    uv_timer_stop(&ft->timer);
    if (ft->nscopes == 0)
        return;
    for (int i = 0; i < ft->nscopes; i++)
        if (i == 0 || ft->scopes[i].expires < first)
            first = ft->scopes[i].expires;
    double ms = (first - now) * 1e3;
    /* A day at most: an absurd expiry must not overflow the timer; it is re-armed then. */
    ms = ms < 0 ? 0 : ms > 86400e3 ? 86400e3 : ms;
    uv_timer_start(&ft->timer, on_timer, (uint64_t)ms + 1, 0);
}

static void malformed(const char *line, const char *why)
{
    mgpu_warn("timer: ignoring a malformed request (%s): %.200s", why, line);
}

/* One request line. */
static void on_request(mgpu_filetimer_t *ft, const char *line)
{
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithOpts(line, &end, 0);
    const cJSON *pid, *scope, *exp, *sig;
    int i;

    if (j == NULL || !cJSON_IsObject(j)) {
        malformed(line, "not a JSON object");
        goto out;
    }
    pid = cJSON_GetObjectItemCaseSensitive(j, "pid");
    scope = cJSON_GetObjectItemCaseSensitive(j, "scope_id");
    exp = cJSON_GetObjectItemCaseSensitive(j, "expiration_time");
    sig = cJSON_GetObjectItemCaseSensitive(j, "signal");
    if (!cJSON_IsNumber(pid) || pid->valuedouble < 2 || pid->valuedouble > 4194304 ||
        pid->valuedouble != (double)(int)pid->valuedouble) {
        malformed(line, "\"pid\" must be a process id");
        goto out;
    }
    if (!cJSON_IsString(scope) || strlen(scope->valuestring) >= SCOPE_MAX) {
        malformed(line, "\"scope_id\" must be a string shorter than 256 bytes");
        goto out;
    }
    if (!cJSON_IsNumber(exp) || !isfinite(exp->valuedouble)) {
        malformed(line, "\"expiration_time\" must be a number");
        goto out;
    }
    if (sig != NULL && (!cJSON_IsNumber(sig) || sig->valuedouble >= 65 ||
                        sig->valuedouble != (double)(int)sig->valuedouble)) {
        malformed(line, "\"signal\" must be a signal number");
        goto out;
    }
    for (i = 0; i < ft->nscopes; i++)
        if (ft->scopes[i].pid == (pid_t)pid->valueint &&
            strcmp(ft->scopes[i].id, scope->valuestring) == 0)
            break;
    if (exp->valuedouble < 0) { /* release */
        if (i < ft->nscopes)
            drop_scope(ft, i);
        rearm(ft);
        goto out;
    }
    if (i == ft->nscopes) {
        if (ft->nscopes == ft->cap) {
            int cap = ft->cap ? ft->cap * 2 : 16;
            scope_t *s = cap <= 65536 ? realloc(ft->scopes, (size_t)cap * sizeof *s) : NULL;
            if (s == NULL) {
                malformed(line, "too many scopes held at once");
                goto out;
            }
            ft->scopes = s;
            ft->cap = cap;
        }
        ft->nscopes++;
    }
    ft->scopes[i].pid = (pid_t)pid->valueint;
    snprintf(ft->scopes[i].id, SCOPE_MAX, "%s", scope->valuestring);
    ft->scopes[i].expires = exp->valuedouble;
    ft->scopes[i].received = mgpu_clock_real();
    ft->scopes[i].sig = sig != NULL ? sig->valueint : 0;
    rearm(ft);
out:
    cJSON_Delete(j);
}

static void on_readable(uv_poll_t *p, int status, int events)
{
    mgpu_filetimer_t *ft = p->data;
    char buf[4096];
    ssize_t n;

    /* The launcher holds the FIFO open for writing too (O_RDWR): it never reads EOF, and
     * read() returns EAGAIN once the writers' bytes are consumed. */
    while ((n = read(ft->fd, buf, sizeof buf)) > 0) {
        for (ssize_t i = 0; i < n; i++) {
            char c = buf[i];
            if (c == '\n') {
                if (ft->overlong)
                    mgpu_warn("timer: ignoring a request longer than %d bytes", PIPE_BUF);
                else if (ft->len > 0) {
                    ft->line[ft->len] = '\0';
                    on_request(ft, ft->line);
                }
                ft->len = 0;
                ft->overlong = 0;
            } else if (ft->len < PIPE_BUF) {
                ft->line[ft->len++] = c;
            } else {
                ft->overlong = 1;
            }
        }
    }
}

static char **timer_env(char **environ_, const char *entry)
{
    size_t n = 0, k = 0;
    char **env;
    while (environ_ && environ_[n])
        n++;
    if ((env = calloc(n + 2, sizeof *env)) == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ_[i], "TORCHELASTIC_TIMER_FILE=", 24) != 0)
            env[k++] = environ_[i];
    env[k] = (char *)entry;
    return env;
}

static void free_module(mgpu_filetimer_t *ft)
{
    if (ft->fd >= 0)
        close(ft->fd);
    if (ft->path[0])
        unlink(ft->path);
    if (ft->dir[0])
        rmdir(ft->dir);
    free(ft->env);
    free(ft->env_entry);
    free(ft->scopes);
    free(ft);
}

int mgpu_filetimer_open(uv_loop_t *loop, char **environ_, const mgpu_filetimer_hooks_t *hooks,
                        mgpu_filetimer_t **out, mgpu_err_t *err)
{
    const char *on = env_get(environ_, "TORCHELASTIC_ENABLE_FILE_TIMER");
    const char *user = env_get(environ_, "TORCHELASTIC_TIMER_FILE");
    mgpu_filetimer_t *ft;
    struct stat st;
    int rc;

    *out = NULL;
    if (on == NULL || strcmp(on, "1") != 0)
        return 0; /* torchrun starts its server only for "1" */
    if ((ft = calloc(1, sizeof *ft)) == NULL)
        return mgpu_err_set(err, -ENOMEM, "expiration timers: out of memory");
    ft->fd = -1;
    ft->loop = loop;
    ft->hooks = *hooks;
    if (user != NULL && user[0] != '\0') {
        /* The user's path, as torchrun takes it; a FIFO left there by an earlier run is
         * replaced, anything else is left alone. */
        if (snprintf(ft->path, sizeof ft->path, "%s", user) >= (int)sizeof ft->path) {
            ft->path[0] = '\0';
            rc = mgpu_err_set(err, MGPU_E_USAGE, "TORCHELASTIC_TIMER_FILE=%.100s...: too long",
                              user);
            goto fail;
        }
        if (lstat(ft->path, &st) == 0) {
            if (!S_ISFIFO(st.st_mode)) {
                rc = mgpu_err_set(err, MGPU_E_USAGE,
                                  "TORCHELASTIC_TIMER_FILE=%s: exists and is not a FIFO "
                                  "(expected a free path for the timers' FIFO)",
                                  ft->path);
                ft->path[0] = '\0'; /* not ours to remove */
                goto fail;
            }
            unlink(ft->path);
        }
    } else {
        const char *tmp = env_get(environ_, "TMPDIR");
        snprintf(ft->dir, sizeof ft->dir, "%s/mgpu-timer-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (mkdtemp(ft->dir) == NULL) { /* 0700: no other user can reach the FIFO */
            rc = mgpu_err_set(err, -errno, "expiration timers: mkdtemp(%s): %s", ft->dir,
                              strerror(errno));
            ft->dir[0] = '\0';
            goto fail;
        }
        snprintf(ft->path, sizeof ft->path, "%s/timer", ft->dir);
    }
    if (mkfifo(ft->path, 0600) != 0) {
        rc = mgpu_err_set(err, -errno, "expiration timers: mkfifo(%s): %s", ft->path,
                          strerror(errno));
        ft->path[0] = '\0';
        goto fail;
    }
    /* O_RDWR: the FIFO always has a writer (this descriptor), so workers that come and go
     * never make it read EOF, and opening it never blocks. */
    if ((ft->fd = open(ft->path, O_RDWR | O_NONBLOCK | O_CLOEXEC)) < 0) {
        rc =
            mgpu_err_set(err, -errno, "expiration timers: open(%s): %s", ft->path, strerror(errno));
        goto fail;
    }
    if ((ft->env_entry = malloc(strlen(ft->path) + 32)) == NULL) {
        rc = mgpu_err_set(err, -ENOMEM, "expiration timers: out of memory");
        goto fail;
    }
    sprintf(ft->env_entry, "TORCHELASTIC_TIMER_FILE=%s", ft->path);
    if ((ft->env = timer_env(environ_, ft->env_entry)) == NULL) {
        rc = mgpu_err_set(err, -ENOMEM, "expiration timers: out of memory");
        goto fail;
    }
    if ((rc = uv_poll_init(loop, &ft->poll, ft->fd)) < 0) {
        rc = mgpu_err_set(err, rc, "expiration timers: uv_poll_init(%s): %s", ft->path,
                          uv_strerror(rc));
        goto fail;
    }
    ft->poll.data = ft;
    uv_poll_start(&ft->poll, UV_READABLE, on_readable);
    uv_timer_init(loop, &ft->timer);
    ft->timer.data = ft;
    mgpu_info("expiration timers: serving %s (TORCHELASTIC_TIMER_FILE)", ft->path);
    *out = ft;
    return 0;
fail:
    free_module(ft);
    return rc;
}

char **mgpu_filetimer_environ(const mgpu_filetimer_t *ft)
{
    return ft->env;
}

const char *mgpu_filetimer_path(const mgpu_filetimer_t *ft)
{
    return ft->path;
}

const char *mgpu_filetimer_dir(const mgpu_filetimer_t *ft)
{
    return ft->dir;
}

static void on_closed(uv_handle_t *h)
{
    mgpu_filetimer_t *ft = h->data;
    if (--ft->nopen == 0)
        free_module(ft);
}

void mgpu_filetimer_close(mgpu_filetimer_t *ft)
{
    if (ft == NULL)
        return;
    ft->nopen = 2;
    uv_close((uv_handle_t *)&ft->poll, on_closed);
    uv_close((uv_handle_t *)&ft->timer, on_closed);
}
