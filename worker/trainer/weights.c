/* weights.c - GPT-2 weights from Hugging Face's safetensors and llm.c's checkpoints, and the
 * export to a Hugging Face folder (model.safetensors and config.json). */
#include "weights.h"

#include <cjson/cJSON.h> /* config.json */
#include <errno.h>       /* ENOMEM */
#include <stdint.h>      /* int32_t, uint16_t */
#include <stdio.h>       /* snprintf */
#include <stdlib.h>      /* malloc, free */
#include <string.h>      /* memcpy, strcmp, strrchr */
#include <sys/mman.h>    /* mmap, munmap */
#include <sys/stat.h>    /* stat */
#include <sys/uio.h>     /* struct iovec */
#include <unistd.h>      /* close, pread, access, getpid, unlink */

#include "atomic_file.h" /* mgpu_atomic_file_write, mgpu_atomic_file_commit */
#include "data.h"        /* mgpu_data_open_regular */
#include "dtype.h"       /* mgpu_dtype_bf16_to_f32 */
#include "safetensors.h" /* mgpu_st_* */

/* llm.c's gpt2_124M.bin (train_gpt2.py's write_model, train_gpt2.c's
 * gpt2_build_from_checkpoint). */
#define LLMC_MAGIC 20240326
#define LLMC_FP32 3
#define LLMC_BF16 5
#define LLMC_HEADER 256 /* int32 words */

#define HF_PREFIX "transformer."

