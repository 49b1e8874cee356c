/* supervisor.c - watching and stopping the workers (see supervisor.h); starting one worker is
 * spawner.c's. */
#include "supervisor_impl.h"

#include <dirent.h>    /* opendir */
#include <errno.h>     /* errno */
#include <fcntl.h>     /* open, O_CLOEXEC */
#include <signal.h>    /* kill, sigprocmask */
#include <stdarg.h>    /* va_list */
#include <stdio.h>     /* snprintf */
#include <stdlib.h>    /* calloc, mkdtemp */
#include <string.h>    /* strerror */
#include <sys/ioctl.h> /* FIONREAD, TIOCGWINSZ */
#include <sys/prctl.h> /* PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER */
#include <sys/stat.h>  /* mkdir, stat */
#include <sys/vfs.h>   /* statfs */
#include <sys/wait.h>  /* waitpid */
#include <unistd.h>    /* fork, execve */
#include <uv.h>        /* the event loop */

#include "cgroup.h"   /* mgpu_cgroup_create */
#include "clock.h"    /* mgpu_clock_real */
#include "console.h"  /* mgpu_console_put */
#include "fdio.h"     /* mgpu_fdio_write_all */
#include "fs.h"       /* mgpu_fs_mkdir_p, mgpu_fs_remove_tree */
#include "log.h"      /* mgpu_warn */
#include "output.h"   /* mgpu_linebuf_t */
#include "reaper.h"   /* mgpu_reaper_children */
#include "pages.h"    /* mgpu_pages_set_lost */
#include "shm_head.h" /* mgpu_shm_remove_stale */
#include "ptys.h"     /* mgpu_ptys_t */
#include "spawner.h"  /* mgpu_spawner_worker */
#include "trace.h"    /* mgpu_trace_mark */

extern char **environ;

/* Signals every worker group still running (and their process groups). stop: the signal
 * ends the attempt (the workers it kills were stopped by the launcher), else it is only
 * passed on (SIGUSR1 or SIGUSR2 outside --signals_to_handle). */
static void signal_all(sup_t *s, int sig, int stop)
{
    for (int k = 0; k < s->nproc; k++) {
        proc_t *p = &s->procs[k];
        if (!p->running || p->out->exec_errno)
            continue;
        if (p->out->stop_signal == 0 && stop)
            p->out->stop_signal = sig;
        if (kill(-p->pid, sig) != 0)
            kill(p->pid, sig); /* the worker moved itself to another process group */
        /* A stopped worker (SIGSTOP, Ctrl-Z, a debugger) would sit on its SIGTERM until the
         * SIGKILL: SIGCONT lets it act on it now, as Slurm does. */
        if (stop && sig != SIGKILL && sig != SIGCONT && kill(-p->pid, SIGCONT) != 0)
            kill(p->pid, SIGCONT);
    }
}

/* The signals the launcher catches: the list that stops the job (--signals_to_handle),
 * SIGUSR1 and SIGUSR2 (passed on when not in it), SIGCHLD. Any other keeps the disposition
 * the launcher was started with: the default (the launcher dies, its workers with it: their
 * PR_SET_PDEATHSIG, the keeper) or ignored (nohup). */
static void handled_signals(sup_t *s)
{
    unsigned long long set = s->plan->stop_signals | 1ull << SIGUSR1 | 1ull << SIGUSR2;

    s->nsigs = 0;
    for (int sig = 1; sig < 64 && s->nsigs < MGPU_SUP_MAX_SIGS - 1; sig++)
        if ((set >> sig) & 1)
            s->sig_nums[s->nsigs++] = sig;
    s->sig_nums[s->nsigs++] = SIGCHLD;
}

/* After the workers exited: whatever they left behind (their process groups, orphans
 * reparented to the launcher, and all that is still in the job's cgroup) gets sig. Returns how
 * many targets were signalled. */
static int sweep_leftovers(sup_t *s, int sig)
{
    pid_t kids[1024];
    int n = 0, nk = mgpu_reaper_children(kids, 1024);

    for (int k = 0; k < s->nproc; k++) {
        proc_t *p = &s->procs[k];
        if (p->pid > 0 && !p->running && kill(-p->pid, sig) == 0)
            n++;
    }
    for (int i = 0; i < nk; i++) {
        int worker = 0;
        for (int k = 0; k < s->nproc; k++)
            worker |= s->procs[k].pid == kids[i] && s->procs[k].running;
        worker |= kids[i] == s->keeper.pid;
        if (!worker && kill(kids[i], sig) == 0)
            n++;
    }
    if (s->running == 0)
        n += mgpu_cgroup_signal(&s->cg, sig);
    return n;
}

static void on_drain_timer(uv_timer_t *t)
{
    sup_t *s = t->data;
    /* Something outside the launcher's reach still holds a worker's pipe: stop reading. */
    s->drained = 1;
    for (int k = 0; k < s->nproc; k++)
        for (int i = 0; i < 2; i++)
            mgpu_relay_close(&s->procs[k].s[i]);
}

static void kill_everything(sup_t *s)
{
    s->killed = 1;
    for (int k = 0; k < s->nproc; k++) {
        proc_t *p = &s->procs[k];
        if (p->running && !p->out->exec_errno) {
            mgpu_warn("local rank %d (pid %d) did not stop within %gs: sending SIGKILL", k,
                      (int)p->pid, s->plan->grace_period);
            if (p->out->stop_signal == 0)
                p->out->stop_signal = SIGKILL;
            kill(-p->pid, SIGKILL);
        }
    }
    /* Everything in the job's cgroup at once: a leftover cannot escape by forking. */
    mgpu_cgroup_kill(&s->cg);
    sweep_leftovers(s, SIGKILL);
    uv_timer_start(&s->drain_timer, on_drain_timer, 2000, 0);
}

