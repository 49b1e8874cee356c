/* test_cli.c - torchrun's grammar, spellings, PET_ defaults and bad input. */
#include <signal.h> /* SIGTERM */
#include <stdarg.h> /* va_list */
#include <stdlib.h> /* calloc */

#include "check.h"
#include "cli.h"

static const char *fake_env[16][2];

static const char *env_get(const char *name)
{
    for (int i = 0; i < 16 && fake_env[i][0]; i++)
        if (strcmp(fake_env[i][0], name) == 0)
            return fake_env[i][1];
    return NULL;
}

#define MAX_ARGS 32
/* Parses a NULL-terminated list of arguments after "mgpu-launch". */
static int parse(mgpu_cli_t *cli, mgpu_err_t *err, ...)
{
    static char *argv[MAX_ARGS];
    int argc = 0;
    va_list ap;
    va_start(ap, err);
    argv[argc++] = "mgpu-launch";
    for (char *a; (a = va_arg(ap, char *)) != NULL;)
        argv[argc++] = a;
    va_end(ap);
    memset(err, 0, sizeof *err);
    return mgpu_cli_parse(cli, argc, argv, env_get, err);
}

static void test_defaults(void)
{
    mgpu_cli_t *c = calloc(1, sizeof *c);
    mgpu_err_t e;
    CHECK_INT(parse(c, &e, "prog", NULL), 0);
    CHECK_STR(c->nproc, "1");
    CHECK_INT(c->nnodes_min, 1);
    CHECK_INT(c->nnodes_max, 1);
    CHECK_STR(c->master_addr, "127.0.0.1");
    CHECK_INT(c->master_port, -1);
    CHECK_STR(c->role, "default");
    CHECK_STR(c->rdzv_id, "none");
    CHECK(c->grace_period == 30.0);
    CHECK_INT(c->prog_argc, 1);
    CHECK_STR(c->prog_argv[0], "prog");
    free(c);
}

/* An IPv6 node 0: bare, or in brackets as in HOST:PORT forms (the brackets are not the address). */
static void test_master_addr_ipv6(void)
{
    mgpu_cli_t *c = calloc(1, sizeof *c);
    mgpu_err_t e;
    CHECK_INT(parse(c, &e, "--master_addr=fd00::1", "x", NULL), 0);
    CHECK_STR(c->master_addr, "fd00::1");
    CHECK_INT(parse(c, &e, "--master_addr=[fd00::2]", "x", NULL), 0);
    CHECK_STR(c->master_addr, "fd00::2");
    CHECK_INT(parse(c, &e, "--master_addr=[]", "x", NULL), MGPU_E_USAGE);
    CHECK_CONTAINS(e.msg, "--master_addr='[]': expected a host name or address");
    CHECK_INT(parse(c, &e, "--master_addr=[fd00::1", "x", NULL), MGPU_E_USAGE);
    free(c);
}

static void test_spellings(void)
{
    mgpu_cli_t *c = calloc(1, sizeof *c);
    mgpu_err_t e;
    CHECK_INT(parse(c, &e, "--nproc_per_node=4", "x", NULL), 0);
    CHECK_STR(c->nproc, "4");
    CHECK_INT(parse(c, &e, "--nproc-per-node", "3", "x", NULL), 0);
    CHECK_STR(c->nproc, "3");
    CHECK_INT(parse(c, &e, "--nproc_per_node", "gpu", "--max-restarts=2", "x", NULL), 0);
    CHECK_STR(c->nproc, "gpu");
    CHECK_INT(c->max_restarts, 2);
    /* argparse's unique prefixes: torchrun's own tests use --redirect=3 */
    CHECK_INT(parse(c, &e, "--redirect=3", "--nproc=2", "x", NULL), 0);
    CHECK_INT(c->redirects.all, 3);
    CHECK_STR(c->nproc, "2");
    CHECK_INT(parse(c, &e, "-r", "1", "-t3", "-m", "mod", NULL), 0);
    CHECK_INT(c->redirects.all, 1);
    CHECK_INT(c->tee.all, 3);
    CHECK_INT(c->module, 1);
    CHECK_INT(parse(c, &e, "--dry-run", "x", NULL), 0);
    CHECK_INT(c->dry_run, MGPU_DRY_TEXT);
    CHECK_INT(parse(c, &e, "--dry_run=json", "x", NULL), 0);
    CHECK_INT(c->dry_run, MGPU_DRY_JSON);
    CHECK_INT(parse(c, &e, "--nnodes=2:4", "--node-rank=3", "x", NULL), 0);
    CHECK_INT(c->nnodes_min, 2);
    CHECK_INT(c->nnodes_max, 4);
    CHECK_INT(c->node_rank, 3);
    free(c);
}

