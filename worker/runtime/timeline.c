/* timeline.c - a rank's startup timeline (timeline.h). */
#include "timeline.h"

#include <stdio.h>  /* snprintf, fopen */
#include <string.h> /* strcmp, strrchr */
#include <time.h>   /* clock_gettime */
#include <unistd.h> /* sysconf */

#include "error.h" /* MGPU_E_USAGE, MGPU_E_RANGE */

int64_t mgpu_timeline_now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (int64_t)t.tv_sec * 1000000 + t.tv_nsec / 1000;
}

int64_t mgpu_timeline_process_start_us(void)
{
    char line[1024], *p;
    unsigned long long start_ticks = 0;
    struct timespec boot;
    long hz = sysconf(_SC_CLK_TCK);
    FILE *f = fopen("/proc/self/stat", "re");
    size_t len;

    if (f == NULL)
        return -1;
    len = fread(line, 1, sizeof line - 1, f);
    fclose(f);
    line[len] = '\0';
    /* The command name (field 2) may hold spaces and parentheses: fields are counted after
     * the last ')'. starttime is field 22, the 20th after it. */
    if ((p = strrchr(line, ')')) == NULL || hz <= 0)
        return -1;
    if (sscanf(p + 1,
               " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d "
               "%*d %llu",
               &start_ticks) != 1)
        return -1;
    /* The start time counts from boot, as CLOCK_BOOTTIME does (suspended time included). */
    if (clock_gettime(CLOCK_BOOTTIME, &boot) != 0)
        return -1;
    int64_t boot_us = (int64_t)boot.tv_sec * 1000000 + boot.tv_nsec / 1000;
    int64_t start_us = (int64_t)(start_ticks * 1000000ULL / (unsigned long long)hz);
    return mgpu_timeline_now_us() - (boot_us - start_us);
}

int mgpu_timeline_add(mgpu_timeline_t *tl, const char *name, int64_t us)
{
    size_t len = name != NULL ? strlen(name) : 0;

    if (len == 0 || len >= MGPU_TIMELINE_NAME)
        return MGPU_E_USAGE;
    for (const char *c = name; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              *c == '_' || *c == '-' || *c == '.'))
            return MGPU_E_USAGE; /* '=' and ';' would break the text form */
    for (int i = 0; i < tl->n; i++)
        if (strcmp(tl->ev[i].name, name) == 0)
            return 0;
    if (tl->n == MGPU_TIMELINE_MAX)
        return MGPU_E_RANGE;
    memcpy(tl->ev[tl->n].name, name, len + 1);
    tl->ev[tl->n].us = us;
    tl->n++;
    return 1;
}

size_t mgpu_timeline_format(const mgpu_timeline_t *tl, char *buf, size_t len)
{
    size_t used = 0;

    if (len > 0)
        buf[0] = '\0';
    for (int i = 0; i < tl->n; i++) {
        int64_t us = tl->ev[i].us;
        int k = snprintf(used < len ? buf + used : NULL, used < len ? len - used : 0,
                         "%s%s=%lld.%06lld", i ? ";" : "", tl->ev[i].name,
                         (long long)(us / 1000000), (long long)(us % 1000000));
        if (k > 0)
            used += (size_t)k;
    }
    return used;
}
