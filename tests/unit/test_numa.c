/* test_numa.c - --numa_binding's four modes on a fake sysfs topology, CPU lists, a GPU's
 * node, the launcher's own affinity, and the plan's bound and unbound workers. */
#include <stdarg.h>   /* va_list */
#include <stdlib.h>   /* mkdtemp */
#include <sys/stat.h> /* mkdir */

#include "check.h"
#include "fs.h" /* mgpu_fs_mkdir_p, mgpu_fs_remove_tree */
#include "numa.h"
#include "plan.h"
#include "plan_build.h" /* build */

/* Writes text and a newline to root/rel, making the folders on the way. */
static void put(const char *root, const char *rel, const char *fmt, ...)
{
    char path[1024], dir[1024];
    va_list ap;
    FILE *f;

    snprintf(path, sizeof path, "%s/%s", root, rel);
    snprintf(dir, sizeof dir, "%s", path);
    *strrchr(dir, '/') = '\0';
    mgpu_fs_mkdir_p(dir);
    f = fopen(path, "w");
    if (f == NULL) {
        printf("  cannot write %s\n", path);
        check_failed++;
        return;
    }
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fputc('\n', f);
    fclose(f);
}

/* A two-socket server: 2 NUMA nodes per socket, 8 cores per node, 2 hyperthreads per core
 * (CPU c and c + 32), an L3 cache per 4 cores (the core complexes), 2 GPUs per node: GPU g
 * (bus 0000:1g:00.0; bus 0000:aa:00.0 is a ninth, reporting -1) on node g / 2. */
static char *fake_server(void)
{
    static char root[] = "/tmp/mgpu_test_numa_XXXXXX";
    char rel[256];

    if (mkdtemp(root) == NULL)
        return NULL;
    for (int n = 0; n < 4; n++)
        put(root, (snprintf(rel, sizeof rel, "devices/system/node/node%d/cpulist", n), rel),
            "%d-%d,%d-%d", n * 8, n * 8 + 7, 32 + n * 8, 32 + n * 8 + 7);
    put(root, "devices/system/node/online", "0-3");
    for (int c = 0; c < 64; c++) {
        int core = c % 32, l3 = core / 4 * 4;
        snprintf(rel, sizeof rel, "devices/system/cpu/cpu%d/topology/physical_package_id", c);
        put(root, rel, "%d", core / 16);
        snprintf(rel, sizeof rel, "devices/system/cpu/cpu%d/topology/thread_siblings_list", c);
        put(root, rel, "%d,%d", core, core + 32);
        const char *types[] = {"Data", "Instruction", "Unified", "Unified"};
        const int levels[] = {1, 1, 2, 3};
        for (int i = 0; i < 4; i++) {
            snprintf(rel, sizeof rel, "devices/system/cpu/cpu%d/cache/index%d/type", c, i);
            put(root, rel, "%s", types[i]);
            snprintf(rel, sizeof rel, "devices/system/cpu/cpu%d/cache/index%d/level", c, i);
            put(root, rel, "%d", levels[i]);
            snprintf(rel, sizeof rel, "devices/system/cpu/cpu%d/cache/index%d/shared_cpu_list", c,
                     i);
            if (i < 3)
                put(root, rel, "%d,%d", core, core + 32);
            else
                put(root, rel, "%d-%d,%d-%d", l3, l3 + 3, l3 + 32, l3 + 35);
        }
    }
    for (int g = 0; g < 8; g++) {
        snprintf(rel, sizeof rel, "bus/pci/devices/0000:1%d:00.0/numa_node", g);
        put(root, rel, "%d", g / 2);
    }
    put(root, "bus/pci/devices/0000:aa:00.0/numa_node", "-1");
    return root;
}

static const int server_gpus[8] = {0, 0, 1, 1, 2, 2, 3, 3};

/* The CPUs mode gives GPU gpu of gpu_nodes (n GPUs), as a list; "skip: why" or "error: msg". */
static const char *cpus_for(const char *root, mgpu_numa_mode_t mode, const cpu_set_t *allowed,
                            const int *gpu_nodes, int n, int gpu)
{
    static char out[600];
    static mgpu_numa_topo_t t;
    char why[400] = "";
    cpu_set_t cpus;
    mgpu_err_t e = {0};
    int rc;

    CHECK_INT(mgpu_numa_topo_read(root, mode, allowed, &t, why, sizeof why), 0);
    rc = mgpu_numa_cpus(&t, mode, gpu_nodes, n, gpu, &cpus, why, sizeof why, &e);
    if (rc < 0)
        snprintf(out, sizeof out, "error: %s", e.msg);
    else if (rc > 0)
        snprintf(out, sizeof out, "skip: %s", why);
    else
        mgpu_cpulist_format(&cpus, out, sizeof out);
    return out;
}

