/* ucd.h - the few Unicode character classes the GPT-2 pre-tokenizer asks about (its \p{L},
 * \p{N} and \s), from tables generated out of the Unicode database (scripts/gen_ucd.py). */
#ifndef MGPU_UCD_H
#define MGPU_UCD_H

#include <stdint.h> /* uint32_t */

/* 1 when code point cp is a letter (general category L*), else 0. */
int mgpu_ucd_is_letter(uint32_t cp);
/* 1 when cp is a number (N*: Nd, Nl, No). */
int mgpu_ucd_is_number(uint32_t cp);
/* 1 when cp has the White_Space property. */
int mgpu_ucd_is_space(uint32_t cp);

#endif
