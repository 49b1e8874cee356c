/* cfg.h - train.cfg, the file mgpu-worker runs: `key = value` lines, `#` comments.
 *
 *   # the article's demo
 *   model = linear          # a comment after a value needs a space before the '#'
 *   features = 5
 *
 * Every key has a default (mgpu_cfg_defaults); a file sets what it needs. Unknown keys, bad
 * values, keys set twice, keys that contradict each other and data files that do not exist
 * are MGPU_E_CONFIG with "file:line: ..." naming the key, the value and the accepted values:
 * a conflict at the line of the key written last (with the others' lines), a data file's
 * problem at the line of data_x or data_y, an override at "command line". So is a cfg that
 * is not text or too long (at its line) and one that is no regular file ("file: is a FIFO,
 * not a regular file", refused before it is opened, so it cannot block the reader).
 * Relative input paths (data_x, data_y) are resolved against the directory of the cfg file,
 * so a cfg and its data travel together; outputs (metrics_file, checkpoint) belong to the run
 * and stay relative to the working directory, as a PyTorch script's would. An override
 * "key=value" (mgpu_cfg_override, e.g. from a command line) resolves against the working
 * directory. The keys and their meaning are listed in configs/README.md and by
 * mgpu_cfg_write(), which prints a complete cfg.
 *
 * mgpu_cfg_t is a plain value owned by the caller; nothing in it needs freeing. */
#ifndef MGPU_CFG_H
#define MGPU_CFG_H

#include <stdint.h> /* uint64_t */
#include <stdio.h>  /* FILE */

#include "error.h"   /* mgpu_err_t */
#include "kernels.h" /* mgpu_act_t, mgpu_precision_t */
#include "mgpu.h"    /* mgpu_backend_t */
#include "model.h"   /* mgpu_loss_t, MGPU_MODEL_MAX_LAYERS */
#include "optim.h"   /* mgpu_optim_kind_t */

#define MGPU_CFG_PATH_MAX 1024

typedef enum mgpu_cfg_mode { MGPU_MODE_DDP = 0, MGPU_MODE_DP = 1 } mgpu_cfg_mode_t;
typedef enum mgpu_cfg_dataset {
    MGPU_DATASET_RANDOM = 0,
    MGPU_DATASET_SYNTHETIC = 1,
    MGPU_DATASET_NPY = 2,
    MGPU_DATASET_TEXT = 3,  /* data_text: bytes are tokens (vocab 256) */
    MGPU_DATASET_TOKENS = 4 /* data_tokens: little-endian uint16 token ids */
} mgpu_cfg_dataset_t;
typedef enum mgpu_cfg_model {
    MGPU_MODEL_LINEAR = 0,
    MGPU_MODEL_MLP = 1,
    MGPU_MODEL_GPT = 2
} mgpu_cfg_model_t;

