/* test_cfg.c - train.cfg: the checked-in configs load, every kind of mistake is an error
 * with file:line and the accepted values, paths resolve as documented, and mgpu_cfg_write's
 * output loads back to the same settings. */
#include "cfg.h"
#include "check.h"

#include <sys/resource.h> /* setrlimit */
#include <sys/stat.h>     /* mkdir, mkfifo */
#include <unistd.h>       /* getcwd, symlink, alarm */

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

/* A .npy v1.0 file of dtype descr and shape (numpy's text, e.g. "(2, 2)") over bytes of data. */
static void write_npy(const char *path, const char *descr, const char *shape, const void *data,
                      size_t bytes)
{
    char hdr[256];
    int n = snprintf(hdr, sizeof hdr, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                     descr, shape);
    int hlen = (10 + n + 1 + 63) / 64 * 64 - 10;
    memset(hdr + n, ' ', (size_t)(hlen - n - 1));
    hdr[hlen - 1] = '\n';
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)hlen, 0};
    FILE *f = fopen(path, "wb");
    fwrite(pre, 1, 10, f);
    fwrite(hdr, 1, (size_t)hlen, f);
    fwrite(data, 1, bytes, f);
    fclose(f);
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
    /* a known key with a part added */
    expect_error("checkpoint_dir = ck\n",
                 "t.cfg:1: unknown key 'checkpoint_dir' (did you mean 'checkpoint'?)", NULL);
    /* a known key with a part left off, and nanoGPT's and Hugging Face's names */
    expect_error("batch = 8\n", "t.cfg:1: unknown key 'batch' (did you mean 'batch_size'?)", NULL);
    expect_error("block_size = 1024\n",
                 "t.cfg:1: unknown key 'block_size' (did you mean 'context'?)", NULL);
    expect_error("vocab_size = 50304\n",
                 "t.cfg:1: unknown key 'vocab_size' (did you mean 'vocab'?)", NULL);
    expect_error("learning_rate = 6e-4\n",
                 "t.cfg:1: unknown key 'learning_rate' (did you mean 'lr'?)", NULL);
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
    expect_error("dataset = random\ndata_x = x.npy\n",
                 "t.cfg:2: data_x is only read with dataset = npy", NULL);
    /* a data file alone names its dataset (and a GPT's): the check goes on to the file */
    expect_error("data_x = x.npy\n", "t.cfg:1: data_x = 'x.npy': No such file", NULL);
    expect_error("data_tokens = /nonexistent/t.bin\nvocab = 64\n",
                 "t.cfg:1: data_tokens: /nonexistent/t.bin: cannot open data_tokens: No such",
                 NULL);
    expect_error("model = mlp\ndata_tokens = t.bin\n",
                 "dataset = tokens needs model = gpt (model is mlp)", NULL);
    expect_error("data_text = a.txt\ndata_tokens = t.bin\n", "needs model = gpt (model is linear)",
                 NULL);
    expect_error("samples = 10\neval_fraction = 0.96\n", "eval_fraction = 0.96 of 10 samples",
                 NULL);
    expect_error("class_sep = 2\n", "need dataset = synthetic", NULL);
    expect_error("checkpoint_interval = 5\n", "t.cfg:1: checkpoint_interval is set but checkpoint",
                 NULL);
    expect_error("metrics_file = /nonexistent/dir/m.jsonl\n",
                 "t.cfg:1: metrics_file = '/nonexistent/dir/m.jsonl': directory '/nonexistent/dir'",
                 NULL);
    expect_error("dp_devices = 2\n", "dp_devices needs mode = dp", NULL);
    expect_error("recompute = 1\n", "t.cfg:1: recompute needs model = gpt (model is linear)", NULL);
    expect_error("model = gpt\nrecompute = 3\n",
                 "t.cfg:2: recompute = '3': expected an integer in [0, 2]", NULL);
}

