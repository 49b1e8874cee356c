/* test_clone_vm.c - the side-by-side start (clone_vm.h): a child that shares the parent's
 * memory, runs on the stack of its own mapping while the parent goes on (several children at
 * once, none waiting for another's exec), dies on its guard page rather than overrun it,
 * starts with every signal blocked, resets handlers in its own table only (or is born with
 * none, CLONE_CLEAR_SIGHAND), is born in a cgroup when asked, and a refused clone leaves no
 * child and the caller's signal mask and errno as they were. */
#include <errno.h>       /* errno, ENOENT */
#include <fcntl.h>       /* open */
#include <signal.h>      /* sigaction, sigprocmask */
#include <stdint.h>      /* uint64_t, uintptr_t */
#include <stdio.h>       /* snprintf */
#include <string.h>      /* memset */
#include <sys/prctl.h>   /* PR_SET_DUMPABLE */
#include <sys/syscall.h> /* SYS_rt_sigprocmask, SYS_execve */
#include <sys/wait.h>    /* waitpid */
#include <unistd.h>      /* getpid */

#include "cgroup.h"
#include "check.h"
#include "clone_vm.h"
#include "watchdog.h"

#define NEED_CLONE_VM()                                                                            \
    do {                                                                                           \
        if (!MGPU_CLONE_VM)                                                                        \
            SKIP("no clone_vm trampoline for this architecture (the fork path is used)");          \
    } while (0)

/* a spawn that the kernel refuses here (before 5.3, a seccomp filter) is a skip, not a failure */
static pid_t spawn_or_skip(int (*fn)(void *), void *arg, const mgpu_clone_vm_mem_t *m,
                           int cgroup_fd, int flags)
{
    pid_t pid = mgpu_clone_vm_spawn(fn, arg, m, cgroup_fd, flags);
    if (pid == -ENOSYS)
        SKIP("clone3 is refused here (a kernel before 5.3, or a seccomp filter)");
    return pid;
}

/* A child's mapping with room for a T, which it gets as its argument: zeroed. */
#define MAP_FOR(m, T) ((T *)map_or_die((m), sizeof(T)))
static void *map_or_die(mgpu_clone_vm_mem_t *m, size_t size)
{
    void *p = mgpu_clone_vm_map(m, size);
    if (p == NULL) {
        printf("  mgpu_clone_vm_map(%zu): %s\n", size, strerror(errno));
        exit(1);
    }
    return p;
}

static int exit_status(pid_t pid)
{
    int status = 0;
    if (waitpid(pid, &status, 0) != pid)
        return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1000 + WTERMSIG(status);
}

/* What a child writes into its mapping, where the parent reads it. */
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

/* The child's write is in the parent's memory once it has exited: one address space. */
static void test_child_shares_memory(void)
{
    mgpu_clone_vm_mem_t m;
    seen_t *s;
    pid_t pid;

    NEED_CLONE_VM();
    s = MAP_FOR(&m, seen_t);
    errno = EDOM;
    pid = spawn_or_skip(child_writes, s, &m, -1, 0);
    CHECK_INT(errno, EDOM);
    CHECK(pid > 0);
    CHECK_INT(exit_status(pid), 7);
    CHECK_INT(s->value, 42);
    mgpu_clone_vm_unmap(&m);
    CHECK(m.base == NULL);
}

/* One of the children that meet: each says it has started, then waits for the parent's word,
 * which comes only once every child has started. */
typedef struct meet {
    int arrive_w, go_r, go_w, k;
    uintptr_t sp; /* an address on the child's stack */
} meet_t;

static MGPU_CLONE_VM_CHILD int child_meets(void *arg)
{
    meet_t *m = arg;
    volatile char c = (char)m->k;

    m->sp = (uintptr_t)&c;
    /* the parent's word or, should the parent be gone, EOF: never a wait for nothing */
    mgpu_clone_vm_syscall(SYS_close, m->go_w, 0, 0, 0, 0, 0);
    if (mgpu_clone_vm_syscall(SYS_write, m->arrive_w, (long)&c, 1, 0, 0, 0) != 1)
        return 1;
    if (mgpu_clone_vm_syscall(SYS_read, m->go_r, (long)&c, 1, 0, 0, 0) != 1)
        return 2;
    return 10 + m->k;
}

#define NMEET 8

/* NMEET children all alive at once, none of them done, before the parent lets any go: the
 * spawn does not wait for a child to exec or exit (a spawn that did would never return from
 * the first child, which waits for the parent: the watchdog ends that test). Each ran on the
 * stack of its own mapping, not the parent's. */
