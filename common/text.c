/* text.c - see text.h. */
#include "text.h"

#include <stdarg.h> /* va_list */
#include <stdio.h>  /* vsnprintf */
#include <string.h> /* strlen */

char *mgpu_trim(char *s)
{
    size_t n;

    while (*s == ' ' || *s == '\t')
        s++;
    n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t'))
        s[--n] = '\0';
    return s;
}

void mgpu_append_line(char *buf, size_t size, const char *fmt, ...)
{
    size_t n = strlen(buf);
    va_list ap;

    if (n + 2 >= size)
        return;
    va_start(ap, fmt);
    vsnprintf(buf + n, size - n - 1, fmt, ap);
    va_end(ap);
    n = strlen(buf);
    buf[n] = '\n';
    buf[n + 1] = '\0';
}