static void test_files_and_paths(void)
{
    char dir[64] = "/tmp/mgpu_test_cfg.XXXXXX", p[256], sub[256];
    mgpu_cfg_t c;
    mgpu_err_t err = {0};
    CHECK(mkdtemp(dir) != NULL);
    snprintf(sub, sizeof sub, "%s/data", dir);
    CHECK(mkdir(sub, 0755) == 0);
    /* Data next to the cfg, named relative to it (the check reads them: valid .npy files). */
    float x4[4] = {0, 1, 2, 3};
    int64_t y2[2] = {0, 1};
    snprintf(p, sizeof p, "%s/data/x.npy", dir);
    write_npy(p, "<f4", "(2, 2)", x4, sizeof x4);
    snprintf(p, sizeof p, "%s/data/y.npy", dir);
    write_npy(p, "<i8", "(2,)", y2, sizeof y2);
    snprintf(p, sizeof p, "%s/run.cfg", dir);
    FILE *f = fopen(p, "w");
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

/* A file of len bytes: text, then (if fill) fill repeated up to len. */
static void write_file(const char *path, const char *text, size_t len, char fill)
{
    FILE *f = fopen(path, "wb");
    size_t n = strlen(text);
    fwrite(text, 1, n, f);
    for (size_t i = n; i < len; i++)
        fputc(fill, f);
    fclose(f);
}

static char tdir[64];
static const char *in_tdir(const char *name)
{
    static char p[4][256];
    static int next;
    char *b = p[next++ % 4];
    if (tdir[0] == 0) {
        snprintf(tdir, sizeof tdir, "/tmp/mgpu_test_cfg.XXXXXX");
        CHECK(mkdtemp(tdir) != NULL);
    }
    snprintf(b, sizeof p[0], "%s/%s", tdir, name);
    return b;
}

static void rm_tdir(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tdir);
    CHECK(system(cmd) == 0);
}

static void expect_load_error(const char *path, const char *want)
{
    mgpu_cfg_t c;
    mgpu_err_t err = {0};
    CHECK_INT(mgpu_cfg_load(path, &c, &err), MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, want);
}

/* A FIFO, a link to a device and a directory are refused by name before anything reads them
 * (a FIFO would block the reader until a writer came); an empty regular file is the
 * defaults. */
static void test_special_files(void)
{
    char want[400];
    mgpu_cfg_t c;
    mgpu_err_t err = {0};
    alarm(20); /* a blocked open or read fails the test instead of hanging it */
    CHECK(mkfifo(in_tdir("fifo.cfg"), 0600) == 0);
    snprintf(want, sizeof want, "%s: is a FIFO, not a regular file", in_tdir("fifo.cfg"));
    expect_load_error(in_tdir("fifo.cfg"), want);
    CHECK(symlink("/dev/zero", in_tdir("zero.cfg")) == 0);
    snprintf(want, sizeof want, "%s -> /dev/zero: is a character device, not a regular file",
             in_tdir("zero.cfg"));
    expect_load_error(in_tdir("zero.cfg"), want);
    CHECK(symlink("/dev/null", in_tdir("null.cfg")) == 0);
    expect_load_error(in_tdir("null.cfg"), "is a character device, not a regular file");
    CHECK(mkdir(in_tdir("dir.cfg"), 0755) == 0);
    snprintf(want, sizeof want, "%s: is a directory, not a regular file", in_tdir("dir.cfg"));
    expect_load_error(in_tdir("dir.cfg"), want);
    write_file(in_tdir("empty.cfg"), "", 0, 0);
    CHECK_INT(mgpu_cfg_load(in_tdir("empty.cfg"), &c, &err), 0);
    CHECK_INT(c.batch_size, 30);
    CHECK(symlink("empty.cfg", in_tdir("link.cfg")) == 0); /* a link to a regular file is one */
    CHECK_INT(mgpu_cfg_load(in_tdir("link.cfg"), &c, &err), 0);
    rm_tdir();
}

