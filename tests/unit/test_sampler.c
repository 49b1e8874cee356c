/* test_sampler.c - DistributedSampler against PyTorch 1.13's outputs (shuffle off, where the
 * indices are PyTorch's exactly), the partition properties with shuffle on, the batching the
 * article's scenarios show (45 -> 30 + 15, 23 -> 23), and the generator itself. */
#include "check.h"
#include "rng.h"
#include "sampler.h"

#include <errno.h> /* EINVAL */
#include <math.h>  /* fabs */

/* list(DistributedSampler(range(90), num_replicas=4, rank=3, shuffle=False)) */
static void test_torch_90_over_4(void)
{
    static const size_t want[23] = {3,  7,  11, 15, 19, 23, 27, 31, 35, 39, 43, 47,
                                    51, 55, 59, 63, 67, 71, 75, 79, 83, 87, 1};
    mgpu_sampler_t s;
    size_t got[23];
    CHECK_INT(mgpu_sampler_init(&s, 90, 4, 3, 0, 0, 0, NULL), 0);
    CHECK_INT(s.num_samples, 23);
    CHECK_INT(s.total_size, 92);
    CHECK_INT(mgpu_sampler_indices(&s, 0, got, NULL), 0);
    for (int i = 0; i < 23; i++)
        CHECK_INT(got[i], want[i]);
    /* Rank 0 starts 0, 4, ... and its padding is index 0 (position 88 -> 88). */
    CHECK_INT(mgpu_sampler_init(&s, 90, 4, 2, 0, 0, 0, NULL), 0);
    CHECK_INT(mgpu_sampler_indices(&s, 0, got, NULL), 0);
    CHECK_INT(got[22], 0); /* position 2 + 22*4 = 90 -> wraps to 0 */
    /* Scenario 2: one batch of 23 (batch_size 30). */
    CHECK_INT(mgpu_sampler_num_batches(&s, 30, 0), 1);
    size_t start, count;
    mgpu_sampler_batch(&s, 30, 0, &start, &count);
    CHECK_INT(start, 0);
    CHECK_INT(count, 23);
}

/* Scenario 1: 90 samples over 2 ranks, batch 30 -> batches of 30 and 15. */
static void test_scenario1_batches(void)
{
    mgpu_sampler_t s;
    size_t start, count;
    CHECK_INT(mgpu_sampler_init(&s, 90, 2, 1, 0, 0, 0, NULL), 0);
    CHECK_INT(s.num_samples, 45);
    CHECK_INT(mgpu_sampler_num_batches(&s, 30, 0), 2);
    mgpu_sampler_batch(&s, 30, 1, &start, &count);
    CHECK_INT(start, 30);
    CHECK_INT(count, 15);
    CHECK_INT(mgpu_sampler_num_batches(&s, 30, 1), 1); /* drop the last batch */
}

/* DistributedSampler(range(10), num_replicas=4, rank=r, shuffle=False, drop_last=True):
 * [0, 4], [1, 5], [2, 6], [3, 7]. */
static void test_torch_drop_last(void)
{
    for (int r = 0; r < 4; r++) {
        mgpu_sampler_t s;
        size_t got[2];
        CHECK_INT(mgpu_sampler_init(&s, 10, 4, r, 0, 0, 1, NULL), 0);
        CHECK_INT(s.num_samples, 2);
        CHECK_INT(mgpu_sampler_indices(&s, 0, got, NULL), 0);
        CHECK_INT(got[0], r);
        CHECK_INT(got[1], r + 4);
    }
    /* Divisible: drop_last changes nothing. */
    mgpu_sampler_t s;
    CHECK_INT(mgpu_sampler_init(&s, 12, 4, 0, 0, 0, 1, NULL), 0);
    CHECK_INT(s.num_samples, 3);
}

