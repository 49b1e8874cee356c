/* devices.c - GPU discovery from /proc (no CUDA) and the driver's CUDA_VISIBLE_DEVICES rules. */
#include "devices.h"

#include <ctype.h>  /* isspace, isdigit */
#include <dirent.h> /* opendir */
#include <errno.h>  /* errno */
#include <stdio.h>  /* snprintf, fopen */
#include <stdlib.h> /* qsort, strtol */
#include <string.h> /* strncmp */

static int cmp_bus(const void *a, const void *b)
{
    return strcmp(((const mgpu_gpu_t *)a)->bus_id, ((const mgpu_gpu_t *)b)->bus_id);
}

/* Copies the value of "Key:   value" lines of the driver's information file. */
static void read_info_field(const char *line, const char *key, char *dst, size_t len)
{
    size_t k = strlen(key);
    if (strncmp(line, key, k) != 0 || line[k] != ':')
        return;
    line += k + 1;
    while (isspace((unsigned char)*line))
        line++;
    snprintf(dst, len, "%s", line);
    for (size_t n = strlen(dst); n > 0 && isspace((unsigned char)dst[n - 1]); n--)
        dst[n - 1] = '\0';
}

static int discover_sim(mgpu_gpu_list_t *out, const char *sim, mgpu_err_t *err)
{
    char *end;
    long n;

    errno = 0;
    n = strtol(sim, &end, 10);
    if (*sim == '\0' || *end != '\0' || errno != 0 || n < 0 || n > MGPU_MAX_GPUS)
        return mgpu_err_set(err, MGPU_E_USAGE,
                            "MGPU_SIM_GPUS='%s': expected a number of simulated GPUs from 0 to %d",
                            sim, MGPU_MAX_GPUS);
    out->simulated = 1;
    out->count = (int)n;
    for (int i = 0; i < out->count; i++) {
        mgpu_gpu_t *g = &out->gpus[i];
        g->index = i;
        g->simulated = 1;
        /* Recognisable at a glance in every report: "5140" reads as "SIM0". */
        snprintf(g->uuid, sizeof g->uuid, "GPU-51300000-0000-4000-8000-%012d", i);
        snprintf(g->bus_id, sizeof g->bus_id, "0000:%02x:00.0", 0x10 + i);
        snprintf(g->name, sizeof g->name, "simulated GPU");
    }
    return 0;
}

int mgpu_devices_discover(mgpu_gpu_list_t *out, const char *sim, const char *proc_root,
                          mgpu_err_t *err)
{
    char dirpath[512];
    DIR *dir;
    struct dirent *de;

    memset(out, 0, sizeof *out);
    if (sim != NULL)
        return discover_sim(out, sim, err);

    snprintf(dirpath, sizeof dirpath, "%s/driver/nvidia/gpus", proc_root ? proc_root : "/proc");
    dir = opendir(dirpath);
    if (dir == NULL)
        return 0; /* no driver loaded: no GPU, not an error */
    while ((de = readdir(dir)) != NULL && out->count < MGPU_MAX_GPUS) {
        char path[1024], line[512];
        mgpu_gpu_t *g = &out->gpus[out->count];
        FILE *f;

        if (de->d_name[0] == '.')
            continue;
        memset(g, 0, sizeof *g);
        snprintf(g->bus_id, sizeof g->bus_id, "%.31s", de->d_name);
        snprintf(path, sizeof path, "%s/%s/information", dirpath, de->d_name);
        f = fopen(path, "re");
        if (f == NULL)
            continue;
        while (fgets(line, sizeof line, f) != NULL) {
            read_info_field(line, "Model", g->name, sizeof g->name);
            read_info_field(line, "GPU UUID", g->uuid, sizeof g->uuid);
            read_info_field(line, "Bus Location", g->bus_id, sizeof g->bus_id);
        }
        fclose(f);
        out->count++;
    }
    closedir(dir);
    /* nvidia-smi and CUDA_DEVICE_ORDER=PCI_BUS_ID number devices by bus id; for identical
     * GPUs (the case on multi-GPU servers) the driver's default order is the same. */
    qsort(out->gpus, (size_t)out->count, sizeof out->gpus[0], cmp_bus);
    for (int i = 0; i < out->count; i++)
        out->gpus[i].index = i;
    return 0;
}

