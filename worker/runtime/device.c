/* device.c - LOCAL_RANK -> visible ordinal -> physical GPU, and the refusal of scenario 4.
 *
 * LOCAL_RANK is a process number, not a GPU number (the article's scenario 2): local rank k
 * uses visible ordinal k, which is physical GPU vis->physical[k] after CUDA_VISIBLE_DEVICES
 * renumbering. */
#include "device.h"

#include <stdio.h>  /* snprintf */
#include <stdlib.h> /* getenv */
#include <string.h> /* memset, strcmp */

int mgpu_device_select(const mgpu_gpu_list_t *installed, const mgpu_visible_t *vis,
                       const mgpu_device_req_t *req, mgpu_device_info_t *out, mgpu_err_t *err)
{
    const char *cvd = vis->cvd_set ? vis->cvd : "(unset)";
    /* The visible list goes last in messages: with many GPUs it is what gets cut. */
    const char *list = req->described != NULL && *req->described ? req->described : "none";
    const mgpu_gpu_t *g;
    int ordinal;

    memset(out, 0, sizeof *out);
    out->ordinal = out->physical = -1;
    out->visible_count = vis->error ? 0 : vis->count;
    out->simulated = installed->simulated;
    if (!req->want_gpu)
        return 0;
    if (vis->error)
        return mgpu_err_set(err, MGPU_E_DEVICE,
                            "rank %d: CUDA_VISIBLE_DEVICES=\"%s\" is invalid: %s (CUDA fails with "
                            "\"invalid device ordinal\")",
                            req->rank, cvd, vis->why);
    if (vis->count == 0)
        return 0; /* no GPU: this rank computes on the CPU */
    ordinal = req->local_rank;
    if (ordinal >= vis->count) {
        if (!req->allow_sharing)
            return mgpu_err_set(
                err, MGPU_E_DEVICE,
                "rank %d (LOCAL_RANK=%d) needs visible GPU ordinal %d, but only %d GPU%s %s "
                "visible (CUDA_VISIBLE_DEVICES=%s). LOCAL_RANK is a process number: "
                "LOCAL_WORLD_SIZE=%d processes on this node need %d GPUs (PyTorch fails here "
                "with \"invalid device ordinal\"). Start at most %d processes per node, make "
                "more GPUs visible, or allow sharing (mgpu-launch --allow_gpu_sharing, "
                "MGPU_ALLOW_GPU_SHARING=1) to use ordinal LOCAL_RANK mod %d. For a CPU-only "
                "job, hide the GPUs: CUDA_VISIBLE_DEVICES= (empty). Visible: %s",
                req->rank, req->local_rank, ordinal, vis->count, vis->count == 1 ? "" : "s",
                vis->count == 1 ? "is" : "are", cvd, req->local_world_size, req->local_world_size,
                vis->count, vis->count, list);
        ordinal = req->local_rank % vis->count;
    }
    if (vis->physical[ordinal] < 0 || vis->physical[ordinal] >= installed->count)
        return mgpu_err_set(err, MGPU_E_DEVICE,
                            "rank %d: visible ordinal %d maps to installed device %d of %d",
                            req->rank, ordinal, vis->physical[ordinal], installed->count);
    g = &installed->gpus[vis->physical[ordinal]];
    /* A simulated GPU has every field a real one has, but the rank computes on the CPU. */
    out->is_gpu = !installed->simulated;
    out->ordinal = ordinal;
    out->physical = g->index;
    snprintf(out->uuid, sizeof out->uuid, "%s", g->uuid);
    snprintf(out->bus_id, sizeof out->bus_id, "%s", g->bus_id);
    snprintf(out->name, sizeof out->name, "%s", g->name);
    return 0;
}

int mgpu_device_virtual_local_rank(void)
{
    const char *lr = getenv("LOCAL_RANK");
    return getenv("MGPU_LOCAL_RANK") != NULL && lr != NULL && strcmp(lr, "0") == 0;
}
