/* store_bench.c - throughput and rendezvous time of mgpu's store, for tests/bench/store_bench.sh
 * (which runs PyTorch's TCPStore through the same steps, tests/bench/tcpstore_bench.py).
 *
 *   store_bench [SECONDS [CLIENTS [RDZV [REPS]]]]
 *       defaults: 2 s per measurement, 64 clients, 1024, each throughput figure the median of
 *       3 measurements (all of them on a "# " line before it)
 *
 * The server runs in a forked child on its own libuv loop, as in mgpu-launch. Clients are
 * processes, forked and connected before the clock starts, then released together by closing
 * a pipe they all block on; each runs for SECONDS and reports its count. The rendezvous forks
 * RDZV processes that block first, then, on release: connect, set their own key, add 1 to a
 * counter, the one that brings it to RDZV sets "done", and all wait for "done" (so every key
 * exists when anyone leaves). It is timed from the release to the last process's report.
 * Every get is checked against the value set; after the rendezvous all keys are checked.
 * Output lines: "<what> <clients> <figure> <wrong>", figure in ops/s or seconds. */
#include <errno.h>        /* errno */
#include <signal.h>       /* kill */
#include <stdio.h>        /* printf */
#include <stdlib.h>       /* atof */
#include <string.h>       /* strcmp */
#include <sys/resource.h> /* setrlimit */
#include <sys/wait.h>     /* waitpid */
#include <time.h>         /* clock_gettime */
#include <unistd.h>       /* fork, pipe */

#include "log.h"
#include "store.h"
#include "store_server.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void on_sigterm(uv_signal_t *h, int signum)
{
    mgpu_store_server_close(h->data);
    uv_close((uv_handle_t *)h, NULL);
}

/* Forks the server; its port comes back through a pipe. */
static pid_t start_server(int *port)
{
    int p[2];
    pid_t pid;
    if (pipe(p) < 0)
        return -1;
    pid = fork();
    if (pid == 0) {
        uv_loop_t loop;
        uv_signal_t sig;
        mgpu_store_server_t *s;
        mgpu_err_t err;
        mgpu_store_server_opts_t o = {.max_conns = 8192};
        int port_ = -1;
        close(p[0]);
        signal(SIGPIPE, SIG_IGN); /* as mgpu-launch does (store_server.h) */
        uv_loop_init(&loop);
        if (mgpu_store_server_start(&loop, &o, &s, &err) < 0) {
            fprintf(stderr, "store_bench: %s\n", err.msg);
            (void)!write(p[1], &port_, sizeof port_);
            _exit(1);
        }
        uv_signal_init(&loop, &sig);
        sig.data = s;
        uv_signal_start(&sig, on_sigterm, SIGTERM);
        port_ = mgpu_store_server_port(s);
        (void)!write(p[1], &port_, sizeof port_);
        close(p[1]);
        uv_run(&loop, UV_RUN_DEFAULT);
        _exit(uv_loop_close(&loop) == 0 ? 0 : 3);
    }
    close(p[1]);
    if (pid < 0 || read(p[0], port, sizeof *port) != sizeof *port || *port <= 0)
        pid = -1;
    close(p[0]);
    return pid;
}

static void die(const char *what, const mgpu_err_t *err)
{
    fprintf(stderr, "store_bench: %s: %s\n", what, err ? err->msg : strerror(errno));
    _exit(1);
}

typedef struct result {
    long ops;
    long wrong;
} result_t;

static const char VALUE[] = "0123456789abcdef"; /* 16 bytes, as in the TCPStore run */

/* One throughput client: connects, says ready, waits for the start, runs `secs`. */
static void tp_client(int port, int is_get, double secs, int id, int ready_w, int go_r, int res_w)
{
    mgpu_store_t *s;
    mgpu_err_t err;
    result_t r = {0, 0};
    char key[32], c;
    double end;

    if (mgpu_store_connect("127.0.0.1", port, NULL, 60.0, &s, &err) < 0)
        die("connect", &err);
    snprintf(key, sizeof key, "tp/%d", id);
    if (mgpu_store_set(s, key, VALUE, sizeof VALUE - 1, &err) < 0)
        die("set", &err);
    (void)!write(ready_w, "r", 1);
    (void)!read(go_r, &c, 1); /* EOF when the parent closes its end: all start together */
    end = now_s() + secs;
    while (now_s() < end) {
        for (int i = 0; i < 32; i++) {
            if (is_get) {
                void *v = NULL;
                size_t n = 0;
                if (mgpu_store_get(s, key, 10.0, &v, &n, &err) < 0)
                    die("get", &err);
                r.wrong += n != sizeof VALUE - 1 || memcmp(v, VALUE, n) != 0;
                free(v);
            } else if (mgpu_store_set(s, key, VALUE, sizeof VALUE - 1, &err) < 0) {
                die("set", &err);
            }
            r.ops++;
        }
    }
    (void)!write(res_w, &r, sizeof r);
    mgpu_store_close(s);
    _exit(0);
}

