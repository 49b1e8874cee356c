/* tokens.h - the prompt a GPT's sampling starts from, as token ids. (The token files
 * themselves are mapped by shards.h.) Plain values, owned by the caller. */
#ifndef MGPU_TOKENS_H
#define MGPU_TOKENS_H

#include <stdint.h> /* int32_t */

#include "error.h" /* mgpu_err_t */

/* The prompt a sampler starts from, as at most max tokens: text, its bytes with the escapes
 * \n, \t, \\ and \xNN (empty: a newline); tokens, ids separated by spaces or commas, each below
 * vocab (empty: id 0). MGPU_E_CONFIG naming the prompt and what was expected. */
int mgpu_tokens_prompt(const char *prompt, int text, int vocab, int32_t *out, int max, int *n,
                       mgpu_err_t *err);

#endif
