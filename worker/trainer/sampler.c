/* sampler.c - DistributedSampler (torch/utils/data/distributed.py, PyTorch 1.13 - 2.x). */
#include "sampler.h"

#include <errno.h>  /* EINVAL, ENOMEM */
#include <stdlib.h> /* malloc */

#include "rng.h" /* mgpu_rng_permutation */

int mgpu_sampler_init(mgpu_sampler_t *s, size_t n, int world, int rank, int shuffle, uint64_t seed,
                      int drop_last, mgpu_err_t *err)
{
    if (n == 0)
        return mgpu_err_set(err, -EINVAL, "sampler: empty data set, expected >= 1 sample");
    if (world < 1)
        return mgpu_err_set(err, -EINVAL, "sampler: world size %d, expected >= 1", world);
    if (rank < 0 || rank >= world)
        return mgpu_err_set(err, -EINVAL, "sampler: rank %d, expected 0..%d", rank, world - 1);
    s->n = n;
    s->world = world;
    s->rank = rank;
    s->shuffle = shuffle != 0;
    s->drop_last = drop_last != 0;
    s->seed = seed;
    if (s->drop_last && n % (size_t)world != 0) {
        /* PyTorch: math.ceil((len - W) / W), i.e. floor(len / W) when len >= W; with
         * len < W every rank would get nothing, which PyTorch allows silently. */
        if (n < (size_t)world)
            return mgpu_err_set(err, -EINVAL,
                                "sampler: drop_last with %zu samples and %d ranks leaves every "
                                "rank empty, expected at least %d samples",
                                n, world, world);
        s->num_samples = (n - (size_t)world + (size_t)world - 1) / (size_t)world;
    } else {
        s->num_samples = (n + (size_t)world - 1) / (size_t)world;
    }
    s->total_size = s->num_samples * (size_t)world;
    return 0;
}

int mgpu_sampler_indices(const mgpu_sampler_t *s, uint64_t epoch, size_t *out, mgpu_err_t *err)
{
    size_t *perm = NULL;

    if (s->shuffle) {
        mgpu_rng_t rng;
        perm = malloc(sizeof *perm * s->n);
        if (perm == NULL)
            return mgpu_err_set(err, -ENOMEM, "sampler: malloc(%zu) for the permutation failed",
                                sizeof *perm * s->n);
        mgpu_rng_seed(&rng, s->seed + epoch); /* g.manual_seed(self.seed + self.epoch) */
        mgpu_rng_permutation(&rng, perm, s->n);
    }
    /* Position q of the padded list is q itself below n, and wraps to the start above it
     * (PyTorch repeats the whole list as often as needed when padding exceeds n). Without
     * padding, total_size <= n and the tail is cut. */
    for (size_t i = 0; i < s->num_samples; i++) {
        size_t q = (size_t)s->rank + i * (size_t)s->world;
        size_t pos = q % s->n;
        out[i] = perm ? perm[pos] : pos;
    }
    free(perm);
    return 0;
}

/* splitmix64's finaliser: every bit of x reaches every bit of the result. */
static uint64_t mix64(uint64_t x)
{
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* A bijection of [0, 4^half) keyed by key: six rounds of a balanced Feistel network on two
 * halves of `half` bits (invertible whatever the round function is). */
static uint64_t feistel(uint64_t x, unsigned half, uint64_t key)
{
    const uint64_t mask = (1ull << half) - 1;
    uint64_t l = x >> half, r = x & mask;
    for (uint64_t round = 0; round < 6; round++) {
        uint64_t f = mix64(key ^ mix64(r + (round << 58))) & mask;
        uint64_t t = l ^ f;
        l = r;
        r = t;
    }
    return l << half | r;
}

size_t mgpu_sampler_index(const mgpu_sampler_t *s, uint64_t epoch, size_t i)
{
    size_t pos = ((size_t)s->rank + i * (size_t)s->world) % s->n; /* as mgpu_sampler_indices */
    if (!s->shuffle)
        return pos;
    unsigned half = 1;
    while (half < 32 && (1ull << (2 * half)) < (uint64_t)s->n)
        half++;
    /* Walking the cycle of pos until it lands below n keeps a bijection of [0, n): the domain
     * is under 4n, so a few steps on average. */
    const uint64_t key = mix64(s->seed + epoch);
    uint64_t x = pos;
    do
        x = feistel(x, half, key);
    while (x >= (uint64_t)s->n);
    return (size_t)x;
}

size_t mgpu_sampler_num_batches(const mgpu_sampler_t *s, size_t batch_size, int drop_last_batch)
{
    if (batch_size == 0)
        return 0;
    return drop_last_batch ? s->num_samples / batch_size
                           : (s->num_samples + batch_size - 1) / batch_size;
}

void mgpu_sampler_batch(const mgpu_sampler_t *s, size_t batch_size, size_t b, size_t *start,
                        size_t *count)
{
    size_t lo = b * batch_size, hi = lo + batch_size;
    if (lo > s->num_samples)
        lo = s->num_samples;
    if (hi > s->num_samples)
        hi = s->num_samples;
    *start = lo;
    *count = hi - lo;
}
