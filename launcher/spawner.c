/* spawner.c - starting one worker process, and the keeper (see spawner.h). */
#include "spawner.h"

#include <errno.h>       /* errno, EINVAL */
#include <fcntl.h>       /* O_CLOEXEC, F_SETFD */
#include <signal.h>      /* sigprocmask, kill */
#include <stdlib.h>      /* posix_openpt, grantpt, ptsname_r */
#include <string.h>      /* memcpy, strlen, strerror */
#include <sys/ioctl.h>   /* TIOCSWINSZ, TIOCSPTLCK, TIOCGPTPEER */
#include <sys/prctl.h>   /* PR_SET_PDEATHSIG, PR_SET_NAME, PR_SET_PTRACER */
#include <sys/syscall.h> /* SYS_execve, SYS_dup3, SYS_close_range, ... */
#include <termios.h>     /* tcgetattr, OPOST */
#include <time.h>        /* CLOCK_REALTIME */
#include <unistd.h>      /* fork, getpid */

#include "clone_vm.h" /* mgpu_clone_vm_spawn, mgpu_clone_vm_map, mgpu_clone_vm_syscall */
#include "keeper.h"   /* mgpu_keeper_read, mgpu_keeper_clean */
#include "log.h"      /* mgpu_debug */

/* What the child reads. A child started side by side gets its own copy, in its own mapping
 * (args_copy), with every pointer into that mapping: the launcher goes on and frees the
 * environment, or builds the next worker's, while the child still runs before its exec. A
 * forked child reads the launcher's, in its own copy of the launcher's memory. */
typedef struct child_args {
    const char *path;
    char *const *argv, *const *envp;
    int out_w, err_w, exec_w;
    int join_fd; /* the cgroup's cgroup.procs to join, -1: born in it, or none */
    pid_t parent;
    const int *reset;
    int nreset;
    const cpu_set_t *cpus;
    int handlers_dfl; /* 1: born with every handler at SIG_DFL (CLONE_CLEAR_SIGHAND) */
} child_args_t;

/* The child's system calls: raw, so that nothing in the C library runs (clone_vm.h). */
#define SYS4(n, a, b, c, d)                                                                        \
    mgpu_clone_vm_syscall((n), (long)(a), (long)(b), (long)(c), (long)(d), 0, 0)
#define SYS3(n, a, b, c) SYS4((n), (a), (b), (c), 0)

/* fd becomes `to`, open across execve. */
static MGPU_CLONE_VM_CHILD long dup_to(int fd, int to)
{
    /* dup3 (aarch64 has no dup2) refuses fd == to; there the descriptor only loses its
     * close-on-exec flag. */
    if (fd == to)
        return SYS3(SYS_fcntl, fd, F_SETFD, 0);
    return SYS3(SYS_dup3, fd, to, 0);
}

/* The child from its start to execve. It shares the launcher's memory until then when it was
 * started by mgpu_clone_vm_spawn, so it follows clone_vm.h's rules either way: raw system calls
 * only, reads only its own copy of its arguments, writes to its own stack only, no handler run
 * before exec. It starts with every signal blocked. Exits 127 (not found) or 126 when execve
 * fails, after writing its errno on the exec pipe. */
