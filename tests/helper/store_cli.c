/* store_cli.c - the store from the shell, for integration tests and for workers that are
 * scripts: one operation per run through the blocking client (common/store.h).
 *
 *   store_cli [-a HOST] [-p PORT] [-t TOKEN] [-T TIMEOUT_S] [-P PREFIX] OP ARGS...
 *
 * With no -a, it connects as a worker would (mgpu_store_connect_env: MGPU_STORE_ADDR/PORT/TOKEN,
 * keys under "<TORCHELASTIC_RUN_ID>/<TORCHELASTIC_RESTART_COUNT>/"). Ops:
 *   set KEY VALUE          get KEY [WAIT_S]       add KEY DELTA (prints the new value)
 *   cas KEY EXPECTED DESIRED (prints the value after)  delete KEY (prints 1 or 0)
 *   wait WAIT_S KEY...     check KEY... (prints 1 or 0)  num_keys  ping
 *   barrier NAME WORLD WAIT_S
 *   garbage | oversized    misbehave on a raw connection (bytes that are no frame; the
 *                          handshake then a header announcing 4 GiB) and print "closed" when the
 * server hangs up, as it must Exit status: 0 done, 1 failed (the message on stderr), 2 usage, 3
 * timed out. */
#include <errno.h>      /* errno */
#include <netdb.h>      /* getaddrinfo */
#include <stdio.h>      /* printf */
#include <stdlib.h>     /* strtoll, free */
#include <string.h>     /* strlen */
#include <sys/socket.h> /* socket */
#include <sys/time.h>   /* timeval */
#include <unistd.h>     /* getopt */

#include "store.h"
#include "store_proto.h"

static int usage(void)
{
    fprintf(stderr, "usage: store_cli [-a HOST] [-p PORT] [-t TOKEN] [-T TIMEOUT_S] [-P PREFIX] "
                    "set|get|add|cas|delete|wait|check|num_keys|ping|barrier|garbage|oversized "
                    "ARGS...\n");
    return 2;
}

static int fail(int rc, const mgpu_err_t *err)
{
    fprintf(stderr, "store_cli: %s\n", err->msg);
    return rc == MGPU_E_TIMEOUT ? 3 : 1;
}

/* A raw TCP connection, for what the client library would never send. */
static int raw_connect(const char *host, int port)
{
    struct addrinfo hints = {0}, *ai = NULL;
    struct timeval tv = {10, 0};
    char p[16];
    int fd;

    snprintf(p, sizeof p, "%d", port);
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, p, &hints, &ai) != 0)
        return -1;
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

/* Reads one frame from the blocking fd into d; 1 and *f, or 0 when the peer closed. */
static int raw_frame(int fd, mgpu_store_dec_t *d, mgpu_store_frame_t *f)
{
    for (;;) {
        uint8_t *p;
        size_t avail;
        ssize_t r;
        if (mgpu_store_dec_next(d, f, NULL) == 1)
            return 1;
        if (mgpu_store_dec_reserve(d, 0, &p, &avail) < 0)
            return 0;
        r = recv(fd, p, avail, 0);
        if (r <= 0)
            return 0;
        mgpu_store_dec_commit(d, (size_t)r);
    }
}

/* The handshake of store_proto.h on a raw blocking socket; 0 when the server accepted it. */
static int raw_auth(int fd, const char *token)
{
    uint8_t cn[MGPU_STORE_NONCE_LEN] = {1, 2, 3}, proof[MGPU_STORE_PROOF_LEN];
    mgpu_store_buf_t b = {0};
    mgpu_store_dec_t d;
    mgpu_store_frame_t f;
    mgpu_store_msg_t m;
    size_t at;
    int ok = 0;

    mgpu_store_dec_init(&d, NULL, 1);
    at = mgpu_store_buf_frame_begin(&b, MGPU_STORE_OP_HELLO, 0, 1);
    mgpu_store_buf_u8(&b, MGPU_STORE_PROTO_VERSION);
    mgpu_store_buf_bytes(&b, cn, sizeof cn);
    mgpu_store_buf_frame_end(&b, at);
    if (send(fd, b.p, b.len, MSG_NOSIGNAL) == (ssize_t)b.len && raw_frame(fd, &d, &f) &&
        f.status == 0 && mgpu_store_msg_parse(&f, NULL, &m, NULL) == 0) {
        mgpu_store_proof(token, strlen(token), 0, cn, m.val.p, proof);
        b.len = 0;
        at = mgpu_store_buf_frame_begin(&b, MGPU_STORE_OP_AUTH, 0, 2);
        mgpu_store_buf_bytes(&b, proof, sizeof proof);
        mgpu_store_buf_frame_end(&b, at);
        /* the server's proof is not checked: this is a test of the server */
        ok = send(fd, b.p, b.len, MSG_NOSIGNAL) == (ssize_t)b.len && raw_frame(fd, &d, &f) &&
             f.status == 0;
    }
    mgpu_store_buf_free(&b);
    mgpu_store_dec_free(&d);
    return ok ? 0 : -1;
}

