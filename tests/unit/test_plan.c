/* test_plan.c - ranks, devices (the article's four scenarios), environment and commands. */
#include <stdlib.h>   /* calloc */
#include <sys/stat.h> /* chmod */

#include "check.h"
#include "plan.h"
#include "plan_build.h" /* build */

static mgpu_plan_input_t input(const char *sim, const char *cvd)
{
    mgpu_plan_input_t in = {0};
    in.sim_gpus = sim;
    in.cvd = cvd;
    in.cpu_count = 6;
    in.free_port = 41234;
    in.worker_bin = "/bin/true"; /* stands in for mgpu-worker */
    in.python = "sh";
    in.hostname = "node-a";
    in.run_id = "rand-id";
    in.path_env = "/usr/bin:/bin";
    return in;
}

static void test_scenario1(void)
{
    mgpu_plan_t p;
    mgpu_err_t e;
    mgpu_plan_input_t in = input("8", "1,2,3,4");
    CHECK_INT(build(&p, &e, &in, "--nproc_per_node=2", "/bin/true", NULL), 0);
    CHECK_INT(p.nproc, 2);
    CHECK_INT(p.vis.count, 4); /* each rank sees 4 GPUs */
    CHECK_INT(p.workers[0].ordinal, 0);
    CHECK_INT(p.workers[0].physical, 1);
    CHECK_INT(p.workers[1].physical, 2);
    CHECK_STR(mgpu_plan_var(&p, 1, "MGPU_PHYSICAL_GPU"), "2");
    CHECK_STR(mgpu_plan_var(&p, 1, "MGPU_GPU_ORDINAL"), "1");
    CHECK_STR(mgpu_plan_var(&p, 1, "MGPU_GPU_SIMULATED"), "1");
    mgpu_plan_free(&p);
}

static void test_scenario2_and_3(void)
{
    mgpu_plan_t p;
    mgpu_err_t e;
    mgpu_plan_input_t in = input("8", "1,2,3,4");
    CHECK_INT(build(&p, &e, &in, "--nproc_per_node=4", "/bin/true", NULL), 0);
    for (int k = 0; k < 4; k++) {
        CHECK_INT(p.workers[k].ordinal, k);
        CHECK_INT(p.workers[k].physical, k + 1); /* local_rank is a process number */
    }
    mgpu_plan_free(&p);
    in = input("8", NULL);
    CHECK_INT(build(&p, &e, &in, "--nproc_per_node=4", "/bin/true", NULL), 0);
    for (int k = 0; k < 4; k++)
        CHECK_INT(p.workers[k].physical, k);
    mgpu_plan_free(&p);
}

static void test_scenario4_refused(void)
{
    mgpu_plan_t p;
    mgpu_err_t e;
    mgpu_plan_input_t in = input("8", "1,2,3,4");
    CHECK_INT(build(&p, &e, &in, "--nproc_per_node=5", "/bin/true", NULL), MGPU_E_USAGE);
    CHECK_CONTAINS(e.msg, "--nproc_per_node=5 but only 4 simulated GPUs are visible");
    CHECK_CONTAINS(e.msg, "CUDA_VISIBLE_DEVICES='1,2,3,4'");
    CHECK_CONTAINS(e.msg, "ordinal 3 = GPU 4");
    CHECK_CONTAINS(e.msg, "8 simulated GPUs installed");
    CHECK_CONTAINS(e.msg, "local rank 4 would fail in cudaSetDevice(4)");
    CHECK_CONTAINS(e.msg, "--allow_gpu_sharing");
    CHECK_CONTAINS(e.msg, "For a CPU-only job, hide the GPUs: CUDA_VISIBLE_DEVICES= mgpu-launch");
    mgpu_plan_free(&p);
    CHECK_INT(build(&p, &e, &in, "--nproc_per_node=5", "--allow_gpu_sharing", "/bin/true", NULL),
              0);
    CHECK_INT(p.sharing, 1);
    CHECK_INT(p.workers[4].ordinal, 0);
    CHECK_INT(p.workers[4].physical, 1);
    CHECK_STR(mgpu_plan_var(&p, 4, "MGPU_ALLOW_GPU_SHARING"), "1");
    mgpu_plan_free(&p);
}

