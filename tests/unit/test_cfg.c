/* test_cfg.c - train.cfg: the checked-in configs load, every kind of mistake is an error
 * with file:line and the accepted values, paths resolve as documented, and mgpu_cfg_write's
 * output loads back to the same settings. */
#include "cfg.h"
#include "check.h"

#include <sys/stat.h> /* mkdir */
#include <unistd.h>   /* getcwd */

static const char *root(void)
{
    const char *r = getenv("MGPU_ROOT");
    return r != NULL ? r : ".";
}

/* Parses text as "t.cfg" with the cross-key checks; returns the code, err holds the message. */
static int parse(const char *text, mgpu_cfg_t *cfg, mgpu_err_t *err)
{
    mgpu_cfg_defaults(cfg);
    int rc = mgpu_cfg_parse(text, "t.cfg", NULL, cfg, err);
    return rc < 0 ? rc : mgpu_cfg_check(cfg, err);
}

static void test_defaults_are_the_demo(void)
{
    mgpu_cfg_t c;
    mgpu_cfg_defaults(&c);
    CHECK_INT(c.mode, MGPU_MODE_DDP);
    CHECK_INT(c.dataset, MGPU_DATASET_RANDOM);
    CHECK_INT(c.samples, 90);
    CHECK_INT(c.features, 5);
    CHECK_INT(c.classes, 2);
    CHECK_INT(c.batch_size, 30);
    CHECK_INT(c.model, MGPU_MODEL_LINEAR);
    CHECK(c.bucket_mb == 25.0);
    mgpu_err_t err = {0};
    CHECK_INT(mgpu_cfg_check(&c, &err), 0);
    CHECK(c.weight_decay == 0.0);
}

static void test_checked_in_configs_load(void)
{
    char p[1024];
    mgpu_cfg_t c;
    mgpu_err_t err = {0};
    snprintf(p, sizeof p, "%s/configs/demo.cfg", root());
    CHECK_INT(mgpu_cfg_load(p, &c, &err), 0);
    if (err.msg[0])
        printf("  %s\n", err.msg);
    CHECK_INT(c.demo_prints, 1);
    CHECK_INT(c.shuffle, 0);
    CHECK_INT(c.batch_size, 30);
    snprintf(p, sizeof p, "%s/configs/train.cfg", root());
    CHECK_INT(mgpu_cfg_load(p, &c, &err), 0);
    if (err.msg[0])
        printf("  %s\n", err.msg);
    CHECK_INT(c.model, MGPU_MODEL_MLP);
    CHECK_INT(c.n_hidden, 2);
    CHECK_INT(c.hidden[0], 128);
    CHECK_INT(c.optimizer, MGPU_OPTIM_ADAMW);
    CHECK(c.weight_decay == 0.01); /* AdamW's default, derived */
    /* digits.cfg needs scripts/export_digits.py's files; without them it says which. */
    char x[1100];
    snprintf(p, sizeof p, "%s/configs/digits.cfg", root());
    snprintf(x, sizeof x, "%s/configs/../data/digits_x.npy", root());
    int rc = mgpu_cfg_load(p, &c, &err);
    if (access(x, R_OK) == 0) {
        CHECK_INT(rc, 0);
    } else {
        CHECK_INT(rc, MGPU_E_CONFIG);
        CHECK_CONTAINS(err.msg, "digits.cfg:9: data_x = '");
        CHECK_CONTAINS(err.msg, "/configs/../data/digits_x.npy': No such file or directory");
    }
}

