/* test_train_gpu.c - the trainer's GPU path (worker/trainer/gpustep.cu through mgpu_ddp_run).
 *
 * Everywhere: the bucket schedule (which layer's backward completes each gradient bucket,
 * checked against the gradients themselves: at the hook that launches a bucket, its slice
 * already holds its final values) and the CUDA graph eligibility rules.
 * On a GPU (skipped without one or without CUDA in the build): a small MLP trained on the
 * GPU in fp32 matches the CPU reference; graph replay gives the same parameters as eager
 * steps; a partial last batch and AdamW (eager paths) match the CPU; two thread-ranks on one
 * GPU, their buckets all-reduced on the all-reduce stream, match two CPU ranks.
 * Run it on a GPU machine: build/tests/test_train_gpu. */
#include "check.h"
#include "kernels_check.h" /* need_gpu */
#include "ddp.h"
#include "train.h"

#if defined(MGPU_HAVE_CUDA) && MGPU_HAVE_CUDA
#include "kernels_cuda.h"     /* mgpu_kernels_cuda_stream */
#include <cuda_runtime_api.h> /* cudaStreamSynchronize, cudaMemcpy: the test's all-reduce */
#endif

#include <math.h>    /* fabs */
#include <pthread.h> /* the thread-ranks */

static void cfg_text(mgpu_cfg_t *cfg, const char *text)
{
    mgpu_err_t err = {0};
    mgpu_cfg_defaults(cfg);
    CHECK_INT(mgpu_cfg_parse(text, "test.cfg", NULL, cfg, &err), 0);
    CHECK_INT(mgpu_cfg_check(cfg, &err), 0);
    if (err.msg[0])
        printf("  cfg: %s\n", err.msg);
}

/* --- the bucket schedule (no GPU) ------------------------------------------------------------ */

typedef struct hook_rec {
    mgpu_model_t *m;
    const mgpu_bucket_t *b;
    const int *ready;
    int nb, next;
    float *snap; /* each bucket's slice as it was when its hook ran */
    int order_ok;
} hook_rec_t;

static int rec_hook(void *ctx, int layer, mgpu_err_t *err)
{
    hook_rec_t *h = ctx;
    while (h->next < h->nb && h->ready[h->next] == layer) {
        const mgpu_bucket_t *b = &h->b[h->next];
        /* Every float of the bucket belongs to a layer at or above this one. */
        if (b->offset < h->m->layers[layer].w_off)
            h->order_ok = 0;
        memcpy(h->snap + b->offset, h->m->grads + b->offset, sizeof(float) * b->count);
        h->next++;
    }
    return 0;
}

