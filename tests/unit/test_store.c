/* test_store.c - the store's server (launcher/store_server.c), blocking client (common/store.c)
 * and wire format (common/store_proto.c), over real loopback sockets.
 *
 * Each test starts a server in a forked child running its own libuv loop; the child's stderr
 * goes to a file so tests can check the server's log lines, and on SIGTERM the child closes the
 * server and exits 0 only if the loop then closes with no handle left. */
#include <errno.h>        /* EINVAL */
#include <netinet/in.h>   /* sockaddr_in */
#include <signal.h>       /* kill */
#include <stdint.h>       /* uint8_t */
#include <stdlib.h>       /* setenv */
#include <sys/resource.h> /* setrlimit */
#include <sys/socket.h>   /* socket */
#include <time.h>         /* clock_gettime */

#include "check.h"
#include "clock.h"
#include "log.h"
#include "netns.h"
#include "store.h"
#include "store_proto.h"
#include "store_server.h"

typedef struct srv {
    pid_t pid;
    int port;
    char log[64];
} srv_t;

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static void on_sigterm(uv_signal_t *h, int signum)
{
    mgpu_store_server_close(h->data);
    uv_close((uv_handle_t *)h, NULL);
}

/* The server's child: reports its port (or -1) on fd wr, serves until SIGTERM. */
static void srv_child(const mgpu_store_server_opts_t *o, int wr, const char *log)
{
    uv_loop_t loop;
    uv_signal_t sig;
    mgpu_store_server_t *s;
    mgpu_err_t err;
    int port = -1;
    FILE *f = freopen(log, "w", stderr);

    setvbuf(stderr, NULL, _IONBF, 0);
    signal(SIGPIPE, SIG_IGN); /* as mgpu-launch does (store_server.h) */
    mgpu_log_init("store-test", MGPU_LOG_INFO);
    uv_loop_init(&loop);
    if (f == NULL || mgpu_store_server_start(&loop, o, &s, &err) < 0) {
        fprintf(stderr, "start: %s\n", err.msg);
        (void)!write(wr, &port, sizeof port);
        _exit(2);
    }
    uv_signal_init(&loop, &sig);
    sig.data = s;
    uv_signal_start(&sig, on_sigterm, SIGTERM);
    port = mgpu_store_server_port(s);
    (void)!write(wr, &port, sizeof port);
    close(wr);
    uv_run(&loop, UV_RUN_DEFAULT);
    /* exit, not _exit: under ASan, LeakSanitizer then checks the server freed everything
     * (srv_start flushed stdout before the fork, so nothing is printed twice). */
    exit(uv_loop_close(&loop) == 0 ? 0 : 3);
}

static srv_t srv_start(const mgpu_store_server_opts_t *o)
{
    srv_t s = {0};
    int p[2];
    int fd;

    snprintf(s.log, sizeof s.log, "/tmp/mgpu-store-test-XXXXXX");
    fd = mkstemp(s.log);
    close(fd);
    if (pipe(p) < 0)
        abort();
    fflush(stdout);
    s.pid = fork();
    if (s.pid == 0) {
        close(p[0]);
        srv_child(o, p[1], s.log);
    }
    close(p[1]);
    if (read(p[0], &s.port, sizeof s.port) != sizeof s.port)
        s.port = -1;
    close(p[0]);
    CHECK(s.port > 0);
    return s;
}