static void test_syntax(void)
{
    mgpu_cfg_t c;
    mgpu_err_t err = {0};
    const char *text = "# a comment\n"
                       "\n"
                       "   model = MLP   # case-insensitive values, trailing comment\n"
                       "hidden = 64, 32 ,16\n"
                       "activation=gelu\n"
                       "loss = cross_entropy\r\n"
                       "optimizer = adamw\n"
                       "betas = 0.8 , 0.95\n"
                       "eps = 1e-6\n"
                       "shuffle = off\n"
                       "drop_last = YES\n"
                       "seed = 0x10\n"
                       "metrics_file = \" m #1.jsonl\" # quoted: spaces and ' #' kept\n"
                       "checkpoint = a#b.ckpt\n"
                       "lr = 3e-4";
    CHECK_INT(parse(text, &c, &err), 0);
    if (err.msg[0])
        printf("  %s\n", err.msg);
    CHECK_INT(c.model, MGPU_MODEL_MLP);
    CHECK_INT(c.n_hidden, 3);
    CHECK(c.hidden[0] == 64 && c.hidden[1] == 32 && c.hidden[2] == 16);
    CHECK_INT(c.activation, MGPU_ACT_GELU);
    CHECK(c.beta1 == 0.8 && c.beta2 == 0.95);
    CHECK(c.eps == 1e-6 && c.lr == 3e-4);
    CHECK_INT(c.shuffle, 0);
    CHECK_INT(c.drop_last, 1);
    CHECK_INT(c.seed, 16);
    CHECK_STR(c.metrics_file, " m #1.jsonl");
    CHECK_STR(c.checkpoint, "a#b.ckpt"); /* '#' not after a blank is no comment */
    CHECK_INT(c.line[0], 0);             /* mode: default */
}

static void expect_error(const char *text, const char *want1, const char *want2)
{
    mgpu_cfg_t c;
    mgpu_err_t err = {0};
    CHECK_INT(parse(text, &c, &err), MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, want1);
    if (want2 != NULL)
        CHECK_CONTAINS(err.msg, want2);
}

static void test_value_errors(void)
{
    expect_error("lr = 0.1\noptimiser = adamw\n",
                 "t.cfg:2: unknown key 'optimiser' (did you mean "
                 "'optimizer'?)",
                 "accepted keys: mode, backend, dp_devices");
    expect_error("flux = 1\n", "t.cfg:1: unknown key 'flux'; accepted keys: mode", NULL);
    expect_error("\n\noptimizer = adam\n",
                 "t.cfg:3: optimizer = 'adam': expected one of sgd, adamw", NULL);
    expect_error("mode = ddp\nmode = dp\n", "t.cfg:2: mode is set twice (first at line 1)", NULL);
    expect_error("batch_size = 0\n", "t.cfg:1: batch_size = '0': expected an integer in [1, ",
                 NULL);
    expect_error("batch_size = 3.5\n", "batch_size = '3.5': expected an integer", NULL);
    expect_error("lr = fast\n", "t.cfg:1: lr = 'fast': expected a number in [0, ", NULL);
    expect_error("lr = nan\n", "lr = 'nan'", NULL);
    expect_error("shuffle = maybe\n", "shuffle = 'maybe': expected true or false", NULL);
    expect_error("seed = -1\n", "seed = '-1': expected an integer in [0, 2^64 - 1]", NULL);
    expect_error("model = mlp\nhidden = 64,,2\n", "t.cfg:2: hidden = '64,,2': expected layer sizes",
                 NULL);
    expect_error("model = mlp\nhidden = 64 x\n", "hidden = '64 x'", NULL);
    expect_error("optimizer = adamw\nbetas = 0.9\n", "t.cfg:2: betas = '0.9': expected two numbers",
                 NULL);
    expect_error("optimizer = adamw\nbetas = 0.9, 1.0\n", "expected two numbers in [0, 1)", NULL);
    expect_error("lr 0.1\n", "t.cfg:1: 'lr 0.1': expected 'key = value'", NULL);
    expect_error("= 3\n", "t.cfg:1: no key before '='", NULL);
    expect_error("lr =\n", "t.cfg:1: lr has no value", NULL);
    expect_error("activation = swish\nmodel = mlp\nhidden = 4\n",
                 "activation = 'swish': expected one of identity, relu, gelu, tanh, sigmoid", NULL);
    expect_error("precision = fp16\n", "expected one of fp32, tf32, bf16", NULL);
    expect_error("backend = mpi\n", "expected one of auto, cpu, nccl", NULL);
}

