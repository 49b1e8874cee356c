/* atomic_file.h - replacing a file so that a reader, or the file system after a crash, sees
 * either the old contents or the new, never half of them.
 *
 * The bytes go to PATH.tmp.PID, which is fsynced (the data must be on disk before the rename
 * makes it the file, or a crash can leave the new name on an empty or partial file), renamed
 * over PATH, and then the directory is fsynced (the rename lives in the directory: without it
 * the new name may not survive a crash). A symlink to a file has its target replaced (the link
 * stays); a path that is not a regular file (a terminal, a pipe, /dev/null) or that names a
 * descriptor of the process (/dev/stdout, /proc/self/fd/N) is written in place, appended to,
 * since a rename would put a file where the device was or take a redirected log away from its
 * shell. The caller owns path and the buffers. */
#ifndef MGPU_ATOMIC_FILE_H
#define MGPU_ATOMIC_FILE_H

#include <sys/uio.h> /* struct iovec */

#include "error.h" /* mgpu_err_t */

/* Flags of mgpu_atomic_file_write. */
enum {
    /* Readers never see half a file, but a crash may lose it: no fsync of the file or the
     * directory (test helpers and scratch files, where an fsync's latency costs more than a
     * crash could). */
    MGPU_ATOMIC_FILE_NO_SYNC = 1,
};

/* Writes the niov buffers, in order, as the new contents of path. flags: 0 (durable) or
 * MGPU_ATOMIC_FILE_NO_SYNC. On failure the temporary file is removed, path is left as it was
 * (unless only the directory's fsync failed: the new file is then in place), and err names
 * the call and the file. Returns 0 or a negative errno. */
int mgpu_atomic_file_write(const char *path, const struct iovec *iov, int niov, int flags,
                           mgpu_err_t *err);

/* The file mgpu_atomic_file_write replaces for path, in to (cap bytes): path, or the final
 * target of a symlink to a regular file (its temporary goes beside that); *in_place set
 * instead where it writes in place. A folder is -EISDIR. 0 or a negative errno. */
int mgpu_atomic_file_target(const char *path, char *to, size_t cap, int *in_place, mgpu_err_t *err);

/* Whether mgpu_atomic_file_write could write path, without writing: a file (or a link's
 * target) in a folder this process may write in, or a device, pipe or descriptor of the
 * process it may write to; a folder is refused. 0, or a negative errno with err saying why. */
int mgpu_atomic_file_check(const char *path, mgpu_err_t *err);

/* Renames tmp, a complete file already synced by its writer, over path, then fsyncs path's
 * directory (flags as above): mgpu_atomic_file_write's last step, for a caller that writes
 * several files before any of them replaces its old one. tmp stays where it is on failure.
 * Returns 0 or a negative errno. */
int mgpu_atomic_file_commit(const char *tmp, const char *path, int flags, mgpu_err_t *err);

#endif