/* Stops the server; its exit status must be 0 (closed cleanly, no handle left). */
static void srv_stop(srv_t *s)
{
    int status = 0;
    kill(s->pid, SIGTERM);
    waitpid(s->pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    unlink(s->log);
}

/* The server's stderr so far (static buffer). */
static const char *srv_log(const srv_t *s)
{
    static char buf[16384];
    FILE *f = fopen(s->log, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = '\0';
    return buf;
}

static mgpu_store_t *client(int port, const char *token)
{
    mgpu_store_t *c = NULL;
    mgpu_err_t err = {0};
    int rc = mgpu_store_connect("127.0.0.1", port, token, 5.0, &c, &err);
    if (rc != 0)
        printf("  connect: %s\n", err.msg);
    CHECK_INT(rc, 0);
    return c;
}

/* A raw blocking socket to the server, for frames the client would never send. */
static int raw_connect(int port)
{
    struct sockaddr_in a = {0};
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
    return fd;
}

static void raw_send(int fd, const void *p, size_t n)
{
    CHECK(send(fd, p, n, MSG_NOSIGNAL) == (ssize_t)n);
}

static int raw_read_frame(int fd, uint8_t *status, uint8_t *op);

/* The handshake on a raw socket: HELLO, and with the current version the server's answer read
 * and AUTH with the proof for token, its answer read too (so what the caller reads next
 * answers its own frames). Another version: HELLO alone, for the server to refuse. */
static void raw_hello(int fd, uint8_t version, const char *token)
{
    mgpu_store_buf_t b = {0};
    mgpu_store_dec_t d;
    mgpu_store_frame_t f;
    mgpu_store_msg_t m;
    uint8_t cn[MGPU_STORE_NONCE_LEN] = {7}, proof[MGPU_STORE_PROOF_LEN];
    size_t st = mgpu_store_buf_frame_begin(&b, MGPU_STORE_OP_HELLO, 0, 7);
    mgpu_store_buf_u8(&b, version);
    mgpu_store_buf_bytes(&b, cn, sizeof cn);
    mgpu_store_buf_frame_end(&b, st);
    raw_send(fd, b.p, b.len);
    mgpu_store_buf_free(&b);
    if (version != MGPU_STORE_PROTO_VERSION)
        return;
    /* the answer: exactly one frame, read byte by byte so nothing after it is consumed */
    mgpu_store_dec_init(&d, NULL, 1);
    for (;;) {
        uint8_t *p;
        size_t avail;
        if (mgpu_store_dec_next(&d, &f, NULL) == 1)
            break;
        mgpu_store_dec_reserve(&d, 0, &p, &avail);
        if (recv(fd, p, 1, 0) != 1)
            break;
        mgpu_store_dec_commit(&d, 1);
    }
    CHECK(mgpu_store_msg_parse(&f, NULL, &m, NULL) == 0 && f.status == 0);
    mgpu_store_proof(token, strlen(token), 0, cn, m.val.p, proof);
    mgpu_store_dec_free(&d);
    st = mgpu_store_buf_frame_begin(&b, MGPU_STORE_OP_AUTH, 0, 8);
    mgpu_store_buf_bytes(&b, proof, sizeof proof);
    mgpu_store_buf_frame_end(&b, st);
    raw_send(fd, b.p, b.len);
    mgpu_store_buf_free(&b);
    {
        /* AUTH's answer: the header and the server's proof (u32 length + 32 bytes) */
        uint8_t h[MGPU_STORE_HDR_SIZE + 4 + MGPU_STORE_PROOF_LEN];
        size_t got = 0;
        while (got < sizeof h) {
            ssize_t r = recv(fd, h + got, sizeof h - got, 0);
            if (r <= 0)
                break;
            got += (size_t)r;
        }
        CHECK(got == sizeof h && h[2] == (MGPU_STORE_OP_AUTH | MGPU_STORE_RESP) && h[3] == 0);
    }
}

/* Reads frames until one arrives (1, parsed status in *status) or the peer closes (0). */
static int raw_read_frame(int fd, uint8_t *status, uint8_t *op)
{
    mgpu_store_dec_t d;
    mgpu_store_frame_t f;
    int got = 0;
    mgpu_store_dec_init(&d, NULL, 1);
    for (;;) {
        uint8_t *p;
        size_t avail;
        ssize_t r;
        if (mgpu_store_dec_next(&d, &f, NULL) == 1) {
            *status = f.status;
            *op = f.op;
            got = 1;
            break;
        }
        mgpu_store_dec_reserve(&d, 0, &p, &avail);
        r = recv(fd, p, avail, 0);
        if (r <= 0)
            break;
        mgpu_store_dec_commit(&d, (size_t)r);
    }
    mgpu_store_dec_free(&d);
    return got;
}

/* 1 when the server closed fd (EOF or reset after reading whatever it sent). */
static int raw_closed(int fd)
{
    char buf[4096];
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    for (;;) {
        ssize_t r = recv(fd, buf, sizeof buf, 0);
        if (r == 0 || (r < 0 && errno == ECONNRESET))
            return 1;
        if (r < 0)
            return 0;
    }
}

static void t_every_op(void)
{
    srv_t s = srv_start(NULL);
    mgpu_store_t *c = client(s.port, NULL);
    mgpu_err_t err = {0};
    void *v = NULL;
    size_t n = 0;
    int64_t x = 0;
    int flag = -1;
    const char *keys[] = {"a", "bin", "empty"};

    CHECK_INT(mgpu_store_ping(c, &err), 0);
    CHECK_INT(mgpu_store_num_keys(c, &x, &err), 0);
    CHECK_INT(x, 0);
    CHECK_INT(mgpu_store_set(c, "a", "hello", 5, &err), 0);
    CHECK_INT(mgpu_store_get(c, "a", 1.0, &v, &n, &err), 0);
    CHECK_INT(n, 5);
    CHECK_STR((char *)v, "hello");
    free(v);
    CHECK_INT(mgpu_store_set(c, "a", "bye", 3, &err), 0); /* overwrite */
    CHECK_INT(mgpu_store_get(c, "a", 0, &v, &n, &err), 0);
    CHECK_STR((char *)v, "bye");
    free(v);
    CHECK_INT(mgpu_store_set(c, "bin", "\0\1\0\xff", 4, &err), 0);
    CHECK_INT(mgpu_store_get(c, "bin", 0, &v, &n, &err), 0);
    CHECK_INT(n, 4);
    CHECK(memcmp(v, "\0\1\0\xff", 4) == 0);
    free(v);
    CHECK_INT(mgpu_store_set(c, "empty", "", 0, &err), 0);
    CHECK_INT(mgpu_store_get(c, "empty", 0, &v, &n, &err), 0);
    CHECK_INT(n, 0);
    free(v);
    /* get with no wait on a missing key */
    CHECK_INT(mgpu_store_get(c, "missing", 0, &v, &n, &err), MGPU_E_TIMEOUT);
    CHECK(v == NULL);
    CHECK_CONTAINS(err.msg, "\"missing\" not set");
    CHECK_INT(mgpu_store_num_keys(c, &x, &err), 0);
    CHECK_INT(x, 3);

    CHECK_INT(mgpu_store_check(c, keys, 3, &flag, &err), 0);
    CHECK_INT(flag, 1);
    CHECK_INT(mgpu_store_wait(c, keys, 3, 1.0, &err), 0);
    CHECK_INT(mgpu_store_delete(c, "a", &flag, &err), 0);
    CHECK_INT(flag, 1);
    CHECK_INT(mgpu_store_delete(c, "a", &flag, &err), 0);
    CHECK_INT(flag, 0);
    CHECK_INT(mgpu_store_check(c, keys, 3, &flag, &err), 0);
    CHECK_INT(flag, 0);
    CHECK_INT(mgpu_store_num_keys(c, &x, &err), 0);
    CHECK_INT(x, 2);

    /* add: a missing key counts from 0; the value is stored as decimal text */
    CHECK_INT(mgpu_store_add(c, "n", 5, &x, &err), 0);
    CHECK_INT(x, 5);
    CHECK_INT(mgpu_store_add(c, "n", -7, &x, &err), 0);
    CHECK_INT(x, -2);
    CHECK_INT(mgpu_store_get(c, "n", 0, &v, &n, &err), 0);
    CHECK_STR((char *)v, "-2");
    free(v);
    CHECK_INT(mgpu_store_add(c, "n", INT64_MAX, &x, &err), 0);
    CHECK_INT(mgpu_store_add(c, "n", 10, &x, &err), -EINVAL); /* overflow */
    CHECK_CONTAINS(err.msg, "overflow");
    CHECK_INT(mgpu_store_add(c, "bin", 1, &x, &err), -EINVAL); /* not a number */
    CHECK_CONTAINS(err.msg, "not a decimal int64");
    CHECK_INT(mgpu_store_ping(c, &err), 0); /* the connection survived */

    /* compare_set */
    CHECK_INT(mgpu_store_compare_set(c, "cas", "", 0, "one", 3, &v, &n, &err), 0);
    CHECK_STR((char *)v, "one"); /* missing + empty expected: set */
    free(v);
    CHECK_INT(mgpu_store_compare_set(c, "cas", "two", 3, "three", 5, &v, &n, &err), 0);
    CHECK_STR((char *)v, "one"); /* wrong expected: unchanged, current returned */
    free(v);
    CHECK_INT(mgpu_store_compare_set(c, "cas", "one", 3, "two", 3, &v, &n, &err), 0);
    CHECK_STR((char *)v, "two");
    free(v);
    CHECK_INT(mgpu_store_compare_set(c, "nocas", "x", 1, "y", 1, &v, &n, &err), 0);
    CHECK_INT(n, 0); /* missing + non-empty expected: not set */
    free(v);
    CHECK_INT(mgpu_store_check(c, (const char *[]){"nocas"}, 1, &flag, &err), 0);
    CHECK_INT(flag, 0);
    CHECK_INT(mgpu_store_compare_set(c, "cas", "two", 3, "x", 1, NULL, NULL, &err), 0);
    CHECK_INT(mgpu_store_get(c, "cas", 0, &v, &n, &err), 0);
    CHECK_STR((char *)v, "x");
    free(v);
    mgpu_store_close(c);
    srv_stop(&s);
}

static void t_get_waits_for_later_set(void)
{
    srv_t s = srv_start(NULL);
    mgpu_store_t *c = client(s.port, NULL);
    mgpu_err_t err = {0};
    void *v = NULL;
    size_t n;
    double t0 = mgpu_clock_mono();
    pid_t pid = fork();

    if (pid == 0) {
        mgpu_store_t *w = client(s.port, NULL);
        sleep_s(0.3);
        mgpu_store_set(w, "late", "v", 1, &err);
        mgpu_store_close(w);
        _exit(0);
    }
    CHECK_INT(mgpu_store_get(c, "late", 10.0, &v, &n, &err), 0);
    CHECK(mgpu_clock_mono() - t0 >= 0.25);
    CHECK(mgpu_clock_mono() - t0 < 5.0);
    CHECK_STR((char *)v, "v");
    free(v);
    waitpid(pid, NULL, 0);
    mgpu_store_close(c);
    srv_stop(&s);
}

static void t_waits_time_out(void)
{
    srv_t s = srv_start(NULL);
    mgpu_store_t *c = client(s.port, NULL);
    mgpu_err_t err = {0};
    const char *keys[] = {"x", "y", "z"};
    void *v = NULL;
    size_t n;
    double t0 = mgpu_clock_mono(), dt;

    CHECK_INT(mgpu_store_set(c, "y", "1", 1, &err), 0);
    CHECK_INT(mgpu_store_wait(c, keys, 3, 0.3, &err), MGPU_E_TIMEOUT);
    dt = mgpu_clock_mono() - t0;
    CHECK(dt >= 0.28 && dt < 2.0);
    CHECK_CONTAINS(err.msg, "2 of 3 keys not set after 300 ms");
    CHECK_INT(mgpu_store_wait(c, keys, 3, 0, &err), MGPU_E_TIMEOUT); /* no wait */
    t0 = mgpu_clock_mono();
    CHECK_INT(mgpu_store_get(c, "x", 0.2, &v, &n, &err), MGPU_E_TIMEOUT);
    dt = mgpu_clock_mono() - t0;
    CHECK(dt >= 0.18 && dt < 2.0);
    CHECK_CONTAINS(err.msg, "\"x\" not set after 200 ms");
    /* the connection is still good, and the timed-out waiters are gone */
    CHECK_INT(mgpu_store_set(c, "x", "1", 1, &err), 0);
    CHECK_INT(mgpu_store_ping(c, &err), 0);
    mgpu_store_close(c);
    srv_stop(&s);
}

static void t_wait_for_several_keys(void)
{
    srv_t s = srv_start(NULL);
    mgpu_store_t *c = client(s.port, NULL);
    mgpu_err_t err = {0};
    const char *keys[] = {"k0", "k1", "k2", "k1"}; /* a repeated key counts once it is set */
    pid_t pid = fork();
    double t0 = mgpu_clock_mono();

    if (pid == 0) {
        mgpu_store_t *w = client(s.port, NULL);
        for (int i = 0; i < 3; i++) {
            char k[16];
            sleep_s(0.1);
            snprintf(k, sizeof k, "k%d", i);
            mgpu_store_set(w, k, "v", 1, &err);
        }
        mgpu_store_close(w);
        _exit(0);
    }
    CHECK_INT(mgpu_store_wait(c, keys, 4, 10.0, &err), 0);
    CHECK(mgpu_clock_mono() - t0 >= 0.28);
    waitpid(pid, NULL, 0);
    mgpu_store_close(c);
    srv_stop(&s);
}

static void t_add_is_atomic_across_processes(void)
{
    enum { PROCS = 8, ADDS = 300 };
    srv_t s = srv_start(NULL);
    mgpu_store_t *c;
    mgpu_err_t err = {0};
    pid_t pids[PROCS];
    int64_t x = 0;

    for (int i = 0; i < PROCS; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            mgpu_store_t *w = client(s.port, NULL);
            int64_t last = 0, r;
            for (int j = 0; j < ADDS; j++) {
                if (mgpu_store_add(w, "ctr", 1, &r, &err) < 0 || r <= last)
                    _exit(1); /* each process sees its own results strictly increase */
                last = r;
            }
            mgpu_store_close(w);
            _exit(0);
        }
    }
    for (int i = 0; i < PROCS; i++) {
        int st = -1;
        waitpid(pids[i], &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    c = client(s.port, NULL);
    CHECK_INT(mgpu_store_add(c, "ctr", 0, &x, &err), 0);
    CHECK_INT(x, PROCS * ADDS);
    mgpu_store_close(c);
    srv_stop(&s);
}

static void t_barrier_across_processes(void)
{
    enum { PROCS = 6, ROUNDS = 3 };
    srv_t s = srv_start(NULL);
    pid_t pids[PROCS];

    for (int i = 0; i < PROCS; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            mgpu_store_t *w = client(s.port, NULL);
            mgpu_err_t err = {0};
            for (int r = 0; r < ROUNDS; r++) {
                char k[32], keys[PROCS][32];
                const char *kp[PROCS];
                int ready = 0;
                if (i == r) /* a late arrival each round: the others must wait for it */
                    sleep_s(0.2);
                snprintf(k, sizeof k, "r%d/%d", r, i);
                if (mgpu_store_set(w, k, "1", 1, &err) < 0 ||
                    mgpu_store_barrier(w, "b", PROCS, 10.0, &err) < 0)
                    _exit(1);
                /* past the barrier, everyone's key of this round exists */
                for (int j = 0; j < PROCS; j++) {
                    snprintf(keys[j], sizeof keys[j], "r%d/%d", r, j);
                    kp[j] = keys[j];
                }
                if (mgpu_store_check(w, kp, PROCS, &ready, &err) < 0 || !ready)
                    _exit(2);
            }
            mgpu_store_close(w);
            _exit(0);
        }
    }
    for (int i = 0; i < PROCS; i++) {
        int st = -1;
        waitpid(pids[i], &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    srv_stop(&s);
}

static void t_barrier_times_out_naming_arrivals(void)
{
    srv_t s = srv_start(NULL);
    mgpu_store_t *c = client(s.port, NULL);
    mgpu_err_t err = {0};
    CHECK_INT(mgpu_store_barrier(c, "lonely", 3, 0.2, &err), MGPU_E_TIMEOUT);
    CHECK_CONTAINS(err.msg, "barrier \"lonely\": 1 of 3 arrived");
    mgpu_store_close(c);
    srv_stop(&s);
}

static void t_prefix_namespaces_keys(void)
{
    srv_t s = srv_start(NULL);
    mgpu_store_t *a = client(s.port, NULL), *b = client(s.port, NULL), *raw = client(s.port, NULL);
    mgpu_store_t *e = NULL;
    mgpu_err_t err = {0};
    void *v = NULL;
    size_t n;
    char port[16];

    mgpu_store_set_prefix(a, "run/0/");
    mgpu_store_set_prefix(b, "run/1/");
    CHECK_INT(mgpu_store_set(a, "k", "A", 1, &err), 0);
    CHECK_INT(mgpu_store_set(b, "k", "B", 1, &err), 0);
    CHECK_INT(mgpu_store_get(a, "k", 0, &v, &n, &err), 0);
    CHECK_STR((char *)v, "A");
    free(v);
    CHECK_INT(mgpu_store_get(raw, "run/1/k", 0, &v, &n, &err), 0);
    CHECK_STR((char *)v, "B");
    free(v);
    CHECK_INT(mgpu_store_get(raw, "k", 0, &v, &n, &err), MGPU_E_TIMEOUT);

    /* the environment of a worker of restart attempt 1 */
    snprintf(port, sizeof port, "%d", s.port);
    setenv(MGPU_ENV_STORE_ADDR, "127.0.0.1", 1);
    setenv(MGPU_ENV_STORE_PORT, port, 1);
    unsetenv(MGPU_ENV_STORE_TOKEN);
    setenv("TORCHELASTIC_RUN_ID", "run", 1);
    setenv("TORCHELASTIC_RESTART_COUNT", "1", 1);
    CHECK_INT(mgpu_store_connect_env(5.0, &e, &err), 0);
    CHECK_INT(mgpu_store_get(e, "k", 0, &v, &n, &err), 0);
    CHECK_STR((char *)v, "B");
    free(v);
    mgpu_store_close(e);
    setenv(MGPU_ENV_STORE_PORT, "70000", 1);
    CHECK_INT(mgpu_store_connect_env(5.0, &e, &err), MGPU_E_USAGE);
    CHECK_CONTAINS(err.msg, "MGPU_STORE_PORT=\"70000\"");
    unsetenv(MGPU_ENV_STORE_ADDR);
    CHECK_INT(mgpu_store_connect_env(5.0, &e, &err), MGPU_E_USAGE);
    CHECK_CONTAINS(err.msg, "MGPU_STORE_ADDR is not set");
    mgpu_store_close(a);
    mgpu_store_close(b);
    mgpu_store_close(raw);
    srv_stop(&s);
}

static void t_token(void)
{
    mgpu_store_server_opts_t o = {.token = "s3cret"};
    srv_t s = srv_start(&o);
    mgpu_store_t *c = NULL;
    mgpu_err_t err = {0};
    double t0 = mgpu_clock_mono();
    uint8_t st = 0, op = 0;
    int fd;

    CHECK_INT(mgpu_store_connect("127.0.0.1", s.port, "s3creT", 5.0, &c, &err), MGPU_E_AUTH);
    CHECK(mgpu_clock_mono() - t0 < 2.0); /* refused at once, not retried until the timeout */
    CHECK_CONTAINS(err.msg, "wrong store token");
    CHECK_INT(mgpu_store_connect("127.0.0.1", s.port, NULL, 5.0, &c, &err), MGPU_E_AUTH);
    CHECK_INT(mgpu_store_connect("127.0.0.1", s.port, "s3cret1", 5.0, &c, &err), MGPU_E_AUTH);
    c = client(s.port, "s3cret");
    CHECK_INT(mgpu_store_ping(c, &err), 0);
    mgpu_store_close(c);
    /* a request before HELLO is refused */
    fd = raw_connect(s.port);
    {
        mgpu_store_buf_t b = {0};
        size_t at = mgpu_store_buf_frame_begin(&b, MGPU_STORE_OP_NUM_KEYS, 0, 1);
        mgpu_store_buf_frame_end(&b, at);
        raw_send(fd, b.p, b.len);
        mgpu_store_buf_free(&b);
    }
    CHECK_INT(raw_read_frame(fd, &st, &op), 1);
    CHECK_INT(st, MGPU_STORE_ST_PROTOCOL);
    CHECK(raw_closed(fd));
    close(fd);
    /* another protocol version is refused, whatever follows its version byte */
    fd = raw_connect(s.port);
    raw_send(fd, "MG\x01\x00\x01\x00\x00\x00\x03\x00\x00\x00\x09\xff\xff", 15);
    CHECK_INT(raw_read_frame(fd, &st, &op), 1);
    CHECK_INT(st, MGPU_STORE_ST_VERSION);
    CHECK(raw_closed(fd));
    close(fd);
    sleep_s(0.05);
    CHECK_CONTAINS(srv_log(&s), "wrong store token");
    CHECK_CONTAINS(srv_log(&s), "first request is NUM_KEYS, expected HELLO");
    CHECK_CONTAINS(srv_log(&s), "protocol version 9 not supported");
    srv_stop(&s);
}

static void t_open_bind_without_token_warns(void)
{
    mgpu_store_server_opts_t o = {.bind_host = "0.0.0.0"};
    srv_t s = srv_start(&o);
    mgpu_store_t *c = client(s.port, NULL);
    mgpu_err_t err = {0};
    CHECK_INT(mgpu_store_ping(c, &err), 0);
    CHECK_CONTAINS(srv_log(&s), "listening on 0.0.0.0:0 with no token");
    mgpu_store_close(c);
    srv_stop(&s);
}

static void t_silent_peer_is_closed(void)
{
    mgpu_store_server_opts_t o = {.hello_timeout_ms = 200};
    srv_t s = srv_start(&o);
    mgpu_store_t *c = client(s.port, NULL);
    mgpu_err_t err = {0};
    double t0 = mgpu_clock_mono();
    int fd = raw_connect(s.port); /* connects and never says HELLO */

    CHECK(raw_closed(fd));
    CHECK(mgpu_clock_mono() - t0 >= 0.15 && mgpu_clock_mono() - t0 < 2.0);
    close(fd);
    sleep_s(0.3); /* an authenticated connection is not subject to it */
    CHECK_INT(mgpu_store_ping(c, &err), 0);
    CHECK_CONTAINS(srv_log(&s), "no HELLO within 200 ms");
    mgpu_store_close(c);
    srv_stop(&s);
}

static void t_garbage_closes_only_that_connection(void)
{
    srv_t s = srv_start(NULL);
    mgpu_store_t *c = client(s.port, NULL);
    mgpu_err_t err = {0};
    const char http[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    int fd;

    CHECK_INT(mgpu_store_set(c, "k", "v", 1, &err), 0);
    /* garbage before HELLO */
    fd = raw_connect(s.port);
    raw_send(fd, http, sizeof http - 1);
    CHECK(raw_closed(fd));
    close(fd);
    /* garbage after a good HELLO */
    fd = raw_connect(s.port);
    raw_hello(fd, MGPU_STORE_PROTO_VERSION, "");
    raw_send(fd, "MG\x03\x00\x01\x00\x00\x00\x02\x00\x00\x00zz", 14); /* GET truncated field */
    CHECK(raw_closed(fd));
    close(fd);
    /* an unknown op */
    fd = raw_connect(s.port);
    raw_hello(fd, MGPU_STORE_PROTO_VERSION, "");
    raw_send(fd, "MG\x42\x00\x01\x00\x00\x00\x00\x00\x00\x00", 12);
    CHECK(raw_closed(fd));
    close(fd);
    /* the good client never noticed */
    CHECK_INT(mgpu_store_set(c, "k2", "v", 1, &err), 0);
    CHECK_INT(mgpu_store_ping(c, &err), 0);
    sleep_s(0.05);
    CHECK_CONTAINS(srv_log(&s), "bad frame magic");
    CHECK_CONTAINS(srv_log(&s), "malformed GET frame");
    CHECK_CONTAINS(srv_log(&s), "unknown request op 0x42");
    mgpu_store_close(c);
    srv_stop(&s);
}

static void t_oversized_frames(void)
{
    mgpu_store_server_opts_t o = {.max_value = 1024, .max_key = 64};
    srv_t s = srv_start(&o);
    mgpu_store_t *c = client(s.port, NULL), *big = client(s.port, NULL);
    mgpu_err_t err = {0};
    char val[2048], key[100];
    int fd;

    memset(val, 'v', sizeof val);
    memset(key, 'k', sizeof key - 1);
    key[sizeof key - 1] = '\0';
    /* a header announcing 4 GiB after HELLO: refused on the header alone */
    fd = raw_connect(s.port);
    raw_hello(fd, MGPU_STORE_PROTO_VERSION, "");
    raw_send(fd, "MG\x02\x00\x01\x00\x00\x00\xf0\xff\xff\xff", 12);
    CHECK(raw_closed(fd));
    close(fd);
    /* before HELLO even a value-sized frame is too big */
    fd = raw_connect(s.port);
    raw_send(fd, "MG\x01\x00\x01\x00\x00\x00\x00\x04\x00\x00", 12);
    CHECK(raw_closed(fd));
    close(fd);
    /* the client sends what its own (larger) limits allow; this server refuses it */
    CHECK_INT(mgpu_store_set(big, "k", val, sizeof val, &err), MGPU_E_PROTOCOL);
    CHECK_CONTAINS(err.msg, "over its limit");
    CHECK_INT(mgpu_store_set(big, key, "v", 1, &err), MGPU_E_PROTOCOL);
    /* ... and that client reconnects for its next call */
    CHECK_INT(mgpu_store_set(big, "k", val, 1024, &err), 0);
    CHECK_INT(mgpu_store_set(c, "other", "v", 1, &err), 0);
    sleep_s(0.05);
    CHECK_CONTAINS(srv_log(&s), "exceeds the limit");
    mgpu_store_close(c);
    mgpu_store_close(big);
    srv_stop(&s);
}

static void t_large_value_round_trip(void)
{
    srv_t s = srv_start(NULL);
    mgpu_store_t *c = client(s.port, NULL);
    mgpu_err_t err = {0};
    size_t n = 24u << 20, got = 0;
    unsigned char *val = malloc(n);
    void *v = NULL;

    for (size_t i = 0; i < n; i++)
        val[i] = (unsigned char)(i * 2654435761u >> 13);
    CHECK_INT(mgpu_store_set(c, "big", val, n, &err), 0);
    CHECK_INT(mgpu_store_get(c, "big", 0, &v, &got, &err), 0);
    CHECK_INT(got, n);
    CHECK(v != NULL && memcmp(v, val, n) == 0);
    free(v);
    CHECK_INT(mgpu_store_set(c, "huge", val, MGPU_STORE_MAX_VALUE + 1u, &err), MGPU_E_RANGE);
    free(val);
    mgpu_store_close(c);
    srv_stop(&s);
}

/* A client that pipelines requests for a big value and never reads must not slow others. */
static void t_slow_client_blocks_no_one(void)
{
    srv_t s = srv_start(NULL);
    mgpu_store_t *c = client(s.port, NULL);
    mgpu_err_t err = {0};
    size_t n = 4u << 20;
    char *val = calloc(1, n);
    mgpu_store_buf_t b = {0};
    double t0;
    int fd;

    CHECK_INT(mgpu_store_set(c, "big", val, n, &err), 0);
    fd = raw_connect(s.port);
    raw_hello(fd, MGPU_STORE_PROTO_VERSION, "");
    for (int i = 0; i < 200; i++) { /* 800 MiB of answers that will never be read */
        size_t at = mgpu_store_buf_frame_begin(&b, MGPU_STORE_OP_GET, 0, (uint32_t)i + 10);
        mgpu_store_buf_u32(&b, 0);
        mgpu_store_buf_bytes(&b, "big", 3);
        mgpu_store_buf_frame_end(&b, at);
    }
    raw_send(fd, b.p, b.len);
    mgpu_store_buf_free(&b);
    t0 = mgpu_clock_mono();
    for (int i = 0; i < 200; i++)
        CHECK_INT(mgpu_store_ping(c, &err), 0);
    CHECK(mgpu_clock_mono() - t0 < 1.0);
    close(fd);
    free(val);
    mgpu_store_close(c);
    srv_stop(&s);
}

/* A paused connection (answers not read) resumes and gets every answer once it reads. */
static void t_back_pressure_resumes(void)
{
    enum { N = 40 };
    srv_t s = srv_start(NULL);
    mgpu_store_t *c = client(s.port, NULL);
    mgpu_err_t err = {0};
    size_t n = 4u << 20;
    char *val = malloc(n);
    mgpu_store_buf_t b = {0};
    uint8_t st = 0, op = 0;
    int fd, got = 0;

    memset(val, 'x', n);
    CHECK_INT(mgpu_store_set(c, "big", val, n, &err), 0);
    fd = raw_connect(s.port);
    raw_hello(fd, MGPU_STORE_PROTO_VERSION, "");
    got = 1; /* the handshake's answers, read by raw_hello */
    for (int i = 0; i < N; i++) {
        size_t at = mgpu_store_buf_frame_begin(&b, MGPU_STORE_OP_GET, 0, (uint32_t)i + 10);
        mgpu_store_buf_u32(&b, 0);
        mgpu_store_buf_bytes(&b, "big", 3);
        mgpu_store_buf_frame_end(&b, at);
    }
    raw_send(fd, b.p, b.len);
    mgpu_store_buf_free(&b);
    sleep_s(0.3); /* the server fills the socket and pauses this connection */
    {
        struct timeval tv = {5, 0}; /* a server that never resumes fails, not hangs, the test */
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    }
    {
        mgpu_store_dec_t d;
        mgpu_store_frame_t f;
        mgpu_store_dec_init(&d, NULL, 1);
        while (got < N + 1) { /* the handshake's answers, then N values */
            uint8_t *p;
            size_t avail;
            ssize_t r;
            if (mgpu_store_dec_next(&d, &f, NULL) == 1) {
                if (got > 0) {
                    st = f.status;
                    op = f.op;
                    CHECK(st == 0 && op == (MGPU_STORE_OP_GET | MGPU_STORE_RESP) &&
                          f.id == (uint32_t)got - 1 + 10 && f.len == 4 + n);
                }
                got++;
                continue;
            }
            mgpu_store_dec_reserve(&d, 0, &p, &avail);
            r = recv(fd, p, avail, 0);
            if (r <= 0)
                break;
            mgpu_store_dec_commit(&d, (size_t)r);
        }
        mgpu_store_dec_free(&d);
    }
    CHECK_INT(got, N + 1);
    close(fd);
    free(val);
    mgpu_store_close(c);
    srv_stop(&s);
}

/* Waits parked by a client that goes away, or still parked when the server stops, are freed
 * (LeakSanitizer checks the server under ASan); keys only waited for are not counted. */
static void t_parked_waits_of_gone_clients(void)
{
    srv_t s = srv_start(NULL);
    mgpu_store_t *c = client(s.port, NULL);
    mgpu_err_t err = {0};
    int64_t x = -1;
    pid_t a = fork(), b;

    if (a == 0) {
        mgpu_store_t *w = client(s.port, NULL);
        void *v;
        size_t n;
        mgpu_store_get(w, "never", 60.0, &v, &n, &err);
        _exit(0);
    }
    b = fork();
    if (b == 0) {
        mgpu_store_t *w = client(s.port, NULL);
        const char *keys[] = {"never", "x", "y"};
        mgpu_store_wait(w, keys, 3, -1.0, &err); /* no deadline: no timer */
        _exit(0);
    }
    sleep_s(0.3);
    CHECK_INT(mgpu_store_num_keys(c, &x, &err), 0);
    CHECK_INT(x, 0);
    CHECK_INT(mgpu_store_delete(c, "never", NULL, &err), 0);
    kill(a, SIGKILL);
    waitpid(a, NULL, 0);
    sleep_s(0.1);
    CHECK_INT(mgpu_store_set(c, "never", "v", 1, &err), 0); /* b's wait still has x and y */
    CHECK_INT(mgpu_store_set(c, "x", "v", 1, &err), 0);
    CHECK_INT(mgpu_store_num_keys(c, &x, &err), 0);
    CHECK_INT(x, 2);
    mgpu_store_close(c);
    srv_stop(&s); /* with b still parked */
    kill(b, SIGKILL);
    waitpid(b, NULL, 0);
}

static void t_max_conns(void)
{
    mgpu_store_server_opts_t o = {.max_conns = 3};
    srv_t s = srv_start(&o);
    mgpu_store_t *c[3], *d = NULL;
    mgpu_err_t err = {0};
    double t0;
    int rc = -1;

    for (int i = 0; i < 3; i++)
        c[i] = client(s.port, NULL);
    /* a full store is busy, not wrong: the client retries until its own deadline */
    t0 = mgpu_clock_mono();
    CHECK_INT(mgpu_store_connect("127.0.0.1", s.port, NULL, 1.0, &d, &err), MGPU_E_TIMEOUT);
    CHECK(mgpu_clock_mono() - t0 < 2.0);
    CHECK(mgpu_clock_mono() - t0 >= 0.5);
    CHECK_CONTAINS(err.msg, "too many connections (max_conns 3)");
    mgpu_store_close(c[0]);
    /* the server notices the close asynchronously: a slot frees within moments */
    for (int i = 0; i < 100 && rc != 0; i++) {
        rc = mgpu_store_connect("127.0.0.1", s.port, NULL, 5.0, &d, &err);
        if (rc != 0)
            sleep_s(0.01);
    }
    CHECK_INT(rc, 0);
    CHECK_INT(mgpu_store_ping(c[1], &err), 0);
    mgpu_store_close(d);
    mgpu_store_close(c[1]);
    mgpu_store_close(c[2]);
    sleep_s(0.05);
    CHECK_CONTAINS(srv_log(&s), "too many connections");
    srv_stop(&s);
}

/* A free port: bound, read and released (a race with other programs, harmless here). */
static int free_port(void)
{
    struct sockaddr_in a = {0};
    socklen_t len = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM, 0), port;
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd, (struct sockaddr *)&a, sizeof a);
    getsockname(fd, (struct sockaddr *)&a, &len);
    port = ntohs(a.sin_port);
    close(fd);
    return port;
}

/* A server of options o that starts after delay seconds, in a child; its log file is made
 * from the template log. The child's pid. */
static pid_t late_server(const mgpu_store_server_opts_t *o, double delay, char *log)
{
    close(mkstemp(log));
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int p[2];
        if (pipe(p) < 0)
            _exit(1);
        sleep_s(delay);
        srv_child(o, p[1], log);
    }
    return pid;
}

static void t_connect_retries_until_server_is_up(void)
{
    mgpu_store_server_opts_t o = {.port = free_port()};
    mgpu_store_t *c = NULL;
    mgpu_err_t err = {0};
    char log[] = "/tmp/mgpu-store-test-XXXXXX"; /* the server's, removed here after it ends */
    double t0 = mgpu_clock_mono();
    pid_t pid = late_server(&o, 0.4, log);

    CHECK_INT(mgpu_store_connect("127.0.0.1", o.port, NULL, 5.0, &c, &err), 0);
    CHECK(mgpu_clock_mono() - t0 >= 0.35);
    CHECK_INT(mgpu_store_ping(c, &err), 0);
    mgpu_store_close(c);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    unlink(log);
    /* nothing there: a timeout naming the address */
    t0 = mgpu_clock_mono();
    CHECK_INT(mgpu_store_connect("127.0.0.1", free_port(), NULL, 0.5, &c, &err), MGPU_E_TIMEOUT);
    CHECK(mgpu_clock_mono() - t0 < 2.0);
    CHECK_CONTAINS(err.msg, "cannot reach the store at 127.0.0.1:");
    CHECK_CONTAINS(err.msg, "Connection refused");
}

/* Something that is not a store on the port (it accepts, and never answers): the client says
 * so rather than that nobody is there. */
static void t_connect_to_a_silent_listener_says_so(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t len = sizeof a;
    mgpu_store_t *c = NULL;
    mgpu_err_t err = {0};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 8) == 0 &&
          getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    CHECK_INT(mgpu_store_connect("127.0.0.1", ntohs(a.sin_port), NULL, 0.5, &c, &err),
              MGPU_E_TIMEOUT);
    CHECK_CONTAINS(err.msg, "the connection was accepted but HELLO got no answer");
    CHECK_CONTAINS(err.msg, "not an mgpu store");
    close(fd);
}

/* A raw connect to 127.0.0.1:port; 1 when it reached itself (closed here with a reset). */
static int raw_connect_reaches_itself(int port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    struct sockaddr_in me = {0};
    socklen_t len = sizeof me;
    const struct linger now = {.l_onoff = 1, .l_linger = 0};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), self = 0;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&me, &len) == 0)
        self = me.sin_port == a.sin_port;
    if (fd >= 0) {
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &now, sizeof now);
        close(fd);
    }
    return self;
}