static void on_grace_timer(uv_timer_t *t)
{
    kill_everything(t->data);
}

/* Starts stopping the attempt: sig to every running worker group now, SIGKILL after grace. */
void mgpu_sup_stop_group(sup_t *s, int sig)
{
    signal_all(s, sig, 1);
    if (s->stopping)
        return;
    s->stopping = 1;
    if (s->plan->grace_period <= 0)
        kill_everything(s);
    else
        uv_timer_start(&s->grace_timer, on_grace_timer, (uint64_t)(s->plan->grace_period * 1000),
                       0);
}

/* Why execve(path) failed, in words. ENOENT for a file that exists means the interpreter of
 * its #! line is missing: say which, rather than the puzzling "No such file or directory". */
static void exec_reason(const char *exe, int e, char *buf, size_t len)
{
    char line[512];
    FILE *f;

    snprintf(buf, len, "'%s': %s", exe, strerror(e));
    if (e != ENOENT || access(exe, F_OK) != 0 || (f = fopen(exe, "re")) == NULL)
        return;
    if (fgets(line, sizeof line, f) != NULL && line[0] == '#' && line[1] == '!') {
        char *interp = line + 2;
        while (*interp == ' ' || *interp == '\t')
            interp++;
        interp[strcspn(interp, " \t\r\n")] = '\0';
        snprintf(buf, len, "'%s': its interpreter '%s' (from the #! line): %s", exe, interp,
                 strerror(e));
    }
    fclose(f);
}

static void record_exit(sup_t *s, proc_t *p, int status)
{
    mgpu_outcome_t *o = p->out;

    p->running = 0;
    s->running--;
    mgpu_debug("local rank %d exited (%d still running)", p->k, s->running);
    o->t_end = mgpu_clock_real();
    o->t_detected_mono = mgpu_clock_mono();
    if (o->exec_errno) {
        o->exit_code = o->exec_errno == ENOENT || o->exec_errno == ENOTDIR ? 127 : 126;
        exec_reason(s->plan->exe, o->exec_errno, o->exec_reason, sizeof o->exec_reason);
        o->state = MGPU_W_FAILED;
    } else if (WIFSIGNALED(status)) {
        o->signal = WTERMSIG(status);
        o->exit_code = 128 + o->signal;
        o->state = o->stop_signal ? MGPU_W_STOPPED : MGPU_W_FAILED;
    } else {
        o->exit_code = WEXITSTATUS(status);
        o->state = o->stop_signal ? MGPU_W_STOPPED
                                  : (o->exit_code == 0 ? MGPU_W_SUCCEEDED : MGPU_W_FAILED);
    }
    if (o->stalled) { /* the root cause of a stop by --stall_action fail */
        o->state = MGPU_W_FAILED;
        o->exit_code = 124;
    }
    if (o->state == MGPU_W_FAILED && s->root < 0 && !s->user_signal) {
        s->root = p->k;
        /* Teardown first, words after: the other workers' SIGTERM must not wait on stderr. */
        mgpu_sup_stop_group(s, SIGTERM);
        mgpu_sup_report_failure(s, o->rank, p->k, o->exit_code);
        if (o->exec_errno)
            mgpu_error("local rank %d (rank %d) could not be executed: %s (exit %d)", p->k, o->rank,
                       o->exec_reason, o->exit_code);
        else
            mgpu_info("local rank %d (rank %d, pid %d) failed with exit code %d; stopping the "
                      "others",
                      p->k, o->rank, (int)p->pid, o->exit_code);
    }
    if (s->running == 0) {
        mgpu_trace_mark("workers exit");
        /* Every worker exited: stop what they left behind, SIGKILL after the grace period
         * (at once when the SIGKILL already went out: a stubborn child of a worker killed
         * then was reparented here only when that worker died). */
        if (!s->swept && sweep_leftovers(s, s->killed ? SIGKILL : SIGTERM) > 0 && !s->stopping) {
            s->stopping = 1;
            uv_timer_start(&s->grace_timer, on_grace_timer,
                           (uint64_t)(s->plan->grace_period * 1000), 0);
        }
        s->swept = 1;
        /* Nothing is left to read when no process holds the pipes any more. */
    }
}

static void on_sigchld(sup_t *s)
{
    int status;
    pid_t pid;

    /* Reap everything: workers, and orphans reparented to the launcher as subreaper. */
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (int k = 0; k < s->nproc; k++)
            if (s->procs[k].pid == pid && s->procs[k].running) {
                record_exit(s, &s->procs[k], status);
                break;
            }
    }
    /* After the SIGKILL, orphans reparented here since (children of a process that just
     * died) get it too. */
    if (s->killed)
        sweep_leftovers(s, SIGKILL);
    mgpu_sup_maybe_finish(s);
}

