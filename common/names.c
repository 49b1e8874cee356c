/* names.c - see names.h. */
#include "names.h"

#include <stddef.h>  /* NULL */
#include <strings.h> /* strcasecmp */

const char *mgpu_names_get(const char *const *table, int count, int value, const char *fallback)
{
    if (value < 0 || value >= count || table[value] == NULL)
        return fallback;
    return table[value];
}

int mgpu_names_find(const char *const *table, int count, const char *s)
{
    for (int i = 0; i < count; i++)
        if (table[i] != NULL && strcasecmp(table[i], s) == 0)
            return i;
    return -1;
}