static const char *const block_names[MGPU_W_PER_LAYER] = {
    "ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
    "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};
int mgpu_weights_count(const mgpu_gpt_spec_t *spec)
{
    return 4 + MGPU_W_PER_LAYER * spec->n_layer;
}

static void add(mgpu_weights_tensor_t *t, int *i, size_t *at, const char *name, int rows, int cols,
                int conv1d)
{
    mgpu_weights_tensor_t *w = &t[(*i)++];
    snprintf(w->hf, sizeof w->hf, "%s", name);
    w->off = *at;
    w->rows = rows;
    w->cols = cols;
    w->conv1d = conv1d;
    *at += (size_t)rows * (size_t)(cols > 0 ? cols : 1);
}

void mgpu_weights_layout(const mgpu_gpt_spec_t *spec, mgpu_weights_tensor_t *t, size_t *n_params)
{
    const int C = spec->n_embd;
    /* [out, in] of each block tensor (in 0: a vector), and whether it is a Conv1D weight */
    const int rows[MGPU_W_PER_LAYER] = {C, C, 3 * C, 3 * C, C, C, C, C, 4 * C, 4 * C, C, C};
    const int cols[MGPU_W_PER_LAYER] = {0, 0, C, 0, C, 0, 0, 0, C, 0, 4 * C, 0};
    size_t at = 0;
    int i = 0;
    char name[64];

    add(t, &i, &at, HF_PREFIX "wte.weight", spec->vocab, C, 0);
    add(t, &i, &at, HF_PREFIX "wpe.weight", spec->context, C, 0);
    for (int l = 0; l < spec->n_layer; l++)
        for (int k = 0; k < MGPU_W_PER_LAYER; k++) {
            snprintf(name, sizeof name, HF_PREFIX "h.%d.%s", l, block_names[k]);
            add(t, &i, &at, name, rows[k], cols[k], cols[k] > 0);
        }
    add(t, &i, &at, HF_PREFIX "ln_f.weight", C, 0, 0);
    add(t, &i, &at, HF_PREFIX "ln_f.bias", C, 0, 0);
    if (n_params != NULL)
        *n_params = at;
}

/* A layout's tensors, malloc'd. */
static mgpu_weights_tensor_t *layout(const mgpu_gpt_spec_t *spec, size_t *n_params, mgpu_err_t *err)
{
    mgpu_weights_tensor_t *t = malloc(sizeof *t * (size_t)mgpu_weights_count(spec));
    if (t == NULL)
        mgpu_err_set(err, -ENOMEM, "weights: malloc for %d tensors failed",
                     mgpu_weights_count(spec));
    else
        mgpu_weights_layout(spec, t, n_params);
    return t;
}

/* "[a, b]" of a file's tensor. */
static void shape_str(const mgpu_st_tensor_t *t, char *buf, size_t cap)
{
    int n = snprintf(buf, cap, "[");
    for (int d = 0; d < t->ndim && n < (int)cap; d++)
        n += snprintf(buf + n, cap - (size_t)n, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    if (n < (int)cap)
        snprintf(buf + n, cap - (size_t)n, "]");
}

/* --- Hugging Face ---------------------------------------------------------------------------- */

/* The causal-mask buffers that older GPT-2 files carry beside the parameters. */
static int is_mask_buffer(const char *name)
{
    int l, n = 0;
    char rest[32];
    if (sscanf(name, "h.%d.attn.%31s%n", &l, rest, &n) != 2 || name[n] != 0)
        return 0;
    return strcmp(rest, "bias") == 0 || strcmp(rest, "masked_bias") == 0;
}

/* config.json beside path, where there is one: the keys that the tensors cannot tell. */
static int check_hf_config(const char *path, const mgpu_gpt_spec_t *spec, mgpu_err_t *err)
{
    char cfg[4096];
    const char *slash = strrchr(path, '/');
    snprintf(cfg, sizeof cfg, "%.*sconfig.json", slash ? (int)(slash - path + 1) : 0, path);
    if (access(cfg, F_OK) != 0)
        return 0;
    FILE *f = fopen(cfg, "rb");
    if (f == NULL)
        return mgpu_err_set(err, MGPU_E_CONFIG, "%s: cannot open: %s", cfg, strerror(errno));
    char *text = malloc(1 << 20);
    size_t n = text != NULL ? fread(text, 1, (1 << 20) - 1, f) : 0;
    fclose(f);
    if (text == NULL)
        return mgpu_err_set(err, -ENOMEM, "%s: malloc failed", cfg);
    text[n] = 0;
    cJSON *root = cJSON_ParseWithOpts(text, NULL, 0);
    free(text);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return mgpu_err_set(err, MGPU_E_CONFIG, "%s: not a JSON object", cfg);
    }
    const cJSON *nh = cJSON_GetObjectItemCaseSensitive(root, "n_head");
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "activation_function");
    const cJSON *eps = cJSON_GetObjectItemCaseSensitive(root, "layer_norm_epsilon");
    const cJSON *by_layer =
        cJSON_GetObjectItemCaseSensitive(root, "scale_attn_by_inverse_layer_idx");
    const cJSON *scaled = cJSON_GetObjectItemCaseSensitive(root, "scale_attn_weights");
    int rc = 0;
    if (cJSON_IsNumber(nh) && nh->valueint != spec->n_head)
        rc = mgpu_err_set(err, MGPU_E_CONFIG, "%s: n_head %d, the cfg has n_head = %d", cfg,
                          nh->valueint, spec->n_head);
    else if (cJSON_IsString(act) && strcmp(act->valuestring, "gelu_new") != 0 &&
             strcmp(act->valuestring, "gelu_pytorch_tanh") != 0)
        rc = mgpu_err_set(err, MGPU_E_CONFIG,
                          "%s: activation_function '%.40s', expected gelu_new (mgpu's GPT "
                          "computes GELU's tanh approximation)",
                          cfg, act->valuestring);
    else if (cJSON_IsNumber(eps) && eps->valuedouble != 1e-5)
        rc = mgpu_err_set(err, MGPU_E_CONFIG,
                          "%s: layer_norm_epsilon %g, expected 1e-05 (mgpu's LayerNorm's)", cfg,
                          eps->valuedouble);
    else if (cJSON_IsTrue(by_layer) || cJSON_IsFalse(scaled))
        rc = mgpu_err_set(err, MGPU_E_CONFIG,
                          "%s: scale_attn_by_inverse_layer_idx true or scale_attn_weights false: "
                          "mgpu's attention scales its scores by 1 / sqrt(head size) alone",
                          cfg);
    cJSON_Delete(root);
    return rc;
}

