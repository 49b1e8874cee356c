/* test_rank.c - rank info from the environment of mgpu-launch/torchrun, srun and mpirun, and
 * the device each rank gets (the article's four scenarios, on simulated GPUs). Each test runs
 * in its own process, so it may change the environment freely. */
#include "check.h"

#include <stdlib.h> /* setenv, unsetenv */

#include "device.h"  /* mgpu_device_select */
#include "devices.h" /* mgpu_devices_discover */
#include "mgpu.h"

extern char **environ;

/* Removes every variable a launcher might have left in the test's own environment. */
static void env_clear(void)
{
    static const char *const prefixes[] = {
        "RANK=",   "WORLD_SIZE=", "LOCAL_", "GROUP_", "ROLE_", "TORCHELASTIC_",
        "MASTER_", "SLURM_",      "OMPI_",  "PMIX_",  "MGPU_", "CUDA_VISIBLE_DEVICES=",
        NULL};
    for (int again = 1; again;) {
        again = 0;
        for (char **e = environ; *e != NULL && !again; e++) {
            for (const char *const *p = prefixes; *p != NULL; p++) {
                if (strncmp(*e, *p, strlen(*p)) == 0) {
                    char name[256];
                    size_t n = strcspn(*e, "=");
                    snprintf(name, sizeof name, "%.*s", (int)n, *e);
                    unsetenv(name);
                    again = 1; /* environ changed under us: start over */
                    break;
                }
            }
        }
    }
}

static void env_torchrun(const char *rank, const char *world, const char *local,
                         const char *local_world)
{
    env_clear();
    if (rank)
        setenv("RANK", rank, 1);
    if (world)
        setenv("WORLD_SIZE", world, 1);
    if (local)
        setenv("LOCAL_RANK", local, 1);
    if (local_world)
        setenv("LOCAL_WORLD_SIZE", local_world, 1);
    setenv("TORCHELASTIC_RUN_ID", "job42", 1);
}

static int parse(mgpu_rank_info_t *r, mgpu_err_t *err)
{
    memset(r, 0x5a, sizeof *r);
    err->code = 0;
    err->msg[0] = '\0';
    return mgpu_rank_info_from_env(r, err);
}

static void test_single_process(void)
{
    mgpu_rank_info_t r;
    mgpu_err_t err;
    env_clear();
    CHECK_INT(parse(&r, &err), 0);
    CHECK_INT(r.rank, 0);
    CHECK_INT(r.world_size, 1);
    CHECK_INT(r.local_rank, 0);
    CHECK_INT(r.local_world_size, 1);
    CHECK_INT(r.node_rank, 0);
    CHECK_INT(r.nnodes, 1);
    CHECK_INT(r.restart_count, 0);
    CHECK_STR(r.source, "single");
    CHECK_STR(r.run_id, "none");
}

static void test_torchrun(void)
{
    mgpu_rank_info_t r;
    mgpu_err_t err;
    env_torchrun("2", "4", "2", "4");
    setenv("TORCHELASTIC_RESTART_COUNT", "3", 1);
    setenv("MGPU_SIM_GPUS", "4", 1); /* a user's knob: still torchrun */
    setenv("MGPU_BUILD", "/tmp", 1); /* a test harness's: still torchrun */
    CHECK_INT(parse(&r, &err), 0);
    CHECK_INT(r.rank, 2);
    CHECK_INT(r.world_size, 4);
    CHECK_INT(r.local_rank, 2);
    CHECK_INT(r.local_world_size, 4);
    CHECK_INT(r.node_rank, 0);
    CHECK_INT(r.nnodes, 1);
    CHECK_INT(r.restart_count, 3);
    CHECK_STR(r.source, "torchrun");
    CHECK_STR(r.run_id, "job42");
}

static void test_mgpu_launch_and_plain_env(void)
{
    mgpu_rank_info_t r;
    mgpu_err_t err;
    env_torchrun("0", "2", "0", "2");
    setenv("MGPU_STORE_ADDR", "127.0.0.1", 1);
    CHECK_INT(parse(&r, &err), 0);
    CHECK_STR(r.source, "mgpu-launch");
    env_torchrun("0", "2", "0", "2");
    setenv("MGPU_LAUNCHER_PID", "1", 1); /* a variable only mgpu-launch sets */
    CHECK_INT(parse(&r, &err), 0);
    CHECK_STR(r.source, "mgpu-launch");
    env_torchrun("1", "2", "1", "2");
    unsetenv("TORCHELASTIC_RUN_ID");
    CHECK_INT(parse(&r, &err), 0);
    CHECK_STR(r.source, "env");
    CHECK_STR(r.run_id, "none");
    CHECK_INT(r.rank, 1);
}