static void on_signal(uv_signal_t *h, int sig)
{
    sup_t *s = h->data;

    if (sig == SIGCHLD) {
        on_sigchld(s);
        return;
    }
    if (!((s->plan->stop_signals >> sig) & 1)) {
        /* SIGUSR1 or SIGUSR2 outside --signals_to_handle: forwarded, not a stop. Slurm's
         * --signal=USR1@T warns jobs before their time limit, and the job should go on to
         * act on it (torchrun would die of it, leaving its workers behind). */
        mgpu_info("received SIG%s: forwarding it to the workers", sigabbrev_np(sig));
        signal_all(s, sig, 0);
        return;
    }
    if (s->in_round) {
        /* Between two attempts of an elastic job: no worker runs; the rendezvous gives up. */
        if (!s->user_signal)
            mgpu_warn("received SIG%s during the rendezvous: leaving the job", sigabbrev_np(sig));
        s->user_signal = s->user_signal ? s->user_signal : sig;
        mgpu_rdzv_cancel(s->rdzv);
        return;
    }
    if (s->ending && !s->user_signal) {
        /* This node's workers are over and it waits for the other nodes' to end (no deadline
         * while they run): it stops waiting, and they hear it as this node stopped. */
        mgpu_warn("received SIG%s while waiting for the other nodes to finish: leaving the job",
                  sigabbrev_np(sig));
        s->user_signal = sig;
        mgpu_rdzv_cancel(s->rdzv);
        return;
    }
    if (s->user_signal && sig == SIGINT) {
        mgpu_warn("second SIGINT: killing the workers now");
        kill_everything(s);
        return;
    }
    if (!s->user_signal) {
        s->user_signal = sig;
        mgpu_sup_report_failure(s, -1, -1, 128 + sig);
        mgpu_warn("received SIG%s: stopping the workers (SIGKILL after %gs%s)", sigabbrev_np(sig),
                  s->plan->grace_period, sig == SIGINT ? "; Ctrl-C again to kill at once" : "");
    }
    mgpu_sup_stop_group(s, sig);
}

/* Whether a worker's stream goes through a pseudo-terminal: --tty, --no_tty, or by default
 * when what it reaches is the launcher's own terminal (as if the worker ran there itself).
 * is_tty caches isatty of the launcher's stdout and stderr (-1: not asked yet). */
static int wants_pty(const sup_t *s, int console_fd, int is_tty[3])
{
    int tty = s->plan->output.tty;
    if (tty != 0 || console_fd < 1 || console_fd > 2)
        return tty > 0;
    if (is_tty[console_fd] < 0)
        is_tty[console_fd] = isatty(console_fd);
    return is_tty[console_fd];
}

static void on_winch(uv_signal_t *h, int sig)
{
    sup_t *s = h->data;

    (void)sig;
    for (int k = 0; k < s->nproc; k++) {
        proc_t *p = &s->procs[k];
        int resized = 0;
        for (int i = 0; i < 2; i++) {
            stream_t *st = &p->s[i];
            struct winsize ws;
            int fd;
            if (st->open && st->pty && uv_fileno((uv_handle_t *)&st->pipe, &fd) == 0 &&
                mgpu_spawner_pty_size(st->console_fd, strlen(p->prefix), &ws) &&
                ioctl(fd, TIOCSWINSZ, &ws) == 0)
                resized = 1;
        }
        /* The pty is not the worker's controlling terminal, so the kernel does not tell it;
         * the launcher does, as a terminal would. */
        if (resized && p->running)
            kill(-p->pid, SIGWINCH);
    }
}

static int open_log(const char *dir, const char *name, mgpu_err_t *err)
{
    char path[2500];
    int fd;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0)
        return mgpu_err_set(err, -errno, "open(%s): %s", path, strerror(errno));
    return fd;
}

/* A worker's stream on pseudo-terminal i of ptys: fd[0] the master, fd[1] the slave, and
 * *pty set; where none could be opened and --tty was not given, a pipe (a container without
 * devpts). */
static int take_pty(const sup_t *s, mgpu_ptys_t *ptys, int i, int k, int fd[2], int *pty,
                    mgpu_err_t *err)
{
    const char *call;
    int e = mgpu_ptys_take(ptys, i, &fd[0], &fd[1], &call);

    *pty = e == 0;
    if (e == 0)
        return 0;
    if (s->plan->output.tty > 0)
        return mgpu_err_set(err, e, "%s: %s (local rank %d)", call, strerror(-e), k);
    mgpu_warn("%s: %s; local rank %d writes to a pipe", call, strerror(-e), k);
    if (pipe2(fd, O_CLOEXEC) != 0)
        return mgpu_err_set(err, -errno, "pipe2: %s (local rank %d)", strerror(errno), k);
    return 0;
}

/* Each worker's prefix, and where its streams go: log files, console, and which go through a
 * pseudo-terminal, whose thread starts here (ptys.h). Cheap, and called as early as it can
 * be: for the first attempt, before the run's folder and the loop are made, so that the
 * terminals open meanwhile. */