/* A client that retries before its server is up may be given the server's port as its own
 * source port when that port lies in the ephemeral range: the connection reaches itself (TCP's
 * simultaneous open) and reads back its own HELLO. In a network namespace of its own whose
 * ephemeral range is the server's port P and P + 1, every attempt while nothing listens on P
 * does so; the client must wait for the server all the same, and leave P free for it. A
 * network namespace needs root: skipped without. */
static void t_connect_waits_past_a_connection_to_itself(void)
{
    enum { P = 40000 };
    mgpu_store_server_opts_t o = {.port = P};
    mgpu_store_t *c = NULL;
    mgpu_err_t err = {0};
    char log[] = "/tmp/mgpu-store-test-XXXXXX";

    if (netns_enter(P, P + 1) != 0)
        SKIP("no network namespace of its own with ephemeral ports %d-%d here", P, P + 1);
    if (!raw_connect_reaches_itself(P))
        SKIP("this kernel did not hand out port %d to a connection to it", P);
    const double t0 = mgpu_clock_mono();
    pid_t pid = late_server(&o, 0.3, log);
    CHECK_INT(mgpu_store_connect("127.0.0.1", P, NULL, 5.0, &c, &err), 0);
    CHECK(mgpu_clock_mono() - t0 >= 0.25);
    if (c != NULL) {
        CHECK_INT(mgpu_store_set(c, "k", "v", 1, &err), 0);
        CHECK_INT(mgpu_store_ping(c, &err), 0);
        mgpu_store_close(c);
    } else {
        printf("  %s\n", err.msg);
    }
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    unlink(log);
}

