/* cfg_keys.h - the table of train.cfg's keys (type, field, accepted values, range, the line
 * of documentation that mgpu_cfg_write prints) and the parsing of one value: what cfg.c's
 * parser, its cross-key checks and mgpu_cfg_write share. A new key is one line in the table
 * (cfg_keys.c) and one in configs/README.md.
 *
 * Everything here is constant or writes into the caller's mgpu_cfg_t. */
#ifndef MGPU_CFG_KEYS_H
#define MGPU_CFG_KEYS_H

#include <stddef.h> /* size_t */

#include "cfg.h"   /* mgpu_cfg_t */
#include "error.h" /* mgpu_err_t */

typedef enum mgpu_cfg_ktype {
    MGPU_CFG_T_ENUM, /* int-sized enum field, value one of names[] */
    MGPU_CFG_T_INT,  /* int */
    MGPU_CFG_T_LL,   /* long long */
    MGPU_CFG_T_U64,  /* uint64_t */
    MGPU_CFG_T_DBL,  /* double */
    MGPU_CFG_T_BOOL, /* int 0/1 */
    MGPU_CFG_T_PATH, /* char[MGPU_CFG_PATH_MAX], an input: resolved against the cfg's directory */
    MGPU_CFG_T_OUTPATH, /* char[MGPU_CFG_PATH_MAX], an output: kept as written */
    MGPU_CFG_T_HIDDEN,  /* "256,256" into hidden[] and n_hidden */
    MGPU_CFG_T_BETAS,   /* "0.9, 0.999" into beta1, beta2 */
    MGPU_CFG_T_STR,     /* char[MGPU_CFG_PATH_MAX], kept as written (may be empty) */
    MGPU_CFG_T_PATHS,   /* char[MGPU_CFG_PATH_MAX], inputs separated by commas (each may be a
                         * glob pattern), each resolved against the cfg's directory */
} mgpu_cfg_ktype_t;

typedef struct mgpu_cfg_key {
    const char *name;
    mgpu_cfg_ktype_t type;
    size_t off;
    const char *const *names; /* T_ENUM: accepted values, in enum order, NULL-terminated */
    double min, max;          /* T_INT, T_LL, T_DBL: inclusive range */
    const char *doc;
} mgpu_cfg_key_t;

/* The keys, in the order of mgpu_cfg_write and configs/README.md; mgpu_cfg_t.line[i] is where
 * key i was set. */
extern const mgpu_cfg_key_t mgpu_cfg_keys[];
extern const size_t mgpu_cfg_n_keys;

/* The accepted values of the enum keys, as the messages name them. */
extern const char *const mgpu_cfg_dataset_names[];
extern const char *const mgpu_cfg_model_names[];

/* The index of key name in mgpu_cfg_keys, -1 when there is none. */
int mgpu_cfg_keys_index(const char *name);
/* Where key name was set: its line, 0 (default) or -1 (command line). */
int mgpu_cfg_keys_line(const mgpu_cfg_t *cfg, const char *name);
/* "a, b, c" from a NULL-terminated list, for messages. */
void mgpu_cfg_keys_list(const char *const *names, char *buf, size_t len);
/* Parses v as key k's value into cfg; where ("file:line" or "command line") starts the
 * message of a bad value, which names the key, the value and what is accepted. */
int mgpu_cfg_keys_set(mgpu_cfg_t *cfg, const mgpu_cfg_key_t *k, const char *v, const char *base_dir,
                      const char *where, mgpu_err_t *err);

#endif
