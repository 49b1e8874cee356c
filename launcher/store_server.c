/* store_server.c - the store's libuv server: a hash table of keys, connections that decode
 * frames, and waiters that GET and WAIT park on missing keys.
 *
 * Everything runs on the caller's loop thread. Nothing here blocks: a client that does not read
 * its responses only stops its own connection from being read (back-pressure), and waits are
 * callbacks, so one slow or silent client never delays another. */
#include "store_server.h"

#include <errno.h>        /* ENOMEM */
#include <netdb.h>        /* getaddrinfo */
#include <netinet/in.h>   /* sockaddr_in */
#include <stdarg.h>       /* va_list */
#include <stdio.h>        /* snprintf */
#include <stdlib.h>       /* malloc, free */
#include <string.h>       /* memcmp, memcpy */
#include <sys/random.h>   /* getrandom */
#include <sys/resource.h> /* getrlimit, setrlimit */
#include <sys/socket.h>   /* socket, bind, listen */
#include <unistd.h>       /* close */

#include "log.h"         /* mgpu_warn, mgpu_debug */
#include "store_proto.h" /* frames, decoder */

#define DEFAULT_MAX_CONNS 4096
/* Stop decoding a connection's requests while this many response bytes wait for its socket:
 * a client that sends without reading cannot make the server buffer without bound. */
#define OUT_HIGH (1u << 20)
/* listen(2) backlog: a rendezvous of thousands of workers connects at once; the kernel caps
 * this at net.core.somaxconn. */
#define LISTEN_BACKLOG 4096

typedef struct entry entry_t;
typedef struct waiter waiter_t;
typedef struct conn conn_t;

/* One key a waiter still waits for, linked into that key's entry. */
typedef struct wnode {
    struct wnode *prev, *next;
    waiter_t *w;
    entry_t *e; /* NULL once the key was set (the node is unlinked) */
} wnode_t;

/* A key. An entry exists while the key has a value or someone waits for it. */
struct entry {
    entry_t *next; /* hash chain */
    uint32_t hash;
    uint32_t klen;
    uint8_t *val;
    size_t vlen;
    int has_value;
    wnode_t *waiters;
    uint8_t key[];
};

/* A GET or WAIT parked until its missing keys are set or its timer fires. */
struct waiter {
    waiter_t *prev, *next; /* in the connection's list */
    conn_t *c;
    mgpu_store_server_t *srv;
    uint32_t id;
    uint8_t op;
    uint32_t timeout_ms;
    uint32_t missing; /* keys not set yet */
    uint32_t nkeys;   /* keys asked for (for the timeout message) */
    int has_timer;
    uv_timer_t timer;
    uint32_t nnodes;
    wnode_t nodes[];
};

struct conn {
    uv_tcp_t tcp; /* first: the handle's address is the connection's */
    mgpu_store_server_t *srv;
    conn_t *prev, *next;
    mgpu_store_dec_t dec;
    mgpu_store_buf_t out;  /* responses not yet handed to the socket */
    mgpu_store_buf_t wbuf; /* the bytes of the uv_write in flight */
    uv_write_t wreq;
    uv_shutdown_t sreq;
    int writing;          /* wreq in flight */
    int reading;          /* uv_read_start in effect */
    int authed;           /* HELLO accepted */
    int draining;         /* answer what is queued, then shut down and close */
    int shutdown;         /* sreq in flight */
    int closing;          /* uv_close called */
    int counted;          /* counts towards max_conns (refused connections do not) */
    uint64_t accepted_ms; /* uv_now at accept: a peer has hello_timeout_ms to say HELLO */
    waiter_t *waiters;
    uint8_t *on_close; /* ON_CLOSE's encoded key/value list, set when this one closes */
    uint32_t on_close_len, on_close_n;
    char peer[64];
};

struct mgpu_store_server {
    uv_loop_t *loop;
    uv_tcp_t listener;
    uv_timer_t sweep; /* closes connections that did not say HELLO in time */
    uint64_t hello_timeout_ms;
    int port;
    uint8_t *token;
    size_t token_len;
    int max_conns;
    mgpu_store_limits_t lim;
    conn_t *conns;
    int nconns;
    int handles; /* handles whose close callback has not run yet */
    int closing;
    entry_t **buckets;
    size_t nbuckets; /* a power of two */
    size_t nentries;
    int64_t nkeys; /* entries with a value */
};

