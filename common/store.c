/* store.c - the blocking client of the store: one non-blocking socket driven with poll(), so
 * every wait has a deadline, and the protocol of store_proto.h.
 *
 * A request is written whole, then frames are read until the one with its id arrives; frames
 * with other ids answer requests whose client-side deadline passed earlier and are skipped.
 * A connection that breaks is dropped; the next call reconnects. The call that saw it break is
 * retried once on a new connection when repeating it cannot change the outcome (SET, GET,
 * WAIT, CHECK, NUM_KEYS, PING); ADD, COMPARE_SET and DELETE are not, since the server may have
 * applied them before the connection broke. */
#include "store.h"

#include <errno.h>       /* errno */
#include <math.h>        /* ceil */
#include <netdb.h>       /* getaddrinfo */
#include <netinet/in.h>  /* IPPROTO_TCP */
#include <netinet/tcp.h> /* TCP_NODELAY */
#include <poll.h>        /* poll */
#include <stdio.h>       /* snprintf */
#include <stdlib.h>      /* malloc, getenv */
#include <string.h>      /* strlen, memcpy */
#include <sys/socket.h>  /* socket, connect, send, recv */
#include <time.h>        /* nanosleep */
#include <unistd.h>      /* close, getpid */

#include "clock.h"       /* mgpu_clock_mono */
#include "sha256.h"      /* mgpu_sha256_equal, mgpu_sha256_wipe */
#include "sock.h"        /* mgpu_sock_is_self_connected */
#include "store_proto.h" /* frames, decoder, handshake proofs */

/* Backoff between connection attempts: starts short because the server is usually starting at
 * the same moment, grows so that a thousand waiting workers do not flood a host that is down. */
#define BACKOFF_FIRST_S 0.01
#define BACKOFF_MAX_S 1.0

struct mgpu_store {
    int fd;           /* -1 after the connection broke: the next call reconnects */
    int no_reconnect; /* mgpu_store_set_reconnect(s, 0): a broken connection stays broken */
    int interrupted;  /* mgpu_store_interrupt: every call fails, none reconnects (atomic) */
    char *host;
    int port;
    char *token;
    double io_timeout_s; /* deadline of calls that do not wait for keys; connect retries */
    char *prefix;
    size_t prefix_len;
    uint32_t next_id;
    mgpu_store_dec_t dec;
    mgpu_store_buf_t out;
};

/* poll() timeout in ms until deadline (< 0: none). */
static int ms_left(double deadline)
{
    double left;
    if (deadline < 0)
        return -1;
    left = deadline - mgpu_clock_mono();
    if (left <= 0)
        return 0;
    return left > 2e6 ? 2000000000 : (int)ceil(left * 1000.0);
}

static void drop_conn(mgpu_store_t *s)
{
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
    /* A new connection starts a new stream: what was buffered belongs to the old one. */
    mgpu_store_dec_free(&s->dec);
    mgpu_store_dec_init(&s->dec, NULL, 1);
}

/* Waits for fd to be ready for events; 0, MGPU_E_TIMEOUT or -errno. */
static int wait_fd(int fd, short events, double deadline)
{
    struct pollfd p = {fd, events, 0};
    for (;;) {
        int rc = poll(&p, 1, ms_left(deadline));
        if (rc > 0)
            return 0;
        if (rc == 0)
            return MGPU_E_TIMEOUT;
        if (errno != EINTR)
            return -errno;
    }
}

static int send_all(mgpu_store_t *s, const uint8_t *p, size_t n, double deadline, mgpu_err_t *err)
{
    while (n > 0) {
        ssize_t w = send(s->fd, p, n, MSG_NOSIGNAL); /* a dead peer must not kill us */
        int rc;
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno != EAGAIN)
            return mgpu_err_set(err, -errno, "send(store %s:%d): %s", s->host, s->port,
                                strerror(errno));
        rc = wait_fd(s->fd, POLLOUT, deadline);
        if (rc == MGPU_E_TIMEOUT)
            return mgpu_err_set(err, rc, "send(store %s:%d): timed out (server not reading)",
                                s->host, s->port);
        if (rc < 0)
            return mgpu_err_set(err, rc, "poll(store %s:%d): %s", s->host, s->port, strerror(-rc));
    }
    return 0;
}