/* mgpu-launch --virtual_local_rank: LOCAL_RANK=0 everywhere, the index on the node in
 * MGPU_LOCAL_RANK; torchrun's flag alone (no MGPU_LOCAL_RANK) is refused with a way out. */
static void test_virtual_local_rank(void)
{
    mgpu_rank_info_t r;
    mgpu_err_t err;
    env_torchrun("2", "4", "0", "4");
    setenv("MGPU_LOCAL_RANK", "2", 1);
    CHECK_INT(parse(&r, &err), 0);
    CHECK_INT(r.local_rank, 2);
    CHECK_INT(r.rank, 2);
    CHECK_INT(mgpu_device_virtual_local_rank(), 1);
    setenv("MGPU_LOCAL_RANK", "4", 1);
    CHECK(parse(&r, &err) < 0);
    CHECK_CONTAINS(err.msg, "LOCAL_RANK=4 is not below LOCAL_WORLD_SIZE=4");
    unsetenv("MGPU_LOCAL_RANK");
    CHECK_INT(mgpu_device_virtual_local_rank(), 0);
    CHECK(parse(&r, &err) < 0);
    CHECK_CONTAINS(err.msg, "LOCAL_RANK=0 differs from RANK=2");
    CHECK_CONTAINS(err.msg, "mgpu-launch --virtual_local_rank");
    /* MGPU_LOCAL_RANK counts only where LOCAL_RANK is 0 */
    env_torchrun("1", "4", "1", "4");
    setenv("MGPU_LOCAL_RANK", "3", 1);
    CHECK_INT(parse(&r, &err), 0);
    CHECK_INT(r.local_rank, 1);
    CHECK_INT(mgpu_device_virtual_local_rank(), 0);
}

static void test_multi_node(void)
{
    mgpu_rank_info_t r;
    mgpu_err_t err;
    env_torchrun("5", "8", "1", "4");
    setenv("GROUP_RANK", "1", 1);
    setenv("GROUP_WORLD_SIZE", "2", 1);
    CHECK_INT(parse(&r, &err), 0);
    CHECK_INT(r.node_rank, 1);
    CHECK_INT(r.nnodes, 2);
    /* Without GROUP_*: nodes of equal size. */
    env_torchrun("6", "8", "2", "4");
    CHECK_INT(parse(&r, &err), 0);
    CHECK_INT(r.node_rank, 1);
    CHECK_INT(r.nnodes, 2);
    env_torchrun("5", "8", "1", "4");
    setenv("GROUP_RANK", "2", 1);
    setenv("GROUP_WORLD_SIZE", "2", 1);
    CHECK_INT(parse(&r, &err), MGPU_E_RANGE);
    CHECK_CONTAINS(err.msg, "GROUP_RANK=2 is not below the number of nodes=2");
}

