/* test_model.c - the networks and optimizers, single process: parameter layout and init,
 * gradients against finite differences and a closed form, an MLP trained to >= 95% held-out
 * accuracy, and DDP at the math level: W simulated ranks averaging their shard gradients
 * train exactly like one rank with batch W*B. */
#include "check.h"
#include "data.h"
#include "kernels.h"
#include "model.h"
#include "optim.h"
#include "sampler.h"
#include "backward_order.h" /* mgpu_backward_order_build */

#include <errno.h> /* EINVAL */
#include <math.h>  /* fabs, sqrt */
#include <time.h>  /* clock_gettime */

static mgpu_kernels_t *cpu(void)
{
    mgpu_kernels_t *k = NULL;
    mgpu_err_t err = {0};
    if (mgpu_kernels_create(MGPU_KBACKEND_CPU, -1, &k, &err) != 0) {
        printf("  %s\n", err.msg);
        exit(1);
    }
    return k;
}

#define MUST(call)                                                                                 \
    do {                                                                                           \
        mgpu_err_t e_ = {0};                                                                       \
        int rc_ = (call);                                                                          \
        (void)e_;                                                                                  \
        if (rc_ != 0) {                                                                            \
            printf("  %s:%d: %s = %d\n", __FILE__, __LINE__, #call, rc_);                          \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static void test_layout_and_init(void)
{
    mgpu_kernels_t *k = cpu();
    mgpu_err_t err = {0};
    mgpu_model_t *m = NULL;
    mgpu_model_spec_t lin = {.inputs = 5, .outputs = 2, .loss = MGPU_LOSS_MSE};
    CHECK_INT(mgpu_model_create(k, &lin, 30, &m, &err), 0);
    CHECK_INT(m->n_params, 12); /* Linear(5, 2): weight 2x5, bias 2 */
    CHECK_INT(m->layers[0].b_off, 10);
    mgpu_model_destroy(m);

    mgpu_model_spec_t mlp = {.inputs = 4,
                             .outputs = 3,
                             .n_hidden = 2,
                             .hidden = {8, 6},
                             .activation = MGPU_ACT_RELU,
                             .loss = MGPU_LOSS_CROSS_ENTROPY};
    CHECK_INT(mgpu_model_create(k, &mlp, 16, &m, &err), 0);
    /* parameters() order: w0 (8x4) b0 (8) w1 (6x8) b1 (6) w2 (3x6) b2 (3) */
    CHECK_INT(m->n_params, 32 + 8 + 48 + 6 + 18 + 3);
    CHECK_INT(m->layers[1].w_off, 40);
    CHECK_INT(m->layers[2].w_off, 94);
    CHECK_INT(m->layers[2].b_off, 112);
    CHECK_INT(m->layers[2].act, MGPU_ACT_IDENTITY);
    CHECK_INT(m->layers[0].act, MGPU_ACT_RELU);
    CHECK_INT(mgpu_model_init(m, 7, &err), 0);
    /* Every parameter within +-1/sqrt(fan_in), and the spread reaches most of it. */
    for (int l = 0; l < m->n_layers; l++) {
        const mgpu_layer_t *ly = &m->layers[l];
        double bound = 1.0 / sqrt(ly->in), mx = 0;
        for (size_t i = ly->w_off; i < ly->b_off + ly->out; i++) {
            CHECK(fabs(m->params[i]) <= bound);
            mx = fabs(m->params[i]) > mx ? fabs(m->params[i]) : mx;
        }
        CHECK(mx > 0.7 * bound);
    }
    /* Same seed, same parameters; another seed, others. */
    mgpu_model_t *m2 = NULL;
    CHECK_INT(mgpu_model_create(k, &mlp, 16, &m2, &err), 0);
    CHECK_INT(mgpu_model_init(m2, 7, &err), 0);
    CHECK(memcmp(m->params, m2->params, m->n_params * sizeof(float)) == 0);
    CHECK_INT(mgpu_model_init(m2, 8, &err), 0);
    CHECK(memcmp(m->params, m2->params, m->n_params * sizeof(float)) != 0);
    CHECK(mgpu_model_shape_hash(m) == mgpu_model_shape_hash(m2));
    mgpu_model_destroy(m2);
    mgpu_model_destroy(m);

    /* Bad specs are refused with the value named. */
    mgpu_model_spec_t bad = mlp;
    bad.hidden[1] = 0;
    CHECK_INT(mgpu_model_create(k, &bad, 16, &m, &err), -EINVAL);
    CHECK_CONTAINS(err.msg, "hidden layer 1 has 0 units");
    bad = lin;
    bad.loss = MGPU_LOSS_CROSS_ENTROPY;
    bad.outputs = 1;
    CHECK_INT(mgpu_model_create(k, &bad, 16, &m, &err), -EINVAL);
    CHECK_CONTAINS(err.msg, "cross_entropy over 1 class");
    mgpu_kernels_destroy(k);
}

/* The article's Linear(5 -> 2) with MSE: dW = 2/(B*2) (Y - T)^T X, db = column sums of the
 * same, computed here in double. */
static void test_linear_mse_closed_form(void)
{
    mgpu_kernels_t *k = cpu();
    mgpu_model_t *m = NULL;
    mgpu_dataset_t ds;
    mgpu_model_spec_t lin = {.inputs = 5, .outputs = 2, .loss = MGPU_LOSS_MSE};
    const float *out;
    float loss;
    MUST(mgpu_data_random(&ds, 30, 5, 2, 1, NULL));
    MUST(mgpu_model_create(k, &lin, 30, &m, NULL));
    MUST(mgpu_model_init(m, 3, NULL));
    MUST(mgpu_model_forward(m, ds.x, 30, &out, NULL));
    MUST(mgpu_model_backward(m, ds.x, NULL, ds.targets, NULL));
    MUST(mgpu_model_read_scalars(m, &loss, NULL, NULL));
    double dw[2][5] = {{0}}, db[2] = {0}, l2 = 0;
    for (int i = 0; i < 30; i++)
        for (int o = 0; o < 2; o++) {
            double y = m->params[10 + o];
            for (int f = 0; f < 5; f++)
                y += (double)m->params[o * 5 + f] * ds.x[i * 5 + f];
            CHECK(fabs(y - out[i * 2 + o]) < 1e-5);
            double d = y - ds.targets[i * 2 + o];
            l2 += d * d;
            db[o] += 2.0 * d / 60.0;
            for (int f = 0; f < 5; f++)
                dw[o][f] += 2.0 * d / 60.0 * ds.x[i * 5 + f];
        }
    CHECK(fabs(loss - l2 / 60.0) < 1e-5);
    for (int o = 0; o < 2; o++) {
        CHECK(fabs(m->grads[10 + o] - db[o]) < 1e-5);
        for (int f = 0; f < 5; f++)
            CHECK(fabs(m->grads[o * 5 + f] - dw[o][f]) < 1e-5);
    }
    mgpu_model_destroy(m);
    mgpu_data_free(&ds);
    mgpu_kernels_destroy(k);
}

static float loss_at(mgpu_model_t *m, const mgpu_dataset_t *ds, int batch)
{
    float loss;
    MUST(mgpu_model_forward(m, ds->x, batch, NULL, NULL));
    MUST(mgpu_model_eval_loss(m, ds->labels, ds->targets, NULL));
    MUST(mgpu_model_read_scalars(m, &loss, NULL, NULL));
    return loss;
}

/* Central differences on every parameter of a small MLP, for each activation and loss. */
static void test_mlp_gradients_finite_differences(void)
{
    mgpu_kernels_t *k = cpu();
    mgpu_dataset_t ds;
    MUST(mgpu_data_random(&ds, 6, 4, 3, 11, NULL));
    for (int loss = 0; loss < 2; loss++)
        for (int act = 0; act < MGPU_ACT_COUNT; act++) {
            mgpu_model_spec_t s = {.inputs = 4,
                                   .outputs = 3,
                                   .n_hidden = 2,
                                   .hidden = {5, 4},
                                   .activation = act,
                                   .loss = loss};
            mgpu_model_t *m = NULL;
            MUST(mgpu_model_create(k, &s, 6, &m, NULL));
            MUST(mgpu_model_init(m, 5, NULL));
            MUST(mgpu_model_compute_grads(m, ds.x, ds.labels, ds.targets, 6, NULL));
            float *g = malloc(sizeof(float) * m->n_params);
            memcpy(g, m->grads, sizeof(float) * m->n_params);
            int bad = 0;
            double worst = 0;
            for (size_t i = 0; i < m->n_params; i++) {
                float keep = m->params[i], h = 1e-2f;
                m->params[i] = keep + h;
                double lp = loss_at(m, &ds, 6);
                m->params[i] = keep - h;
                double lm = loss_at(m, &ds, 6);
                m->params[i] = keep;
                double fd = (lp - lm) / (2.0 * h);
                double d = fabs(fd - g[i]);
                worst = d > worst ? d : worst;
                /* ReLU's kink can sit inside +-h: a looser bound there. */
                if (d > (act == MGPU_ACT_RELU ? 5e-3 : 1e-3) + 1e-2 * fabs(fd)) {
                    if (bad++ < 3)
                        printf("  %s/%s: grad[%zu] = %.6g, finite difference %.6g\n",
                               mgpu_loss_name(loss), mgpu_act_name(act), i, g[i], fd);
                }
            }
            if (bad)
                printf("  %s/%s: %d mismatches, largest difference %.3g\n", mgpu_loss_name(loss),
                       mgpu_act_name(act), bad, worst);
            CHECK_INT(bad, 0);
            free(g);
            mgpu_model_destroy(m);
        }
    mgpu_data_free(&ds);
    mgpu_kernels_destroy(k);
}

/* mgpu_model_grads_hooked (the output layer and its loss as one mgpu_k_linear_loss, its weight
 * gradient joined with the layer below's) gives the bits of forward + backward_hooked, and
 * calls the hook once per layer, top to bottom. */
typedef struct hook_log {
    int layers[MGPU_MODEL_MAX_LAYERS + 1], n;
} hook_log_t;

static int log_hook(void *ctx, int layer, mgpu_err_t *err)
{
    hook_log_t *h = ctx;
    (void)err;
    if (h->n <= MGPU_MODEL_MAX_LAYERS)
        h->layers[h->n++] = layer;
    return 0;
}

/* Trains one batch on every small MLP shape two ways: forward + backward_hooked on the plain
 * CPU backend (the reference), and mgpu_model_grads_hooked on kb, whose gradients start as
 * NaN so that one nobody writes shows. Same loss, logits and gradients bit for bit, and the
 * hook once per layer, top to bottom, in both. */
static void grads_path_matches(mgpu_kernels_t *kb, uint64_t seed)
{
    mgpu_kernels_t *k = cpu();
    mgpu_dataset_t ds;
    MUST(mgpu_data_random(&ds, 12, 6, 4, seed, NULL));
    for (int nh = 0; nh <= 3; nh++)
        for (int loss = 0; loss < 2; loss++) {
            mgpu_model_spec_t s = {.inputs = 6,
                                   .outputs = 4,
                                   .n_hidden = nh,
                                   .hidden = {7, 5, 3},
                                   .activation = nh == 2 ? MGPU_ACT_GELU : MGPU_ACT_RELU,
                                   .loss = loss};
            mgpu_model_t *a = NULL, *b = NULL;
            hook_log_t ha = {.n = 0}, hb = {.n = 0};
            float la, lb;
            MUST(mgpu_model_create(kb, &s, 12, &a, NULL));
            MUST(mgpu_model_create(k, &s, 12, &b, NULL));
            MUST(mgpu_model_init(a, 9, NULL));
            MUST(mgpu_model_init(b, 9, NULL));
            for (size_t i = 0; i < a->n_params; i++)
                a->grads[i] = NAN;
            MUST(mgpu_model_grads_hooked(a, ds.x, ds.labels, ds.targets, 12, log_hook, &ha, NULL));
            MUST(mgpu_model_forward(b, ds.x, 12, NULL, NULL));
            MUST(mgpu_model_backward_hooked(b, ds.x, ds.labels, ds.targets, log_hook, &hb, NULL));
            MUST(mgpu_model_read_scalars(a, &la, NULL, NULL));
            MUST(mgpu_model_read_scalars(b, &lb, NULL, NULL));
            CHECK(la == lb);
            CHECK(memcmp(a->grads, b->grads, sizeof(float) * a->n_params) == 0);
            CHECK(memcmp(a->y[nh], b->y[nh], sizeof(float) * 12 * 4) == 0);
            CHECK_INT(ha.n, nh + 1);
            CHECK_INT(hb.n, nh + 1);
            for (int i = 0; i < ha.n && i < hb.n; i++) {
                CHECK_INT(ha.layers[i], nh - i);
                CHECK_INT(hb.layers[i], nh - i);
            }
            mgpu_model_destroy(a);
            mgpu_model_destroy(b);
        }
    mgpu_data_free(&ds);
    mgpu_kernels_destroy(k);
}

static void test_grads_hooked_equals_forward_backward(void)
{
    mgpu_kernels_t *k = cpu();
    grads_path_matches(k, 13);
    /* The loss's input is checked before anything runs. */
    mgpu_dataset_t ds;
    MUST(mgpu_data_random(&ds, 12, 6, 4, 13, NULL));
    mgpu_model_spec_t ce = {.inputs = 6, .outputs = 4, .loss = MGPU_LOSS_CROSS_ENTROPY};
    mgpu_model_t *m = NULL;
    mgpu_err_t err = {0};
    MUST(mgpu_model_create(k, &ce, 12, &m, NULL));
    CHECK_INT(mgpu_model_grads_hooked(m, ds.x, NULL, ds.targets, 12, NULL, NULL, &err), -EINVAL);
    CHECK_CONTAINS(err.msg, "cross_entropy needs labels");
    mgpu_model_destroy(m);
    mgpu_data_free(&ds);
    mgpu_kernels_destroy(k);
}

/* A backend whose linear_loss leaves the bias gradient below (MGPU_K_BIAS_LEFT), as the CUDA
 * kernel does: the CPU's composition without that bias, then the layer below's weight-gradient
 * op computes it. The gradients come out the same bits as the plain path's (the same column
 * sums of the same buffer). */
static int left_bias_loss(void *impl, const mgpu_k_head_t *h, mgpu_err_t *err)
{
    mgpu_kernels_t cpu_k = {
        .ops = &mgpu_kernels_cpu_ops, .impl = impl, .backend = MGPU_KBACKEND_CPU, .device = -1};
    mgpu_k_head_t g = *h;
    g.dbias_in = NULL;
    int rc = mgpu_k_linear_loss(&cpu_k, &g, err);
    return rc < 0 ? rc : h->dbias_in != NULL ? MGPU_K_BIAS_LEFT : 0;
}

static void test_grads_when_linear_loss_leaves_the_bias(void)
{
    mgpu_kernels_t *kl = cpu();
    mgpu_kernels_ops_t ops = mgpu_kernels_cpu_ops;
    ops.linear_loss = left_bias_loss;
    kl->ops = &ops;
    grads_path_matches(kl, 17);
    mgpu_kernels_destroy(kl);
}

/* One epoch of training over a sampler's batches (world 1), with eval accuracy after. */
typedef struct trainer {
    mgpu_kernels_t *k;
    mgpu_model_t *m;
    mgpu_optim_t *o;
    float *xb, *tb;
    int32_t *lb;
    size_t *idx;
} trainer_t;

static double eval_accuracy(mgpu_model_t *m, const mgpu_dataset_t *ev, int max_batch)
{
    double correct = 0;
    for (size_t s = 0; s < ev->n; s += (size_t)max_batch) {
        int b = (int)(ev->n - s < (size_t)max_batch ? ev->n - s : (size_t)max_batch);
        float c;
        MUST(mgpu_model_forward(m, ev->x + s * ev->features, b, NULL, NULL));
        MUST(mgpu_model_eval_loss(m, ev->labels + s, NULL, NULL));
        MUST(mgpu_model_read_scalars(m, NULL, &c, NULL));
        correct += c;
    }
    return correct / (double)ev->n;
}

static void test_mlp_trains_to_95_percent(void)
{
    mgpu_kernels_t *k = cpu();
    mgpu_dataset_t all, tr, ev;
    mgpu_model_t *m = NULL;
    mgpu_optim_t *o = NULL;
    mgpu_sampler_t s;
    struct timespec t0, t1;
    enum { B = 64 };
    clock_gettime(CLOCK_MONOTONIC, &t0);
    MUST(mgpu_data_synthetic(&all, 4000, 20, 5, 2, 1.0, 1.0, 123, NULL));
    MUST(mgpu_data_split(&all, 0.2, 123, &tr, &ev, NULL));
    mgpu_model_spec_t spec = {.inputs = 20,
                              .outputs = 5,
                              .n_hidden = 2,
                              .hidden = {64, 64},
                              .activation = MGPU_ACT_RELU,
                              .loss = MGPU_LOSS_CROSS_ENTROPY};
    mgpu_optim_spec_t os = {.kind = MGPU_OPTIM_ADAMW,
                            .lr = 1e-3f,
                            .beta1 = 0.9f,
                            .beta2 = 0.999f,
                            .eps = 1e-8f,
                            .weight_decay = 0.01f};
    MUST(mgpu_model_create(k, &spec, B, &m, NULL));
    MUST(mgpu_model_init(m, 1, NULL));
    MUST(mgpu_optim_create(k, &os, m->n_params, &o, NULL));
    MUST(mgpu_sampler_init(&s, tr.n, 1, 0, 1, 9, 0, NULL));
    double acc0 = eval_accuracy(m, &ev, B), acc = 0;
    size_t *idx = malloc(sizeof(size_t) * s.num_samples);
    float xb[B * 20];
    int32_t lb[B];
    for (int epoch = 0; epoch < 5; epoch++) {
        MUST(mgpu_sampler_indices(&s, epoch, idx, NULL));
        for (size_t b = 0; b < mgpu_sampler_num_batches(&s, B, 0); b++) {
            size_t start, count;
            mgpu_sampler_batch(&s, B, b, &start, &count);
            mgpu_data_gather(&tr, idx + start, count, xb, lb, NULL);
            MUST(mgpu_model_compute_grads(m, xb, lb, NULL, (int)count, NULL));
            MUST(mgpu_optim_step(o, m->params, m->grads, NULL));
        }
        acc = eval_accuracy(m, &ev, B);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("  accuracy %.1f%% before, %.1f%% after 5 epochs of %zu samples (%zu held out), "
           "%.2f s\n",
           100 * acc0, 100 * acc, tr.n, ev.n,
           (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec));
    CHECK(acc0 < 0.5); /* it learned, it did not start there */
    CHECK(acc >= 0.95);
    free(idx);
    mgpu_optim_destroy(o);
    mgpu_model_destroy(m);
    mgpu_data_free(&all), mgpu_data_free(&tr), mgpu_data_free(&ev);
    mgpu_kernels_destroy(k);
}

/* DDP at the math level. W ranks, each with its own model copy (same init), take their
 * DistributedSampler shard, compute the gradient of B samples, average the W gradients (the
 * all-reduce, done here in gradient buckets of a few hundred floats, last layer first, as
 * DDP's buckets are slices of the flat buffer) and step. One rank with batch W*B takes the same
 * W*B samples per step. After several steps (SGD with momentum and AdamW, both losses) the
 * parameters agree to float tolerance. */
static void ddp_case(mgpu_loss_t loss, mgpu_optim_kind_t kind)
{
    enum { W = 4, B = 8, STEPS = 6, BUCKET = 100 };
    mgpu_kernels_t *k = cpu();
    mgpu_dataset_t ds;
    mgpu_model_spec_t spec = {.inputs = 6,
                              .outputs = 3,
                              .n_hidden = 1,
                              .hidden = {16},
                              .activation = MGPU_ACT_TANH,
                              .loss = loss};
    mgpu_optim_spec_t os = {.kind = kind,
                            .lr = 0.05f,
                            .momentum = 0.9f,
                            .weight_decay = 0.01f,
                            .beta1 = 0.9f,
                            .beta2 = 0.99f,
                            .eps = 1e-8f};
    mgpu_model_t *rank[W], *single;
    mgpu_optim_t *ropt[W], *sopt;
    mgpu_sampler_t samp[W];
    size_t idx[W][64];
    MUST(mgpu_data_random(&ds, 200, 6, 3, 77, NULL));
    for (int r = 0; r < W; r++) {
        MUST(mgpu_model_create(k, &spec, B, &rank[r], NULL));
        MUST(mgpu_model_init(rank[r], 5, NULL));
        MUST(mgpu_optim_create(k, &os, rank[r]->n_params, &ropt[r], NULL));
        MUST(mgpu_sampler_init(&samp[r], ds.n, W, r, 1, 3, 0, NULL));
        MUST(mgpu_sampler_indices(&samp[r], 0, idx[r], NULL));
    }
    MUST(mgpu_model_create(k, &spec, W * B, &single, NULL));
    MUST(mgpu_model_init(single, 5, NULL));
    MUST(mgpu_optim_create(k, &os, single->n_params, &sopt, NULL));
    size_t n = single->n_params;
    float *avg = malloc(sizeof(float) * n);
    for (int step = 0; step < STEPS; step++) {
        float xb[W * B * 6], tb[W * B * 3];
        int32_t lb[W * B];
        for (int r = 0; r < W; r++) {
            float xr[B * 6], tr[B * 3];
            int32_t lr[B];
            mgpu_data_gather(&ds, idx[r] + step * B, B, xr, lr, tr);
            MUST(mgpu_model_compute_grads(rank[r], xr, lr, tr, B, NULL));
            /* The single rank's batch is the union of the shards. */
            mgpu_data_gather(&ds, idx[r] + step * B, B, xb + r * B * 6, lb + r * B, tb + r * B * 3);
        }
        /* Bucketed all-reduce (average), last parameters first. */
        for (size_t end = n; end > 0;) {
            size_t start = end > BUCKET ? end - BUCKET : 0;
            for (size_t i = start; i < end; i++) {
                double s = 0;
                for (int r = 0; r < W; r++)
                    s += rank[r]->grads[i];
                avg[i] = (float)(s / W);
            }
            end = start;
        }
        for (int r = 0; r < W; r++) {
            memcpy(rank[r]->grads, avg, sizeof(float) * n);
            MUST(mgpu_optim_step(ropt[r], rank[r]->params, rank[r]->grads, NULL));
        }
        MUST(mgpu_model_compute_grads(single, xb, lb, tb, W * B, NULL));
        double gd = 0;
        for (size_t i = 0; i < n; i++)
            gd = fmax(gd, fabs(single->grads[i] - avg[i]));
        if (gd > 1e-6)
            printf("  step %d: gradients differ by %.3g\n", step, gd);
        CHECK(gd <= 1e-6);
        MUST(mgpu_optim_step(sopt, single->params, single->grads, NULL));
    }
    double pd = 0, moved = 0;
    for (int r = 0; r < W; r++)
        for (size_t i = 0; i < n; i++) {
            pd = fmax(pd, fabs(rank[r]->params[i] - single->params[i]));
            CHECK(rank[r]->params[i] == rank[0]->params[i]); /* ranks stay identical */
        }
    /* Parameters really moved (the comparison is not between two untouched copies). */
    mgpu_model_t *fresh;
    MUST(mgpu_model_create(k, &spec, 1, &fresh, NULL));
    MUST(mgpu_model_init(fresh, 5, NULL));
    for (size_t i = 0; i < n; i++)
        moved = fmax(moved, fabs(fresh->params[i] - single->params[i]));
    printf("  %s/%s: largest parameter difference %.3g after %d steps (moved %.3g)\n",
           mgpu_loss_name(loss), mgpu_optim_name(kind), pd, STEPS, moved);
    CHECK(pd <= 1e-5);
    CHECK(moved > 1e-2);
    mgpu_model_destroy(fresh);
    for (int r = 0; r < W; r++) {
        mgpu_optim_destroy(ropt[r]);
        mgpu_model_destroy(rank[r]);
    }
    mgpu_optim_destroy(sopt);
    mgpu_model_destroy(single);
    free(avg);
    mgpu_data_free(&ds);
    mgpu_kernels_destroy(k);
}

static void test_ddp_equals_big_batch(void)
{
    ddp_case(MGPU_LOSS_CROSS_ENTROPY, MGPU_OPTIM_SGD);
    ddp_case(MGPU_LOSS_MSE, MGPU_OPTIM_SGD);
    ddp_case(MGPU_LOSS_CROSS_ENTROPY, MGPU_OPTIM_ADAMW);
    ddp_case(MGPU_LOSS_MSE, MGPU_OPTIM_ADAMW);
}

static void test_optim_state_and_errors(void)
{
    mgpu_kernels_t *k = cpu();
    mgpu_err_t err = {0};
    mgpu_optim_t *o = NULL;
    mgpu_optim_spec_t sgd = {.kind = MGPU_OPTIM_SGD, .lr = 0.1f};
    CHECK_INT(mgpu_optim_create(k, &sgd, 10, &o, &err), 0);
    CHECK_INT(o->n_state, 0);
    mgpu_optim_destroy(o);
    sgd.momentum = 0.9f;
    CHECK_INT(mgpu_optim_create(k, &sgd, 10, &o, &err), 0);
    CHECK_INT(o->n_state, 10);
    mgpu_optim_destroy(o);
    mgpu_optim_spec_t ad = {
        .kind = MGPU_OPTIM_ADAMW, .lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
    CHECK_INT(mgpu_optim_create(k, &ad, 10, &o, &err), 0);
    CHECK_INT(o->n_state, 20);
    float p[10] = {0}, g[10] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    CHECK_INT(mgpu_optim_step(o, p, g, &err), 0);
    CHECK_INT(o->step, 1);
    CHECK(fabs(p[0] + 0.1f) < 1e-6); /* Adam's first step moves by lr * sign(g) */
    mgpu_optim_destroy(o);
    ad.eps = 0;
    CHECK_INT(mgpu_optim_create(k, &ad, 10, &o, &err), MGPU_E_RANGE);
    CHECK_CONTAINS(err.msg, "eps=0");
    CHECK(o == NULL);
    CHECK_INT(mgpu_optim_parse("AdamW"), MGPU_OPTIM_ADAMW);
    CHECK_INT(mgpu_optim_parse("adam"), -1);
    mgpu_kernels_destroy(k);
}

/* The backward's order (backward_order.h), as a string: W weight gradient, D input gradient, J
 * join, H hook, each followed by its layer. The model runs it as given; the join rule lives there.
 */
static const char *order_str(int n_layers, int top_done, int hooked, char *buf)
{
    mgpu_backward_step_t steps[MGPU_BACKWARD_ORDER_MAX_STEPS(MGPU_MODEL_MAX_LAYERS)];
    int n = mgpu_backward_order_build(n_layers, top_done, hooked, steps);
    char *p = buf;
    for (int i = 0; i < n; i++) {
        static const char ops[] = "WDJH";
        p += sprintf(p, "%s%c%d", i ? " " : "", ops[steps[i].op], steps[i].layer);
    }
    *p = '\0';
    return buf;
}

static void test_backward_order(void)
{
    char b[256];
    /* Without hooks layer 1 skips its join: its input gradient first, its weight gradient
     * beside the first layer's. */
    CHECK_STR(order_str(3, 0, 0, b), "W2 D2 J2 D1 W1 W0 J0");
    CHECK_STR(order_str(3, 0, 1, b), "W2 D2 J2 H2 W1 D1 J1 H1 W0 J0 H0");
    /* top_done: the output layer's weight gradient goes with the layer below's. */
    CHECK_STR(order_str(3, 1, 0, b), "D1 W2 W1 W0 J0");
    CHECK_STR(order_str(3, 1, 1, b), "W2 W1 D1 J1 H2 H1 W0 J0 H0");
    CHECK_STR(order_str(2, 1, 0, b), "W1 W0 J0");
    CHECK_STR(order_str(1, 1, 1, b), "W0 J0 H0");
    CHECK_STR(order_str(1, 0, 0, b), "W0 J0");
}

int main(void)
{
    RUN(test_backward_order);
    RUN(test_layout_and_init);
    RUN(test_linear_mse_closed_form);
    RUN(test_mlp_gradients_finite_differences);
    RUN(test_grads_hooked_equals_forward_backward);
    RUN(test_grads_when_linear_loss_leaves_the_bias);
    RUN(test_mlp_trains_to_95_percent);
    RUN(test_ddp_equals_big_batch);
    RUN(test_optim_state_and_errors);
    return check_done();
}
