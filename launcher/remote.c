/* remote.c - one job on many hosts over ssh (see remote.h). */
#include "remote.h"

#include <dirent.h>     /* opendir */
#include <errno.h>      /* errno */
#include <fcntl.h>      /* open */
#include <poll.h>       /* poll */
#include <pthread.h>    /* pthread_create */
#include <signal.h>     /* kill */
#include <stdio.h>      /* printf */
#include <stdlib.h>     /* malloc */
#include <string.h>     /* strlen */
#include <sys/random.h> /* getrandom */
#include <unistd.h>     /* getcwd */
#include <uv.h>         /* uv_spawn */

#include "fdio.h"  /* mgpu_fdio_write_all */
#include "hosts.h" /* mgpu_hosts_t */
#include "log.h"   /* mgpu_error */

extern char **environ;

#define SETTLE_MS 5000   /* after a host fails, the others' own stop before theirs is forced */
#define MAX_SSH_WORDS 64 /* words of --ssh */
/* Seconds between the lines "alive N" sent to every host once the job runs (MGPU_SSH_KEEPALIVE
 * changes it, for tests), and ssh's ServerAliveInterval: a host whose network goes away is
 * given up by ssh here after 3 of them, and its launcher stops its job after 3 without a line
 * (plus 2 s), even though its sshd may not notice for hours. */
#define KEEPALIVE_S 10

typedef struct rhost rhost_t;

typedef struct rstream {
    uv_pipe_t pipe;
    rhost_t *h;
    int fd;    /* 1 or 2: where its lines go */
    char *buf; /* an unfinished line */
    size_t used, cap;
} rstream_t;

typedef struct remote remote_t;

struct rhost {
    remote_t *r;
    int k;
    uv_process_t proc;
    uv_pipe_t in;
    uv_write_t wreq, sreq;
    rstream_t out, err;
    char **argv; /* ssh ... HOST COMMAND */
    int in_open, exited, code;
    int spawned;     /* its ssh runs (or ran) */
    int ready;       /* its launcher runs, and waits for the token */
    char tail[1024]; /* the end of its stderr before that, for the message if it never does */
    char line[300];  /* "[HOST]: " */
};

struct remote {
    uv_loop_t loop;
    const mgpu_cli_t *cli;
    mgpu_hosts_t hosts;
    rhost_t *h;
    const char *token;
    int nready;     /* hosts whose launcher waits for the token */
    int started;    /* the token was sent: the job runs */
    int aborting;   /* a host did not come up: every host is stopped before the token */
    int abort_code; /* that host's exit status */
    int culprit;    /* and its index */
    int handles;    /* open handles of the hosts */
    uv_signal_t sig[4];
    int nsig;
    uv_timer_t settle;
    uv_timer_t alive;
    int keepalive_s;
    char aliveline[32];
    int user_signal, signals_seen, failed, exit_code;
    char sigline[32];
};

/* ------------------------------------------------------------------ output */

static void put_line(rstream_t *s, const char *line, size_t n)
{
    const rhost_t *h = s->h;
    size_t pl = strlen(h->line) - 3; /* "[HOST" */
    /* The workers' lines carry "[HOST:rankN]:" already (the template the host's launcher was
     * given); the host's launcher's own lines get "[HOST]: ". */
    int own = n > pl && memcmp(line, h->line, pl) == 0 && line[pl] == ':';
    if (!own)
        mgpu_fdio_write_all(s->fd, h->line, strlen(h->line));
    mgpu_fdio_write_all(s->fd, line, n);
    mgpu_fdio_write_all(s->fd, "\n", 1);
}

static void keep_tail(rhost_t *h, const char *p, size_t n)
{
    size_t have = strlen(h->tail), room = sizeof h->tail - 1;
    if (n >= room) {
        p += n - room;
        n = room;
    }
    if (have + n > room) {
        memmove(h->tail, h->tail + (have + n - room), room - n);
        have = room - n;
    }
    memcpy(h->tail + have, p, n);
    h->tail[have + n] = '\0';
}

