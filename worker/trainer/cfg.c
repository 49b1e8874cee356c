/* cfg.c - train.cfg: one table describes every key (type, field, accepted values, range,
 * documentation), and the parser, the error messages and mgpu_cfg_write all read it, so a
 * new key is one line here and one in configs/README.md. */
#include "cfg.h"

#include <errno.h>    /* errno */
#include <limits.h>   /* INT_MAX */
#include <math.h>     /* isfinite */
#include <stddef.h>   /* offsetof */
#include <stdlib.h>   /* strtod, strtoll */
#include <string.h>   /* strchr, strlen */
#include <strings.h>  /* strcasecmp */
#include <sys/stat.h> /* stat, S_ISDIR */
#include <unistd.h>   /* access, read, close */

#include "data.h" /* mgpu_data_open_regular, mgpu_data_check_npy */
#include "dp.h"   /* MGPU_DP_MAX_DEVICES */

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

/* Limits of what is read: a cfg is a few dozen short lines. */
#define CFG_MAX_BYTES (1 << 20) /* the whole file */
#define CFG_LINE_MAX 4095       /* one line, without its '\n' */
#define SHOWN 80                /* bytes of a key or a line quoted in a message */

#define F(field) offsetof(mgpu_cfg_t, field)
#define BIG 1e15 /* "no practical limit" for long long keys */