/* ---- the table ---- */

/* FNV-1a. Not keyed: a client could choose colliding keys and lengthen one chain, but only
 * clients that passed HELLO (with the token where the store is reachable from other hosts)
 * send keys, and they are the job's own processes. */
static uint32_t hash_key(const uint8_t *k, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ k[i]) * 16777619u;
    return h;
}

static entry_t *table_find(mgpu_store_server_t *s, const uint8_t *k, size_t n)
{
    uint32_t h = hash_key(k, n);
    for (entry_t *e = s->buckets[h & (s->nbuckets - 1)]; e != NULL; e = e->next)
        if (e->hash == h && e->klen == n && memcmp(e->key, k, n) == 0)
            return e;
    return NULL;
}

static void table_grow(mgpu_store_server_t *s)
{
    size_t nb = s->nbuckets * 2;
    entry_t **b = calloc(nb, sizeof *b);
    if (b == NULL)
        return; /* longer chains, still correct */
    for (size_t i = 0; i < s->nbuckets; i++) {
        entry_t *e = s->buckets[i], *next;
        for (; e != NULL; e = next) {
            next = e->next;
            e->next = b[e->hash & (nb - 1)];
            b[e->hash & (nb - 1)] = e;
        }
    }
    free(s->buckets);
    s->buckets = b;
    s->nbuckets = nb;
}

/* The entry of key k, created empty when missing; NULL when out of memory. */
static entry_t *table_get(mgpu_store_server_t *s, const uint8_t *k, size_t n)
{
    entry_t *e = table_find(s, k, n);
    if (e != NULL)
        return e;
    e = calloc(1, sizeof *e + n);
    if (e == NULL)
        return NULL;
    e->hash = hash_key(k, n);
    e->klen = (uint32_t)n;
    memcpy(e->key, k, n);
    if (s->nentries >= s->nbuckets)
        table_grow(s);
    e->next = s->buckets[e->hash & (s->nbuckets - 1)];
    s->buckets[e->hash & (s->nbuckets - 1)] = e;
    s->nentries++;
    return e;
}

/* Drops an entry that neither holds a value nor has waiters. */
static void table_gc(mgpu_store_server_t *s, entry_t *e)
{
    entry_t **pp;
    if (e->has_value || e->waiters != NULL)
        return;
    for (pp = &s->buckets[e->hash & (s->nbuckets - 1)]; *pp != e; pp = &(*pp)->next)
        ;
    *pp = e->next;
    s->nentries--;
    free(e->val);
    free(e);
}

static void table_free(mgpu_store_server_t *s)
{
    for (size_t i = 0; i < s->nbuckets; i++) {
        entry_t *e = s->buckets[i], *next;
        for (; e != NULL; e = next) {
            next = e->next;
            free(e->val);
            free(e);
        }
    }
    free(s->buckets);
    s->buckets = NULL;
}

/* ---- lifetime ---- */

static void srv_handle_closed(mgpu_store_server_t *s)
{
    s->handles--;
    if (s->closing && s->handles == 0) {
        table_free(s);
        free(s->token);
        free(s);
    }
}

static void listener_closed(uv_handle_t *h)
{
    srv_handle_closed(h->data);
}

static void sweep_closed(uv_handle_t *h)
{
    srv_handle_closed(h->data);
}

static void waiter_timer_closed(uv_handle_t *h)
{
    waiter_t *w = h->data;
    mgpu_store_server_t *s = w->srv;
    free(w);
    srv_handle_closed(s);
}