static void test_bucket_schedule(void)
{
    mgpu_kernels_t *k = NULL;
    mgpu_err_t err = {0};
    mgpu_model_t *m = NULL;
    mgpu_model_spec_t spec = {.inputs = 784,
                              .outputs = 10,
                              .n_hidden = 2,
                              .hidden = {256, 256},
                              .activation = MGPU_ACT_RELU,
                              .loss = MGPU_LOSS_CROSS_ENTROPY};
    const int B = 16;
    CHECK_INT(mgpu_kernels_create(MGPU_KBACKEND_CPU, -1, &k, &err), 0);
    CHECK_INT(mgpu_model_create(k, &spec, B, &m, &err), 0);
    CHECK_INT(mgpu_model_init(m, 7, &err), 0);
    /* Bucket sizes that put bucket edges inside layers, on layer edges and past the model. */
    const double sizes_mb[] = {0.01, 0.2, 0.5, 1.0, 25.0};
    for (size_t si = 0; si < sizeof sizes_mb / sizeof sizes_mb[0]; si++) {
        mgpu_bucket_t *b = NULL;
        int nb = 0;
        CHECK_INT(mgpu_train_buckets(m, sizes_mb[si], &b, &nb, &err), 0);
        int *ready = malloc(sizeof(int) * (size_t)nb);
        CHECK_INT(mgpu_train_bucket_layers(m, b, nb, ready, &err), 0);
        for (int i = 0; i < nb; i++) {
            /* The layer that holds the bucket's first float, found the slow way. */
            int want = -1;
            for (int l = 0; l < m->n_layers; l++)
                if (b[i].offset >= m->layers[l].w_off &&
                    b[i].offset < m->layers[l].b_off + (size_t)m->layers[l].out)
                    want = l;
            CHECK_INT(ready[i], want);
            if (i > 0)
                CHECK(ready[i] <= ready[i - 1]);
        }
        /* The largest bucket size leaves one bucket, launched by layer 0. */
        if (sizes_mb[si] >= 25.0) {
            CHECK_INT(nb, 1);
            CHECK_INT(ready[0], 0);
        }
        if (sizes_mb[si] <= 0.01) {
            /* A bucket per big tensor: some layer's weight and bias in different buckets. */
            int shared = 0;
            for (int i = 1; i < nb; i++)
                shared += ready[i] == ready[i - 1];
            CHECK_INT(nb, 3); /* {b2 W2 b1}, {W1}, {b0 W0} */
            CHECK(shared > 0);
        }
        /* A backward whose hook snapshots each bucket when launched: the snapshot must
         * equal the final gradient, i.e. nothing after the hook changes the slice. */
        float *x = malloc(sizeof(float) * (size_t)B * 784);
        int32_t lab[16];
        for (int i = 0; i < B * 784; i++)
            x[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
        for (int i = 0; i < B; i++)
            lab[i] = (i * 3) % 10;
        hook_rec_t h = {.m = m, .b = b, .ready = ready, .nb = nb, .order_ok = 1};
        h.snap = calloc(m->n_params, sizeof(float));
        /* The training step's path: the output layer fused with its loss, its hook
         * joined with the layer below's. */
        CHECK_INT(mgpu_model_grads_hooked(m, x, lab, NULL, B, rec_hook, &h, &err), 0);
        CHECK_INT(h.next, nb);
        CHECK(h.order_ok);
        size_t differ = 0;
        for (size_t i = 0; i < m->n_params; i++)
            differ += h.snap[i] != m->grads[i];
        CHECK_INT(differ, 0);
        free(h.snap);
        free(x);
        free(ready);
        free(b);
    }
    mgpu_model_destroy(m);
    mgpu_kernels_destroy(k);
}

static void test_bucket_layers_rejects_bad_bucket(void)
{
    mgpu_kernels_t *k = NULL;
    mgpu_err_t err = {0};
    mgpu_model_t *m = NULL;
    mgpu_model_spec_t spec = {.inputs = 5, .outputs = 2, .loss = MGPU_LOSS_MSE};
    CHECK_INT(mgpu_kernels_create(MGPU_KBACKEND_CPU, -1, &k, &err), 0);
    CHECK_INT(mgpu_model_create(k, &spec, 4, &m, &err), 0);
    mgpu_bucket_t b = {.offset = 10, .count = 5}; /* 12 parameters: past the end */
    int ready;
    CHECK(mgpu_train_bucket_layers(m, &b, 1, &ready, &err) < 0);
    CHECK_CONTAINS(err.msg, "bucket 0 covers [10, 15) of 12");
    mgpu_model_destroy(m);
    mgpu_kernels_destroy(k);
}

static void test_graph_eligibility(void)
{
    mgpu_cfg_t cfg;
    char why[256];
    /* The article's demo: 90 samples, batch 30, sgd: three full batches. */
    cfg_text(&cfg, "batch_size = 30\n");
    CHECK_INT(mgpu_train_graph_eligible(&cfg, 90, why, sizeof why), 1);
    CHECK_STR(why, "");
    /* Two ranks: 45 samples each, batches of 30 and 15. */
    CHECK_INT(mgpu_train_graph_eligible(&cfg, 45, why, sizeof why), 0);
    CHECK_CONTAINS(why, "last batch of 15 rows");
    /* ... unless the last batch is dropped. */
    cfg_text(&cfg, "batch_size = 30\ndrop_last_batch = true\n");
    CHECK_INT(mgpu_train_graph_eligible(&cfg, 45, why, sizeof why), 1);
    /* Fewer samples than one batch: no full step at all. */
    CHECK_INT(mgpu_train_graph_eligible(&cfg, 29, why, sizeof why), 0);
    CHECK_CONTAINS(why, "fewer than batch_size 30");
    /* AdamW's step number lives in device memory (optimizers.cu): graphable. */
    cfg_text(&cfg, "optimizer = adamw\nbatch_size = 30\n");
    CHECK_INT(mgpu_train_graph_eligible(&cfg, 90, why, sizeof why), 1);
    cfg_text(&cfg, "batch_size = 30\ncuda_graph = false\n");
    CHECK_INT(mgpu_train_graph_eligible(&cfg, 90, why, sizeof why), 0);
    CHECK_CONTAINS(why, "cuda_graph = false");
    /* Momentum is fine: only the first update differs, and it runs eagerly. */
    cfg_text(&cfg, "batch_size = 30\nmomentum = 0.9\nnesterov = true\n");
    CHECK_INT(mgpu_train_graph_eligible(&cfg, 90, NULL, 0), 1);
}

/* --- on the GPU ------------------------------------------------------------------------------- */

#define MAXW 2

typedef struct tworld {
    int W;
    pthread_barrier_t barrier;
    float *host[MAXW];
    size_t count;
} tworld_t;

typedef struct trank {
    tworld_t *w;
    int rank;
    void *kstream; /* the rank's kernels stream: where its small collectives' buffers live */
    int gpu;
} trank_t;

/* A host-side all-reduce between thread-ranks. On a GPU it waits for the stream the buffer
 * was produced on, so it also checks that the bucket's event ordering hands it final
 * gradients (a graph cannot capture this: the GPU runs with world size 2 are eager). */
static int t_reduce(trank_t *r, float *buf, size_t n, int average, void *stream)
{
    tworld_t *w = r->w;
    float *h = malloc(sizeof(float) * (n + 1));
    int rc = 0;
#if defined(MGPU_HAVE_CUDA) && MGPU_HAVE_CUDA
    if (r->gpu && (cudaStreamSynchronize(stream) != 0 ||
                   cudaMemcpy(h, buf, sizeof(float) * n, cudaMemcpyDeviceToHost) != 0))
        rc = -1;
#endif
    if (!r->gpu)
        memcpy(h, buf, sizeof(float) * n);
    w->host[r->rank] = h;
    pthread_barrier_wait(&w->barrier);
    float *out = malloc(sizeof(float) * (n + 1));
    for (size_t i = 0; i < n; i++) {
        double s = 0;
        for (int q = 0; q < w->W; q++)
            s += w->host[q][i];
        out[i] = (float)(average ? s / w->W : s);
    }
    pthread_barrier_wait(&w->barrier);
#if defined(MGPU_HAVE_CUDA) && MGPU_HAVE_CUDA
    if (r->gpu && cudaMemcpy(buf, out, sizeof(float) * n, cudaMemcpyHostToDevice) != 0)
        rc = -1;
#endif
    if (!r->gpu)
        memcpy(buf, out, sizeof(float) * n);
    free(out);
    free(h);
    return rc;
}

static int t_avg(void *c, float *b, size_t n, mgpu_err_t *e)
{
    trank_t *r = c;
    return t_reduce(r, b, n, 1, r->kstream);
}

static int t_sum(void *c, float *b, size_t n, mgpu_err_t *e)
{
    trank_t *r = c;
    return t_reduce(r, b, n, 0, r->kstream);
}

static int t_avg_stream(void *c, float *b, size_t n, void *stream, mgpu_err_t *e)
{
    return t_reduce(c, b, n, 1, stream);
}

static int t_bcast(void *c, void *b, size_t bytes, int root, mgpu_err_t *e)
{
    /* Every rank initialises the same parameters from one seed: a broadcast of them must
     * change nothing, so the test checks that instead of copying. */
    return 0;
}

typedef struct job {
    const mgpu_cfg_t *cfg;
    tworld_t *w;
    int rank, gpu;
    mgpu_ddp_result_t res;
    mgpu_err_t err;
    int rc;
} job_t;

static void *job_main(void *arg)
{
    job_t *j = arg;
    mgpu_kernels_t *k = NULL;
    trank_t tr = {.w = j->w, .rank = j->rank, .gpu = j->gpu};
    FILE *out = fopen("/dev/null", "w");
    j->rc = mgpu_kernels_create(j->gpu ? MGPU_KBACKEND_CUDA : MGPU_KBACKEND_CPU, j->gpu ? 0 : -1,
                                &k, &j->err);
#if defined(MGPU_HAVE_CUDA) && MGPU_HAVE_CUDA
    if (j->rc == 0 && j->gpu)
        tr.kstream = mgpu_kernels_cuda_stream(k);
#endif
    mgpu_ddp_comm_t comm = {.rank = j->rank,
                            .world_size = j->w->W,
                            .ctx = &tr,
                            .allreduce_avg = t_avg,
                            .allreduce_sum = t_sum,
                            .broadcast = t_bcast,
                            .allreduce_avg_stream = t_avg_stream};
    if (j->rc == 0)
        j->rc = mgpu_ddp_run(k, j->cfg, &comm, out, &j->res, &j->err);
    if (j->rc != 0)
        printf("  rank %d (%s): %s\n", j->rank, j->gpu ? "gpu" : "cpu", j->err.msg);
    fclose(out);
    mgpu_kernels_destroy(k);
    return NULL;
}

/* Trains cfg on W thread-ranks; jobs[0].res.params holds rank 0's final parameters. */
static void run_world(const mgpu_cfg_t *cfg, int W, int gpu, job_t *jobs)
{
    tworld_t w = {.W = W};
    pthread_t th[MAXW];
    pthread_barrier_init(&w.barrier, NULL, (unsigned)W);
    for (int r = 0; r < W; r++) {
        jobs[r] = (job_t){.cfg = cfg, .w = &w, .rank = r, .gpu = gpu};
        pthread_create(&th[r], NULL, job_main, &jobs[r]);
    }
    for (int r = 0; r < W; r++)
        pthread_join(th[r], NULL);
    pthread_barrier_destroy(&w.barrier);
    for (int r = 0; r < W; r++)
        CHECK_INT(jobs[r].rc, 0);
}

/* max |a - b| / max(1, max |b|), printing the first mismatches over tol. */
static double compare(const char *what, const float *a, const float *b, size_t n, double tol)
{
    double scale = 1, worst = 0;
    int shown = 0;
    for (size_t i = 0; i < n; i++)
        scale = fabs(b[i]) > scale ? fabs(b[i]) : scale;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]) / scale;
        if (!(d <= tol) && shown++ < 5)
            printf("  %s: param %zu: %.9g vs %.9g\n", what, i, a[i], b[i]);
        if (!(d <= worst))
            worst = d; /* NaN sticks */
    }
    printf("  %s: %zu params, largest difference %.3g (tolerance %.3g)\n", what, n, worst, tol);
    return worst;
}

