/* test_zero_gpu.c - zero = 1 through mgpu_ddp_run (the worker's training loop) on ranks that
 * are threads of one process, with collectives of this file's own that move each buffer
 * through host memory: two or three ranks on the CPU everywhere, and on one GPU where there
 * is one (NCCL cannot put two ranks on one GPU, and mgpu-worker's ranks that share a GPU
 * train on the CPU, so this is how a single GPU runs the sharded step at world size 2).
 *
 * The collectives reduce every element in rank order with the same code whatever the message,
 * so zero = 1's reduce-scatter gives each gradient the bits of zero = 0's all-reduce. Checked:
 *   - the GPT at 2 ranks (bf16 path on a GPU), zero = 1 against zero = 0 over 50 steps:
 *     without a clip every step's loss and the final parameters bit for bit (the update of a
 *     slice is elementwise, the bf16 copy is rounded as AdamW rounds it); with a clip the norm
 *     is summed slice by slice, in another order, so the losses agree within 1e-5 relative
 *     in fp32 (float rounding of the clip factor) and 2e-3 on the bf16 path (a parameter one
 *     float step away can round to the neighbouring bf16);
 *   - rank 0's printed optimizer state: 2 x floor(n / W) floats against zero = 0's 2 n;
 *   - at 3 ranks, whose parameter count leaves a tail of n mod 3 floats (averaged with an
 *     all-reduce, sent with a broadcast), the same;
 *   - the MLP at 2 ranks (on a GPU through its GPU step, with the sharded update in place of
 *     the buckets), zero = 1 against zero = 0, AdamW and SGD with momentum, bit for bit;
 *   - on a GPU, optimizers of 2 and 3 slices (starting where they fall, mostly not 16-byte
 *     aligned) update as the whole optimizer, bit for bit;
 *   - a checkpoint of zero = 1 at 2 ranks, resumed at world size 1 with zero = 1 and with
 *     zero = 0: both resume at its step and go on as the run that never stopped (the same
 *     windows in the same steps: the checkpoint falls on an epoch's end and the global batch
 *     stays 8), within float rounding of the ranks' means.
 * Run it on a GPU machine: build/tests/test_zero_gpu (tests/gpu/zero_checks.sh does). */
#include "check.h"
#include "kernels_check.h" /* need_gpu */
#include "tmpdir.h"        /* make_tmpdir, tmp */
#include "ddp.h"
#include "optim.h" /* mgpu_optim_create_slice: the slices' update on the GPU */
#include "zero.h"  /* mgpu_zero_init */

#if defined(MGPU_HAVE_CUDA) && MGPU_HAVE_CUDA
#include "kernels_cuda.h"     /* mgpu_kernels_cuda_stream */
#include <cuda_runtime_api.h> /* the collectives' copies through the host */
#endif

#include <errno.h>   /* EIO, ENOMEM */
#include <math.h>    /* fabs */
#include <pthread.h> /* the thread-ranks */
#include <unistd.h>  /* alarm */

#define MAXW 3
#define MAXSTEPS 64

/* --- the collectives, through host memory -------------------------------------------------- */

typedef struct world {
    int W;
    pthread_barrier_t barrier;
    const void *host[MAXW]; /* each rank's host copy of its buffer in the current collective */
} world_t;

typedef struct rank {
    world_t *w;
    int rank, gpu;
    void *stream; /* the rank's kernels stream (a GPU's) */
} rank_t;

/* bytes of src (backend memory) into dst (host), after the work queued on stream (NULL: the
 * rank's kernels stream), or back. */
static int move(rank_t *r, void *dst, const void *src, size_t bytes, int to_host, void *stream)
{
    if (bytes == 0)
        return 0;
#if defined(MGPU_HAVE_CUDA) && MGPU_HAVE_CUDA
    if (r->gpu) {
        cudaStream_t s = (cudaStream_t)(stream != NULL ? stream : r->stream);
        return cudaMemcpyAsync(dst, src, bytes,
                               to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice,
                               s) == cudaSuccess &&
                       cudaStreamSynchronize(s) == cudaSuccess
                   ? 0
                   : -1;
    }
#endif
    memcpy(dst, src, bytes);
    return 0;
}

/* Every rank's bytes at buf, copied to the host, seen by all: this rank's copy is returned and
 * in w->host[rank] once every rank has arrived (each rank arrives at both barriers whatever
 * failed, so none is left waiting). */
