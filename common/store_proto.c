/* store_proto.c - frame decoder, payload parser and frame writer of the store protocol
 * (the format is documented in store_proto.h). */
#include "store_proto.h"

#include <errno.h>      /* ENOMEM */
#include <sys/random.h> /* getrandom */
#include <stdlib.h>     /* malloc, realloc, free */
#include <string.h>     /* memcpy, memmove */

#include "names.h"  /* mgpu_names_get */
#include "sha256.h" /* mgpu_sha256_hmac */

/* Whatever the decoder reads at once when no frame tells it more: large enough for many
 * small requests per read, small enough that a thousand idle connections cost little. */
#define DEC_MIN_CHUNK (16u << 10)

mgpu_store_limits_t mgpu_store_limits_default(void)
{
    mgpu_store_limits_t l = {MGPU_STORE_MAX_KEY, MGPU_STORE_MAX_VALUE, MGPU_STORE_MAX_KEYS_PER_REQ};
    return l;
}

static uint32_t rd_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void wr_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

/* The largest payload any frame may carry under lim: COMPARE_SET's key and two values, plus
 * their length fields; a WAIT/CHECK key list must fit in the same bound. */
static size_t max_payload(const mgpu_store_limits_t *lim)
{
    size_t m = 2 * lim->max_value + lim->max_key + 64;
    return m > UINT32_MAX ? UINT32_MAX : m;
}

void mgpu_store_dec_init(mgpu_store_dec_t *d, const mgpu_store_limits_t *lim, int responses)
{
    mgpu_store_limits_t def = mgpu_store_limits_default();
    memset(d, 0, sizeof *d);
    d->max_payload = max_payload(lim ? lim : &def);
    d->chunk = DEC_MIN_CHUNK;
    d->responses = responses;
}

void mgpu_store_dec_set_chunk(mgpu_store_dec_t *d, size_t chunk)
{
    d->chunk = chunk > 0 ? chunk : DEC_MIN_CHUNK;
}

void mgpu_store_dec_set_limits(mgpu_store_dec_t *d, const mgpu_store_limits_t *lim)
{
    d->max_payload = max_payload(lim);
}

void mgpu_store_dec_free(mgpu_store_dec_t *d)
{
    free(d->buf);
    d->buf = NULL;
    d->start = d->len = d->cap = 0;
}

int mgpu_store_dec_reserve(mgpu_store_dec_t *d, size_t min, uint8_t **p, size_t *avail)
{
    size_t pending = d->len - d->start, want = min < d->chunk ? d->chunk : min;

    /* A frame whose header is in: make room for more of it, so a big value arrives in few
     * reads. At most as much again as has arrived, though: memory follows the bytes a peer
     * really sends, not the length it announces. */
    if (pending >= MGPU_STORE_HDR_SIZE) {
        size_t plen = rd_u32(d->buf + d->start + 8), rest;
        if (plen <= d->max_payload && MGPU_STORE_HDR_SIZE + plen > pending) {
            rest = MGPU_STORE_HDR_SIZE + plen - pending;
            if (rest > pending)
                rest = pending;
            if (rest > want)
                want = rest;
        }
    }
    /* Compact: frames before start were handed out and are now invalidated by contract. */
    if (d->start > 0) {
        memmove(d->buf, d->buf + d->start, pending);
        d->start = 0;
        d->len = pending;
    }
    if (d->cap - d->len < want) {
        size_t ncap = d->cap ? d->cap : d->chunk;
        uint8_t *nb;
        while (ncap - d->len < want)
            ncap *= 2;
        nb = realloc(d->buf, ncap);
        if (nb == NULL)
            return -ENOMEM;
        d->buf = nb;
        d->cap = ncap;
    }
    *p = d->buf + d->len;
    *avail = d->cap - d->len;
    return 0;
}

void mgpu_store_dec_commit(mgpu_store_dec_t *d, size_t n)
{
    d->len += n;
}

int mgpu_store_dec_feed(mgpu_store_dec_t *d, const void *p, size_t n, mgpu_err_t *err)
{
    uint8_t *dst;
    size_t avail;
    int rc = mgpu_store_dec_reserve(d, n, &dst, &avail);
    if (rc < 0)
        return mgpu_err_set(err, rc, "store decoder: cannot buffer %zu bytes", n);
    memcpy(dst, p, n);
    mgpu_store_dec_commit(d, n);
    return 0;
}