static void t_reconnect_after_server_restart(void)
{
    srv_t s = srv_start(NULL);
    mgpu_store_server_opts_t o = {.port = s.port};
    mgpu_store_t *c = client(s.port, NULL);
    mgpu_err_t err = {0};
    int64_t x = 0;

    CHECK_INT(mgpu_store_set(c, "k", "v", 1, &err), 0);
    srv_stop(&s);
    s = srv_start(&o); /* same port, empty store */
    /* idempotent: retried on a new connection, transparently */
    CHECK_INT(mgpu_store_set(c, "k", "w", 1, &err), 0);
    srv_stop(&s);
    s = srv_start(&o);
    /* not idempotent: reported; the next call reconnects */
    CHECK_INT(mgpu_store_add(c, "n", 1, &x, &err), MGPU_E_PEER);
    CHECK_CONTAINS(err.msg, "not retried");
    CHECK_INT(mgpu_store_add(c, "n", 1, &x, &err), 0);
    CHECK_INT(x, 1);
    mgpu_store_close(c);
    srv_stop(&s);
}

static void t_bind_error_names_the_call(void)
{
    uv_loop_t loop;
    mgpu_store_server_t *a = NULL, *b = NULL;
    mgpu_store_server_opts_t o = {0};
    mgpu_err_t err = {0};
    char want[64];

    uv_loop_init(&loop);
    CHECK_INT(mgpu_store_server_start(&loop, &o, &a, &err), 0);
    o.port = mgpu_store_server_port(a);
    CHECK(o.port > 0);
    CHECK_INT(mgpu_store_server_start(&loop, &o, &b, &err), -EADDRINUSE);
    CHECK(b == NULL);
    snprintf(want, sizeof want, "bind(127.0.0.1:%d): Address already in use", o.port);
    CHECK_STR(err.msg, want);
    o.bind_host = "::1";
    if (mgpu_store_server_start(&loop, &o, &b, &err) == 0) /* where IPv6 loopback exists */
        mgpu_store_server_close(b);
    o.bind_host = "no-such-host.invalid";
    CHECK(mgpu_store_server_start(&loop, &o, &b, &err) < 0);
    CHECK_CONTAINS(err.msg, "getaddrinfo(no-such-host.invalid)");
    o.bind_host = NULL;
    o.port = 70000;
    CHECK_INT(mgpu_store_server_start(&loop, &o, &b, &err), MGPU_E_RANGE);
    {
        char t1[33], t2[33];
        CHECK_INT(mgpu_store_server_token_generate(t1, sizeof t1, &err), 0);
        CHECK_INT(mgpu_store_server_token_generate(t2, sizeof t2, &err), 0);
        CHECK_INT(strlen(t1), 32);
        CHECK_INT(strspn(t1, "0123456789abcdef"), 32);
        CHECK(strcmp(t1, t2) != 0);
        CHECK_INT(mgpu_store_server_token_generate(t1, 32, &err), MGPU_E_RANGE);
    }
    mgpu_store_server_close(a);
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK_INT(uv_loop_close(&loop), 0); /* every handle closed and freed */
}

