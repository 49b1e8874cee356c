/* main.c - mgpu-launch: parse, plan, start, supervise, report. */
#include <errno.h>        /* errno */
#include <fcntl.h>        /* open */
#include <libgen.h>       /* dirname */
#include <netinet/in.h>   /* sockaddr_in */
#include <stdio.h>        /* printf */
#include <stdlib.h>       /* getenv */
#include <string.h>       /* strcmp */
#include <sys/random.h>   /* getrandom */
#include <sys/resource.h> /* setrlimit */
#include <sys/socket.h>   /* socket */
#include <unistd.h>       /* sysconf */

#include "cli.h"        /* mgpu_cli_parse */
#include "log.h"        /* mgpu_log_init */
#include "plan.h"       /* mgpu_plan_build */
#include "report.h"     /* mgpu_report_print */
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

/* A port nobody listens on now, for MASTER_PORT on a single node. The workers' rank 0 binds
 * it moments later (PyTorch's TCPStore sets SO_REUSEADDR). */
static int free_port(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
    socklen_t len = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), port = -1;

    if (fd < 0)
        return -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

static void random_run_id(char *buf, size_t len)
{
    unsigned char b[16] = {0};
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b)
        for (size_t i = 0; i < sizeof b; i++)
            b[i] = (unsigned char)(rand() ^ getpid());
    b[6] = (unsigned char)((b[6] & 0x0f) | 0x40);
    b[8] = (unsigned char)((b[8] & 0x3f) | 0x80);
    snprintf(buf, len, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12],
             b[13], b[14], b[15]);
}

static void raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

int main(int argc, char **argv)
{
    mgpu_cli_t *cli = calloc(1, sizeof *cli);
    mgpu_plan_t plan;
    mgpu_plan_input_t in = {0};
    mgpu_run_result_t res;
    mgpu_err_t err = {0};
    char exe[4096], worker_bin[4200], host[256], run_id[64];
    const char *loglevel = getenv("LOGLEVEL");
    int level = loglevel ? mgpu_log_level_parse(loglevel) : -1;
    ssize_t n;

    ensure_std_fds();
    mgpu_log_init("mgpu-launch", level >= 0 ? (mgpu_log_level_t)level : MGPU_LOG_WARN);
    if (cli == NULL)
        return 1;
    if (mgpu_cli_parse(cli, argc, argv, env_lookup, &err) < 0) {
        mgpu_error("%s", err.msg);
        return 2;
    }
    if (cli->show_help) {
        mgpu_cli_usage(stdout);
        return 0;
    }
    if (cli->show_version) {
        printf("mgpu-launch %s\n", MGPU_VERSION);
        return 0;
    }
    if (cli->quiet)
        mgpu_log_init("mgpu-launch", MGPU_LOG_ERROR);
    else if (cli->verbose)
        mgpu_log_init("mgpu-launch", MGPU_LOG_INFO);

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
    in.free_port = (cli->master_port < 0 || cli->standalone) && cli->nnodes_max == 1 ? free_port() : -1;
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
    if (plan.cpu_reason[0] && plan.gpus.count > 0)
        mgpu_warn("workers run on the CPU: %s", plan.cpu_reason);
    raise_fd_limit();
    fflush(stdout);
    fflush(stderr);

    if (mgpu_sup_run(&plan, cli, &res, &err) < 0) {
        mgpu_error("%s", err.msg);
        mgpu_plan_free(&plan);
        return 1;
    }
    mgpu_report_print(&plan, &res, stderr);
    if (res.keep_logs && !cli->log_dir[0])
        mgpu_warn("worker logs are in %s", res.log_root);
    if (cli->summary[0] && mgpu_report_write_summary(&plan, &res, cli->summary, &err) < 0)
        mgpu_error("%s", err.msg);
    n = res.exit_code;
    mgpu_run_result_free(&res);
    mgpu_plan_free(&plan);
    free(cli);
    return (int)n;
}
