/* cli.c - the option table and its parser. Grammar as torchrun's argparse: options first; the
 * first positional (or whatever follows "--") is the worker program, and everything after it
 * belongs to the worker unchanged. */
#include "cli.h"

#include <errno.h>    /* errno */
#include <fcntl.h>    /* open */
#include <math.h>     /* isfinite */
#include <stdio.h>    /* fprintf */
#include <stdlib.h>   /* strtol, strtod */
#include <string.h>   /* strcmp */
#include <sys/stat.h> /* fstat */
#include <unistd.h>   /* read, close */

#include "escape.h"   /* mgpu_escape_inplace */
#include "hosts.h"    /* mgpu_hosts_read_token, mgpu_cli_hosts_local */
#include "signames.h" /* mgpu_signames_parse */
#include "text.h"     /* mgpu_append_line, mgpu_trim, mgpu_edit_distance */

typedef enum {
    O_NPROC,
    O_NNODES,
    O_NODE_RANK,
    O_MASTER_ADDR,
    O_MASTER_PORT,
    O_STANDALONE,
    O_RDZV_BACKEND,
    O_RDZV_ENDPOINT,
    O_RDZV_ID,
    O_RDZV_CONF,
    O_RDZV_TOKEN,
    O_RDZV_TOKEN_FILE,
    O_MAX_RESTARTS,
    O_MONITOR,
    O_START_METHOD,
    O_EVENT_LOG_HANDLER,
    O_LOGS_SPECS,
    O_ROLE,
    O_LOG_DIR,
    O_REDIRECTS,
    O_TEE,
    O_FILTER,
    O_DUP_OUT,
    O_DUP_ERR,
    O_NO_PYTHON,
    O_MODULE,
    O_RUN_PATH,
    O_USE_ENV,
    O_LEGACY,
    O_VIRTUAL_LOCAL_RANK,
    O_LOCAL_ADDR,
    O_PREFIX_TEMPLATE,
    O_NO_PREFIX,
    O_TTY,
    O_NO_TTY,
    O_DRY_RUN,
    O_GRACE,
    O_SIGNALS,
    O_NUMA,
    O_SUMMARY,
    O_SHARING,
    O_MULTI_LAUNCHERS,
    O_STALL_TIMEOUT,
    O_STALL_ACTION,
    O_QUIET,
    O_VERBOSE,
    O_HELP,
    O_VERSION,
    O_HOSTFILE,
    O_HOSTS,
    O_INCLUDE,
    O_EXCLUDE,
    O_SSH,
    O_EXPORT,
    O_WATCH_STDIN,
} opt_id;

typedef enum { ARG_NONE, ARG_REQUIRED, ARG_OPTIONAL } arg_kind;

typedef struct opt {
    const char *name; /* underscore spelling; the dash spelling is accepted too */
    char shortopt;    /* 0 when none */
    arg_kind arg;
    opt_id id;
    const char *help;
} opt_t;

