/* status_server.h - the Unix socket a running launcher answers `mgpu-launch status` on.
 *
 * The socket is <dir>/<launcher pid>.sock, dir being $XDG_RUNTIME_DIR/mgpu when
 * XDG_RUNTIME_DIR names a folder of this user, else /tmp/mgpu-<uid>. The folder is made with
 * mode 0700 when missing and refused when it is not this user's or grants group or other
 * access: another user must not plant or read sockets there. The socket has mode 0600, and
 * each connection's peer is checked (SO_PEERCRED) as well: only this user is answered. No
 * network port is opened.
 *
 * Protocol: the client writes one JSON object on one line, {"stacks": false}; the server
 * answers with one JSON object (the job, status_client.h prints it) and closes.
 *
 * Ownership: the server owns its handles and the socket file; mgpu_status_server_close
 * closes them (the loop must run on until they are closed) and removes the file. */
#ifndef MGPU_STATUS_SERVER_H
#define MGPU_STATUS_SERVER_H

#include <stddef.h> /* size_t */
#include <uv.h>     /* uv_pipe_t */

#include "error.h" /* mgpu_err_t */

typedef struct mgpu_status_conn mgpu_status_conn_t;

/* A request arrived: answer it with mgpu_status_reply, now or later on the loop (even after
 * mgpu_status_server_close: the connection stays until then). */
typedef void (*mgpu_status_fn)(void *arg, mgpu_status_conn_t *c, int stacks);

typedef struct mgpu_status_server {
    uv_pipe_t pipe;
    int open;
    char path[108]; /* sun_path */
    mgpu_status_fn fn;
    void *arg;
    mgpu_status_conn_t *conns; /* connections not yet closed */
} mgpu_status_server_t;

/* The folders a launcher of this user may use, the one it uses first ($XDG_RUNTIME_DIR/mgpu
 * when XDG_RUNTIME_DIR is a folder of this user, then /tmp/mgpu-<uid>); returns how many. */
int mgpu_status_dirs(char dirs[2][256]);
/* Checks that dir is a folder of this user without group or other access (create 1: made
 * with mode 0700 when missing). Returns 0, -ENOENT when it is missing (create 0), or
 * MGPU_E_USAGE with err naming the folder, its owner and mode, and what is expected. */
int mgpu_status_check_dir(const char *dir, int create, mgpu_err_t *err);

/* Listens on loop; fn(arg, ...) answers. 0, or a negative code and err (the job runs on). */
int mgpu_status_server_start(mgpu_status_server_t *srv, uv_loop_t *loop, mgpu_status_fn fn,
                             void *arg, mgpu_err_t *err);
/* Sends json (copied) and closes the connection. */
void mgpu_status_reply(mgpu_status_conn_t *c, const char *json);
void mgpu_status_server_close(mgpu_status_server_t *srv);

#endif
