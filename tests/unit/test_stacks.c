/* test_stacks.c - launcher/stacks.c: stacks of real processes through gdb, eu-stack and
 * py-spy, the hand-over from a failing tool to the next, the deadline, and bounded output.
 * Fake tools are shell scripts put first in PATH. */
#include "check.h"

#include <errno.h>     /* errno */
#include <signal.h>    /* kill, SIGSTOP */
#include <stdio.h>     /* fopen */
#include <stdlib.h>    /* mkdtemp, setenv */
#include <sys/prctl.h> /* PR_SET_PTRACER */
#include <sys/stat.h>  /* chmod */
#include <time.h>      /* clock_gettime */
#include <unistd.h>    /* fork, sleep */
#include <uv.h>        /* uv_loop_t */

#include "stacks.h"

typedef struct got {
    char **texts;
    int n, calls;
} got_t;

static void on_stacks(void *arg, char **texts, int n)
{
    got_t *g = arg;
    g->texts = texts;
    g->n = n;
    g->calls++;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Collects on a loop of its own; returns the seconds it took. */
static double collect(const pid_t *pids, int n, double timeout_s, got_t *g)
{
    uv_loop_t loop;
    mgpu_err_t err = {0};
    double t0 = now_s();
    int rc;

    memset(g, 0, sizeof *g);
    uv_loop_init(&loop);
    rc = mgpu_stacks_collect(&loop, pids, n, timeout_s, on_stacks, g, &err);
    CHECK_INT(rc, 0);
    if (rc != 0)
        printf("  %s\n", err.msg);
    CHECK_INT(g->calls, 0); /* never from inside the call */
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK_INT(uv_loop_close(&loop), 0);
    CHECK_INT(g->calls, 1);
    if (getenv("STACKS_SHOW") != NULL)
        for (int i = 0; i < g->n; i++)
            printf("---- %d\n%s\n", i, g->texts[i]);
    return now_s() - t0;
}

static int in_path(const char *name)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", name);
    return system(cmd) == 0;
}

static pid_t start_sleeper(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        /* As the launcher's spawner declares it for a worker: under Yama's ptrace_scope=1
         * the tools, children of the test process, may attach. */
        prctl(PR_SET_PTRACER, getppid());
        for (;;)
            sleep(100);
    }
    usleep(100 * 1000); /* into sleep() before the tool looks */
    return pid;
}

/* Whether pid is stopped (state T in /proc/<pid>/stat). */
static int is_stopped(pid_t pid)
{
    char path[64], buf[512], *p = NULL;
    FILE *f;
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    if ((f = fopen(path, "r")) == NULL)
        return 0;
    if (fgets(buf, sizeof buf, f) != NULL)
        p = strrchr(buf, ')');
    fclose(f);
    return p != NULL && strncmp(p, ") T ", 4) == 0;
}

