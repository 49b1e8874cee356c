/* test_engines.c - Slurm host lists, and options taken from Slurm, Open MPI and Kubeflow
 * variables. */
#include <stdlib.h> /* calloc */

#include "check.h"
#include "cli.h"
#include "engines.h"

static const char *env[16][2];

static const char *env_get(const char *name)
{
    for (int i = 0; i < 16 && env[i][0]; i++)
        if (strcmp(env[i][0], name) == 0)
            return env[i][1];
    return NULL;
}

static const char *expand(const char *list)
{
    static char out[4096];
    mgpu_err_t e;
    int n = mgpu_hostlist_expand(list, out, sizeof out, &e);
    if (n < 0)
        return "ERR";
    for (char *p = out; *p; p++)
        if (*p == '\n')
            *p = p[1] ? ' ' : '\0';
    return out;
}

static void test_hostlists(void)
{
    CHECK_STR(expand("node1"), "node1");
    CHECK_STR(expand("a,b"), "a b");
    CHECK_STR(expand("gpu[01-03,07]"), "gpu01 gpu02 gpu03 gpu07");
    CHECK_STR(expand("gpu[8-10],login"), "gpu8 gpu9 gpu10 login");
    CHECK_STR(expand("r[1-2]n[1-2]"), "r1n1 r1n2 r2n1 r2n2");
    CHECK_STR(expand("x[001-002]-ib"), "x001-ib x002-ib");
    CHECK_STR(expand("bad[1-"), "ERR");
    CHECK_STR(expand("bad[3-1]"), "ERR");
    CHECK_STR(expand("a,,b"), "ERR");
    CHECK_STR(expand("a[x]"), "ERR");
}

static mgpu_cli_t *parse(char **argv, int argc)
{
    mgpu_cli_t *c = calloc(1, sizeof *c);
    mgpu_err_t e;
    CHECK_INT(mgpu_cli_parse(c, argc, argv, env_get, &e), 0);
    return c;
}

static void test_slurm(void)
{
    char *argv[] = {"mgpu-launch", "prog"};
    char *argv2[] = {"mgpu-launch", "--nnodes=3", "--node_rank=0", "--master_addr=h0", "prog"};
    mgpu_err_t e;
    env[0][0] = "SLURM_NNODES", env[0][1] = "3";
    env[1][0] = "SLURM_NODEID", env[1][1] = "2";
    env[2][0] = "SLURM_JOB_NODELIST", env[2][1] = "gpu[07-09]";
    env[3][0] = "SLURM_JOB_ID", env[3][1] = "4242";
    mgpu_cli_t *c = parse(argv, 2);
    CHECK_INT(mgpu_engines_apply(c, env_get, &e), 0);
    CHECK_INT(c->nnodes_max, 3);
    CHECK_INT(c->node_rank, 2);
    CHECK_STR(c->master_addr, "gpu07");
    CHECK_STR(c->rdzv_id, "slurm-4242");
    CHECK_CONTAINS(c->derived, "node_rank=2 (SLURM_NODEID)");
    free(c);
    /* explicit options win */
    c = parse(argv2, 5);
    CHECK_INT(mgpu_engines_apply(c, env_get, &e), 0);
    CHECK_INT(c->node_rank, 0);
    CHECK_STR(c->master_addr, "h0");
    free(c);
    /* a node rank the node count cannot hold */
    env[1][1] = "5";
    c = parse(argv, 2);
    CHECK_INT(mgpu_engines_apply(c, env_get, &e), MGPU_E_USAGE);
    CHECK_CONTAINS(e.msg, "node rank 5");
    free(c);
    env[0][0] = NULL;
}

