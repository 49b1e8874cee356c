/* test_ddp.c - mgpu_ddp_run, the worker's training loop, with threads as ranks over a
 * shared-memory communicator: the article's demo batches per rank, configs/train.cfg on 4
 * ranks to >= 95% with its metrics file, 4 ranks == 1 rank with the global batch (and a GPT's
 * 2 ranks, their gradient buckets in backward's order), a run
 * killed and resumed from its checkpoint == an uninterrupted one (bit for bit), and a
 * checkpoint of another run refused on every rank. */
#include "check.h"
#include "ddp.h"
#include "model_gpt.h" /* mgpu_gpt_buckets: the averages' plan */

#include <math.h>    /* fabs */
#include <pthread.h> /* pthread_barrier_t */

#define MAXW 8

#define MAX_AVGS 4096

typedef struct tworld {
    int W;
    pthread_barrier_t barrier;
    void *bufs[MAXW];
    float *tmp;
    int calls;
    /* Rank 0's averages in order: where in its buffer and how many floats (base: the
     * gradients of its GPT, found by the first average's address). */
    int n_avgs;
    const float *avg_buf[MAX_AVGS];
    size_t avg_count[MAX_AVGS];
} tworld_t;

typedef struct trank {
    tworld_t *w;
    int rank;
} trank_t;

static int t_reduce(void *ctx, float *buf, size_t count, int average)
{
    trank_t *r = ctx;
    tworld_t *w = r->w;
    w->bufs[r->rank] = buf;
    pthread_barrier_wait(&w->barrier);
    if (r->rank == 0) {
        w->tmp = malloc(sizeof(float) * (count + 1));
        for (size_t i = 0; i < count; i++) {
            double s = 0;
            for (int q = 0; q < w->W; q++)
                s += ((float *)w->bufs[q])[i];
            w->tmp[i] = (float)(average ? s / w->W : s);
        }
        w->calls++;
        if (average && w->n_avgs < MAX_AVGS) {
            w->avg_buf[w->n_avgs] = buf;
            w->avg_count[w->n_avgs++] = count;
        }
    }
    pthread_barrier_wait(&w->barrier);
    memcpy(buf, w->tmp, sizeof(float) * count);
    pthread_barrier_wait(&w->barrier);
    if (r->rank == 0)
        free(w->tmp);
    return 0;
}

static int t_avg(void *ctx, float *buf, size_t count, mgpu_err_t *err)
{
    return t_reduce(ctx, buf, count, 1);
}

static int t_sum(void *ctx, float *buf, size_t count, mgpu_err_t *err)
{
    return t_reduce(ctx, buf, count, 0);
}

static int t_bcast(void *ctx, void *buf, size_t bytes, int root, mgpu_err_t *err)
{
    trank_t *r = ctx;
    tworld_t *w = r->w;
    if (r->rank == root)
        w->bufs[root] = buf;
    pthread_barrier_wait(&w->barrier);
    if (r->rank != root)
        memcpy(buf, w->bufs[root], bytes);
    pthread_barrier_wait(&w->barrier);
    return 0;
}

typedef struct job {
    const mgpu_cfg_t *cfg;
    tworld_t *w;
    int rank;
    char *out;
    size_t out_len;
    mgpu_ddp_result_t res;
    mgpu_err_t err;
    int rc;
} job_t;

static void *job_main(void *arg)
{
    job_t *j = arg;
    trank_t tr = {.w = j->w, .rank = j->rank};
    mgpu_ddp_comm_t comm = {.rank = j->rank,
                            .world_size = j->w->W,
                            .ctx = &tr,
                            .allreduce_avg = t_avg,
                            .allreduce_sum = t_sum,
                            .broadcast = t_bcast};
    mgpu_kernels_t *k = NULL;
    FILE *out = open_memstream(&j->out, &j->out_len);
    j->rc = mgpu_kernels_create(MGPU_KBACKEND_CPU, -1, &k, &j->err);
    if (j->rc == 0)
        j->rc = mgpu_ddp_run(k, j->cfg, &comm, out, &j->res, &j->err);
    fclose(out);
    mgpu_kernels_destroy(k);
    return NULL;
}

