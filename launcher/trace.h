/* trace.h - MGPU_LAUNCH_TRACE: a timeline of the launcher's own start and stop.
 *
 * With MGPU_LAUNCH_TRACE=1 the launcher records the moment each of its phases ends (parse,
 * plan, containment, rendezvous, spawn, ..., exit) and prints the table on stderr when it
 * is done; with MGPU_LAUNCH_TRACE=/path it appends the table to that file (one write a run),
 * which is how tests/bench/launch_bench.sh collects many runs. Each row carries the phase's
 * end in CLOCK_MONOTONIC ns, so a caller that stamped the launcher's start and exit on the
 * same clock can add what lies outside main: exec and dynamic loading before it, the exit
 * and the reaping after it.
 *
 * Unset, a mark costs one branch. Marks are taken on the launcher's main thread only (the
 * store's thread and the thread pool record nothing); the table is a fixed array, so a mark
 * never allocates. Phase names must be string literals: only the pointer is kept. */
#ifndef MGPU_TRACE_H
#define MGPU_TRACE_H

#include <stdint.h> /* int64_t */

/* Reads MGPU_LAUNCH_TRACE's value (NULL, "" or "0": off) and takes the first mark, "main". */
void mgpu_trace_init(const char *spec);
/* The phase `phase` ended now. */
void mgpu_trace_mark(const char *phase);
/* A moment that is not the end of one of the launcher's own phases (the first worker's exec,
 * stamped in the child), at mono_ns on CLOCK_MONOTONIC: listed apart, after the phases. */
void mgpu_trace_point(const char *what, int64_t mono_ns);
/* Whether tracing is on (to skip work done only for a point). */
int mgpu_trace_on(void);
/* Takes the last mark, "exit", and writes the table (see above). Once; later calls do
 * nothing. */
void mgpu_trace_report(void);

#endif
