/* engines.c - Slurm, Open MPI and Kubeflow's PyTorchJob (see engines.h). */
#include "engines.h"

#include <stdarg.h> /* va_list */
#include <stdio.h>  /* snprintf */
#include <stdlib.h> /* strtol */
#include <string.h> /* strchr */

#include "escape.h" /* mgpu_escape_inplace */

/* Appends every expansion of pattern (brackets resolved left to right) to out. */
static int expand_one(const char *pat, char *out, size_t len, size_t *used, int *count,
                      mgpu_err_t *err)
{
    const char *open = strchr(pat, '['), *close;
    char prefix[256], rest[512], ranges[512], *save = NULL;

    if (open == NULL) {
        size_t n = strlen(pat);
        if (*used + n + 2 > len)
            return mgpu_err_set(err, MGPU_E_RANGE, "host list too long");
        memcpy(out + *used, pat, n);
        *used += n;
        out[(*used)++] = '\n';
        out[*used] = '\0';
        (*count)++;
        return 0;
    }
    close = strchr(open, ']');
    if (close == NULL || (size_t)(open - pat) >= sizeof prefix ||
        (size_t)(close - open) >= sizeof ranges)
        return mgpu_err_set(err, MGPU_E_USAGE, "host list pattern '%s': unbalanced '['", pat);
    snprintf(prefix, sizeof prefix, "%.*s", (int)(open - pat), pat);
    snprintf(ranges, sizeof ranges, "%.*s", (int)(close - open - 1), open + 1);
    snprintf(rest, sizeof rest, "%s", close + 1);
    for (char *r = strtok_r(ranges, ",", &save); r; r = strtok_r(NULL, ",", &save)) {
        char *dash = strchr(r, '-'), *end;
        long lo = strtol(r, &end, 10), hi = lo;
        int width = dash ? (int)(dash - r) : (int)strlen(r);
        if (end == r || (dash == NULL && *end != '\0') || (dash != NULL && end != dash))
            return mgpu_err_set(err, MGPU_E_USAGE, "host list range '%s' in '%s'", r, pat);
        if (dash != NULL) {
            hi = strtol(dash + 1, &end, 10);
            if (end == dash + 1 || *end != '\0' || hi < lo || hi - lo > 100000)
                return mgpu_err_set(err, MGPU_E_USAGE, "host list range '%s' in '%s'", r, pat);
        }
        for (long v = lo; v <= hi; v++) {
            char item[1024];
            int rc;
            /* Zero padding follows the written width: node[01-10] -> node01 .. node10. */
            snprintf(item, sizeof item, "%s%0*ld%s", prefix, width, v, rest);
            if ((rc = expand_one(item, out, len, used, count, err)) < 0)
                return rc;
        }
    }
    return 0;
}

int mgpu_hostlist_expand(const char *list, char *out, size_t len, mgpu_err_t *err)
{
    size_t used = 0;
    int count = 0, depth = 0;
    const char *start = list;

    out[0] = '\0';
    for (const char *p = list;; p++) {
        if (*p == '[')
            depth++;
        else if (*p == ']')
            depth--;
        if ((*p == ',' && depth == 0) || *p == '\0') {
            char item[1024];
            int rc;
            if (p == start || (size_t)(p - start) >= sizeof item)
                return mgpu_err_set(err, MGPU_E_USAGE, "host list '%s': empty or overlong entry",
                                    list);
            snprintf(item, sizeof item, "%.*s", (int)(p - start), start);
            if ((rc = expand_one(item, out, len, &used, &count, err)) < 0)
                return rc;
            start = p + 1;
        }
        if (*p == '\0')
            break;
    }
    if (depth != 0)
        return mgpu_err_set(err, MGPU_E_USAGE, "host list '%s': unbalanced brackets", list);
    return count;
}

static int env_int(mgpu_getenv_fn g, const char *name, int *out)
{
    const char *v = g(name);
    char *end;
    long n;
    if (v == NULL || *v == '\0')
        return 0;
    n = strtol(v, &end, 10);
    if (*end != '\0' && *end != '(') /* SLURM_TASKS_PER_NODE looks like "2(x3)" */
        return 0;
    *out = (int)n;
    return 1;
}