static void *share(rank_t *r, const void *buf, size_t bytes, void *stream, int *rc)
{
    void *h = malloc(bytes + 1);
    *rc = h == NULL ? -ENOMEM : move(r, h, buf, bytes, 1, stream) < 0 ? -EIO : 0;
    r->w->host[r->rank] = h;
    pthread_barrier_wait(&r->w->barrier);
    for (int q = 0; q < r->w->W; q++)
        if (r->w->host[q] == NULL)
            *rc = -ENOMEM;
    return h;
}

/* Every rank has read the others' copies: this one's may go. */
static void share_done(rank_t *r, void *h)
{
    pthread_barrier_wait(&r->w->barrier);
    free(h);
}

/* Element i of float block `at` (in floats) over the ranks, in rank order: the sum or the
 * average. One function for the all-reduce and the reduce-scatter: the same bits. */
static float reduce_at(const world_t *w, size_t at, size_t i, int average)
{
    float s = 0.0f;
    for (int q = 0; q < w->W; q++)
        s += ((const float *)w->host[q])[at + i];
    return average ? s / (float)w->W : s;
}

static int failed(int rc, const char *what, size_t bytes, mgpu_err_t *err)
{
    return rc < 0 ? mgpu_err_set(err, rc, "test %s of %zu bytes: a copy through the host failed",
                                 what, bytes)
                  : 0;
}

static int allreduce(rank_t *r, float *buf, size_t n, int average, void *stream, mgpu_err_t *err)
{
    int rc;
    float *out = malloc(sizeof(float) * (n + 1));
    void *h = share(r, buf, sizeof(float) * n, stream, &rc);
    for (size_t i = 0; rc == 0 && out != NULL && i < n; i++)
        out[i] = reduce_at(r->w, 0, i, average);
    share_done(r, h);
    if (rc == 0)
        rc = out == NULL ? -ENOMEM : move(r, buf, out, sizeof(float) * n, 0, stream) < 0 ? -EIO : 0;
    free(out);
    return failed(rc, "all-reduce", sizeof(float) * n, err);
}

static int t_avg(void *c, float *b, size_t n, mgpu_err_t *e)
{
    return allreduce(c, b, n, 1, NULL, e);
}

static int t_sum(void *c, float *b, size_t n, mgpu_err_t *e)
{
    return allreduce(c, b, n, 0, NULL, e);
}

static int t_avg_stream(void *c, float *b, size_t n, void *stream, mgpu_err_t *e)
{
    return allreduce(c, b, n, 1, stream, e);
}

/* buf holds W blocks of n: block rank becomes their average over the ranks. */
static int t_reduce_scatter(void *c, float *buf, size_t n, mgpu_err_t *err)
{
    rank_t *r = c;
    int rc;
    float *out = malloc(sizeof(float) * (n + 1));
    void *h = share(r, buf, sizeof(float) * n * (size_t)r->w->W, NULL, &rc);
    for (size_t i = 0; rc == 0 && out != NULL && i < n; i++)
        out[i] = reduce_at(r->w, (size_t)r->rank * n, i, 1);
    share_done(r, h);
    if (rc == 0)
        rc = out == NULL                                                               ? -ENOMEM
             : move(r, buf + (size_t)r->rank * n, out, sizeof(float) * n, 0, NULL) < 0 ? -EIO
                                                                                       : 0;
    free(out);
    return failed(rc, "reduce-scatter", sizeof(float) * n, err);
}

/* buf holds W blocks of n: block q becomes rank q's. */
static int t_all_gather(void *c, float *buf, size_t n, mgpu_err_t *err)
{
    rank_t *r = c;
    const int W = r->w->W;
    int rc;
    float *out = malloc(sizeof(float) * (n * (size_t)W + 1));
    void *h = share(r, buf + (size_t)r->rank * n, sizeof(float) * n, NULL, &rc);
    for (int q = 0; rc == 0 && out != NULL && q < W; q++)
        memcpy(out + (size_t)q * n, r->w->host[q], sizeof(float) * n);
    share_done(r, h);
    if (rc == 0)
        rc = out == NULL                                                     ? -ENOMEM
             : move(r, buf, out, sizeof(float) * n * (size_t)W, 0, NULL) < 0 ? -EIO
                                                                             : 0;
    free(out);
    return failed(rc, "all-gather", sizeof(float) * n, err);
}

