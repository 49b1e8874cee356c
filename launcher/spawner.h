/* spawner.h - starting one worker process, and the keeper that outlives a killed launcher.
 *
 * (Not spawn.h: the launcher's folder is on the include path, and that name would hide the
 * system's <spawn.h>.)
 *
 * Spawning follows libuv's src/unix/process.c, written out here because the child needs two
 * steps uv_spawn has no hook for: PR_SET_PDEATHSIG (with its race closed) and a new session.
 * A worker is started side by side where it can be (clone_vm.h: clone3 with CLONE_VM and no
 * CLONE_VFORK, straight into the job's cgroup): no copy of the launcher's page tables and no
 * copy-on-write faults after, which were over half of the launcher's start with 64 workers on
 * a 16-core host, and no wait for its exec either, so that the workers exec in parallel, as
 * a shell's `cmd &` loop's do. Such a child runs on a mapping of its own holding its own copy
 * of everything it reads (path, argv, envp, the signals to reset, the CPU set), since the
 * launcher goes on at once. It is forked otherwise: on other architectures, where the kernel
 * refuses clone3 or a flag, or where it must join the cgroup by writing cgroup.procs
 * (milliseconds each, which forked workers spend side by side). Either way the child runs the
 * same code, raw system calls only, and puts every handled signal back to its default before
 * it unblocks any (or is born with none, CLONE_CLEAR_SIGHAND), so a signal arriving before
 * exec cannot run the launcher's handler there. exec errors travel back on a close-on-exec
 * pipe, so a worker that could not start is known at once, with its errno, and is never
 * signalled as if it were running; that pipe's EOF is also what tells that the child no longer
 * runs on its mapping.
 *
 * Ownership: the caller owns every descriptor it passes. A worker's mapping (mem of
 * mgpu_spawner_worker) is the caller's to hand to mgpu_spawner_read_exec, which unmaps it at
 * the worker's exec pipe's EOF; it must not be unmapped before (the child may still run on
 * it), and a caller that never reads that pipe leaks it. The keeper's pipe end belongs to the
 * mgpu_spawner_keeper_t until mgpu_spawner_keeper_forget.
 *
 * Threads: mgpu_spawner_worker and mgpu_spawner_read_exec may run while the launcher's other
 * threads (the store's) run: a child started side by side reads nothing but its own mapping,
 * writes nothing but its own stack, and makes no call that sets errno, so it touches no
 * memory those threads use. */
#ifndef MGPU_SPAWNER_H
#define MGPU_SPAWNER_H

#include <sched.h>     /* cpu_set_t */
#include <stddef.h>    /* size_t */
#include <stdint.h>    /* int32_t */
#include <sys/types.h> /* pid_t */

#include "cgroup.h"   /* mgpu_cgroup_t */
#include "clone_vm.h" /* mgpu_clone_vm_mem_t */

/* Starts a worker that executes path with argv and envp, its stdout on out_w, its stderr on
 * err_w, in a session of its own, with nothing open but 0, 1, 2 and no signal blocked.
 * exec_w is the write end of a close-on-exec pipe: the child writes the moment of exec
 * (int64 ns, CLOCK_REALTIME) and, when execve fails, its errno (then exits 127 for ENOENT,
 * else 126). The signals in reset and SIGPIPE go back to their default action in the child,
 * even when ignored; every other signal with a handler too. The child is born in the job's
 * cgroup cg (or, where the kernel cannot do that, joins it first; NULL or a cg with no group:
 * none), and runs on the CPUs of cpus (NULL: the launcher's), which its threads and children
 * inherit. Call with every signal blocked. Returns the child's pid, or a negative errno when
 * no child could be made; either way *mem is the child's mapping (empty for a forked child,
 * or when none was made), for mgpu_spawner_read_exec.
 *
 * It returns without waiting for the exec: the child may still be on its way to execve, in
 * the launcher's session and process group, not yet tied to the launcher's death. The
 * caller's buffers (path, argv, envp, reset, cpus) are its own again at once: the child reads
 * its copy. */
pid_t mgpu_spawner_worker(const char *path, char *const argv[], char *const envp[], int out_w,
                          int err_w, int exec_w, const int *reset, int nreset,
                          const mgpu_cgroup_t *cg, const cpu_set_t *cpus, mgpu_clone_vm_mem_t *mem);