static void on_alloc(uv_handle_t *handle, size_t want, uv_buf_t *buf)
{
    rstream_t *s = handle->data;
    if (s->cap - s->used < 65536) {
        size_t cap = s->cap + 65536;
        char *b = realloc(s->buf, cap);
        if (b == NULL) {
            *buf = uv_buf_init(NULL, 0);
            return;
        }
        s->buf = b;
        s->cap = cap;
    }
    (void)want;
    *buf = uv_buf_init(s->buf + s->used, (unsigned)(s->cap - s->used));
}

static void on_closed(uv_handle_t *handle);
static void send_tokens(remote_t *r);

/* One line of a host: before its launcher said it waits for the token, ssh's or the shell's
 * words (kept for the message, should the host not come up); then the job's output. */
static void take_line(rstream_t *s, const char *line, size_t n)
{
    rhost_t *h = s->h;
    remote_t *r = h->r;
    size_t rl = strlen(MGPU_HOSTS_READY_LINE);

    if (!h->ready && s->fd == 2 && n == rl && memcmp(line, MGPU_HOSTS_READY_LINE, rl) == 0) {
        h->ready = 1;
        if (++r->nready == r->hosts.n && !r->aborting)
            send_tokens(r);
        return;
    }
    if (!h->ready || r->aborting) {
        keep_tail(h, line, n);
        keep_tail(h, "\n", 1);
        return;
    }
    put_line(s, line, n);
}

static void on_read(uv_stream_t *stream, ssize_t n, const uv_buf_t *buf)
{
    rstream_t *s = stream->data;
    size_t start = 0;
    (void)buf;
    if (n > 0) {
        s->used += (size_t)n;
        for (size_t i = 0; i < s->used; i++)
            if (s->buf[i] == '\n') {
                take_line(s, s->buf + start, i - start);
                start = i + 1;
            }
        memmove(s->buf, s->buf + start, s->used - start);
        s->used -= start;
        return;
    }
    if (n < 0) {
        if (s->used > 0)
            take_line(s, s->buf, s->used); /* a last line without its newline, completed */
        s->used = 0;
        uv_close((uv_handle_t *)&s->pipe, on_closed);
    }
}

/* ------------------------------------------------------------------ the hosts' processes */

static void maybe_done(remote_t *r)
{
    if (r->handles == 0) {
        for (int i = 0; i < r->nsig; i++)
            if (!uv_is_closing((uv_handle_t *)&r->sig[i]))
                uv_close((uv_handle_t *)&r->sig[i], NULL);
        if (!uv_is_closing((uv_handle_t *)&r->settle))
            uv_close((uv_handle_t *)&r->settle, NULL);
        if (!uv_is_closing((uv_handle_t *)&r->alive))
            uv_close((uv_handle_t *)&r->alive, NULL);
    }
}

static void on_closed(uv_handle_t *handle)
{
    remote_t *r = handle->loop->data;
    r->handles--;
    maybe_done(r);
}

static void close_stdin(rhost_t *h)
{
    if (h->in_open) {
        h->in_open = 0;
        uv_close((uv_handle_t *)&h->in, on_closed);
    }
}

static void stop_all(remote_t *r)
{
    for (int k = 0; k < r->hosts.n; k++)
        close_stdin(&r->h[k]);
}

static void on_settled(uv_timer_t *t)
{
    remote_t *r = t->loop->data;
    int left = 0;
    for (int k = 0; k < r->hosts.n; k++)
        left += !r->h[k].exited;
    if (left > 0)
        mgpu_warn("%d host(s) still running %d s after the first failure: closing their "
                  "connections",
                  left, SETTLE_MS / 1000);
    stop_all(r);
}