/* The file's tensor for layout tensor w, checked against its shape. */
static int hf_tensor(const mgpu_st_t *st, const char *prefix, const mgpu_gpt_spec_t *spec,
                     const mgpu_weights_tensor_t *w, int index, const mgpu_st_tensor_t **out,
                     mgpu_err_t *err)
{
    char name[80], got[96], want[64];
    snprintf(name, sizeof name, "%s%s", prefix, w->hf + strlen(HF_PREFIX));
    const mgpu_st_tensor_t *t = mgpu_st_find(st, name);
    *out = t;
    if (t == NULL)
        return mgpu_err_set(err, MGPU_E_CONFIG,
                            "%s: no tensor '%s' (the cfg's GPT-2 has n_layer = %d): another "
                            "model's file",
                            st->path, name, spec->n_layer);
    shape_str(t, got, sizeof got);
    int a = w->conv1d ? w->cols : w->rows, b = w->conv1d ? w->rows : w->cols;
    if (b > 0)
        snprintf(want, sizeof want, "[%d, %d]", a, b);
    else
        snprintf(want, sizeof want, "[%d]", a);
    if (index == 0) { /* wte: up to vocab rows */
        if (t->ndim != 2 || t->shape[1] != spec->n_embd || t->shape[0] < 1 ||
            t->shape[0] > spec->vocab)
            return mgpu_err_set(err, MGPU_E_CONFIG,
                                "%s: tensor '%s' has shape %s, expected [at most vocab = %d, "
                                "n_embd = %d]",
                                st->path, name, got, spec->vocab, spec->n_embd);
    } else if (index == 1) { /* wpe: at least context rows */
        if (t->ndim != 2 || t->shape[1] != spec->n_embd || t->shape[0] < spec->context)
            return mgpu_err_set(err, MGPU_E_CONFIG,
                                "%s: tensor '%s' has shape %s, expected [at least context = %d, "
                                "n_embd = %d]",
                                st->path, name, got, spec->context, spec->n_embd);
    } else if (t->ndim != (b > 0 ? 2 : 1) || t->shape[0] != a || (b > 0 && t->shape[1] != b)) {
        return mgpu_err_set(err, MGPU_E_CONFIG,
                            "%s: tensor '%s' has shape %s, expected %s (n_embd = %d%s)", st->path,
                            name, got, want, spec->n_embd, w->conv1d ? "; Conv1D's [in, out]" : "");
    }
    if (t->dtype != MGPU_ST_F32 && t->dtype != MGPU_ST_BF16 && t->dtype != MGPU_ST_F16 &&
        t->dtype != MGPU_ST_F64)
        return mgpu_err_set(err, MGPU_E_CONFIG,
                            "%s: tensor '%s' has dtype %s, expected F32, BF16, F16 or F64",
                            st->path, name, mgpu_st_dtype_name(t->dtype));
    return 0;
}

/* Every tensor of the file is a parameter of the layout, lm_head.weight or a mask buffer. */
static int hf_no_strangers(const mgpu_st_t *st, const char *prefix, const mgpu_gpt_spec_t *spec,
                           const mgpu_weights_tensor_t *w, int nw, mgpu_err_t *err)
{
    const size_t np = strlen(prefix);
    for (int i = 0; i < st->n; i++) {
        const char *name = st->tensors[i].name;
        int known = strcmp(name, "lm_head.weight") == 0;
        if (!known && strncmp(name, prefix, np) == 0) {
            known = is_mask_buffer(name + np);
            for (int j = 0; j < nw && !known; j++)
                known = strcmp(name + np, w[j].hf + strlen(HF_PREFIX)) == 0;
        }
        if (!known)
            return mgpu_err_set(err, MGPU_E_CONFIG,
                                "%s: unexpected tensor '%.200s': the cfg's GPT-2 (n_layer = %d) "
                                "has no such parameter",
                                st->path, name, spec->n_layer);
    }
    return 0;
}

/* lm_head.weight, of wte's shape, holds wte's values: mgpu's output layer is wte itself. */
static int hf_tied(const mgpu_st_t *st, const mgpu_st_tensor_t *head, const mgpu_st_tensor_t *wte,
                   const char *prefix, mgpu_err_t *err)
{
    const size_t n = mgpu_st_numel(wte);
    int same;
    if (head->dtype == wte->dtype) {
        same = memcmp(st->data + head->begin, st->data + wte->begin,
                      n * mgpu_st_dtype_size(wte->dtype)) == 0;
    } else {
        float *a = malloc(sizeof(float) * (n ? n : 1)), *b = malloc(sizeof(float) * (n ? n : 1));
        int rc = a == NULL || b == NULL
                     ? mgpu_err_set(err, -ENOMEM, "weights: malloc for lm_head.weight failed")
                     : 0;
        if (rc == 0 && (rc = mgpu_st_read_f32(st, head, a, err)) == 0)
            rc = mgpu_st_read_f32(st, wte, b, err);
        same = rc == 0 && memcmp(a, b, sizeof(float) * n) == 0;
        free(a);
        free(b);
        if (rc < 0)
            return rc;
    }
    if (!same)
        return mgpu_err_set(err, MGPU_E_CONFIG,
                            "%s: tensor 'lm_head.weight' differs from %swte.weight: mgpu's "
                            "output layer is tied to the token embedding",
                            st->path, prefix);
    return 0;
}

/* Reads (params not NULL) or only checks an open safetensors file. */
static int hf_read(const mgpu_st_t *st, const mgpu_gpt_spec_t *spec, float *params, size_t n_params,
                   char *what, size_t cap, mgpu_err_t *err)
{
    const char *prefix = HF_PREFIX;
    const mgpu_st_tensor_t *wte = NULL, *wpe = NULL, *t;
    size_t n;
    float *tmp = NULL;
    int rc, nw = mgpu_weights_count(spec);

    if (mgpu_st_find(st, HF_PREFIX "wte.weight") == NULL) {
        prefix = "";
        if (mgpu_st_find(st, "wte.weight") == NULL)
            return mgpu_err_set(err, MGPU_E_CONFIG,
                                "%s: no tensor transformer.wte.weight or wte.weight: not a "
                                "GPT-2 model's safetensors file (%d tensors, the first '%.200s')",
                                st->path, st->n, st->n > 0 ? st->tensors[0].name : "");
    }
    mgpu_weights_tensor_t *w = layout(spec, &n, err);
    if (w == NULL)
        return -ENOMEM;
    if (params != NULL && n != n_params) {
        rc = mgpu_err_set(err, -EINVAL, "weights: %zu parameters given, the layout has %zu",
                          n_params, n);
        goto out;
    }
    if ((rc = hf_no_strangers(st, prefix, spec, w, nw, err)) < 0)
        goto out;
    size_t most = 0;
    for (int i = 0; i < nw; i++) {
        if ((rc = hf_tensor(st, prefix, spec, &w[i], i, &t, err)) < 0)
            goto out;
        wte = i == 0 ? t : wte;
        wpe = i == 1 ? t : wpe;
        most = mgpu_st_numel(t) > most ? mgpu_st_numel(t) : most;
    }
    const mgpu_st_tensor_t *head = mgpu_st_find(st, "lm_head.weight");
    if (head != NULL &&
        (head->ndim != 2 || head->shape[0] != wte->shape[0] || head->shape[1] != wte->shape[1])) {
        char got[96];
        shape_str(head, got, sizeof got);
        rc = mgpu_err_set(err, MGPU_E_CONFIG,
                          "%s: tensor 'lm_head.weight' has shape %s, expected wte's [%lld, %lld] "
                          "(mgpu's output layer is tied to the token embedding)",
                          st->path, got, (long long)wte->shape[0], (long long)wte->shape[1]);
        goto out;
    }
    if ((head != NULL && (rc = hf_tied(st, head, wte, prefix, err)) < 0) ||
        (rc = check_hf_config(st->path, spec, err)) < 0 || params == NULL)
        goto out;
    if ((tmp = malloc(sizeof(float) * (most ? most : 1))) == NULL) {
        rc = mgpu_err_set(err, -ENOMEM, "weights: malloc of %zu floats failed", most);
        goto out;
    }
    const size_t C = (size_t)spec->n_embd;
    for (int i = 0; i < nw; i++) {
        float *dst = params + w[i].off;
        if ((rc = hf_tensor(st, prefix, spec, &w[i], i, &t, err)) < 0 ||
            (rc = mgpu_st_read_f32(st, t, tmp, err)) < 0)
            goto out;
        if (i == 0) { /* rows past the file's vocabulary: zero, as llm.c pads */
            memcpy(dst, tmp, sizeof(float) * mgpu_st_numel(t));
            memset(dst + mgpu_st_numel(t), 0,
                   sizeof(float) * ((size_t)spec->vocab - (size_t)t->shape[0]) * C);
        } else if (i == 1) { /* the first context positions */
            memcpy(dst, tmp, sizeof(float) * (size_t)spec->context * C);
        } else if (w[i].conv1d) { /* [in, out] to [out, in] */
            const size_t R = (size_t)w[i].rows, K = (size_t)w[i].cols;
            for (size_t r = 0; r < R; r++)
                for (size_t c = 0; c < K; c++)
                    dst[r * K + c] = tmp[c * R + r];
        } else {
            memcpy(dst, tmp, sizeof(float) * mgpu_st_numel(t));
        }
    }
    if (what != NULL)
        snprintf(what, cap,
                 "Hugging Face safetensors, %s, %d tensors; wte %lld of the cfg's %d rows%s, wpe "
                 "%d of %lld positions",
                 mgpu_st_dtype_name(wte->dtype), st->n, (long long)wte->shape[0], spec->vocab,
                 wte->shape[0] < spec->vocab ? " (the rest zero)" : "", spec->context,
                 (long long)wpe->shape[0]);
out:
    free(tmp);
    free(w);
    return rc;
}

/* --- llm.c ----------------------------------------------------------------------------------- */

/* Checks llm.c's header h (of a file of size bytes) against spec; *esize receives the bytes
 * of an element. */
static int llmc_check(const char *path, const int32_t *h, size_t size, const mgpu_gpt_spec_t *spec,
                      size_t *esize, mgpu_err_t *err)
{
    const int maxT = h[2], V = h[3], L = h[4], NH = h[5], C = h[6], Vp = h[7];
    if (h[1] != LLMC_FP32 && h[1] != LLMC_BF16)
        return mgpu_err_set(err, MGPU_E_CONFIG,
                            "%s: llm.c checkpoint version %d, expected 3 (fp32) or 5 (bf16)", path,
                            h[1]);
    if (maxT < 1 || V < 1 || L < 1 || NH < 1 || C < 1 || Vp < V || C % NH != 0)
        return mgpu_err_set(err, MGPU_E_CONFIG,
                            "%s: llm.c header max_seq_len %d, vocab %d, layers %d, heads %d, "
                            "channels %d, padded vocab %d: not a GPT-2 shape",
                            path, maxT, V, L, NH, C, Vp);
    if (L != spec->n_layer || NH != spec->n_head || C != spec->n_embd)
        return mgpu_err_set(err, MGPU_E_CONFIG,
                            "%s: llm.c header: %d layers, %d heads, %d channels; the cfg has "
                            "n_layer = %d, n_head = %d, n_embd = %d",
                            path, L, NH, C, spec->n_layer, spec->n_head, spec->n_embd);
    if (spec->context > maxT)
        return mgpu_err_set(err, MGPU_E_CONFIG,
                            "%s: tensor wpe has %d positions (max_seq_len), fewer than the "
                            "cfg's context = %d",
                            path, maxT, spec->context);
    if (V > spec->vocab)
        return mgpu_err_set(err, MGPU_E_CONFIG,
                            "%s: tensor wte holds a vocabulary of %d, more than the cfg's "
                            "vocab = %d",
                            path, V, spec->vocab);
    *esize = h[1] == LLMC_FP32 ? 4 : 2;
    const size_t c = (size_t)C;
    size_t count = (size_t)Vp * c + (size_t)maxT * c + (size_t)L * (12 * c * c + 13 * c) + 2 * c;
    if (size != 4 * LLMC_HEADER + count * *esize)
        return mgpu_err_set(err, MGPU_E_CONFIG,
                            "%s: %zu bytes, expected %zu (a 1024-byte header and %zu %s "
                            "parameters): truncated or another layout",
                            path, size, 4 * LLMC_HEADER + count * *esize, count,
                            *esize == 4 ? "fp32" : "bf16");
    return 0;
}