static void t_fd_limit_follows_max_conns(void)
{
    uv_loop_t loop;
    mgpu_store_server_t *a = NULL;
    /* the descriptors it wants: both budgets, authenticated and not, plus 256 */
    mgpu_store_server_opts_t o = {.max_conns = 100, .max_pending = 44};
    mgpu_err_t err = {0};
    struct rlimit rl;
    char log[] = "/tmp/mgpu-store-test-XXXXXX";
    FILE *f;
    char buf[1024] = "";

    close(mkstemp(log));
    uv_loop_init(&loop);
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = 64;
    CHECK(rl.rlim_max >= 400);
    CHECK_INT(setrlimit(RLIMIT_NOFILE, &rl), 0);
    CHECK_INT(mgpu_store_server_start(&loop, &o, &a, &err), 0);
    getrlimit(RLIMIT_NOFILE, &rl);
    CHECK_INT(rl.rlim_cur, 100 + 44 + 256);
    mgpu_store_server_close(a);
    /* a hard limit below what max_conns needs: raised to it, and a warning */
    rl.rlim_cur = 64;
    rl.rlim_max = 200;
    CHECK_INT(setrlimit(RLIMIT_NOFILE, &rl), 0);
    CHECK(freopen(log, "w", stderr) != NULL);
    CHECK_INT(mgpu_store_server_start(&loop, &o, &a, &err), 0);
    getrlimit(RLIMIT_NOFILE, &rl);
    CHECK_INT(rl.rlim_cur, 200);
    mgpu_store_server_close(a);
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK_INT(uv_loop_close(&loop), 0);
    f = fopen(log, "r");
    if (f) {
        buf[fread(buf, 1, sizeof buf - 1, f)] = '\0';
        fclose(f);
    }
    unlink(log);
    CHECK_CONTAINS(buf, "max_conns is 100 but this process may open only 200 descriptors");
}

