/* test_spawner.c - starting one worker (spawner.h), each of the three ways: side by side
 * (clone3 with CLONE_VM) with no cgroup, side by side born in the job's cgroup, and forked then
 * joining it (where clone3 cannot put a child in the group). Each way: the worker's session,
 * descriptors, signals, PR_SET_PDEATHSIG, CPUs and output; a failed execve's errno on the exec
 * pipe with exit 127 or 126; and several workers held before their exec at once, each with its
 * own path, argv and envp after the caller overwrote and freed its buffers. The binary doubles
 * as the worker ("report": what it was given, on stdout; "args": its argv and environment). */
#include <dirent.h>    /* opendir */
#include <errno.h>     /* ENOENT, EACCES */
#include <fcntl.h>     /* O_CLOEXEC */
#include <limits.h>    /* PATH_MAX */
#include <signal.h>    /* sigprocmask */
#include <stdio.h>     /* printf */
#include <stdlib.h>    /* atoi */
#include <string.h>    /* strcmp */
#include <sys/prctl.h> /* PR_GET_PDEATHSIG */
#include <sys/stat.h>  /* chmod */
#include <sys/wait.h>  /* waitpid */
#include <unistd.h>    /* getsid */

#include "check.h"
#include "spawner.h"
#include "tmpdir.h"
#include "watchdog.h"

extern char **environ;

/* The worker's side: "sid=1 fds=0,1,2, blocked=0 pipe=dfl term=dfl usr2=ign pdeath=9 cpus=N". */
static int report(void)
{
    char fds[256] = "";
    struct dirent *e;
    struct sigaction sa;
    sigset_t blocked;
    cpu_set_t cpus;
    int pdeath = 0, nblocked = 0;
    DIR *d = opendir("/proc/self/fd");

    while (d != NULL && (e = readdir(d)) != NULL)
        if (e->d_name[0] != '.' && atoi(e->d_name) != dirfd(d))
            snprintf(fds + strlen(fds), sizeof fds - strlen(fds), "%s,", e->d_name);
    if (d != NULL)
        closedir(d);
    sigprocmask(SIG_SETMASK, NULL, &blocked);
    for (int s = 1; s < 65; s++)
        nblocked += sigismember(&blocked, s) == 1;
    prctl(PR_GET_PDEATHSIG, &pdeath);
    sched_getaffinity(0, sizeof cpus, &cpus);
    printf("sid=%d fds=%s blocked=%d", getsid(0) == getpid(), fds, nblocked);
    sigaction(SIGPIPE, NULL, &sa);
    printf(" pipe=%s", sa.sa_handler == SIG_IGN ? "ign" : "dfl");
    sigaction(SIGTERM, NULL, &sa);
    printf(" term=%s", sa.sa_handler == SIG_IGN ? "ign" : "dfl");
    sigaction(SIGUSR2, NULL, &sa);
    printf(" usr2=%s pdeath=%d cpus=%d\n", sa.sa_handler == SIG_IGN ? "ign" : "dfl", pdeath,
           CPU_COUNT(&cpus));
    fprintf(stderr, "on stderr\n");
    return 5;
}

/* The worker's side of the side-by-side test: "<argv[2]> <$MGPU_TEST_SPAWN>". */
static int print_args(char **argv)
{
    const char *v = getenv("MGPU_TEST_SPAWN");
    printf("%s %s\n", argv[2], v != NULL ? v : "(unset)");
    return 0;
}

enum { NO_GROUP, BORN_IN, JOINS, NWAYS };
static const char *const way_name[NWAYS] = {"no cgroup", "born in the cgroup", "joins the cgroup"};

/* The cgroup of a way (NULL for none); skips where none can be made. */
static const mgpu_cgroup_t *way_cgroup(int way, mgpu_cgroup_t *cg)
{
    mgpu_err_t err = {0};
    char name[64];

    if (way == NO_GROUP)
        return NULL;
    snprintf(name, sizeof name, "mgpu-test-spawner-%d", (int)getpid());
    if (mgpu_cgroup_create(cg, NULL, name, &err) < 0)
        SKIP("no cgroup can be made here: %s", err.msg);
    if (way == JOINS) { /* no folder for CLONE_INTO_CGROUP: forked, and it joins */
        close(cg->dir_fd);
        cg->dir_fd = -1;
    }
    return cg;
}