int mgpu_store_dec_next(mgpu_store_dec_t *d, mgpu_store_frame_t *f, mgpu_err_t *err)
{
    const uint8_t *h = d->buf + d->start;
    size_t pending = d->len - d->start;
    uint8_t op;
    uint32_t plen;

    if (d->failed)
        return mgpu_err_set(err, MGPU_E_PROTOCOL, "store decoder: stream already failed");
    if (pending < MGPU_STORE_HDR_SIZE)
        return 0;
    d->failed = 1; /* until the header proves good */
    if (h[0] != MGPU_STORE_MAGIC0 || h[1] != MGPU_STORE_MAGIC1)
        return mgpu_err_set(err, MGPU_E_PROTOCOL,
                            "bad frame magic 0x%02x%02x (expected \"MG\": not an mgpu store peer?)",
                            h[0], h[1]);
    op = h[2];
    if (((op & MGPU_STORE_RESP) != 0) != (d->responses != 0) ||
        (op & ~MGPU_STORE_RESP) < MGPU_STORE_OP_HELLO ||
        (op & ~MGPU_STORE_RESP) > MGPU_STORE_OP_LAST)
        return mgpu_err_set(err, MGPU_E_PROTOCOL, "unknown %s op 0x%02x",
                            d->responses ? "response" : "request", op);
    if (!d->responses && h[3] != 0)
        return mgpu_err_set(err, MGPU_E_PROTOCOL, "request %s with status %u",
                            mgpu_store_op_name(op), h[3]);
    if (d->responses && h[3] > MGPU_STORE_ST_LAST)
        return mgpu_err_set(err, MGPU_E_PROTOCOL, "unknown status %u", h[3]);
    plen = rd_u32(h + 8);
    if (plen > d->max_payload)
        return mgpu_err_set(err, MGPU_E_PROTOCOL, "%s frame of %u bytes exceeds the limit of %zu",
                            mgpu_store_op_name(op), plen, d->max_payload);
    d->failed = 0;
    if (pending - MGPU_STORE_HDR_SIZE < plen)
        return 0;
    f->op = op;
    f->status = h[3];
    f->id = rd_u32(h + 4);
    f->payload = h + MGPU_STORE_HDR_SIZE;
    f->len = plen;
    d->start += MGPU_STORE_HDR_SIZE + plen;
    return 1;
}

/* A cursor over a payload; every read checks the bounds. */
typedef struct rd {
    const uint8_t *p;
    uint32_t left;
} rd_t;

static int rd_u8(rd_t *r, uint8_t *v)
{
    if (r->left < 1)
        return -1;
    *v = *r->p;
    r->p++;
    r->left--;
    return 0;
}

static int rd_u32c(rd_t *r, uint32_t *v)
{
    if (r->left < 4)
        return -1;
    *v = rd_u32(r->p);
    r->p += 4;
    r->left -= 4;
    return 0;
}

static int rd_i64(rd_t *r, int64_t *v)
{
    uint64_t u;
    if (r->left < 8)
        return -1;
    u = (uint64_t)rd_u32(r->p) | (uint64_t)rd_u32(r->p + 4) << 32;
    *v = (int64_t)u;
    r->p += 8;
    r->left -= 8;
    return 0;
}

/* bytes of at most max length */
static int rd_bytes(rd_t *r, mgpu_store_slice_t *s, size_t max)
{
    uint32_t n;
    if (rd_u32c(r, &n) < 0 || n > max || n > r->left)
        return -1;
    s->p = r->p;
    s->len = n;
    r->p += n;
    r->left -= n;
    return 0;
}

static int parse_fail(mgpu_err_t *err, const mgpu_store_frame_t *f, const char *what)
{
    return mgpu_err_set(err, MGPU_E_PROTOCOL, "malformed %s%s frame (%u payload bytes): %s",
                        mgpu_store_op_name(f->op), f->op & MGPU_STORE_RESP ? " response" : "",
                        f->len, what);
}

