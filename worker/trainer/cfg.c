/* cfg.c - train.cfg: one table describes every key (type, field, accepted values, range,
 * documentation), and the parser, the error messages and mgpu_cfg_write all read it, so a
 * new key is one line here and one in configs/README.md. */
#include "cfg.h"

#include <errno.h>   /* errno */
#include <limits.h>  /* INT_MAX */
#include <math.h>    /* isfinite */
#include <stddef.h>  /* offsetof */
#include <stdlib.h>  /* strtod, strtoll */
#include <string.h>  /* strchr, strlen */
#include <strings.h> /* strcasecmp */
#include <unistd.h>  /* access */

typedef enum ktype {
    T_ENUM,    /* int-sized enum field, value one of names[] */
    T_INT,     /* int */
    T_LL,      /* long long */
    T_U64,     /* uint64_t */
    T_DBL,     /* double */
    T_BOOL,    /* int 0/1 */
    T_PATH,    /* char[MGPU_CFG_PATH_MAX], an input: resolved against the cfg's directory */
    T_OUTPATH, /* char[MGPU_CFG_PATH_MAX], an output: kept as written (the working directory) */
    T_HIDDEN,  /* "256,256" into hidden[] and n_hidden */
    T_BETAS,   /* "0.9, 0.999" into beta1, beta2 */
} ktype_t;

typedef struct cfg_key {
    const char *name;
    ktype_t type;
    size_t off;
    const char *const *names; /* T_ENUM: accepted values, in enum order, NULL-terminated */
    double min, max;          /* T_INT, T_LL, T_DBL: inclusive range */
    const char *doc;
} cfg_key_t;

_Static_assert(sizeof(mgpu_cfg_mode_t) == sizeof(int) && sizeof(mgpu_act_t) == sizeof(int) &&
                   sizeof(mgpu_backend_t) == sizeof(int),
               "T_ENUM fields are written as int");

static const char *const mode_names[] = {"ddp", "dp", NULL};
static const char *const backend_names[] = {"auto", "cpu", "nccl", NULL};
static const char *const prec_names[] = {"fp32", "tf32", "bf16", NULL};
static const char *const dataset_names[] = {"random", "synthetic", "npy", NULL};
static const char *const model_names[] = {"linear", "mlp", NULL};
static const char *const act_names[] = {"identity", "relu", "gelu", "tanh", "sigmoid", NULL};
static const char *const loss_names[] = {"mse", "cross_entropy", NULL};
static const char *const optim_names[] = {"sgd", "adamw", NULL};

#define F(field) offsetof(mgpu_cfg_t, field)
#define BIG 1e15 /* "no practical limit" for long long keys */

