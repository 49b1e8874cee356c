/* numa.c - --numa_binding's CPU sets from the sysfs topology (see numa.h). */
#include "numa.h"

#include <ctype.h>  /* isdigit */
#include <dirent.h> /* opendir */
#include <errno.h>  /* errno */
#include <fcntl.h>  /* open */
#include <stdio.h>  /* snprintf */
#include <stdlib.h> /* strtol, qsort */
#include <string.h> /* strcmp */
#include <unistd.h> /* read */

static const char *root_of(const char *sys_root)
{
    return sys_root != NULL && sys_root[0] ? sys_root : "/sys";
}

/* The first line of a small sysfs file, without its newline. Returns 0, or a negative errno. */
static int read_line(const char *path, char *buf, size_t len)
{
    ssize_t n;
    int fd = open(path, O_RDONLY | O_CLOEXEC);

    if (fd < 0)
        return -errno;
    n = read(fd, buf, len - 1);
    close(fd);
    if (n < 0)
        return -EIO;
    buf[n] = '\0';
    buf[strcspn(buf, "\n")] = '\0';
    return 0;
}

static int read_int(const char *path, long *out)
{
    char buf[64], *end;
    int rc = read_line(path, buf, sizeof buf);

    if (rc < 0)
        return rc;
    errno = 0;
    *out = strtol(buf, &end, 10);
    return end == buf || *end != '\0' || errno != 0 ? -EINVAL : 0;
}

int mgpu_numa_mode_parse(const char *s)
{
    if (strcmp(s, "node") == 0)
        return MGPU_NUMA_NODE;
    if (strcmp(s, "socket") == 0)
        return MGPU_NUMA_SOCKET;
    if (strcmp(s, "exclusive") == 0)
        return MGPU_NUMA_EXCLUSIVE;
    if (strcmp(s, "core-complex") == 0 || strcmp(s, "core_complex") == 0)
        return MGPU_NUMA_CORE_COMPLEX;
    return -1;
}

const char *mgpu_numa_mode_name(mgpu_numa_mode_t mode)
{
    switch (mode) {
    case MGPU_NUMA_NODE:
        return "node";
    case MGPU_NUMA_SOCKET:
        return "socket";
    case MGPU_NUMA_EXCLUSIVE:
        return "exclusive";
    case MGPU_NUMA_CORE_COMPLEX:
        return "core-complex";
    case MGPU_NUMA_OFF:
        break;
    }
    return "off";
}

int mgpu_cpulist_parse(const char *s, cpu_set_t *out)
{
    CPU_ZERO(out);
    while (*s == ' ' || *s == '\t')
        s++;
    while (*s && *s != '\n') {
        char *end;
        long lo, hi;
        if (!isdigit((unsigned char)*s))
            return -1;
        lo = hi = strtol(s, &end, 10);
        s = end;
        if (*s == '-') {
            if (!isdigit((unsigned char)s[1]))
                return -1;
            hi = strtol(s + 1, &end, 10);
            s = end;
        }
        if (lo > hi || hi >= CPU_SETSIZE)
            return -1;
        for (long c = lo; c <= hi; c++)
            CPU_SET((int)c, out);
        if (*s == ',')
            s++;
        else if (*s != '\0' && *s != '\n')
            return -1;
    }
    return 0;
}

void mgpu_cpulist_format(const cpu_set_t *set, char *buf, size_t len)
{
    size_t used = 0;

    if (len > 0)
        buf[0] = '\0';
    for (int c = 0; c < CPU_SETSIZE; c++) {
        int end = c;
        if (!CPU_ISSET(c, set))
            continue;
        while (end + 1 < CPU_SETSIZE && CPU_ISSET(end + 1, set))
            end++;
        if (used < len)
            used +=
                (size_t)(end > c
                             ? snprintf(buf + used, len - used, "%s%d-%d", used ? "," : "", c, end)
                             : snprintf(buf + used, len - used, "%s%d", used ? "," : "", c));
        c = end;
    }
}

static int lowest_cpu(const cpu_set_t *set)
{
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, set))
            return c;
    return -1;
}

