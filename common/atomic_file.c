/* atomic_file.c - see atomic_file.h. */
#include "atomic_file.h"

#include <errno.h>    /* errno */
#include <fcntl.h>    /* open */
#include <limits.h>   /* PATH_MAX */
#include <stdio.h>    /* snprintf, rename */
#include <stdlib.h>   /* realpath */
#include <string.h>   /* strerror, strrchr, strncmp */
#include <sys/stat.h> /* stat, lstat, S_ISREG */
#include <unistd.h>   /* fsync, close, unlink, getpid, readlink */

#include "fdio.h" /* mgpu_fdio_write_all */
#include "path.h" /* mgpu_path_dirname */

/* A process's own descriptors under another name: /proc/self/fd/1, /dev/fd/2, /dev/stdout
 * (a link into /proc). Behind one may be the file a shell redirected to. */
static int own_descriptor(const char *path)
{
    char link[PATH_MAX];
    ssize_t n;
    if (strncmp(path, "/proc/", 6) == 0 || strncmp(path, "/dev/fd/", 8) == 0)
        return 1;
    if ((n = readlink(path, link, sizeof link - 1)) < 0)
        return 0;
    link[n] = 0;
    return strncmp(link, "/proc/", 6) == 0;
}

/* In place: something that is not a regular file (a terminal, a pipe, /dev/null, /dev/full),
 * which a rename would replace with a file, and a descriptor of the process
 * (--summary=/dev/stdout with stdout redirected to a log), whose file a rename would take away
 * from the shell. */
int mgpu_atomic_file_target(const char *path, char *to, size_t cap, int *in_place, mgpu_err_t *err)
{
    struct stat st, lst;
    char real[PATH_MAX], link[PATH_MAX], dir[PATH_MAX];
    ssize_t n;

    *in_place = 0;
    if (stat(path, &st) == 0) {
        if (S_ISDIR(st.st_mode))
            return mgpu_err_set(err, -EISDIR, "%s is a folder, expected a file", path);
        if (!S_ISREG(st.st_mode) || own_descriptor(path))
            *in_place = 1;
        else if (lstat(path, &lst) == 0 && S_ISLNK(lst.st_mode) && realpath(path, real) != NULL)
            path = real;
    } else if (lstat(path, &lst) == 0 && S_ISLNK(lst.st_mode) &&
               (n = readlink(path, link, sizeof link - 1)) > 0) {
        /* a link to a file not there yet: the file is made where the link points, as an
         * open() through the link would make it */
        link[n] = 0;
        if (link[0] == '/' || mgpu_path_dirname(path, dir, sizeof dir) < 0)
            snprintf(real, sizeof real, "%s", link);
        else
            snprintf(real, sizeof real, "%s/%s", dir, link);
        path = real;
    }
    if ((size_t)snprintf(to, cap, "%s", path) >= cap)
        return mgpu_err_set(err, -ENAMETOOLONG, "path too long: %s", path);
    return 0;
}

/* The buffers appended to what path already is (a device, a pipe, a descriptor). */
static int write_in_place(const char *path, const struct iovec *iov, int niov, mgpu_err_t *err)
{
    int fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC), rc = 0;
    if (fd < 0)
        return mgpu_err_set(err, -errno, "open(%s): %s", path, strerror(errno));
    for (int i = 0; i < niov && rc == 0; i++)
        if ((rc = mgpu_fdio_write_all(fd, iov[i].iov_base, iov[i].iov_len)) < 0)
            mgpu_err_set(err, rc, "write(%s): %s", path, strerror(-rc));
    if (close(fd) != 0 && rc == 0)
        rc = mgpu_err_set(err, -errno, "close(%s): %s", path, strerror(errno));
    return rc;
}

int mgpu_atomic_file_check(const char *given, mgpu_err_t *err)
{
    char path[4096], dir[4096];
    struct stat st;
    int rc, in_place;

    if ((rc = mgpu_atomic_file_target(given, path, sizeof path, &in_place, err)) < 0)
        return rc;
    if (in_place)
        return access(path, W_OK) == 0
                   ? 0
                   : mgpu_err_set(err, -errno, "cannot write to '%s': %s", given, strerror(errno));
    if (mgpu_path_dirname(path, dir, sizeof dir) < 0)
        return mgpu_err_set(err, -ENAMETOOLONG, "path too long: %s", path);
    if (stat(dir, &st) != 0)
        return mgpu_err_set(err, -errno, "folder '%s': %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return mgpu_err_set(err, -ENOTDIR, "'%s' is not a folder", dir);
    if (access(dir, W_OK | X_OK) != 0)
        return mgpu_err_set(err, -errno, "cannot write in '%s': %s", dir, strerror(errno));
    return 0;
}

/* tmp renamed over path (already resolved by mgpu_atomic_file_target), then the folder
 * synced. */
static int replace(const char *tmp, const char *path, int flags, mgpu_err_t *err)
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

int mgpu_atomic_file_commit(const char *tmp, const char *given, int flags, mgpu_err_t *err)
{
    char path[4096];
    int rc, in_place;

    if ((rc = mgpu_atomic_file_target(given, path, sizeof path, &in_place, err)) < 0)
        return rc;
    if (in_place)
        return mgpu_err_set(err, -EINVAL,
                            "%s is not a regular file (a device, a pipe or a descriptor), "
                            "expected a file that a new one can replace",
                            given);
    return replace(tmp, path, flags, err);
}

int mgpu_atomic_file_write(const char *given, const struct iovec *iov, int niov, int flags,
                           mgpu_err_t *err)
{
    char tmp[4200], path[4096];
    int fd, rc, in_place;

    if ((rc = mgpu_atomic_file_target(given, path, sizeof path, &in_place, err)) < 0)
        return rc;
    if (in_place)
        return write_in_place(path, iov, niov, err);
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
    if ((rc = replace(tmp, path, flags, err)) < 0)
        goto fail;
    return 0;
fail:
    if (fd >= 0)
        close(fd);
    unlink(tmp);
    return rc;
}