static MGPU_CLONE_VM_CHILD int child_main(void *arg)
{
    const child_args_t *a = arg;
    const uint64_t none = 0;
    struct timespec ts;
    int64_t ns;
    long rc;
    int e;

    /* Into the job's cgroup before anything else (unless it was born there): all the worker
     * will ever start is born inside it. Should the write fail, the process groups and the
     * keeper still hold it. */
    if (a->join_fd >= 0)
        SYS3(SYS_write, a->join_fd, "0", 1);
    /* --numa_binding: set here, before exec, so that every thread the program starts and
     * every process it forks inherits it. The plan kept the set within the launcher's own
     * affinity; should the kernel refuse it all the same (a cpuset changed meanwhile), the
     * worker runs where the launcher may. */
    if (a->cpus != NULL)
        SYS3(SYS_sched_setaffinity, 0, sizeof *a->cpus, a->cpus);
    /* Every signal the launcher handles (libuv's SIGCHLD, SIGWINCH and the stop signals) back
     * to its default before any is unblocked: a handler would run the launcher's code on the
     * launcher's memory (a child born with CLONE_CLEAR_SIGHAND has none left). The stop signals
     * go back to the default even when ignored (a shell's background job ignores SIGINT), and
     * SIGPIPE, which the launcher ignores: a worker must not inherit that. Other ignored
     * signals stay ignored, as across execve. */
    for (int sig = 1; sig <= 64; sig++) {
        int always = sig == SIGPIPE;
        if (sig == SIGKILL || sig == SIGSTOP)
            continue;
        for (int i = 0; i < a->nreset; i++)
            always |= a->reset[i] == sig;
        if (always || !a->handlers_dfl)
            mgpu_clone_vm_sig_default(sig, always);
    }
    /* A session of its own: the launcher alone decides which signal reaches which worker, and
     * a terminal's Ctrl-C reaches the launcher only (it forwards it). */
    SYS3(SYS_setsid, 0, 0, 0);
    /* Dies with the launcher, even by SIGKILL. The launcher may have died already between
     * clone and prctl: then this process was reparented and getppid() tells. */
    SYS3(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0);
    if (SYS3(SYS_getppid, 0, 0, 0) != a->parent)
        return 128 + SIGKILL;
    /* The stack tools (stacks.c) are the launcher's children, not the worker's ancestors:
     * under Yama's ptrace_scope=1 only a declared tracer and its descendants may attach. The
     * declaration lasts across execve; without Yama the call fails with EINVAL, harmlessly. */
    SYS3(SYS_prctl, PR_SET_PTRACER, a->parent, 0);
    if ((rc = dup_to(a->out_w, 1)) < 0 || (rc = dup_to(a->err_w, 2)) < 0)
        goto fail;
    /* Only 0, 1 and 2 reach the worker (torchrun's Popen uses close_fds=True): a wrapper's pipe
     * inherited by workers, and by what they leave behind, could keep the wrapper waiting. The
     * exec-error pipe stays open until execve closes it (close-on-exec). */
    if ((a->exec_w > 3 && SYS3(SYS_close_range, 3, a->exec_w - 1, 0) != 0) ||
        SYS3(SYS_close_range, a->exec_w + 1, ~0u, 0) != 0)
        for (int fd = 3; fd < 4096; fd++) /* kernels before 5.9 */
            if (fd != a->exec_w)
                SYS3(SYS_close, fd, 0, 0);
    SYS4(SYS_rt_sigprocmask, SIG_SETMASK, &none, 0, sizeof none);
    /* The moment of exec, for the startup timeline: the pipe carries it first (8 bytes), then
     * either EOF (exec succeeded and closed the pipe) or the errno of a failed exec. */
    SYS3(SYS_clock_gettime, CLOCK_REALTIME, &ts, 0);
    ns = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    while (SYS3(SYS_write, a->exec_w, &ns, sizeof ns) == -EINTR)
        ;
    rc = SYS3(SYS_execve, a->path, a->argv, a->envp);
fail:
    e = (int)-rc;
    while (SYS3(SYS_write, a->exec_w, &e, sizeof e) == -EINTR)
        ;
    return e == ENOENT ? 127 : 126;
}

/* The size of a NULL-terminated vector's pointers and strings, with its terminator; *n gets
 * how many strings it holds. A NULL vector stays NULL. */
static size_t vec_size(char *const *v, size_t *n)
{
    size_t len = 0;

    *n = 0;
    if (v == NULL)
        return 0;
    for (; v[*n] != NULL; (*n)++)
        len += strlen(v[*n]) + 1;
    return len + (*n + 1) * sizeof(char *);
}

/* Copies vector v (n strings) to *vec (room for its pointers) and its strings to *str, and
 * moves both past what they took. */
static char **vec_copy(char *const *v, size_t n, char ***vec, char **str)
{
    char **out = *vec;

    if (v == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(v[i]) + 1;
        memcpy(*str, v[i], len);
        out[i] = *str;
        *str += len;
    }
    out[n] = NULL;
    *vec += n + 1;
    return out;
}