static int plan_streams(sup_t *s, mgpu_err_t *err)
{
    const mgpu_plan_t *plan = s->plan;
    const mgpu_plan_output_t *o_opts = &plan->output;
    int npty = 0, is_tty[3] = {-1, -1, -1};

    for (int k = 0; k < s->nproc; k++) {
        proc_t *p = &s->procs[k];
        mgpu_outcome_t *o = &s->res->outcomes[k];
        int redirect = mgpu_std_spec_get(&o_opts->redirects, k);
        int tee = mgpu_std_spec_get(&o_opts->tee, k);
        int shown = o_opts->nfilter == 0;

        for (int i = 0; i < o_opts->nfilter; i++)
            shown |= o_opts->filter[i] == k;
        memset(o, 0, sizeof *o);
        o->local_rank = k;
        o->rank = plan->workers[k].rank;
        p->out = o;
        p->sup = s;
        p->k = k;
        p->pid = -1;
        if (o_opts->no_prefix)
            p->prefix[0] = '\0';
        else
            mgpu_prefix_format(
                o_opts->prefix_template[0] ? o_opts->prefix_template : "[rank${rank}]:", plan->role,
                k, o->rank, p->prefix, sizeof p->prefix);
        for (int i = 0; i < 2; i++) {
            stream_t *st = &p->s[i];
            int bit = i == 0 ? 1 : 2;
            memset(&st->lb, 0, sizeof st->lb);
            st->proc = p;
            st->which = bit;
            st->file_fd = -1;
            st->pty = 0;
            st->both = 0;
            /* torchrun: redirect = file only; tee = file and console. */
            st->console_fd = (redirect & bit) && !(tee & bit) ? -1 : (shown ? bit : -1);
            s->pty_slot[k][i] = wants_pty(s, st->console_fd, is_tty) ? npty++ : -1;
        }
        /* Both streams bound for the one terminal the launcher writes to, with nothing that
         * tells them apart (no log files, no filters): one pseudo-terminal carries both, as the
         * console would show them, and a start needs half the terminals (each costs some tens
         * of microseconds to open and to close). The failure report's tail is then the
         * worker's last lines of either stream. */
        if (s->pty_slot[k][0] >= 0 && s->pty_slot[k][1] >= 0 && !((redirect | tee) & 3) &&
            o_opts->dup[0].n == 0 && o_opts->dup[1].n == 0 && p->s[0].console_fd == 1 &&
            p->s[1].console_fd == 2 && mgpu_console_one_terminal(&s->con)) {
            p->s[0].both = 1;
            o->tail_both = 1;
            s->pty_slot[k][1] = -1;
            npty--;
        }
    }
    if (npty > 0) {
        mgpu_pty_pair_t *pair = mgpu_ptys_ask(&s->ptys, npty);
        if (pair == NULL)
            return mgpu_err_set(err, -ENOMEM, "out of memory (%d pseudo-terminals)", npty);
        for (int k = 0; k < s->nproc; k++)
            for (int i = 0; i < 2; i++)
                if (s->pty_slot[k][i] >= 0)
                    pair[s->pty_slot[k][i]].has_ws = mgpu_spawner_pty_size(
                        s->procs[k].s[i].console_fd, strlen(s->procs[k].prefix),
                        &pair[s->pty_slot[k][i]].ws);
        mgpu_ptys_go(&s->ptys);
    }
    s->streams_ready = 1;
    return 0;
}

