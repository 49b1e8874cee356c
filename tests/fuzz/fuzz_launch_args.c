/* fuzz_launch_args.c - libFuzzer target for what a user types to mgpu-launch: its command line
 * (launcher/cli.c, PET_* variables included), a host list or hostfile with DeepSpeed's
 * --include / --exclude (hosts.c), and CUDA_VISIBLE_DEVICES (common/devices.c). None may crash
 * or leak on any input: each is taken, or refused with a message.
 *
 * Input layout: byte 0 picks the parser (0 command line, 1 --hosts list and a selection, 2
 * hostfile and a selection, 3 CUDA_VISIBLE_DEVICES over 8 simulated GPUs; the rest modulo 4),
 * the other bytes are its text, split at NUL bytes where it takes several strings: the command
 * line's arguments (one of the form PET_NAME=VALUE is put in the environment instead), the
 * list and the selection (the first string --include, the second --exclude).
 *
 *   tests/fuzz/run.sh 20    builds it with clang -fsanitize=fuzzer,address,undefined and runs */
#include <stdint.h> /* uint8_t */
#include <stdio.h>  /* snprintf */
#include <stdlib.h> /* malloc, getenv, mkstemp */
#include <string.h> /* memcpy, strncmp */
#include <unistd.h> /* pwrite, ftruncate */

#include "cli.h"
#include "devices.h"
#include "hosts.h"

#define MAX_ARGS 64

/* The input's strings: text split at NUL bytes (a NUL added at the end). */
static int split(const uint8_t *p, size_t n, char **buf, char **parts, int max)
{
    int k = 0;
    if ((*buf = malloc(n + 1)) == NULL)
        return 0;
    memcpy(*buf, p, n);
    (*buf)[n] = 0;
    for (size_t at = 0; at <= n && k < max; at += strlen(*buf + at) + 1)
        parts[k++] = *buf + at;
    return k;
}

static char *env_kv[MAX_ARGS];
static int env_n;
static const char *fake_getenv(const char *name)
{
    const size_t len = strlen(name);
    for (int i = 0; i < env_n; i++)
        if (strncmp(env_kv[i], name, len) == 0 && env_kv[i][len] == '=')
            return env_kv[i] + len + 1;
    return NULL;
}

static void command_line(const uint8_t *p, size_t n)
{
    char *buf = NULL, *parts[MAX_ARGS], *argv[MAX_ARGS + 2];
    int k = split(p, n, &buf, parts, MAX_ARGS), argc = 0;
    mgpu_cli_t *cli = calloc(1, sizeof *cli);
    mgpu_err_t err = {0};

    argv[argc++] = "mgpu-launch";
    env_n = 0;
    for (int i = 0; i < k; i++) {
        if (strncmp(parts[i], "PET_", 4) == 0 && strchr(parts[i], '=') != NULL)
            env_kv[env_n++] = parts[i];
        else
            argv[argc++] = parts[i];
    }
    argv[argc] = NULL;
    /* --rdzv_token_file - would read stdin: not in a fuzzer */
    for (int i = 1; i < argc; i++)
        if (strstr(argv[i], "token_file") != NULL)
            argc = 1;
    if (cli != NULL && buf != NULL && mgpu_cli_parse(cli, argc, argv, fake_getenv, &err) == 0)
        mgpu_cli_scrub_token(cli);
    free(cli);
    free(buf);
}

static char path[64];
static void host_lists(const uint8_t *p, size_t n, int file)
{
    char *buf = NULL, *parts[3] = {NULL, NULL, NULL};
    mgpu_hosts_t h = {0};
    mgpu_err_t err = {0};
    int k = split(p, n, &buf, parts, 3), rc;

    if (buf == NULL)
        return;
    if (file) {
        static int fd = -1;
        const size_t len = strlen(parts[0]);
        if (fd < 0) {
            const char *dir = getenv("TMPDIR");
            snprintf(path, sizeof path, "%s/mgpu-fuzz-XXXXXX", dir && *dir ? dir : "/tmp");
            if ((fd = mkstemp(path)) < 0)
                abort();
        }
        if (ftruncate(fd, 0) != 0 || (len > 0 && pwrite(fd, parts[0], len, 0) != (ssize_t)len))
            abort();
        rc = mgpu_hosts_read_file(path, &h, &err);
    } else {
        rc = mgpu_hosts_parse_list(parts[0], &h, &err);
    }
    if (rc == 0)
        mgpu_hosts_select(&h, k > 1 ? parts[1] : NULL, k > 2 ? parts[2] : NULL, &err);
    mgpu_hosts_free(&h);
    free(buf);
}

static void visible(const uint8_t *p, size_t n)
{
    static mgpu_gpu_list_t installed;
    mgpu_visible_t vis;
    mgpu_err_t err = {0};
    char *cvd = malloc(n + 1), line[1024];
    if (cvd == NULL)
        return;
    memcpy(cvd, p, n);
    cvd[n] = 0;
    if (installed.count == 0 && mgpu_devices_discover(&installed, "8", NULL, &err) < 0)
        abort();
    mgpu_devices_visible(&installed, cvd, &vis);
    mgpu_devices_describe(&installed, &vis, line, sizeof line);
    free(cvd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    switch (data[0] % 4) {
    case 0:
        command_line(data + 1, size - 1);
        break;
    case 1:
    case 2:
        host_lists(data + 1, size - 1, data[0] % 4 == 2);
        break;
    default:
        visible(data + 1, size - 1);
        break;
    }
    return 0;
}