static void llmc_copy(float *dst, const uint8_t *src, size_t n, size_t esize)
{
    if (esize == 4) {
        memcpy(dst, src, sizeof(float) * n);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        uint16_t b;
        memcpy(&b, src + 2 * i, 2);
        dst[i] = mgpu_dtype_bf16_to_f32(b);
    }
}

static int llmc_read(const char *path, int fd, size_t size, const int32_t *h,
                     const mgpu_gpt_spec_t *spec, float *params, size_t n_params, char *what,
                     size_t cap, mgpu_err_t *err)
{
    size_t esize = 4, n;
    int rc = llmc_check(path, h, size, spec, &esize, err);
    if (rc < 0 || params == NULL)
        return rc;
    mgpu_weights_tensor_t *w = layout(spec, &n, err);
    if (w == NULL)
        return -ENOMEM;
    if (n != n_params) {
        free(w);
        return mgpu_err_set(err, -EINVAL, "weights: %zu parameters given, the layout has %zu",
                            n_params, n);
    }
    const uint8_t *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        free(w);
        return mgpu_err_set(err, -errno, "mmap(%s, %zu bytes): %s", path, size, strerror(errno));
    }
    const size_t C = (size_t)spec->n_embd, V = (size_t)spec->vocab, Vp = (size_t)h[7];
    const size_t rows = Vp < V ? Vp : V;
    const uint8_t *p = map + 4 * LLMC_HEADER;
    /* wte: its padded rows, cut or filled with zeros to the cfg's vocab */
    llmc_copy(params + w[0].off, p, rows * C, esize);
    memset(params + w[0].off + rows * C, 0, sizeof(float) * (V - rows) * C);
    p += Vp * C * esize;
    llmc_copy(params + w[1].off, p, (size_t)spec->context * C, esize);
    p += (size_t)h[2] * C * esize;
    for (int k = 0; k < MGPU_W_PER_LAYER; k++) /* each kind, all layers in turn */
        for (int l = 0; l < spec->n_layer; l++) {
            const mgpu_weights_tensor_t *t = &w[2 + l * MGPU_W_PER_LAYER + k];
            size_t e = (size_t)t->rows * (size_t)(t->cols > 0 ? t->cols : 1);
            llmc_copy(params + t->off, p, e, esize);
            p += e * esize;
        }
    const int last = mgpu_weights_count(spec) - 2;
    llmc_copy(params + w[last].off, p, C, esize);
    llmc_copy(params + w[last + 1].off, p + C * esize, C, esize);
    munmap((void *)map, size);
    free(w);
    if (what != NULL)
        snprintf(what, cap,
                 "llm.c checkpoint, %s; wte %d of the cfg's %d rows%s (padded vocab %d), wpe %d "
                 "of %d positions",
                 esize == 4 ? "fp32" : "bf16", h[3], spec->vocab,
                 rows < V ? " (the rest zero)" : "", h[7], spec->context, h[2]);
    return 0;
}

/* --- either ---------------------------------------------------------------------------------- */

/* A folder, as Hugging Face's from_pretrained takes: its model.safetensors, in file (cap bytes);
 * anything else as it is named. */
static int weights_file(const char *path, char *file, size_t cap, mgpu_err_t *err)
{
    static const char *const others[][2] = {
        {"model.safetensors.index.json", "a model sharded over several safetensors files"},
        {"pytorch_model.bin", "PyTorch's pickle"},
    };
    char other[4200];
    int rc = mgpu_data_in_folder(path, "model.safetensors", "init_from", file, cap, err);

    if (rc <= 0 || access(file, F_OK) == 0)
        return rc < 0 ? rc : 0;
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++)
        if (mgpu_data_in_folder(path, others[i][0], "init_from", other, sizeof other, err) > 0 &&
            access(other, F_OK) == 0)
            return mgpu_err_set(err, MGPU_E_CONFIG,
                                "%s: a folder with %s (%s) and no model.safetensors: save the "
                                "model as one safetensors file (save_pretrained(folder, "
                                "safe_serialization=True, max_shard_size=\"100GB\"))",
                                path, others[i][0], others[i][1]);
    return mgpu_err_set(err, MGPU_E_CONFIG,
                        "%s: a folder with no model.safetensors, expected a safetensors file, a "
                        "Hugging Face model folder holding one, or llm.c's weights",
                        path);
}

