/* tmpdir.h - a scratch folder for the tests that write files: make_tmpdir("NAME") makes
 * /tmp/mgpu_test_NAME.XXXXXX, tmp("file") names a file in it (four rotating buffers: one call
 * may pass two paths), remove_tmpdir removes it with what is in it. Each test runs in its own
 * process (check.h), makes its own folder and removes it at its end. Included after check.h. */
#ifndef MGPU_TEST_TMPDIR_H
#define MGPU_TEST_TMPDIR_H

#include <stdio.h>  /* snprintf, perror */
#include <stdlib.h> /* mkdtemp, system, exit */

static char tmpdir[64];

static inline void make_tmpdir(const char *name)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/mgpu_test_%s.XXXXXX", name);
    if (mkdtemp(tmpdir) == NULL) {
        perror("mkdtemp");
        exit(1);
    }
}

static inline void remove_tmpdir(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    CHECK(system(cmd) == 0);
}

static inline const char *tmp(const char *name)
{
    static char path[4][512];
    static int next;
    char *p = path[next++ % 4];
    snprintf(p, sizeof path[0], "%s/%s", tmpdir, name);
    return p;
}

#endif