/* n keys, each bytes <= max_key; the list as a whole becomes m->key. */
static int rd_keys(rd_t *r, mgpu_store_msg_t *m, const mgpu_store_limits_t *lim)
{
    const uint8_t *begin;
    mgpu_store_slice_t k;
    if (rd_u32c(r, &m->nkeys) < 0 || m->nkeys > lim->max_keys)
        return -1;
    begin = r->p;
    for (uint32_t i = 0; i < m->nkeys; i++)
        if (rd_bytes(r, &k, lim->max_key) < 0)
            return -1;
    m->key.p = begin;
    m->key.len = (uint32_t)(r->p - begin);
    return 0;
}

int mgpu_store_msg_parse(const mgpu_store_frame_t *f, const mgpu_store_limits_t *lim,
                         mgpu_store_msg_t *m, mgpu_err_t *err)
{
    mgpu_store_limits_t def = mgpu_store_limits_default();
    rd_t r = {f->payload, f->len};
    int bad = 0;

    if (lim == NULL)
        lim = &def;
    memset(m, 0, sizeof *m);
    m->op = f->op;
    m->status = f->status;
    m->id = f->id;
    if ((f->op & MGPU_STORE_RESP) && f->status != MGPU_STORE_ST_OK) {
        bad = rd_bytes(&r, &m->val, lim->max_key);
    } else {
        switch (f->op) {
        case MGPU_STORE_OP_HELLO:
            bad = rd_u8(&r, &m->u8);
            /* Another version's HELLO may go on differently: leave the rest unread, so that
             * the server can answer with ST_VERSION rather than a protocol error. */
            if (!bad && m->u8 != MGPU_STORE_PROTO_VERSION)
                r.left = 0;
            else if (!bad)
                bad = rd_bytes(&r, &m->key, MGPU_STORE_NONCE_LEN) ||
                      m->key.len != MGPU_STORE_NONCE_LEN;
            break;
        case MGPU_STORE_OP_SET:
            bad = rd_bytes(&r, &m->key, lim->max_key) || rd_bytes(&r, &m->val, lim->max_value);
            break;
        case MGPU_STORE_OP_GET:
            bad = rd_u32c(&r, &m->u32) || rd_bytes(&r, &m->key, lim->max_key);
            break;
        case MGPU_STORE_OP_ADD:
            bad = rd_bytes(&r, &m->key, lim->max_key) || rd_i64(&r, &m->i64);
            break;
        case MGPU_STORE_OP_COMPARE_SET:
            bad = rd_bytes(&r, &m->key, lim->max_key) || rd_bytes(&r, &m->val, lim->max_value) ||
                  rd_bytes(&r, &m->val2, lim->max_value);
            break;
        case MGPU_STORE_OP_WAIT:
            bad = rd_u32c(&r, &m->u32) || rd_keys(&r, m, lim);
            break;
        case MGPU_STORE_OP_CHECK:
        case MGPU_STORE_OP_ON_CLOSE:
            bad = rd_keys(&r, m, lim) || (f->op == MGPU_STORE_OP_ON_CLOSE && m->nkeys % 2 != 0);
            break;
        case MGPU_STORE_OP_ON_IDLE:
            bad = rd_u32c(&r, &m->u32) || rd_keys(&r, m, lim) || m->nkeys % 2 != 0;
            break;
        case MGPU_STORE_OP_DELETE:
            bad = rd_bytes(&r, &m->key, lim->max_key);
            break;
        case MGPU_STORE_OP_AUTH:
            bad = rd_bytes(&r, &m->key, MGPU_STORE_PROOF_LEN) || m->key.len != MGPU_STORE_PROOF_LEN;
            break;
        case MGPU_STORE_OP_NUM_KEYS:
            break;
        case MGPU_STORE_OP_PING:
        case MGPU_STORE_OP_PING | MGPU_STORE_RESP:
            bad = rd_u32c(&r, &m->u32);
            break;
        case MGPU_STORE_OP_HELLO | MGPU_STORE_RESP:
            bad = rd_u8(&r, &m->u8);
            /* another version's answer: its version byte is all the client needs */
            if (!bad && m->u8 != MGPU_STORE_PROTO_VERSION)
                r.left = 0;
            else if (!bad)
                bad = rd_bytes(&r, &m->val, MGPU_STORE_NONCE_LEN) ||
                      m->val.len != MGPU_STORE_NONCE_LEN;
            break;
        case MGPU_STORE_OP_AUTH | MGPU_STORE_RESP:
            bad =
                rd_bytes(&r, &m->val2, MGPU_STORE_PROOF_LEN) || m->val2.len != MGPU_STORE_PROOF_LEN;
            break;
        case MGPU_STORE_OP_CHECK | MGPU_STORE_RESP:
        case MGPU_STORE_OP_DELETE | MGPU_STORE_RESP:
            bad = rd_u8(&r, &m->u8);
            break;
        case MGPU_STORE_OP_SET | MGPU_STORE_RESP:
        case MGPU_STORE_OP_WAIT | MGPU_STORE_RESP:
        case MGPU_STORE_OP_ON_CLOSE | MGPU_STORE_RESP:
        case MGPU_STORE_OP_ON_IDLE | MGPU_STORE_RESP:
            break;
        case MGPU_STORE_OP_GET | MGPU_STORE_RESP:
            bad = rd_bytes(&r, &m->val, lim->max_value);
            break;
        case MGPU_STORE_OP_ADD | MGPU_STORE_RESP:
        case MGPU_STORE_OP_NUM_KEYS | MGPU_STORE_RESP:
            bad = rd_i64(&r, &m->i64);
            break;
        case MGPU_STORE_OP_COMPARE_SET | MGPU_STORE_RESP:
            bad = rd_u8(&r, &m->u8) || rd_bytes(&r, &m->val, lim->max_value);
            break;
        default:
            return parse_fail(err, f, "unknown op");
        }
    }
    if (bad)
        return parse_fail(err, f, "a field is truncated or over its limit");
    if (r.left != 0)
        return parse_fail(err, f, "trailing bytes");
    return 0;
}

