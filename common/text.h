/* text.h - small edits of NUL-terminated strings in caller-owned buffers: blanks trimmed in
 * place, and a formatted line appended to a bounded buffer of lines (messages gathered before
 * they can be shown); how far one word is from another, for suggestions. */
#ifndef MGPU_TEXT_H
#define MGPU_TEXT_H

#include <stddef.h> /* size_t */

/* s without the spaces and tabs around it: the trailing ones overwritten with NULs, the
 * returned pointer past the leading ones. */
char *mgpu_trim(char *s);

/* Appends the formatted text and a newline to buf (size bytes, always terminated). A line
 * that does not fit whole is cut; once buf is full, later lines are dropped. */
void mgpu_append_line(char *buf, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The Levenshtein distance between a and b (insertions, deletions and substitutions of one
 * byte), for "did you mean" in messages; 99 for strings of 63 bytes or more. */
size_t mgpu_edit_distance(const char *a, const char *b);

#endif