/* Padding longer than the data set: range(2) over 5 ranks gives [0], [1], [0], [1], [0]. */
static void test_torch_padding_wraps_many_times(void)
{
    static const size_t want[5] = {0, 1, 0, 1, 0};
    for (int r = 0; r < 5; r++) {
        mgpu_sampler_t s;
        size_t got[1];
        CHECK_INT(mgpu_sampler_init(&s, 2, 5, r, 0, 0, 0, NULL), 0);
        CHECK_INT(s.num_samples, 1);
        CHECK_INT(mgpu_sampler_indices(&s, 0, got, NULL), 0);
        CHECK_INT(got[0], want[r]);
    }
}

static void test_shuffle_partition(void)
{
    enum { N = 1001, W = 4 };
    size_t shard[W][251], first[W][251];
    int seen[N];
    for (int epoch = 0; epoch < 3; epoch++) {
        memset(seen, 0, sizeof seen);
        for (int r = 0; r < W; r++) {
            mgpu_sampler_t s;
            CHECK_INT(mgpu_sampler_init(&s, N, W, r, 1, 42, 0, NULL), 0);
            CHECK_INT(s.num_samples, 251);
            CHECK_INT(mgpu_sampler_indices(&s, epoch, shard[r], NULL), 0);
            for (int i = 0; i < 251; i++) {
                CHECK(shard[r][i] < N);
                seen[shard[r][i]]++;
            }
        }
        /* Every sample appears; 1004 positions for 1001 samples: exactly 3 twice. */
        int twice = 0;
        for (int i = 0; i < N; i++) {
            CHECK(seen[i] >= 1 && seen[i] <= 2);
            twice += seen[i] == 2;
        }
        CHECK_INT(twice, 3);
        if (epoch == 0)
            memcpy(first, shard, sizeof shard);
        else
            CHECK(memcmp(first, shard, sizeof shard) != 0); /* set_epoch reshuffles */
    }
    /* Same seed and epoch: the same permutation (every rank computes it alone). */
    mgpu_sampler_t s;
    size_t again[251];
    CHECK_INT(mgpu_sampler_init(&s, N, W, 0, 1, 42, 0, NULL), 0);
    CHECK_INT(mgpu_sampler_indices(&s, 0, again, NULL), 0);
    CHECK(memcmp(again, first[0], sizeof again) == 0);
    /* A different seed: a different order. */
    CHECK_INT(mgpu_sampler_init(&s, N, W, 0, 1, 43, 0, NULL), 0);
    CHECK_INT(mgpu_sampler_indices(&s, 0, again, NULL), 0);
    CHECK(memcmp(again, first[0], sizeof again) != 0);
}

static void test_bad_arguments(void)
{
    mgpu_sampler_t s;
    mgpu_err_t err = {0};
    CHECK_INT(mgpu_sampler_init(&s, 0, 1, 0, 0, 0, 0, &err), -EINVAL);
    CHECK_CONTAINS(err.msg, "empty data set");
    CHECK_INT(mgpu_sampler_init(&s, 10, 4, 4, 0, 0, 0, &err), -EINVAL);
    CHECK_CONTAINS(err.msg, "rank 4, expected 0..3");
    CHECK_INT(mgpu_sampler_init(&s, 10, 0, 0, 0, 0, 0, &err), -EINVAL);
    CHECK_CONTAINS(err.msg, "world size 0");
    CHECK_INT(mgpu_sampler_init(&s, 3, 4, 0, 0, 0, 1, &err), -EINVAL);
    CHECK_CONTAINS(err.msg, "drop_last with 3 samples and 4 ranks");
}