static void test_cpu_workers(void)
{
    mgpu_plan_t p;
    mgpu_err_t e;
    mgpu_plan_input_t in = input("0", NULL);
    CHECK_INT(build(&p, &e, &in, "--nproc_per_node=3", "/bin/true", NULL), 0);
    CHECK_INT(p.workers[2].ordinal, -1);
    CHECK_STR(mgpu_plan_var(&p, 2, "MGPU_DEVICE"), "cpu");
    CHECK_CONTAINS(p.cpu_reason, "no GPU is installed");
    mgpu_plan_free(&p);
    in = input("2", "5");
    CHECK_INT(build(&p, &e, &in, "--nproc_per_node=3", "/bin/true", NULL), 0);
    CHECK_CONTAINS(p.cpu_reason, "makes none of the 2 simulated GPUs visible");
    mgpu_plan_free(&p);
    /* nproc gpu|cpu|auto */
    in = input("0", NULL);
    CHECK_INT(build(&p, &e, &in, "--nproc_per_node=gpu", "/bin/true", NULL), MGPU_E_USAGE);
    CHECK_CONTAINS(e.msg, "no GPU is visible");
    mgpu_plan_free(&p);
    CHECK_INT(build(&p, &e, &in, "--nproc_per_node=auto", "/bin/true", NULL), 0);
    CHECK_INT(p.nproc, 6);
    mgpu_plan_free(&p);
    in = input("3", NULL);
    CHECK_INT(build(&p, &e, &in, "--nproc_per_node=auto", "/bin/true", NULL), 0);
    CHECK_INT(p.nproc, 3);
    mgpu_plan_free(&p);
    CHECK_INT(build(&p, &e, &in, "--nproc_per_node=cpu", "--allow_gpu_sharing", "/bin/true", NULL),
              0);
    CHECK_INT(p.nproc, 6);
    mgpu_plan_free(&p);
    in = input("2", "0,0");
    CHECK_INT(build(&p, &e, &in, "/bin/true", NULL), MGPU_E_USAGE);
    CHECK_CONTAINS(e.msg, "appears twice");
    mgpu_plan_free(&p);
}

