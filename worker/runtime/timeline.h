/* timeline.h - a rank's startup timeline: named wall-clock instants (exec, init, device,
 * store, cuda, comm, first_step, ...) in the order they happened, and their text form
 * "event=seconds.micros;event=..." that libmgpu publishes to the store (see mgpu.h,
 * mgpu_timeline_mark) and the launcher prints.
 *
 * Pure but for the clocks: mgpu.c owns one per context and does the publishing. */
#ifndef MGPU_TIMELINE_H
#define MGPU_TIMELINE_H

#include <stddef.h> /* size_t */
#include <stdint.h> /* int64_t */

#define MGPU_TIMELINE_MAX 16  /* events per rank */
#define MGPU_TIMELINE_NAME 32 /* bytes of a name, NUL included */

typedef struct mgpu_timeline {
    int n;
    struct {
        char name[MGPU_TIMELINE_NAME];
        int64_t us; /* CLOCK_REALTIME, microseconds since the epoch */
    } ev[MGPU_TIMELINE_MAX];
} mgpu_timeline_t;

/* CLOCK_REALTIME now, in microseconds. */
int64_t mgpu_timeline_now_us(void);
/* When this process was exec'd (CLOCK_REALTIME, microseconds), from /proc/self/stat's start
 * time in clock ticks since boot (so to 1/CLK_TCK, 10 ms on Linux); -1 if unreadable. */
int64_t mgpu_timeline_process_start_us(void);
/* Adds name at us. Returns 1 when added, 0 when name was marked already (its first time
 * stays: "first_step" may be marked every step), MGPU_E_USAGE for a name that is empty, too
 * long or holds anything but letters, digits, '_', '-' and '.', MGPU_E_RANGE when full. */
int mgpu_timeline_add(mgpu_timeline_t *tl, const char *name, int64_t us);
/* The text form into buf (always NUL-terminated when len > 0); returns the length it needs,
 * as snprintf does. */
size_t mgpu_timeline_format(const mgpu_timeline_t *tl, char *buf, size_t len);

#endif