/* The lowest CPU of the list in file path, -1 when it cannot be read. */
static int lowest_in_file(const char *path)
{
    char line[4096];
    cpu_set_t set;

    if (read_line(path, line, sizeof line) < 0 || mgpu_cpulist_parse(line, &set) < 0)
        return -1;
    return lowest_cpu(&set);
}

/* The lowest CPU sharing cpu's largest data or unified cache, -1 when sysfs does not say. */
static int largest_cache_group(const char *root, int cpu)
{
    char dir[512], path[700], type[32];
    int best_level = -1, group = -1;
    DIR *d;
    struct dirent *de;

    snprintf(dir, sizeof dir, "%s/devices/system/cpu/cpu%d/cache", root, cpu);
    if ((d = opendir(dir)) == NULL)
        return -1;
    while ((de = readdir(d)) != NULL) {
        long level;
        int lowest;
        if (strncmp(de->d_name, "index", 5) != 0 || !isdigit((unsigned char)de->d_name[5]))
            continue;
        /* instruction caches are per core: only data and unified ones make a complex */
        snprintf(path, sizeof path, "%s/%s/type", dir, de->d_name);
        if (read_line(path, type, sizeof type) < 0 ||
            (strcmp(type, "Unified") != 0 && strcmp(type, "Data") != 0))
            continue;
        snprintf(path, sizeof path, "%s/%s/level", dir, de->d_name);
        if (read_int(path, &level) < 0 || level <= best_level)
            continue;
        snprintf(path, sizeof path, "%s/%s/shared_cpu_list", dir, de->d_name);
        if ((lowest = lowest_in_file(path)) < 0)
            continue;
        best_level = (int)level;
        group = lowest;
    }
    closedir(d);
    return group;
}

static int cmp_int(const void *a, const void *b)
{
    return *(const int *)a - *(const int *)b;
}

int mgpu_numa_topo_read(const char *sys_root, mgpu_numa_mode_t mode, const cpu_set_t *allowed,
                        mgpu_numa_topo_t *t, char *why, size_t whylen)
{
    const char *root = root_of(sys_root);
    char dir[512], path[700];
    cpu_set_t all;
    DIR *d;
    struct dirent *de;

    memset(t, 0, sizeof *t);
    for (int c = 0; c < CPU_SETSIZE; c++)
        t->core[c] = t->cache[c] = t->package[c] = -1;
    snprintf(dir, sizeof dir, "%s/devices/system/node", root);
    if ((d = opendir(dir)) == NULL) {
        snprintf(why, whylen, "%s: %s (a kernel without NUMA)", dir, strerror(errno));
        return 1;
    }
    while ((de = readdir(d)) != NULL && t->nnodes < MGPU_NUMA_MAX_NODES) {
        char *end;
        long n;
        if (strncmp(de->d_name, "node", 4) != 0 || !isdigit((unsigned char)de->d_name[4]))
            continue;
        n = strtol(de->d_name + 4, &end, 10);
        if (*end == '\0')
            t->node[t->nnodes++] = (int)n;
    }
    closedir(d);
    if (t->nnodes == 0) {
        snprintf(why, whylen, "%s lists no NUMA node", dir);
        return 1;
    }
    qsort(t->node, (size_t)t->nnodes, sizeof t->node[0], cmp_int);

    CPU_ZERO(&all);
    for (int i = 0; i < t->nnodes; i++) {
        snprintf(path, sizeof path, "%s/node%d/cpulist", dir, t->node[i]);
        /* a node of memory alone (CXL, HBM) has an empty list, or none */
        if (read_line(path, t->cpulist[i], sizeof t->cpulist[i]) < 0 ||
            mgpu_cpulist_parse(t->cpulist[i], &t->cpus[i]) < 0)
            CPU_ZERO(&t->cpus[i]);
        if (allowed != NULL)
            CPU_AND(&t->cpus[i], &t->cpus[i], allowed);
        CPU_OR(&all, &all, &t->cpus[i]);
    }
    for (int c = 0; c < CPU_SETSIZE; c++) {
        long v;
        if (!CPU_ISSET(c, &all))
            continue;
        switch (mode) {
        case MGPU_NUMA_SOCKET:
            snprintf(path, sizeof path, "%s/devices/system/cpu/cpu%d/topology/physical_package_id",
                     root, c);
            if (read_int(path, &v) == 0 && v >= 0 && v < 32768)
                t->package[c] = (short)v;
            break;
        case MGPU_NUMA_EXCLUSIVE:
            snprintf(path, sizeof path, "%s/devices/system/cpu/cpu%d/topology/thread_siblings_list",
                     root, c);
            t->core[c] = (short)lowest_in_file(path);
            break;
        case MGPU_NUMA_CORE_COMPLEX:
            t->cache[c] = (short)largest_cache_group(root, c);
            break;
        case MGPU_NUMA_NODE:
        case MGPU_NUMA_OFF:
            break;
        }
    }
    return 0;
}

