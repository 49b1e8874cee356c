/* pages.c - the progress pages and heartbeat files of the local workers (see pages.h). */
#include "pages.h"

#include <errno.h>    /* errno */
#include <stdlib.h>   /* calloc */
#include <string.h>   /* memset, strerror */
#include <sys/mman.h> /* memfd_create, mmap */
#include <sys/stat.h> /* fstat */
#include <unistd.h>   /* ftruncate, close */

int mgpu_pages_open(mgpu_pages_t *pg, int n, mgpu_err_t *err)
{
    memset(pg, 0, sizeof *pg);
    pg->fd = -1;
    pg->map = MAP_FAILED;
    pg->n = n;
    pg->len = (size_t)n * MGPU_PROGRESS_PAGE;
    pg->heartbeat_fds = malloc((size_t)n * sizeof *pg->heartbeat_fds);
    if (pg->heartbeat_fds == NULL)
        return mgpu_err_set(err, -ENOMEM, "out of memory");
    for (int k = 0; k < n; k++)
        pg->heartbeat_fds[k] = -1;
    pg->fd = memfd_create("mgpu-progress", MFD_CLOEXEC);
    if (pg->fd < 0 || ftruncate(pg->fd, (off_t)pg->len) != 0) {
        int e = errno;
        mgpu_pages_close(pg);
        return mgpu_err_set(err, -e, "memfd_create(mgpu-progress, %zu bytes): %s",
                            (size_t)n * MGPU_PROGRESS_PAGE, strerror(e));
    }
    pg->map = mmap(NULL, pg->len, PROT_READ | PROT_WRITE, MAP_SHARED, pg->fd, 0);
    if (pg->map == MAP_FAILED) {
        int e = errno;
        mgpu_pages_close(pg);
        return mgpu_err_set(err, -e, "mmap(progress pages, %zu bytes): %s",
                            (size_t)n * MGPU_PROGRESS_PAGE, strerror(e));
    }
    for (int k = 0; k < n; k++) {
        pg->heartbeat_fds[k] = memfd_create("mgpu-heartbeat", MFD_CLOEXEC);
        if (pg->heartbeat_fds[k] < 0) {
            int e = errno;
            mgpu_pages_close(pg);
            return mgpu_err_set(err, -e, "memfd_create(mgpu-heartbeat) for local rank %d: %s", k,
                                strerror(e));
        }
    }
    return 0;
}

void mgpu_pages_reset(const mgpu_pages_t *pg)
{
    if (pg->map != MAP_FAILED && pg->map != NULL)
        memset(pg->map, 0, pg->len);
}

void mgpu_pages_set_lost(const mgpu_pages_t *pg, const char *text)
{
    if (pg->map == MAP_FAILED || pg->map == NULL)
        return;
    for (int k = 0; k < pg->n; k++)
        mgpu_progress_set_lost(
            (mgpu_progress_page_t *)((char *)pg->map + (size_t)k * MGPU_PROGRESS_PAGE), text);
}

int mgpu_pages_read(const mgpu_pages_t *pg, int k, mgpu_progress_page_t *out)
{
    if (pg->map == MAP_FAILED || pg->map == NULL || k < 0 || k >= pg->n)
        return -1;
    return mgpu_progress_read(
        (const mgpu_progress_page_t *)((const char *)pg->map + (size_t)k * MGPU_PROGRESS_PAGE),
        out);
}

int64_t mgpu_pages_heartbeat_ns(const mgpu_pages_t *pg, int k)
{
    struct stat st;

    if (k < 0 || k >= pg->n || pg->heartbeat_fds[k] < 0 || fstat(pg->heartbeat_fds[k], &st) != 0)
        return 0;
    return (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
}

void mgpu_pages_close(mgpu_pages_t *pg)
{
    if (pg->map != MAP_FAILED && pg->map != NULL)
        munmap(pg->map, pg->len);
    pg->map = MAP_FAILED;
    if (pg->fd >= 0)
        close(pg->fd);
    pg->fd = -1;
    for (int k = 0; pg->heartbeat_fds != NULL && k < pg->n; k++)
        if (pg->heartbeat_fds[k] >= 0)
            close(pg->heartbeat_fds[k]);
    free(pg->heartbeat_fds);
    pg->heartbeat_fds = NULL;
}