/* The order is the order of mgpu_cfg_write and configs/README.md. */
static const cfg_key_t keys[] = {
    {"mode", T_ENUM, F(mode), mode_names, 0, 0,
     "ddp: one process per device, gradients all-reduced (DistributedDataParallel); dp: one "
     "process drives all devices (DataParallel)"},
    {"backend", T_ENUM, F(backend), backend_names, 0, 0,
     "collectives: auto picks nccl when the worker has a GPU, cpu otherwise"},
    {"dp_devices", T_INT, F(dp_devices), NULL, 0, 1024,
     "mode = dp: devices to use (threads stand in for them on a CPU); 0 = all visible, 2 on a "
     "CPU"},
    {"precision", T_ENUM, F(precision), prec_names, 0, 0,
     "GEMM precision on a GPU: fp32, tf32 (default), bf16 with fp32 master weights; the CPU "
     "always computes fp32"},
    {"timeout", T_DBL, F(timeout_s), NULL, 0.001, 86400,
     "seconds a collective may take before the run fails naming the missing ranks"},
    {"dataset", T_ENUM, F(dataset), dataset_names, 0, 0,
     "random: the article's RandomDataset; synthetic: Gaussian clusters; npy: data_x/data_y "
     "files"},
    {"samples", T_LL, F(samples), NULL, 1, BIG, "random/synthetic: number of samples"},
    {"features", T_INT, F(features), NULL, 1, 1 << 24,
     "random/synthetic: values per sample (the model's input size)"},
    {"classes", T_INT, F(classes), NULL, 0, 1 << 24,
     "cross_entropy: number of classes; mse: target size (the model's output size); npy: 0 = "
     "max label + 1"},
    {"data_seed", T_U64, F(data_seed), NULL, 0, 0,
     "seed of the generated data set and of the held-out split"},
    {"data_x", T_PATH, F(data_x), NULL, 0, 0,
     "npy: features, shape (N, ...) of float32/float64/int64/int32/int16/uint8/int8"},
    {"data_y", T_PATH, F(data_y), NULL, 0, 0,
     "npy: labels (N) of integers for cross_entropy, or targets (N) / (N, T) for mse"},
    {"eval_fraction", T_DBL, F(eval_fraction), NULL, 0, 0.99,
     "share of the samples held out for evaluation (0: no evaluation)"},
    {"clusters_per_class", T_INT, F(clusters_per_class), NULL, 1, 1024,
     "synthetic: Gaussian clusters per class"},
    {"class_sep", T_DBL, F(class_sep), NULL, 1e-6, 1e6,
     "synthetic: standard deviation of the cluster centers (larger: easier)"},
    {"cluster_std", T_DBL, F(cluster_std), NULL, 0, 1e6,
     "synthetic: standard deviation of the samples around their center"},
    {"model", T_ENUM, F(model), model_names, 0, 0,
     "linear: one nn.Linear(features, classes); mlp: hidden layers with an activation"},
    {"hidden", T_HIDDEN, F(hidden), NULL, 1, 1 << 24,
     "mlp: sizes of the hidden layers, comma-separated, e.g. 256,256"},
    {"activation", T_ENUM, F(activation), act_names, 0, 0,
     "mlp: activation after each hidden layer (gelu is the tanh approximation)"},
    {"loss", T_ENUM, F(loss), loss_names, 0, 0,
     "mse: nn.MSELoss (mean); cross_entropy: nn.CrossEntropyLoss (mean)"},
    {"optimizer", T_ENUM, F(optimizer), optim_names, 0, 0,
     "sgd: torch.optim.SGD; adamw: torch.optim.AdamW"},
    {"lr", T_DBL, F(lr), NULL, 0, 1e6, "learning rate"},
    {"momentum", T_DBL, F(momentum), NULL, 0, 1, "sgd: momentum (0: none)"},
    {"dampening", T_DBL, F(dampening), NULL, 0, 1, "sgd: dampening of the momentum"},
    {"nesterov", T_BOOL, F(nesterov), NULL, 0, 0, "sgd: Nesterov momentum"},
    {"weight_decay", T_DBL, F(weight_decay), NULL, 0, 1e6,
     "sgd: L2 added to the gradient (default 0); adamw: decoupled decay (default 0.01)"},
    {"betas", T_BETAS, F(beta1), NULL, 0, 0, "adamw: beta1, beta2 in [0, 1)"},
    {"eps", T_DBL, F(eps), NULL, 1e-30, 1, "adamw: epsilon"},
    {"batch_size", T_LL, F(batch_size), NULL, 1, 1 << 30,
     "samples per rank per step (the global batch is batch_size x world size)"},
    {"epochs", T_LL, F(epochs), NULL, 1, BIG, "passes over the training set"},
    {"max_steps", T_LL, F(max_steps), NULL, 0, BIG,
     "stop after this many optimizer steps (0: run all epochs)"},
    {"shuffle", T_BOOL, F(shuffle), NULL, 0, 0,
     "DistributedSampler(shuffle=): a new permutation from seed + epoch every epoch"},
    {"seed", T_U64, F(seed), NULL, 0, 0, "seed of the sampler's shuffle and of the parameter init"},
    {"drop_last", T_BOOL, F(drop_last), NULL, 0, 0,
     "DistributedSampler(drop_last=): drop the tail instead of padding to a multiple of the "
     "world size"},
    {"drop_last_batch", T_BOOL, F(drop_last_batch), NULL, 0, 0,
     "DataLoader(drop_last=): drop each rank's last, smaller batch"},
    {"bucket_mb", T_DBL, F(bucket_mb), NULL, 0.001, 1e6,
     "DDP gradient bucket size in MiB (PyTorch's bucket_cap_mb)"},
    {"bucket_overlap", T_BOOL, F(bucket_overlap), NULL, 0, 0,
     "GPU: all-reduce each bucket as soon as backward has made it, during the rest of "
     "backward (false: all buckets after backward, to measure what the overlap buys)"},
    {"log_interval", T_LL, F(log_interval), NULL, 0, BIG,
     "steps between rank 0's progress lines (0: none)"},
    {"eval_interval", T_LL, F(eval_interval), NULL, 0, BIG,
     "epochs between evaluations on the held-out set (0: only at the end)"},
    {"metrics_file", T_OUTPATH, F(metrics_file), NULL, 0, 0,
     "JSON lines of metrics written by rank 0 (empty: none)"},
    {"checkpoint", T_OUTPATH, F(checkpoint), NULL, 0, 0,
     "checkpoint file, written atomically by rank 0 and resumed from at start (empty: none)"},
    {"checkpoint_interval", T_LL, F(checkpoint_interval), NULL, 0, BIG,
     "steps between checkpoints (0: at the end of every epoch)"},
    {"demo_prints", T_BOOL, F(demo_prints), NULL, 0, 0,
     "print the article's lines per batch: \"In Model: input size ...\" and \"Outside: ...\""},
    {"cuda_graph", T_BOOL, F(cuda_graph), NULL, 0, 0,
     "GPU: after a warm-up step, capture the whole step (forward, backward, all-reduce, update) "
     "in a CUDA graph and replay it; needs full batches (drop_last_batch or a batch size that "
     "divides each rank's samples); sgd and adamw"},
    {"timing_warmup", T_LL, F(timing_warmup), NULL, 0, BIG,
     "time the steps after the first timing_warmup ones (CUDA events on a GPU): a \"step time\" "
     "line and step_us in the final metrics line (0: no timing)"},
};
#define N_KEYS (sizeof keys / sizeof keys[0])
_Static_assert(sizeof keys / sizeof keys[0] <= sizeof(((mgpu_cfg_t *)0)->line) / sizeof(int),
               "mgpu_cfg_t.line has a slot per key");