int mgpu_store_keys_next(const mgpu_store_msg_t *m, uint32_t *pos, mgpu_store_slice_t *key)
{
    uint32_t n;
    if (*pos >= m->key.len)
        return 0;
    n = rd_u32(m->key.p + *pos);
    key->p = m->key.p + *pos + 4;
    key->len = n;
    *pos += 4 + n;
    return 1;
}

void mgpu_store_buf_free(mgpu_store_buf_t *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
    b->failed = 0;
}

/* Room for n more bytes, or the buffer is marked failed and the append dropped. */
static uint8_t *buf_room(mgpu_store_buf_t *b, size_t n)
{
    if (b->failed)
        return NULL;
    if (b->cap - b->len < n) {
        size_t ncap = b->cap ? b->cap : 256;
        uint8_t *np;
        while (ncap - b->len < n)
            ncap *= 2;
        np = realloc(b->p, ncap);
        if (np == NULL) {
            b->failed = 1;
            return NULL;
        }
        b->p = np;
        b->cap = ncap;
    }
    return b->p + b->len;
}

size_t mgpu_store_buf_frame_begin(mgpu_store_buf_t *b, uint8_t op, uint8_t status, uint32_t id)
{
    size_t start = b->len;
    uint8_t *p = buf_room(b, MGPU_STORE_HDR_SIZE);
    if (p != NULL) {
        p[0] = MGPU_STORE_MAGIC0;
        p[1] = MGPU_STORE_MAGIC1;
        p[2] = op;
        p[3] = status;
        wr_u32(p + 4, id);
        wr_u32(p + 8, 0);
        b->len += MGPU_STORE_HDR_SIZE;
    }
    return start;
}

int mgpu_store_buf_frame_end(mgpu_store_buf_t *b, size_t start)
{
    if (b->failed || b->len - start - MGPU_STORE_HDR_SIZE > UINT32_MAX) {
        b->len = start;
        b->failed = 0;
        return -ENOMEM;
    }
    wr_u32(b->p + start + 8, (uint32_t)(b->len - start - MGPU_STORE_HDR_SIZE));
    return 0;
}

void mgpu_store_buf_u8(mgpu_store_buf_t *b, uint8_t v)
{
    uint8_t *p = buf_room(b, 1);
    if (p != NULL) {
        *p = v;
        b->len++;
    }
}

