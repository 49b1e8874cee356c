/* stacks.c - every rank's stack through py-spy, gdb or eu-stack (see stacks.h).
 *
 * The tools are forked here rather than through uv_spawn: the supervisor reaps with
 * waitpid(-1) (it is the subreaper of the job), so libuv's own per-pid waitpid would find the
 * tool gone and never call its exit callback. A tool's end is seen instead through a pidfd
 * (readable once the process has exited, whoever reaps it) and the EOF of its output pipe;
 * its exit status, when the supervisor took it first, is simply unknown, and success is
 * judged from the output (frames printed) rather than from the status. */
#include "stacks.h"

#include <errno.h>       /* errno */
#include <fcntl.h>       /* open, O_RDONLY */
#include <limits.h>      /* PATH_MAX */
#include <signal.h>      /* kill, SIGKILL */
#include <stdio.h>       /* snprintf */
#include <stdlib.h>      /* malloc, free, getenv */
#include <string.h>      /* strlen, memcpy, strncmp */
#include <sys/prctl.h>   /* PR_SET_PDEATHSIG */
#include <sys/syscall.h> /* SYS_pidfd_open */
#include <sys/wait.h>    /* waitpid */
#include <unistd.h>      /* fork, execve, access */

extern char **environ;

/* The programs, looked up in PATH. */
enum { TOOL_PYSPY, TOOL_GDB, TOOL_EUSTACK, TOOL_N };
static const char *const tool_names[TOOL_N] = {"py-spy", "gdb", "eu-stack"};
/* The ways to run them, tried in this order: py-spy with the native frames (the C function
 * a Python program is blocked in, such as clock_nanosleep), then without them (unwinding
 * native frames needs the process paused, and may fail on some builds), then gdb, then
 * eu-stack. */
enum { WAY_PYSPY_NATIVE, WAY_PYSPY, WAY_GDB, WAY_EUSTACK, WAY_N };
static const int way_tool[WAY_N] = {TOOL_PYSPY, TOOL_PYSPY, TOOL_GDB, TOOL_EUSTACK};
static const char *const way_names[WAY_N] = {"py-spy --native", "py-spy", "gdb", "eu-stack"};

struct coll;

typedef struct job {
    struct coll *c;
    pid_t target;
    int stopped;      /* the target is stopped (SIGSTOP, a debugger): tools must not wait */
    int chain[WAY_N]; /* the ways to try, in order */
    int nchain, at;   /* how many; the one running or last run */
    pid_t tool;       /* the running tool, -1 when none */
    uv_pipe_t pipe;   /* the tool's stdout and stderr */
    uv_poll_t poll;   /* the tool's pidfd */
    int pidfd;        /* -1 when the kernel has no pidfd_open */
    int poll_open;    /* poll watches pidfd (closed with the handle) */
    int nopen;        /* handles of this tool not yet closed */
    int eof, exited;  /* the output ended; the process ended */
    int status;       /* wait status, -1 when another reaper took it */
    int timed_out;    /* killed at the deadline */
    char *buf;        /* the tool's output, MGPU_STACKS_MAX at most */
    size_t len;
    int cut;          /* output beyond MGPU_STACKS_MAX was dropped */
    char notes[1024]; /* one line per tool that failed before the one that worked */
    char *text;       /* the result, once done */
} job_t;

typedef struct coll {
    uv_loop_t *loop;
    job_t *jobs;
    int n, left;      /* jobs; jobs not done */
    uv_timer_t timer; /* the deadline */
    double timeout_s;
    int closing;                 /* the timer is being closed: the callback is next */
    int expired;                 /* the deadline has passed: no further tool starts */
    char path[TOOL_N][PATH_MAX]; /* "" when the tool is not in PATH */
    char **env;                  /* the tools' environment */
    int devnull;
    mgpu_stacks_cb cb;
    void *arg;
    char rbuf[65536]; /* libuv reads into it, then the bytes are copied to their job */
} coll_t;

static void job_start_tool(job_t *j);