static void on_exit_cb(uv_process_t *p, int64_t status, int sig)
{
    rhost_t *h = p->data;
    remote_t *r = h->r;
    const char *name = r->hosts.v[h->k].name;

    h->exited = 1;
    h->code = sig ? 128 + sig : (int)status;
    uv_close((uv_handle_t *)p, on_closed);
    close_stdin(h);
    if (!r->started) {
        /* Before the token: this host was not reached, or its launcher could not run. None
         * has started anything; the others stop when their stdin ends, still waiting for the
         * token. */
        if (!r->aborting && !r->user_signal) {
            r->aborting = 1;
            r->abort_code = h->code ? h->code : 1;
            r->culprit = h->k;
            stop_all(r);
        }
        return;
    }
    if (h->code != 0 && !r->failed && !r->user_signal) {
        r->failed = 1;
        r->exit_code = h->code;
        if (h->code == 255)
            mgpu_error("host %s (node rank %d): ssh exited with status 255 (the connection "
                       "failed or was lost); stopping every host",
                       name, h->k);
        else
            /* Not necessarily the host of the failing rank: every host learns of it through
             * the store and may exit first with its status. The hosts' reports say who. */
            mgpu_error("host %s (node rank %d) exited with status %d; stopping every host", name,
                       h->k, h->code);
        uv_timer_start(&r->settle, on_settled, SETTLE_MS, 0);
    }
}

static void on_written(uv_write_t *w, int status)
{
    (void)w;
    (void)status; /* a host that died before reading is reported by its exit */
}

static void on_alive_written(uv_write_t *w, int status)
{
    (void)status;
    free(w);
}

/* The job runs: every host with its connection open hears from here (--watch_stdin there). */
static void on_alive(uv_timer_t *t)
{
    remote_t *r = t->loop->data;
    for (int k = 0; k < r->hosts.n; k++) {
        rhost_t *h = &r->h[k];
        uv_write_t *w;
        uv_buf_t b = uv_buf_init(r->aliveline, (unsigned)strlen(r->aliveline));
        /* A host that does not read is not written to without end: its pipe's kernel buffer
         * holds hours of these lines, and ssh gives the host up long before. */
        if (!h->in_open || uv_stream_get_write_queue_size((uv_stream_t *)&h->in) > 4096 ||
            (w = malloc(sizeof *w)) == NULL)
            continue;
        if (uv_write(w, (uv_stream_t *)&h->in, &b, 1, on_alive_written) < 0)
            free(w);
    }
}

static void on_signal(uv_signal_t *handle, int signum)
{
    remote_t *r = handle->loop->data;
    if (r->signals_seen++ > 0 && signum == SIGINT) {
        /* Ctrl-C twice: at once. The connections close, and the launchers there stop. */
        mgpu_warn("%s again: killing every ssh", signum == SIGINT ? "SIGINT" : "signal");
        for (int k = 0; k < r->hosts.n; k++)
            if (!r->h[k].exited)
                uv_process_kill(&r->h[k].proc, SIGKILL);
        return;
    }
    if (r->user_signal)
        return;
    r->user_signal = signum;
    if (!r->started) {
        /* The hosts' launchers still wait for the token: the end of their stdin stops them.
         * An ssh still connecting reads no stdin and would wait out its ConnectTimeout; where
         * no launcher runs yet nothing can be left behind, so it is stopped at once. */
        mgpu_warn("signal %d (%s) before the job started: stopping every host", signum,
                  strsignal(signum));
        r->aborting = 1;
        stop_all(r);
        for (int k = 0; k < r->hosts.n; k++)
            if (r->h[k].spawned && !r->h[k].exited && !r->h[k].ready)
                uv_process_kill(&r->h[k].proc, SIGTERM);
        return;
    }
    mgpu_warn("signal %d (%s): stopping every host", signum, strsignal(signum));
    /* The launcher there takes the same signal (its --watch_stdin), then the end of stdin. */
    snprintf(r->sigline, sizeof r->sigline, "signal %d\n", signum);
    for (int k = 0; k < r->hosts.n; k++) {
        rhost_t *h = &r->h[k];
        if (h->in_open) {
            uv_buf_t b = uv_buf_init(r->sigline, (unsigned)strlen(r->sigline));
            uv_write(&h->sreq, (uv_stream_t *)&h->in, &b, 1, on_written);
        }
    }
}