static int key_index(const char *name)
{
    for (size_t i = 0; i < N_KEYS; i++)
        if (strcmp(keys[i].name, name) == 0)
            return (int)i;
    return -1;
}

static int line_of(const mgpu_cfg_t *cfg, const char *name)
{
    return cfg->line[key_index(name)];
}

void mgpu_cfg_defaults(mgpu_cfg_t *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->mode = MGPU_MODE_DDP;
    cfg->backend = MGPU_BACKEND_AUTO;
    cfg->precision = MGPU_PREC_TF32;
    cfg->timeout_s = 300;
    cfg->dataset = MGPU_DATASET_RANDOM;
    cfg->samples = 90;
    cfg->features = 5;
    cfg->classes = 2;
    cfg->clusters_per_class = 2;
    cfg->class_sep = 1.0;
    cfg->cluster_std = 1.0;
    cfg->model = MGPU_MODEL_LINEAR;
    cfg->activation = MGPU_ACT_RELU;
    cfg->loss = MGPU_LOSS_MSE;
    cfg->optimizer = MGPU_OPTIM_SGD;
    cfg->lr = 0.01;
    cfg->beta1 = 0.9;
    cfg->beta2 = 0.999;
    cfg->eps = 1e-8;
    cfg->batch_size = 30;
    cfg->epochs = 1;
    cfg->shuffle = 1;
    cfg->bucket_mb = 25;
    cfg->bucket_overlap = 1;
    cfg->log_interval = 10;
    cfg->eval_interval = 1;
    cfg->cuda_graph = 1;
    snprintf(cfg->file, sizeof cfg->file, "(defaults)");
}

/* --- values -------------------------------------------------------------------------------- */

static void list_names(const char *const *names, char *buf, size_t len)
{
    buf[0] = 0;
    for (int i = 0; names[i] != NULL; i++)
        snprintf(buf + strlen(buf), len - strlen(buf), "%s%s", i ? ", " : "", names[i]);
}

static int parse_ll(const char *v, long long *out)
{
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end != 0 || errno != 0)
        return -1;
    *out = x;
    return 0;
}

static int parse_double(const char *v, double *out)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || *end != 0 || errno != 0 || !isfinite(x))
        return -1;
    *out = x;
    return 0;
}

static int parse_bool(const char *v)
{
    static const char *const yes[] = {"true", "yes", "on", "1"}, *const no[] = {"false", "no",
                                                                                "off", "0"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(v, yes[i]) == 0)
            return 1;
        if (strcasecmp(v, no[i]) == 0)
            return 0;
    }
    return -1;
}

