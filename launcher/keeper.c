/* keeper.c - the keeper's messages and the removal of a dead launcher's files (see keeper.h). */
#include "keeper.h"

#include <dirent.h>      /* DT_DIR */
#include <errno.h>       /* errno */
#include <fcntl.h>       /* openat, O_DIRECTORY, O_NOFOLLOW */
#include <string.h>      /* strlen, memcpy */
#include <sys/syscall.h> /* SYS_getdents64 */
#include <unistd.h>      /* read, write, unlinkat, syscall */

/* The kernel's record of getdents64 (glibc's wrapper came in 2.30; the raw call is older). */
struct dirent64_rec {
    uint64_t d_ino;
    int64_t d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
};

/* The tree's depth the pruning goes to: each level holds a listing buffer on the stack. */
#define PRUNE_DEPTH 16

int mgpu_keeper_send(int fd, int32_t v)
{
    ssize_t r;

    while ((r = write(fd, &v, sizeof v)) < 0 && errno == EINTR)
        ;
    return r == (ssize_t)sizeof v ? 0 : r < 0 ? -errno : -EIO;
}

int mgpu_keeper_send_path(int fd, const char *path)
{
    char msg[2 * sizeof(int32_t) + MGPU_KEEPER_PATH_MAX];
    int32_t head[2] = {MGPU_KEEPER_PATH, (int32_t)strlen(path)};
    size_t n = sizeof head + (size_t)head[1];
    ssize_t r;

    if (head[1] == 0)
        return -EINVAL;
    if (head[1] >= MGPU_KEEPER_PATH_MAX)
        return -ENAMETOOLONG;
    memcpy(msg, head, sizeof head);
    memcpy(msg + sizeof head, path, (size_t)head[1]);
    /* One write of at most PIPE_BUF bytes: all of it reaches the pipe, or none. */
    while ((r = write(fd, msg, n)) < 0 && errno == EINTR)
        ;
    return r == (ssize_t)n ? 0 : r < 0 ? -errno : -EIO;
}

/* Reads n bytes: 1, 0 when nothing was there to read (EAGAIN before the first byte; start
 * says this is a message's start), -1 at EOF or on an error. The rest of a message is never
 * missing: it came in the same write. */
static int read_full(int fd, void *buf, size_t n, int start)
{
    size_t got = 0;

    while (got < n) {
        ssize_t r = read(fd, (char *)buf + got, n - got);
        if (r > 0)
            got += (size_t)r;
        else if (r < 0 && errno == EINTR)
            continue;
        else if (r < 0 && errno == EAGAIN && start && got == 0)
            return 0;
        else
            return -1;
    }
    return 1;
}

int mgpu_keeper_read(int fd, mgpu_keeper_paths_t *paths, int32_t *msg)
{
    int32_t len;
    char *slot;
    int rc;

    if ((rc = read_full(fd, msg, sizeof *msg, 1)) <= 0)
        return rc;
    if (*msg == MGPU_KEEPER_FORGET)
        paths->n = 0;
    if (*msg != MGPU_KEEPER_PATH)
        return 1;
    if (read_full(fd, &len, sizeof len, 0) < 0 || len <= 0 || len >= MGPU_KEEPER_PATH_MAX)
        return -1;
    if (paths->n >= MGPU_KEEPER_NPATHS) {
        /* A full table: the path is read all the same, to keep in step with the messages. */
        char skip[MGPU_KEEPER_PATH_MAX];
        return read_full(fd, skip, (size_t)len, 0) < 0 ? -1 : 1;
    }
    slot = paths->path[paths->n];
    if (read_full(fd, slot, (size_t)len, 0) < 0)
        return -1;
    slot[len] = '\0';
    paths->n++;
    return 1;
}

/* Prunes the folder name under dirfd (mgpu_keeper_prune). Returns 0, or -1 with errno when
 * name could not be opened as a folder (ENOTDIR, ELOOP for a symbolic link: not one). */
static int prune_at(int dirfd, const char *name, int depth)
{
    uint64_t buf[256]; /* 2 KiB, aligned as the kernel's records are */
    long n;
    int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

    if (fd < 0)
        return -1;
    /* A folder removed while its parent is being listed does not upset the listing (as with
     * `find -delete`): the entries not yet returned stay where they are. */
    while (depth < PRUNE_DEPTH && (n = syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0)
        for (long off = 0; off < n;) {
            struct dirent64_rec *d = (struct dirent64_rec *)((char *)buf + off);
            const char *s = d->d_name;

            off += d->d_reclen;
            if (s[0] == '.' && (s[1] == '\0' || (s[1] == '.' && s[2] == '\0')))
                continue;
            /* DT_UNKNOWN (some file systems): openat's O_DIRECTORY tells */
            if (d->d_type == DT_DIR || d->d_type == DT_UNKNOWN)
                prune_at(fd, s, depth + 1);
        }
    close(fd);
    unlinkat(dirfd, name, AT_REMOVEDIR); /* ENOTEMPTY: a file stays below */
    return 0;
}

void mgpu_keeper_prune(const char *dir)
{
    prune_at(AT_FDCWD, dir, 0);
}

void mgpu_keeper_clean(mgpu_keeper_paths_t *paths)
{
    for (int i = paths->n - 1; i >= 0; i--)
        if (prune_at(AT_FDCWD, paths->path[i], 0) < 0 && (errno == ENOTDIR || errno == ELOOP))
            unlink(paths->path[i]);
    paths->n = 0;
}