int mgpu_sup_start_attempt(sup_t *s, mgpu_err_t *err)
{
    const mgpu_plan_t *plan = s->plan;
    const mgpu_plan_output_t *o_opts = &plan->output;
    char attempt_dir[2200];
    int pipes[MGPU_MAX_LOCAL][3][2];
    /* Each worker's mapping (spawner.h): this function's from the spawn until the read of its
     * exec pipe, which unmaps it once the worker has exec'd or died. */
    mgpu_clone_vm_mem_t mem[MGPU_MAX_LOCAL];
    sigset_t all, old;
    int rc = 0;

    s->root = -1;
    s->stopping = s->killed = s->swept = s->ending = s->drained = 0;
    mgpu_watch_attempt(s); /* before the workers exist: their pages start blank */
    if (s->multi)
        mgpu_sup_rdzv_work(s, MGPU_SUP_RW_WATCH, NULL);
    snprintf(attempt_dir, sizeof attempt_dir, "%s/attempt_%d", s->res->log_root, s->attempt);
    s->res->attempts++;
    mgpu_sup_record_world(s);

    /* --duplicate_std{out,err}_filters: one file an attempt, for every rank, as torchrun's */
    for (int i = 0; i < 2; i++) {
        if (s->filtered_fd[i] >= 0)
            close(s->filtered_fd[i]);
        s->filtered_fd[i] = -1;
        if (o_opts->dup[i].n == 0)
            continue;
        if ((rc = mgpu_fs_mkdir_p(attempt_dir)) < 0)
            return mgpu_err_set(err, rc, "mkdir(%s): %s", attempt_dir, strerror(-rc));
        s->filtered_fd[i] =
            open_log(attempt_dir, i == 0 ? "filtered_stdout.log" : "filtered_stderr.log", err);
        if (s->filtered_fd[i] < 0)
            return s->filtered_fd[i];
        s->res->keep_logs = 1;
    }
    for (int k = 0; k < s->nproc; k++)
        for (int i = 0; i < 3; i++)
            pipes[k][i][0] = pipes[k][i][1] = -1;
    if (!s->streams_ready && (rc = plan_streams(s, err)) < 0)
        return rc;
    s->streams_ready = 0;

    for (int k = 0; k < s->nproc; k++) {
        proc_t *p = &s->procs[k];
        mgpu_outcome_t *o = p->out;
        char rank_dir[2300];
        int redirect = mgpu_std_spec_get(&o_opts->redirects, k);
        int tee = mgpu_std_spec_get(&o_opts->tee, k);
        int fresh;

        snprintf(rank_dir, sizeof rank_dir, "%s/%d", attempt_dir, k);
        /* The attempt's folder once, then one mkdir a rank (not one a level); a folder made
         * now holds no error file of an earlier run to remove. */
        if (k == 0 && (rc = mgpu_fs_mkdir_p(attempt_dir)) < 0) {
            rc = mgpu_err_set(err, rc, "mkdir(%s): %s", attempt_dir, strerror(-rc));
            goto unmade;
        }
        fresh = mkdir(rank_dir, 0755) == 0;
        if (!fresh && errno != EEXIST) {
            rc = mgpu_err_set(err, -errno, "mkdir(%s): %s", rank_dir, strerror(errno));
            goto unmade;
        }
        snprintf(o->error_file, sizeof o->error_file, "%s/error.json", rank_dir);
        if (!fresh)
            unlink(o->error_file);
        for (int i = 0; i < 2; i++) {
            stream_t *st = &p->s[i];
            int bit = i == 0 ? 1 : 2;
            if ((redirect | tee) & bit) {
                st->file_fd = open_log(rank_dir, i == 0 ? "stdout.log" : "stderr.log", err);
                if (st->file_fd < 0) {
                    rc = st->file_fd;
                    goto unmade;
                }
                s->res->keep_logs = 1;
            }
        }
        /* The pipes now; a stream's pseudo-terminal as its worker is forked. */
        for (int i = 0; i < 3; i++) {
            if ((i < 2 && s->pty_slot[k][i] >= 0) || (i == 1 && p->s[0].both))
                continue;
            if (pipe2(pipes[k][i], O_CLOEXEC) != 0) {
                rc = mgpu_err_set(err, -errno, "pipe2: %s (local rank %d)", strerror(errno), k);
                goto unmade;
            }
        }
    }

    mgpu_debug("attempt %d: log folders and pipes ready", s->attempt);
    mgpu_trace_mark("pipes");
    /* Start every worker first, then collect exec results: the workers start in parallel. Until
     * its exec result is in, a worker may not have reached its own session yet, so nothing
     * signals the workers' groups before the second loop. */
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &old);
    for (int k = 0; k < s->nproc; k++) {
        proc_t *p = &s->procs[k];
        char **envp = mgpu_plan_env(plan, k, s->ft ? mgpu_filetimer_environ(s->ft) : environ,
                                    s->attempt, s->restarts, p->out->error_file);
        pid_t pid;

        for (int i = 0; i < 2 && rc == 0; i++)
            if (s->pty_slot[k][i] >= 0)
                rc = take_pty(s, &s->ptys, s->pty_slot[k][i], k, pipes[k][i], &p->s[i].pty, err);
        /* stdout's terminal failed to open and a pipe took its place: stderr gets its own */
        if (rc == 0 && p->s[0].both && !p->s[0].pty) {
            p->s[0].both = p->out->tail_both = 0;
            if (pipe2(pipes[k][1], O_CLOEXEC) != 0)
                rc = mgpu_err_set(err, -errno, "pipe2: %s (local rank %d)", strerror(errno), k);
        }
        if (rc == 0 && envp == NULL)
            rc = mgpu_err_set(err, -ENOMEM, "out of memory building the environment");
        if (rc < 0) {
            free(envp);
            break;
        }
        /* Stamped before fork: the timeline's "exec" (the process's start) comes after it. */
        p->out->t_start = mgpu_clock_real();
        pid = mgpu_spawner_worker(plan->exe, plan->workers[k].argv, envp, pipes[k][0][1],
                                  pipes[k][p->s[0].both ? 0 : 1][1], pipes[k][2][1], s->sig_nums,
                                  s->nsigs, &s->cg,
                                  plan->workers[k].bound ? &plan->workers[k].cpus : NULL, &mem[k]);
        free(envp); /* the worker has its own copy */
        if (pid < 0) {
            rc = mgpu_err_set(err, (int)pid, "fork: %s (local rank %d)", strerror((int)-pid), k);
            break;
        }
        p->pid = pid;
        mgpu_debug("local rank %d forked (pid %d)", k, (int)pid);
        mgpu_spawner_keeper_tell(&s->keeper, pid);
        p->running = 1;
        p->out->pid = pid;
        p->out->state = MGPU_W_RUNNING;
        s->running++;
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    mgpu_ptys_end(&s->ptys); /* every pair taken, unless a fork failed */
    mgpu_debug("attempt %d: %d workers forked", s->attempt, s->nproc);
    mgpu_trace_mark("fork");
    /* One node: the store's thread starts now, so that the workers fork from a launcher whose
     * only other thread makes system calls (rdzv.h); they may connect once they exec. */
    if (rc == 0)
        rc = mgpu_rdzv_serve(s->rdzv, err);

    for (int k = 0; k < s->nproc; k++) {
        proc_t *p = &s->procs[k];
        for (int i = 0; i < 3; i++)
            close(pipes[k][i][1]);
        if (p->pid > 0)
            mgpu_spawner_read_exec(pipes[k][2][0], &mem[k], &p->out->t_exec, &p->out->exec_errno);
        close(pipes[k][2][0]);
        for (int i = 0; i < 2; i++) {
            stream_t *st = &p->s[i];
            if (pipes[k][i][0] < 0) /* stderr on stdout's terminal */
                continue;
            if (p->pid <= 0) {
                close(pipes[k][i][0]);
                continue;
            }
            uv_pipe_init(&s->loop, &st->pipe, 0);
            st->pipe.data = st;
            uv_pipe_open(&st->pipe, pipes[k][i][0]);
            st->open = 1;
            s->open_streams++;
            uv_read_start((uv_stream_t *)&st->pipe, mgpu_relay_alloc, mgpu_relay_read);
        }
    }
    mgpu_debug("attempt %d: every worker executed (or failed to)", s->attempt);
    if (s->res->nworlds > 0)
        for (int k = 0; k < s->nproc; k++) {
            mgpu_attempt_record_t *w = &s->res->worlds[s->res->nworlds - 1];
            double t = s->procs[k].out->t_exec;
            if (t > 0 && (w->t_first_exec == 0 || t < w->t_first_exec))
                w->t_first_exec = t;
        }
    mgpu_trace_mark("exec");
    if (mgpu_trace_on()) {
        /* The children stamp their exec on CLOCK_REALTIME: brought onto the trace's clock */
        double first = 0, real = mgpu_clock_real();
        int64_t mono = mgpu_clock_mono_ns();
        for (int k = 0; k < s->nproc; k++)
            if (s->procs[k].out->t_exec > 0 && (first == 0 || s->procs[k].out->t_exec < first))
                first = s->procs[k].out->t_exec;
        if (first > 0)
            mgpu_trace_point("first exec", mono - (int64_t)((real - first) * 1e9));
    }
    if (rc < 0)
        mgpu_sup_stop_group(s, SIGKILL);
    return rc;

unmade: /* nothing forked yet */
    for (int k = 0; k < s->nproc; k++)
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 2; j++)
                if (pipes[k][i][j] >= 0)
                    close(pipes[k][i][j]);
    mgpu_ptys_end(&s->ptys);
    return rc;
}

