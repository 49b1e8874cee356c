/* store_server.c - the store's libuv server: the listener and the connections that decode
 * frames and write responses. The key table, parked waits and the request handlers are
 * store_requests.c's (the two share store_requests.h).
 *
 * Everything runs on the caller's loop thread. Nothing here blocks: a client that does not read
 * its responses only stops its own connection from being read (back-pressure), and waits are
 * callbacks, so one slow or silent client never delays another. */
#include "store_server.h"

#include <errno.h>      /* ENOMEM */
#include <netdb.h>      /* getaddrinfo */
#include <netinet/in.h> /* sockaddr_in */
#include <stdarg.h>     /* va_list */
#include <stdio.h>      /* snprintf */
#include <stdlib.h>     /* malloc, free */
#include <string.h>     /* memcmp, memcpy */
#include <sys/random.h> /* getrandom */
#include <sys/socket.h> /* socket, bind, listen */
#include <unistd.h>     /* close */

#include "fdio.h"           /* mgpu_fdio_raise_limit */
#include "log.h"            /* mgpu_warn, mgpu_debug */
#include "store_proto.h"    /* frames, decoder */
#include "sock.h"           /* mgpu_sock_addr_is_loopback */
#include "store_requests.h" /* the table and the handlers */

#define DEFAULT_MAX_CONNS 4096
/* Stop decoding a connection's requests while this many response bytes wait for its socket:
 * a client that sends without reading cannot make the server buffer without bound. */
#define OUT_HIGH (1u << 20)
/* listen(2) backlog: a rendezvous of thousands of workers connects at once; the kernel caps
 * this at net.core.somaxconn. */
#define LISTEN_BACKLOG 4096

/* ---- lifetime ---- */

void mgpu_store_server_handle_closed(mgpu_store_server_t *s)
{
    s->handles--;
    if (s->closing && s->handles == 0) {
        mgpu_store_requests_table_free(s);
        free(s->token);
        free(s);
    }
}

static void listener_closed(uv_handle_t *h)
{
    mgpu_store_server_handle_closed(h->data);
}

static void sweep_closed(uv_handle_t *h)
{
    mgpu_store_server_handle_closed(h->data);
}

static void conn_closed(uv_handle_t *h)
{
    conn_t *c = h->data;
    mgpu_store_server_t *s = c->srv;
    free(c->on_close);
    mgpu_store_dec_free(&c->dec);
    mgpu_store_buf_free(&c->out);
    mgpu_store_buf_free(&c->wbuf);
    free(c);
    mgpu_store_server_handle_closed(s);
}

/* Closes at once: queued responses are dropped and parked waits end unanswered. */
void mgpu_store_server_conn_close(conn_t *c)
{
    mgpu_store_server_t *s = c->srv;
    if (c->closing)
        return;
    c->closing = 1;
    if (c->on_close != NULL && !s->closing)
        mgpu_store_requests_on_close(c);
    while (c->waiters != NULL)
        mgpu_store_requests_waiter_free(c->waiters);
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    if (c->counted)
        s->nconns--;
    /* uv_close cancels a write in flight; its callback runs (ECANCELED) before conn_closed. */
    uv_close((uv_handle_t *)&c->tcp, conn_closed);
}

/* ---- writing ---- */

static void conn_process(conn_t *c);
static void conn_read_start(conn_t *c);

static void conn_shutdown_done(uv_shutdown_t *req, int status)
{
    mgpu_store_server_conn_close(req->data);
}

/* A draining connection shuts down once everything queued has been written, so the peer reads
 * the error response before the end of the stream. */
static void conn_maybe_finish(conn_t *c)
{
    if (!c->draining || c->closing || c->shutdown || c->writing || c->out.len > 0)
        return;
    c->sreq.data = c;
    if (uv_shutdown(&c->sreq, (uv_stream_t *)&c->tcp, conn_shutdown_done) == 0)
        c->shutdown = 1;
    else
        mgpu_store_server_conn_close(c);
}

/* After a large value went out, its buffer is given back rather than kept per connection. */
static void buf_trim(mgpu_store_buf_t *b)
{
    if (b->len == 0 && b->cap > OUT_HIGH)
        mgpu_store_buf_free(b);
}

