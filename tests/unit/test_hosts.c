/* test_hosts.c - the ssh launch's pure parts: hostfiles, host lists, --include/--exclude, the
 * hosts' environment and each host's command. */
#include <stdlib.h> /* free */
#include <unistd.h> /* unlink */

#include "check.h"
#include "hosts.h"

static const char *file_with(const char *text)
{
    static char path[64];
    snprintf(path, sizeof path, "/tmp/test_hosts_%d", (int)getpid());
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
    return path;
}

/* The error message for a hostfile of text ("" when it is accepted), with the file's path
 * replaced by "F". */
static const char *hostfile_error(const char *text, mgpu_hosts_t *h)
{
    static char msg[1024];
    const char *path = file_with(text);
    mgpu_err_t e = {0};
    int rc = mgpu_hosts_read_file(path, h, &e);
    unlink(path);
    msg[0] = '\0';
    for (const char *p = rc < 0 ? e.msg : ""; *p;) { /* every "PATH" as "F" */
        const char *q = strstr(p, path);
        size_t n = strlen(msg);
        if (q == NULL) {
            snprintf(msg + n, sizeof msg - n, "%s", p);
            break;
        }
        snprintf(msg + n, sizeof msg - n, "%.*sF", (int)(q - p), p);
        p = q + strlen(path);
    }
    return msg;
}

static void test_hostfile(void)
{
    mgpu_hosts_t h;
    CHECK_STR(
        hostfile_error("# hosts\n\nn1 slots=4   # the first\n\tn2 slots=2 max_slots=8\nn3\n", &h),
        "");
    CHECK_INT(h.n, 3);
    CHECK_STR(h.v[0].name, "n1");
    CHECK_INT(h.v[0].slots, 4);
    CHECK_INT(h.v[1].slots, 2);
    CHECK_INT(h.v[2].slots, 1);
    CHECK_STR(h.v[1].origin + strlen(h.v[1].origin) - 2, ":4");
    mgpu_hosts_free(&h);
    CHECK_CONTAINS(hostfile_error("a slots=1\nb slots=1\na slots=2\n", &h),
                   "F:3: host 'a' is already listed at F:1");
    CHECK_CONTAINS(hostfile_error("a slots=x\n", &h), "F:1: 'slots=x': expected 'HOST slots=N'");
    CHECK_CONTAINS(hostfile_error("a slots=1 b\n", &h), "F:1: 'b': expected");
    CHECK_CONTAINS(hostfile_error("a slots=-1\n", &h), "F:1: 'slots=-1'");
    CHECK_CONTAINS(hostfile_error("a slots=2000\n", &h),
                   "F:1: host 'a': slots=2000: expected 1 to");
    CHECK_CONTAINS(hostfile_error("-oProxyCommand=x slots=1\n", &h), "expected a host name");
    CHECK_CONTAINS(hostfile_error("a$(x) slots=1\n", &h), "expected a host name");
    CHECK_CONTAINS(hostfile_error("# only\n", &h), "F lists no host");
}

static void test_list_and_select(void)
{
    mgpu_hosts_t h;
    mgpu_err_t e = {0};
    CHECK_INT(mgpu_hosts_parse_list("a:4,b,c:2", &h, &e), 0);
    CHECK_INT(h.n, 3);
    CHECK_INT(h.v[1].slots, 1);
    CHECK_INT(mgpu_hosts_select(&h, "a:0,2@c", NULL, &e), 0);
    CHECK_INT(h.n, 2);
    CHECK_STR(h.v[0].name, "a");
    CHECK_INT(h.v[0].nsel, 2);
    CHECK_INT(h.v[0].sel[0], 0);
    CHECK_INT(h.v[0].sel[1], 2);
    CHECK_STR(h.v[1].name, "c");
    CHECK_INT(h.v[1].nsel, 2);
    mgpu_hosts_free(&h);
    CHECK_INT(mgpu_hosts_parse_list("a:4,b,c:2", &h, &e), 0);
    CHECK_INT(mgpu_hosts_select(&h, NULL, "a:1@b", &e), 0);
    CHECK_INT(h.n, 2);
    CHECK_INT(h.v[0].nsel, 3);
    CHECK_INT(h.v[0].sel[0], 0);
    CHECK_INT(h.v[0].sel[1], 2);
    CHECK_STR(h.v[1].name, "c");
    CHECK_INT(mgpu_hosts_select(&h, "zz", NULL, &e), MGPU_E_USAGE);
    CHECK_CONTAINS(e.msg, "--include: host 'zz' is not in the host list");
    CHECK_INT(mgpu_hosts_select(&h, NULL, "c:5", &e), MGPU_E_USAGE);
    CHECK_CONTAINS(e.msg, "slot '5': expected a slot from 0 to 1");
    CHECK_INT(mgpu_hosts_select(&h, "a", "c", &e), MGPU_E_USAGE);
    CHECK_INT(mgpu_hosts_select(&h, NULL, "a@c", &e), MGPU_E_USAGE);
    CHECK_CONTAINS(e.msg, "leaves no host");
    mgpu_hosts_free(&h);
    CHECK_INT(mgpu_hosts_parse_list("a:0", &h, &e), MGPU_E_USAGE);
    CHECK_INT(mgpu_hosts_parse_list("a:2,a:1", &h, &e), MGPU_E_USAGE);
    CHECK_CONTAINS(e.msg, "host 'a' is already listed");
    CHECK_INT(mgpu_hosts_parse_list("", &h, &e), MGPU_E_USAGE);
}