void mgpu_sup_close_handles(sup_t *s)
{
    for (int i = 0; i < s->nsigs; i++)
        uv_close((uv_handle_t *)&s->sigs[i], NULL);
    uv_close((uv_handle_t *)&s->grace_timer, NULL);
    uv_close((uv_handle_t *)&s->drain_timer, NULL);
    uv_close((uv_handle_t *)&s->quiet_timer, NULL);
    uv_close((uv_handle_t *)&s->winch, NULL);
    mgpu_filetimer_close(s->ft);
    s->ft = NULL;
    mgpu_watch_close(s);
}

void mgpu_sup_fail(sup_t *s, int k, int code)
{
    if (s->root >= 0 || s->user_signal || s->stopping)
        return;
    s->root = k;
    mgpu_sup_stop_group(s, SIGTERM);
    mgpu_sup_report_failure(s, s->procs[k].out->rank, k, code);
}

void mgpu_sup_maybe_finish(sup_t *s)
{
    pid_t kids[4];

    if (s->finished || s->ending || s->running > 0 || s->open_streams > 0 || s->reports_pending > 0)
        return;
    int nk = mgpu_reaper_children(kids, 4), others = 0;
    for (int i = 0; i < nk; i++)
        others += kids[i] != s->keeper.pid;
    if (others > 0 && !s->drained)
        return; /* leftovers are stopping or dying; their SIGCHLD brings us back */
    uv_timer_stop(&s->grace_timer);
    uv_timer_stop(&s->drain_timer);
    /* What is left in the cgroup is no child of the launcher (a worker's descendant made
     * itself a subreaper): nothing would tell when it ends, so it ends now. */
    if (mgpu_cgroup_count(&s->cg) > 0)
        mgpu_cgroup_kill(&s->cg);
    /* A libmgpu rank 0 stopped while it waited for ranks that had failed leaves its shared
     * memory behind: no worker of this node lives now, so a dead creator's segment is
     * garbage, this job's or an earlier one's (shm_head.h). */
    int swept = mgpu_shm_remove_stale(NULL, (unsigned)getuid());
    if (swept > 0)
        mgpu_debug("removed %d shared-memory segment%s of dead workers", swept,
                   swept == 1 ? "" : "s");
    mgpu_debug("attempt %d over on this node", s->attempt);
    if (s->multi && s->res->rdzv_error) {
        mgpu_sup_attempt_done(s, 1, NULL); /* the store is gone: nobody to agree with */
        return;
    }
    if (s->multi) {
        /* Every node must end this attempt before any restarts or leaves. */
        s->ending = 1;
        mgpu_sup_rdzv_work(s, MGPU_SUP_RW_END, NULL);
        return;
    }
    mgpu_sup_attempt_done(s, s->root >= 0, NULL);
}

/* Where the run's temporary folder goes when there is no --log_dir: $TMPDIR when it is set,
 * as torchrun's tempfile does. Else a folder that only ever holds the workers' error files (no
 * --tee, --redirects or --duplicate_*_filters: no logs, which may be large) lives in memory:
 * $XDG_RUNTIME_DIR when it is this user's folder, else /dev/shm when it is a tmpfs; else /tmp.
 * The folder and one folder a rank are made at every start and removed at every exit: on a
 * disk they were most of the start (a 2-core VM's ext4 without a journal, mounted with
 * discard: 0.2-0.4 ms a mkdir, 0.1-3 ms an rmdir; tmpfs: 5 us). */
