/* test_clone_vm.c - the vfork-style start (clone_vm.h): a child that shares the parent's memory
 * and holds the parent until it execs or exits, starts with every signal blocked, resets
 * handlers in its own table only, is born in a cgroup when asked, and a refused clone leaves
 * no child and the caller's signal mask and errno as they were. */
#include <errno.h>       /* errno, ENOENT */
#include <fcntl.h>       /* open */
#include <signal.h>      /* sigaction, sigprocmask */
#include <stdint.h>      /* uint64_t */
#include <stdio.h>       /* snprintf */
#include <string.h>      /* memset */
#include <sys/syscall.h> /* SYS_rt_sigprocmask, SYS_execve */
#include <sys/wait.h>    /* waitpid */
#include <unistd.h>      /* getpid */

#include "cgroup.h"
#include "check.h"
#include "clone_vm.h"

#define NEED_CLONE_VM()                                                                            \
    do {                                                                                           \
        if (!MGPU_CLONE_VM)                                                                        \
            SKIP("no clone_vm trampoline for this architecture (the fork path is used)");          \
    } while (0)

/* a spawn that the kernel refuses here (before 5.3, a seccomp filter) is a skip, not a failure */
static pid_t spawn_or_skip(int (*fn)(void *), void *arg, int cgroup_fd)
{
    pid_t pid = mgpu_clone_vm_spawn(fn, arg, cgroup_fd);
    if (pid == -ENOSYS)
        SKIP("clone3 is refused here (a kernel before 5.3, or a seccomp filter)");
    return pid;
}

static int exit_status(pid_t pid)
{
    int status = 0;
    if (waitpid(pid, &status, 0) != pid)
        return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1000 + WTERMSIG(status);
}

/* What a child writes into the parent's memory. */
typedef struct seen {
    int value;
    uint64_t mask;
    long handler[3];
    long exec_rc;
} seen_t;

static MGPU_CLONE_VM_CHILD int child_writes(void *arg)
{
    ((seen_t *)arg)->value = 42;
    return 7;
}

/* The child's write is in the parent's memory the moment the spawn returns: one address
 * space, and the parent held until the child was done. */
static void test_child_shares_memory_and_parent_waits(void)
{
    seen_t s;
    pid_t pid;

    NEED_CLONE_VM();
    memset(&s, 0, sizeof s);
    errno = EDOM;
    pid = spawn_or_skip(child_writes, &s, -1);
    CHECK_INT(errno, EDOM);
    CHECK(pid > 0);
    CHECK_INT(s.value, 42);
    CHECK_INT(exit_status(pid), 7);
}

static MGPU_CLONE_VM_CHILD int child_reads_mask(void *arg)
{
    seen_t *s = arg;
    mgpu_clone_vm_syscall(SYS_rt_sigprocmask, SIG_BLOCK, 0, (long)&s->mask, 8, 0, 0);
    return 0;
}

/* Every signal is blocked in the child from its first instruction (the kernel never blocks
 * SIGKILL and SIGSTOP), and the caller's mask is as it was afterwards. */
static void test_child_starts_with_every_signal_blocked(void)
{
    uint64_t unblockable = (1ull << (SIGKILL - 1)) | (1ull << (SIGSTOP - 1));
    sigset_t before, after, one;
    seen_t s;
    pid_t pid;

    NEED_CLONE_VM();
    memset(&s, 0, sizeof s);
    sigemptyset(&one);
    sigaddset(&one, SIGUSR1);
    sigprocmask(SIG_SETMASK, &one, &before);
    pid = spawn_or_skip(child_reads_mask, &s, -1);
    CHECK(pid > 0);
    CHECK_INT(exit_status(pid), 0);
    CHECK(s.mask == ~unblockable);
    sigprocmask(SIG_SETMASK, &before, &after);
    CHECK(sigismember(&after, SIGUSR1) == 1);
    CHECK(sigismember(&after, SIGUSR2) == 0);
}

static void on_usr1(int sig)
{
    (void)sig;
}

static MGPU_CLONE_VM_CHILD int child_resets(void *arg)
{
    seen_t *s = arg;
    const int sigs[3] = {SIGUSR1, SIGUSR2, SIGHUP};
    long cur[4];

    mgpu_clone_vm_sig_default(SIGUSR1, 0); /* handled: back to SIG_DFL */
    mgpu_clone_vm_sig_default(SIGUSR2, 0); /* ignored: stays so */
    mgpu_clone_vm_sig_default(SIGHUP, 1);  /* ignored, but asked for always */
    for (int i = 0; i < 3; i++) {
        mgpu_clone_vm_syscall(SYS_rt_sigaction, sigs[i], 0, (long)cur, 8, 0, 0);
        s->handler[i] = cur[0];
    }
    return 0;
}

/* The child's signal table is its own (no CLONE_SIGHAND): what it resets stays as it was in
 * the parent. */
