/* checkpoint.c - atomic write (temp file, fsync, rename, fsync of the directory) and verified
 * read of a checkpoint. */
#include "checkpoint.h"

#include <dirent.h>   /* opendir, readdir */
#include <errno.h>    /* errno, EBADMSG, ESRCH */
#include <fcntl.h>    /* open, O_CLOEXEC */
#include <signal.h>   /* kill */
#include <stdio.h>    /* fdopen, snprintf */
#include <stdlib.h>   /* malloc */
#include <string.h>   /* memcpy, strerror */
#include <sys/stat.h> /* fstat */
#include <unistd.h>   /* close */

#include "atomic_file.h" /* mgpu_atomic_file_write, mgpu_atomic_file_target */

#define CKPT_MAGIC "MGPUCKPT"
#define CKPT_VERSION 2 /* 1: without the header's last 8 bytes (batch_per_rank), still read */
#define CKPT_V1_BYTES 128

typedef struct ckpt_header {
    char magic[8];
    uint32_t version;
    uint32_t header_bytes;
    uint64_t model_hash;
    uint64_t n_params;
    uint64_t n_state;
    uint64_t epoch;
    uint64_t batch_in_epoch;
    uint64_t step;
    uint64_t optim_step;
    uint32_t optim_kind;
    uint32_t world_size;
    uint64_t seed;
    uint64_t rng[4];
    uint64_t checksum;       /* FNV-1a over this header (with checksum = 0) and the payload */
    uint32_t batch_per_rank; /* version 2 on: a rank's samples in each batch_in_epoch */
    uint32_t reserved;
} ckpt_header_t;
_Static_assert(sizeof(ckpt_header_t) == 136, "the on-disk header is 136 bytes");

uint64_t mgpu_fnv1a(uint64_t h, const void *data, size_t len)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

static uint64_t checksum(const ckpt_header_t *hdr, const float *params, const float *state)
{
    ckpt_header_t h = *hdr;
    h.checksum = 0;
    uint64_t x = mgpu_fnv1a(MGPU_FNV_OFFSET, &h, hdr->header_bytes);
    x = mgpu_fnv1a(x, params, sizeof(float) * hdr->n_params);
    if (hdr->n_state > 0)
        x = mgpu_fnv1a(x, state, sizeof(float) * hdr->n_state);
    return x;
}

int mgpu_ckpt_write(const char *path, const mgpu_ckpt_t *c, mgpu_err_t *err)
{
    ckpt_header_t h;
    struct iovec iov[3];
    mgpu_err_t aerr = {0};
    int rc;

    if (c->n_params > 0 && c->params == NULL)
        return mgpu_err_set(err, -EINVAL, "checkpoint: %zu params but params is NULL", c->n_params);
    if (c->n_state > 0 && c->state == NULL)
        return mgpu_err_set(err, -EINVAL, "checkpoint: %zu state floats but state is NULL",
                            c->n_state);
    memset(&h, 0, sizeof h);
    memcpy(h.magic, CKPT_MAGIC, 8);
    h.version = CKPT_VERSION;
    h.header_bytes = sizeof h;
    h.model_hash = c->model_hash;
    h.n_params = c->n_params;
    h.n_state = c->n_state;
    h.epoch = c->epoch;
    h.batch_in_epoch = c->batch_in_epoch;
    h.step = c->step;
    h.optim_step = c->optim_step;
    h.optim_kind = c->optim_kind;
    h.world_size = c->world_size;
    h.batch_per_rank = c->batch_per_rank;
    h.seed = c->seed;
    memcpy(h.rng, c->rng, sizeof h.rng);
    h.checksum = checksum(&h, c->params, c->state);

    iov[0] = (struct iovec){.iov_base = &h, .iov_len = sizeof h};
    iov[1] = (struct iovec){.iov_base = (void *)c->params, .iov_len = sizeof(float) * c->n_params};
    iov[2] = (struct iovec){.iov_base = (void *)c->state, .iov_len = sizeof(float) * c->n_state};
    if ((rc = mgpu_atomic_file_write(path, iov, c->n_state > 0 ? 3 : 2, 0, &aerr)) < 0)
        return mgpu_err_set(err, rc, "checkpoint: %s", aerr.msg);
    return 0;
}

void mgpu_ckpt_free(mgpu_ckpt_t *c)
{
    if (c == NULL)
        return;
    free(c->params);
    free(c->state);
    c->params = NULL;
    c->state = NULL;
}