/* Reads what the child wrote on the exec pipe (read end exec_r) until EOF, which comes when
 * the child has exec'd or died: *t_exec gets the moment of exec in seconds (left alone when
 * the child died before it), *exec_errno the errno of a failed execve (left alone when exec
 * succeeded). Then unmaps the child's mapping mem (from mgpu_spawner_worker), and empties it;
 * a read that fails (not EINTR) leaves it mapped. The pipe's write end must be closed in the
 * caller first, and any other process that holds it delays the EOF until it closes it. */
void mgpu_spawner_read_exec(int exec_r, mgpu_clone_vm_mem_t *mem, double *t_exec, int *exec_errno);

struct winsize;

/* A pseudo-terminal for one of a worker's output streams, so that isatty() is true in the
 * worker (line-buffered stdout, colours) while the launcher still reads and prefixes what it
 * writes: *master for the launcher, *slave to pass as out_w or err_w. Both are close-on-exec.
 * Output processing is off, so bytes arrive as written ("\n" stays "\n"); echo is off. It is
 * not made the worker's controlling terminal: signals reach workers from the launcher alone.
 * ws (may be NULL) sets its window size. Returns 0, or a negative errno with *call naming the
 * call that failed. */
int mgpu_spawner_pty_open(int *master, int *slave, const struct winsize *ws, const char **call);

/* The size for a worker's terminal: the launcher's (console_fd's first, else any of its
 * standard streams that is a terminal), narrower by prefix_len, so that a bar drawn to the
 * full width still fits on one console line after its prefix (a wrapped line cannot be
 * redrawn with '\r'). Returns 0 when the launcher has no terminal. */
int mgpu_spawner_pty_size(int console_fd, size_t prefix_len, struct winsize *ws);

typedef struct mgpu_spawner_keeper {
    pid_t pid; /* -1 when none could be started, or the keeper is not a child */
    int fd;    /* write end of its pipe, -1 when none */
} mgpu_spawner_keeper_t;

/* The keeper: a small child of the launcher that outlives it. PR_SET_PDEATHSIG kills the
 * workers when the launcher dies, even by SIGKILL, but not what the workers started (a shell's
 * children, data-loader processes, daemons): those would be reparented to init and hold the
 * GPU. The keeper runs in a session of its own, so no signal to the launcher or to its process
 * group reaches it, and watches the launcher through a pipe (keeper.h's messages): when the
 * pipe reaches EOF before the launcher's "quit", the launcher died, and the keeper SIGKILLs
 * everything in the job's cgroup cg (when there is one), and every worker's process group the
 * launcher told it, then removes the cgroup; at EOF before "forget", it removes the files the
 * launcher told it. Without a keeper (pipe or fork failed) the run goes on, with workers still
 * tied to the launcher by PDEATHSIG. */
void mgpu_spawner_keeper_start(mgpu_spawner_keeper_t *k, const mgpu_cgroup_t *cg);
/* The keeper is the reaper's (reaper.h), the launcher's parent, which reads the same messages
 * on the pipe whose write end is fd (process groups and "quit" it has no use for: it kills all
 * its children when the launcher dies). */
void mgpu_spawner_keeper_attach(mgpu_spawner_keeper_t *k, int fd);
/* Tells the keeper one more process group to kill should the launcher die. */
void mgpu_spawner_keeper_tell(mgpu_spawner_keeper_t *k, pid_t pgid);
/* Tells the keeper a file or folder the launcher just made, to remove should it die before
 * mgpu_spawner_keeper_forget (a folder loses its empty folders only; keeper.h). */
void mgpu_spawner_keeper_tell_path(mgpu_spawner_keeper_t *k, const char *path);
/* The job's processes are over: the keeper kills nothing, and removes the cgroup should the
 * launcher have left it. It still watches for the files. */
void mgpu_spawner_keeper_release(mgpu_spawner_keeper_t *k);
/* The launcher removed its files, or keeps them on purpose: the keeper forgets them and exits
 * (after mgpu_spawner_keeper_release); closes the pipe. */
void mgpu_spawner_keeper_forget(mgpu_spawner_keeper_t *k);

#endif
