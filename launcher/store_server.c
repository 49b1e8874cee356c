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
#include "sock.h"           /* mgpu_sock_addr_is_loopback, mgpu_sock_hostport */
#include "store_requests.h" /* the table and the handlers */

#define DEFAULT_MAX_CONNS 4096
/* Connections accepted but not authenticated yet (see the pending list in store_requests.h):
 * a real client leaves the list within a round trip or two, so this bounds a flood's cost
 * (about 1 KiB each) rather than a rendezvous's speed. */
#define DEFAULT_MAX_PENDING 1024
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
    free(c->on_idle);
    mgpu_store_dec_free(&c->dec);
    mgpu_store_buf_free(&c->out);
    mgpu_store_buf_free(&c->wbuf);
    free(c);
    mgpu_store_server_handle_closed(s);
}

/* Takes c out of its list (pending or authenticated) and its count. */
static void conn_unlink(conn_t *c)
{
    mgpu_store_server_t *s = c->srv;
    if (c->prev)
        c->prev->next = c->next;
    else if (c->authed)
        s->conns = c->next;
    else
        s->pending = c->next;
    if (c->next)
        c->next->prev = c->prev;
    else if (!c->authed)
        s->pending_tail = c->prev;
    c->prev = c->next = NULL;
    if (c->counted)
        s->nconns--;
    else
        s->npending--;
}