/* Unlinks the waiter from its keys and its connection and frees it (after its timer closed). */
static void waiter_free(waiter_t *w)
{
    mgpu_store_server_t *s = w->srv;
    for (uint32_t i = 0; i < w->nnodes; i++) {
        wnode_t *nd = &w->nodes[i];
        entry_t *e = nd->e;
        if (e == NULL)
            continue;
        if (nd->prev)
            nd->prev->next = nd->next;
        else
            e->waiters = nd->next;
        if (nd->next)
            nd->next->prev = nd->prev;
        nd->e = NULL;
        table_gc(s, e);
    }
    if (w->c != NULL) {
        if (w->prev)
            w->prev->next = w->next;
        else
            w->c->waiters = w->next;
        if (w->next)
            w->next->prev = w->prev;
        w->c = NULL;
    }
    if (w->has_timer) {
        uv_timer_stop(&w->timer);
        uv_close((uv_handle_t *)&w->timer, waiter_timer_closed);
    } else {
        free(w);
    }
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
    srv_handle_closed(s);
}

static int entry_set(mgpu_store_server_t *s, entry_t *e, const void *v, size_t n);
static entry_t *table_get(mgpu_store_server_t *s, const uint8_t *k, size_t n);
static entry_t *table_find(mgpu_store_server_t *s, const uint8_t *k, size_t n);

/* The keys a closing connection registered with ON_CLOSE, set where they have no value. */
static void fire_on_close(conn_t *c)
{
    mgpu_store_server_t *s = c->srv;
    const uint8_t *p = c->on_close, *end = p + c->on_close_len;

    for (uint32_t i = 0; i + 1 < c->on_close_n && p + 8 <= end; i += 2) {
        uint32_t kl, vl;
        const uint8_t *k, *v;
        entry_t *e;
        kl = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
        k = p + 4;
        v = k + kl + 4;
        vl = (uint32_t)v[-4] | (uint32_t)v[-3] << 8 | (uint32_t)v[-2] << 16 | (uint32_t)v[-1] << 24;
        p = v + vl;
        e = table_find(s, k, kl);
        if (e != NULL && e->has_value)
            continue;
        if ((e = table_get(s, k, kl)) != NULL)
            entry_set(s, e, v, vl);
    }
}

/* Closes at once: queued responses are dropped and parked waits end unanswered. */
static void conn_close(conn_t *c)
{
    mgpu_store_server_t *s = c->srv;
    if (c->closing)
        return;
    c->closing = 1;
    if (c->on_close != NULL && !s->closing)
        fire_on_close(c);
    while (c->waiters != NULL)
        waiter_free(c->waiters);
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

static void conn_flush(conn_t *c);
static void conn_process(conn_t *c);
static void conn_read_start(conn_t *c);

static void conn_shutdown_done(uv_shutdown_t *req, int status)
{
    conn_close(req->data);
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
        conn_close(c);
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
        conn_close(c);
        return;
    }
    conn_flush(c);
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
static void conn_flush(conn_t *c)
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
        conn_close(c);
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
        conn_close(c);
        return;
    }
    c->writing = 1;
}

/* Ends a response frame; a connection whose response cannot be built is closed. */
static void resp_end(conn_t *c, size_t start)
{
    if (mgpu_store_buf_frame_end(&c->out, start) < 0) {
        mgpu_error("store: out of memory answering %s, closing it", c->peer);
        conn_close(c);
    }
}

/* A non-OK response: status + message. */
static void resp_status(conn_t *c, uint8_t op, uint32_t id, uint8_t status, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void resp_status(conn_t *c, uint8_t op, uint32_t id, uint8_t status, const char *fmt, ...)
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
    resp_end(c, start);
}

/* Answers with an error and closes once it is written; reading stops at once. */
static void conn_fail(conn_t *c, uint8_t op, uint32_t id, uint8_t status, const char *why)
{
    mgpu_warn("store: closing connection from %s: %s", c->peer, why);
    if (c->closing || c->draining)
        return;
    resp_status(c, op ? op : MGPU_STORE_OP_HELLO, id, status, "%s", why);
    c->draining = 1;
    if (c->reading) {
        uv_read_stop((uv_stream_t *)&c->tcp);
        c->reading = 0;
    }
    while (c->waiters != NULL)
        waiter_free(c->waiters);
    conn_flush(c);
}

/* A key for a message: printable, shortened. */
static const char *key_str(const uint8_t *k, size_t n, char *buf, size_t size)
{
    size_t i, m = n < size - 4 ? n : size - 4;
    for (i = 0; i < m; i++)
        buf[i] = k[i] >= 0x20 && k[i] < 0x7f ? (char)k[i] : '?';
    if (m < n) {
        memcpy(buf + i, "...", 3);
        i += 3;
    }
    buf[i] = '\0';
    return buf;
}