typedef struct started {
    pid_t pid;
    int status; /* exit status, or 1000 + signal */
    double t_exec;
    int exec_errno;
    char out[512], err[512];
} started_t;

static void read_all(int fd, char *buf, size_t len)
{
    size_t got = 0;
    ssize_t r;
    while (got + 1 < len && (r = read(fd, buf + got, len - 1 - got)) > 0)
        got += (size_t)r;
    buf[got] = '\0';
    close(fd);
}

/* Starts path with argv as the supervisor does (every signal blocked), waits for it. */
static void start(const char *path, char *const argv[], const mgpu_cgroup_t *cg,
                  const cpu_set_t *cpus, started_t *w)
{
    int out[2], err[2], ex[2], status = 0;
    const int reset[] = {SIGTERM, SIGCHLD};
    mgpu_clone_vm_mem_t mem;
    sigset_t all, old;

    memset(w, 0, sizeof *w);
    w->exec_errno = -1;
    CHECK(pipe2(out, O_CLOEXEC) == 0 && pipe2(err, O_CLOEXEC) == 0 && pipe2(ex, O_CLOEXEC) == 0);
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &old);
    w->pid =
        mgpu_spawner_worker(path, argv, environ, out[1], err[1], ex[1], reset, 2, cg, cpus, &mem);
    sigprocmask(SIG_SETMASK, &old, NULL);
    close(out[1]);
    close(err[1]);
    close(ex[1]);
    CHECK(w->pid > 0);
    mgpu_spawner_read_exec(ex[0], &mem, &w->t_exec, &w->exec_errno);
    CHECK(mem.base == NULL);
    close(ex[0]);
    read_all(out[0], w->out, sizeof w->out);
    read_all(err[0], w->err, sizeof w->err);
    if (w->pid > 0 && waitpid(w->pid, &status, 0) == w->pid)
        w->status = WIFEXITED(status) ? WEXITSTATUS(status) : 1000 + WTERMSIG(status);
}

static void end_way(const mgpu_cgroup_t *cg)
{
    if (cg != NULL) {
        mgpu_cgroup_close((mgpu_cgroup_t *)cg);
        CHECK_INT(mgpu_cgroup_remove(cg, 2000), 0);
    }
}

/* The worker as it starts: a session of its own, only 0, 1 and 2 open (the launcher's other
 * descriptors, an inherited one included, stay behind), no signal blocked, SIGPIPE and the
 * reset signals back to their default while another ignored signal stays ignored, SIGKILL
 * on the launcher's death, and the CPUs it was given. */
static void check_worker_way(int way)
{
    char self[PATH_MAX];
    char *argv[] = {self, "report", NULL};
    mgpu_cgroup_t cgs;
    const mgpu_cgroup_t *cg = way_cgroup(way, &cgs);
    int leak = open("/dev/null", O_RDONLY); /* no close-on-exec: close_range must take it */
    cpu_set_t one;
    started_t w;
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);

    printf("  %s\n", way_name[way]);
    CHECK(n > 0);
    self[n > 0 ? n : 0] = '\0';
    signal(SIGPIPE, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    signal(SIGUSR2, SIG_IGN);
    CPU_ZERO(&one);
    sched_getaffinity(0, sizeof one, &one);
    for (int c = 0, kept = 0; c < CPU_SETSIZE; c++) /* keep the first allowed CPU only */
        if (CPU_ISSET(c, &one) && kept++)
            CPU_CLR(c, &one);
    start(self, argv, cg, &one, &w);
    CHECK_STR(w.out, "sid=1 fds=0,1,2, blocked=0 pipe=dfl term=dfl usr2=ign pdeath=9 cpus=1\n");
    CHECK_STR(w.err, "on stderr\n");
    CHECK_INT(w.status, 5);
    CHECK(w.t_exec > 0);
    CHECK_INT(w.exec_errno, -1);
    if (cg != NULL)
        CHECK_INT(mgpu_cgroup_count(cg), 0);
    close(leak);
    end_way(cg);
}