/* Reads frames until the response with id arrives, parsed into *m (pointing into s->dec). */
static int recv_resp(mgpu_store_t *s, uint32_t id, double deadline, mgpu_store_msg_t *m,
                     mgpu_err_t *err)
{
    for (;;) {
        mgpu_store_frame_t f;
        uint8_t *p;
        size_t avail;
        ssize_t r;
        int rc = mgpu_store_dec_next(&s->dec, &f, err);
        if (rc < 0)
            return rc;
        if (rc == 1) {
            /* Another id answers no request of this connection (requests are not pipelined,
             * and a connection whose request timed out is dropped): skipped. Except id 0 with
             * an error: the server's word on the whole connection (too many connections, a
             * frame it could not cut), which answers whatever is waiting. */
            if (f.id != id && !(f.id == 0 && f.status != MGPU_STORE_ST_OK))
                continue;
            return mgpu_store_msg_parse(&f, NULL, m, err);
        }
        /* poll before recv: right after a request the answer is not there yet, and a recv
         * failing with EAGAIN would cost one more system call per round trip. */
        rc = wait_fd(s->fd, POLLIN, deadline);
        if (rc == MGPU_E_TIMEOUT)
            return mgpu_err_set(err, rc, "store %s:%d: no response in time", s->host, s->port);
        if (rc < 0)
            return mgpu_err_set(err, rc, "poll(store %s:%d): %s", s->host, s->port, strerror(-rc));
        if (mgpu_store_dec_reserve(&s->dec, 0, &p, &avail) < 0)
            return mgpu_err_set(err, -ENOMEM, "store client: out of memory reading a response");
        r = recv(s->fd, p, avail, 0);
        if (r > 0) {
            mgpu_store_dec_commit(&s->dec, (size_t)r);
            continue;
        }
        if (r == 0)
            return mgpu_err_set(err, MGPU_E_PEER, "store %s:%d closed the connection", s->host,
                                s->port);
        if (errno != EINTR && errno != EAGAIN)
            return mgpu_err_set(err, -errno, "recv(store %s:%d): %s", s->host, s->port,
                                strerror(errno));
    }
}

/* The error of a non-OK response, with the server's message. */
static int status_error(mgpu_store_t *s, const mgpu_store_msg_t *m, mgpu_err_t *err)
{
    int code;
    switch (m->status) {
    case MGPU_STORE_ST_TIMEOUT:
        code = MGPU_E_TIMEOUT;
        break;
    case MGPU_STORE_ST_BAD_VALUE:
        code = -EINVAL;
        break;
    case MGPU_STORE_ST_AUTH:
        code = MGPU_E_AUTH;
        break;
    case MGPU_STORE_ST_BUSY:
        code = MGPU_E_PEER; /* retried by reconnect, like a server that went away */
        break;
    default:
        code = MGPU_E_PROTOCOL;
        break;
    }
    return mgpu_err_set(err, code, "store %s:%d: %s: %.*s", s->host, s->port,
                        mgpu_store_op_name(m->op), (int)m->val.len, (const char *)m->val.p);
}

/* One TCP connection attempt to any address of host; the fd or -errno (detail in err). */
static int connect_once(mgpu_store_t *s, double deadline, mgpu_err_t *err)
{
    struct addrinfo hints = {0}, *ai = NULL, *a;
    char port[16];
    int rc, fd = -1;

    snprintf(port, sizeof port, "%d", s->port);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    rc = getaddrinfo(s->host, port, &hints, &ai);
    if (rc != 0)
        return mgpu_err_set(err, MGPU_E_PEER, "getaddrinfo(%s): %s", s->host, gai_strerror(rc));
    rc = -ECONNREFUSED;
    for (a = ai; a != NULL; a = a->ai_next) {
        int one = 1, soerr = 0;
        socklen_t len = sizeof soerr;
        fd = socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            rc = mgpu_err_set(err, -errno, "socket(): %s", strerror(errno));
            continue;
        }
        if (connect(fd, a->ai_addr, a->ai_addrlen) < 0) {
            if (errno != EINPROGRESS) {
                rc = mgpu_err_set(err, -errno, "connect(%s:%d): %s", s->host, s->port,
                                  strerror(errno));
                goto next;
            }
            rc = wait_fd(fd, POLLOUT, deadline);
            if (rc == 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) == 0 && soerr) {
                rc = -soerr;
            }
            if (rc < 0) {
                mgpu_err_set(err, rc, "connect(%s:%d): %s", s->host, s->port,
                             rc == MGPU_E_TIMEOUT ? "timed out" : strerror(-rc));
                goto next;
            }
        }
        if (mgpu_sock_is_self_connected(fd)) {
            /* closed with a reset: no TIME_WAIT left on the port the server is to take */
            const struct linger now = {.l_onoff = 1, .l_linger = 0};
            setsockopt(fd, SOL_SOCKET, SO_LINGER, &now, sizeof now);
            rc = mgpu_err_set(err, -ECONNREFUSED,
                              "connect(%s:%d): nobody listens there yet (the attempt reached "
                              "itself)",
                              s->host, s->port);
            goto next;
        }
        /* Requests are small and each waits for its answer: Nagle would add delay to each. */
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        freeaddrinfo(ai);
        return fd;
    next:
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    return rc;
}

