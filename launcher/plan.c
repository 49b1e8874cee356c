/* plan.c - ranks, devices, environment and command of every worker. */
#include "plan.h"

#include <errno.h>    /* errno */
#include <stdlib.h>   /* calloc */
#include <string.h>   /* strcmp */
#include <sys/stat.h> /* stat */
#include <unistd.h>   /* access */
#include <fcntl.h>    /* open */
#include <signal.h>   /* kill */

#include <poll.h>     /* poll */
#include <spawn.h>    /* posix_spawn */
#include <sys/wait.h> /* waitpid */
#include <time.h>     /* clock_gettime */

#include "atomic_file.h" /* mgpu_atomic_file_check */
#include "clock.h"       /* mgpu_clock_mono */
#include "escape.h"      /* mgpu_escape_inplace */
#include "log.h"         /* mgpu_info */
#include "sock.h"        /* mgpu_sock_is_loopback */
#include "text.h"        /* mgpu_append_line */

extern char **environ;

/* The workers' variables are set for every worker, three times before the first fork (the
 * plan, its pages, the rendezvous's world): without printf where a copy will do. 64 workers'
 * variables took 1 to 2 ms a build with two snprintf a variable into 46 KiB a worker. */

/* Appends "KEY=VALUE" (vlen bytes of val) to w's variables. */
static void put_var(mgpu_worker_plan_t *w, const char *key, const char *val, size_t vlen)
{
    size_t klen = strlen(key), need = w->env_len + klen + vlen + 2;
    char *d;

    if (w->nvars >= MGPU_MAX_VARS || w->env_oom) {
        w->env_oom = 1;
        return;
    }
    if (need > w->env_cap) {
        size_t cap = need < 2048 ? 2048 : 2 * need;
        char *grown = realloc(w->env, cap);
        if (grown == NULL) {
            w->env_oom = 1;
            return;
        }
        w->env = grown;
        w->env_cap = cap;
    }
    d = w->env + w->env_len;
    memcpy(d, key, klen);
    d[klen] = '=';
    memcpy(d + klen + 1, val, vlen);
    d[klen + 1 + vlen] = '\0';
    w->var_off[w->nvars++] = (unsigned)w->env_len;
    w->env_len = need;
}

static void set_str(mgpu_worker_plan_t *w, const char *key, const char *val)
{
    put_var(w, key, val, strlen(val));
}

static void set_int(mgpu_worker_plan_t *w, const char *key, long long v)
{
    char buf[24], *p = buf + sizeof buf;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;

    do
        *--p = (char)('0' + u % 10);
    while ((u /= 10) != 0);
    if (v < 0)
        *--p = '-';
    put_var(w, key, p, (size_t)(buf + sizeof buf - p));
}

const char *mgpu_plan_var_at(const mgpu_plan_t *plan, int k, int i, size_t *klen)
{
    const mgpu_worker_plan_t *w = &plan->workers[k];
    const char *v = w->env + w->var_off[i];
    if (klen != NULL)
        *klen = (size_t)(strchr(v, '=') - v);
    return v;
}