static const opt_t opts[] = {
    {"nproc_per_node", 0, ARG_REQUIRED, O_NPROC,
     "N|gpu|cpu|auto  workers on this node (default 1)"},
    {"nnodes", 0, ARG_REQUIRED, O_NNODES, "N|MIN:MAX  number of nodes (default 1)"},
    {"node_rank", 0, ARG_REQUIRED, O_NODE_RANK, "R  this node's rank (default 0)"},
    {"master_addr", 0, ARG_REQUIRED, O_MASTER_ADDR, "HOST  address of node 0 (default 127.0.0.1)"},
    {"master_port", 0, ARG_REQUIRED, O_MASTER_PORT,
     "PORT  default: a free port on one node, else 29500"},
    {"standalone", 0, ARG_NONE, O_STANDALONE, "single node, free port, random run id"},
    {"rdzv_backend", 0, ARG_REQUIRED, O_RDZV_BACKEND, "static|c10d (default static)"},
    {"rdzv_endpoint", 0, ARG_REQUIRED, O_RDZV_ENDPOINT, "HOST[:PORT]"},
    {"rdzv_id", 0, ARG_REQUIRED, O_RDZV_ID, "ID  run id (default none)"},
    {"rdzv_conf", 0, ARG_REQUIRED, O_RDZV_CONF,
     "k=v,...  join_timeout, last_call_timeout, heartbeat_timeout, is_host, timeout (others "
     "ignored)"},
    {"rdzv_token", 0, ARG_REQUIRED, O_RDZV_TOKEN,
     "SECRET  the store's token (several hosts); PET_RDZV_TOKEN or --rdzv_token_file keep it "
     "off the command line"},
    {"rdzv_token_file", 0, ARG_REQUIRED, O_RDZV_TOKEN_FILE,
     "PATH  read the store's token from PATH (mode 0600)"},
    {"max_restarts", 0, ARG_REQUIRED, O_MAX_RESTARTS,
     "N  group restarts before failing (default 0)"},
    {"monitor_interval", 0, ARG_REQUIRED, O_MONITOR, "SECONDS  accepted; mgpu does not poll"},
    {"start_method", 0, ARG_REQUIRED, O_START_METHOD, "spawn|fork|forkserver  accepted"},
    {"event_log_handler", 0, ARG_REQUIRED, O_EVENT_LOG_HANDLER,
     "null|console|dynamic_rendezvous  console: the launcher's events on stderr, as -v"},
    {"logs_specs", 0, ARG_REQUIRED, O_LOGS_SPECS,
     "default  torchrun's log layout (--log_dir), the one mgpu writes"},
    {"role", 0, ARG_REQUIRED, O_ROLE, "NAME  ROLE_NAME of the workers (default default)"},
    {"log_dir", 0, ARG_REQUIRED, O_LOG_DIR, "DIR  per-rank logs in torchrun's layout"},
    {"redirects", 'r', ARG_REQUIRED, O_REDIRECTS,
     "0-3|R:V,...  streams to files only (1 out, 2 err, 3 both)"},
    {"tee", 't', ARG_REQUIRED, O_TEE, "0-3|R:V,...  streams to files and console"},
    {"local_ranks_filter", 0, ARG_REQUIRED, O_FILTER,
     "R,R,...  console output of these local ranks only"},
    {"duplicate_stdout_filters", 0, ARG_REQUIRED, O_DUP_OUT,
     "S,...  also copy stdout lines that contain an S to filtered_stdout.log (,, a comma)"},
    {"duplicate_stderr_filters", 0, ARG_REQUIRED, O_DUP_ERR,
     "S,...  the same for stderr, to filtered_stderr.log"},
    {"no_python", 0, ARG_NONE, O_NO_PYTHON, "execute the program directly"},
    {"module", 'm', ARG_NONE, O_MODULE, "run the program as python -m MODULE"},
    {"run_path", 0, ARG_NONE, O_RUN_PATH, "run the program with python whatever its name"},
    {"use_env", 0, ARG_NONE, O_USE_ENV, "accepted (the environment is always set)"},
    {"legacy_local_rank", 0, ARG_OPTIONAL, O_LEGACY,
     "[=dash]  pass --local_rank=N first, as torch.distributed.launch (dash: --local-rank=N, "
     "as its 2.x releases)"},
    {"virtual_local_rank", 0, ARG_NONE, O_VIRTUAL_LOCAL_RANK,
     "LOCAL_RANK=0 in every worker, CUDA_VISIBLE_DEVICES its own GPU alone"},
    {"local_addr", 0, ARG_REQUIRED, O_LOCAL_ADDR, "HOST  this node's address"},
    {"log_line_prefix_template", 0, ARG_REQUIRED, O_PREFIX_TEMPLATE,
     "T  e.g. '[${role_name}${local_rank}]:'"},
    {"no_prefix", 0, ARG_NONE, O_NO_PREFIX, "worker lines without a prefix"},
    {"tty", 0, ARG_NONE, O_TTY, "workers' output on ptys (default: on a terminal)"},
    {"no_tty", 0, ARG_NONE, O_NO_TTY, "workers' output through pipes"},
    {"dry_run", 0, ARG_OPTIONAL, O_DRY_RUN, "[=json]  print the plan, start nothing"},
    {"grace_period", 0, ARG_REQUIRED, O_GRACE, "SECONDS  SIGTERM to SIGKILL (default 30)"},
    {"shutdown_timeout", 0, ARG_REQUIRED, O_GRACE, "SECONDS  same as --grace_period"},
    {"signals_to_handle", 0, ARG_REQUIRED, O_SIGNALS,
     "SIG,...  signals that stop the job, forwarded first (default " MGPU_SIGNAMES_DEFAULT ")"},
    {"numa_binding", 0, ARG_REQUIRED, O_NUMA,
     "node|socket|exclusive|core-complex  bind each worker to CPUs near its GPU"},
    {"summary", 0, ARG_REQUIRED, O_SUMMARY, "FILE  JSON report of the run"},
    {"allow_gpu_sharing", 0, ARG_NONE, O_SHARING,
     "more workers than GPUs: rank k on ordinal k mod n"},
    {"allow_multiple_launchers", 0, ARG_NONE, O_MULTI_LAUNCHERS,
     "several launchers per node (a Slurm step or mpirun with several tasks on a node)"},
    {"stall_timeout", 0, ARG_REQUIRED, O_STALL_TIMEOUT,
     "SECONDS  report a rank without progress for SECONDS (default 0: off)"},
    {"stall_action", 0, ARG_REQUIRED, O_STALL_ACTION,
     "report|fail  after a stall report, go on or stop the group (default report)"},
    {"quiet", 'q', ARG_NONE, O_QUIET, "only errors from the launcher"},
    {"verbose", 'v', ARG_NONE, O_VERBOSE, "the launcher's info messages"},
    {"help", 'h', ARG_NONE, O_HELP, "this help"},
    {"version", 0, ARG_NONE, O_VERSION, "print the version"},
    {"hostfile", 0, ARG_REQUIRED, O_HOSTFILE,
     "FILE  one launcher per host over ssh; lines 'HOST slots=N' (launcher/README.md)"},
    {"hosts", 0, ARG_REQUIRED, O_HOSTS, "H1:N,H2:N  the same from a list"},
    {"include", 0, ARG_REQUIRED, O_INCLUDE, "H1[:S,S]@H2  only these hosts or slots"},
    {"exclude", 0, ARG_REQUIRED, O_EXCLUDE, "H1[:S,S]@H2  not these hosts or slots"},
    {"ssh", 0, ARG_REQUIRED, O_SSH, "CMD  the ssh command (default ssh)"},
    {"export", 0, ARG_REQUIRED, O_EXPORT, "VAR,...  variables set on every host"},
    {"watch_stdin", 0, ARG_NONE, O_WATCH_STDIN, "stop the job when stdin closes (as SIGHUP)"},
};

#define NOPTS (sizeof opts / sizeof opts[0])

static int parse_long(const char *what, const char *s, long min, long max, long *out,
                      mgpu_err_t *err)
{
    char *end;
    long v;

    errno = 0;
    v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || errno != 0 || v < min || v > max)
        return mgpu_err_set(err, MGPU_E_USAGE, "%s='%s': expected an integer from %ld to %ld", what,
                            s, min, max);
    *out = v;
    return 0;
}

static int parse_seconds(const char *what, const char *s, double min, double max, double *out,
                         mgpu_err_t *err)
{
    char *end;
    double v;

    errno = 0;
    v = strtod(s, &end);
    if (*s == '\0' || *end != '\0' || errno != 0 || !isfinite(v) || v < min || v > max)
        return mgpu_err_set(err, MGPU_E_USAGE, "%s='%s': expected seconds from %g to %g", what, s,
                            min, max);
    *out = v;
    return 0;
}

static int copy_str(const char *what, char *dst, size_t len, const char *s, mgpu_err_t *err)
{
    if (strlen(s) >= len)
        return mgpu_err_set(err, MGPU_E_USAGE, "%s: value longer than %zu characters", what,
                            len - 1);
    memcpy(dst, s, strlen(s) + 1);
    return 0;
}

