/* hosts.h - the hosts of a job started over ssh (`mgpu-launch --hostfile FILE` or `--hosts
 * h1:4,h2:4`), the slots kept by `--include` / `--exclude`, the environment every host gets
 * (`--export`, torchrun's and NCCL's prefixes, a `.mgpu_env` file) and the command each host
 * runs. Pure: it reads files and the environment given to it, starts nothing (remote.c does).
 * The formats are DeepSpeed's and Open MPI's hostfile (`host slots=N`, `#` comments), Horovod's
 * `-H` list and DeepSpeed's `NAME[:SLOT[,SLOT]][@NAME...]` selection. The caller owns every
 * struct and frees it with its _free function. */
#ifndef MGPU_HOSTS_H
#define MGPU_HOSTS_H

#include "cli.h"   /* mgpu_cli_t, mgpu_getenv_fn */
#include "error.h" /* mgpu_err_t */

#define MGPU_HOSTS_MAX 4096 /* hosts of one job; more is refused as a mistake */

typedef struct mgpu_host {
    char name[256];
    char origin[300]; /* where it was named: "FILE:LINE" or "--hosts" */
    int slots;        /* the slots the list gives (1 when it gives none) */
    int nsel;         /* slots kept, in sel[]; equal to slots when every slot is kept */
    int sel[MGPU_MAX_LOCAL];
} mgpu_host_t;

typedef struct mgpu_hosts {
    mgpu_host_t *v;
    int n;
} mgpu_hosts_t;

/* KEY=VALUE strings (malloc'd) to set on every host. */
typedef struct mgpu_hosts_env {
    char **kv;
    int n;
} mgpu_hosts_env_t;

/* What a launcher reading its token from stdin says first, on stderr: the launcher that
 * started it over ssh sends the token once every host has said it (remote.h). */
#define MGPU_HOSTS_READY_LINE "mgpu-launch: reading the store's token from stdin"

/* --rdzv_token_file -: the token is the first line of stdin (sent there by the launcher that
 * started this one over ssh, so that no command line shows it), after MGPU_HOSTS_READY_LINE on
 * stderr. out has len bytes. */
int mgpu_hosts_read_token(const char *what, char *out, size_t len, mgpu_err_t *err);

/* Reads a hostfile: one host a line, `HOST [slots=N] [max_slots=M]`, `#` to the end of a line
 * a comment, blank lines ignored. A malformed or repeated line is an MGPU_E_USAGE error naming
 * FILE:LINE. */
int mgpu_hosts_read_file(const char *path, mgpu_hosts_t *out, mgpu_err_t *err);

/* Parses Horovod's list "h1:4,h2,h3:2" (a host without :N has one slot). */
int mgpu_hosts_parse_list(const char *list, mgpu_hosts_t *out, mgpu_err_t *err);

/* Applies DeepSpeed's --include (only these hosts, or these slots of a host) or --exclude
 * (not these hosts, or not these slots); either may be NULL or "". Hosts left with no slot are
 * dropped; an unknown host or slot, or both options at once, is an MGPU_E_USAGE error. */
int mgpu_hosts_select(mgpu_hosts_t *h, const char *include, const char *exclude, mgpu_err_t *err);

void mgpu_hosts_free(mgpu_hosts_t *h);

/* The environment every host gets, in this order (a later one wins on the host): the
 * variables of getenv_fn's environment (the array environ) whose names start with NCCL_,
 * PYTHON, CUDA_, OMP_ or PET_ (but PET_ variables of the options the ssh launch sets itself
 * and the token's), each variable of exports ("A,B"; an unset one is an error), then the
 * KEY=VAL lines of env_file when it exists (NULL: none). A malformed line is an MGPU_E_USAGE
 * error naming FILE:LINE. */
int mgpu_hosts_env_collect(char **environ_, mgpu_getenv_fn getenv_fn, const char *exports,
                           const char *env_file, mgpu_hosts_env_t *out, mgpu_err_t *err);

void mgpu_hosts_env_free(mgpu_hosts_env_t *e);

/* What every host's launcher is told. */
typedef struct mgpu_hosts_job {
    const char *launcher; /* the mgpu-launch to run there (this one's absolute path) */
    const char *cwd;      /* the working directory there */
    const char *master_addr;
    int master_port;
    const char *nproc;      /* --nproc_per_node given to the local launcher, or NULL */
    const char *const *fwd; /* the user's options to pass on as they are */
    int nfwd;               /* how many */
    int own_prefix;         /* the user chose a prefix template or none: keep it */
    const char *summary;    /* --summary FILE: host 0's; the others' get ".nodeK" in it */
    char *const *prog_argv; /* the worker program and its arguments */
    int prog_argc;
    const mgpu_hosts_env_t *env;
} mgpu_hosts_job_t;

/* The shell command host k runs (what ssh passes to the host's shell), malloc'd; NULL when
 * memory runs out. The token is not in it: the launcher there reads it from its stdin. */
char *mgpu_hosts_command(const mgpu_hosts_t *h, int k, const mgpu_hosts_job_t *job);

/* Appends s to buf (of len bytes, at *used) quoted for a POSIX shell. Returns 0, or -1 when
 * it does not fit. */
int mgpu_hosts_quote(char *buf, size_t len, size_t *used, const char *s);

#endif
