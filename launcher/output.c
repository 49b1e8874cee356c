/* output.c - line assembly for worker output. */
#include "output.h"

#include <errno.h>  /* ENOMEM */
#include <stdio.h>  /* snprintf */
#include <stdlib.h> /* realloc */
#include <string.h> /* memchr */

void mgpu_prefix_format(const char *tmpl, const char *role, int local_rank, int rank, char *out,
                        size_t len)
{
    size_t n = 0;

    out[0] = '\0';
    while (*tmpl && n + 1 < len) {
        if (strncmp(tmpl, "${role_name}", 12) == 0) {
            n += (size_t)snprintf(out + n, len - n, "%s", role);
            tmpl += 12;
        } else if (strncmp(tmpl, "${local_rank}", 13) == 0) {
            n += (size_t)snprintf(out + n, len - n, "%d", local_rank);
            tmpl += 13;
        } else if (strncmp(tmpl, "${rank}", 7) == 0) {
            n += (size_t)snprintf(out + n, len - n, "%d", rank);
            tmpl += 7;
        } else {
            out[n++] = *tmpl++;
            out[n] = '\0';
        }
        if (n >= len)
            n = len - 1;
    }
}

int mgpu_line_filters_parse(const char *s, mgpu_line_filters_t *f)
{
    size_t o = 0, start = 0;

    memset(f, 0, sizeof *f);
    for (;; s++) {
        if (*s == ',' && s[1] == ',') {
            s++; /* ",," is a comma of the substring */
        } else if (*s == ',' || *s == '\0') {
            if (o > start) { /* an empty entry copies nothing: left out */
                f->buf[o++] = '\0';
                f->n++;
                start = o;
            }
            if (*s == '\0')
                return 0;
            continue;
        }
        if (o + 2 >= sizeof f->buf) {
            memset(f, 0, sizeof *f);
            return -E2BIG;
        }
        f->buf[o++] = *s;
    }
}

int mgpu_line_filters_match(const mgpu_line_filters_t *f, const char *line, size_t n)
{
    const char *p = f->buf;

    for (int i = 0; i < f->n; i++, p += strlen(p) + 1)
        if (memmem(line, n, p, strlen(p)) != NULL)
            return 1;
    return 0;
}

static int reserve(char **buf, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 4096;
    while (c < need)
        c *= 2;
    char *b = realloc(*buf, c);
    if (b == NULL)
        return -ENOMEM;
    *buf = b;
    *cap = c;
    return 0;
}

/* Console text for q, n bytes of the current line from where the console last left it. The
 * prefix goes before the first visible byte wherever the cursor is at column 0: at the start
 * of a line the console does not hold for this stream, and after each '\r'. A newline that
 * would only end a line another stream's break ended already is left out. out may be NULL to
 * measure. */
static size_t live_layout(char *out, const mgpu_linebuf_t *lb, const char *prefix, size_t plen,
                          const char *q, size_t n)
{
    size_t o = 0;
    int need = !lb->live || lb->at_cr;

    for (size_t i = 0; i < n; i++) {
        char c = q[i];
        if (c == '\n' && !lb->live && o == 0)
            continue;
        if (need && c != '\r' && c != '\n') {
            if (out != NULL)
                memcpy(out + o, prefix, plen);
            o += plen;
            need = 0;
        }
        if (out != NULL)
            out[o] = c;
        o++;
        need |= c == '\r';
    }
    return o;
}

/* Lays out [prefix line]... then the raw lines after them in the same buffer. The first line
 * continues what mgpu_linebuf_live already showed of it, when it showed any. */
static int emit(mgpu_linebuf_t *lb, mgpu_outbuf_t *ob, const char *prefix, const char *lines,
                size_t n, size_t nlines, const char **block, size_t *blen, const char **raw,
                size_t *rlen)
{
    size_t plen = strlen(prefix), total = n + nlines * plen, o = 0;
    const char *p = lines, *end = lines + n;
    int cont = lb->shown > 0 || lb->live;
    char *out;

    if (cont)
        total += live_layout(NULL, lb, prefix, plen, lines, n); /* a bound: \r prefixes */
    if (reserve(&ob->buf, &ob->cap, total + n) < 0)
        return -ENOMEM;
    out = ob->buf;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t l = (size_t)(nl - p) + 1;
        if (cont) {
            o += live_layout(out + o, lb, prefix, plen, p + lb->shown, l - lb->shown);
            cont = 0;
        } else {
            memcpy(out + o, prefix, plen);
            memcpy(out + o + plen, p, l);
            o += plen + l;
        }
        p += l;
    }
    lb->shown = 0;
    lb->live = lb->at_cr = 0;
    memcpy(out + o, lines, n);
    *block = out;
    *blen = o;
    if (raw != NULL) {
        *raw = out + o;
        *rlen = n;
    }
    return 0;
}

/* A line past MGPU_LINE_MAX, not held whole: what there is of it goes on now, the raw bytes
 * exactly as written (no newline added) and on the console as a line that goes on, as
 * mgpu_linebuf_live shows one: the rest follows without a prefix, unless another stream's
 * line breaks in first. */