/* Sends the frame in b (freed here) and reads the answer to id into *m. */
static int exchange(mgpu_store_t *s, mgpu_store_buf_t *b, size_t start, uint32_t id,
                    double deadline, mgpu_store_msg_t *m, mgpu_err_t *err)
{
    int rc = mgpu_store_buf_frame_end(b, start);
    if (rc < 0) {
        mgpu_store_buf_free(b);
        return mgpu_err_set(err, rc, "store client: out of memory");
    }
    rc = send_all(s, b->p, b->len, deadline, err);
    mgpu_store_buf_free(b);
    if (rc < 0)
        return rc;
    rc = recv_resp(s, id, deadline, m, err);
    if (rc < 0)
        return rc;
    if (m->status != MGPU_STORE_ST_OK)
        return status_error(s, m, err);
    return 0;
}

/* The handshake on the fresh connection s->fd (store_proto.h): HELLO with a nonce, AUTH with
 * our proof, then check the server's. The token itself never leaves the process. */
static int handshake(mgpu_store_t *s, double deadline, mgpu_err_t *err)
{
    mgpu_store_buf_t b = {0};
    mgpu_store_msg_t m;
    uint8_t cnonce[MGPU_STORE_NONCE_LEN], snonce[MGPU_STORE_NONCE_LEN];
    uint8_t want[MGPU_STORE_PROOF_LEN], proof[MGPU_STORE_PROOF_LEN];
    size_t tlen = s->token ? strlen(s->token) : 0;
    uint32_t id = s->next_id++;
    size_t start;
    int rc;

    if ((rc = mgpu_store_random(cnonce, sizeof cnonce, err)) < 0)
        return rc;
    start = mgpu_store_buf_frame_begin(&b, MGPU_STORE_OP_HELLO, 0, id);
    mgpu_store_buf_u8(&b, MGPU_STORE_PROTO_VERSION);
    mgpu_store_buf_bytes(&b, cnonce, sizeof cnonce);
    if ((rc = exchange(s, &b, start, id, deadline, &m, err)) == MGPU_E_TIMEOUT)
        /* A store answers HELLO at once, even when busy: this is something else. */
        return mgpu_err_set(err, rc,
                            "store %s:%d: the connection was accepted but HELLO got no answer "
                            "(a program that is not an mgpu store listening there?)",
                            s->host, s->port);
    if (rc < 0)
        return rc;
    if (m.u8 != MGPU_STORE_PROTO_VERSION)
        return mgpu_err_set(err, MGPU_E_PROTOCOL, "store %s:%d speaks protocol version %u, not %d",
                            s->host, s->port, m.u8, MGPU_STORE_PROTO_VERSION);
    memcpy(snonce, m.val.p, sizeof snonce);
    mgpu_store_proof(s->token, tlen, 0, cnonce, snonce, proof);
    id = s->next_id++;
    start = mgpu_store_buf_frame_begin(&b, MGPU_STORE_OP_AUTH, 0, id);
    mgpu_store_buf_bytes(&b, proof, sizeof proof);
    mgpu_sha256_wipe(proof, sizeof proof);
    if ((rc = exchange(s, &b, start, id, deadline, &m, err)) < 0)
        return rc;
    /* The server proves in turn: a client must not talk to a store that does not know the
     * token (another service on the port, or someone posing as the job's store). */
    mgpu_store_proof(s->token, tlen, 1, cnonce, snonce, want);
    if (!mgpu_sha256_equal(want, m.val2.p, sizeof want))
        return mgpu_err_set(err, MGPU_E_AUTH,
                            "store %s:%d: AUTH: the server does not know this store token (its "
                            "proof does not match): is this the job's store, with the same "
                            "--rdzv_token on every node?",
                            s->host, s->port);
    return 0;
}

