/* cfg.c - train.cfg: defaults, the parser of lines and overrides, and the cross-key checks.
 * The keys themselves (types, ranges, documentation) and mgpu_cfg_write are cfg_keys.c's
 * table, which the parser and the messages read. */
#include "cfg.h"

#include "cfg_keys.h" /* the key table, mgpu_cfg_keys_set */

#include <errno.h>    /* errno */
#include <limits.h>   /* INT_MAX */
#include <math.h>     /* isfinite */
#include <stddef.h>   /* offsetof */
#include <stdlib.h>   /* strtod, strtoll */
#include <string.h>   /* strchr, strlen */
#include <strings.h>  /* strcasecmp */
#include <sys/stat.h> /* stat, S_ISDIR */
#include <unistd.h>   /* access, read, close */

#include "atomic_file.h" /* mgpu_atomic_file_target: where an output goes */
#include "data.h"        /* mgpu_data_open_regular, mgpu_data_check_npy, mgpu_data_in_folder */
#include "bpe.h"         /* mgpu_bpe_load: the tokenizer's vocabulary */
#include "shards.h"      /* mgpu_shards_open: the token files' headers */
#include "text.h"        /* mgpu_edit_distance */
#include "tokens.h"      /* mgpu_tokens_prompt */
#include "weights.h"     /* mgpu_weights_check */

/* Limits of what is read: a cfg is a few dozen short lines. */
#define CFG_MAX_BYTES (1 << 20) /* the whole file */
#define CFG_LINE_MAX 4095       /* one line, without its '\n' */
#define SHOWN 80                /* bytes of a key or a line quoted in a message */

static int line_of(const mgpu_cfg_t *cfg, const char *name)
{
    return mgpu_cfg_keys_line(cfg, name);
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
    cfg->n_layer = 4;
    cfg->n_head = 4;
    cfg->n_embd = 128;
    cfg->context = 64;
    cfg->grad_accum = 1;
    cfg->temperature = 1.0;
    snprintf(cfg->file, sizeof cfg->file, "(defaults)");
}

/* --- lines --------------------------------------------------------------------------------- */

/* Keys of nanoGPT's and Hugging Face's configs, and the key here that means the same. */
static const char *const other_names[][2] = {
    {"block_size", "context"},
    {"n_ctx", "context"},
    {"n_positions", "context"},
    {"vocab_size", "vocab"},
    {"learning_rate", "lr"},
    {"max_iters", "max_steps"},
    {"min_lr", "lr_min"},
    {"warmup_iters", "warmup_steps"},
    {"beta1", "betas"},
    {"beta2", "betas"},
    {"gradient_accumulation_steps", "grad_accum"},
};

static int unknown_key(const char *where, const char *key, mgpu_err_t *err)
{
    char list[1024] = "";
    const char *best = NULL;
    size_t best_d = 3;
    for (size_t i = 0; i < sizeof other_names / sizeof other_names[0]; i++)
        if (strcmp(key, other_names[i][0]) == 0)
            best = other_names[i][1], best_d = 0;
    for (size_t i = 0; i < mgpu_cfg_n_keys; i++) {
        const char *name = mgpu_cfg_keys[i].name;
        size_t d = mgpu_edit_distance(key, name), n = strlen(name), k = strlen(key);
        /* a known key with a part added (checkpoint_dir, lr_schedule) or left off (batch) */
        if (best_d > 0 && d >= best_d && n >= 4 && strncmp(key, name, n) == 0 && key[n] == '_')
            d = best_d - 1;
        if (best_d > 0 && d >= best_d && k >= 4 && strncmp(name, key, k) == 0 && name[k] == '_')
            d = best_d - 1;
        if (d < best_d)
            best_d = d, best = mgpu_cfg_keys[i].name;
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "",
                 mgpu_cfg_keys[i].name);
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
    ki = mgpu_cfg_keys_index(key);
    if (ki < 0)
        return unknown_key(where, key, err);
    if (lineno > 0 && cfg->line[ki] > 0 && strcmp(cfg->file, name) == 0)
        return mgpu_err_set(err, MGPU_E_CONFIG, "%s: %s is set twice (first at line %d)", where,
                            key, cfg->line[ki]);
    int rc = mgpu_cfg_keys_set(cfg, &mgpu_cfg_keys[ki], val, base_dir, where, err);
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

int mgpu_cfg_read(const char *path, mgpu_cfg_t *cfg, mgpu_err_t *err)
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
    return rc;
}

