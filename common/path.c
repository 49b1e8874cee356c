/* path.c - see path.h. */
#include "path.h"

#include <errno.h>  /* ENAMETOOLONG */
#include <stdio.h>  /* snprintf */
#include <string.h> /* strrchr */

int mgpu_path_dirname(const char *path, char *out, size_t len)
{
    const char *slash = strrchr(path, '/');
    int n;

    if (slash == NULL)
        n = snprintf(out, len, ".");
    else if (slash == path)
        n = snprintf(out, len, "/");
    else
        n = snprintf(out, len, "%.*s", (int)(slash - path), path);
    return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}
