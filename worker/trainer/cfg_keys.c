/* cfg_keys.c - the table of train.cfg's keys, the parsing of one value, and mgpu_cfg_write,
 * which prints every key with its documentation from the same table. */
#include "cfg_keys.h"

#include <errno.h>   /* errno */
#include <math.h>    /* isfinite */
#include <stddef.h>  /* offsetof */
#include <stdio.h>   /* snprintf, fprintf */
#include <stdlib.h>  /* strtod, strtoll */
#include <string.h>  /* strchr, strlen */
#include <strings.h> /* strcasecmp */

#include "dp.h" /* MGPU_DP_MAX_DEVICES */

_Static_assert(sizeof(mgpu_cfg_mode_t) == sizeof(int) && sizeof(mgpu_act_t) == sizeof(int) &&
                   sizeof(mgpu_backend_t) == sizeof(int),
               "T_ENUM fields are written as int");

static const char *const mode_names[] = {"ddp", "dp", NULL};
static const char *const backend_names[] = {"auto", "cpu", "nccl", NULL};
static const char *const prec_names[] = {"fp32", "tf32", "bf16", NULL};
const char *const mgpu_cfg_dataset_names[] = {"random", "synthetic", "npy", "text", "tokens", NULL};
const char *const mgpu_cfg_model_names[] = {"linear", "mlp", "gpt", NULL};
static const char *const act_names[] = {"identity", "relu", "gelu", "tanh", "sigmoid", NULL};
static const char *const loss_names[] = {"mse", "cross_entropy", NULL};
static const char *const optim_names[] = {"sgd", "adamw", NULL};

#define F(field) offsetof(mgpu_cfg_t, field)
#define BIG 1e15 /* "no practical limit" for long long keys */