int mgpu_ckpt_read(const char *path, mgpu_ckpt_t *c, mgpu_err_t *err)
{
    ckpt_header_t h;
    struct stat st;
    int fd, rc = 0;
    FILE *f;

    memset(c, 0, sizeof *c);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return mgpu_err_set(err, -errno, "checkpoint: open(%s): %s", path, strerror(errno));
    f = fdopen(fd, "rb");
    if (f == NULL) {
        rc = mgpu_err_set(err, -errno, "checkpoint: fdopen(%s): %s", path, strerror(errno));
        close(fd);
        return rc;
    }
    if (fstat(fd, &st) != 0) {
        rc = mgpu_err_set(err, -errno, "checkpoint: fstat(%s): %s", path, strerror(errno));
        goto out;
    }
    memset(&h, 0, sizeof h);
    if ((size_t)st.st_size < CKPT_V1_BYTES || fread(&h, CKPT_V1_BYTES, 1, f) != 1) {
        rc = mgpu_err_set(err, -EBADMSG, "checkpoint %s: %lld bytes, shorter than its header", path,
                          (long long)st.st_size);
        goto out;
    }
    if (memcmp(h.magic, CKPT_MAGIC, 8) != 0) {
        rc = mgpu_err_set(err, -EBADMSG, "checkpoint %s: not an mgpu checkpoint (bad magic)", path);
        goto out;
    }
    if (!(h.version == CKPT_VERSION && h.header_bytes == sizeof h) &&
        !(h.version == 1 && h.header_bytes == CKPT_V1_BYTES)) {
        rc = mgpu_err_set(err, -EBADMSG,
                          "checkpoint %s: version %u with a %u-byte header, expected version "
                          "%d with %zu (or 1 with %d)",
                          path, h.version, h.header_bytes, CKPT_VERSION, sizeof h, CKPT_V1_BYTES);
        goto out;
    }
    if (h.version > 1 && ((size_t)st.st_size < sizeof h ||
                          fread((char *)&h + CKPT_V1_BYTES, sizeof h - CKPT_V1_BYTES, 1, f) != 1)) {
        rc = mgpu_err_set(err, -EBADMSG, "checkpoint %s: %lld bytes, shorter than its header", path,
                          (long long)st.st_size);
        goto out;
    }
    uint64_t want = h.header_bytes + sizeof(float) * (h.n_params + h.n_state);
    if (h.n_params > ((uint64_t)1 << 40) || h.n_state > ((uint64_t)1 << 41) ||
        (uint64_t)st.st_size != want) {
        rc = mgpu_err_set(err, -EBADMSG,
                          "checkpoint %s: %lld bytes, expected %llu for %llu params and %llu "
                          "state floats (truncated or damaged)",
                          path, (long long)st.st_size, (unsigned long long)want,
                          (unsigned long long)h.n_params, (unsigned long long)h.n_state);
        goto out;
    }
    c->params = malloc(sizeof(float) * (h.n_params ? h.n_params : 1));
    c->state = h.n_state ? malloc(sizeof(float) * h.n_state) : NULL;
    if (c->params == NULL || (h.n_state && c->state == NULL)) {
        rc = mgpu_err_set(err, -ENOMEM, "checkpoint %s: cannot allocate %llu floats", path,
                          (unsigned long long)(h.n_params + h.n_state));
        goto out;
    }
    if (fread(c->params, sizeof(float), h.n_params, f) != h.n_params ||
        (h.n_state && fread(c->state, sizeof(float), h.n_state, f) != h.n_state)) {
        rc = mgpu_err_set(err, -EIO, "checkpoint %s: short read", path);
        goto out;
    }
    if (checksum(&h, c->params, c->state) != h.checksum) {
        rc = mgpu_err_set(err, -EBADMSG, "checkpoint %s: checksum mismatch (the file is damaged)",
                          path);
        goto out;
    }
    c->model_hash = h.model_hash;
    c->epoch = h.epoch;
    c->batch_in_epoch = h.batch_in_epoch;
    c->step = h.step;
    c->optim_step = h.optim_step;
    c->optim_kind = h.optim_kind;
    c->world_size = h.world_size;
    c->batch_per_rank = h.batch_per_rank;
    c->seed = h.seed;
    memcpy(c->rng, h.rng, sizeof c->rng);
    c->n_params = h.n_params;
    c->n_state = h.n_state;
out:
    fclose(f);
    if (rc < 0)
        mgpu_ckpt_free(c);
    return rc;
}

int mgpu_ckpt_remove_stale(const char *given, mgpu_err_t *err)
{
    char dir[4096], full[4400], path[4096];
    struct dirent *e;
    int removed = 0, rc = 0, in_place;

    /* the temporaries lie beside the file a write replaces (a link's target); a device or a
     * descriptor is written in place, with none */
    mgpu_err_t terr = {0};
    if (mgpu_atomic_file_target(given, path, sizeof path, &in_place, &terr) < 0 || in_place)
        return 0; /* a folder: the write says so */
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    size_t blen = strlen(base);
    if (blen == 0)
        return 0;
    if (slash == NULL)
        snprintf(dir, sizeof dir, ".");
    else if (slash == path)
        snprintf(dir, sizeof dir, "/");
    else
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    DIR *d = opendir(dir);
    if (d == NULL)
        return mgpu_err_set(err, -errno, "checkpoint: opendir(%s): %s", dir, strerror(errno));
    while ((e = readdir(d)) != NULL) {
        /* Exactly the name mgpu_atomic_file_write gives its temp file: PATH.tmp.<pid>, the pid in
         * decimal as %ld prints it (no sign, no leading zero); anything else is not ours. */
        const char *name = e->d_name;
        if (strncmp(name, base, blen) != 0 || strncmp(name + blen, ".tmp.", 5) != 0)
            continue;
        const char *digits = name + blen + 5;
        size_t nd = strspn(digits, "0123456789");
        if (nd == 0 || nd > 9 || digits[nd] != 0 || digits[0] == '0')
            continue;
        pid_t pid = (pid_t)strtol(digits, NULL, 10);
        /* A live writer (EPERM: alive, another user's) may be in the middle of its write. */
        if (kill(pid, 0) == 0 || errno != ESRCH)
            continue;
        struct stat st;
        snprintf(full, sizeof full, "%s/%s", dir, name);
        if (lstat(full, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        if (unlink(full) == 0)
            removed++;
        else if (errno != ENOENT && rc == 0)
            rc = mgpu_err_set(err, -errno, "checkpoint: unlink(%s): %s", full, strerror(errno));
    }
    closedir(d);
    return rc < 0 ? rc : removed;
}