static void test_env_contract(void)
{
    mgpu_plan_t p;
    mgpu_err_t e;
    mgpu_plan_input_t in = input("0", NULL);
    char *environ_[] = {"HOME=/root", "RANK=99", "OMP_NUM_THREADS=7",
                        "TORCHELASTIC_RESTART_COUNT=5", NULL};
    char **env;
    int seen_home = 0, seen_rank = 0;

    CHECK_INT(build(&p, &e, &in, "--nnodes=2", "--node_rank=1", "--nproc_per_node=3",
                    "--role=trainer", "--rdzv_id=job7", "--master_addr=10.0.0.1",
                    "--max_restarts=3", "/bin/true", NULL),
              0);
    CHECK_INT(p.world_size, 6);
    CHECK_STR(mgpu_plan_var(&p, 2, "RANK"), "5");
    CHECK_STR(mgpu_plan_var(&p, 2, "LOCAL_RANK"), "2");
    CHECK_STR(mgpu_plan_var(&p, 2, "GROUP_RANK"), "1");
    CHECK_STR(mgpu_plan_var(&p, 2, "ROLE_RANK"), "5");
    CHECK_STR(mgpu_plan_var(&p, 2, "ROLE_NAME"), "trainer");
    CHECK_STR(mgpu_plan_var(&p, 2, "LOCAL_WORLD_SIZE"), "3");
    CHECK_STR(mgpu_plan_var(&p, 2, "WORLD_SIZE"), "6");
    CHECK_STR(mgpu_plan_var(&p, 2, "GROUP_WORLD_SIZE"), "2");
    CHECK_STR(mgpu_plan_var(&p, 2, "ROLE_WORLD_SIZE"), "6");
    CHECK_STR(mgpu_plan_var(&p, 2, "MASTER_ADDR"), "10.0.0.1");
    CHECK_STR(mgpu_plan_var(&p, 2, "MASTER_PORT"),
              "29501"); /* several nodes: the store on 29500, + 1 */
    CHECK_STR(mgpu_plan_var(&p, 2, "TORCHELASTIC_RUN_ID"), "job7");
    CHECK_STR(mgpu_plan_var(&p, 2, "TORCHELASTIC_MAX_RESTARTS"), "3");
    CHECK_STR(mgpu_plan_var(&p, 2, "TORCHELASTIC_USE_AGENT_STORE"), "False");
    CHECK_STR(mgpu_plan_var(&p, 2, "TORCH_NCCL_ASYNC_ERROR_HANDLING"), "1");
    CHECK_STR(mgpu_plan_var(&p, 2, "OMP_NUM_THREADS"), "1");
    CHECK_INT(p.omp_warning, 1);

    env = mgpu_plan_env(&p, 2, environ_, 6, 4, "/tmp/x/error.json");
    for (char **v = env; *v; v++) {
        seen_home += strcmp(*v, "HOME=/root") == 0;
        seen_rank += strncmp(*v, "RANK=", 5) == 0;
        CHECK(strcmp(*v, "RANK=99") != 0);
        CHECK(strcmp(*v, "TORCHELASTIC_RESTART_COUNT=5") != 0);
    }
    CHECK_INT(seen_home, 1);
    CHECK_INT(seen_rank, 1);
    int found_restart = 0, found_err = 0, found_attempt = 0;
    for (char **v = env; *v; v++) {
        found_restart += strcmp(*v, "TORCHELASTIC_RESTART_COUNT=4") == 0;
        found_attempt += strcmp(*v, "MGPU_ATTEMPT=6") == 0;
        found_err += strcmp(*v, "TORCHELASTIC_ERROR_FILE=/tmp/x/error.json") == 0;
    }
    CHECK_INT(found_restart, 1);
    CHECK_INT(found_attempt, 1);
    CHECK_INT(found_err, 1);
    free(env);
    mgpu_plan_free(&p);

    /* one node, no port: the free port; an inherited OMP_NUM_THREADS is kept, no banner */
    in.omp_threads = "7";
    CHECK_INT(build(&p, &e, &in, "--nproc_per_node=2", "/bin/true", NULL), 0);
    CHECK_STR(mgpu_plan_var(&p, 0, "MASTER_PORT"), "41234");
    CHECK_STR(mgpu_plan_var(&p, 0, "OMP_NUM_THREADS"), "7");
    CHECK_INT(p.omp_warning, 0);
    mgpu_plan_free(&p);
    CHECK_INT(build(&p, &e, &in, "--master_port=1234", "/bin/true", NULL), 0);
    CHECK_STR(mgpu_plan_var(&p, 0, "MASTER_PORT"), "1234");
    CHECK(mgpu_plan_var(&p, 0, "OMP_NUM_THREADS") != NULL);
    mgpu_plan_free(&p);
    /* one node with a static --rdzv_endpoint: torchrun's master is there */
    CHECK_INT(build(&p, &e, &in, "--rdzv_endpoint=127.0.0.2:29655", "/bin/true", NULL), 0);
    CHECK_STR(mgpu_plan_var(&p, 0, "MASTER_ADDR"), "127.0.0.2");
    CHECK_STR(mgpu_plan_var(&p, 0, "MASTER_PORT"), "29655");
    mgpu_plan_free(&p);
    CHECK_INT(
        build(&p, &e, &in, "--standalone", "--rdzv_endpoint=127.0.0.2:29655", "/bin/true", NULL),
        0);
    CHECK_STR(mgpu_plan_var(&p, 0, "MASTER_PORT"), "41234"); /* standalone: its own port */
    mgpu_plan_free(&p);
    in.omp_threads = NULL;
    CHECK_INT(build(&p, &e, &in, "--standalone", "/bin/true", NULL), 0);
    CHECK_STR(mgpu_plan_var(&p, 0, "TORCHELASTIC_RUN_ID"), "rand-id");
    CHECK(mgpu_plan_var(&p, 0, "OMP_NUM_THREADS") == NULL); /* one worker: torchrun sets none */
    mgpu_plan_free(&p);
}