const mgpu_cfg_key_t mgpu_cfg_keys[] = {
    {"mode", MGPU_CFG_T_ENUM, F(mode), mode_names, 0, 0,
     "ddp: one process per device, gradients all-reduced (DistributedDataParallel); dp: one "
     "process drives all devices (DataParallel)"},
    {"backend", MGPU_CFG_T_ENUM, F(backend), backend_names, 0, 0,
     "collectives: auto picks nccl when the worker has a GPU and other ranks, cpu otherwise"},
    {"dp_devices", MGPU_CFG_T_INT, F(dp_devices), NULL, 0, MGPU_DP_MAX_DEVICES,
     "mode = dp: devices to use (threads stand in for them on a CPU); 0 = all visible, 2 on a "
     "CPU"},
    {"precision", MGPU_CFG_T_ENUM, F(precision), prec_names, 0, 0,
     "GEMM precision on a GPU: fp32, tf32 (default), bf16 with fp32 master weights; the CPU "
     "always computes fp32"},
    {"timeout", MGPU_CFG_T_DBL, F(timeout_s), NULL, 0.001, 86400,
     "seconds a collective may take before the run fails naming the missing ranks"},
    {"dataset", MGPU_CFG_T_ENUM, F(dataset), mgpu_cfg_dataset_names, 0, 0,
     "random: the article's RandomDataset; synthetic: Gaussian clusters; npy: data_x/data_y "
     "files; text, tokens (model = gpt): data_text, data_tokens. Unset: the dataset of the "
     "one data file given (and model = gpt for text and tokens), else random"},
    {"samples", MGPU_CFG_T_LL, F(samples), NULL, 1, BIG, "random/synthetic: number of samples"},
    {"features", MGPU_CFG_T_INT, F(features), NULL, 1, 1 << 24,
     "random/synthetic: values per sample (the model's input size)"},
    {"classes", MGPU_CFG_T_INT, F(classes), NULL, 0, 1 << 24,
     "cross_entropy: number of classes; mse: target size (the model's output size); npy: 0 = "
     "max label + 1"},
    {"data_seed", MGPU_CFG_T_U64, F(data_seed), NULL, 0, 0,
     "seed of the generated data set and of the held-out split"},
    {"data_x", MGPU_CFG_T_PATH, F(data_x), NULL, 0, 0,
     "npy: features, shape (N, ...) of float32/float64/int64/int32/int16/uint8/int8"},
    {"data_y", MGPU_CFG_T_PATH, F(data_y), NULL, 0, 0,
     "npy: labels (N) of integers for cross_entropy, or targets (N) / (N, T) for mse"},
    {"data_text", MGPU_CFG_T_PATH, F(data_text), NULL, 0, 0,
     "text: a file whose bytes are the tokens (vocab 256); the held-out split is its tail"},
    {"data_tokens", MGPU_CFG_T_PATHS, F(data_tokens), NULL, 0, 0,
     "tokens: llm.c shards (uint16 or uint32) or raw uint16 files (nanoGPT's .bin), each id "
     "below vocab: a file, a comma-separated list or a glob pattern (fineweb_train_*.bin)"},
    {"eval_fraction", MGPU_CFG_T_DBL, F(eval_fraction), NULL, 0, 0.99,
     "share of the samples held out for evaluation (0: no evaluation)"},
    {"clusters_per_class", MGPU_CFG_T_INT, F(clusters_per_class), NULL, 1, 1024,
     "synthetic: Gaussian clusters per class"},
    {"class_sep", MGPU_CFG_T_DBL, F(class_sep), NULL, 1e-6, 1e6,
     "synthetic: standard deviation of the cluster centers (larger: easier)"},
    {"cluster_std", MGPU_CFG_T_DBL, F(cluster_std), NULL, 0, 1e6,
     "synthetic: standard deviation of the samples around their center"},
    {"model", MGPU_CFG_T_ENUM, F(model), mgpu_cfg_model_names, 0, 0,
     "linear: one nn.Linear(features, classes); mlp: hidden layers with an activation; gpt: a "
     "GPT-2 language model (n_layer, n_head, n_embd, context, vocab)"},
    {"hidden", MGPU_CFG_T_HIDDEN, F(hidden), NULL, 1, 1 << 24,
     "mlp: sizes of the hidden layers, comma-separated, e.g. 256,256"},
    {"activation", MGPU_CFG_T_ENUM, F(activation), act_names, 0, 0,
     "mlp: activation after each hidden layer (gelu is the tanh approximation)"},
    {"n_layer", MGPU_CFG_T_INT, F(n_layer), NULL, 1, 256, "gpt: transformer blocks"},
    {"n_head", MGPU_CFG_T_INT, F(n_head), NULL, 1, 1024,
     "gpt: attention heads per block (n_embd must be a multiple of it)"},
    {"n_embd", MGPU_CFG_T_INT, F(n_embd), NULL, 1, 1 << 16, "gpt: width of the residual stream"},
    {"context", MGPU_CFG_T_INT, F(context), NULL, 1, 1 << 16,
     "gpt: tokens per training window (block size; windows are context + 1 tokens)"},
    {"vocab", MGPU_CFG_T_INT, F(vocab), NULL, 1, 65536,
     "gpt: token ids 0..vocab-1 (tokens: required; text: 256)"},
    {"loss", MGPU_CFG_T_ENUM, F(loss), loss_names, 0, 0,
     "mse: nn.MSELoss (mean); cross_entropy: nn.CrossEntropyLoss (mean)"},
    {"optimizer", MGPU_CFG_T_ENUM, F(optimizer), optim_names, 0, 0,
     "sgd: torch.optim.SGD; adamw: torch.optim.AdamW"},
    {"lr", MGPU_CFG_T_DBL, F(lr), NULL, 0, 1e6, "learning rate"},
    {"momentum", MGPU_CFG_T_DBL, F(momentum), NULL, 0, 1, "sgd: momentum (0: none)"},
    {"dampening", MGPU_CFG_T_DBL, F(dampening), NULL, 0, 1, "sgd: dampening of the momentum"},
    {"nesterov", MGPU_CFG_T_BOOL, F(nesterov), NULL, 0, 0, "sgd: Nesterov momentum"},
    {"weight_decay", MGPU_CFG_T_DBL, F(weight_decay), NULL, 0, 1e6,
     "sgd: L2 added to the gradient (default 0); adamw: decoupled decay (default 0.01)"},
    {"betas", MGPU_CFG_T_BETAS, F(beta1), NULL, 0, 0, "adamw: beta1, beta2 in [0, 1)"},
    {"eps", MGPU_CFG_T_DBL, F(eps), NULL, 1e-30, 1, "adamw: epsilon"},
    {"lr_min", MGPU_CFG_T_DBL, F(lr_min), NULL, 0, 1e6,
     "gpt: learning rate at the end of the cosine decay over max_steps (or the run's steps); "
     "default lr (no decay)"},
    {"warmup_steps", MGPU_CFG_T_LL, F(warmup_steps), NULL, 0, BIG,
     "gpt: steps of linear learning-rate warm-up from lr / warmup_steps to lr"},
    {"grad_clip", MGPU_CFG_T_DBL, F(grad_clip), NULL, 0, 1e6,
     "gpt: clip the global gradient norm (after the all-reduce) to this (0: off)"},
    {"batch_size", MGPU_CFG_T_LL, F(batch_size), NULL, 1, 1 << 30,
     "samples per rank per step (the global batch is batch_size x world size)"},
    {"grad_accum", MGPU_CFG_T_LL, F(grad_accum), NULL, 1, 1 << 20,
     "gpt: micro-batches of batch_size per optimizer step; the gradient all-reduce runs on the "
     "last one only (DDP's no_sync)"},
    {"epochs", MGPU_CFG_T_LL, F(epochs), NULL, 1, BIG, "passes over the training set"},
    {"max_steps", MGPU_CFG_T_LL, F(max_steps), NULL, 0, BIG,
     "stop after this many optimizer steps (0: run all epochs)"},
    {"shuffle", MGPU_CFG_T_BOOL, F(shuffle), NULL, 0, 0,
     "DistributedSampler(shuffle=): a new permutation from seed + epoch every epoch"},
    {"seed", MGPU_CFG_T_U64, F(seed), NULL, 0, 0,
     "seed of the sampler's shuffle and of the parameter init"},
    {"drop_last", MGPU_CFG_T_BOOL, F(drop_last), NULL, 0, 0,
     "DistributedSampler(drop_last=): drop the tail instead of padding to a multiple of the "
     "world size"},
    {"drop_last_batch", MGPU_CFG_T_BOOL, F(drop_last_batch), NULL, 0, 0,
     "DataLoader(drop_last=): drop each rank's last, smaller batch"},
    {"bucket_mb", MGPU_CFG_T_DBL, F(bucket_mb), NULL, 0.001, 1e6,
     "DDP gradient bucket size in MiB (PyTorch's bucket_cap_mb)"},
    {"bucket_overlap", MGPU_CFG_T_BOOL, F(bucket_overlap), NULL, 0, 0,
     "GPU: all-reduce each bucket as soon as backward has made it, during the rest of "
     "backward (false: all buckets after backward, to measure what the overlap buys)"},
    {"log_interval", MGPU_CFG_T_LL, F(log_interval), NULL, 0, BIG,
     "steps between rank 0's progress lines (0: none)"},
    {"eval_interval", MGPU_CFG_T_LL, F(eval_interval), NULL, 0, BIG,
     "epochs between evaluations on the held-out set (0: only at the end)"},
    {"metrics_file", MGPU_CFG_T_OUTPATH, F(metrics_file), NULL, 0, 0,
     "JSON lines of metrics written by rank 0 (empty: none)"},
    {"checkpoint", MGPU_CFG_T_OUTPATH, F(checkpoint), NULL, 0, 0,
     "checkpoint file, written atomically by rank 0 and resumed from at start (empty: none)"},
    {"checkpoint_interval", MGPU_CFG_T_LL, F(checkpoint_interval), NULL, 0, BIG,
     "steps between checkpoints (0: at the end of every epoch)"},
    {"demo_prints", MGPU_CFG_T_BOOL, F(demo_prints), NULL, 0, 0,
     "print the article's lines per batch: \"In Model: input size ...\" and \"Outside: ...\""},
    {"generate", MGPU_CFG_T_LL, F(generate), NULL, 0, 1 << 24,
     "gpt: after training, rank 0 prints this many sampled tokens (0: none)"},
    {"prompt", MGPU_CFG_T_STR, F(prompt), NULL, 0, 0,
     "gpt: what sampling continues; text: bytes (\\n is a newline; empty: a newline); tokens: "
     "ids separated by spaces (empty: id 0)"},
    {"temperature", MGPU_CFG_T_DBL, F(temperature), NULL, 1e-6, 1e6,
     "gpt: sampling temperature (logits divided by it)"},
    {"top_k", MGPU_CFG_T_INT, F(top_k), NULL, 0, 65536,
     "gpt: sample among the top_k most likely tokens (0: all)"},
    {"cuda_graph", MGPU_CFG_T_BOOL, F(cuda_graph), NULL, 0, 0,
     "GPU: after a warm-up step, capture the whole step (forward, backward, all-reduce, update) "
     "in a CUDA graph and replay it; needs full batches (drop_last_batch or a batch size that "
     "divides each rank's samples); sgd and adamw"},
    {"timing_warmup", MGPU_CFG_T_LL, F(timing_warmup), NULL, 0, BIG,
     "time the steps after the first timing_warmup ones (CUDA events on a GPU): a \"step time\" "
     "line and step_us in the final metrics line (0: no timing)"},
    {"zero", MGPU_CFG_T_INT, F(zero), NULL, 0, 1,
     "1: ZeRO-1, each rank keeps the optimizer state of its 1 / world slice of the parameters "
     "(gradients reduce-scattered, parameters all-gathered); 0: every rank keeps all of it"},
    {"recompute", MGPU_CFG_T_INT, F(recompute), NULL, 0, 2,
     "gpt: activations backward makes again instead of keeping them from forward, for memory: "
     "0 none; 1 the MLP's GELU output (8 bytes a token, channel and layer in bf16, 16 in "
     "fp32); 2 also both LayerNorms' outputs (4 bytes more in bf16, 8 in fp32)"},
    {"data_val_tokens", MGPU_CFG_T_PATHS, F(data_val_tokens), NULL, 0, 0,
     "tokens: the held-out files, as data_tokens (fineweb_val_*.bin); instead of eval_fraction"},
    {"tokenizer", MGPU_CFG_T_PATH, F(tokenizer), NULL, 0, 0,
     "tokens: a Hugging Face tokenizer.json (byte-level BPE, GPT-2's; or the folder holding it) "
     "that encodes prompt (text) and decodes what generate prints"},
    {"init_from", MGPU_CFG_T_PATH, F(init_from), NULL, 0, 0,
     "gpt: start from these GPT-2 weights instead of the seed's: Hugging Face model.safetensors "
     "(or the model's folder holding it) or llm.c's gpt2_124M.bin (a checkpoint to resume from "
     "wins; empty: none)"},
    {"export", MGPU_CFG_T_OUTPATH, F(export_file), NULL, 0, 0,
     "gpt: rank 0 writes the trained model to this .safetensors file (a folder: its "
     "model.safetensors) and a config.json beside it, a folder GPT2LMHeadModel.from_pretrained "
     "loads (empty: none)"},
};
const size_t mgpu_cfg_n_keys = sizeof mgpu_cfg_keys / sizeof mgpu_cfg_keys[0];
_Static_assert(sizeof mgpu_cfg_keys / sizeof mgpu_cfg_keys[0] <=
                   sizeof(((mgpu_cfg_t *)0)->line) / sizeof(int),
               "mgpu_cfg_t.line has a slot per key");

