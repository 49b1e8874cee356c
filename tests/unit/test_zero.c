/* test_zero.c - ZeRO-1's pieces on one process: the slices cover the parameters once whatever
 * the world size, an optimizer of a slice makes the whole optimizer's update of those floats
 * bit for bit (AdamW and SGD with momentum), the GPT's sharded AdamW cuts the model's
 * tensors at the slice's edges with their weight decay and, alone, steps as mgpu_gpt_step
 * does, on the fp32 path and on the bf16 path (whose bf16 copy of the weights, fc16's rows
 * inside a wider matrix included, comes out with the same bits), and the check takes GPU
 * ranks but wants every collective. The ranks together (collectives, checkpoints) are
 * tests/integration/test_zero.sh and, on thread-ranks, test_zero_gpu.c. */
#include "check.h"
#include "model_gpt.h"
#include "optim.h"
#include "transformer.h" /* mgpu_gpt_to_bf16 */
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

static int no_avg(void *ctx, float *buf, size_t count, mgpu_err_t *err)
{
    return 0;
}

static int no_bcast(void *ctx, void *buf, size_t bytes, int root, mgpu_err_t *err)
{
    return 0;
}

/* A rank that trains on a GPU is taken (its collectives, NCCL's, take device memory); with
 * more than one rank each collective the sharded step calls must be there. */
static void test_check_takes_gpu_ranks_and_wants_every_collective(void)
{
    mgpu_kernels_t *k, gpu;
    mgpu_err_t err = {0};
    CHECK_INT(mgpu_kernels_create(MGPU_KBACKEND_CPU, -1, &k, &err), 0);
    gpu = *k;
    gpu.backend = MGPU_KBACKEND_CUDA; /* read by the check alone: nothing runs on it */
    const mgpu_ddp_comm_t full = {.rank = 0,
                                  .world_size = 2,
                                  .allreduce_avg = no_avg,
                                  .allreduce_sum = no_avg,
                                  .broadcast = no_bcast,
                                  .reduce_scatter_avg = no_avg,
                                  .all_gather = no_avg};
    CHECK_INT(mgpu_zero_check("gpt", &gpu, &full, &err), 0);
    CHECK_INT(mgpu_zero_check("ddp", k, &full, &err), 0);
    for (int miss = 0; miss < 5; miss++) {
        mgpu_ddp_comm_t c = full;
        if (miss == 0)
            c.allreduce_avg = NULL;
        else if (miss == 1)
            c.allreduce_sum = NULL;
        else if (miss == 2)
            c.broadcast = NULL;
        else if (miss == 3)
            c.reduce_scatter_avg = NULL;
        else
            c.all_gather = NULL;
        err.msg[0] = 0;
        CHECK(mgpu_zero_check("gpt", &gpu, &c, &err) < 0);
        CHECK_CONTAINS(err.msg, "gpt: zero = 1 with world size 2 needs the reduce-scatter");
        c.world_size = 1; /* alone: no collective runs */
        CHECK_INT(mgpu_zero_check("gpt", &gpu, &c, &err), 0);
    }
    mgpu_kernels_destroy(k);
}

/* The bf16 path's conversions on the host (the CPU backend's memory is the host's), as the
 * CUDA ones round: to nearest, ties to even. The other ops are never called here. */
static int h_to_bf16(void *impl, size_t n, const float *x, mgpu_bf16_t *y, mgpu_err_t *err)
{
    for (size_t i = 0; i < n; i++)
        y[i] = mgpu_gpt_to_bf16(x[i]);
    return 0;
}

static int h_to_bf16_2d(void *impl, int rows, int cols, const float *x, size_t ldx, mgpu_bf16_t *y,
                        size_t ldy, mgpu_err_t *err)
{
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < cols; j++)
            y[(size_t)r * ldy + (size_t)j] = mgpu_gpt_to_bf16(x[(size_t)r * ldx + (size_t)j]);
    return 0;
}

static const mgpu_gpt_bf16_ops_t host16 = {.to_bf16 = h_to_bf16, .to_bf16_2d = h_to_bf16_2d};

