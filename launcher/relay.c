/* relay.c - the workers' output on its way out (supervisor_impl.h): each stream's bytes
 * into whole prefixed lines for the console, the per-rank log file and the failure report's
 * tail, and the partial lines on the console (a progress bar's '\r' updates at once, any other
 * after the console's quiet time without more bytes: console.h). */
#include "supervisor_impl.h"

#include <errno.h>     /* EINTR, errno */
#include <stdio.h>     /* snprintf */
#include <string.h>    /* memchr, memmove, strerror, strrchr */
#include <sys/ioctl.h> /* FIONREAD */
#include <sys/uio.h>   /* writev */
#include <unistd.h>    /* close, read */

#include "fdio.h" /* mgpu_fdio_write_all */
#include "log.h"  /* mgpu_error, mgpu_warn */

static void console_put(stream_t *st, const char *block, size_t blen)
{
    mgpu_console_put(&st->proc->sup->con, st->console_fd, &st->lb, block, blen);
}

static int stream_live(const stream_t *st)
{
    return mgpu_console_live(&st->proc->sup->con, st->console_fd);
}

/* A log file that took no more bytes (a full disk, a quota, an I/O error): said once, naming
 * the file, and closed; where the console shows the stream (shown), it still does. dir_of is a
 * file in the log's folder (the rank's error.json), levels the folders above it to go up. */
static void log_lost(int *fd, const char *dir_of, int levels, const char *name, int e,
                     const char *whose, int shown)
{
    char path[2500];
    int n = snprintf(path, sizeof path, "%s", dir_of);

    for (int i = 0; i <= levels && n > 0; i++) {
        char *slash = strrchr(path, '/');
        n = slash != NULL ? (int)(slash - path) : 0;
        path[n] = '\0';
    }
    mgpu_warn("%s%s%s: %s; %s's output from here on is not in it%s", path, n > 0 ? "/" : "", name,
              strerror(-e), whose, shown ? " (the console still shows it)" : "");
    close(*fd);
    *fd = -1;
}

static void push_tail(mgpu_outcome_t *o, const char *raw, size_t n)
{
    const char *p = raw, *end = raw + n;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t l = nl ? (size_t)(nl - p) : (size_t)(end - p);
        if (o->ntail == MGPU_TAIL_LINES) {
            memmove(o->tail[0], o->tail[1], sizeof o->tail[0] * (MGPU_TAIL_LINES - 1));
            o->ntail--;
        }
        snprintf(o->tail[o->ntail++], sizeof o->tail[0], "%.*s", (int)(l > 255 ? 255 : l), p);
        p += l + 1;
    }
}

static void on_stream_closed(uv_handle_t *h)
{
    stream_t *st = h->data;
    sup_t *s = st->proc->sup;
    mgpu_linebuf_free(&st->lb);
    if (st->file_fd >= 0)
        close(st->file_fd);
    st->file_fd = -1;
    st->open = 0;
    s->open_streams--;
    mgpu_sup_maybe_finish(s);
}

/* --duplicate_std{out,err}_filters: the lines of raw (each ending with '\n') that contain a
 * filter's substring, with the rank's prefix as on the console, to the attempt's filtered log.
 * One writev a line: with O_APPEND, lines of different ranks never tear. */
static void duplicate_filtered(stream_t *st, const char *raw, size_t rlen)
{
    sup_t *s = st->proc->sup;
    const mgpu_line_filters_t *f = &s->plan->output.dup[st->which - 1];
    int fd = s->filtered_fd[st->which - 1];
    const char *p = raw, *end = raw + rlen;

    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t l = nl ? (size_t)(nl - p) + 1 : (size_t)(end - p);
        if (mgpu_line_filters_match(f, p, l)) {
            struct iovec iov[2] = {{st->proc->prefix, strlen(st->proc->prefix)}, {(void *)p, l}};
            ssize_t w = writev(fd, iov, 2);
            int e = w < 0 ? -errno : 0;
            /* a short write (a signal, a disk just full): the rest as it can go */
            if (w >= 0 && (size_t)w < iov[0].iov_len + l) {
                size_t done = (size_t)w;
                if (done < iov[0].iov_len)
                    e = mgpu_fdio_write_all(fd, (const char *)iov[0].iov_base + done,
                                            iov[0].iov_len - done);
                done = done > iov[0].iov_len ? done - iov[0].iov_len : 0;
                if (e == 0)
                    e = mgpu_fdio_write_all(fd, p + done, l - done);
            }
            if (e < 0 && e != -EINTR) {
                log_lost(&s->filtered_fd[st->which - 1], st->proc->out->error_file, 1,
                         st->which == 1 ? "filtered_stdout.log" : "filtered_stderr.log", e,
                         "every rank", 1);
                return;
            }
        }
        p += l;
    }
}

static void deliver(stream_t *st, const char *block, size_t blen, const char *raw, size_t rlen)
{
    /* blen may be 0 with a whole line in raw: its newline already reached the console. */
    if (rlen == 0)
        return;
    mgpu_watch_lines(st->proc, raw, rlen);
    if (st->which == 2 || st->both)
        push_tail(st->proc->out, raw, rlen);
    if (st->file_fd >= 0) {
        int e = mgpu_fdio_write_all(st->file_fd, raw, rlen);
        if (e < 0) {
            char whose[32];
            snprintf(whose, sizeof whose, "rank %d", st->proc->out->rank);
            log_lost(&st->file_fd, st->proc->out->error_file, 0,
                     st->which == 1 ? "stdout.log" : "stderr.log", e, whose, st->console_fd >= 0);
        }
    }
    /* torchrun copies the lines it shows (tee'd streams); mgpu shows every stream that is not
     * redirected or filtered out, and copies from them all. */
    if (st->console_fd >= 0 && st->proc->sup->filtered_fd[st->which - 1] >= 0)
        duplicate_filtered(st, raw, rlen);
    console_put(st, block, blen);
}