/* Tasks per node in Slurm's list form, "2(x3),1" meaning 2,2,2,1: the count of node (an
 * index into the list), or 0 when the list does not say. */
static int slurm_list_at(const char *list, int node)
{
    for (const char *p = list; p != NULL && *p;) {
        char *end;
        long tasks = strtol(p, &end, 10), times = 1;
        if (end == p || tasks < 0)
            return 0;
        if (strncmp(end, "(x", 2) == 0) {
            char *end2;
            times = strtol(end + 2, &end2, 10);
            if (end2 == end + 2 || *end2 != ')' || times < 1)
                return 0;
            end = end2 + 1;
        }
        if (node < times)
            return (int)tasks;
        node -= (int)times;
        if (*end != ',')
            return 0;
        p = end + 1;
    }
    return 0;
}

/* The tasks of this Slurm step on this node (node: SLURM_NODEID), and which variable said so:
 * the step's own list first, then --ntasks-per-node, then the job's list. 0 when unknown. */
static int slurm_tasks_here(mgpu_getenv_fn g, int node, const char **from)
{
    int n = 0;

    *from = "SLURM_STEP_TASKS_PER_NODE";
    if ((n = slurm_list_at(g(*from), node)) > 0)
        return n;
    *from = "SLURM_NTASKS_PER_NODE";
    if (env_int(g, *from, &n) && n > 0)
        return n;
    *from = "SLURM_TASKS_PER_NODE";
    return slurm_list_at(g(*from), node);
}