static int t_bcast(void *c, void *buf, size_t bytes, int root, mgpu_err_t *err)
{
    rank_t *r = c;
    int rc;
    char *out = malloc(bytes + 1);
    void *h = share(r, buf, bytes, NULL, &rc);
    if (rc == 0 && out != NULL)
        memcpy(out, r->w->host[root], bytes);
    share_done(r, h);
    if (rc == 0 && r->rank != root)
        rc = out == NULL ? -ENOMEM : move(r, buf, out, bytes, 0, NULL) < 0 ? -EIO : 0;
    free(out);
    return failed(rc, "broadcast", bytes, err);
}

/* --- a job of W thread-ranks ----------------------------------------------------------------- */

typedef struct job {
    const mgpu_cfg_t *cfg;
    world_t *w;
    int rank, gpu;
    const char *out_path; /* rank 0's output */
    mgpu_ddp_result_t res;
    mgpu_err_t err;
    int rc;
} job_t;

static void *job_main(void *arg)
{
    job_t *j = arg;
    mgpu_kernels_t *k = NULL;
    rank_t r = {.w = j->w, .rank = j->rank, .gpu = j->gpu};
    FILE *out = fopen(j->rank == 0 ? j->out_path : "/dev/null", "w");
    j->rc = out == NULL ? -errno : 0;
    if (j->rc == 0)
        j->rc = mgpu_kernels_create(j->gpu ? MGPU_KBACKEND_CUDA : MGPU_KBACKEND_CPU,
                                    j->gpu ? 0 : -1, &k, &j->err);
#if defined(MGPU_HAVE_CUDA) && MGPU_HAVE_CUDA
    if (j->rc == 0 && j->gpu)
        r.stream = mgpu_kernels_cuda_stream(k);
#endif
    mgpu_ddp_comm_t comm = {.rank = j->rank,
                            .world_size = j->w->W,
                            .ctx = &r,
                            .allreduce_avg = t_avg,
                            .allreduce_sum = t_sum,
                            .broadcast = t_bcast,
                            .reduce_scatter_avg = t_reduce_scatter,
                            .all_gather = t_all_gather};
    /* The MLP's GPU step with zero = 0 and more than one rank wants the stream form; the GPT
     * gets none, so that no CUDA graph tries to capture these copies. */
    if (j->cfg->model == MGPU_MODEL_MLP)
        comm.allreduce_avg_stream = t_avg_stream;
    if (j->rc == 0)
        j->rc = mgpu_ddp_run(k, j->cfg, &comm, out, &j->res, &j->err);
    if (j->rc != 0)
        printf("  rank %d (%s): %s\n", j->rank, j->gpu ? "gpu" : "cpu", j->err.msg);
    if (out != NULL)
        fclose(out);
    mgpu_kernels_destroy(k);
    return NULL;
}

/* A run's outcome: rank 0's final parameters, its printed optimizer state, and every logged
 * step's loss (from the metrics file; NAN where a step was not logged). */
typedef struct run {
    int ok;
    mgpu_ddp_result_t res;
    size_t state; /* the floats of "optimizer state N floats" on rank 0 */
    int cuda;     /* the final metrics say backend cuda */
    double loss[MAXSTEPS + 1];
    char out[8192];
} run_t;

static void read_run(run_t *o, const char *out_path, const char *metrics)
{
    char line[1024];
    FILE *f = fopen(out_path, "r");
    size_t got = f != NULL ? fread(o->out, 1, sizeof o->out - 1, f) : 0;
    o->out[got] = 0;
    if (f != NULL)
        fclose(f);
    const char *s = strstr(o->out, "optimizer state ");
    if (s == NULL || sscanf(s, "optimizer state %zu floats", &o->state) != 1)
        o->state = 0;
    for (int i = 0; i <= MAXSTEPS; i++)
        o->loss[i] = NAN;
    f = fopen(metrics, "r");
    while (f != NULL && fgets(line, sizeof line, f) != NULL) {
        long long step;
        double loss;
        const char *st = strstr(line, "\"step\":"), *lo = strstr(line, "\"loss\":");
        if (strstr(line, "\"final\"") != NULL)
            o->cuda = strstr(line, "\"backend\":\"cuda\"") != NULL;
        if (strstr(line, "\"final\"") != NULL || st == NULL || lo == NULL ||
            sscanf(st, "\"step\":%lld", &step) != 1 || sscanf(lo, "\"loss\":%lf", &loss) != 1)
            continue;
        if (step >= 1 && step <= MAXSTEPS)
            o->loss[step] = loss;
    }
    if (f != NULL)
        fclose(f);
}

