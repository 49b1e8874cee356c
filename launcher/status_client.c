/* status_client.c - `mgpu-launch status` (see status_client.h). */
#include "status_client.h"

#include <cjson/cJSON.h> /* the launchers' answers */
#include <dirent.h>      /* opendir */
#include <errno.h>       /* errno */
#include <libgen.h>      /* basename */
#include <signal.h>      /* kill */
#include <stdlib.h>      /* strtol */
#include <string.h>      /* strcmp */
#include <sys/socket.h>  /* connect */
#include <sys/stat.h>    /* lstat */
#include <sys/time.h>    /* struct timeval */
#include <sys/un.h>      /* sockaddr_un */
#include <time.h>        /* localtime_r */
#include <unistd.h>      /* getuid */

#include "clock.h"         /* mgpu_clock_real */
#include "log.h"           /* mgpu_error */
#include "status_server.h" /* mgpu_status_dirs */

/* Whether the launcher behind path ended while it was asked: a launcher removes its socket
 * before it closes the connections, and one killed leaves no process behind its pid (the
 * socket's name). Waits up to a second for either. */
static int ended(const char *path)
{
    char copy[600];
    long pid;

    snprintf(copy, sizeof copy, "%s", path);
    pid = strtol(basename(copy), NULL, 10);
    for (int i = 0; i < 100; i++) {
        if (access(path, F_OK) != 0 && errno == ENOENT)
            return 1;
        if (pid > 0 && kill((pid_t)pid, 0) != 0 && errno == ESRCH)
            return 1;
        usleep(10 * 1000);
    }
    return 0;
}

/* The answer of the launcher listening on path, or NULL (*bad set when it failed in a way
 * worth an exit status of 1; a job that ends while it is asked is just not listed). */
static cJSON *ask(const char *path, int stacks, int *bad)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    /* stacks take the launcher a few seconds to collect */
    struct timeval tv = {.tv_sec = stacks ? 60 : 10};
    const char *req = stacks ? "{\"stacks\": true}\n" : "{\"stacks\": false}\n";
    char *buf = NULL;
    size_t len = 0, cap = 0;
    cJSON *j = NULL;
    int read_err = 0;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

    if (fd < 0) {
        mgpu_error("socket(AF_UNIX): %s", strerror(errno));
        *bad = 1;
        return NULL;
    }
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        if (errno == ENOENT) {
            /* ended between the listing and now */
        } else if (errno == ECONNREFUSED) {
            /* its launcher is gone (killed before it could remove it) */
            mgpu_info("removing %s: no launcher listens on it", path);
            unlink(path);
        } else {
            mgpu_error("connect(%s): %s", path, strerror(errno));
            *bad = 1;
        }
        close(fd);
        return NULL;
    }
    if (send(fd, req, strlen(req), MSG_NOSIGNAL) != (ssize_t)strlen(req)) {
        int err = errno;
        close(fd);
        if (!ended(path)) {
            mgpu_error("write(%s): %s", path, strerror(err));
            *bad = 1;
        }
        return NULL;
    }
    for (;;) {
        ssize_t n;
        if (len + 4096 + 1 > cap) {
            char *nb = realloc(buf, cap = cap * 2 + 8192);
            if (nb == NULL)
                break;
            buf = nb;
        }
        n = read(fd, buf + len, cap - len - 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (n < 0)
                read_err = errno;
            break;
        }
        len += (size_t)n;
    }
    close(fd);
    if (buf != NULL) {
        buf[len] = '\0';
        j = cJSON_ParseWithOpts(buf, NULL, 0);
    }
    if (j == NULL && ended(path)) {
        free(buf);
        return NULL;
    }
    if (j == NULL && read_err != 0) {
        mgpu_error("read(%s): %s", path, strerror(read_err));
        *bad = 1;
        free(buf);
        return NULL;
    }
    if (j == NULL || cJSON_GetObjectItemCaseSensitive(j, "error") != NULL) {
        const cJSON *e = j != NULL ? cJSON_GetObjectItemCaseSensitive(j, "error") : NULL;
        mgpu_error("%s: %s", path,
                   cJSON_IsString(e) ? e->valuestring
                                     : (len == 0 ? "no answer (another user's launcher?)"
                                                 : "the answer is not JSON"));
        cJSON_Delete(j);
        j = NULL;
        *bad = 1;
    }
    free(buf);
    return j;
}