/* One rank on the bf16 path: the sharded step (its slice's AdamW writes no bf16 copy; the whole
 * copy is made after the all-gather) leaves the parameters, the moments and the bf16 copies
 * the products read (params16, and fc16's rows of [w | b | 0...] for mlp.c_fc) with the bits
 * of mgpu_gpt_step, whose AdamW writes the copies itself. The gradients are set by hand (the
 * ops that would compute them are the GPU's). */
static void test_gpt_sharded_step_on_the_bf16_path_keeps_the_copies(void)
{
    mgpu_kernels_t *k;
    mgpu_err_t err = {0};
    mgpu_gpt_spec_t spec = {.n_layer = 2, .n_head = 3, .n_embd = 24, .context = 8, .vocab = 40};
    mgpu_gpt_t *a = NULL, *b = NULL;
    mgpu_zero_gpt_t *zg = NULL;
    unsetenv("MGPU_GPT_FC_BIAS"); /* the bias inside the product: fc16 in use */
    CHECK_INT(mgpu_kernels_create(MGPU_KBACKEND_CPU, -1, &k, &err), 0);
    CHECK_INT(mgpu_gpt_create_with(k, &spec, 1, &host16, &a, &err), 0);
    spec.sharded_optimizer = 1;
    CHECK_INT(mgpu_gpt_create_with(k, &spec, 1, &host16, &b, &err), 0);
    if (a == NULL || b == NULL) {
        printf("  %s\n", err.msg);
        return;
    }
    CHECK(a->fc_kp > 0 && b->fc16 != NULL);
    CHECK_INT(mgpu_gpt_init(a, 3, &err), 0);
    CHECK_INT(mgpu_gpt_init(b, 3, &err), 0);
    CHECK_INT(mgpu_zero_gpt_create(b, 0, 1, &zg, &err), 0);
    mgpu_ddp_comm_t solo = {.rank = 0, .world_size = 1};
    mgpu_adamw_hparams_t hp = {
        .lr = 0.02f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
    const size_t n = a->n_params, C = (size_t)spec.n_embd;
    const size_t nfc = (size_t)spec.n_layer * 4 * C * (size_t)a->fc_kp;
    for (int s = 1; s <= 3; s++) {
        for (size_t i = 0; i < n; i++)
            a->grads[i] = b->grads[i] = 0.01f * (float)((i * 13 + (size_t)s * 5) % 23) - 0.11f;
        a->grads_fresh = b->grads_fresh = 0;
        /* clip 0.5: the norm of these gradients is above it, so the factor acts */
        CHECK_INT(mgpu_gpt_step(a, &hp, s, 0.5f, NULL, &err), 0);
        CHECK_INT(mgpu_zero_gpt_step(zg, &solo, b, &hp, s, 0.5f, &err), 0);
        CHECK(memcmp(a->params, b->params, sizeof(float) * n) == 0);
        CHECK(memcmp(a->fc16, b->fc16, sizeof(mgpu_bf16_t) * nfc) == 0);
        /* params16 holds every tensor's copy but mlp.c_fc's weight and bias, whose copy is
         * fc16's: mgpu_gpt_w16 finds each value's, and NULL for those */
        size_t differ = 0, read = 0;
        for (size_t i = 0; i < n; i++) {
            int in_fc = 0;
            for (int l = 0; l < spec.n_layer; l++)
                in_fc |= (i >= a->blocks[l].fc_w && i < a->blocks[l].fc_w + 4 * C * C) ||
                         (i >= a->blocks[l].fc_b && i < a->blocks[l].fc_b + 4 * C);
            const mgpu_bf16_t *wa = mgpu_gpt_w16(a, i), *wb = mgpu_gpt_w16(b, i);
            differ += in_fc != (wa == NULL) || in_fc != (wb == NULL);
            if (in_fc || wa == NULL || wb == NULL)
                continue;
            read++;
            differ += *wa != *wb;
            differ += *wb != mgpu_gpt_to_bf16(b->params[i]);
        }
        CHECK(read > n / 2);
        CHECK_INT(differ, 0);
    }
    CHECK(memcmp(a->moments, zg->moments, sizeof(float) * 2 * n) == 0);
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
    RUN(test_check_takes_gpu_ranks_and_wants_every_collective);
    RUN(test_gpt_sharded_step_on_the_bf16_path_keeps_the_copies);
    return check_done();
}