static const char *run_folder_base(const mgpu_plan_t *plan)
{
    const char *tmp = getenv("TMPDIR"), *xdg = getenv("XDG_RUNTIME_DIR");
    const mgpu_plan_output_t *o = &plan->output;
    struct stat st;
    struct statfs sf;
    int logs = o->dup[0].n > 0 || o->dup[1].n > 0;

    if (tmp != NULL && tmp[0])
        return tmp;
    for (int k = 0; k < plan->nproc; k++)
        logs |= (mgpu_std_spec_get(&o->redirects, k) | mgpu_std_spec_get(&o->tee, k)) != 0;
    if (logs)
        return "/tmp";
    if (xdg != NULL && xdg[0] == '/' && stat(xdg, &st) == 0 && S_ISDIR(st.st_mode) &&
        st.st_uid == getuid() && access(xdg, W_OK | X_OK) == 0)
        return xdg;
    if (statfs("/dev/shm", &sf) == 0 && sf.f_type == 0x01021994 /* TMPFS_MAGIC */ &&
        access("/dev/shm", W_OK | X_OK) == 0)
        return "/dev/shm";
    return "/tmp";
}

/* Before the launcher's own messages reach stderr: a worker's unfinished line shown there ends
 * first (mgpu_log's hook). Only in the launcher itself: a child between fork and exec that
 * logs writes to the worker's own descriptors. */
static pid_t console_pid;

static void end_stderr_line(void *con)
{
    if (getpid() == console_pid)
        mgpu_console_end_line(con, 2);
}

/* The expiration timers' view of the workers (filetimer.h). */
static int timer_worker_of(void *arg, pid_t pid, int *rank)
{
    sup_t *s = arg;
    for (int k = 0; k < s->nproc; k++)
        if (s->procs[k].running && s->procs[k].pid == pid) {
            *rank = s->procs[k].out->rank;
            return k;
        }
    return -1;
}

static void timer_expired(void *arg, int k, const char *line)
{
    sup_t *s = arg;
    snprintf(s->procs[k].out->note, sizeof s->procs[k].out->note, "%s", line);
}

