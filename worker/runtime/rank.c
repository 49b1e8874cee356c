/* rank.c - who this process is, read from the environment a launcher leaves behind.
 *
 * Sources, in order: the torchrun contract (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
 * GROUP_RANK; given by mgpu-launch and torchrun), Open MPI's mpirun (OMPI_COMM_WORLD_*),
 * Slurm's srun (SLURM_PROCID, ...), else a single process. Numbers are parsed strictly (decimal, no
 * sign games, no trailing text) and every error names the variable and its value, because the
 * usual failure is a wrapper script that exported one variable too few or a stale value. */
#include "mgpu.h"

#include "device.h" /* mgpu_device_virtual_local_rank */

#include <errno.h>  /* errno, ERANGE */
#include <limits.h> /* INT_MAX */
#include <stdio.h>  /* snprintf */
#include <stdlib.h> /* getenv, strtol */
#include <string.h> /* strncmp, memset */

/* Variables only mgpu-launch sets (launcher/plan.c). Not "any MGPU_ variable": users and
 * harnesses set their own (MGPU_SIM_GPUS, MGPU_BUILD, ...) under torchrun too. */
static const char *const launcher_vars[] = {"MGPU_STORE_ADDR", "MGPU_LAUNCHER_PID",
                                            "MGPU_NODE_RANK", "MGPU_NNODES", NULL};

/* Parses a decimal int in [lo, hi]. name/source go into the message. Returns 0, MGPU_E_USAGE
 * for text that is not a number, or MGPU_E_RANGE. */
static int rank_parse_int(const char *name, const char *val, int lo, int hi, int *out,
                          mgpu_err_t *err)
{
    const char *p = val;
    char *end = NULL;
    long v;

    /* strtol would skip leading spaces and accept "+3": a value torchrun never writes, so
     * most likely a hand-edited script; refuse rather than guess. */
    if (*p == '-')
        p++;
    if (*p < '0' || *p > '9')
        return mgpu_err_set(err, MGPU_E_USAGE, "%s=\"%s\" is not an integer", name, val);
    errno = 0;
    v = strtol(val, &end, 10);
    if (*end != '\0')
        return mgpu_err_set(err, MGPU_E_USAGE, "%s=\"%s\" is not an integer", name, val);
    if (errno == ERANGE || v < lo || v > hi)
        return mgpu_err_set(err, MGPU_E_RANGE, "%s=%s is out of range [%d, %d]", name, val, lo, hi);
    *out = (int)v;
    return 0;
}

/* A required variable. */
static int rank_env_int(const char *name, const char *source, int lo, int hi, int *out,
                        mgpu_err_t *err)
{
    const char *v = getenv(name);
    int rc;

    if (v == NULL)
        return mgpu_err_set(err, MGPU_E_USAGE, "%s is not set (rank from %s variables)", name,
                            source);
    rc = rank_parse_int(name, v, lo, hi, out, err);
    if (rc < 0) {
        char tmp[sizeof err->msg];
        snprintf(tmp, sizeof tmp, "%s", err->msg);
        mgpu_err_set(err, rc, "%s (rank from %s variables)", tmp, source);
    }
    return rc;
}

/* An optional variable: *out keeps its default when unset. */
static int rank_env_int_opt(const char *name, const char *source, int lo, int hi, int *out,
                            mgpu_err_t *err)
{
    if (getenv(name) == NULL)
        return 0;
    return rank_env_int(name, source, lo, hi, out, err);
}

static void rank_copy(char *dst, size_t len, const char *src)
{
    snprintf(dst, len, "%s", src);
}

static int rank_below(const char *a, int av, const char *b, int bv, mgpu_err_t *err)
{
    if (av < bv)
        return 0;
    return mgpu_err_set(err, MGPU_E_RANGE, "%s=%d is not below %s=%d", a, av, b, bv);
}

static int rank_from_mgpu_launch(void)
{
    for (const char *const *v = launcher_vars; *v != NULL; v++)
        if (getenv(*v) != NULL)
            return 1;
    return 0;
}