/* ---- waits ---- */

static void waiter_complete(waiter_t *w, entry_t *last)
{
    conn_t *c = w->c;
    size_t start =
        mgpu_store_buf_frame_begin(&c->out, w->op | MGPU_STORE_RESP, MGPU_STORE_ST_OK, w->id);
    if (w->op == MGPU_STORE_OP_GET)
        mgpu_store_buf_bytes(&c->out, last->val, last->vlen);
    waiter_free(w);
    resp_end(c, start);
    conn_flush(c);
}

static void waiter_timed_out(uv_timer_t *t)
{
    waiter_t *w = t->data;
    conn_t *c = w->c;
    char kb[128] = "?";

    for (uint32_t i = 0; i < w->nnodes; i++)
        if (w->nodes[i].e != NULL) {
            key_str(w->nodes[i].e->key, w->nodes[i].e->klen, kb, sizeof kb);
            break;
        }
    if (w->op == MGPU_STORE_OP_GET)
        resp_status(c, w->op, w->id, MGPU_STORE_ST_TIMEOUT, "key \"%s\" not set after %u ms", kb,
                    w->timeout_ms);
    else
        resp_status(c, w->op, w->id, MGPU_STORE_ST_TIMEOUT,
                    "%u of %u keys not set after %u ms (first missing: \"%s\")", w->missing,
                    w->nkeys, w->timeout_ms, kb);
    waiter_free(w);
    conn_flush(c);
}

/* Sets a value and completes the waits it was the last missing key of. */
static int entry_set(mgpu_store_server_t *s, entry_t *e, const void *v, size_t n)
{
    uint8_t *copy = malloc(n ? n : 1);
    wnode_t *nd;
    if (copy == NULL)
        return -ENOMEM;
    if (n > 0)
        memcpy(copy, v, n);
    free(e->val);
    e->val = copy;
    e->vlen = n;
    if (!e->has_value) {
        e->has_value = 1;
        s->nkeys++;
    }
    while ((nd = e->waiters) != NULL) {
        waiter_t *w = nd->w;
        e->waiters = nd->next;
        if (e->waiters)
            e->waiters->prev = NULL;
        nd->e = NULL;
        if (--w->missing == 0)
            waiter_complete(w, e);
    }
    return 0;
}

/* GET (one key) or WAIT (m's key list) on keys of which `missing` are not set. */
static void park(conn_t *c, const mgpu_store_msg_t *m, uint32_t missing)
{
    mgpu_store_server_t *s = c->srv;
    waiter_t *w = calloc(1, sizeof *w + missing * sizeof(wnode_t));
    mgpu_store_slice_t k = m->key;
    uint32_t pos = 0, j = 0;
    int single = m->op == MGPU_STORE_OP_GET;

    if (w == NULL)
        goto nomem;
    w->srv = s;
    w->c = c;
    w->id = m->id;
    w->op = m->op;
    w->timeout_ms = m->u32;
    w->missing = missing;
    w->nkeys = single ? 1 : m->nkeys;
    w->next = c->waiters;
    if (c->waiters)
        c->waiters->prev = w;
    c->waiters = w;
    while (single ? j == 0 : mgpu_store_keys_next(m, &pos, &k)) {
        entry_t *e = table_find(s, k.p, k.len);
        wnode_t *nd;
        if (e != NULL && e->has_value) {
            if (single)
                break;
            continue;
        }
        if (e == NULL && (e = table_get(s, k.p, k.len)) == NULL)
            goto nomem;
        nd = &w->nodes[j++];
        w->nnodes = j;
        nd->w = w;
        nd->e = e;
        nd->next = e->waiters;
        if (e->waiters)
            e->waiters->prev = nd;
        e->waiters = nd;
    }
    if (m->u32 != MGPU_STORE_WAIT_FOREVER) {
        uv_timer_init(s->loop, &w->timer);
        s->handles++;
        w->has_timer = 1;
        w->timer.data = w;
        uv_timer_start(&w->timer, waiter_timed_out, m->u32, 0);
    }
    return;
nomem:
    mgpu_error("store: out of memory parking %s of %s", mgpu_store_op_name(m->op), c->peer);
    if (w != NULL)
        waiter_free(w);
    conn_close(c);
}