static void test_program_ends_options(void)
{
    mgpu_cli_t *c = calloc(1, sizeof *c);
    mgpu_err_t e;
    CHECK_INT(
        parse(c, &e, "--nproc_per_node=2", "train.py", "--nproc_per_node=5", "--", "-x", NULL), 0);
    CHECK_STR(c->nproc, "2");
    CHECK_INT(c->prog_argc, 4);
    CHECK_STR(c->prog_argv[1], "--nproc_per_node=5");
    CHECK_STR(c->prog_argv[2], "--");
    CHECK_INT(parse(c, &e, "--", "--weird-name", "a", NULL), 0);
    CHECK_STR(c->prog_argv[0], "--weird-name");
    CHECK_INT(c->prog_argc, 2);
    free(c);
}

static void test_env_defaults(void)
{
    mgpu_cli_t *c = calloc(1, sizeof *c);
    mgpu_err_t e;
    fake_env[0][0] = "PET_NPROC_PER_NODE";
    fake_env[0][1] = "3";
    fake_env[1][0] = "PET_STANDALONE";
    fake_env[1][1] = "1";
    fake_env[2][0] = "PET_MAX_RESTARTS";
    fake_env[2][1] = "4";
    CHECK_INT(parse(c, &e, "x", NULL), 0);
    CHECK_STR(c->nproc, "3");
    CHECK_INT(c->standalone, 1);
    CHECK_INT(c->max_restarts, 4);
    /* the command line wins */
    CHECK_INT(parse(c, &e, "--nproc_per_node=2", "x", NULL), 0);
    CHECK_STR(c->nproc, "2");
    fake_env[2][1] = "many";
    CHECK_INT(parse(c, &e, "x", NULL), MGPU_E_USAGE);
    CHECK_CONTAINS(e.msg, "PET_MAX_RESTARTS='many'");
    fake_env[1][1] = "0";
    fake_env[2][1] = "0";
    CHECK_INT(parse(c, &e, "x", NULL), 0);
    CHECK_INT(c->standalone, 0);
    fake_env[0][0] = NULL;
    free(c);
}

