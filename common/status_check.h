/* status_check.h - MGPU_STATUS_CHECK: the one shape of every library-status check in mgpu's
 * CUDA sources (CUDA_CHECK, CUBLAS_CHECK, NCCL_CHECK are each a line over it). On failure it
 * fills the caller's mgpu_err_t with file:line, the call as written and the library's own
 * text and name for the status, then returns the negative code from the enclosing function
 * (which must return int). No exit, no abort: only main decides that.
 *
 * No CUDA header here: the status type and the functions that name a status are arguments,
 * so common/ stays buildable without a toolkit. */
#ifndef MGPU_STATUS_CHECK_H
#define MGPU_STATUS_CHECK_H

#ifdef __cplusplus
extern "C" {
#endif
#include "error.h" /* mgpu_err_set */
#ifdef __cplusplus
}
#endif

/* type: the status type; ok: its success value; text, name: functions from a status to its
 * description and its enumerator's name (name may be a function returning "" ). */
#define MGPU_STATUS_CHECK(err, code, type, ok, text, name, call)                                   \
    do {                                                                                           \
        type sc_rc_ = (call);                                                                      \
        if (sc_rc_ != (ok))                                                                        \
            return mgpu_err_set((err), (code), "%s:%d: %s: %s (%s)", __FILE__, __LINE__, #call,    \
                                text(sc_rc_), name(sc_rc_));                                       \
    } while (0)

#endif