static int emit_long(mgpu_linebuf_t *lb, mgpu_outbuf_t *ob, const char *prefix, const char **block,
                     size_t *blen, const char **raw, size_t *rlen)
{
    const size_t plen = strlen(prefix), q = lb->plen - lb->shown;
    size_t c = live_layout(NULL, lb, prefix, plen, lb->part + lb->shown, q);

    if (reserve(&ob->buf, &ob->cap, c + lb->plen) < 0)
        return -ENOMEM;
    *blen = live_layout(ob->buf, lb, prefix, plen, lb->part + lb->shown, q);
    *block = ob->buf;
    memcpy(ob->buf + *blen, lb->part, lb->plen);
    if (raw != NULL) {
        *raw = ob->buf + *blen;
        *rlen = lb->plen;
    }
    lb->at_cr = lb->part[lb->plen - 1] == '\r';
    lb->live = 1;
    lb->shown = lb->plen = 0;
    if (lb->pcap > 65536) {
        free(lb->part);
        lb->part = NULL;
        lb->pcap = 0;
    }
    return 0;
}

int mgpu_linebuf_feed(mgpu_linebuf_t *lb, mgpu_outbuf_t *ob, const char *prefix, const char *data,
                      size_t n, const char **block, size_t *blen, const char **raw, size_t *rlen)
{
    size_t nlines = 0, last = 0;

    *blen = 0;
    if (rlen != NULL)
        *rlen = 0;
    if (n == 0)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (data[i] == '\n') {
            nlines++;
            last = i + 1;
        }
    if (nlines == 0 && lb->plen + n < MGPU_LINE_MAX) {
        if (reserve(&lb->part, &lb->pcap, lb->plen + n) < 0)
            return -ENOMEM;
        memcpy(lb->part + lb->plen, data, n);
        lb->plen += n;
        return 0;
    }
    if (nlines == 0) {
        if (reserve(&lb->part, &lb->pcap, lb->plen + n) < 0)
            return -ENOMEM;
        memcpy(lb->part + lb->plen, data, n);
        lb->plen += n;
        return emit_long(lb, ob, prefix, block, blen, raw, rlen);
    }
    if (reserve(&lb->part, &lb->pcap, lb->plen + last) < 0)
        return -ENOMEM;
    memcpy(lb->part + lb->plen, data, last);
    lb->plen += last;
    if (emit(lb, ob, prefix, lb->part, lb->plen, nlines, block, blen, raw, rlen) < 0)
        return -ENOMEM;
    /* Keep the tail after the last newline as the next partial line. */
    lb->plen = n - last;
    if (lb->plen == 0 && lb->pcap > 65536) {
        free(lb->part); /* a long line passed: do not keep its memory for the next short ones */
        lb->part = NULL;
        lb->pcap = 0;
    }
    if (lb->plen > 0) {
        if (reserve(&lb->part, &lb->pcap, lb->plen) < 0)
            return -ENOMEM;
        memcpy(lb->part, data + last, lb->plen);
    }
    return 0;
}

int mgpu_linebuf_flush(mgpu_linebuf_t *lb, mgpu_outbuf_t *ob, const char *prefix,
                       const char **block, size_t *blen, const char **raw, size_t *rlen)
{
    *blen = 0;
    if (rlen != NULL)
        *rlen = 0;
    if (lb->plen == 0 && !lb->live) /* (live: a long line's start went on, its end is due) */
        return 0;
    if (reserve(&lb->part, &lb->pcap, lb->plen + 1) < 0)
        return -ENOMEM;
    lb->part[lb->plen++] = '\n';
    int rc = emit(lb, ob, prefix, lb->part, lb->plen, 1, block, blen, raw, rlen);
    lb->plen = 0;
    return rc;
}

int mgpu_linebuf_live(mgpu_linebuf_t *lb, mgpu_outbuf_t *ob, const char *prefix, int all,
                      const char **block, size_t *blen)
{
    size_t cut = lb->shown, plen = strlen(prefix), n;

    *blen = 0;
    if (all)
        cut = lb->plen;
    else
        for (size_t i = lb->plen; i > lb->shown; i--)
            if (lb->part[i - 1] == '\r') {
                cut = i;
                break;
            }
    if (cut == lb->shown)
        return 0;
    if (!lb->live) {
        /* Only '\r's so far (a bar that starts each update with one): nothing to see yet. */
        size_t i = lb->shown;
        while (i < cut && lb->part[i] == '\r')
            i++;
        if (i == cut)
            return 0;
    }
    n = live_layout(NULL, lb, prefix, plen, lb->part + lb->shown, cut - lb->shown);
    if (reserve(&ob->buf, &ob->cap, n) < 0)
        return -ENOMEM;
    *blen = live_layout(ob->buf, lb, prefix, plen, lb->part + lb->shown, cut - lb->shown);
    *block = ob->buf;
    lb->at_cr = lb->part[cut - 1] == '\r';
    lb->live = 1;
    lb->shown = cut;
    return 0;
}

void mgpu_linebuf_detach(mgpu_linebuf_t *lb)
{
    lb->live = lb->at_cr = 0;
}

size_t mgpu_linebuf_unshown(const mgpu_linebuf_t *lb)
{
    return lb->plen - lb->shown;
}

void mgpu_linebuf_free(mgpu_linebuf_t *lb)
{
    free(lb->part);
    memset(lb, 0, sizeof *lb);
}

void mgpu_outbuf_trim(mgpu_outbuf_t *ob)
{
    if (ob->cap > 262144)
        mgpu_outbuf_free(ob);
}

void mgpu_outbuf_free(mgpu_outbuf_t *ob)
{
    free(ob->buf);
    ob->buf = NULL;
    ob->cap = 0;
}
