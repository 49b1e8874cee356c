/* io_trace.c - an LD_PRELOAD library that logs the file calls whose order makes a write
 * durable, for tests/integration/test_durability.sh: with MGPU_IO_TRACE=FILE in the
 * environment, every process that loads it appends one line per call to FILE:
 *
 *   PID open PATH          open/openat/creat of PATH (a file or a directory)
 *   PID write PATH         write/pwrite/writev/fwrite to the regular file PATH
 *   PID fsync PATH         fsync/fdatasync of PATH (a file or a directory)
 *   PID rename OLD NEW     rename/renameat/renameat2, both paths absolute
 *
 * PATH is what /proc/self/fd says at the time of the call, so a file fsync'd after its rename
 * shows its new name. Lines are single O_APPEND writes, so processes do not tear each other's.
 * The library calls the real functions (dlsym RTLD_NEXT) and changes nothing they do. */
#include <dlfcn.h>       /* dlsym, RTLD_NEXT */
#include <errno.h>       /* errno */
#include <fcntl.h>       /* AT_FDCWD, O_CREAT */
#include <stdarg.h>      /* va_list */
#include <stdio.h>       /* snprintf, FILE */
#include <stdlib.h>      /* getenv */
#include <string.h>      /* strlen */
#include <sys/stat.h>    /* fstat, S_ISREG */
#include <sys/syscall.h> /* SYS_write, SYS_openat */
#include <sys/uio.h>     /* struct iovec */
#include <unistd.h>      /* syscall, readlink, getpid */

#define REAL(name) ((__typeof__(&name))dlsym(RTLD_NEXT, #name))

/* One line to the log, by raw system calls: the library's own I/O must not log itself. */
static void trace(const char *event, const char *a, const char *b)
{
    const char *path = getenv("MGPU_IO_TRACE");
    char line[8192];
    int saved = errno, n, fd;

    if (path == NULL || path[0] == '\0')
        return;
    n = snprintf(line, sizeof line, "%d %s %s%s%s\n", (int)getpid(), event, a, b ? " " : "",
                 b ? b : "");
    if (n > 0 && (size_t)n < sizeof line &&
        (fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC,
                           0644)) >= 0) {
        (void)!syscall(SYS_write, fd, line, (size_t)n);
        syscall(SYS_close, fd);
    }
    errno = saved;
}

static int fd_path(int fd, char *buf, size_t size)
{
    char link[64];
    ssize_t n;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    n = readlink(link, buf, size - 1);
    if (n < 0)
        return -1;
    buf[n] = '\0';
    return 0;
}

static void trace_fd(const char *event, int fd, int regular_only)
{
    char p[4096];
    struct stat st;
    if (fd < 0 || (regular_only && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))))
        return;
    if (fd_path(fd, p, sizeof p) == 0)
        trace(event, p, NULL);
}

/* PATH made absolute against DIRFD (AT_FDCWD: the working directory). */
static void absolute(int dirfd, const char *path, char *out, size_t size)
{
    char base[4096];
    if (path[0] == '/' || (dirfd == AT_FDCWD ? getcwd(base, sizeof base) == NULL
                                             : fd_path(dirfd, base, sizeof base) != 0))
        snprintf(out, size, "%s", path);
    else
        snprintf(out, size, "%s/%s", base, path);
}

#define OPEN_LIKE(name)                                                                            \
    int name(const char *path, int flags, ...)                                                     \
    {                                                                                              \
        mode_t mode = 0;                                                                           \
        if (flags & (O_CREAT | O_TMPFILE)) {                                                       \
            va_list ap;                                                                            \
            va_start(ap, flags);                                                                   \
            mode = va_arg(ap, mode_t);                                                             \
            va_end(ap);                                                                            \
        }                                                                                          \
        int fd = REAL(name)(path, flags, mode);                                                    \
        trace_fd("open", fd, 0);                                                                   \
        return fd;                                                                                 \
    }
OPEN_LIKE(open)
OPEN_LIKE(open64)

#define OPENAT_LIKE(name)                                                                          \
    int name(int dirfd, const char *path, int flags, ...)                                          \
    {                                                                                              \
        mode_t mode = 0;                                                                           \
        if (flags & (O_CREAT | O_TMPFILE)) {                                                       \
            va_list ap;                                                                            \
            va_start(ap, flags);                                                                   \
            mode = va_arg(ap, mode_t);                                                             \
            va_end(ap);                                                                            \
        }                                                                                          \
        int fd = REAL(name)(dirfd, path, flags, mode);                                             \
        trace_fd("open", fd, 0);                                                                   \
        return fd;                                                                                 \
    }
OPENAT_LIKE(openat)
OPENAT_LIKE(openat64)

int creat(const char *path, mode_t mode)
{
    int fd = REAL(creat)(path, mode);
    trace_fd("open", fd, 0);
    return fd;
}

ssize_t write(int fd, const void *buf, size_t len)
{
    trace_fd("write", fd, 1);
    return REAL(write)(fd, buf, len);
}

ssize_t pwrite(int fd, const void *buf, size_t len, off_t off)
{
    trace_fd("write", fd, 1);
    return REAL(pwrite)(fd, buf, len, off);
}

ssize_t pwrite64(int fd, const void *buf, size_t len, off64_t off)
{
    trace_fd("write", fd, 1);
    return REAL(pwrite64)(fd, buf, len, off);
}

ssize_t writev(int fd, const struct iovec *iov, int n)
{
    trace_fd("write", fd, 1);
    return REAL(writev)(fd, iov, n);
}

size_t fwrite(const void *buf, size_t size, size_t n, FILE *f)
{
    trace_fd("write", fileno(f), 1);
    return REAL(fwrite)(buf, size, n, f);
}

int fsync(int fd)
{
    int rc = REAL(fsync)(fd);
    if (rc == 0)
        trace_fd("fsync", fd, 0);
    return rc;
}

int fdatasync(int fd)
{
    int rc = REAL(fdatasync)(fd);
    if (rc == 0)
        trace_fd("fsync", fd, 0);
    return rc;
}

static void trace_rename(int olddir, const char *from, int newdir, const char *to)
{
    char a[4096], b[4096];
    absolute(olddir, from, a, sizeof a);
    absolute(newdir, to, b, sizeof b);
    trace("rename", a, b);
}

int rename(const char *from, const char *to)
{
    int rc = REAL(rename)(from, to);
    if (rc == 0)
        trace_rename(AT_FDCWD, from, AT_FDCWD, to);
    return rc;
}

int renameat(int olddir, const char *from, int newdir, const char *to)
{
    int rc = REAL(renameat)(olddir, from, newdir, to);
    if (rc == 0)
        trace_rename(olddir, from, newdir, to);
    return rc;
}

int renameat2(int olddir, const char *from, int newdir, const char *to, unsigned int flags)
{
    int rc = REAL(renameat2)(olddir, from, newdir, to, flags);
    if (rc == 0)
        trace_rename(olddir, from, newdir, to);
    return rc;
}
