/* trace.c - the launcher's own timeline (see trace.h). */
#include "trace.h"

#include <errno.h>  /* errno */
#include <fcntl.h>  /* open */
#include <stdio.h>  /* snprintf */
#include <string.h> /* strcmp, strerror */
#include <unistd.h> /* getpid, write */

#include "clock.h" /* mgpu_clock_mono_ns */
#include "fdio.h"  /* mgpu_fdio_write_all */

#define TRACE_MAX 48

typedef struct trace_mark {
    const char *name;
    int64_t ns;
    int point; /* a moment beside the phases, not a phase's end */
} trace_mark_t;

/* The one table of the process: filled by the main thread (trace.h), written once at exit.
 * A global because the marks sit in every phase's module, and threading a handle through
 * each for a diagnostic would change every signature on the start path. */
static struct {
    int on, reported, n;
    char path[1024]; /* "" for stderr */
    trace_mark_t marks[TRACE_MAX];
} trace;

static void add(const char *name, int64_t ns, int point)
{
    if (!trace.on || trace.n >= TRACE_MAX)
        return;
    trace.marks[trace.n++] = (trace_mark_t){name, ns, point};
}

void mgpu_trace_init(const char *spec)
{
    if (spec == NULL || spec[0] == '\0' || strcmp(spec, "0") == 0)
        return;
    trace.on = 1;
    if (strcmp(spec, "1") != 0)
        snprintf(trace.path, sizeof trace.path, "%s", spec);
    add("main", mgpu_clock_mono_ns(), 0);
}

void mgpu_trace_mark(const char *phase)
{
    if (trace.on)
        add(phase, mgpu_clock_mono_ns(), 0);
}

void mgpu_trace_point(const char *what, int64_t mono_ns)
{
    add(what, mono_ns, 1);
}

int mgpu_trace_on(void)
{
    return trace.on;
}

void mgpu_trace_report(void)
{
    char buf[8192];
    size_t u = 0;
    int64_t t0, prev, end;
    int fd = 2;

    if (!trace.on || trace.reported)
        return;
    trace.reported = 1;
    add("exit", mgpu_clock_mono_ns(), 0);
    t0 = prev = trace.marks[0].ns;
    end = trace.marks[trace.n - 1].ns;
#define PUT(...)                                                                                   \
    do {                                                                                           \
        if (u < sizeof buf)                                                                        \
            u += (size_t)snprintf(buf + u, sizeof buf - u, __VA_ARGS__);                           \
    } while (0)
    PUT("mgpu-launch trace: pid %d, %.3f ms from main to exit\n", (int)getpid(),
        (double)(end - t0) / 1e6);
    PUT("  %-20s %9s %9s %6s %20s\n", "phase", "took ms", "end ms", "share", "end (mono ns)");
    for (int i = 1; i < trace.n; i++) {
        const trace_mark_t *m = &trace.marks[i];
        if (m->point)
            continue;
        PUT("  %-20s %9.3f %9.3f %5.1f%% %20lld\n", m->name, (double)(m->ns - prev) / 1e6,
            (double)(m->ns - t0) / 1e6,
            end > t0 ? 100.0 * (double)(m->ns - prev) / (double)(end - t0) : 0.0, (long long)m->ns);
        prev = m->ns;
    }
    for (int i = 1; i < trace.n; i++)
        if (trace.marks[i].point)
            PUT("  %-20s %9s %9.3f %6s %20lld\n", trace.marks[i].name, "(point)",
                (double)(trace.marks[i].ns - t0) / 1e6, "", (long long)trace.marks[i].ns);
    PUT("  %-20s %9s %9.3f %6s %20lld\n", "main", "(start)", 0.0, "", (long long)t0);
#undef PUT
    if (u >= sizeof buf)
        u = sizeof buf - 1;
    if (trace.path[0] &&
        (fd = open(trace.path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644)) < 0) {
        /* The table is not lost: it goes where MGPU_LAUNCH_TRACE=1 would send it. */
        char note[1200];
        int n = snprintf(note, sizeof note,
                         "mgpu-launch: warning: MGPU_LAUNCH_TRACE=%s: open: %s; expected 1 "
                         "(stderr) or a file that can be written: the trace follows here\n",
                         trace.path, strerror(errno));
        fd = 2;
        mgpu_fdio_write_all(fd, note, n > 0 && (size_t)n < sizeof note ? (size_t)n : 0);
    }
    mgpu_fdio_write_all(fd, buf, u);
    if (fd != 2)
        close(fd);
}