/* Every host's launcher waits for the token: the job starts. */
static void send_tokens(remote_t *r)
{
    r->started = 1;
    snprintf(r->aliveline, sizeof r->aliveline, "alive %d\n", r->keepalive_s);
    uv_timer_start(&r->alive, on_alive, 0, (uint64_t)r->keepalive_s * 1000);
    for (int k = 0; k < r->hosts.n; k++) {
        rhost_t *h = &r->h[k];
        uv_buf_t b[2] = {uv_buf_init((char *)r->token, (unsigned)strlen(r->token)),
                         uv_buf_init("\n", 1)};
        if (h->in_open)
            uv_write(&h->wreq, (uv_stream_t *)&h->in, b, 2, on_written);
    }
}

static int start_one(remote_t *r, rhost_t *h)
{
    uv_process_options_t o = {0};
    uv_stdio_container_t io[3];
    int rc;

    h->out.h = h->err.h = h;
    h->out.fd = 1;
    h->err.fd = 2;
    uv_pipe_init(&r->loop, &h->out.pipe, 0);
    uv_pipe_init(&r->loop, &h->err.pipe, 0);
    h->out.pipe.data = &h->out;
    h->err.pipe.data = &h->err;
    uv_pipe_init(&r->loop, &h->in, 0);
    io[0].flags = UV_CREATE_PIPE | UV_READABLE_PIPE;
    io[0].data.stream = (uv_stream_t *)&h->in;
    io[1].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
    io[1].data.stream = (uv_stream_t *)&h->out.pipe;
    io[2].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
    io[2].data.stream = (uv_stream_t *)&h->err.pipe;
    o.args = h->argv;
    o.file = o.args[0];
    o.stdio = io;
    o.stdio_count = 3;
    o.exit_cb = on_exit_cb;
    /* A session of its own: Ctrl-C at the terminal reaches this launcher only, which passes it
     * on in order (the hosts' reports still come back through ssh). */
    o.flags = UV_PROCESS_DETACHED;
    h->proc.data = h;
    rc = uv_spawn(&r->loop, &h->proc, &o);
    r->handles += 4;
    if (rc < 0) {
        /* libuv's process handle is to be closed even when the spawn failed */
        uv_close((uv_handle_t *)&h->proc, on_closed);
        uv_close((uv_handle_t *)&h->out.pipe, on_closed);
        uv_close((uv_handle_t *)&h->err.pipe, on_closed);
        uv_close((uv_handle_t *)&h->in, on_closed);
        h->exited = 1;
        h->code = 127;
        snprintf(h->tail, sizeof h->tail, "cannot run %s here: %s", h->argv[0], uv_strerror(rc));
        return rc;
    }
    h->spawned = 1;
    h->in_open = 1;
    uv_read_start((uv_stream_t *)&h->out.pipe, on_alloc, on_read);
    uv_read_start((uv_stream_t *)&h->err.pipe, on_alloc, on_read);
    return 0;
}

/* Starts every host's ssh at once, sends the token once every host's launcher waits for it,
 * and waits for all of them. */
static void run_all(remote_t *r)
{
    for (int k = 0; k < r->hosts.n; k++) {
        rhost_t *h = &r->h[k];
        h->r = r;
        h->k = k;
        if (start_one(r, h) < 0 && !r->aborting) {
            r->aborting = 1;
            r->abort_code = 127;
            r->culprit = k;
            stop_all(r);
        }
    }
    maybe_done(r);
    uv_run(&r->loop, UV_RUN_DEFAULT);
}

/* ------------------------------------------------------------------ commands */

static void free_argv(char **argv)
{
    for (char **a = argv; a != NULL && *a; a++)
        free(*a);
    free(argv);
}

