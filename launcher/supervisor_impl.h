/* supervisor_impl.h - the supervisor's state, shared by supervisor.c (workers, signals,
 * teardown, restarts) and relay.c (the workers' output on its way to the console and the log
 * files). Private to those two files: nothing else includes it. */
#ifndef MGPU_SUPERVISOR_IMPL_H
#define MGPU_SUPERVISOR_IMPL_H

#include <stdint.h> /* uint64_t */
#include <uv.h>     /* the event loop */

#include "cgroup.h"        /* mgpu_cgroup_t */
#include "console.h"       /* mgpu_console_t */
#include "filetimer.h"     /* mgpu_filetimer_t */
#include "output.h"        /* mgpu_linebuf_t, mgpu_outbuf_t */
#include "ptys.h"          /* mgpu_ptys_t */
#include "spawner.h"       /* mgpu_spawner_keeper_t */
#include "status_server.h" /* mgpu_status_server_t */
#include "supervisor.h"    /* mgpu_run_result_t, mgpu_outcome_t */

/* The most signals the launcher handles: --signals_to_handle's, SIGUSR1, SIGUSR2, SIGCHLD. */
#define MGPU_SUP_MAX_SIGS 16

struct proc;

typedef struct stream {
    uv_pipe_t pipe;
    struct proc *proc;
    int which;       /* 1 stdout, 2 stderr */
    int console_fd;  /* 1 or 2, -1 when --local_ranks_filter hides this rank */
    int file_fd;     /* per-rank log file, -1 when none */
    int open;        /* the handle is initialised and not yet closed */
    int pty;         /* the worker writes to a pseudo-terminal (the handle reads its master) */
    int both;        /* stdout's stream carries stderr too: one terminal for both (s[1] unused) */
    uint64_t t_last; /* uv_now of the last read, for the quiet-time flush */
    mgpu_linebuf_t lb;
} stream_t;

typedef struct proc {
    struct sup *sup;
    int k;
    pid_t pid;
    int running;
    uint64_t lines;     /* output lines so far (progress, for stall detection) */
    int64_t line_ns;    /* CLOCK_MONOTONIC of the last one */
    char last_line[96]; /* its start */
    char prefix[300];
    stream_t s[2];
    mgpu_outcome_t *out;
} proc_t;

typedef struct sup {
    uv_loop_t loop;
    uv_signal_t sigs[MGPU_SUP_MAX_SIGS];
    int sig_nums[MGPU_SUP_MAX_SIGS]; /* the signal of each handle */
    int nsigs;
    uv_timer_t grace_timer, drain_timer;
    uv_timer_t quiet_timer; /* flushes partial lines of streams gone quiet (live consoles) */
    uv_signal_t winch;      /* the launcher's terminal changed size: the workers' ptys follow */
    mgpu_plan_t *plan;      /* an elastic restart changes its world */
    mgpu_run_result_t *res;
    proc_t *procs;
    int nproc;
    int attempt;
    int running;      /* workers of this attempt still alive */
    int open_streams; /* stream handles not yet closed */
    int stopping;     /* the launcher has started stopping this attempt */
    int killed;       /* SIGKILL sent to everything left */
    int swept;        /* leftovers of exited workers were signalled */
    int drained;      /* the drain timer gave up on pipes held outside the launcher's reach */
    int user_signal;  /* a terminating signal the launcher received */
    int root;         /* first failure of this attempt, -1 */
    int finished;
    mgpu_console_t con;           /* the launcher's stdout and stderr */
    mgpu_spawner_keeper_t keeper; /* ends the job and removes its files if the launcher dies */
    mgpu_cgroup_t cg;             /* the job's cgroup; cg.path "" when none could be made */
    /* Shared by every stream: libuv calls on_read right after on_alloc, and a block of lines
     * is written before the next read, so one of each serves all workers (and keeps the
     * launcher small however many workers write at once). */
    char rbuf[65536];
    mgpu_outbuf_t ob;
    mgpu_rdzv_t *rdzv;           /* the launchers' rendezvous */
    int multi;                   /* several nodes: failures and attempt ends go through the store */
    int elastic;                 /* --nnodes MIN:MAX: each restart is a new rendezvous round */
    int restarts;                /* failures restarted from (TORCHELASTIC_RESTART_COUNT) */
    int in_round;                /* an elastic rendezvous runs on the thread pool */
    int ending;                  /* this node's attempt is over; waiting for the other nodes */
    int pending_work;            /* rendezvous calls on the thread pool */
    int reports_pending;         /* failure reports not yet in the store: the attempt's end waits */
    uv_timer_t stall_timer;      /* checks progress (--stall_timeout) */
    mgpu_stall_rank_t *stall;    /* nproc entries */
    int stall_active;            /* a stall was reported and no rank has moved since */
    int stall_count;             /* reports in this attempt */
    int stall_pending;           /* reports waiting for their stacks */
    mgpu_status_server_t status; /* `mgpu-launch status` */

    mgpu_filetimer_t *ft; /* torchrun's expiration timers, NULL when not enabled */
    int filtered_fd[2];   /* this attempt's filtered_std{out,err}.log, -1 when none */
    /* The next attempt's streams: each one's pseudo-terminal in ptys (-1: a pipe), opened
     * from plan_streams on (ptys.h) */
    int (*pty_slot)[2]; /* nproc entries */
    mgpu_ptys_t ptys;
    int streams_ready; /* plan_streams ran for the next attempt */
} sup_t;