/* Trains cfg text plus the overrides (key=value, NULL-terminated) on W thread-ranks; rank 0's
 * results in *o. name names its files in the test's folder. */
static void run_world(const char *name, const char *text, const char *const *over, int W, int gpu,
                      run_t *o)
{
    mgpu_cfg_t cfg;
    mgpu_err_t err = {0};
    world_t w = {.W = W};
    pthread_t th[MAXW];
    job_t jobs[MAXW];
    char out_path[512], metrics[600], key[700];
    snprintf(out_path, sizeof out_path, "%s", tmp(name));
    snprintf(metrics, sizeof metrics, "%s.jsonl", out_path);
    memset(o, 0, sizeof *o);
    mgpu_cfg_defaults(&cfg);
    CHECK_INT(mgpu_cfg_parse(text, "test.cfg", NULL, &cfg, &err), 0);
    for (int i = 0; over != NULL && over[i] != NULL; i++)
        CHECK_INT(mgpu_cfg_override(&cfg, over[i], &err), 0);
    snprintf(key, sizeof key, "metrics_file=%s", metrics);
    CHECK_INT(mgpu_cfg_override(&cfg, key, &err), 0);
    CHECK_INT(mgpu_cfg_check(&cfg, &err), 0);
    if (err.msg[0] != 0)
        printf("  %s: cfg: %s\n", name, err.msg);
    pthread_barrier_init(&w.barrier, NULL, (unsigned)W);
    for (int r = 0; r < W; r++) {
        jobs[r] = (job_t){.cfg = &cfg, .w = &w, .rank = r, .gpu = gpu, .out_path = out_path};
        pthread_create(&th[r], NULL, job_main, &jobs[r]);
    }
    for (int r = 0; r < W; r++)
        pthread_join(th[r], NULL);
    pthread_barrier_destroy(&w.barrier);
    o->ok = 1;
    for (int r = 0; r < W; r++) {
        CHECK_INT(jobs[r].rc, 0);
        o->ok &= jobs[r].rc == 0;
        if (r > 0)
            free(jobs[r].res.params);
    }
    o->res = jobs[0].res;
    read_run(o, out_path, metrics);
    CHECK_INT(o->cuda, gpu); /* a GPU run that fell back to the CPU would prove nothing */
}

static void run_free(run_t *o)
{
    free(o->res.params);
    o->res.params = NULL;
}

/* The largest relative difference of the losses of steps [from, to] (both runs must have
 * them all), printed with the first and last; NAN when one is missing. */
static double loss_diff(const char *what, const run_t *a, const run_t *b, int from, int to)
{
    double worst = 0;
    int at = from;
    for (int s = from; s <= to; s++) {
        double d = fabs(a->loss[s] - b->loss[s]) / fabs(b->loss[s]);
        if (!(d <= worst)) /* NaN sticks */
            worst = d, at = s;
    }
    printf("  %s: losses of steps %d-%d: %.7f / %.7f first, %.7f / %.7f last; largest "
           "relative difference %.3g at step %d\n",
           what, from, to, a->loss[from], b->loss[from], a->loss[to], b->loss[to], worst, at);
    return worst;
}

/* Parameters that differ in their bits. */
static size_t params_differ(const run_t *a, const run_t *b)
{
    size_t n = a->res.n_params, d = 0;
    if (a->res.params == NULL || b->res.params == NULL || n != b->res.n_params)
        return (size_t)-1;
    for (size_t i = 0; i < n; i++)
        d += memcmp(&a->res.params[i], &b->res.params[i], sizeof(float)) != 0;
    return d;
}

/* Rank 0 holds 2 floor(n / W) floats of AdamW's state with zero = 1, zero = 0 2 n. */
static void check_state(const char *what, const run_t *z0, const run_t *z1, int W, int arrays)
{
    const size_t n = z0->res.n_params;
    printf("  %s: optimizer state on rank 0: zero = 0 %zu floats, zero = 1 %zu floats (%.4f of "
           "it, %d ranks)\n",
           what, z0->state, z1->state, z0->state ? (double)z1->state / (double)z0->state : 0.0, W);
    CHECK_INT(z0->state, (size_t)arrays * n);
    CHECK_INT(z1->state, (size_t)arrays * (n / (size_t)W));
    CHECK_CONTAINS(z1->out, "(zero = 1)");
}