/* ssh's words, its options, the host and the command. */
static char **ssh_argv(const char *ssh, int keepalive_s, const char *host, const char *cmd)
{
    char alive[64];
    const char *const opts[] = {"-o", "BatchMode=yes", "-o", "ConnectTimeout=30",
                                "-o", alive,           "-o", "ServerAliveCountMax=3"};
    char **argv = calloc(MAX_SSH_WORDS + 16, sizeof *argv), *save = NULL, *w;
    char *copy = strdup(ssh);
    int n = 0;

    snprintf(alive, sizeof alive, "ServerAliveInterval=%d", keepalive_s);
    if (argv == NULL || copy == NULL) {
        free(argv);
        free(copy);
        return NULL;
    }
    for (w = strtok_r(copy, " \t", &save); w && n < MAX_SSH_WORDS; w = strtok_r(NULL, " \t", &save))
        argv[n++] = strdup(w);
    free(copy);
    /* After the user's words: ssh takes an option's first value, so theirs win. */
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++)
        argv[n++] = strdup(opts[i]);
    argv[n++] = strdup(host);
    argv[n++] = strdup(cmd);
    for (int i = 0; i < n; i++)
        if (argv[i] == NULL) {
            free_argv(argv);
            return NULL;
        }
    return argv;
}

/* argv for --dry-run, each word quoted where a shell needs it. */
static void print_argv(FILE *out, char **argv)
{
    for (char **a = argv; *a; a++) {
        const char *p = *a;
        int plain = *p != '\0';
        for (; *p; p++)
            plain &= (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                     (*p >= '0' && *p <= '9') || strchr("-_./=:,@%+", *p) != NULL;
        if (plain) {
            fprintf(out, "%s%s", a == argv ? "" : " ", *a);
        } else {
            size_t len = 4 * strlen(*a) + 8, used = 0;
            char *q = malloc(len);
            if (q != NULL && mgpu_hosts_quote(q, len, &used, *a) == 0) {
                q[used - 1] = '\0'; /* its trailing blank */
                fprintf(out, "%s%s", a == argv ? "" : " ", q);
            }
            free(q);
        }
    }
    fputc('\n', out);
}

static int hosts_of(const mgpu_cli_t *cli, mgpu_hosts_t *hosts, mgpu_err_t *err)
{
    int rc;
    if (cli->hostfile[0] && cli->hosts[0])
        return mgpu_err_set(err, MGPU_E_USAGE,
                            "--hostfile and --hosts are given both: expected one of them");
    if (mgpu_cli_given(cli, "nnodes") || mgpu_cli_given(cli, "node_rank"))
        return mgpu_err_set(err, MGPU_E_USAGE,
                            "--nnodes and --node_rank come from the host list with %s: expected "
                            "neither",
                            cli->hostfile[0] ? "--hostfile" : "--hosts");
    rc = cli->hostfile[0] ? mgpu_hosts_read_file(cli->hostfile, hosts, err)
                          : mgpu_hosts_parse_list(cli->hosts, hosts, err);
    if (rc == 0 && (rc = mgpu_hosts_select(hosts, cli->include, cli->exclude, err)) < 0)
        mgpu_hosts_free(hosts);
    return rc;
}

/* The user's options that every host's launcher gets as they are: all but those the ssh launch
 * sets itself, and without the "--" before the program (the commands put their own). */
static int forwarded(const mgpu_cli_t *cli, int argc, char **argv, const char **fwd)
{
    int end = (int)(cli->prog_argv - argv), n = 0;
    for (int i = 1; i < end && i < argc; i++) {
        int local = strcmp(argv[i], "--") == 0 && i == end - 1;
        for (int j = 0; j < cli->n_local_args; j++)
            local |= cli->local_args[j] == i;
        if (!local)
            fwd[n++] = argv[i];
    }
    return n;
}

static void random_token(char *out, size_t len)
{
    unsigned char b[16];
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b)
        for (size_t i = 0; i < sizeof b; i++)
            b[i] = (unsigned char)(rand() ^ getpid() ^ (int)i);
    for (size_t i = 0; i < sizeof b && 2 * i + 2 < len; i++)
        snprintf(out + 2 * i, 3, "%02x", b[i]);
}