void mgpu_store_server_conn_authed(conn_t *c)
{
    mgpu_store_server_t *s = c->srv;
    conn_unlink(c);
    c->authed = 1;
    c->counted = 1;
    s->nconns++;
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    /* Before AUTH a peer may only send a small frame, read in small pieces; now the full
     * limits apply. */
    mgpu_store_dec_set_limits(&c->dec, &s->lim);
    mgpu_store_dec_set_chunk(&c->dec, 0);
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
    conn_unlink(c);
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

/* ---- log lines about closed connections ---- */

static void loglimit_init(loglimit_t *l, double burst, const char *what, uint64_t now)
{
    l->tokens = l->burst = burst;
    l->last_ms = now;
    l->suppressed = 0;
    l->what = what;
}

/* 1 when a line may be written now (refilling the budget first). */
static int loglimit_take(loglimit_t *l, uint64_t now)
{
    l->tokens += (double)(now - l->last_ms) / 1000.0;
    if (l->tokens > l->burst)
        l->tokens = l->burst;
    l->last_ms = now;
    if (l->tokens < 1.0)
        return 0;
    l->tokens -= 1.0;
    return 1;
}

/* One line about closing c, unless the budget is spent: then only counted. A flood of
 * connections would otherwise write a line each (thousands a second) and bury the log. */
static void log_closed(conn_t *c, loglimit_t *l, const char *why)
{
    uint64_t now = uv_now(c->srv->loop);
    if (!loglimit_take(l, now)) {
        l->suppressed++;
        return;
    }
    if (l->suppressed > 0)
        mgpu_warn("store: closing connection from %s: %s (and %lu more %s connections closed "
                  "without a line)",
                  c->peer, why, l->suppressed, l->what);
    else
        mgpu_warn("store: closing connection from %s: %s", c->peer, why);
    l->suppressed = 0;
}

/* The count of lines not written, once the budget allows (the flood may have stopped). */
static void log_flush(mgpu_store_server_t *s, loglimit_t *l)
{
    if (l->suppressed > 0 && loglimit_take(l, uv_now(s->loop))) {
        mgpu_warn("store: closed %lu more %s connections without a line", l->suppressed, l->what);
        l->suppressed = 0;
    }
}

void mgpu_store_server_conn_refuse(conn_t *c, uint32_t id, uint8_t status, const char *why)
{
    uint8_t frame[MGPU_STORE_HDR_SIZE + 4 + 128];
    size_t n = strlen(why);
    uv_buf_t b;

    if (c->closing)
        return;
    log_closed(c, &c->srv->log_refused, why);
    if (n > sizeof frame - MGPU_STORE_HDR_SIZE - 4)
        n = sizeof frame - MGPU_STORE_HDR_SIZE - 4;
    /* Built by hand into a small stack buffer: a refused connection gets no buffers. */
    frame[0] = MGPU_STORE_MAGIC0;
    frame[1] = MGPU_STORE_MAGIC1;
    frame[2] = (c->hello ? MGPU_STORE_OP_AUTH : MGPU_STORE_OP_HELLO) | MGPU_STORE_RESP;
    frame[3] = status;
    for (int i = 0; i < 4; i++) {
        frame[4 + i] = (uint8_t)(id >> (8 * i));
        frame[8 + i] = (uint8_t)((n + 4) >> (8 * i));
        frame[12 + i] = (uint8_t)(n >> (8 * i));
    }
    memcpy(frame + 16, why, n);
    b = uv_buf_init((char *)frame, (unsigned)(16 + n));
    if (!c->writing && c->out.len == 0)
        (void)uv_try_write((uv_stream_t *)&c->tcp, &b, 1); /* best effort: the peer may not read */
    mgpu_store_server_conn_close(c);
}

/* Answers with an error and closes once it is written; reading stops at once. */
void mgpu_store_server_conn_fail(conn_t *c, uint8_t op, uint32_t id, uint8_t status,
                                 const char *why)
{
    if (c->authed)
        mgpu_warn("store: closing connection from %s: %s", c->peer, why);
    else
        log_closed(c, &c->srv->log_bad, why);
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
        c->rx_ms = uv_now(c->srv->loop);
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
    mgpu_sock_hostport(buf, size, host, port);
}

static void on_connection(uv_stream_t *l, int status)
{
    mgpu_store_server_t *s = l->data;
    conn_t *c;
    int rc;

    if (status < 0) {
        /* EMFILE under a flood: libuv drops the connection; one line a second says so. */
        if (loglimit_take(&s->log_refused, uv_now(s->loop))) {
            mgpu_warn("store: accept: %s", uv_strerror(status));
        } else {
            s->log_refused.suppressed++;
        }
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
    /* Until AUTH, only a frame the size of a HELLO is admitted, read in pieces that small: an
     * unauthenticated peer cannot make the server buffer a value-sized frame, nor even the
     * usual read chunk. */
    mgpu_store_dec_init(&c->dec, &s->lim, 0);
    c->dec.max_payload = MGPU_STORE_PREAUTH_MAX;
    mgpu_store_dec_set_chunk(&c->dec, MGPU_STORE_HDR_SIZE + MGPU_STORE_PREAUTH_MAX);
    /* Appended to the pending list (oldest first); when its budget is spent, the oldest is
     * closed: a flood of connections that never authenticate then churns among itself, and a
     * real client, which authenticates within a round trip or two, keeps its place. */
    if (s->npending >= s->max_pending && s->pending != NULL) {
        char why[96];
        snprintf(why, sizeof why, "too many connections not authenticated yet (max_pending %d)",
                 s->max_pending);
        mgpu_store_server_conn_refuse(s->pending, 0, MGPU_STORE_ST_BUSY, why);
    }
    c->prev = s->pending_tail;
    if (s->pending_tail)
        s->pending_tail->next = c;
    else
        s->pending = c;
    s->pending_tail = c;
    s->npending++;
    rc = uv_accept(l, (uv_stream_t *)&c->tcp);
    if (rc < 0) {
        snprintf(c->peer, sizeof c->peer, "?"); /* not known before accept */
        log_closed(c, &s->log_refused, uv_strerror(rc));
        mgpu_store_server_conn_close(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    /* A node that dies without closing its sockets: its connections (and the waits parked on
     * them) end once keepalive probes go unanswered instead of never. */
    uv_tcp_keepalive(&c->tcp, 1, 30);
    c->accepted_ms = uv_now(s->loop);
    peer_name(&c->tcp, c->peer, sizeof c->peer);
    mgpu_debug("store: connection from %s", c->peer);
    conn_read_start(c);
}

/* Every few hundred ms: connections that did not authenticate in time hold a place for
 * nothing (or are probing the port); they are closed, oldest first (the pending list is in
 * accept order, so only its head needs looking at). */
static void sweep(uv_timer_t *t)
{
    mgpu_store_server_t *s = t->data;
    uint64_t now = uv_now(s->loop);
    conn_t *c;
    while ((c = s->pending) != NULL && now - c->accepted_ms >= s->hello_timeout_ms) {
        char why[64];
        if (c->draining) {
            mgpu_store_server_conn_close(c); /* its error was sent; the peer does not read */
            continue;
        }
        snprintf(why, sizeof why, "no %s within %llu ms", c->hello ? "AUTH" : "HELLO",
                 (unsigned long long)s->hello_timeout_ms);
        mgpu_store_server_conn_refuse(c, 0, MGPU_STORE_ST_PROTOCOL, why);
    }
    /* ON_IDLE: a peer silent past its lease (cut off, stopped) is given up as if it closed. */
    for (conn_t *n = NULL, *l = s->conns; l != NULL; l = n) {
        n = l->next;
        if (l->idle_ms == 0 || l->closing || now - l->rx_ms < l->idle_ms)
            continue;
        mgpu_info("store: no request from %s for %llu ms (its lease): closing it", l->peer,
                  (unsigned long long)(now - l->rx_ms));
        mgpu_store_requests_on_idle(l);
        mgpu_store_server_conn_close(l);
    }
    log_flush(s, &s->log_refused);
    log_flush(s, &s->log_bad);
}

/* ---- the public API ---- */

/* Each connection is a descriptor, and the usual soft limit (1024) is below the default
 * max_conns: without this, a rendezvous of a thousand workers fails at accept(2) with EMFILE.
 * Raises the soft limit as far as the hard one allows (children inherit it, which is harmless),
 * and says so when even that is short. */
static void raise_fd_limit(int max_conns, int max_pending)
{
    /* + the launcher's own pipes, logs, workers */
    long want = (long)max_conns + max_pending + 256;
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
    mgpu_sock_hostport(addr_str, sizeof addr_str, host, o->port);

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
    s->max_pending = o->max_pending > 0 ? o->max_pending : DEFAULT_MAX_PENDING;
    s->hello_timeout_ms = o->hello_timeout_ms > 0 ? (uint64_t)o->hello_timeout_ms : 2000;
    loglimit_init(&s->log_refused, 1.0, "refused", uv_now(loop));
    loglimit_init(&s->log_bad, 32.0, "unauthenticated", uv_now(loop));
    raise_fd_limit(s->max_conns, s->max_pending);
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
        uint64_t every = s->hello_timeout_ms / 4 < 250 ? s->hello_timeout_ms / 4 : 250;
        every = every > 0 ? every : 1;
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
    while (s->pending != NULL)
        mgpu_store_server_conn_close(s->pending);
    uv_close((uv_handle_t *)&s->sweep, sweep_closed);
    uv_close((uv_handle_t *)&s->listener, listener_closed);
}
