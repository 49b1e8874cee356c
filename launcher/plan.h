/* plan.h - who runs where: from the parsed command line, the devices and this node's facts,
 * decide every worker's ranks, device, environment and command. Deciding starts nothing;
 * --dry-run prints exactly what would be started.
 *
 * Ownership: mgpu_plan_build allocates the workers' argv and variables inside the plan;
 * mgpu_plan_free releases them. Strings handed in through mgpu_plan_input_t are copied. */
#ifndef MGPU_PLAN_H
#define MGPU_PLAN_H

#include <stdio.h> /* FILE */

#include "cli.h"     /* mgpu_cli_t */
#include "devices.h" /* mgpu_gpu_list_t, mgpu_visible_t */
#include "numa.h"    /* cpu_set_t, mgpu_numa_mode_t */
#include "error.h"   /* mgpu_err_t */
#include "pages.h"   /* mgpu_pages_t */
#include "rdzv.h"    /* mgpu_rdzv_world_t, mgpu_rdzv_opts_t */
#include "version.h" /* MGPU_VERSION */

#define MGPU_MAX_VARS 40

/* What the plan needs from the machine, gathered by main (kept out so the plan is testable). */
typedef struct mgpu_plan_input {
    const char *cvd;         /* CUDA_VISIBLE_DEVICES, NULL when unset */
    const char *sim_gpus;    /* MGPU_SIM_GPUS, NULL when unset */
    const char *proc_root;   /* NULL: /proc */
    int cpu_count;           /* for --nproc_per_node=cpu|auto */
    int free_port;           /* used when one node and no --master_port */
    const char *worker_bin;  /* mgpu-worker next to mgpu-launch */
    const char *python;      /* $PYTHON_EXEC or "python3" */
    const char *omp_threads; /* OMP_NUM_THREADS, NULL when unset */
    const char *nccl_async;  /* TORCH_NCCL_ASYNC_ERROR_HANDLING, NULL when unset */
    const char *hostname;
    const char *run_id;            /* used with --standalone (a fresh random id) */
    const char *path_env;          /* PATH, to check that the program exists */
    const char *sys_root;          /* where sysfs is (MGPU_SYSFS_ROOT), NULL: /sys */
    const cpu_set_t *cpus_allowed; /* the launcher's own affinity, NULL: every CPU */
} mgpu_plan_input_t;

typedef struct mgpu_worker_plan {
    int local_rank, rank;
    int ordinal;   /* CUDA ordinal of this worker, -1 on the CPU */
    int physical;  /* physical GPU index, -1 on the CPU */
    int numa_node; /* --numa_binding: the NUMA node of its GPU, -1 when unknown or off */
    int bound;     /* --numa_binding: cpus is its CPU affinity */
    cpu_set_t cpus;
    char numa_why[400]; /* --numa_binding and not bound: why */
    /* What the launcher sets, the rest being inherited: nvars strings "KEY=VALUE" at
     * env + var_off[i] (one small buffer a worker, rebuilt in place: the plan is written again
     * after the keeper is forked, when every page it touches is copied) */
    int nvars;
    unsigned var_off[MGPU_MAX_VARS];
    char *env;
    size_t env_len, env_cap;
    int env_oom; /* a variable did not fit (out of memory): mgpu_plan_env says so */
    char **argv; /* NULL-terminated */
} mgpu_worker_plan_t;

/* Where the launchers meet: the command line's rendezvous options, as the plan keeps them for
 * mgpu_plan_rdzv_opts. */
typedef struct mgpu_plan_rdzv {
    int nnodes_min, nnodes_max;
    int node_rank;
    int is_host;         /* from --rdzv_conf is_host: -1 unset, 0, 1 */
    int c10d;            /* --rdzv_backend c10d: ranks in arrival order */
    double join_timeout; /* seconds */
    double last_call_timeout;
    double heartbeat_timeout; /* a node silent this long is lost */
    char local_addr[256];     /* --local_addr, "" = the hostname */
    char token[128];          /* --rdzv_token, "" = generated on one node */
    char endpoint_host[256];  /* --rdzv_endpoint's host, "" = none */
    int endpoint_port;
    char master_addr[256]; /* --master_addr as given (the plan's own may be the endpoint) */
    int master_port;       /* --master_port as given, -1 = none */
} mgpu_plan_rdzv_t;

/* What the supervisor does with the workers' output, and what the run reports. */
typedef struct mgpu_plan_output {
    mgpu_std_spec_t redirects, tee; /* -r / -t: which streams go to files, which to both */
    mgpu_line_filters_t dup[2];     /* --duplicate_std{out,err}_filters */
    int nfilter;                    /* --local_ranks_filter entries; 0 = every rank shown */
    int filter[MGPU_MAX_LOCAL];
    int no_prefix;
    char prefix_template[256]; /* "" = "[rank${rank}]:" */
    char log_dir[1024];        /* "" = a temporary folder, removed unless logs were kept */
    char summary[1024];        /* --summary FILE, "" = none */
    int quiet, verbose;
    int tty; /* workers' output on pseudo-terminals: 1 --tty, -1 --no_tty, 0 when a terminal */
} mgpu_plan_output_t;

