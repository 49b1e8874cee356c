/* shm_head.c - the stale segments of libmgpu's one-host collectives (shm_head.h). */
#include "shm_head.h"

#include <dirent.h>   /* opendir, readdir */
#include <errno.h>    /* errno, EPERM */
#include <fcntl.h>    /* open, O_* */
#include <signal.h>   /* kill */
#include <stdio.h>    /* snprintf */
#include <string.h>   /* strncmp */
#include <sys/stat.h> /* fstat */
#include <unistd.h>   /* pread, unlinkat, close */

int mgpu_shm_pid_alive(int pid)
{
    return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM);
}

int mgpu_shm_head_creator(int fd)
{
    struct stat st;
    mgpu_shm_head_t h;

    if (fstat(fd, &st) < 0 || (size_t)st.st_size < sizeof h ||
        pread(fd, &h, sizeof h, 0) != (ssize_t)sizeof h || h.magic != MGPU_SHM_MAGIC)
        return 0;
    return h.creator_pid > 0 ? h.creator_pid : 0;
}

/* A segment of uid's whose head names a creator that no longer exists. */
static int creator_dead(int fd, unsigned uid)
{
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_uid != uid)
        return 0;
    int pid = mgpu_shm_head_creator(fd);
    return pid > 0 && !mgpu_shm_pid_alive(pid);
}

int mgpu_shm_remove_stale(const char *dir, unsigned uid)
{
    char prefix[32];
    int removed = 0;
    DIR *d = opendir(dir != NULL ? dir : "/dev/shm");

    if (d == NULL)
        return 0;
    snprintf(prefix, sizeof prefix, "mgpu-%u-", uid);
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0)
            continue;
        int fd = openat(dirfd(d), e->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0)
            continue;
        int dead = creator_dead(fd, uid);
        close(fd);
        if (dead && unlinkat(dirfd(d), e->d_name, 0) == 0)
            removed++;
    }
    closedir(d);
    return removed;
}
