/* cgroup.c - a cgroup (v2) of the job's own (see cgroup.h). */
#include "cgroup.h"

#include <errno.h>       /* errno */
#include <fcntl.h>       /* open */
#include <signal.h>      /* kill, SIGCHLD */
#include <stdint.h>      /* uint64_t */
#include <stdio.h>       /* snprintf */
#include <string.h>      /* strncmp */
#include <sys/stat.h>    /* mkdir */
#include <sys/syscall.h> /* SYS_getdents64, SYS_clone3 */
#include <time.h>        /* nanosleep */
#include <unistd.h>      /* read, write, rmdir */

/* Copies one space-separated field of mountinfo, undoing its octal escapes (\040 a space). */
static void unescape_field(const char *p, size_t n, char *out, size_t len)
{
    size_t o = 0;
    for (size_t i = 0; i < n && o + 1 < len; i++) {
        if (p[i] == '\\' && i + 3 < n && p[i + 1] >= '0' && p[i + 1] <= '3') {
            out[o++] = (char)((p[i + 1] - '0') * 64 + (p[i + 2] - '0') * 8 + (p[i + 3] - '0'));
            i += 3;
        } else {
            out[o++] = p[i];
        }
    }
    out[o] = '\0';
}

int mgpu_cgroup_v2_mount(const char *mountinfo, char *mnt, size_t mnt_len, char *root,
                         size_t root_len)
{
    const char *line = mountinfo;

    while (line != NULL && *line) {
        const char *end = strchr(line, '\n'), *sep;
        size_t n = end ? (size_t)(end - line) : strlen(line);
        /* "ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER" */
        sep = memmem(line, n, " - ", 3);
        if (sep != NULL && (size_t)(line + n - (sep + 3)) >= 8 &&
            strncmp(sep + 3, "cgroup2 ", 8) == 0) {
            const char *f[5];
            const char *p = line;
            int i;
            for (i = 0; i < 5 && p < sep; i++) {
                f[i] = p;
                p = memchr(p, ' ', (size_t)(sep - p));
                if (p == NULL)
                    break;
                p++;
            }
            if (i == 5) {
                const char *root_end = memchr(f[3], ' ', (size_t)(sep - f[3]));
                const char *mnt_end = memchr(f[4], ' ', (size_t)(sep + 1 - f[4]));
                if (root_end != NULL && mnt_end != NULL) {
                    unescape_field(f[3], (size_t)(root_end - f[3]), root, root_len);
                    unescape_field(f[4], (size_t)(mnt_end - f[4]), mnt, mnt_len);
                    return 0;
                }
            }
        }
        line = end ? end + 1 : NULL;
    }
    return -ENOENT;
}

int mgpu_cgroup_v2_self(const char *proc_cgroup, char *path, size_t len)
{
    const char *line = proc_cgroup;

    while (line != NULL && *line) {
        const char *end = strchr(line, '\n');
        size_t n = end ? (size_t)(end - line) : strlen(line);
        if (n >= 3 && strncmp(line, "0::", 3) == 0) {
            snprintf(path, len, "%.*s", (int)(n - 3), line + 3);
            return 0;
        }
        line = end ? end + 1 : NULL;
    }
    return -ENOENT;
}

int mgpu_cgroup_dir(const char *mnt, const char *root, const char *self, char *out, size_t len)
{
    size_t rl = strlen(root);

    /* The mount shows the hierarchy from `root` down: self must lie under it. */
    if (strcmp(root, "/") != 0) {
        if (strncmp(self, root, rl) != 0 || (self[rl] != '\0' && self[rl] != '/'))
            return -ENOENT;
        self += rl;
    }
    while (*self == '/')
        self++;
    if (*self)
        snprintf(out, len, "%s/%s", mnt, self);
    else
        snprintf(out, len, "%s", mnt);
    return 0;
}

static int read_text(const char *path, char *buf, size_t len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    size_t got = 0;
    ssize_t r;

    if (fd < 0)
        return -errno;
    while (got + 1 < len &&
           ((r = read(fd, buf + got, len - 1 - got)) > 0 || (r < 0 && errno == EINTR)))
        got += r > 0 ? (size_t)r : 0;
    close(fd);
    buf[got] = '\0';
    return 0;
}

static int write_text(const char *path, const char *text)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC), rc = 0;
    size_t n = strlen(text);

    if (fd < 0)
        return -errno;
    if (write(fd, text, n) != (ssize_t)n)
        rc = -errno;
    close(fd);
    return rc;
}

