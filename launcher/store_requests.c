/* store_requests.c - the store server's key table, the waits that GET and WAIT park on missing
 * keys, and the request handlers (see store_requests.h). Runs on the server's loop thread. */
#include "store_requests.h"

#include <errno.h>  /* ENOMEM */
#include <stdio.h>  /* snprintf */
#include <stdlib.h> /* malloc, free */
#include <string.h> /* memcmp, memcpy */

#include "log.h"    /* mgpu_warn, mgpu_debug */
#include "sha256.h" /* mgpu_sha256_equal */

/* ---- the table ---- */

/* FNV-1a. Not keyed: a client could choose colliding keys and lengthen one chain, but only
 * clients that authenticated (with the token where the store is reachable from other hosts)
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

void mgpu_store_requests_table_free(mgpu_store_server_t *s)
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

static void waiter_timer_closed(uv_handle_t *h)
{
    waiter_t *w = h->data;
    mgpu_store_server_t *s = w->srv;
    free(w);
    mgpu_store_server_handle_closed(s);
}

/* Unlinks the waiter from its keys and its connection and frees it (after its timer closed). */
void mgpu_store_requests_waiter_free(waiter_t *w)
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
static int entry_set(mgpu_store_server_t *s, entry_t *e, const void *v, size_t n);

/* An encoded key/value list (as ON_CLOSE and ON_IDLE carry it): each key set where it has no
 * value. */