/* The decoder cuts frames at any byte boundary, and fails for good on a bad header. */
static void t_decoder_incremental(void)
{
    mgpu_store_buf_t b = {0};
    mgpu_store_dec_t d;
    mgpu_store_frame_t f;
    mgpu_store_msg_t m;
    mgpu_store_slice_t k;
    mgpu_err_t err = {0};
    uint32_t pos = 0;
    int frames = 0;

    size_t at = mgpu_store_buf_frame_begin(&b, MGPU_STORE_OP_SET, 0, 5);
    mgpu_store_buf_bytes(&b, "key", 3);
    mgpu_store_buf_bytes(&b, "value", 5);
    CHECK_INT(mgpu_store_buf_frame_end(&b, at), 0);
    at = mgpu_store_buf_frame_begin(&b, MGPU_STORE_OP_WAIT, 0, 6);
    mgpu_store_buf_u32(&b, 100);
    mgpu_store_buf_u32(&b, 2);
    mgpu_store_buf_bytes(&b, "a", 1);
    mgpu_store_buf_bytes(&b, "bc", 2);
    CHECK_INT(mgpu_store_buf_frame_end(&b, at), 0);
    mgpu_store_dec_init(&d, NULL, 0);
    for (size_t i = 0; i < b.len; i++) { /* one byte at a time */
        CHECK_INT(mgpu_store_dec_feed(&d, b.p + i, 1, &err), 0);
        while (mgpu_store_dec_next(&d, &f, &err) == 1) {
            CHECK_INT(mgpu_store_msg_parse(&f, NULL, &m, &err), 0);
            if (frames++ == 0) {
                CHECK_INT(m.op, MGPU_STORE_OP_SET);
                CHECK_INT(m.id, 5);
                CHECK(m.key.len == 3 && memcmp(m.key.p, "key", 3) == 0);
                CHECK(m.val.len == 5 && memcmp(m.val.p, "value", 5) == 0);
            } else {
                CHECK_INT(m.op, MGPU_STORE_OP_WAIT);
                CHECK_INT(m.u32, 100);
                CHECK_INT(m.nkeys, 2);
                CHECK_INT(mgpu_store_keys_next(&m, &pos, &k), 1);
                CHECK(k.len == 1 && k.p[0] == 'a');
                CHECK_INT(mgpu_store_keys_next(&m, &pos, &k), 1);
                CHECK(k.len == 2 && memcmp(k.p, "bc", 2) == 0);
                CHECK_INT(mgpu_store_keys_next(&m, &pos, &k), 0);
            }
        }
    }
    CHECK_INT(frames, 2);
    /* a response op is not a request */
    CHECK_INT(mgpu_store_dec_feed(&d, "MG\x82\x00\0\0\0\0\0\0\0\0", 12, &err), 0);
    CHECK_INT(mgpu_store_dec_next(&d, &f, &err), MGPU_E_PROTOCOL);
    CHECK_CONTAINS(err.msg, "unknown request op 0x82");
    CHECK_INT(mgpu_store_dec_next(&d, &f, &err), MGPU_E_PROTOCOL); /* and stays failed */
    mgpu_store_dec_free(&d);
    /* trailing bytes in a payload */
    mgpu_store_dec_init(&d, NULL, 0);
    CHECK_INT(mgpu_store_dec_feed(&d, "MG\x09\x00\1\0\0\0\1\0\0\0x", 13, &err), 0);
    CHECK_INT(mgpu_store_dec_next(&d, &f, &err), 1);
    CHECK_INT(mgpu_store_msg_parse(&f, NULL, &m, &err), MGPU_E_PROTOCOL);
    CHECK_CONTAINS(err.msg, "trailing bytes");
    mgpu_store_dec_free(&d);
    mgpu_store_buf_free(&b);
}