/* Looks name up in PATH into out ("" when absent or not executable). */
static void find_in_path(const char *name, char *out, size_t len)
{
    const char *p = getenv("PATH");
    out[0] = '\0';
    if (p == NULL || p[0] == '\0')
        p = "/usr/local/bin:/usr/bin:/bin";
    while (*p) {
        const char *e = strchr(p, ':');
        size_t dl = e ? (size_t)(e - p) : strlen(p);
        char cand[PATH_MAX];
        if (dl > 0 && snprintf(cand, sizeof cand, "%.*s/%s", (int)dl, p, name) < (int)sizeof cand &&
            access(cand, X_OK) == 0) {
            snprintf(out, len, "%s", cand);
            return;
        }
        p += dl;
        if (*p == ':')
            p++;
    }
}

/* Whether a program's name is a Python interpreter's: python, python3, python3.11, ... */
static int is_python_name(const char *path)
{
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    if (strncmp(b, "python", 6) != 0)
        return 0;
    for (b += 6; *b; b++)
        if ((*b < '0' || *b > '9') && *b != '.')
            return 0;
    return 1;
}

static int target_is_python(pid_t pid)
{
    char link[64], exe[PATH_MAX], cmd[PATH_MAX];
    ssize_t r;
    int fd;

    snprintf(link, sizeof link, "/proc/%d/exe", (int)pid);
    if ((r = readlink(link, exe, sizeof exe - 1)) > 0) {
        exe[r] = '\0';
        if (is_python_name(exe))
            return 1;
    }
    /* argv[0], for an interpreter reached through a differently named link (a venv's). */
    snprintf(link, sizeof link, "/proc/%d/cmdline", (int)pid);
    if ((fd = open(link, O_RDONLY | O_CLOEXEC)) < 0)
        return 0;
    r = read(fd, cmd, sizeof cmd - 1);
    close(fd);
    if (r <= 0)
        return 0;
    cmd[r] = '\0';
    return is_python_name(cmd);
}

/* The process's state letter from /proc/<pid>/stat ('T' stopped, 't' traced), 0 if gone. */
static char target_state(pid_t pid)
{
    char path[64], buf[512], *p;
    ssize_t r;
    int fd;

    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return 0;
    r = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (r <= 0)
        return 0;
    buf[r] = '\0';
    /* "pid (comm) S ...": comm may hold spaces and parentheses, so the last ')' ends it. */
    if ((p = strrchr(buf, ')')) == NULL || p[1] != ' ')
        return 0;
    return p[2];
}

/* The tools' environment: the launcher's without DEBUGINFOD_URLS, so gdb and eu-stack never
 * go to the network for debug symbols while the deadline runs. */
static char **tools_env(void)
{
    size_t n = 0, k = 0;
    char **env;
    while (environ[n])
        n++;
    if ((env = calloc(n + 1, sizeof *env)) == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "DEBUGINFOD_URLS=", 16) != 0)
            env[k++] = environ[i];
    return env;
}

/* gdb's lines that say nothing about where the process is. */
static int gdb_noise(const char *s, size_t n)
{
    static const char *const prefixes[] = {
        "[New LWP",   "[New Thread", "[Thread debugging", "Using host libthread_db",
        "[Inferior ", "warning: ",   "Download failed",   "Reading symbols from"};
    for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++) {
        size_t pl = strlen(prefixes[i]);
        if (n >= pl && memcmp(s, prefixes[i], pl) == 0)
            return 1;
    }
    /* "27\t../sysdeps/unix/sysv/linux/clock_nanosleep.c: No such file or directory." */
    static const char nosrc[] = ": No such file or directory.";
    if (n > sizeof nosrc && s[0] >= '0' && s[0] <= '9' &&
        memcmp(s + n - (sizeof nosrc - 1), nosrc, sizeof nosrc - 1) == 0)
        return 1;
    return 0;
}

