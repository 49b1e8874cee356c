/* stacks.h - every rank's stack, on demand, bounded in time.
 *
 * For each pid, one outside tool prints the process's stack: `py-spy dump` for a Python
 * process when py-spy is installed (Python frames with file:line), else `gdb -batch` (native
 * frames of every thread), else `eu-stack`; a tool that fails hands over to the next one. All
 * pids are collected at once, each tool's output is kept up to MGPU_STACKS_MAX bytes, and
 * whatever still runs at the deadline is SIGKILLed: a wedged process, or a wedged tool, cannot
 * hang the launcher. The tools are looked up in PATH once per collection.
 *
 * Ownership: the callback receives the texts and owns them (free each, then the array); the
 * collection frees everything else itself, after the callback. */
#ifndef MGPU_STACKS_H
#define MGPU_STACKS_H

#include <sys/types.h> /* pid_t */
#include <uv.h>        /* uv_loop_t */

#include "error.h" /* mgpu_err_t */

/* The most output kept from one tool for one process; the rest is cut, with a note. */
#define MGPU_STACKS_MAX (64 * 1024)

/* texts[i] is the stack of pids[i] as text (malloc'd; "stack unavailable: <why>" when no
 * tool could get it); the callback owns texts and each texts[i]. */
typedef void (*mgpu_stacks_cb)(void *arg, char **texts, int n);

/* Starts collecting on loop (py-spy dump for a Python process when py-spy is installed,
 * else gdb -batch, else eu-stack), all pids at once, each tool killed after timeout_s; cb
 * runs on the loop once all are done. 0, or a negative code and err. */
int mgpu_stacks_collect(uv_loop_t *loop, const pid_t *pids, int n, double timeout_s,
                        mgpu_stacks_cb cb, void *arg, mgpu_err_t *err);

#endif