static void test_bad_input(void)
{
    mgpu_cli_t *c = calloc(1, sizeof *c);
    mgpu_err_t e;
#define BAD(substr, ...)                                                                           \
    do {                                                                                           \
        CHECK_INT(parse(c, &e, __VA_ARGS__, NULL), MGPU_E_USAGE);                                  \
        CHECK_CONTAINS(e.msg, substr);                                                             \
    } while (0)
    BAD("unknown option --bogus", "--bogus", "x");
    /* the near spelling is named; none where nothing is near */
    BAD("unknown option --nproc_per_nodes=2 (did you mean --nproc_per_node? see",
        "--nproc_per_nodes=2", "x");
    BAD("unknown option --hostfle (did you mean --hostfile?", "--hostfle", "x");
    BAD("unknown option --bogus (see mgpu-launch --help)", "--bogus", "x");
    BAD("ambiguous option --n", "--n=1", "x");
    BAD("--nproc_per_node: missing value", "--nproc_per_node");
    BAD("--nproc_per_node='0'", "--nproc_per_node=0", "x");
    BAD("--nproc_per_node='-1'", "--nproc_per_node=-1", "x");
    BAD("--nproc_per_node='99999'", "--nproc_per_node=99999", "x");
    BAD("--nproc_per_node='abc'", "--nproc_per_node=abc", "x");
    BAD("--nproc_per_node='4x'", "--nproc_per_node=4x", "x");
    BAD("MIN (2) is larger than MAX (1)", "--nnodes=2:1", "x");
    BAD("--nnodes='1:2:3'", "--nnodes=1:2:3", "x");
    BAD("--nnodes='0'", "--nnodes=0", "x");
    BAD("--master_port='70000'", "--master_port=70000", "x");
    BAD("--grace_period='-1'", "--grace_period=-1", "x");
    BAD("--redirects='4'", "--redirects=4", "x");
    BAD("--tee='0:9'", "--tee=0:9", "x");
    BAD("--node_rank=2", "--nnodes=2", "--node_rank=2", "x");
    BAD("--local_ranks_filter='0,a'", "--local_ranks_filter=0,a", "x");
    BAD("--standalone takes no value", "--standalone=1", "x");
    BAD("missing the worker program", "--nproc_per_node=2");
    BAD("'--no_python' flag and the '--module' flag", "--no_python", "-m", "x");
    BAD("unknown option -z", "-z", "x");
    BAD("--rdzv_backend='etcd'", "--rdzv_backend=etcd", "x");
    BAD("--legacy_local_rank='x': expected underscore or dash", "--legacy_local_rank=x", "x");
    /* torchrun's static rendezvous meets at --rdzv_endpoint when given: HOST:PORT. */
    BAD("--rdzv_endpoint='node0': the static rendezvous", "--nnodes=2", "--rdzv_endpoint=node0",
        "x");
#undef BAD
    /* ... which elastic and one-node jobs do not need (c10d's default port is 29400). */
    CHECK_INT(parse(c, &e, "--nnodes=2", "--rdzv_endpoint=node0:29555", "x", NULL), 0);
    CHECK_INT(c->endpoint_port, 29555);
    CHECK_INT(parse(c, &e, "--nnodes=1:2", "--rdzv_endpoint=node0", "x", NULL), 0);
    CHECK_INT(c->endpoint_port, 29400);
    CHECK_INT(parse(c, &e, "--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=node0", "x", NULL),
              0);
    CHECK_INT(parse(c, &e, "--rdzv_endpoint=node0", "x", NULL), 0);
    free(c);
}

static void test_std_spec(void)
{
    mgpu_std_spec_t s;
    mgpu_err_t e;
    CHECK_INT(mgpu_std_spec_parse("0:1,1:2,12:3", &s, &e), 0);
    CHECK_INT(mgpu_std_spec_get(&s, 0), 1);
    CHECK_INT(mgpu_std_spec_get(&s, 1), 2);
    CHECK_INT(mgpu_std_spec_get(&s, 12), 3);
    CHECK_INT(mgpu_std_spec_get(&s, 2), 0);
    CHECK_INT(mgpu_std_spec_parse("2", &s, &e), 0);
    CHECK_INT(mgpu_std_spec_get(&s, 7), 2);
    CHECK_INT(mgpu_std_spec_parse("0:1,", &s, &e), MGPU_E_USAGE);
    CHECK_INT(mgpu_std_spec_parse("", &s, &e), MGPU_E_USAGE);
    CHECK_INT(mgpu_std_spec_parse("1:", &s, &e), MGPU_E_USAGE);
    CHECK_INT(mgpu_std_spec_parse("x:1", &s, &e), MGPU_E_USAGE);
}

static void test_filter_and_flags(void)
{
    mgpu_cli_t *c = calloc(1, sizeof *c);
    mgpu_err_t e;
    CHECK_INT(parse(c, &e, "--local_ranks_filter=0,2", "--no_prefix", "--allow-gpu-sharing",
                    "--legacy_local_rank", "--summary", "s.json", "--grace_period=0.5", "x", NULL),
              0);
    CHECK_INT(c->nfilter, 2);
    CHECK_INT(c->filter[1], 2);
    CHECK_INT(c->no_prefix, 1);
    CHECK_INT(c->allow_gpu_sharing, 1);
    CHECK_INT(c->legacy_local_rank, 1);
    CHECK_STR(c->summary, "s.json");
    CHECK(c->grace_period == 0.5);
    CHECK_INT(parse(c, &e, "--version", NULL), 0);
    CHECK_INT(c->show_version, 1);
    CHECK_INT(parse(c, &e, "-h", NULL), 0);
    CHECK_INT(c->show_help, 1);
    free(c);
}

/* torchrun passes --rdzv_conf keys on and ignores those it has no use for; quotes around the
 * whole value or one value are stripped; timeout is kept for the static rendezvous. */
static void test_rdzv_conf(void)
{
    mgpu_cli_t *c = calloc(1, sizeof *c);
    mgpu_err_t e;
    CHECK_INT(parse(c, &e, "--rdzv-conf=use_libuv=0", "x", NULL), 0);
    CHECK_CONTAINS(c->notes, "rdzv_conf: ignoring use_libuv=0 (not used by mgpu)");
    CHECK_INT(parse(c, &e, "--rdzv_conf=read_timeout=5,close_timeout=7,store_type=tcp", "x", NULL),
              0);
    CHECK_CONTAINS(c->notes, "rdzv_conf: ignoring read_timeout=5 (not used by mgpu)");
    CHECK_CONTAINS(c->notes, "rdzv_conf: ignoring close_timeout=7 (not used by mgpu)");
    CHECK(c->rdzv_timeout < 0);
    CHECK_INT(parse(c, &e, "--rdzv_conf='join_timeout=5,last_call_timeout=1,timeout=5'", "x", NULL),
              0);
    CHECK(c->join_timeout == 5.0);
    CHECK(c->last_call_timeout == 1.0);
    CHECK(c->rdzv_timeout == 5.0);
    CHECK_INT(c->join_timeout_given, 1);
    CHECK_INT(parse(c, &e, "--rdzv_conf=\"timeout=9\"", "x", NULL), 0);
    CHECK(c->rdzv_timeout == 9.0);
    CHECK_INT(c->join_timeout_given, 0);
    CHECK_INT(parse(c, &e, "--rdzv_conf=join_timeout='7', is_host=\"1\"", "x", NULL), 0);
    CHECK(c->join_timeout == 7.0);
    CHECK_INT(c->is_host, 1);
    /* malformed entries stay errors */
    CHECK_INT(parse(c, &e, "--rdzv_conf=join_timeout", "x", NULL), MGPU_E_USAGE);
    CHECK_CONTAINS(e.msg, "is not KEY=VALUE");
    CHECK_INT(parse(c, &e, "--rdzv_conf==5", "x", NULL), MGPU_E_USAGE);
    CHECK_CONTAINS(e.msg, "empty key");
    CHECK_INT(parse(c, &e, "--rdzv_conf=timeout=", "x", NULL), MGPU_E_USAGE);
    CHECK_INT(parse(c, &e, "--rdzv_conf=timeout=soon", "x", NULL), MGPU_E_USAGE);
    free(c);
}

/* A value that looks like an option is the next option, as argparse has it, unless it is
 * attached with "=". */
static void test_option_like_values(void)
{
    mgpu_cli_t *c = calloc(1, sizeof *c);
    mgpu_err_t e;
    CHECK_INT(parse(c, &e, "--log_dir", "--standalone=1", "x", NULL), MGPU_E_USAGE);
    CHECK_CONTAINS(e.msg, "argument --log_dir: expected one argument");
    CHECK_INT(parse(c, &e, "--role", "--legacy_local_rank=yes", "x", NULL), MGPU_E_USAGE);
    CHECK_CONTAINS(e.msg, "argument --role: expected one argument");
    CHECK_INT(parse(c, &e, "-r", "--tee=1", "x", NULL), MGPU_E_USAGE);
    CHECK_INT(parse(c, &e, "--role=--x", "x", NULL), 0);
    CHECK_STR(c->role, "--x");
    CHECK_INT(parse(c, &e, "--role", "-x", "x", NULL), 0); /* one dash: a value */
    CHECK_STR(c->role, "-x");
    free(c);
}