/* A mapping for a child started side by side (clone_vm.h) holding its own copy of a: the
 * struct, then the pointer vectors, the CPU set, the signals to reset, and the strings (in
 * that order, so that each is aligned for its type). Returns the copy, or NULL with errno
 * set and mem empty. */
static child_args_t *args_copy(const child_args_t *a, mgpu_clone_vm_mem_t *mem)
{
    size_t nargv, nenvp, vecs, size = sizeof *a;
    child_args_t *c;
    char **vec, *str;

    vecs = vec_size(a->argv, &nargv) + vec_size(a->envp, &nenvp);
    size += vecs + (a->cpus != NULL ? sizeof *a->cpus : 0) + (size_t)a->nreset * sizeof(int) +
            strlen(a->path) + 1;
    if ((c = mgpu_clone_vm_map(mem, size)) == NULL)
        return NULL;
    *c = *a;
    vec = (char **)(c + 1);
    str = (char *)vec + (a->argv != NULL ? (nargv + 1) * sizeof(char *) : 0) +
          (a->envp != NULL ? (nenvp + 1) * sizeof(char *) : 0);
    if (a->cpus != NULL) {
        memcpy(str, a->cpus, sizeof *a->cpus);
        c->cpus = (const cpu_set_t *)str;
        str += sizeof *a->cpus;
    }
    if (a->nreset > 0) {
        memcpy(str, a->reset, (size_t)a->nreset * sizeof(int));
        c->reset = (const int *)str;
        str += (size_t)a->nreset * sizeof(int);
    }
    c->argv = vec_copy(a->argv, nargv, &vec, &str);
    c->envp = vec_copy(a->envp, nenvp, &vec, &str);
    c->path = memcpy(str, a->path, strlen(a->path) + 1);
    return c;
}

pid_t mgpu_spawner_worker(const char *path, char *const argv[], char *const envp[], int out_w,
                          int err_w, int exec_w, const int *reset, int nreset,
                          const mgpu_cgroup_t *cg, const cpu_set_t *cpus, mgpu_clone_vm_mem_t *mem)
{
    child_args_t a = {path, argv, envp, out_w, err_w, exec_w, -1, getpid(), reset, nreset, cpus, 0};
    int born_in = cg != NULL && cg->dir_fd >= 0, no_group = cg == NULL || cg->procs_fd < 0;
    pid_t pid = -ENOSYS;

    mem->base = NULL;
    mem->len = 0;
    /* Side by side where this build can (clone_vm.h): straight into the job's cgroup, or with
     * no cgroup at all. A child that had to join the group by writing cgroup.procs (which waits
     * for an RCU grace period: milliseconds) is forked instead: a copy of the launcher's memory
     * of its own, which the launcher's next mallocs cannot change under it. */
    if (MGPU_CLONE_VM && (born_in || no_group)) {
        int cg_fd = born_in ? cg->dir_fd : -1;
        child_args_t *c = args_copy(&a, mem);

        if (c == NULL) {
            mgpu_debug("mmap(a child's stack): %s; forking instead", strerror(errno));
        } else {
            /* Born with default handlers, so that it skips checking each signal's; before
             * Linux 5.5 the kernel refuses the flag, and the child resets them itself. No
             * child exists after a refusal, so its copy may change. */
            c->handlers_dfl = 1;
            pid = mgpu_clone_vm_spawn(child_main, c, mem, cg_fd, MGPU_CLONE_VM_CLEAR_SIGHAND);
            if (pid == -EINVAL) {
                c->handlers_dfl = 0;
                pid = mgpu_clone_vm_spawn(child_main, c, mem, cg_fd, 0);
            }
            if (pid >= 0)
                return pid;
            mgpu_clone_vm_unmap(mem);
            mgpu_debug("clone3(CLONE_VM): %s; forking instead", strerror(-pid));
        }
    }
    /* fork's way: born in the job's cgroup where the kernel can; else forked, and it joins. */
    pid = mgpu_cgroup_fork_into(cg);
    if (pid < 0) {
        a.join_fd = no_group ? -1 : cg->procs_fd;
        pid = fork();
    }
    if (pid == 0)
        _exit(child_main(&a));
    return pid < 0 ? -errno : pid;
}