static void conn_write_done(uv_write_t *req, int status)
{
    conn_t *c = req->data;
    c->writing = 0;
    c->wbuf.len = 0;
    buf_trim(&c->wbuf);
    if (c->closing)
        return;
    if (status < 0) {
        mgpu_debug("store: write to %s: %s", c->peer, uv_strerror(status));
        mgpu_store_server_conn_close(c);
        return;
    }
    mgpu_store_server_conn_flush(c);
    /* Resume a connection paused by back-pressure: serve the frames it already sent, then
     * read again unless that paused it anew. */
    if (!c->reading && !c->draining && !(c->writing && c->out.len >= OUT_HIGH)) {
        conn_process(c);
        if (!c->closing && !c->draining && !c->reading && !(c->writing && c->out.len >= OUT_HIGH))
            conn_read_start(c);
    }
}

/* Hands queued responses to the socket: directly when it takes them all (the common case),
 * otherwise through one uv_write of the rest while new responses queue behind it. */
void mgpu_store_server_conn_flush(conn_t *c)
{
    uv_buf_t b;
    int n;
    mgpu_store_buf_t t;

    if (c->closing || c->writing || c->shutdown || c->out.len == 0) {
        conn_maybe_finish(c);
        return;
    }
    b = uv_buf_init((char *)c->out.p, (unsigned)c->out.len);
    n = uv_try_write((uv_stream_t *)&c->tcp, &b, 1);
    if (n == UV_EAGAIN || n == UV_ENOSYS)
        n = 0;
    if (n < 0) {
        mgpu_debug("store: write to %s: %s", c->peer, uv_strerror(n));
        mgpu_store_server_conn_close(c);
        return;
    }
    if ((size_t)n == c->out.len) {
        c->out.len = 0;
        buf_trim(&c->out);
        conn_maybe_finish(c);
        return;
    }
    t = c->wbuf;
    c->wbuf = c->out;
    c->out = t;
    c->out.len = 0;
    b = uv_buf_init((char *)c->wbuf.p + n, (unsigned)(c->wbuf.len - (size_t)n));
    c->wreq.data = c;
    n = uv_write(&c->wreq, (uv_stream_t *)&c->tcp, &b, 1, conn_write_done);
    if (n < 0) {
        mgpu_debug("store: write to %s: %s", c->peer, uv_strerror(n));
        mgpu_store_server_conn_close(c);
        return;
    }
    c->writing = 1;
}

/* Ends a response frame; a connection whose response cannot be built is closed. */
void mgpu_store_server_resp_end(conn_t *c, size_t start)
{
    if (mgpu_store_buf_frame_end(&c->out, start) < 0) {
        mgpu_error("store: out of memory answering %s, closing it", c->peer);
        mgpu_store_server_conn_close(c);
    }
}

/* A non-OK response: status + message. */
void mgpu_store_server_resp_status(conn_t *c, uint8_t op, uint32_t id, uint8_t status,
                                   const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    size_t start;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (n < 0)
        n = 0;
    if ((size_t)n >= sizeof msg)
        n = sizeof msg - 1;
    start = mgpu_store_buf_frame_begin(&c->out, op | MGPU_STORE_RESP, status, id);
    mgpu_store_buf_bytes(&c->out, msg, (size_t)n);
    mgpu_store_server_resp_end(c, start);
}

/* Answers with an error and closes once it is written; reading stops at once. */
void mgpu_store_server_conn_fail(conn_t *c, uint8_t op, uint32_t id, uint8_t status,
                                 const char *why)
{
    mgpu_warn("store: closing connection from %s: %s", c->peer, why);
    if (c->closing || c->draining)
        return;
    mgpu_store_server_resp_status(c, op ? op : MGPU_STORE_OP_HELLO, id, status, "%s", why);
    c->draining = 1;
    if (c->reading) {
        uv_read_stop((uv_stream_t *)&c->tcp);
        c->reading = 0;
    }
    while (c->waiters != NULL)
        mgpu_store_requests_waiter_free(c->waiters);
    mgpu_store_server_conn_flush(c);
}