static void test_worker_no_cgroup(void)
{
    check_worker_way(NO_GROUP);
}

static void test_worker_born_in_cgroup(void)
{
    check_worker_way(BORN_IN);
}

static void test_worker_joins_cgroup(void)
{
    check_worker_way(JOINS);
}

/* An execve that fails: its errno on the exec pipe, after the moment of the attempt, and exit
 * 127 (not found: here a script's missing interpreter) or 126 (not executable, no format). */
static void check_exec_errors_way(int way)
{
    mgpu_cgroup_t cgs;
    const mgpu_cgroup_t *cg = way_cgroup(way, &cgs);
    const char *files[3] = {"badinterp", "noexec", "garbage"};
    const char *bodies[3] = {"#!/nonexistent/interpreter\n", "#!/bin/sh\n", "\177ELF junk\n"};
    const int modes[3] = {0755, 0644, 0755}, errnos[3] = {ENOENT, EACCES, ENOEXEC},
              codes[3] = {127, 126, 126};
    started_t w;

    printf("  %s\n", way_name[way]);
    make_tmpdir("spawner");
    for (int i = 0; i < 3; i++) {
        char *argv[] = {(char *)files[i], NULL};
        FILE *f = fopen(tmp(files[i]), "w");
        CHECK(f != NULL);
        if (f == NULL)
            continue;
        fputs(bodies[i], f);
        fclose(f);
        chmod(tmp(files[i]), (mode_t)modes[i]);
        start(tmp(files[i]), argv, cg, NULL, &w);
        CHECK_INT(w.exec_errno, errnos[i]);
        CHECK_INT(w.status, codes[i]);
        CHECK(w.t_exec > 0);
        CHECK_STR(w.out, "");
    }
    remove_tmpdir();
    end_way(cg);
}

static void test_exec_errors_no_cgroup(void)
{
    check_exec_errors_way(NO_GROUP);
}

static void test_exec_errors_born_in_cgroup(void)
{
    check_exec_errors_way(BORN_IN);
}

static void test_exec_errors_joins_cgroup(void)
{
    check_exec_errors_way(JOINS);
}

/* Fills the pipe whose write end is fd, so that the next write blocks; returns how many bytes
 * it took. Page-sized writes fill each of the pipe's pages: a small write finds no room left
 * in the last one. */
static size_t fill_pipe(int fd)
{
    static const char page[4096];
    size_t n = 0;
    ssize_t r;
    int fl = fcntl(fd, F_GETFL);

    fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    while ((r = write(fd, page, sizeof page)) > 0)
        n += (size_t)r;
    fcntl(fd, F_SETFL, fl); /* the child's write must wait, not fail */
    return n;
}

static char *dup_or_die(const char *s)
{
    char *d = strdup(s);
    if (d == NULL)
        exit(1);
    return d;
}

#define NSIDE 6

/* NSIDE workers, each held before its exec by its exec pipe (full: the child's write of the
 * moment of exec waits until the test drains it), are all started before any of them may go
 * on: mgpu_spawner_worker does not wait for the exec (one that did would wait forever on the
 * first: the watchdog ends that test). Meanwhile the test overwrites and frees the path, argv and
 * envp it passed; each worker still executes its own. */
