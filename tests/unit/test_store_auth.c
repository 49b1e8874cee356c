/* test_store_auth.c - the store's handshake (challenge and response: the token never crosses
 * the wire, both sides prove they know it) and its defences against connections that never
 * authenticate (a budget and a deadline of their own, rate-limited log lines). The server runs
 * on its thread in the test's process (store_thread.h); its log goes to a file. */
#include <errno.h>        /* errno */
#include <netinet/in.h>   /* sockaddr_in */
#include <poll.h>         /* poll */
#include <stdio.h>        /* freopen */
#include <stdlib.h>       /* free */
#include <sys/resource.h> /* setrlimit */
#include <sys/socket.h>   /* socket */
#include <time.h>         /* nanosleep */

#include "check.h"
#include "clock.h"
#include "log.h"
#include "store.h"
#include "store_proto.h"
#include "store_thread.h"

static char logpath[64];

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* The server's log lines go to a file that the test reads back. */
static mgpu_store_thread_t *start(mgpu_store_server_opts_t *o, int *port)
{
    mgpu_store_thread_t *t = NULL;
    mgpu_err_t e = {0};
    int fd;
    snprintf(logpath, sizeof logpath, "/tmp/mgpu-store-auth-XXXXXX");
    fd = mkstemp(logpath);
    close(fd);
    CHECK(freopen(logpath, "w", stderr) != NULL);
    unlink(logpath); /* read back through /proc/self/fd/2; nothing is left behind */
    setvbuf(stderr, NULL, _IONBF, 0);
    mgpu_log_init("store-test", MGPU_LOG_INFO);
    o->bind_host = "127.0.0.1";
    CHECK_INT(mgpu_store_thread_start(o, &t, port, &e), 0);
    return t;
}

static const char *server_log(void)
{
    static char buf[65536];
    FILE *f = fopen("/proc/self/fd/2", "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = '\0';
    return buf;
}

static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(hay, needle); p != NULL; p = strstr(p + 1, needle))
        n++;
    return n;
}