static void conn_process(conn_t *c)
{
    mgpu_store_frame_t f;
    mgpu_err_t err;
    int rc;

    while (!c->closing && !c->draining) {
        if (c->out.len >= OUT_HIGH) {
            mgpu_store_server_conn_flush(c);
            if (c->closing)
                return;
            if (c->writing && c->out.len >= OUT_HIGH) {
                if (c->reading) {
                    uv_read_stop((uv_stream_t *)&c->tcp);
                    c->reading = 0;
                }
                return;
            }
        }
        rc = mgpu_store_dec_next(&c->dec, &f, &err);
        if (rc == 0)
            break;
        if (rc < 0) {
            mgpu_store_server_conn_fail(c, 0, 0, MGPU_STORE_ST_PROTOCOL, err.msg);
            return;
        }
        mgpu_store_requests_handle(c, &f);
    }
    mgpu_store_server_conn_flush(c);
}

static void conn_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    conn_t *c = h->data;
    uint8_t *p;
    size_t avail;
    if (mgpu_store_dec_reserve(&c->dec, 0, &p, &avail) < 0) {
        *buf = uv_buf_init(NULL, 0); /* read_cb gets UV_ENOBUFS */
        return;
    }
    *buf = uv_buf_init((char *)p, avail > UINT32_MAX ? UINT32_MAX : (unsigned)avail);
}

static void conn_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    conn_t *c = st->data;
    if (nread > 0) {
        mgpu_store_dec_commit(&c->dec, (size_t)nread);
        conn_process(c);
    } else if (nread == UV_EOF) {
        mgpu_debug("store: %s disconnected", c->peer);
        mgpu_store_server_conn_close(c);
    } else if (nread < 0) {
        mgpu_warn("store: closing connection from %s: read: %s", c->peer, uv_strerror((int)nread));
        mgpu_store_server_conn_close(c);
    }
}

static void conn_read_start(conn_t *c)
{
    int rc = uv_read_start((uv_stream_t *)&c->tcp, conn_alloc, conn_read);
    if (rc < 0) {
        mgpu_warn("store: closing connection from %s: uv_read_start: %s", c->peer, uv_strerror(rc));
        mgpu_store_server_conn_close(c);
        return;
    }
    c->reading = 1;
}

static void peer_name(uv_tcp_t *t, char *buf, size_t size)
{
    struct sockaddr_storage ss;
    int len = sizeof ss;
    char host[48] = "?";
    int port = 0;
    if (uv_tcp_getpeername(t, (struct sockaddr *)&ss, &len) == 0) {
        if (ss.ss_family == AF_INET6) {
            uv_ip6_name((struct sockaddr_in6 *)&ss, host, sizeof host);
            port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
        } else {
            uv_ip4_name((struct sockaddr_in *)&ss, host, sizeof host);
            port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        }
    }
    snprintf(buf, size, "%s:%d", host, port);
}

