/* checkpoint.h - one file holding everything a run needs to continue as if never stopped:
 * parameters, optimizer state and step, epoch and position in it, seeds and RNG state.
 *
 * Writes are atomic: the file is written as "<path>.tmp.<pid>", fsync'd, renamed over path,
 * and the directory fsync'd, so a crash at any moment leaves either the old checkpoint or
 * the new one, never a torn file. A 64-bit FNV-1a checksum over the header and payload
 * catches a file damaged afterwards (-EBADMSG, naming what failed).
 *
 * Format (little-endian, version 2): a 136-byte header (magic "MGPUCKPT", version, sizes,
 * counters, checksum, a rank's batch), then n_params floats, then n_state floats. Version 1
 * files (a 128-byte header, without the batch) are read too.
 *
 * Ownership: mgpu_ckpt_read allocates params and state; mgpu_ckpt_free releases them. For
 * mgpu_ckpt_write the caller's arrays are only read. */
#ifndef MGPU_CHECKPOINT_H
#define MGPU_CHECKPOINT_H

#include <stddef.h> /* size_t */
#include <stdint.h> /* uint64_t */

#include "error.h" /* mgpu_err_t */

typedef struct mgpu_ckpt {
    uint64_t model_hash;     /* mgpu_model_shape_hash: resume only into the same network */
    uint64_t epoch;          /* the epoch to continue */
    uint64_t batch_in_epoch; /* batches of that epoch already done */
    uint64_t step;           /* optimizer steps done in all */
    uint64_t optim_step;     /* the optimizer's own step count (bias correction) */
    uint32_t optim_kind;     /* mgpu_optim_kind_t */
    uint32_t world_size;     /* of the run that wrote it */
    uint32_t batch_per_rank; /* samples one rank took in each batch_in_epoch (0: unknown) */
    uint64_t seed;           /* the cfg's seed, to refuse resuming a differently seeded run */
    uint64_t rng[4];         /* trainer RNG state */
    size_t n_params, n_state;
    float *params; /* n_params */
    float *state;  /* n_state (may be NULL when 0) */
} mgpu_ckpt_t;

/* Atomically replaces path with c. */
int mgpu_ckpt_write(const char *path, const mgpu_ckpt_t *c, mgpu_err_t *err);
/* Reads and verifies path into c. -ENOENT when there is none (a fresh start); -EBADMSG when
 * it is damaged (bad magic, version, size or checksum). */
int mgpu_ckpt_read(const char *path, mgpu_ckpt_t *c, mgpu_err_t *err);
void mgpu_ckpt_free(mgpu_ckpt_t *c);

/* Removes the temp files "<path>.tmp.<pid>" that a writer killed mid-write left behind (path
 * a link: beside its target, where the writer puts them): those
 * whose pid is no live process of this host (regular files with exactly that name; nothing
 * else). Call it where the run that writes path starts. The number removed, or -errno. */
int mgpu_ckpt_remove_stale(const char *path, mgpu_err_t *err);

/* FNV-1a 64 of len bytes, continuing from h (start with MGPU_FNV_OFFSET). */
#define MGPU_FNV_OFFSET 0xcbf29ce484222325ULL
uint64_t mgpu_fnv1a(uint64_t h, const void *data, size_t len);

#endif