int mgpu_std_spec_parse(const char *s, mgpu_std_spec_t *spec, mgpu_err_t *err)
{
    const char *p = s;

    memset(spec, 0, sizeof *spec);
    if (s[0] >= '0' && s[0] <= '3' && s[1] == '\0') {
        spec->all = s[0] - '0';
        return 0;
    }
    while (*p) {
        long r = 0;
        int digits = 0;
        while (*p >= '0' && *p <= '9' && digits < 5) {
            r = r * 10 + (*p++ - '0');
            digits++;
        }
        if (digits == 0 || *p != ':' || p[1] < '0' || p[1] > '3' || (p[2] != ',' && p[2] != '\0') ||
            spec->nmap >= MGPU_MAX_LOCAL)
            return mgpu_err_set(err, MGPU_E_USAGE,
                                "'%s': expected 0, 1, 2 or 3 (1 stdout, 2 stderr, 3 both) or a map "
                                "of local rank to value like 0:1,1:2",
                                s);
        spec->rank[spec->nmap] = (int)r;
        spec->value[spec->nmap++] = p[1] - '0';
        p += 2;
        if (*p == ',') {
            p++;
            if (*p == '\0')
                return mgpu_err_set(err, MGPU_E_USAGE, "'%s': trailing comma", s);
        }
    }
    if (spec->nmap == 0)
        return mgpu_err_set(err, MGPU_E_USAGE, "'%s': expected 0, 1, 2 or 3, or a map like 0:1,1:2",
                            s);
    return 0;
}

void mgpu_cli_scrub_token(mgpu_cli_t *cli)
{
    for (int i = 0; i < cli->n_token_args; i++) {
        char *p = cli->token_args[i];
        size_t n = strlen(p);
        /* "***" then NULs: /proc/PID/cmdline shows neither the token nor its length */
        memset(p, 0, n);
        memcpy(p, "***", n < 3 ? n : 3);
    }
    cli->n_token_args = 0;
}

int mgpu_cli_given(const mgpu_cli_t *cli, const char *name)
{
    for (size_t i = 0; i < NOPTS; i++)
        if (strcmp(opts[i].name, name) == 0)
            return (cli->given >> opts[i].id) & 1;
    return 0;
}

int mgpu_std_spec_get(const mgpu_std_spec_t *spec, int lr)
{
    for (int i = 0; i < spec->nmap; i++)
        if (spec->rank[i] == lr)
            return spec->value[i];
    return spec->all;
}

static int parse_nnodes(const char *what, const char *v, mgpu_cli_t *cli, mgpu_err_t *err)
{
    char buf[64];
    char *colon;
    long lo, hi;
    int rc;

    if (copy_str(what, buf, sizeof buf, v, err) < 0)
        return MGPU_E_USAGE;
    colon = strchr(buf, ':');
    if (colon == NULL) {
        rc = parse_long(what, buf, 1, 100000, &lo, err);
        if (rc < 0)
            return rc;
        cli->nnodes_min = cli->nnodes_max = (int)lo;
        return 0;
    }
    *colon = '\0';
    if (strchr(colon + 1, ':') != NULL)
        return mgpu_err_set(err, MGPU_E_USAGE, "%s='%s': expected N or MIN:MAX", what, v);
    if (parse_long(what, buf, 1, 100000, &lo, err) < 0 ||
        parse_long(what, colon + 1, 1, 100000, &hi, err) < 0)
        return mgpu_err_set(err, MGPU_E_USAGE,
                            "%s='%s': expected N or MIN:MAX with 1 <= MIN <= MAX <= 100000", what,
                            v);
    if (lo > hi)
        return mgpu_err_set(err, MGPU_E_USAGE, "%s='%s': MIN (%ld) is larger than MAX (%ld)", what,
                            v, lo, hi);
    cli->nnodes_min = (int)lo;
    cli->nnodes_max = (int)hi;
    return 0;
}

static int parse_filter(const char *what, const char *v, mgpu_cli_t *cli, mgpu_err_t *err)
{
    char buf[4096], *save = NULL;

    if (copy_str(what, buf, sizeof buf, v, err) < 0)
        return MGPU_E_USAGE;
    cli->nfilter = 0;
    if (buf[0] == '\0')
        return 0;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        long r;
        if (parse_long(what, tok, 0, MGPU_MAX_LOCAL - 1, &r, err) < 0)
            return mgpu_err_set(err, MGPU_E_USAGE,
                                "%s='%s': expected local ranks separated by commas, like 0,2", what,
                                v);
        if (cli->nfilter < MGPU_MAX_LOCAL)
            cli->filter[cli->nfilter++] = (int)r;
    }
    return 0;
}

/* "host", "host:port", "[v6addr]:port"; torchrun's c10d default port is 29400. */
static int parse_endpoint(const char *what, const char *v, mgpu_cli_t *cli, mgpu_err_t *err)
{
    char buf[300];
    const char *host = buf, *port = NULL;
    long p = 29400;

    if (copy_str(what, cli->rdzv_endpoint, sizeof cli->rdzv_endpoint, v, err) < 0 ||
        copy_str(what, buf, sizeof buf, v, err) < 0)
        return MGPU_E_USAGE;
    if (buf[0] == '[') {
        char *close = strchr(buf, ']');
        if (close == NULL || (close[1] != '\0' && close[1] != ':'))
            return mgpu_err_set(err, MGPU_E_USAGE, "%s='%s': expected HOST[:PORT]", what, v);
        *close = '\0';
        host = buf + 1;
        port = close[1] == ':' ? close + 2 : NULL;
    } else {
        char *colon = strrchr(buf, ':');
        if (colon != NULL && strchr(buf, ':') == colon) {
            *colon = '\0';
            port = colon + 1;
        }
    }
    if (*host == '\0')
        return mgpu_err_set(err, MGPU_E_USAGE, "%s='%s': expected HOST[:PORT]", what, v);
    if (port != NULL && parse_long(what, port, 0, 65535, &p, err) < 0)
        return mgpu_err_set(err, MGPU_E_USAGE, "%s='%s': the port must be 0 to 65535", what, v);
    snprintf(cli->endpoint_host, sizeof cli->endpoint_host, "%s", host);
    cli->endpoint_port = (int)p;
    cli->endpoint_port_given = port != NULL;
    return 0;
}

