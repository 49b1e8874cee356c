/* ranks.h - runs one function as W forked ranks and collects how each ended, for the
 * collective tests. Included by test files after check.h; a rank's CHECK failures make its
 * exit status 1. A rank still running at the deadline is killed and counts as hung. */
#ifndef MGPU_TEST_RANKS_H
#define MGPU_TEST_RANKS_H

#include <signal.h>   /* kill */
#include <stdio.h>    /* snprintf */
#include <sys/wait.h> /* waitpid */
#include <time.h>     /* nanosleep */
#include <unistd.h>   /* fork */

#define RANKS_MAX 8

typedef void (*ranks_fn)(int rank, int size, void *arg);

typedef struct ranks_result {
    pid_t pid[RANKS_MAX];
    int status[RANKS_MAX]; /* waitpid status */
    int hung[RANKS_MAX];   /* killed at the deadline */
} ranks_result_t;

static void ranks_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Forks size ranks running fn. If kill_rank >= 0, that rank gets SIGKILL after kill_ms.
 * Returns the number of ranks that did not exit 0 (killed ranks included). */
static int ranks_run_kill(int size, ranks_fn fn, void *arg, int deadline_s, int kill_rank,
                          int kill_ms, ranks_result_t *res)
{
    int left = size, bad = 0, waited_ms = 0;
    ranks_result_t local;

    if (res == NULL)
        res = &local;
    memset(res, 0, sizeof *res);
    fflush(stdout);
    for (int r = 0; r < size; r++) {
        pid_t pid = fork();
        if (pid == 0) {
            fn(r, size, arg);
            fflush(stdout);
            _exit(check_failed ? 1 : 0);
        }
        res->pid[r] = pid;
    }
    while (left > 0) {
        for (int r = 0; r < size; r++) {
            int st;
            if (res->pid[r] <= 0)
                continue;
            if (waitpid(res->pid[r], &st, WNOHANG) == res->pid[r]) {
                res->status[r] = st;
                res->pid[r] = -res->pid[r];
                left--;
                if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
                    bad++;
            }
        }
        if (left == 0)
            break;
        if (kill_rank >= 0 && waited_ms >= kill_ms && res->pid[kill_rank] > 0) {
            kill(res->pid[kill_rank], SIGKILL);
            kill_rank = -1;
        }
        if (waited_ms >= deadline_s * 1000) {
            for (int r = 0; r < size; r++)
                if (res->pid[r] > 0) {
                    printf("  rank %d hung: killing it\n", r);
                    res->hung[r] = 1;
                    kill(res->pid[r], SIGKILL);
                }
            deadline_s = 1 << 20;
        }
        ranks_sleep_ms(2);
        waited_ms += 2;
    }
    return bad;
}

static int ranks_run(int size, ranks_fn fn, void *arg, int deadline_s)
{
    return ranks_run_kill(size, fn, arg, deadline_s, -1, 0, NULL);
}

/* Bounds for "fails fast": far below the timeouts the tests set (>= 20 s), far above what a
 * loaded 2-core machine needs, so the checks separate fast failure from a hang, not speeds. */
#define RANKS_FAST_S 5.0

/* The absent rank of a timeout test: stays alive, calling nothing, until the others have
 * counted themselves done in *done (or 30 s pass), so it never leaves before they time out. */
static void ranks_stay_until(volatile int *done, int count)
{
    for (int ms = 0; ms < 30000 && __atomic_load_n(done, __ATOMIC_SEQ_CST) < count; ms += 5)
        ranks_sleep_ms(5);
}

static double ranks_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif
