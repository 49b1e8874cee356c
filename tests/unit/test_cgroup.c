/* test_cgroup.c - finding the cgroup2 mount and the launcher's own group; a job's group made,
 * joined, killed and removed (where this machine lets one be made). */
#include <errno.h>    /* ENOENT */
#include <signal.h>   /* kill */
#include <stdio.h>    /* snprintf */
#include <sys/stat.h> /* stat */
#include <time.h>     /* nanosleep */
#include <unistd.h>   /* fork */

#include "cgroup.h"
#include "check.h"

static const char *hybrid =
    "22 1 259:1 / / rw,relatime shared:1 - ext4 /dev/root rw\n"
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
    "40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";

static void test_v2_mount_hybrid(void)
{
    char mnt[256], root[256];
    CHECK_INT(mgpu_cgroup_v2_mount(hybrid, mnt, sizeof mnt, root, sizeof root), 0);
    CHECK_STR(mnt, "/sys/fs/cgroup/unified");
    CHECK_STR(root, "/");
}

static void test_v2_mount_pure_with_optional_fields(void)
{
    /* systemd's layout: optional fields (shared:N) before the separator */
    const char *mi = "25 30 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - "
                     "cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n";
    char mnt[256], root[256];
    CHECK_INT(mgpu_cgroup_v2_mount(mi, mnt, sizeof mnt, root, sizeof root), 0);
    CHECK_STR(mnt, "/sys/fs/cgroup");
}

static void test_v2_mount_escaped_and_container_root(void)
{
    const char *mi = "41 31 0:38 /job\\0401 /mnt/my\\040cg rw - cgroup2 none rw\n";
    char mnt[256], root[256];
    CHECK_INT(mgpu_cgroup_v2_mount(mi, mnt, sizeof mnt, root, sizeof root), 0);
    CHECK_STR(mnt, "/mnt/my cg");
    CHECK_STR(root, "/job 1");
}

static void test_v2_mount_none(void)
{
    const char *mi = "32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"
                     "33 31 0:30 / /sys/fs/cgroup/cgroup2 rw - tmpfs cgroup2 rw\n";
    char mnt[256], root[256];
    CHECK_INT(mgpu_cgroup_v2_mount(mi, mnt, sizeof mnt, root, sizeof root), -ENOENT);
    CHECK_INT(mgpu_cgroup_v2_mount("", mnt, sizeof mnt, root, sizeof root), -ENOENT);
}

static void test_v2_self(void)
{
    char p[256];
    CHECK_INT(mgpu_cgroup_v2_self("9:name=systemd:/\n4:memory:/x/y\n0::/user.slice/a.scope\n", p,
                                  sizeof p),
              0);
    CHECK_STR(p, "/user.slice/a.scope");
    CHECK_INT(mgpu_cgroup_v2_self("0::/", p, sizeof p), 0);
    CHECK_STR(p, "/");
    CHECK_INT(mgpu_cgroup_v2_self("4:memory:/x\n", p, sizeof p), -ENOENT);
}

static void test_dir(void)
{
    char d[256];
    CHECK_INT(mgpu_cgroup_dir("/sys/fs/cgroup", "/", "/", d, sizeof d), 0);
    CHECK_STR(d, "/sys/fs/cgroup");
    CHECK_INT(mgpu_cgroup_dir("/sys/fs/cgroup/unified", "/", "/a/b", d, sizeof d), 0);
    CHECK_STR(d, "/sys/fs/cgroup/unified/a/b");
    CHECK_INT(mgpu_cgroup_dir("/cg", "/job", "/job/step", d, sizeof d), 0);
    CHECK_STR(d, "/cg/step");
    CHECK_INT(mgpu_cgroup_dir("/cg", "/job", "/jobs/x", d, sizeof d), -ENOENT);
}

static void sleep_ms(int ms)
{
    struct timespec ts = {0, ms * 1000000L};
    nanosleep(&ts, NULL);
}

/* A job's group for real: a child joins it and forks a grandchild that leaves its session;
 * the kill ends both, and the group goes away. */
static void test_create_join_kill_remove(void)
{
    mgpu_cgroup_t cg;
    mgpu_err_t err = {0};
    char name[64];
    struct stat st;
    pid_t pid;
    int status = 0;

    snprintf(name, sizeof name, "mgpu-test-%d", (int)getpid());
    if (mgpu_cgroup_create(&cg, NULL, name, &err) < 0)
        SKIP("no cgroup can be made here: %s", err.msg);
    CHECK_INT(stat(cg.path, &st), 0);
    CHECK_INT(mgpu_cgroup_count(&cg), 0);
    pid = fork();
    if (pid == 0) {
        if (mgpu_cgroup_join(&cg) != 0)
            _exit(3);
        if (fork() == 0) {
            setsid();
            for (;;)
                pause();
        }
        for (;;)
            pause();
    }
    for (int i = 0; i < 500 && mgpu_cgroup_count(&cg) < 2; i++)
        sleep_ms(2);
    CHECK_INT(mgpu_cgroup_count(&cg), 2);
    CHECK_INT(mgpu_cgroup_kill(&cg), 0);
    CHECK_INT(waitpid(pid, &status, 0), pid);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    mgpu_cgroup_close(&cg);
    CHECK_INT(mgpu_cgroup_remove(&cg, 2000), 0);
    CHECK(stat(cg.path, &st) != 0);
}