/* Strips surrounding spaces and one pair of matching quotes (' or "): a value quoted twice
 * by a wrapper script, or PyTorch's own test, arrives with literal quotes. */
static char *unquote(char *s)
{
    size_t n;

    s = mgpu_trim(s);
    n = strlen(s);
    if (n >= 2 && (s[0] == '\'' || s[0] == '"') && s[n - 1] == s[0]) {
        s[n - 1] = '\0';
        s++;
    }
    return s;
}

/* torchrun's --rdzv_conf: "join_timeout=600,last_call_timeout=30,is_host=1,...". Like torchrun,
 * keys that this launcher has no use for (read_timeout, close_timeout, store_type, use_libuv,
 * ...) are passed over, and said so with -v; an entry without "=", an empty key or an empty
 * value is an error. timeout is the static rendezvous's time limit, as in torchrun (where it is
 * the agent store's timeout, 900 s by default). */
static int parse_rdzv_conf(const char *what, const char *v, mgpu_cli_t *cli, mgpu_err_t *err)
{
    char buf[512], kwhat[160], *save = NULL, *all;

    snprintf(buf, sizeof buf, "%s", v);
    all = unquote(buf);
    for (char *tok = strtok_r(all, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *kv = unquote(tok), *eq = strchr(kv, '='), *val;
        long n;
        if (eq == NULL)
            return mgpu_err_set(err, MGPU_E_USAGE, "%s: '%s' is not KEY=VALUE", what, kv);
        *eq = '\0';
        kv = unquote(kv);
        val = unquote(eq + 1);
        if (*kv == '\0')
            return mgpu_err_set(err, MGPU_E_USAGE,
                                "%s: '=%s' has an empty key (expected KEY=VALUE)", what, val);
        if (*val == '\0')
            return mgpu_err_set(err, MGPU_E_USAGE, "%s: '%s' has no value (expected %s=VALUE)",
                                what, kv, kv);
        /* messages name the key: "--rdzv_conf: timeout='abc'", not just the value */
        snprintf(kwhat, sizeof kwhat, "%s: %s", what, kv);
        if (strcmp(kv, "join_timeout") == 0) {
            if (parse_seconds(kwhat, val, 0.001, 1e7, &cli->join_timeout, err) < 0)
                return MGPU_E_USAGE;
            cli->join_timeout_given = 1;
        } else if (strcmp(kv, "last_call_timeout") == 0) {
            if (parse_seconds(kwhat, val, 0.0, 1e7, &cli->last_call_timeout, err) < 0)
                return MGPU_E_USAGE;
        } else if (strcmp(kv, "timeout") == 0) {
            if (parse_seconds(kwhat, val, 0.001, 1e7, &cli->rdzv_timeout, err) < 0)
                return MGPU_E_USAGE;
        } else if (strcmp(kv, "heartbeat_timeout") == 0) {
            if (parse_seconds(kwhat, val, 0.1, 1e6, &cli->heartbeat_timeout, err) < 0)
                return MGPU_E_USAGE;
        } else if (strcmp(kv, "is_host") == 0) {
            if (strcmp(val, "true") == 0 || strcmp(val, "True") == 0)
                cli->is_host = 1;
            else if (strcmp(val, "false") == 0 || strcmp(val, "False") == 0)
                cli->is_host = 0;
            else if (parse_long(kwhat, val, 0, 1, &n, err) == 0)
                cli->is_host = (int)n;
            else
                return mgpu_err_set(err, MGPU_E_USAGE, "%s: is_host='%s': expected 1 or 0", what,
                                    val);
        } else {
            mgpu_append_line(cli->notes, sizeof cli->notes,
                             "rdzv_conf: ignoring %s=%s (not used by mgpu)", kv, val);
        }
    }
    return 0;
}

/* 1 when s holds a control byte: no host name or run id does, and such a value would travel
 * raw into later messages, file names and store keys. */
static int has_control(const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p < 0x20 || *p == 0x7f)
            return 1;
    return 0;
}

/* Flags from the environment read as torchrun's check_env: an integer, non-zero is true. */
static int parse_flag_env(const char *what, const char *v, int *out, mgpu_err_t *err)
{
    long n;
    if (parse_long(what, v, -1000000, 1000000, &n, err) < 0)
        return mgpu_err_set(err, MGPU_E_USAGE, "%s='%s': expected 1 or 0", what, v);
    *out = n != 0;
    return 0;
}

/* --rdzv_token_file: the token is the file's first line. A file that others can read gives
 * the secret away as surely as the command line would, so it is refused, as ssh refuses a
 * private key of mode 0644. */
static int read_token_file(const char *what, const char *path, mgpu_cli_t *cli, mgpu_err_t *err)
{
    char buf[sizeof cli->rdzv_token + 2];
    struct stat st;
    ssize_t n = 0, r;
    int fd;

    if (strcmp(path, "-") == 0) /* from the launcher that started this one over ssh */
        return mgpu_hosts_read_token(what, cli->rdzv_token, sizeof cli->rdzv_token, err);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return mgpu_err_set(err, MGPU_E_USAGE, "%s: open(%s): %s", what, path, strerror(errno));
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return mgpu_err_set(err, MGPU_E_USAGE, "%s: %s is not a regular file", what, path);
    }
    if (st.st_mode & (S_IRGRP | S_IROTH)) {
        close(fd);
        return mgpu_err_set(err, MGPU_E_USAGE,
                            "%s: %s is readable by others (mode %04o); chmod 600 %s", what, path,
                            (unsigned)(st.st_mode & 07777), path);
    }
    while ((size_t)n < sizeof buf - 1 &&
           ((r = read(fd, buf + n, sizeof buf - 1 - (size_t)n)) > 0 || (r < 0 && errno == EINTR)))
        n += r > 0 ? r : 0;
    close(fd);
    buf[n] = '\0';
    buf[strcspn(buf, "\r\n")] = '\0'; /* the first line, without its end */
    if (buf[0] == '\0')
        return mgpu_err_set(err, MGPU_E_USAGE,
                            "%s: %s is empty: expected the token on its first line", what, path);
    if (strlen(buf) >= sizeof cli->rdzv_token) {
        memset(buf, 0, sizeof buf);
        return mgpu_err_set(err, MGPU_E_USAGE, "%s: the token in %s is longer than %zu characters",
                            what, path, sizeof cli->rdzv_token - 1);
    }
    memcpy(cli->rdzv_token, buf, strlen(buf) + 1);
    memset(buf, 0, sizeof buf);
    return 0;
}