/* Sends the misbehaviour, then reads until the server hangs up: 0 when it did. */
static int misbehave(const char *host, int port, const char *token, int oversized)
{
    int fd = raw_connect(host, port);
    mgpu_store_buf_t b = {0};
    char buf[4096];

    if (fd < 0) {
        fprintf(stderr, "store_cli: cannot connect to %s:%d\n", host, port);
        return 1;
    }
    if (oversized) {
        if (raw_auth(fd, token) < 0) {
            fprintf(stderr, "store_cli: the handshake with %s:%d failed\n", host, port);
            close(fd);
            return 1;
        }
        /* SET announcing 0xfffffff0 bytes: refused on the header alone */
        mgpu_store_buf_raw(&b, "MG\x02\x00\x02\x00\x00\x00\xf0\xff\xff\xff", 12);
    } else {
        mgpu_store_buf_raw(&b, "GET / HTTP/1.1\r\nHost: store\r\n\r\n", 31);
    }
    if (send(fd, b.p, b.len, MSG_NOSIGNAL) != (ssize_t)b.len) {
        perror("store_cli: send");
        close(fd);
        mgpu_store_buf_free(&b);
        return 1;
    }
    mgpu_store_buf_free(&b);
    for (;;) {
        ssize_t r = recv(fd, buf, sizeof buf, 0);
        if (r == 0 || (r < 0 && errno == ECONNRESET)) {
            printf("closed\n");
            close(fd);
            return 0;
        }
        if (r < 0) {
            fprintf(stderr, "store_cli: the server kept the connection open\n");
            close(fd);
            return 1;
        }
    }
}

static int64_t to_i64(const char *s, int *ok)
{
    char *end;
    long long v;
    errno = 0;
    v = strtoll(s, &end, 10);
    *ok = errno == 0 && end != s && *end == '\0';
    return v;
}

int main(int argc, char **argv)
{
    const char *host = NULL, *token = NULL, *prefix = NULL, *op;
    double timeout = 30.0;
    int port = 0, opt, rc, ok = 1;
    mgpu_store_t *s = NULL;
    mgpu_err_t err = {0};

    while ((opt = getopt(argc, argv, "+a:p:t:T:P:")) != -1) {
        switch (opt) {
        case 'a':
            host = optarg;
            break;
        case 'p':
            port = atoi(optarg);
            break;
        case 't':
            token = optarg;
            break;
        case 'T':
            timeout = atof(optarg);
            break;
        case 'P':
            prefix = optarg;
            break;
        default:
            return usage();
        }
    }
    if (optind >= argc)
        return usage();
    op = argv[optind];
    argv += optind + 1;
    argc -= optind + 1;

    if (strcmp(op, "garbage") == 0 || strcmp(op, "oversized") == 0) {
        if (host == NULL) {
            const char *p = getenv(MGPU_ENV_STORE_PORT);
            host = getenv(MGPU_ENV_STORE_ADDR);
            port = p ? atoi(p) : 0;
            token = token ? token : getenv(MGPU_ENV_STORE_TOKEN);
        }
        if (host == NULL || port <= 0)
            return usage();
        return misbehave(host, port, token ? token : "", op[0] == 'o');
    }

    rc = host ? mgpu_store_connect(host, port, token, timeout, &s, &err)
              : mgpu_store_connect_env(timeout, &s, &err);
    if (rc < 0)
        return fail(rc, &err);
    if (prefix)
        mgpu_store_set_prefix(s, prefix);

    if (strcmp(op, "set") == 0 && argc == 2) {
        rc = mgpu_store_set(s, argv[0], argv[1], strlen(argv[1]), &err);
    } else if (strcmp(op, "get") == 0 && (argc == 1 || argc == 2)) {
        void *v = NULL;
        size_t n = 0;
        rc = mgpu_store_get(s, argv[0], argc == 2 ? atof(argv[1]) : timeout, &v, &n, &err);
        if (rc == 0) {
            fwrite(v, 1, n, stdout);
            putchar('\n');
        }
        free(v);
    } else if (strcmp(op, "add") == 0 && argc == 2) {
        int64_t r = 0, d = to_i64(argv[1], &ok);
        rc = ok ? mgpu_store_add(s, argv[0], d, &r, &err) : 0;
        if (ok && rc == 0)
            printf("%lld\n", (long long)r);
    } else if (strcmp(op, "cas") == 0 && argc == 3) {
        void *v = NULL;
        size_t n = 0;
        rc = mgpu_store_compare_set(s, argv[0], argv[1], strlen(argv[1]), argv[2], strlen(argv[2]),
                                    &v, &n, &err);
        if (rc == 0) {
            fwrite(v, 1, n, stdout);
            putchar('\n');
        }
        free(v);
    } else if (strcmp(op, "delete") == 0 && argc == 1) {
        int d = 0;
        rc = mgpu_store_delete(s, argv[0], &d, &err);
        if (rc == 0)
            printf("%d\n", d);
    } else if (strcmp(op, "wait") == 0 && argc >= 2) {
        rc = mgpu_store_wait(s, (const char *const *)argv + 1, (size_t)argc - 1, atof(argv[0]),
                             &err);
    } else if (strcmp(op, "check") == 0 && argc >= 1) {
        int ready = 0;
        rc = mgpu_store_check(s, (const char *const *)argv, (size_t)argc, &ready, &err);
        if (rc == 0)
            printf("%d\n", ready);
    } else if (strcmp(op, "num_keys") == 0 && argc == 0) {
        int64_t n = 0;
        rc = mgpu_store_num_keys(s, &n, &err);
        if (rc == 0)
            printf("%lld\n", (long long)n);
    } else if (strcmp(op, "ping") == 0 && argc == 0) {
        rc = mgpu_store_ping(s, &err);
    } else if (strcmp(op, "barrier") == 0 && argc == 3) {
        int64_t world = to_i64(argv[1], &ok);
        rc = ok ? mgpu_store_barrier(s, argv[0], (int)world, atof(argv[2]), &err) : 0;
    } else {
        ok = 0;
    }
    mgpu_store_close(s);
    if (!ok)
        return usage();
    return rc < 0 ? fail(rc, &err) : 0;
}
