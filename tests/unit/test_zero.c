/* test_zero.c - ZeRO-1's pieces on one process: the slices cover the parameters once whatever
 * the world size, an optimizer of a slice makes the whole optimizer's update of those floats
 * bit for bit (AdamW and SGD with momentum), and the GPT's sharded AdamW cuts the model's
 * tensors at the slice's edges with their weight decay and, alone, steps as mgpu_gpt_step
 * does. The ranks together (collectives, checkpoints) are tests/integration/test_zero.sh. */
#include "check.h"
#include "model_gpt.h"
#include "optim.h"
#include "zero.h"

static void test_slices_cover_the_parameters_once(void)
{
    const size_t ns[] = {0, 1, 2, 3, 5, 8, 277, 11319};
    const int ws[] = {1, 2, 3, 4, 7, 8};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
        for (size_t j = 0; j < sizeof ws / sizeof ws[0]; j++) {
            size_t n = ns[i], next = 0;
            int W = ws[j];
            for (int r = 0; r < W; r++) {
                mgpu_zero_t z;
                mgpu_zero_init(&z, r, W, n);
                CHECK_INT(z.block, n / (size_t)W);
                CHECK_INT(z.lo, next); /* contiguous, in rank order */
                /* Every rank a block; the last also the n % W left over. */
                CHECK_INT(z.hi - z.lo, z.block + (r == W - 1 ? n % (size_t)W : 0));
                next = z.hi;
            }
            CHECK_INT(next, n);
        }
}

/* W slices of one optimizer's kind make its update of n floats over steps, bit for bit. */
static void check_slices_update_as_whole(const mgpu_optim_spec_t *spec, size_t n, int W)
{
    mgpu_kernels_t *k;
    mgpu_err_t err = {0};
    mgpu_optim_t *whole, *part[8];
    float p0[64], p1[64], g[64];
    CHECK(n <= 64 && W <= 8);
    CHECK_INT(mgpu_kernels_create(MGPU_KBACKEND_CPU, -1, &k, &err), 0);
    CHECK_INT(mgpu_optim_create(k, spec, n, &whole, &err), 0);
    for (int r = 0; r < W; r++) {
        mgpu_zero_t z;
        mgpu_zero_init(&z, r, W, n);
        CHECK_INT(mgpu_optim_create_slice(k, spec, z.lo, z.hi - z.lo, &part[r], &err), 0);
        CHECK_INT(part[r]->n_state,
                  (size_t)mgpu_optim_state_arrays(spec) * (z.hi - z.lo)); /* its share only */
    }
    for (size_t i = 0; i < n; i++)
        p0[i] = p1[i] = 0.1f * (float)i - 1.0f;
    for (int s = 0; s < 5; s++) {
        for (size_t i = 0; i < n; i++)
            g[i] = 0.01f * (float)((i * 7 + (size_t)s * 3) % 11) - 0.05f;
        CHECK_INT(mgpu_optim_step(whole, p0, g, &err), 0);
        for (int r = 0; r < W; r++)
            CHECK_INT(mgpu_optim_step(part[r], p1, g, &err), 0);
    }
    CHECK(memcmp(p0, p1, sizeof(float) * n) == 0);
    /* Each slice's state is the whole state's arrays there. */
    const int arrays = mgpu_optim_state_arrays(spec);
    for (int r = 0; r < W; r++) {
        const mgpu_optim_t *o = part[r];
        CHECK(o->n > 0 || o->state == NULL); /* an empty slice holds no state */
        for (int a = 0; a < arrays && o->n > 0; a++)
            CHECK(memcmp(o->state + (size_t)a * o->n, whole->state + (size_t)a * n + o->off,
                         sizeof(float) * o->n) == 0);
        CHECK_INT(o->step, 5);
    }
    for (int r = 0; r < W; r++)
        mgpu_optim_destroy(part[r]);
    mgpu_optim_destroy(whole);
    mgpu_kernels_destroy(k);
}

static void test_slice_optimizer_updates_as_the_whole_one(void)
{
    mgpu_optim_spec_t adamw = {.kind = MGPU_OPTIM_ADAMW,
                               .lr = 0.01f,
                               .weight_decay = 0.1f,
                               .beta1 = 0.9f,
                               .beta2 = 0.95f,
                               .eps = 1e-8f};
    mgpu_optim_spec_t sgd = {.kind = MGPU_OPTIM_SGD, .lr = 0.1f, .momentum = 0.9f};
    CHECK_INT(mgpu_optim_state_arrays(&adamw), 2);
    CHECK_INT(mgpu_optim_state_arrays(&sgd), 1);
    for (int W = 1; W <= 8; W++) {
        check_slices_update_as_whole(&adamw, 37, W);
        check_slices_update_as_whole(&sgd, 37, W);
        check_slices_update_as_whole(&adamw, 3, W); /* fewer floats than ranks from W = 4 */
    }
}