/* Applies one option. what names its source in messages ("--nproc_per_node" or
 * "PET_NPROC_PER_NODE"); v is NULL for a flag given on the command line. */
static int apply(mgpu_cli_t *cli, const opt_t *o, const char *what, const char *v, int from_env,
                 mgpu_err_t *err)
{
    long n;
    int rc = 0;

    cli->given |= 1ull << o->id;
    if (o->arg == ARG_NONE && from_env) {
        int on = 0;
        if (parse_flag_env(what, v, &on, err) < 0)
            return MGPU_E_USAGE;
        if (!on)
            return 0;
    }
    switch (o->id) {
    case O_NPROC:
        if (strcmp(v, "gpu") == 0 || strcmp(v, "cpu") == 0 || strcmp(v, "auto") == 0)
            return copy_str(what, cli->nproc, sizeof cli->nproc, v, err);
        if (parse_long(what, v, 1, MGPU_MAX_LOCAL, &n, err) < 0)
            return mgpu_err_set(err, MGPU_E_USAGE,
                                "%s='%s': expected a number of workers from 1 to %d, or gpu, cpu, "
                                "auto",
                                what, v, MGPU_MAX_LOCAL);
        snprintf(cli->nproc, sizeof cli->nproc, "%ld", n);
        return 0;
    case O_NNODES:
        return parse_nnodes(what, v, cli, err);
    case O_NODE_RANK:
        rc = parse_long(what, v, 0, 99999, &n, err);
        cli->node_rank = (int)n;
        return rc;
    case O_MASTER_ADDR:
        if (*v == '\0' || has_control(v))
            return mgpu_err_set(err, MGPU_E_USAGE, "%s='%s': expected a host name or address", what,
                                v);
        cli->master_given = 1;
        if (v[0] == '[') { /* [IPv6]: the address in the brackets */
            if (strlen(v) < 3 || v[strlen(v) - 1] != ']')
                return mgpu_err_set(err, MGPU_E_USAGE,
                                    "%s='%s': expected a host name or address, an IPv6 one "
                                    "bare or in brackets",
                                    what, v);
            rc = copy_str(what, cli->master_addr, sizeof cli->master_addr, v + 1, err);
            if (rc == 0)
                cli->master_addr[strlen(cli->master_addr) - 1] = '\0';
            return rc;
        }
        return copy_str(what, cli->master_addr, sizeof cli->master_addr, v, err);
    case O_MASTER_PORT:
        cli->master_given = 1;
        rc = parse_long(what, v, 0, 65535, &n, err);
        cli->master_port = (int)n;
        return rc;
    case O_STANDALONE:
        cli->standalone = 1;
        return 0;
    case O_RDZV_BACKEND:
        if (strcmp(v, "static") != 0 && strcmp(v, "c10d") != 0)
            return mgpu_err_set(err, MGPU_E_USAGE, "%s='%s': expected static or c10d", what, v);
        return copy_str(what, cli->rdzv_backend, sizeof cli->rdzv_backend, v, err);
    case O_RDZV_ENDPOINT:
        if (has_control(v))
            return mgpu_err_set(err, MGPU_E_USAGE, "%s='%s': expected HOST[:PORT]", what, v);
        return parse_endpoint(what, v, cli, err);
    case O_RDZV_TOKEN:
        return copy_str(what, cli->rdzv_token, sizeof cli->rdzv_token, v, err);
    case O_RDZV_TOKEN_FILE:
        return read_token_file(what, v, cli, err);
    case O_RDZV_ID:
        if (*v == '\0' || strchr(v, '/') != NULL || has_control(v))
            return mgpu_err_set(err, MGPU_E_USAGE,
                                "%s='%s': expected a non-empty id without '/' or control "
                                "characters",
                                what, v);
        return copy_str(what, cli->rdzv_id, sizeof cli->rdzv_id, v, err);
    case O_RDZV_CONF:
        if (copy_str(what, cli->rdzv_conf, sizeof cli->rdzv_conf, v, err) < 0)
            return MGPU_E_USAGE;
        return parse_rdzv_conf(what, v, cli, err);
    case O_MAX_RESTARTS:
        rc = parse_long(what, v, 0, 1000000, &n, err);
        cli->max_restarts = (int)n;
        return rc;
    case O_MONITOR:
        return parse_seconds(what, v, 0.0, 3600.0, &cli->monitor_interval, err);
    case O_START_METHOD:
        if (strcmp(v, "spawn") != 0 && strcmp(v, "fork") != 0 && strcmp(v, "forkserver") != 0)
            return mgpu_err_set(err, MGPU_E_USAGE, "%s='%s': expected spawn, fork or forkserver",
                                what, v);
        return copy_str(what, cli->start_method, sizeof cli->start_method, v, err);
    case O_EVENT_LOG_HANDLER:
        /* torchrun's handlers of its event records: null and dynamic_rendezvous drop them,
         * console logs them; the launcher's events are its info messages. */
        if (strcmp(v, "console") == 0)
            cli->verbose = 1;
        else if (strcmp(v, "null") != 0 && strcmp(v, "dynamic_rendezvous") != 0)
            return mgpu_err_set(err, MGPU_E_USAGE,
                                "%s='%s': expected null, console or dynamic_rendezvous", what, v);
        return 0;
    case O_LOGS_SPECS:
        if (strcmp(v, "default") != 0)
            return mgpu_err_set(err, MGPU_E_USAGE,
                                "%s='%s': expected default (torchrun's layout, which mgpu-launch "
                                "writes under --log_dir; other layouts are Python plug-ins)",
                                what, v);
        return 0;
    case O_ROLE:
        if (*v == '\0')
            return mgpu_err_set(err, MGPU_E_USAGE, "%s='': expected a role name", what);
        return copy_str(what, cli->role, sizeof cli->role, v, err);
    case O_LOG_DIR:
        if (*v == '\0')
            return mgpu_err_set(err, MGPU_E_USAGE, "%s='': expected a directory", what);
        return copy_str(what, cli->log_dir, sizeof cli->log_dir, v, err);
    case O_REDIRECTS:
    case O_TEE:
        rc = mgpu_std_spec_parse(v, o->id == O_TEE ? &cli->tee : &cli->redirects, err);
        if (rc < 0) {
            char msg[sizeof err->msg];
            snprintf(msg, sizeof msg, "%s", err->msg);
            return mgpu_err_set(err, rc, "%s=%s", what, msg);
        }
        return 0;
    case O_FILTER:
        return parse_filter(what, v, cli, err);
    case O_DUP_OUT:
    case O_DUP_ERR:
        if (mgpu_line_filters_parse(v, &cli->dup_filters[o->id == O_DUP_ERR]) < 0)
            return mgpu_err_set(err, MGPU_E_USAGE, "%s: value longer than %zu characters", what,
                                sizeof cli->dup_filters[0].buf - 2);
        return 0;
    case O_NO_PYTHON:
        cli->no_python = 1;
        return 0;
    case O_MODULE:
        cli->module = 1;
        return 0;
    case O_RUN_PATH:
        cli->run_path = 1;
        return 0;
    case O_USE_ENV:
        return 0;
    case O_LEGACY:
        if (v == NULL || strcmp(v, "underscore") == 0)
            cli->legacy_local_rank = 1;
        else if (strcmp(v, "dash") == 0)
            cli->legacy_local_rank = 2;
        else
            return mgpu_err_set(err, MGPU_E_USAGE, "%s='%s': expected underscore or dash", what, v);
        return 0;
    case O_VIRTUAL_LOCAL_RANK:
        cli->virtual_local_rank = 1;
        return 0;
    case O_LOCAL_ADDR:
        if (has_control(v))
            return mgpu_err_set(err, MGPU_E_USAGE, "%s='%s': expected a host name or address", what,
                                v);
        return copy_str(what, cli->local_addr, sizeof cli->local_addr, v, err);
    case O_PREFIX_TEMPLATE:
        return copy_str(what, cli->prefix_template, sizeof cli->prefix_template, v, err);
    case O_NO_PREFIX:
        cli->no_prefix = 1;
        return 0;
    case O_TTY:
        cli->tty = 1;
        return 0;
    case O_NO_TTY:
        cli->tty = -1;
        return 0;
    case O_DRY_RUN:
        if (v == NULL || strcmp(v, "text") == 0 || (from_env && strcmp(v, "1") == 0))
            cli->dry_run = MGPU_DRY_TEXT;
        else if (strcmp(v, "json") == 0)
            cli->dry_run = MGPU_DRY_JSON;
        else if (from_env && strcmp(v, "0") == 0)
            cli->dry_run = MGPU_DRY_NONE;
        else
            return mgpu_err_set(err, MGPU_E_USAGE, "%s='%s': expected text or json", what, v);
        return 0;
    case O_GRACE:
        return parse_seconds(what, v, 0.0, 86400.0, &cli->grace_period, err);
    case O_SIGNALS:
        return mgpu_signames_parse(what, v, &cli->stop_signals, cli->signals, sizeof cli->signals,
                                   err);
    case O_NUMA:
        if ((n = mgpu_numa_mode_parse(v)) < 0)
            return mgpu_err_set(err, MGPU_E_USAGE,
                                "%s='%s': expected node, socket, exclusive or core-complex", what,
                                v);
        cli->numa_binding = (mgpu_numa_mode_t)n;
        return 0;
    case O_SUMMARY:
        if (*v == '\0')
            return mgpu_err_set(err, MGPU_E_USAGE, "%s='': expected a file name", what);
        return copy_str(what, cli->summary, sizeof cli->summary, v, err);
    case O_SHARING:
        cli->allow_gpu_sharing = 1;
        return 0;
    case O_MULTI_LAUNCHERS:
        cli->allow_multiple_launchers = 1;
        return 0;
    case O_STALL_TIMEOUT:
        return parse_seconds(what, v, 0.0, 1e7, &cli->stall_timeout, err);
    case O_STALL_ACTION:
        if (strcmp(v, "report") == 0 || strcmp(v, "fail") == 0) {
            cli->stall_fail = v[0] == 'f';
            return 0;
        }
        return mgpu_err_set(err, MGPU_E_USAGE, "%s='%s': expected report or fail", what, v);
    case O_QUIET:
        cli->quiet = 1;
        return 0;
    case O_VERBOSE:
        cli->verbose = 1;
        return 0;
    case O_HELP:
        cli->show_help = 1;
        return 0;
    case O_VERSION:
        cli->show_version = 1;
        return 0;
    case O_HOSTFILE:
        return copy_str(what, cli->hostfile, sizeof cli->hostfile, v, err);
    case O_HOSTS:
        return copy_str(what, cli->hosts, sizeof cli->hosts, v, err);
    case O_INCLUDE:
        return copy_str(what, cli->include, sizeof cli->include, v, err);
    case O_EXCLUDE:
        return copy_str(what, cli->exclude, sizeof cli->exclude, v, err);
    case O_SSH:
        return copy_str(what, cli->ssh, sizeof cli->ssh, v, err);
    case O_EXPORT:
        return copy_str(what, cli->exports, sizeof cli->exports, v, err);
    case O_WATCH_STDIN:
        cli->watch_stdin = 1;
        return 0;
    }
    return 0;
}