static void test_cross_key_errors(void)
{
    expect_error("model = mlp\n", "t.cfg:1: model = mlp needs hidden", NULL);
    expect_error("hidden = 8\n", "t.cfg:1: hidden is set but model = linear", NULL);
    expect_error("activation = tanh\n", "activation is set but model = linear", NULL);
    expect_error("optimizer = adamw\nmomentum = 0.9\n", "momentum, dampening and nesterov are sgd",
                 NULL);
    expect_error("betas = 0.9, 0.99\n", "betas and eps are adamw settings", NULL);
    expect_error("nesterov = true\n", "t.cfg:1: nesterov needs momentum > 0", NULL);
    expect_error("dataset = synthetic\nloss = mse\n",
                 "t.cfg:2: dataset = synthetic has labels only", NULL);
    expect_error("loss = cross_entropy\nclasses = 1\n",
                 "t.cfg:2: classes = 1 with loss = "
                 "cross_entropy",
                 NULL);
    expect_error("dataset = npy\n", "t.cfg:1: dataset = npy needs data_x", NULL);
    expect_error("dataset = npy\ndata_x = /nonexistent/x.npy\ndata_y = /nonexistent/y.npy\n",
                 "t.cfg:2: data_x = '/nonexistent/x.npy': No such file or directory", NULL);
    expect_error("data_x = x.npy\n", "t.cfg:1: data_x is only read with dataset = npy", NULL);
    expect_error("samples = 10\neval_fraction = 0.96\n", "eval_fraction = 0.96 of 10 samples",
                 NULL);
    expect_error("class_sep = 2\n", "need dataset = synthetic", NULL);
    expect_error("checkpoint_interval = 5\n", "t.cfg:1: checkpoint_interval is set but checkpoint",
                 NULL);
    expect_error("metrics_file = /nonexistent/dir/m.jsonl\n",
                 "t.cfg:1: metrics_file = '/nonexistent/dir/m.jsonl': directory '/nonexistent/dir'",
                 NULL);
    expect_error("dp_devices = 2\n", "dp_devices needs mode = dp", NULL);
}

