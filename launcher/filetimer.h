/* filetimer.h - torchrun's expiration timers: the server side of PyTorch's file-based timer
 * protocol (torch.distributed.elastic.timer.FileTimerClient, used by `expires(after=...)`).
 *
 * With TORCHELASTIC_ENABLE_FILE_TIMER=1 in the launcher's environment, the launcher makes a
 * FIFO (in a private 0700 folder, or at TORCHELASTIC_TIMER_FILE when the user set one, as
 * torchrun does) and every worker gets its path in TORCHELASTIC_TIMER_FILE. A worker writes
 * one JSON request a line: {"version": 1, "pid": P, "scope_id": S, "expiration_time": T,
 * "signal": N}; T is a wall-clock time (time.time()), and a negative T releases the scope.
 * When a scope of pid P expires, P gets the signal of its earliest expired scope (none when
 * that is 0 or less) and every scope of P is dropped, as torchrun's server does - but only when
 * P is a worker of this job or one of its descendants. A line goes to stderr, and to the
 * worker's note for the failure report. Malformed requests are ignored with a warning.
 *
 * The module owns its handles on the caller's loop; mgpu_filetimer_close closes them, removes
 * the FIFO (and its folder) and frees the module once they are closed. */
#ifndef MGPU_FILETIMER_H
#define MGPU_FILETIMER_H

#include <sys/types.h> /* pid_t */
#include <uv.h>        /* uv_loop_t */

#include "error.h" /* mgpu_err_t */

typedef struct mgpu_filetimer mgpu_filetimer_t;

typedef struct mgpu_filetimer_hooks {
    /* The local index of the running worker whose pid is pid, with its global rank, or -1. */
    int (*worker_of)(void *arg, pid_t pid, int *rank);
    /* A scope of worker k (or of a descendant of it) expired; line says what was done. */
    void (*expired)(void *arg, int k, const char *line);
    void *arg;
} mgpu_filetimer_hooks_t;

/* Starts the server on loop when environ_ has TORCHELASTIC_ENABLE_FILE_TIMER=1: *out is the
 * module, else NULL (nothing to do). 0, or a negative code and err (the FIFO could not be
 * made). hooks is copied. */
int mgpu_filetimer_open(uv_loop_t *loop, char **environ_, const mgpu_filetimer_hooks_t *hooks,
                        mgpu_filetimer_t **out, mgpu_err_t *err);

/* The environment workers start from: environ_ as given to open, with TORCHELASTIC_TIMER_FILE
 * set to the FIFO. Owned by the module; valid until close. */
char **mgpu_filetimer_environ(const mgpu_filetimer_t *ft);

/* The FIFO's path. */
const char *mgpu_filetimer_path(const mgpu_filetimer_t *ft);
/* The private folder made for the FIFO, "" when the user named the FIFO's path. */
const char *mgpu_filetimer_dir(const mgpu_filetimer_t *ft);

/* Stops serving (see above). NULL does nothing. */
void mgpu_filetimer_close(mgpu_filetimer_t *ft);

#endif
