/* remote.h - one job on many hosts over ssh (`mgpu-launch --hostfile FILE` / `--hosts`):
 * this launcher starts one mgpu-launch per host through OpenSSH, as ordinary static nodes of
 * one job (hosts.c builds their commands), and gives the job one lifetime:
 *   - the store's token is written on each ssh's standard input (the launcher there reads it
 *     with --rdzv_token_file -), never on a command line, once every host's launcher said it
 *     waits for it (MGPU_HOSTS_READY_LINE): a host that cannot be reached (or cannot run
 *     mgpu-launch) is named with ssh's own words, and nothing starts anywhere;
 *   - the hosts' output comes here, each line prefixed with its host;
 *   - the launchers there run with --watch_stdin: they stop their job when their ssh
 *     connection closes (this launcher killed, even by SIGKILL; ssh killed) or goes silent
 *     (the "alive N" lines sent every N s stop coming: the network gone), and take the signals
 *     this one gets (Ctrl-C) through it;
 *   - the first host that fails stops the others (they also learn it from the store);
 *   - the exit status is the failing host's (its failing rank's), or 128+N for a signal N.
 * Owns every process and handle it makes; nothing outlives mgpu_remote_main. */
#ifndef MGPU_REMOTE_H
#define MGPU_REMOTE_H

#include "cli.h"   /* mgpu_cli_t */
#include "error.h" /* mgpu_err_t */

/* Runs the job on the hosts cli names (or prints each host's command with --dry-run); argv is
 * the launcher's own. Returns the launcher's exit status. */
int mgpu_remote_main(const mgpu_cli_t *cli, int argc, char **argv);

/* --watch_stdin: a thread reads what is left of stdin (stdin itself becomes /dev/null, so no
 * worker inherits it): a line "signal N" raises signal N in this process; the end of the
 * stream, or 3 periods (+ 2 s) without a line after "alive N" (a period of N s), raises
 * SIGHUP, and the process is killed 3 s after its last child is gone should it not have
 * exited by then. Call in the process that supervises the job, after any fork of the
 * launcher (reaper.h). Returns 0 or a negative errno. */
int mgpu_remote_watch_stdin(mgpu_err_t *err);

#endif