/* Text that is not text, and lines and files too long: each error names its line. */
static void test_text_errors(void)
{
    mgpu_cfg_t c;
    mgpu_err_t err = {0};
    char want[400];
    FILE *f = fopen(in_tdir("nul.cfg"), "wb");
    fwrite("lr = 0.1\nseed = 1\0\0\n", 1, 20, f);
    fclose(f);
    snprintf(want, sizeof want, "%s:2: not a text file: a NUL byte at column 9",
             in_tdir("nul.cfg"));
    expect_load_error(in_tdir("nul.cfg"), want);
    expect_error("lr = 0.1\n\nseed = 1\x01\n", "t.cfg:3: not a text file: byte 0x01 at column 9",
                 NULL);
    expect_error("# \xc3\x28\n", "t.cfg:1: not a text file: byte 0xc3 at column 3", NULL);
    expect_error("lr = 0.1 # \xed\xa0\x80\n", "t.cfg:1: not a text file", NULL); /* surrogate */
    expect_error("lr = 0.1\x7f\n", "t.cfg:1: not a text file: byte 0x7f", NULL);
    CHECK_INT(parse("\xef\xbb\xbf# caf\xc3\xa9 \xe2\x9c\x93\r\nlr = 0.5\n", &c, &err), 0);
    CHECK(c.lr == 0.5); /* a byte order mark, UTF-8 and CRLF are text */

    /* A 10 MB line, a 2 MB comment, a file over 1 MiB of short lines. */
    write_file(in_tdir("long.cfg"), "lr = 0.1\nseed = 1", 10 << 20, '7');
    snprintf(want, sizeof want, "%s:2: line longer than the limit of 4095 bytes",
             in_tdir("long.cfg"));
    expect_load_error(in_tdir("long.cfg"), want);
    write_file(in_tdir("comment.cfg"), "# ", 2 << 20, 'c');
    expect_load_error(in_tdir("comment.cfg"), "comment.cfg:1: line longer than the limit");
    f = fopen(in_tdir("many.cfg"), "w");
    for (int i = 0; i < 100000; i++)
        fprintf(f, "# line %d\n", i);
    fclose(f);
    expect_load_error(in_tdir("many.cfg"), "many.cfg:81515: the cfg goes on past 1048576 bytes");
    /* 1 MiB is the limit: blank lines up to it are fine, one byte more is not. */
    write_file(in_tdir("max.cfg"), "lr = 0.5\n", 1 << 20, '\n');
    CHECK_INT(mgpu_cfg_load(in_tdir("max.cfg"), &c, &err), 0);
    CHECK(c.lr == 0.5);
    write_file(in_tdir("max.cfg"), "lr = 0.5\n", (1 << 20) + 1, '\n');
    expect_load_error(in_tdir("max.cfg"), "max.cfg:1048569: the cfg goes on past");

    /* Long keys and values are refused with their size; messages quote 80 bytes at most. */
    char line[5000];
    snprintf(line, sizeof line, "lr = %02000d\n", 1);
    expect_error(line, "t.cfg:1: lr: a value of 2000 bytes, expected at most 1023", NULL);
    snprintf(line, sizeof line, "k%0200d = 1\n", 1);
    CHECK_INT(parse(line, &c, &err), MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, "t.cfg:1: unknown key 'k000");
    CHECK_CONTAINS(err.msg, "...' (201 bytes long)");
    CHECK(strlen(err.msg) < 200);
    memset(line, 'x', 4000);
    line[4000] = 0;
    CHECK_INT(parse(line, &c, &err), MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, "t.cfg:1: 'xxx");
    CHECK_CONTAINS(err.msg, "...': expected 'key = value'");
    CHECK(strlen(err.msg) < 200);
    rm_tdir();
}

/* A problem between keys is at the line of the one written last; the others' lines follow. */
static void test_cross_key_lines(void)
{
    mgpu_cfg_t c;
    mgpu_err_t err = {0};
    expect_error("class_sep = 2\n", "t.cfg:1: clusters_per_class, class_sep and cluster_std need",
                 NULL);
    expect_error("dataset = random\nclass_sep = 2\n",
                 "t.cfg:2: clusters_per_class, class_sep and cluster_std need dataset = "
                 "synthetic (dataset at line 1)",
                 NULL);
    expect_error("class_sep = 2\n\ndataset = random\ncluster_std = 3\n",
                 "t.cfg:4: clusters_per_class, class_sep and cluster_std need dataset = "
                 "synthetic (dataset at line 3, class_sep at line 1)",
                 NULL);
    expect_error("dataset = synthetic\n", "t.cfg:1: dataset = synthetic has labels only", NULL);
    expect_error("loss = mse\ndataset = synthetic\n",
                 "t.cfg:2: dataset = synthetic has labels only, expected loss = cross_entropy "
                 "(loss at line 1)",
                 NULL);
    expect_error("checkpoint = c.ck\nmode = dp\n",
                 "t.cfg:2: checkpoint is not supported with mode = dp; use mode = ddp or remove "
                 "checkpoint (checkpoint at line 1)",
                 NULL);
    expect_error("mode = dp\ndp_devices = 100\n",
                 "t.cfg:2: dp_devices = '100': expected an "
                 "integer in [0, 64]",
                 NULL);
    expect_error("metrics_file = /tmp\n",
                 "t.cfg:1: metrics_file = '/tmp': is a directory, expected a file", NULL);
    expect_error("samples = 1000000000000000\nfeatures = 1000\n",
                 "t.cfg:2: samples = 1000000000000000 of 1000 features (and 2 outputs) need ",
                 NULL);
    expect_error("model = mlp\nhidden = 16777216,16777216\n",
                 "t.cfg:2: the model's 281475127705602 parameters need ", NULL);
    /* Overrides are "command line", with the file's lines of the other keys. */
    CHECK_INT(parse("dataset = synthetic\nloss = cross_entropy\n", &c, &err), 0);
    CHECK_INT(mgpu_cfg_override(&c, "loss=mse", &err), 0);
    CHECK_INT(mgpu_cfg_check(&c, &err), MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, "command line: dataset = synthetic has labels only, expected loss = "
                            "cross_entropy (dataset at line 1)");
    CHECK_INT(mgpu_cfg_override(&c, "lrr=1", &err), MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, "command line: override 'lrr=1': unknown key 'lrr'");
    char big[5000];
    memset(big, 'y', sizeof big - 1);
    big[sizeof big - 1] = 0;
    CHECK_INT(mgpu_cfg_override(&c, big, &err), MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, "command line: override 'yyy");
    CHECK_CONTAINS(err.msg, "of 4999 bytes, longer than the limit of 4095");
    CHECK_INT(mgpu_cfg_override(&c, "lr=0.1\x1b", &err), MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, "command line: override of 7 bytes: byte 0x1b at column 7");
}