static void check_side_by_side_way(int way)
{
    char self[PATH_MAX], want[64], got[256];
    mgpu_cgroup_t cgs;
    const mgpu_cgroup_t *cg = way_cgroup(way, &cgs);
    const int reset[] = {SIGTERM};
    mgpu_clone_vm_mem_t mem[NSIDE];
    int out[NSIDE][2], ex[NSIDE][2];
    size_t filled[NSIDE];
    pid_t pid[NSIDE];
    sigset_t all, old;
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    pid_t dog = watchdog_start(60);

    printf("  %s\n", way_name[way]);
    CHECK(n > 0);
    self[n > 0 ? n : 0] = '\0';
    sigfillset(&all);
    for (int k = 0; k < NSIDE; k++) {
        char *path = dup_or_die(self), **argv = calloc(4, sizeof *argv);
        char **envp = calloc(3, sizeof *envp), arg[32], env[64];

        CHECK(argv != NULL && envp != NULL);
        if (argv == NULL || envp == NULL)
            exit(1);
        snprintf(arg, sizeof arg, "worker-%d", k);
        snprintf(env, sizeof env, "MGPU_TEST_SPAWN=%d", 100 + k);
        argv[0] = path;
        argv[1] = dup_or_die("args");
        argv[2] = dup_or_die(arg);
        envp[0] = dup_or_die(env);
        envp[1] = dup_or_die("PATH=/usr/bin:/bin");
        CHECK(pipe2(out[k], O_CLOEXEC) == 0 && pipe2(ex[k], O_CLOEXEC) == 0);
        filled[k] = fill_pipe(ex[k][1]);
        sigprocmask(SIG_BLOCK, &all, &old);
        pid[k] = mgpu_spawner_worker(path, argv, envp, out[k][1], out[k][1], ex[k][1], reset, 1, cg,
                                     NULL, &mem[k]);
        sigprocmask(SIG_SETMASK, &old, NULL);
        CHECK(pid[k] > 0);
        close(out[k][1]);
        close(ex[k][1]);
        /* the caller's buffers are its own again: scribbled over, then freed */
        for (int i = 0; i < 3; i++) {
            memset(argv[i], 'x', strlen(argv[i]));
            free(argv[i]);
            argv[i] = "scribbled";
        }
        for (int i = 0; i < 2; i++) {
            memset(envp[i], 'x', strlen(envp[i]));
            free(envp[i]);
            envp[i] = "MGPU_TEST_SPAWN=scribbled";
        }
        free(argv);
        free(envp);
    }
    /* every worker has been started, and none has exec'd: each is still held */
    for (int k = 0; k < NSIDE; k++)
        CHECK(waitpid(pid[k], NULL, WNOHANG) == 0);
    for (int k = 0; k < NSIDE; k++) {
        char drain[4096];
        double t_exec = 0;
        int exec_errno = -1, status = -1;

        for (size_t left = filled[k]; left > 0;) {
            ssize_t r = read(ex[k][0], drain, left < sizeof drain ? left : sizeof drain);
            CHECK(r > 0);
            if (r <= 0)
                break;
            left -= (size_t)r;
        }
        mgpu_spawner_read_exec(ex[k][0], &mem[k], &t_exec, &exec_errno);
        close(ex[k][0]);
        CHECK(mem[k].base == NULL);
        CHECK(t_exec > 0);
        CHECK_INT(exec_errno, -1);
        read_all(out[k][0], got, sizeof got);
        snprintf(want, sizeof want, "worker-%d %d\n", k, 100 + k);
        CHECK_STR(got, want);
        CHECK(waitpid(pid[k], &status, 0) == pid[k]);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    watchdog_stop(dog);
    end_way(cg);
}

static void test_side_by_side_no_cgroup(void)
{
    check_side_by_side_way(NO_GROUP);
}

static void test_side_by_side_born_in_cgroup(void)
{
    check_side_by_side_way(BORN_IN);
}

static void test_side_by_side_joins_cgroup(void)
{
    check_side_by_side_way(JOINS);
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "report") == 0)
        return report();
    if (argc == 3 && strcmp(argv[1], "args") == 0)
        return print_args(argv);
    RUN(test_worker_no_cgroup);
    RUN(test_worker_born_in_cgroup);
    RUN(test_worker_joins_cgroup);
    RUN(test_exec_errors_no_cgroup);
    RUN(test_exec_errors_born_in_cgroup);
    RUN(test_exec_errors_joins_cgroup);
    RUN(test_side_by_side_no_cgroup);
    RUN(test_side_by_side_born_in_cgroup);
    RUN(test_side_by_side_joins_cgroup);
    return check_done();
}