static int raw_connect(int port)
{
    struct sockaddr_in a = {0};
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void t_wrong_token_refused_on_both_sides(void)
{
    mgpu_store_server_opts_t o = {.token = "right-token"};
    int port;
    mgpu_store_thread_t *t = start(&o, &port);
    mgpu_store_t *c = NULL;
    mgpu_err_t e = {0};
    double t0 = mgpu_clock_mono();

    CHECK_INT(mgpu_store_connect("127.0.0.1", port, "wrong-token", 10, &c, &e), MGPU_E_AUTH);
    CHECK(mgpu_clock_mono() - t0 < 2.0); /* final at once, not retried */
    CHECK_CONTAINS(e.msg, "wrong store token");
    CHECK_INT(mgpu_store_connect("127.0.0.1", port, NULL, 10, &c, &e), MGPU_E_AUTH);
    CHECK_INT(mgpu_store_connect("127.0.0.1", port, "right-token", 10, &c, &e), 0);
    CHECK_INT(mgpu_store_ping(c, &e), 0);
    mgpu_store_close(c);
    mgpu_store_thread_stop(t);
    CHECK_CONTAINS(server_log(), "wrong store token");
    /* neither side ever writes the token */
    CHECK(strstr(server_log(), "right-token") == NULL);
    CHECK(strstr(e.msg, "right-token") == NULL);
}

static void t_client_refuses_a_server_without_the_token(void)
{
    mgpu_store_server_opts_t o = {0}; /* takes anyone, but cannot prove it knows "secret" */
    int port;
    mgpu_store_thread_t *t = start(&o, &port);
    mgpu_store_t *c = NULL;
    mgpu_err_t e = {0};

    CHECK_INT(mgpu_store_connect("127.0.0.1", port, "secret", 10, &c, &e), MGPU_E_AUTH);
    CHECK_CONTAINS(e.msg, "the server does not know this store token");
    CHECK_INT(mgpu_store_connect("127.0.0.1", port, NULL, 10, &c, &e), 0);
    mgpu_store_close(c);
    mgpu_store_thread_stop(t);
}

/* Reads one whole frame from a blocking socket into buf; its total length, or -1. */
static ssize_t read_frame(int fd, uint8_t *buf, size_t cap)
{
    size_t got = 0, want = MGPU_STORE_HDR_SIZE;
    while (got < want) {
        ssize_t r = recv(fd, buf + got, want - got, 0);
        if (r <= 0)
            return -1;
        got += (size_t)r;
        if (got == MGPU_STORE_HDR_SIZE) {
            want += (size_t)buf[8] | (size_t)buf[9] << 8 | (size_t)buf[10] << 16;
            if (want > cap)
                return -1;
        }
    }
    return (ssize_t)got;
}

static int contains(const uint8_t *p, size_t n, const char *s)
{
    size_t k = strlen(s);
    for (size_t i = 0; i + k <= n; i++)
        if (memcmp(p + i, s, k) == 0)
            return 1;
    return 0;
}

static void t_token_never_crosses_the_wire(void)
{
    /* The test plays the server on a plain socket: it sees every byte the client sends, and it
     * answers AUTH with a forged proof, which the client must refuse. */
    const char *token = "tok-0123456789-secret";
    struct sockaddr_in a = {0};
    socklen_t alen = sizeof a;
    int l = socket(AF_INET, SOCK_STREAM, 0), fd, status = 0;
    uint8_t in[512], cn[MGPU_STORE_NONCE_LEN], sn[MGPU_STORE_NONCE_LEN] = {9, 9, 9};
    uint8_t want[MGPU_STORE_PROOF_LEN];
    mgpu_store_buf_t b = {0};
    ssize_t n;
    size_t at;
    pid_t pid;

    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(bind(l, (struct sockaddr *)&a, sizeof a) == 0 && listen(l, 4) == 0);
    getsockname(l, (struct sockaddr *)&a, &alen);
    fflush(stdout);
    pid = fork();
    if (pid == 0) {
        mgpu_store_t *c = NULL;
        mgpu_err_t e = {0};
        int rc = mgpu_store_connect("127.0.0.1", ntohs(a.sin_port), token, 5, &c, &e);
        printf("  client: %s\n", e.msg);
        fflush(stdout);
        _exit(rc == MGPU_E_AUTH && strstr(e.msg, "does not know this store token") ? 0 : 1);
    }
    fd = accept(l, NULL, NULL);
    n = read_frame(fd, in, sizeof in);
    CHECK(n == MGPU_STORE_HDR_SIZE + 1 + 4 + MGPU_STORE_NONCE_LEN);
    CHECK(in[2] == MGPU_STORE_OP_HELLO && in[12] == MGPU_STORE_PROTO_VERSION);
    CHECK(!contains(in, (size_t)n, token));
    memcpy(cn, in + 17, sizeof cn);
    at = mgpu_store_buf_frame_begin(&b, MGPU_STORE_OP_HELLO | MGPU_STORE_RESP, 0,
                                    in[4] | in[5] << 8 | (uint32_t)in[6] << 16 |
                                        (uint32_t)in[7] << 24);
    mgpu_store_buf_u8(&b, MGPU_STORE_PROTO_VERSION);
    mgpu_store_buf_bytes(&b, sn, sizeof sn);
    mgpu_store_buf_frame_end(&b, at);
    CHECK(send(fd, b.p, b.len, MSG_NOSIGNAL) == (ssize_t)b.len);
    n = read_frame(fd, in, sizeof in);
    CHECK(n == MGPU_STORE_HDR_SIZE + 4 + MGPU_STORE_PROOF_LEN && in[2] == MGPU_STORE_OP_AUTH);
    CHECK(!contains(in, (size_t)n, token));
    /* the client's proof is the HMAC the protocol defines */
    mgpu_store_proof(token, strlen(token), 0, cn, sn, want);
    CHECK(memcmp(in + 16, want, sizeof want) == 0);
    /* answer with the client's own proof: a replay, which must not pass for the server's */
    b.len = 0;
    at = mgpu_store_buf_frame_begin(&b, MGPU_STORE_OP_AUTH | MGPU_STORE_RESP, 0,
                                    in[4] | in[5] << 8 | (uint32_t)in[6] << 16 |
                                        (uint32_t)in[7] << 24);
    mgpu_store_buf_bytes(&b, want, sizeof want);
    mgpu_store_buf_frame_end(&b, at);
    CHECK(send(fd, b.p, b.len, MSG_NOSIGNAL) == (ssize_t)b.len);
    mgpu_store_buf_free(&b);
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    close(fd);
    close(l);
}

static void t_busy_store_is_retried(void)
{
    mgpu_store_server_opts_t o = {.token = "t", .max_conns = 1};
    int port, status = 0;
    mgpu_store_thread_t *t = start(&o, &port);
    mgpu_store_t *a = NULL;
    mgpu_err_t e = {0};
    pid_t pid;

    fflush(stdout);
    pid = fork(); /* before the first client connects: the child must not share its socket */
    if (pid == 0) {
        mgpu_store_t *b = NULL;
        int rc;
        sleep_s(0.3);
        rc = mgpu_store_connect("127.0.0.1", port, "t", 10, &b, &e);
        if (rc == 0)
            rc = mgpu_store_ping(b, &e);
        if (rc != 0)
            printf("  second client: %s\n", e.msg);
        fflush(stdout);
        _exit(rc == 0 ? 0 : 1);
    }
    CHECK_INT(mgpu_store_connect("127.0.0.1", port, "t", 5, &a, &e), 0);
    sleep_s(1.0); /* the second client finds the store full and retries */
    mgpu_store_close(a);
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    mgpu_store_thread_stop(t);
    CHECK_CONTAINS(server_log(), "too many connections (max_conns 1)");
}

static void t_handshake_has_a_deadline(void)
{
    mgpu_store_server_opts_t o = {.token = "t", .hello_timeout_ms = 300};
    int port;
    mgpu_store_thread_t *t = start(&o, &port);
    int fd = raw_connect(port);
    /* HELLO, then nothing */
    uint8_t hello[MGPU_STORE_HDR_SIZE + 1 + 4 + MGPU_STORE_NONCE_LEN] = {'M', 'G', 1, 0, 1};
    char buf[256];
    double t0 = mgpu_clock_mono();
    struct timeval tv = {5, 0};

    hello[8] = 1 + 4 + MGPU_STORE_NONCE_LEN;
    hello[12] = MGPU_STORE_PROTO_VERSION;
    hello[13] = MGPU_STORE_NONCE_LEN;
    CHECK(send(fd, hello, sizeof hello, 0) == (ssize_t)sizeof hello);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    while (recv(fd, buf, sizeof buf, 0) > 0)
        ;
    CHECK(mgpu_clock_mono() - t0 < 2.0);
    close(fd);
    mgpu_store_thread_stop(t);
    CHECK_CONTAINS(server_log(), "no AUTH within 300 ms");
}

/* Raises the soft limit on descriptors to the hard one; skips the test when even that is
 * below need (both ends of every connection live in this process). */
static void raise_nofile(long need)
{
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_max != RLIM_INFINITY && (long)rl.rlim_max < need)
        SKIP("the hard limit on descriptors (%ld) is below the %ld this test needs",
             (long)rl.rlim_max, need);
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
}

