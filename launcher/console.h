/* console.h - the launcher's console (its stdout and stderr) as the workers' output reaches it.
 *
 * Every console is live, as a worker's own inherited stdout would be under torchrun: a progress
 * bar's '\r' update is shown as it comes, and an unfinished line once its stream has been quiet
 * for mgpu_console_quiet_ms (mgpu_linebuf_live): 50 ms on a terminal, 100 ms on a pipe or a
 * file, where a line a worker writes in two pieces is then less likely to show split when the
 * machine is busy. A console remembers whose unfinished line it shows, and ends that line
 * with a newline before another stream writes, so two workers' text never shares a console
 * line. fd 1 and 2 count as one console when they are the same terminal, pipe or file. A
 * console whose reader went away (EPIPE: `mgpu-launch ... | head`) is written no more, and the
 * run goes on.
 *
 * Ownership: the console keeps pointers to the line buffers it shows; the caller calls
 * mgpu_console_forget before freeing one. */
#ifndef MGPU_CONSOLE_H
#define MGPU_CONSOLE_H

#include <stddef.h> /* size_t */

#include "output.h" /* mgpu_linebuf_t */

typedef struct mgpu_console {
    int live[3];     /* fd 1, 2: partial lines shown as they come */
    int quiet_ms[3]; /* fd 1, 2: how long a stream is quiet before its partial line shows */
    int slot[3];     /* fd -> the console it writes to (2 -> 1 when both are the same) */
    int dead[3];     /* EPIPE seen on that fd: stop writing there */
    mgpu_linebuf_t *owner[3]; /* per slot: the stream whose unfinished line it shows, or NULL */
    int owner_fd[3];
    int one_terminal; /* fd 1 and 2 are one terminal (a console, not `2>file`) */
} mgpu_console_t;

/* force_tty: treat both as terminals (--tty). */
void mgpu_console_init(mgpu_console_t *c, int force_tty);
/* Whether the launcher's stdout and stderr are one terminal. */
int mgpu_console_one_terminal(const mgpu_console_t *c);
/* Whether fd (1 or 2; -1 is no console) shows partial lines. */
int mgpu_console_live(const mgpu_console_t *c, int fd);
/* How long fd's streams stay quiet before an unfinished line shows (ms; 0 for no console). */
int mgpu_console_quiet_ms(const mgpu_console_t *c, int fd);
/* Writes n bytes that lb handed out (whole lines, or part of one) to fd; -1 writes nothing. */
void mgpu_console_put(mgpu_console_t *c, int fd, mgpu_linebuf_t *lb, const char *p, size_t n);
/* lb's stream is closed: the console no longer points to it. */
/* Ends the unfinished line a worker's stream shows on fd's console, if one does (a newline;
 * the rest of that line comes with a prefix of its own): before the launcher writes there. */
void mgpu_console_end_line(mgpu_console_t *c, int fd);
void mgpu_console_forget(mgpu_console_t *c, const mgpu_linebuf_t *lb);

#endif