/* "where" is "file:line" (or "command line") for messages. */
static int set_value(mgpu_cfg_t *cfg, const cfg_key_t *k, const char *v, const char *base_dir,
                     const char *where, mgpu_err_t *err)
{
    char *field = (char *)cfg + k->off;
    char accepted[256];

    if (*v == 0 && k->type != T_PATH && k->type != T_OUTPATH)
        return mgpu_err_set(err, MGPU_E_CONFIG, "%s: %s has no value (%s)", where, k->name, k->doc);
    switch (k->type) {
    case T_ENUM:
        for (int i = 0; k->names[i] != NULL; i++)
            if (strcasecmp(v, k->names[i]) == 0) {
                memcpy(field, &i, sizeof i);
                return 0;
            }
        list_names(k->names, accepted, sizeof accepted);
        return mgpu_err_set(err, MGPU_E_CONFIG, "%s: %s = '%s': expected one of %s", where, k->name,
                            v, accepted);
    case T_INT:
    case T_LL: {
        long long x;
        if (parse_ll(v, &x) < 0 || x < k->min || x > k->max)
            return mgpu_err_set(err, MGPU_E_CONFIG,
                                "%s: %s = '%s': expected an integer in [%.0f, %.0f]", where,
                                k->name, v, k->min, k->max);
        if (k->type == T_INT) {
            int i = (int)x;
            memcpy(field, &i, sizeof i);
        } else {
            memcpy(field, &x, sizeof x);
        }
        return 0;
    }
    case T_U64: {
        char *end;
        errno = 0;
        /* Decimal, or hex with 0x; never octal ("010" is ten, as anyone reading it expects). */
        int hex = v[0] == '0' && (v[1] == 'x' || v[1] == 'X');
        unsigned long long x = strtoull(v, &end, hex ? 16 : 10);
        if (end == v || *end != 0 || errno != 0 || *v == '-')
            return mgpu_err_set(err, MGPU_E_CONFIG,
                                "%s: %s = '%s': expected an integer in [0, 2^64 - 1]", where,
                                k->name, v);
        uint64_t u = x;
        memcpy(field, &u, sizeof u);
        return 0;
    }
    case T_DBL: {
        double x;
        if (parse_double(v, &x) < 0 || x < k->min || x > k->max)
            return mgpu_err_set(err, MGPU_E_CONFIG, "%s: %s = '%s': expected a number in [%g, %g]",
                                where, k->name, v, k->min, k->max);
        memcpy(field, &x, sizeof x);
        return 0;
    }
    case T_BOOL: {
        int b = parse_bool(v);
        if (b < 0)
            return mgpu_err_set(err, MGPU_E_CONFIG,
                                "%s: %s = '%s': expected true or false (also yes/no, on/off, 1/0)",
                                where, k->name, v);
        memcpy(field, &b, sizeof b);
        return 0;
    }
    case T_PATH:
    case T_OUTPATH: {
        int n;
        if (*v == 0 || *v == '/' || base_dir == NULL || *base_dir == 0 || k->type == T_OUTPATH)
            n = snprintf(field, MGPU_CFG_PATH_MAX, "%s", v);
        else
            n = snprintf(field, MGPU_CFG_PATH_MAX, "%s/%s", base_dir, v);
        if (n >= MGPU_CFG_PATH_MAX)
            return mgpu_err_set(err, MGPU_E_CONFIG, "%s: %s: path longer than %d bytes", where,
                                k->name, MGPU_CFG_PATH_MAX - 1);
        return 0;
    }
    case T_HIDDEN: {
        int n = 0;
        const char *p = v;
        for (;;) {
            char *end;
            while (*p == ' ' || *p == '\t')
                p++;
            errno = 0;
            long x = strtol(p, &end, 10);
            if (end == p || errno != 0 || x < k->min || x > k->max)
                return mgpu_err_set(err, MGPU_E_CONFIG,
                                    "%s: hidden = '%s': expected layer sizes in [1, %.0f] "
                                    "separated by commas, e.g. 256,256",
                                    where, v, k->max);
            if (n == MGPU_MODEL_MAX_LAYERS - 1)
                return mgpu_err_set(err, MGPU_E_CONFIG, "%s: hidden = '%s': more than %d layers",
                                    where, v, MGPU_MODEL_MAX_LAYERS - 1);
            cfg->hidden[n++] = (int)x;
            p = end;
            while (*p == ' ' || *p == '\t')
                p++;
            if (*p == 0)
                break;
            if (*p != ',')
                return mgpu_err_set(err, MGPU_E_CONFIG,
                                    "%s: hidden = '%s': expected layer sizes separated by "
                                    "commas, e.g. 256,256",
                                    where, v);
            p++;
        }
        cfg->n_hidden = n;
        return 0;
    }
    case T_BETAS: {
        char a[64], b[64];
        const char *comma = strchr(v, ',');
        double b1, b2;
        if (comma == NULL || (size_t)(comma - v) >= sizeof a || strlen(comma + 1) >= sizeof b)
            goto bad_betas;
        snprintf(a, sizeof a, "%.*s", (int)(comma - v), v);
        snprintf(b, sizeof b, "%s", comma + 1);
        /* strtod skips leading spaces; trailing ones are trimmed here. */
        for (char *s = a + strlen(a); s > a && (s[-1] == ' ' || s[-1] == '\t');)
            *--s = 0;
        if (parse_double(a, &b1) < 0 || parse_double(b, &b2) < 0 || b1 < 0 || b1 >= 1 || b2 < 0 ||
            b2 >= 1)
            goto bad_betas;
        cfg->beta1 = b1;
        cfg->beta2 = b2;
        return 0;
    bad_betas:
        return mgpu_err_set(err, MGPU_E_CONFIG,
                            "%s: betas = '%s': expected two numbers in [0, 1), e.g. 0.9, 0.999",
                            where, v);
    }
    }
    return mgpu_err_set(err, MGPU_E_CONFIG, "%s: %s: internal error (type %d)", where, k->name,
                        (int)k->type);
}