static void test_rng(void)
{
    mgpu_rng_t a, b;
    mgpu_rng_seed(&a, 7);
    mgpu_rng_seed(&b, 7);
    for (int i = 0; i < 100; i++)
        CHECK(mgpu_rng_u64(&a) == mgpu_rng_u64(&b));
    mgpu_rng_seed2(&a, 7, 1);
    mgpu_rng_seed2(&b, 7, 2);
    CHECK(mgpu_rng_u64(&a) != mgpu_rng_u64(&b));
    /* Moments of 200000 normals and uniforms: mean 0 / 0.5, variance 1 / 1/12. */
    double sn = 0, sn2 = 0, su = 0;
    int below_hist[5] = {0};
    for (int i = 0; i < 200000; i++) {
        double x = mgpu_rng_normal(&a), u = mgpu_rng_uniform(&a);
        sn += x, sn2 += x * x, su += u;
        CHECK(u >= 0.0 && u < 1.0);
        below_hist[mgpu_rng_below(&a, 5)]++;
    }
    CHECK(fabs(sn / 200000) < 0.01);
    CHECK(fabs(sn2 / 200000 - 1.0) < 0.02);
    CHECK(fabs(su / 200000 - 0.5) < 0.01);
    for (int i = 0; i < 5; i++)
        CHECK(below_hist[i] > 39000 && below_hist[i] < 41000);
    size_t perm[50];
    int hit[50] = {0};
    mgpu_rng_permutation(&a, perm, 50);
    for (int i = 0; i < 50; i++)
        hit[perm[i]]++;
    for (int i = 0; i < 50; i++)
        CHECK_INT(hit[i], 1);
}

/* The O(1) index: PyTorch's partition; with shuffle a permutation of [0, n) per epoch that
 * every rank draws alike (the ranks' lists together hold each index once, but the padding);
 * without shuffle the same indices as mgpu_sampler_indices. */
static void test_index_without_a_list(void)
{
    const size_t sizes[] = {1, 2, 3, 7, 64, 65, 1000, 4097};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = sizes[k];
        for (int world = 1; world <= 4; world++) {
            int *hit = calloc(n, sizeof *hit), moved = 0;
            size_t *list = malloc(sizeof *list * (n + 4));
            for (int r = 0; r < world; r++) {
                mgpu_sampler_t s, plain;
                CHECK_INT(mgpu_sampler_init(&s, n, world, r, 1, 42, 0, NULL), 0);
                CHECK_INT(mgpu_sampler_init(&plain, n, world, r, 0, 42, 0, NULL), 0);
                CHECK_INT(mgpu_sampler_indices(&plain, 3, list, NULL), 0);
                for (size_t i = 0; i < s.num_samples; i++) {
                    size_t x = mgpu_sampler_index(&s, 3, i);
                    CHECK(x < n);
                    if (x < n && (size_t)r + i * (size_t)world < n)
                        hit[x]++;
                    moved += x != list[i];
                    CHECK_INT(mgpu_sampler_index(&plain, 3, i), list[i]);
                    CHECK_INT(mgpu_sampler_index(&s, 3, i), x); /* the same every time */
                }
            }
            for (size_t i = 0; i < n; i++)
                CHECK_INT(hit[i], 1);
            if (n >= 64)
                CHECK(moved > (int)n / 2); /* shuffled indeed */
            free(hit);
            free(list);
        }
    }
    /* another epoch, another order; the padding repeats the start of the epoch's order */
    mgpu_sampler_t s;
    CHECK_INT(mgpu_sampler_init(&s, 1000, 3, 0, 1, 7, 0, NULL), 0);
    int same = 0;
    for (size_t i = 0; i < s.num_samples; i++)
        same += mgpu_sampler_index(&s, 0, i) == mgpu_sampler_index(&s, 1, i);
    CHECK(same < 20);
    mgpu_sampler_t last;
    CHECK_INT(mgpu_sampler_init(&last, 1000, 3, 1, 1, 7, 0, NULL), 0);
    CHECK_INT(mgpu_sampler_index(&last, 5, 333), mgpu_sampler_index(&s, 5, 0)); /* 1000 -> 0 */
    /* drop_last: the first total_size of the order, nothing repeated */
    CHECK_INT(mgpu_sampler_init(&s, 10, 4, 3, 1, 7, 1, NULL), 0);
    CHECK_INT(s.num_samples, 2);
}

int main(void)
{
    RUN(test_torch_90_over_4);
    RUN(test_scenario1_batches);
    RUN(test_torch_drop_last);
    RUN(test_torch_padding_wraps_many_times);
    RUN(test_shuffle_partition);
    RUN(test_bad_arguments);
    RUN(test_rng);
    RUN(test_index_without_a_list);
    return check_done();
}
