/* clone_vm.c - starting a child that shares the parent's memory until it execs (see
 * clone_vm.h). */
#include "clone_vm.h"

#include <errno.h>       /* ENOSYS */
#include <sched.h>       /* CLONE_VM */
#include <signal.h>      /* SIGCHLD, SIG_DFL, SIG_IGN, sigaction */
#include <stdint.h>      /* uint64_t, uintptr_t */
#include <sys/mman.h>    /* mmap, mprotect, munmap */
#include <sys/syscall.h> /* SYS_clone3, SYS_exit, SYS_rt_sigprocmask, SYS_rt_sigaction */
#include <unistd.h>      /* syscall, getpagesize */

/* The kernel's signal set, in bytes (_NSIG / 8 on both architectures built here). */
#define KSIGSET 8

void *mgpu_clone_vm_map(mgpu_clone_vm_mem_t *m, size_t size)
{
    size_t page = (size_t)getpagesize();
    size_t len = page + MGPU_CLONE_VM_STACK + (size + page - 1) / page * page;
    void *p;
    int e;

    m->base = NULL;
    m->len = 0;
    p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    /* The guard page: a child that outgrew its stack dies of SIGSEGV there rather than write
     * into whatever the parent mapped below. */
    if (mprotect(p, page, PROT_NONE) != 0) {
        e = errno;
        munmap(p, len);
        errno = e;
        return NULL;
    }
    m->base = p;
    m->len = len;
    return (char *)p + page + MGPU_CLONE_VM_STACK;
}

void mgpu_clone_vm_unmap(mgpu_clone_vm_mem_t *m)
{
    if (m->base != NULL)
        munmap(m->base, m->len);
    m->base = NULL;
    m->len = 0;
}

#if MGPU_CLONE_VM

/* clone3's argument, struct clone_args of <linux/sched.h> up to its `cgroup` field (88 bytes,
 * CLONE_ARGS_SIZE_VER2), written out as cgroup.c does: that header's CLONE_* names clash with
 * <sched.h>'s. */
struct clone3_args {
    uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls, set_tid,
        set_tid_size, cgroup;
};
#define CLONE3_CLEAR_SIGHAND 0x100000000ULL
#define CLONE3_INTO_CGROUP 0x200000000ULL

MGPU_CLONE_VM_CHILD long mgpu_clone_vm_syscall(long n, long a1, long a2, long a3, long a4, long a5,
                                               long a6)
{
#if defined(__x86_64__)
    register long r10 __asm__("r10") = a4;
    register long r8 __asm__("r8") = a5;
    register long r9 __asm__("r9") = a6;
    long ret;

    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(n), "D"(a1), "S"(a2), "d"(a3), "r"(r10), "r"(r8), "r"(r9)
                     : "rcx", "r11", "memory");
    return ret;
#else /* aarch64 */
    register long x8 __asm__("x8") = n;
    register long x0 __asm__("x0") = a1;
    register long x1 __asm__("x1") = a2;
    register long x2 __asm__("x2") = a3;
    register long x3 __asm__("x3") = a4;
    register long x4 __asm__("x4") = a5;
    register long x5 __asm__("x5") = a6;

    __asm__ volatile("svc #0"
                     : "+r"(x0)
                     : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5)
                     : "memory");
    return x0;
#endif
}

/* clone3 itself, and the child's first instructions. The kernel starts the child after the
 * system call with the parent's registers but a stack pointer of stack + stack_size and 0 as
 * the result. The parent returns at once and goes on using its own stack, so the child must
 * not touch that stack at all: before any compiled code runs, it marks the outermost frame,
 * calls fn(arg) on the new stack, and exits with its result, all from registers. The parent
 * gets the pid or -errno, as from any system call. Both architectures keep every register but
 * the result (and x86_64's rcx, r11) across a system call, so fn and arg are still there. */