/* Finds a long option by exact name or unique prefix, as argparse does; name is normalised
 * (dashes to underscores) and has no leading "--" and no "=value". */
static const opt_t *find_long(const char *name, const char *orig, mgpu_err_t *err)
{
    const opt_t *match = NULL;
    char cands[512] = "";
    int n = 0;

    for (size_t i = 0; i < NOPTS; i++)
        if (strcmp(opts[i].name, name) == 0)
            return &opts[i];
    for (size_t i = 0; i < NOPTS; i++)
        if (strncmp(opts[i].name, name, strlen(name)) == 0) {
            if (match != NULL && match->id == opts[i].id)
                continue; /* two spellings of one option are one candidate */
            size_t l = strlen(cands);
            snprintf(cands + l, sizeof cands - l, "%s--%s", n ? ", " : "", opts[i].name);
            match = &opts[i];
            n++;
        }
    if (n == 1)
        return match;
    if (n > 1) {
        mgpu_err_set(err, MGPU_E_USAGE, "ambiguous option %s: could match %s", orig, cands);
        return NULL;
    }
    /* the nearest spelling, where one is near: a letter off, swapped or missing */
    size_t best_d = 3;
    for (size_t i = 0; i < NOPTS; i++) {
        size_t d = mgpu_edit_distance(name, opts[i].name);
        if (d < best_d)
            best_d = d, match = &opts[i];
    }
    if (match != NULL)
        mgpu_err_set(err, MGPU_E_USAGE,
                     "unknown option %s (did you mean --%s? see mgpu-launch --help)", orig,
                     match->name);
    else
        mgpu_err_set(err, MGPU_E_USAGE, "unknown option %s (see mgpu-launch --help)", orig);
    return NULL;
}

