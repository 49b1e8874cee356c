/* main.c - mgpu-launch: parse -> plan -> rendezvous -> spawn and supervise -> report. */
#include <errno.h>      /* errno */
#include <fcntl.h>      /* open */
#include <sched.h>      /* sched_getaffinity */
#include <stdio.h>      /* printf */
#include <stdlib.h>     /* getenv */
#include <string.h>     /* strcmp */
#include <sys/random.h> /* getrandom */
#include <unistd.h>     /* sysconf */

#include "cgroup.h"        /* mgpu_cgroup_create */
#include "cli.h"           /* mgpu_cli_parse */
#include "engines.h"       /* mgpu_engines_apply */
#include "fdio.h"          /* mgpu_fdio_raise_limit */
#include "path.h"          /* mgpu_path_dirname */
#include "log.h"           /* mgpu_log_init */
#include "pages.h"         /* mgpu_pages_open */
#include "plan.h"          /* mgpu_plan_build */
#include "reaper.h"        /* mgpu_reaper_start */
#include "rdzv.h"          /* mgpu_rdzv_join */
#include "remote.h"        /* mgpu_remote_main */
#include "report.h"        /* mgpu_report_print */
#include "sock.h"          /* mgpu_sock_free_port */
#include "spawner.h"       /* mgpu_spawner_keeper_start */
#include "status_client.h" /* mgpu_status_client_main */
#include "supervisor.h"    /* mgpu_sup_run */
#include "trace.h"         /* mgpu_trace_mark */

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

/* Parse: the command line, with torchrun's defaults from the environment and from Slurm or
 * Open MPI. Returns -1 to go on, else the exit status (help, version, bad usage). */
static int parse(mgpu_cli_t *cli, int argc, char **argv)
{
    mgpu_err_t err = {0};

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
    if (cli->endpoint_host[0] && cli->master_given && !cli->standalone &&
        (cli->nnodes_max > 1 ||
         (cli->endpoint_port_given && strcmp(cli->rdzv_backend, "static") == 0)))
        mgpu_warn("--master_addr and --master_port are only used without --rdzv_endpoint: the "
                  "nodes meet at %s, as with torchrun",
                  cli->rdzv_endpoint);
    return -1;
}

/* Plan: who runs where, from the command line and this machine's facts. The plan is the only
 * reader of the command line: every later phase takes the plan. */
static int plan_run(mgpu_plan_t *plan, const mgpu_cli_t *cli, mgpu_err_t *err)
{
    mgpu_plan_input_t in = {0};
    char exe[4096], dir[4096], worker_bin[4200], host[256], run_id[64];
    cpu_set_t allowed;
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);

    exe[n > 0 ? n : 0] = '\0';
    if (n <= 0 || mgpu_path_dirname(exe, dir, sizeof dir) < 0)
        snprintf(dir, sizeof dir, ".");
    snprintf(worker_bin, sizeof worker_bin, "%s/mgpu-worker", dir);
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
    /* --numa_binding: the topology (MGPU_SYSFS_ROOT: a fake one, for tests), and the CPUs this
     * launcher may use, which bound workers stay within. */
    in.sys_root = getenv("MGPU_SYSFS_ROOT");
    if (sched_getaffinity(0, sizeof allowed, &allowed) == 0)
        in.cpus_allowed = &allowed;
    return mgpu_plan_build(plan, cli, &in, err);
}

/* What the user sees before the workers start: the OMP banner, where options came from, why
 * the workers run on the CPU. */