/* A small MLP on Gaussian clusters: 512 training samples, shuffled, batch 64 (8 full
 * batches), 6 epochs (more than the index ring's 4 slots); SGD with momentum or AdamW. */
#define MLP_BASE                                                                                   \
    "dataset = synthetic\nsamples = 640\nfeatures = 32\nclasses = 10\neval_fraction = 0.2\n"       \
    "model = mlp\nhidden = 64,64\nloss = cross_entropy\nbatch_size = 64\nepochs = 6\n"             \
    "shuffle = true\nprecision = fp32\nlog_interval = 7\n"
static const char *const kMlp = MLP_BASE "optimizer = sgd\nlr = 0.05\nmomentum = 0.9\n";
static const char *const kAdamw = MLP_BASE "optimizer = adamw\nlr = 0.003\n";

static void test_gpu_matches_cpu_fp32(void)
{
    need_gpu();
    mgpu_cfg_t cfg;
    job_t cpu[1], gpu[1];
    cfg_text(&cfg, kMlp);
    run_world(&cfg, 1, 0, cpu);
    run_world(&cfg, 1, 1, gpu);
    if (cpu[0].rc || gpu[0].rc)
        return;
    CHECK_INT(gpu[0].res.graphed, 1);
    CHECK_INT(cpu[0].res.graphed, 0);
    CHECK_INT(gpu[0].res.steps, 48);
    CHECK(compare("gpu vs cpu", gpu[0].res.params, cpu[0].res.params, gpu[0].res.n_params, 2e-4) <=
          2e-4);
    CHECK(fabs(gpu[0].res.loss - cpu[0].res.loss) <= 1e-3 * (1 + fabs(cpu[0].res.loss)));
    CHECK(fabs(gpu[0].res.eval_accuracy - cpu[0].res.eval_accuracy) <= 0.02);
    free(cpu[0].res.params);
    free(gpu[0].res.params);
}

static void test_graph_equals_eager(void)
{
    need_gpu();
    /* SGD with momentum, and AdamW (whose replays must each be the next step number). */
    for (int i = 0; i < 2; i++) {
        mgpu_cfg_t graph, eager;
        job_t a[1], b[1];
        cfg_text(&graph, i == 0 ? kMlp : kAdamw);
        eager = graph;
        eager.cuda_graph = 0;
        /* Each run tunes its own GEMMs by timing (cublas.cu's lt_tune) and may pick
         * other algorithms: the heuristic's first choice in both, for comparable bits. */
        setenv("MGPU_LT_TUNE", "0", 1);
        run_world(&graph, 1, 1, a);
        run_world(&eager, 1, 1, b);
        unsetenv("MGPU_LT_TUNE");
        if (a[0].rc || b[0].rc)
            return;
        CHECK_INT(a[0].res.graphed, 1);
        CHECK_INT(b[0].res.graphed, 0);
        /* The same kernels with the same arguments in the same order: the same bits, up to
         * cuBLAS choosing another algorithm inside a capture (it should not). */
        CHECK(compare(i == 0 ? "graph vs eager" : "adamw graph vs eager", a[0].res.params,
                      b[0].res.params, a[0].res.n_params, 1e-6) <= 1e-6);
        CHECK(fabs(a[0].res.loss - b[0].res.loss) <= 1e-6 * (1 + fabs(b[0].res.loss)));
        free(a[0].res.params);
        free(b[0].res.params);
    }
}

static void test_partial_batch_and_adamw_match_cpu(void)
{
    need_gpu();
    /* A last batch of 512 % 96 = 32 rows (not graphable), then AdamW (graph replays: its
     * step number advances in device memory, 48 steps, the first eager). */
    for (int i = 0; i < 2; i++) {
        mgpu_cfg_t cfg;
        mgpu_err_t err = {0};
        job_t cpu[1], gpu[1];
        cfg_text(&cfg, i == 0 ? kMlp : kAdamw);
        if (i == 0) {
            CHECK_INT(mgpu_cfg_override(&cfg, "batch_size=96", &err), 0);
            CHECK_INT(mgpu_cfg_check(&cfg, &err), 0);
        }
        CHECK_INT(cfg.batch_size, i == 0 ? 96 : 64);
        CHECK_INT(cfg.optimizer, i == 0 ? MGPU_OPTIM_SGD : MGPU_OPTIM_ADAMW);
        run_world(&cfg, 1, 0, cpu);
        run_world(&cfg, 1, 1, gpu);
        if (cpu[0].rc || gpu[0].rc)
            return;
        CHECK_INT(gpu[0].res.graphed, i == 0 ? 0 : 1);
        CHECK_INT(gpu[0].res.steps, i == 0 ? 36 : 48);
        CHECK_INT(gpu[0].res.steps, cpu[0].res.steps);
        /* AdamW divides by sqrt(v): a gradient near zero, summed in another order, moves its
         * parameter by a visible fraction of lr, so its tolerance is wider (a wrong update
         * would be off by about lr x steps = 0.14). */
        double tol = i == 0 ? 2e-4 : 3e-3;
        CHECK(compare(i == 0 ? "partial batch" : "adamw", gpu[0].res.params, cpu[0].res.params,
                      gpu[0].res.n_params, tol) <= tol);
        free(cpu[0].res.params);
        free(gpu[0].res.params);
    }
}

static void test_two_ranks_buckets_match_cpu(void)
{
    need_gpu();
    mgpu_cfg_t cfg;
    job_t cpu[2], gpu[2];
    char text[1024];
    /* Small buckets: several per layer, launched from the backward hooks. */
    snprintf(text, sizeof text, "%sbucket_mb = 0.004\ncuda_graph = false\n", kMlp);
    cfg_text(&cfg, text);
    job_t late[2];
    mgpu_cfg_t no_overlap;
    run_world(&cfg, 2, 0, cpu);
    /* The same algorithms in both GPU runs (no tuning), so they can agree to the bit. */
    setenv("MGPU_LT_TUNE", "0", 1);
    run_world(&cfg, 2, 1, gpu);
    /* bucket_overlap = false: the same all-reduces, after the whole backward. */
    no_overlap = cfg;
    no_overlap.bucket_overlap = 0;
    run_world(&no_overlap, 2, 1, late);
    unsetenv("MGPU_LT_TUNE");
    if (cpu[0].rc || cpu[1].rc || gpu[0].rc || gpu[1].rc || late[0].rc || late[1].rc)
        return;
    CHECK_INT(gpu[0].res.graphed, 0); /* its all-reduce synchronises: not capturable */
    CHECK(compare("2 gpu ranks vs 2 cpu ranks", gpu[0].res.params, cpu[0].res.params,
                  gpu[0].res.n_params, 2e-4) <= 2e-4);
    CHECK(compare("gpu rank 1 vs rank 0", gpu[1].res.params, gpu[0].res.params, gpu[0].res.n_params,
                  0) <= 0);
    CHECK(compare("buckets after backward vs during it", late[0].res.params, gpu[0].res.params,
                  gpu[0].res.n_params, 0) <= 0);
    for (int r = 0; r < 2; r++) {
        free(cpu[r].res.params);
        free(gpu[r].res.params);
        free(late[r].res.params);
    }
}

/* Runs cfg (bf16) on the GPU with the kept bf16 copies and without them (MGPU_BF16_SHADOW=0:
 * every operand converted in every GEMM), the same algorithms in both (MGPU_LT_TUNE=0), and
 * on the CPU in fp32; checks the GPU run was graphed, the two GPU runs agree within
 * tol_copies, and the GPU is within bf16's rounding (5e-2) of the CPU. */
static void bf16_copies_vs_conversions(const char *what, mgpu_cfg_t *cfg, double tol_copies)
{
    mgpu_err_t err = {0};
    job_t cpu[1], a[1], b[1];
    char label[128];
    CHECK_INT(mgpu_cfg_check(cfg, &err), 0);
    setenv("MGPU_LT_TUNE", "0", 1);
    run_world(cfg, 1, 1, a);
    setenv("MGPU_BF16_SHADOW", "0", 1);
    run_world(cfg, 1, 1, b);
    unsetenv("MGPU_BF16_SHADOW");
    unsetenv("MGPU_LT_TUNE");
    run_world(cfg, 1, 0, cpu);
    if (a[0].rc || b[0].rc || cpu[0].rc)
        return;
    CHECK_INT(a[0].res.graphed, 1);
    snprintf(label, sizeof label, "%s, kept copies vs conversions", what);
    CHECK(compare(label, a[0].res.params, b[0].res.params, a[0].res.n_params, tol_copies) <=
          tol_copies);
    snprintf(label, sizeof label, "%s, gpu vs fp32 cpu", what);
    CHECK(compare(label, a[0].res.params, cpu[0].res.params, a[0].res.n_params, 5e-2) <= 5e-2);
    free(a[0].res.params);
    free(b[0].res.params);
    free(cpu[0].res.params);
}

/* bf16: the GEMMs read the parameters' bf16 mirror that SGD writes, and reuse an activation's
 * or gradient's bf16 copy from its first GEMM in its second (cublas.cu). The same run
 * with MGPU_BF16_SHADOW=0 converts every operand in every GEMM: the same bf16 values into the
 * same products, so the parameters must agree to the bit (a stale mirror or copy would not);
 * and bf16 against the fp32 CPU within bf16's rounding. */
static void test_bf16_mirror_matches_conversions(void)
{
    need_gpu();
    mgpu_cfg_t cfg;
    mgpu_err_t err = {0};
    cfg_text(&cfg, kMlp);
    CHECK_INT(mgpu_cfg_override(&cfg, "precision=bf16", &err), 0);
    /* The same bf16 values into the same products: to the bit. */
    bf16_copies_vs_conversions("bf16", &cfg, 1e-6);
}