static long clone3_enter(struct clone3_args *a, int (*fn)(void *), void *arg)
{
#if defined(__x86_64__)
    register long rax __asm__("rax") = SYS_clone3;
    register long rdi __asm__("rdi") = (long)a;
    register long rsi __asm__("rsi") = (long)sizeof *a;
    register long rdx __asm__("rdx") = (long)fn;
    register long r8 __asm__("r8") = (long)arg;

    __asm__ volatile("syscall\n\t"
                     "test %%rax, %%rax\n\t"
                     "jnz 1f\n\t"
                     "xor %%ebp, %%ebp\n\t" /* the child: no frame above this one */
                     "mov %%r8, %%rdi\n\t"
                     "call *%%rdx\n\t" /* the stack is 16-aligned here, as the ABI wants */
                     "mov %%eax, %%edi\n\t"
                     "mov %[nr_exit], %%eax\n\t"
                     "syscall\n\t"
                     "ud2\n"
                     "1:"
                     : "+r"(rax)
                     : "r"(rdi), "r"(rsi), "r"(rdx), "r"(r8), [nr_exit] "i"(SYS_exit)
                     : "rcx", "r11", "memory", "cc");
    return rax;
#else /* aarch64 */
    register long x8 __asm__("x8") = SYS_clone3;
    register long x0 __asm__("x0") = (long)a;
    register long x1 __asm__("x1") = (long)sizeof *a;
    register long x2 __asm__("x2") = (long)fn;
    register long x3 __asm__("x3") = (long)arg;

    __asm__ volatile("svc #0\n\t"
                     "cbnz x0, 1f\n\t"
                     "mov x29, xzr\n\t" /* the child: no frame above this one */
                     "mov x30, xzr\n\t"
                     "mov x0, x3\n\t"
                     "blr x2\n\t"
                     "mov x8, %[nr_exit]\n\t"
                     "svc #0\n\t"
                     "brk #0\n"
                     "1:"
                     : "+r"(x0)
                     : "r"(x8), "r"(x1), "r"(x2), "r"(x3), [nr_exit] "i"(SYS_exit)
                     : "memory", "cc");
    return x0;
#endif
}

pid_t mgpu_clone_vm_spawn(int (*fn)(void *), void *arg, const mgpu_clone_vm_mem_t *m, int cgroup_fd,
                          int flags)
{
    struct clone3_args a = {0};
    uint64_t all = ~(uint64_t)0, old;
    long pid;

    /* No CLONE_VFORK: the caller goes on at once, and the child runs on a stack of its own (m,
     * above its guard page), which the caller keeps mapped until the child has exec'd. */
    a.flags = CLONE_VM | (cgroup_fd >= 0 ? CLONE3_INTO_CGROUP : 0) |
              ((flags & MGPU_CLONE_VM_CLEAR_SIGHAND) ? CLONE3_CLEAR_SIGHAND : 0);
    a.exit_signal = SIGCHLD;
    a.stack = (uintptr_t)m->base + (uintptr_t)getpagesize();
    a.stack_size = MGPU_CLONE_VM_STACK;
    a.cgroup = cgroup_fd >= 0 ? (uint64_t)cgroup_fd : 0;
    /* Every signal blocked, glibc's own (SIGCANCEL, SIGSETXID) too, which sigprocmask would
     * leave open: the child inherits the mask and must not run a handler before it has reset
     * it (clone_vm.h). The raw calls leave errno as it was. */
    mgpu_clone_vm_syscall(SYS_rt_sigprocmask, SIG_BLOCK, (long)&all, (long)&old, KSIGSET, 0, 0);
    pid = clone3_enter(&a, fn, arg);
    mgpu_clone_vm_syscall(SYS_rt_sigprocmask, SIG_SETMASK, (long)&old, 0, KSIGSET, 0, 0);
    return (pid_t)pid;
}

MGPU_CLONE_VM_CHILD int mgpu_clone_vm_sig_default(int sig, int always)
{
    /* The kernel's struct sigaction: the handler first on both architectures, and all zeros
     * is SIG_DFL with no flags and an empty mask. */
    long dfl[4] = {0, 0, 0, 0}, cur[4];
    long rc;

    if (!always) {
        rc = mgpu_clone_vm_syscall(SYS_rt_sigaction, sig, 0, (long)cur, KSIGSET, 0, 0);
        if (rc < 0)
            return (int)rc;
        if (cur[0] == (long)SIG_DFL || cur[0] == (long)SIG_IGN)
            return 0;
    }
    return (int)mgpu_clone_vm_syscall(SYS_rt_sigaction, sig, (long)dfl, 0, KSIGSET, 0, 0);
}

#else /* no trampoline for this architecture: fork's child calls libc */

pid_t mgpu_clone_vm_spawn(int (*fn)(void *), void *arg, const mgpu_clone_vm_mem_t *m, int cgroup_fd,
                          int flags)
{
    (void)fn;
    (void)arg;
    (void)m;
    (void)cgroup_fd;
    (void)flags;
    return -ENOSYS;
}

long mgpu_clone_vm_syscall(long n, long a1, long a2, long a3, long a4, long a5, long a6)
{
    long r = syscall(n, a1, a2, a3, a4, a5, a6);
    return r < 0 ? -errno : r;
}

int mgpu_clone_vm_sig_default(int sig, int always)
{
    struct sigaction sa;

    if (!always) {
        if (sigaction(sig, NULL, &sa) != 0)
            return -errno;
        if (sa.sa_handler == SIG_DFL || sa.sa_handler == SIG_IGN)
            return 0;
    }
    return signal(sig, SIG_DFL) == SIG_ERR ? -errno : 0;
}

#endif
