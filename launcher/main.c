/* main.c - mgpu-launch: parse, plan, start, supervise, report. */
#include <errno.h>        /* errno */
#include <fcntl.h>        /* open */
#include <libgen.h>       /* dirname */
#include <stdio.h>        /* printf */
#include <stdlib.h>       /* getenv */
#include <string.h>       /* strcmp */
#include <sys/random.h>   /* getrandom */
#include <sys/resource.h> /* setrlimit */
#include <unistd.h>       /* sysconf */

#include "cli.h"        /* mgpu_cli_parse */
#include "engines.h"    /* mgpu_engines_apply */
#include "log.h"        /* mgpu_log_init */
#include "plan.h"       /* mgpu_plan_build */
#include "rdzv.h"       /* mgpu_rdzv_join */
#include "report.h"     /* mgpu_report_print */
#include "sock.h"       /* mgpu_sock_free_port */
#include "supervisor.h" /* mgpu_sup_run */

static const char *env_lookup(const char *name)
{
    return getenv(name);
}

/* Descriptors 0-2 must exist: a pipe created later must never become a worker's stdout by
 * accident (a launcher started with stdout closed, by cron or a careless wrapper). */
static void ensure_std_fds(void)
{
    for (int fd = 0; fd < 3; fd++)
        if (fcntl(fd, F_GETFD) < 0)
            open("/dev/null", O_RDWR);
}

static void random_run_id(char *buf, size_t len)
{
    unsigned char b[16] = {0};
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b)
        for (size_t i = 0; i < sizeof b; i++)
            b[i] = (unsigned char)(rand() ^ getpid());
    b[6] = (unsigned char)((b[6] & 0x0f) | 0x40);
    b[8] = (unsigned char)((b[8] & 0x3f) | 0x80);
    snprintf(buf, len, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
             b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
}

/* Where the launchers meet, and whether this one serves the store there. */
static void rdzv_options(const mgpu_cli_t *cli, const mgpu_plan_t *plan, const char *host,
                         mgpu_rdzv_opts_t *ro)
{
    memset(ro, 0, sizeof *ro);
    ro->run_id = plan->run_id;
    ro->nnodes_min = cli->nnodes_min;
    ro->nnodes_max = cli->nnodes_max;
    ro->node_rank = cli->node_rank;
    ro->nproc = plan->nproc;
    ro->hostname = cli->local_addr[0] ? cli->local_addr : host;
    ro->token = cli->rdzv_token[0] ? cli->rdzv_token : NULL;
    ro->join_timeout = cli->join_timeout;
    ro->last_call_timeout = cli->last_call_timeout;
    ro->elastic = cli->nnodes_min != cli->nnodes_max || strcmp(cli->rdzv_backend, "c10d") == 0;
    /* Two connections a launcher, one or two a worker, nodes alike in size; and room to spare. */
    ro->max_conns = cli->nnodes_max * (2 * plan->nproc + 4) + 64;
    if (ro->max_conns > 65536)
        ro->max_conns = 65536;
    if (cli->nnodes_max == 1) {
        /* One node: the store is this launcher's own, on loopback at a free port, and
         * MASTER_PORT is --master_port or another free port. */
        ro->elastic = 0;
        ro->node_rank = 0;
        ro->store_host = "127.0.0.1";
        ro->bind_host = "127.0.0.1";
        ro->serve = 1;
        ro->master_addr = plan->master_addr;
        ro->master_port = plan->master_port;
        return;
    }
    if (ro->elastic) {
        const char *eh = cli->endpoint_host[0] ? cli->endpoint_host : cli->master_addr;
        ro->store_host = eh;
        ro->store_port = cli->endpoint_host[0] ? cli->endpoint_port
                                               : (cli->master_port >= 0 ? cli->master_port : 29400);
        /* torchrun's c10d: the launcher on the endpoint's host serves it. Which host that is,
         * binding tells: an address of another host fails with EADDRNOTAVAIL, and one that
         * another launcher here serves already with EADDRINUSE; main then joins as a client. */
        ro->serve = cli->is_host >= 0 ? cli->is_host : 1;
        ro->master_addr = mgpu_sock_is_loopback(eh) ? "127.0.0.1" : ro->hostname;
        ro->bind_host =
            mgpu_sock_is_loopback(eh) ? "127.0.0.1" : (cli->is_host == 1 ? "0.0.0.0" : eh);
        return;
    }
    /* Static: node 0 serves the store at the plan's master address and port (--rdzv_endpoint
     * when it is given, as torchrun's static rendezvous; else --master_addr:--master_port). */
    ro->store_host = plan->master_addr;
    ro->store_port = plan->master_port;
    ro->serve = cli->node_rank == 0;
    ro->master_addr = plan->master_addr;
    ro->bind_host = mgpu_sock_is_loopback(ro->store_host) ? "127.0.0.1" : "0.0.0.0";
}