static void defaults(mgpu_cli_t *cli)
{
    memset(cli, 0, sizeof *cli);
    snprintf(cli->nproc, sizeof cli->nproc, "1");
    cli->nnodes_min = cli->nnodes_max = 1;
    snprintf(cli->master_addr, sizeof cli->master_addr, "127.0.0.1");
    cli->master_port = -1;
    snprintf(cli->rdzv_backend, sizeof cli->rdzv_backend, "static");
    snprintf(cli->rdzv_id, sizeof cli->rdzv_id, "none");
    cli->monitor_interval = 0.1;
    snprintf(cli->start_method, sizeof cli->start_method, "spawn");
    snprintf(cli->role, sizeof cli->role, "default");
    cli->grace_period = 30.0;
    mgpu_signames_parse("", MGPU_SIGNAMES_DEFAULT, &cli->stop_signals, cli->signals,
                        sizeof cli->signals, NULL);
    cli->join_timeout = 600.0;
    cli->rdzv_timeout = -1.0;
    cli->last_call_timeout = 30.0;
    cli->heartbeat_timeout = 15.0;
    cli->is_host = -1;
    cli->endpoint_port = 29400;
}

/* Environment defaults: PET_<NAME> for every option but help and version. */
static int apply_env(mgpu_cli_t *cli, mgpu_getenv_fn getenv_fn, mgpu_err_t *err)
{
    for (size_t i = 0; i < NOPTS; i++) {
        char var[64] = "PET_";
        const char *v;

        if (opts[i].id == O_HELP || opts[i].id == O_VERSION)
            continue;
        for (size_t k = 0; opts[i].name[k] && k < 58; k++)
            var[4 + k] = (char)(opts[i].name[k] >= 'a' && opts[i].name[k] <= 'z'
                                    ? opts[i].name[k] - 'a' + 'A'
                                    : opts[i].name[k]);
        v = getenv_fn(var);
        if (v == NULL)
            continue;
        if (apply(cli, &opts[i], var, v, 1, err) < 0)
            return MGPU_E_USAGE;
    }
    return 0;
}