/* --- lines --------------------------------------------------------------------------------- */

static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b), row[64];
    if (la >= 63 || lb >= 63)
        return 99;
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

static int unknown_key(const char *where, const char *key, mgpu_err_t *err)
{
    char list[1024] = "";
    const char *best = NULL;
    size_t best_d = 3;
    for (size_t i = 0; i < N_KEYS; i++) {
        size_t d = edit_distance(key, keys[i].name);
        if (d < best_d)
            best_d = d, best = keys[i].name;
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "",
                 keys[i].name);
    }
    if (best != NULL)
        return mgpu_err_set(err, MGPU_E_CONFIG,
                            "%s: unknown key '%s' (did you mean '%s'?); accepted keys: %s", where,
                            key, best, list);
    return mgpu_err_set(err, MGPU_E_CONFIG, "%s: unknown key '%s'; accepted keys: %s", where, key,
                        list);
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t' || *s == '\r')
        s++;
    char *e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r' || e[-1] == '\n'))
        *--e = 0;
    return s;
}

/* One "key = value" line (already stripped of its comment); lineno < 0: an override. */
static int parse_line(mgpu_cfg_t *cfg, char *text, const char *name, int lineno,
                      const char *base_dir, mgpu_err_t *err)
{
    char where[MGPU_CFG_PATH_MAX + 32];
    char *eq = strchr(text, '='), *key, *val;
    int ki;

    if (lineno >= 0)
        snprintf(where, sizeof where, "%s:%d", name, lineno);
    else
        snprintf(where, sizeof where, "override '%s'", text);
    if (eq == NULL)
        return mgpu_err_set(err, MGPU_E_CONFIG, "%s: '%s': expected 'key = value'", where,
                            trim(text));
    *eq = 0;
    key = trim(text);
    val = trim(eq + 1);
    if (*key == 0)
        return mgpu_err_set(err, MGPU_E_CONFIG, "%s: no key before '='", where);
    /* An optional pair of double quotes keeps leading spaces or a " #" in a path. */
    size_t vl = strlen(val);
    if (vl >= 2 && val[0] == '"' && val[vl - 1] == '"') {
        val[vl - 1] = 0;
        val++;
    }
    ki = key_index(key);
    if (ki < 0)
        return unknown_key(where, key, err);
    if (lineno > 0 && cfg->line[ki] > 0 && strcmp(cfg->file, name) == 0)
        return mgpu_err_set(err, MGPU_E_CONFIG, "%s: %s is set twice (first at line %d)", where,
                            key, cfg->line[ki]);
    int rc = set_value(cfg, &keys[ki], val, base_dir, where, err);
    if (rc == 0)
        cfg->line[ki] = lineno;
    return rc;
}