/* Index of NUMA node number n in t, -1 when it is not there. */
static int node_index(const mgpu_numa_topo_t *t, int n)
{
    for (int i = 0; i < t->nnodes; i++)
        if (t->node[i] == n)
            return i;
    return -1;
}

int mgpu_numa_device_node(const char *sys_root, const char *bus_id, const mgpu_numa_topo_t *t,
                          int *node, char *why, size_t whylen)
{
    char bus[64], path[700];
    long n;
    int rc;

    /* sysfs names PCI devices in lower case; the driver may report "0000:1A:00.0" */
    snprintf(bus, sizeof bus, "%s", bus_id);
    for (char *p = bus; *p; p++)
        *p = (char)tolower((unsigned char)*p);
    snprintf(path, sizeof path, "%s/bus/pci/devices/%s/numa_node", root_of(sys_root), bus);
    if ((rc = read_int(path, &n)) < 0) {
        snprintf(why, whylen, "its NUMA node is unknown (%s: %s)", path, strerror(-rc));
        return 1;
    }
    if (n < 0 && t->nnodes == 1) {
        /* Firmware of one-node machines often leaves it at -1: the one node it is, as
         * torchrun reads it. */
        *node = t->node[0];
        return 0;
    }
    if (n < 0) {
        snprintf(why, whylen,
                 "its NUMA node is unknown (%s is -1, and this machine has %d NUMA nodes)", path,
                 t->nnodes);
        return 1;
    }
    if (node_index(t, (int)n) < 0) {
        snprintf(why, whylen, "its NUMA node %ld (%s) is not among the machine's nodes", n, path);
        return 1;
    }
    *node = (int)n;
    return 0;
}

/* The CPUs of set grouped by key[cpu] (a CPU with key -1 alone in its group, when alone_unknown,
 * else all such CPUs in one group). Fills group[] (the lowest CPU of each group, in ascending
 * order) and returns how many there are. */
static int groups_of(const cpu_set_t *set, const short *key, int alone_unknown,
                     int group[CPU_SETSIZE])
{
    int n = 0;
    int unknown = -1;

    for (int c = 0; c < CPU_SETSIZE; c++) {
        int k, seen = 0;
        if (!CPU_ISSET(c, set))
            continue;
        k = key[c];
        if (k < 0 && !alone_unknown) {
            if (unknown >= 0)
                continue;
            unknown = k = c;
        } else if (k < 0) {
            k = c;
        }
        for (int i = 0; i < n && !seen; i++)
            seen = group[i] == k;
        if (!seen)
            group[n++] = k;
    }
    qsort(group, (size_t)n, sizeof group[0], cmp_int);
    return n;
}

/* Adds to out the CPUs of set whose group (as groups_of made it) is g. */
static void add_group(const cpu_set_t *set, const short *key, int alone_unknown, int unknown_group,
                      int g, cpu_set_t *out)
{
    for (int c = 0; c < CPU_SETSIZE; c++) {
        int k;
        if (!CPU_ISSET(c, set))
            continue;
        k = key[c] >= 0 ? key[c] : alone_unknown ? c : unknown_group;
        if (k == g)
            CPU_SET(c, out);
    }
}

