/* check.h - the unit tests' harness: each TEST runs in its own forked process (a crash or an
 * abort fails that test alone), prints "ok - name" or "not ok - name", and main ends with
 * "N passed, N failed". Included by exactly one .c per test binary.
 * With CHECK_LIST=1 in the environment each RUN prints "list - name" instead of running, so
 * tests/run.sh knows how many tests to expect before it runs them (a binary that dies before
 * its first test cannot then pass for one with no tests). */
#ifndef MGPU_CHECK_H
#define MGPU_CHECK_H

#include <stdio.h>    /* printf */
#include <stdlib.h>   /* exit */
#include <string.h>   /* strcmp, strstr */
#include <sys/wait.h> /* waitpid */
#include <unistd.h>   /* fork */

static int check_failed; /* failures inside the current test's process */

/* Inside a test: stop it here and count it as skipped (no GPU on this machine, say). A check
 * that already failed stays a failure: a skip must not hide it. */
#define SKIP(...)                                                                                  \
    do {                                                                                           \
        if (check_failed) {                                                                        \
            printf("  skip after %d failed check(s): counted as a failure\n", check_failed);       \
            fflush(stdout);                                                                        \
            _exit(1);                                                                              \
        }                                                                                          \
        printf("  skip: " __VA_ARGS__);                                                            \
        printf("\n");                                                                              \
        fflush(stdout);                                                                            \
        _exit(77);                                                                                 \
    } while (0)

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            printf("  %s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond);                      \
            check_failed++;                                                                        \
        }                                                                                          \
    } while (0)

#define CHECK_INT(a, b)                                                                            \
    do {                                                                                           \
        long long a_ = (long long)(a), b_ = (long long)(b);                                        \
        if (a_ != b_) {                                                                            \
            printf("  %s:%d: %s == %lld, expected %s == %lld\n", __FILE__, __LINE__, #a, a_, #b,   \
                   b_);                                                                            \
            check_failed++;                                                                        \
        }                                                                                          \
    } while (0)

#define CHECK_STR(a, b)                                                                            \
    do {                                                                                           \
        const char *a_ = (a), *b_ = (b);                                                           \
        if (a_ == NULL || b_ == NULL ? a_ != b_ : strcmp(a_, b_) != 0) {                           \
            printf("  %s:%d: %s == \"%s\", expected \"%s\"\n", __FILE__, __LINE__, #a,             \
                   a_ ? a_ : "(null)", b_ ? b_ : "(null)");                                        \
            check_failed++;                                                                        \
        }                                                                                          \
    } while (0)

/* a contains b */
#define CHECK_CONTAINS(a, b)                                                                       \
    do {                                                                                           \
        const char *a_ = (a), *b_ = (b);                                                           \
        if (a_ == NULL || strstr(a_, b_) == NULL) {                                                \
            printf("  %s:%d: %s == \"%s\", expected it to contain \"%s\"\n", __FILE__, __LINE__,   \
                   #a, a_ ? a_ : "(null)", b_);                                                    \
            check_failed++;                                                                        \
        }                                                                                          \
    } while (0)

typedef void (*check_fn)(void);
static int check_passed_total, check_failed_total, check_skipped_total;

static void check_run(const char *name, check_fn fn)
{
    int status = 0;
    pid_t pid;
    const char *only = getenv("CHECK_ONLY"); /* run only the tests whose names contain it */
    const char *list = getenv("CHECK_LIST");

    if (only != NULL && only[0] != '\0' && strstr(name, only) == NULL)
        return;
    if (list != NULL && list[0] != '\0') {
        printf("list - %s\n", name);
        return;
    }
    fflush(stdout);
    pid = fork();
    if (pid == 0) {
        fn();
        fflush(stdout);
        _exit(check_failed ? 1 : 0);
    }
    if (pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
        WEXITSTATUS(status) == 77) {
        printf("skip - %s\n", name);
        check_skipped_total++;
    } else if (pid < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        if (WIFSIGNALED(status))
            printf("  killed by signal %d\n", WTERMSIG(status));
        printf("not ok - %s\n", name);
        check_failed_total++;
    } else {
        printf("ok - %s\n", name);
        check_passed_total++;
    }
}

#define RUN(fn) check_run(#fn, fn)

static int check_done(void)
{
    const char *list = getenv("CHECK_LIST");

    if (list != NULL && list[0] != '\0')
        return 0;
    if (check_skipped_total)
        printf("%d passed, %d failed, %d skipped\n", check_passed_total, check_failed_total,
               check_skipped_total);
    else
        printf("%d passed, %d failed\n", check_passed_total, check_failed_total);
    return check_failed_total ? 1 : 0;
}

#endif