void mgpu_store_buf_u32(mgpu_store_buf_t *b, uint32_t v)
{
    uint8_t *p = buf_room(b, 4);
    if (p != NULL) {
        wr_u32(p, v);
        b->len += 4;
    }
}

void mgpu_store_buf_i64(mgpu_store_buf_t *b, int64_t v)
{
    uint8_t *p = buf_room(b, 8);
    if (p != NULL) {
        wr_u32(p, (uint32_t)(uint64_t)v);
        wr_u32(p + 4, (uint32_t)((uint64_t)v >> 32));
        b->len += 8;
    }
}

void mgpu_store_buf_bytes(mgpu_store_buf_t *b, const void *p, size_t n)
{
    uint8_t *d;
    if (n > UINT32_MAX) {
        b->failed = 1;
        return;
    }
    d = buf_room(b, 4 + n);
    if (d != NULL) {
        wr_u32(d, (uint32_t)n);
        if (n > 0)
            memcpy(d + 4, p, n);
        b->len += 4 + n;
    }
}

void mgpu_store_buf_raw(mgpu_store_buf_t *b, const void *p, size_t n)
{
    uint8_t *d = buf_room(b, n);
    if (d != NULL && n > 0) {
        memcpy(d, p, n);
        b->len += n;
    }
}

const char *mgpu_store_op_name(uint8_t op)
{
    static const char *const names[] = {
        [MGPU_STORE_OP_HELLO] = "HELLO",
        [MGPU_STORE_OP_SET] = "SET",
        [MGPU_STORE_OP_GET] = "GET",
        [MGPU_STORE_OP_ADD] = "ADD",
        [MGPU_STORE_OP_COMPARE_SET] = "COMPARE_SET",
        [MGPU_STORE_OP_WAIT] = "WAIT",
        [MGPU_STORE_OP_CHECK] = "CHECK",
        [MGPU_STORE_OP_DELETE] = "DELETE",
        [MGPU_STORE_OP_NUM_KEYS] = "NUM_KEYS",
        [MGPU_STORE_OP_PING] = "PING",
        [MGPU_STORE_OP_ON_CLOSE] = "ON_CLOSE",
        [MGPU_STORE_OP_ON_IDLE] = "ON_IDLE",
        [MGPU_STORE_OP_AUTH] = "AUTH",
    };
    op &= (uint8_t)~MGPU_STORE_RESP;
    return mgpu_names_get(names, MGPU_NAMES_COUNT(names), op, "?");
}

const char *mgpu_store_status_name(uint8_t status)
{
    static const char *const names[] = {
        [MGPU_STORE_ST_OK] = "ok",
        [MGPU_STORE_ST_TIMEOUT] = "timeout",
        [MGPU_STORE_ST_BAD_VALUE] = "bad value",
        [MGPU_STORE_ST_AUTH] = "authentication failed",
        [MGPU_STORE_ST_VERSION] = "version mismatch",
        [MGPU_STORE_ST_PROTOCOL] = "protocol error",
        [MGPU_STORE_ST_BUSY] = "busy",
    };
    return mgpu_names_get(names, MGPU_NAMES_COUNT(names), status, "?");
}

void mgpu_store_proof(const void *token, size_t tlen, int server,
                      const uint8_t cnonce[MGPU_STORE_NONCE_LEN],
                      const uint8_t snonce[MGPU_STORE_NONCE_LEN], uint8_t out[MGPU_STORE_PROOF_LEN])
{
    static const char sctx[] = "mgpu-store-v2 server", cctx[] = "mgpu-store-v2 client";
    if (server)
        mgpu_sha256_hmac(token, tlen, cnonce, MGPU_STORE_NONCE_LEN, snonce, MGPU_STORE_NONCE_LEN,
                         sctx, sizeof sctx - 1, out);
    else
        mgpu_sha256_hmac(token, tlen, snonce, MGPU_STORE_NONCE_LEN, cnonce, MGPU_STORE_NONCE_LEN,
                         cctx, sizeof cctx - 1, out);
}

int mgpu_store_random(void *p, size_t n, mgpu_err_t *err)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = getrandom((uint8_t *)p + got, n - got, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return mgpu_err_set(err, -errno, "getrandom(%zu): %s", n - got, strerror(errno));
        got += (size_t)r;
    }
    return 0;
}