/* A child forked into the group (clone3's CLONE_INTO_CGROUP) is in it from its first
 * instruction: counted at once, with no join, and killed with the group. */
static void test_fork_into(void)
{
    mgpu_cgroup_t cg;
    mgpu_err_t err = {0};
    char name[64];
    pid_t pid;
    int status = 0;

    snprintf(name, sizeof name, "mgpu-test-into-%d", (int)getpid());
    if (mgpu_cgroup_create(&cg, NULL, name, &err) < 0)
        SKIP("no cgroup can be made here: %s", err.msg);
    CHECK(cg.dir_fd >= 0);
    pid = mgpu_cgroup_fork_into(&cg);
    if (pid < 0 && errno == ENOSYS) {
        mgpu_cgroup_close(&cg);
        mgpu_cgroup_remove(&cg, 100);
        SKIP("clone3 is refused here (a kernel before 5.7, or a seccomp filter)");
    }
    if (pid == 0)
        for (;;)
            pause();
    CHECK(pid > 0);
    CHECK_INT(mgpu_cgroup_count(&cg), 1);
    CHECK_INT(mgpu_cgroup_kill(&cg), 0);
    CHECK_INT(waitpid(pid, &status, 0), pid);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    mgpu_cgroup_close(&cg);
    CHECK_INT(cg.dir_fd, -1);
    CHECK_INT(mgpu_cgroup_remove(&cg, 2000), 0);
}

/* Kernels before 5.14 have no cgroup.kill: the group is frozen and emptied one by one, even
 * while a process in it keeps forking. */
static void test_kill_without_cgroup_kill(void)
{
    mgpu_cgroup_t cg;
    mgpu_err_t err = {0};
    char name[64];
    pid_t pid;
    int status = 0;

    snprintf(name, sizeof name, "mgpu-test-nokill-%d", (int)getpid());
    if (mgpu_cgroup_create(&cg, NULL, name, &err) < 0)
        SKIP("no cgroup can be made here: %s", err.msg);
    cg.kill[0] = '\0';
    pid = fork();
    if (pid == 0) {
        if (mgpu_cgroup_join(&cg) != 0)
            _exit(3);
        /* a chain of forks (each child forks again and lingers), at most 200 long */
        for (int depth = 0;; depth++) {
            if (depth >= 200 || fork() > 0)
                for (;;)
                    pause();
            sleep_ms(5);
        }
    }
    for (int i = 0; i < 500 && mgpu_cgroup_count(&cg) < 4; i++)
        sleep_ms(2);
    CHECK(mgpu_cgroup_count(&cg) >= 4);
    CHECK_INT(mgpu_cgroup_kill(&cg), 0);
    CHECK_INT(waitpid(pid, &status, 0), pid);
    mgpu_cgroup_close(&cg);
    CHECK_INT(mgpu_cgroup_remove(&cg, 2000), 0);
}

/* A launcher run inside the job makes its own group under the job's; when the job is killed
 * its launcher cannot remove it: the job's removal does. */
static void test_remove_with_nested_groups(void)
{
    mgpu_cgroup_t cg;
    mgpu_err_t err = {0};
    char name[64], sub[MGPU_CGROUP_PATH_MAX + 32];
    struct stat st;

    snprintf(name, sizeof name, "mgpu-test-nested-%d", (int)getpid());
    if (mgpu_cgroup_create(&cg, NULL, name, &err) < 0)
        SKIP("no cgroup can be made here: %s", err.msg);
    snprintf(sub, sizeof sub, "%s/mgpu-1", cg.path);
    CHECK_INT(mkdir(sub, 0755), 0);
    snprintf(sub, sizeof sub, "%s/mgpu-1/mgpu-2", cg.path);
    CHECK_INT(mkdir(sub, 0755), 0);
    mgpu_cgroup_close(&cg);
    CHECK_INT(mgpu_cgroup_remove(&cg, 100), 0);
    CHECK(stat(cg.path, &st) != 0);
}

static void test_create_under_missing_parent_fails(void)
{
    mgpu_cgroup_t cg;
    mgpu_err_t err = {0};
    CHECK(mgpu_cgroup_create(&cg, "/nonexistent/cgroup/parent", "x", &err) < 0);
    CHECK_CONTAINS(err.msg, "/nonexistent/cgroup/parent/cgroup.procs");
    CHECK_STR(cg.path, "");
    /* With no group, the rest does nothing. */
    CHECK_INT(mgpu_cgroup_count(&cg), 0);
    CHECK_INT(mgpu_cgroup_kill(&cg), 0);
    CHECK_INT(mgpu_cgroup_remove(&cg, 10), 0);
    CHECK_INT(mgpu_cgroup_join(&cg), 0);
    /* and no fork into it: the caller forks and joins (nothing) instead */
    errno = 0;
    CHECK_INT(mgpu_cgroup_fork_into(&cg), -1);
    CHECK_INT(errno, EBADF);
}

int main(void)
{
    RUN(test_v2_mount_hybrid);
    RUN(test_v2_mount_pure_with_optional_fields);
    RUN(test_v2_mount_escaped_and_container_root);
    RUN(test_v2_mount_none);
    RUN(test_v2_self);
    RUN(test_dir);
    RUN(test_create_join_kill_remove);
    RUN(test_fork_into);
    RUN(test_kill_without_cgroup_kill);
    RUN(test_remove_with_nested_groups);
    RUN(test_create_under_missing_parent_fails);
    return check_done();
}
