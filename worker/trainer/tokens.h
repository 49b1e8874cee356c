/* tokens.h - a language model's data: a file of token ids read whole into host memory.
 *
 *   text    every byte is a token (vocab 256): any text file, no tokenizer
 *   tokens  little-endian uint16 ids, the layout of nanoGPT's .bin files; every id is checked
 *           against vocab when the file is read, so no kernel ever sees one out of range
 *
 * The held-out split is the file's tail (mgpu_tokens_split). Training windows are context + 1
 * tokens at stride context (the last token of a window is the first of the next), so a split
 * of n tokens holds (n - 1) / context of them.
 *
 * Ownership: mgpu_tokens_load allocates ids; mgpu_tokens_free releases it (safe on a zeroed or
 * freed value). */
#ifndef MGPU_TOKENS_H
#define MGPU_TOKENS_H

#include <stddef.h> /* size_t */
#include <stdint.h> /* int32_t */

#include "error.h" /* mgpu_err_t */

typedef struct mgpu_tokens {
    int32_t *ids;
    size_t n;
} mgpu_tokens_t;

/* Reads path (text: bytes; else uint16 ids each below vocab). Errors are MGPU_E_CONFIG naming
 * the file and, for an id out of range, its byte offset and value. */
int mgpu_tokens_load(const char *path, int text, int vocab, mgpu_tokens_t *out, mgpu_err_t *err);
void mgpu_tokens_free(mgpu_tokens_t *t);

/* The tail of round(n * eval_fraction) tokens is held out. */
void mgpu_tokens_split(size_t n, double eval_fraction, size_t *n_train, size_t *n_eval);

/* The prompt a sampler starts from, as at most max tokens: text, its bytes with the escapes
 * \n, \t, \\ and \xNN (empty: a newline); tokens, ids separated by spaces or commas, each below
 * vocab (empty: id 0). MGPU_E_CONFIG naming the prompt and what was expected. */
int mgpu_tokens_prompt(const char *prompt, int text, int vocab, int32_t *out, int max, int *n,
                       mgpu_err_t *err);

/* Windows of context + 1 tokens at stride context in n tokens. */
size_t mgpu_tokens_windows(size_t n, int context);

#endif
