/* fs.c - folders on the file system (fs.h). */
#include "fs.h"

#include <dirent.h>   /* opendir */
#include <errno.h>    /* errno */
#include <stdio.h>    /* snprintf */
#include <string.h>   /* strcmp */
#include <sys/stat.h> /* mkdir */
#include <unistd.h>   /* unlink, rmdir */

int mgpu_fs_mkdir_p(const char *path)
{
    char buf[2400];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return -errno;
            *p = '/';
        }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return -errno;
    return 0;
}

void mgpu_fs_remove_tree(const char *path)
{
    DIR *d = opendir(path);
    struct dirent *de;
    if (d != NULL) {
        while ((de = readdir(d)) != NULL) {
            char sub[2600];
            if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                continue;
            snprintf(sub, sizeof sub, "%s/%s", path, de->d_name);
            if (de->d_type == DT_DIR)
                mgpu_fs_remove_tree(sub);
            else
                unlink(sub);
        }
        closedir(d);
    }
    rmdir(path);
}