int mgpu_sup_run(mgpu_plan_t *plan, mgpu_rdzv_t *rdzv, mgpu_cgroup_t *cg,
                 mgpu_spawner_keeper_t *keeper, mgpu_run_result_t *res, mgpu_err_t *err)
{
    sup_t *s = calloc(1, sizeof *s);
    long long keys0, keys1;
    int rc, published;

    memset(res, 0, sizeof *res);
    res->root = res->root_attempt = -1;
    res->t_start = mgpu_clock_real();
    if (s == NULL)
        return mgpu_err_set(err, -ENOMEM, "out of memory");
    s->plan = plan;
    s->res = res;
    s->rdzv = rdzv;
    s->filtered_fd[0] = s->filtered_fd[1] = -1;
    s->cg = *cg;
    s->keeper = *keeper;
    /* An elastic job that runs on one node now may grow: it keeps the store's agreement. */
    s->multi = rdzv != NULL && plan->rdzv.nnodes_max > 1;
    s->elastic = s->multi && (plan->rdzv.nnodes_min != plan->rdzv.nnodes_max || plan->rdzv.c10d);
    s->attempt = plan->round;
    s->restarts = plan->restarts;
    s->nproc = plan->nproc;
    s->procs = calloc((size_t)plan->nproc, sizeof *s->procs);
    s->pty_slot = calloc((size_t)plan->nproc, sizeof *s->pty_slot);
    res->outcomes = calloc((size_t)plan->nproc, sizeof *res->outcomes);
    res->nout = plan->nproc;
    mgpu_ptys_init(&s->ptys);
    if (s->procs == NULL || s->pty_slot == NULL || res->outcomes == NULL) {
        free(s->procs);
        free(s->pty_slot);
        free(s);
        return mgpu_err_set(err, -ENOMEM, "out of memory");
    }
    /* The first attempt's pseudo-terminals open while the run's folder and loop are made
     * (which streams share one depends on the console). */
    mgpu_console_init(&s->con, plan->output.tty > 0);
    console_pid = getpid();
    mgpu_log_before_write(end_stderr_line, &s->con);
    if ((rc = plan_streams(s, err)) < 0)
        goto out;

    /* The run's folder: error files always (TORCHELASTIC_ERROR_FILE), logs when asked. */
    if (plan->output.log_dir[0]) {
        char rnd[9];
        unsigned v = (unsigned)getpid() ^ (unsigned)(mgpu_clock_real() * 1e6);
        snprintf(rnd, sizeof rnd, "%08x", v * 2654435761u);
        snprintf(res->log_root, sizeof res->log_root, "%s/%s_%s", plan->output.log_dir,
                 plan->run_id, rnd);
        res->keep_logs = 1;
        if ((rc = mgpu_fs_mkdir_p(res->log_root)) < 0) {
            rc = mgpu_err_set(err, MGPU_E_USAGE, "--log_dir: mkdir(%s): %s", res->log_root,
                              strerror(-rc));
            goto out;
        }
    } else {
        snprintf(res->log_root, sizeof res->log_root, "%s/mgpu_%s_XXXXXX", run_folder_base(plan),
                 plan->run_id);
        if (mkdtemp(res->log_root) == NULL) {
            rc = mgpu_err_set(err, -errno, "mkdtemp(%s): %s", res->log_root, strerror(errno));
            goto out;
        }
        /* Should this process be killed, the keeper removes the folder's empty folders, and
         * keeps what the workers wrote. A folder under --log_dir is the user's: never told. */
        mgpu_spawner_keeper_tell_path(&s->keeper, res->log_root);
    }

    mgpu_trace_mark("run folder");
    uv_loop_init(&s->loop);
    if ((rc = mgpu_filetimer_open(&s->loop, environ,
                                  &(mgpu_filetimer_hooks_t){timer_worker_of, timer_expired, s},
                                  &s->ft, err)) < 0) {
        uv_loop_close(&s->loop);
        goto out;
    }
    if (s->ft != NULL) { /* the FIFO is removed before its folder: told after it */
        if (mgpu_filetimer_dir(s->ft)[0])
            mgpu_spawner_keeper_tell_path(&s->keeper, mgpu_filetimer_dir(s->ft));
        mgpu_spawner_keeper_tell_path(&s->keeper, mgpu_filetimer_path(s->ft));
    }
    signal(SIGPIPE, SIG_IGN);
    /* Orphans of the workers are reparented here, so teardown can find and reap them. */
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    handled_signals(s);
    for (int i = 0; i < s->nsigs; i++) {
        uv_signal_init(&s->loop, &s->sigs[i]);
        s->sigs[i].data = s;
        uv_signal_start(&s->sigs[i], on_signal, s->sig_nums[i]);
    }
    uv_timer_init(&s->loop, &s->grace_timer);
    uv_timer_init(&s->loop, &s->drain_timer);
    s->grace_timer.data = s->drain_timer.data = s;
    uv_timer_init(&s->loop, &s->quiet_timer);
    s->quiet_timer.data = s;
    uv_signal_init(&s->loop, &s->winch);
    s->winch.data = s;
    uv_signal_start(&s->winch, on_winch, SIGWINCH);
    mgpu_trace_mark("loop");
    /* The store's keys before any worker runs: the same number at the end means that no worker
     * published a timeline (mgpu_rdzv_num_keys), and 2 round trips a rank are saved. */
    if (rdzv == NULL || mgpu_rdzv_num_keys(rdzv, &keys0) < 0)
        keys0 = -1;
    if ((rc = mgpu_watch_init(s, err)) == 0)
        rc = mgpu_sup_start_attempt(s, err);
    /* `mgpu-launch status`'s socket: made once the workers run, off their way to exec. */
    if (rc == 0)
        mgpu_watch_serve(s);
    mgpu_trace_mark("status socket");
    if (rc < 0)
        mgpu_error("%s", err->msg);
    /* Exits that happened before the SIGCHLD handle existed are collected here too. */
    on_sigchld(s);
    uv_run(&s->loop, UV_RUN_DEFAULT);
    uv_loop_close(&s->loop);
    mgpu_rdzv_quiesce(rdzv); /* one node: the store's thread ends while the cgroup goes */
    mgpu_trace_mark("loop end");
    for (int i = 0; i < 2; i++)
        if (s->filtered_fd[i] >= 0)
            close(s->filtered_fd[i]);
    /* Every worker is gone: remove the job's cgroup (what is still in it dies: nothing of the
     * job may outlive it), release the keeper without letting it kill anything. It finishes
     * removing a group whose last processes are still exiting. */
    if (mgpu_cgroup_count(&s->cg) > 0)
        mgpu_cgroup_kill(&s->cg);
    mgpu_cgroup_close(&s->cg);
    if (mgpu_cgroup_remove(&s->cg, 50) == 0)
        s->cg.path[0] = '\0';
    mgpu_spawner_keeper_release(&s->keeper);
    mgpu_trace_mark("cgroup remove");
    res->signal = s->user_signal;
    res->t_end = mgpu_clock_real();
    /* The workers' startup timelines of the last attempt, when they published any. */
    published = rdzv != NULL;
    if (published && keys0 >= 0 && mgpu_rdzv_num_keys(rdzv, &keys1) == 0 && keys1 == keys0)
        published = 0;
    for (int k = 0; published && k < s->nproc; k++)
        mgpu_rdzv_read_timeline(rdzv, plan->run_id, s->attempt, res->outcomes[k].rank,
                                res->outcomes[k].timeline, sizeof res->outcomes[k].timeline);
    /* The report prints the error files' paths: without --log_dir they must not go with the
     * temporary folder. */
    for (int k = 0; k < res->nout; k++)
        res->keep_error_files |= access(res->outcomes[k].error_file, F_OK) == 0;
    for (int i = 0; i < res->nhistory; i++)
        res->keep_error_files |= access(res->history[i].error_file, F_OK) == 0;
    mgpu_trace_mark("timelines");
    if (s->user_signal)
        res->exit_code = 128 + s->user_signal;
    else if (res->root >= 0)
        res->exit_code = res->outcomes[res->root].exit_code;
    else if (res->remote)
        res->exit_code = res->remote_failure.exit_code;
    else
        res->exit_code = rc < 0 || res->rdzv_error ? 1 : 0;
    rc = 0;
out:
    mgpu_log_before_write(NULL, NULL);
    mgpu_ptys_end(&s->ptys); /* pairs left by a run that ended before its first fork */
    *cg = s->cg;
    *keeper = s->keeper;
    mgpu_outbuf_free(&s->ob);
    free(s->stall);
    free(s->procs);
    free(s->pty_slot);
    free(s);
    return rc;
}

void mgpu_run_result_free(mgpu_run_result_t *res)
{
    if (!res->keep_logs && !res->keep_error_files && res->log_root[0])
        mgpu_fs_remove_tree(res->log_root);
    free(res->outcomes);
    free(res->history);
    free(res->remote_history);
    free(res->worlds);
    for (int i = 0; i < res->nstalls; i++) {
        for (int k = 0; res->stalls[i].stacks != NULL && k < res->stalls[i].n; k++)
            free(res->stalls[i].stacks[k]);
        free(res->stalls[i].stacks);
        free(res->stalls[i].ranks);
    }
    free(res->stalls);
    memset(res, 0, sizeof *res);
}
