/* path.h - file names as strings (no file system access). The caller owns every buffer. */
#ifndef MGPU_PATH_H
#define MGPU_PATH_H

#include <stddef.h> /* size_t */

/* The folder part of path into out: "a/b" -> "a", "b" -> ".", "/b" -> "/". Does not change
 * path (unlike dirname(3)). Returns 0, or -ENAMETOOLONG when out is too small. */
int mgpu_path_dirname(const char *path, char *out, size_t len);

#endif