static void set_pairs(mgpu_store_server_t *s, const uint8_t *p, uint32_t len, uint32_t n)
{
    const uint8_t *end = p + len;

    for (uint32_t i = 0; i + 1 < n && p + 8 <= end; i += 2) {
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

void mgpu_store_requests_on_close(conn_t *c)
{
    set_pairs(c->srv, c->on_close, c->on_close_len, c->on_close_n);
}

void mgpu_store_requests_on_idle(conn_t *c)
{
    set_pairs(c->srv, c->on_idle, c->on_idle_len, c->on_idle_n);
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
    mgpu_store_requests_waiter_free(w);
    mgpu_store_server_resp_end(c, start);
    mgpu_store_server_conn_flush(c);
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
        mgpu_store_server_resp_status(c, w->op, w->id, MGPU_STORE_ST_TIMEOUT,
                                      "key \"%s\" not set after %u ms", kb, w->timeout_ms);
    else
        mgpu_store_server_resp_status(c, w->op, w->id, MGPU_STORE_ST_TIMEOUT,
                                      "%u of %u keys not set after %u ms (first missing: \"%s\")",
                                      w->missing, w->nkeys, w->timeout_ms, kb);
    mgpu_store_requests_waiter_free(w);
    mgpu_store_server_conn_flush(c);
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
        __atomic_add_fetch(&s->nkeys, 1, __ATOMIC_RELAXED); /* read by other threads */
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
        mgpu_store_requests_waiter_free(w);
    mgpu_store_server_conn_close(c);
}

/* ---- requests ---- */

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

/* HELLO: the server's nonce (store_proto.h). */
static void handle_hello(conn_t *c, const mgpu_store_msg_t *m)
{
    mgpu_err_t err;
    size_t start;
    char why[128];

    if (c->hello) {
        mgpu_store_server_conn_fail(c, m->op, m->id, MGPU_STORE_ST_PROTOCOL, "HELLO sent twice");
        return;
    }
    if (m->u8 != MGPU_STORE_PROTO_VERSION) {
        snprintf(why, sizeof why, "protocol version %u not supported (this server speaks %d)",
                 m->u8, MGPU_STORE_PROTO_VERSION);
        mgpu_store_server_conn_fail(c, m->op, m->id, MGPU_STORE_ST_VERSION, why);
        return;
    }
    if (mgpu_store_random(c->snonce, sizeof c->snonce, &err) < 0) {
        mgpu_error("store: %s", err.msg);
        mgpu_store_server_conn_close(c);
        return;
    }
    memcpy(c->cnonce, m->key.p, sizeof c->cnonce);
    c->hello = 1;
    start = mgpu_store_buf_frame_begin(&c->out, m->op | MGPU_STORE_RESP, MGPU_STORE_ST_OK, m->id);
    mgpu_store_buf_u8(&c->out, MGPU_STORE_PROTO_VERSION);
    mgpu_store_buf_bytes(&c->out, c->snonce, sizeof c->snonce);
    mgpu_store_server_resp_end(c, start);
}

/* AUTH: the client's proof, compared in constant time; then a slot, if one is free, and the
 * server's own proof. */
static void handle_auth(conn_t *c, const mgpu_store_msg_t *m)
{
    mgpu_store_server_t *s = c->srv;
    uint8_t want[MGPU_STORE_PROOF_LEN];
    size_t start;

    if (c->authed) {
        mgpu_store_server_conn_fail(c, m->op, m->id, MGPU_STORE_ST_PROTOCOL, "AUTH sent twice");
        return;
    }
    mgpu_store_proof(s->token, s->token_len, 0, c->cnonce, c->snonce, want);
    /* A server without a token requires nothing: any proof will do. */
    if (s->token_len > 0 && !mgpu_sha256_equal(want, m->key.p, sizeof want)) {
        mgpu_store_server_conn_fail(c, m->op, m->id, MGPU_STORE_ST_AUTH, "wrong store token");
        return;
    }
    if (s->nconns >= s->max_conns) {
        char why[96];
        snprintf(why, sizeof why, "too many connections (max_conns %d)", s->max_conns);
        mgpu_store_server_conn_refuse(c, m->id, MGPU_STORE_ST_BUSY, why);
        return;
    }
    mgpu_store_server_conn_authed(c);
    mgpu_store_proof(s->token, s->token_len, 1, c->cnonce, c->snonce, want);
    start = mgpu_store_buf_frame_begin(&c->out, m->op | MGPU_STORE_RESP, MGPU_STORE_ST_OK, m->id);
    mgpu_store_buf_bytes(&c->out, want, sizeof want);
    mgpu_store_server_resp_end(c, start);
}

void mgpu_store_requests_handle(conn_t *c, const mgpu_store_frame_t *f)
{
    mgpu_store_server_t *s = c->srv;
    mgpu_store_msg_t m;
    mgpu_err_t err;
    entry_t *e;
    size_t start;

    if (mgpu_store_msg_parse(f, &s->lim, &m, &err) < 0) {
        mgpu_store_server_conn_fail(c, f->op, f->id, MGPU_STORE_ST_PROTOCOL, err.msg);
        return;
    }
    if (!c->authed && !c->hello && m.op != MGPU_STORE_OP_HELLO) {
        snprintf(err.msg, sizeof err.msg, "first request is %s, expected HELLO",
                 mgpu_store_op_name(m.op));
        mgpu_store_server_conn_fail(c, m.op, m.id, MGPU_STORE_ST_PROTOCOL, err.msg);
        return;
    }
    if (!c->authed && c->hello && m.op != MGPU_STORE_OP_AUTH) {
        snprintf(err.msg, sizeof err.msg, "%s after HELLO, expected AUTH",
                 mgpu_store_op_name(m.op));
        mgpu_store_server_conn_fail(c, m.op, m.id, MGPU_STORE_ST_PROTOCOL, err.msg);
        return;
    }
    switch (m.op) {
    case MGPU_STORE_OP_HELLO:
        handle_hello(c, &m);
        return;
    case MGPU_STORE_OP_AUTH:
        handle_auth(c, &m);
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
            mgpu_store_server_resp_status(c, m.op, m.id, MGPU_STORE_ST_TIMEOUT,
                                          "key \"%s\" not set",
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
            mgpu_store_server_resp_status(c, m.op, m.id, MGPU_STORE_ST_BAD_VALUE,
                                          "ADD on key \"%s\" whose value is not a decimal int64",
                                          key_str(m.key.p, m.key.len, kb, sizeof kb));
            return;
        }
        if (__builtin_add_overflow(v, m.i64, &v)) {
            mgpu_store_server_resp_status(c, m.op, m.id, MGPU_STORE_ST_BAD_VALUE,
                                          "ADD overflows int64");
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
            mgpu_store_server_resp_status(c, m.op, m.id, MGPU_STORE_ST_TIMEOUT,
                                          "%u of %u keys not set", missing, m.nkeys);
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
            __atomic_sub_fetch(&s->nkeys, 1, __ATOMIC_RELAXED);
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
    case MGPU_STORE_OP_ON_CLOSE:
    case MGPU_STORE_OP_ON_IDLE: {
        /* The key list is already checked by the parser: keep it encoded as it came. */
        uint8_t *copy = m.key.len ? malloc(m.key.len) : NULL;
        if (m.key.len && copy == NULL)
            goto nomem;
        if (m.key.len)
            memcpy(copy, m.key.p, m.key.len);
        if (m.op == MGPU_STORE_OP_ON_CLOSE) {
            free(c->on_close);
            c->on_close = copy;
            c->on_close_len = m.key.len;
            c->on_close_n = m.nkeys;
        } else {
            free(c->on_idle);
            c->on_idle = copy;
            c->on_idle_len = m.key.len;
            c->on_idle_n = m.nkeys;
            c->idle_ms = m.nkeys > 0 ? m.u32 : 0;
            c->rx_ms = uv_now(s->loop);
        }
        start = mgpu_store_buf_frame_begin(&c->out, m.op | MGPU_STORE_RESP, 0, m.id);
        break;
    }
    default: /* the decoder admits request ops only */
        mgpu_store_server_conn_fail(c, m.op, m.id, MGPU_STORE_ST_PROTOCOL, "unexpected op");
        return;
    }
    mgpu_store_server_resp_end(c, start);
    return;
nomem:
    mgpu_error("store: out of memory serving %s of %s, closing it", mgpu_store_op_name(m.op),
               c->peer);
    mgpu_store_server_conn_close(c);
}

/* ---- in-process access (store_server.h) ---- */

int mgpu_store_server_put(mgpu_store_server_t *s, const void *key, size_t klen, const void *val,
                          size_t vlen)
{
    entry_t *e = table_get(s, key, klen);
    return e == NULL ? -ENOMEM : entry_set(s, e, val, vlen);
}

int mgpu_store_server_get(mgpu_store_server_t *s, const void *key, size_t klen, void **val,
                          size_t *vlen)
{
    entry_t *e = table_find(s, key, klen);
    *val = NULL;
    *vlen = 0;
    if (e == NULL || !e->has_value)
        return -ENOENT;
    if ((*val = malloc(e->vlen + 1)) == NULL)
        return -ENOMEM;
    memcpy(*val, e->val, e->vlen);
    ((char *)*val)[e->vlen] = '\0';
    *vlen = e->vlen;
    return 0;
}

int64_t mgpu_store_server_num_keys(const mgpu_store_server_t *s)
{
    return __atomic_load_n(&s->nkeys, __ATOMIC_RELAXED);
}
