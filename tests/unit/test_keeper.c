/* test_keeper.c - the keeper's messages read back as sent, and a dead launcher's files
 * removed: empty folders go, files of every kind stay, links are not followed. */
#include <errno.h>    /* EINVAL */
#include <fcntl.h>    /* open, O_NONBLOCK */
#include <stdio.h>    /* snprintf */
#include <stdlib.h>   /* mkdtemp, getenv */
#include <string.h>   /* memset */
#include <sys/stat.h> /* mkdir, mkfifo, lstat */
#include <unistd.h>   /* pipe2, symlink */

#include "check.h"
#include "fs.h" /* mgpu_fs_remove_tree */
#include "keeper.h"

/* A fresh folder for one test, under TMPDIR. */
static void tmp_dir(char *out, size_t n)
{
    const char *t = getenv("TMPDIR");
    snprintf(out, n, "%s/test_keeper_XXXXXX", t && *t ? t : "/tmp");
    if (mkdtemp(out) == NULL)
        out[0] = '\0';
}

static int exists(const char *base, const char *rel)
{
    char p[512];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", base, rel);
    return lstat(p, &st) == 0;
}

static void make_dir(const char *base, const char *rel)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", base, rel);
    CHECK_INT(mkdir(p, 0755), 0);
}

static void make_file(const char *base, const char *rel)
{
    char p[512];
    int fd;
    snprintf(p, sizeof p, "%s/%s", base, rel);
    fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CHECK(fd >= 0);
    if (fd >= 0)
        close(fd);
}

/* A run folder after a killed launcher: a worker's error file, empty rank folders, a FIFO and
 * a link to a folder outside it, whose empty folder must not be touched. */
static void test_prune_keeps_files(void)
{
    char root[256], out[256], p[512];

    tmp_dir(root, sizeof root);
    tmp_dir(out, sizeof out);
    CHECK(root[0] && out[0]);
    make_dir(root, "attempt_0");
    make_dir(root, "attempt_0/0");
    make_file(root, "attempt_0/0/error.json");
    make_dir(root, "attempt_0/1");
    make_dir(root, "attempt_1");
    make_dir(root, "attempt_1/0");
    make_dir(root, "attempt_1/0/deeper");
    make_dir(root, "fifo_here");
    snprintf(p, sizeof p, "%s/fifo_here/timer", root);
    CHECK_INT(mkfifo(p, 0600), 0);
    make_dir(out, "empty");
    snprintf(p, sizeof p, "%s/link", root);
    CHECK_INT(symlink(out, p), 0);

    mgpu_keeper_prune(root);

    CHECK(exists(root, "attempt_0/0/error.json"));
    CHECK(!exists(root, "attempt_0/1"));
    CHECK(!exists(root, "attempt_1"));
    CHECK(exists(root, "fifo_here/timer"));
    CHECK(exists(root, "link"));
    CHECK(exists(out, "empty"));
    mgpu_fs_remove_tree(root);
    mgpu_fs_remove_tree(out);
}

static void test_prune_empty_tree_goes(void)
{
    char root[256];
    struct stat st;

    tmp_dir(root, sizeof root);
    make_dir(root, "a");
    make_dir(root, "a/b");
    make_dir(root, "a/b/c");
    make_dir(root, "d");
    mgpu_keeper_prune(root);
    CHECK(lstat(root, &st) != 0 && errno == ENOENT);
}

/* More entries than one getdents64 buffer holds, removed while their folder is listed. */
static void test_prune_many_entries(void)
{
    char root[256], name[64];
    int left = 0;

    tmp_dir(root, sizeof root);
    for (int i = 0; i < 400; i++) {
        snprintf(name, sizeof name, "rank_folder_with_a_long_name_%03d", i);
        make_dir(root, name);
        if (i % 50 == 7) {
            snprintf(name, sizeof name, "rank_folder_with_a_long_name_%03d/stderr.log", i);
            make_file(root, name);
        }
    }
    mgpu_keeper_prune(root);
    for (int i = 0; i < 400; i++) {
        snprintf(name, sizeof name, "rank_folder_with_a_long_name_%03d", i);
        left += exists(root, name);
        if (i % 50 == 7)
            CHECK(exists(root, name));
    }
    CHECK_INT(left, 8);
    mgpu_fs_remove_tree(root);
}

/* Not a folder, or gone: nothing happens, nothing crashes. */
static void test_prune_not_a_folder(void)
{
    char root[256], p[512];

    tmp_dir(root, sizeof root);
    make_file(root, "file");
    snprintf(p, sizeof p, "%s/file", root);
    mgpu_keeper_prune(p);
    CHECK(exists(root, "file"));
    snprintf(p, sizeof p, "%s/missing", root);
    mgpu_keeper_prune(p);
    mgpu_fs_remove_tree(root);
}

/* Every message read back as sent, in order; the paths, once cleaned, are gone (the FIFO told
 * after its folder goes first, so the folder can go too). */