/* After an abort: the hosts whose launcher never came up, named with ssh's (or the shell's)
 * own words. */
static void report_unreached(remote_t *r)
{
    for (int k = 0; k < r->hosts.n; k++) {
        rhost_t *h = &r->h[k];
        char *t = h->tail;
        size_t n = strlen(t);
        if (h->ready && k != r->culprit)
            continue; /* stopped, waiting for the token, because another did not come up */
        while (n > 0 && (t[n - 1] == '\n' || t[n - 1] == '\r'))
            t[--n] = '\0';
        for (char *c = t; *c; c++)
            if (*c == '\n' || *c == '\r')
                *c = ' ';
        if (!h->spawned)
            mgpu_error("host %s (%s): %s", r->hosts.v[k].name, r->hosts.v[k].origin, t);
        else if (h->code == 255)
            mgpu_error("host %s (%s) cannot be reached: ssh exited with status 255%s%s",
                       r->hosts.v[k].name, r->hosts.v[k].origin, t[0] ? ": " : "", t);
        else if (h->code == 127 || h->code == 126)
            mgpu_error("host %s (%s): mgpu-launch cannot run there (status %d%s%s); it must be "
                       "installed at the same path on every host",
                       r->hosts.v[k].name, r->hosts.v[k].origin, h->code, t[0] ? ": " : "", t);
        else
            mgpu_error("host %s (%s): its launcher exited with status %d before the job "
                       "started%s%s",
                       r->hosts.v[k].name, r->hosts.v[k].origin, h->code, t[0] ? ": " : "", t);
    }
}

static const char *env_lookup(const char *name)
{
    return getenv(name);
}

static int build(remote_t *r, const mgpu_cli_t *cli, int argc, char **argv, mgpu_err_t *err)
{
    char exe[4096], cwd[4096], env_path[4200];
    const char **fwd = calloc((size_t)argc + 1, sizeof *fwd);
    mgpu_hosts_env_t env;
    mgpu_hosts_job_t job = {0};
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    int rc = 0;

    if (fwd == NULL)
        return mgpu_err_set(err, -ENOMEM, "out of memory");
    exe[n > 0 ? n : 0] = '\0';
    if (getcwd(cwd, sizeof cwd) == NULL) {
        free(fwd);
        return mgpu_err_set(err, -errno, "getcwd: %s", strerror(errno));
    }
    /* .mgpu_env of the working directory, else of the home directory (DeepSpeed reads its
     * .deepspeed_env the same way). */
    snprintf(env_path, sizeof env_path, "%s/.mgpu_env", cwd);
    if (access(env_path, F_OK) != 0 && getenv("HOME"))
        snprintf(env_path, sizeof env_path, "%s/.mgpu_env", getenv("HOME"));
    if ((rc = mgpu_hosts_env_collect(environ, env_lookup, cli->exports, env_path, &env, err)) < 0) {
        free(fwd);
        return rc;
    }
    job.launcher = exe;
    job.cwd = cwd;
    job.master_addr = cli->master_given && mgpu_cli_given(cli, "master_addr") ? cli->master_addr
                                                                              : r->hosts.v[0].name;
    job.master_port = cli->master_port >= 0 ? cli->master_port : 29500;
    job.nproc = mgpu_cli_given(cli, "nproc_per_node") ? cli->nproc : NULL;
    job.fwd = fwd;
    job.nfwd = forwarded(cli, argc, argv, fwd);
    job.own_prefix = cli->prefix_template[0] || cli->no_prefix;
    job.summary = cli->summary;
    job.prog_argv = cli->prog_argv;
    job.prog_argc = cli->prog_argc;
    job.env = &env;
    for (int k = 0; rc == 0 && k < r->hosts.n; k++) {
        char *cmd = mgpu_hosts_command(&r->hosts, k, &job);
        const char *ssh = cli->ssh[0] ? cli->ssh : "ssh";
        r->h[k].argv = cmd ? ssh_argv(ssh, r->keepalive_s, r->hosts.v[k].name, cmd) : NULL;
        if (r->h[k].argv == NULL)
            rc = mgpu_err_set(err, -ENOMEM, "host %s: its command: out of memory",
                              r->hosts.v[k].name);
        snprintf(r->h[k].line, sizeof r->h[k].line, "[%s]: ", r->hosts.v[k].name);
        free(cmd);
    }
    mgpu_hosts_env_free(&env);
    free(fwd);
    return rc;
}

