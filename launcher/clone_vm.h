/* clone_vm.h - starting a child that shares the parent's memory until it execs: clone3 with
 * CLONE_VM (and no CLONE_VFORK), on a stack of its own in a mapping of its own, optionally
 * straight into a cgroup (CLONE_INTO_CGROUP).
 *
 * fork(2) copies the parent's page tables, and each page either side then writes costs a
 * copy-on-write fault: the larger the launcher's address space (libuv, the store's thread, the
 * plan), the longer each worker's fork. A child that shares the parent's memory until it execs,
 * as in posix_spawn, costs neither. posix_spawn itself cannot do it here: it has no
 * PR_SET_PDEATHSIG and no CLONE_INTO_CGROUP. Unlike vfork and posix_spawn, the calling thread
 * does not wait for the child's exec: mgpu_clone_vm_spawn returns as soon as the child exists,
 * so that 64 children exec side by side on 64 cores rather than one after the other.
 *
 * So the parent goes on, and may change or free any of its memory, while the child still runs
 * before its exec: the child must read nothing but what lies in its own mapping
 * (mgpu_clone_vm_map: a guard page, its stack, then room for the caller's copy of everything
 * the child reads), and that mapping must outlive the child's use of it: unmap it only once
 * the child has exec'd or died (a close-on-exec pipe whose write end only the child holds
 * reaches EOF then: the kernel switches to the new program's memory, or releases a dying
 * child's, before it closes the child's descriptors).
 *
 * The child starts in fn(arg) on that stack, and exits with fn's return value through the exit
 * system call should fn return. Until it execs it shares every byte of the parent's memory,
 * the calling thread's thread-local storage included (errno), so fn and everything it calls
 * must:
 *   - make raw system calls only (mgpu_clone_vm_syscall, which sets no errno; no libc, no PLT
 *     lookup, no malloc, no stdio), read only its own mapping (and constants), and write only
 *     there;
 *   - put every signal with a handler back to SIG_DFL (mgpu_clone_vm_sig_default) before it
 *     unblocks any, unless it was started with MGPU_CLONE_VM_CLEAR_SIGHAND: a launcher handler
 *     run in the child would run on the launcher's memory. mgpu_clone_vm_spawn blocks every
 *     signal (glibc's internal ones too) across the clone, so the child starts with all of
 *     them blocked;
 *   - carry MGPU_CLONE_VM_CHILD, which keeps sanitizer instrumentation (whose runtime keeps
 *     per-thread state) and the stack protector (whose canary is in the parent's thread-local
 *     storage) out of it.
 *
 * Built for x86_64 and aarch64, which have an assembly trampoline here (the child must run on
 * the new stack from its first instruction: the parent is using the old one); elsewhere
 * MGPU_CLONE_VM is 0, mgpu_clone_vm_spawn returns -ENOSYS, and the system call and signal
 * helpers are plain libc calls, for a child made by fork.
 *
 * Ownership: the mapping is the caller's from mgpu_clone_vm_map to mgpu_clone_vm_unmap. */
#ifndef MGPU_CLONE_VM_H
#define MGPU_CLONE_VM_H

#include <stddef.h>    /* size_t */
#include <sys/types.h> /* pid_t */

#if defined(__x86_64__) || defined(__aarch64__)
#define MGPU_CLONE_VM 1
#else
#define MGPU_CLONE_VM 0
#endif

#if defined(__has_attribute)
#if __has_attribute(no_stack_protector)
#define MGPU_CLONE_VM_NO_SSP __attribute__((no_stack_protector))
#endif
#endif
#ifndef MGPU_CLONE_VM_NO_SSP
#define MGPU_CLONE_VM_NO_SSP
#endif
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 8)
#define MGPU_CLONE_VM_CHILD                                                                        \
    __attribute__((no_sanitize("address", "undefined"))) MGPU_CLONE_VM_NO_SSP
#else
#define MGPU_CLONE_VM_CHILD MGPU_CLONE_VM_NO_SSP
#endif

/* The child's stack: what the launcher's child code needs (a few hundred bytes) with a wide
 * margin; a multiple of 16, the alignment both ABIs want of the stack pointer. */
#define MGPU_CLONE_VM_STACK 16384

/* One child's mapping: [guard page][stack, MGPU_CLONE_VM_STACK bytes][the caller's bytes]. The
 * stack grows down towards the guard page, away from the caller's bytes. */
typedef struct mgpu_clone_vm_mem {
    void *base; /* NULL: none */
    size_t len;
} mgpu_clone_vm_mem_t;

/* Maps a child's memory with `size` bytes for the caller, zeroed; returns where they start
 * (aligned for any type), or NULL with errno set and m empty. */
void *mgpu_clone_vm_map(mgpu_clone_vm_mem_t *m, size_t size);

/* Unmaps it (nothing when empty), and empties m. Only once the child that ran on it has exec'd
 * or died, or when none was started on it. */
void mgpu_clone_vm_unmap(mgpu_clone_vm_mem_t *m);

/* The child starts with every signal handler at SIG_DFL (ignored signals stay ignored), as
 * after execve: CLONE_CLEAR_SIGHAND, Linux 5.5; older kernels refuse it with -EINVAL. */
#define MGPU_CLONE_VM_CLEAR_SIGHAND 1

/* Runs fn(arg) in a new process (exit signal SIGCHLD) that shares this one's memory, on the
 * stack of m (from mgpu_clone_vm_map), and returns at once: the child's pid, or a negative
 * errno and no child (-ENOSYS where it is not built, or where the kernel or a seccomp filter
 * refuses clone3; -EINVAL on a kernel that lacks one of the flags). arg and everything fn reads
 * should lie in m's bytes. cgroup_fd >= 0: the child is born in the cgroup whose folder that
 * descriptor is (Linux 5.7). flags: 0 or MGPU_CLONE_VM_CLEAR_SIGHAND. The calling thread's
 * signal mask and errno are as they were. Safe to call from several threads at once, each
 * with its own m. */
pid_t mgpu_clone_vm_spawn(int (*fn)(void *), void *arg, const mgpu_clone_vm_mem_t *m, int cgroup_fd,
                          int flags);

/* The system call n with six arguments: its result, or a negative errno (errno untouched where
 * MGPU_CLONE_VM is 1; elsewhere libc's syscall(), for a forked child). */
long mgpu_clone_vm_syscall(long n, long a1, long a2, long a3, long a4, long a5, long a6);

/* Puts signal sig back to SIG_DFL when it has a handler, or always when `always` is set (an
 * ignored signal stays ignored otherwise, as across execve). Returns 0 or a negative errno. */
int mgpu_clone_vm_sig_default(int sig, int always);

#endif