/* ---- requests ---- */

/* Compares in time that depends on the presented token's length only, not on where it
 * differs from the secret. */
static int token_ok(const mgpu_store_server_t *s, const mgpu_store_slice_t *t)
{
    unsigned diff = t->len != s->token_len;
    if (s->token_len == 0)
        return 1;
    for (uint32_t i = 0; i < t->len; i++)
        diff |= t->p[i] ^ s->token[i % s->token_len];
    return diff == 0;
}

/* The decimal int64 of an ADD counter: -?[0-9]+ with no overflow. */
static int parse_i64(const uint8_t *p, size_t n, int64_t *v)
{
    int neg = n > 0 && p[0] == '-';
    size_t i = (size_t)neg;
    int64_t x = 0;
    if (i == n)
        return -1;
    for (; i < n; i++) {
        if (p[i] < '0' || p[i] > '9')
            return -1;
        if (__builtin_mul_overflow(x, 10, &x) || (neg ? __builtin_sub_overflow(x, p[i] - '0', &x)
                                                      : __builtin_add_overflow(x, p[i] - '0', &x)))
            return -1;
    }
    *v = x;
    return 0;
}

static void handle_hello(conn_t *c, const mgpu_store_msg_t *m)
{
    size_t start;
    char why[128];
    if (c->authed) {
        conn_fail(c, m->op, m->id, MGPU_STORE_ST_PROTOCOL, "HELLO sent twice");
        return;
    }
    if (m->u8 != MGPU_STORE_PROTO_VERSION) {
        snprintf(why, sizeof why, "protocol version %u not supported (this server speaks %d)",
                 m->u8, MGPU_STORE_PROTO_VERSION);
        conn_fail(c, m->op, m->id, MGPU_STORE_ST_VERSION, why);
        return;
    }
    if (!token_ok(c->srv, &m->key)) {
        conn_fail(c, m->op, m->id, MGPU_STORE_ST_AUTH, "wrong store token");
        return;
    }
    c->authed = 1;
    /* Before HELLO a peer may only send a small frame; now the full limits apply. */
    mgpu_store_dec_set_limits(&c->dec, &c->srv->lim);
    start = mgpu_store_buf_frame_begin(&c->out, m->op | MGPU_STORE_RESP, MGPU_STORE_ST_OK, m->id);
    mgpu_store_buf_u8(&c->out, MGPU_STORE_PROTO_VERSION);
    resp_end(c, start);
}

