/* signames.h - the signals that may stop a job, by name: --signals_to_handle's list, checked
 * and made into a set. Pure: nothing is caught or sent here (the supervisor does that). */
#ifndef MGPU_SIGNAMES_H
#define MGPU_SIGNAMES_H

#include <stddef.h> /* size_t */

#include "error.h" /* mgpu_err_t */

/* torchrun's default --signals_to_handle. */
#define MGPU_SIGNAMES_DEFAULT "SIGTERM,SIGINT,SIGHUP,SIGQUIT"

/* Parses a list like "SIGTERM, SIGUSR1": signal names separated by commas, blanks around a
 * name ignored, a repeated name kept once. Fills *mask (bit 1 << N for signal N) and norm (the
 * names, comma-separated, without blanks). Returns 0, or MGPU_E_USAGE with a message (what
 * names the source: "--signals_to_handle" or its PET_ variable) naming the entry that is not
 * a signal that can stop a job, and those that are. */
int mgpu_signames_parse(const char *what, const char *s, unsigned long long *mask, char *norm,
                        size_t normlen, mgpu_err_t *err);

#endif
