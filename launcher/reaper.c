/* reaper.c - the launcher split around a subreaper that outlives it (see reaper.h). */
#include "reaper.h"

#include <errno.h>        /* errno */
#include <fcntl.h>        /* O_CLOEXEC, fcntl */
#include <poll.h>         /* poll */
#include <signal.h>       /* sigprocmask, kill */
#include <stdio.h>        /* fflush */
#include <stdlib.h>       /* strtol */
#include <sys/prctl.h>    /* PR_SET_CHILD_SUBREAPER, PR_SET_NAME */
#include <sys/signalfd.h> /* signalfd */
#include <sys/wait.h>     /* waitpid */
#include <unistd.h>       /* fork, setsid, pipe2 */

#include "keeper.h" /* mgpu_keeper_read, mgpu_keeper_clean */
#include "log.h"    /* mgpu_error */

static int read_int(int fd, int *v)
{
    size_t got = 0;
    ssize_t r;
    while (got < sizeof *v &&
           ((r = read(fd, (char *)v + got, sizeof *v - got)) > 0 || (r < 0 && errno == EINTR)))
        got += r > 0 ? (size_t)r : 0;
    return got == sizeof *v ? 0 : -1;
}

static void write_int(int fd, int v)
{
    while (write(fd, &v, sizeof v) < 0 && errno == EINTR)
        ;
}

int mgpu_reaper_children(pid_t *out, int max)
{
    char path[64], buf[8192];
    int n = 0, fd;
    ssize_t r;

    snprintf(path, sizeof path, "/proc/self/task/%d/children", (int)getpid());
    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return 0;
    r = read(fd, buf, sizeof buf - 1);
    close(fd);
    buf[r > 0 ? r : 0] = '\0';
    for (char *p = buf, *end; n < max; p = end) {
        long pid = strtol(p, &end, 10);
        if (end == p)
            break;
        out[n++] = (pid_t)pid;
    }
    return n;
}

/* SIGKILLs every child of this process and reaps it, again and again, until it has none: a
 * process that dies hands its own children to this one (the subreaper), and they are killed
 * in the next round. */
static void kill_children(void)
{
    pid_t kids[256];

    for (;;) {
        int n = mgpu_reaper_children(kids, 256);
        for (int i = 0; i < n; i++)
            kill(kids[i], SIGKILL);
        /* Blocks until one of them is gone; ECHILD: none is left. */
        if (waitpid(-1, NULL, 0) < 0 && errno == ECHILD)
            return;
        while (waitpid(-1, NULL, WNOHANG) > 0)
            ;
    }
}

/* K: a session of its own, subreaper of everything P1 starts. Returns -1 in P1, with *msg_w
 * the write end of the pipe K reads P1's messages on (keeper.h); K itself ends here. Forked
 * with every signal blocked; K keeps them blocked (no terminal signal or stray SIGTERM may end
 * it before its work is done) and reads SIGCHLD from a signalfd. Forked before any thread, K
 * may call anything; it shares the spawner's keeper's async-signal-safe cleanup all the same. */