static void test_env_errors(void)
{
    static const struct {
        const char *rank, *world, *local, *local_world;
        int code;
        const char *msg;
    } cases[] = {
        {"abc", "4", "0", "4", MGPU_E_USAGE, "RANK=\"abc\" is not an integer"},
        {"1x", "4", "1", "4", MGPU_E_USAGE, "RANK=\"1x\" is not an integer"},
        {" 1", "4", "1", "4", MGPU_E_USAGE, "RANK=\" 1\" is not an integer"},
        {"+1", "4", "1", "4", MGPU_E_USAGE, "RANK=\"+1\" is not an integer"},
        {"", "4", "0", "4", MGPU_E_USAGE, "RANK=\"\" is not an integer"},
        {"-1", "4", "0", "4", MGPU_E_RANGE, "RANK=-1 is out of range"},
        {"99999999999", "4", "0", "4", MGPU_E_RANGE, "RANK=99999999999 is out of range"},
        {"4", "4", "0", "4", MGPU_E_RANGE, "RANK=4 is not below WORLD_SIZE=4"},
        {"0", "0", "0", "1", MGPU_E_RANGE, "WORLD_SIZE=0 is out of range"},
        {"1", "2", "2", "2", MGPU_E_RANGE, "LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2"},
        {"1", "2", "1", "3", MGPU_E_RANGE, "LOCAL_WORLD_SIZE=3 is above WORLD_SIZE=2"},
        {"1", "2", NULL, "2", MGPU_E_USAGE, "LOCAL_RANK is not set (rank from torchrun"},
        {"1", NULL, "1", "2", MGPU_E_USAGE, "WORLD_SIZE is not set"},
        {NULL, "2", "1", "2", MGPU_E_USAGE, "RANK is not set"},
        {"1", "2", "1", NULL, MGPU_E_USAGE, "LOCAL_WORLD_SIZE is not set"},
        {"1", "2", "0", "2", MGPU_E_RANGE, "LOCAL_RANK=0 differs from RANK=1 on a single node"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mgpu_rank_info_t r;
        mgpu_err_t err;
        env_torchrun(cases[i].rank, cases[i].world, cases[i].local, cases[i].local_world);
        int rc = parse(&r, &err);
        if (rc != cases[i].code)
            printf("  case %zu: rc %d (%s)\n", i, rc, err.msg);
        CHECK_INT(rc, cases[i].code);
        CHECK_INT(err.code, cases[i].code);
        CHECK_CONTAINS(err.msg, cases[i].msg);
    }
    env_torchrun("0", "1", "0", "1");
    setenv("TORCHELASTIC_RESTART_COUNT", "x", 1);
    mgpu_rank_info_t r;
    mgpu_err_t err;
    CHECK_INT(parse(&r, &err), MGPU_E_USAGE);
    CHECK_CONTAINS(err.msg, "TORCHELASTIC_RESTART_COUNT=\"x\"");
}

static void env_slurm(void)
{
    env_clear();
    setenv("SLURM_PROCID", "3", 1);
    setenv("SLURM_NTASKS", "5", 1);
    setenv("SLURM_LOCALID", "0", 1);
    setenv("SLURM_NODEID", "1", 1);
    setenv("SLURM_NNODES", "2", 1);
    setenv("SLURM_TASKS_PER_NODE", "3,2", 1);
    setenv("SLURM_JOB_ID", "777", 1);
    setenv("SLURM_STEP_ID", "1", 1);
}

static void test_slurm(void)
{
    mgpu_rank_info_t r;
    mgpu_err_t err;
    env_slurm();
    CHECK_INT(parse(&r, &err), 0);
    CHECK_STR(r.source, "slurm");
    CHECK_STR(r.run_id, "777.1");
    CHECK_INT(r.rank, 3);
    CHECK_INT(r.world_size, 5);
    CHECK_INT(r.local_rank, 0);
    CHECK_INT(r.local_world_size, 2); /* node 1 of "3,2" */
    CHECK_INT(r.node_rank, 1);
    CHECK_INT(r.nnodes, 2);
    /* The repeat form: 2 tasks on each of 3 nodes. */
    env_slurm();
    setenv("SLURM_NTASKS", "6", 1);
    setenv("SLURM_NNODES", "3", 1);
    setenv("SLURM_NODEID", "2", 1);
    setenv("SLURM_LOCALID", "1", 1);
    setenv("SLURM_PROCID", "5", 1);
    setenv("SLURM_TASKS_PER_NODE", "2(x3)", 1);
    CHECK_INT(parse(&r, &err), 0);
    CHECK_INT(r.local_world_size, 2);
    /* Only --ntasks-per-node. */
    env_slurm();
    unsetenv("SLURM_TASKS_PER_NODE");
    setenv("SLURM_NTASKS_PER_NODE", "4", 1);
    CHECK_INT(parse(&r, &err), 0);
    CHECK_INT(r.local_world_size, 4);
    /* Errors name the variable. */
    env_slurm();
    setenv("SLURM_TASKS_PER_NODE", "2(y3)", 1);
    CHECK_INT(parse(&r, &err), MGPU_E_USAGE);
    CHECK_CONTAINS(err.msg, "SLURM_TASKS_PER_NODE=\"2(y3)\"");
    env_slurm();
    setenv("SLURM_TASKS_PER_NODE", "3", 1); /* too short for node 1 */
    CHECK_INT(parse(&r, &err), MGPU_E_USAGE);
    CHECK_CONTAINS(err.msg, "SLURM_NODEID=1");
    env_slurm();
    setenv("SLURM_PROCID", "5", 1);
    CHECK_INT(parse(&r, &err), MGPU_E_RANGE);
    CHECK_CONTAINS(err.msg, "SLURM_PROCID=5 is not below SLURM_NTASKS=5");
    env_slurm();
    setenv("SLURM_LOCALID", "2", 1);
    CHECK_INT(parse(&r, &err), MGPU_E_RANGE);
    CHECK_CONTAINS(err.msg, "SLURM_LOCALID=2");
    env_slurm();
    unsetenv("SLURM_NNODES");
    CHECK_INT(parse(&r, &err), MGPU_E_USAGE);
    CHECK_CONTAINS(err.msg, "SLURM_NNODES is not set");
}

static void test_openmpi(void)
{
    mgpu_rank_info_t r;
    mgpu_err_t err;
    env_clear();
    setenv("OMPI_COMM_WORLD_RANK", "5", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "8", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4", 1);
    setenv("PMIX_NAMESPACE", "prterun-host-1234@1", 1);
    CHECK_INT(parse(&r, &err), 0);
    CHECK_STR(r.source, "openmpi");
    CHECK_STR(r.run_id, "prterun-host-1234@1");
    CHECK_INT(r.rank, 5);
    CHECK_INT(r.world_size, 8);
    CHECK_INT(r.local_rank, 1);
    CHECK_INT(r.local_world_size, 4);
    CHECK_INT(r.node_rank, 1);
    CHECK_INT(r.nnodes, 2);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "4", 1);
    CHECK_INT(parse(&r, &err), MGPU_E_RANGE);
    CHECK_CONTAINS(err.msg,
                   "OMPI_COMM_WORLD_LOCAL_RANK=4 is not below OMPI_COMM_WORLD_LOCAL_SIZE=4");
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
    unsetenv("OMPI_COMM_WORLD_SIZE");
    CHECK_INT(parse(&r, &err), MGPU_E_USAGE);
    CHECK_CONTAINS(err.msg, "OMPI_COMM_WORLD_SIZE is not set");
}

static void test_precedence(void)
{
    mgpu_rank_info_t r;
    mgpu_err_t err;
    /* torchrun inside an srun allocation: the torchrun variables describe the worker. */
    env_slurm();
    setenv("RANK", "1", 1);
    setenv("WORLD_SIZE", "2", 1);
    setenv("LOCAL_RANK", "1", 1);
    setenv("LOCAL_WORLD_SIZE", "2", 1);
    CHECK_INT(parse(&r, &err), 0);
    CHECK_STR(r.source, "env");
    CHECK_INT(r.world_size, 2);
    /* mpirun inside an sbatch script: the batch step's SLURM_PROCID=0 is stale, Open MPI's
     * variables describe the rank. */
    env_slurm();
    setenv("SLURM_PROCID", "0", 1);
    setenv("OMPI_COMM_WORLD_RANK", "3", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4", 1);
    CHECK_INT(parse(&r, &err), 0);
    CHECK_STR(r.source, "openmpi");
    CHECK_INT(r.rank, 3);
}

/* ---- devices: the article's scenarios on 5 simulated GPUs ------------------------------ */

static int pick(const char *cvd, int local_rank, int local_world, int sharing,
                mgpu_device_info_t *d, mgpu_err_t *err)
{
    static mgpu_gpu_list_t inst;
    static mgpu_visible_t vis;
    char described[1024];
    mgpu_device_req_t req = {local_rank, local_rank, local_world, 1, sharing, described};
    CHECK_INT(mgpu_devices_discover(&inst, "5", NULL, err), 0);
    mgpu_devices_visible(&inst, cvd, &vis);
    mgpu_devices_describe(&inst, &vis, described, sizeof described);
    err->msg[0] = '\0';
    return mgpu_device_select(&inst, &vis, &req, d, err);
}

static void test_device_scenarios(void)
{
    mgpu_device_info_t d;
    mgpu_err_t err;
    /* 1 and 2: CUDA_VISIBLE_DEVICES=1,2,3,4, local rank k on physical GPU k+1. */
    for (int k = 0; k < 4; k++) {
        CHECK_INT(pick("1,2,3,4", k, 4, 0, &d, &err), 0);
        CHECK_INT(d.ordinal, k);
        CHECK_INT(d.physical, k + 1);
        CHECK_INT(d.visible_count, 4);
        CHECK_INT(d.simulated, 1);
        CHECK_INT(d.is_gpu, 0); /* simulated: computes on the CPU */
    }
    /* 3: unset, local rank k on physical k. */
    CHECK_INT(pick(NULL, 3, 4, 0, &d, &err), 0);
    CHECK_INT(d.physical, 3);
    CHECK_INT(d.visible_count, 5);
    CHECK_CONTAINS(d.uuid, "GPU-");
    /* 4: five processes, four visible: rank 4 is refused, naming what it saw. */
    CHECK_INT(pick("1,2,3,4", 4, 5, 0, &d, &err), MGPU_E_DEVICE);
    CHECK_CONTAINS(err.msg, "rank 4 (LOCAL_RANK=4) needs visible GPU ordinal 4");
    CHECK_CONTAINS(err.msg, "only 4 GPUs are visible (CUDA_VISIBLE_DEVICES=1,2,3,4)");
    CHECK_CONTAINS(err.msg, "ordinal 3 = GPU 4");
    CHECK_CONTAINS(err.msg, "invalid device ordinal");
    CHECK_CONTAINS(err.msg, "MGPU_ALLOW_GPU_SHARING=1");
    CHECK_CONTAINS(err.msg, "For a CPU-only job, hide the GPUs: CUDA_VISIBLE_DEVICES= (empty)");
    /* ... unless sharing is allowed: ordinal 4 mod 4 = 0 = physical 1. */
    CHECK_INT(pick("1,2,3,4", 4, 5, 1, &d, &err), 0);
    CHECK_INT(d.ordinal, 0);
    CHECK_INT(d.physical, 1);
    /* The driver's rules reach here too: a repeated device is an error. */
    CHECK_INT(pick("0,0", 0, 1, 0, &d, &err), MGPU_E_DEVICE);
    CHECK_CONTAINS(err.msg, "CUDA_VISIBLE_DEVICES=\"0,0\" is invalid");
    /* Nothing visible: the CPU, not an error. */
    CHECK_INT(pick("", 0, 2, 0, &d, &err), 0);
    CHECK_INT(d.ordinal, -1);
    CHECK_INT(d.physical, -1);
    CHECK_INT(d.visible_count, 0);
}

/* The same through mgpu_init, as a worker started by mgpu-launch --nproc_per_node=5 sees it. */
static void test_init_scenario4(void)
{
    mgpu_ctx_t *ctx = NULL;
    mgpu_err_t err = {0, ""};
    env_torchrun("4", "5", "4", "5");
    setenv("MGPU_SIM_GPUS", "5", 1);
    setenv("CUDA_VISIBLE_DEVICES", "1,2,3,4", 1);
    CHECK_INT(mgpu_init(NULL, &ctx, &err), MGPU_E_DEVICE);
    CHECK_CONTAINS(err.msg, "rank 4 (LOCAL_RANK=4) needs visible GPU ordinal 4");
    setenv("MGPU_ALLOW_GPU_SHARING", "1", 1);
    CHECK_INT(mgpu_init(NULL, &ctx, &err), 0);
    if (ctx != NULL) {
        CHECK_INT(mgpu_device(ctx)->ordinal, 0);
        CHECK_INT(mgpu_device(ctx)->physical, 1);
        CHECK_INT(mgpu_rank(ctx)->rank, 4);
        CHECK(mgpu_ctx_store(ctx) == NULL);
        mgpu_finalize(ctx);
    }
    setenv("MGPU_ALLOW_GPU_SHARING", "yes", 1);
    CHECK_INT(mgpu_init(NULL, &ctx, &err), MGPU_E_USAGE);
    CHECK_CONTAINS(err.msg, "MGPU_ALLOW_GPU_SHARING=\"yes\"");
    /* want_gpu = 0: the CPU whatever is visible. */
    unsetenv("MGPU_ALLOW_GPU_SHARING");
    mgpu_init_opts_t o = {0, 0};
    CHECK_INT(mgpu_init(&o, &ctx, &err), 0);
    if (ctx != NULL) {
        CHECK_INT(mgpu_device(ctx)->is_gpu, 0);
        CHECK_INT(mgpu_device(ctx)->ordinal, -1);
        mgpu_finalize(ctx);
    }
    /* A bad rank stops init before anything else. */
    env_torchrun("9", "5", "4", "5");
    CHECK_INT(mgpu_init(NULL, &ctx, &err), MGPU_E_RANGE);
    CHECK_CONTAINS(err.msg, "RANK=9 is not below WORLD_SIZE=5");
}

int main(void)
{
    RUN(test_single_process);
    RUN(test_torchrun);
    RUN(test_mgpu_launch_and_plain_env);
    RUN(test_virtual_local_rank);
    RUN(test_multi_node);
    RUN(test_env_errors);
    RUN(test_slurm);
    RUN(test_openmpi);
    RUN(test_precedence);
    RUN(test_device_scenarios);
    RUN(test_init_scenario4);
    return check_done();
}
