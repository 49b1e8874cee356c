/* atomic_file.c - see atomic_file.h. */
#include "atomic_file.h"

#include <errno.h>  /* errno */
#include <fcntl.h>  /* open */
#include <stdio.h>  /* snprintf, rename */
#include <string.h> /* strerror, strrchr */
#include <unistd.h> /* fsync, close, unlink, getpid */

#include "fdio.h" /* mgpu_fdio_write_all */
#include "path.h" /* mgpu_path_dirname */

int mgpu_atomic_file_commit(const char *tmp, const char *path, int flags, mgpu_err_t *err)
{
    char dir[4096];
    int dfd, rc;

    if (mgpu_path_dirname(path, dir, sizeof dir) < 0)
        return mgpu_err_set(err, -ENAMETOOLONG, "path too long: %s", path);
    if (rename(tmp, path) != 0)
        return mgpu_err_set(err, -errno, "rename(%s, %s): %s", tmp, path, strerror(errno));
    if (flags & MGPU_ATOMIC_FILE_NO_SYNC)
        return 0;
    dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return mgpu_err_set(err, -errno, "open(%s): %s", dir, strerror(errno));
    rc = fsync(dfd) != 0 ? -errno : 0;
    close(dfd);
    if (rc < 0)
        return mgpu_err_set(err, rc, "fsync(%s): %s", dir, strerror(-rc));
    return 0;
}

int mgpu_atomic_file_write(const char *path, const struct iovec *iov, int niov, int flags,
                           mgpu_err_t *err)
{
    char tmp[4200];
    int fd, rc;

    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= sizeof tmp)
        return mgpu_err_set(err, -ENAMETOOLONG, "path too long: %s", path);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return mgpu_err_set(err, -errno, "open(%s): %s", tmp, strerror(errno));
    for (int i = 0; i < niov; i++)
        if ((rc = mgpu_fdio_write_all(fd, iov[i].iov_base, iov[i].iov_len)) < 0) {
            mgpu_err_set(err, rc, "write(%s): %s", tmp, strerror(-rc));
            goto fail;
        }
    if (!(flags & MGPU_ATOMIC_FILE_NO_SYNC) && fsync(fd) != 0) {
        rc = mgpu_err_set(err, -errno, "fsync(%s): %s", tmp, strerror(errno));
        goto fail;
    }
    if (close(fd) != 0) {
        fd = -1;
        rc = mgpu_err_set(err, -errno, "close(%s): %s", tmp, strerror(errno));
        goto fail;
    }
    fd = -1;
    if ((rc = mgpu_atomic_file_commit(tmp, path, flags, err)) < 0)
        goto fail;
    return 0;
fail:
    if (fd >= 0)
        close(fd);
    unlink(tmp);
    return rc;
}
