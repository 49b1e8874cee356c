/* names.h - one way to map an enum to its name and back: a table of names indexed by the
 * enum's value, written with designated initialisers ([MGPU_X] = "x") so that a value and its
 * name stay together. Values without a name (holes, out of range) map to the caller's
 * fallback. Tables are the caller's static arrays; nothing is allocated. */
#ifndef MGPU_NAMES_H
#define MGPU_NAMES_H

/* The number of entries of a names table (an array, not a pointer). */
#define MGPU_NAMES_COUNT(table) ((int)(sizeof(table) / sizeof((table)[0])))

/* The name of value, or fallback when value is out of range or has no name. */
const char *mgpu_names_get(const char *const *table, int count, int value, const char *fallback);

/* The value whose name is s, compared without regard to case; -1 when none. */
int mgpu_names_find(const char *const *table, int count, const char *s);

#endif