/* 1, with err set, once mgpu_store_interrupt gave the connection up (from another thread). */
static int given_up(mgpu_store_t *s, mgpu_err_t *err)
{
    if (!__atomic_load_n(&s->interrupted, __ATOMIC_ACQUIRE))
        return 0;
    mgpu_err_set(err, MGPU_E_CLOSED, "store %s:%d: the connection was given up", s->host, s->port);
    return 1;
}

/* Connects and authenticates, retrying with backoff until the deadline while the server
 * cannot be reached (it may not be up yet) or is busy (all its slots taken, or a flood of
 * connections that never authenticate pushed ours out). A refusal of the token or of the
 * protocol version is final: it cannot get better by retrying. */
static int reconnect(mgpu_store_t *s, double deadline, mgpu_err_t *err)
{
    double backoff = BACKOFF_FIRST_S;
    int attempts = 0;
    for (;;) {
        if (given_up(s, err))
            return MGPU_E_CLOSED; /* no more attempts */
        int rc = connect_once(s, deadline, err);
        attempts++;
        if (rc >= 0) {
            s->fd = rc;
            rc = handshake(s, deadline, err);
            if (rc == 0)
                return 0;
            drop_conn(s);
            /* EOF before the answer: the server went away (restarting?) or dropped us as busy;
             * ST_BUSY says so outright. Anything else that it said is its answer. */
            if (rc != MGPU_E_PEER && rc != -ECONNRESET && rc != -EPIPE)
                return rc;
        }
        if (deadline >= 0 && mgpu_clock_mono() + backoff > deadline) {
            char why[sizeof err->msg - 100];
            snprintf(why, sizeof why, "%.800s", err ? err->msg : "");
            return mgpu_err_set(err, MGPU_E_TIMEOUT,
                                "cannot reach the store at %s:%d after %d attempts: %s", s->host,
                                s->port, attempts, why);
        }
        {
            struct timespec ts = {(time_t)backoff, (long)((backoff - (time_t)backoff) * 1e9)};
            nanosleep(&ts, NULL);
        }
        backoff = backoff * 2 > BACKOFF_MAX_S ? BACKOFF_MAX_S : backoff * 2;
    }
}

int mgpu_store_connect(const char *host, int port, const char *token, double timeout_s,
                       mgpu_store_t **out, mgpu_err_t *err)
{
    mgpu_store_t *s;
    int rc;

    *out = NULL;
    if (host == NULL || *host == '\0' || port <= 0 || port > 65535)
        return mgpu_err_set(err, MGPU_E_USAGE, "store address %s:%d is not valid",
                            host ? host : "(null)", port);
    s = calloc(1, sizeof *s);
    if (s == NULL || (s->host = strdup(host)) == NULL ||
        (token && *token && (s->token = strdup(token)) == NULL) ||
        (s->prefix = strdup("")) == NULL) {
        mgpu_store_close(s);
        return mgpu_err_set(err, -ENOMEM, "store client: out of memory");
    }
    s->fd = -1;
    s->port = port;
    s->io_timeout_s = timeout_s > 0 ? timeout_s : 30.0;
    /* Ids start from the pid so that two clients' frames are told apart in a capture. */
    s->next_id = ((uint32_t)getpid() << 16) | 1u;
    mgpu_store_dec_init(&s->dec, NULL, 1);
    rc = reconnect(s, mgpu_clock_mono() + s->io_timeout_s, err);
    if (rc < 0) {
        mgpu_store_close(s);
        return rc;
    }
    *out = s;
    return 0;
}

