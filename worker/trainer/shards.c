/* shards.c - token files mapped, their headers checked, and windows read out of them. */
#include "shards.h"

#include <errno.h>    /* errno, ENOMEM */
#include <glob.h>     /* glob: fineweb_train_*.bin */
#include <setjmp.h>   /* sigjmp_buf: a read of a file cut short */
#include <signal.h>   /* sigaction, SIGBUS */
#include <stdio.h>    /* snprintf */
#include <stdlib.h>   /* malloc, free */
#include <string.h>   /* strdup, strcspn */
#include <sys/mman.h> /* mmap, munmap, madvise */
#include <sys/stat.h> /* stat: a file cut short */
#include <sys/uio.h>  /* struct iovec */
#include <unistd.h>   /* close, sysconf */

#include "atomic_file.h" /* mgpu_atomic_file_write */
#include "data.h"        /* mgpu_data_open_regular */

static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* A mapped file cut shorter while the run reads it (truncated, or rewritten in place) makes
 * the first touch of a page past its new end SIGBUS, which would end the worker with no word
 * of the file. Reading a window is guarded: the signal jumps back to the read, which fails
 * naming the file. A SIGBUS anywhere else gets what it got before: the previous disposition is
 * put back and the faulting access runs again. */
static __thread sigjmp_buf *volatile bus_guard; /* volatile: set around loads only */
static struct sigaction bus_prev;
static int bus_installed;

static void on_bus(int sig, siginfo_t *si, void *uc)
{
    (void)si;
    (void)uc;
    if (bus_guard != NULL)
        siglongjmp(*bus_guard, 1);
    sigaction(sig, &bus_prev, NULL);
}

static void install_bus_guard(void)
{
    struct sigaction sa;
    if (bus_installed)
        return;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_bus;
    /* SA_NODEFER: SIGBUS stays unblocked in the handler, so a jump out of it leaves the mask as
     * it was and the guards need not save it (sigsetjmp(.., 0): no system call a window) */
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    bus_installed = sigaction(SIGBUS, &sa, &bus_prev) == 0;
}

/* The message for a SIGBUS of f's mapping while token `token` (or, at SIZE_MAX, some byte) was
 * read: the file cut short since it was opened, or its storage failing. */
static int lost(const mgpu_shard_t *f, size_t token, mgpu_err_t *err)
{
    char where[96] = "";
    struct stat st;
    if (token != SIZE_MAX)
        snprintf(where, sizeof where, " (token %zu at byte offset %zu cannot be read)", token,
                 f->header + token * (size_t)f->width);
    if (stat(f->path, &st) == 0 && (size_t)st.st_size < f->map_len)
        return mgpu_err_set(err, MGPU_E_CONFIG,
                            "%s: the file is shorter than the %zu bytes it had when it was "
                            "opened%s: a data file must not change while a run reads it",
                            f->path, f->map_len, where);
    return mgpu_err_set(err, -EIO,
                        "%s: a read of the file failed%s (its storage failed, or the file "
                        "changed while it was read)",
                        f->path, where);
}

int mgpu_shards_guarded(const mgpu_shards_t *s, int file, int (*fn)(void *ctx, mgpu_err_t *err),
                        void *ctx, mgpu_err_t *err)
{
    sigjmp_buf jb;
    if (sigsetjmp(jb, 0) != 0) {
        bus_guard = NULL;
        return lost(&s->f[file], SIZE_MAX, err);
    }
    bus_guard = &jb;
    int rc = fn(ctx, err);
    bus_guard = NULL;
    return rc;
}