static void test_children_run_side_by_side(void)
{
    mgpu_clone_vm_mem_t m[NMEET];
    meet_t *a[NMEET];
    pid_t pid[NMEET];
    int arrive[2], go[2];
    char buf[NMEET];
    size_t page = (size_t)getpagesize();
    ssize_t got = 0, r;
    pid_t dog;

    NEED_CLONE_VM();
    dog = watchdog_start(60);
    CHECK(pipe2(arrive, O_CLOEXEC) == 0 && pipe2(go, O_CLOEXEC) == 0);
    for (int k = 0; k < NMEET; k++) {
        a[k] = MAP_FOR(&m[k], meet_t);
        a[k]->arrive_w = arrive[1];
        a[k]->go_r = go[0];
        a[k]->go_w = go[1];
        a[k]->k = k;
        pid[k] = spawn_or_skip(child_meets, a[k], &m[k], -1, 0);
        CHECK(pid[k] > 0);
    }
    while (got < NMEET && (r = read(arrive[0], buf + got, (size_t)(NMEET - got))) > 0)
        got += r;
    CHECK_INT(got, NMEET);
    for (int k = 0; k < NMEET; k++)
        CHECK(waitpid(pid[k], NULL, WNOHANG) == 0); /* all waiting for the word */
    memset(buf, 'g', sizeof buf);
    CHECK_INT(write(go[1], buf, NMEET), NMEET);
    for (int k = 0; k < NMEET; k++) {
        uintptr_t lo = (uintptr_t)m[k].base + page;
        CHECK_INT(exit_status(pid[k]), 10 + k);
        CHECK(a[k]->sp >= lo && a[k]->sp < lo + MGPU_CLONE_VM_STACK);
        mgpu_clone_vm_unmap(&m[k]);
    }
    watchdog_stop(dog);
    for (int i = 0; i < 2; i++) {
        close(arrive[i]);
        close(go[i]);
    }
}

static MGPU_CLONE_VM_CHILD int child_overruns(void *arg)
{
    /* the byte just below the stack: the guard page */
    *(volatile char *)(*(uintptr_t *)arg - 1) = 1;
    return 0;
}

/* Below the child's stack is a page that no one may touch: a child that outgrows its stack
 * dies there, and the parent lives on. */
static void test_guard_page_stops_overrun(void)
{
    mgpu_clone_vm_mem_t m;
    uintptr_t *bottom;
    pid_t pid;

    NEED_CLONE_VM();
    /* No core dump: before Linux 5.16, dumping one process's core killed every process that
     * shared its memory, this one too. */
    prctl(PR_SET_DUMPABLE, 0);
    bottom = MAP_FOR(&m, uintptr_t);
    *bottom = (uintptr_t)m.base + (uintptr_t)getpagesize();
    pid = spawn_or_skip(child_overruns, bottom, &m, -1, 0);
    CHECK(pid > 0);
    CHECK_INT(exit_status(pid), 1000 + SIGSEGV);
    mgpu_clone_vm_unmap(&m);
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
    mgpu_clone_vm_mem_t m;
    sigset_t before, after, one;
    seen_t *s;
    pid_t pid;

    NEED_CLONE_VM();
    s = MAP_FOR(&m, seen_t);
    sigemptyset(&one);
    sigaddset(&one, SIGUSR1);
    sigprocmask(SIG_SETMASK, &one, &before);
    pid = spawn_or_skip(child_reads_mask, s, &m, -1, 0);
    sigprocmask(SIG_SETMASK, NULL, &after); /* at once: the spawn restored it */
    CHECK(pid > 0);
    CHECK_INT(exit_status(pid), 0);
    CHECK(s->mask == ~unblockable);
    CHECK(sigismember(&after, SIGUSR1) == 1);
    CHECK(sigismember(&after, SIGUSR2) == 0);
    sigprocmask(SIG_SETMASK, &before, NULL);
    mgpu_clone_vm_unmap(&m);
}

static void on_usr1(int sig)
{
    (void)sig;
}

static MGPU_CLONE_VM_CHILD void read_handlers(seen_t *s)
{
    const int sigs[3] = {SIGUSR1, SIGUSR2, SIGHUP};
    long cur[4];

    for (int i = 0; i < 3; i++) {
        mgpu_clone_vm_syscall(SYS_rt_sigaction, sigs[i], 0, (long)cur, 8, 0, 0);
        s->handler[i] = cur[0];
    }
}

static MGPU_CLONE_VM_CHILD int child_resets(void *arg)
{
    mgpu_clone_vm_sig_default(SIGUSR1, 0); /* handled: back to SIG_DFL */
    mgpu_clone_vm_sig_default(SIGUSR2, 0); /* ignored: stays so */
    mgpu_clone_vm_sig_default(SIGHUP, 1);  /* ignored, but asked for always */
    read_handlers(arg);
    return 0;
}

static MGPU_CLONE_VM_CHILD int child_reads_handlers(void *arg)
{
    read_handlers(arg);
    return 0;
}

/* SIGUSR1 handled, SIGUSR2 and SIGHUP ignored, in the parent. */
static void set_handlers(void)
{
    struct sigaction sa;

    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, NULL);
    signal(SIGUSR2, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
}

/* The parent's handlers are as they were. */
static void check_parent_handlers(void)
{
    struct sigaction got;

    sigaction(SIGUSR1, NULL, &got);
    CHECK(got.sa_handler == on_usr1);
    sigaction(SIGHUP, NULL, &got);
    CHECK(got.sa_handler == SIG_IGN);
}

/* The child's signal table is its own (no CLONE_SIGHAND): what it resets stays as it was in
 * the parent. */
