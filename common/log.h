/* log.h - the one logger of launcher and workers: "<prog>: <level>: message" on stderr.
 *
 * The level and program name are the process's only logging state (set once by main). */
#ifndef MGPU_LOG_H
#define MGPU_LOG_H

typedef enum mgpu_log_level {
    MGPU_LOG_ERROR = 0,
    MGPU_LOG_WARN = 1,
    MGPU_LOG_INFO = 2,
    MGPU_LOG_DEBUG = 3,
} mgpu_log_level_t;

/* prog is kept by pointer: pass a string that lives as long as the process. */
void mgpu_log_init(const char *prog, mgpu_log_level_t level);
mgpu_log_level_t mgpu_log_level(void);
/* Parses "error", "warn"/"warning", "info", "debug" (any case); -1 when unknown. */
int mgpu_log_level_parse(const char *s);
void mgpu_log(mgpu_log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* fn(ctx) runs before each line is written (NULL: nothing): the launcher ends there a worker's
 * unfinished line that its console shows, so that no message is glued onto it. */
void mgpu_log_before_write(void (*fn)(void *ctx), void *ctx);

#define mgpu_error(...) mgpu_log(MGPU_LOG_ERROR, __VA_ARGS__)
#define mgpu_warn(...) mgpu_log(MGPU_LOG_WARN, __VA_ARGS__)
#define mgpu_info(...) mgpu_log(MGPU_LOG_INFO, __VA_ARGS__)
#define mgpu_debug(...) mgpu_log(MGPU_LOG_DEBUG, __VA_ARGS__)

#endif