static int reap(int n)
{
    int bad = 0, st;
    for (int i = 0; i < n; i++)
        if (wait(&st) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
            bad++;
    return bad;
}

/* One measurement: ops/s of nclients released together for secs; wrong results added. */
static double throughput_once(int port, int is_get, int nclients, double secs, long *wrong)
{
    int ready[2], go[2], res[2];
    result_t sum = {0, 0}, r;
    char c;

    if (pipe(ready) < 0 || pipe(go) < 0 || pipe(res) < 0)
        die("pipe", NULL);
    for (int i = 0; i < nclients; i++) {
        pid_t pid = fork();
        if (pid < 0)
            die("fork", NULL);
        if (pid == 0) {
            close(go[1]);
            tp_client(port, is_get, secs, i, ready[1], go[0], res[1]);
        }
    }
    close(go[0]);
    close(ready[1]); /* a client that dies makes the reads below end, not hang */
    close(res[1]);
    for (int i = 0; i < nclients; i++)
        if (read(ready[0], &c, 1) != 1)
            die("ready (a client failed)", NULL);
    close(go[1]);
    for (int i = 0; i < nclients; i++) {
        if (read(res[0], &r, sizeof r) != sizeof r)
            die("result (a client failed)", NULL);
        sum.ops += r.ops;
        sum.wrong += r.wrong;
    }
    sum.wrong += reap(nclients);
    close(ready[0]);
    close(res[0]);
    *wrong += sum.wrong;
    return (double)sum.ops / secs;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of reps measurements (each with fresh client processes): where the scheduler
 * puts client and server changes a round trip's cost between runs, so one run can mislead. */
static void throughput(int port, int is_get, int nclients, double secs, int reps)
{
    double v[16];
    long wrong = 0;
    if (reps > 16)
        reps = 16;
    printf("# %s %d:", is_get ? "get" : "set", nclients);
    for (int i = 0; i < reps; i++) {
        v[i] = throughput_once(port, is_get, nclients, secs, &wrong);
        printf(" %.0f", v[i]);
    }
    qsort(v, (size_t)reps, sizeof v[0], cmp_double);
    printf("\n%s %d %.0f %ld\n", is_get ? "get" : "set", nclients, v[reps / 2], wrong);
    fflush(stdout);
}

static void rdzv_client(int port, int n, int round, int rank, int go_r, int res_w)
{
    mgpu_store_t *s;
    mgpu_err_t err;
    char key[48], count_key[32], done_key[32], c;
    const char *done[] = {done_key};
    int64_t count;

    (void)!read(go_r, &c, 1);
    if (mgpu_store_connect("127.0.0.1", port, NULL, 60.0, &s, &err) < 0)
        die("connect", &err);
    snprintf(key, sizeof key, "rdzv%d/rank/%d", round, rank);
    snprintf(count_key, sizeof count_key, "rdzv%d/count", round);
    snprintf(done_key, sizeof done_key, "rdzv%d/done", round);
    if (mgpu_store_set(s, key, "1", 1, &err) < 0 ||
        mgpu_store_add(s, count_key, 1, &count, &err) < 0 ||
        (count == n && mgpu_store_set(s, done_key, "1", 1, &err) < 0) ||
        mgpu_store_wait(s, done, 1, 60.0, &err) < 0)
        die("rendezvous", &err);
    (void)!write(res_w, "d", 1);
    mgpu_store_close(s);
    _exit(0);
}

/* One rendezvous of n processes under keys "rdzv<round>/"; its time in seconds. */
static double rendezvous_once(int port, int n, int round, long *wrong)
{
    int go[2], res[2];
    double t0, t1;
    char c;
    mgpu_store_t *s;
    mgpu_err_t err;

    if (pipe(go) < 0 || pipe(res) < 0)
        die("pipe", NULL);
    for (int i = 0; i < n; i++) {
        pid_t pid = fork();
        if (pid < 0)
            die("fork", NULL);
        if (pid == 0) {
            close(go[1]);
            close(res[0]);
            rdzv_client(port, n, round, i, go[0], res[1]);
        }
    }
    close(go[0]);
    close(res[1]); /* a client that dies makes the reads below end, not hang */
    t0 = now_s();
    close(go[1]);
    for (int i = 0; i < n; i++)
        if (read(res[0], &c, 1) != 1)
            die("rendezvous result (a client failed)", NULL);
    t1 = now_s();
    close(res[0]);
    *wrong += reap(n);
    if (mgpu_store_connect("127.0.0.1", port, NULL, 10.0, &s, &err) < 0)
        die("connect", &err);
    for (int i = 0; i < n; i++) {
        char key[48];
        const char *k[] = {key};
        int ready = 0;
        snprintf(key, sizeof key, "rdzv%d/rank/%d", round, i);
        if (mgpu_store_check(s, k, 1, &ready, &err) < 0)
            die("check", &err);
        *wrong += !ready;
    }
    mgpu_store_close(s);
    return t1 - t0;
}

static void rendezvous(int port, int n, int reps)
{
    double v[16];
    long wrong = 0;
    if (reps > 16)
        reps = 16;
    printf("# rdzv %d:", n);
    for (int i = 0; i < reps; i++) {
        v[i] = rendezvous_once(port, n, i, &wrong);
        printf(" %.4f", v[i]);
    }
    qsort(v, (size_t)reps, sizeof v[0], cmp_double);
    printf("\nrdzv %d %.4f %ld\n", n, v[reps / 2], wrong);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    double secs = argc > 1 ? atof(argv[1]) : 2.0;
    int nclients = argc > 2 ? atoi(argv[2]) : 64, nrdzv = argc > 3 ? atoi(argv[3]) : 1024;
    int reps = argc > 4 ? atoi(argv[4]) : 3;
    struct rlimit rl;
    int port = 0, st = 0;
    pid_t srv;

    mgpu_log_init("store_bench", MGPU_LOG_WARN);
    /* The server holds a descriptor per client: lift the soft limit to the hard one. */
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    srv = start_server(&port);
    if (srv < 0) {
        fprintf(stderr, "store_bench: the server did not start\n");
        return 1;
    }
    if (reps < 1)
        reps = 1;
    throughput(port, 1, 1, secs, reps);
    throughput(port, 0, 1, secs, reps);
    throughput(port, 1, nclients, secs, reps);
    throughput(port, 0, nclients, secs, reps);
    rendezvous(port, nrdzv, reps);
    kill(srv, SIGTERM);
    waitpid(srv, &st, 0);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}