int mgpu_store_connect_env(double timeout_s, mgpu_store_t **out, mgpu_err_t *err)
{
    const char *addr = getenv(MGPU_ENV_STORE_ADDR), *port = getenv(MGPU_ENV_STORE_PORT);
    /* MGPU_ATTEMPT counts every start of the group (an elastic restart that admits a node
     * keeps TORCHELASTIC_RESTART_COUNT): each start gets keys of its own. */
    const char *run = getenv("TORCHELASTIC_RUN_ID"), *attempt = getenv("MGPU_ATTEMPT");
    if (attempt == NULL || *attempt == '\0')
        attempt = getenv("TORCHELASTIC_RESTART_COUNT");
    char *end, prefix[512];
    long p;
    int rc;

    *out = NULL;
    if (addr == NULL || *addr == '\0')
        return mgpu_err_set(err, MGPU_E_USAGE, "%s is not set (not started by mgpu-launch?)",
                            MGPU_ENV_STORE_ADDR);
    if (port == NULL)
        return mgpu_err_set(err, MGPU_E_USAGE, "%s is not set (not started by mgpu-launch?)",
                            MGPU_ENV_STORE_PORT);
    errno = 0;
    p = strtol(port, &end, 10);
    if (errno || end == port || *end != '\0' || p <= 0 || p > 65535)
        return mgpu_err_set(err, MGPU_E_USAGE, "%s=\"%s\" is not a port", MGPU_ENV_STORE_PORT,
                            port);
    /* torchrun's defaults when they are absent: run id "none", first attempt. */
    if (snprintf(prefix, sizeof prefix, "%s/%s/", run && *run ? run : "none",
                 attempt && *attempt ? attempt : "0") >= (int)sizeof prefix)
        return mgpu_err_set(err, MGPU_E_USAGE, "TORCHELASTIC_RUN_ID is too long (%zu bytes)",
                            strlen(run));
    rc = mgpu_store_connect(addr, (int)p, getenv(MGPU_ENV_STORE_TOKEN), timeout_s, out, err);
    if (rc == 0)
        mgpu_store_set_prefix(*out, prefix);
    return rc;
}

void mgpu_store_close(mgpu_store_t *s)
{
    if (s == NULL)
        return;
    if (s->fd >= 0)
        close(s->fd);
    mgpu_store_dec_free(&s->dec);
    mgpu_store_buf_free(&s->out);
    free(s->host);
    if (s->token != NULL)
        mgpu_sha256_wipe(s->token, strlen(s->token));
    free(s->token);
    free(s->prefix);
    free(s);
}

void mgpu_store_set_prefix(mgpu_store_t *s, const char *prefix)
{
    char *p = strdup(prefix ? prefix : "");
    if (p == NULL)
        return; /* keeps the old prefix; callers cannot act on this and it never happens */
    free(s->prefix);
    s->prefix = p;
    s->prefix_len = strlen(p);
}

/* ---- requests ---- */

static uint32_t timeout_ms(double timeout_s)
{
    double ms;
    if (timeout_s < 0)
        return MGPU_STORE_WAIT_FOREVER;
    ms = ceil(timeout_s * 1000.0);
    return ms >= (double)(MGPU_STORE_WAIT_FOREVER - 1) ? MGPU_STORE_WAIT_FOREVER - 1 : (uint32_t)ms;
}

static size_t begin(mgpu_store_t *s, uint8_t op)
{
    s->out.len = 0;
    return mgpu_store_buf_frame_begin(&s->out, op, 0, s->next_id++);
}

/* A key field with the prefix, checked against the default key limit. */
static int put_key(mgpu_store_t *s, const char *key, mgpu_err_t *err)
{
    size_t n = strlen(key);
    if (s->prefix_len + n > MGPU_STORE_MAX_KEY)
        return mgpu_err_set(err, MGPU_E_RANGE,
                            "store key \"%.64s...\" is %zu bytes with its prefix (limit %u)", key,
                            s->prefix_len + n, MGPU_STORE_MAX_KEY);
    mgpu_store_buf_u32(&s->out, (uint32_t)(s->prefix_len + n));
    mgpu_store_buf_raw(&s->out, s->prefix, s->prefix_len);
    mgpu_store_buf_raw(&s->out, key, n);
    return 0;
}

static int check_value(size_t len, mgpu_err_t *err)
{
    if (len > MGPU_STORE_MAX_VALUE)
        return mgpu_err_set(err, MGPU_E_RANGE, "store value of %zu bytes exceeds the limit of %u",
                            len, MGPU_STORE_MAX_VALUE);
    return 0;
}

/* Sends the frame begun at `start` in s->out and reads its response into *m. wait_s >= 0 is
 * how long the server may hold the request (GET, WAIT): the client's own deadline is that plus
 * the I/O timeout, so the server's TIMEOUT answer normally comes first. */
