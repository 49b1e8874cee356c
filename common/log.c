/* log.c - formats one whole line and writes it with a single write(2), so lines of the
 * launcher and of workers sharing a stderr never tear each other. */
#include "log.h"

#include <stdarg.h>  /* va_list */
#include <stdio.h>   /* vsnprintf */
#include <strings.h> /* strcasecmp */
#include <unistd.h>  /* write */

#include "clock.h" /* mgpu_clock_mono_ns */
#include "names.h" /* mgpu_names_get */

/* The process's logging state: written once by main before anything else runs. */
static const char *log_prog = "mgpu";
static mgpu_log_level_t log_level = MGPU_LOG_WARN;

void mgpu_log_init(const char *prog, mgpu_log_level_t level)
{
    log_prog = prog;
    log_level = level;
}

mgpu_log_level_t mgpu_log_level(void)
{
    return log_level;
}

/* The names in log lines, and the names LOGLEVEL takes (Python's logging spells them so). */
static const char *const level_names[] = {
    [MGPU_LOG_ERROR] = "error",
    [MGPU_LOG_WARN] = "warning",
    [MGPU_LOG_INFO] = "info",
    [MGPU_LOG_DEBUG] = "debug",
};

int mgpu_log_level_parse(const char *s)
{
    /* Python's logging also takes CRITICAL and WARN; mgpu has no level above error. */
    if (strcasecmp(s, "critical") == 0)
        return MGPU_LOG_ERROR;
    if (strcasecmp(s, "warn") == 0)
        return MGPU_LOG_WARN;
    return mgpu_names_find(level_names, MGPU_NAMES_COUNT(level_names), s);
}

static void (*before_write)(void *ctx);
static void *before_write_ctx;

void mgpu_log_before_write(void (*fn)(void *ctx), void *ctx)
{
    before_write = fn;
    before_write_ctx = ctx;
}

void mgpu_log(mgpu_log_level_t level, const char *fmt, ...)
{
    char line[4096];
    int n;
    va_list ap;

    if (level > log_level)
        return;
    if (level == MGPU_LOG_DEBUG) {
        /* Debug lines carry a monotonic time (ms), to see where a run spends its time. */
        int64_t ns = mgpu_clock_mono_ns();
        n = snprintf(line, sizeof line, "%s: debug %lld.%03ld: ", log_prog,
                     (long long)(ns / 1000000), (long)((ns / 1000) % 1000));
    } else {
        n = snprintf(line, sizeof line, "%s: %s: ", log_prog,
                     mgpu_names_get(level_names, MGPU_NAMES_COUNT(level_names), level, "?"));
    }
    va_start(ap, fmt);
    n += vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof line - 1)
        n = (int)sizeof line - 2;
    line[n++] = '\n';
    if (before_write != NULL)
        before_write(before_write_ctx);
    /* One write: a line is never split between this and another writer of stderr. */
    for (const char *p = line; n > 0;) {
        ssize_t w = write(2, p, (size_t)n);
        if (w <= 0)
            break;
        p += w;
        n -= (int)w;
    }
}
