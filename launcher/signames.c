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
static const struct {
    const char *name;
    int sig;
} stop_signal_names[] = {
    {"SIGTERM", SIGTERM}, {"SIGINT", SIGINT},   {"SIGHUP", SIGHUP},   {"SIGQUIT", SIGQUIT},
    {"SIGUSR1", SIGUSR1}, {"SIGUSR2", SIGUSR2}, {"SIGALRM", SIGALRM}, {"SIGVTALRM", SIGVTALRM},
    {"SIGPROF", SIGPROF}, {"SIGXCPU", SIGXCPU}, {"SIGXFSZ", SIGXFSZ}, {"SIGPWR", SIGPWR},
};
#define STOP_SIGNAL_LIST                                                                           \
    "SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, SIGVTALRM, SIGPROF, SIGXCPU, "   \
    "SIGXFSZ, SIGPWR"

/* Why a known signal that is not in stop_signal_names cannot be in the list, or NULL when the
 * name is no signal at all. */
static const char *unhandled_reason(const char *name)
{
    if (strncmp(name, "SIG", 3) != 0)
        return NULL;
    if (strcmp(name, "SIGKILL") == 0 || strcmp(name, "SIGSTOP") == 0)
        return "it cannot be caught";
    if (strcmp(name, "SIGCHLD") == 0 || strcmp(name, "SIGWINCH") == 0 ||
        strcmp(name, "SIGPIPE") == 0)
        return "the launcher uses it itself";
    for (int sig = 1; sig < 32; sig++) {
        const char *abbrev = sigabbrev_np(sig);
        if (abbrev != NULL && strcmp(abbrev, name + 3) == 0)
            return "it does not ask a job to end";
    }
    return NULL;
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
        char *name;
        int sig = 0;
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
        for (size_t i = 0; i < sizeof stop_signal_names / sizeof stop_signal_names[0]; i++)
            if (strcmp(stop_signal_names[i].name, name) == 0)
                sig = stop_signal_names[i].sig;
        if (sig == 0) {
            const char *why = unhandled_reason(name);
            if (why != NULL)
                return mgpu_err_set(err, MGPU_E_USAGE,
                                    "%s='%s': %s cannot be handled (%s); expected some of: %s",
                                    what, s, name, why, STOP_SIGNAL_LIST);
            return mgpu_err_set(err, MGPU_E_USAGE,
                                "%s='%s': unknown signal '%s'; expected some of: %s", what, s, name,
                                STOP_SIGNAL_LIST);
        }
        if ((*mask >> sig) & 1)
            continue;
        *mask |= 1ull << sig;
        if (normlen > 0)
            used += (size_t)snprintf(norm + used, used < normlen ? normlen - used : 0, "%s%s",
                                     used ? "," : "", name);
    }
    return 0;
}