static int roundtrip(mgpu_store_t *s, size_t start, double wait_s, int idempotent,
                     mgpu_store_msg_t *m, mgpu_err_t *err)
{
    uint8_t op = s->out.p[start + 2];
    uint32_t id = (uint32_t)s->out.p[start + 4] | (uint32_t)s->out.p[start + 5] << 8 |
                  (uint32_t)s->out.p[start + 6] << 16 | (uint32_t)s->out.p[start + 7] << 24;
    double deadline = wait_s < 0 ? -1.0 : mgpu_clock_mono() + wait_s + s->io_timeout_s;
    int rc;

    if (mgpu_store_buf_frame_end(&s->out, start) < 0)
        return mgpu_err_set(err, -ENOMEM, "store client: out of memory building %s",
                            mgpu_store_op_name(op));
    for (int attempt = 0;; attempt++) {
        int sent = 0;
        if (given_up(s, err))
            return MGPU_E_CLOSED;
        if (s->fd < 0 && s->no_reconnect)
            return mgpu_err_set(err, MGPU_E_CLOSED, "store %s:%d: the connection is lost", s->host,
                                s->port);
        if (s->fd < 0) {
            /* Reconnecting before anything was sent is always safe. */
            rc = reconnect(s, mgpu_clock_mono() + s->io_timeout_s, err);
            if (rc < 0)
                return rc;
        }
        rc = send_all(s, s->out.p, s->out.len, deadline, err);
        if (rc == 0) {
            sent = 1;
            rc = recv_resp(s, id, deadline, m, err);
        }
        if (rc == 0)
            break;
        if (rc == MGPU_E_TIMEOUT) {
            /* Half a frame may be in the socket: the stream is no longer usable. A response
             * that is merely late would be skipped by its id, but a clean slate is simpler. */
            drop_conn(s);
            return rc;
        }
        drop_conn(s);
        if (rc == MGPU_E_PROTOCOL || attempt > 0 || (sent && !idempotent) || s->no_reconnect) {
            if (sent && !idempotent && rc != MGPU_E_PROTOCOL) {
                char why[sizeof err->msg - 120];
                snprintf(why, sizeof why, "%.800s", err ? err->msg : "");
                return mgpu_err_set(err, MGPU_E_PEER,
                                    "%s: connection lost during %s, not retried (it may have "
                                    "been applied)",
                                    why, mgpu_store_op_name(op));
            }
            return rc;
        }
    }
    if (m->status != MGPU_STORE_ST_OK) {
        rc = status_error(s, m, err);
        if (m->status >= MGPU_STORE_ST_AUTH) /* the server closes after these */
            drop_conn(s);
        return rc;
    }
    if (m->op != (op | MGPU_STORE_RESP)) {
        drop_conn(s);
        return mgpu_err_set(err, MGPU_E_PROTOCOL, "store %s:%d answered %s with a %s response",
                            s->host, s->port, mgpu_store_op_name(op), mgpu_store_op_name(m->op));
    }
    return 0;
}

static int copy_out(const mgpu_store_slice_t *v, void **val, size_t *len, mgpu_err_t *err)
{
    /* One more byte, a NUL, so that string values can be used as such. */
    char *p = malloc((size_t)v->len + 1);
    if (p == NULL)
        return mgpu_err_set(err, -ENOMEM, "store client: out of memory for a %u-byte value",
                            v->len);
    if (v->len)
        memcpy(p, v->p, v->len);
    p[v->len] = '\0';
    *val = p;
    if (len)
        *len = v->len;
    return 0;
}

int mgpu_store_set(mgpu_store_t *s, const char *key, const void *val, size_t len, mgpu_err_t *err)
{
    mgpu_store_msg_t m;
    size_t start = begin(s, MGPU_STORE_OP_SET);
    int rc = put_key(s, key, err);
    if (rc < 0 || (rc = check_value(len, err)) < 0)
        return rc;
    mgpu_store_buf_bytes(&s->out, val, len);
    return roundtrip(s, start, 0, 1, &m, err);
}

int mgpu_store_get(mgpu_store_t *s, const char *key, double timeout_s, void **val, size_t *len,
                   mgpu_err_t *err)
{
    mgpu_store_msg_t m;
    size_t start = begin(s, MGPU_STORE_OP_GET);
    int rc;

    *val = NULL;
    mgpu_store_buf_u32(&s->out, timeout_ms(timeout_s));
    if ((rc = put_key(s, key, err)) < 0)
        return rc;
    rc = roundtrip(s, start, timeout_s, 1, &m, err);
    if (rc < 0)
        return rc;
    return copy_out(&m.val, val, len, err);
}

int mgpu_store_add(mgpu_store_t *s, const char *key, int64_t delta, int64_t *result,
                   mgpu_err_t *err)
{
    mgpu_store_msg_t m;
    size_t start = begin(s, MGPU_STORE_OP_ADD);
    int rc = put_key(s, key, err);
    if (rc < 0)
        return rc;
    mgpu_store_buf_i64(&s->out, delta);
    rc = roundtrip(s, start, 0, 0, &m, err);
    if (rc == 0 && result)
        *result = m.i64;
    return rc;
}