static void on_connection(uv_stream_t *l, int status)
{
    mgpu_store_server_t *s = l->data;
    conn_t *c;
    int rc;

    if (status < 0) {
        mgpu_warn("store: accept: %s", uv_strerror(status));
        return;
    }
    c = calloc(1, sizeof *c);
    if (c == NULL) {
        mgpu_error("store: out of memory accepting a connection");
        return;
    }
    c->srv = s;
    uv_tcp_init(s->loop, &c->tcp);
    s->handles++;
    c->tcp.data = c;
    {
        /* Until HELLO, only a frame the size of a HELLO is admitted: an unauthenticated peer
         * cannot make the server buffer a value-sized frame. */
        mgpu_store_limits_t pre = s->lim;
        pre.max_value = 0;
        mgpu_store_dec_init(&c->dec, &pre, 0);
    }
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    rc = uv_accept(l, (uv_stream_t *)&c->tcp);
    if (rc < 0) {
        mgpu_warn("store: accept: %s", uv_strerror(rc));
        mgpu_store_server_conn_close(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    /* A node that dies without closing its sockets: its connections (and the waits parked on
     * them) end once keepalive probes go unanswered instead of never. */
    uv_tcp_keepalive(&c->tcp, 1, 30);
    c->accepted_ms = uv_now(s->loop);
    peer_name(&c->tcp, c->peer, sizeof c->peer);
    if (s->nconns >= s->max_conns) {
        char why[96];
        snprintf(why, sizeof why, "too many connections (max_conns %d)", s->max_conns);
        mgpu_store_server_conn_fail(c, MGPU_STORE_OP_HELLO, 0, MGPU_STORE_ST_PROTOCOL, why);
        return;
    }
    c->counted = 1;
    s->nconns++;
    mgpu_debug("store: connection from %s", c->peer);
    conn_read_start(c);
}

/* Once a second: a peer that connected but has not said HELLO in time holds a connection slot
 * for nothing (or is probing the port); it is closed. */
static void sweep(uv_timer_t *t)
{
    mgpu_store_server_t *s = t->data;
    uint64_t now = uv_now(s->loop);
    for (conn_t *c = s->conns, *next; c != NULL; c = next) {
        next = c->next;
        if (!c->authed && !c->draining && !c->closing &&
            now - c->accepted_ms >= s->hello_timeout_ms) {
            char why[64];
            snprintf(why, sizeof why, "no HELLO within %llu ms",
                     (unsigned long long)s->hello_timeout_ms);
            mgpu_store_server_conn_fail(c, MGPU_STORE_OP_HELLO, 0, MGPU_STORE_ST_PROTOCOL, why);
        }
    }
}

/* ---- the public API ---- */

/* Each connection is a descriptor, and the usual soft limit (1024) is below the default
 * max_conns: without this, a rendezvous of a thousand workers fails at accept(2) with EMFILE.
 * Raises the soft limit as far as the hard one allows (children inherit it, which is harmless),
 * and says so when even that is short. */
static void raise_fd_limit(int max_conns)
{
    long want = (long)max_conns + 256; /* the launcher's own pipes, logs, workers */
    long got = mgpu_fdio_raise_limit(want);
    if (got >= 0 && got < want)
        mgpu_warn("store: max_conns is %d but this process may open only %ld descriptors "
                  "(ulimit -n): clients beyond that will be refused",
                  max_conns, got);
}

int mgpu_store_server_token_generate(char *buf, size_t size, mgpu_err_t *err)
{
    static const char hex[] = "0123456789abcdef";
    unsigned char raw[16];
    size_t got = 0;

    if (size < 2 * sizeof raw + 1)
        return mgpu_err_set(err, MGPU_E_RANGE, "token buffer of %zu bytes, need %zu", size,
                            2 * sizeof raw + 1);
    while (got < sizeof raw) {
        ssize_t n = getrandom(raw + got, sizeof raw - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return mgpu_err_set(err, -errno, "getrandom(%zu): %s", sizeof raw, strerror(errno));
        got += (size_t)n;
    }
    for (size_t i = 0; i < sizeof raw; i++) {
        buf[2 * i] = hex[raw[i] >> 4];
        buf[2 * i + 1] = hex[raw[i] & 15];
    }
    buf[2 * sizeof raw] = '\0';
    return 0;
}

int mgpu_store_server_start(uv_loop_t *loop, const mgpu_store_server_opts_t *o,
                            mgpu_store_server_t **out, mgpu_err_t *err)
{
    static const mgpu_store_server_opts_t def = {0};
    const char *host;
    char addr_str[80];
    struct addrinfo hints = {0}, *ai = NULL;
    struct sockaddr_storage bound;
    socklen_t blen = sizeof bound;
    mgpu_store_server_t *s = NULL;
    int fd = -1, rc, one = 1;
    char portbuf[16];

    *out = NULL;
    if (o == NULL)
        o = &def;
    host = o->bind_host && *o->bind_host ? o->bind_host : "127.0.0.1";
    if (o->port < 0 || o->port > 65535)
        return mgpu_err_set(err, MGPU_E_RANGE, "store port %d is not in 0..65535", o->port);
    snprintf(addr_str, sizeof addr_str, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, o->port);

    snprintf(portbuf, sizeof portbuf, "%d", o->port);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    rc = getaddrinfo(host, portbuf, &hints, &ai);
    if (rc != 0)
        return mgpu_err_set(err, MGPU_E_USAGE, "getaddrinfo(%s): %s", host, gai_strerror(rc));

    /* The socket is made here rather than by uv_tcp_bind, which defers EADDRINUSE to
     * uv_listen: errors then name the call that failed, before any handle needs closing. */
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        rc = mgpu_err_set(err, -errno, "socket(%s): %s", addr_str, strerror(errno));
        goto fail;
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one); /* restart over TIME_WAIT */
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
        rc = mgpu_err_set(err, -errno, "bind(%s): %s", addr_str, strerror(errno));
        goto fail;
    }
    if (listen(fd, LISTEN_BACKLOG) < 0) {
        rc = mgpu_err_set(err, -errno, "listen(%s): %s", addr_str, strerror(errno));
        goto fail;
    }
    if (getsockname(fd, (struct sockaddr *)&bound, &blen) < 0) {
        rc = mgpu_err_set(err, -errno, "getsockname(%s): %s", addr_str, strerror(errno));
        goto fail;
    }

    if (!mgpu_sock_addr_is_loopback(ai->ai_addr) && (o->token == NULL || *o->token == '\0'))
        mgpu_warn("store: listening on %s with no token: anyone who can reach it can read and "
                  "change the job's keys",
                  addr_str);

    s = calloc(1, sizeof *s);
    if (s == NULL || (s->buckets = calloc(64, sizeof *s->buckets)) == NULL) {
        rc = mgpu_err_set(err, -ENOMEM, "store server: out of memory");
        goto fail;
    }
    s->nbuckets = 64;
    s->loop = loop;
    s->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                : ((struct sockaddr_in *)&bound)->sin_port);
    s->max_conns = o->max_conns > 0 ? o->max_conns : DEFAULT_MAX_CONNS;
    s->hello_timeout_ms = o->hello_timeout_ms > 0 ? (uint64_t)o->hello_timeout_ms : 10000;
    raise_fd_limit(s->max_conns);
    s->lim = mgpu_store_limits_default();
    if (o->max_key)
        s->lim.max_key = o->max_key;
    if (o->max_value)
        s->lim.max_value = o->max_value;
    if (o->token && *o->token) {
        s->token_len = strlen(o->token);
        if ((s->token = malloc(s->token_len)) == NULL) {
            rc = mgpu_err_set(err, -ENOMEM, "store server: out of memory");
            goto fail;
        }
        memcpy(s->token, o->token, s->token_len);
    }

    uv_tcp_init(loop, &s->listener);
    s->handles = 1;
    s->listener.data = s;
    rc = uv_tcp_open(&s->listener, fd);
    if (rc == 0) {
        fd = -1; /* the handle owns it now */
        rc = uv_listen((uv_stream_t *)&s->listener, LISTEN_BACKLOG, on_connection);
    }
    if (rc == 0) {
        uint64_t every = s->hello_timeout_ms < 1000 ? s->hello_timeout_ms : 1000;
        uv_timer_init(loop, &s->sweep);
        s->handles++;
        s->sweep.data = s;
        uv_timer_start(&s->sweep, sweep, every, every);
    }
    if (rc < 0) {
        mgpu_err_set(err, rc, "uv_listen(%s): %s", addr_str, uv_strerror(rc));
        if (fd >= 0)
            close(fd);
        freeaddrinfo(ai);
        /* The handle exists: it is freed with the server by its close callback. */
        s->closing = 1;
        uv_close((uv_handle_t *)&s->listener, listener_closed);
        return rc;
    }
    freeaddrinfo(ai);
    mgpu_debug("store: listening on %s port %d", host, s->port);
    *out = s;
    return 0;

fail:
    if (fd >= 0)
        close(fd);
    freeaddrinfo(ai);
    if (s != NULL) {
        free(s->buckets);
        free(s->token);
        free(s);
    }
    return rc;
}

int mgpu_store_server_port(const mgpu_store_server_t *s)
{
    return s->port;
}

int mgpu_store_server_num_conns(const mgpu_store_server_t *s)
{
    return s->nconns;
}

void mgpu_store_server_close(mgpu_store_server_t *s)
{
    if (s == NULL || s->closing)
        return;
    s->closing = 1;
    while (s->conns != NULL)
        mgpu_store_server_conn_close(s->conns);
    uv_close((uv_handle_t *)&s->sweep, sweep_closed);
    uv_close((uv_handle_t *)&s->listener, listener_closed);
}