/* Runs cfg on W thread-ranks; jobs[r] holds each rank's output and result. */
static void run_world(const mgpu_cfg_t *cfg, int W, job_t *jobs, tworld_t *w)
{
    pthread_t th[MAXW];
    memset(w, 0, sizeof *w);
    w->W = W;
    pthread_barrier_init(&w->barrier, NULL, (unsigned)W);
    for (int r = 0; r < W; r++) {
        jobs[r] = (job_t){.cfg = cfg, .w = w, .rank = r};
        pthread_create(&th[r], NULL, job_main, &jobs[r]);
    }
    for (int r = 0; r < W; r++)
        pthread_join(th[r], NULL);
    pthread_barrier_destroy(&w->barrier);
}

static void free_jobs(job_t *jobs, int W)
{
    for (int r = 0; r < W; r++) {
        free(jobs[r].out);
        free(jobs[r].res.params);
    }
}

static int count_lines(const char *text, const char *needle)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)) != NULL; p++)
        n++;
    return n;
}

static void cfg_from(mgpu_cfg_t *cfg, const char *file, const char *text)
{
    mgpu_err_t err = {0};
    if (file != NULL) {
        char p[1024];
        const char *root = getenv("MGPU_ROOT");
        snprintf(p, sizeof p, "%s/configs/%s", root ? root : ".", file);
        CHECK_INT(mgpu_cfg_load(p, cfg, &err), 0);
    } else {
        mgpu_cfg_defaults(cfg);
        CHECK_INT(mgpu_cfg_parse(text, "test.cfg", NULL, cfg, &err), 0);
        CHECK_INT(mgpu_cfg_check(cfg, &err), 0);
    }
    if (err.msg[0])
        printf("  %s\n", err.msg);
}

/* Scenarios 1 and 2: 2 ranks get batches of 30 and 15; 4 ranks one batch of 23. */
static void test_demo_batches(void)
{
    mgpu_cfg_t cfg;
    job_t jobs[MAXW];
    tworld_t w;
    cfg_from(&cfg, "demo.cfg", NULL);
    run_world(&cfg, 2, jobs, &w);
    for (int r = 0; r < 2; r++) {
        CHECK_INT(jobs[r].rc, 0);
        CHECK_INT(count_lines(jobs[r].out, "\tIn Model: input size [30, 5] output size [30, 2]\n"),
                  1);
        CHECK_INT(count_lines(jobs[r].out, "Outside: input size [30, 5] output_size [30, 2]\n"), 1);
        CHECK_INT(count_lines(jobs[r].out, "Outside: input size [15, 5] output_size [15, 2]\n"), 1);
        CHECK_INT(count_lines(jobs[r].out, "Outside:"), 2);
        CHECK_INT(jobs[r].res.steps, 2);
    }
    free_jobs(jobs, 2);
    run_world(&cfg, 4, jobs, &w);
    for (int r = 0; r < 4; r++) {
        CHECK_INT(jobs[r].rc, 0);
        CHECK_INT(count_lines(jobs[r].out, "Outside: input size [23, 5] output_size [23, 2]\n"), 1);
        CHECK_INT(count_lines(jobs[r].out, "Outside:"), 1);
    }
    printf("  rank 0 of 4 printed:\n%s", jobs[0].out);
    free_jobs(jobs, 4);
}