static void test_commands(void)
{
    mgpu_plan_t p;
    mgpu_err_t e;
    mgpu_plan_input_t in = input("0", NULL);
    FILE *f = fopen("/tmp/mgpu_test_plan.py", "w");
    fclose(f);
    f = fopen("/tmp/mgpu_test_plan.cfg", "w");
    fclose(f);

    CHECK_INT(build(&p, &e, &in, "--nproc_per_node=2", "/tmp/mgpu_test_plan.py", "--lr", "1", NULL),
              0);
    CHECK_STR(p.workers[1].argv[0], "sh");
    CHECK_STR(p.workers[1].argv[1], "-u");
    CHECK_STR(p.workers[1].argv[2], "/tmp/mgpu_test_plan.py");
    CHECK_STR(p.workers[1].argv[3], "--lr");
    CHECK(p.workers[1].argv[5] == NULL);
    mgpu_plan_free(&p);
    CHECK_INT(build(&p, &e, &in, "--nproc_per_node=2", "--legacy_local_rank",
                    "/tmp/mgpu_test_plan.py", "--lr", NULL),
              0);
    CHECK_STR(p.workers[1].argv[3], "--local_rank=1");
    CHECK_STR(p.workers[1].argv[4], "--lr");
    mgpu_plan_free(&p);
    /* torch 2.x's launch spells it with a dash */
    CHECK_INT(build(&p, &e, &in, "--nproc_per_node=2", "--legacy_local_rank=dash",
                    "/tmp/mgpu_test_plan.py", "--lr", NULL),
              0);
    CHECK_STR(p.workers[1].argv[3], "--local-rank=1");
    mgpu_plan_free(&p);
    CHECK_INT(build(&p, &e, &in, "-m", "pkg.mod", "a", NULL), 0);
    CHECK_STR(p.workers[0].argv[2], "-m");
    CHECK_STR(p.workers[0].argv[3], "pkg.mod");
    mgpu_plan_free(&p);
    CHECK_INT(build(&p, &e, &in, "/tmp/mgpu_test_plan.cfg", NULL), 0);
    CHECK_STR(p.workers[0].argv[0], "/bin/true");
    CHECK_STR(p.workers[0].argv[1], "/tmp/mgpu_test_plan.cfg");
    mgpu_plan_free(&p);
    CHECK_INT(build(&p, &e, &in, "--no_python", "/bin/echo", "x.py", NULL), 0);
    CHECK_STR(p.workers[0].argv[0], "/bin/echo");
    mgpu_plan_free(&p);
    CHECK_INT(build(&p, &e, &in, "/tmp/missing_mgpu.py", NULL), MGPU_E_USAGE);
    CHECK_CONTAINS(e.msg, "python script '/tmp/missing_mgpu.py': No such file or directory");
    mgpu_plan_free(&p);
    CHECK_INT(build(&p, &e, &in, "/tmp/missing_mgpu.cfg", NULL), MGPU_E_USAGE);
    CHECK_CONTAINS(e.msg, "training config");
    mgpu_plan_free(&p);
    CHECK_INT(build(&p, &e, &in, "no-such-program-mgpu", NULL), MGPU_E_USAGE);
    CHECK_CONTAINS(e.msg, "worker program 'no-such-program-mgpu': not found in PATH");
    mgpu_plan_free(&p);
    in.python = "no-such-python";
    CHECK_INT(build(&p, &e, &in, "/tmp/mgpu_test_plan.py", NULL), MGPU_E_USAGE);
    CHECK_CONTAINS(e.msg, "python interpreter 'no-such-python'");
    mgpu_plan_free(&p);
    in.python = "sh";
    in.worker_bin = "/nonexistent/mgpu-worker";
    CHECK_INT(build(&p, &e, &in, "/tmp/mgpu_test_plan.cfg", NULL), MGPU_E_USAGE);
    CHECK_CONTAINS(e.msg, "needs mgpu-worker");
    mgpu_plan_free(&p);
    unlink("/tmp/mgpu_test_plan.py");
    unlink("/tmp/mgpu_test_plan.cfg");
}

