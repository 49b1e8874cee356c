/* shm_head.h - the head of a shared-memory segment of libmgpu's one-host collectives
 * (worker/runtime/shm.c), known here so that mgpu-launch can remove the segments that a job
 * left behind.
 *
 * A segment is named /dev/shm/mgpu-<uid>-<hash>; its creator (a job's local rank 0) removes
 * the name once every rank has attached, and from then on the kernel frees the memory with
 * the last process. A creator that dies before that (its job failed while starting: the
 * launcher stopped it while it waited for a rank that had already exited) leaves the name,
 * and its megabytes, until the machine restarts. */
#ifndef MGPU_SHM_HEAD_H
#define MGPU_SHM_HEAD_H

#include <stdint.h> /* uint64_t, uint32_t, int32_t */

#define MGPU_SHM_MAGIC 0x316d687375706d67ull /* "mgpushm1" */
#define MGPU_SHM_VERSION 2u

typedef struct mgpu_shm_head {
    uint64_t magic;
    uint32_t version, size; /* size: ranks */
    uint64_t chunk, total;  /* bytes of a rank's data slot, of the whole segment */
    int32_t creator_pid;    /* 0 until the creator has written the head */
} mgpu_shm_head_t;

/* Whether process pid exists (also one of another user's); 0 for pid <= 0. */
int mgpu_shm_pid_alive(int pid);

/* The creator pid in the head of the segment open on fd: 0 when the file is too short, not a
 * segment, or its creator has not written the head yet. */
int mgpu_shm_head_creator(int fd);

/* Removes this user's segments whose creator has died (the rule libmgpu itself applies to a
 * segment it finds under its own name): under /dev/shm (dir, NULL for /dev/shm), files named
 * mgpu-<uid>-*, owned by uid, with a head that names a creator that no longer exists. A
 * segment whose creator lives, or whose head is not written yet, stays. Returns how many
 * were removed. */
int mgpu_shm_remove_stale(const char *dir, unsigned uid);

#endif