/* Removes gdb's noise lines from j->buf, in place. */
static void strip_gdb(job_t *j)
{
    size_t r = 0, w = 0;
    while (r < j->len) {
        char *nl = memchr(j->buf + r, '\n', j->len - r);
        size_t n = nl ? (size_t)(nl - (j->buf + r)) : j->len - r;
        size_t take = nl ? n + 1 : n;
        if (!gdb_noise(j->buf + r, n)) {
            memmove(j->buf + w, j->buf + r, take);
            w += take;
        }
        r += take;
    }
    j->len = w;
}

/* Whether the output holds a stack: a frame line ("#0 ") for gdb and eu-stack, a thread
 * header for py-spy. */
static int has_stack(const job_t *j, int tool)
{
    const char *mark = tool == TOOL_PYSPY ? "Thread " : "#0 ";
    size_t ml = strlen(mark);
    for (size_t i = 0; i + ml <= j->len; i++)
        if ((i == 0 || j->buf[i - 1] == '\n') && memcmp(j->buf + i, mark, ml) == 0)
            return 1;
    return 0;
}

/* The first non-empty line of the output, for a one-line reason. */
static void first_line(const job_t *j, char *out, size_t len)
{
    size_t i = 0, n;
    while (i < j->len && (j->buf[i] == '\n' || j->buf[i] == ' '))
        i++;
    for (n = 0; i + n < j->len && j->buf[i + n] != '\n'; n++)
        ;
    snprintf(out, len, "%.*s", (int)(n > 200 ? 200 : n), j->buf + i);
}

static void append(char *dst, size_t cap, const char *fmt, const char *a, const char *b)
{
    size_t l = strlen(dst);
    if (l < cap)
        snprintf(dst + l, cap - l, fmt, a, b);
}

static void coll_on_timer_closed(uv_handle_t *h)
{
    coll_t *c = h->data;
    char **texts = malloc((size_t)(c->n > 0 ? c->n : 1) * sizeof *texts);

    for (int i = 0; i < c->n; i++) {
        if (texts != NULL)
            texts[i] = c->jobs[i].text;
        else
            free(c->jobs[i].text);
        free(c->jobs[i].buf);
    }
    if (c->devnull >= 0)
        close(c->devnull);
    free(c->env);
    free(c->jobs);
    /* Out of memory for the array alone: the callback still runs, with no texts. */
    c->cb(c->arg, texts, texts != NULL ? c->n : 0);
    free(c);
}

static void coll_maybe_finish(coll_t *c)
{
    if (c->left > 0 || c->closing)
        return;
    c->closing = 1;
    uv_timer_stop(&c->timer);
    /* The close callback runs on a later turn of the loop: the caller's cb never runs inside
     * mgpu_stacks_collect, even when there was nothing to collect. */
    uv_close((uv_handle_t *)&c->timer, coll_on_timer_closed);
}

static void job_finish(job_t *j, char *text)
{
    j->text = text;
    j->c->left--;
    coll_maybe_finish(j->c);
}

/* "stack unavailable: <notes><why>" as the job's text. */
static void job_unavailable(job_t *j, const char *why)
{
    size_t n = strlen(j->notes) + strlen(why) + 64;
    char *t = malloc(n);
    if (t != NULL)
        snprintf(t, n, "stack unavailable: %s%s", j->notes, why);
    job_finish(j, t);
}

/* The tool is over (exited and its output read, or killed at the deadline): keep its stack,
 * or note why it failed and go on with the next tool. */