int mgpu_cfg_load(const char *path, mgpu_cfg_t *cfg, mgpu_err_t *err)
{
    int rc = mgpu_cfg_read(path, cfg, err);
    return rc < 0 ? rc : mgpu_cfg_check(cfg, err);
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

/* An output: its directory exists and is writable, and the file, if there, is no directory;
 * for a link, the folder of the file it points to, and a device (/dev/null) or descriptor
 * (/dev/stdout), written in place, must itself be writable (atomic_file.h). */
static int check_out(const mgpu_cfg_t *cfg, const char *key, const char *given, mgpu_err_t *err)
{
    char dir[MGPU_CFG_PATH_MAX], w[MGPU_CFG_PATH_MAX + 32], path[MGPU_CFG_PATH_MAX];
    struct stat st;
    mgpu_err_t terr = {0};
    int in_place;
    if (*given == 0)
        return 0;
    if (stat(given, &st) == 0 && S_ISDIR(st.st_mode))
        return mgpu_err_set(err, MGPU_E_CONFIG, "%s: %s = '%s': is a directory, expected a file",
                            at(cfg, key, w, sizeof w), key, given);
    if (mgpu_atomic_file_target(given, path, sizeof path, &in_place, &terr) < 0)
        return mgpu_err_set(err, MGPU_E_CONFIG, "%s: %s = '%s': %s", at(cfg, key, w, sizeof w), key,
                            given, terr.msg);
    if (in_place) {
        if (access(path, W_OK) != 0)
            return mgpu_err_set(err, MGPU_E_CONFIG, "%s: %s = '%s': %s", at(cfg, key, w, sizeof w),
                                key, given, strerror(errno));
        return 0;
    }
    /* the folder the file goes to: there, and writable (a checkpoint or an export arrives
     * through a new file and a rename) */
    const char *slash = strrchr(path, '/');
    if (slash == NULL)
        snprintf(dir, sizeof dir, ".");
    else
        snprintf(dir, sizeof dir, "%.*s", slash == path ? 1 : (int)(slash - path), path);
    int bad = stat(dir, &st) != 0 ? errno : !S_ISDIR(st.st_mode) ? ENOTDIR : 0;
    if (bad == 0 && access(dir, W_OK | X_OK) != 0)
        bad = errno;
    if (bad != 0)
        return mgpu_err_set(err, MGPU_E_CONFIG, "%s: %s = '%s': directory '%s': %s",
                            at(cfg, key, w, sizeof w), key, given, dir, strerror(bad));
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

int mgpu_cfg_resumes(const mgpu_cfg_t *cfg)
{
    return cfg->checkpoint[0] != 0 && access(cfg->checkpoint, F_OK) == 0;
}

/* init_from's weights fit the cfg's GPT (unless a checkpoint is resumed instead); export is a
 * .safetensors file in a writable folder, or a folder (then its model.safetensors). */
static int check_weights(mgpu_cfg_t *cfg, mgpu_err_t *err)
{
    const char *ext = ".safetensors";
    size_t n = strlen(cfg->export_file), ne = strlen(ext);
    char w[MGPU_CFG_PATH_MAX + 32];
    struct stat st;
    int rc;

    /* A folder, as save_pretrained takes: its model.safetensors (config.json beside it). */
    if (n > 0) {
        char file[sizeof cfg->export_file];
        mgpu_err_t e = {0};
        if (mgpu_data_in_folder(cfg->export_file, "model.safetensors", "export", file, sizeof file,
                                &e) < 0)
            return mgpu_err_set(err, MGPU_E_CONFIG, "%s: %s", at(cfg, "export", w, sizeof w),
                                e.msg);
        memcpy(cfg->export_file, file, sizeof file);
        n = strlen(cfg->export_file);
    }

    if (cfg->init_from[0] != 0 && !mgpu_cfg_resumes(cfg)) {
        mgpu_gpt_spec_t spec = {.n_layer = cfg->n_layer,
                                .n_head = cfg->n_head,
                                .n_embd = cfg->n_embd,
                                .context = cfg->context,
                                .vocab = cfg->vocab};
        mgpu_err_t e = {0};
        if (mgpu_weights_check(cfg->init_from, &spec, &e) < 0)
            return mgpu_err_set(err, MGPU_E_CONFIG, "%s: init_from: %s",
                                at(cfg, "init_from", w, sizeof w), e.msg);
    }
    if (n > 0 && (n <= ne || strcmp(cfg->export_file + n - ne, ext) != 0))
        return mgpu_err_set(err, MGPU_E_CONFIG,
                            "%s: export = '%s': expected a file name ending in .safetensors "
                            "(from_pretrained reads model.safetensors)",
                            at(cfg, "export", w, sizeof w), cfg->export_file);
    if ((rc = check_out(cfg, "export", cfg->export_file, err)) < 0)
        return rc;
    if (n > 0) { /* config.json goes beside it */
        char json[MGPU_CFG_PATH_MAX + 16];
        const char *slash = strrchr(cfg->export_file, '/');
        snprintf(json, sizeof json, "%.*sconfig.json",
                 slash ? (int)(slash - cfg->export_file + 1) : 0, cfg->export_file);
        if (stat(json, &st) == 0 && S_ISDIR(st.st_mode))
            return mgpu_err_set(err, MGPU_E_CONFIG,
                                "%s: export = '%s': %s, where its config.json goes, is a "
                                "directory",
                                at(cfg, "export", w, sizeof w), cfg->export_file, json);
    }
    return 0;
}

/* model = gpt and its data (text, tokens): the keys that only it reads, the shape, the file
 * (read and checked token by token, so a bad id is refused before a run starts) and the
 * splits, each long enough for one window of context + 1 tokens. */
static int check_gpt(mgpu_cfg_t *cfg, mgpu_err_t *err)
{
    static const char *const mlp_keys[] = {
        "samples", "features",           "classes",   "hidden",     "activation", "loss", "data_x",
        "data_y",  "clusters_per_class", "class_sep", "cluster_std"};
    int gpt = cfg->model == MGPU_MODEL_GPT, text = cfg->dataset == MGPU_DATASET_TEXT;
    int lm = text || cfg->dataset == MGPU_DATASET_TOKENS;
    char w[MGPU_CFG_PATH_MAX + 32];
    int rc;

    CONFLICT(gpt && !lm, "model dataset",
             "model = gpt needs dataset = text or tokens (dataset is %s)",
             mgpu_cfg_dataset_names[cfg->dataset]);
    CONFLICT(!gpt, "dataset model", "dataset = %s needs model = gpt (model is %s)",
             mgpu_cfg_dataset_names[cfg->dataset], mgpu_cfg_model_names[cfg->model]);
    for (size_t i = 0; i < sizeof mlp_keys / sizeof mlp_keys[0]; i++) {
        char names[64];
        snprintf(names, sizeof names, "%s model", mlp_keys[i]);
        CONFLICT(line_of(cfg, mlp_keys[i]) != 0, names, "%s is not read by model = gpt; remove it",
                 mlp_keys[i]);
    }
    CONFLICT(line_of(cfg, text ? "data_tokens" : "data_text") != 0,
             text ? "data_tokens dataset" : "data_text dataset", "%s needs dataset = %s",
             text ? "data_tokens" : "data_text", text ? "tokens" : "text");
    CONFLICT(cfg->mode == MGPU_MODE_DP, "mode model",
             "model = gpt trains with mode = ddp only (one process per device)");
    CONFLICT(cfg->n_embd % cfg->n_head != 0, "n_embd n_head",
             "n_embd = %d is not a multiple of n_head = %d (each head is n_embd / n_head wide)",
             cfg->n_embd, cfg->n_head);
    if (text) {
        CONFLICT(line_of(cfg, "vocab") != 0 && cfg->vocab != 256, "vocab dataset",
                 "vocab = %d with dataset = text, whose tokens are bytes: expected 256 (or no "
                 "vocab)",
                 cfg->vocab);
        cfg->vocab = 256;
    } else {
        CONFLICT(line_of(cfg, "vocab") == 0, "dataset vocab",
                 "dataset = tokens needs vocab (token ids are below it)");
    }
    CONFLICT(cfg->top_k > cfg->vocab, "top_k vocab", "top_k = %d, expected at most vocab = %d",
             cfg->top_k, cfg->vocab);
    if (line_of(cfg, "optimizer") == 0)
        cfg->optimizer = MGPU_OPTIM_ADAMW;
    CONFLICT(cfg->optimizer != MGPU_OPTIM_ADAMW, "optimizer model",
             "model = gpt trains with optimizer = adamw");
    if (line_of(cfg, "lr_min") == 0)
        cfg->lr_min = cfg->lr;
    /* A language model's run is counted in steps: max_steps alone sets its length. */
    if (line_of(cfg, "epochs") == 0 && cfg->max_steps > 0)
        cfg->epochs = cfg->max_steps;
    CONFLICT(cfg->lr_min > cfg->lr, "lr_min lr", "lr_min = %g is above lr = %g", cfg->lr_min,
             cfg->lr);

    CONFLICT(text && line_of(cfg, "data_val_tokens") != 0, "data_val_tokens dataset",
             "data_val_tokens needs dataset = tokens (dataset is text)");
    CONFLICT(text && line_of(cfg, "tokenizer") != 0, "tokenizer dataset",
             "tokenizer needs dataset = tokens (dataset = text has bytes for tokens)");
    CONFLICT(line_of(cfg, "data_val_tokens") != 0 && cfg->eval_fraction > 0,
             "data_val_tokens eval_fraction",
             "data_val_tokens holds the evaluation's tokens: eval_fraction = %g would hold out "
             "more; remove eval_fraction",
             cfg->eval_fraction);

    if (cfg->tokenizer[0] != 0) {
        mgpu_bpe_t *tk;
        mgpu_err_t e = {0};
        if (mgpu_bpe_load(cfg->tokenizer, &tk, &e) < 0)
            return mgpu_err_set(err, MGPU_E_CONFIG, "%s: %s", at(cfg, "tokenizer", w, sizeof w),
                                e.msg);
        int tv = mgpu_bpe_vocab_size(tk);
        mgpu_bpe_free(tk);
        CONFLICT(tv > cfg->vocab, "tokenizer vocab",
                 "%s has ids up to %d, expected below vocab = %d (raise vocab)", cfg->tokenizer,
                 tv - 1, cfg->vocab);
    }
    if (cfg->generate > 0) {
        int32_t ids[MGPU_CFG_PATH_MAX];
        int n_ids;
        mgpu_err_t e = {0};
        /* With a tokenizer the prompt is text, whose ids the run computes. */
        if (mgpu_tokens_prompt(cfg->prompt, text || cfg->tokenizer[0] != 0,
                               text || cfg->tokenizer[0] != 0 ? 256 : cfg->vocab, ids,
                               MGPU_CFG_PATH_MAX, &n_ids, &e) < 0)
            return mgpu_err_set(err, MGPU_E_CONFIG, "%s: %s", at(cfg, "prompt", w, sizeof w),
                                e.msg);
    }
    if ((rc = check_weights(cfg, err)) < 0)
        return rc;
    const char *key = text ? "data_text" : "data_tokens";
    const char *path = text ? cfg->data_text : cfg->data_tokens;
    if (*path == 0)
        return mgpu_err_set(err, MGPU_E_CONFIG, "%s: dataset = %s needs %s (a file)",
                            at(cfg, "dataset", w, sizeof w), mgpu_cfg_dataset_names[cfg->dataset],
                            key);
    /* The headers and sizes of every file now; the ids as the run reads its windows. */
    mgpu_shards_t sh = {0}, val = {0};
    mgpu_windows_t train = {0}, eval = {0}, none = {0};
    mgpu_err_t e = {0};
    const char *bad = NULL; /* the key whose files failed */
    const int has_val = cfg->data_val_tokens[0] != 0;
    if (mgpu_shards_open(&sh, path, key, text, cfg->vocab, &e) < 0 ||
        mgpu_windows_split(&sh, cfg->context, has_val ? 0 : cfg->eval_fraction, &train,
                           has_val ? &none : &eval, &e) < 0)
        bad = key;
    else if (has_val && (mgpu_shards_open(&val, cfg->data_val_tokens, "data_val_tokens", 0,
                                          cfg->vocab, &e) < 0 ||
                         mgpu_windows_split(&val, cfg->context, 0, &eval, &none, &e) < 0))
        bad = "data_val_tokens";
    size_t n = sh.n_tokens, n_train = train.n_tokens, w_train = train.n_windows;
    size_t n_eval = eval.n_tokens, w_eval = eval.n_windows;
    mgpu_windows_free(&train);
    mgpu_windows_free(&eval);
    mgpu_windows_free(&none);
    mgpu_shards_close(&sh);
    mgpu_shards_close(&val);
    if (bad != NULL)
        return mgpu_err_set(err, MGPU_E_CONFIG, "%s: %s: %s", at(cfg, bad, w, sizeof w), bad,
                            e.msg);
    CONFLICT(w_train == 0, "context eval_fraction",
             "%s has %zu tokens, %zu of them for training: no run of context + 1 = %d within "
             "one file (one window)",
             path, n, n_train, cfg->context + 1);
    CONFLICT((has_val || n_eval > 0) && w_eval == 0,
             has_val ? "context data_val_tokens" : "context eval_fraction",
             "the %zu held-out tokens of %s hold no run of context + 1 = %d within one file "
             "(one window)",
             n_eval, has_val ? cfg->data_val_tokens : path, cfg->context + 1);
    return 0;
}

/* Where dataset is not given, a data file names it (data_text: text, data_tokens: tokens,
 * data_x: npy) when one kind is given; and where model is not given, text and tokens are a
 * GPT's (the one model that reads them). */
static void infer_data(mgpu_cfg_t *cfg)
{
    int text = line_of(cfg, "data_text") != 0, tokens = line_of(cfg, "data_tokens") != 0;
    int npy = line_of(cfg, "data_x") != 0;

    if (line_of(cfg, "dataset") == 0 && text + tokens + npy == 1)
        cfg->dataset = text ? MGPU_DATASET_TEXT : tokens ? MGPU_DATASET_TOKENS : MGPU_DATASET_NPY;
    if (line_of(cfg, "model") == 0 &&
        (cfg->dataset == MGPU_DATASET_TEXT || cfg->dataset == MGPU_DATASET_TOKENS))
        cfg->model = MGPU_MODEL_GPT;
}

int mgpu_cfg_check(mgpu_cfg_t *cfg, mgpu_err_t *err)
{
    int rc, npy;
    int xent = cfg->loss == MGPU_LOSS_CROSS_ENTROPY, adamw = cfg->optimizer == MGPU_OPTIM_ADAMW;
    size_t n_npy = 0;

    infer_data(cfg);
    npy = cfg->dataset == MGPU_DATASET_NPY;
    if (cfg->model == MGPU_MODEL_GPT || cfg->dataset == MGPU_DATASET_TEXT ||
        cfg->dataset == MGPU_DATASET_TOKENS) {
        if ((rc = check_gpt(cfg, err)) < 0)
            return rc;
        adamw = 1;
    } else {
        static const char *const gpt_keys[] = {
            "n_layer",         "n_head",       "n_embd",    "context",    "vocab",
            "lr_min",          "warmup_steps", "grad_clip", "grad_accum", "generate",
            "prompt",          "temperature",  "top_k",     "data_text",  "data_tokens",
            "data_val_tokens", "tokenizer",    "init_from", "export",     "recompute"};
        for (size_t i = 0; i < sizeof gpt_keys / sizeof gpt_keys[0]; i++) {
            char names[64];
            snprintf(names, sizeof names, "%s model", gpt_keys[i]);
            CONFLICT(line_of(cfg, gpt_keys[i]) != 0, names, "%s needs model = gpt (model is %s)",
                     gpt_keys[i], mgpu_cfg_model_names[cfg->model]);
        }
    }

    /* Data. */
    CONFLICT(npy && line_of(cfg, "samples") != 0, "samples dataset",
             "samples is read from data_x with dataset = npy; remove it");
    CONFLICT(npy && line_of(cfg, "features") != 0, "features dataset",
             "features is read from data_x with dataset = npy; remove it");
    CONFLICT(!npy && line_of(cfg, "data_x") != 0, "data_x dataset",
             "data_x is only read with dataset = npy (dataset is %s)",
             mgpu_cfg_dataset_names[cfg->dataset]);
    CONFLICT(!npy && line_of(cfg, "data_y") != 0, "data_y dataset",
             "data_y is only read with dataset = npy (dataset is %s)",
             mgpu_cfg_dataset_names[cfg->dataset]);
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
    CONFLICT(cfg->checkpoint_interval > 0 && cfg->checkpoint[0] == 0,
             "checkpoint_interval checkpoint",
             "checkpoint_interval is set but checkpoint (the file) is not");
    if ((rc = check_out(cfg, "metrics_file", cfg->metrics_file, err)) < 0 ||
        (rc = check_out(cfg, "checkpoint", cfg->checkpoint, err)) < 0)
        return rc;
    CONFLICT(cfg->mode == MGPU_MODE_DDP && line_of(cfg, "dp_devices") != 0, "dp_devices mode",
             "dp_devices needs mode = dp (with ddp the launcher's --nproc_per_node decides)");
    CONFLICT(cfg->mode == MGPU_MODE_DP && cfg->checkpoint[0] != 0, "checkpoint mode",
             "checkpoint is not supported with mode = dp; use mode = ddp or remove checkpoint");
    CONFLICT(cfg->mode == MGPU_MODE_DP && cfg->zero != 0, "zero mode",
             "zero = 1 shards the optimizer over DDP's ranks; mode = dp steps one optimizer on "
             "device 0: use mode = ddp or zero = 0");
    return 0;
}
