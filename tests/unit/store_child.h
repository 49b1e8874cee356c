/* store_child.h - a store server (launcher/store_server.c) in a child process, for the tests
 * of the collectives that meet through it. Included by test files after check.h, with
 * store_server.h and <uv.h>. store_start returns the child's pid and sets *port;
 * store_stop kills and reaps it. */
#ifndef MGPU_TEST_STORE_CHILD_H
#define MGPU_TEST_STORE_CHILD_H

#include <signal.h>   /* kill */
#include <stdio.h>    /* printf */
#include <sys/wait.h> /* waitpid */
#include <unistd.h>   /* fork, pipe */
#include <uv.h>       /* uv_loop_t: the server's loop */

#include "store_server.h" /* mgpu_store_server_start */

static inline pid_t store_start(int *port)
{
    int fds[2];
    pid_t pid;

    CHECK_INT(pipe(fds), 0);
    fflush(stdout);
    pid = fork();
    if (pid == 0) {
        uv_loop_t loop;
        mgpu_store_server_t *srv = NULL;
        mgpu_err_t err = {0, ""};
        uv_loop_init(&loop);
        if (mgpu_store_server_start(&loop, NULL, &srv, &err) < 0) {
            printf("  store: %s\n", err.msg);
            _exit(1);
        }
        int p = mgpu_store_server_port(srv);
        if (write(fds[1], &p, sizeof p) != sizeof p)
            _exit(1);
        uv_run(&loop, UV_RUN_DEFAULT);
        _exit(0);
    }
    close(fds[1]);
    *port = 0;
    CHECK_INT(read(fds[0], port, sizeof *port), (long)sizeof *port);
    close(fds[0]);
    return pid;
}

static inline void store_stop(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

#endif