static void job_tool_done(job_t *j)
{
    int tool = way_tool[j->chain[j->at]];
    const char *name = way_names[j->chain[j->at]];
    char line[256], status[64] = "";

    if (tool == TOOL_GDB)
        strip_gdb(j);
    if (j->timed_out) {
        /* "<tool> timed out after N s" and what it printed so far. */
        size_t n = strlen(j->notes) + j->len + 160;
        char *t = malloc(n);
        if (t != NULL) {
            int h = snprintf(t, n, "%s%s timed out after %g s%s%s", j->notes, name, j->c->timeout_s,
                             j->stopped ? " (the process is stopped)" : "",
                             j->len ? "; its output so far:\n" : "");
            memcpy(t + h, j->buf, j->len);
            t[h + j->len] = '\0';
        }
        job_finish(j, t);
        return;
    }
    if (has_stack(j, tool)) {
        size_t n = strlen(j->notes) + j->len + 80;
        char *t = malloc(n);
        if (t != NULL) {
            /* The failures before it on a line of their own, above the stack. */
            size_t l = strlen(j->notes);
            int h = snprintf(t, n, "%.*s%s", (int)(l >= 2 ? l - 2 : 0), j->notes, l ? "\n" : "");
            memcpy(t + h, j->buf, j->len);
            h += (int)j->len;
            if (j->cut)
                h += snprintf(t + h, n - (size_t)h, "\n[cut at %d KiB]", MGPU_STACKS_MAX / 1024);
            t[h] = '\0';
        }
        job_finish(j, t);
        return;
    }
    first_line(j, line, sizeof line);
    if (j->status >= 0 && WIFEXITED(j->status))
        snprintf(status, sizeof status, "exit status %d", WEXITSTATUS(j->status));
    else if (j->status >= 0 && WIFSIGNALED(j->status))
        snprintf(status, sizeof status, "killed by %s", sigabbrev_np(WTERMSIG(j->status)));
    else
        snprintf(status, sizeof status, "no stack printed");
    append(j->notes, sizeof j->notes, "%s failed (%s", name, status);
    append(j->notes, sizeof j->notes, "%s%s); ", line[0] ? ": " : "", line);
    j->len = 0;
    j->cut = 0;
    if (++j->at < j->nchain && !j->c->expired) {
        job_start_tool(j);
        return;
    }
    if (j->at < j->nchain)
        append(j->notes, sizeof j->notes, "%s%s", "the deadline passed before ",
               way_names[j->chain[j->at]]);
    /* The notes end with "; ": drop it. */
    size_t l = strlen(j->notes);
    if (l >= 2 && strcmp(j->notes + l - 2, "; ") == 0)
        j->notes[l - 2] = '\0';
    job_unavailable(j, "");
}

static void job_on_closed(uv_handle_t *h)
{
    job_t *j = h->data;
    if (h == (uv_handle_t *)&j->poll) {
        close(j->pidfd); /* libuv has let go of it */
        j->pidfd = -1;
    }
    if (--j->nopen == 0)
        job_tool_done(j);
}

/* Both ends seen (or given up at the deadline): the tool's handles go, then job_tool_done. */
static void job_close_handles(job_t *j)
{
    j->tool = -1;
    uv_close((uv_handle_t *)&j->pipe, job_on_closed);
    if (j->poll_open) {
        j->poll_open = 0;
        uv_close((uv_handle_t *)&j->poll, job_on_closed);
    }
}

static void job_reap(job_t *j)
{
    int st;
    pid_t r;
    while ((r = waitpid(j->tool, &st, WNOHANG)) < 0 && errno == EINTR)
        ;
    if (r == j->tool)
        j->status = st;
    j->exited = 1;
}

static void job_maybe_done(job_t *j)
{
    if (!j->eof)
        return;
    /* Without a pidfd, the end of the output stands for the end of the process. */
    if (!j->poll_open && !j->exited)
        job_reap(j);
    if (j->exited)
        job_close_handles(j);
}

static void job_on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
    job_t *j = h->data;
    buf->base = j->c->rbuf;
    buf->len = sizeof j->c->rbuf;
}

static void job_on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    job_t *j = s->data;

    if (n > 0) {
        size_t room = MGPU_STACKS_MAX - j->len, take = (size_t)n < room ? (size_t)n : room;
        memcpy(j->buf + j->len, buf->base, take);
        j->len += take;
        if (take < (size_t)n)
            j->cut = 1;
        return;
    }
    if (n < 0) {
        uv_read_stop(s);
        j->eof = 1;
        job_maybe_done(j);
    }
}