static void test_cpulist(void)
{
    cpu_set_t s;
    char buf[128];
    CHECK_INT(mgpu_cpulist_parse("0-3,8,10-11\n", &s), 0);
    CHECK_INT(CPU_COUNT(&s), 7);
    mgpu_cpulist_format(&s, buf, sizeof buf);
    CHECK_STR(buf, "0-3,8,10-11");
    CHECK_INT(mgpu_cpulist_parse("", &s), 0); /* a node of memory alone */
    CHECK_INT(CPU_COUNT(&s), 0);
    mgpu_cpulist_format(&s, buf, sizeof buf);
    CHECK_STR(buf, "");
    CHECK_INT(mgpu_cpulist_parse("5", &s), 0);
    mgpu_cpulist_format(&s, buf, sizeof buf);
    CHECK_STR(buf, "5");
    CHECK_INT(mgpu_cpulist_parse("3-1", &s), -1);
    CHECK_INT(mgpu_cpulist_parse("1-", &s), -1);
    CHECK_INT(mgpu_cpulist_parse("a", &s), -1);
    CHECK_INT(mgpu_cpulist_parse("1;2", &s), -1);
    CHECK_INT(mgpu_cpulist_parse("99999", &s), -1);
}

static void test_mode_names(void)
{
    CHECK_INT(mgpu_numa_mode_parse("node"), MGPU_NUMA_NODE);
    CHECK_INT(mgpu_numa_mode_parse("socket"), MGPU_NUMA_SOCKET);
    CHECK_INT(mgpu_numa_mode_parse("exclusive"), MGPU_NUMA_EXCLUSIVE);
    CHECK_INT(mgpu_numa_mode_parse("core-complex"), MGPU_NUMA_CORE_COMPLEX);
    CHECK_INT(mgpu_numa_mode_parse("core_complex"), MGPU_NUMA_CORE_COMPLEX);
    CHECK_INT(mgpu_numa_mode_parse("Node"), -1);
    CHECK_INT(mgpu_numa_mode_parse(""), -1);
    CHECK_STR(mgpu_numa_mode_name(MGPU_NUMA_CORE_COMPLEX), "core-complex");
}

/* node: the GPU's node; socket: every node of its socket. */
static void test_node_and_socket(void)
{
    char *root = fake_server();
    CHECK(root != NULL);
    CHECK_STR(cpus_for(root, MGPU_NUMA_NODE, NULL, server_gpus, 8, 3), "8-15,40-47");
    CHECK_STR(cpus_for(root, MGPU_NUMA_NODE, NULL, server_gpus, 8, 4), "16-23,48-55");
    CHECK_STR(cpus_for(root, MGPU_NUMA_SOCKET, NULL, server_gpus, 8, 3), "0-15,32-47");
    CHECK_STR(cpus_for(root, MGPU_NUMA_SOCKET, NULL, server_gpus, 8, 7), "16-31,48-63");
    mgpu_fs_remove_tree(root);
}

/* exclusive: the node's 8 cores shared out, hyperthreads with their core; the lower GPUs of a
 * node take the remainder; fewer cores than GPUs is an error naming the node. */
static void test_exclusive(void)
{
    char *root = fake_server();
    const int three_on_node0[3] = {0, 0, 0}, nine_on_node0[9] = {0};
    CHECK_STR(cpus_for(root, MGPU_NUMA_EXCLUSIVE, NULL, server_gpus, 8, 2), "8-11,40-43");
    CHECK_STR(cpus_for(root, MGPU_NUMA_EXCLUSIVE, NULL, server_gpus, 8, 3), "12-15,44-47");
    CHECK_STR(cpus_for(root, MGPU_NUMA_EXCLUSIVE, NULL, three_on_node0, 3, 0), "0-2,32-34");
    CHECK_STR(cpus_for(root, MGPU_NUMA_EXCLUSIVE, NULL, three_on_node0, 3, 1), "3-5,35-37");
    CHECK_STR(cpus_for(root, MGPU_NUMA_EXCLUSIVE, NULL, three_on_node0, 3, 2), "6-7,38-39");
    CHECK_CONTAINS(cpus_for(root, MGPU_NUMA_EXCLUSIVE, NULL, nine_on_node0, 9, 0),
                   "error: --numa_binding=exclusive: NUMA node 0 has 8 physical cores (CPUs "
                   "0-7,32-39) for its 9 GPUs");
    mgpu_fs_remove_tree(root);
}