/* Shows the unfinished line's new bytes on a live console: up to its last '\r' (all = 0), or
 * all of them (all = 1, the stream went quiet). */
static void show_partial(stream_t *st, int all)
{
    const char *block;
    size_t blen;

    if (mgpu_linebuf_live(&st->lb, &st->proc->sup->ob, st->proc->prefix, all, &block, &blen) == 0)
        console_put(st, block, blen);
}

void mgpu_relay_quiet(uv_timer_t *t)
{
    sup_t *s = t->data;
    uint64_t now = uv_now(&s->loop), wait = 0;

    for (int k = 0; k < s->nproc; k++)
        for (int i = 0; i < 2; i++) {
            stream_t *st = &s->procs[k].s[i];
            int fd, unread = 0;
            uint64_t w = 0, quiet = (uint64_t)mgpu_console_quiet_ms(&s->con, st->console_fd);
            if (!st->open || !stream_live(st) || mgpu_linebuf_unshown(&st->lb) == 0)
                continue;
            /* Bytes waiting in the pipe mean the launcher was busy, not that the worker
             * paused: read them first. */
            if (uv_fileno((uv_handle_t *)&st->pipe, &fd) == 0 &&
                ioctl(fd, FIONREAD, &unread) == 0 && unread > 0)
                w = quiet;
            else if (now - st->t_last < quiet)
                w = quiet - (now - st->t_last);
            else
                show_partial(st, 1);
            if (w > 0 && (wait == 0 || w < wait))
                wait = w;
        }
    if (wait > 0)
        uv_timer_start(t, mgpu_relay_quiet, wait, 0);
}

void mgpu_relay_close(stream_t *st)
{
    const char *block, *raw;
    size_t blen, rlen;

    if (!st->open || uv_is_closing((uv_handle_t *)&st->pipe))
        return;
    if (mgpu_linebuf_flush(&st->lb, &st->proc->sup->ob, st->proc->prefix, &block, &blen, &raw,
                           &rlen) == 0)
        deliver(st, block, blen, raw, rlen);
    mgpu_outbuf_trim(&st->proc->sup->ob);
    mgpu_console_forget(&st->proc->sup->con, &st->lb);
    uv_close((uv_handle_t *)&st->pipe, on_stream_closed);
}

void mgpu_relay_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
    stream_t *st = h->data;
    buf->base = st->proc->sup->rbuf;
    buf->len = sizeof st->proc->sup->rbuf;
}

/* n bytes that st's worker wrote: whole lines out, the unfinished one kept (or shown). */
static void take(stream_t *st, const char *p, size_t n)
{
    const char *block, *raw;
    size_t blen, rlen;

    if (mgpu_linebuf_feed(&st->lb, &st->proc->sup->ob, st->proc->prefix, p, n, &block, &blen, &raw,
                          &rlen) < 0) {
        mgpu_error("out of memory buffering output of local rank %d", st->proc->k);
        return;
    }
    deliver(st, block, blen, raw, rlen);
    if (stream_live(st)) {
        show_partial(st, 0);
        if (mgpu_linebuf_unshown(&st->lb) > 0) {
            sup_t *s = st->proc->sup;
            st->t_last = uv_now(&s->loop);
            if (!uv_is_active((uv_handle_t *)&s->quiet_timer))
                uv_timer_start(&s->quiet_timer, mgpu_relay_quiet,
                               (uint64_t)mgpu_console_quiet_ms(&s->con, st->console_fd), 0);
        }
    }
    mgpu_outbuf_trim(&st->proc->sup->ob);
}

/* What is left in st's descriptor, read up to its end (0, or EIO on a pseudo-terminal whose
 * worker side is closed) or EAGAIN. libuv before 1.52 (Debian 12 has 1.44) reports UV_EOF
 * without reading again once the descriptor has signalled a hangup and a read came back
 * short, but a pseudo-terminal's master signals the hangup while it still holds more of what
 * the worker wrote just before it exited (libuv upstream fixed it in commit 2e2114ed8): a worker
 * that wrote a lot and ended lost its last thousand lines or so. The descriptor is non-blocking
 * (uv_pipe_open). */
static void drain(stream_t *st)
{
    uv_os_fd_t fd;
    char *buf = st->proc->sup->rbuf;
    const size_t cap = sizeof st->proc->sup->rbuf;

    if (uv_fileno((uv_handle_t *)&st->pipe, &fd) != 0)
        return;
    for (;;) {
        ssize_t r = read(fd, buf, cap);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return;
        take(st, buf, (size_t)r);
    }
}

void mgpu_relay_read(uv_stream_t *h, ssize_t n, const uv_buf_t *buf)
{
    stream_t *st = h->data;

    if (n < 0) {
        /* UV_EOF, or an error (a pty's master reads EIO once the worker's side is closed):
         * either way the stream is done, once what the descriptor still holds is read */
        if (n == UV_EOF)
            drain(st);
        mgpu_relay_close(st);
        return;
    }
    if (n > 0)
        take(st, buf->base, (size_t)n);
}