static void note(mgpu_cli_t *cli, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Adds one "option=value (source)" to what --dry-run shows as derived. */
static void note(mgpu_cli_t *cli, const char *fmt, ...)
{
    size_t n = strlen(cli->derived);
    va_list ap;
    if (n > 0 && n + 2 < sizeof cli->derived) {
        memcpy(cli->derived + n, ", ", 3);
        n += 2;
    }
    va_start(ap, fmt);
    vsnprintf(cli->derived + n, sizeof cli->derived - n, fmt, ap);
    va_end(ap);
    /* The values come from the environment: shown by -v and --dry-run, never raw. */
    mgpu_escape_inplace(cli->derived + n, sizeof cli->derived - n);
}

static int apply_slurm(mgpu_cli_t *cli, mgpu_getenv_fn g, mgpu_err_t *err)
{
    const char *list =
        g("SLURM_STEP_NODELIST") ? g("SLURM_STEP_NODELIST") : g("SLURM_JOB_NODELIST");
    int nnodes = 0, node = 0;

    if (!env_int(g, "SLURM_STEP_NUM_NODES", &nnodes) && !env_int(g, "SLURM_NNODES", &nnodes))
        return 0;
    env_int(g, "SLURM_NODEID", &node);
    /* srun -n2 on one node starts two launchers that each think they are the whole node:
     * two independent jobs on the same GPUs. Inside a step (srun sets SLURM_STEP_ID), more
     * than one task here is refused unless asked for. */
    const char *from = NULL;
    int here = slurm_tasks_here(g, node, &from);
    if (here > 1 && (g("SLURM_STEP_ID") != NULL || g("SLURM_STEP_TASKS_PER_NODE") != NULL) &&
        !cli->allow_multiple_launchers)
        return mgpu_err_set(err, MGPU_E_USAGE,
                            "this Slurm step runs %d tasks on this node (%s), so %d launchers "
                            "would start here, each running its own job on the same GPUs; run "
                            "one launcher per node: srun --nodes=%d --ntasks-per-node=1 "
                            "mgpu-launch ... (or pass --allow_multiple_launchers)",
                            here, from, here, nnodes);
    if (!mgpu_cli_given(cli, "nnodes")) {
        cli->nnodes_min = cli->nnodes_max = nnodes;
        note(cli, "nnodes=%d (SLURM_NNODES)", nnodes);
    }
    if (!mgpu_cli_given(cli, "node_rank")) {
        cli->node_rank = node;
        note(cli, "node_rank=%d (SLURM_NODEID)", node);
    }
    if (!mgpu_cli_given(cli, "master_addr") && list != NULL && cli->nnodes_max > 1) {
        static char hosts[65536];
        int n = mgpu_hostlist_expand(list, hosts, sizeof hosts, err);
        if (n < 0)
            return n;
        hosts[strcspn(hosts, "\n")] = '\0';
        snprintf(cli->master_addr, sizeof cli->master_addr, "%s", hosts);
        note(cli, "master_addr=%s (first of SLURM_JOB_NODELIST)", cli->master_addr);
    }
    if (!mgpu_cli_given(cli, "rdzv_id") && g("SLURM_JOB_ID") != NULL) {
        snprintf(cli->rdzv_id, sizeof cli->rdzv_id, "slurm-%s%s%s", g("SLURM_JOB_ID"),
                 g("SLURM_STEP_ID") ? "." : "", g("SLURM_STEP_ID") ? g("SLURM_STEP_ID") : "");
        note(cli, "rdzv_id=%s (SLURM_JOB_ID)", cli->rdzv_id);
    }
    return 1;
}

static int apply_ompi(mgpu_cli_t *cli, mgpu_getenv_fn g, mgpu_err_t *err)
{
    int size = 0, rank = 0, local_size = 0;

    if (!env_int(g, "OMPI_COMM_WORLD_SIZE", &size))
        return 0;
    env_int(g, "OMPI_COMM_WORLD_RANK", &rank);
    env_int(g, "OMPI_COMM_WORLD_LOCAL_SIZE", &local_size);
    /* mpirun maps ranks by slot: -np 2 on one host starts two launchers here, each giving its
     * workers local ranks 0, 1, ... on the same GPUs. Refused as a Slurm step of several tasks
     * on a node is, unless asked for. */
    if (local_size > 1 && !cli->allow_multiple_launchers)
        return mgpu_err_set(err, MGPU_E_USAGE,
                            "mpirun started %d launchers on this host "
                            "(OMPI_COMM_WORLD_LOCAL_SIZE=%d), each running its workers on the "
                            "same GPUs; run one launcher per host: mpirun --map-by ppr:1:node "
                            "mgpu-launch ... (or pass --allow_multiple_launchers)",
                            local_size, local_size);
    if (!mgpu_cli_given(cli, "nnodes")) {
        cli->nnodes_min = cli->nnodes_max = size;
        note(cli, "nnodes=%d (OMPI_COMM_WORLD_SIZE)", size);
    }
    if (!mgpu_cli_given(cli, "node_rank")) {
        cli->node_rank = rank;
        note(cli, "node_rank=%d (OMPI_COMM_WORLD_RANK)", rank);
    }
    if (!mgpu_cli_given(cli, "master_addr") && cli->nnodes_max > 1) {
        /* Open MPI does not name rank 0's host; when every launcher is on this host, loopback
         * is right, otherwise the user must say where node 0 is. */
        if (local_size != size)
            return mgpu_err_set(err, MGPU_E_USAGE,
                                "under mpirun across %d hosts, give --master_addr (the address of "
                                "the host of OMPI_COMM_WORLD_RANK 0)",
                                size);
        note(cli, "master_addr=%s (every rank on this host)", cli->master_addr);
    }
    /* The job's id: Open MPI 4 (PMIx) names it PMIX_NAMESPACE, older ones orte_ess_jobid. */
    const char *job = g("PMIX_NAMESPACE") ? g("PMIX_NAMESPACE") : g("OMPI_MCA_orte_ess_jobid");
    if (!mgpu_cli_given(cli, "rdzv_id") && job != NULL) {
        snprintf(cli->rdzv_id, sizeof cli->rdzv_id, "ompi-%s", job);
        for (char *c = cli->rdzv_id; *c; c++)
            if (*c == '/')
                *c = '_'; /* a run id names folders and store keys */
        note(cli, "rdzv_id=%s (%s)", cli->rdzv_id,
             g("PMIX_NAMESPACE") ? "PMIX_NAMESPACE" : "OMPI_MCA_orte_ess_jobid");
    }
    return 1;
}

/* Kubeflow's training operator (PyTorchJob, pkg/controller.v1/pytorch/envvar.go, master.go):
 * its current releases set torchrun's PET_NNODES, PET_NODE_RANK, PET_NPROC_PER_NODE and
 * PET_MASTER_* (read as every PET_ default is, cli.h); earlier ones give a pod of a job that is
 * not elastic only MASTER_ADDR, MASTER_PORT, WORLD_SIZE = the number of pods and RANK = the
 * pod's index (master 0, worker i at i + 1). torchrun's WORLD_SIZE and RANK count processes:
 * the pod's are taken here as the nodes and the node rank, and the workers get torchrun's own.
 * A torchrun worker's environment (LOCAL_RANK, TORCHELASTIC_RUN_ID) is not a pod's. */
static int apply_kubeflow(mgpu_cli_t *cli, mgpu_getenv_fn g, mgpu_err_t *err)
{
    int pods = 0, index = 0, port = 0;

    if (g("KUBERNETES_SERVICE_HOST") == NULL || g("PET_NNODES") != NULL ||
        g("LOCAL_RANK") != NULL || g("TORCHELASTIC_RUN_ID") != NULL || g("MASTER_ADDR") == NULL ||
        !env_int(g, "WORLD_SIZE", &pods) || !env_int(g, "RANK", &index))
        return 0;
    if (pods < 1 || index < 0 || index >= pods)
        return mgpu_err_set(err, MGPU_E_USAGE,
                            "WORLD_SIZE=%s RANK=%s from the PyTorchJob: expected the number of "
                            "pods and this pod's index below it",
                            g("WORLD_SIZE"), g("RANK"));
    if (!mgpu_cli_given(cli, "nnodes")) {
        cli->nnodes_min = cli->nnodes_max = pods;
        note(cli, "nnodes=%d (WORLD_SIZE: the PyTorchJob's pods)", pods);
    }
    if (!mgpu_cli_given(cli, "node_rank")) {
        cli->node_rank = index;
        note(cli, "node_rank=%d (RANK: this pod's index)", index);
    }
    if (!mgpu_cli_given(cli, "master_addr") && cli->nnodes_max > 1 && *g("MASTER_ADDR") &&
        strlen(g("MASTER_ADDR")) < sizeof cli->master_addr) {
        snprintf(cli->master_addr, sizeof cli->master_addr, "%s", g("MASTER_ADDR"));
        note(cli, "master_addr=%s (MASTER_ADDR)", cli->master_addr);
    }
    if (!mgpu_cli_given(cli, "master_port") && env_int(g, "MASTER_PORT", &port) && port > 0 &&
        port < 65535) {
        cli->master_port = port;
        note(cli, "master_port=%d (MASTER_PORT)", port);
    }
    return 1;
}

static int engines_apply(mgpu_cli_t *cli, mgpu_getenv_fn g, mgpu_err_t *err)
{
    int rc;

    /* One launcher per host over ssh: the host list says it all (remote.h). */
    if (cli->hostfile[0] || cli->hosts[0])
        return 0;
    rc = apply_slurm(cli, g, err);
    if (rc == 0)
        rc = apply_ompi(cli, g, err);
    if (rc == 0)
        rc = apply_kubeflow(cli, g, err);
    if (rc < 0)
        return rc;
    if (cli->node_rank >= cli->nnodes_max)
        return mgpu_err_set(err, MGPU_E_USAGE,
                            "node rank %d from the environment is not below nnodes %d (%s)",
                            cli->node_rank, cli->nnodes_max, cli->derived);
    return 0;
}

int mgpu_engines_apply(mgpu_cli_t *cli, mgpu_getenv_fn g, mgpu_err_t *err)
{
    int rc = engines_apply(cli, g, err);
    /* Messages quote Slurm's and Open MPI's variables: control bytes are shown escaped. */
    if (rc < 0 && err != NULL)
        mgpu_escape_inplace(err->msg, sizeof err->msg);
    return rc;
}
