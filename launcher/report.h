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

/* For a scheduler above the launcher, as torchrun's agent is used: when the run failed, path
 * (the launcher's own TORCHELASTIC_ERROR_FILE) gets the root cause's error file with
 * "errorCode": its exit code added inside "message", as torch's @record does; when the root
 * cause wrote none, one in that format with the failure in words, the last stderr lines as
 * its call stack, and the exit code. Written atomically. Returns 0 (nothing is written for a
 * run that succeeded) or a negative code with err set. */
int mgpu_report_write_parent_error(const mgpu_plan_t *plan, const mgpu_run_result_t *res,
                                   const char *path, mgpu_err_t *err);

/* The message and traceback of a torchrun-format error file (either of its two layouts).
 * Returns 0 when the file exists and parses; *msg and *trace are malloc'd (may be NULL). */
int mgpu_report_read_error_file(const char *path, char **msg, char **trace, long *timestamp);

#endif