int mgpu_numa_cpus(const mgpu_numa_topo_t *t, mgpu_numa_mode_t mode, const int *gpu_nodes,
                   int ngpus, int gpu, cpu_set_t *out, char *why, size_t whylen, mgpu_err_t *err)
{
    int group[CPU_SETSIZE];
    int node = gpu_nodes[gpu], ni = node_index(t, node), rel = 0, on_node = 0;
    const cpu_set_t *cpus;

    CPU_ZERO(out);
    if (ni < 0) {
        snprintf(why, whylen, "NUMA node %d is not among the machine's nodes", node);
        return 1;
    }
    cpus = &t->cpus[ni];
    if (CPU_COUNT(cpus) == 0) {
        snprintf(why, whylen,
                 "NUMA node %d has no CPU the launcher may run on (its CPUs: %s; the launcher's "
                 "affinity excludes them)",
                 node, t->cpulist[ni][0] ? t->cpulist[ni] : "none");
        return 1;
    }
    /* This GPU's place among the GPUs of its node, in ordinal order. */
    for (int i = 0; i < ngpus; i++)
        if (gpu_nodes[i] == node) {
            if (i < gpu)
                rel++;
            on_node++;
        }

    switch (mode) {
    case MGPU_NUMA_NODE:
    case MGPU_NUMA_OFF:
        *out = *cpus;
        return 0;
    case MGPU_NUMA_SOCKET: {
        int package = t->package[lowest_cpu(cpus)];
        *out = *cpus;
        /* the package unknown: the node alone, as on a machine of one node per socket */
        for (int i = 0; i < t->nnodes && package >= 0; i++) {
            int lowest = lowest_cpu(&t->cpus[i]);
            if (lowest >= 0 && t->package[lowest] == package)
                CPU_OR(out, out, &t->cpus[i]);
        }
        return 0;
    }
    case MGPU_NUMA_EXCLUSIVE: {
        int ncores = groups_of(cpus, t->core, 1, group), per, extra, start, end;
        if (ncores < on_node) {
            char list[512];
            mgpu_cpulist_format(cpus, list, sizeof list);
            return mgpu_err_set(err, MGPU_E_USAGE,
                                "--numa_binding=exclusive: NUMA node %d has %d physical core%s "
                                "(CPUs %s) for its %d GPUs; expected at least one core a GPU "
                                "(--numa_binding=node shares the node's CPUs)",
                                node, ncores, ncores == 1 ? "" : "s", list, on_node);
        }
        per = ncores / on_node;
        extra = ncores % on_node;
        start = rel * per + (rel < extra ? rel : extra);
        end = start + per + (rel < extra ? 1 : 0);
        for (int g = start; g < end; g++)
            add_group(cpus, t->core, 1, -1, group[g], out);
        return 0;
    }
    case MGPU_NUMA_CORE_COMPLEX: {
        int ngroups = groups_of(cpus, t->cache, 0, group), size[CPU_SETSIZE], order[CPU_SETSIZE];
        int unknown = -1;
        for (int c = 0; c < CPU_SETSIZE && unknown < 0; c++)
            if (CPU_ISSET(c, cpus) && t->cache[c] < 0)
                unknown = c;
        for (int g = 0; g < ngroups; g++) {
            cpu_set_t one;
            CPU_ZERO(&one);
            add_group(cpus, t->cache, 0, unknown, group[g], &one);
            size[g] = CPU_COUNT(&one);
            order[g] = g;
        }
        /* the largest complexes first, then by lowest CPU (group[] is ascending): a stable
         * insertion sort keeps the second key */
        for (int i = 1; i < ngroups; i++)
            for (int j = i; j > 0 && size[order[j]] > size[order[j - 1]]; j--) {
                int tmp = order[j];
                order[j] = order[j - 1];
                order[j - 1] = tmp;
            }
        add_group(cpus, t->cache, 0, unknown, group[order[rel % ngroups]], out);
        return 0;
    }
    }
    return 0;
}