/* The order is the order of mgpu_cfg_write and configs/README.md. */
static const cfg_key_t keys[] = {
    {"mode", T_ENUM, F(mode), mode_names, 0, 0,
     "ddp: one process per device, gradients all-reduced (DistributedDataParallel); dp: one "
     "process drives all devices (DataParallel)"},
    {"backend", T_ENUM, F(backend), backend_names, 0, 0,
     "collectives: auto picks nccl when the worker has a GPU, cpu otherwise"},
    {"dp_devices", T_INT, F(dp_devices), NULL, 0, MGPU_DP_MAX_DEVICES,
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

    /* Messages quote at most SHOWN bytes of what the user wrote, so that one stays readable
     * (and whole through mgpu-launch) whatever the line holds. */
    if (lineno >= 0)
        snprintf(where, sizeof where, "%s:%d", name, lineno);
    else
        snprintf(where, sizeof where, "command line: override '%.*s%s'", SHOWN, text,
                 strlen(text) > SHOWN ? "..." : "");
    if (eq == NULL) {
        text = trim(text);
        return mgpu_err_set(err, MGPU_E_CONFIG, "%s: '%.*s%s': expected 'key = value'", where,
                            SHOWN, text, strlen(text) > SHOWN ? "..." : "");
    }
    *eq = 0;
    key = trim(text);
    val = trim(eq + 1);
    if (*key == 0)
        return mgpu_err_set(err, MGPU_E_CONFIG, "%s: no key before '='", where);
    if (strlen(key) > SHOWN)
        return mgpu_err_set(err, MGPU_E_CONFIG, "%s: unknown key '%.*s...' (%zu bytes long)", where,
                            SHOWN, key, strlen(key));
    if (strlen(val) >= MGPU_CFG_PATH_MAX)
        return mgpu_err_set(err, MGPU_E_CONFIG, "%s: %s: a value of %zu bytes, expected at most %d",
                            where, key, strlen(val), MGPU_CFG_PATH_MAX - 1);
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

/* 0, or the 1-based column of the first byte of s[0..len) that is not text: a control
 * character (tab and carriage return aside), NUL included, or a byte that is not part of a
 * well-formed UTF-8 sequence. */
static size_t bad_byte(const unsigned char *s, size_t len)
{
    for (size_t i = 0; i < len;) {
        unsigned char c = s[i];
        if (c < 0x80) {
            if ((c < 0x20 && c != '\t' && c != '\r') || c == 0x7f)
                return i + 1;
            i++;
            continue;
        }
        size_t more = c >= 0xc2 && c <= 0xdf   ? 1
                      : c >= 0xe0 && c <= 0xef ? 2
                      : c >= 0xf0 && c <= 0xf4 ? 3
                                               : 0;
        if (more == 0 || len - i <= more)
            return i + 1;
        for (size_t j = 1; j <= more; j++)
            if ((s[i + j] & 0xc0) != 0x80)
                return i + 1;
        /* Overlong forms, UTF-16 surrogates and code points past U+10FFFF. */
        if ((c == 0xe0 && s[i + 1] < 0xa0) || (c == 0xed && s[i + 1] > 0x9f) ||
            (c == 0xf0 && s[i + 1] < 0x90) || (c == 0xf4 && s[i + 1] > 0x8f))
            return i + 1;
        i += more + 1;
    }
    return 0;
}

/* The lines of text[0..len): each checked to be text no longer than the line buffer, then
 * (unless check_only) parsed. */
static int parse_text(const char *text, size_t len, const char *name, const char *base_dir,
                      mgpu_cfg_t *cfg, int check_only, mgpu_err_t *err)
{
    char buf[CFG_LINE_MAX + 1];
    const char *end = text + len;
    int lineno = 0;

    snprintf(cfg->file, sizeof cfg->file, "%s", name);
    /* A byte order mark, as some editors write at the start of a UTF-8 file. */
    if (len >= 3 && memcmp(text, "\xef\xbb\xbf", 3) == 0)
        text += 3;
    while (text < end) {
        const char *nl = memchr(text, '\n', (size_t)(end - text));
        size_t n = nl ? (size_t)(nl - text) : (size_t)(end - text);
        lineno++;
        if (n > CFG_LINE_MAX)
            return mgpu_err_set(err, MGPU_E_CONFIG, "%s:%d: line longer than the limit of %d bytes",
                                name, lineno, CFG_LINE_MAX);
        size_t col = bad_byte((const unsigned char *)text, n);
        if (col > 0) {
            unsigned char c = (unsigned char)text[col - 1];
            if (c == 0)
                return mgpu_err_set(err, MGPU_E_CONFIG,
                                    "%s:%d: not a text file: a NUL byte at column %zu", name,
                                    lineno, col);
            return mgpu_err_set(err, MGPU_E_CONFIG,
                                "%s:%d: not a text file: byte 0x%02x at column %zu (expected "
                                "UTF-8 text without control characters)",
                                name, lineno, c, col);
        }
        memcpy(buf, text, n);
        buf[n] = 0;
        text += nl ? n + 1 : n;
        if (check_only)
            continue;
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

int mgpu_cfg_parse(const char *text, const char *name, const char *base_dir, mgpu_cfg_t *cfg,
                   mgpu_err_t *err)
{
    return parse_text(text, strlen(text), name, base_dir, cfg, 0, err);
}

int mgpu_cfg_override(mgpu_cfg_t *cfg, const char *assignment, mgpu_err_t *err)
{
    char buf[CFG_LINE_MAX + 1];
    size_t col = bad_byte((const unsigned char *)assignment, strlen(assignment));
    if (strlen(assignment) >= sizeof buf)
        return mgpu_err_set(err, MGPU_E_CONFIG,
                            "command line: override '%.*s...' of %zu bytes, longer than the limit "
                            "of %d",
                            SHOWN, assignment, strlen(assignment), CFG_LINE_MAX);
    if (col > 0)
        return mgpu_err_set(err, MGPU_E_CONFIG,
                            "command line: override of %zu bytes: byte 0x%02x at column %zu is "
                            "not text (expected UTF-8 without control characters)",
                            strlen(assignment), (unsigned char)assignment[col - 1], col);
    snprintf(buf, sizeof buf, "%s", assignment);
    return parse_line(cfg, buf, "command line", -1, NULL, err);
}

int mgpu_cfg_load(const char *path, mgpu_cfg_t *cfg, mgpu_err_t *err)
{
    char *text, dir[MGPU_CFG_PATH_MAX];
    size_t size, len = 0;
    int fd, rc;

    mgpu_cfg_defaults(cfg);
    snprintf(cfg->file, sizeof cfg->file, "%s", path);
    if ((rc = mgpu_data_open_regular(path, "the cfg", &fd, &size, err)) < 0) {
        if (err != NULL)
            err->code = MGPU_E_CONFIG;
        return MGPU_E_CONFIG;
    }
    /* At most one byte past the limit: enough to know the file is too large. */
    size_t want = size < CFG_MAX_BYTES ? size : CFG_MAX_BYTES + 1;
    text = malloc(want + 1);
    if (text == NULL) {
        close(fd);
        return mgpu_err_set(err, -ENOMEM, "%s: cannot allocate %zu bytes", path, want + 1);
    }
    while (len < want) {
        ssize_t n = read(fd, text + len, want - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int e = errno;
            free(text);
            close(fd);
            return mgpu_err_set(err, MGPU_E_CONFIG, "%s: cannot read the cfg: %s", path,
                                strerror(e));
        }
        if (n == 0)
            break;
        len += (size_t)n;
    }
    close(fd);
    text[len] = 0;
    if (len > CFG_MAX_BYTES) {
        /* A line that is not text or too long says more than the size: look for one first. */
        rc = parse_text(text, CFG_MAX_BYTES, path, NULL, cfg, 1, err);
        if (rc == 0) {
            int lines = 1;
            for (const char *p = text; p < text + CFG_MAX_BYTES; p++)
                lines += *p == '\n';
            rc = mgpu_err_set(err, MGPU_E_CONFIG,
                              "%s:%d: the cfg goes on past %d bytes at this line; expected a "
                              "short key = value text",
                              path, lines, CFG_MAX_BYTES);
        }
        free(text);
        return rc;
    }
    const char *slash = strrchr(path, '/');
    if (slash == NULL)
        snprintf(dir, sizeof dir, ".");
    else if (slash == path)
        snprintf(dir, sizeof dir, "/");
    else
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    rc = parse_text(text, len, path, dir, cfg, 0, err);
    free(text);
    if (rc == 0)
        rc = mgpu_cfg_check(cfg, err);
    return rc;
}

/* --- cross-key checks ---------------------------------------------------------------------- */

/* "file:line" of a key, "command line" for an override, or "file" when it kept its default. */
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

/* The place of a problem between the keys of `names` (separated by spaces): the line of the
 * one set last (an override after every line), so that a message always has a line when one
 * of the keys was written; `also` lists where the others were set, e.g. " (dataset at line
 * 1)", or is empty. */
static const char *place(const mgpu_cfg_t *cfg, const char *names, char *buf, size_t len,
                         char *also, size_t alen)
{
    char list[256], *save = NULL, *best = NULL, *first = NULL;
    int best_rank = 0;

    snprintf(list, sizeof list, "%s", names);
    for (char *k = strtok_r(list, " ", &save); k != NULL; k = strtok_r(NULL, " ", &save)) {
        int l = line_of(cfg, k), r = l < 0 ? INT_MAX : l;
        if (first == NULL)
            first = k;
        if (r > best_rank)
            best_rank = r, best = k;
    }
    at(cfg, best != NULL ? best : first, buf, len);
    char chosen[64];
    snprintf(chosen, sizeof chosen, "%s", best != NULL ? best : "");
    also[0] = 0;
    snprintf(list, sizeof list, "%s", names);
    int n = 0;
    for (char *k = strtok_r(list, " ", &save); k != NULL; k = strtok_r(NULL, " ", &save)) {
        int l = line_of(cfg, k);
        if (l == 0 || strcmp(k, chosen) == 0)
            continue;
        size_t u = strlen(also);
        if (l > 0)
            snprintf(also + u, alen - u, "%s%s at line %d", n ? ", " : " (", k, l);
        else
            snprintf(also + u, alen - u, "%s%s on the command line", n ? ", " : " (", k);
        n++;
    }
    if (n > 0)
        snprintf(also + strlen(also), alen - strlen(also), ")");
    return buf;
}

/* --- sizes a cfg implies, against the host's memory ----------------------------------------- */

#define GIB (1024.0 * 1024.0 * 1024.0)

static double host_memory(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (double)pages * (double)page : 1e300;
}

/* A generated data set: features, targets and labels, twice (all samples, then the split). */
static double data_bytes(const mgpu_cfg_t *cfg)
{
    double per = (double)cfg->features + (cfg->dataset == MGPU_DATASET_RANDOM ? cfg->classes : 0);
    return 2.0 * (double)cfg->samples * (per + 1.0) * 4.0;
}

/* Parameters of the network (npy: the inputs are known only from data_x, so 0). */
static double model_params(const mgpu_cfg_t *cfg)
{
    if (cfg->dataset == MGPU_DATASET_NPY)
        return 0;
    double params = 0, in = cfg->features;
    int layers = cfg->model == MGPU_MODEL_MLP ? cfg->n_hidden : 0;
    for (int i = 0; i < layers; i++) {
        params += in * cfg->hidden[i] + cfg->hidden[i];
        in = cfg->hidden[i];
    }
    return params + in * cfg->classes + cfg->classes;
}

/* A data file the cfg names: readable, a regular file, and (both files together) data that
 * mgpu_data_load_npy will take; the message starts at the cfg's line of data_x or data_y. */
static int check_data(mgpu_cfg_t *cfg, size_t *n, mgpu_err_t *err)
{
    char w[MGPU_CFG_PATH_MAX + 32];
    const char *key[2] = {"data_x", "data_y"}, *path[2] = {cfg->data_x, cfg->data_y};
    int bad_y;

    for (int i = 0; i < 2; i++) {
        if (*path[i] == 0)
            return mgpu_err_set(err, MGPU_E_CONFIG, "%s: dataset = npy needs %s (a .npy file)",
                                at(cfg, "dataset", w, sizeof w), key[i]);
        if (access(path[i], R_OK) != 0)
            return mgpu_err_set(err, MGPU_E_CONFIG, "%s: %s = '%s': %s",
                                at(cfg, key[i], w, sizeof w), key[i], path[i], strerror(errno));
    }
    mgpu_err_t e = {0};
    if (mgpu_data_check_npy(cfg->data_x, cfg->data_y, cfg->loss == MGPU_LOSS_CROSS_ENTROPY,
                            cfg->classes, n, &bad_y, &e) < 0)
        return mgpu_err_set(err, MGPU_E_CONFIG, "%s: %s: %s", at(cfg, key[bad_y], w, sizeof w),
                            key[bad_y], e.msg);
    return 0;
}

/* An output: its directory exists and is writable, and the file, if there, is no directory. */
static int check_out(const mgpu_cfg_t *cfg, const char *key, const char *path, mgpu_err_t *err)
{
    char dir[MGPU_CFG_PATH_MAX], w[MGPU_CFG_PATH_MAX + 32];
    struct stat st;
    const char *slash = strrchr(path, '/');
    if (*path == 0)
        return 0;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return mgpu_err_set(err, MGPU_E_CONFIG, "%s: %s = '%s': is a directory, expected a file",
                            at(cfg, key, w, sizeof w), key, path);
    if (slash == NULL || slash == path)
        return 0;
    snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    if (access(dir, W_OK) != 0)
        return mgpu_err_set(err, MGPU_E_CONFIG, "%s: %s = '%s': directory '%s': %s",
                            at(cfg, key, w, sizeof w), key, path, dir, strerror(errno));
    return 0;
}

/* When cond holds: the problem, at the place of the keys involved (see place()). */
#define CONFLICT(cond, keys, ...)                                                                  \
    do {                                                                                           \
        if (cond) {                                                                                \
            char w_[MGPU_CFG_PATH_MAX + 32], a_[256], m_[512];                                     \
            snprintf(m_, sizeof m_, __VA_ARGS__);                                                  \
            place(cfg, keys, w_, sizeof w_, a_, sizeof a_);                                        \
            return mgpu_err_set(err, MGPU_E_CONFIG, "%s: %s%s", w_, m_, a_);                       \
        }                                                                                          \
    } while (0)

int mgpu_cfg_check(mgpu_cfg_t *cfg, mgpu_err_t *err)
{
    int rc, npy = cfg->dataset == MGPU_DATASET_NPY;
    int xent = cfg->loss == MGPU_LOSS_CROSS_ENTROPY, adamw = cfg->optimizer == MGPU_OPTIM_ADAMW;
    size_t n_npy = 0;

    /* Data. */
    CONFLICT(npy && line_of(cfg, "samples") != 0, "samples dataset",
             "samples is read from data_x with dataset = npy; remove it");
    CONFLICT(npy && line_of(cfg, "features") != 0, "features dataset",
             "features is read from data_x with dataset = npy; remove it");
    CONFLICT(!npy && line_of(cfg, "data_x") != 0, "data_x dataset",
             "data_x is only read with dataset = npy (dataset is %s)", dataset_names[cfg->dataset]);
    CONFLICT(!npy && line_of(cfg, "data_y") != 0, "data_y dataset",
             "data_y is only read with dataset = npy (dataset is %s)", dataset_names[cfg->dataset]);
    if (npy) {
        /* classes 0 means "infer from the labels"; the default 2 is for random data. */
        if (line_of(cfg, "classes") == 0)
            cfg->classes = 0;
        CONFLICT(!xent && cfg->classes != 0, "classes loss dataset",
                 "classes = %d with loss = mse and dataset = npy: the target size is read "
                 "from data_y; remove it",
                 cfg->classes);
        if ((rc = check_data(cfg, &n_npy, err)) < 0)
            return rc;
        CONFLICT(cfg->eval_fraction > 0 && (size_t)(n_npy * cfg->eval_fraction + 0.5) >= n_npy,
                 "eval_fraction data_x",
                 "eval_fraction = %g of the %zu samples of data_x leaves "
                 "none to train on",
                 cfg->eval_fraction, n_npy);
    }
    CONFLICT(cfg->dataset == MGPU_DATASET_SYNTHETIC && !xent, "loss dataset",
             "dataset = synthetic has labels only, expected loss = cross_entropy");
    CONFLICT(!npy && cfg->classes < 1, "classes", "classes = %d, expected >= 1", cfg->classes);
    CONFLICT(xent && !npy && cfg->classes < 2, "classes loss",
             "classes = %d with loss = cross_entropy, expected >= 2", cfg->classes);
    CONFLICT(cfg->dataset != MGPU_DATASET_SYNTHETIC &&
                 (line_of(cfg, "clusters_per_class") != 0 || line_of(cfg, "class_sep") != 0 ||
                  line_of(cfg, "cluster_std") != 0),
             "dataset clusters_per_class class_sep cluster_std",
             "clusters_per_class, class_sep and cluster_std need dataset = synthetic");
    CONFLICT(!npy && cfg->eval_fraction > 0 &&
                 (long long)(cfg->samples * cfg->eval_fraction + 0.5) >= cfg->samples,
             "eval_fraction samples", "eval_fraction = %g of %lld samples leaves none to train on",
             cfg->eval_fraction, cfg->samples);
    CONFLICT(!npy && data_bytes(cfg) > host_memory(), "samples features classes",
             "samples = %lld of %d features (and %d outputs) need %.1f GiB, more than the %.1f "
             "GiB of memory of this host",
             cfg->samples, cfg->features, cfg->classes, data_bytes(cfg) / GIB, host_memory() / GIB);

    /* Model. */
    CONFLICT(cfg->model == MGPU_MODEL_MLP && cfg->n_hidden == 0, "model hidden",
             "model = mlp needs hidden (layer sizes, e.g. hidden = 256,256)");
    CONFLICT(cfg->model == MGPU_MODEL_LINEAR && cfg->n_hidden > 0, "hidden model",
             "hidden is set but model = linear; use model = mlp or remove hidden");
    CONFLICT(cfg->model == MGPU_MODEL_LINEAR && line_of(cfg, "activation") != 0, "activation model",
             "activation is set but model = linear has none; use model = mlp");
    /* Parameters, gradients and up to two optimizer states, 4 bytes each. */
    CONFLICT(model_params(cfg) * 16 > host_memory(), "hidden features classes model",
             "the model's %.0f parameters need %.1f GiB with their gradients and optimizer "
             "state, more than the %.1f GiB of memory of this host",
             model_params(cfg), model_params(cfg) * 16 / GIB, host_memory() / GIB);

    /* Optimizer: settings of the other optimizer are mistakes, not no-ops. */
    CONFLICT(adamw && (line_of(cfg, "momentum") || line_of(cfg, "dampening") ||
                       line_of(cfg, "nesterov")),
             "optimizer momentum dampening nesterov",
             "momentum, dampening and nesterov are sgd settings; adamw uses betas");
    CONFLICT(!adamw && (line_of(cfg, "betas") || line_of(cfg, "eps")), "optimizer betas eps",
             "betas and eps are adamw settings; sgd uses momentum");
    CONFLICT(cfg->nesterov && (cfg->momentum <= 0 || cfg->dampening != 0),
             "nesterov momentum dampening",
             "nesterov needs momentum > 0 and dampening = 0 (momentum = %g, dampening = %g)",
             cfg->momentum, cfg->dampening);
    if (line_of(cfg, "weight_decay") == 0)
        cfg->weight_decay = adamw ? 0.01 : 0.0; /* torch.optim defaults */

    /* Output. */
    CONFLICT(line_of(cfg, "checkpoint_interval") != 0 && cfg->checkpoint[0] == 0,
             "checkpoint_interval checkpoint",
             "checkpoint_interval is set but checkpoint (the file) is not");
    if ((rc = check_out(cfg, "metrics_file", cfg->metrics_file, err)) < 0 ||
        (rc = check_out(cfg, "checkpoint", cfg->checkpoint, err)) < 0)
        return rc;
    CONFLICT(cfg->mode == MGPU_MODE_DDP && line_of(cfg, "dp_devices") != 0, "dp_devices mode",
             "dp_devices needs mode = dp (with ddp the launcher's --nproc_per_node decides)");
    CONFLICT(cfg->mode == MGPU_MODE_DP && cfg->checkpoint[0] != 0, "checkpoint mode",
             "checkpoint is not supported with mode = dp; use mode = ddp or remove checkpoint");
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