/* IPv6 addresses: bare in a hostfile, in brackets before a slot count or slots. */
static void test_ipv6(void)
{
    mgpu_hosts_t h;
    mgpu_err_t e = {0};
    CHECK_STR(hostfile_error("fd77::1 slots=2\nfd77::2\n::ffff:10.0.0.3 slots=4\n", &h), "");
    CHECK_INT(h.n, 3);
    CHECK_STR(h.v[0].name, "fd77::1");
    CHECK_INT(h.v[0].slots, 2);
    CHECK_STR(h.v[2].name, "::ffff:10.0.0.3");
    mgpu_hosts_free(&h);
    CHECK_CONTAINS(hostfile_error("fd77:::1 slots=2\n", &h), "F:1: 'fd77:::1': expected a host");
    CHECK_INT(mgpu_hosts_parse_list("[fd77::1]:4,fd77::2,[fd77::3],b:2", &h, &e), 0);
    CHECK_INT(h.n, 4);
    CHECK_STR(h.v[0].name, "fd77::1");
    CHECK_INT(h.v[0].slots, 4);
    CHECK_STR(h.v[1].name, "fd77::2");
    CHECK_INT(h.v[1].slots, 1);
    CHECK_STR(h.v[2].name, "fd77::3");
    CHECK_INT(h.v[2].slots, 1);
    CHECK_INT(mgpu_hosts_select(&h, "[fd77::1]:1,3@fd77::2@b", NULL, &e), 0);
    CHECK_INT(h.n, 3);
    CHECK_INT(h.v[0].nsel, 2);
    CHECK_INT(h.v[0].sel[1], 3);
    CHECK_STR(h.v[1].name, "fd77::2");
    CHECK_INT(mgpu_hosts_select(&h, NULL, "[fd77::1", &e), MGPU_E_USAGE);
    CHECK_CONTAINS(e.msg, "--exclude: '[fd77::1': expected [IPv6 address]");
    mgpu_hosts_free(&h);
    CHECK_INT(mgpu_hosts_parse_list("[fd77::1]4", &h, &e), MGPU_E_USAGE);
    CHECK_CONTAINS(e.msg, "expected [IPv6 address] or [IPv6 address]:SLOTS");
    CHECK_INT(mgpu_hosts_parse_list("[fd77::1]:0", &h, &e), MGPU_E_USAGE);
    CHECK_INT(mgpu_hosts_parse_list("[a]:1", &h, &e), 0); /* a name in brackets is still a name */
    CHECK_STR(h.v[0].name, "a");
    mgpu_hosts_free(&h);
}

static const char *vars[][2] = {{"MY_VAR", "v"}, {"PET_RDZV_TOKEN", "secret"}, {NULL, NULL}};

static const char *get(const char *name)
{
    for (int i = 0; vars[i][0]; i++)
        if (strcmp(vars[i][0], name) == 0)
            return vars[i][1];
    return NULL;
}

