/* test_devices.c - CUDA_VISIBLE_DEVICES as the driver reads it, and GPU discovery. */
#include <stdio.h>    /* fopen */
#include <stdlib.h>   /* mkdtemp */
#include <sys/stat.h> /* mkdir */

#include "check.h"
#include "devices.h"

static mgpu_gpu_list_t sim(int n)
{
    mgpu_gpu_list_t l;
    char s[8];
    snprintf(s, sizeof s, "%d", n);
    mgpu_devices_discover(&l, s, NULL, NULL);
    return l;
}

/* Visible physical indices as "a,b,c" ("" for none, "ERR" for an error). */
static const char *vis(int installed, const char *cvd)
{
    static char out[256];
    mgpu_gpu_list_t l = sim(installed);
    mgpu_visible_t v;
    size_t n = 0;

    mgpu_devices_visible(&l, cvd, &v);
    out[0] = '\0';
    if (v.error)
        return "ERR";
    for (int i = 0; i < v.count; i++)
        n += (size_t)snprintf(out + n, sizeof out - n, "%s%d", i ? "," : "", v.physical[i]);
    return out;
}

/* The values cudaGetDeviceCount gave on an H200 (one GPU, driver 580) for each value of
 * CUDA_VISIBLE_DEVICES. */
static void test_driver_measurements_one_gpu(void)
{
    CHECK_STR(vis(1, NULL), "0");
    CHECK_STR(vis(1, ""), "");
    CHECK_STR(vis(1, "0"), "0");
    CHECK_STR(vis(1, "1"), "");
    CHECK_STR(vis(1, "0,1"), "0");
    CHECK_STR(vis(1, "1,0"), "");
    CHECK_STR(vis(1, "-1"), "");
    CHECK_STR(vis(1, "0,-1"), "0");
    CHECK_STR(vis(1, " 0"), "0");
    CHECK_STR(vis(1, "0 "), "0");
    CHECK_STR(vis(1, "0,0"), "ERR");
    CHECK_STR(vis(1, "GPU-"), "");
    CHECK_STR(vis(1, "abc"), "");
    CHECK_STR(vis(1, "0,abc"), "0");
}

static void test_article_scenarios(void)
{
    CHECK_STR(vis(8, "1,2,3,4"), "1,2,3,4");
    CHECK_STR(vis(8, NULL), "0,1,2,3,4,5,6,7");
    CHECK_STR(vis(8, "3,1"), "3,1");
    CHECK_STR(vis(4, "1,2,3,4"), "1,2,3"); /* 4 is out of range: the list ends there */
    CHECK_STR(vis(8, "2,-1,3"), "2");
    CHECK_STR(vis(8, "1,,2"), "1");
    CHECK_STR(vis(8, "1,2,1"), "ERR");
    CHECK_STR(vis(8, "0,-1,0"), "0"); /* the repeat comes after the end: no error */
}

static void test_uuid_prefixes(void)
{
    mgpu_gpu_list_t l = sim(3);
    mgpu_visible_t v;
    char full[96];

    snprintf(full, sizeof full, "%s", l.gpus[2].uuid);
    mgpu_devices_visible(&l, full, &v);
    CHECK_INT(v.count, 1);
    CHECK_INT(v.physical[0], 2);
    /* "GPU-5130" is shared by every simulated GPU: ambiguous, so the list ends at once */
    mgpu_devices_visible(&l, "GPU-5130", &v);
    CHECK_INT(v.count, 0);
    CHECK_CONTAINS(v.why, "several");
    mgpu_devices_visible(&l, "1,GPU-51300000-0000-4000-8000-000000000000", &v);
    CHECK_INT(v.count, 2);
    CHECK_INT(v.physical[1], 0);
    /* the driver (H200, 580) shows one device for "GPU-<uuid of 0>,0" and for "0,GPU-<0>" */
    snprintf(full, sizeof full, "%s,0", l.gpus[0].uuid);
    mgpu_devices_visible(&l, full, &v);
    CHECK_INT(v.error, 0);
    CHECK_INT(v.count, 1);
    snprintf(full, sizeof full, "0,%s,1", l.gpus[0].uuid);
    mgpu_devices_visible(&l, full, &v);
    CHECK_INT(v.error, 0);
    CHECK_INT(v.count, 1);
    mgpu_devices_visible(&l, "MIG-abc", &v);
    CHECK_INT(v.count, 0);
}

