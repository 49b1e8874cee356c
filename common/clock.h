/* clock.h - the time every part of mgpu measures with: seconds as doubles.
 *
 * Deadlines and durations use the monotonic clock (it never jumps with NTP or an admin's
 * `date`); times shown to people or written to reports use the real-time clock. Nothing to
 * own or free. */
#ifndef MGPU_CLOCK_H
#define MGPU_CLOCK_H

#include <stdint.h> /* int64_t */

/* CLOCK_MONOTONIC, in seconds. */
double mgpu_clock_mono(void);
/* CLOCK_MONOTONIC, in nanoseconds. */
int64_t mgpu_clock_mono_ns(void);
/* CLOCK_REALTIME (seconds since the epoch). */
double mgpu_clock_real(void);

#endif
