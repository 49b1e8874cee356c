/* status_server.c - the launcher's status socket (see status_server.h). */
#include "status_server.h"

#include <cjson/cJSON.h> /* the request */
#include <errno.h>       /* errno */
#include <stdio.h>       /* snprintf */
#include <stdlib.h>      /* calloc */
#include <string.h>      /* memchr */
#include <sys/socket.h>  /* socket, SO_PEERCRED */
#include <sys/stat.h>    /* lstat, mkdir, umask */
#include <sys/un.h>      /* sockaddr_un */
#include <unistd.h>      /* getuid, unlink */

#include "log.h" /* mgpu_warn */

struct mgpu_status_conn {
    uv_pipe_t pipe;
    mgpu_status_server_t *srv;
    mgpu_status_conn_t *next;
    int asked;   /* the request was handed to srv->fn: the reply closes the connection */
    int closing; /* uv_close called */
    uv_write_t wr;
    char *out;
    size_t n;
    char in[1024];
};

int mgpu_status_dirs(char dirs[2][256])
{
    const char *x = getenv("XDG_RUNTIME_DIR");
    struct stat st;
    int n = 0;

    if (x != NULL && x[0] == '/' && strlen(x) < 200 && stat(x, &st) == 0 && S_ISDIR(st.st_mode) &&
        st.st_uid == getuid() && access(x, W_OK | X_OK) == 0)
        snprintf(dirs[n++], 256, "%s/mgpu", x);
    snprintf(dirs[n++], 256, "/tmp/mgpu-%d", (int)getuid());
    return n;
}

int mgpu_status_check_dir(const char *dir, int create, mgpu_err_t *err)
{
    struct stat st;

    if (create && mkdir(dir, 0700) != 0 && errno != EEXIST)
        return mgpu_err_set(err, -errno, "mkdir(%s): %s", dir, strerror(errno));
    if (lstat(dir, &st) != 0)
        return errno == ENOENT ? -ENOENT
                               : mgpu_err_set(err, -errno, "lstat(%s): %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return mgpu_err_set(err, MGPU_E_USAGE,
                            "%s is not a folder (a link or a file): expected a folder of uid %d "
                            "with mode 0700",
                            dir, (int)getuid());
    if (st.st_uid != getuid() || (st.st_mode & 077) != 0)
        return mgpu_err_set(err, MGPU_E_USAGE,
                            "%s belongs to uid %d and has mode %04o: expected uid %d and mode 0700 "
                            "(no group or other access)",
                            dir, (int)st.st_uid, (unsigned)(st.st_mode & 07777), (int)getuid());
    return 0;
}

static void conn_closed(uv_handle_t *h)
{
    mgpu_status_conn_t *c = h->data, **pp = &c->srv->conns;

    while (*pp != NULL && *pp != c)
        pp = &(*pp)->next;
    if (*pp == c)
        *pp = c->next;
    free(c->out);
    free(c);
}

static void conn_close(mgpu_status_conn_t *c)
{
    if (c->closing)
        return;
    c->closing = 1;
    uv_close((uv_handle_t *)&c->pipe, conn_closed);
}

static void on_written(uv_write_t *w, int status)
{
    (void)status;
    conn_close(w->data);
}

void mgpu_status_reply(mgpu_status_conn_t *c, const char *json)
{
    size_t n = strlen(json);
    uv_buf_t b;

    if (c->closing || c->out != NULL)
        return;
    c->out = malloc(n + 1);
    if (c->out == NULL) {
        conn_close(c);
        return;
    }
    memcpy(c->out, json, n);
    c->out[n] = '\n';
    b = uv_buf_init(c->out, (unsigned)(n + 1));
    c->wr.data = c;
    if (uv_write(&c->wr, (uv_stream_t *)&c->pipe, &b, 1, on_written) < 0)
        conn_close(c);
}

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
    mgpu_status_conn_t *c = h->data;
    (void)hint;
    buf->base = c->in + c->n;
    buf->len = sizeof c->in - c->n - 1;
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    mgpu_status_conn_t *c = s->data;
    cJSON *req;
    int stacks = 0;

    (void)buf;
    if (nread < 0) {
        conn_close(c); /* gone before it asked */
        return;
    }
    c->n += (size_t)nread;
    c->in[c->n] = '\0';
    if (memchr(c->in, '\n', c->n) == NULL && c->n < sizeof c->in - 1)
        return;
    uv_read_stop(s);
    req = cJSON_ParseWithOpts(c->in, NULL, 0);
    if (req == NULL || !cJSON_IsObject(req)) {
        cJSON_Delete(req);
        mgpu_status_reply(c, "{\"error\": \"expected one JSON object on one line\"}");
        return;
    }
    stacks = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(req, "stacks"));
    cJSON_Delete(req);
    c->asked = 1;
    c->srv->fn(c->srv->arg, c, stacks);
}