int mgpu_cgroup_create(mgpu_cgroup_t *cg, const char *parent, const char *name, mgpu_err_t *err)
{
    char mountinfo[65536], self_cg[4096], mnt[512], root[512], self[MGPU_CGROUP_PATH_MAX];
    char dir[MGPU_CGROUP_PATH_MAX], own_procs[MGPU_CGROUP_PATH_MAX + 16];
    int rc;

    memset(cg, 0, sizeof *cg);
    cg->procs_fd = cg->dir_fd = -1;
    if (parent != NULL && parent[0]) {
        snprintf(dir, sizeof dir, "%s", parent);
    } else {
        if ((rc = read_text("/proc/self/mountinfo", mountinfo, sizeof mountinfo)) < 0)
            return mgpu_err_set(err, rc, "open(/proc/self/mountinfo): %s", strerror(-rc));
        if (mgpu_cgroup_v2_mount(mountinfo, mnt, sizeof mnt, root, sizeof root) < 0)
            return mgpu_err_set(err, -ENOENT, "no cgroup2 file system in /proc/self/mountinfo");
        if ((rc = read_text("/proc/self/cgroup", self_cg, sizeof self_cg)) < 0)
            return mgpu_err_set(err, rc, "open(/proc/self/cgroup): %s", strerror(-rc));
        if (mgpu_cgroup_v2_self(self_cg, self, sizeof self) < 0)
            return mgpu_err_set(err, -ENOENT, "no v2 group (\"0::\") in /proc/self/cgroup");
        if (mgpu_cgroup_dir(mnt, root, self, dir, sizeof dir) < 0)
            return mgpu_err_set(err, -ENOENT,
                                "own group %s is outside the cgroup2 mount %s (root %s)", self, mnt,
                                root);
    }
    /* Moving a process from the launcher's group into the new one needs write access to the
     * cgroup.procs of both (the common ancestor's and the destination's). */
    snprintf(own_procs, sizeof own_procs, "%s/cgroup.procs", dir);
    if (access(own_procs, W_OK) != 0)
        return mgpu_err_set(err, -errno, "%s: %s", own_procs, strerror(errno));
    if (snprintf(cg->path, sizeof cg->path, "%s/%s", dir, name) >= (int)sizeof cg->path)
        return mgpu_err_set(err, -ENAMETOOLONG, "cgroup path %s/%s: too long", dir, name);
    if (mkdir(cg->path, 0755) != 0 &&
        (errno != EEXIST || rmdir(cg->path) != 0 || mkdir(cg->path, 0755) != 0)) {
        /* EEXIST: a group of that name left by a launcher with the same pid, removed above
         * when it was empty. */
        rc = mgpu_err_set(err, -errno, "mkdir(%s): %s", cg->path, strerror(errno));
        cg->path[0] = '\0';
        return rc;
    }
    snprintf(cg->procs, sizeof cg->procs, "%s/cgroup.procs", cg->path);
    snprintf(cg->kill, sizeof cg->kill, "%s/cgroup.kill", cg->path);
    snprintf(cg->freeze, sizeof cg->freeze, "%s/cgroup.freeze", cg->path);
    if (access(cg->kill, W_OK) != 0)
        cg->kill[0] = '\0'; /* before Linux 5.14 */
    if (access(cg->freeze, W_OK) != 0)
        cg->freeze[0] = '\0'; /* before Linux 5.2 */
    cg->procs_fd = open(cg->procs, O_WRONLY | O_CLOEXEC);
    if (cg->procs_fd < 0) {
        rc = mgpu_err_set(err, -errno, "open(%s): %s", cg->procs, strerror(errno));
        rmdir(cg->path);
        cg->path[0] = '\0';
        return rc;
    }
    /* Without it, workers are forked and then join (mgpu_cgroup_fork_into says why not). */
    cg->dir_fd = open(cg->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    return 0;
}

int mgpu_cgroup_join(const mgpu_cgroup_t *cg)
{
    /* "0" is the writing process itself. */
    if (cg == NULL || cg->procs_fd < 0)
        return 0;
    return write(cg->procs_fd, "0", 1) == 1 ? 0 : -errno;
}

/* clone3's argument, struct clone_args of <linux/sched.h> up to its `cgroup` field (88 bytes,
 * CLONE_ARGS_SIZE_VER2): written out because that header's CLONE_* names clash with
 * <sched.h>'s. */
struct clone3_args {
    uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls, set_tid,
        set_tid_size, cgroup;
};
#define CLONE3_INTO_CGROUP 0x200000000ULL

pid_t mgpu_cgroup_fork_into(const mgpu_cgroup_t *cg)
{
#ifdef SYS_clone3
    struct clone3_args a;
    long pid;

    if (cg == NULL || cg->dir_fd < 0) {
        errno = EBADF;
        return -1;
    }
    memset(&a, 0, sizeof a);
    a.flags = CLONE3_INTO_CGROUP;
    a.exit_signal = SIGCHLD;
    a.cgroup = (uint64_t)cg->dir_fd;
    /* No stack of its own and no CLONE_VM: the child runs on a copy of this stack, as after
     * fork, and returns here with 0. */
    pid = syscall(SYS_clone3, &a, sizeof a);
    return pid < 0 ? -1 : (pid_t)pid;
#else
    (void)cg;
    errno = ENOSYS;
    return -1;
#endif
}

/* Calls fn(pid, arg) for every pid in cgroup.procs; returns how many there were, or -errno.
 * Reads with read(2) into a stack buffer: no stdio, no malloc (see cgroup.h). */
static int each_proc(const mgpu_cgroup_t *cg, void (*fn)(int pid, void *arg), void *arg)
{
    char buf[4096];
    int fd, n = 0;
    long pid = -1;
    ssize_t r;

    if (cg == NULL || !cg->path[0])
        return 0;
    if ((fd = open(cg->procs, O_RDONLY | O_CLOEXEC)) < 0)
        return -errno;
    while ((r = read(fd, buf, sizeof buf)) > 0 || (r < 0 && errno == EINTR)) {
        for (ssize_t i = 0; i < r; i++) {
            if (buf[i] >= '0' && buf[i] <= '9') {
                pid = (pid < 0 ? 0 : pid * 10) + (buf[i] - '0');
            } else if (pid >= 0) {
                fn((int)pid, arg);
                n++;
                pid = -1;
            }
        }
    }
    if (pid >= 0) {
        fn((int)pid, arg);
        n++;
    }
    close(fd);
    return n;
}

static void count_one(int pid, void *arg)
{
    (void)pid;
    (void)arg;
}

static void signal_one(int pid, void *arg)
{
    kill(pid, *(int *)arg);
}

int mgpu_cgroup_count(const mgpu_cgroup_t *cg)
{
    int n = each_proc(cg, count_one, NULL);
    return n < 0 ? 0 : n;
}

int mgpu_cgroup_signal(const mgpu_cgroup_t *cg, int sig)
{
    int n = each_proc(cg, signal_one, &sig);
    return n < 0 ? 0 : n;
}

static void pause_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

int mgpu_cgroup_kill(const mgpu_cgroup_t *cg)
{
    int sig = SIGKILL, n;

    if (cg == NULL || !cg->path[0])
        return 0;
    if (cg->kill[0])
        return write_text(cg->kill, "1");
    /* Without cgroup.kill: freeze the group so nothing forks while it is being emptied (a
     * SIGKILLed frozen process still dies), and repeat until nothing is left. */
    if (cg->freeze[0])
        write_text(cg->freeze, "1");
    for (int round = 0; round < 1000 && (n = each_proc(cg, signal_one, &sig)) > 0; round++)
        pause_ms(1);
    if (cg->freeze[0])
        write_text(cg->freeze, "0");
    return 0;
}

/* Removes the empty groups under dir, depth first (a launcher run inside the job made its own
 * group there, and died with the job): rmdir of a group with children fails with EBUSY.
 * getdents64 rather than opendir, which allocates. */
static void remove_children(const char *dir, int depth)
{
    char buf[4096], sub[MGPU_CGROUP_PATH_MAX];
    size_t dl = strlen(dir);
    long n;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

    if (fd < 0 || depth > 16) {
        if (fd >= 0)
            close(fd);
        return;
    }
    while ((n = syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0) {
        for (long off = 0; off < n;) {
            /* struct linux_dirent64: u64 ino, s64 off, u16 reclen, u8 type, char name[] */
            unsigned short reclen;
            unsigned char type = (unsigned char)buf[off + 18];
            const char *name = buf + off + 19;
            size_t nl = strlen(name);
            memcpy(&reclen, buf + off + 16, sizeof reclen);
            off += reclen;
            if (type != 4 /* DT_DIR */ || (name[0] == '.' && (name[1] == '\0' || name[1] == '.')) ||
                dl + 1 + nl + 1 > sizeof sub)
                continue;
            memcpy(sub, dir, dl);
            sub[dl] = '/';
            memcpy(sub + dl + 1, name, nl + 1);
            remove_children(sub, depth + 1);
            rmdir(sub);
        }
    }
    close(fd);
}

int mgpu_cgroup_remove(const mgpu_cgroup_t *cg, int timeout_ms)
{
    int rc = 0;

    if (cg == NULL || !cg->path[0])
        return 0;
    for (int waited = 0;; waited++) {
        if (rmdir(cg->path) == 0 || errno == ENOENT)
            return 0;
        rc = -errno;
        if (rc != -EBUSY || waited >= timeout_ms)
            return rc;
        /* Processes still in it (or just killed, still exiting), or groups under it: kill
         * again, remove those, wait a little. */
        mgpu_cgroup_kill(cg);
        remove_children(cg->path, 0);
        pause_ms(1);
    }
}

void mgpu_cgroup_close(mgpu_cgroup_t *cg)
{
    if (cg->procs_fd >= 0)
        close(cg->procs_fd);
    if (cg->dir_fd >= 0)
        close(cg->dir_fd);
    cg->procs_fd = cg->dir_fd = -1;
}