/* relay.c: reading a worker's stream (libuv callbacks), and closing it. */
void mgpu_relay_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf);
void mgpu_relay_read(uv_stream_t *h, ssize_t n, const uv_buf_t *buf);
void mgpu_relay_close(stream_t *st);
/* The quiet-time flush of partial lines on a live console (sup_t's quiet_timer). */
void mgpu_relay_quiet(uv_timer_t *t);

/* supervisor.c: starting an attempt's workers; stopping them (sig now, SIGKILL after the grace
 * period); closing the loop's handles when the run ends. */
int mgpu_sup_start_attempt(sup_t *s, mgpu_err_t *err);
void mgpu_sup_stop_group(sup_t *s, int sig);
void mgpu_sup_close_handles(sup_t *s);

/* attempts.c: rendezvous calls on the thread pool (kind: MGPU_SUP_RW_*, f for a report); a
 * failure of this node told to the others; an attempt's world recorded at its start; an
 * attempt over everywhere, restarted or finished. */
enum { MGPU_SUP_RW_WATCH, MGPU_SUP_RW_REPORT, MGPU_SUP_RW_END, MGPU_SUP_RW_ROUND };
void mgpu_sup_rdzv_work(sup_t *s, int kind, const mgpu_rdzv_failure_t *f);
void mgpu_sup_report_failure(sup_t *s, int rank, int local_rank, int code);
void mgpu_sup_record_world(sup_t *s);
void mgpu_sup_attempt_done(sup_t *s, int failed, const mgpu_rdzv_failure_t *rf);

/* supervisor.c: the attempt may be over (a worker exited, a stream closed, ...). */
void mgpu_sup_maybe_finish(sup_t *s);
/* supervisor.c: local rank k is the attempt's root failure (a stall): the group stops as on
 * a failure, and the other nodes hear of it with code. */
void mgpu_sup_fail(sup_t *s, int k, int code);

/* watch.c: stall detection (--stall_timeout). init once (0 or a negative code), attempt at
 * each attempt's start once the workers run, close with the loop's other handles. serve
 * opens the status socket (status_server.h), once, after the first attempt's workers were
 * started: a failure to open it is a warning. */
int mgpu_watch_init(sup_t *s, mgpu_err_t *err);
void mgpu_watch_serve(sup_t *s);
void mgpu_watch_attempt(sup_t *s);
void mgpu_watch_close(sup_t *s);
/* relay.c tells of whole output lines (raw: n bytes, one or more lines) of local rank p. */
void mgpu_watch_lines(proc_t *p, const char *raw, size_t n);

#endif