/* Every socket in dir: lstat says it is ours and 0600 before anything is sent to it. */
static void ask_dir(const char *dir, int stacks, cJSON *jobs, int *bad)
{
    DIR *d = opendir(dir);
    struct dirent *e;

    if (d == NULL) {
        if (errno != ENOENT) {
            mgpu_error("opendir(%s): %s", dir, strerror(errno));
            *bad = 1;
        }
        return;
    }
    while ((e = readdir(d)) != NULL) {
        char path[600];
        struct stat st;
        size_t n = strlen(e->d_name);
        cJSON *j;

        if (n < 6 || strcmp(e->d_name + n - 5, ".sock") != 0)
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (lstat(path, &st) != 0)
            continue;
        if (!S_ISSOCK(st.st_mode) || st.st_uid != getuid() || (st.st_mode & 077) != 0) {
            mgpu_error("refusing %s: %s of uid %d with mode %04o, expected a socket of uid %d "
                       "with mode 0600",
                       path, S_ISSOCK(st.st_mode) ? "a socket" : "not a socket", (int)st.st_uid,
                       (unsigned)(st.st_mode & 07777), (int)getuid());
            *bad = 1;
            continue;
        }
        if ((j = ask(path, stacks, bad)) != NULL) {
            cJSON_AddStringToObject(j, "socket", path);
            cJSON_AddItemToArray(jobs, j);
        }
    }
    closedir(d);
}

static double num(const cJSON *o, const char *k, double dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

static const char *str(const cJSON *o, const char *k, const char *dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : dflt;
}

static void print_rank(const cJSON *r, FILE *out)
{
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(r, "collective");
    const cJSON *stack = cJSON_GetObjectItemCaseSensitive(r, "stack");
    char state[64], step[32], coll[128] = "-";

    if (cJSON_GetObjectItemCaseSensitive(r, "signal") != NULL)
        snprintf(state, sizeof state, "killed (SIG%s)", str(r, "signal", "?"));
    else if (strcmp(str(r, "state", "?"), "exited") == 0)
        snprintf(state, sizeof state, "exited %d", (int)num(r, "exit_code", -1));
    else
        snprintf(state, sizeof state, "%s", str(r, "state", "?"));
    if (cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(r, "step")))
        snprintf(step, sizeof step, "%lld", (long long)num(r, "step", -1));
    else
        snprintf(step, sizeof step, "-");
    if (cJSON_IsObject(c))
        snprintf(coll, sizeof coll, "%s #%lld for %.1f s", str(c, "op", "?"),
                 (long long)num(c, "seq", 0), num(c, "for_s", 0));
    fprintf(out, "  %-5d %-5d %-8d %-15s %-11s %-7s %7.1f s  %-26s %s%s%s\n",
            (int)num(r, "rank", -1), (int)num(r, "local_rank", -1), (int)num(r, "pid", -1), state,
            str(r, "phase", "-"), step, num(r, "progress_age_s", 0), coll,
            str(r, "last_line", "")[0] ? "\"" : "", str(r, "last_line", ""),
            str(r, "last_line", "")[0] ? "\"" : "");
    if (cJSON_IsString(stack)) {
        fprintf(out, "    stack of rank %d (pid %d):\n", (int)num(r, "rank", -1),
                (int)num(r, "pid", -1));
        for (const char *p = stack->valuestring; *p;) {
            size_t n = strcspn(p, "\n");
            fprintf(out, "      %.*s\n", (int)n, p);
            p += n + (p[n] == '\n');
        }
    }
}