/* Where the launchers meet, as the plan decides it from the command line. */
static void test_rdzv_options(void)
{
    mgpu_plan_t p;
    mgpu_err_t e;
    mgpu_rdzv_opts_t ro;
    mgpu_plan_input_t in = input("2", NULL);

    /* One node: its own store on loopback, served here, at a free port. */
    CHECK_INT(build(&p, &e, &in, "--nproc_per_node=2", "/bin/true", NULL), 0);
    mgpu_plan_rdzv_opts(&p, &ro);
    CHECK_INT(ro.serve, 1);
    CHECK_INT(ro.elastic, 0);
    CHECK_STR(ro.store_host, "127.0.0.1");
    CHECK_STR(ro.bind_host, "127.0.0.1");
    CHECK_INT(ro.store_port, 0);
    CHECK_INT(ro.master_port, 41234);
    CHECK_STR(ro.hostname, "node-a");
    CHECK(ro.token == NULL);
    CHECK_INT(ro.max_conns, 2 * 2 + 4 + 64);
    mgpu_plan_free(&p);

    /* Static, two nodes: node 1 joins node 0's store at the master address and port. */
    CHECK_INT(build(&p, &e, &in, "--nnodes=2", "--node_rank=1", "--master_addr=10.0.0.5",
                    "--master_port=29511", "--rdzv_token=tok", "--local_addr=10.0.0.6", "/bin/true",
                    NULL),
              0);
    mgpu_plan_rdzv_opts(&p, &ro);
    CHECK_INT(ro.serve, 0);
    CHECK_INT(ro.elastic, 0);
    CHECK_STR(ro.store_host, "10.0.0.5");
    CHECK_INT(ro.store_port, 29511);
    CHECK_STR(ro.bind_host, "0.0.0.0");
    CHECK_STR(ro.hostname, "10.0.0.6");
    CHECK_STR(ro.token, "tok");
    CHECK_INT(ro.nnodes_min, 2);
    CHECK_INT(ro.nnodes_max, 2);
    mgpu_plan_free(&p);

    /* Elastic: the endpoint's host serves; with no is_host, this launcher tries. */
    CHECK_INT(build(&p, &e, &in, "--nnodes=1:3", "--rdzv_backend=c10d",
                    "--rdzv_endpoint=127.0.0.1:29477", "--rdzv_token=tok", "/bin/true", NULL),
              0);
    mgpu_plan_rdzv_opts(&p, &ro);
    CHECK_INT(ro.elastic, 1);
    CHECK_INT(ro.serve, 1);
    CHECK_STR(ro.store_host, "127.0.0.1");
    CHECK_INT(ro.store_port, 29477);
    CHECK_STR(ro.bind_host, "127.0.0.1");
    CHECK_STR(ro.master_addr, "127.0.0.1");
    CHECK_INT(p.rdzv.is_host, -1);
    mgpu_plan_free(&p);
}

/* Everything the later phases read comes from the plan: output options, grace period,
 * restarts, summary. */
static void test_plan_carries_run_options(void)
{
    mgpu_plan_t p;
    mgpu_err_t e;
    mgpu_plan_input_t in = input("2", NULL);

    CHECK_INT(build(&p, &e, &in, "--nproc_per_node=2", "--max_restarts=3", "--grace_period=7",
                    "--summary=/tmp/s.json", "--log_dir=/tmp/logs", "--tee=2",
                    "--local_ranks_filter=1", "--quiet", "/bin/true", NULL),
              0);
    CHECK_INT(p.max_restarts, 3);
    CHECK(p.grace_period == 7.0);
    CHECK_STR(p.output.summary, "/tmp/s.json");
    CHECK_STR(p.output.log_dir, "/tmp/logs");
    CHECK_INT(mgpu_std_spec_get(&p.output.tee, 0), 2);
    CHECK_INT(p.output.nfilter, 1);
    CHECK_INT(p.output.filter[0], 1);
    CHECK_INT(p.output.quiet, 1);
    CHECK_INT(p.dry_run, MGPU_DRY_NONE);
    mgpu_plan_free(&p);
}

