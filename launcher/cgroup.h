/* cgroup.h - a cgroup (v2) of its own for a job's processes, and ending everything in it.
 *
 * A process group or a session does not hold what a worker starts: a child that calls setsid,
 * a daemon (double fork), a child that clears its environment all leave them. A cgroup does:
 * every process forked inside it stays inside, and the kernel lists them all (cgroup.procs)
 * and kills them all at once (cgroup.kill, Linux 5.14). This is what Slurm's cgroup process
 * tracking and systemd's control-group kill do.
 *
 * The job's group is made under the launcher's own v2 group (found through /proc/self/cgroup
 * and the cgroup2 mount in /proc/self/mountinfo: hybrid layouts mount it at
 * /sys/fs/cgroup/unified, pure v2 ones at /sys/fs/cgroup), or under a parent group the caller
 * names (one delegated to the user). Where none can be made (no cgroup2 mount, no permission)
 * mgpu_cgroup_create says why and the caller falls back to process groups and a keeper.
 *
 * mgpu_cgroup_signal, mgpu_cgroup_kill and mgpu_cgroup_remove use only async-signal-safe calls
 * (no stdio, no malloc): the keeper, forked from the multi-threaded launcher, calls them.
 *
 * Ownership: the caller owns the mgpu_cgroup_t; procs_fd and dir_fd are close-on-exec and are
 * closed by mgpu_cgroup_close, which leaves the group itself to mgpu_cgroup_remove. */
#ifndef MGPU_CGROUP_H
#define MGPU_CGROUP_H

#include <stddef.h>    /* size_t */
#include <sys/types.h> /* pid_t */

#include "error.h" /* mgpu_err_t */

#define MGPU_CGROUP_PATH_MAX 1024

typedef struct mgpu_cgroup {
    char path[MGPU_CGROUP_PATH_MAX];        /* the job's group, "" when none */
    char procs[MGPU_CGROUP_PATH_MAX + 16];  /* path/cgroup.procs */
    char kill[MGPU_CGROUP_PATH_MAX + 16];   /* path/cgroup.kill, "" when the kernel lacks it */
    char freeze[MGPU_CGROUP_PATH_MAX + 16]; /* path/cgroup.freeze, "" when the kernel lacks it */
    int procs_fd; /* open for writing: a child writes "0" to it to join, -1 when none */
    int dir_fd;   /* the group's folder, for clone3's CLONE_INTO_CGROUP; -1 when none */
} mgpu_cgroup_t;

/* The mount point of the cgroup2 file system from the text of /proc/self/mountinfo, with its
 * root (the part of the hierarchy it shows, "/" but in a container or a bind mount).
 * Returns 0, or -ENOENT when there is no cgroup2 mount. */
int mgpu_cgroup_v2_mount(const char *mountinfo, char *mnt, size_t mnt_len, char *root,
                         size_t root_len);
/* The v2 group ("0::/path" line) from the text of /proc/self/cgroup. Returns 0, or -ENOENT. */
int mgpu_cgroup_v2_self(const char *proc_cgroup, char *path, size_t len);
/* The directory of group `self` under a mount of `root` at `mnt`. Returns 0, or -ENOENT when
 * the group is outside what the mount shows. */
int mgpu_cgroup_dir(const char *mnt, const char *root, const char *self, char *out, size_t len);

/* Makes the job's group `name` under `parent` (a group's directory), or under the launcher's
 * own v2 group when parent is NULL or "". cg->path is "" and err says why on failure. */
int mgpu_cgroup_create(mgpu_cgroup_t *cg, const char *parent, const char *name, mgpu_err_t *err);
/* Called in a child between fork and exec: moves it into the group. Returns 0 or -errno. */
int mgpu_cgroup_join(const mgpu_cgroup_t *cg);
/* Forks, as fork(2) does, a child that is born inside the group: clone3 with
 * CLONE_INTO_CGROUP (Linux 5.7). Moving a process afterwards (mgpu_cgroup_join) takes the
 * kernel's cgroup-wide write lock, which waits for an RCU grace period: 0.5 to 15 ms a worker
 * on a 2-core VM, where a fork into the group costs what a fork costs. Returns the child's pid
 * in the parent and 0 in the child; or -1 with errno and no child (EBADF: no group; ENOSYS: a
 * kernel before 5.7 or a seccomp filter that refuses clone3; or the kernel's refusal of the
 * group), when the caller forks and joins instead. The child must only make async-signal-safe
 * calls until it execs: it is not a fork of the C library's (no atfork handlers, and the
 * thread id the library keeps for it is its parent's). */
pid_t mgpu_cgroup_fork_into(const mgpu_cgroup_t *cg);
/* Number of processes in the group now (0 when none or no group). */
int mgpu_cgroup_count(const mgpu_cgroup_t *cg);
/* Sends sig to every process in the group. Returns how many were signalled. */
int mgpu_cgroup_signal(const mgpu_cgroup_t *cg, int sig);
/* SIGKILLs every process in the group: cgroup.kill (no process can escape by forking), else
 * frozen and killed one by one until the group is empty. Returns 0 or -errno. */
int mgpu_cgroup_kill(const mgpu_cgroup_t *cg);
/* Kills what is left and removes the group, waiting up to timeout_ms for the dying processes
 * to leave it. Returns 0 (or when there is no group), or -errno of the last rmdir. */
int mgpu_cgroup_remove(const mgpu_cgroup_t *cg, int timeout_ms);
/* Closes procs_fd and dir_fd (the group itself stays). */
void mgpu_cgroup_close(mgpu_cgroup_t *cg);

#endif
