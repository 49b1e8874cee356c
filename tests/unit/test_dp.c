/* test_dp.c - mode = dp (DataParallel over thread "devices"): the article's per-replica
 * shapes, the same training result as DDP on the same data (even with uneven chunks), the
 * per-device report, train.cfg to >= 95%, and the refusal of checkpoints. */
#include "check.h"
#include "dp.h"

#include <errno.h> /* EINVAL */
#include <math.h>  /* fabs */

static void cfg_text(mgpu_cfg_t *cfg, const char *text)
{
    mgpu_err_t err = {0};
    mgpu_cfg_defaults(cfg);
    CHECK_INT(mgpu_cfg_parse(text, "dp.cfg", NULL, cfg, &err), 0);
    CHECK_INT(mgpu_cfg_check(cfg, &err), 0);
    if (err.msg[0])
        printf("  %s\n", err.msg);
}

static int count(const char *text, const char *needle)
{
    int n = 0;
    for (const char *p = text; p && (p = strstr(p, needle)) != NULL; p++)
        n++;
    return n;
}

static void test_demo_shapes(void)
{
    mgpu_cfg_t cfg;
    mgpu_dp_result_t res;
    mgpu_err_t err = {0};
    char *buf = NULL;
    size_t len = 0;
    cfg_text(&cfg, "mode = dp\ndataset = random\nsamples = 90\nfeatures = 5\nclasses = 2\n"
                   "batch_size = 30\nshuffle = false\ndemo_prints = true\nlog_interval = 0\n");
    FILE *out = open_memstream(&buf, &len);
    CHECK_INT(mgpu_dp_run(MGPU_KBACKEND_CPU, &cfg, 4, out, NULL, &res, &err), 0);
    fclose(out);
    /* 3 batches of 30, each scattered as 8 + 8 + 8 + 6, as the article shows. */
    CHECK_INT(count(buf, "\tIn Model: input size [8, 5] output size [8, 2]\n"), 9);
    CHECK_INT(count(buf, "\tIn Model: input size [6, 5] output size [6, 2]\n"), 3);
    CHECK_INT(count(buf, "Outside: input size [30, 5] output_size [30, 2]\n"), 3);
    CHECK_INT(res.run.steps, 3);
    CHECK_INT(res.dev[0].samples, 24);
    CHECK_INT(res.dev[3].samples, 18);
    CHECK(res.dev[0].extra_s > 0 && res.dev[1].extra_s == 0);
    CHECK_CONTAINS(buf, "dp: device 0: 24 samples");
    printf("%s", strstr(buf, "dp: 4 devices"));
    free(buf);
    free(res.run.params);
}

/* DataParallel with batch B over n devices trains like one process with batch B (which is
 * DDP's result too, test_ddp.c): chunk gradients weighted by their share sum to the batch
 * gradient. 30 on 4 devices makes uneven chunks (8, 8, 8, 6). */
static void dp_vs_single(const char *text, int n)
{
    mgpu_cfg_t cfg;
    mgpu_dp_result_t dp, one;
    mgpu_ddp_result_t ddp;
    mgpu_err_t err = {0};
    mgpu_kernels_t *k = NULL;
    FILE *devnull = fopen("/dev/null", "w");
    cfg_text(&cfg, text);
    CHECK_INT(mgpu_dp_run(MGPU_KBACKEND_CPU, &cfg, n, devnull, NULL, &dp, &err), 0);
    CHECK_INT(mgpu_dp_run(MGPU_KBACKEND_CPU, &cfg, 1, devnull, NULL, &one, &err), 0);
    CHECK_INT(mgpu_kernels_create(MGPU_KBACKEND_CPU, -1, &k, &err), 0);
    mgpu_ddp_comm_t solo = {.rank = 0, .world_size = 1};
    CHECK_INT(mgpu_ddp_run(k, &cfg, &solo, devnull, &ddp, &err), 0);
    fclose(devnull);
    double d1 = 0, d2 = 0;
    for (size_t i = 0; i < dp.run.n_params; i++) {
        d1 = fmax(d1, fabs(dp.run.params[i] - one.run.params[i]));
        d2 = fmax(d2, fabs(dp.run.params[i] - ddp.params[i]));
    }
    printf("  dp on %d devices vs 1 device: %.3g, vs ddp world 1: %.3g (%lld steps)\n", n, d1, d2,
           dp.run.steps);
    CHECK_INT(dp.run.steps, ddp.steps);
    CHECK(d1 < 1e-5 && d2 < 1e-5);
    CHECK(memcmp(one.run.params, ddp.params, sizeof(float) * ddp.n_params) == 0);
    free(dp.run.params);
    free(one.run.params);
    free(ddp.params);
    mgpu_kernels_destroy(k);
}

static void test_dp_equals_ddp(void)
{
    dp_vs_single("mode = dp\ndataset = random\nsamples = 90\nfeatures = 5\nclasses = 2\n"
                 "batch_size = 30\nepochs = 5\nlr = 0.1\nmomentum = 0.9\nlog_interval = 0\n",
                 4);
    dp_vs_single("mode = dp\ndataset = synthetic\nsamples = 1000\nfeatures = 10\nclasses = 4\n"
                 "eval_fraction = 0.2\nmodel = mlp\nhidden = 32\nactivation = gelu\n"
                 "loss = cross_entropy\noptimizer = adamw\nlr = 0.005\nbatch_size = 50\n"
                 "epochs = 2\nlog_interval = 0\n",
                 3);
}

static void test_train_cfg_dp(void)
{
    char p[1024], *buf = NULL;
    size_t len = 0;
    const char *root = getenv("MGPU_ROOT");
    mgpu_cfg_t cfg;
    mgpu_dp_result_t res;
    mgpu_err_t err = {0};
    snprintf(p, sizeof p, "%s/configs/train.cfg", root ? root : ".");
    CHECK_INT(mgpu_cfg_load(p, &cfg, &err), 0);
    CHECK_INT(mgpu_cfg_override(&cfg, "mode=dp", &err), 0);
    CHECK_INT(mgpu_cfg_override(&cfg, "batch_size=256", &err), 0);
    CHECK_INT(mgpu_cfg_override(&cfg, "metrics_file=", &err), 0);
    CHECK_INT(mgpu_cfg_check(&cfg, &err), 0);
    FILE *out = open_memstream(&buf, &len);
    CHECK_INT(mgpu_dp_run(MGPU_KBACKEND_CPU, &cfg, 2, out, NULL, &res, &err), 0);
    fclose(out);
    CHECK(res.run.eval_accuracy >= 0.95);
    CHECK_CONTAINS(buf, "epoch 1/4 step 50/");
    CHECK_CONTAINS(buf, "eval epoch 4 step 252: loss");
    printf("  train.cfg, dp on 2 devices: accuracy %.2f%%, %.2f s\n", 100 * res.run.eval_accuracy,
           res.run.seconds);
    free(buf);
    free(res.run.params);

    CHECK_INT(mgpu_cfg_override(&cfg, "checkpoint=x.ckpt", &err), 0);
    CHECK_INT(mgpu_dp_run(MGPU_KBACKEND_CPU, &cfg, 2, NULL, NULL, &res, &err), MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, "checkpoint is not supported with mode = dp");
    CHECK_INT(mgpu_dp_run(MGPU_KBACKEND_CPU, &cfg, 0, NULL, NULL, &res, &err), -EINVAL);
}

int main(void)
{
    RUN(test_demo_shapes);
    RUN(test_dp_equals_ddp);
    RUN(test_train_cfg_dp);
    return check_done();
}
