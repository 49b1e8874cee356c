/* devices.h - which GPUs a process can see, decided without initialising CUDA.
 *
 * Discovery reads the installed NVIDIA GPUs from /proc/driver/nvidia/gpus/ (PCI bus order), or
 * invents N of them when MGPU_SIM_GPUS=N (a machine with no GPU; every report says
 * "simulated"). Visibility applies CUDA_VISIBLE_DEVICES by the rules the CUDA driver follows
 * (measured on an H200 with driver 580): unset -> all; empty -> none; entries
 * are indices or GPU-/MIG- UUID prefixes, read left to right with surrounding spaces ignored;
 * the list ends at the first invalid or out-of-range entry, or at -1; a repeated index makes
 * the whole list an error ("invalid device ordinal"), while a UUID naming a device already
 * listed ends the list. Visible ordinals count from 0.
 *
 * All structures are plain values owned by the caller; nothing here allocates. */
#ifndef MGPU_DEVICES_H
#define MGPU_DEVICES_H

#include "error.h" /* mgpu_err_t */

#define MGPU_MAX_GPUS 64

typedef struct mgpu_gpu {
    int index;       /* physical index: position in PCI bus order, as nvidia-smi numbers it */
    char uuid[80];   /* "GPU-xxxxxxxx-xxxx-..." */
    char bus_id[32]; /* "0000:18:00.0" */
    char name[96];   /* model, e.g. "NVIDIA H200" */
    int simulated;   /* 1 when invented by MGPU_SIM_GPUS */
} mgpu_gpu_t;

typedef struct mgpu_gpu_list {
    int count;
    int simulated; /* 1 when the list comes from MGPU_SIM_GPUS */
    mgpu_gpu_t gpus[MGPU_MAX_GPUS];
} mgpu_gpu_list_t;

typedef struct mgpu_visible {
    int count;                   /* visible devices; ordinal k is physical[k] */
    int physical[MGPU_MAX_GPUS]; /* index into the installed list */
    int cvd_set;                 /* CUDA_VISIBLE_DEVICES was set (possibly empty) */
    char cvd[256];               /* its value, for messages */
    int error;                   /* 1 when the list is an error (a repeated device) */
    char why[256];               /* where and why the list stopped early, or the error */
    /* Ordinal k's entry in cvd, blanks trimmed: cvd + entry_at[k], entry_len[k] bytes. */
    short entry_at[MGPU_MAX_GPUS], entry_len[MGPU_MAX_GPUS];
} mgpu_visible_t;

/* Installed GPUs: MGPU_SIM_GPUS (sim, "0".."64") wins when set, else /proc/driver/nvidia/gpus
 * under proc_root (NULL for "/proc"). No GPU is not an error: count is 0. */
int mgpu_devices_discover(mgpu_gpu_list_t *out, const char *sim, const char *proc_root,
                          mgpu_err_t *err);

/* Applies a CUDA_VISIBLE_DEVICES value (NULL = unset) to the installed list. Never fails: an
 * odd value gives what the driver gives (fewer devices, or error=1 with why set). */
void mgpu_devices_visible(const mgpu_gpu_list_t *installed, const char *cvd, mgpu_visible_t *out);

/* "0 (GPU-19b5..., 0000:18:00.0)" style one-line list of the visible devices, for messages. */
void mgpu_devices_describe(const mgpu_gpu_list_t *installed, const mgpu_visible_t *vis, char *buf,
                           size_t len);

#endif