/* --- the runs -------------------------------------------------------------------------------- */

/* 1025 bytes of text: 64 windows of context 16, all of them training windows. */
static void write_text(void)
{
    static const char *const words[] = {"the", "quick", "brown", "fox",   "jumps", "over",
                                        "a",   "lazy",  "dog",   "while", "ranks", "share",
                                        "one", "slice", "of",    "state"};
    char text[1025 + 16];
    unsigned x = 7;
    size_t n = 0;
    while (n < 1025) { /* words from a fixed LCG, each followed by a space */
        x = x * 1103515245u + 12345u;
        n += (size_t)sprintf(text + n, "%s ", words[(x >> 16) % 16]);
    }
    FILE *f = fopen(tmp("text.txt"), "w");
    CHECK(f != NULL);
    if (f != NULL) {
        CHECK_INT(fwrite(text, 1, 1025, f), 1025);
        fclose(f);
    }
}

/* A GPT of 2 layers, 32 wide (the bf16 path's multiples of 8), over the text's bytes: 8 steps an
 * epoch at 2 ranks of 4 windows. */
static void gpt_text(char *buf, size_t cap, int n_layer)
{
    snprintf(buf, cap,
             "model = gpt\nn_layer = %d\nn_head = 2\nn_embd = 32\ncontext = 16\n"
             "dataset = text\ndata_text = %s\neval_fraction = 0\nbatch_size = 4\n"
             "optimizer = adamw\nlr = 0.003\nwarmup_steps = 5\nweight_decay = 0.1\n"
             "log_interval = 1\nseed = 5\n",
             n_layer, tmp("text.txt"));
}

/* zero = 1 against zero = 0 at W ranks, clip off and on. zero = 0 runs eagerly (a step replayed
 * from a CUDA graph need not give the eager step's bits); zero = 1 is left cuda_graph = true,
 * which it does not use, and says so. */
static void gpt_zero_vs_zero0(int W, int gpu, const char *precision, int n_layer, double tol)
{
    char text[1024], prec[64];
    run_t *o = calloc(4, sizeof *o);
    CHECK(o != NULL);
    if (o == NULL)
        return;
    gpt_text(text, sizeof text, n_layer);
    snprintf(prec, sizeof prec, "precision=%s", precision);
    for (int clip = 0; clip < 2; clip++) {
        const char *c = clip ? "grad_clip=1.0" : "grad_clip=0";
        const char *z0[] = {prec, c, "max_steps=50", "zero=0", "cuda_graph=false", NULL};
        const char *z1[] = {prec, c, "max_steps=50", "zero=1", NULL};
        run_world("z0", text, z0, W, gpu, &o[2 * clip]);
        run_world("z1", text, z1, W, gpu, &o[2 * clip + 1]);
        if (!o[2 * clip].ok || !o[2 * clip + 1].ok)
            return;
        char what[128];
        snprintf(what, sizeof what, "%d ranks, %s, %s, %s", W, gpu ? "gpu" : "cpu", precision,
                 clip ? "clip 1.0" : "no clip");
        double d = loss_diff(what, &o[2 * clip + 1], &o[2 * clip], 1, 50);
        if (!clip) {
            size_t differ = params_differ(&o[1], &o[0]);
            printf("  %s: %zu of %zu parameters differ in their bits\n", what, differ,
                   o[0].res.n_params);
            CHECK(d == 0.0);
            CHECK_INT(differ, 0);
        } else {
            CHECK(d <= tol);
        }
        if (gpu && strcmp(precision, "bf16") == 0)
            CHECK_CONTAINS(o[2 * clip + 1].out, "bf16 activations");
        CHECK_CONTAINS(o[2 * clip + 1].out,
                       gpu ? "gpt: zero = 1 runs its GPU steps eagerly" : "(zero = 1)");
        check_state(what, &o[2 * clip], &o[2 * clip + 1], W, 2);
    }
    for (int i = 0; i < 4; i++)
        run_free(&o[i]);
    free(o);
}