static void job_on_exit(uv_poll_t *p, int status, int events)
{
    job_t *j = p->data;
    uv_poll_stop(p);
    job_reap(j);
    job_maybe_done(j);
}

/* Forks and execs the job's current tool with its output to a pipe. On failure the tool is
 * noted as failed and the next one is tried. */
static void job_start_tool(job_t *j)
{
    coll_t *c = j->c;
    int way = j->chain[j->at], tool = way_tool[way];
    char pidstr[16], nomsg[PATH_MAX + 32];
    char *argv[12];
    int fds[2], a = 0;
    pid_t parent = getpid();

    snprintf(pidstr, sizeof pidstr, "%d", (int)j->target);
    argv[a++] = c->path[tool];
    if (tool == TOOL_PYSPY) {
        argv[a++] = "dump";
        argv[a++] = "--pid";
        argv[a++] = pidstr;
        /* py-spy pauses the process through ptrace while it reads, and waits for it to stop:
         * a process stopped already would keep it waiting. Reading without the pause is safe
         * when the process cannot run anyway. */
        if (j->stopped)
            argv[a++] = "--nonblocking";
        else if (way == WAY_PYSPY_NATIVE)
            argv[a++] = "--native";
    } else if (tool == TOOL_GDB) {
        argv[a++] = "-q";
        argv[a++] = "-nx";
        argv[a++] = "-batch";
        argv[a++] = "-p";
        argv[a++] = pidstr;
        argv[a++] = "-ex";
        argv[a++] = "thread apply all bt";
    } else {
        argv[a++] = "-p";
        argv[a++] = pidstr;
    }
    argv[a] = NULL;
    snprintf(nomsg, sizeof nomsg, "cannot run %s\n", c->path[tool]);

    j->eof = j->exited = j->timed_out = 0;
    j->status = -1;
    j->tool = -1;
    j->pidfd = -1;
    if (pipe2(fds, O_CLOEXEC) != 0)
        goto fail;
    j->tool = fork();
    if (j->tool == 0) {
        /* The child: async-signal-safe calls only (the launcher has threads). */
        sigset_t none;
        setpgid(0, 0); /* the deadline's SIGKILL takes whatever the tool started */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        dup2(c->devnull, 0);
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        if (close_range(3, ~0u, 0) != 0)
            for (int fd = 3; fd < 4096; fd++)
                close(fd);
        signal(SIGPIPE, SIG_DFL);
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        execve(argv[0], argv, c->env);
        if (write(2, nomsg, strlen(nomsg)) < 0)
            _exit(127);
        _exit(127);
    }
    close(fds[1]);
    if (j->tool < 0) {
        close(fds[0]);
        goto fail;
    }
    uv_pipe_init(c->loop, &j->pipe, 0);
    j->pipe.data = j;
    j->nopen = 1;
    uv_pipe_open(&j->pipe, fds[0]);
    uv_read_start((uv_stream_t *)&j->pipe, job_on_alloc, job_on_read);
    j->pidfd = (int)syscall(SYS_pidfd_open, j->tool, 0);
    if (j->pidfd >= 0 && uv_poll_init(c->loop, &j->poll, j->pidfd) == 0) {
        j->poll.data = j;
        j->poll_open = 1;
        j->nopen++;
        uv_poll_start(&j->poll, UV_READABLE, job_on_exit);
    } else if (j->pidfd >= 0) {
        close(j->pidfd);
        j->pidfd = -1;
    }
    return;
fail:
    append(j->notes, sizeof j->notes, "%s failed (%s); ", way_names[way], strerror(errno));
    if (++j->at < j->nchain)
        job_start_tool(j);
    else
        job_unavailable(j, "no tool could be started");
}