static void test_child_resets_its_own_handlers(void)
{
    mgpu_clone_vm_mem_t m;
    seen_t *s;
    pid_t pid;

    NEED_CLONE_VM();
    set_handlers();
    s = MAP_FOR(&m, seen_t);
    pid = spawn_or_skip(child_resets, s, &m, -1, 0);
    CHECK(pid > 0);
    CHECK_INT(exit_status(pid), 0);
    CHECK(s->handler[0] == (long)SIG_DFL);
    CHECK(s->handler[1] == (long)SIG_IGN);
    CHECK(s->handler[2] == (long)SIG_DFL);
    check_parent_handlers();
    mgpu_clone_vm_unmap(&m);
}

/* MGPU_CLONE_VM_CLEAR_SIGHAND: born with the handled signal at SIG_DFL, the ignored ones
 * still ignored, and the parent's table untouched. */
static void test_child_born_with_default_handlers(void)
{
    mgpu_clone_vm_mem_t m;
    seen_t *s;
    pid_t pid;

    NEED_CLONE_VM();
    set_handlers();
    s = MAP_FOR(&m, seen_t);
    pid = spawn_or_skip(child_reads_handlers, s, &m, -1, MGPU_CLONE_VM_CLEAR_SIGHAND);
    if (pid == -EINVAL) {
        mgpu_clone_vm_unmap(&m);
        SKIP("CLONE_CLEAR_SIGHAND is refused here (a kernel before 5.5)");
    }
    CHECK(pid > 0);
    CHECK_INT(exit_status(pid), 0);
    CHECK(s->handler[0] == (long)SIG_DFL);
    CHECK(s->handler[1] == (long)SIG_IGN);
    CHECK(s->handler[2] == (long)SIG_IGN);
    check_parent_handlers();
    mgpu_clone_vm_unmap(&m);
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

/* A failed execve is a negative errno in the child, with errno untouched; the second execve
 * replaces the child. */
static void test_child_execs(void)
{
    mgpu_clone_vm_mem_t m;
    seen_t *s;
    pid_t pid;

    NEED_CLONE_VM();
    s = MAP_FOR(&m, seen_t);
    errno = 0;
    pid = spawn_or_skip(child_execs, s, &m, -1, 0);
    CHECK(pid > 0);
    CHECK_INT(errno, 0);
    CHECK_INT(exit_status(pid), 0);
    CHECK_INT(s->exec_rc, -ENOENT);
    mgpu_clone_vm_unmap(&m);
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
    mgpu_clone_vm_mem_t m;
    mgpu_cgroup_t cg;
    mgpu_err_t err = {0};
    char name[64];
    pid_t pid;

    NEED_CLONE_VM();
    snprintf(name, sizeof name, "mgpu-test-clonevm-%d", (int)getpid());
    if (mgpu_cgroup_create(&cg, NULL, name, &err) < 0)
        SKIP("no cgroup can be made here: %s", err.msg);
    map_or_die(&m, 1);
    pid = mgpu_clone_vm_spawn(child_sleeps, NULL, &m, cg.dir_fd, 0);
    if (pid == -ENOSYS || pid == -EINVAL) {
        mgpu_cgroup_close(&cg);
        mgpu_cgroup_remove(&cg, 100);
        SKIP("clone3 with CLONE_INTO_CGROUP is refused here: %s", strerror(-pid));
    }
    CHECK(pid > 0);
    CHECK_INT(mgpu_cgroup_count(&cg), 1);
    CHECK_INT(mgpu_cgroup_kill(&cg), 0);
    CHECK_INT(exit_status(pid), 1000 + SIGKILL);
    mgpu_clone_vm_unmap(&m);
    mgpu_cgroup_close(&cg);
    CHECK_INT(mgpu_cgroup_remove(&cg, 2000), 0);
}

/* A descriptor that is no cgroup: refused, no child, mask and errno as they were. */
static void test_refused_leaves_no_child(void)
{
    mgpu_clone_vm_mem_t m;
    sigset_t before, after;
    seen_t *s;
    pid_t pid;
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);

    NEED_CLONE_VM();
    s = MAP_FOR(&m, seen_t);
    sigemptyset(&before);
    sigprocmask(SIG_SETMASK, &before, NULL);
    errno = EDOM;
    pid = spawn_or_skip(child_writes, s, &m, fd, 0);
    CHECK(pid < 0);
    CHECK_INT(errno, EDOM);
    CHECK_INT(s->value, 0);
    CHECK_INT(waitpid(-1, NULL, WNOHANG), -1);
    sigprocmask(SIG_SETMASK, NULL, &after);
    CHECK(sigismember(&after, SIGTERM) == 0);
    close(fd);
    mgpu_clone_vm_unmap(&m);
}

int main(void)
{
    RUN(test_child_shares_memory);
    RUN(test_children_run_side_by_side);
    RUN(test_guard_page_stops_overrun);
    RUN(test_child_starts_with_every_signal_blocked);
    RUN(test_child_resets_its_own_handlers);
    RUN(test_child_born_with_default_handlers);
    RUN(test_child_execs);
    RUN(test_child_born_in_cgroup);
    RUN(test_refused_leaves_no_child);
    return check_done();
}