int mgpu_store_compare_set(mgpu_store_t *s, const char *key, const void *expected, size_t elen,
                           const void *desired, size_t dlen, void **current, size_t *clen,
                           mgpu_err_t *err)
{
    mgpu_store_msg_t m;
    size_t start = begin(s, MGPU_STORE_OP_COMPARE_SET);
    int rc = put_key(s, key, err);

    if (current)
        *current = NULL;
    if (rc < 0 || (rc = check_value(elen, err)) < 0 || (rc = check_value(dlen, err)) < 0)
        return rc;
    mgpu_store_buf_bytes(&s->out, expected, elen);
    mgpu_store_buf_bytes(&s->out, desired, dlen);
    rc = roundtrip(s, start, 0, 0, &m, err);
    if (rc < 0 || current == NULL)
        return rc;
    return copy_out(&m.val, current, clen, err);
}

/* WAIT (timeout_s) or CHECK (timeout_s unused) of n keys. */
static int keys_op(mgpu_store_t *s, uint8_t op, const char *const *keys, size_t n, double timeout_s,
                   mgpu_store_msg_t *m, mgpu_err_t *err)
{
    size_t start = begin(s, op);
    int rc;
    if (n > MGPU_STORE_MAX_KEYS_PER_REQ)
        return mgpu_err_set(err, MGPU_E_RANGE, "store %s of %zu keys exceeds the limit of %u",
                            mgpu_store_op_name(op), n, MGPU_STORE_MAX_KEYS_PER_REQ);
    if (op == MGPU_STORE_OP_WAIT)
        mgpu_store_buf_u32(&s->out, timeout_ms(timeout_s));
    mgpu_store_buf_u32(&s->out, (uint32_t)n);
    for (size_t i = 0; i < n; i++)
        if ((rc = put_key(s, keys[i], err)) < 0)
            return rc;
    return roundtrip(s, start, op == MGPU_STORE_OP_WAIT ? timeout_s : 0, 1, m, err);
}

int mgpu_store_wait(mgpu_store_t *s, const char *const *keys, size_t n, double timeout_s,
                    mgpu_err_t *err)
{
    mgpu_store_msg_t m;
    return keys_op(s, MGPU_STORE_OP_WAIT, keys, n, timeout_s, &m, err);
}

int mgpu_store_check(mgpu_store_t *s, const char *const *keys, size_t n, int *ready,
                     mgpu_err_t *err)
{
    mgpu_store_msg_t m;
    int rc = keys_op(s, MGPU_STORE_OP_CHECK, keys, n, 0, &m, err);
    if (rc == 0)
        *ready = m.u8 != 0;
    return rc;
}

void mgpu_store_set_io_timeout(mgpu_store_t *s, double timeout_s)
{
    if (timeout_s > 0)
        s->io_timeout_s = timeout_s;
}

void mgpu_store_set_reconnect(mgpu_store_t *s, int on)
{
    s->no_reconnect = !on;
}

/* ON_CLOSE and ON_IDLE: a list of key/value pairs, after ON_IDLE's timeout. */
static int pairs_op(mgpu_store_t *s, uint8_t op, double timeout_s, const char *const *keys,
                    const char *const *vals, size_t n, mgpu_err_t *err)
{
    mgpu_store_msg_t m;
    size_t start = begin(s, op);
    int rc;
    if (2 * n > MGPU_STORE_MAX_KEYS_PER_REQ)
        return mgpu_err_set(err, MGPU_E_RANGE, "store %s of %zu keys exceeds the limit",
                            mgpu_store_op_name(op), n);
    if (op == MGPU_STORE_OP_ON_IDLE)
        mgpu_store_buf_u32(&s->out, timeout_ms(timeout_s));
    mgpu_store_buf_u32(&s->out, (uint32_t)(2 * n));
    for (size_t i = 0; i < n; i++) {
        size_t vl = strlen(vals[i]);
        if ((rc = put_key(s, keys[i], err)) < 0)
            return rc;
        if (vl > MGPU_STORE_MAX_KEY)
            return mgpu_err_set(err, MGPU_E_RANGE, "%s value of %zu bytes", mgpu_store_op_name(op),
                                vl);
        mgpu_store_buf_u32(&s->out, (uint32_t)vl);
        mgpu_store_buf_raw(&s->out, vals[i], vl);
    }
    return roundtrip(s, start, 0, 0, &m, err);
}