static void start(const char *name)
{
    alarm(240); /* a rank that failed leaves the others at a barrier: the test fails, not hangs */
    make_tmpdir(name);
    write_text();
    /* Each run picks its GEMM algorithms by timing unless told not to: the same ones in
     * every run, for comparable bits. */
    setenv("MGPU_LT_TUNE", "0", 1);
}

static void test_gpt_two_ranks_cpu(void)
{
    start("zero_gpt_cpu");
    gpt_zero_vs_zero0(2, 0, "fp32", 2, 1e-5);
    remove_tmpdir();
}

static void test_gpt_two_ranks_gpu_bf16(void)
{
    need_gpu();
    start("zero_gpt_bf16");
    gpt_zero_vs_zero0(2, 1, "bf16", 2, 2e-3);
    remove_tmpdir();
}

static void test_gpt_two_ranks_gpu_fp32(void)
{
    need_gpu();
    start("zero_gpt_fp32");
    gpt_zero_vs_zero0(2, 1, "fp32", 2, 1e-5);
    remove_tmpdir();
}

/* 1 layer: 21,472 parameters, 1 over a multiple of 3, so the last rank's slice has the tail. */
static void test_gpt_three_ranks_with_a_tail(void)
{
    start("zero_gpt_tail");
    gpt_zero_vs_zero0(3, 0, "fp32", 1, 1e-5);
    remove_tmpdir();
}

static void test_gpt_three_ranks_with_a_tail_gpu(void)
{
    need_gpu();
    start("zero_gpt_tail_gpu");
    gpt_zero_vs_zero0(3, 1, "bf16", 1, 2e-3);
    remove_tmpdir();
}

/* The MLP: 32 -> 64 -> 64 -> 10 on Gaussian clusters, 512 samples, 2 ranks of 32 a step. */
static void mlp_zero_vs_zero0(int gpu)
{
    static const char *const text = "dataset = synthetic\nsamples = 512\nfeatures = 32\n"
                                    "classes = 10\neval_fraction = 0\nmodel = mlp\n"
                                    "hidden = 64,64\nloss = cross_entropy\nbatch_size = 32\n"
                                    "epochs = 5\nshuffle = true\nprecision = fp32\n"
                                    "log_interval = 1\n";
    for (int sgd = 0; sgd < 2; sgd++) {
        const char *opt = sgd ? "optimizer=sgd" : "optimizer=adamw";
        const char *lr = sgd ? "lr=0.05" : "lr=0.003";
        const char *mom = sgd ? "momentum=0.9" : "weight_decay=0.01";
        /* zero = 0's buckets after the backward (bucket_overlap = false): its backward then
         * queues its work in zero = 1's order, with no hook between the layers */
        const char *z0[] = {opt, lr, mom, "zero=0", "cuda_graph=false", "bucket_overlap=false",
                            NULL};
        const char *z1[] = {opt, lr, mom, "zero=1", NULL};
        run_t a, b;
        run_world("m0", text, z0, 2, gpu, &a);
        run_world("m1", text, z1, 2, gpu, &b);
        if (a.ok && b.ok) {
            char what[96];
            snprintf(what, sizeof what, "mlp, %s, 2 ranks, %s", sgd ? "sgd" : "adamw",
                     gpu ? "gpu" : "cpu");
            double d = loss_diff(what, &b, &a, 1, 40);
            size_t differ = params_differ(&b, &a);
            printf("  %s: %zu of %zu parameters differ in their bits\n", what, differ,
                   a.res.n_params);
            CHECK(d == 0.0);
            CHECK_INT(differ, 0);
            check_state(what, &a, &b, 2, sgd ? 1 : 2);
            if (gpu)
                CHECK_CONTAINS(b.out, "ddp: zero = 1 runs its GPU steps eagerly");
        }
        run_free(&a);
        run_free(&b);
    }
}

static void test_mlp_two_ranks_cpu(void)
{
    start("zero_mlp_cpu");
    mlp_zero_vs_zero0(0);
    remove_tmpdir();
}

static void test_mlp_two_ranks_gpu(void)
{
    need_gpu();
    start("zero_mlp_gpu");
    mlp_zero_vs_zero0(1);
    remove_tmpdir();
}