static void announce(const mgpu_plan_t *plan)
{
    if (plan->omp_warning && !plan->output.quiet)
        fprintf(stderr,
                "*****************************************\n"
                "Setting OMP_NUM_THREADS environment variable for each process to be 1 in "
                "default, to avoid your system being overloaded, please further tune the variable "
                "for optimal performance in your application as needed.\n"
                "*****************************************\n");
    if (plan->derived[0])
        mgpu_info("from the environment: %s", plan->derived);
    if (plan->python[0])
        mgpu_info("python: %s", plan->python);
    if (plan->cpu_reason[0] && plan->gpus.count > 0)
        mgpu_warn("workers run on the CPU: %s", plan->cpu_reason);
    for (const char *p = plan->numa_warning; *p;) {
        size_t n = strcspn(p, "\n");
        mgpu_warn("%.*s", (int)n, p);
        p += n + (p[n] == '\n');
    }
    for (int k = 0; k < plan->nproc; k++)
        if (plan->workers[k].bound) {
            char list[1024];
            mgpu_cpulist_format(&plan->workers[k].cpus, list, sizeof list);
            mgpu_info("--numa_binding=%s: local rank %d on CPUs %s (NUMA node %d)",
                      mgpu_numa_mode_name(plan->numa_mode), k, list, plan->workers[k].numa_node);
        }
}

/* Rendezvous: meet the other launchers (or, on one node, just start the store for the
 * workers); the world they agree on goes into the plan. */
static int rendezvous(mgpu_plan_t *plan, mgpu_rdzv_t **rdzv, mgpu_err_t *err)
{
    mgpu_rdzv_opts_t ro;
    mgpu_rdzv_world_t world;
    int rc;

    mgpu_debug("planned %d workers; rendezvous", plan->nproc);
    mgpu_plan_rdzv_opts(plan, &ro);
    rc = mgpu_rdzv_join(&ro, rdzv, &world, err);
    if (rc < 0 && ro.serve && ro.elastic && plan->rdzv.is_host < 0 &&
        (err->code == -EADDRINUSE || err->code == -EADDRNOTAVAIL)) {
        /* The endpoint is another host's, or another launcher here serves it: join it. */
        ro.serve = 0;
        rc = mgpu_rdzv_join(&ro, rdzv, &world, err);
    }
    if (rc < 0)
        return rc;
    mgpu_debug("rendezvous done");
    mgpu_plan_set_world(plan, &world);
    if (plan->rdzv.nnodes_max > 1)
        mgpu_info("node %d of %d: global ranks %d..%d of %d; MASTER_ADDR=%s MASTER_PORT=%d",
                  world.node_rank, world.nnodes, world.base_rank, world.base_rank + plan->nproc - 1,
                  world.world_size, world.master_addr, world.master_port);
    return 0;
}

/* Containment: a cgroup of the job's own where one can be made (MGPU_CGROUP: unset or 1,
 * under the launcher's own group; a path, under that group, e.g. one delegated to the user; 0,
 * none), else the launcher's keeper as the subreaper of everything (reaper.h). Decided before
 * the rendezvous: the keeper must be forked while the launcher has one thread. cg->path is ""
 * when there is no cgroup. Returns 0, or MGPU_E_USAGE for a bad MGPU_CGROUP. */
static int contain(mgpu_cgroup_t *cg, mgpu_err_t *err)
{
    const char *v = getenv("MGPU_CGROUP");
    char name[64];

    memset(cg, 0, sizeof *cg);
    cg->procs_fd = cg->dir_fd = -1;
    if (v != NULL && strcmp(v, "0") == 0) {
        mgpu_info("containment: subreaper keeper (no cgroup: MGPU_CGROUP=0)");
        return 0;
    }
    if (v != NULL && v[0] != '\0' && strcmp(v, "1") != 0 && v[0] != '/')
        return mgpu_err_set(err, MGPU_E_USAGE,
                            "MGPU_CGROUP=%s: expected 1 (a cgroup for the job), 0 (none) or the "
                            "absolute path of a parent cgroup",
                            v);
    snprintf(name, sizeof name, "mgpu-%d", (int)getpid());
    if (mgpu_cgroup_create(cg, v != NULL && v[0] == '/' ? v : NULL, name, err) < 0)
        mgpu_info("containment: subreaper keeper (no cgroup: %s)", err->msg);
    else
        mgpu_info("containment: cgroup %s", cg->path);
    memset(err, 0, sizeof *err);
    return 0;
}