static void test_train_cfg_on_4_ranks(void)
{
    mgpu_cfg_t cfg;
    job_t jobs[MAXW];
    tworld_t w;
    char metrics[] = "/tmp/mgpu_test_metrics.XXXXXX";
    close(mkstemp(metrics));
    cfg_from(&cfg, "train.cfg", NULL);
    snprintf(cfg.metrics_file, sizeof cfg.metrics_file, "%s", metrics);
    run_world(&cfg, 4, jobs, &w);
    for (int r = 0; r < 4; r++) {
        CHECK_INT(jobs[r].rc, 0);
        if (jobs[r].rc)
            printf("  rank %d: %s\n", r, jobs[r].err.msg);
        CHECK(jobs[r].res.eval_accuracy >= 0.95);
        CHECK(jobs[r].res.params && jobs[0].res.params &&
              memcmp(jobs[r].res.params, jobs[0].res.params,
                     sizeof(float) * jobs[0].res.n_params) == 0);
    }
    /* Progress lines from rank 0 only. */
    CHECK(strstr(jobs[0].out, "epoch 1/4 step 50/") != NULL);
    CHECK(strstr(jobs[0].out, "samples/s") != NULL);
    CHECK(strstr(jobs[0].out, "eval epoch 4 step") != NULL);
    CHECK(strstr(jobs[1].out, "epoch") == NULL);
    printf("  %.60s... accuracy %.2f%%, %.2f s, %.0f samples/s on 4 thread-ranks\n", jobs[0].out,
           100 * jobs[0].res.eval_accuracy, jobs[0].res.seconds, jobs[0].res.samples_per_s);
    /* Metrics: JSON lines, the last one final. */
    FILE *f = fopen(metrics, "r");
    char line[512], last[512] = "";
    int n = 0;
    while (f && fgets(line, sizeof line, f)) {
        CHECK(line[0] == '{');
        memcpy(last, line, sizeof last);
        n++;
    }
    if (f)
        fclose(f);
    CHECK(n > 5);
    CHECK_CONTAINS(last, "\"final\":true");
    CHECK_CONTAINS(last, "\"world_size\":4");
    CHECK_CONTAINS(last, "\"eval_accuracy\":0.9");
    CHECK_CONTAINS(last, "\"steps\":252"); /* 16000 / 4 / 64 = 62.5 -> 63 batches x 4 epochs */
    unlink(metrics);
    free_jobs(jobs, 4);
}

static void test_4_ranks_equal_1_rank_global_batch(void)
{
    const char *text = "dataset = synthetic\nsamples = 2000\nfeatures = 16\nclasses = 5\n"
                       "eval_fraction = 0.1\nmodel = mlp\nhidden = 64,32\nactivation = tanh\n"
                       "loss = cross_entropy\noptimizer = sgd\nlr = 0.05\nmomentum = 0.9\n"
                       "batch_size = 32\nepochs = 2\nbucket_mb = 0.004\nlog_interval = 0\n";
    mgpu_cfg_t c4, c1;
    job_t j4[MAXW], j1[1];
    tworld_t w4, w1;
    cfg_from(&c4, NULL, text);
    cfg_from(&c1, NULL, text);
    c1.batch_size = 4 * 32;
    /* Rank r's batch b holds positions r + 4i, i in [32b, 32b + 32), of the epoch's
     * permutation; together: positions [128b, 128b + 128), the one rank's batch b. */
    run_world(&c4, 4, j4, &w4);
    run_world(&c1, 1, j1, &w1);
    CHECK_INT(j4[0].rc, 0);
    CHECK_INT(j1[0].rc, 0);
    CHECK_INT(j4[0].res.steps, j1[0].res.steps);
    double d = 0;
    for (size_t i = 0; i < j1[0].res.n_params; i++)
        d = fmax(d, fabs(j4[0].res.params[i] - j1[0].res.params[i]));
    printf("  4 x 32 vs 1 x 128: %lld steps, %d collectives, largest parameter difference %.3g, "
           "accuracy %.2f%% vs %.2f%%\n",
           j1[0].res.steps, w4.calls, d, 100 * j4[0].res.eval_accuracy,
           100 * j1[0].res.eval_accuracy);
    CHECK(d < 1e-5);
    CHECK(fabs(j4[0].res.eval_accuracy - j1[0].res.eval_accuracy) < 1e-6);
    free_jobs(j4, 4);
    free_jobs(j1, 1);
}

/* A little text for model = gpt (bytes as tokens): one sentence over and over with a counter,
 * so the windows differ. */
static void write_text(char *path)
{
    FILE *f = fdopen(mkstemp(path), "w");
    for (int i = 0; f != NULL && i < 200; i++)
        fprintf(f, "line %d: the quick brown fox jumps over the lazy dog.\n", i);
    if (f != NULL)
        fclose(f);
}

/* model = gpt on thread-ranks: 2 ranks x batch 2 equal 1 rank x batch 4, with buckets small
 * enough that every block is one (bucket_mb = 0.001: 262 floats) (averaged after each step's
 * backward on the CPU, in the order of mgpu_gpt_buckets), and with gradient accumulation (averaged
 * once a step, on the last micro-batch). */
