/* error.h - mgpu's error codes and the message buffer every fallible call fills.
 *
 * Every function that can fail returns 0 or a negative code: a negated errno for system
 * failures (-ENOENT, ...) or one of the MGPU_E_* codes below. Detail for the user - the call
 * that failed and the value that made it fail - goes into an mgpu_err_t the caller owns. */
#ifndef MGPU_ERROR_H
#define MGPU_ERROR_H

#include <stddef.h> /* size_t */

enum {
    MGPU_E_USAGE = -1001,    /* bad command line or environment value */
    MGPU_E_CONFIG = -1002,   /* bad configuration file */
    MGPU_E_DEVICE = -1003,   /* no such device, or too few of them */
    MGPU_E_TIMEOUT = -1004,  /* a deadline passed */
    MGPU_E_PROTOCOL = -1005, /* a peer sent something malformed */
    MGPU_E_PEER = -1006,     /* a peer failed or went away */
    MGPU_E_RANGE = -1007,    /* a number out of its range */
    MGPU_E_CUDA = -1008,     /* a CUDA runtime call failed */
    MGPU_E_NCCL = -1009,     /* an NCCL call failed */
    MGPU_E_AUTH = -1010,     /* a wrong token */
    MGPU_E_CLOSED = -1011,   /* the connection or object is closed */
    MGPU_E_CUBLAS = -1012,   /* a cuBLAS call failed */
};

/* Filled by the callee on failure; code is the value the callee returned. */
typedef struct mgpu_err {
    int code;
    char msg[1024];
} mgpu_err_t;

/* Formats the message into err (if err is not NULL) and returns code, so a failing function
 * can end with `return mgpu_err_set(err, -EINVAL, "...", ...);`. */
int mgpu_err_set(mgpu_err_t *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A static description of code: strerror(-code) for errno values, the table for MGPU_E_*. */
const char *mgpu_strerror(int code);

#endif