static void test_child_resets_its_own_handlers(void)
{
    struct sigaction sa, got;
    seen_t s;
    pid_t pid;

    NEED_CLONE_VM();
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, NULL);
    signal(SIGUSR2, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    memset(&s, 0, sizeof s);
    pid = spawn_or_skip(child_resets, &s, -1);
    CHECK(pid > 0);
    CHECK_INT(exit_status(pid), 0);
    CHECK(s.handler[0] == (long)SIG_DFL);
    CHECK(s.handler[1] == (long)SIG_IGN);
    CHECK(s.handler[2] == (long)SIG_DFL);
    sigaction(SIGUSR1, NULL, &got);
    CHECK(got.sa_handler == on_usr1);
    sigaction(SIGHUP, NULL, &got);
    CHECK(got.sa_handler == SIG_IGN);
}

static MGPU_CLONE_VM_CHILD int child_execs(void *arg)
{
    seen_t *s = arg;
    static char *const argv_missing[] = {"missing", 0}, *const argv_true[] = {"true", 0};
    static char *const envp[] = {0};

    s->exec_rc = mgpu_clone_vm_syscall(SYS_execve, (long)"/nonexistent/program", (long)argv_missing,
                                       (long)envp, 0, 0, 0);
    mgpu_clone_vm_syscall(SYS_execve, (long)"/bin/true", (long)argv_true, (long)envp, 0, 0, 0);
    return 99;
}

/* A failed execve is a negative errno in the child, with errno untouched; the parent resumes
 * once the second execve has replaced the child. */
static void test_child_execs(void)
{
    seen_t s;
    pid_t pid;

    NEED_CLONE_VM();
    memset(&s, 0, sizeof s);
    errno = 0;
    pid = spawn_or_skip(child_execs, &s, -1);
    CHECK(pid > 0);
    CHECK_INT(errno, 0);
    CHECK_INT(s.exec_rc, -ENOENT);
    CHECK_INT(exit_status(pid), 0);
}

static MGPU_CLONE_VM_CHILD int child_sleeps(void *arg)
{
    static char *const argv[] = {"sleep", "30", 0};
    static char *const envp[] = {0};
    (void)arg;
    mgpu_clone_vm_syscall(SYS_execve, (long)"/bin/sleep", (long)argv, (long)envp, 0, 0, 0);
    return 99;
}

/* With a cgroup's folder, the child is born in that group: counted at once, killed with it. */
static void test_child_born_in_cgroup(void)
{
    mgpu_cgroup_t cg;
    mgpu_err_t err = {0};
    char name[64];
    pid_t pid;

    NEED_CLONE_VM();
    snprintf(name, sizeof name, "mgpu-test-clonevm-%d", (int)getpid());
    if (mgpu_cgroup_create(&cg, NULL, name, &err) < 0)
        SKIP("no cgroup can be made here: %s", err.msg);
    pid = mgpu_clone_vm_spawn(child_sleeps, NULL, cg.dir_fd);
    if (pid == -ENOSYS || pid == -EINVAL) {
        mgpu_cgroup_close(&cg);
        mgpu_cgroup_remove(&cg, 100);
        SKIP("clone3 with CLONE_INTO_CGROUP is refused here: %s", strerror(-pid));
    }
    CHECK(pid > 0);
    CHECK_INT(mgpu_cgroup_count(&cg), 1);
    CHECK_INT(mgpu_cgroup_kill(&cg), 0);
    CHECK_INT(exit_status(pid), 1000 + SIGKILL);
    mgpu_cgroup_close(&cg);
    CHECK_INT(mgpu_cgroup_remove(&cg, 2000), 0);
}

/* A descriptor that is no cgroup: refused, no child, mask and errno as they were. */
static void test_refused_leaves_no_child(void)
{
    sigset_t before, after;
    seen_t s;
    pid_t pid;
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);

    NEED_CLONE_VM();
    memset(&s, 0, sizeof s);
    sigemptyset(&before);
    sigprocmask(SIG_SETMASK, &before, NULL);
    errno = EDOM;
    pid = spawn_or_skip(child_writes, &s, fd);
    CHECK(pid < 0);
    CHECK_INT(errno, EDOM);
    CHECK_INT(s.value, 0);
    CHECK_INT(waitpid(-1, NULL, WNOHANG), -1);
    sigprocmask(SIG_SETMASK, NULL, &after);
    CHECK(sigismember(&after, SIGTERM) == 0);
    close(fd);
}

int main(void)
{
    RUN(test_child_shares_memory_and_parent_waits);
    RUN(test_child_starts_with_every_signal_blocked);
    RUN(test_child_resets_its_own_handlers);
    RUN(test_child_execs);
    RUN(test_child_born_in_cgroup);
    RUN(test_refused_leaves_no_child);
    return check_done();
}