static void test_openmpi(void)
{
    char *argv[] = {"mgpu-launch", "prog"};
    char *allow[] = {"mgpu-launch", "--allow_multiple_launchers", "prog"};
    mgpu_err_t e;
    env[0][0] = "OMPI_COMM_WORLD_SIZE", env[0][1] = "2";
    env[1][0] = "OMPI_COMM_WORLD_RANK", env[1][1] = "1";
    env[2][0] = "OMPI_COMM_WORLD_LOCAL_SIZE", env[2][1] = "2";
    /* mpirun -np 2 on one host: two launchers on the same GPUs, refused unless asked for */
    mgpu_cli_t *c = parse(argv, 2);
    CHECK_INT(mgpu_engines_apply(c, env_get, &e), MGPU_E_USAGE);
    CHECK_CONTAINS(e.msg, "mpirun started 2 launchers on this host (OMPI_COMM_WORLD_LOCAL_SIZE=2)");
    CHECK_CONTAINS(e.msg, "mpirun --map-by ppr:1:node mgpu-launch");
    CHECK_CONTAINS(e.msg, "--allow_multiple_launchers");
    free(c);
    c = parse(allow, 3);
    CHECK_INT(mgpu_engines_apply(c, env_get, &e), 0);
    CHECK_INT(c->nnodes_max, 2);
    CHECK_INT(c->node_rank, 1);
    CHECK_STR(c->master_addr, "127.0.0.1");
    free(c);
    env[2][1] = "1"; /* one launcher per host, over two hosts: node 0 must be named */
    c = parse(argv, 2);
    CHECK_INT(mgpu_engines_apply(c, env_get, &e), MGPU_E_USAGE);
    CHECK_CONTAINS(e.msg, "--master_addr");
    free(c);
    env[0][0] = NULL;
    c = parse(argv, 2); /* neither engine: nothing changes */
    CHECK_INT(mgpu_engines_apply(c, env_get, &e), 0);
    CHECK_INT(c->nnodes_max, 1);
    CHECK_STR(c->derived, "");
    free(c);
}

/* srun -n2 on one node would start two launchers, two jobs on the same GPUs: refused,
 * with the right srun line, unless --allow_multiple_launchers. */
static void test_slurm_tasks_per_node(void)
{
    char *argv[] = {"mgpu-launch", "prog"};
    char *allow[] = {"mgpu-launch", "--allow_multiple_launchers", "prog"};
    mgpu_err_t e;
    mgpu_cli_t *c;
    memset(env, 0, sizeof env);
    env[0][0] = "SLURM_NNODES", env[0][1] = "1";
    env[1][0] = "SLURM_NODEID", env[1][1] = "0";
    env[2][0] = "SLURM_STEP_ID", env[2][1] = "0";
    env[3][0] = "SLURM_STEP_TASKS_PER_NODE", env[3][1] = "2";
    c = parse(argv, 2);
    CHECK_INT(mgpu_engines_apply(c, env_get, &e), MGPU_E_USAGE);
    CHECK_CONTAINS(e.msg, "runs 2 tasks on this node (SLURM_STEP_TASKS_PER_NODE)");
    CHECK_CONTAINS(e.msg, "srun --nodes=1 --ntasks-per-node=1 mgpu-launch");
    CHECK_CONTAINS(e.msg, "--allow_multiple_launchers");
    free(c);
    c = parse(allow, 3);
    CHECK_INT(mgpu_engines_apply(c, env_get, &e), 0);
    free(c);
    /* Slurm's compressed list: 1 task on node 0, 2 on nodes 1-3 */
    env[0][1] = "4";
    env[3][1] = "1,2(x3)";
    c = parse(argv, 2);
    CHECK_INT(mgpu_engines_apply(c, env_get, &e), 0);
    free(c);
    env[1][1] = "3";
    c = parse(argv, 2);
    CHECK_INT(mgpu_engines_apply(c, env_get, &e), MGPU_E_USAGE);
    CHECK_CONTAINS(e.msg, "srun --nodes=4 --ntasks-per-node=1");
    free(c);
    /* --ntasks-per-node, and the job's list when the step has none */
    env[3][0] = "SLURM_NTASKS_PER_NODE", env[3][1] = "4";
    c = parse(argv, 2);
    CHECK_INT(mgpu_engines_apply(c, env_get, &e), MGPU_E_USAGE);
    CHECK_CONTAINS(e.msg, "runs 4 tasks on this node (SLURM_NTASKS_PER_NODE)");
    free(c);
    env[3][0] = "SLURM_TASKS_PER_NODE", env[3][1] = "2(x4)";
    c = parse(argv, 2);
    CHECK_INT(mgpu_engines_apply(c, env_get, &e), MGPU_E_USAGE);
    free(c);
    /* one task per node is the right way */
    env[3][1] = "1(x4)";
    c = parse(argv, 2);
    CHECK_INT(mgpu_engines_apply(c, env_get, &e), 0);
    free(c);
    /* a batch script outside any step runs one launcher whatever the job's tasks */
    env[3][1] = "2(x4)";
    env[2][0] = "SLURM_JOB_ID";
    c = parse(argv, 2);
    CHECK_INT(mgpu_engines_apply(c, env_get, &e), 0);
    free(c);
    /* control bytes in the variables are escaped in messages */
    env[2][0] = "SLURM_STEP_ID";
    env[0][1] = "2";
    env[1][1] = "5";
    env[3][1] = "1(x4)";
    env[4][0] = "SLURM_JOB_NODELIST", env[4][1] = "a\x1b"
                                                  "b\x07,c";
    c = parse(argv, 2);
    CHECK_INT(mgpu_engines_apply(c, env_get, &e), MGPU_E_USAGE);
    CHECK(strchr(e.msg, 0x1b) == NULL);
    free(c);
    env[1][1] = "1";
    c = parse(argv, 2);
    CHECK_INT(mgpu_engines_apply(c, env_get, &e), 0);
    CHECK_CONTAINS(c->derived, "master_addr=a\\x1bb\\x07 (first of SLURM_JOB_NODELIST)");
    free(c);
    memset(env, 0, sizeof env);
}

