/* clone_vm.h - a vfork-style start of a child: clone3 with CLONE_VM | CLONE_VFORK, on a stack of
 * its own, optionally straight into a cgroup (CLONE_INTO_CGROUP).
 *
 * fork(2) copies the parent's page tables, and each page either side then writes costs a
 * copy-on-write fault: the larger the launcher's address space (libuv, the store's thread, the
 * plan), the longer each worker's fork, and workers are forked one after the other. A child
 * that shares the parent's memory until it execs, as after vfork or in posix_spawn, costs
 * neither; the calling thread waits until the child has exec'd or exited (the launcher's other
 * threads run on). posix_spawn itself cannot do it here: it has no PR_SET_PDEATHSIG and no
 * CLONE_INTO_CGROUP.
 *
 * The child starts in fn(arg) on a stack carved from mgpu_clone_vm_spawn's frame (the calling
 * thread is suspended while the child uses it, as in musl's posix_spawn), and exits with fn's
 * return value through the exit system call should fn return. Until it execs it shares every
 * byte of the parent's memory, the calling thread's thread-local storage included (errno), so
 * fn and everything it calls must:
 *   - make raw system calls only (mgpu_clone_vm_syscall, which sets no errno; no libc, no PLT
 *     lookup, no malloc, no stdio), and write only to its own stack;
 *   - put every signal with a handler back to SIG_DFL (mgpu_clone_vm_sig_default) before it
 *     unblocks any: a launcher handler run in the child would run on the launcher's memory.
 *     mgpu_clone_vm_spawn blocks every signal (glibc's internal ones too) across the clone,
 *     so the child starts with all of them blocked;
 *   - carry MGPU_CLONE_VM_CHILD, which keeps sanitizer instrumentation (whose runtime keeps
 *     per-thread state) out of it.
 *
 * Built for x86_64 and aarch64, which have an assembly trampoline here (the child must switch
 * to the new stack before any compiled code runs); elsewhere MGPU_CLONE_VM is 0,
 * mgpu_clone_vm_spawn returns -ENOSYS, and the other two are plain libc calls, for a child
 * made by fork. */
#ifndef MGPU_CLONE_VM_H
#define MGPU_CLONE_VM_H

#include <sys/types.h> /* pid_t */

#if defined(__x86_64__) || defined(__aarch64__)
#define MGPU_CLONE_VM 1
#else
#define MGPU_CLONE_VM 0
#endif

#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 8)
#define MGPU_CLONE_VM_CHILD __attribute__((no_sanitize("address", "undefined")))
#else
#define MGPU_CLONE_VM_CHILD
#endif

/* Runs fn(arg) in a new process (exit signal SIGCHLD) that shares this one's memory, and
 * returns once it has exec'd or exited: the child's pid, or a negative errno and no child
 * (-ENOSYS where it is not built, or where the kernel or a seccomp filter refuses clone3;
 * -EINVAL on a kernel that lacks one of the flags). cgroup_fd >= 0: the child is born in the
 * cgroup whose folder that descriptor is (Linux 5.7). The calling thread's signal mask and
 * errno are as they were. */
pid_t mgpu_clone_vm_spawn(int (*fn)(void *), void *arg, int cgroup_fd);

/* The system call n with six arguments: its result, or a negative errno (errno untouched where
 * MGPU_CLONE_VM is 1; elsewhere libc's syscall(), for a forked child). */
long mgpu_clone_vm_syscall(long n, long a1, long a2, long a3, long a4, long a5, long a6);

/* Puts signal sig back to SIG_DFL when it has a handler, or always when `always` is set (an
 * ignored signal stays ignored otherwise, as across execve). Returns 0 or a negative errno. */
int mgpu_clone_vm_sig_default(int sig, int always);

#endif