int mgpu_cfg_parse(const char *text, const char *name, const char *base_dir, mgpu_cfg_t *cfg,
                   mgpu_err_t *err)
{
    char buf[4096];
    int lineno = 0;

    snprintf(cfg->file, sizeof cfg->file, "%s", name);
    while (*text) {
        const char *nl = strchr(text, '\n');
        size_t len = nl ? (size_t)(nl - text) : strlen(text);
        lineno++;
        if (len >= sizeof buf)
            return mgpu_err_set(err, MGPU_E_CONFIG, "%s:%d: line longer than %zu bytes", name,
                                lineno, sizeof buf - 1);
        memcpy(buf, text, len);
        buf[len] = 0;
        text += nl ? len + 1 : len;
        /* A comment starts at a '#' at the start of the line or after a blank, outside double
         * quotes, so that a '#' inside a value (a path) survives. */
        int quoted = 0;
        for (char *p = buf; *p; p++) {
            quoted ^= *p == '"';
            if (!quoted && *p == '#' && (p == buf || p[-1] == ' ' || p[-1] == '\t')) {
                *p = 0;
                break;
            }
        }
        char *line = trim(buf);
        if (*line == 0)
            continue;
        int rc = parse_line(cfg, line, name, lineno, base_dir, err);
        if (rc < 0)
            return rc;
    }
    return 0;
}

int mgpu_cfg_override(mgpu_cfg_t *cfg, const char *assignment, mgpu_err_t *err)
{
    char buf[4096];
    if (strlen(assignment) >= sizeof buf)
        return mgpu_err_set(err, MGPU_E_CONFIG, "override too long (%zu bytes)",
                            strlen(assignment));
    snprintf(buf, sizeof buf, "%s", assignment);
    return parse_line(cfg, buf, "command line", -1, NULL, err);
}

int mgpu_cfg_load(const char *path, mgpu_cfg_t *cfg, mgpu_err_t *err)
{
    FILE *f;
    char *text, dir[MGPU_CFG_PATH_MAX];
    long size;
    int rc;

    mgpu_cfg_defaults(cfg);
    f = fopen(path, "rb");
    if (f == NULL)
        return mgpu_err_set(err, MGPU_E_CONFIG, "%s: cannot open the cfg: %s", path,
                            strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0 ||
        size > (1 << 20)) {
        fclose(f);
        return mgpu_err_set(err, MGPU_E_CONFIG,
                            "%s: cannot read the cfg (not a regular file "
                            "under 1 MiB)",
                            path);
    }
    text = malloc((size_t)size + 1);
    if (text == NULL || fread(text, 1, (size_t)size, f) != (size_t)size) {
        free(text);
        fclose(f);
        return mgpu_err_set(err, MGPU_E_CONFIG, "%s: cannot read the cfg: %s", path,
                            strerror(errno ? errno : EIO));
    }
    fclose(f);
    text[size] = 0;
    if (memchr(text, 0, (size_t)size) != NULL) {
        free(text);
        return mgpu_err_set(err, MGPU_E_CONFIG, "%s: a binary file, expected key = value text",
                            path);
    }
    const char *slash = strrchr(path, '/');
    if (slash == NULL)
        snprintf(dir, sizeof dir, ".");
    else if (slash == path)
        snprintf(dir, sizeof dir, "/");
    else
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    rc = mgpu_cfg_parse(text, path, dir, cfg, err);
    free(text);
    if (rc == 0)
        rc = mgpu_cfg_check(cfg, err);
    return rc;
}

/* --- cross-key checks ---------------------------------------------------------------------- */

/* "file:line" of a key, or "file" when it kept its default. */
static const char *at(const mgpu_cfg_t *cfg, const char *key, char *buf, size_t len)
{
    int l = line_of(cfg, key);
    if (l > 0)
        snprintf(buf, len, "%s:%d", cfg->file, l);
    else if (l < 0)
        snprintf(buf, len, "command line");
    else
        snprintf(buf, len, "%s", cfg->file);
    return buf;
}

static int check_readable(const mgpu_cfg_t *cfg, const char *key, const char *path, mgpu_err_t *err)
{
    char w[MGPU_CFG_PATH_MAX + 32];
    if (*path == 0)
        return mgpu_err_set(err, MGPU_E_CONFIG, "%s: dataset = npy needs %s (a .npy file)",
                            at(cfg, "dataset", w, sizeof w), key);
    if (access(path, R_OK) != 0)
        return mgpu_err_set(err, MGPU_E_CONFIG, "%s: %s = '%s': %s", at(cfg, key, w, sizeof w), key,
                            path, strerror(errno));
    return 0;
}

