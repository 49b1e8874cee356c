/* fdio.h - whole-buffer reads and writes on descriptors, and the process's descriptor limit.
 *
 * write(2) and read(2) may move fewer bytes than asked (signals, pipes, quotas); these loop
 * until done. The caller owns the descriptors and the buffers. */
#ifndef MGPU_FDIO_H
#define MGPU_FDIO_H

#include <stddef.h> /* size_t */

/* Writes all n bytes. Retries on EINTR; on EAGAIN (a non-blocking descriptor, such as a
 * console the launcher shares with its workers) waits until it is writable again. Returns 0
 * or a negative errno (-EPIPE when the reader went away). */
int mgpu_fdio_write_all(int fd, const void *buf, size_t n);

/* Reads until n bytes came or the stream ended. Retries on EINTR. Returns the number of bytes
 * read (less than n only at end of stream), or a negative errno. */
long mgpu_fdio_read_all(int fd, void *buf, size_t n);

/* Raises the soft limit on open descriptors (RLIMIT_NOFILE) to want, or as far as the hard
 * limit allows; never lowers it. want < 0 asks for the hard limit. Returns the soft limit now
 * (a very large number when unlimited). */
long mgpu_fdio_raise_limit(long want);

/* Makes the file table hold fds descriptors (capped by the soft limit) now, by taking and
 * releasing the descriptor fds - 1. Linux grows a process's file table by copying it, and
 * when the process has threads it waits for an RCU grace period first: 20-30 ms measured on a
 * 16-core H200 host, where 8 workers (6 pipe ends each) took the table past 64 files after
 * the store's thread had started. Grown before any thread, it costs microseconds; it never
 * shrinks. */
void mgpu_fdio_grow_table(long fds);

#endif