/* torchrun runs any script under Python unless --no_python: a file that is not executable
 * and not a .cfg is run by the interpreter; an executable is run as it is. */
static void test_python_without_py(void)
{
    mgpu_plan_t p;
    mgpu_err_t e;
    mgpu_plan_input_t in = input("0", NULL);
    FILE *f = fopen("/tmp/mgpu_test_train", "w");
    fputs("print(1)\n", f);
    fclose(f);
    chmod("/tmp/mgpu_test_train", 0644);

    CHECK_INT(build(&p, &e, &in, "/tmp/mgpu_test_train", "--lr", NULL), 0);
    CHECK_STR(p.workers[0].argv[0], "sh");
    CHECK_STR(p.workers[0].argv[1], "-u");
    CHECK_STR(p.workers[0].argv[2], "/tmp/mgpu_test_train");
    CHECK_STR(p.workers[0].argv[3], "--lr");
    mgpu_plan_free(&p);
    CHECK_INT(build(&p, &e, &in, "--no_python", "/tmp/mgpu_test_train", NULL), 0);
    CHECK_STR(p.workers[0].argv[0], "/tmp/mgpu_test_train");
    mgpu_plan_free(&p);
    chmod("/tmp/mgpu_test_train", 0755);
    CHECK_INT(build(&p, &e, &in, "/tmp/mgpu_test_train", NULL), 0);
    CHECK_STR(p.workers[0].argv[0], "/tmp/mgpu_test_train");
    mgpu_plan_free(&p);
    /* a script for another interpreter is no Python: exec says why it cannot run it (126) */
    f = fopen("/tmp/mgpu_test_train", "w");
    fputs("#!/bin/sh\necho hi\n", f);
    fclose(f);
    chmod("/tmp/mgpu_test_train", 0644);
    CHECK_INT(build(&p, &e, &in, "/tmp/mgpu_test_train", NULL), 0);
    CHECK_STR(p.workers[0].argv[0], "/tmp/mgpu_test_train");
    mgpu_plan_free(&p);
    f = fopen("/tmp/mgpu_test_train", "w");
    fputs("#!/usr/bin/env python3\nprint(1)\n", f);
    fclose(f);
    CHECK_INT(build(&p, &e, &in, "/tmp/mgpu_test_train", NULL), 0);
    CHECK_STR(p.workers[0].argv[0], "sh");
    mgpu_plan_free(&p);
    unlink("/tmp/mgpu_test_train");
}

/* Several nodes: the store on P, MASTER_PORT = P + 1, in the plan and in what the rendezvous
 * is told. */