static int check_out_dir(const mgpu_cfg_t *cfg, const char *key, const char *path, mgpu_err_t *err)
{
    char dir[MGPU_CFG_PATH_MAX], w[MGPU_CFG_PATH_MAX + 32];
    const char *slash = strrchr(path, '/');
    if (*path == 0 || slash == NULL || slash == path)
        return 0;
    snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    if (access(dir, W_OK) != 0)
        return mgpu_err_set(err, MGPU_E_CONFIG, "%s: %s = '%s': directory '%s': %s",
                            at(cfg, key, w, sizeof w), key, path, dir, strerror(errno));
    return 0;
}

#define CONFLICT(cond, key, ...)                                                                   \
    do {                                                                                           \
        if (cond) {                                                                                \
            char w_[MGPU_CFG_PATH_MAX + 32];                                                       \
            char m_[512];                                                                          \
            snprintf(m_, sizeof m_, __VA_ARGS__);                                                  \
            return mgpu_err_set(err, MGPU_E_CONFIG, "%s: %s", at(cfg, key, w_, sizeof w_), m_);    \
        }                                                                                          \
    } while (0)

int mgpu_cfg_check(mgpu_cfg_t *cfg, mgpu_err_t *err)
{
    int rc, npy = cfg->dataset == MGPU_DATASET_NPY;
    int xent = cfg->loss == MGPU_LOSS_CROSS_ENTROPY, adamw = cfg->optimizer == MGPU_OPTIM_ADAMW;

    /* Data. */
    CONFLICT(npy && line_of(cfg, "samples") != 0, "samples",
             "samples is read from data_x with dataset = npy; remove it");
    CONFLICT(npy && line_of(cfg, "features") != 0, "features",
             "features is read from data_x with dataset = npy; remove it");
    CONFLICT(!npy && line_of(cfg, "data_x") != 0, "data_x",
             "data_x is only read with dataset = npy (dataset is %s)", dataset_names[cfg->dataset]);
    CONFLICT(!npy && line_of(cfg, "data_y") != 0, "data_y",
             "data_y is only read with dataset = npy (dataset is %s)", dataset_names[cfg->dataset]);
    if (npy) {
        if ((rc = check_readable(cfg, "data_x", cfg->data_x, err)) < 0 ||
            (rc = check_readable(cfg, "data_y", cfg->data_y, err)) < 0)
            return rc;
        /* classes 0 means "infer from the labels"; the default 2 is for random data. */
        if (line_of(cfg, "classes") == 0)
            cfg->classes = 0;
        CONFLICT(!xent && cfg->classes != 0, "classes",
                 "classes = %d with loss = mse and dataset = npy: the target size is read "
                 "from data_y; remove it",
                 cfg->classes);
    }
    CONFLICT(cfg->dataset == MGPU_DATASET_SYNTHETIC && !xent, "loss",
             "dataset = synthetic has labels only, expected loss = cross_entropy");
    CONFLICT(!npy && cfg->classes < 1, "classes", "classes = %d, expected >= 1", cfg->classes);
    CONFLICT(xent && !npy && cfg->classes < 2, "classes",
             "classes = %d with loss = cross_entropy, expected >= 2", cfg->classes);
    CONFLICT(cfg->dataset != MGPU_DATASET_SYNTHETIC &&
                 (line_of(cfg, "clusters_per_class") != 0 || line_of(cfg, "class_sep") != 0 ||
                  line_of(cfg, "cluster_std") != 0),
             "dataset", "clusters_per_class, class_sep and cluster_std need dataset = synthetic");
    CONFLICT(!npy && cfg->eval_fraction > 0 &&
                 (long long)(cfg->samples * cfg->eval_fraction + 0.5) >= cfg->samples,
             "eval_fraction", "eval_fraction = %g of %lld samples leaves none to train on",
             cfg->eval_fraction, cfg->samples);

    /* Model. */
    CONFLICT(cfg->model == MGPU_MODEL_MLP && cfg->n_hidden == 0, "model",
             "model = mlp needs hidden (layer sizes, e.g. hidden = 256,256)");
    CONFLICT(cfg->model == MGPU_MODEL_LINEAR && cfg->n_hidden > 0, "hidden",
             "hidden is set but model = linear; use model = mlp or remove hidden");
    CONFLICT(cfg->model == MGPU_MODEL_LINEAR && line_of(cfg, "activation") != 0, "activation",
             "activation is set but model = linear has none; use model = mlp");

    /* Optimizer: settings of the other optimizer are mistakes, not no-ops. */
    CONFLICT(adamw && (line_of(cfg, "momentum") || line_of(cfg, "dampening") ||
                       line_of(cfg, "nesterov")),
             "optimizer", "momentum, dampening and nesterov are sgd settings; adamw uses betas");
    CONFLICT(!adamw && (line_of(cfg, "betas") || line_of(cfg, "eps")), "optimizer",
             "betas and eps are adamw settings; sgd uses momentum");
    CONFLICT(cfg->nesterov && (cfg->momentum <= 0 || cfg->dampening != 0), "nesterov",
             "nesterov needs momentum > 0 and dampening = 0 (momentum = %g, dampening = %g)",
             cfg->momentum, cfg->dampening);
    if (line_of(cfg, "weight_decay") == 0)
        cfg->weight_decay = adamw ? 0.01 : 0.0; /* torch.optim defaults */

    /* Output. */
    CONFLICT(line_of(cfg, "checkpoint_interval") != 0 && cfg->checkpoint[0] == 0,
             "checkpoint_interval", "checkpoint_interval is set but checkpoint (the file) is not");
    if ((rc = check_out_dir(cfg, "metrics_file", cfg->metrics_file, err)) < 0 ||
        (rc = check_out_dir(cfg, "checkpoint", cfg->checkpoint, err)) < 0)
        return rc;
    CONFLICT(cfg->mode == MGPU_MODE_DDP && line_of(cfg, "dp_devices") != 0, "dp_devices",
             "dp_devices needs mode = dp (with ddp the launcher's --nproc_per_node decides)");
    return 0;
}

