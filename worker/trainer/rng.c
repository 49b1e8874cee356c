/* rng.c - xoshiro256** (Blackman and Vigna, 2018) seeded with splitmix64, as its authors
 * recommend: splitmix64 never yields the all-zero state xoshiro cannot leave. */
#include "rng.h"

#include <math.h> /* log, sqrt, cos */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

void mgpu_rng_seed(mgpu_rng_t *r, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
}

void mgpu_rng_seed2(mgpu_rng_t *r, uint64_t seed, uint64_t stream)
{
    /* Mix the stream number through splitmix64 first so that (seed, stream) and
     * (seed + 1, stream - 1) land far apart. */
    uint64_t x = stream;
    mgpu_rng_seed(r, seed ^ splitmix64(&x));
}

uint64_t mgpu_rng_u64(mgpu_rng_t *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double mgpu_rng_uniform(mgpu_rng_t *r)
{
    return (double)(mgpu_rng_u64(r) >> 11) * 0x1.0p-53;
}

uint64_t mgpu_rng_below(mgpu_rng_t *r, uint64_t n)
{
    /* Rejection on the top of the range: values >= the largest multiple of n are redrawn. */
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do
        x = mgpu_rng_u64(r);
    while (x >= limit);
    return x % n;
}

double mgpu_rng_normal(mgpu_rng_t *r)
{
    /* 1 - u lies in (0, 1], so the log is finite. */
    double u1 = 1.0 - mgpu_rng_uniform(r), u2 = mgpu_rng_uniform(r);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void mgpu_rng_permutation(mgpu_rng_t *r, size_t *perm, size_t n)
{
    for (size_t i = 0; i < n; i++)
        perm[i] = i;
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)mgpu_rng_below(r, i);
        size_t t = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = t;
    }
}