/* Connections that never authenticate (idle, or garbage) cannot lock the job out: a client
 * still connects within a second, and the log gets a line a second, not one each. */
static void t_flood_cannot_lock_the_store(void)
{
    enum { IDLE = 2000, GARBAGE = 200 };
    mgpu_store_server_opts_t o = {.token = "flood-token"};
    int port, *fds = calloc(IDLE + GARBAGE, sizeof *fds), opened = 0;
    mgpu_store_thread_t *t;
    mgpu_store_t *c = NULL;
    mgpu_err_t e = {0};
    double t0, dt;

    raise_nofile(2L * (IDLE + GARBAGE) + 1024 + 256);
    t = start(&o, &port);
    for (int i = 0; i < IDLE + GARBAGE; i++) {
        fds[i] = raw_connect(port);
        opened += fds[i] >= 0;
        if (i >= IDLE && fds[i] >= 0)
            (void)!send(fds[i], "GET / HTTP/1.1\r\n\r\n", 18, MSG_NOSIGNAL);
    }
    CHECK(opened >= IDLE); /* the flood is in place */
    t0 = mgpu_clock_mono();
    CHECK_INT(mgpu_store_connect("127.0.0.1", port, "flood-token", 10, &c, &e), 0);
    dt = mgpu_clock_mono() - t0;
    printf("  connected in %.1f ms with %d connections of the flood open\n", dt * 1e3, opened);
    CHECK(dt < 1.0);
    CHECK_INT(mgpu_store_ping(c, &e), 0);
    sleep_s(1.2); /* the count of lines not written comes out within a second */
    mgpu_store_close(c);
    for (int i = 0; i < IDLE + GARBAGE; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    free(fds);
    mgpu_store_thread_stop(t);
    {
        const char *log = server_log();
        int lines = count(log, "\n");
        printf("  %d log lines\n", lines);
        CHECK(lines <= 40); /* not one per connection */
        CHECK_CONTAINS(log, "too many connections not authenticated yet (max_pending 1024)");
        CHECK_CONTAINS(log, "without a line");
    }
}

int main(void)
{
    RUN(t_wrong_token_refused_on_both_sides);
    RUN(t_client_refuses_a_server_without_the_token);
    RUN(t_token_never_crosses_the_wire);
    RUN(t_busy_store_is_retried);
    RUN(t_handshake_has_a_deadline);
    RUN(t_flood_cannot_lock_the_store);
    return check_done();
}