/* --- writing ------------------------------------------------------------------------------- */

/* The shortest of %.15g / %.17g that reads back to the same double ("0.9", not
 * "0.90000000000000002"). */
static const char *fmt_double(double v, char *buf, size_t len)
{
    snprintf(buf, len, "%.15g", v);
    if (strtod(buf, NULL) != v)
        snprintf(buf, len, "%.17g", v);
    return buf;
}

void mgpu_cfg_write(const mgpu_cfg_t *cfg, FILE *out)
{
    for (size_t i = 0; i < N_KEYS; i++) {
        const cfg_key_t *k = &keys[i];
        const char *field = (const char *)cfg + k->off;
        char accepted[256];
        fprintf(out, "# %s", k->doc);
        if (k->type == T_ENUM) {
            list_names(k->names, accepted, sizeof accepted);
            fprintf(out, " [%s]", accepted);
        }
        /* Keys left at their default are written commented out, so that reading the output
         * back sets exactly the keys the original set and passes the same checks. */
        fprintf(out, "\n%s%s = ", cfg->line[i] != 0 ? "" : "# ", k->name);
        switch (k->type) {
        case T_ENUM: {
            int v;
            memcpy(&v, field, sizeof v);
            fprintf(out, "%s\n", k->names[v]);
            break;
        }
        case T_INT:
        case T_BOOL: {
            int v;
            memcpy(&v, field, sizeof v);
            if (k->type == T_BOOL)
                fprintf(out, "%s\n", v ? "true" : "false");
            else
                fprintf(out, "%d\n", v);
            break;
        }
        case T_LL: {
            long long v;
            memcpy(&v, field, sizeof v);
            fprintf(out, "%lld\n", v);
            break;
        }
        case T_U64: {
            uint64_t v;
            memcpy(&v, field, sizeof v);
            fprintf(out, "%llu\n", (unsigned long long)v);
            break;
        }
        case T_DBL: {
            double v;
            memcpy(&v, field, sizeof v);
            char b[40];
            fprintf(out, "%s\n", fmt_double(v, b, sizeof b));
            break;
        }
        case T_PATH:
        case T_OUTPATH:
            fprintf(out, "%s\n", field);
            break;
        case T_HIDDEN:
            for (int j = 0; j < cfg->n_hidden; j++)
                fprintf(out, "%s%d", j ? "," : "", cfg->hidden[j]);
            fprintf(out, "\n");
            break;
        case T_BETAS: {
            char b1[40], b2[40];
            fprintf(out, "%s, %s\n", fmt_double(cfg->beta1, b1, sizeof b1),
                    fmt_double(cfg->beta2, b2, sizeof b2));
            break;
        }
        }
    }
}