/* bf16 with layers of 1024 x 1024 rows: the hidden layers' outputs and input gradients go
 * straight to bf16 copies, and the ReLU backward and bias gradient run as one pass on the
 * bf16 gradient (drelu16_kernel); without the copies, the fp32 products and
 * drelu_bgrad4_kernel. Graph replay. */
static void test_bf16_large_layers(void)
{
    need_gpu();
    mgpu_cfg_t cfg;
    cfg_text(&cfg, "dataset = synthetic\nsamples = 2048\nfeatures = 64\nclasses = 10\n"
                   "eval_fraction = 0\nmodel = mlp\nhidden = 1024,1024\nloss = cross_entropy\n"
                   "batch_size = 1024\nepochs = 4\nshuffle = true\nprecision = bf16\n"
                   "log_interval = 0\noptimizer = sgd\nlr = 0.05\n");
    /* Not to the bit: with the copies, the products write bf16 straight from cuBLASLt
     * (another plan, maybe another accumulation order than the fp32 product that is
     * converted without them). A stale copy would be off by far more. */
    bf16_copies_vs_conversions("bf16 large", &cfg, 1e-3);
}

/* Full-batch training without shuffling: each epoch is one step over the whole training
 * split in its order, which the GPU step reads in place (no gather, and bf16 keeps the
 * input's copy from step to step). fp32 against the CPU with graph replay, bf16's kept
 * copies against conversions, and the same cfg shuffled, which gathers. */
static void test_whole_data_set_in_place(void)
{
    need_gpu();
    static const char *const text =
        "dataset = synthetic\nsamples = 640\nfeatures = 32\nclasses = 10\neval_fraction = 0.2\n"
        "model = mlp\nhidden = 64,64\nloss = cross_entropy\nbatch_size = 512\nepochs = 7\n"
        "shuffle = false\nprecision = fp32\nlog_interval = 3\noptimizer = sgd\nlr = 0.05\n"
        "momentum = 0.9\n";
    mgpu_cfg_t cfg;
    mgpu_err_t err = {0};
    job_t cpu[1], gpu[1], shuffled[1];
    cfg_text(&cfg, text);
    run_world(&cfg, 1, 0, cpu);
    run_world(&cfg, 1, 1, gpu);
    if (cpu[0].rc || gpu[0].rc)
        return;
    CHECK_INT(gpu[0].res.steps, 7);
    CHECK_INT(gpu[0].res.graphed, 1);
    CHECK_INT(gpu[0].res.in_place, 1);
    CHECK_INT(cpu[0].res.in_place, 0);
    CHECK(compare("in place vs cpu", gpu[0].res.params, cpu[0].res.params, gpu[0].res.n_params,
                  2e-4) <= 2e-4);
    CHECK(fabs(gpu[0].res.loss - cpu[0].res.loss) <= 1e-3 * (1 + fabs(cpu[0].res.loss)));
    free(cpu[0].res.params);
    free(gpu[0].res.params);

    mgpu_cfg_t sh = cfg;
    CHECK_INT(mgpu_cfg_override(&sh, "shuffle=true", &err), 0);
    run_world(&sh, 1, 1, shuffled);
    if (shuffled[0].rc)
        return;
    CHECK_INT(shuffled[0].res.in_place, 0);
    CHECK_INT(shuffled[0].res.graphed, 1);
    free(shuffled[0].res.params);

    CHECK_INT(mgpu_cfg_override(&cfg, "precision=bf16", &err), 0);
    bf16_copies_vs_conversions("bf16 in place", &cfg, 1e-6);
}

int main(void)
{
    RUN(test_bucket_schedule);
    RUN(test_bucket_layers_rejects_bad_bucket);
    RUN(test_graph_eligibility);
    RUN(test_gpu_matches_cpu_fp32);
    RUN(test_graph_equals_eager);
    RUN(test_partial_batch_and_adamw_match_cpu);
    RUN(test_two_ranks_buckets_match_cpu);
    RUN(test_bf16_mirror_matches_conversions);
    RUN(test_bf16_large_layers);
    RUN(test_whole_data_set_in_place);
    return check_done();
}