static void test_gpt_2_ranks_equal_1_rank_global_batch(void)
{
    char path[] = "/tmp/mgpu_test_gpt_text.XXXXXX", text[1024];
    write_text(path);
    snprintf(text, sizeof text,
             "model = gpt\ndataset = text\ndata_text = %s\neval_fraction = 0.1\n"
             "n_layer = 3\nn_head = 2\nn_embd = 32\ncontext = 16\nbatch_size = 2\n"
             "max_steps = 6\nlr = 0.003\nlr_min = 0.0003\nwarmup_steps = 2\n"
             "grad_clip = 1.0\nweight_decay = 0.1\nseed = 5\nlog_interval = 0\n"
             "eval_interval = 0\nbucket_mb = 0.001\n",
             path);
    mgpu_cfg_t c2, c1, acc2;
    job_t j2[MAXW], j1[1], ja[MAXW];
    tworld_t w2, w1, wa;
    cfg_from(&c2, NULL, text);
    c1 = c2;
    c1.batch_size = 4;
    acc2 = c2;
    acc2.batch_size = 1;
    acc2.grad_accum = 2;
    run_world(&c2, 2, j2, &w2);
    run_world(&c1, 1, j1, &w1);
    run_world(&acc2, 2, ja, &wa);
    CHECK_INT(j2[0].rc, 0);
    CHECK_INT(j1[0].rc, 0);
    CHECK_INT(ja[0].rc, 0);
    if (j2[0].rc || j1[0].rc || ja[0].rc) {
        printf("  %s / %s / %s\n", j2[0].err.msg, j1[0].err.msg, ja[0].err.msg);
        goto out;
    }
    CHECK_INT(j2[0].res.steps, 6);
    CHECK_INT(ja[0].res.steps, 6);
    double d = 0, da = 0;
    for (size_t i = 0; i < j1[0].res.n_params; i++) {
        d = fmax(d, fabs(j2[0].res.params[i] - j1[0].res.params[i]));
        da = fmax(da, fabs(ja[0].res.params[i] - j1[0].res.params[i]));
    }
    CHECK(memcmp(j2[0].res.params, j2[1].res.params, sizeof(float) * j2[0].res.n_params) == 0);
    printf("  gpt, 2 x 2 and 2 x 1 x grad_accum 2 vs 1 x 4: largest parameter differences %.3g, "
           "%.3g; loss %.5f, %.5f vs %.5f\n",
           d, da, j2[0].res.loss, ja[0].res.loss, j1[0].res.loss);
    CHECK(d < 1e-5);
    CHECK(da < 1e-5);
    CHECK(fabs(j2[0].res.loss - j1[0].res.loss) < 1e-5);

    /* The averages: per step, the buckets of mgpu_gpt_buckets in their order (the embeddings'
     * last), once a step also with grad_accum = 2; then the loss and the evaluation's. */
    mgpu_kernels_t *k = NULL;
    mgpu_gpt_t *m = NULL;
    mgpu_gpt_bucket_t *plan = NULL;
    mgpu_err_t err = {0};
    int nb = 0;
    mgpu_gpt_spec_t spec = {.n_layer = 3, .n_head = 2, .n_embd = 32, .context = 16, .vocab = 256};
    CHECK_INT(mgpu_kernels_create(MGPU_KBACKEND_CPU, -1, &k, &err), 0);
    CHECK_INT(mgpu_gpt_create(k, &spec, 1, &m, &err), 0);
    CHECK_INT(mgpu_gpt_buckets(m, c2.bucket_mb, &plan, &nb, &err), 0);
    CHECK_INT(nb, spec.n_layer + 1); /* the final LayerNorm's 64 floats go with the top block */
    const tworld_t *ws[2] = {&w2, &wa};
    for (int wi = 0; wi < 2 && nb > 0; wi++) {
        const tworld_t *w = ws[wi];
        /* The last bucket starts at the gradients' first float. */
        const float *grads = w->avg_buf[nb - 1];
        int bad = 0;
        CHECK(w->n_avgs >= 6 * nb);
        for (int i = 0; i < 6 * nb && i < w->n_avgs; i++) {
            const mgpu_gpt_bucket_t *b = &plan[i % nb];
            bad += w->avg_buf[i] != grads + b->off || w->avg_count[i] != b->n;
        }
        CHECK_INT(bad, 0);
        for (int i = 6 * nb; i < w->n_avgs; i++)
            CHECK(w->avg_count[i] <= 2);
    }
    free(plan);
    mgpu_gpt_destroy(m);
    mgpu_kernels_destroy(k);
out:
    free_jobs(j2, 2);
    free_jobs(j1, 1);
    free_jobs(ja, 2);
    unlink(path);
}