static int load(const char *given, const mgpu_gpt_spec_t *spec, float *params, size_t n_params,
                char *what, size_t cap, mgpu_err_t *err)
{
    int fd, rc;
    size_t size;
    int32_t h[LLMC_HEADER];
    char path[4096];

    if ((rc = weights_file(given, path, sizeof path, err)) < 0 ||
        (rc = mgpu_data_open_regular(path, "init_from", &fd, &size, err)) < 0)
        return rc;
    long got = (long)pread(fd, h, size < sizeof h ? size : sizeof h, 0);
    if (got >= 4 && h[0] == LLMC_MAGIC && size < sizeof h) {
        close(fd);
        return mgpu_err_set(err, MGPU_E_CONFIG,
                            "%s: llm.c's weights (magic %d) cut short: %zu bytes, its header "
                            "alone is %zu",
                            path, LLMC_MAGIC, size, sizeof h);
    }
    if (got == (long)sizeof h && h[0] == LLMC_MAGIC) {
        rc = llmc_read(path, fd, size, h, spec, params, n_params, what, cap, err);
        close(fd);
        return rc;
    }
    close(fd);
    mgpu_st_t *st;
    if ((rc = mgpu_st_open(path, &st, err)) < 0) {
        /* Neither format: say both were tried. */
        char m[sizeof err->msg];
        snprintf(m, sizeof m, "%s", err->msg);
        return mgpu_err_set(err, rc,
                            "%s (expected a safetensors file or llm.c's weights, magic %d)", m,
                            LLMC_MAGIC);
    }
    rc = hf_read(st, spec, params, n_params, what, cap, err);
    mgpu_st_close(st);
    return rc;
}

int mgpu_weights_check(const char *path, const mgpu_gpt_spec_t *spec, mgpu_err_t *err)
{
    return load(path, spec, NULL, 0, NULL, 0, err);
}

int mgpu_weights_load(const char *path, const mgpu_gpt_spec_t *spec, float *params, size_t n_params,
                      char *what, size_t cap, mgpu_err_t *err)
{
    return load(path, spec, params, n_params, what, cap, err);
}

/* --- export ---------------------------------------------------------------------------------- */

/* A GPT2Config for spec: what from_pretrained needs to build the same model. */
static int write_config(const char *path, const mgpu_gpt_spec_t *spec, mgpu_err_t *err)
{
    cJSON *o = cJSON_CreateObject(), *arch = cJSON_AddArrayToObject(o, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString("GPT2LMHeadModel"));
    cJSON_AddStringToObject(o, "model_type", "gpt2");
    cJSON_AddNumberToObject(o, "vocab_size", spec->vocab);
    cJSON_AddNumberToObject(o, "n_positions", spec->context);
    cJSON_AddNumberToObject(o, "n_embd", spec->n_embd);
    cJSON_AddNumberToObject(o, "n_layer", spec->n_layer);
    cJSON_AddNumberToObject(o, "n_head", spec->n_head);
    cJSON_AddNullToObject(o, "n_inner");                           /* 4 x n_embd */
    cJSON_AddStringToObject(o, "activation_function", "gelu_new"); /* the tanh approximation */
    cJSON_AddNumberToObject(o, "layer_norm_epsilon", 1e-5);
    /* mgpu trains without dropout */
    cJSON_AddNumberToObject(o, "resid_pdrop", 0.0);
    cJSON_AddNumberToObject(o, "embd_pdrop", 0.0);
    cJSON_AddNumberToObject(o, "attn_pdrop", 0.0);
    cJSON_AddNumberToObject(o, "initializer_range", 0.02);
    cJSON_AddBoolToObject(o, "scale_attn_weights", 1);
    cJSON_AddBoolToObject(o, "tie_word_embeddings", 1);
    cJSON_AddStringToObject(o, "torch_dtype", "float32");
    if (spec->vocab > 50256) { /* GPT-2's <|endoftext|> */
        cJSON_AddNumberToObject(o, "bos_token_id", 50256);
        cJSON_AddNumberToObject(o, "eos_token_id", 50256);
    }
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    if (s == NULL)
        return mgpu_err_set(err, -ENOMEM, "%s: building the JSON failed", path);
    struct iovec iov[2] = {{.iov_base = s, .iov_len = strlen(s)}, {.iov_base = "\n", .iov_len = 1}};
    int rc = mgpu_atomic_file_write(path, iov, 2, 0, err);
    free(s);
    return rc;
}