static void print_job(const cJSON *j, FILE *out)
{
    const cJSON *ranks = cJSON_GetObjectItemCaseSensitive(j, "ranks"), *r;
    const cJSON *argv = cJSON_GetObjectItemCaseSensitive(j, "argv"), *a;
    double start = num(j, "start_time", 0), stall = num(j, "stall_timeout", 0);
    time_t t = (time_t)start;
    struct tm tm;
    char when[64] = "?";

    if (localtime_r(&t, &tm) != NULL)
        strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
    fprintf(out, "job of launcher %d on %s, run id %s:", (int)num(j, "launcher_pid", -1),
            str(j, "host", "?"), str(j, "run_id", "?"));
    cJSON_ArrayForEach(a, argv) if (cJSON_IsString(a)) fprintf(out, " %s", a->valuestring);
    fprintf(out, "\n  started %s (%.0f s ago), attempt %d (max_restarts %d), ", when,
            mgpu_clock_real() - start, (int)num(j, "attempt", 0), (int)num(j, "max_restarts", 0));
    if (stall > 0)
        fprintf(out, "stall timeout %g s, %d stall%s reported\n", stall, (int)num(j, "stalls", 0),
                (int)num(j, "stalls", 0) == 1 ? "" : "s");
    else
        fprintf(out, "no stall detection (--stall_timeout)\n");
    fprintf(out, "  %-5s %-5s %-8s %-15s %-11s %-7s %9s  %-26s %s\n", "RANK", "LOCAL", "PID",
            "STATE", "PHASE", "STEP", "PROGRESS", "COLLECTIVE", "LAST LINE");
    cJSON_ArrayForEach(r, ranks) print_rank(r, out);
}

int mgpu_status_client_main(int argc, char **argv, FILE *out)
{
    char dirs[2][256];
    int stacks = 0, json = 0, bad = 0, ndirs;
    cJSON *root, *jobs;
    mgpu_err_t err = {0};

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--stacks") == 0) {
            stacks = 1;
        } else if (strcmp(argv[i], "--json") == 0) {
            json = 1;
        } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            fprintf(out, "usage: mgpu-launch status [--stacks] [--json]\n"
                         "  the running jobs of this user on this host: each rank's pid, state, "
                         "phase, step,\n  age of its progress and the collective it is in\n"
                         "  --stacks  every rank's stack too\n"
                         "  --json    one JSON object {\"jobs\": [...]} for scripts\n");
            return 0;
        } else {
            mgpu_error("status: unknown option '%s': expected --stacks or --json", argv[i]);
            return 2;
        }
    }
    root = cJSON_CreateObject();
    if (root == NULL)
        return 1;
    cJSON_AddNumberToObject(root, "uid", (double)getuid());
    jobs = cJSON_AddArrayToObject(root, "jobs");
    ndirs = mgpu_status_dirs(dirs);
    for (int i = 0; i < ndirs; i++) {
        int rc = mgpu_status_check_dir(dirs[i], 0, &err);
        if (rc == -ENOENT)
            continue;
        if (rc < 0) {
            mgpu_error("refusing the status folder: %s", err.msg);
            bad = 1;
            continue;
        }
        ask_dir(dirs[i], stacks, jobs, &bad);
    }
    if (json) {
        char *text = cJSON_Print(root);
        if (text != NULL)
            fprintf(out, "%s\n", text);
        cJSON_free(text);
    } else if (cJSON_GetArraySize(jobs) == 0) {
        fprintf(out, "no running mgpu-launch job of uid %d on this host\n", (int)getuid());
    } else {
        const cJSON *j;
        int first = 1;
        cJSON_ArrayForEach(j, jobs)
        {
            if (!first)
                fprintf(out, "\n");
            print_job(j, out);
            first = 0;
        }
    }
    cJSON_Delete(root);
    return bad;
}
