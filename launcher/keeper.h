/* keeper.h - what a launcher tells its keeper, and the files a dead launcher leaves, removed.
 *
 * Both keepers (spawner.h's, forked beside a job that has a cgroup, and reaper.h's, the parent
 * of a launcher without one) read the same messages on a pipe from the launcher that runs the
 * job. When that pipe ends without the launcher's last word, the launcher died (kill -9 of it
 * or of its process group, `timeout -s KILL`): its processes go (each keeper has its way), and
 * so do the files it made and would have removed on its way out: the status socket, the
 * expiration timers' FIFO and folder, the run's temporary folder.
 *
 * Messages: each one write of at most PIPE_BUF bytes, so a reader never sees half of one even
 * when the launcher dies while writing. An int32 first:
 *   > 0                   a process group to SIGKILL should the launcher die (the reaper's
 *                         keeper reads it and goes on: it kills all its children anyway)
 *   MGPU_KEEPER_QUIT      the job's processes are gone: kill nothing
 *   MGPU_KEEPER_PATH      then an int32 length and the path's bytes (no NUL): a file or folder
 *                         the launcher made, to remove should it die
 *   MGPU_KEEPER_FORGET    the launcher removed what it made, or keeps it on purpose: forget
 *                         the paths (a later process may reuse a pid, and a socket's name with
 *                         it; nothing of its may ever be removed by mistake)
 *
 * The keeper's side (mgpu_keeper_read, mgpu_keeper_clean, mgpu_keeper_prune) uses only
 * async-signal-safe calls, no malloc and no stdio: the spawner's keeper is forked from the
 * multi-threaded launcher. The paths live in a fixed table owned by the caller. */
#ifndef MGPU_KEEPER_H
#define MGPU_KEEPER_H

#include <stdint.h> /* int32_t */

#define MGPU_KEEPER_QUIT (-1)
#define MGPU_KEEPER_PATH (-2)
#define MGPU_KEEPER_FORGET (-3)

/* A path message fits in one atomic pipe write (PIPE_BUF, 4096 on Linux) with its 8 bytes of
 * header and the keeper's NUL. */
#define MGPU_KEEPER_PATH_MAX 4088
/* The socket, the timers' FIFO and folder, the run folder; room to spare. */
#define MGPU_KEEPER_NPATHS 8

typedef struct mgpu_keeper_paths {
    int n;
    char path[MGPU_KEEPER_NPATHS][MGPU_KEEPER_PATH_MAX];
} mgpu_keeper_paths_t;

/* The launcher's side: one message of the list above, v > 0 or QUIT or FORGET. Returns 0 or
 * -errno (a keeper that is gone: EPIPE). */
int mgpu_keeper_send(int fd, int32_t v);
/* The launcher's side: path, made by the launcher, to remove should it die. Returns 0,
 * -EINVAL for "" or -ENAMETOOLONG (nothing sent), or -errno of the write. */
int mgpu_keeper_send_path(int fd, const char *path);

/* The keeper's side: reads one message from fd (blocking or not). A path is added to paths
 * (dropped when the table is full), FORGET empties it; *msg gets the message's first int32.
 * Returns 1 (a message), 0 (nothing to read now, on a non-blocking fd), or -1 (EOF: the
 * launcher closed its end or died; or a broken message). */
int mgpu_keeper_read(int fd, mgpu_keeper_paths_t *paths, int32_t *msg);

/* The keeper's side, once the launcher died: removes the paths, the last told first (a FIFO
 * before its folder). A folder loses only its empty folders (mgpu_keeper_prune); anything else
 * is unlinked. Then forgets them. */
void mgpu_keeper_clean(mgpu_keeper_paths_t *paths);

/* Removes the empty folders of the tree at dir, the deepest first, and dir itself when it ends
 * up empty. Files of every kind stay, with the folders that hold them: a worker's error file
 * or log outlives a killed launcher, as it would a failed run. Symbolic links are not followed;
 * below 16 levels nothing is looked at. */
void mgpu_keeper_prune(const char *dir);

#endif