/* path can be replaced by a new file: it is not there, or it is not a folder. */
static int export_target(const char *path, mgpu_err_t *err)
{
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        return mgpu_err_set(err, -EISDIR, "export: %s is a folder, expected a file or nothing",
                            path);
    return 0;
}

int mgpu_weights_export(const char *path, const mgpu_gpt_spec_t *spec, const float *params,
                        size_t n_params, mgpu_err_t *err)
{
    size_t n;
    const int nw = mgpu_weights_count(spec);
    float *buf = NULL;
    mgpu_st_out_t *o = NULL;
    int rc;
    mgpu_weights_tensor_t *w = layout(spec, &n, err);
    if (w == NULL)
        return -ENOMEM;
    if (n != n_params) {
        rc = mgpu_err_set(err, -EINVAL, "weights: %zu parameters given, the layout has %zu",
                          n_params, n);
        goto out;
    }
    buf = malloc(sizeof(float) * (n ? n : 1));
    o = calloc((size_t)nw, sizeof *o);
    if (buf == NULL || o == NULL) {
        rc = mgpu_err_set(err, -ENOMEM, "%s: malloc of %zu floats for the export failed", path, n);
        goto out;
    }
    for (int i = 0; i < nw; i++) {
        const size_t R = (size_t)w[i].rows, K = (size_t)(w[i].cols > 0 ? w[i].cols : 1);
        float *dst = buf + w[i].off;
        o[i] = (mgpu_st_out_t){.name = w[i].hf, .dtype = MGPU_ST_F32, .data = dst};
        if (w[i].conv1d) { /* [out, in] to Conv1D's [in, out] */
            for (size_t r = 0; r < R; r++)
                for (size_t c = 0; c < K; c++)
                    dst[c * R + r] = params[w[i].off + r * K + c];
            o[i].ndim = 2;
            o[i].shape[0] = (int64_t)K;
            o[i].shape[1] = (int64_t)R;
        } else {
            memcpy(dst, params + w[i].off, sizeof(float) * R * K);
            o[i].ndim = w[i].cols > 0 ? 2 : 1;
            o[i].shape[0] = (int64_t)R;
            o[i].shape[1] = (int64_t)K;
        }
    }
    /* Both files or neither: the model goes to a file of its own first, then config.json
     * replaces its old one, then the model replaces its old one (a rename in the same folder,
     * over a file that is not a folder: checked before anything is written). */
    char cfg[4096], part[4200];
    const char *slash = strrchr(path, '/');
    snprintf(cfg, sizeof cfg, "%.*sconfig.json", slash ? (int)(slash - path + 1) : 0, path);
    if ((size_t)snprintf(part, sizeof part, "%s.part.%ld", path, (long)getpid()) >= sizeof part) {
        rc = mgpu_err_set(err, -ENAMETOOLONG, "export: path too long: %s", path);
        goto out;
    }
    if ((rc = export_target(path, err)) < 0 || (rc = export_target(cfg, err)) < 0)
        goto out;
    /* from_pretrained refuses a safetensors file whose metadata names no framework */
    const char *meta[] = {"format", "pt"};
    if ((rc = mgpu_st_write(part, o, nw, meta, 1, 0, err)) < 0)
        goto out;
    if ((rc = write_config(cfg, spec, err)) < 0 ||
        (rc = mgpu_atomic_file_commit(part, path, 0, err)) < 0)
        unlink(part);
out:
    free(o);
    free(buf);
    free(w);
    return rc;
}