/* --signals_to_handle: torchrun's default, both spellings, prefixes, PET_, a checked list. */
static void test_signals_to_handle(void)
{
    mgpu_cli_t *c = calloc(1, sizeof *c);
    mgpu_err_t e;
    const unsigned long long deflt =
        1ull << SIGTERM | 1ull << SIGINT | 1ull << SIGHUP | 1ull << SIGQUIT;
    CHECK_INT(parse(c, &e, "x", NULL), 0);
    CHECK_STR(c->signals, "SIGTERM,SIGINT,SIGHUP,SIGQUIT");
    CHECK(c->stop_signals == deflt);
    CHECK_INT(parse(c, &e, "--signals-to-handle=SIGTERM,SIGUSR1,SIGUSR2", "x", NULL), 0);
    CHECK_STR(c->signals, "SIGTERM,SIGUSR1,SIGUSR2");
    CHECK(c->stop_signals == (1ull << SIGTERM | 1ull << SIGUSR1 | 1ull << SIGUSR2));
    CHECK_INT(mgpu_cli_given(c, "signals_to_handle"), 1);
    /* blanks around names (torchrun strips them), a repeated name kept once */
    CHECK_INT(parse(c, &e, "--signals_to_handle", " SIGHUP , SIGPWR,SIGHUP", "x", NULL), 0);
    CHECK_STR(c->signals, "SIGHUP,SIGPWR");
    CHECK(c->stop_signals == (1ull << SIGHUP | 1ull << SIGPWR));
    CHECK_INT(parse(c, &e, "--sig=SIGINT", "x", NULL), 0); /* a unique prefix */
    CHECK_STR(c->signals, "SIGINT");
    fake_env[0][0] = "PET_SIGNALS_TO_HANDLE";
    fake_env[0][1] = "SIGUSR1";
    CHECK_INT(parse(c, &e, "x", NULL), 0);
    CHECK(c->stop_signals == 1ull << SIGUSR1);
    CHECK_INT(parse(c, &e, "--signals_to_handle=SIGQUIT", "x", NULL), 0); /* the option wins */
    CHECK(c->stop_signals == 1ull << SIGQUIT);
    fake_env[0][1] = "SIGTERM,SIGFOO";
    CHECK_INT(parse(c, &e, "x", NULL), MGPU_E_USAGE);
    CHECK_CONTAINS(e.msg, "PET_SIGNALS_TO_HANDLE='SIGTERM,SIGFOO': unknown signal 'SIGFOO'");
    fake_env[0][0] = NULL;
#define BAD(substr, value)                                                                         \
    do {                                                                                           \
        CHECK_INT(parse(c, &e, "--signals_to_handle", value, "x", NULL), MGPU_E_USAGE);            \
        CHECK_CONTAINS(e.msg, substr);                                                             \
    } while (0)
    BAD("--signals_to_handle='SIGFOO': unknown signal 'SIGFOO'; expected some of: SIGTERM",
        "SIGFOO");
    BAD("--signals_to_handle='': empty list", "");
    BAD("--signals_to_handle=' ': empty list", " ");
    BAD("--signals_to_handle='SIGTERM,': empty entry", "SIGTERM,");
    BAD("--signals_to_handle='SIGTERM,,SIGINT': empty entry", "SIGTERM,,SIGINT");
    BAD("SIGKILL cannot be handled (it cannot be caught)", "SIGKILL");
    BAD("SIGSTOP cannot be handled (it cannot be caught)", "SIGTERM,SIGSTOP");
    BAD("SIGCHLD cannot be handled (the launcher uses it itself)", "SIGCHLD");
    BAD("SIGWINCH cannot be handled (the launcher uses it itself)", "SIGWINCH");
    BAD("SIGSEGV cannot be handled (it does not ask a job to end)", "SIGSEGV");
    BAD("unknown signal 'sigterm'", "sigterm");
    BAD("unknown signal 'TERM'", "TERM");
    BAD("unknown signal '15'", "15");
#undef BAD
    free(c);
}