int mgpu_cfg_keys_index(const char *name)
{
    for (size_t i = 0; i < mgpu_cfg_n_keys; i++)
        if (strcmp(mgpu_cfg_keys[i].name, name) == 0)
            return (int)i;
    return -1;
}

int mgpu_cfg_keys_line(const mgpu_cfg_t *cfg, const char *name)
{
    return cfg->line[mgpu_cfg_keys_index(name)];
}

/* --- values -------------------------------------------------------------------------------- */

void mgpu_cfg_keys_list(const char *const *names, char *buf, size_t len)
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
int mgpu_cfg_keys_set(mgpu_cfg_t *cfg, const mgpu_cfg_key_t *k, const char *v, const char *base_dir,
                      const char *where, mgpu_err_t *err)
{
    char *field = (char *)cfg + k->off;
    char accepted[256];

    if (*v == 0 && k->type != MGPU_CFG_T_PATH && k->type != MGPU_CFG_T_OUTPATH &&
        k->type != MGPU_CFG_T_STR && k->type != MGPU_CFG_T_PATHS)
        return mgpu_err_set(err, MGPU_E_CONFIG, "%s: %s has no value (%s)", where, k->name, k->doc);
    switch (k->type) {
    case MGPU_CFG_T_ENUM:
        for (int i = 0; k->names[i] != NULL; i++)
            if (strcasecmp(v, k->names[i]) == 0) {
                memcpy(field, &i, sizeof i);
                return 0;
            }
        mgpu_cfg_keys_list(k->names, accepted, sizeof accepted);
        return mgpu_err_set(err, MGPU_E_CONFIG, "%s: %s = '%s': expected one of %s", where, k->name,
                            v, accepted);
    case MGPU_CFG_T_INT:
    case MGPU_CFG_T_LL: {
        long long x;
        if (parse_ll(v, &x) < 0 || x < k->min || x > k->max)
            return mgpu_err_set(err, MGPU_E_CONFIG,
                                "%s: %s = '%s': expected an integer in [%.0f, %.0f]", where,
                                k->name, v, k->min, k->max);
        if (k->type == MGPU_CFG_T_INT) {
            int i = (int)x;
            memcpy(field, &i, sizeof i);
        } else {
            memcpy(field, &x, sizeof x);
        }
        return 0;
    }
    case MGPU_CFG_T_U64: {
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
    case MGPU_CFG_T_DBL: {
        double x;
        if (parse_double(v, &x) < 0 || x < k->min || x > k->max)
            return mgpu_err_set(err, MGPU_E_CONFIG, "%s: %s = '%s': expected a number in [%g, %g]",
                                where, k->name, v, k->min, k->max);
        memcpy(field, &x, sizeof x);
        return 0;
    }
    case MGPU_CFG_T_BOOL: {
        int b = parse_bool(v);
        if (b < 0)
            return mgpu_err_set(err, MGPU_E_CONFIG,
                                "%s: %s = '%s': expected true or false (also yes/no, on/off, 1/0)",
                                where, k->name, v);
        memcpy(field, &b, sizeof b);
        return 0;
    }
    case MGPU_CFG_T_STR:
        if (snprintf(field, MGPU_CFG_PATH_MAX, "%s", v) >= MGPU_CFG_PATH_MAX)
            return mgpu_err_set(err, MGPU_E_CONFIG, "%s: %s: value longer than %d bytes", where,
                                k->name, MGPU_CFG_PATH_MAX - 1);
        return 0;
    case MGPU_CFG_T_PATH:
    case MGPU_CFG_T_OUTPATH: {
        int n;
        if (*v == 0 || *v == '/' || base_dir == NULL || *base_dir == 0 ||
            k->type == MGPU_CFG_T_OUTPATH)
            n = snprintf(field, MGPU_CFG_PATH_MAX, "%s", v);
        else
            n = snprintf(field, MGPU_CFG_PATH_MAX, "%s/%s", base_dir, v);
        if (n >= MGPU_CFG_PATH_MAX)
            return mgpu_err_set(err, MGPU_E_CONFIG, "%s: %s: path longer than %d bytes", where,
                                k->name, MGPU_CFG_PATH_MAX - 1);
        return 0;
    }
    case MGPU_CFG_T_PATHS: {
        size_t at = 0;
        *field = 0;
        for (const char *p = v; *p != 0;) {
            size_t len = strcspn(p, ",");
            const char *e = p;
            size_t el = len;
            while (el > 0 && (*e == ' ' || *e == '\t'))
                e++, el--;
            while (el > 0 && (e[el - 1] == ' ' || e[el - 1] == '\t'))
                el--;
            if (el > 0) {
                int rel = *e != '/' && base_dir != NULL && *base_dir != 0;
                int n =
                    snprintf(field + at, MGPU_CFG_PATH_MAX - at, "%s%s%s%.*s", at > 0 ? "," : "",
                             rel ? base_dir : "", rel ? "/" : "", (int)el, e);
                if (n < 0 || (size_t)n >= MGPU_CFG_PATH_MAX - at)
                    return mgpu_err_set(err, MGPU_E_CONFIG, "%s: %s: paths longer than %d bytes",
                                        where, k->name, MGPU_CFG_PATH_MAX - 1);
                at += (size_t)n;
            }
            p += len + (p[len] == ',');
        }
        return 0;
    }
    case MGPU_CFG_T_HIDDEN: {
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
    case MGPU_CFG_T_BETAS: {
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
    for (size_t i = 0; i < mgpu_cfg_n_keys; i++) {
        const mgpu_cfg_key_t *k = &mgpu_cfg_keys[i];
        const char *field = (const char *)cfg + k->off;
        char accepted[256];
        fprintf(out, "# %s", k->doc);
        if (k->type == MGPU_CFG_T_ENUM) {
            mgpu_cfg_keys_list(k->names, accepted, sizeof accepted);
            fprintf(out, " [%s]", accepted);
        }
        /* Keys left at their default are written commented out, so that reading the output
         * back sets exactly the keys the original set and passes the same checks. */
        fprintf(out, "\n%s%s = ", cfg->line[i] != 0 ? "" : "# ", k->name);
        switch (k->type) {
        case MGPU_CFG_T_ENUM: {
            int v;
            memcpy(&v, field, sizeof v);
            fprintf(out, "%s\n", k->names[v]);
            break;
        }
        case MGPU_CFG_T_INT:
        case MGPU_CFG_T_BOOL: {
            int v;
            memcpy(&v, field, sizeof v);
            if (k->type == MGPU_CFG_T_BOOL)
                fprintf(out, "%s\n", v ? "true" : "false");
            else
                fprintf(out, "%d\n", v);
            break;
        }
        case MGPU_CFG_T_LL: {
            long long v;
            memcpy(&v, field, sizeof v);
            fprintf(out, "%lld\n", v);
            break;
        }
        case MGPU_CFG_T_U64: {
            uint64_t v;
            memcpy(&v, field, sizeof v);
            fprintf(out, "%llu\n", (unsigned long long)v);
            break;
        }
        case MGPU_CFG_T_DBL: {
            double v;
            memcpy(&v, field, sizeof v);
            char b[40];
            fprintf(out, "%s\n", fmt_double(v, b, sizeof b));
            break;
        }
        case MGPU_CFG_T_PATH:
        case MGPU_CFG_T_OUTPATH:
        case MGPU_CFG_T_STR:
        case MGPU_CFG_T_PATHS:
            fprintf(out, "%s\n", field);
            break;
        case MGPU_CFG_T_HIDDEN:
            for (int j = 0; j < cfg->n_hidden; j++)
                fprintf(out, "%s%d", j ? "," : "", cfg->hidden[j]);
            fprintf(out, "\n");
            break;
        case MGPU_CFG_T_BETAS: {
            char b1[40], b2[40];
            fprintf(out, "%s, %s\n", fmt_double(cfg->beta1, b1, sizeof b1),
                    fmt_double(cfg->beta2, b2, sizeof b2));
            break;
        }
        }
    }
}
