/* pages.h - the shared memory a group of local workers reports its progress on: one memfd of
 * nproc progress pages (progress.h: libmgpu writes them) and one heartbeat memfd per rank,
 * whose modification time any program may touch (MGPU_HEARTBEAT_FILE) to say it is alive.
 *
 * Only descriptors 0-2 reach a worker, so a worker opens /proc/<launcher pid>/fd/<fd>: the
 * same user may open (and touch) another process's memfd through that path. A memfd goes away
 * with its last holder, so nothing is left behind however the launcher ends.
 *
 * Ownership: mgpu_pages_open creates the descriptors and the mapping; mgpu_pages_close
 * releases them. */
#ifndef MGPU_PAGES_H
#define MGPU_PAGES_H

#include <stddef.h> /* size_t */
#include <stdint.h> /* int64_t */

#include "error.h"    /* mgpu_err_t */
#include "progress.h" /* mgpu_progress_page_t */

#define MGPU_HEARTBEAT_ENV "MGPU_HEARTBEAT_FILE"

typedef struct mgpu_pages {
    int n;     /* local workers */
    int fd;    /* the progress pages, n * MGPU_PROGRESS_PAGE bytes; -1 none */
    void *map; /* its shared mapping */
    size_t len;
    int *heartbeat_fds; /* n memfds */
} mgpu_pages_t;

/* Creates the pages of n workers (all zero) and their heartbeat files (close-on-exec).
 * Returns 0, or a negative code and err naming the call. */
int mgpu_pages_open(mgpu_pages_t *pg, int n, mgpu_err_t *err);
/* A new attempt starts: every page is zeroed (what the last workers wrote is gone). */
void mgpu_pages_reset(const mgpu_pages_t *pg);
/* A node of the job is lost: text (e.g. "ranks 2-3 (node 1, host h1) lost: heartbeat missed
 * for 15.0 s", cut to 255 bytes) goes into every local rank's page and its lost_seq is bumped
 * (progress.h), attached or not: libmgpu's collectives waiting in those workers fail with it
 * within a few milliseconds, and those started later fail at once. Until mgpu_pages_reset. */
void mgpu_pages_set_lost(const mgpu_pages_t *pg, const char *text);
/* A consistent copy of rank k's page into out; 0, or -1 when the worker did not attach. */
int mgpu_pages_read(const mgpu_pages_t *pg, int k, mgpu_progress_page_t *out);
/* The heartbeat file's modification time of rank k (CLOCK_REALTIME ns), or 0. */
int64_t mgpu_pages_heartbeat_ns(const mgpu_pages_t *pg, int k);
void mgpu_pages_close(mgpu_pages_t *pg);

#endif
