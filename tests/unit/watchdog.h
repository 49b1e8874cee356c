/* watchdog.h - ends a test that hangs where alarm() cannot: watchdog_start(S) forks a process
 * that SIGKILLs the test's process after S seconds, unless watchdog_stop ends it first. For a
 * test whose hang would be a wait with every signal blocked (a vfork-style spawn, which waits
 * for its child in the kernel): a pending SIGALRM would never be delivered there, while
 * SIGKILL ends any wait. The watchdog dies with the test (PR_SET_PDEATHSIG). Included after
 * check.h. */
#ifndef MGPU_TEST_WATCHDOG_H
#define MGPU_TEST_WATCHDOG_H

#include <signal.h>    /* kill, SIGKILL */
#include <sys/prctl.h> /* PR_SET_PDEATHSIG */
#include <sys/wait.h>  /* waitpid */
#include <unistd.h>    /* fork, sleep, getppid */

static inline pid_t watchdog_start(unsigned seconds)
{
    pid_t test = getpid(), pid = fork();

    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() == test) {
            sleep(seconds);
            if (getppid() == test) {
                printf("  watchdog: still running after %us: killed\n", seconds);
                fflush(stdout);
                kill(test, SIGKILL);
            }
        }
        _exit(0);
    }
    return pid;
}

static inline void watchdog_stop(pid_t pid)
{
    if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
}

#endif