static void handle(conn_t *c, const mgpu_store_frame_t *f)
{
    mgpu_store_server_t *s = c->srv;
    mgpu_store_msg_t m;
    mgpu_err_t err;
    entry_t *e;
    size_t start;

    if (mgpu_store_msg_parse(f, &s->lim, &m, &err) < 0) {
        conn_fail(c, f->op, f->id, MGPU_STORE_ST_PROTOCOL, err.msg);
        return;
    }
    if (!c->authed && m.op != MGPU_STORE_OP_HELLO) {
        snprintf(err.msg, sizeof err.msg, "first request is %s, expected HELLO",
                 mgpu_store_op_name(m.op));
        conn_fail(c, m.op, m.id, MGPU_STORE_ST_PROTOCOL, err.msg);
        return;
    }
    switch (m.op) {
    case MGPU_STORE_OP_HELLO:
        handle_hello(c, &m);
        return;
    case MGPU_STORE_OP_SET:
        if ((e = table_get(s, m.key.p, m.key.len)) == NULL || entry_set(s, e, m.val.p, m.val.len))
            goto nomem;
        start = mgpu_store_buf_frame_begin(&c->out, m.op | MGPU_STORE_RESP, 0, m.id);
        break;
    case MGPU_STORE_OP_GET:
        e = table_find(s, m.key.p, m.key.len);
        if (e == NULL || !e->has_value) {
            char kb[128];
            if (m.u32 != 0) {
                park(c, &m, 1);
                return;
            }
            resp_status(c, m.op, m.id, MGPU_STORE_ST_TIMEOUT, "key \"%s\" not set",
                        key_str(m.key.p, m.key.len, kb, sizeof kb));
            return;
        }
        start = mgpu_store_buf_frame_begin(&c->out, m.op | MGPU_STORE_RESP, 0, m.id);
        mgpu_store_buf_bytes(&c->out, e->val, e->vlen);
        break;
    case MGPU_STORE_OP_ADD: {
        int64_t v = 0;
        char num[24];
        int n;
        e = table_find(s, m.key.p, m.key.len);
        if (e != NULL && e->has_value && parse_i64(e->val, e->vlen, &v) < 0) {
            char kb[128];
            resp_status(c, m.op, m.id, MGPU_STORE_ST_BAD_VALUE,
                        "ADD on key \"%s\" whose value is not a decimal int64",
                        key_str(m.key.p, m.key.len, kb, sizeof kb));
            return;
        }
        if (__builtin_add_overflow(v, m.i64, &v)) {
            resp_status(c, m.op, m.id, MGPU_STORE_ST_BAD_VALUE, "ADD overflows int64");
            return;
        }
        n = snprintf(num, sizeof num, "%lld", (long long)v);
        if ((e == NULL && (e = table_get(s, m.key.p, m.key.len)) == NULL) ||
            entry_set(s, e, num, (size_t)n) < 0)
            goto nomem;
        start = mgpu_store_buf_frame_begin(&c->out, m.op | MGPU_STORE_RESP, 0, m.id);
        mgpu_store_buf_i64(&c->out, v);
        break;
    }
    case MGPU_STORE_OP_COMPARE_SET: {
        int exists;
        e = table_find(s, m.key.p, m.key.len);
        exists = e != NULL && e->has_value;
        if (exists ? e->vlen == m.val.len && memcmp(e->val, m.val.p, m.val.len) == 0
                   : m.val.len == 0) {
            if ((e == NULL && (e = table_get(s, m.key.p, m.key.len)) == NULL) ||
                entry_set(s, e, m.val2.p, m.val2.len) < 0)
                goto nomem;
            exists = 1;
        }
        start = mgpu_store_buf_frame_begin(&c->out, m.op | MGPU_STORE_RESP, 0, m.id);
        mgpu_store_buf_u8(&c->out, (uint8_t)exists);
        mgpu_store_buf_bytes(&c->out, exists ? e->val : NULL, exists ? e->vlen : 0);
        break;
    }
    case MGPU_STORE_OP_WAIT:
    case MGPU_STORE_OP_CHECK: {
        uint32_t pos = 0, missing = 0;
        mgpu_store_slice_t k;
        while (mgpu_store_keys_next(&m, &pos, &k)) {
            e = table_find(s, k.p, k.len);
            missing += e == NULL || !e->has_value;
        }
        if (m.op == MGPU_STORE_OP_CHECK) {
            start = mgpu_store_buf_frame_begin(&c->out, m.op | MGPU_STORE_RESP, 0, m.id);
            mgpu_store_buf_u8(&c->out, missing == 0);
            break;
        }
        if (missing > 0 && m.u32 != 0) {
            park(c, &m, missing);
            return;
        }
        if (missing > 0) {
            resp_status(c, m.op, m.id, MGPU_STORE_ST_TIMEOUT, "%u of %u keys not set", missing,
                        m.nkeys);
            return;
        }
        start = mgpu_store_buf_frame_begin(&c->out, m.op | MGPU_STORE_RESP, 0, m.id);
        break;
    }
    case MGPU_STORE_OP_DELETE: {
        int deleted;
        e = table_find(s, m.key.p, m.key.len);
        deleted = e != NULL && e->has_value;
        if (deleted) {
            free(e->val);
            e->val = NULL;
            e->vlen = 0;
            e->has_value = 0;
            s->nkeys--;
            table_gc(s, e);
        }
        start = mgpu_store_buf_frame_begin(&c->out, m.op | MGPU_STORE_RESP, 0, m.id);
        mgpu_store_buf_u8(&c->out, (uint8_t)deleted);
        break;
    }
    case MGPU_STORE_OP_NUM_KEYS:
        start = mgpu_store_buf_frame_begin(&c->out, m.op | MGPU_STORE_RESP, 0, m.id);
        mgpu_store_buf_i64(&c->out, s->nkeys);
        break;
    case MGPU_STORE_OP_PING:
        start = mgpu_store_buf_frame_begin(&c->out, m.op | MGPU_STORE_RESP, 0, m.id);
        mgpu_store_buf_u32(&c->out, m.u32);
        break;
    case MGPU_STORE_OP_ON_CLOSE: {
        /* The key list is already checked by the parser: keep it encoded as it came. */
        uint8_t *copy = m.key.len ? malloc(m.key.len) : NULL;
        if (m.key.len && copy == NULL)
            goto nomem;
        if (m.key.len)
            memcpy(copy, m.key.p, m.key.len);
        free(c->on_close);
        c->on_close = copy;
        c->on_close_len = m.key.len;
        c->on_close_n = m.nkeys;
        start = mgpu_store_buf_frame_begin(&c->out, m.op | MGPU_STORE_RESP, 0, m.id);
        break;
    }
    default: /* the decoder admits request ops only */
        conn_fail(c, m.op, m.id, MGPU_STORE_ST_PROTOCOL, "unexpected op");
        return;
    }
    resp_end(c, start);
    return;
nomem:
    mgpu_error("store: out of memory serving %s of %s, closing it", mgpu_store_op_name(m.op),
               c->peer);
    conn_close(c);
}

/* Serves the whole frames buffered, pausing (reads stopped) while too much output waits. */
static void conn_process(conn_t *c)
{
    mgpu_store_frame_t f;
    mgpu_err_t err;
    int rc;

    while (!c->closing && !c->draining) {
        if (c->out.len >= OUT_HIGH) {
            conn_flush(c);
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
            conn_fail(c, 0, 0, MGPU_STORE_ST_PROTOCOL, err.msg);
            return;
        }
        handle(c, &f);
    }
    conn_flush(c);
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
        conn_close(c);
    } else if (nread < 0) {
        mgpu_warn("store: closing connection from %s: read: %s", c->peer, uv_strerror((int)nread));
        conn_close(c);
    }
}

static void conn_read_start(conn_t *c)
{
    int rc = uv_read_start((uv_stream_t *)&c->tcp, conn_alloc, conn_read);
    if (rc < 0) {
        mgpu_warn("store: closing connection from %s: uv_read_start: %s", c->peer, uv_strerror(rc));
        conn_close(c);
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
        conn_close(c);
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
        conn_fail(c, MGPU_STORE_OP_HELLO, 0, MGPU_STORE_ST_PROTOCOL, why);
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
            conn_fail(c, MGPU_STORE_OP_HELLO, 0, MGPU_STORE_ST_PROTOCOL, why);
        }
    }
}

/* ---- the public API ---- */

static int is_loopback(const struct sockaddr *a)
{
    static const struct in6_addr lo6 = IN6ADDR_LOOPBACK_INIT;
    if (a->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)a)->sin_addr.s_addr) >> 24) == 127;
    return a->sa_family == AF_INET6 &&
           memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &lo6, sizeof lo6) == 0;
}

/* Each connection is a descriptor, and the usual soft limit (1024) is below the default
 * max_conns: without this, a rendezvous of a thousand workers fails at accept(2) with EMFILE.
 * Raises the soft limit as far as the hard one allows (children inherit it, which is harmless),
 * and says so when even that is short. */
static void raise_fd_limit(int max_conns)
{
    struct rlimit rl;
    rlim_t want = (rlim_t)max_conns + 256; /* the launcher's own pipes, logs, workers */
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur >= want)
        return;
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= want ? want : rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur < want)
        mgpu_warn("store: max_conns is %d but this process may open only %llu descriptors "
                  "(ulimit -n): clients beyond that will be refused",
                  max_conns, (unsigned long long)rl.rlim_cur);
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

    if (!is_loopback(ai->ai_addr) && (o->token == NULL || *o->token == '\0'))
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
        conn_close(s->conns);
    uv_close((uv_handle_t *)&s->sweep, sweep_closed);
    uv_close((uv_handle_t *)&s->listener, listener_closed);
}