static int keeper_main(int st_w, int life_r, const sigset_t *old, int *msg_w)
{
    sigset_t chld;
    struct pollfd pf[3];
    mgpu_keeper_paths_t paths = {0};
    int status = 0, ws, sfd, p1_done = 0, msg[2] = {-1, -1};
    int32_t v;
    pid_t self = getpid(), p1, pid;

    setsid();
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    /* Should the pipe fail, the job runs with nobody to remove its files if P1 is killed. */
    if (pipe2(msg, O_CLOEXEC) != 0)
        msg[0] = msg[1] = -1;
    p1 = fork();
    if (p1 == 0) {
        close(st_w);
        close(life_r);
        if (msg[0] >= 0)
            close(msg[0]);
        *msg_w = msg[1];
        /* Should K be killed, the job goes with it rather than run on with nobody to report
         * to; K may have died already between fork and prctl. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != self)
            _exit(128 + SIGKILL);
        sigprocmask(SIG_SETMASK, old, NULL);
        return -1;
    }
    if (p1 < 0) {
        write_int(st_w, -errno);
        _exit(0);
    }
    prctl(PR_SET_NAME, "mgpu-keeper");
    /* Nothing of the launcher's but its pipes: a wrapper reading the launcher's output must
     * see EOF when the job is over, not when K is. */
    for (int fd = 0; fd < 3; fd++)
        close(fd);
    if (msg[1] >= 0) {
        close(msg[1]);
        fcntl(msg[0], F_SETFL, O_NONBLOCK);
    }
    write_int(st_w, (int)p1);
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
    pf[0] = (struct pollfd){.fd = life_r, .events = POLLIN};
    pf[1] = (struct pollfd){.fd = sfd, .events = POLLIN};
    pf[2] = (struct pollfd){.fd = msg[0], .events = POLLIN};
    while (!p1_done) {
        struct signalfd_siginfo si;
        int r;

        /* Without a signalfd, poll wakes every 100 ms to reap. */
        if (poll(pf, 3, sfd < 0 ? 100 : -1) < 0 && errno != EINTR)
            break;
        while (sfd >= 0 && read(sfd, &si, sizeof si) == (ssize_t)sizeof si)
            ;
        /* P1's messages: only its paths matter here (it kills all its children anyway) */
        while (pf[2].fd >= 0 && pf[2].revents != 0 && (r = mgpu_keeper_read(msg[0], &paths, &v)))
            if (r < 0)
                pf[2].fd = -1; /* EOF: P1 is exiting; its SIGCHLD follows */
        while ((pid = waitpid(-1, &ws, WNOHANG)) > 0)
            if (pid == p1) {
                status = ws;
                p1_done = 1;
            }
        if (!p1_done && pf[0].fd >= 0 && pf[0].revents != 0) {
            /* EOF: P0 died (P0 never writes). P1 goes now; its workers die with it
             * (PDEATHSIG), and all they started is reparented here. */
            kill(p1, SIGKILL);
            pf[0].fd = -1;
        }
    }
    /* What P1 wrote before it ended, "forget" last when it ended normally. */
    while (msg[0] >= 0 && mgpu_keeper_read(msg[0], &paths, &v) > 0)
        ;
    kill_children();
    /* A P1 killed before its "forget" left its files: removed once nothing of the job can
     * write there any more, and before P0 hears that the job is over. */
    mgpu_keeper_clean(&paths);
    write_int(st_w, status);
    _exit(0);
}

int mgpu_reaper_start(unsigned long long stop_signals, const char **why, int *keeper_fd)
{
    int st[2], life[2], sfd, v = 0, status = -1;
    sigset_t all, old, mask;
    pid_t k, p1;
    /* What P0 forwards to P1: the signals P1 catches (what a terminal, `kill PID`, `timeout`
     * or a scheduler send to stop the job, and SIGUSR1/SIGUSR2, which it passes on), and a
     * terminal's new size. The others keep their disposition in P0 as in P1: a default one
     * ends P0, and K then ends the job, as it ends P1 by default. */
    unsigned long long forwarded =
        stop_signals | 1ull << SIGUSR1 | 1ull << SIGUSR2 | 1ull << SIGWINCH;

    *why = NULL;
    *keeper_fd = -1;
    if (pipe2(st, O_CLOEXEC) != 0) {
        *why = "pipe2";
        return -1;
    }
    if (pipe2(life, O_CLOEXEC) != 0) {
        *why = "pipe2";
        close(st[0]);
        close(st[1]);
        return -1;
    }
    fflush(stdout);
    fflush(stderr);
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &old);
    k = fork();
    if (k == 0) {
        close(st[0]);
        close(life[1]);
        return keeper_main(st[1], life[0], &old, keeper_fd);
    }
    close(st[1]);
    close(life[0]);
    if (k < 0 || read_int(st[0], &v) < 0 || v < 0) {
        errno = k < 0 ? errno : v < 0 ? -v : ECHILD;
        *why = "fork";
        if (k > 0)
            waitpid(k, NULL, 0);
        sigprocmask(SIG_SETMASK, &old, NULL);
        close(st[0]);
        close(life[1]);
        return -1;
    }
    p1 = (pid_t)v;

    /* P0: the forwarded signals arrive on a signalfd (those that came since the fork are
     * pending and come first); every other signal keeps its disposition, so Ctrl-Z still
     * stops this process as it stops any job. */
    sigemptyset(&mask);
    for (int sig = 1; sig < 64; sig++)
        if ((forwarded >> sig) & 1)
            sigaddset(&mask, sig);
    sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    for (int sig = 1; sfd >= 0 && sig < 64; sig++)
        if ((forwarded >> sig) & 1)
            sigaddset(&old, sig);
    sigprocmask(SIG_SETMASK, &old, NULL);
    for (;;) {
        struct pollfd pf[2] = {{.fd = st[0], .events = POLLIN}, {.fd = sfd, .events = POLLIN}};
        struct signalfd_siginfo si;

        if (poll(pf, sfd < 0 ? 1 : 2, -1) < 0 && errno != EINTR)
            break;
        while (sfd >= 0 && read(sfd, &si, sizeof si) == (ssize_t)sizeof si)
            kill(p1, (int)si.ssi_signo);
        if (pf[0].revents != 0) {
            if (read_int(st[0], &status) < 0) {
                mgpu_error("the keeper (pid %d) ended before the job: the job was killed", (int)k);
                status = -1;
            }
            break;
        }
    }
    waitpid(k, NULL, 0);
    close(st[0]);
    if (sfd >= 0)
        close(sfd);
    /* life[1] stays open until this process exits: its EOF tells K that P0 is gone. */
    if (status < 0)
        return 1;
    return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}