/* Resolves one trimmed entry to a physical index: >= 0 found; -1 ends the list. */
static int resolve_entry(const mgpu_gpu_list_t *inst, const char *e, char *why, size_t wlen)
{
    if (strncmp(e, "GPU-", 4) == 0 || strncmp(e, "MIG-", 4) == 0) {
        int found = -1, matches = 0;
        if (strncmp(e, "MIG-", 4) == 0) {
            snprintf(why, wlen, "'%s': MIG instances are not enumerated by mgpu", e);
            return -1;
        }
        if (e[4] == '\0') {
            snprintf(why, wlen, "'%s' is not a UUID prefix", e);
            return -1;
        }
        for (int i = 0; i < inst->count; i++)
            if (strncmp(inst->gpus[i].uuid, e, strlen(e)) == 0) {
                found = i;
                matches++;
            }
        if (matches == 1)
            return found;
        snprintf(why, wlen, matches ? "'%s' matches several GPUs" : "'%s' matches no GPU UUID", e);
        return -1;
    }
    if (e[0] == '-') {
        snprintf(why, wlen, "'%s' ends the list", e);
        return -1;
    }
    for (const char *p = e; *p; p++)
        if (!isdigit((unsigned char)*p) || p - e > 6) {
            snprintf(why, wlen, "'%s' is neither an index nor a GPU- UUID", e);
            return -1;
        }
    if (*e == '\0') {
        snprintf(why, wlen, "an empty entry");
        return -1;
    }
    if (atoi(e) >= inst->count) {
        snprintf(why, wlen, "index %s is out of range (%d GPU%s installed)", e, inst->count,
                 inst->count == 1 ? "" : "s");
        return -1;
    }
    return atoi(e);
}

void mgpu_devices_visible(const mgpu_gpu_list_t *inst, const char *cvd, mgpu_visible_t *out)
{
    char buf[256], *save = NULL, *tok;
    int by_uuid[MGPU_MAX_GPUS] = {0}; /* how each listed device was named */

    memset(out, 0, sizeof *out);
    if (cvd == NULL) {
        out->count = inst->count;
        for (int i = 0; i < inst->count; i++)
            out->physical[i] = i;
        return;
    }
    out->cvd_set = 1;
    snprintf(out->cvd, sizeof out->cvd, "%s", cvd);
    snprintf(buf, sizeof buf, "%s", cvd);
    /* strtok_r would merge ",," into one separator; the driver stops at an empty entry. */
    for (tok = buf; tok != NULL; tok = save) {
        char *e = tok, *end;
        int idx;

        save = strchr(tok, ',');
        if (save != NULL)
            *save++ = '\0';
        while (isspace((unsigned char)*e))
            e++;
        end = e + strlen(e);
        while (end > e && isspace((unsigned char)end[-1]))
            *--end = '\0';
        if (*e == '\0' && save == NULL && tok == buf) {
            snprintf(out->why, sizeof out->why, "CUDA_VISIBLE_DEVICES is empty");
            return;
        }
        idx = resolve_entry(inst, e, out->why, sizeof out->why);
        if (idx < 0)
            return;
        int is_uuid = strncmp(e, "GPU-", 4) == 0;
        for (int k = 0; k < out->count; k++)
            if (out->physical[k] == idx && (is_uuid || by_uuid[k])) {
                /* Measured on the H200 (driver 580): "GPU-<uuid of 0>,0" shows one device,
                 * while "0,0" fails; a UUID naming a listed device ends the list. */
                snprintf(out->why, sizeof out->why, "'%s' names GPU %d again", e, idx);
                return;
            } else if (out->physical[k] == idx) {
                /* The driver fails every call ("invalid device ordinal") on a repeat. */
                out->error = 1;
                out->count = 0;
                snprintf(out->why, sizeof out->why,
                         "GPU %d appears twice; the CUDA driver rejects the whole list "
                         "(invalid device ordinal)",
                         idx);
                return;
            }
        by_uuid[out->count] = is_uuid;
        out->entry_at[out->count] = (short)(e - buf);
        out->entry_len[out->count] = (short)(end - e);
        out->physical[out->count++] = idx;
    }
}

void mgpu_devices_describe(const mgpu_gpu_list_t *inst, const mgpu_visible_t *vis, char *buf,
                           size_t len)
{
    size_t n = 0;

    buf[0] = '\0';
    if (vis->count == 0) {
        snprintf(buf, len, "none");
        return;
    }
    for (int k = 0; k < vis->count && n < len; k++) {
        const mgpu_gpu_t *g = &inst->gpus[vis->physical[k]];
        n += (size_t)snprintf(buf + n, len - n, "%sordinal %d = GPU %d (%s, %s%s)", k ? "; " : "",
                              k, g->index, g->uuid, g->bus_id, g->simulated ? ", simulated" : "");
    }
}
