/* sampler.h - torch.utils.data.DistributedSampler, index for index, and the batches a rank
 * takes from it.
 *
 * As PyTorch defines it: with N samples and W ranks, each rank gets
 *   num_samples = ceil(N / W)             (drop_last off: pad by repeating from the start)
 *   num_samples = ceil((N - W) / W)       (drop_last on, N % W != 0: drop the tail)
 * total_size = num_samples * W; the index list (0..N-1, or a permutation drawn from seed +
 * epoch when shuffling) is padded or cut to total_size, and rank r takes positions r, r + W,
 * r + 2W, ... Every rank draws the same permutation, so the shards are disjoint (but for the
 * padding) and cover the data set.
 *
 * The permutation comes from mgpu_rng (rng.h) seeded with seed + epoch, not from
 * torch.randperm: the partition rules are PyTorch's, the shuffled order is not bit-equal to
 * PyTorch's. With shuffle off the indices are exactly PyTorch's.
 *
 * Plain values, owned by the caller; mgpu_sampler_indices writes into the caller's array. */
#ifndef MGPU_SAMPLER_H
#define MGPU_SAMPLER_H

#include <stddef.h> /* size_t */
#include <stdint.h> /* uint64_t */

#include "error.h" /* mgpu_err_t */

typedef struct mgpu_sampler {
    size_t n;        /* data set size */
    int world, rank; /* num_replicas, rank */
    int shuffle;     /* 1: permute with seed + epoch */
    int drop_last;   /* 1: drop the tail instead of padding */
    uint64_t seed;
    size_t num_samples; /* indices this rank gets per epoch */
    size_t total_size;  /* num_samples * world */
} mgpu_sampler_t;

/* Fills s; -EINVAL (with the value named) for n == 0, world < 1, rank outside [0, world), or
 * drop_last with fewer samples than ranks (every rank would get none). */
int mgpu_sampler_init(mgpu_sampler_t *s, size_t n, int world, int rank, int shuffle, uint64_t seed,
                      int drop_last, mgpu_err_t *err);
/* Writes this rank's num_samples indices for epoch into out; -ENOMEM if the scratch
 * permutation cannot be allocated. */
int mgpu_sampler_indices(const mgpu_sampler_t *s, uint64_t epoch, size_t *out, mgpu_err_t *err);

/* Index i (< num_samples) of this rank's list for epoch, computed alone in O(1) memory, for a
 * data set too large to hold a permutation of per rank (a language model's windows). The
 * partition is the same as mgpu_sampler_indices'; with shuffle on, the order is another
 * permutation: a keyed bijection of [0, n) drawn from seed + epoch (a Feistel network over the
 * next power of four at or above n, stepping again while the result is n or more), the same on
 * every rank. Without shuffle both give the same indices. */
size_t mgpu_sampler_index(const mgpu_sampler_t *s, uint64_t epoch, size_t i);

/* Batches of batch_size over num_samples indices (a DataLoader over the sampler): the last
 * one is smaller unless drop_last_batch. */
size_t mgpu_sampler_num_batches(const mgpu_sampler_t *s, size_t batch_size, int drop_last_batch);
/* Start and size of batch b (b < mgpu_sampler_num_batches). */
void mgpu_sampler_batch(const mgpu_sampler_t *s, size_t batch_size, size_t b, size_t *start,
                        size_t *count);

#endif