static void test_resume_after_kill(void)
{
    const char *text = "dataset = synthetic\nsamples = 600\nfeatures = 8\nclasses = 3\n"
                       "eval_fraction = 0.2\nmodel = mlp\nhidden = 16\nloss = cross_entropy\n"
                       "optimizer = adamw\nlr = 0.01\nbatch_size = 20\nepochs = 3\n"
                       "log_interval = 0\n";
    char ckpt[] = "/tmp/mgpu_test_ddp_ckpt.XXXXXX";
    close(mkstemp(ckpt));
    unlink(ckpt);
    mgpu_cfg_t full, killed;
    job_t ja[MAXW], jb[MAXW], jc[MAXW];
    tworld_t w;
    cfg_from(&full, NULL, text);
    /* Uninterrupted, no checkpoint. */
    run_world(&full, 2, ja, &w);
    /* The same with checkpoints every 4 steps, stopped by max_steps after 15 of 24 steps: its
     * end is checkpointed too (a kill's is not: test_durability kills). */
    killed = full;
    snprintf(killed.checkpoint, sizeof killed.checkpoint, "%s", ckpt);
    killed.checkpoint_interval = 4;
    killed.max_steps = 15;
    run_world(&killed, 2, jb, &w);
    CHECK_INT(jb[0].res.steps, 15);
    /* Restarted: resumes from step 15 by itself and runs to the end. */
    killed.max_steps = 0;
    run_world(&killed, 2, jc, &w);
    for (int r = 0; r < 2; r++) {
        CHECK_INT(jc[r].rc, 0);
        CHECK_INT(jc[r].res.resumed_step, 15);
        CHECK_INT(jc[r].res.steps, ja[r].res.steps);
        CHECK(memcmp(jc[r].res.params, ja[r].res.params, sizeof(float) * ja[r].res.n_params) == 0);
    }
    CHECK(strstr(jc[0].out, "resumed from") != NULL);
    printf("  stopped at step 15, resumed there: final parameters bit-identical\n");
    free_jobs(jb, 2);
    free_jobs(jc, 2);

    /* A checkpoint of another network: every rank fails with rank 0's reason. */
    mgpu_cfg_t other = killed;
    other.hidden[0] = 17;
    run_world(&other, 2, jc, &w);
    CHECK_INT(jc[0].rc, MGPU_E_CONFIG);
    CHECK_CONTAINS(jc[0].err.msg, "was written by another run");
    CHECK_INT(jc[1].rc, MGPU_E_CONFIG);
    CHECK_CONTAINS(jc[1].err.msg, "rank 0 cannot resume: checkpoint");
    free_jobs(jc, 2);
    /* A damaged one: refused, not silently restarted. */
    FILE *f = fopen(ckpt, "r+b");
    fseek(f, 200, SEEK_SET);
    fputc(0x55, f);
    fclose(f);
    run_world(&killed, 2, jc, &w);
    CHECK_INT(jc[1].rc, MGPU_E_CONFIG);
    CHECK_CONTAINS(jc[1].err.msg, "checksum mismatch");
    free_jobs(jc, 2);
    free_jobs(ja, 2);
    unlink(ckpt);
}

int main(void)
{
    RUN(test_demo_batches);
    RUN(test_train_cfg_on_4_ranks);
    RUN(test_4_ranks_equal_1_rank_global_batch);
    RUN(test_gpt_2_ranks_equal_1_rank_global_batch);
    RUN(test_resume_after_kill);
    return check_done();
}