/* Maps path and reads its layout into f (path is copied). */
static int map_file(mgpu_shards_t *s, mgpu_shard_t *f, const char *path, int text, mgpu_err_t *err)
{
    size_t size;
    int fd, rc;

    memset(f, 0, sizeof *f);
    if ((f->path = strdup(path)) == NULL)
        return mgpu_err_set(err, -ENOMEM, "shards: strdup of a path failed");
    if ((rc = mgpu_data_open_regular(path, s->key, &fd, &size, err)) < 0)
        return MGPU_E_CONFIG; /* a data file's fault: the message names it */
    if (size > 0) {
        void *m = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            return mgpu_err_set(err, MGPU_E_CONFIG, "%s: mmap of %zu bytes: %s", path, size,
                                strerror(e));
        }
        f->map = m;
        f->map_len = size;
        install_bus_guard();
    }
    close(fd); /* the mapping keeps the file */
    const unsigned char *p = f->map;
    uint32_t magic = size >= 4 ? le32(p) : 0;
    if (text) {
        f->width = 1;
        f->n = size;
        return 0;
    }
    if (magic == MGPU_SHARD_MAGIC || magic == MGPU_SHARD_MAGIC_U32) {
        uint32_t want = magic == MGPU_SHARD_MAGIC ? 1 : 7;
        if (size < MGPU_SHARD_HEADER_BYTES)
            return mgpu_err_set(err, MGPU_E_CONFIG,
                                "%s: llm.c shard magic %u but %zu bytes, expected a header of "
                                "%d bytes (256 x int32) and the tokens",
                                path, magic, size, MGPU_SHARD_HEADER_BYTES);
        uint32_t version = le32(p + 4);
        int32_t count = (int32_t)le32(p + 8);
        if (version != want)
            return mgpu_err_set(err, MGPU_E_CONFIG,
                                "%s: llm.c header version %u at byte 4 with magic %u, expected "
                                "%u (%s tokens)",
                                path, version, magic, want, want == 1 ? "uint16" : "uint32");
        f->width = want == 1 ? 2 : 4;
        f->header = MGPU_SHARD_HEADER_BYTES;
        if (count < 0 || (size_t)count * (size_t)f->width + MGPU_SHARD_HEADER_BYTES != size)
            return mgpu_err_set(
                err, MGPU_E_CONFIG,
                "%s: llm.c header says %d tokens at byte 8 (%zu bytes with the "
                "header), the file has %zu bytes",
                path, count,
                (size_t)(count < 0 ? 0 : count) * (size_t)f->width + MGPU_SHARD_HEADER_BYTES, size);
        f->n = (size_t)count;
        return 0;
    }
    if (size % 2 != 0)
        return mgpu_err_set(err, MGPU_E_CONFIG,
                            "%s: %zu bytes and no llm.c header (magic %u or %u), expected whole "
                            "little-endian uint16 tokens (an even size)",
                            path, size, MGPU_SHARD_MAGIC, MGPU_SHARD_MAGIC_U32);
    f->width = 2;
    f->n = size / 2;
    return 0;
}

/* Appends one file to s->f. */
static int add_file(mgpu_shards_t *s, const char *path, int text, mgpu_err_t *err)
{
    mgpu_shard_t *g = realloc(s->f, sizeof *g * (size_t)(s->n_files + 1));
    if (g == NULL)
        return mgpu_err_set(err, -ENOMEM, "shards: realloc for %d files failed", s->n_files + 1);
    s->f = g;
    int rc = map_file(s, &g[s->n_files], path, text, err);
    s->n_files++; /* even when it failed: close releases what it holds */
    if (rc < 0)
        return rc;
    s->n_tokens += g[s->n_files - 1].n;
    return 0;
}

/* The folder glob could not read, for the message (glob reports it through a callback). */
static char glob_failed_at[512];
static int glob_errno;

static int glob_error(const char *path, int eerrno)
{
    snprintf(glob_failed_at, sizeof glob_failed_at, "%s", path);
    glob_errno = eerrno;
    return 1; /* stop: GLOB_ERR stops anyway */
}

int mgpu_shards_open(mgpu_shards_t *s, const char *spec, const char *key, int text, int vocab,
                     mgpu_err_t *err)
{
    char *copy = strdup(spec);
    int rc = 0;

    memset(s, 0, sizeof *s);
    s->vocab = vocab;
    snprintf(s->key, sizeof s->key, "%s", key);
    if (copy == NULL)
        return mgpu_err_set(err, -ENOMEM, "shards: strdup of the file list failed");
    for (char *save = NULL, *e = strtok_r(copy, ",", &save); e != NULL && rc == 0;
         e = strtok_r(NULL, ",", &save)) {
        while (*e == ' ' || *e == '\t')
            e++;
        size_t len = strlen(e);
        while (len > 0 && (e[len - 1] == ' ' || e[len - 1] == '\t'))
            e[--len] = 0;
        if (len == 0)
            continue;
        if (strcspn(e, "*?[") == len) {
            rc = add_file(s, e, text, err);
            continue;
        }
        glob_t g;
        glob_failed_at[0] = 0;
        glob_errno = 0;
        int gr = glob(e, GLOB_ERR, glob_error, &g);
        if (gr == GLOB_NOMATCH)
            rc = mgpu_err_set(err, MGPU_E_CONFIG, "%s = '%s': no file matches the pattern '%s'",
                              key, spec, e);
        else if (gr == GLOB_NOSPACE)
            rc = mgpu_err_set(err, -ENOMEM, "%s = '%s': out of memory matching the pattern '%s'",
                              key, spec, e);
        else if (gr != 0)
            rc = mgpu_err_set(err, MGPU_E_CONFIG,
                              "%s = '%s': the pattern '%s' needs the folder '%s': %s", key, spec, e,
                              glob_failed_at, strerror(glob_errno));
        for (size_t i = 0; gr == 0 && i < g.gl_pathc && rc == 0; i++)
            rc = add_file(s, g.gl_pathv[i], text, err);
        if (gr == 0 || gr == GLOB_NOMATCH)
            globfree(&g);
    }
    free(copy);
    if (rc == 0 && s->n_files == 0)
        rc = mgpu_err_set(err, MGPU_E_CONFIG, "%s = '%s': expected a file, a list or a pattern",
                          key, spec);
    if (rc < 0)
        mgpu_shards_close(s);
    return rc;
}

