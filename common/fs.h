/* fs.h - folders on the file system: made with their parents, removed with what they hold.
 * The caller owns every string. */
#ifndef MGPU_FS_H
#define MGPU_FS_H

/* mkdir -p: path and each missing parent, mode 0755. 0, or -errno of the mkdir that failed.
 * path is cut at 2,399 bytes. */
int mgpu_fs_mkdir_p(const char *path);

/* rm -r of a folder the caller made (the launcher's own log folder): files and folders below
 * it, then path itself; symbolic links are removed, not followed. Errors are ignored: what
 * cannot be removed stays. */
void mgpu_fs_remove_tree(const char *path);

#endif