static void test_messages_and_clean(void)
{
    mgpu_keeper_paths_t paths = {0};
    char root[256], timer_dir[512], fifo[600], sock[512], run[512];
    int fds[2];
    int32_t v;

    tmp_dir(root, sizeof root);
    snprintf(timer_dir, sizeof timer_dir, "%s/mgpu-timer-x", root);
    snprintf(fifo, sizeof fifo, "%s/timer", timer_dir);
    snprintf(sock, sizeof sock, "%s/123.sock", root);
    snprintf(run, sizeof run, "%s/mgpu_none_x", root);
    CHECK_INT(mkdir(timer_dir, 0700), 0);
    CHECK_INT(mkfifo(fifo, 0600), 0);
    make_file(root, "123.sock");
    CHECK_INT(mkdir(run, 0700), 0);
    make_dir(run, "attempt_0");
    make_file(run, "attempt_0/filtered_stdout.log");
    make_dir(run, "attempt_0/0");

    CHECK_INT(pipe2(fds, O_CLOEXEC), 0);
    CHECK_INT(mgpu_keeper_send_path(fds[1], run), 0);
    CHECK_INT(mgpu_keeper_send(fds[1], 4242), 0);
    CHECK_INT(mgpu_keeper_send_path(fds[1], sock), 0);
    CHECK_INT(mgpu_keeper_send_path(fds[1], timer_dir), 0);
    CHECK_INT(mgpu_keeper_send_path(fds[1], fifo), 0);
    CHECK_INT(mgpu_keeper_send(fds[1], MGPU_KEEPER_QUIT), 0);
    close(fds[1]);

    CHECK_INT(mgpu_keeper_read(fds[0], &paths, &v), 1);
    CHECK_INT(v, MGPU_KEEPER_PATH);
    CHECK_INT(mgpu_keeper_read(fds[0], &paths, &v), 1);
    CHECK_INT(v, 4242);
    for (int i = 0; i < 3; i++) {
        CHECK_INT(mgpu_keeper_read(fds[0], &paths, &v), 1);
        CHECK_INT(v, MGPU_KEEPER_PATH);
    }
    CHECK_INT(mgpu_keeper_read(fds[0], &paths, &v), 1);
    CHECK_INT(v, MGPU_KEEPER_QUIT);
    CHECK_INT(mgpu_keeper_read(fds[0], &paths, &v), -1); /* EOF */
    close(fds[0]);
    CHECK_INT(paths.n, 4);
    CHECK_STR(paths.path[0], run);
    CHECK_STR(paths.path[3], fifo);

    mgpu_keeper_clean(&paths);
    CHECK_INT(paths.n, 0);
    CHECK(!exists(root, "123.sock"));
    CHECK(!exists(root, "mgpu-timer-x"));
    CHECK(exists(run, "attempt_0/filtered_stdout.log"));
    CHECK(!exists(run, "attempt_0/0"));
    mgpu_fs_remove_tree(root);
}

/* "forget": nothing told before it is removed. */
static void test_forget(void)
{
    mgpu_keeper_paths_t paths = {0};
    char root[256];
    int fds[2];
    int32_t v;

    tmp_dir(root, sizeof root);
    make_dir(root, "empty");
    CHECK_INT(pipe2(fds, O_CLOEXEC), 0);
    CHECK_INT(mgpu_keeper_send_path(fds[1], root), 0);
    CHECK_INT(mgpu_keeper_send(fds[1], MGPU_KEEPER_FORGET), 0);
    close(fds[1]);
    while (mgpu_keeper_read(fds[0], &paths, &v) > 0)
        ;
    close(fds[0]);
    CHECK_INT(v, MGPU_KEEPER_FORGET);
    CHECK_INT(paths.n, 0);
    mgpu_keeper_clean(&paths);
    CHECK(exists(root, "empty"));
    mgpu_fs_remove_tree(root);
}

/* A non-blocking pipe with nothing in it: 0, not EOF. */
static void test_read_nothing_yet(void)
{
    mgpu_keeper_paths_t paths = {0};
    int fds[2];
    int32_t v;

    CHECK_INT(pipe2(fds, O_CLOEXEC | O_NONBLOCK), 0);
    CHECK_INT(mgpu_keeper_read(fds[0], &paths, &v), 0);
    CHECK_INT(mgpu_keeper_send(fds[1], 7), 0);
    CHECK_INT(mgpu_keeper_read(fds[0], &paths, &v), 1);
    CHECK_INT(v, 7);
    CHECK_INT(mgpu_keeper_read(fds[0], &paths, &v), 0);
    close(fds[1]);
    CHECK_INT(mgpu_keeper_read(fds[0], &paths, &v), -1);
    close(fds[0]);
}

/* A full table drops the paths beyond it and stays in step with the messages after them; a
 * path too long for one atomic write, or empty, is refused unsent. */
static void test_full_table_and_bad_paths(void)
{
    mgpu_keeper_paths_t paths = {0};
    char path[64], huge[MGPU_KEEPER_PATH_MAX + 1];
    int fds[2];
    int32_t v = 0;

    CHECK_INT(pipe2(fds, O_CLOEXEC), 0);
    memset(huge, 'a', sizeof huge - 1);
    huge[sizeof huge - 1] = '\0';
    CHECK_INT(mgpu_keeper_send_path(fds[1], huge), -ENAMETOOLONG);
    CHECK_INT(mgpu_keeper_send_path(fds[1], ""), -EINVAL);
    for (int i = 0; i < MGPU_KEEPER_NPATHS + 3; i++) {
        snprintf(path, sizeof path, "/nonexistent/keeper-test/%d", i);
        CHECK_INT(mgpu_keeper_send_path(fds[1], path), 0);
    }
    CHECK_INT(mgpu_keeper_send(fds[1], 99), 0);
    close(fds[1]);
    while (mgpu_keeper_read(fds[0], &paths, &v) > 0 && v != 99)
        ;
    close(fds[0]);
    CHECK_INT(v, 99);
    CHECK_INT(paths.n, MGPU_KEEPER_NPATHS);
    CHECK_STR(paths.path[MGPU_KEEPER_NPATHS - 1], "/nonexistent/keeper-test/7");
}

int main(void)
{
    RUN(test_prune_keeps_files);
    RUN(test_prune_empty_tree_goes);
    RUN(test_prune_many_entries);
    RUN(test_prune_not_a_folder);
    RUN(test_messages_and_clean);
    RUN(test_forget);
    RUN(test_read_nothing_yet);
    RUN(test_full_table_and_bad_paths);
    return check_done();
}