static void test_env(void)
{
    char *environ_[] = {
        "NCCL_DEBUG=INFO", "PET_NNODES=4",      "PET_MAX_RESTARTS=2", "PET_RDZV_TOKEN=secret",
        "HOME=/root",      "OMP_NUM_THREADS=2", "PET_HOSTFILE=h",     NULL};
    mgpu_hosts_env_t env;
    mgpu_err_t e = {0};
    const char *path = file_with("# x\nA=1\n\n  B = 2\nMY_VAR=file\n");
    CHECK_INT(mgpu_hosts_env_collect(environ_, get, "MY_VAR", "/nonexistent/.mgpu_env", &env, &e),
              0);
    CHECK_INT(env.n, 4);
    CHECK_STR(env.kv[0], "NCCL_DEBUG=INFO");
    CHECK_STR(env.kv[1], "PET_MAX_RESTARTS=2"); /* not PET_NNODES, PET_RDZV_TOKEN, PET_HOSTFILE */
    CHECK_STR(env.kv[2], "OMP_NUM_THREADS=2");
    CHECK_STR(env.kv[3], "MY_VAR=v");
    mgpu_hosts_env_free(&env);
    CHECK_INT(mgpu_hosts_env_collect(environ_, get, "", path, &env, &e), MGPU_E_USAGE);
    CHECK_CONTAINS(e.msg, ":4: 'B = 2': expected KEY=VALUE");
    file_with("A=1 2\nMY_VAR=file\n");
    CHECK_INT(mgpu_hosts_env_collect(environ_, get, "MY_VAR", path, &env, &e), 0);
    CHECK_STR(env.kv[env.n - 2], "A=1 2");
    CHECK_STR(env.kv[env.n - 1], "MY_VAR=file");
    mgpu_hosts_env_free(&env);
    CHECK_INT(mgpu_hosts_env_collect(environ_, get, "NOPE", NULL, &env, &e), MGPU_E_USAGE);
    CHECK_CONTAINS(e.msg, "NOPE is not set here");
    CHECK_INT(mgpu_hosts_env_collect(environ_, get, "PET_RDZV_TOKEN", NULL, &env, &e),
              MGPU_E_USAGE);
    unlink(path);
}

static void test_command(void)
{
    mgpu_hosts_t h;
    mgpu_hosts_env_t env = {0};
    mgpu_err_t e = {0};
    char *kv[] = {"X=a'b"};
    const char *fwd[] = {"--max_restarts=1"};
    char *prog[] = {"train.py", "two words"};
    mgpu_hosts_job_t job = {.launcher = "/opt/mgpu/bin/mgpu-launch",
                            .cwd = "/home/u/run 1",
                            .master_addr = "a",
                            .master_port = 29500,
                            .fwd = fwd,
                            .nfwd = 1,
                            .prog_argv = prog,
                            .prog_argc = 2,
                            .env = &env};
    env.kv = kv;
    env.n = 1;
    CHECK_INT(mgpu_hosts_parse_list("a:4,b:2", &h, &e), 0);
    CHECK_INT(mgpu_hosts_select(&h, "a:1,3@b", NULL, &e), 0);
    char *c = mgpu_hosts_command(&h, 0, &job);
    CHECK_STR(c, "cd '/home/u/run 1' && exec env 'X=a'\\''b' CUDA_VISIBLE_DEVICES=1,3 "
                 "/opt/mgpu/bin/mgpu-launch --nnodes=2 --node_rank=0 --master_addr=a "
                 "--master_port=29500 --nproc_per_node=2 --local_addr=a --rdzv_token_file=- "
                 "--watch_stdin '--log_line_prefix_template=[a:rank${rank}]:' --max_restarts=1 "
                 "-- train.py 'two words'");
    free(c);
    job.nproc = "gpu";
    job.own_prefix = 1;
    env.n = 0;
    c = mgpu_hosts_command(&h, 1, &job);
    CHECK_STR(c, "cd '/home/u/run 1' && exec /opt/mgpu/bin/mgpu-launch --nnodes=2 --node_rank=1 "
                 "--master_addr=a --master_port=29500 --nproc_per_node=gpu --local_addr=b "
                 "--rdzv_token_file=- --watch_stdin --max_restarts=1 -- train.py 'two words'");
    free(c);
    /* --summary: host 0's as given, another host's with .nodeK before the extension */
    const char *const sums[][3] = {
        {"out/run.json", "--summary=out/run.json", "--summary=out/run.node1.json"},
        {"run", "--summary=run", "--summary=run.node1"},
        {"a.d/.sum", "--summary=a.d/.sum", "--summary=a.d/.sum.node1"}};
    for (size_t i = 0; i < sizeof sums / sizeof sums[0]; i++)
        for (int k = 0; k < 2; k++) {
            job.summary = sums[i][0];
            char want[64];
            snprintf(want, sizeof want, "%s --max_restarts", sums[i][1 + k]); /* the whole word */
            c = mgpu_hosts_command(&h, k, &job);
            CHECK_CONTAINS(c, want);
            free(c);
        }
    mgpu_hosts_free(&h);
}

int main(void)
{
    RUN(test_hostfile);
    RUN(test_list_and_select);
    RUN(test_ipv6);
    RUN(test_env);
    RUN(test_command);
    return check_done();
}
