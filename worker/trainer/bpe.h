/* bpe.h - Hugging Face byte-level BPE tokenizers (GPT-2's) read from a tokenizer.json:
 * text to token ids and back, with the ids Hugging Face's `tokenizers` gives.
 *
 * Encoding follows the library step by step: the added tokens (<|endoftext|>) are cut out of
 * the text first (longest match at each position) and map to their ids; every other stretch
 * gets a leading space if the pre-tokenizer says add_prefix_space and it has none, is split
 * by GPT-2's pattern
 *     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * (Unicode letters, numbers and White_Space, ucd.h), each piece's UTF-8 bytes become the
 * printable characters of GPT-2's byte-to-unicode map, and the model's merges are applied by
 * rank (the lowest-ranked adjacent pair first, leftmost on a tie) until none applies. A piece
 * that is itself in the vocabulary is one token when the model says ignore_merges. Decoding
 * maps each token's characters back to bytes (a token with a character outside the map, such
 * as an added token's, is its own UTF-8).
 *
 * Accepted: model.type "BPE" with its vocab and merges ("a b" strings or [a, b] pairs), no
 * continuing_subword_prefix or end_of_word_suffix, no byte_fallback; pre_tokenizer ByteLevel
 * (alone or the only one of a Sequence); no normalizer (or an empty Sequence). Anything else is
 * refused naming the field, since its ids would differ from the library's.
 *
 * Ownership: mgpu_bpe_load returns a tokenizer that mgpu_bpe_free releases; encode and decode
 * return arrays (malloc) that the caller frees. */
#ifndef MGPU_BPE_H
#define MGPU_BPE_H

#include <stddef.h> /* size_t */
#include <stdint.h> /* int32_t */

#include "error.h" /* mgpu_err_t */

typedef struct mgpu_bpe mgpu_bpe_t;

/* Reads path; MGPU_E_CONFIG naming the file and the field for what is not a byte-level BPE. */
int mgpu_bpe_load(const char *path, mgpu_bpe_t **out, mgpu_err_t *err);
void mgpu_bpe_free(mgpu_bpe_t *t);

/* The largest id of the vocabulary and the added tokens, plus one. */
int mgpu_bpe_vocab_size(const mgpu_bpe_t *t);
/* Whether id has a token to decode to (a model's vocabulary may be padded past the
 * tokenizer's, and a tokenizer's ids may have gaps). */
int mgpu_bpe_has_id(const mgpu_bpe_t *t, int32_t id);

/* The ids of text[0..len) into *ids (malloc, *n of them; the caller frees). */
int mgpu_bpe_encode(const mgpu_bpe_t *t, const char *text, size_t len, int32_t **ids, size_t *n,
                    mgpu_err_t *err);

/* The bytes of ids[0..n) into *text (malloc, *len bytes and a NUL; the caller frees). An id
 * without a token is MGPU_E_CONFIG naming it. */
int mgpu_bpe_decode(const mgpu_bpe_t *t, const int32_t *ids, size_t n, char **text, size_t *len,
                    mgpu_err_t *err);

#endif