static int rank_torchrun(mgpu_rank_info_t *r, mgpu_err_t *err)
{
    const char *src, *run_id = getenv("TORCHELASTIC_RUN_ID");
    int rc, nnodes_default;

    if (rank_from_mgpu_launch())
        src = "mgpu-launch";
    else if (run_id != NULL)
        src = "torchrun";
    else
        src = "env"; /* RANK & co. set by hand or by an older launcher */
    rank_copy(r->source, sizeof r->source, src);
    rank_copy(r->run_id, sizeof r->run_id, run_id != NULL && *run_id ? run_id : "none");

    if ((rc = rank_env_int("WORLD_SIZE", src, 1, INT_MAX, &r->world_size, err)) < 0 ||
        (rc = rank_env_int("RANK", src, 0, INT_MAX, &r->rank, err)) < 0 ||
        (rc = rank_env_int("LOCAL_RANK", src, 0, INT_MAX, &r->local_rank, err)) < 0 ||
        (rc = rank_env_int("LOCAL_WORLD_SIZE", src, 1, INT_MAX, &r->local_world_size, err)) < 0)
        return rc;
    /* mgpu-launch --virtual_local_rank: every LOCAL_RANK is 0, the index on the node is here */
    if (mgpu_device_virtual_local_rank() &&
        (rc = rank_env_int("MGPU_LOCAL_RANK", src, 0, INT_MAX, &r->local_rank, err)) < 0)
        return rc;
    if ((rc = rank_below("RANK", r->rank, "WORLD_SIZE", r->world_size, err)) < 0 ||
        (rc = rank_below("LOCAL_RANK", r->local_rank, "LOCAL_WORLD_SIZE", r->local_world_size,
                         err)) < 0)
        return rc;
    if (r->local_world_size > r->world_size)
        return mgpu_err_set(err, MGPU_E_RANGE, "LOCAL_WORLD_SIZE=%d is above WORLD_SIZE=%d",
                            r->local_world_size, r->world_size);
    /* torchrun gives GROUP_RANK and GROUP_WORLD_SIZE; without them, assume nodes of equal
     * size, which is what every launcher of this contract produces. */
    r->node_rank = r->rank / r->local_world_size;
    nnodes_default = (r->world_size + r->local_world_size - 1) / r->local_world_size;
    r->nnodes = nnodes_default;
    if ((rc = rank_env_int_opt("GROUP_WORLD_SIZE", src, 1, INT_MAX, &r->nnodes, err)) < 0 ||
        (rc = rank_env_int_opt("GROUP_RANK", src, 0, INT_MAX, &r->node_rank, err)) < 0)
        return rc;
    if ((rc = rank_below("GROUP_RANK", r->node_rank, "the number of nodes", r->nnodes, err)) < 0)
        return rc;
    if (r->nnodes == 1 && r->local_world_size != r->world_size)
        return mgpu_err_set(err, MGPU_E_RANGE,
                            "LOCAL_WORLD_SIZE=%d differs from WORLD_SIZE=%d on a single node",
                            r->local_world_size, r->world_size);
    if (r->nnodes == 1 && r->local_rank != r->rank)
        return mgpu_err_set(err, MGPU_E_RANGE,
                            "LOCAL_RANK=%d differs from RANK=%d on a single node%s", r->local_rank,
                            r->rank,
                            r->local_rank == 0 ? " (torchrun --virtual-local-rank gives every "
                                                 "worker LOCAL_RANK=0; libmgpu needs each one's "
                                                 "index on the node: use mgpu-launch "
                                                 "--virtual_local_rank, which also gives it)"
                                               : "");
    return rank_env_int_opt("TORCHELASTIC_RESTART_COUNT", src, 0, INT_MAX, &r->restart_count, err);
}

/* SLURM_TASKS_PER_NODE is "2(x3),1": 2 tasks on each of 3 nodes, then 1. Returns the count
 * of node node_id, or -1 when the value is malformed or too short. */
static int rank_slurm_tasks_on(const char *s, int node_id)
{
    int node = 0;
    const char *p = s;

    while (*p) {
        char *end;
        long count = strtol(p, &end, 10), rep = 1;
        if (end == p || count < 0 || count > INT_MAX)
            return -1;
        p = end;
        if (*p == '(') {
            if (p[1] != 'x')
                return -1;
            rep = strtol(p + 2, &end, 10);
            if (end == p + 2 || *end != ')' || rep < 1)
                return -1;
            p = end + 1;
        }
        if (node_id < node + rep)
            return (int)count;
        node += (int)rep;
        if (*p == ',')
            p++;
        else if (*p != '\0')
            return -1;
    }
    return -1;
}

