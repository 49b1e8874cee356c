/* stall.h - which ranks of a running group are stalled, and the report's first line.
 *
 * Progress of a rank is anything that changes: its progress page (moves, coll_done: libmgpu
 * workers, progress.h), the modification time of its heartbeat file, an output line. A rank
 * that is still running is stalled when none of these changed for the timeout. That covers
 * both rules of the detection: a rank left behind while others moved on, and a group where no
 * rank moved at all. The culprits are the ranks behind: stalled ranks that are stopped (a
 * signal or a debugger: whatever their page says, they hold the others up), else those not in
 * the collective the others wait in (or that entered fewer collectives), else the ones whose
 * last progress is the oldest.
 *
 * Everything here is pure (no clock, no system call): the supervisor fills the snapshots and
 * passes the time, and the unit tests do the same with synthetic ones. */
#ifndef MGPU_STALL_H
#define MGPU_STALL_H

#include <stddef.h>    /* size_t */
#include <stdint.h>    /* int64_t, uint64_t */
#include <sys/types.h> /* pid_t */

#include "progress.h" /* mgpu_progress_page_t */

typedef struct mgpu_stall_rank {
    /* --- what the supervisor saw, filled before each mgpu_stall_update --- */
    int alive;  /* still running (ranks that exited are never stalled) */
    int paused; /* stopped by a signal or a debugger (SIGSTOP, Ctrl-Z, ptrace) */
    int rank, local_rank;
    pid_t pid;
    int attached;              /* page holds a valid copy of the worker's progress page */
    mgpu_progress_page_t page; /* CLOCK_MONOTONIC times, as libmgpu writes them */
    int64_t heartbeat_ns;      /* the heartbeat file's mtime, CLOCK_REALTIME, 0 = never */
    uint64_t lines;            /* output lines so far */
    int64_t line_ns;           /* CLOCK_MONOTONIC of the last one */
    char last_line[96];        /* its text, "" when none */
    /* --- kept by mgpu_stall_update between calls (zero them at each attempt's start) --- */
    int64_t start_ns; /* when the attempt started: progress before anything else */
    uint64_t seen_moves, seen_coll_done, seen_lines;
    int64_t seen_heartbeat;
    int64_t last_ns; /* CLOCK_MONOTONIC of the rank's last progress */
    int heartbeats;  /* it touched its heartbeat file at least once */
    /* --- mgpu_stall_detect's answer --- */
    int stalled;
    int culprit;
} mgpu_stall_rank_t;

/* Takes the snapshots in r into each rank's last progress time. now_ns is CLOCK_MONOTONIC,
 * real_ns CLOCK_REALTIME at the same moment (for the heartbeat's mtime). */
void mgpu_stall_update(mgpu_stall_rank_t *r, int n, int64_t now_ns, int64_t real_ns);

/* Marks the stalled ranks (alive, no progress for timeout_s) and, when any, the culprits
 * among all ranks. Returns how many are stalled. */
int mgpu_stall_detect(mgpu_stall_rank_t *r, int n, int64_t now_ns, double timeout_s);

/* The report's first line (no newline), after mgpu_stall_detect found a stall, e.g.
 * "stall: rank 3 (local 3, pid 8123, host n1) has been in forward of step 1531 for 62 s;
 * ranks 0, 1, 2 have waited in all-reduce #4593 (bucket 3, 4 MiB) for 61 s". */
void mgpu_stall_describe(const mgpu_stall_rank_t *r, int n, int64_t now_ns, const char *host,
                         char *buf, size_t len);

/* The collective rank r is in (entered and not finished), or NULL. */
const mgpu_progress_coll_t *mgpu_stall_coll(const mgpu_stall_rank_t *r);

#endif