void mgpu_shards_close(mgpu_shards_t *s)
{
    for (int i = 0; i < s->n_files; i++) {
        if (s->f[i].map != NULL)
            munmap((void *)s->f[i].map, s->f[i].map_len);
        free(s->f[i].path);
    }
    free(s->f);
    s->f = NULL;
    s->n_files = 0;
    s->n_tokens = 0;
}

void mgpu_shards_describe(const mgpu_shards_t *s, char *buf, size_t cap)
{
    int hdr = 0, w4 = 0;
    for (int i = 0; i < s->n_files; i++) {
        hdr += s->f[i].header > 0;
        w4 += s->f[i].width == 4;
    }
    const char *kind = s->n_files > 0 && s->f[0].width == 1 ? "text"
                       : hdr == s->n_files                  ? "llm.c shard"
                       : hdr == 0                           ? "raw uint16"
                                                            : "token";
    snprintf(buf, cap, "%d %s file%s%s, %zu tokens", s->n_files, kind, s->n_files == 1 ? "" : "s",
             w4 > 0 ? " (uint32)" : "", s->n_tokens);
}

static size_t span_windows(size_t n, int context)
{
    return n > (size_t)context ? (n - 1) / (size_t)context : 0;
}

/* Appends [start, start + n) of file to w when it holds a window. */
static int add_span(mgpu_windows_t *w, int file, size_t start, size_t n, mgpu_err_t *err)
{
    w->n_tokens += n;
    size_t k = span_windows(n, w->context);
    if (k == 0)
        return 0;
    mgpu_span_t *g = realloc(w->spans, sizeof *g * (size_t)(w->n_spans + 1));
    if (g == NULL)
        return mgpu_err_set(err, -ENOMEM, "shards: realloc of %d spans failed", w->n_spans + 1);
    w->spans = g;
    g[w->n_spans++] =
        (mgpu_span_t){.file = file, .start = start, .n = n, .first_window = w->n_windows};
    w->n_windows += k;
    return 0;
}

int mgpu_windows_split(const mgpu_shards_t *s, int context, double eval_fraction,
                       mgpu_windows_t *train, mgpu_windows_t *eval, mgpu_err_t *err)
{
    size_t n_eval = (size_t)((double)s->n_tokens * eval_fraction + 0.5), seen = 0;
    int rc = 0;

    if (n_eval > s->n_tokens)
        n_eval = s->n_tokens;
    size_t n_train = s->n_tokens - n_eval;
    *train = (mgpu_windows_t){.s = s, .context = context};
    *eval = (mgpu_windows_t){.s = s, .context = context};
    for (int i = 0; i < s->n_files && rc == 0; i++) {
        size_t n = s->f[i].n, a = seen, b = seen + n; /* this file's tokens in the whole */
        if (a < n_train)
            rc = add_span(train, i, 0, (b < n_train ? b : n_train) - a, err);
        if (rc == 0 && b > n_train) {
            size_t from = a > n_train ? 0 : n_train - a;
            rc = add_span(eval, i, from, n - from, err);
        }
        seen = b;
    }
    if (rc < 0) {
        mgpu_windows_free(train);
        mgpu_windows_free(eval);
    }
    return rc;
}

void mgpu_windows_free(mgpu_windows_t *w)
{
    free(w->spans);
    w->spans = NULL;
    w->n_spans = 0;
    w->n_windows = 0;
    w->n_tokens = 0;
}