const char *mgpu_plan_var(const mgpu_plan_t *plan, int k, const char *key)
{
    const mgpu_worker_plan_t *w = &plan->workers[k];
    size_t klen = strlen(key);
    for (int i = 0; i < w->nvars; i++) {
        const char *v = w->env + w->var_off[i];
        if (strncmp(v, key, klen) == 0 && v[klen] == '=')
            return v + klen + 1;
    }
    return NULL;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* The executable execvp would run for prog: prog itself when it names a path (it exists; a
 * permission problem shows as exit 126 with the reason), else the first regular, executable
 * file of that name in PATH. Fills out (the path) or why. */
static int find_program(const char *prog, const char *path_env, char *out, size_t olen, char *why,
                        size_t len)
{
    struct stat st;

    if (strchr(prog, '/') != NULL) {
        if (stat(prog, &st) != 0) {
            snprintf(why, len, "%s", strerror(errno));
            return -1;
        }
        snprintf(out, olen, "%s", prog);
        return 0;
    }
    if (path_env == NULL || *path_env == '\0')
        path_env = "/usr/local/bin:/usr/bin:/bin";
    for (const char *p = path_env; p != NULL;) {
        const char *colon = strchr(p, ':');
        size_t dlen = colon ? (size_t)(colon - p) : strlen(p);
        char full[4096];
        snprintf(full, sizeof full, "%.*s/%s", (int)dlen, dlen ? p : ".", prog);
        if (stat(full, &st) == 0 && S_ISREG(st.st_mode) && access(full, X_OK) == 0) {
            snprintf(out, olen, "%s", full);
            return 0;
        }
        p = colon ? colon + 1 : NULL;
    }
    snprintf(why, len, "not found in PATH (%s)", path_env);
    return -1;
}

static int check_file(const char *what, const char *file, mgpu_err_t *err)
{
    struct stat st;
    if (stat(file, &st) != 0)
        return mgpu_err_set(err, MGPU_E_USAGE, "%s '%s': %s", what, file, strerror(errno));
    if (S_ISDIR(st.st_mode))
        return mgpu_err_set(err, MGPU_E_USAGE, "%s '%s': is a directory, expected a file", what,
                            file);
    if (access(file, R_OK) != 0)
        return mgpu_err_set(err, MGPU_E_USAGE, "%s '%s': %s", what, file, strerror(errno));
    return 0;
}

/* --summary FILE is written at the end, through FILE.tmp.<pid> in its folder (or in place, for
 * /dev/stdout and the like: atomic_file.h): that folder, or the device, must be writable now,
 * so that a mistyped path is one message before anything starts rather than a report lost
 * after the job. */
static int check_summary(const char *file, mgpu_err_t *err)
{
    mgpu_err_t why = {0};
    struct stat st;
    if (stat(file, &st) == 0 && S_ISDIR(st.st_mode))
        return mgpu_err_set(err, MGPU_E_USAGE, "--summary '%s': is a directory, expected a file",
                            file);
    if (mgpu_atomic_file_check(file, &why) < 0)
        return mgpu_err_set(err, MGPU_E_USAGE, "--summary '%s': %s", file, why.msg);
    return 0;
}

/* A train.cfg is checked by the worker that will read it (`mgpu-worker --check FILE
 * key=value ...`), before anything starts: a bad cfg is one message and exit 2 here, not the
 * same error from every rank after they started, and the launcher links no trainer code. The
 * check is bounded in time, so a cfg that blocks its reader cannot hang the launcher. */
#define CFG_CHECK_TIMEOUT_MS 10000

static int check_cfg(const char *worker_bin, const mgpu_cli_t *cli, mgpu_err_t *err)
{
    const char **argv = calloc((size_t)cli->prog_argc + 3, sizeof *argv);
    char out[4096];
    size_t len = 0;
    int fds[2], status = 0, argc = 0;
    pid_t pid;
    posix_spawn_file_actions_t fa;
    double t0;

    if (argv == NULL)
        return mgpu_err_set(err, -ENOMEM, "out of memory");
    argv[argc++] = worker_bin;
    argv[argc++] = "--check";
    for (int i = 0; i < cli->prog_argc; i++)
        argv[argc++] = cli->prog_argv[i];
    argv[argc] = NULL;
    if (pipe2(fds, O_CLOEXEC) != 0) {
        free(argv);
        return mgpu_err_set(err, -errno, "pipe: %s", strerror(errno));
    }
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
    int rc = posix_spawn(&pid, worker_bin, &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    free(argv);
    close(fds[1]);
    if (rc != 0) {
        close(fds[0]);
        return mgpu_err_set(err, MGPU_E_USAGE, "checking '%s' with %s --check: %s",
                            cli->prog_argv[0], worker_bin, strerror(rc));
    }
    t0 = mgpu_clock_mono();
    for (;;) {
        struct pollfd p = {.fd = fds[0], .events = POLLIN};
        long left = CFG_CHECK_TIMEOUT_MS - (long)((mgpu_clock_mono() - t0) * 1000);
        if (left <= 0) {
            kill(pid, SIGKILL);
            break;
        }
        int n = poll(&p, 1, (int)left);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            continue;
        char buf[1024];
        ssize_t got = read(fds[0], buf, sizeof buf);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        size_t take = (size_t)got < sizeof out - 1 - len ? (size_t)got : sizeof out - 1 - len;
        memcpy(out + len, buf, take);
        len += take;
    }
    close(fds[0]);
    out[len] = '\0';
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return 0;
    /* The worker's message is "mgpu-worker: error: FILE:LINE: ...": keep what follows. */
    while (len > 0 && (out[len - 1] == '\n' || out[len - 1] == '\r'))
        out[--len] = '\0';
    const char *msg = out, *tag = strstr(out, ": error: ");
    if (tag != NULL)
        msg = tag + strlen(": error: ");
    if (WIFSIGNALED(status))
        return mgpu_err_set(err, MGPU_E_USAGE,
                            "checking '%s' with %s --check: %s (the check was killed by signal "
                            "%d%s)",
                            cli->prog_argv[0], worker_bin, *msg ? msg : "no message",
                            WTERMSIG(status), WTERMSIG(status) == SIGKILL ? ", after 10 s" : "");
    return mgpu_err_set(err, MGPU_E_USAGE, "%s", *msg ? msg : "bad training config");
}

static int resolve_nproc(mgpu_plan_t *plan, const mgpu_cli_t *cli, const mgpu_plan_input_t *in,
                         mgpu_err_t *err)
{
    if (strcmp(cli->nproc, "gpu") == 0) {
        if (plan->vis.count == 0)
            return mgpu_err_set(
                err, MGPU_E_USAGE, "--nproc_per_node=gpu: no GPU is visible (%d installed%s%s%s)",
                plan->gpus.count, plan->vis.cvd_set ? ", CUDA_VISIBLE_DEVICES='" : "",
                plan->vis.cvd_set ? plan->vis.cvd : "", plan->vis.cvd_set ? "'" : "");
        plan->nproc = plan->vis.count;
    } else if (strcmp(cli->nproc, "cpu") == 0) {
        plan->nproc = in->cpu_count > 0 ? in->cpu_count : 1;
    } else if (strcmp(cli->nproc, "auto") == 0) {
        plan->nproc =
            plan->vis.count > 0 ? plan->vis.count : (in->cpu_count > 0 ? in->cpu_count : 1);
    } else {
        plan->nproc = atoi(cli->nproc);
    }
    if (plan->nproc > MGPU_MAX_LOCAL)
        plan->nproc = MGPU_MAX_LOCAL;
    return 0;
}

/* The article's scenario 4: more local ranks than visible GPUs. */
static int check_devices(mgpu_plan_t *plan, const mgpu_cli_t *cli, mgpu_err_t *err)
{
    char list[2048];
    const char *sim = plan->gpus.simulated ? " simulated" : "";

    if (plan->vis.error)
        return mgpu_err_set(err, MGPU_E_USAGE, "CUDA_VISIBLE_DEVICES='%s': %s", plan->vis.cvd,
                            plan->vis.why);
    if (plan->vis.count == 0) {
        if (plan->gpus.count == 0)
            snprintf(plan->cpu_reason, sizeof plan->cpu_reason, "no GPU is installed");
        else
            snprintf(plan->cpu_reason, sizeof plan->cpu_reason,
                     "CUDA_VISIBLE_DEVICES='%s' makes none of the %d%s GPUs visible (%s)",
                     plan->vis.cvd, plan->gpus.count, sim, plan->vis.why);
        return 0;
    }
    if (plan->nproc <= plan->vis.count)
        return 0;
    if (cli->allow_gpu_sharing) {
        plan->sharing = 1;
        return 0;
    }
    mgpu_devices_describe(&plan->gpus, &plan->vis, list, sizeof list);
    return mgpu_err_set(
        err, MGPU_E_USAGE,
        "--nproc_per_node=%d but only %d%s GPU%s visible (CUDA_VISIBLE_DEVICES=%s%s%s: %s; %d%s "
        "GPU%s installed): local rank %d would fail in cudaSetDevice(%d) with 'invalid device "
        "ordinal'. Start at most %d worker%s, make more GPUs visible, or pass "
        "--allow_gpu_sharing to run local rank k on ordinal k mod %d. For a CPU-only job, hide "
        "the GPUs: CUDA_VISIBLE_DEVICES= mgpu-launch ...",
        plan->nproc, plan->vis.count, sim, plan->vis.count == 1 ? " is" : "s are",
        plan->vis.cvd_set ? "'" : "", plan->vis.cvd_set ? plan->vis.cvd : "(unset)",
        plan->vis.cvd_set ? "'" : "", list, plan->gpus.count, sim, plan->gpus.count == 1 ? "" : "s",
        plan->vis.count, plan->vis.count, plan->vis.count, plan->vis.count == 1 ? "" : "s",
        plan->vis.count);
}

/* A program that exec cannot run but Python can: a regular file, not executable, that names
 * a path or sits in the current folder and is not found in PATH, and is not plainly something
 * else: a binary, or a script whose "#!" line names another interpreter (a shell script
 * without its x bit still fails with 126 and the reason, as exec reports it). */
static int is_python_source(const char *prog, const char *path_env)
{
    struct stat st;
    char exe[4096], why[4200], head[256];
    ssize_t n = 0;
    int fd;

    if (stat(prog, &st) != 0 || !S_ISREG(st.st_mode) || access(prog, X_OK) == 0)
        return 0;
    if (strchr(prog, '/') == NULL &&
        find_program(prog, path_env, exe, sizeof exe, why, sizeof why) == 0)
        return 0;
    if ((fd = open(prog, O_RDONLY | O_CLOEXEC)) >= 0) {
        n = read(fd, head, sizeof head - 1);
        close(fd);
    }
    if (n <= 0)
        return n == 0; /* empty: Python runs it; unreadable: let exec say why */
    head[n] = '\0';
    if (memchr(head, '\0', (size_t)n) != NULL)
        return 0; /* a binary */
    if (strncmp(head, "#!", 2) == 0) {
        head[strcspn(head, "\n")] = '\0';
        return strstr(head, "python") != NULL;
    }
    return 1;
}

/* The worker command: argv[0] is what is executed. */
static int build_argv(mgpu_plan_t *plan, const mgpu_cli_t *cli, const mgpu_plan_input_t *in,
                      mgpu_err_t *err)
{
    const char *prog = cli->prog_argv[0];
    const char *head[4];
    int nhead = 0, python = 0, rc;
    char why[4200];

    snprintf(plan->entrypoint, sizeof plan->entrypoint, "%s", prog);
    if (cli->module) {
        head[nhead++] = in->python;
        head[nhead++] = "-u";
        head[nhead++] = "-m";
        python = 1;
    } else if (!cli->no_python && (cli->run_path || ends_with(prog, ".py"))) {
        head[nhead++] = in->python;
        head[nhead++] = "-u";
        python = 1;
        if ((rc = check_file("python script", prog, err)) < 0)
            return rc;
    } else if (!cli->no_python && ends_with(prog, ".cfg")) {
        if ((rc = check_file("training config", prog, err)) < 0)
            return rc;
        if (access(in->worker_bin, X_OK) != 0)
            return mgpu_err_set(err, MGPU_E_USAGE,
                                "'%s' needs mgpu-worker, but '%s' is missing (%s); build it with "
                                "make",
                                prog, in->worker_bin, strerror(errno));
        if ((rc = check_cfg(in->worker_bin, cli, err)) < 0)
            return rc;
        head[nhead++] = in->worker_bin;
    } else if (!cli->no_python && is_python_source(prog, in->path_env)) {
        /* torchrun runs any training script under Python unless --no_python: a script without
         * ".py" that cannot be executed (no x bit) is one, where exec would fail with 126. */
        head[nhead++] = in->python;
        head[nhead++] = "-u";
        python = 1;
        if ((rc = check_file("python script", prog, err)) < 0)
            return rc;
        char shown[4096];
        mgpu_info("'%s' is not executable: running it with %s, as torchrun does (--no_python to "
                  "execute it directly)",
                  mgpu_escape(prog, shown, sizeof shown), in->python);
    } else if (find_program(prog, in->path_env, plan->exe, sizeof plan->exe, why, sizeof why) < 0) {
        return mgpu_err_set(err, MGPU_E_USAGE, "worker program '%s': %s", prog, why);
    }
    if (python &&
        find_program(in->python, in->path_env, plan->exe, sizeof plan->exe, why, sizeof why) < 0)
        return mgpu_err_set(err, MGPU_E_USAGE, "python interpreter '%s' (PYTHON_EXEC): %s",
                            in->python, why);
    if (python) {
        /* A full path, as the user must name it in PYTHON_EXEC; not realpath(): a virtual
         * environment's python is a symlink, and its own path is what selects the packages. */
        char cwd[2048];
        if (plan->exe[0] != '/' && getcwd(cwd, sizeof cwd) != NULL)
            snprintf(plan->python, sizeof plan->python, "%s/%s", cwd,
                     strncmp(plan->exe, "./", 2) == 0 ? plan->exe + 2 : plan->exe);
        else
            snprintf(plan->python, sizeof plan->python, "%s", plan->exe);
    }
    if (nhead > 0 && !python) /* mgpu-worker, checked above */
        snprintf(plan->exe, sizeof plan->exe, "%s", in->worker_bin);

    for (int k = 0; k < plan->nproc; k++) {
        mgpu_worker_plan_t *w = &plan->workers[k];
        int n = 0, total = nhead + cli->prog_argc + 2;
        w->argv = calloc((size_t)total, sizeof *w->argv);
        if (w->argv == NULL)
            return mgpu_err_set(err, -ENOMEM, "out of memory");
        for (int i = 0; i < nhead; i++)
            w->argv[n++] = strdup(head[i]);
        w->argv[n++] = strdup(prog);
        /* torch.distributed.launch without --use_env: "--local_rank=N" before the user's own
         * arguments (the article's scripts parse it with argparse). */
        if (cli->legacy_local_rank &&
            asprintf(&w->argv[n++],
                     cli->legacy_local_rank == 2 ? "--local-rank=%d" : "--local_rank=%d", k) < 0)
            return mgpu_err_set(err, -ENOMEM, "out of memory");
        for (int i = 1; i < cli->prog_argc; i++)
            w->argv[n++] = strdup(cli->prog_argv[i]);
        for (int i = 0; i < n; i++)
            if (w->argv[i] == NULL)
                return mgpu_err_set(err, -ENOMEM, "out of memory");
    }
    return 0;
}

/* --virtual_local_rank, as torchrun has it: LOCAL_RANK=0 in every worker and
 * CUDA_VISIBLE_DEVICES the one visible device the worker would have used (entry k of the
 * launcher's list, or k when it is unset), which the worker then sees as ordinal 0. GPUs
 * hidden from the launcher stay hidden (torchrun fails from the second worker on).
 * MGPU_LOCAL_RANK keeps the worker's index on the node for libmgpu (device.h). */
static void virtual_local_rank_vars(mgpu_plan_t *plan, mgpu_worker_plan_t *w, int slot)
{
    char entry[256];
    set_str(w, "LOCAL_RANK", "0");
    set_int(w, "MGPU_LOCAL_RANK", w->local_rank); /* the index libmgpu needs */
    if (plan->vis.cvd_set && plan->vis.count == 0)
        snprintf(entry, sizeof entry, "%s", plan->vis.cvd);
    else if (plan->vis.cvd_set)
        snprintf(entry, sizeof entry, "%.*s", plan->vis.entry_len[slot],
                 plan->vis.cvd + plan->vis.entry_at[slot]);
    else
        snprintf(entry, sizeof entry, "%d", slot);
    set_str(w, "CUDA_VISIBLE_DEVICES", entry);
}

static void build_vars(mgpu_plan_t *plan)
{
    const int pid = (int)getpid();
    char progress[64] = "";

    if (plan->pages != NULL)
        snprintf(progress, sizeof progress, "/proc/%d/fd/%d", pid, plan->pages->fd);
    for (int k = 0; k < plan->nproc; k++) {
        mgpu_worker_plan_t *w = &plan->workers[k];
        int slot = k; /* the visible device this worker uses, among the launcher's */

        w->nvars = 0;
        w->env_len = 0;
        w->env_oom = 0;
        w->local_rank = k;
        w->rank = plan->base_rank + k;
        w->ordinal = -1;
        w->physical = -1;
        if (plan->vis.count > 0) {
            slot = k % plan->vis.count;
            w->ordinal = plan->virtual_local_rank ? 0 : slot;
            w->physical = plan->vis.physical[slot];
        }
        if (plan->virtual_local_rank)
            virtual_local_rank_vars(plan, w, slot);
        else
            set_int(w, "LOCAL_RANK", k);
        set_int(w, "RANK", w->rank);
        set_int(w, "GROUP_RANK", plan->node_rank);
        set_int(w, "ROLE_RANK", plan->role_base_rank + k);
        set_str(w, "ROLE_NAME", plan->role);
        set_int(w, "LOCAL_WORLD_SIZE", plan->nproc);
        set_int(w, "WORLD_SIZE", plan->world_size);
        set_int(w, "GROUP_WORLD_SIZE", plan->nnodes);
        set_int(w, "ROLE_WORLD_SIZE", plan->role_world_size);
        set_str(w, "MASTER_ADDR", plan->master_addr);
        set_int(w, "MASTER_PORT", plan->master_port);
        set_int(w, "TORCHELASTIC_MAX_RESTARTS", plan->max_restarts);
        set_str(w, "TORCHELASTIC_RUN_ID", plan->run_id);
        /* torchrun's agent exports its --signals_to_handle; PyTorch's own process contexts
         * started inside a worker read it. */
        set_str(w, "TORCHELASTIC_SIGNALS_TO_HANDLE", plan->signals);
        /* Workers host their own TCPStore on MASTER_PORT (rank 0): the launcher's store speaks
         * mgpu's protocol, not PyTorch's, whose wire format changes between releases. */
        set_str(w, "TORCHELASTIC_USE_AGENT_STORE", "False");
        set_str(w, "TORCH_NCCL_ASYNC_ERROR_HANDLING", plan->nccl_async);
        if (plan->omp_threads[0])
            set_str(w, "OMP_NUM_THREADS", plan->omp_threads);
        set_int(w, "MGPU_NODE_RANK", plan->node_rank);
        set_int(w, "MGPU_NNODES", plan->nnodes);
        set_int(w, "MGPU_LAUNCHER_PID", pid);
        if (w->physical >= 0) {
            const mgpu_gpu_t *g = &plan->gpus.gpus[w->physical];
            set_int(w, "MGPU_GPU_ORDINAL", w->ordinal);
            set_int(w, "MGPU_PHYSICAL_GPU", g->index);
            set_str(w, "MGPU_GPU_UUID", g->uuid);
            set_str(w, "MGPU_GPU_BUS_ID", g->bus_id);
            if (g->simulated)
                set_str(w, "MGPU_GPU_SIMULATED", "1");
        } else {
            set_str(w, "MGPU_DEVICE", "cpu");
        }
        if (plan->sharing)
            set_str(w, "MGPU_ALLOW_GPU_SHARING", "1");
        if (plan->pages != NULL) {
            set_str(w, MGPU_PROGRESS_ENV_FILE, progress);
            set_int(w, MGPU_PROGRESS_ENV_SLOT, k);
            char heartbeat[64];
            snprintf(heartbeat, sizeof heartbeat, "/proc/%d/fd/%d", pid,
                     plan->pages->heartbeat_fds[k]);
            set_str(w, MGPU_HEARTBEAT_ENV, heartbeat);
        }
        if (plan->store_port > 0) {
            set_str(w, "MGPU_STORE_ADDR", plan->store_addr);
            set_int(w, "MGPU_STORE_PORT", plan->store_port);
            set_str(w, "MGPU_STORE_TOKEN", plan->store_token);
        }
    }
}

static void copy_rdzv(mgpu_plan_rdzv_t *r, const mgpu_cli_t *cli)
{
    r->nnodes_min = cli->nnodes_min;
    r->nnodes_max = cli->nnodes_max;
    r->node_rank = cli->node_rank;
    r->is_host = cli->is_host;
    r->c10d = strcmp(cli->rdzv_backend, "c10d") == 0;
    r->join_timeout = cli->join_timeout;
    r->last_call_timeout = cli->last_call_timeout;
    r->heartbeat_timeout = cli->heartbeat_timeout;
    if (cli->rdzv_timeout > 0) {
        /* torchrun's static rendezvous waits its store's timeout for every node; its dynamic
         * one (c10d, MIN:MAX) waits join_timeout and has no use for timeout. */
        int elastic = cli->nnodes_min != cli->nnodes_max || r->c10d;
        if (elastic)
            mgpu_info("rdzv_conf: ignoring timeout=%g (the elastic rendezvous waits "
                      "join_timeout=%g)",
                      cli->rdzv_timeout, cli->join_timeout);
        else if (!cli->join_timeout_given)
            r->join_timeout = cli->rdzv_timeout;
    }
    snprintf(r->local_addr, sizeof r->local_addr, "%s", cli->local_addr);
    snprintf(r->token, sizeof r->token, "%s", cli->rdzv_token);
    snprintf(r->endpoint_host, sizeof r->endpoint_host, "%s", cli->endpoint_host);
    r->endpoint_port = cli->endpoint_port;
    snprintf(r->master_addr, sizeof r->master_addr, "%s", cli->master_addr);
    r->master_port = cli->master_port;
}

static void copy_output(mgpu_plan_output_t *o, const mgpu_cli_t *cli)
{
    o->redirects = cli->redirects;
    o->tee = cli->tee;
    o->dup[0] = cli->dup_filters[0];
    o->dup[1] = cli->dup_filters[1];
    o->nfilter = cli->nfilter;
    memcpy(o->filter, cli->filter, sizeof o->filter);
    o->no_prefix = cli->no_prefix;
    snprintf(o->prefix_template, sizeof o->prefix_template, "%s", cli->prefix_template);
    snprintf(o->log_dir, sizeof o->log_dir, "%s", cli->log_dir);
    snprintf(o->summary, sizeof o->summary, "%s", cli->summary);
    o->quiet = cli->quiet;
    o->verbose = cli->verbose;
    o->tty = cli->tty;
}

/* Several nodes, one rule a firewall can follow: the launchers' store listens on port P
 * (--master_port, default 29500; --rdzv_endpoint's port when given; 29400 for an elastic
 * rendezvous given neither) and MASTER_PORT, where the workers' rank 0 hosts PyTorch's own
 * store, is P + 1 on the node of global rank 0. The store cannot also be PyTorch's: the
 * workers' TCPStore protocol changes between releases. */
static int rdzv_ports(mgpu_plan_t *plan, const mgpu_cli_t *cli, mgpu_err_t *err)
{
    int elastic = cli->nnodes_min != cli->nnodes_max || strcmp(cli->rdzv_backend, "c10d") == 0;

    if (cli->endpoint_host[0])
        plan->rdzv_port = cli->endpoint_port;
    else if (cli->master_port >= 0)
        plan->rdzv_port = cli->master_port;
    else
        plan->rdzv_port = elastic ? 29400 : 29500;
    if (plan->rdzv_port >= 65535)
        return mgpu_err_set(err, MGPU_E_USAGE,
                            "%s port %d: several nodes use two ports, the store's (P) and "
                            "MASTER_PORT (P+1); expected a port below 65535",
                            cli->endpoint_host[0] ? "--rdzv_endpoint" : "--master_port",
                            plan->rdzv_port);
    plan->master_port = plan->rdzv_port > 0 ? plan->rdzv_port + 1 : 0;
    plan->port_is_free_pick = plan->rdzv_port == 0;
    return 0;
}

/* Where node 0 serves a store reached at host: a loopback host on loopback, any other on every
 * address; of the host's family (an IPv6 literal: IPv6, whose "::" takes IPv4 too). */
static const char *bind_any(const char *host)
{
    const int v6 = strchr(host, ':') != NULL;
    if (mgpu_sock_is_loopback(host))
        return v6 ? "::1" : "127.0.0.1";
    return v6 ? "::" : "0.0.0.0";
}

void mgpu_plan_rdzv_opts(const mgpu_plan_t *plan, mgpu_rdzv_opts_t *ro)
{
    const mgpu_plan_rdzv_t *r = &plan->rdzv;

    memset(ro, 0, sizeof *ro);
    ro->run_id = plan->run_id;
    ro->nnodes_min = r->nnodes_min;
    ro->nnodes_max = r->nnodes_max;
    ro->node_rank = r->node_rank;
    ro->nproc = plan->nproc;
    ro->hostname = r->local_addr[0] ? r->local_addr : plan->hostname;
    ro->role = plan->role;
    ro->token = r->token[0] ? r->token : NULL;
    ro->join_timeout = r->join_timeout;
    ro->last_call_timeout = r->last_call_timeout;
    ro->heartbeat_timeout = r->heartbeat_timeout;
    ro->max_restarts = plan->max_restarts;
    ro->elastic = r->nnodes_min != r->nnodes_max || r->c10d;
    ro->max_conns = mgpu_plan_max_conns(plan);
    if (r->nnodes_max == 1) {
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
    /* Several nodes: MASTER_PORT is the store's port + 1 (see rdzv_ports); 0 when the store's
     * port is itself a free pick. */
    ro->store_port = plan->rdzv_port;
    ro->master_port = plan->rdzv_port > 0 ? plan->rdzv_port + 1 : 0;
    if (ro->elastic) {
        const char *eh = r->endpoint_host[0] ? r->endpoint_host : r->master_addr;
        ro->store_host = eh;
        /* torchrun's c10d: the launcher on the endpoint's host serves it. Which host that is,
         * binding tells: an address of another host fails with EADDRNOTAVAIL, and one that
         * another launcher here serves already with EADDRINUSE; main then joins as a client. */
        ro->serve = r->is_host >= 0 ? r->is_host : 1;
        ro->master_addr = mgpu_sock_is_loopback(eh) ? "127.0.0.1" : ro->hostname;
        ro->bind_host = mgpu_sock_is_loopback(eh) || r->is_host == 1 ? bind_any(eh) : eh;
        return;
    }
    /* Static: node 0 serves the store at the plan's master address and port (--rdzv_endpoint
     * when it is given, as torchrun's static rendezvous; else --master_addr:--master_port). */
    ro->store_host = plan->master_addr;
    ro->serve = r->node_rank == 0;
    ro->master_addr = plan->master_addr;
    ro->bind_host = bind_any(ro->store_host);
}

int mgpu_plan_max_conns(const mgpu_plan_t *plan)
{
    long n = (long)plan->rdzv.nnodes_max * (2 * plan->nproc + 4) + 64;
    return n > 65536 ? 65536 : (int)n;
}

void mgpu_plan_set_world(mgpu_plan_t *plan, const mgpu_rdzv_world_t *world)
{
    plan->nnodes = world->nnodes;
    plan->node_rank = world->node_rank;
    plan->base_rank = world->base_rank;
    plan->world_size = world->world_size;
    plan->role_base_rank = world->role_base_rank;
    plan->role_world_size = world->role_world_size;
    plan->round = world->round;
    plan->restarts = world->restarts;
    snprintf(plan->world_hosts, sizeof plan->world_hosts, "%s", world->hosts);
    snprintf(plan->master_addr, sizeof plan->master_addr, "%s", world->master_addr);
    plan->master_port = world->master_port;
    plan->port_is_free_pick = 1;
    snprintf(plan->store_addr, sizeof plan->store_addr, "%s", world->store_addr);
    plan->store_port = world->store_port;
    snprintf(plan->store_token, sizeof plan->store_token, "%s", world->token);
    build_vars(plan);
}

void mgpu_plan_set_pages(mgpu_plan_t *plan, const mgpu_pages_t *pages)
{
    plan->pages = pages;
    build_vars(plan);
}

/* --numa_binding: each worker's CPUs, from the NUMA node of its GPU (numa.h); workers on one
 * GPU share them. A worker that cannot be bound (no GPU, a GPU whose node is unknown, a node
 * outside the launcher's own affinity) runs unbound, and the launcher says why: the option
 * asks for a placement, and torchrun's exception there would stop the job before it starts.
 * A mode the machine cannot meet (exclusive with fewer cores than GPUs) is an error. */
static int bind_numa(mgpu_plan_t *plan, const mgpu_plan_input_t *in, mgpu_err_t *err)
{
    const char *mode = mgpu_numa_mode_name(plan->numa_mode);
    int gpu_nodes[MGPU_MAX_GPUS], rc = 0;
    char why[400];
    mgpu_numa_topo_t *t;

    for (int k = 0; k < plan->nproc; k++)
        plan->workers[k].numa_node = -1;
    if (plan->numa_mode == MGPU_NUMA_OFF)
        return 0;
    if (plan->vis.count == 0) {
        for (int k = 0; k < plan->nproc; k++)
            snprintf(plan->workers[k].numa_why, sizeof plan->workers[k].numa_why,
                     "it runs on the CPU");
        mgpu_append_line(plan->numa_warning, sizeof plan->numa_warning,
                         "--numa_binding=%s: the workers run on the CPU (%s): no GPU to bind them "
                         "near; they run unbound",
                         mode, plan->cpu_reason);
        return 0;
    }
    if ((t = malloc(sizeof *t)) == NULL)
        return mgpu_err_set(err, -ENOMEM, "out of memory reading the NUMA topology");
    if (mgpu_numa_topo_read(in->sys_root, plan->numa_mode, in->cpus_allowed, t, why, sizeof why) !=
        0) {
        for (int k = 0; k < plan->nproc; k++)
            snprintf(plan->workers[k].numa_why, sizeof plan->workers[k].numa_why, "%s", why);
        mgpu_append_line(plan->numa_warning, sizeof plan->numa_warning,
                         "--numa_binding=%s: %s: the workers run unbound", mode, why);
        free(t);
        return 0;
    }
    for (int i = 0; i < plan->vis.count; i++) {
        const mgpu_gpu_t *g = &plan->gpus.gpus[plan->vis.physical[i]];
        char gwhy[400];
        if (mgpu_numa_device_node(in->sys_root, g->bus_id, t, &gpu_nodes[i], gwhy, sizeof gwhy))
            gpu_nodes[i] = -1;
    }
    /* Ordinal i serves local ranks i, i + n, ... (n visible GPUs; more with sharing). */
    for (int i = 0; i < plan->vis.count && i < plan->nproc; i++) {
        const mgpu_gpu_t *g = &plan->gpus.gpus[plan->vis.physical[i]];
        char ranks[128] = "";
        cpu_set_t cpus;
        int st, nranks = 0;

        if (gpu_nodes[i] < 0) /* asked again, for the reason */
            st = mgpu_numa_device_node(in->sys_root, g->bus_id, t, &gpu_nodes[i], why, sizeof why);
        else
            st = mgpu_numa_cpus(t, plan->numa_mode, gpu_nodes, plan->vis.count, i, &cpus, why,
                                sizeof why, err);
        if (st < 0) {
            rc = st;
            break;
        }
        for (int k = i; k < plan->nproc; k += plan->vis.count) {
            mgpu_worker_plan_t *w = &plan->workers[k];
            size_t l = strlen(ranks);
            w->numa_node = gpu_nodes[i];
            w->bound = st == 0;
            if (st == 0)
                w->cpus = cpus;
            else
                snprintf(w->numa_why, sizeof w->numa_why, "%s", why);
            if (l + 16 < sizeof ranks)
                snprintf(ranks + l, sizeof ranks - l, "%s%d", nranks ? ", " : "", k);
            nranks++;
        }
        if (st != 0)
            mgpu_append_line(plan->numa_warning, sizeof plan->numa_warning,
                             "--numa_binding=%s: local rank%s %s (GPU %d, %s%s) run%s unbound: %s",
                             mode, nranks > 1 ? "s" : "", ranks, g->index, g->bus_id,
                             g->simulated ? ", simulated" : "", nranks > 1 ? "" : "s", why);
    }
    free(t);
    return rc;
}

static int plan_build(mgpu_plan_t *plan, const mgpu_cli_t *cli, const mgpu_plan_input_t *in,
                      mgpu_err_t *err);

int mgpu_plan_build(mgpu_plan_t *plan, const mgpu_cli_t *cli, const mgpu_plan_input_t *in,
                    mgpu_err_t *err)
{
    /* What parsing had to say for -v, now that the log level is known. */
    for (const char *p = cli->notes; *p;) {
        size_t n = strcspn(p, "\n");
        char line[sizeof cli->notes], shown[4 * sizeof cli->notes];
        snprintf(line, sizeof line, "%.*s", (int)n, p);
        mgpu_info("%s", mgpu_escape(line, shown, sizeof shown));
        p += n + (p[n] == '\n');
    }
    int rc = plan_build(plan, cli, in, err);
    /* Messages quote programs, files and variables the user gave: control bytes are shown
     * escaped, never sent raw to the terminal. */
    if (rc < 0 && err != NULL)
        mgpu_escape_inplace(err->msg, sizeof err->msg);
    return rc;
}

static int plan_build(mgpu_plan_t *plan, const mgpu_cli_t *cli, const mgpu_plan_input_t *in,
                      mgpu_err_t *err)
{
    int rc;

    memset(plan, 0, sizeof *plan);
    rc = mgpu_devices_discover(&plan->gpus, in->sim_gpus, in->proc_root, err);
    if (rc < 0)
        return rc;
    mgpu_devices_visible(&plan->gpus, in->cvd, &plan->vis);
    if ((rc = resolve_nproc(plan, cli, in, err)) < 0)
        return rc;
    if ((rc = check_devices(plan, cli, err)) < 0)
        return rc;

    /* A first guess, as a static rendezvous would have it: every node runs nproc workers and
     * ranks follow node ranks. The rendezvous replaces it (mgpu_plan_set_world), since nodes
     * of different sizes meet through the store. */
    plan->nnodes = cli->nnodes_max;
    plan->node_rank = cli->node_rank;
    plan->world_size = plan->nproc * plan->nnodes;
    plan->base_rank = plan->node_rank * plan->nproc;
    plan->role_base_rank = plan->base_rank; /* one role until the rendezvous says otherwise */
    plan->role_world_size = plan->world_size;
    plan->max_restarts = cli->max_restarts;
    plan->virtual_local_rank = cli->virtual_local_rank;
    plan->legacy_local_rank = cli->legacy_local_rank;
    plan->grace_period = cli->grace_period;
    plan->stop_signals = cli->stop_signals;
    snprintf(plan->signals, sizeof plan->signals, "%s", cli->signals);
    plan->stall_timeout = cli->stall_timeout;
    plan->stall_fail = cli->stall_fail;
    plan->dry_run = cli->dry_run;
    copy_rdzv(&plan->rdzv, cli);
    copy_output(&plan->output, cli);
    if (cli->summary[0] && (rc = check_summary(cli->summary, err)) < 0)
        return rc;
    snprintf(plan->master_addr, sizeof plan->master_addr, "%s", cli->master_addr);
    snprintf(plan->role, sizeof plan->role, "%s", cli->role);
    snprintf(plan->hostname, sizeof plan->hostname, "%s",
             in->hostname ? in->hostname : "localhost");
    snprintf(plan->run_id, sizeof plan->run_id, "%s",
             cli->standalone && in->run_id ? in->run_id : cli->rdzv_id);
    if (cli->master_port >= 0 && !cli->standalone) {
        plan->master_port = cli->master_port;
    } else if (plan->nnodes == 1 && in->free_port > 0) {
        /* One node and no port: a free one, so two jobs on one host never collide. */
        plan->master_port = in->free_port;
        plan->port_is_free_pick = 1;
    } else {
        plan->master_port = 29500;
    }
    if (plan->nnodes > 1 && cli->endpoint_host[0]) {
        /* The nodes meet at --rdzv_endpoint when it is given (main.c). */
        snprintf(plan->master_addr, sizeof plan->master_addr, "%s", cli->endpoint_host);
        plan->master_port = cli->endpoint_port;
    } else if (cli->endpoint_host[0] && cli->endpoint_port_given && !cli->standalone &&
               strcmp(cli->rdzv_backend, "static") == 0) {
        /* One node: torchrun's static rendezvous makes HOST:PORT the workers' master */
        snprintf(plan->master_addr, sizeof plan->master_addr, "%s", cli->endpoint_host);
        plan->master_port = cli->endpoint_port;
        plan->port_is_free_pick = 0;
    }
    if (plan->nnodes > 1 && (rc = rdzv_ports(plan, cli, err)) < 0)
        return rc;
    plan->omp_warning = in->omp_threads == NULL && plan->nproc > 1;
    snprintf(plan->derived, sizeof plan->derived, "%s", cli->derived);
    snprintf(plan->omp_threads, sizeof plan->omp_threads, "%s",
             in->omp_threads ? in->omp_threads : (plan->nproc > 1 ? "1" : ""));
    snprintf(plan->nccl_async, sizeof plan->nccl_async, "%s",
             in->nccl_async ? in->nccl_async : "1");

    plan->workers = calloc((size_t)plan->nproc, sizeof *plan->workers);
    if (plan->workers == NULL)
        return mgpu_err_set(err, -ENOMEM, "out of memory for %d workers", plan->nproc);
    build_vars(plan);
    plan->numa_mode = cli->numa_binding;
    if ((rc = bind_numa(plan, in, err)) < 0)
        return rc;
    return build_argv(plan, cli, in, err);
}

void mgpu_plan_free(mgpu_plan_t *plan)
{
    if (plan->workers == NULL)
        return;
    for (int k = 0; k < plan->nproc; k++) {
        char **a = plan->workers[k].argv;
        for (int i = 0; a != NULL && a[i] != NULL; i++)
            free(a[i]);
        free(a);
        free(plan->workers[k].env);
    }
    free(plan->workers);
    plan->workers = NULL;
}

/* Whether the environment entry e ("KEY=VALUE") is one that worker w's plan or
 * mgpu_plan_env's own three set. Runs for every entry of environ, for every worker, before its
 * fork: a first byte and a length are compared before any string. */
static int overridden(const mgpu_worker_plan_t *w, const char *e)
{
    static const struct {
        const char *key;
        size_t len;
    } own[] = {
        {"TORCHELASTIC_RESTART_COUNT", 26}, {"MGPU_ATTEMPT", 12}, {"TORCHELASTIC_ERROR_FILE", 23}};
    size_t klen = (size_t)(strchrnul(e, '=') - e);

    for (size_t i = 0; i < sizeof own / sizeof *own; i++)
        if (klen == own[i].len && memcmp(e, own[i].key, klen) == 0)
            return 1;
    for (int i = 0; i < w->nvars; i++) {
        const char *v = w->env + w->var_off[i];
        if (v[0] == e[0] && strncmp(v, e, klen) == 0 && v[klen] == '=')
            return 1;
    }
    return 0;
}

char **mgpu_plan_env(const mgpu_plan_t *plan, int k, char **environ_, int attempt, int restarts,
                     const char *error_file)
{
    const mgpu_worker_plan_t *w = &plan->workers[k];
    size_t nenv = 0, bytes = 128 + strlen(error_file), n = 0;
    char **out, *p;

    if (w->env_oom)
        return NULL;
    for (char **e = environ_; e && *e; e++)
        nenv++;
    out = malloc((nenv + (size_t)w->nvars + 4) * sizeof *out + bytes);
    if (out == NULL)
        return NULL;
    p = (char *)(out + nenv + (size_t)w->nvars + 4);
    /* Neither environ's strings nor the plan's are copied: both outlive the exec. */
    for (char **e = environ_; e && *e; e++)
        if (!overridden(w, *e))
            out[n++] = *e;
    for (int i = 0; i < w->nvars; i++)
        out[n++] = w->env + w->var_off[i];
    out[n++] = p;
    p += sprintf(p, "TORCHELASTIC_RESTART_COUNT=%d", restarts) + 1;
    out[n++] = p;
    p += sprintf(p, "MGPU_ATTEMPT=%d", attempt) + 1;
    out[n++] = p;
    sprintf(p, "TORCHELASTIC_ERROR_FILE=%s", error_file);
    out[n] = NULL;
    return out;
}