static void on_connection(uv_stream_t *l, int status)
{
    mgpu_status_server_t *srv = l->data;
    mgpu_status_conn_t *c;
    struct ucred cred;
    socklen_t clen = sizeof cred;
    int fd;

    if (status < 0 || (c = calloc(1, sizeof *c)) == NULL)
        return;
    c->srv = srv;
    c->next = srv->conns;
    srv->conns = c;
    uv_pipe_init(l->loop, &c->pipe, 0);
    c->pipe.data = c;
    if (uv_accept(l, (uv_stream_t *)&c->pipe) != 0) {
        conn_close(c);
        return;
    }
    /* The socket's mode keeps other users out; this keeps them out should the mode be
     * loosened by hand. */
    if (uv_fileno((uv_handle_t *)&c->pipe, &fd) != 0 ||
        getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0 || cred.uid != getuid()) {
        mgpu_warn("status socket %s: refused a connection from uid %d (only uid %d is answered)",
                  srv->path, (int)cred.uid, (int)getuid());
        conn_close(c);
        return;
    }
    uv_read_start((uv_stream_t *)&c->pipe, on_alloc, on_read);
}

int mgpu_status_server_start(mgpu_status_server_t *srv, uv_loop_t *loop, mgpu_status_fn fn,
                             void *arg, mgpu_err_t *err)
{
    char dirs[2][256];
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    mode_t old;
    int fd, rc;

    memset(srv, 0, sizeof *srv);
    srv->fn = fn;
    srv->arg = arg;
    mgpu_status_dirs(dirs);
    if ((rc = mgpu_status_check_dir(dirs[0], 1, err)) < 0)
        return rc;
    if ((size_t)snprintf(srv->path, sizeof srv->path, "%s/%d.sock", dirs[0], (int)getpid()) >=
        sizeof srv->path)
        return mgpu_err_set(err, -ENAMETOOLONG, "status socket %s/%d.sock: path too long", dirs[0],
                            (int)getpid());
    memcpy(sa.sun_path, srv->path, strlen(srv->path) + 1);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return mgpu_err_set(err, -errno, "socket(AF_UNIX): %s", strerror(errno));
    unlink(srv->path); /* a launcher with this pid is gone: its socket is stale */
    /* 0600 from the start: no moment when another user could connect */
    old = umask(0177);
    rc = bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 ? -errno : 0;
    umask(old);
    if (rc == 0 && (chmod(srv->path, 0600) != 0 || listen(fd, 16) != 0))
        rc = -errno;
    if (rc < 0) {
        close(fd);
        unlink(srv->path);
        return mgpu_err_set(err, rc, "status socket %s: %s", srv->path, strerror(-rc));
    }
    uv_pipe_init(loop, &srv->pipe, 0);
    srv->pipe.data = srv;
    srv->open = 1;
    if ((rc = uv_pipe_open(&srv->pipe, fd)) < 0 ||
        (rc = uv_listen((uv_stream_t *)&srv->pipe, 16, on_connection)) < 0) {
        mgpu_status_server_close(srv);
        return mgpu_err_set(err, rc, "uv_listen(%s): %s", srv->path, uv_strerror(rc));
    }
    return 0;
}

void mgpu_status_server_close(mgpu_status_server_t *srv)
{
    if (!srv->open)
        return;
    srv->open = 0;
    unlink(srv->path);
    uv_close((uv_handle_t *)&srv->pipe, NULL);
    /* A request being answered (stacks on their way) closes with its reply. */
    for (mgpu_status_conn_t *c = srv->conns; c != NULL; c = c->next)
        if (!c->asked || c->out != NULL)
            conn_close(c);
}