static mgpu_gpt_t *small_gpt(mgpu_kernels_t *k, int sharded)
{
    mgpu_gpt_spec_t spec = {.n_layer = 1,
                            .n_head = 3,
                            .n_embd = 21,
                            .context = 8,
                            .vocab = 32,
                            .sharded_optimizer = sharded};
    mgpu_err_t err = {0};
    mgpu_gpt_t *m = NULL;
    CHECK_INT(mgpu_gpt_create(k, &spec, 2, &m, &err), 0);
    CHECK_INT(mgpu_gpt_init(m, 11, &err), 0);
    return m;
}

static void test_gpt_slice_cuts_the_tensors_at_its_edges(void)
{
    mgpu_kernels_t *k;
    mgpu_err_t err = {0};
    CHECK_INT(mgpu_kernels_create(MGPU_KBACKEND_CPU, -1, &k, &err), 0);
    mgpu_gpt_t *m = small_gpt(k, 1);
    CHECK(m->moments == NULL);
    for (int W = 1; W <= 5; W++) {
        size_t covered = 0;
        for (int r = 0; r < W; r++) {
            mgpu_zero_gpt_t *zg;
            CHECK_INT(mgpu_zero_gpt_create(m, r, W, &zg, &err), 0);
            const size_t lo = zg->z.lo, len = zg->z.hi - zg->z.lo;
            size_t next = lo; /* the pieces follow each other from the slice's start */
            CHECK_INT(zg->n_moments, 2 * len);
            for (int i = 0; i < zg->n_tensors; i++) {
                const mgpu_gpt_adamw_tensor_t *t = &zg->adam[i];
                const size_t at = (size_t)(t->p - m->params);
                CHECK_INT(at, next);
                CHECK(t->g == m->grads + at);
                CHECK(t->m == zg->moments + (at - lo));
                CHECK(t->v == zg->moments + len + (at - lo));
                CHECK(t->p16 == NULL);
                /* inside one model tensor, with its weight decay */
                int j = 0;
                while (!(m->tensors[j].off <= at && at < m->tensors[j].off + m->tensors[j].n))
                    j++;
                CHECK(at + t->n <= m->tensors[j].off + m->tensors[j].n);
                CHECK_INT(t->decay, m->adam[j].decay);
                next = at + t->n;
            }
            CHECK_INT(next, zg->z.hi);
            covered += len;
            mgpu_zero_gpt_destroy(zg);
        }
        CHECK_INT(covered, m->n_params);
    }
    mgpu_gpt_destroy(m);
    mgpu_kernels_destroy(k);
}

/* One rank alone: the sharded step is mgpu_gpt_step (clip included), bit for bit. */
static void test_gpt_sharded_step_alone_is_the_gpt_step(void)
{
    mgpu_kernels_t *k;
    mgpu_err_t err = {0};
    CHECK_INT(mgpu_kernels_create(MGPU_KBACKEND_CPU, -1, &k, &err), 0);
    mgpu_gpt_t *a = small_gpt(k, 0), *b = small_gpt(k, 1);
    mgpu_zero_gpt_t *zg;
    CHECK_INT(mgpu_zero_gpt_create(b, 0, 1, &zg, &err), 0);
    mgpu_ddp_comm_t solo = {.rank = 0, .world_size = 1};
    mgpu_adamw_hparams_t hp = {
        .lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
    int32_t tok[16], tgt[16];
    CHECK(mgpu_gpt_step(b, &hp, 1, 1.0f, NULL, &err) < 0); /* no moments of its own */
    CHECK_CONTAINS(err.msg, "sharded_optimizer");
    for (int s = 1; s <= 4; s++) {
        for (int i = 0; i < 16; i++)
            tok[i] = (i * 5 + s) % 32, tgt[i] = (i * 3 + s * 7) % 32;
        mgpu_gpt_t *both[2] = {a, b};
        for (int j = 0; j < 2; j++)
            CHECK(mgpu_gpt_zero_grads(both[j], &err) == 0 &&
                  mgpu_gpt_load(both[j], tok, tgt, 2, 8, &err) == 0 &&
                  mgpu_gpt_loss(both[j], 1.0f / 16, 1, &err) == 0);
        CHECK_INT(mgpu_gpt_step(a, &hp, s, 0.5f, NULL, &err), 0);
        CHECK_INT(mgpu_zero_gpt_step(zg, &solo, b, &hp, s, 0.5f, &err), 0);
        CHECK(memcmp(a->params, b->params, sizeof(float) * a->n_params) == 0);
    }
    CHECK(memcmp(a->moments, zg->moments, sizeof(float) * 2 * a->n_params) == 0);
    mgpu_zero_gpt_destroy(zg);
    mgpu_gpt_destroy(a);
    mgpu_gpt_destroy(b);
    mgpu_kernels_destroy(k);
}

int main(void)
{
    RUN(test_slices_cover_the_parameters_once);
    RUN(test_slice_optimizer_updates_as_the_whole_one);
    RUN(test_gpt_slice_cuts_the_tensors_at_its_edges);
    RUN(test_gpt_sharded_step_alone_is_the_gpt_step);
    return check_done();
}
