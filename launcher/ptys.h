/* ptys.h - an attempt's pseudo-terminals, opened on a thread of their own while the supervisor
 * makes the attempt's folders and pipes and forks the workers.
 *
 * A worker whose output reaches a terminal gets a pseudo-terminal for stdout and one for
 * stderr, or one for both when the launcher's two are one terminal and nothing tells them
 * apart (spawner.h: mgpu_spawner_pty_open). Each costs some twenty microseconds of system
 * calls (the kernel's tty, its termios, its window), and opened one after the other in the
 * launcher's one thread they were the largest part of the difference between a launch on a
 * terminal and one on a pipe: 16 of them, a tenth of the start to exit of 8 workers. So a
 * thread opens them in the order the workers are forked, and the supervisor takes each pair as
 * it forks the worker that uses it, waiting only when it gets ahead of the thread.
 *
 * The thread makes system calls only (no malloc, no stdio, no lock of libc's): a worker
 * forked beside it, or a child made by fork, finds no lock held. Every descriptor it opens is
 * close-on-exec, so a worker forked while it runs holds a later worker's pair only until its
 * exec. Under MGPU_PTYS_THREAD_MIN pairs (one or two workers), or should the thread not start,
 * mgpu_ptys_take opens the pair itself, as before.
 *
 * Ownership: what mgpu_ptys_start allocates, and every pair not taken, is freed and closed by
 * mgpu_ptys_end, which waits for the thread; a pair taken is the caller's. */
#ifndef MGPU_PTYS_H
#define MGPU_PTYS_H

#include <pthread.h>   /* pthread_t, pthread_mutex_t, pthread_cond_t */
#include <sys/ioctl.h> /* struct winsize */

/* From this many pairs on, a thread opens them. */
#define MGPU_PTYS_THREAD_MIN 4

typedef struct mgpu_pty_pair {
    struct winsize ws; /* the window size to set, when has_ws */
    int has_ws;
    int master, slave; /* -1 until opened, and once taken */
    int err;           /* 0, or the negative errno of the call that failed */
    const char *call;  /* the call that failed */
} mgpu_pty_pair_t;

typedef struct mgpu_ptys {
    mgpu_pty_pair_t *pair; /* n of them; NULL: none asked for */
    int n;
    int ready;    /* pairs done (opened or failed), in order: written under mu by the thread */
    int threaded; /* the thread runs (or ran): else mgpu_ptys_take opens each pair itself */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} mgpu_ptys_t;

/* Empties p: no pairs; mgpu_ptys_end of it does nothing. */
void mgpu_ptys_init(mgpu_ptys_t *p);

/* Asks for n pairs: returns the array to fill in (each pair's ws and has_ws) before
 * mgpu_ptys_go, or NULL when out of memory. */
mgpu_pty_pair_t *mgpu_ptys_ask(mgpu_ptys_t *p, int n);

/* Starts opening the pairs asked for, on a thread from MGPU_PTYS_THREAD_MIN pairs on. */
void mgpu_ptys_go(mgpu_ptys_t *p);

/* Pair i (in the order asked for), once open: *master and *slave are the caller's (both
 * close-on-exec). Returns 0, or a negative errno with *call naming the call that failed. */
int mgpu_ptys_take(mgpu_ptys_t *p, int i, int *master, int *slave, const char **call);

/* Waits for the thread, closes every pair not taken, frees p's memory; p is empty again. */
void mgpu_ptys_end(mgpu_ptys_t *p);

#endif /* MGPU_PTYS_H */
