/* shards.h - a language model's token files, mapped, and the windows a sampler draws from
 * them.
 *
 * A data set is one file, a comma-separated list of files, or glob patterns
 * (fineweb_train_*.bin, matches sorted by name), each file one of:
 *   llm.c shard    a 256 x int32 header ([0] magic 20240520, [1] version 1, [2] token count)
 *                  then count little-endian uint16 ids; or magic 20240801, version 7, uint32
 *                  ids (llm.c's Llama-3 shards). The size must be 1024 + width * count.
 *   raw uint16     nanoGPT's .bin: little-endian uint16 ids, no header
 *   bytes          (text) every byte is a token
 * A file whose first int32 is one of the two magics is read as an llm.c shard.
 *
 * Files are mapped read-only (mmap, MAP_SHARED), never copied: a window is copied into the
 * caller's batch when it is read, and the pages it touched are dropped from the process's
 * mapping afterwards (MADV_DONTNEED, which leaves them in the page cache), so a rank's
 * resident memory stays at its batch however much of the data set an epoch visits, and the
 * ranks of a node share one copy of the data in the page cache. A file cut shorter during the
 * run (its next read past the new end would be a SIGBUS) fails that read, MGPU_E_CONFIG naming
 * the file and the token.
 *
 * Windows are context + 1 tokens at stride context inside one span of one file: a file
 * boundary never falls inside a window. The held-out split (eval_fraction) is the tail of the
 * concatenated files; with one file it is that file's tail. Every id is checked against vocab
 * as its window is read, before a model sees it; an id out of range is MGPU_E_CONFIG naming the
 * file and the token's position.
 *
 * Ownership: mgpu_shards_open maps the files into s; mgpu_shards_close unmaps them (safe on a
 * zeroed or closed value). A windows value points into its shards and owns its spans
 * (mgpu_windows_free). */
#ifndef MGPU_SHARDS_H
#define MGPU_SHARDS_H

#include <stddef.h> /* size_t */
#include <stdint.h> /* int32_t */

#include "error.h" /* mgpu_err_t */

#define MGPU_SHARD_MAGIC 20240520     /* llm.c: version 1, uint16 tokens */
#define MGPU_SHARD_MAGIC_U32 20240801 /* llm.c: version 7, uint32 tokens */
#define MGPU_SHARD_HEADER_BYTES 1024  /* 256 x int32 */

typedef struct mgpu_shard {
    char *path;
    const unsigned char *map; /* the whole file, or NULL for an empty one */
    size_t map_len;
    size_t header; /* bytes before the first token: 0 or MGPU_SHARD_HEADER_BYTES */
    int width;     /* bytes per token: 1 (text), 2 or 4 */
    size_t n;      /* tokens */
} mgpu_shard_t;

typedef struct mgpu_shards {
    mgpu_shard_t *f;
    int n_files;
    size_t n_tokens; /* over all files */
    int vocab;       /* every id must be below it */
    char key[32];    /* the cfg key that named the files, for messages */
} mgpu_shards_t;

/* Maps the files of spec (see above; key names it in messages, e.g. "data_tokens"); text:
 * every file is bytes. A missing file, a pattern that matches nothing, a header with another
 * version or a count that disagrees with the file's size is MGPU_E_CONFIG naming the file. */
int mgpu_shards_open(mgpu_shards_t *s, const char *spec, const char *key, int text, int vocab,
                     mgpu_err_t *err);
void mgpu_shards_close(mgpu_shards_t *s);

/* fn(ctx, err) with its reads of file's mapping guarded: should the file be cut short (or its
 * storage fail) while fn reads it, fn is left where it was (what it allocated is lost) and
 * the call fails naming the file (MGPU_E_CONFIG, or -EIO). Else fn's result. */
int mgpu_shards_guarded(const mgpu_shards_t *s, int file, int (*fn)(void *ctx, mgpu_err_t *err),
                        void *ctx, mgpu_err_t *err);

/* A contiguous run of tokens of one file and the windows it holds. */
typedef struct mgpu_span {
    int file;
    size_t start, n;     /* tokens */
    size_t first_window; /* windows of the spans before this one */
} mgpu_span_t;

typedef struct mgpu_windows {
    const mgpu_shards_t *s;
    mgpu_span_t *spans;
    int n_spans;
    int context;
    size_t n_tokens, n_windows;
} mgpu_windows_t;

/* The training and held-out windows: round(n_tokens * eval_fraction) tokens at the end of
 * the concatenated files are held out (eval is empty for 0). */
int mgpu_windows_split(const mgpu_shards_t *s, int context, double eval_fraction,
                       mgpu_windows_t *train, mgpu_windows_t *eval, mgpu_err_t *err);

/* Window w (below n_windows): its first context tokens into tok and the next context into
 * tgt (either may be NULL); every id checked against vocab. */
int mgpu_windows_read(const mgpu_windows_t *w, size_t win, int32_t *tok, int32_t *tgt,
                      mgpu_err_t *err);
void mgpu_windows_free(mgpu_windows_t *w);

/* Writes ids[0..n) as an llm.c shard at path, atomically (a reader sees the old file or the
 * whole new one): version 1 (uint16) when every id is below 65536, else version 7 (magic
 * 20240801, uint32). More than INT32_MAX ids is MGPU_E_CONFIG (the header's count is an int32).
 * *version: the version written. */
int mgpu_shards_write(const char *path, const int32_t *ids, size_t n, int *version,
                      mgpu_err_t *err);

/* One line about the files: "3 llm.c shards (uint16), 123456 tokens". */
void mgpu_shards_describe(const mgpu_shards_t *s, char *buf, size_t cap);

#endif