/* zero = 1 at 2 ranks of 4 windows for 2 epochs (16 steps), then world size 1 with 8 windows a
 * step to 4 epochs (32 steps), with zero = 1 and with zero = 0; against 2 ranks straight. */
static void resume_at_world_1(int gpu, const char *precision, double tol)
{
    char text[1024], prec[64], ck1[600], ck0[600], cmd[1300];
    gpt_text(text, sizeof text, 2);
    snprintf(prec, sizeof prec, "precision=%s", precision);
    snprintf(ck1, sizeof ck1, "checkpoint=%s", tmp("a.ckpt"));
    snprintf(ck0, sizeof ck0, "checkpoint=%s", tmp("b.ckpt"));
    const char *straight[] = {prec, "grad_clip=1.0", "epochs=4", "zero=1", NULL};
    const char *first[] = {prec, "grad_clip=1.0", "epochs=2", "zero=1", ck1, NULL};
    const char *then1[] = {prec, "grad_clip=1.0", "epochs=4", "zero=1", "batch_size=8", ck1, NULL};
    const char *then0[] = {prec, "grad_clip=1.0",    "epochs=4", "zero=0", "batch_size=8",
                           ck0,  "cuda_graph=false", NULL};
    run_t *o = calloc(4, sizeof *o);
    CHECK(o != NULL);
    if (o == NULL)
        return;
    run_world("ref", text, straight, 2, gpu, &o[0]);
    run_world("first", text, first, 2, gpu, &o[1]);
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", tmp("a.ckpt"), tmp("b.ckpt"));
    CHECK(system(cmd) == 0);
    run_world("then1", text, then1, 1, gpu, &o[2]);
    run_world("then0", text, then0, 1, gpu, &o[3]);
    if (o[0].ok && o[1].ok && o[2].ok && o[3].ok) {
        CHECK_INT(o[0].res.steps, 32);
        CHECK_INT(o[1].res.steps, 16);
        for (int i = 2; i < 4; i++) {
            CHECK_INT(o[i].res.resumed_step, 16);
            CHECK_INT(o[i].res.steps, 32);
            CHECK_CONTAINS(o[i].out, "at epoch 3, step 16");
        }
        CHECK(loss_diff("2 ranks zero = 1 to step 16 / straight", &o[1], &o[0], 1, 16) == 0.0);
        CHECK(loss_diff("resumed at 1 rank, zero = 1 / 2 ranks straight", &o[2], &o[0], 17, 32) <=
              tol);
        CHECK(loss_diff("resumed at 1 rank, zero = 0 / 2 ranks straight", &o[3], &o[0], 17, 32) <=
              tol);
        /* One rank: zero = 1 is zero = 0's step on the whole, from the same checkpoint. */
        CHECK(loss_diff("resumed at 1 rank, zero = 1 / zero = 0", &o[2], &o[3], 17, 32) == 0.0);
        CHECK_INT(params_differ(&o[2], &o[3]), 0);
    }
    for (int i = 0; i < 4; i++)
        run_free(&o[i]);
    free(o);
}

static void test_resume_at_world_1_cpu(void)
{
    start("zero_resume_cpu");
    resume_at_world_1(0, "fp32", 1e-5);
    remove_tmpdir();
}

static void test_resume_at_world_1_gpu(void)
{
    need_gpu();
    start("zero_resume_gpu");
    resume_at_world_1(1, "fp32", 1e-4);
    remove_tmpdir();
}

/* On the GPU, optimizers of the slices of W ranks (each starting where it falls, mostly not
 * 16-byte aligned) update n floats with the whole optimizer's bits, AdamW and SGD with
 * momentum, over steps: optimizers.cu rounds every operation on its own, so its float4 and
 * scalar paths agree. */