static void test_port_rule(void)
{
    mgpu_plan_t p;
    mgpu_err_t e;
    mgpu_rdzv_opts_t ro;
    mgpu_plan_input_t in = input("2", NULL);

    CHECK_INT(
        build(&p, &e, &in, "--nnodes=2", "--node_rank=1", "--master_port=29511", "/bin/true", NULL),
        0);
    CHECK_INT(p.rdzv_port, 29511);
    CHECK_INT(p.master_port, 29512);
    CHECK_STR(mgpu_plan_var(&p, 0, "MASTER_PORT"), "29512");
    mgpu_plan_rdzv_opts(&p, &ro);
    CHECK_INT(ro.store_port, 29511);
    CHECK_INT(ro.master_port, 29512);
    mgpu_plan_free(&p);
    CHECK_INT(build(&p, &e, &in, "--nnodes=2", "/bin/true", NULL), 0);
    CHECK_INT(p.master_port, 29501); /* the default 29500, + 1 */
    mgpu_plan_free(&p);
    CHECK_INT(
        build(&p, &e, &in, "--nnodes=1:2", "--rdzv_endpoint=10.0.0.1:29477", "/bin/true", NULL), 0);
    mgpu_plan_rdzv_opts(&p, &ro);
    CHECK_INT(ro.store_port, 29477);
    CHECK_INT(ro.master_port, 29478);
    mgpu_plan_free(&p);
    CHECK_INT(build(&p, &e, &in, "--nnodes=2", "--master_port=65535", "/bin/true", NULL),
              MGPU_E_USAGE);
    CHECK_CONTAINS(e.msg, "--master_port port 65535");
    mgpu_plan_free(&p);
    /* one node keeps --master_port as MASTER_PORT: the store is on loopback elsewhere */
    CHECK_INT(build(&p, &e, &in, "--master_port=29511", "/bin/true", NULL), 0);
    CHECK_STR(mgpu_plan_var(&p, 0, "MASTER_PORT"), "29511");
    mgpu_plan_free(&p);
}

/* --rdzv_conf timeout: the static rendezvous's limit (join_timeout, when given, wins). */
static void test_rdzv_timeout(void)
{
    mgpu_plan_t p;
    mgpu_err_t e;
    mgpu_rdzv_opts_t ro;
    mgpu_plan_input_t in = input("2", NULL);

    CHECK_INT(build(&p, &e, &in, "--nnodes=2", "--rdzv_conf=timeout=45", "/bin/true", NULL), 0);
    mgpu_plan_rdzv_opts(&p, &ro);
    CHECK(ro.join_timeout == 45.0);
    mgpu_plan_free(&p);
    CHECK_INT(build(&p, &e, &in, "--nnodes=2", "--rdzv_conf=timeout=45,join_timeout=20",
                    "/bin/true", NULL),
              0);
    mgpu_plan_rdzv_opts(&p, &ro);
    CHECK(ro.join_timeout == 20.0);
    mgpu_plan_free(&p);
    CHECK_INT(build(&p, &e, &in, "--nnodes=1:2", "--rdzv_conf=timeout=45", "/bin/true", NULL), 0);
    mgpu_plan_rdzv_opts(&p, &ro);
    CHECK(ro.join_timeout == 600.0);
    mgpu_plan_free(&p);
}

/* One role until the rendezvous: ROLE_RANK = RANK; the world's role counts replace it. */
static void test_roles(void)
{
    mgpu_plan_t p;
    mgpu_err_t e;
    mgpu_rdzv_opts_t ro;
    mgpu_rdzv_world_t w = {0};
    mgpu_plan_input_t in = input("0", NULL);

    CHECK_INT(build(&p, &e, &in, "--nnodes=3", "--node_rank=2", "--nproc_per_node=2",
                    "--role=trainer", "/bin/true", NULL),
              0);
    CHECK_STR(mgpu_plan_var(&p, 1, "ROLE_RANK"), "5");
    CHECK_STR(mgpu_plan_var(&p, 1, "ROLE_WORLD_SIZE"), "6");
    mgpu_plan_rdzv_opts(&p, &ro);
    CHECK_STR(ro.role, "trainer");
    w.nnodes = 3, w.node_rank = 2, w.base_rank = 3, w.world_size = 5;
    w.role_base_rank = 2, w.role_world_size = 4;
    mgpu_plan_set_world(&p, &w);
    CHECK_STR(mgpu_plan_var(&p, 1, "RANK"), "4");
    CHECK_STR(mgpu_plan_var(&p, 1, "ROLE_RANK"), "3");
    CHECK_STR(mgpu_plan_var(&p, 1, "ROLE_WORLD_SIZE"), "4");
    CHECK_STR(mgpu_plan_var(&p, 1, "ROLE_NAME"), "trainer");
    mgpu_plan_free(&p);
}

/* Values as long as their options allow, set again by the rendezvous: every one comes back
 * whole (a worker's variables grow their buffer in place), and a key never matches the start of
 * a longer one, in the plan or in the inherited environment. */
