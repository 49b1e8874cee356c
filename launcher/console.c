/* console.c - writing the workers' output to the launcher's console (see console.h). */
#include "console.h"

#include <errno.h>    /* EPIPE */
#include <string.h>   /* memset */
#include <sys/stat.h> /* fstat */
#include <unistd.h>   /* isatty */

#include "fdio.h" /* mgpu_fdio_write_all */

void mgpu_console_init(mgpu_console_t *c, int force_tty)
{
    struct stat a, b;

    memset(c, 0, sizeof *c);
    for (int fd = 1; fd <= 2; fd++) {
        c->live[fd] = 1;
        c->quiet_ms[fd] = force_tty || isatty(fd) ? 50 : 100;
        c->slot[fd] = fd;
    }
    /* `>log 2>&1`, or one terminal for both: one console, one line at a time across both */
    if (fstat(1, &a) == 0 && fstat(2, &b) == 0 &&
        (S_ISCHR(a.st_mode) ? S_ISCHR(b.st_mode) && a.st_rdev == b.st_rdev
                            : a.st_dev == b.st_dev && a.st_ino == b.st_ino)) {
        c->slot[2] = 1;
        c->one_terminal = S_ISCHR(a.st_mode) && isatty(1);
    }
}

int mgpu_console_one_terminal(const mgpu_console_t *c)
{
    return c->one_terminal;
}

int mgpu_console_live(const mgpu_console_t *c, int fd)
{
    return fd >= 1 && fd <= 2 && c->live[fd];
}

int mgpu_console_quiet_ms(const mgpu_console_t *c, int fd)
{
    return fd >= 1 && fd <= 2 ? c->quiet_ms[fd] : 0;
}

static void write_fd(mgpu_console_t *c, int fd, const char *p, size_t n)
{
    if (fd < 0 || c->dead[fd] || n == 0)
        return;
    if (mgpu_fdio_write_all(fd, p, n) == -EPIPE)
        c->dead[fd] = 1; /* `mgpu-launch ... | head`: keep supervising, stop printing */
}

void mgpu_console_put(mgpu_console_t *c, int fd, mgpu_linebuf_t *lb, const char *p, size_t n)
{
    int slot;

    if (fd < 1 || fd > 2 || n == 0)
        return;
    slot = c->slot[fd];
    if (c->owner[slot] != NULL && c->owner[slot] != lb) {
        write_fd(c, c->owner_fd[slot], "\n", 1);
        mgpu_linebuf_detach(c->owner[slot]);
    }
    write_fd(c, fd, p, n);
    c->owner[slot] = lb->live ? lb : NULL;
    c->owner_fd[slot] = fd;
}

void mgpu_console_end_line(mgpu_console_t *c, int fd)
{
    int slot;

    if (fd < 1 || fd > 2)
        return;
    slot = c->slot[fd];
    if (c->owner[slot] != NULL) {
        write_fd(c, c->owner_fd[slot], "\n", 1);
        mgpu_linebuf_detach(c->owner[slot]);
        c->owner[slot] = NULL;
    }
}

void mgpu_console_forget(mgpu_console_t *c, const mgpu_linebuf_t *lb)
{
    for (int i = 0; i < 3; i++)
        if (c->owner[i] == lb)
            c->owner[i] = NULL;
}