static void test_slice_optimizers_on_the_gpu_match_the_whole_one(void)
{
    need_gpu();
    const mgpu_optim_spec_t specs[] = {
        {.kind = MGPU_OPTIM_ADAMW,
         .lr = 0.01f,
         .weight_decay = 0.1f,
         .beta1 = 0.9f,
         .beta2 = 0.95f,
         .eps = 1e-8f},
        /* nesterov with dampening 0, as torch.optim.SGD (and mgpu) require */
        {.kind = MGPU_OPTIM_SGD, .lr = 0.1f, .momentum = 0.9f, .dampening = 0.0f, .nesterov = 1},
        {.kind = MGPU_OPTIM_SGD, .lr = 0.1f, .momentum = 0.9f, .dampening = 0.1f}};
    const size_t n = 4099;
    mgpu_kernels_t *k = NULL;
    mgpu_err_t err = {0};
    CHECK_INT(mgpu_kernels_create(MGPU_KBACKEND_CUDA, 0, &k, &err), 0);
    float *h = malloc(sizeof(float) * n), *p0 = malloc(sizeof(float) * n);
    float *p1 = malloc(sizeof(float) * n);
    void *dp0 = NULL, *dp1 = NULL, *dg = NULL;
    CHECK(k != NULL && h != NULL && p0 != NULL && p1 != NULL);
    if (k == NULL || h == NULL || p0 == NULL || p1 == NULL)
        return;
    CHECK_INT(mgpu_k_alloc(k, sizeof(float) * n, &dp0, &err), 0);
    CHECK_INT(mgpu_k_alloc(k, sizeof(float) * n, &dp1, &err), 0);
    CHECK_INT(mgpu_k_alloc(k, sizeof(float) * n, &dg, &err), 0);
    for (size_t sp = 0; sp < sizeof specs / sizeof specs[0]; sp++)
        for (int W = 2; W <= 3; W++) {
            mgpu_optim_t *whole = NULL, *part[3] = {NULL, NULL, NULL};
            CHECK_INT(mgpu_optim_create(k, &specs[sp], n, &whole, &err), 0);
            for (int r = 0; r < W; r++) {
                mgpu_zero_t z;
                mgpu_zero_init(&z, r, W, n);
                CHECK_INT(mgpu_optim_create_slice(k, &specs[sp], z.lo, z.hi - z.lo, &part[r], &err),
                          0);
            }
            for (size_t i = 0; i < n; i++)
                h[i] = 0.37f * (float)((i * 29) % 97) / 97.0f - 0.2f;
            CHECK_INT(mgpu_k_copy_to_device(k, dp0, h, sizeof(float) * n, &err), 0);
            CHECK_INT(mgpu_k_copy_to_device(k, dp1, h, sizeof(float) * n, &err), 0);
            for (int s = 0; s < 4 && whole != NULL; s++) {
                for (size_t i = 0; i < n; i++)
                    h[i] = 0.013f * (float)((i * 7 + (size_t)s * 3) % 23) - 0.1f;
                CHECK_INT(mgpu_k_copy_to_device(k, dg, h, sizeof(float) * n, &err), 0);
                CHECK_INT(mgpu_optim_step(whole, dp0, dg, &err), 0);
                for (int r = 0; r < W; r++)
                    if (part[r] != NULL)
                        CHECK_INT(mgpu_optim_step(part[r], dp1, dg, &err), 0);
            }
            CHECK_INT(mgpu_k_copy_to_host(k, p0, dp0, sizeof(float) * n, &err), 0);
            CHECK_INT(mgpu_k_copy_to_host(k, p1, dp1, sizeof(float) * n, &err), 0);
            size_t differ = 0;
            for (size_t i = 0; i < n; i++)
                differ += memcmp(&p0[i], &p1[i], sizeof(float)) != 0;
            printf("  %s, %d slices of %zu floats: %zu differ from the whole optimizer's\n",
                   mgpu_optim_name(specs[sp].kind), W, n, differ);
            CHECK_INT(differ, 0);
            for (int r = 0; r < W; r++)
                mgpu_optim_destroy(part[r]);
            mgpu_optim_destroy(whole);
        }
    mgpu_k_free(k, dp0);
    mgpu_k_free(k, dp1);
    mgpu_k_free(k, dg);
    free(h);
    free(p0);
    free(p1);
    mgpu_kernels_destroy(k);
}

int main(void)
{
    RUN(test_gpt_two_ranks_cpu);
    RUN(test_gpt_three_ranks_with_a_tail);
    RUN(test_mlp_two_ranks_cpu);
    RUN(test_resume_at_world_1_cpu);
    RUN(test_slice_optimizers_on_the_gpu_match_the_whole_one);
    RUN(test_gpt_two_ranks_gpu_bf16);
    RUN(test_gpt_two_ranks_gpu_fp32);
    RUN(test_gpt_three_ranks_with_a_tail_gpu);
    RUN(test_mlp_two_ranks_gpu);
    RUN(test_resume_at_world_1_gpu);
    return check_done();
}
