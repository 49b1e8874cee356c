/* rng.h - mgpu's one pseudo-random generator: xoshiro256** seeded through splitmix64.
 *
 * Every random choice of the trainer (datasets, the sampler's shuffle, parameter init) comes
 * from here, so a seed in train.cfg fixes a run bit for bit on any machine, whatever the
 * libc. It does NOT reproduce torch.Generator's bits: a run seeded 0 here and in PyTorch
 * draws different numbers (same distributions). The state is a plain value the caller owns
 * and may save in a checkpoint. */
#ifndef MGPU_RNG_H
#define MGPU_RNG_H

#include <stddef.h> /* size_t */
#include <stdint.h> /* uint64_t */

typedef struct mgpu_rng {
    uint64_t s[4];
} mgpu_rng_t;

/* Seeds from one 64-bit value (any value, 0 included). */
void mgpu_rng_seed(mgpu_rng_t *r, uint64_t seed);
/* Seeds stream `stream` of seed: independent generators from one user seed (e.g. the data
 * set, the init and the sampler each get their own). */
void mgpu_rng_seed2(mgpu_rng_t *r, uint64_t seed, uint64_t stream);
uint64_t mgpu_rng_u64(mgpu_rng_t *r);
/* Uniform in [0, 1) with 53 random bits. */
double mgpu_rng_uniform(mgpu_rng_t *r);
/* Uniform integer in [0, n), n >= 1, without modulo bias. */
uint64_t mgpu_rng_below(mgpu_rng_t *r, uint64_t n);
/* Standard normal (Box-Muller; two uniforms per value, no cached spare so the state alone
 * determines the stream). */
double mgpu_rng_normal(mgpu_rng_t *r);
/* Fisher-Yates: perm becomes a uniformly random permutation of 0..n-1. */
void mgpu_rng_permutation(mgpu_rng_t *r, size_t *perm, size_t n);

#endif