/* The job is over before the supervisor could end it: its cgroup goes, the keeper too (the
 * run's folder, when there was one, is gone: mgpu_run_result_free). */
static void uncontain(mgpu_cgroup_t *cg, mgpu_spawner_keeper_t *keeper)
{
    mgpu_cgroup_close(cg);
    mgpu_cgroup_remove(cg, 50);
    mgpu_spawner_keeper_release(keeper);
    mgpu_spawner_keeper_forget(keeper);
}

/* Report: the root cause, the startup timeline, the summary file. */
static void report(const mgpu_plan_t *plan, const mgpu_run_result_t *res)
{
    mgpu_err_t err = {0};

    mgpu_report_print(plan, res, stderr);
    if (!plan->output.quiet)
        mgpu_report_timeline(plan, res, stderr);
    if (res->keep_logs && !plan->output.log_dir[0])
        mgpu_warn("worker logs are in %s", res->log_root);
    if (plan->output.summary[0] &&
        mgpu_report_write_summary(plan, res, plan->output.summary, &err) < 0)
        mgpu_error("%s", err.msg);
    /* A scheduler above reads the root cause here (torchrun's @record main does the same). */
    if (getenv("TORCHELASTIC_ERROR_FILE") && *getenv("TORCHELASTIC_ERROR_FILE") &&
        mgpu_report_write_parent_error(plan, res, getenv("TORCHELASTIC_ERROR_FILE"), &err) < 0)
        mgpu_error("%s", err.msg);
}