static void raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

/* Linux grows a process's file table by copying it, and when the process has threads it
 * waits for an RCU grace period first: 20-30 ms measured on the 16-core H200 host, where 8
 * workers (6 pipe ends each) took the table past 64 files after the store's thread had
 * started. Grown here, before any thread, it costs microseconds; it never shrinks. */
static void grow_fd_table(long fds)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        (rlim_t)fds > rl.rlim_cur)
        fds = (long)rl.rlim_cur;
    if (fds <= 64)
        return;
    int fd = fcntl(2, F_DUPFD_CLOEXEC, (int)fds - 1); /* the lowest free one from fds - 1 */
    if (fd >= 0)
        close(fd);
}

int main(int argc, char **argv)
{
    mgpu_cli_t cli_storage; /* ~30 KiB, on the stack: no early return can leak it */
    mgpu_cli_t *cli = &cli_storage;
    mgpu_plan_t plan;
    mgpu_plan_input_t in = {0};
    mgpu_run_result_t res;
    mgpu_rdzv_opts_t ro;
    mgpu_rdzv_world_t world;
    mgpu_rdzv_t *rdzv = NULL;
    int rc;
    mgpu_err_t err = {0};
    char exe[4096], worker_bin[4200], host[256], run_id[64];
    const char *loglevel = getenv("LOGLEVEL");
    int level = loglevel ? mgpu_log_level_parse(loglevel) : -1;
    ssize_t n;

    ensure_std_fds();
    mgpu_log_init("mgpu-launch", level >= 0 ? (mgpu_log_level_t)level : MGPU_LOG_WARN);
    if (mgpu_cli_parse(cli, argc, argv, env_lookup, &err) < 0) {
        mgpu_error("%s", err.msg);
        return 2;
    }
    if (cli->show_help) {
        mgpu_cli_usage(stdout);
        return 0;
    }
    if (!cli->show_version && mgpu_engines_apply(cli, env_lookup, &err) < 0) {
        mgpu_error("%s", err.msg);
        return 2;
    }
    if (cli->show_version) {
        printf("mgpu-launch %s\n", MGPU_VERSION);
        return 0;
    }
    /* torchrun reads the prefix template from its environment too; the option wins. */
    if (!cli->prefix_template[0] && getenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"))
        snprintf(cli->prefix_template, sizeof cli->prefix_template, "%s",
                 getenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"));
    if (cli->quiet)
        mgpu_log_init("mgpu-launch", MGPU_LOG_ERROR);
    else if (cli->verbose)
        mgpu_log_init("mgpu-launch", MGPU_LOG_INFO);
    if (cli->nnodes_max > 1 && cli->endpoint_host[0] && cli->master_given && !cli->standalone)
        mgpu_warn("--master_addr and --master_port are only used without --rdzv_endpoint: the "
                  "nodes meet at %s, as with torchrun",
                  cli->rdzv_endpoint);

    /* Facts of this machine the plan needs. */
    n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = '\0';
    snprintf(worker_bin, sizeof worker_bin, "%s/mgpu-worker", n > 0 ? dirname(exe) : ".");
    if (gethostname(host, sizeof host) != 0)
        snprintf(host, sizeof host, "localhost");
    random_run_id(run_id, sizeof run_id);
    in.cvd = getenv("CUDA_VISIBLE_DEVICES");
    in.sim_gpus = getenv("MGPU_SIM_GPUS");
    in.cpu_count = (int)sysconf(_SC_NPROCESSORS_ONLN);
    in.free_port = (cli->master_port < 0 || cli->standalone) && cli->nnodes_max == 1
                       ? mgpu_sock_free_port()
                       : -1;
    in.worker_bin = worker_bin;
    in.python = getenv("PYTHON_EXEC") && *getenv("PYTHON_EXEC") ? getenv("PYTHON_EXEC") : "python3";
    in.omp_threads = getenv("OMP_NUM_THREADS");
    in.nccl_async = getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING");
    in.hostname = host;
    in.run_id = run_id;
    in.path_env = getenv("PATH");

    if (mgpu_plan_build(&plan, cli, &in, &err) < 0) {
        mgpu_error("%s", err.msg);
        mgpu_plan_free(&plan);
        return 2;
    }
    if (cli->dry_run != MGPU_DRY_NONE) {
        if (cli->dry_run == MGPU_DRY_JSON)
            mgpu_plan_print_json(&plan, stdout);
        else
            mgpu_plan_print(&plan, stdout);
        mgpu_plan_free(&plan);
        return 0;
    }
    if (plan.omp_warning && !cli->quiet)
        fprintf(stderr,
                "*****************************************\n"
                "Setting OMP_NUM_THREADS environment variable for each process to be 1 in "
                "default, to avoid your system being overloaded, please further tune the variable "
                "for optimal performance in your application as needed.\n"
                "*****************************************\n");
    if (cli->derived[0])
        mgpu_info("from the environment: %s", cli->derived);
    if (plan.cpu_reason[0] && plan.gpus.count > 0)
        mgpu_warn("workers run on the CPU: %s", plan.cpu_reason);
    raise_fd_limit();
    /* The workers' pipes, the store's connections (as rdzv_options counts them), slack. */
    grow_fd_table(128 + 8L * plan.nproc + (long)cli->nnodes_max * (2 * plan.nproc + 4) + 64);

    /* Meet the other launchers (or, on one node, just start the store for the workers). */
    mgpu_debug("planned %d workers; rendezvous", plan.nproc);
    rdzv_options(cli, &plan, host, &ro);
    rc = mgpu_rdzv_join(&ro, &rdzv, &world, &err);
    if (rc < 0 && ro.serve && ro.elastic && cli->is_host < 0 &&
        (err.code == -EADDRINUSE || err.code == -EADDRNOTAVAIL)) {
        /* The endpoint is another host's, or another launcher here serves it: join it. */
        ro.serve = 0;
        rc = mgpu_rdzv_join(&ro, &rdzv, &world, &err);
    }
    if (rc < 0) {
        mgpu_error("%s", err.msg);
        mgpu_plan_free(&plan);
        return rc == MGPU_E_USAGE ? 2 : 1;
    }
    mgpu_debug("rendezvous done");
    mgpu_plan_set_world(&plan, &world);
    if (cli->nnodes_max > 1)
        mgpu_info("node %d of %d: global ranks %d..%d of %d; MASTER_ADDR=%s MASTER_PORT=%d",
                  world.node_rank, world.nnodes, world.base_rank, world.base_rank + plan.nproc - 1,
                  world.world_size, world.master_addr, world.master_port);
    fflush(stdout);
    fflush(stderr);

    rc = mgpu_sup_run(&plan, cli, rdzv, &res, &err);
    mgpu_rdzv_close(rdzv);
    if (rc < 0) {
        mgpu_error("%s", err.msg);
        mgpu_run_result_free(&res);
        mgpu_plan_free(&plan);
        return rc == MGPU_E_USAGE ? 2 : 1;
    }
    mgpu_debug("run over");
    mgpu_report_print(&plan, &res, stderr);
    if (!cli->quiet)
        mgpu_report_timeline(&plan, &res, stderr);
    if (res.keep_logs && !cli->log_dir[0])
        mgpu_warn("worker logs are in %s", res.log_root);
    if (cli->summary[0] && mgpu_report_write_summary(&plan, &res, cli->summary, &err) < 0)
        mgpu_error("%s", err.msg);
    n = res.exit_code;
    mgpu_run_result_free(&res);
    mgpu_plan_free(&plan);
    return (int)n;
}
