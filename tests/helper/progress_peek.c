/* progress_peek.c - runs a program as N local ranks with progress pages, as mgpu-launch hands
 * them out, and prints the pages while it runs: for tests and for looking at a worker.
 *
 *   progress_peek [-n RANKS] [-i MS] -- PROGRAM [ARGS...]
 *
 * Makes one memfd of RANKS pages, starts RANKS copies of PROGRAM with
 * MGPU_PROGRESS_FILE=/proc/<this pid>/fd/<n> and MGPU_PROGRESS_SLOT=<i> (and, for more than
 * one, RANK, LOCAL_RANK, WORLD_SIZE and LOCAL_WORLD_SIZE), prints every slot every MS
 * milliseconds (default 100) and once more, as "final", after all have exited:
 *   peek t=0.30 slot=0 rank=0 pid=123 step=12 phase=forward moves=40 entered=11 done=11
 *        last=all-reduce#11 bucket=0 bytes=532 label=""
 * ("peek - slot=1 not attached" before a rank attaches). Exits with the first non-zero exit
 * status of the ranks (128 + signal for a killed one), 0 when all succeed. */
#include <errno.h>    /* errno */
#include <signal.h>   /* kill */
#include <stdio.h>    /* printf */
#include <stdlib.h>   /* atoi, setenv */
#include <string.h>   /* strcmp, strerror */
#include <sys/mman.h> /* memfd_create, mmap */
#include <sys/wait.h> /* waitpid */
#include <time.h>     /* clock_gettime */
#include <unistd.h>   /* fork, execvp, ftruncate */

#include "progress.h" /* mgpu_progress_read, MGPU_PROGRESS_PAGE */

#define MAX_RANKS 64

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void show(const char *tag, const char *pages, int n)
{
    for (int s = 0; s < n; s++) {
        const mgpu_progress_page_t *p =
            (const mgpu_progress_page_t *)(pages + (size_t)s * MGPU_PROGRESS_PAGE);
        mgpu_progress_page_t c;
        const mgpu_progress_coll_t *last;
        if (mgpu_progress_read(p, &c) < 0) {
            printf("peek %s slot=%d not attached\n", tag, s);
            continue;
        }
        last = mgpu_progress_coll(&c, c.coll_entered);
        printf("peek %s slot=%d rank=%d pid=%d step=%lld phase=%s moves=%llu entered=%llu "
               "done=%llu last=%s#%llu bucket=%d bytes=%llu label=\"%s\"\n",
               tag, s, c.rank, c.pid, (long long)c.step, mgpu_progress_phase_name(c.phase),
               (unsigned long long)c.moves, (unsigned long long)c.coll_entered,
               (unsigned long long)c.coll_done,
               last != NULL ? mgpu_progress_coll_name(last->op) : "none",
               (unsigned long long)c.coll_entered, last != NULL ? last->bucket : -1,
               last != NULL ? (unsigned long long)last->bytes : 0ULL, c.label);
    }
    fflush(stdout);
}

int main(int argc, char **argv)
{
    int n = 1, interval_ms = 100, i = 1, fd, left, status = 0;
    pid_t pids[MAX_RANKS];
    char path[64], *pages;
    double t0 = now_s();

    for (; i < argc && strcmp(argv[i], "--") != 0; i += 2) {
        if (i + 1 >= argc)
            break;
        if (strcmp(argv[i], "-n") == 0)
            n = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "-i") == 0)
            interval_ms = atoi(argv[i + 1]);
        else
            break;
    }
    if (i >= argc || strcmp(argv[i], "--") != 0 || i + 1 >= argc || n < 1 || n > MAX_RANKS ||
        interval_ms < 1) {
        fprintf(stderr, "usage: progress_peek [-n RANKS (1..%d)] [-i MS] -- PROGRAM [ARGS...]\n",
                MAX_RANKS);
        return 2;
    }
    argv += i + 1;
    if ((fd = memfd_create("mgpu-progress", MFD_CLOEXEC)) < 0 ||
        ftruncate(fd, (off_t)n * MGPU_PROGRESS_PAGE) < 0) {
        fprintf(stderr, "progress_peek: memfd_create/ftruncate: %s\n", strerror(errno));
        return 1;
    }
    pages = mmap(NULL, (size_t)n * MGPU_PROGRESS_PAGE, PROT_READ, MAP_SHARED, fd, 0);
    if (pages == MAP_FAILED) {
        fprintf(stderr, "progress_peek: mmap: %s\n", strerror(errno));
        return 1;
    }
    snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)getpid(), fd);
    for (int r = 0; r < n; r++) {
        char v[16];
        if ((pids[r] = fork()) < 0) {
            fprintf(stderr, "progress_peek: fork: %s\n", strerror(errno));
            for (int q = 0; q < r; q++)
                kill(pids[q], SIGKILL);
            return 1;
        }
        if (pids[r] > 0)
            continue;
        setenv("MGPU_PROGRESS_FILE", path, 1);
        snprintf(v, sizeof v, "%d", r);
        setenv("MGPU_PROGRESS_SLOT", v, 1);
        if (n > 1) {
            setenv("RANK", v, 1);
            setenv("LOCAL_RANK", v, 1);
            snprintf(v, sizeof v, "%d", n);
            setenv("WORLD_SIZE", v, 1);
            setenv("LOCAL_WORLD_SIZE", v, 1);
        }
        execvp(argv[0], argv);
        fprintf(stderr, "progress_peek: exec %s: %s\n", argv[0], strerror(errno));
        _exit(errno == ENOENT ? 127 : 126);
    }
    for (left = n; left > 0;) {
        char tag[32];
        pid_t w;
        int st;
        usleep((useconds_t)interval_ms * 1000);
        snprintf(tag, sizeof tag, "t=%.2f", now_s() - t0);
        show(tag, pages, n);
        while ((w = waitpid(-1, &st, WNOHANG)) > 0) {
            int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            left--;
            if (status == 0)
                status = code;
        }
    }
    show("final", pages, n);
    return status;
}
