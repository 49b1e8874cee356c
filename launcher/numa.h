/* numa.h - the CPUs a worker is bound to with --numa_binding, in the four modes torchrun
 * defines (torch/numa/binding.py), from the machine's topology in sysfs:
 *
 *   node          every CPU of the NUMA node of the worker's GPU
 *   socket        every CPU of the NUMA nodes of that node's socket
 *   exclusive     the node's physical cores divided evenly among the node's GPUs, the lower
 *                 GPUs taking one more when they do not divide (a core's hyperthreads go
 *                 together); fewer cores than GPUs is an error
 *   core-complex  one group of CPUs sharing the largest cache (an L3 "core complex") of the
 *                 node: the node's n-th GPU takes the n-th group (the largest first, then by
 *                 lowest CPU), wrapping when there are more GPUs than groups
 *
 * "The node's GPUs" are the GPUs visible to the launcher whose NUMA node is the same, in
 * ordinal order. Everything stays within the CPUs the launcher itself may run on (its own
 * affinity: taskset, a cpuset cgroup, Slurm's binding), as torchrun's does.
 *
 * Topology comes from sysfs under a root ("/sys"; tests point it at a fake tree):
 *   bus/pci/devices/<bus id>/numa_node                 a GPU's node (-1: none reported)
 *   devices/system/node/node<N>/cpulist                a node's CPUs
 *   devices/system/cpu/cpu<N>/topology/physical_package_id, thread_siblings_list
 *   devices/system/cpu/cpu<N>/cache/index<I>/{type,level,shared_cpu_list}
 *
 * Plain values owned by the caller; nothing here allocates, nothing is printed. */
#ifndef MGPU_NUMA_H
#define MGPU_NUMA_H

#include <sched.h>  /* cpu_set_t */
#include <stddef.h> /* size_t */

#include "error.h" /* mgpu_err_t */

typedef enum {
    MGPU_NUMA_OFF = 0,
    MGPU_NUMA_NODE,
    MGPU_NUMA_SOCKET,
    MGPU_NUMA_EXCLUSIVE,
    MGPU_NUMA_CORE_COMPLEX,
} mgpu_numa_mode_t;

#define MGPU_NUMA_MAX_NODES 64

typedef struct mgpu_numa_topo {
    int nnodes;                             /* online NUMA nodes */
    int node[MGPU_NUMA_MAX_NODES];          /* their numbers, ascending */
    cpu_set_t cpus[MGPU_NUMA_MAX_NODES];    /* their CPUs the launcher may run on */
    char cpulist[MGPU_NUMA_MAX_NODES][128]; /* all their CPUs, as sysfs lists them */
    /* Per CPU, read for the mode that needs it (-1: unknown or not read): the lowest CPU of its
     * physical core (exclusive), the lowest CPU sharing its largest cache (core-complex), its
     * socket, the physical package (socket). */
    short core[CPU_SETSIZE];
    short cache[CPU_SETSIZE];
    short package[CPU_SETSIZE];
} mgpu_numa_topo_t;

/* "node", "socket", "exclusive", "core-complex" (or "core_complex"); -1 for anything else. */
int mgpu_numa_mode_parse(const char *s);
const char *mgpu_numa_mode_name(mgpu_numa_mode_t mode);

/* A kernel CPU list ("0-3,8,10-11\n") to a set. Returns 0, or -1 when malformed. */
int mgpu_cpulist_parse(const char *s, cpu_set_t *out);
/* A set as a kernel CPU list ("0-3,8"); "" when empty. */
void mgpu_cpulist_format(const cpu_set_t *set, char *buf, size_t len);

/* Reads the NUMA nodes and, for mode, the CPUs' cores, caches or sockets under sys_root (NULL:
 * "/sys"). allowed: the launcher's own affinity (NULL: every CPU). Returns 0, or 1 when the
 * machine describes no NUMA node there (why says so: nothing can be bound). */
int mgpu_numa_topo_read(const char *sys_root, mgpu_numa_mode_t mode, const cpu_set_t *allowed,
                        mgpu_numa_topo_t *t, char *why, size_t whylen);

/* The NUMA node of the PCI device bus_id ("0000:18:00.0"). A device that reports none (-1)
 * is on the only node of a one-node machine, as torchrun has it. Returns 0 with *node, or 1
 * with why when it cannot be known (no such file, -1 on a machine of several nodes). */
int mgpu_numa_device_node(const char *sys_root, const char *bus_id, const mgpu_numa_topo_t *t,
                          int *node, char *why, size_t whylen);

/* The CPUs for the GPU gpu (an index into gpu_nodes: the NUMA node of each GPU visible to the
 * launcher, ordinal order, -1 when unknown) in mode. Returns 0 with *out, 1 with why when
 * there is nothing to bind to (the node's CPUs are all outside the launcher's affinity), or
 * MGPU_E_USAGE when the mode cannot be met (exclusive: fewer cores than GPUs). */
int mgpu_numa_cpus(const mgpu_numa_topo_t *t, mgpu_numa_mode_t mode, const int *gpu_nodes,
                   int ngpus, int gpu, cpu_set_t *out, char *why, size_t whylen, mgpu_err_t *err);

#endif