static void start_signals(remote_t *r, const mgpu_cli_t *cli)
{
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        if (!(cli->stop_signals & (1ull << sigs[i])))
            continue;
        uv_signal_init(&r->loop, &r->sig[r->nsig]);
        uv_signal_start(&r->sig[r->nsig++], on_signal, sigs[i]);
    }
}

int mgpu_remote_main(const mgpu_cli_t *cli, int argc, char **argv)
{
    remote_t r;
    mgpu_err_t err = {0};
    char token[128];
    int rc;

    memset(&r, 0, sizeof r);
    r.cli = cli;
    r.keepalive_s = KEEPALIVE_S;
    if (getenv("MGPU_SSH_KEEPALIVE") && atoi(getenv("MGPU_SSH_KEEPALIVE")) > 0)
        r.keepalive_s = atoi(getenv("MGPU_SSH_KEEPALIVE"));
    if (hosts_of(cli, &r.hosts, &err) < 0) {
        mgpu_error("%s", err.msg);
        return 2;
    }
    if ((r.h = calloc((size_t)r.hosts.n, sizeof *r.h)) == NULL) {
        mgpu_hosts_free(&r.hosts);
        mgpu_error("out of memory for %d hosts", r.hosts.n);
        return 1;
    }
    rc = build(&r, cli, argc, argv, &err);
    if (rc < 0) {
        mgpu_error("%s", err.msg);
        rc = rc == MGPU_E_USAGE ? 2 : 1;
        goto out;
    }
    if (cli->dry_run != MGPU_DRY_NONE) {
        printf("%d hosts; the store's token is sent on each ssh's standard input, never on a "
               "command line\n",
               r.hosts.n);
        for (int k = 0; k < r.hosts.n; k++) {
            printf("host %s (node rank %d, %s):\n  ", r.hosts.v[k].name, k, r.hosts.v[k].origin);
            print_argv(stdout, r.h[k].argv);
        }
        rc = 0;
        goto out;
    }
    if (cli->rdzv_token[0])
        snprintf(token, sizeof token, "%s", cli->rdzv_token);
    else
        random_token(token, sizeof token);
    /* A host's ssh may be gone when a line is written to it (a signal passed on while that
     * host stops by itself): the write fails with EPIPE, and its exit is what tells. Without
     * this, SIGPIPE would end the launcher (exit 141) in the middle of stopping the job. The
     * hosts' ssh processes start with default signals (libuv resets them). */
    signal(SIGPIPE, SIG_IGN);
    uv_loop_init(&r.loop);
    r.loop.data = &r;
    uv_timer_init(&r.loop, &r.settle);
    uv_timer_init(&r.loop, &r.alive);
    r.token = token;
    start_signals(&r, cli);
    run_all(&r);
    if (r.aborting && !r.user_signal)
        report_unreached(&r);
    rc = r.user_signal ? 128 + r.user_signal
         : r.aborting  ? r.abort_code
         : r.failed    ? r.exit_code
                       : 0;
    if (!uv_is_closing((uv_handle_t *)&r.settle))
        uv_close((uv_handle_t *)&r.settle, NULL);
    if (!uv_is_closing((uv_handle_t *)&r.alive))
        uv_close((uv_handle_t *)&r.alive, NULL);
    uv_run(&r.loop, UV_RUN_DEFAULT);
    uv_loop_close(&r.loop);
    memset(token, 0, sizeof token);
out:
    for (int k = 0; k < r.hosts.n; k++) {
        free_argv(r.h[k].argv);
        free(r.h[k].out.buf);
        free(r.h[k].err.buf);
    }
    free(r.h);
    mgpu_hosts_free(&r.hosts);
    return rc;
}