/* Data files: every problem of the .npy files is found by the check, at the cfg's line of
 * data_x or data_y, and a header that promises more than the file holds allocates nothing. */
static void test_data_file_errors(void)
{
    mgpu_cfg_t c;
    mgpu_err_t err = {0};
    char text[1024], want[1024];
    float x[12] = {0};
    int64_t y[4] = {0, 1, 0, 1}, y5[4] = {0, 5, 1, 1};
    write_npy(in_tdir("x.npy"), "<f4", "(4, 3)", x, sizeof x);
    write_npy(in_tdir("y.npy"), "<i8", "(4,)", y, sizeof y);
    write_npy(in_tdir("y3.npy"), "<i8", "(3,)", y, 3 * sizeof y[0]);
    write_npy(in_tdir("y5.npy"), "<i8", "(4,)", y5, sizeof y5);
    write_npy(in_tdir("trunc.npy"), "<f4", "(4, 3)", x, sizeof x - 4);
    write_npy(in_tdir("huge.npy"), "<f4", "(4611686018427387904, 4)", x, sizeof x);
    write_npy(in_tdir("big.npy"), "<f4", "(1099511627776, 4)", x, sizeof x);
    CHECK(mkfifo(in_tdir("fifo.npy"), 0600) == 0);
    CHECK(mkdir(in_tdir("d"), 0755) == 0);
    alarm(20);
    /* With the address space capped at 4 GiB an allocation sized by a header fails instead of
     * succeeding lazily: the check must say what is wrong before any such allocation. (ASan
     * reserves terabytes of shadow at start, and aborts on an oversized malloc by itself.) */
#ifndef __SANITIZE_ADDRESS__
    struct rlimit rl = {1UL << 32, 1UL << 32};
    setrlimit(RLIMIT_AS, &rl);
#endif
    const char *fmt = "dataset = npy\ndata_x = %s\ndata_y = %s\nloss = cross_entropy\n%s";
#define NPY_CASE(xf, yf, extra, ...)                                                               \
    do {                                                                                           \
        snprintf(text, sizeof text, fmt, xf, yf, extra);                                           \
        snprintf(want, sizeof want, __VA_ARGS__);                                                  \
        expect_error(text, want, NULL);                                                            \
    } while (0)
    NPY_CASE(".", in_tdir("y.npy"), "", "t.cfg:2: data_x: .: is a directory, not a regular file");
    NPY_CASE(in_tdir("d"), in_tdir("y.npy"), "", "t.cfg:2: data_x: %s: is a directory",
             in_tdir("d"));
    NPY_CASE(in_tdir("fifo.npy"), in_tdir("y.npy"), "", "t.cfg:2: data_x: %s: is a FIFO, not",
             in_tdir("fifo.npy"));
    NPY_CASE("/dev/zero", in_tdir("y.npy"), "", "t.cfg:2: data_x: /dev/zero: is a character");
    NPY_CASE(in_tdir("trunc.npy"), in_tdir("y.npy"), "",
             "t.cfg:2: data_x: %s: 44 bytes of data, expected 48 (12 elements of <f4): truncated",
             in_tdir("trunc.npy"));
    NPY_CASE(in_tdir("huge.npy"), in_tdir("y.npy"), "",
             "t.cfg:2: data_x: %s: 48 bytes of data, but the shape in", in_tdir("huge.npy"));
    NPY_CASE(in_tdir("big.npy"), in_tdir("y.npy"), "",
             "t.cfg:2: data_x: %s: 48 bytes of data, expected 17592186044416", in_tdir("big.npy"));
    NPY_CASE(in_tdir("x.npy"), ".", "", "t.cfg:3: data_y: .: is a directory");
    NPY_CASE(in_tdir("x.npy"), in_tdir("y3.npy"), "",
             "t.cfg:3: data_y: %s: shape (3), expected (N) or (N, 1) with N = 4",
             in_tdir("y3.npy"));
    NPY_CASE(in_tdir("x.npy"), in_tdir("y5.npy"), "classes = 3\n",
             "t.cfg:3: data_y: %s: label 5 at sample 1, expected 0..2", in_tdir("y5.npy"));
    NPY_CASE(in_tdir("x.npy"), in_tdir("y.npy"), "eval_fraction = 0.9\n",
             "t.cfg:5: eval_fraction = 0.9 of the 4 samples of data_x leaves none to train on "
             "(data_x at line 2)");
    snprintf(text, sizeof text, fmt, in_tdir("x.npy"), in_tdir("y.npy"), "");
    CHECK_INT(parse(text, &c, &err), 0);
    rm_tdir();
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

/* configs/gpt_text.cfg: the GPT's keys, what the check derives for model = gpt (vocab 256 for
 * text, adamw, a run as long as max_steps), and mgpu_cfg_write's output reading back. */
static void test_gpt_config_loads_and_writes_back(void)
{
    char p[1024], text[8192];
    mgpu_cfg_t a, b;
    mgpu_err_t err = {0};
    if (access("/usr/share/common-licenses/GPL-3", R_OK) != 0)
        SKIP("/usr/share/common-licenses/GPL-3 (gpt_text.cfg's data) is not here");
    snprintf(p, sizeof p, "%s/configs/gpt_text.cfg", root());
    FILE *f = fopen(p, "r");
    CHECK(f != NULL);
    if (f == NULL)
        return;
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    CHECK_INT(parse(text, &a, &err), 0);
    if (err.msg[0])
        printf("  %s\n", err.msg);
    CHECK_INT(a.model, MGPU_MODEL_GPT);
    CHECK_INT(a.dataset, MGPU_DATASET_TEXT);
    CHECK_INT(a.vocab, 256);
    CHECK_INT(a.optimizer, MGPU_OPTIM_ADAMW);
    CHECK_INT(a.epochs, a.max_steps);
    CHECK_INT(a.n_embd % a.n_head, 0);
    CHECK(a.lr_min < a.lr && a.grad_clip == 1.0 && a.top_k == 40);
    CHECK_STR(a.prompt, "The program");
    /* without model and dataset: data_text names both */
    char *bare = strdup(text), *at;
    while ((at = strstr(bare, "\nmodel = gpt")) != NULL ||
           (at = strstr(bare, "\ndataset =")) != NULL)
        at[1] = '#';
    CHECK_INT(parse(bare, &b, &err), 0);
    CHECK_INT(b.model, MGPU_MODEL_GPT);
    CHECK_INT(b.dataset, MGPU_DATASET_TEXT);
    free(bare);
    char *buf = NULL;
    size_t len = 0;
    f = open_memstream(&buf, &len);
    mgpu_cfg_write(&a, f);
    fclose(f);
    CHECK_CONTAINS(buf, "\nmodel = gpt\n");
    CHECK_CONTAINS(buf, "\nprompt = The program\n");
    CHECK_CONTAINS(buf, "# grad_accum = 1");
    CHECK_INT(parse(buf, &b, &err), 0);
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
    RUN(test_special_files);
    RUN(test_text_errors);
    RUN(test_cross_key_lines);
    RUN(test_data_file_errors);
    RUN(test_overrides);
    RUN(test_write_reads_back);
    RUN(test_gpt_config_loads_and_writes_back);
    return check_done();
}