/* The deadline: every tool still running is killed, and keeps what it printed. */
static void coll_on_deadline(uv_timer_t *t)
{
    coll_t *c = t->data;
    c->expired = 1;
    for (int i = 0; i < c->n; i++) {
        job_t *j = &c->jobs[i];
        if (j->tool <= 0) /* done, or its handles already closing */
            continue;
        j->timed_out = 1;
        kill(-j->tool, SIGKILL);
        kill(j->tool, SIGKILL);
        /* Not waiting for the exit: a tool in an uninterruptible sleep may take its time.
         * Under the supervisor, its waitpid(-1) reaps it whenever it goes; here, one try. */
        job_reap(j);
        if (!j->eof)
            uv_read_stop((uv_stream_t *)&j->pipe);
        j->eof = j->exited = 1;
        job_close_handles(j);
    }
}

static void job_begin(job_t *j)
{
    coll_t *c = j->c;
    char st = target_state(j->target);

    if (st == 0 || st == 'Z' || st == 'X') {
        char why[64];
        snprintf(why, sizeof why, st ? "process %d has exited" : "no process %d", (int)j->target);
        job_unavailable(j, why);
        return;
    }
    j->stopped = st == 'T' || st == 't';
    if (c->path[TOOL_PYSPY][0] && target_is_python(j->target)) {
        /* A stopped process cannot be paused for the native frames: py-spy alone. */
        if (!j->stopped)
            j->chain[j->nchain++] = WAY_PYSPY_NATIVE;
        j->chain[j->nchain++] = WAY_PYSPY;
    }
    if (c->path[TOOL_GDB][0])
        j->chain[j->nchain++] = WAY_GDB;
    if (c->path[TOOL_EUSTACK][0])
        j->chain[j->nchain++] = WAY_EUSTACK;
    if (j->nchain == 0) {
        job_unavailable(j, "neither gdb nor eu-stack is installed (nor py-spy, for Python)");
        return;
    }
    if ((j->buf = malloc(MGPU_STACKS_MAX)) == NULL) {
        job_unavailable(j, "out of memory");
        return;
    }
    job_start_tool(j);
}

int mgpu_stacks_collect(uv_loop_t *loop, const pid_t *pids, int n, double timeout_s,
                        mgpu_stacks_cb cb, void *arg, mgpu_err_t *err)
{
    coll_t *c;

    if (n < 0 || (n > 0 && pids == NULL) || cb == NULL)
        return mgpu_err_set(err, -EINVAL, "mgpu_stacks_collect: %d pids, cb %s", n,
                            cb ? "set" : "NULL");
    if (!(timeout_s > 0 && timeout_s < 86400))
        return mgpu_err_set(err, MGPU_E_RANGE,
                            "mgpu_stacks_collect: timeout %g s (expected > 0 and < 86400)",
                            timeout_s);
    if ((c = calloc(1, sizeof *c)) == NULL ||
        (c->jobs = calloc((size_t)(n > 0 ? n : 1), sizeof *c->jobs)) == NULL ||
        (c->env = tools_env()) == NULL) {
        if (c != NULL)
            free(c->jobs);
        free(c);
        return mgpu_err_set(err, -ENOMEM, "mgpu_stacks_collect: out of memory for %d pids", n);
    }
    if ((c->devnull = open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0) {
        int e = -errno;
        free(c->env);
        free(c->jobs);
        free(c);
        return mgpu_err_set(err, e, "open(/dev/null): %s", strerror(-e));
    }
    c->loop = loop;
    c->n = c->left = n;
    c->timeout_s = timeout_s;
    c->cb = cb;
    c->arg = arg;
    for (int t = 0; t < TOOL_N; t++)
        find_in_path(tool_names[t], c->path[t], sizeof c->path[t]);
    uv_timer_init(loop, &c->timer);
    c->timer.data = c;
    uv_timer_start(&c->timer, coll_on_deadline, (uint64_t)(timeout_s * 1000 + 0.5), 0);
    for (int i = 0; i < n; i++) {
        c->jobs[i].c = c;
        c->jobs[i].target = pids[i];
        c->jobs[i].tool = -1;
        c->jobs[i].pidfd = -1;
    }
    for (int i = 0; i < n; i++)
        job_begin(&c->jobs[i]);
    coll_maybe_finish(c);
    return 0;
}