static void test_sim_parse_errors(void)
{
    mgpu_gpu_list_t l;
    mgpu_err_t err;
    CHECK_INT(mgpu_devices_discover(&l, "x", NULL, &err), MGPU_E_USAGE);
    CHECK_CONTAINS(err.msg, "MGPU_SIM_GPUS='x'");
    CHECK_INT(mgpu_devices_discover(&l, "65", NULL, &err), MGPU_E_USAGE);
    CHECK_INT(mgpu_devices_discover(&l, "-1", NULL, &err), MGPU_E_USAGE);
    CHECK_INT(mgpu_devices_discover(&l, "0", NULL, &err), 0);
    CHECK_INT(l.count, 0);
    CHECK_INT(l.simulated, 1);
}

static void write_info(const char *root, const char *bus, const char *uuid)
{
    char path[512];
    FILE *f;
    snprintf(path, sizeof path, "%s/driver/nvidia/gpus/%s", root, bus);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/driver/nvidia/gpus/%s/information", root, bus);
    f = fopen(path, "w");
    fprintf(f,
            "Model: \t\t NVIDIA H200\nIRQ:   \t\t 42\nGPU UUID: \t %s\nBus Type: \t PCIe\n"
            "Bus Location: \t %s\n",
            uuid, bus);
    fclose(f);
}

static void test_discover_from_proc(void)
{
    char root[] = "/tmp/mgpu_proc_XXXXXX", path[512];
    mgpu_gpu_list_t l;
    mgpu_visible_t v;

    CHECK(mkdtemp(root) != NULL);
    snprintf(path, sizeof path, "%s/driver", root);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/driver/nvidia", root);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/driver/nvidia/gpus", root);
    mkdir(path, 0755);
    /* created out of bus order: discovery sorts by bus id, as nvidia-smi numbers them */
    write_info(root, "0000:9a:00.0", "GPU-bbbb1111-0000-0000-0000-000000000000");
    write_info(root, "0000:18:00.0", "GPU-aaaa2222-0000-0000-0000-000000000000");
    CHECK_INT(mgpu_devices_discover(&l, NULL, root, NULL), 0);
    CHECK_INT(l.count, 2);
    CHECK_INT(l.simulated, 0);
    CHECK_STR(l.gpus[0].bus_id, "0000:18:00.0");
    CHECK_STR(l.gpus[0].uuid, "GPU-aaaa2222-0000-0000-0000-000000000000");
    CHECK_STR(l.gpus[1].name, "NVIDIA H200");
    mgpu_devices_visible(&l, "GPU-bbbb", &v);
    CHECK_INT(v.count, 1);
    CHECK_INT(v.physical[0], 1);
    /* no driver: no GPU, and no error */
    CHECK_INT(mgpu_devices_discover(&l, NULL, "/nonexistent", NULL), 0);
    CHECK_INT(l.count, 0);
    snprintf(path, sizeof path, "/bin/rm -rf %s", root);
    CHECK(system(path) == 0);
}

static void test_describe(void)
{
    mgpu_gpu_list_t l = sim(4);
    mgpu_visible_t v;
    char buf[1024];
    mgpu_devices_visible(&l, "2,0", &v);
    mgpu_devices_describe(&l, &v, buf, sizeof buf);
    CHECK_CONTAINS(buf, "ordinal 0 = GPU 2");
    CHECK_CONTAINS(buf, "ordinal 1 = GPU 0");
    CHECK_CONTAINS(buf, "simulated");
    mgpu_devices_visible(&l, "", &v);
    mgpu_devices_describe(&l, &v, buf, sizeof buf);
    CHECK_STR(buf, "none");
}

int main(void)
{
    RUN(test_driver_measurements_one_gpu);
    RUN(test_article_scenarios);
    RUN(test_uuid_prefixes);
    RUN(test_sim_parse_errors);
    RUN(test_discover_from_proc);
    RUN(test_describe);
    return check_done();
}