/* ------------------------------------------------------------------ --watch_stdin */

/* 1 while this process has a child that is not a zombie nor its keeper: a worker (or a tool
 * it runs) still there. /proc is read, not waited on: the supervisor reaps. */
static int has_children(pid_t self)
{
    DIR *d = opendir("/proc");
    struct dirent *e;
    int found = 0;

    if (d == NULL)
        return 1; /* cannot tell: as if some were left */
    while (!found && (e = readdir(d)) != NULL) {
        char path[64], buf[512], *rp;
        int fd, ppid = 0;
        ssize_t n;
        char state;
        if (e->d_name[0] < '1' || e->d_name[0] > '9')
            continue;
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
            continue;
        n = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (n <= 0)
            continue;
        buf[n] = '\0';
        /* "pid (comm) state ppid ...": comm may hold blanks and parentheses */
        if ((rp = strrchr(buf, ')')) == NULL || sscanf(rp + 1, " %c %d", &state, &ppid) != 2)
            continue;
        found = ppid == (int)self && state != 'Z' && strstr(buf, "(mgpu-keeper)") == NULL;
    }
    closedir(d);
    return found;
}

static void *watch_main(void *arg)
{
    int fd = (int)(intptr_t)arg, wait_ms = -1;
    char line[64];
    size_t n = 0;

    /* Only this thread reads: a line at a time, a byte at a time (lines are rare). */
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        char c;
        int rc = poll(&p, 1, wait_ms);
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc == 0)
            break; /* no keepalive for 3 periods: the network to that launcher is gone */
        ssize_t r = read(fd, &c, 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        if (c != '\n') {
            if (n + 1 < sizeof line)
                line[n++] = c;
            continue;
        }
        line[n] = '\0';
        n = 0;
        int sig = 0, period = 0;
        if (sscanf(line, "signal %d", &sig) == 1 && sig > 0 && sig < 32 && sig != SIGKILL &&
            sig != SIGSTOP)
            kill(getpid(), sig);
        else if (sscanf(line, "alive %d", &period) == 1 && period > 0 && period < 86400)
            wait_ms = (3 * period + 2) * 1000;
    }
    /* The connection closed, or went silent: the launcher that started this one is gone, or
     * asks the job to end. Hang-up, as a terminal's end would say it. */
    kill(getpid(), SIGHUP);
    close(fd);
    /* Nobody is left to report to. Once the workers are gone (SIGHUP, else the supervisor's
     * SIGKILL after the grace period), the launcher normally exits within milliseconds; one
     * still here 3 s later waits on a peer that is gone (seen: a node waiting on the store of
     * a node 0 that had exited first, until the join timeout). It is killed, and its keeper
     * removes whatever is left, as for any killed launcher. */
    for (int quiet_ms = 0; quiet_ms < 3000;) {
        usleep(100 * 1000);
        quiet_ms = has_children(getpid()) ? 0 : quiet_ms + 100;
    }
    kill(getpid(), SIGKILL);
    return NULL;
}

int mgpu_remote_watch_stdin(mgpu_err_t *err)
{
    pthread_t t;
    pthread_attr_t a;
    int fd = fcntl(0, F_DUPFD_CLOEXEC, 3), nul, rc;

    if (fd < 0)
        return mgpu_err_set(err, -errno, "--watch_stdin: fcntl(0, F_DUPFD_CLOEXEC): %s",
                            strerror(errno));
    /* The workers get /dev/null: none of them may read this stream, or hold it open. */
    if ((nul = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0) {
        dup2(nul, 0);
        close(nul);
    }
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    rc = pthread_create(&t, &a, watch_main, (void *)(intptr_t)fd);
    pthread_attr_destroy(&a);
    if (rc != 0) {
        close(fd);
        return mgpu_err_set(err, -rc, "--watch_stdin: pthread_create: %s", strerror(rc));
    }
    return 0;
}
