/* escape.c - see escape.h. */
#include "escape.h"

#include <stdio.h>  /* snprintf */
#include <string.h> /* memcpy */

char *mgpu_escape(const char *s, char *out, size_t len)
{
    size_t n = 0;

    if (len == 0)
        return out;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char e[8];
        size_t el;
        if (*p == '\n')
            el = (size_t)snprintf(e, sizeof e, "\\n");
        else if (*p == '\t')
            el = (size_t)snprintf(e, sizeof e, "\\t");
        else if (*p == '\r')
            el = (size_t)snprintf(e, sizeof e, "\\r");
        else if (*p < 0x20 || *p == 0x7f)
            el = (size_t)snprintf(e, sizeof e, "\\x%02x", *p);
        else {
            e[0] = (char)*p;
            el = 1;
        }
        if (n + el >= len)
            break;
        memcpy(out + n, e, el);
        n += el;
    }
    out[n] = '\0';
    return out;
}

void mgpu_escape_inplace(char *s, size_t len)
{
    char tmp[4096]; /* messages are one line, well under this; a longer one is cut */
    size_t n = len < sizeof tmp ? len : sizeof tmp;

    if (n == 0)
        return;
    mgpu_escape(s, tmp, n);
    memcpy(s, tmp, strlen(tmp) + 1);
}