int main(int argc, char **argv)
{
    mgpu_cli_t cli; /* ~30 KiB, on the stack: no early return can leak it */
    mgpu_plan_t plan;
    mgpu_run_result_t res;
    mgpu_rdzv_t *rdzv = NULL;
    mgpu_cgroup_t cg;
    mgpu_spawner_keeper_t keeper;
    mgpu_pages_t pages;
    mgpu_err_t err = {0};
    const char *loglevel = getenv("LOGLEVEL");
    int level = loglevel ? mgpu_log_level_parse(loglevel) : -1;
    int rc;

    mgpu_trace_init(getenv("MGPU_LAUNCH_TRACE"));
    ensure_std_fds();
    mgpu_log_init("mgpu-launch", level >= 0 ? (mgpu_log_level_t)level : MGPU_LOG_WARN);
    /* `mgpu-launch status`: another terminal asks the running jobs (a program named status
     * runs as ./status or after --) */
    if (argc > 1 && strcmp(argv[1], "status") == 0)
        return mgpu_status_client_main(argc - 1, argv + 1, stdout);
    if ((rc = parse(&cli, argc, argv)) >= 0)
        return rc;
    mgpu_cli_scrub_token(&cli); /* before the keeper is forked: it inherits argv's memory */
    if (cli.hostfile[0] || cli.hosts[0]) /* one launcher per host, over ssh */
        return mgpu_remote_main(&cli, argc, argv);
    mgpu_trace_mark("parse");
    if (plan_run(&plan, &cli, &err) < 0) {
        mgpu_error("%s", err.msg);
        mgpu_plan_free(&plan);
        return 2;
    }
    mgpu_trace_mark("plan");
    /* The workers' progress pages: made here so that --dry-run shows their variables. */
    if (mgpu_pages_open(&pages, plan.nproc, &err) < 0) {
        mgpu_error("%s", err.msg);
        mgpu_plan_free(&plan);
        mgpu_pages_close(&pages);
        return 1;
    }
    mgpu_plan_set_pages(&plan, &pages);
    mgpu_trace_mark("pages");
    if (plan.dry_run != MGPU_DRY_NONE) {
        if (plan.dry_run == MGPU_DRY_JSON)
            mgpu_plan_print_json(&plan, stdout);
        else
            mgpu_plan_print(&plan, stdout);
        mgpu_plan_free(&plan);
        mgpu_pages_close(&pages);
        return 0;
    }
    announce(&plan);
    mgpu_fdio_raise_limit(-1);

    if (contain(&cg, &err) < 0) {
        mgpu_error("%s", err.msg);
        mgpu_plan_free(&plan);
        mgpu_pages_close(&pages);
        return 2;
    }
    mgpu_trace_mark("cgroup");
    /* Without a cgroup, this process splits in two around a keeper that is the subreaper of
     * everything the job starts: this one waits and exits with the job's status, the other
     * goes on from here. With one (or should the split fail), the keeper watches the
     * launcher and kills the group (or the workers' process groups) if it dies. */
    keeper.pid = keeper.fd = -1;
    if (cg.path[0] == '\0') {
        const char *why;
        int keeper_fd;
        if ((rc = mgpu_reaper_start(plan.stop_signals, &why, &keeper_fd)) >= 0) {
            mgpu_plan_free(&plan);
            mgpu_pages_close(&pages);
            return rc;
        }
        mgpu_spawner_keeper_attach(&keeper, keeper_fd);
        if (why != NULL) {
            mgpu_warn("containment: no subreaper keeper: %s: %s", why, strerror(errno));
            mgpu_spawner_keeper_start(&keeper, &cg);
        }
    } else {
        mgpu_spawner_keeper_start(&keeper, &cg);
    }
    /* The workers' pipes, the store's connections, slack: grown here, in the process that
     * opens them and before its first thread. Not before the split above: fork copies only
     * the open descriptors' part of the table, and growing it once the store's thread runs
     * cost 4 ms a worker on a 16-core host (8 workers: 32 ms to start and exit, not 6). */
    mgpu_trace_mark("keeper");
    mgpu_fdio_grow_table(128 + 8L * plan.nproc + mgpu_plan_max_conns(&plan));
    /* Started over ssh: the job ends with the connection (remote.h). */
    if (cli.watch_stdin && mgpu_remote_watch_stdin(&err) < 0) {
        mgpu_error("%s", err.msg);
        uncontain(&cg, &keeper);
        mgpu_plan_free(&plan);
        mgpu_pages_close(&pages);
        return 1;
    }
    mgpu_trace_mark("fd table");

    if ((rc = rendezvous(&plan, &rdzv, &err)) < 0) {
        mgpu_error("%s", err.msg);
        uncontain(&cg, &keeper);
        mgpu_plan_free(&plan);
        mgpu_pages_close(&pages);
        return rc == MGPU_E_USAGE ? 2 : 1;
    }
    mgpu_trace_mark("rendezvous");
    fflush(stdout);
    fflush(stderr);

    /* Spawn and supervise, every attempt. */
    rc = mgpu_sup_run(&plan, rdzv, &cg, &keeper, &res, &err);
    mgpu_rdzv_close(rdzv);
    mgpu_trace_mark("store stop");
    if (rc < 0) {
        mgpu_error("%s", err.msg);
        mgpu_run_result_free(&res);
        uncontain(&cg, &keeper);
        mgpu_plan_free(&plan);
        mgpu_pages_close(&pages);
        return rc == MGPU_E_USAGE ? 2 : 1;
    }
    mgpu_debug("run over");
    report(&plan, &res);
    mgpu_trace_mark("report");
    rc = res.exit_code;
    /* The run's folder goes here, unless it holds what must be kept: only then may the keeper
     * forget it. */
    mgpu_run_result_free(&res);
    mgpu_trace_mark("run folder removal");
    mgpu_spawner_keeper_forget(&keeper);
    mgpu_plan_free(&plan);
    mgpu_pages_close(&pages);
    mgpu_trace_report();
    return rc;
}
