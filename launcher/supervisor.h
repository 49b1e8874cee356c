/* supervisor.h - start the planned workers and watch them on one libuv loop.
 *
 * Event-driven: exits arrive through SIGCHLD, output through the workers' pipes, the user's
 * signals through uv_signal handles; nothing polls. The first failure stops the group (the
 * same signal to every worker's process group, SIGKILL after the grace period), then the group
 * restarts while restarts remain, or the run ends.
 *
 * Ownership: the supervisor keeps a pointer to the plan (it must outlive it) and owns everything
 * else it creates; mgpu_sup_run returns once every handle is closed. */
#ifndef MGPU_SUPERVISOR_H
#define MGPU_SUPERVISOR_H

#include <sys/types.h> /* pid_t */

#include "cgroup.h"  /* mgpu_cgroup_t */
#include "error.h"   /* mgpu_err_t */
#include "plan.h"    /* mgpu_plan_t */
#include "rdzv.h"    /* mgpu_rdzv_t */
#include "spawner.h" /* mgpu_spawner_keeper_t */
#include "stall.h"   /* mgpu_stall_rank_t */

#define MGPU_TAIL_LINES 8

typedef enum {
    MGPU_W_NEW = 0, /* not started in this attempt */
    MGPU_W_RUNNING,
    MGPU_W_SUCCEEDED, /* exited 0 */
    MGPU_W_FAILED,    /* died by itself: exit code != 0, a signal it was not sent, no exec */
    MGPU_W_STOPPED,   /* ended after the launcher signalled it */
} mgpu_wstate_t;

/* How one worker ended in one attempt (what the report and the summary show). */
typedef struct mgpu_outcome {
    int local_rank, rank;
    pid_t pid;
    mgpu_wstate_t state;
    int exit_code;         /* as the launcher reports it: code, 128+signal, 126/127 */
    int signal;            /* the signal that killed it, or 0 */
    int exec_errno;        /* when it could not be executed */
    char exec_reason[600]; /* why, in words: names the program or its missing interpreter */
    int stop_signal;       /* the signal the launcher sent it, or 0 */
    int stalled;           /* stopped by --stall_action fail: exit_code is 124 */
    double t_start;        /* CLOCK_REALTIME seconds, just before fork */
    double t_exec;         /* when the child called execve (0 when it never did) */
    double t_end;
    double t_detected_mono; /* CLOCK_MONOTONIC, when the launcher saw the exit */
    char error_file[2400];
    char timeline[512]; /* what a libmgpu worker published: "event=seconds;..." ("" none) */
    char tail[MGPU_TAIL_LINES][256]; /* last stderr lines, oldest first */
    int ntail;
    int tail_both;  /* tail holds stdout's lines too: the worker had one terminal for both */
    char note[600]; /* what the launcher did to it, for the report ("" none): an expired timer */
} mgpu_outcome_t;

/* One stall report (--stall_timeout): what the ranks were doing when it was made. */
typedef struct mgpu_stall_record {
    int attempt;
    double time;              /* CLOCK_REALTIME */
    int64_t now_ns;           /* CLOCK_MONOTONIC, what the ranks' times compare with */
    char line[2048];          /* the report's first line */
    int n;                    /* ranks */
    mgpu_stall_rank_t *ranks; /* malloc'd */
    char **stacks;            /* n entries, malloc'd, NULL where none was collected */
} mgpu_stall_record_t;

/* One start of the worker group and the world it ran in (elastic jobs change it). */
typedef struct mgpu_attempt_record {
    int attempt, restarts; /* the group start, and TORCHELASTIC_RESTART_COUNT in it */
    int nnodes, node_rank, world_size, base_rank;
    char hosts[512];              /* the nodes' hosts in node rank order */
    double t_start, t_first_exec; /* when it started; when its first worker executed */
    double t_end;                 /* when it ended on this node (0 while it runs) */
    char end[320];                /* "succeeded", "failed: ...", "node 1 (h1) lost: ...", ... */
} mgpu_attempt_record_t;

typedef struct mgpu_run_result {
    int exit_code;    /* what mgpu-launch exits with */
    int signal;       /* a signal the launcher itself received and stopped for, or 0 */
    int attempts;     /* attempts started */
    int root_attempt; /* attempt of the root cause, -1 on success */
    int root;         /* index into outcomes of the first failure, -1 on success */
    int remote;       /* 1: the first failure was on another node (see remote_failure) */
    mgpu_rdzv_failure_t remote_failure;
    int rdzv_error; /* the nodes lost each other (a launcher died, the store went away) */
    int nout;
    mgpu_outcome_t *outcomes; /* the last attempt's workers (nproc entries) */
    mgpu_outcome_t *history;  /* the root cause of every failed attempt on this node, in order */
    int nhistory;
    mgpu_rdzv_failure_t *remote_history; /* those that failed first on another node */
    int nremote_history;
    mgpu_attempt_record_t *worlds; /* every attempt's world, in order */
    int nworlds;
    mgpu_stall_record_t *stalls; /* every stall report of the run, in order */
    int nstalls;
    char log_root[2048]; /* the run's log folder */
    int keep_logs;
    int keep_error_files; /* a worker wrote one: the report names it, so it outlives the run */
    double t_start, t_end;
} mgpu_run_result_t;

/* Runs the whole job (all attempts) in the job's cgroup cg (cg->path "" when none), told to
 * the keeper that outlives a killed launcher (keeper->pid -1 when none). Both are the
 * supervisor's from here: at the end it removes the group and releases the keeper, and leaves
 * in *cg and *keeper what is left of them (on an early failure, all of it, for the caller).
 * Returns 0 when the supervision itself worked (whatever the workers did: see res), or a
 * negative code when it could not start (err says why). */
int mgpu_sup_run(mgpu_plan_t *plan, mgpu_rdzv_t *rdzv, mgpu_cgroup_t *cg,
                 mgpu_spawner_keeper_t *keeper, mgpu_run_result_t *res, mgpu_err_t *err);
/* Frees res and removes the run's folder unless logs were asked for. */
void mgpu_run_result_free(mgpu_run_result_t *res);

#endif