typedef struct mgpu_cfg {
    /* run */
    mgpu_cfg_mode_t mode;   /* ddp: one process per device; dp: one process, all devices */
    mgpu_backend_t backend; /* collectives: auto (nccl on a GPU, else cpu), cpu, nccl */
    int dp_devices;         /* dp: devices (threads on a CPU) to use; 0 = all visible (2 on CPU) */
    mgpu_precision_t precision;
    double timeout_s; /* a collective that takes longer fails */
    /* data */
    mgpu_cfg_dataset_t dataset;
    long long samples;
    int features;
    int classes; /* classes (cross_entropy) or target size (mse); npy: 0 = infer */
    uint64_t data_seed;
    char data_x[MGPU_CFG_PATH_MAX], data_y[MGPU_CFG_PATH_MAX];
    char data_text[MGPU_CFG_PATH_MAX], data_tokens[MGPU_CFG_PATH_MAX];
    double eval_fraction;
    int clusters_per_class; /* synthetic */
    double class_sep;       /* synthetic: spread of the cluster centers */
    double cluster_std;     /* synthetic: noise around each center */
    /* model */
    mgpu_cfg_model_t model;
    int n_hidden;
    int hidden[MGPU_MODEL_MAX_LAYERS - 1];
    mgpu_act_t activation;
    mgpu_loss_t loss;
    int n_layer, n_head, n_embd, context, vocab; /* gpt (vocab 0: 256 for text) */
    /* optimizer */
    mgpu_optim_kind_t optimizer;
    double lr, momentum, dampening, weight_decay, beta1, beta2, eps;
    int nesterov;
    double lr_min;          /* gpt: the cosine schedule's end (set by the check: lr if unset) */
    long long warmup_steps; /* gpt: linear warm-up steps */
    double grad_clip;       /* gpt: global gradient norm limit (0: off) */
    long long grad_accum;   /* gpt: micro-steps per optimizer step */
    /* loop */
    long long batch_size; /* per rank, as in PyTorch's DataLoader under DDP */
    long long epochs;
    long long max_steps; /* 0: no limit; else stop after this many optimizer steps */
    int shuffle;
    uint64_t seed;       /* sampler shuffle and parameter init */
    int drop_last;       /* DistributedSampler(drop_last=) */
    int drop_last_batch; /* DataLoader(drop_last=) */
    double bucket_mb;    /* DDP gradient bucket size */
    int bucket_overlap;  /* GPU: all-reduce each bucket during backward (else after it) */
    /* output */
    long long log_interval;  /* steps between progress lines (0: none) */
    long long eval_interval; /* epochs between evaluations (0: only at the end) */
    char metrics_file[MGPU_CFG_PATH_MAX];
    char checkpoint[MGPU_CFG_PATH_MAX];
    long long checkpoint_interval;  /* steps between checkpoints (0: at the end of each epoch) */
    int demo_prints;                /* the article's "In Model: ..." / "Outside: ..." lines */
    long long generate;             /* gpt: tokens rank 0 samples after training (0: none) */
    char prompt[MGPU_CFG_PATH_MAX]; /* gpt: what sampling starts from (empty: a newline) */
    double temperature;
    int top_k; /* 0: sample from every token */
    /* GPU */
    int cuda_graph;          /* capture the step in a CUDA graph when it is eligible */
    long long timing_warmup; /* steps before the step timer starts (0: no timing) */
    /* data parallel */
    int zero;      /* 1: ZeRO-1, each rank keeps the optimizer state of its slice (zero.h) */
    int recompute; /* gpt: what backward makes again instead of keeping (mgpu_gpt_spec_t) */
    /* text data at scale */
    char data_val_tokens[MGPU_CFG_PATH_MAX]; /* gpt: held-out files (empty: eval_fraction) */
    char tokenizer[MGPU_CFG_PATH_MAX];       /* gpt: a tokenizer.json for prompt and generate */
    /* weights */
    char init_from[MGPU_CFG_PATH_MAX];   /* gpt: GPT-2 weights to start from (empty: none) */
    char export_file[MGPU_CFG_PATH_MAX]; /* gpt: the .safetensors file written at the end */

    /* Where each key was set: line in `file` (0 = default, -1 = command-line override). */
    char file[MGPU_CFG_PATH_MAX];
    int line[96];
} mgpu_cfg_t;

/* All defaults: the article's demo (Linear(5 -> 2), 90 random samples, batch 30, MSE, SGD). */
void mgpu_cfg_defaults(mgpu_cfg_t *cfg);

/* Defaults, then the file, without the cross-key checks: for a caller that applies overrides
 * (mgpu_cfg_override) before it checks the whole (mgpu_cfg_check), so that an override can
 * replace a value the file's checks would refuse, such as a data file that does not exist. */
int mgpu_cfg_read(const char *path, mgpu_cfg_t *cfg, mgpu_err_t *err);
/* Defaults, then the file, then the cross-key checks (mgpu_cfg_check). */
int mgpu_cfg_load(const char *path, mgpu_cfg_t *cfg, mgpu_err_t *err);

/* Parses text as if it were the file `name` in directory base_dir (NULL: the working
 * directory) over the values already in cfg; no cross-key checks. */
int mgpu_cfg_parse(const char *text, const char *name, const char *base_dir, mgpu_cfg_t *cfg,
                   mgpu_err_t *err);

/* One "key=value" override (e.g. from the command line), after the file: it may set a key
 * the file set. Call mgpu_cfg_check afterwards. */
int mgpu_cfg_override(mgpu_cfg_t *cfg, const char *assignment, mgpu_err_t *err);

/* Cross-key checks and derived defaults (weight_decay by optimizer, data files exist, ...). */
int mgpu_cfg_check(mgpu_cfg_t *cfg, mgpu_err_t *err);

/* Whether a run resumes rather than starts: the checkpoint file is there (its weights then
 * replace init_from's, which is neither checked nor read). */
int mgpu_cfg_resumes(const mgpu_cfg_t *cfg);

/* Writes every key with its current value and a comment saying what it does: keys set by the
 * file or an override as `key = value`, the others commented out (`# key = value`), so the
 * output loads back to the same settings. Paths are written as resolved. */
void mgpu_cfg_write(const mgpu_cfg_t *cfg, FILE *out);

#endif
