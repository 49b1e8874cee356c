/* plan_build.h - for the plan's unit tests: a plan built from mgpu-launch's arguments, as the
 * launcher builds it (included by one test program each; everything here is static). */
#ifndef MGPU_TEST_PLAN_BUILD_H
#define MGPU_TEST_PLAN_BUILD_H

#include <stdarg.h> /* va_list */
#include <string.h> /* memset */

#include "plan.h" /* mgpu_plan_build, mgpu_cli_parse */

/* Parses the NULL-terminated arguments after "mgpu-launch" and builds the plan from them and
 * in; -1 (e says why) when the arguments are refused. */
static int build(mgpu_plan_t *p, mgpu_err_t *e, const mgpu_plan_input_t *in, ...)
{
    static char *argv[32];
    static mgpu_cli_t cli;
    int argc = 0;
    va_list ap;
    va_start(ap, in);
    argv[argc++] = "mgpu-launch";
    for (char *a; argc < 31 && (a = va_arg(ap, char *)) != NULL;)
        argv[argc++] = a;
    va_end(ap);
    memset(e, 0, sizeof *e);
    if (mgpu_cli_parse(&cli, argc, argv, NULL, e) < 0)
        return -1;
    return mgpu_plan_build(p, &cli, in, e);
}

#endif