void mgpu_spawner_read_exec(int exec_r, mgpu_clone_vm_mem_t *mem, double *t_exec, int *exec_errno)
{
    /* [int64 ns of exec] [int errno, only if exec failed]; a child that died before exec (its
     * launcher gone) sends neither. Read to EOF even once both are in: a child whose exec
     * failed still runs on its mapping until it exits. */
    char buf[sizeof(int64_t) + sizeof(int)], more[64];
    size_t got = 0;
    ssize_t r;

    for (;;) {
        if (got < sizeof buf)
            r = read(exec_r, buf + got, sizeof buf - got);
        else
            r = read(exec_r, more, sizeof more);
        if (r > 0)
            got += got < sizeof buf ? (size_t)r : 0;
        else if (r == 0 || errno != EINTR)
            break;
    }
    if (got >= sizeof(int64_t)) {
        int64_t ns;
        memcpy(&ns, buf, sizeof ns);
        *t_exec = (double)ns * 1e-9;
    }
    if (got == sizeof buf)
        memcpy(exec_errno, buf + sizeof(int64_t), sizeof(int));
    /* EOF: the child has exec'd (its memory is the program's now) or died; no other read can
     * tell that, so a failed read leaves the mapping where it is. */
    if (r == 0)
        mgpu_clone_vm_unmap(mem);
    else if (mem->base != NULL)
        mgpu_debug("read(exec pipe): %s; a child's %zu bytes stay mapped", strerror(errno),
                   mem->len);
}

int mgpu_spawner_pty_open(int *master, int *slave, const struct winsize *ws, const char **call)
{
    char name[128];
    struct termios t;
    int m, sl = -1, e, unlock = 0;

    *master = *slave = -1;
    /* O_NOCTTY: neither the launcher nor the worker gets it as a controlling terminal. */
    if ((m = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC)) < 0) {
        *call = "posix_openpt";
        return -errno;
    }
    *call = "unlockpt";
    if (ioctl(m, TIOCSPTLCK, &unlock) != 0) /* unlockpt(3), without its checks */
        goto fail;
#ifdef TIOCGPTPEER
    /* The slave straight from the master (Linux 4.13): no name to look up in /dev/pts. */
    sl = ioctl(m, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC);
#endif
    if (sl < 0) {
        *call = "grantpt";
        if (grantpt(m) != 0)
            goto fail;
        *call = "ptsname_r";
        if ((errno = ptsname_r(m, name, sizeof name)) != 0)
            goto fail;
        *call = "open(pty slave)";
        if ((sl = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC)) < 0)
            goto fail;
    }
    *call = "tcgetattr(pty)";
    if (tcgetattr(sl, &t) != 0)
        goto fail;
    /* The terminal's own "\n" -> "\r\n" would reach the console doubled by its terminal. */
    t.c_oflag &= ~(tcflag_t)OPOST;
    t.c_lflag &= ~(tcflag_t)(ECHO | ECHONL);
    *call = "tcsetattr(pty)";
    if (tcsetattr(sl, TCSANOW, &t) != 0)
        goto fail;
    *call = "ioctl(pty, TIOCSWINSZ)";
    if (ws != NULL && ioctl(m, TIOCSWINSZ, ws) != 0)
        goto fail;
    *master = m;
    *slave = sl;
    return 0;
fail:
    e = errno ? errno : EIO;
    close(m);
    if (sl >= 0)
        close(sl);
    return -e;
}

int mgpu_spawner_pty_size(int console_fd, size_t prefix_len, struct winsize *ws)
{
    const int fds[] = {console_fd, 1, 2, 0};

    for (int i = 0; i < 4; i++)
        if (fds[i] >= 0 && ioctl(fds[i], TIOCGWINSZ, ws) == 0 && ws->ws_col > 0) {
            if (ws->ws_col > prefix_len + 20)
                ws->ws_col = (unsigned short)(ws->ws_col - prefix_len);
            ws->ws_xpixel = 0;
            return 1;
        }
    return 0;
}