static int parse_args(mgpu_cli_t *cli, int argc, char **argv, mgpu_getenv_fn getenv_fn,
                      mgpu_err_t *err)
{
    int i;

    defaults(cli);
    if (getenv_fn != NULL && apply_env(cli, getenv_fn, err) < 0)
        return MGPU_E_USAGE;

    for (i = 1; i < argc; i++) {
        const char *arg = argv[i];
        const int first = i;
        const opt_t *o = NULL;
        const char *val = NULL;
        char what[128];

        if (strcmp(arg, "--") == 0) {
            i++;
            break;
        }
        if (arg[0] != '-' || arg[1] == '\0')
            break; /* the first positional: the worker program */
        if (arg[1] == '-') {
            char name[96];
            const char *eq = strchr(arg + 2, '=');
            size_t len = eq ? (size_t)(eq - arg - 2) : strlen(arg + 2);
            if (len == 0 || len >= sizeof name)
                return mgpu_err_set(err, MGPU_E_USAGE, "unknown option %s", arg);
            for (size_t k = 0; k < len; k++)
                name[k] = arg[2 + k] == '-' ? '_' : arg[2 + k];
            name[len] = '\0';
            o = find_long(name, arg, err);
            if (o == NULL)
                return MGPU_E_USAGE;
            snprintf(what, sizeof what, "--%s", o->name);
            if (eq != NULL)
                val = eq + 1;
        } else {
            for (size_t k = 0; k < NOPTS; k++)
                if (opts[k].shortopt == arg[1])
                    o = &opts[k];
            if (o == NULL)
                return mgpu_err_set(err, MGPU_E_USAGE, "unknown option %s (see mgpu-launch --help)",
                                    arg);
            snprintf(what, sizeof what, "-%c", o->shortopt);
            if (arg[2] != '\0')
                val = arg[2] == '=' ? arg + 3 : arg + 2;
        }
        if (o->arg == ARG_NONE && val != NULL)
            return mgpu_err_set(err, MGPU_E_USAGE, "%s takes no value (got '%s')", what, val);
        if (o->arg == ARG_REQUIRED && val == NULL) {
            if (i + 1 >= argc)
                return mgpu_err_set(err, MGPU_E_USAGE, "%s: missing value (%s)", what, o->help);
            /* argparse takes "--x" for the next option, not a value ("argument --log_dir:
             * expected one argument"): a forgotten value must not swallow the option after it.
             * "--role=--x" still gives such a value on purpose. */
            if (strncmp(argv[i + 1], "--", 2) == 0)
                return mgpu_err_set(err, MGPU_E_USAGE,
                                    "argument %s: expected one argument (%s), got the option '%s'; "
                                    "write %s=VALUE for a value that starts with --",
                                    what, o->help, argv[i + 1], what);
            val = argv[++i];
        }
        if (apply(cli, o, what, val, 0, err) < 0)
            return MGPU_E_USAGE;
        for (const char *const *l = mgpu_cli_hosts_local; *l; l++)
            for (int k = first; strcmp(*l, o->name) == 0 && k <= i; k++) {
                if (cli->n_local_args >= MGPU_CLI_MAX_LOCAL_ARGS)
                    return mgpu_err_set(err, MGPU_E_USAGE, "more than %d options like %s",
                                        MGPU_CLI_MAX_LOCAL_ARGS, what);
                cli->local_args[cli->n_local_args++] = k;
            }
        if (o->id == O_RDZV_TOKEN) {
            if (cli->n_token_args >= MGPU_CLI_MAX_TOKEN_ARGS)
                return mgpu_err_set(err, MGPU_E_USAGE, "%s given more than %d times", what,
                                    MGPU_CLI_MAX_TOKEN_ARGS);
            cli->token_args[cli->n_token_args++] = (char *)val; /* inside argv: see scrub */
        }
    }

    if (cli->show_help || cli->show_version)
        return 0;
    if (i >= argc)
        return mgpu_err_set(err, MGPU_E_USAGE,
                            "missing the worker program: mgpu-launch [options] PROGRAM [args...] "
                            "(a .cfg runs mgpu-worker, a .py runs python3)");
    if (argv[i][0] == '\0')
        return mgpu_err_set(err, MGPU_E_USAGE, "the worker program is an empty string");
    cli->prog_argc = argc - i;
    cli->prog_argv = argv + i;

    if (cli->no_python && cli->module)
        return mgpu_err_set(err, MGPU_E_USAGE,
                            "don't use both the '--no_python' flag and the '--module' flag at the "
                            "same time");
    if (cli->node_rank >= cli->nnodes_max)
        return mgpu_err_set(err, MGPU_E_USAGE,
                            "--node_rank=%d: expected a node rank from 0 to %d (--nnodes=%d)",
                            cli->node_rank, cli->nnodes_max - 1, cli->nnodes_max);
    if (cli->nnodes_max > 1 && cli->nnodes_min == cli->nnodes_max &&
        strcmp(cli->rdzv_backend, "static") == 0 && cli->endpoint_host[0] &&
        !cli->endpoint_port_given)
        /* torchrun: "Port is absent in endpoint" */
        return mgpu_err_set(err, MGPU_E_USAGE,
                            "--rdzv_endpoint='%s': the static rendezvous (--nnodes=%d, node ranks "
                            "given) meets at HOST:PORT; expected a port",
                            cli->rdzv_endpoint, cli->nnodes_max);
    if (!cli->hostfile[0] && !cli->hosts[0] &&
        (cli->include[0] || cli->exclude[0] || cli->ssh[0] || cli->exports[0]))
        return mgpu_err_set(err, MGPU_E_USAGE,
                            "--include, --exclude, --ssh and --export go with --hostfile or "
                            "--hosts (one launcher per host over ssh)");
    if (cli->standalone) {
        /* torchrun: --standalone ignores the rendezvous options and runs one node. */
        if (cli->nnodes_max != 1)
            return mgpu_err_set(err, MGPU_E_USAGE,
                                "--standalone runs one node, but --nnodes=%d:%d was given",
                                cli->nnodes_min, cli->nnodes_max);
    }
    return 0;
}

int mgpu_cli_parse(mgpu_cli_t *cli, int argc, char **argv, mgpu_getenv_fn getenv_fn,
                   mgpu_err_t *err)
{
    int rc = parse_args(cli, argc, argv, getenv_fn, err);
    /* Messages quote the arguments: control bytes in them are shown escaped, never sent raw to
     * the terminal. */
    if (rc < 0 && err != NULL)
        mgpu_escape_inplace(err->msg, sizeof err->msg);
    return rc;
}

void mgpu_cli_usage(FILE *out)
{
    fprintf(out,
            "usage: mgpu-launch [options] PROGRAM [args...]\n"
            "       mgpu-launch [options] -- PROGRAM [args...]\n"
            "       mgpu-launch status [--stacks] [--json]   (this user's running jobs)\n\n"
            "Starts one worker per local rank with torchrun's environment (RANK, LOCAL_RANK,\n"
            "WORLD_SIZE, MASTER_ADDR, ...) and supervises them. PROGRAM is a train.cfg (run by\n"
            "mgpu-worker), a .py script (run by python3 -u, or $PYTHON_EXEC), or any executable.\n"
            "Options end at PROGRAM: everything after it goes to the worker unchanged.\n\n"
            "options (--a_b and --a-b both work; each also reads PET_<NAME>):\n");
    for (size_t i = 0; i < NOPTS; i++) {
        char left[64];
        if (opts[i].shortopt)
            snprintf(left, sizeof left, "-%c, --%s", opts[i].shortopt, opts[i].name);
        else
            snprintf(left, sizeof left, "    --%s", opts[i].name);
        fprintf(out, "  %-32s %s\n", left, opts[i].help);
    }
    fprintf(out,
            "\nexit status: 0 when every worker succeeded; else the first failing worker's\n"
            "code (128+N if killed by signal N, 126/127 if it could not be executed); 2 for\n"
            "bad usage; 124 when a stalled job was stopped (--stall_action fail); 128+N when\n"
            "the launcher itself was stopped by signal N.\n"
            "GPUs: CUDA_VISIBLE_DEVICES as the CUDA driver reads it; MGPU_SIM_GPUS=N simulates\n"
            "N GPUs on a machine without any.\n"
            "ports, several nodes: the launchers' store listens on P (--master_port, default\n"
            "29500, or --rdzv_endpoint's port) and MASTER_PORT is P+1, where the workers' rank 0\n"
            "hosts its own store: open both. One node: MASTER_PORT is --master_port or a free\n"
            "port, and the store is on loopback.\n");
}