static void test_files_and_paths(void)
{
    char dir[64] = "/tmp/mgpu_test_cfg.XXXXXX", p[256], sub[256];
    mgpu_cfg_t c;
    mgpu_err_t err = {0};
    CHECK(mkdtemp(dir) != NULL);
    snprintf(sub, sizeof sub, "%s/data", dir);
    CHECK(mkdir(sub, 0755) == 0);
    /* Data next to the cfg, named relative to it. */
    snprintf(p, sizeof p, "%s/data/x.npy", dir);
    FILE *f = fopen(p, "w");
    fclose(f);
    snprintf(p, sizeof p, "%s/data/y.npy", dir);
    f = fopen(p, "w");
    fclose(f);
    snprintf(p, sizeof p, "%s/run.cfg", dir);
    f = fopen(p, "w");
    fputs("dataset = npy\ndata_x = data/x.npy\ndata_y = data/y.npy\nloss = cross_entropy\n"
          "metrics_file = m.jsonl\n",
          f);
    fclose(f);
    CHECK_INT(mgpu_cfg_load(p, &c, &err), 0);
    if (err.msg[0])
        printf("  %s\n", err.msg);
    char want[700];
    snprintf(want, sizeof want, "%s/data/x.npy", dir);
    CHECK_STR(c.data_x, want);
    CHECK_STR(c.metrics_file, "m.jsonl"); /* outputs stay relative to the working directory */
    CHECK_INT(c.classes, 0);              /* npy: inferred from the labels */
    CHECK_STR(c.file, p);

    /* A relative data file that is not there: the message names the cfg line. */
    f = fopen(p, "w");
    fputs("dataset = npy\n# data\ndata_x = data/missing.npy\ndata_y = data/y.npy\n", f);
    fclose(f);
    CHECK_INT(mgpu_cfg_load(p, &c, &err), MGPU_E_CONFIG);
    snprintf(want, sizeof want, "%s:3: data_x = '%s/data/missing.npy': No such file", p, dir);
    CHECK_CONTAINS(err.msg, want);

    /* The cfg itself missing. */
    snprintf(p, sizeof p, "%s/nope.cfg", dir);
    CHECK_INT(mgpu_cfg_load(p, &c, &err), MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, "nope.cfg: cannot open the cfg: No such file or directory");
    /* A directory. */
    CHECK_INT(mgpu_cfg_load(dir, &c, &err), MGPU_E_CONFIG);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

static void test_overrides(void)
{
    mgpu_cfg_t c;
    mgpu_err_t err = {0};
    CHECK_INT(parse("lr = 0.1\nbatch_size = 8\n", &c, &err), 0);
    CHECK_INT(mgpu_cfg_override(&c, "lr=0.5", &err), 0);
    CHECK_INT(mgpu_cfg_override(&c, " batch_size = 16 ", &err), 0);
    CHECK(c.lr == 0.5);
    CHECK_INT(c.batch_size, 16);
    CHECK_INT(c.line[0 + 1], 0); /* backend untouched */
    CHECK_INT(mgpu_cfg_override(&c, "seed=010", &err), 0);
    CHECK_INT(c.seed, 10); /* decimal, not octal */
    CHECK_INT(mgpu_cfg_override(&c, "seed=0x1f", &err), 0);
    CHECK_INT(c.seed, 31);
    CHECK_INT(mgpu_cfg_override(&c, "lrr=1", &err), MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, "override 'lrr=1': unknown key 'lrr' (did you mean 'lr'?)");
    CHECK_INT(mgpu_cfg_override(&c, "epochs", &err), MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, "expected 'key = value'");
    CHECK_INT(mgpu_cfg_check(&c, &err), 0);
}

static void test_write_reads_back(void)
{
    const char *text = "dataset = synthetic\nsamples = 500\nfeatures = 7\nclasses = 3\n"
                       "model = mlp\nhidden = 16,8\nactivation = tanh\nloss = cross_entropy\n"
                       "optimizer = sgd\nmomentum = 0.9\nnesterov = true\nlr = 0.05\n"
                       "eval_fraction = 0.1\nseed = 12345678901234\nbucket_mb = 0.5\n"
                       "precision = bf16\ncheckpoint = c.ckpt\ncheckpoint_interval = 3\n";
    mgpu_cfg_t a, b;
    mgpu_err_t err = {0};
    char *buf = NULL;
    size_t len = 0;
    CHECK_INT(parse(text, &a, &err), 0);
    FILE *f = open_memstream(&buf, &len);
    mgpu_cfg_write(&a, f);
    fclose(f);
    CHECK_CONTAINS(buf, "# mode = ddp"); /* a default, commented out */
    CHECK_CONTAINS(buf, "\nhidden = 16,8");
    CHECK_CONTAINS(buf, "# adamw: beta1, beta2");
    CHECK_INT(parse(buf, &b, &err), 0);
    if (err.msg[0])
        printf("  %s\n", err.msg);
    /* Same settings; only the record of where they came from differs. */
    memset(a.line, 0, sizeof a.line);
    memset(b.line, 0, sizeof b.line);
    CHECK(memcmp(&a, &b, sizeof a) == 0);
    free(buf);
}

int main(void)
{
    RUN(test_defaults_are_the_demo);
    RUN(test_checked_in_configs_load);
    RUN(test_syntax);
    RUN(test_value_errors);
    RUN(test_cross_key_errors);
    RUN(test_files_and_paths);
    RUN(test_overrides);
    RUN(test_write_reads_back);
    return check_done();
}
