/* test_ptys.c - an attempt's pseudo-terminals (launcher/ptys.h): opened in order on a thread
 * (or by the taker under MGPU_PTYS_THREAD_MIN pairs), each a working terminal of the size
 * asked for, output processing and echo off; pairs not taken closed at the end. */
#include "check.h"

#include <dirent.h>       /* opendir */
#include <errno.h>        /* EMFILE */
#include <sys/resource.h> /* setrlimit */
#include <fcntl.h>        /* fcntl, FD_CLOEXEC */
#include <string.h>       /* memcmp */
#include <sys/ioctl.h>    /* TIOCGWINSZ */
#include <termios.h>      /* tcgetattr */
#include <unistd.h>       /* isatty, read, write */

#include "ptys.h"

/* Open descriptors of this process. */
static int open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;

    if (d == NULL)
        return -1;
    while (readdir(d) != NULL)
        n++;
    closedir(d);
    return n - 3; /* ".", ".." and the directory's own */
}

/* A pair works: a terminal each side, close-on-exec, the size asked for, bytes through as
 * written. */
static void check_pair(int m, int s, const struct winsize *want)
{
    struct winsize ws;
    struct termios t;
    char buf[16];

    CHECK(m >= 0 && s >= 0);
    CHECK(isatty(s));
    CHECK(fcntl(m, F_GETFD) & FD_CLOEXEC);
    CHECK(fcntl(s, F_GETFD) & FD_CLOEXEC);
    CHECK(tcgetattr(s, &t) == 0);
    CHECK(!(t.c_oflag & OPOST));
    CHECK(!(t.c_lflag & ECHO));
    if (want != NULL) {
        CHECK(ioctl(s, TIOCGWINSZ, &ws) == 0);
        CHECK_INT(ws.ws_col, want->ws_col);
        CHECK_INT(ws.ws_row, want->ws_row);
    }
    CHECK_INT(write(s, "a\nb", 3), 3);
    CHECK_INT(read(m, buf, sizeof buf), 3);
    CHECK(memcmp(buf, "a\nb", 3) == 0); /* "\n" stays "\n" */
}

static void take_all(int n, int threaded)
{
    mgpu_ptys_t p;
    mgpu_pty_pair_t *pair;
    int before = open_fds();

    pair = mgpu_ptys_ask(&p, n);
    CHECK(pair != NULL);
    for (int i = 0; i < n; i++) {
        pair[i].has_ws = i % 2 == 0;
        pair[i].ws.ws_col = (unsigned short)(40 + i);
        pair[i].ws.ws_row = 10;
    }
    mgpu_ptys_go(&p);
    CHECK_INT(p.threaded, threaded);
    for (int i = 0; i < n; i++) {
        const char *call = NULL;
        int m = -1, s = -1;
        CHECK_INT(mgpu_ptys_take(&p, i, &m, &s, &call), 0);
        check_pair(m, s, pair[i].has_ws ? &pair[i].ws : NULL);
        close(m);
        close(s);
    }
    mgpu_ptys_end(&p);
    CHECK(p.pair == NULL && p.n == 0);
    CHECK_INT(open_fds(), before);
}

static void test_many_on_a_thread(void)
{
    take_all(16, 1);
}

static void test_few_by_the_taker(void)
{
    take_all(MGPU_PTYS_THREAD_MIN - 1, 0);
}

/* A fork that failed half way: the pairs not taken are closed by the end, and the thread is
 * waited for even when nothing was taken. */
static void test_untaken_closed(void)
{
    for (int taken = 0; taken <= 3; taken += 3) {
        mgpu_ptys_t p;
        int before = open_fds();
        CHECK(mgpu_ptys_ask(&p, 8) != NULL);
        mgpu_ptys_go(&p);
        for (int i = 0; i < taken; i++) {
            const char *call;
            int m, s;
            CHECK_INT(mgpu_ptys_take(&p, i, &m, &s, &call), 0);
            close(m);
            close(s);
        }
        mgpu_ptys_end(&p);
        CHECK_INT(open_fds(), before);
    }
}

/* Nothing asked for: nothing to end; an empty p ends as a no-op. */
static void test_none(void)
{
    mgpu_ptys_t p;

    CHECK(mgpu_ptys_ask(&p, 0) == NULL);
    mgpu_ptys_end(&p);
    mgpu_ptys_init(&p);
    mgpu_ptys_end(&p);
    CHECK(p.pair == NULL);
}

/* Where the terminals cannot be opened (no descriptor left), each pair says which call failed,
 * in order, and the taker gets the errno. */
static void test_failure_reported(void)
{
    struct rlimit lim = {64, 64};
    mgpu_ptys_t p;
    int fds[64], n = 0, e, m, s;
    const char *call = NULL;

    CHECK(setrlimit(RLIMIT_NOFILE, &lim) == 0);
    while (n < 64 && (fds[n] = dup(0)) >= 0) /* the table full */
        n++;
    CHECK(n < 64);
    CHECK(mgpu_ptys_ask(&p, 6) != NULL); /* memory, not a descriptor */
    mgpu_ptys_go(&p);
    CHECK_INT(p.threaded, 1);
    for (int i = 0; i < 6; i++) {
        e = mgpu_ptys_take(&p, i, &m, &s, &call);
        CHECK_INT(e, -EMFILE);
        CHECK_STR(call, "posix_openpt");
        CHECK_INT(m, -1);
        CHECK_INT(s, -1);
    }
    mgpu_ptys_end(&p);
    while (n > 0)
        close(fds[--n]);
}

int main(void)
{
    RUN(test_many_on_a_thread);
    RUN(test_few_by_the_taker);
    RUN(test_untaken_closed);
    RUN(test_none);
    RUN(test_failure_reported);
    return check_done();
}