static void end(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* A folder with fake tools (name, shell body) first in PATH; the rest of PATH is dropped when
 * alone is set. */
static void fake_tool(const char *dir, const char *name, const char *body)
{
    char path[512];
    FILE *f;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    f = fopen(path, "w");
    CHECK(f != NULL);
    if (f == NULL)
        return;
    fprintf(f, "#!/bin/sh\n%s\n", body);
    fclose(f);
    chmod(path, 0755);
}

static char *fake_dir(int alone)
{
    static char dir[] = "/tmp/mgpu-stacks-XXXXXX";
    char path[4096];
    CHECK(mkdtemp(dir) != NULL);
    if (alone)
        snprintf(path, sizeof path, "%s", dir);
    else
        snprintf(path, sizeof path, "%s:%s", dir, getenv("PATH") ? getenv("PATH") : "/usr/bin");
    setenv("PATH", path, 1);
    return dir;
}

/* Removes a folder fake_dir made, with the fake tools in it. */
static void remove_fake_dir(const char *dir)
{
    char cmd[64];
    snprintf(cmd, sizeof cmd, "/bin/rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

static void free_texts(got_t *g)
{
    for (int i = 0; i < g->n; i++)
        free(g->texts[i]);
    free(g->texts);
}

static void test_native_sleep(void)
{
    got_t g;
    pid_t pid;
    if (!in_path("gdb") && !in_path("eu-stack"))
        SKIP("neither gdb nor eu-stack is installed");
    pid = start_sleeper();
    collect(&pid, 1, 30, &g);
    CHECK_INT(g.n, 1);
    if (g.n == 1) {
        CHECK_CONTAINS(g.texts[0], "sleep");
        CHECK(strstr(g.texts[0], "stack unavailable") == NULL);
        CHECK(strstr(g.texts[0], "[New LWP") == NULL); /* gdb's noise is gone */
    }
    end(pid);
    free_texts(&g);
}

static void test_each_tool_alone(void)
{
    /* gdb and eu-stack each give the stack when the other is absent. */
    static const char *const tools[] = {"gdb", "eu-stack"};
    char *saved = strdup(getenv("PATH") ? getenv("PATH") : "/usr/bin:/bin");
    for (int t = 0; t < 2; t++) {
        char cmd[300], *dir, real[256] = "";
        FILE *p;
        got_t g;
        pid_t pid;
        snprintf(cmd, sizeof cmd, "command -v %s", tools[t]);
        if ((p = popen(cmd, "r")) != NULL) {
            if (fgets(real, sizeof real, p) == NULL)
                real[0] = '\0';
            pclose(p);
        }
        real[strcspn(real, "\n")] = '\0';
        if (real[0] == '\0') {
            printf("  %s not installed: not tried\n", tools[t]);
            continue;
        }
        dir = fake_dir(1);
        snprintf(cmd, sizeof cmd, "/bin/ln -s %s %s/%s", real, dir, tools[t]);
        CHECK(system(cmd) == 0);
        pid = start_sleeper();
        collect(&pid, 1, 30, &g);
        if (g.n == 1)
            CHECK_CONTAINS(g.texts[0], "sleep");
        end(pid);
        free_texts(&g);
        remove_fake_dir(dir);
        strcpy(dir + strlen(dir) - 6, "XXXXXX");
        setenv("PATH", saved, 1);
    }
    free(saved);
}

static void test_stopped_process(void)
{
    got_t g;
    pid_t pid;
    double t;
    if (!in_path("gdb") && !in_path("eu-stack"))
        SKIP("neither gdb nor eu-stack is installed");
    pid = start_sleeper();
    kill(pid, SIGSTOP);
    usleep(50 * 1000);
    t = collect(&pid, 1, 5, &g);
    CHECK(t < 7);
    CHECK(is_stopped(pid)); /* still stopped once the tool has let go of it */
    if (g.n == 1) {
        /* a stack, or a clear reason within the deadline */
        CHECK(strstr(g.texts[0], "sleep") != NULL || strstr(g.texts[0], "stopped") != NULL);
    }
    end(pid);
    free_texts(&g);
}

/* A Python program in time.sleep, running or stopped: py-spy gives its file:line. */
static void python_case(int stop)
{
    char dir[] = "/tmp/mgpu-stacks-py-XXXXXX", script[300], ready[300];
    got_t g;
    pid_t pid;
    FILE *f;

    if (!in_path("py-spy"))
        SKIP("py-spy is not installed (pip install py-spy)");
    if (access("/usr/bin/python3", X_OK) != 0)
        SKIP("no /usr/bin/python3");
    CHECK(mkdtemp(dir) != NULL);
    snprintf(script, sizeof script, "%s/target.py", dir);
    snprintf(ready, sizeof ready, "%s/ready", dir);
    f = fopen(script, "w");
    fprintf(f, "import sys, time\nopen(sys.argv[1], 'w').close()\ntime.sleep(60)\n");
    fclose(f);
    pid = fork();
    if (pid == 0) {
        execl("/usr/bin/python3", "python3", script, ready, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 500 && access(ready, F_OK) != 0; i++)
        usleep(20 * 1000);
    usleep(100 * 1000);
    if (stop)
        kill(pid, SIGSTOP);
    usleep(50 * 1000);
    collect(&pid, 1, 30, &g);
    if (stop)
        CHECK(is_stopped(pid));
    if (g.n == 1) {
        CHECK_CONTAINS(g.texts[0], "target.py:3");
        if (!stop) /* the native frame, clock_nanosleep */
            CHECK_CONTAINS(g.texts[0], "sleep");
    }
    end(pid);
    free_texts(&g);
    unlink(script);
    unlink(ready);
    rmdir(dir);
}

static void test_python_sleep(void)
{
    python_case(0);
}

static void test_python_stopped(void)
{
    python_case(1);
}

static void test_hung_tool_is_killed(void)
{
    char *dir = fake_dir(1);
    got_t g;
    pid_t pids[2];
    double t;

    fake_tool(dir, "gdb", "echo partial output; exec /bin/sleep 600");
    pids[0] = start_sleeper();
    pids[1] = start_sleeper();
    t = collect(pids, 2, 1, &g);
    CHECK(t < 3); /* 1 s deadline, both at once */
    CHECK_INT(g.n, 2);
    for (int i = 0; i < g.n; i++) {
        CHECK_CONTAINS(g.texts[i], "gdb timed out after 1 s");
        CHECK_CONTAINS(g.texts[i], "partial output");
    }
    end(pids[0]);
    end(pids[1]);
    free_texts(&g);
    remove_fake_dir(dir);
}

static void test_failing_tool_hands_over(void)
{
    char *dir = fake_dir(1);
    got_t g;
    pid_t pid;

    fake_tool(dir, "gdb", "echo 'ptrace: Operation not permitted.'; exit 1");
    fake_tool(dir, "eu-stack", "echo \"TID $2:\"; echo '#0  0x1 fake_frame'");
    pid = start_sleeper();
    collect(&pid, 1, 10, &g);
    if (g.n == 1) {
        CHECK_CONTAINS(g.texts[0], "gdb failed (exit status 1: ptrace: Operation not permitted.)");
        CHECK_CONTAINS(g.texts[0], "#0  0x1 fake_frame");
    }
    free_texts(&g);
    /* Both fail: the reasons of both. */
    fake_tool(dir, "eu-stack",
              "echo 'eu-stack: dwfl_linux_proc_attach: Operation not permitted'; exit 1");
    collect(&pid, 1, 10, &g);
    if (g.n == 1) {
        CHECK_CONTAINS(g.texts[0], "stack unavailable: gdb failed (exit status 1: ptrace:");
        CHECK_CONTAINS(g.texts[0], "; eu-stack failed (exit status 1: eu-stack: dwfl");
    }
    end(pid);
    free_texts(&g);
    remove_fake_dir(dir);
}

static void test_output_is_bounded(void)
{
    char *dir = fake_dir(1);
    got_t g;
    pid_t pid;

    fake_tool(
        dir, "gdb",
        "i=0; while [ $i -lt 20000 ]; do echo '#0  0x1 frame_of_a_deep_stack'; i=$((i+1)); done");
    pid = start_sleeper();
    collect(&pid, 1, 30, &g);
    if (g.n == 1) {
        CHECK(strlen(g.texts[0]) < MGPU_STACKS_MAX + 100);
        CHECK(strlen(g.texts[0]) > MGPU_STACKS_MAX - 100);
        CHECK_CONTAINS(g.texts[0], "[cut at 64 KiB]");
    }
    end(pid);
    free_texts(&g);
    remove_fake_dir(dir);
}

static void test_no_tool_no_process(void)
{
    got_t g;
    pid_t pids[2];

    char *dir = fake_dir(1); /* an empty PATH folder: no tool at all */
    pids[0] = start_sleeper();
    pids[1] = fork();
    if (pids[1] == 0)
        _exit(0);
    waitpid(pids[1], NULL, 0); /* gone and reaped */
    collect(pids, 2, 5, &g);
    CHECK_INT(g.n, 2);
    if (g.n == 2) {
        CHECK_CONTAINS(g.texts[0], "stack unavailable: neither gdb nor eu-stack is installed");
        CHECK_CONTAINS(g.texts[1], "stack unavailable: no process");
    }
    end(pids[0]);
    free_texts(&g);
    /* nothing to collect: the callback still runs, once, with no texts */
    collect(NULL, 0, 5, &g);
    CHECK_INT(g.n, 0);
    free_texts(&g);
    remove_fake_dir(dir);
}

static void test_bad_arguments(void)
{
    uv_loop_t loop;
    mgpu_err_t err = {0};
    pid_t pid = 1;
    got_t g = {0};

    uv_loop_init(&loop);
    CHECK_INT(mgpu_stacks_collect(&loop, &pid, 1, 0, on_stacks, &g, &err), MGPU_E_RANGE);
    CHECK_CONTAINS(err.msg, "timeout 0 s");
    CHECK_INT(mgpu_stacks_collect(&loop, &pid, 1, 5, NULL, &g, &err), -EINVAL);
    CHECK_INT(uv_run(&loop, UV_RUN_DEFAULT), 0);
    CHECK_INT(g.calls, 0);
    uv_loop_close(&loop);
}

int main(void)
{
    RUN(test_native_sleep);
    RUN(test_each_tool_alone);
    RUN(test_stopped_process);
    RUN(test_python_sleep);
    RUN(test_python_stopped);
    RUN(test_hung_tool_is_killed);
    RUN(test_failing_tool_hands_over);
    RUN(test_output_is_bounded);
    RUN(test_no_tool_no_process);
    RUN(test_bad_arguments);
    return check_done();
}