static int rank_slurm(mgpu_rank_info_t *r, mgpu_err_t *err)
{
    const char *src = "slurm", *job = getenv("SLURM_JOB_ID"), *step = getenv("SLURM_STEP_ID");
    const char *tpn = getenv("SLURM_TASKS_PER_NODE"), *ntasks = "SLURM_NTASKS";
    int rc;

    rank_copy(r->source, sizeof r->source, src);
    /* The step id too: two srun steps of one job on one host are two different worlds. */
    snprintf(r->run_id, sizeof r->run_id, "%s%s%s", job ? job : "none", step ? "." : "",
             step ? step : "");
    if (getenv(ntasks) == NULL && getenv("SLURM_NPROCS") != NULL)
        ntasks = "SLURM_NPROCS"; /* older Slurm */
    if ((rc = rank_env_int(ntasks, src, 1, INT_MAX, &r->world_size, err)) < 0 ||
        (rc = rank_env_int("SLURM_PROCID", src, 0, INT_MAX, &r->rank, err)) < 0 ||
        (rc = rank_env_int("SLURM_LOCALID", src, 0, INT_MAX, &r->local_rank, err)) < 0 ||
        (rc = rank_env_int("SLURM_NODEID", src, 0, INT_MAX, &r->node_rank, err)) < 0)
        return rc;
    r->nnodes = 1;
    if (getenv("SLURM_NNODES") == NULL && getenv("SLURM_JOB_NUM_NODES") != NULL)
        rc = rank_env_int("SLURM_JOB_NUM_NODES", src, 1, INT_MAX, &r->nnodes, err);
    else
        rc = rank_env_int("SLURM_NNODES", src, 1, INT_MAX, &r->nnodes, err);
    if (rc < 0)
        return rc;
    /* Per node: SLURM_TASKS_PER_NODE (always set by srun, and right on uneven layouts),
     * else SLURM_NTASKS_PER_NODE (only with --ntasks-per-node). */
    if (tpn != NULL) {
        r->local_world_size = rank_slurm_tasks_on(tpn, r->node_rank);
        if (r->local_world_size < 1)
            return mgpu_err_set(err, MGPU_E_USAGE,
                                "SLURM_TASKS_PER_NODE=\"%s\" has no task count for "
                                "SLURM_NODEID=%d",
                                tpn, r->node_rank);
    } else if ((rc = rank_env_int("SLURM_NTASKS_PER_NODE", src, 1, INT_MAX, &r->local_world_size,
                                  err)) < 0) {
        return rc;
    }
    if ((rc = rank_below("SLURM_PROCID", r->rank, ntasks, r->world_size, err)) < 0 ||
        (rc = rank_below("SLURM_LOCALID", r->local_rank, "the tasks on this node",
                         r->local_world_size, err)) < 0 ||
        (rc = rank_below("SLURM_NODEID", r->node_rank, "SLURM_NNODES", r->nnodes, err)) < 0)
        return rc;
    return rank_env_int_opt("SLURM_RESTART_COUNT", src, 0, INT_MAX, &r->restart_count, err);
}

static int rank_openmpi(mgpu_rank_info_t *r, mgpu_err_t *err)
{
    const char *src = "openmpi", *ns = getenv("PMIX_NAMESPACE");
    const char *jobid = getenv("OMPI_MCA_ess_base_jobid");
    int rc;

    rank_copy(r->source, sizeof r->source, src);
    rank_copy(r->run_id, sizeof r->run_id, ns ? ns : jobid ? jobid : "none");
    if ((rc = rank_env_int("OMPI_COMM_WORLD_SIZE", src, 1, INT_MAX, &r->world_size, err)) < 0 ||
        (rc = rank_env_int("OMPI_COMM_WORLD_RANK", src, 0, INT_MAX, &r->rank, err)) < 0 ||
        (rc = rank_env_int("OMPI_COMM_WORLD_LOCAL_RANK", src, 0, INT_MAX, &r->local_rank, err)) <
            0 ||
        (rc = rank_env_int("OMPI_COMM_WORLD_LOCAL_SIZE", src, 1, INT_MAX, &r->local_world_size,
                           err)) < 0)
        return rc;
    if ((rc = rank_below("OMPI_COMM_WORLD_RANK", r->rank, "OMPI_COMM_WORLD_SIZE", r->world_size,
                         err)) < 0 ||
        (rc = rank_below("OMPI_COMM_WORLD_LOCAL_RANK", r->local_rank, "OMPI_COMM_WORLD_LOCAL_SIZE",
                         r->local_world_size, err)) < 0)
        return rc;
    if (r->local_world_size > r->world_size)
        return mgpu_err_set(err, MGPU_E_RANGE,
                            "OMPI_COMM_WORLD_LOCAL_SIZE=%d is above OMPI_COMM_WORLD_SIZE=%d",
                            r->local_world_size, r->world_size);
    /* Open MPI names no node index (OMPI_COMM_WORLD_NODE_RANK is something else: the rank
     * among this job's processes on the node). mpirun's default by-slot mapping fills nodes
     * in rank order, so the node is rank / local size. */
    r->node_rank = r->rank / r->local_world_size;
    r->nnodes = (r->world_size + r->local_world_size - 1) / r->local_world_size;
    return 0;
}

int mgpu_rank_info_from_env(mgpu_rank_info_t *out, mgpu_err_t *err)
{
    mgpu_rank_info_t r;
    int rc;

    memset(&r, 0, sizeof r);
    if (getenv("RANK") != NULL || getenv("WORLD_SIZE") != NULL)
        rc = rank_torchrun(&r, err);
    /* Open MPI before Slurm: mpirun inside an sbatch script gives its ranks OMPI_* on top of
     * the batch step's stale SLURM_PROCID=0, which would make every rank rank 0. A program
     * srun starts directly has no OMPI_COMM_WORLD_* in its environment (MPI_Init learns
     * its rank from PMIx), so Slurm still describes it. */
    else if (getenv("OMPI_COMM_WORLD_RANK") != NULL || getenv("OMPI_COMM_WORLD_SIZE") != NULL)
        rc = rank_openmpi(&r, err);
    else if (getenv("SLURM_PROCID") != NULL)
        rc = rank_slurm(&r, err);
    else {
        r.world_size = r.local_world_size = r.nnodes = 1;
        rank_copy(r.source, sizeof r.source, "single");
        rank_copy(r.run_id, sizeof r.run_id, "none");
        rc = 0;
    }
    if (rc < 0)
        return rc;
    *out = r;
    return 0;
}