int mgpu_store_on_close(mgpu_store_t *s, const char *const *keys, const char *const *vals, size_t n,
                        mgpu_err_t *err)
{
    return pairs_op(s, MGPU_STORE_OP_ON_CLOSE, 0, keys, vals, n, err);
}

int mgpu_store_on_idle(mgpu_store_t *s, double timeout_s, const char *const *keys,
                       const char *const *vals, size_t n, mgpu_err_t *err)
{
    if (n > 0 && timeout_s <= 0)
        return mgpu_err_set(err, -EINVAL, "store ON_IDLE: a timeout of %g s", timeout_s);
    return pairs_op(s, MGPU_STORE_OP_ON_IDLE, timeout_s, keys, vals, n, err);
}

void mgpu_store_interrupt(mgpu_store_t *s)
{
    __atomic_store_n(&s->interrupted, 1, __ATOMIC_RELEASE);
    /* Wakes a call blocked in poll() on this connection (its owner closes the descriptor). */
    int fd = __atomic_load_n(&s->fd, __ATOMIC_ACQUIRE);
    if (fd >= 0)
        shutdown(fd, SHUT_RDWR);
}

int mgpu_store_delete(mgpu_store_t *s, const char *key, int *deleted, mgpu_err_t *err)
{
    mgpu_store_msg_t m;
    size_t start = begin(s, MGPU_STORE_OP_DELETE);
    int rc = put_key(s, key, err);
    if (rc < 0)
        return rc;
    rc = roundtrip(s, start, 0, 0, &m, err);
    if (rc == 0 && deleted)
        *deleted = m.u8 != 0;
    return rc;
}

int mgpu_store_num_keys(mgpu_store_t *s, int64_t *n, mgpu_err_t *err)
{
    mgpu_store_msg_t m;
    size_t start = begin(s, MGPU_STORE_OP_NUM_KEYS);
    int rc = roundtrip(s, start, 0, 1, &m, err);
    if (rc == 0)
        *n = m.i64;
    return rc;
}

int mgpu_store_ping(mgpu_store_t *s, mgpu_err_t *err)
{
    mgpu_store_msg_t m;
    size_t start = begin(s, MGPU_STORE_OP_PING);
    uint32_t nonce = (uint32_t)getpid();
    int rc;
    mgpu_store_buf_u32(&s->out, nonce);
    rc = roundtrip(s, start, 0, 1, &m, err);
    if (rc == 0 && m.u32 != nonce)
        return mgpu_err_set(err, MGPU_E_PROTOCOL, "store %s:%d: PING echoed %u, sent %u", s->host,
                            s->port, m.u32, nonce);
    return rc;
}

int mgpu_store_barrier(mgpu_store_t *s, const char *name, int world_size, double timeout_s,
                       mgpu_err_t *err)
{
    char count_key[MGPU_STORE_MAX_KEY + 16], done_key[MGPU_STORE_MAX_KEY + 48];
    const char *keys[1] = {done_key};
    int64_t arrived, round, now;
    int rc;

    if (world_size <= 0)
        return mgpu_err_set(err, MGPU_E_USAGE, "barrier \"%s\": world size %d", name, world_size);
    if (strlen(name) > MGPU_STORE_MAX_KEY)
        return mgpu_err_set(err, MGPU_E_RANGE, "barrier name of %zu bytes", strlen(name));
    /* One counter for all rounds: arrival k (from 1) belongs to round (k-1)/world_size, and
     * the last arrival of a round sets that round's key, which everyone of the round waits for.
     * Nothing is reset, so there is no race between rounds. */
    snprintf(count_key, sizeof count_key, "%s/count", name);
    if ((rc = mgpu_store_add(s, count_key, 1, &arrived, err)) < 0)
        return rc;
    round = (arrived - 1) / world_size;
    snprintf(done_key, sizeof done_key, "%s/%lld/done", name, (long long)round);
    if (arrived % world_size == 0 && (rc = mgpu_store_set(s, done_key, "1", 1, err)) < 0)
        return rc;
    rc = mgpu_store_wait(s, keys, 1, timeout_s, err);
    if (rc == MGPU_E_TIMEOUT && mgpu_store_add(s, count_key, 0, &now, NULL) == 0) {
        now -= round * world_size;
        return mgpu_err_set(err, rc, "barrier \"%s\": %lld of %d arrived in %g s", name,
                            (long long)(now > world_size ? world_size : now), world_size,
                            timeout_s);
    }
    return rc;
}
