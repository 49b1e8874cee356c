/* reaper.h - the launcher split in two around a subreaper that outlives it, for jobs that have
 * no cgroup of their own.
 *
 * Without a cgroup, process groups hold only what stays in them: a worker's child that calls
 * setsid, a daemon (double fork), a child that clears its environment leave them, and a
 * `kill -9` of the launcher (or of its process group) would leave those to init. An orphan
 * goes to the nearest subreaper among its ancestors, so the subreaper that ends them must be an
 * ancestor of the launcher that supervises the workers, not a child of it:
 *
 *   P0 (the pid the caller sees; stays in the caller's process group and session)
 *    └─ K (a session of its own, PR_SET_CHILD_SUBREAPER, "mgpu-keeper")
 *        └─ P1 (goes on with the launcher's steps: rendezvous, supervise, report)
 *
 * P0 forwards the signals a user or a scheduler sends (those of --signals_to_handle, by
 * default SIGINT, SIGTERM, SIGHUP and SIGQUIT; SIGUSR1, SIGUSR2, SIGWINCH) to P1 and exits
 * with P1's status (128+signal for a signal). K
 * reaps P1, SIGKILLs and reaps everything reparented to it until it has no child left, then
 * hands P1's status to P0. If P0 dies first (kill -9 of it or of its group: K and P1 are in
 * K's session, untouched), K SIGKILLs P1 and then everything reparented to it. P1 tells K
 * the files it makes on a pipe (keeper.h's messages); should P1 die before its "forget", K
 * removes them.
 *
 * Call before any thread exists: P1 goes on from the fork, and a fork keeps only the calling
 * thread. */
#ifndef MGPU_REAPER_H
#define MGPU_REAPER_H

#include <sys/types.h> /* pid_t */

/* Splits the launcher as above; stop_signals (bit 1 << N for signal N) are the signals P1
 * stops the job on. Returns -1 in P1 (go on with the job), with *keeper_fd the write end of
 * the pipe to K (close-on-exec; -1 when it could not be made), or in P0 the status the
 * launcher exits with. When no pipe or process could be made, returns -1 in the one launcher
 * there is and sets *why (the call that failed): the job runs without the reaper. */
int mgpu_reaper_start(unsigned long long stop_signals, const char **why, int *keeper_fd);

/* The children of the calling process (the kernel's list in /proc): its own, and orphans
 * reparented to it as a subreaper. Up to max pids into out; returns how many. */
int mgpu_reaper_children(pid_t *out, int max);

#endif