static void test_long_values_rebuilt(void)
{
    mgpu_plan_t p;
    mgpu_err_t e;
    mgpu_rdzv_world_t w = {0};
    mgpu_plan_input_t in = input("0", NULL);
    char role[64], rid[128], addr[256], opt_role[80], opt_rid[150], opt_addr[280];
    char *environ_[] = {"RANK_OF_JOB=7", "MASTER=m", "LOCAL_RANK=9", "ROLE=r", NULL}, **env;
    int kept = 0;

    memset(role, 'r', sizeof role - 1), role[sizeof role - 1] = '\0';
    memset(rid, 'i', sizeof rid - 1), rid[sizeof rid - 1] = '\0';
    memset(addr, 'a', sizeof addr - 1), addr[sizeof addr - 1] = '\0';
    snprintf(opt_role, sizeof opt_role, "--role=%s", role);
    snprintf(opt_rid, sizeof opt_rid, "--rdzv_id=%s", rid);
    snprintf(opt_addr, sizeof opt_addr, "--master_addr=%s", addr);
    CHECK_INT(build(&p, &e, &in, "--nnodes=2", "--node_rank=1", "--nproc_per_node=2", opt_role,
                    opt_rid, opt_addr, "/bin/true", NULL),
              0);
    CHECK_STR(mgpu_plan_var(&p, 1, "ROLE_NAME"), role);
    CHECK_STR(mgpu_plan_var(&p, 1, "TORCHELASTIC_RUN_ID"), rid);
    CHECK_STR(mgpu_plan_var(&p, 1, "MASTER_ADDR"), addr);
    w.nnodes = 2, w.node_rank = 1, w.base_rank = 2, w.world_size = 4;
    w.role_base_rank = 2, w.role_world_size = 4, w.master_port = 29501, w.store_port = 29500;
    memset(w.master_addr, 'm', sizeof w.master_addr - 1);
    memset(w.store_addr, 's', sizeof w.store_addr - 1);
    memset(w.token, 't', sizeof w.token - 1);
    mgpu_plan_set_world(&p, &w);
    CHECK_STR(mgpu_plan_var(&p, 1, "MASTER_ADDR"), w.master_addr);
    CHECK_STR(mgpu_plan_var(&p, 1, "MGPU_STORE_ADDR"), w.store_addr);
    CHECK_STR(mgpu_plan_var(&p, 1, "MGPU_STORE_TOKEN"), w.token);
    CHECK_STR(mgpu_plan_var(&p, 1, "ROLE_NAME"), role);
    CHECK_STR(mgpu_plan_var(&p, 1, "RANK"), "3");
    CHECK_STR(mgpu_plan_var(&p, 1, "LOCAL_RANK"), "1");
    CHECK(mgpu_plan_var(&p, 1, "MASTER") == NULL);
    CHECK(mgpu_plan_var(&p, 1, "RANK_OF_JOB") == NULL);
    env = mgpu_plan_env(&p, 1, environ_, 0, 0, "/tmp/x/error.json");
    CHECK(env != NULL);
    for (char **v = env; env != NULL && *v; v++) {
        kept += strcmp(*v, "RANK_OF_JOB=7") == 0 || strcmp(*v, "MASTER=m") == 0 ||
                strcmp(*v, "ROLE=r") == 0;
        CHECK(strcmp(*v, "LOCAL_RANK=9") != 0);
    }
    CHECK_INT(kept, 3);
    free(env);
    mgpu_plan_free(&p);
}

int main(void)
{
    RUN(test_scenario1);
    RUN(test_rdzv_options);
    RUN(test_plan_carries_run_options);
    RUN(test_scenario2_and_3);
    RUN(test_scenario4_refused);
    RUN(test_cpu_workers);
    RUN(test_env_contract);
    RUN(test_commands);
    RUN(test_python_without_py);
    RUN(test_port_rule);
    RUN(test_rdzv_timeout);
    RUN(test_roles);
    RUN(test_long_values_rebuilt);
    return check_done();
}