/* core-complex: one L3 group each, the largest first, wrapping around. */
static void test_core_complex(void)
{
    char *root = fake_server();
    const int three_on_node1[3] = {1, 1, 1};
    cpu_set_t allowed;
    CHECK_STR(cpus_for(root, MGPU_NUMA_CORE_COMPLEX, NULL, server_gpus, 8, 2), "8-11,40-43");
    CHECK_STR(cpus_for(root, MGPU_NUMA_CORE_COMPLEX, NULL, server_gpus, 8, 3), "12-15,44-47");
    CHECK_STR(cpus_for(root, MGPU_NUMA_CORE_COMPLEX, NULL, three_on_node1, 3, 2), "8-11,40-43");
    /* a complex with fewer CPUs the launcher may use comes after the full one */
    mgpu_cpulist_parse("0-7,9-63", &allowed);
    CHECK_STR(cpus_for(root, MGPU_NUMA_CORE_COMPLEX, &allowed, server_gpus, 8, 2), "12-15,44-47");
    CHECK_STR(cpus_for(root, MGPU_NUMA_CORE_COMPLEX, &allowed, server_gpus, 8, 3), "9-11,40-43");
    mgpu_fs_remove_tree(root);
}

/* Binding stays within the launcher's own CPUs; a node with none of them binds nothing. */
static void test_launcher_affinity(void)
{
    char *root = fake_server();
    cpu_set_t allowed;
    mgpu_cpulist_parse("0-15", &allowed); /* no hyperthreads, no second socket */
    CHECK_STR(cpus_for(root, MGPU_NUMA_NODE, &allowed, server_gpus, 8, 3), "8-15");
    CHECK_STR(cpus_for(root, MGPU_NUMA_EXCLUSIVE, &allowed, server_gpus, 8, 3), "12-15");
    CHECK_STR(cpus_for(root, MGPU_NUMA_SOCKET, &allowed, server_gpus, 8, 0), "0-15");
    CHECK_CONTAINS(cpus_for(root, MGPU_NUMA_NODE, &allowed, server_gpus, 8, 5),
                   "skip: NUMA node 2 has no CPU the launcher may run on (its CPUs: "
                   "16-23,48-55;");
    mgpu_fs_remove_tree(root);
}

/* A GPU's node: sysfs's PCI entry; -1 is the only node of a one-node machine, unknown on
 * several; a device sysfs does not list is unknown. */
static void test_device_node(void)
{
    char *root = fake_server(), why[400];
    static mgpu_numa_topo_t t;
    int node = -7;
    CHECK_INT(mgpu_numa_topo_read(root, MGPU_NUMA_NODE, NULL, &t, why, sizeof why), 0);
    CHECK_INT(t.nnodes, 4);
    CHECK_INT(mgpu_numa_device_node(root, "0000:15:00.0", &t, &node, why, sizeof why), 0);
    CHECK_INT(node, 2);
    CHECK_INT(mgpu_numa_device_node(root, "0000:AA:00.0", &t, &node, why, sizeof why), 1);
    CHECK_CONTAINS(why, "0000:aa:00.0/numa_node is -1, and this machine has 4 NUMA nodes");
    CHECK_INT(mgpu_numa_device_node(root, "0000:99:00.0", &t, &node, why, sizeof why), 1);
    CHECK_CONTAINS(why, "0000:99:00.0/numa_node: No such file or directory");
    /* one node: -1 is node 0, as torchrun reads it */
    t.nnodes = 1;
    node = -7;
    CHECK_INT(mgpu_numa_device_node(root, "0000:aa:00.0", &t, &node, why, sizeof why), 0);
    CHECK_INT(node, 0);
    mgpu_fs_remove_tree(root);
    /* no NUMA in the kernel at all */
    CHECK_INT(mgpu_numa_topo_read("/nonexistent", MGPU_NUMA_NODE, NULL, &t, why, sizeof why), 1);
    CHECK_CONTAINS(why, "/nonexistent/devices/system/node: No such file or directory");
}