typedef struct mgpu_plan {
    int nproc;  /* local workers */
    int nnodes; /* nodes (the static rendezvous takes the maximum) */
    int node_rank;
    int world_size;
    int base_rank;         /* global rank of local rank 0 */
    int role_base_rank;    /* ROLE_RANK of local rank 0: counted among nodes of this role */
    int role_world_size;   /* workers of this role in the world */
    int round;             /* the attempt the world is for (elastic: its rendezvous round) */
    int restarts;          /* failures restarted from before it (TORCHELASTIC_RESTART_COUNT) */
    char world_hosts[512]; /* the nodes' hosts in node rank order */
    int rdzv_port;         /* several nodes: the port the launchers' store listens on */
    int master_port;
    int port_is_free_pick;  /* 1 when the launcher chose it */
    int omp_warning;        /* print torchrun's OMP_NUM_THREADS banner */
    int sharing;            /* --allow_gpu_sharing took effect */
    int virtual_local_rank; /* --virtual_local_rank: LOCAL_RANK=0, one GPU visible to each */
    int legacy_local_rank;  /* --legacy_local_rank: "--local_rank=N" (1) or "--local-rank=N" (2)
                               before the user's args */
    int max_restarts;
    double grace_period;             /* seconds from the stop signal to SIGKILL */
    unsigned long long stop_signals; /* --signals_to_handle: bit 1 << N stops the job on N */
    char signals[256];               /* the same list by name (TORCHELASTIC_SIGNALS_TO_HANDLE) */
    double stall_timeout;            /* --stall_timeout seconds, 0 = off */
    int stall_fail;                  /* --stall_action fail */
    const mgpu_pages_t *pages;       /* the workers' progress pages (not owned), NULL = none */
    mgpu_dry_t dry_run;              /* --dry-run: print the plan, start nothing */
    mgpu_numa_mode_t numa_mode;      /* --numa_binding */
    char numa_warning[2048];         /* workers it could not bind, and why, one a line */
    mgpu_plan_rdzv_t rdzv;
    mgpu_plan_output_t output;
    char master_addr[256];
    char run_id[128];
    char role[64];
    char hostname[256];
    char entrypoint[1024]; /* the program as the user named it (report title) */
    char exe[4096];        /* what every worker executes: argv[0] resolved in PATH, once */
    char python[4096];     /* the Python interpreter it is, resolved; "" for other workers */
    char cpu_reason[700];  /* why the workers run on the CPU, when they do */
    char omp_threads[32];  /* OMP_NUM_THREADS for the workers, "" for none */
    char derived[512];     /* options taken from Slurm or Open MPI (cli.derived) */
    char nccl_async[32];   /* TORCH_NCCL_ASYNC_ERROR_HANDLING */
    char store_addr[256];  /* the launchers' store, for MGPU_STORE_*; port 0 = none yet */
    int store_port;
    char store_token[80];
    mgpu_gpu_list_t gpus;
    mgpu_visible_t vis;
    mgpu_worker_plan_t *workers;
} mgpu_plan_t;

int mgpu_plan_build(mgpu_plan_t *plan, const mgpu_cli_t *cli, const mgpu_plan_input_t *in,
                    mgpu_err_t *err);
void mgpu_plan_free(mgpu_plan_t *plan);

/* The rendezvous options for this plan: where the store is served and by whom, who meets
 * whom. The strings point into plan, which must outlive ro. */
void mgpu_plan_rdzv_opts(const mgpu_plan_t *plan, mgpu_rdzv_opts_t *ro);
/* Connections the store may see at most: two a launcher, one or two a worker, nodes alike in
 * size, and room to spare (capped at 65536). */
int mgpu_plan_max_conns(const mgpu_plan_t *plan);

/* After the rendezvous: the world as the nodes agreed it (ranks, MASTER_ADDR/PORT, the store)
 * replaces the static guess of mgpu_plan_build in every worker's variables. */
void mgpu_plan_set_world(mgpu_plan_t *plan, const mgpu_rdzv_world_t *world);

/* The workers' progress pages and heartbeat files (pages.h, owned by the caller, who keeps
 * them open for the run): every worker's MGPU_PROGRESS_FILE, MGPU_PROGRESS_SLOT and
 * MGPU_HEARTBEAT_FILE name them through /proc/<this process>/fd. */
void mgpu_plan_set_pages(mgpu_plan_t *plan, const mgpu_pages_t *pages);

/* The value the plan sets for key in worker k, or NULL. */
const char *mgpu_plan_var(const mgpu_plan_t *plan, int k, const char *key);
/* Variable i (0 <= i < workers[k].nvars) of worker k, "KEY=VALUE"; *klen: the key's length. */
const char *mgpu_plan_var_at(const mgpu_plan_t *plan, int k, int i, size_t *klen);

/* A worker's full environment for one attempt: environ minus what the plan sets, then the
 * plan's variables, then TORCHELASTIC_RESTART_COUNT (restarts: the failures restarted from),
 * MGPU_ATTEMPT (the attempt: every start of the group, restarts that admit new nodes
 * included, so the workers' store keys are new each time) and TORCHELASTIC_ERROR_FILE. The
 * result and the last three strings are one allocation: free() it; the other strings are
 * environ_'s and the plan's, which must outlive the worker's exec. NULL: out of memory. */
char **mgpu_plan_env(const mgpu_plan_t *plan, int k, char **environ_, int attempt, int restarts,
                     const char *error_file);

/* --dry-run (plan_print.c): text for people, or JSON (one object) for scripts. */
void mgpu_plan_print(const mgpu_plan_t *plan, FILE *out);
int mgpu_plan_print_json(const mgpu_plan_t *plan, FILE *out);

#endif