/* It blocks every signal it can, so a terminal's Ctrl-C or a stray SIGTERM leaves it to its
 * one job. Forked from the multi-threaded launcher: async-signal-safe calls only. */
static void keeper_main(int fd, const mgpu_cgroup_t *cg)
{
    mgpu_keeper_paths_t paths;
    int32_t pgids[4096], v;
    int n = 0, quit = 0;
    sigset_t all;

    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, NULL);
    /* A session of its own: `kill -9 -PGID` of the launcher's group, `timeout -s KILL` or a
     * shell's job control take the launcher's whole group, and must not take the keeper. */
    setsid();
    prctl(PR_SET_NAME, "mgpu-keeper");
    /* Nothing of the launcher's but the pipe: a wrapper reading the launcher's output must see
     * EOF when the launcher is gone, not when the keeper is. */
    if (fd != 3) {
        dup2(fd, 3);
        fd = 3;
    }
    if (close_range(4, ~0u, 0) != 0)
        for (int i = 4; i < 4096; i++)
            close(i);
    for (int i = 0; i < 3; i++)
        close(i);
    paths.n = 0;
    while (mgpu_keeper_read(fd, &paths, &v) > 0) {
        if (v > 0 && !quit && n < 4096)
            pgids[n++] = v;
        if (v == MGPU_KEEPER_QUIT && !quit) {
            /* The job's processes are over; the launcher has killed and removed the group,
             * or left it for its last processes to leave. The process groups are forgotten:
             * their ids may be reused. The launcher still has its report to write. */
            quit = 1;
            n = 0;
            mgpu_cgroup_remove(cg, 2000);
        }
        if (v == MGPU_KEEPER_FORGET && quit)
            _exit(0);
    }
    /* EOF without "forget": the launcher died. Before its "quit", everything in the job's
     * cgroup goes at once, and without one, the workers' process groups; then, either way,
     * the files it made. */
    if (!quit) {
        mgpu_cgroup_kill(cg);
        for (int i = 0; i < n; i++)
            kill(-pgids[i], SIGKILL);
        mgpu_cgroup_remove(cg, 5000);
    }
    mgpu_keeper_clean(&paths);
    _exit(0);
}

void mgpu_spawner_keeper_start(mgpu_spawner_keeper_t *k, const mgpu_cgroup_t *cg)
{
    int fds[2];
    sigset_t all, old;

    k->pid = -1;
    k->fd = -1;
    if (pipe2(fds, O_CLOEXEC) != 0)
        return;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &old);
    k->pid = fork();
    if (k->pid == 0) {
        close(fds[1]);
        keeper_main(fds[0], cg);
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    close(fds[0]);
    if (k->pid < 0)
        close(fds[1]);
    else
        k->fd = fds[1];
}

void mgpu_spawner_keeper_attach(mgpu_spawner_keeper_t *k, int fd)
{
    k->pid = -1;
    k->fd = fd;
}

static void keeper_send(mgpu_spawner_keeper_t *k, int32_t v)
{
    if (k->fd >= 0 && mgpu_keeper_send(k->fd, v) < 0) {
        close(k->fd);
        k->fd = -1;
    }
}

void mgpu_spawner_keeper_tell(mgpu_spawner_keeper_t *k, pid_t pgid)
{
    keeper_send(k, (int32_t)pgid);
}

void mgpu_spawner_keeper_tell_path(mgpu_spawner_keeper_t *k, const char *path)
{
    int rc;

    if (k->fd >= 0 && (rc = mgpu_keeper_send_path(k->fd, path)) < 0)
        mgpu_debug("keeper: %s is left should the launcher die: %s", path, strerror(-rc));
}

void mgpu_spawner_keeper_release(mgpu_spawner_keeper_t *k)
{
    keeper_send(k, MGPU_KEEPER_QUIT);
}

void mgpu_spawner_keeper_forget(mgpu_spawner_keeper_t *k)
{
    keeper_send(k, MGPU_KEEPER_FORGET);
    if (k->fd >= 0)
        close(k->fd);
    k->fd = -1;
}