/* A pod of a PyTorchJob from an operator that sets no PET_ variable: WORLD_SIZE counts the
 * pods, RANK is the pod's index (pkg/controller.v1/pytorch/envvar.go). */
static void test_kubeflow(void)
{
    char *argv[] = {"mgpu-launch", "--nproc_per_node=2", "prog"};
    mgpu_err_t e;
    mgpu_cli_t *c;
    memset(env, 0, sizeof env);
    env[0][0] = "KUBERNETES_SERVICE_HOST", env[0][1] = "10.96.0.1";
    env[1][0] = "MASTER_ADDR", env[1][1] = "job-master-0";
    env[2][0] = "MASTER_PORT", env[2][1] = "23456";
    env[3][0] = "WORLD_SIZE", env[3][1] = "3";
    env[4][0] = "RANK", env[4][1] = "2";
    c = parse(argv, 3);
    CHECK_INT(mgpu_engines_apply(c, env_get, &e), 0);
    CHECK_INT(c->nnodes_max, 3);
    CHECK_INT(c->node_rank, 2);
    CHECK_STR(c->master_addr, "job-master-0");
    CHECK_INT(c->master_port, 23456);
    CHECK_CONTAINS(c->derived, "nnodes=3 (WORLD_SIZE: the PyTorchJob's pods)");
    free(c);
    env[4][1] = "3"; /* an index the pods cannot hold */
    c = parse(argv, 3);
    CHECK_INT(mgpu_engines_apply(c, env_get, &e), MGPU_E_USAGE);
    CHECK_CONTAINS(e.msg, "WORLD_SIZE=3 RANK=3 from the PyTorchJob");
    free(c);
    /* a torchrun worker's environment, and a pod whose operator sets PET_NNODES: not taken */
    env[5][0] = "LOCAL_RANK", env[5][1] = "0";
    c = parse(argv, 3);
    CHECK_INT(mgpu_engines_apply(c, env_get, &e), 0);
    CHECK_INT(c->nnodes_max, 1);
    free(c);
    env[5][0] = "PET_NNODES", env[5][1] = "2";
    env[6][0] = "PET_NODE_RANK", env[6][1] = "1";
    env[4][1] = "1";
    c = parse(argv, 3);
    CHECK_INT(mgpu_engines_apply(c, env_get, &e), 0);
    CHECK_INT(c->nnodes_max, 2);
    CHECK_INT(c->node_rank, 1);
    CHECK_STR(c->derived, "");
    free(c);
    memset(env, 0, sizeof env);
}

int main(void)
{
    RUN(test_hostlists);
    RUN(test_slurm);
    RUN(test_openmpi);
    RUN(test_slurm_tasks_per_node);
    RUN(test_kubeflow);
    return check_done();
}