/* The plan: each worker bound near its own GPU (CUDA_VISIBLE_DEVICES and sharing followed),
 * the others unbound with the reason; exclusive's impossible split refused. */
static void test_plan_binding(void)
{
    char *root = fake_server();
    mgpu_plan_t p;
    mgpu_err_t e;
    mgpu_plan_input_t in = {0};
    char list[256];
    in.sim_gpus = "8"; /* simulated GPUs have bus ids 0000:10:00.0 ... 0000:17:00.0 */
    in.cvd = "6,2,0";
    in.cpu_count = 64;
    in.free_port = 41234;
    in.hostname = "h";
    in.path_env = "/usr/bin:/bin";
    in.sys_root = root;
    CHECK_INT(build(&p, &e, &in, "--nproc_per_node=4", "--allow_gpu_sharing", "--numa_binding=node",
                    "/bin/true", NULL),
              0);
    CHECK_INT(p.numa_mode, MGPU_NUMA_NODE);
    CHECK_INT(p.workers[0].bound, 1);
    CHECK_INT(p.workers[0].numa_node, 3);
    mgpu_cpulist_format(&p.workers[0].cpus, list, sizeof list);
    CHECK_STR(list, "24-31,56-63");
    CHECK_INT(p.workers[1].numa_node, 1);
    CHECK_INT(p.workers[2].numa_node, 0);
    CHECK_INT(p.workers[3].numa_node, 3); /* shares ordinal 0 */
    CHECK_INT(p.workers[3].bound, 1);
    CHECK_STR(p.numa_warning, "");
    mgpu_plan_free(&p);
    /* exclusive among the visible GPUs of a node: physical 0 and 1 are node 0's */
    in.cvd = "1,0";
    CHECK_INT(
        build(&p, &e, &in, "--nproc_per_node=2", "--numa-binding", "exclusive", "/bin/true", NULL),
        0);
    mgpu_cpulist_format(&p.workers[0].cpus, list, sizeof list);
    CHECK_STR(list, "0-3,32-35"); /* ordinal 0 is the node's first visible GPU */
    mgpu_cpulist_format(&p.workers[1].cpus, list, sizeof list);
    CHECK_STR(list, "4-7,36-39");
    mgpu_plan_free(&p);
    /* GPUs the topology does not know: unbound, with a warning naming them */
    in.sim_gpus = "10";
    in.cvd = "9";
    CHECK_INT(build(&p, &e, &in, "--numa_binding=node", "/bin/true", NULL), 0);
    CHECK_INT(p.workers[0].bound, 0);
    CHECK_CONTAINS(p.workers[0].numa_why, "0000:19:00.0/numa_node: No such file");
    CHECK_CONTAINS(p.numa_warning,
                   "--numa_binding=node: local rank 0 (GPU 9, 0000:19:00.0, simulated) runs "
                   "unbound: its NUMA node is unknown");
    mgpu_plan_free(&p);
    /* no GPU: unbound, one warning */
    in.sim_gpus = "0";
    in.cvd = NULL;
    CHECK_INT(build(&p, &e, &in, "--nproc_per_node=2", "--numa_binding=socket", "/bin/true", NULL),
              0);
    CHECK_INT(p.workers[0].bound + p.workers[1].bound, 0);
    CHECK_CONTAINS(p.numa_warning, "--numa_binding=socket: the workers run on the CPU (no GPU is "
                                   "installed): no GPU to bind them near; they run unbound\n");
    mgpu_plan_free(&p);
    /* exclusive: more GPUs on node 0 than it has cores */
    put(root, "devices/system/node/node0/cpulist", "0,32");
    in.sim_gpus = "2";
    CHECK_INT(
        build(&p, &e, &in, "--nproc_per_node=2", "--numa_binding=exclusive", "/bin/true", NULL),
        MGPU_E_USAGE);
    CHECK_CONTAINS(e.msg, "--numa_binding=exclusive: NUMA node 0 has 1 physical core (CPUs 0,32) "
                          "for its 2 GPUs");
    mgpu_plan_free(&p);
    mgpu_fs_remove_tree(root);
}

int main(void)
{
    RUN(test_cpulist);
    RUN(test_mode_names);
    RUN(test_node_and_socket);
    RUN(test_exclusive);
    RUN(test_core_complex);
    RUN(test_launcher_affinity);
    RUN(test_device_node);
    RUN(test_plan_binding);
    return check_done();
}