/* Runs a shell command line, its stdout and stderr into out; returns its exit status. */
static int sh(const char *cmd, char *out, size_t size)
{
    FILE *p = popen(cmd, "r");
    size_t n = p ? fread(out, 1, size - 1, p) : 0;
    int st = p ? pclose(p) : -1;
    out[n] = '\0';
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* tests/helper/store_cli, built next to this binary, as shell scripts and workers use it. */
static void t_store_cli(void)
{
    mgpu_store_server_opts_t o = {.token = "tok"};
    srv_t s = srv_start(&o);
    char exe[4096], cli[4200], cmd[8192], out[4096], port[16];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);

    exe[n > 0 ? n : 0] = '\0';
    if (strrchr(exe, '/'))
        *strrchr(exe, '/') = '\0';
    snprintf(cli, sizeof cli, "%s/store_cli", exe);
    CHECK(access(cli, X_OK) == 0);
    snprintf(port, sizeof port, "%d", s.port);
    setenv(MGPU_ENV_STORE_ADDR, "127.0.0.1", 1);
    setenv(MGPU_ENV_STORE_PORT, port, 1);
    setenv(MGPU_ENV_STORE_TOKEN, "tok", 1);
    setenv("TORCHELASTIC_RUN_ID", "job", 1);
    setenv("TORCHELASTIC_RESTART_COUNT", "0", 1);
#define CLI(args) (snprintf(cmd, sizeof cmd, "%s %s 2>&1", cli, args), sh(cmd, out, sizeof out))
    CHECK_INT(CLI("set k hello"), 0);
    CHECK_INT(CLI("get k"), 0);
    CHECK_STR(out, "hello\n");
    CHECK_INT(CLI("-P job/0/ get k"), 0); /* the same key, prefix given explicitly */
    CHECK_INT(CLI("add n 5"), 0);
    CHECK_STR(out, "5\n");
    CHECK_INT(CLI("cas k hello bye"), 0);
    CHECK_STR(out, "bye\n");
    CHECK_INT(CLI("check k missing"), 0);
    CHECK_STR(out, "0\n");
    CHECK_INT(CLI("get missing 0.1"), 3);
    CHECK_CONTAINS(out, "\"job/0/missing\" not set after 100 ms");
    CHECK_INT(CLI("delete k"), 0);
    CHECK_STR(out, "1\n");
    CHECK_INT(CLI("num_keys"), 0);
    CHECK_STR(out, "1\n");
    CHECK_INT(CLI("add"), 2);
    CHECK_INT(CLI("garbage"), 0);
    CHECK_STR(out, "closed\n");
    CHECK_INT(CLI("oversized"), 0);
    CHECK_STR(out, "closed\n");
    snprintf(cmd, sizeof cmd, "%s -a 127.0.0.1 -p %d -t bad ping 2>&1", cli, s.port);
    CHECK_INT(sh(cmd, out, sizeof out), 1);
    CHECK_CONTAINS(out, "wrong store token");
    snprintf(cmd, sizeof cmd, "%s -a 127.0.0.1 -p %d -t tok get k 0 2>&1", cli, s.port);
    CHECK_INT(sh(cmd, out, sizeof out), 3); /* no prefix: "k" is not "job/0/k" */
    /* three shell "workers" meet at a barrier */
    snprintf(cmd, sizeof cmd,
             "c=%s; $c barrier b 3 10 & p1=$!; $c barrier b 3 10 & p2=$!; "
             "$c barrier b 3 10 || exit 1; wait $p1 && wait $p2",
             cli);
    CHECK_INT(sh(cmd, out, sizeof out), 0);
    CHECK_INT(CLI("barrier b2 2 0.2"), 3);
    CHECK_CONTAINS(out, "barrier \"b2\": 1 of 2 arrived");
#undef CLI
    srv_stop(&s);
}

int main(void)
{
    RUN(t_decoder_incremental);
    RUN(t_every_op);
    RUN(t_get_waits_for_later_set);
    RUN(t_waits_time_out);
    RUN(t_wait_for_several_keys);
    RUN(t_add_is_atomic_across_processes);
    RUN(t_barrier_across_processes);
    RUN(t_barrier_times_out_naming_arrivals);
    RUN(t_prefix_namespaces_keys);
    RUN(t_token);
    RUN(t_open_bind_without_token_warns);
    RUN(t_silent_peer_is_closed);
    RUN(t_garbage_closes_only_that_connection);
    RUN(t_oversized_frames);
    RUN(t_large_value_round_trip);
    RUN(t_slow_client_blocks_no_one);
    RUN(t_back_pressure_resumes);
    RUN(t_parked_waits_of_gone_clients);
    RUN(t_max_conns);
    RUN(t_connect_retries_until_server_is_up);
    RUN(t_connect_waits_past_a_connection_to_itself);
    RUN(t_connect_to_a_silent_listener_says_so);
    RUN(t_reconnect_after_server_restart);
    RUN(t_bind_error_names_the_call);
    RUN(t_fd_limit_follows_max_conns);
    RUN(t_store_cli);
    return check_done();
}