/* The bytes [p, p + len) leave this process's page tables; the page cache keeps them. */
static void drop_pages(const unsigned char *p, size_t len)
{
    const long page = sysconf(_SC_PAGESIZE); /* glibc reads it from the auxiliary vector */
    uintptr_t a = (uintptr_t)p & ~((uintptr_t)page - 1);
    uintptr_t b = ((uintptr_t)p + len + (uintptr_t)page - 1) & ~((uintptr_t)page - 1);
    /* Only advice: a failure leaves the pages mapped, which costs memory and nothing else. */
    (void)madvise((void *)a, b - a, MADV_DONTNEED);
}

int mgpu_windows_read(const mgpu_windows_t *w, size_t win, int32_t *tok, int32_t *tgt,
                      mgpu_err_t *err)
{
    const int T = w->context;
    int lo = 0, hi = w->n_spans - 1;

    if (win >= w->n_windows)
        return mgpu_err_set(err, -EINVAL, "shards: window %zu of %zu", win, w->n_windows);
    while (lo < hi) { /* the last span whose first window is at or before win */
        int mid = (lo + hi + 1) / 2;
        if (w->spans[mid].first_window <= win)
            lo = mid;
        else
            hi = mid - 1;
    }
    const mgpu_span_t *sp = &w->spans[lo];
    const mgpu_shard_t *f = &w->s->f[sp->file];
    size_t first = sp->start + (win - sp->first_window) * (size_t)T;
    const unsigned char *p = f->map + f->header + first * (size_t)f->width;
    sigjmp_buf jb;
    volatile int at = 0; /* the token being read when a SIGBUS jumps back */
    if (sigsetjmp(jb, 0) != 0) {
        bus_guard = NULL;
        return lost(f, first + (size_t)at, err);
    }
    bus_guard = &jb;
    for (int i = 0; i <= T; i++) {
        const unsigned char *q = p + (size_t)i * (size_t)f->width;
        at = i;
        uint32_t id = f->width == 1   ? q[0]
                      : f->width == 2 ? (uint32_t)q[0] | (uint32_t)q[1] << 8
                                      : le32(q);
        if (id >= (uint32_t)w->s->vocab) {
            bus_guard = NULL;
            drop_pages(p, (size_t)(T + 1) * (size_t)f->width);
            return mgpu_err_set(err, MGPU_E_CONFIG,
                                "%s: token %u at position %zu (byte offset %zu), expected below "
                                "vocab = %d",
                                f->path, id, first + (size_t)i,
                                f->header + (first + (size_t)i) * (size_t)f->width, w->s->vocab);
        }
        if (tok != NULL && i < T)
            tok[i] = (int32_t)id;
        if (tgt != NULL && i > 0)
            tgt[i - 1] = (int32_t)id;
    }
    bus_guard = NULL;
    drop_pages(p, (size_t)(T + 1) * (size_t)f->width);
    return 0;
}

int mgpu_shards_write(const char *path, const int32_t *ids, size_t n, int *version, mgpu_err_t *err)
{
    int32_t max = 0;
    for (size_t i = 0; i < n; i++)
        max = ids[i] > max ? ids[i] : max;
    if (n > INT32_MAX)
        return mgpu_err_set(err, MGPU_E_CONFIG,
                            "%s: %zu tokens, more than an llm.c header counts (%d)", path, n,
                            INT32_MAX);
    const int wide = max > 0xffff, width = wide ? 4 : 2;
    unsigned char *buf = malloc(MGPU_SHARD_HEADER_BYTES + (size_t)width * (n ? n : 1));
    if (buf == NULL)
        return mgpu_err_set(err, -ENOMEM, "shards: malloc for %zu tokens failed", n);
    memset(buf, 0, MGPU_SHARD_HEADER_BYTES);
    uint32_t hdr[3] = {wide ? MGPU_SHARD_MAGIC_U32 : MGPU_SHARD_MAGIC, wide ? 7 : 1, (uint32_t)n};
    for (int i = 0; i < 3; i++)
        for (int b = 0; b < 4; b++)
            buf[4 * i + b] = (unsigned char)(hdr[i] >> (8 * b));
    unsigned char *p = buf + MGPU_SHARD_HEADER_BYTES;
    for (size_t i = 0; i < n; i++)
        for (int b = 0; b < width; b++)
            p[(size_t)width * i + (size_t)b] = (unsigned char)((uint32_t)ids[i] >> (8 * b));
    struct iovec iov = {.iov_base = buf, .iov_len = MGPU_SHARD_HEADER_BYTES + (size_t)width * n};
    int rc = mgpu_atomic_file_write(path, &iov, 1, 0, err);
    free(buf);
    if (rc == 0 && version != NULL)
        *version = (int)hdr[1];
    return rc;
}
