/* signames.c - --signals_to_handle's names (see signames.h). */
#include "signames.h"

#include <signal.h> /* SIGTERM, sigabbrev_np */
#include <stdio.h>  /* snprintf */
#include <string.h> /* strcmp */

#include "text.h" /* mgpu_trim */

/* The signals a job may be stopped on: those a user, a terminal or a scheduler sends to end
 * a job (Slurm's --signal, a batch system's time limit). Not the others: SIGKILL and SIGSTOP
 * cannot be caught; SIGCHLD, SIGWINCH and SIGPIPE are the launcher's own business; faults
 * (SIGSEGV, SIGBUS, ...) and job control (SIGTSTP, SIGCONT, ...) do not ask a job to end. */
static const int stop_signals[] = {SIGTERM, SIGINT,    SIGHUP,  SIGQUIT, SIGUSR1, SIGUSR2,
                                   SIGALRM, SIGVTALRM, SIGPROF, SIGXCPU, SIGXFSZ, SIGPWR};
#define NSTOP (sizeof stop_signals / sizeof stop_signals[0])

/* The standard signal "SIG<name>" names (SIGTERM: 15), 0 when there is none. */
static int signal_named(const char *name)
{
    if (strncmp(name, "SIG", 3) != 0)
        return 0;
    for (int sig = 1; sig < 32; sig++) {
        const char *abbrev = sigabbrev_np(sig);
        if (abbrev != NULL && strcmp(abbrev, name + 3) == 0)
            return sig;
    }
    return 0;
}

/* Why sig cannot be in the list, or NULL when it may stop a job. */
static const char *unhandled_reason(int sig)
{
    for (size_t i = 0; i < NSTOP; i++)
        if (stop_signals[i] == sig)
            return NULL;
    if (sig == SIGKILL || sig == SIGSTOP)
        return "it cannot be caught";
    if (sig == SIGCHLD || sig == SIGWINCH || sig == SIGPIPE)
        return "the launcher uses it itself";
    return "it does not ask a job to end";
}

/* "SIGTERM, SIGINT, ...": the signals that may stop a job, for the messages. */
static const char *stop_signal_list(char *buf, size_t len)
{
    size_t used = 0;

    buf[0] = '\0';
    for (size_t i = 0; i < NSTOP && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%sSIG%s", i ? ", " : "",
                                 sigabbrev_np(stop_signals[i]));
    return buf;
}

int mgpu_signames_parse(const char *what, const char *s, unsigned long long *mask, char *norm,
                        size_t normlen, mgpu_err_t *err)
{
    char buf[256];
    size_t used = 0;
    int n = 0;

    *mask = 0;
    if (normlen > 0)
        norm[0] = '\0';
    if (strlen(s) >= sizeof buf)
        return mgpu_err_set(err, MGPU_E_USAGE, "%s: value longer than %zu characters", what,
                            sizeof buf - 1);
    snprintf(buf, sizeof buf, "%s", s);
    /* strtok_r would pass over empty entries: find them by hand, as each is a mistake. */
    for (char *tok = buf, *next; tok != NULL; tok = next, n++) {
        char *name, list[160];
        const char *why;
        int sig;
        next = strchr(tok, ',');
        if (next != NULL)
            *next++ = '\0';
        name = mgpu_trim(tok);
        if (*name == '\0')
            return mgpu_err_set(err, MGPU_E_USAGE,
                                "%s='%s': %s; expected signal names separated by commas, e.g. "
                                "%s",
                                what, s, n == 0 && next == NULL ? "empty list" : "empty entry",
                                MGPU_SIGNAMES_DEFAULT);
        if ((sig = signal_named(name)) == 0)
            return mgpu_err_set(err, MGPU_E_USAGE,
                                "%s='%s': unknown signal '%s'; expected some of: %s", what, s, name,
                                stop_signal_list(list, sizeof list));
        if ((why = unhandled_reason(sig)) != NULL)
            return mgpu_err_set(err, MGPU_E_USAGE,
                                "%s='%s': %s cannot be handled (%s); expected some of: %s", what, s,
                                name, why, stop_signal_list(list, sizeof list));
        if ((*mask >> sig) & 1)
            continue;
        *mask |= 1ull << sig;
        if (normlen > 0)
            used += (size_t)snprintf(norm + used, used < normlen ? normlen - used : 0, "%s%s",
                                     used ? "," : "", name);
    }
    return 0;
}
