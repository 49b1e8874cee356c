/* cli.h - mgpu-launch's command line: torchrun's options (both --a_b and --a-b spellings,
 * --opt=v and --opt v, unique prefixes as argparse allows, PET_<NAME> environment defaults)
 * plus mgpu's own. Parsing is pure: it reads argv and an environment lookup, and fills a
 * plain struct; nothing is started or resolved against the machine here. */
#ifndef MGPU_CLI_H
#define MGPU_CLI_H

#include <stdio.h> /* FILE */

#include "error.h"  /* mgpu_err_t */
#include "numa.h"   /* mgpu_numa_mode_t */
#include "output.h" /* mgpu_line_filters_t */

#define MGPU_MAX_LOCAL 1024        /* workers per node; more is refused as absurd */
#define MGPU_CLI_MAX_TOKEN_ARGS 8  /* --rdzv_token given more often is refused */
#define MGPU_CLI_MAX_LOCAL_ARGS 64 /* argv entries of mgpu_cli_hosts_local options */

/* torchrun's -r/-t value: one value for every local rank, or a map "0:1,1:2". Bit 1 is
 * stdout, bit 2 is stderr. */
typedef struct mgpu_std_spec {
    int all;  /* value for ranks absent from the map */
    int nmap; /* entries in the map */
    int rank[MGPU_MAX_LOCAL];
    int value[MGPU_MAX_LOCAL];
} mgpu_std_spec_t;

typedef enum { MGPU_DRY_NONE = 0, MGPU_DRY_TEXT, MGPU_DRY_JSON } mgpu_dry_t;

typedef struct mgpu_cli {
    char nproc[32]; /* "N", "gpu", "cpu" or "auto" (resolved by the plan) */
    int nnodes_min, nnodes_max;
    int node_rank;
    char master_addr[256];
    int master_port;  /* -1: not given */
    int master_given; /* --master_addr or --master_port (or their PET_ defaults) was given */
    int standalone;
    char rdzv_backend[32];
    char rdzv_endpoint[300];
    char rdzv_id[128];
    char rdzv_conf[512];
    char rdzv_token[128]; /* shared secret of the store ("" = generated on one node) */
    char *token_args[MGPU_CLI_MAX_TOKEN_ARGS]; /* --rdzv_token values inside argv (scrubbed) */
    int n_token_args;
    double join_timeout;      /* from --rdzv_conf join_timeout (default 600) */
    int join_timeout_given;   /* join_timeout was in --rdzv_conf */
    double rdzv_timeout;      /* from --rdzv_conf timeout, -1 unset (static rendezvous limit) */
    double last_call_timeout; /* from --rdzv_conf last_call_timeout (default 30) */
    double heartbeat_timeout; /* from --rdzv_conf heartbeat_timeout (default 15): a silent node is
                                 lost */
    int is_host;              /* from --rdzv_conf is_host: -1 unset, 0, 1 */
    char endpoint_host[256];  /* --rdzv_endpoint split: host ("" = none) */
    int endpoint_port;        /* and port (default 29400) */
    int endpoint_port_given;  /* the port was in --rdzv_endpoint */
    int max_restarts;
    double monitor_interval; /* accepted for compatibility; supervision is event-driven */
    char start_method[16];
    char role[64];
    char log_dir[1024]; /* "" : not given */
    mgpu_std_spec_t redirects, tee;
    mgpu_line_filters_t dup_filters[2]; /* --duplicate_std{out,err}_filters */
    int nfilter;                        /* --local_ranks_filter entries; 0 = every rank */
    int filter[MGPU_MAX_LOCAL];
    int no_python, module, run_path;
    int legacy_local_rank;  /* 1: --local_rank=N (torch 1.x's launch), 2: --local-rank=N (2.x) */
    int virtual_local_rank; /* LOCAL_RANK=0, CUDA_VISIBLE_DEVICES the worker's GPU alone */
    char local_addr[256];
    char prefix_template[256]; /* --log_line_prefix_template; "" = default */
    int no_prefix;
    int tty; /* --tty 1, --no_tty -1, 0: a pty when the launcher's output is a terminal */
    mgpu_dry_t dry_run;
    double grace_period;
    char signals[256];               /* --signals_to_handle, checked: "SIGTERM,SIGINT,..." */
    mgpu_numa_mode_t numa_binding;   /* --numa_binding, MGPU_NUMA_OFF when not given */
    unsigned long long stop_signals; /* bit (1 << N) for each signal N in that list */
    char summary[1024];
    int allow_gpu_sharing;
    int allow_multiple_launchers; /* several launchers on one node of a Slurm step */
    double stall_timeout;         /* --stall_timeout seconds, 0 = no stall detection */
    int stall_fail;               /* --stall_action fail */
    int quiet;
    int verbose;
    int show_help, show_version;
    unsigned long long given; /* bit (1 << option id) for every option set by argv or PET_ */
    char derived[512];        /* what was taken from Slurm or Open MPI, for --dry-run */
    char notes[1024];         /* lines for -v (parsing runs before the log level is set) */
    /* the worker program and its arguments (pointers into the caller's argv) */
    int prog_argc;
    char **prog_argv;
    /* several hosts over ssh (hosts.c, remote.c): "" when not given */
    char hostfile[1024];
    char hosts[8192];
    char include[1024], exclude[1024];
    char ssh[1024];
    char exports[2048];
    int watch_stdin; /* --watch_stdin: stop the job when stdin reaches its end */
    /* argv indexes of the options an ssh launch does not pass on (mgpu_cli_hosts_local) */
    int local_args[MGPU_CLI_MAX_LOCAL_ARGS];
    int n_local_args;
} mgpu_cli_t;

/* Names of the options that an ssh launch sets for each host (NULL-terminated; hosts.c). */
extern const char *const mgpu_cli_hosts_local[];

/* Reads the environment through getenv_fn (getenv in main; a table in tests). */
typedef const char *(*mgpu_getenv_fn)(const char *name);

/* Fills cli from argv (argv[0] is the launcher). Returns 0, or MGPU_E_USAGE with a one-line
 * message naming the option, the value and what was expected. */
int mgpu_cli_parse(mgpu_cli_t *cli, int argc, char **argv, mgpu_getenv_fn getenv_fn,
                   mgpu_err_t *err);

/* Overwrites every --rdzv_token value in the argv given to mgpu_cli_parse with "***", so that
 * /proc/PID/cmdline (readable by every user, and by ps) no longer shows it; processes forked
 * afterwards (the keeper) inherit the overwritten copy. Call after parsing, before forking. */
void mgpu_cli_scrub_token(mgpu_cli_t *cli);

/* 1 when the option named (underscore spelling, e.g. "nnodes") was given on the command line
 * or through its PET_ variable. */
int mgpu_cli_given(const mgpu_cli_t *cli, const char *name);

/* The value of spec for local rank lr. */
int mgpu_std_spec_get(const mgpu_std_spec_t *spec, int lr);

/* Parses torchrun's -r/-t syntax ("3", "0:1,1:2"). */
int mgpu_std_spec_parse(const char *s, mgpu_std_spec_t *spec, mgpu_err_t *err);

void mgpu_cli_usage(FILE *out);

#endif
