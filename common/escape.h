/* escape.h - user input made safe to quote in a message: control bytes (and DEL) become C-style
 * escapes, so an argument carrying a terminal escape sequence or a newline is shown, not
 * obeyed, and a message stays one line. */
#ifndef MGPU_ESCAPE_H
#define MGPU_ESCAPE_H

#include <stddef.h> /* size_t */

/* Writes s into out (len bytes, always terminated; cut if it does not fit) with \n, \t, \r,
 * \\e as "\x1b" and every other byte below 0x20 or 0x7f as \xNN. Bytes >= 0x80 pass (UTF-8).
 * Returns out. out and s must not overlap. */
char *mgpu_escape(const char *s, char *out, size_t len);

/* Escapes s in place (a message buffer of len bytes). */
void mgpu_escape_inplace(char *s, size_t len);

#endif