/* --numa_binding: torchrun's four modes, both spellings, prefixes; anything else refused. */
static void test_numa_binding(void)
{
    mgpu_cli_t *c = calloc(1, sizeof *c);
    mgpu_err_t e;
    CHECK_INT(parse(c, &e, "x", NULL), 0);
    CHECK_INT(c->numa_binding, MGPU_NUMA_OFF);
    CHECK_INT(parse(c, &e, "--numa-binding=node", "x", NULL), 0);
    CHECK_INT(c->numa_binding, MGPU_NUMA_NODE);
    CHECK_INT(parse(c, &e, "--numa_binding", "socket", "x", NULL), 0);
    CHECK_INT(c->numa_binding, MGPU_NUMA_SOCKET);
    CHECK_INT(parse(c, &e, "--numa=exclusive", "x", NULL), 0);
    CHECK_INT(c->numa_binding, MGPU_NUMA_EXCLUSIVE);
    CHECK_INT(parse(c, &e, "--numa-b", "core-complex", "x", NULL), 0);
    CHECK_INT(c->numa_binding, MGPU_NUMA_CORE_COMPLEX);
    CHECK_INT(mgpu_cli_given(c, "numa_binding"), 1);
    CHECK_INT(parse(c, &e, "--numa_binding=NUMA", "x", NULL), MGPU_E_USAGE);
    CHECK_CONTAINS(e.msg,
                   "--numa_binding='NUMA': expected node, socket, exclusive or core-complex");
    CHECK_INT(parse(c, &e, "--numa_binding=", "x", NULL), MGPU_E_USAGE);
    CHECK_INT(parse(c, &e, "--numa_binding", "--tee=1", "x", NULL), MGPU_E_USAGE);
    CHECK_CONTAINS(e.msg, "argument --numa_binding: expected one argument");
    free(c);
}

/* --duplicate_std{out,err}_filters: both spellings, PET_, argparse's ambiguity of --dup. */
static void test_duplicate_filters(void)
{
    mgpu_cli_t *c = calloc(1, sizeof *c);
    mgpu_err_t e;
    CHECK_INT(parse(c, &e, "x", NULL), 0);
    CHECK_INT(c->dup_filters[0].n + c->dup_filters[1].n, 0);
    CHECK_INT(parse(c, &e, "--duplicate-stdout-filters=apple,orange", "--duplicate_stderr_filters",
                    "NCCL", "x", NULL),
              0);
    CHECK_INT(c->dup_filters[0].n, 2);
    CHECK_STR(c->dup_filters[0].buf + 6, "orange");
    CHECK_INT(c->dup_filters[1].n, 1);
    CHECK_STR(c->dup_filters[1].buf, "NCCL");
    CHECK_INT(parse(c, &e, "--duplicate_stdout=a,,b", "x", NULL), 0);
    CHECK_STR(c->dup_filters[0].buf, "a,b");
    fake_env[0][0] = "PET_DUPLICATE_STDERR_FILTERS";
    fake_env[0][1] = "Traceback";
    CHECK_INT(parse(c, &e, "x", NULL), 0);
    CHECK_STR(c->dup_filters[1].buf, "Traceback");
    CHECK_INT(parse(c, &e, "--duplicate_stderr_filters=", "x", NULL), 0); /* the option wins */
    CHECK_INT(c->dup_filters[1].n, 0);
    fake_env[0][0] = NULL;
    CHECK_INT(parse(c, &e, "--dup=x", "x", NULL), MGPU_E_USAGE);
    CHECK_CONTAINS(e.msg, "ambiguous option --dup=x");
    free(c);
}

/* Messages that quote arguments show control bytes escaped. */
static void test_messages_escape_input(void)
{
    mgpu_cli_t *c = calloc(1, sizeof *c);
    mgpu_err_t e;
    CHECK_INT(parse(c, &e, "--nproc_per_node=\x1b[31mred\n", "x", NULL), MGPU_E_USAGE);
    CHECK_CONTAINS(e.msg, "'\\x1b[31mred\\n'");
    CHECK(strchr(e.msg, 0x1b) == NULL && strchr(e.msg, '\n') == NULL);
    CHECK_INT(parse(c, &e, "--bogus\r\x07", "x", NULL), MGPU_E_USAGE);
    CHECK_CONTAINS(e.msg, "--bogus\\r\\x07");
    free(c);
}

int main(void)
{
    RUN(test_defaults);
    RUN(test_master_addr_ipv6);
    RUN(test_spellings);
    RUN(test_program_ends_options);
    RUN(test_env_defaults);
    RUN(test_bad_input);
    RUN(test_std_spec);
    RUN(test_filter_and_flags);
    RUN(test_rdzv_conf);
    RUN(test_option_like_values);
    RUN(test_messages_escape_input);
    RUN(test_signals_to_handle);
    RUN(test_numa_binding);
    RUN(test_duplicate_filters);
    return check_done();
}
