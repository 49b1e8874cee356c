/* fdio.c - see fdio.h. */
#include "fdio.h"

#include <errno.h>        /* errno */
#include <fcntl.h>        /* fcntl */
#include <limits.h>       /* LONG_MAX */
#include <poll.h>         /* poll */
#include <sys/resource.h> /* getrlimit, setrlimit */
#include <unistd.h>       /* read, write */

int mgpu_fdio_write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno == EAGAIN) {
            struct pollfd pfd = {.fd = fd, .events = POLLOUT};
            poll(&pfd, 1, 100);
            continue;
        }
        if (w < 0)
            return -errno;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

long mgpu_fdio_read_all(int fd, void *buf, size_t n)
{
    char *p = buf;
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, p + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        if (r == 0)
            break;
        got += (size_t)r;
    }
    return (long)got;
}

long mgpu_fdio_raise_limit(long want)
{
    struct rlimit rl;
    rlim_t w = want < 0 ? RLIM_INFINITY : (rlim_t)want;

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return -errno;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < w) {
        struct rlimit nl = rl;
        nl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= w ? w : rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &nl) == 0)
            rl = nl;
    }
    return rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > (rlim_t)LONG_MAX ? LONG_MAX
                                                                          : (long)rl.rlim_cur;
}

void mgpu_fdio_grow_table(long fds)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        (rlim_t)fds > rl.rlim_cur)
        fds = (long)rl.rlim_cur;
    if (fds <= 64)
        return;
    int fd = fcntl(2, F_DUPFD_CLOEXEC, (int)fds - 1); /* the lowest free one from fds - 1 */
    if (fd >= 0)
        close(fd);
}
