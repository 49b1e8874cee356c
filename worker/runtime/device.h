/* device.h - which device a rank uses: LOCAL_RANK -> visible ordinal -> physical GPU.
 *
 * Pure: decides from the installed and visible lists of common/devices.h, so the article's
 * four scenarios are testable without a GPU. mgpu_init calls it with the real lists. */
#ifndef MGPU_DEVICE_H
#define MGPU_DEVICE_H

#include "devices.h" /* mgpu_gpu_list_t, mgpu_visible_t */
#include "mgpu.h"    /* mgpu_device_info_t */

typedef struct mgpu_device_req {
    int rank, local_rank, local_world_size;
    int want_gpu;          /* 0: CPU only */
    int allow_sharing;     /* MGPU_ALLOW_GPU_SHARING=1: ordinal = local_rank mod visible count */
    const char *described; /* mgpu_devices_describe() of the visible list, for messages */
} mgpu_device_req_t;

/* Fills out. Fails with MGPU_E_DEVICE when CUDA_VISIBLE_DEVICES is an error (a repeated
 * device) or when local_rank has no visible device of its own and sharing is not allowed
 * (the article's scenario 4: PyTorch's "invalid device ordinal"), naming the rank, the
 * ordinal it needs and the visible list. No visible GPU at all means the CPU, not an error. */
int mgpu_device_select(const mgpu_gpu_list_t *installed, const mgpu_visible_t *vis,
                       const mgpu_device_req_t *req, mgpu_device_info_t *out, mgpu_err_t *err);

/* 1 under mgpu-launch --virtual_local_rank: LOCAL_RANK is 0 in every worker, which sees its
 * own GPU alone (its ordinal 0), and MGPU_LOCAL_RANK is the worker's index on the node, the
 * local rank everything else (node layout, shared memory) goes by. */
int mgpu_device_virtual_local_rank(void);

#endif
