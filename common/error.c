/* error.c - the MGPU_E_* table and the message buffer. */
#include "error.h"

#include <stdarg.h> /* va_list */
#include <stdio.h>  /* vsnprintf */
#include <string.h> /* strerror */

int mgpu_err_set(mgpu_err_t *err, int code, const char *fmt, ...)
{
    if (err != NULL) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

const char *mgpu_strerror(int code)
{
    switch (code) {
    case 0:
        return "success";
    case MGPU_E_USAGE:
        return "invalid usage";
    case MGPU_E_CONFIG:
        return "invalid configuration";
    case MGPU_E_DEVICE:
        return "device unavailable";
    case MGPU_E_TIMEOUT:
        return "timed out";
    case MGPU_E_PROTOCOL:
        return "protocol error";
    case MGPU_E_PEER:
        return "peer failed";
    case MGPU_E_RANGE:
        return "value out of range";
    case MGPU_E_CUDA:
        return "CUDA error";
    case MGPU_E_NCCL:
        return "NCCL error";
    case MGPU_E_AUTH:
        return "authentication failed";
    case MGPU_E_CLOSED:
        return "closed";
    case MGPU_E_CUBLAS:
        return "cuBLAS error";
    }
    if (code < 0 && code > -4096)
        return strerror(-code);
    return "unknown error";
}
