/* report.h - how a run ended, for people (torchrun's root-cause layout on stderr) and for
 * scripts (--summary FILE, JSON written atomically). */
#ifndef MGPU_REPORT_H
#define MGPU_REPORT_H

#include <stdio.h> /* FILE */

#include "error.h"      /* mgpu_err_t */
#include "plan.h"       /* mgpu_plan_t */
#include "supervisor.h" /* mgpu_run_result_t */

/* The failure report; prints nothing for a run that succeeded. */
void mgpu_report_print(const mgpu_plan_t *plan, const mgpu_run_result_t *res, FILE *out);

/* The workers' startup timeline (ms after the launcher spawned each), when they published one
 * (libmgpu workers do); prints nothing otherwise. */
void mgpu_report_timeline(const mgpu_plan_t *plan, const mgpu_run_result_t *res, FILE *out);

/* Writes FILE.tmp, fsyncs, renames to FILE: readers never see half a report. */
int mgpu_report_write_summary(const mgpu_plan_t *plan, const mgpu_run_result_t *res,
                              const char *path, mgpu_err_t *err);

/* The message and traceback of a torchrun-format error file (either of its two layouts).
 * Returns 0 when the file exists and parses; *msg and *trace are malloc'd (may be NULL). */
int mgpu_report_read_error_file(const char *path, char **msg, char **trace, long *timestamp);

#endif
