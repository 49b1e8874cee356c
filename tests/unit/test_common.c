/* test_common.c - the shared helpers of common/: clock, fdio, atomic_file, path, names, sock. */
#include <errno.h>        /* EPIPE */
#include <fcntl.h>        /* open */
#include <netinet/in.h>   /* sockaddr_in */
#include <signal.h>       /* signal */
#include <sys/resource.h> /* getrlimit */
#include <sys/stat.h>     /* stat */
#include <sys/wait.h>     /* waitpid */
#include <time.h>         /* nanosleep */
#include <unistd.h>       /* pipe */

#include "atomic_file.h"
#include "check.h"
#include "clock.h"
#include "fdio.h"
#include "fs.h"
#include "log.h"
#include "names.h"
#include "netns.h"
#include "path.h"
#include "shm_head.h"
#include "sock.h"
#include "store_proto.h"
#include "text.h"

static void test_clock_mono_advances(void)
{
    struct timespec ts = {0, 20 * 1000000L};
    double t0 = mgpu_clock_mono();
    int64_t n0 = mgpu_clock_mono_ns();
    nanosleep(&ts, NULL);
    CHECK(mgpu_clock_mono() - t0 >= 0.019);
    CHECK(mgpu_clock_mono_ns() - n0 >= 19 * 1000000LL);
    /* The two views are of the same clock. */
    CHECK((double)mgpu_clock_mono_ns() * 1e-9 - mgpu_clock_mono() < 0.01);
    /* Real time is seconds since the epoch (after 2020). */
    CHECK(mgpu_clock_real() > 1.5e9);
}

static void test_fdio_round_trip_in_pieces(void)
{
    int fds[2];
    static char big[300000], back[300000];
    pid_t pid;

    for (size_t i = 0; i < sizeof big; i++)
        big[i] = (char)(i * 7);
    CHECK_INT(pipe(fds), 0);
    /* More than a pipe holds: the writer must loop over partial writes, the reader too. */
    pid = fork();
    if (pid == 0) {
        close(fds[0]);
        _exit(mgpu_fdio_write_all(fds[1], big, sizeof big) == 0 ? 0 : 1);
    }
    close(fds[1]);
    CHECK_INT((int)mgpu_fdio_read_all(fds[0], back, sizeof back), (int)sizeof back);
    CHECK(memcmp(big, back, sizeof big) == 0);
    /* At the end of the stream: 0 bytes, not an error. */
    CHECK_INT((int)mgpu_fdio_read_all(fds[0], back, 10), 0);
    close(fds[0]);
    int status;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static void test_fdio_write_to_closed_pipe_is_epipe(void)
{
    int fds[2];
    signal(SIGPIPE, SIG_IGN);
    CHECK_INT(pipe(fds), 0);
    close(fds[0]);
    CHECK_INT(mgpu_fdio_write_all(fds[1], "x", 1), -EPIPE);
    CHECK_INT(mgpu_fdio_write_all(-1, "x", 1), -EBADF);
    close(fds[1]);
}

static void test_fdio_raise_limit(void)
{
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max > 64) {
        rl.rlim_cur = 64;
        CHECK_INT(setrlimit(RLIMIT_NOFILE, &rl), 0);
    }
    /* Up to what is asked, never down. */
    CHECK(mgpu_fdio_raise_limit(48) >= 48);
    getrlimit(RLIMIT_NOFILE, &rl);
    CHECK(rl.rlim_cur >= 48);
    long top = mgpu_fdio_raise_limit(-1);
    getrlimit(RLIMIT_NOFILE, &rl);
    CHECK(rl.rlim_cur == rl.rlim_max);
    CHECK(top >= 64);
}

static char *tmpdir_make(void)
{
    static char dir[] = "/tmp/mgpu_test_common_XXXXXX";
    return mkdtemp(dir);
}

static void test_atomic_file_write_replaces(void)
{
    char *dir = tmpdir_make(), path[256], tmp[300], buf[64] = {0};
    struct iovec iov[2] = {{.iov_base = "hello ", .iov_len = 6},
                           {.iov_base = "world", .iov_len = 5}};
    mgpu_err_t err = {0};
    int fd;

    CHECK(dir != NULL);
    snprintf(path, sizeof path, "%s/f.json", dir);
    CHECK_INT(mgpu_atomic_file_write(path, iov, 2, 0, &err), 0);
    fd = open(path, O_RDONLY);
    CHECK(fd >= 0);
    CHECK_INT((int)mgpu_fdio_read_all(fd, buf, sizeof buf - 1), 11);
    close(fd);
    CHECK_STR(buf, "hello world");
    /* Replaced whole, and no temporary file left behind. */
    CHECK_INT(mgpu_atomic_file_write(path, iov + 1, 1, MGPU_ATOMIC_FILE_NO_SYNC, &err), 0);
    fd = open(path, O_RDONLY);
    memset(buf, 0, sizeof buf);
    CHECK_INT((int)mgpu_fdio_read_all(fd, buf, sizeof buf - 1), 5);
    close(fd);
    CHECK_STR(buf, "world");
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    struct stat st;
    CHECK(stat(tmp, &st) != 0);
    unlink(path);
    rmdir(dir);
}

static void test_atomic_file_errors_name_the_call(void)
{
    struct iovec iov = {.iov_base = "x", .iov_len = 1};
    mgpu_err_t err = {0};
    CHECK_INT(mgpu_atomic_file_write("/nonexistent_dir_mgpu/f", &iov, 1, 0, &err), -ENOENT);
    CHECK_CONTAINS(err.msg, "open(/nonexistent_dir_mgpu/f.tmp.");
}

/* What a rename must not replace is written in place; a link stays a link. */
static void test_atomic_file_devices_links_and_descriptors(void)
{
    char *dir = tmpdir_make(), file[256], link[256], fdpath[64], buf[64] = {0};
    struct iovec iov = {.iov_base = "new", .iov_len = 3};
    mgpu_err_t err = {0};
    struct stat st, before;

    CHECK(dir != NULL);
    /* devices: /dev/null takes the bytes and stays a device; /dev/full says it is full */
    CHECK_INT(mgpu_atomic_file_write("/dev/null", &iov, 1, 0, &err), 0);
    CHECK(stat("/dev/null", &st) == 0 && S_ISCHR(st.st_mode));
    CHECK_INT(mgpu_atomic_file_write("/dev/full", &iov, 1, 0, &err), -ENOSPC);
    CHECK_CONTAINS(err.msg, "write(/dev/full)");
    CHECK(stat("/dev/full", &st) == 0 && S_ISCHR(st.st_mode));
    /* a link to a file: the file is replaced, the link kept, no temporary left */
    snprintf(file, sizeof file, "%s/real", dir);
    snprintf(link, sizeof link, "%s/link", dir);
    CHECK_INT(mgpu_atomic_file_write(file, &(struct iovec){"old", 3}, 1, 0, &err), 0);
    CHECK(symlink("real", link) == 0);
    CHECK_INT(mgpu_atomic_file_write(link, &iov, 1, 0, &err), 0);
    CHECK(lstat(link, &st) == 0 && S_ISLNK(st.st_mode));
    int fd = open(file, O_RDONLY);
    CHECK_INT((int)mgpu_fdio_read_all(fd, buf, sizeof buf - 1), 3);
    close(fd);
    CHECK_STR(buf, "new");
    /* a descriptor of this process (stdout redirected to a log): appended to, not replaced */
    unlink(link);
    fd = open(file, O_WRONLY | O_APPEND);
    CHECK(fd >= 0 && fstat(fd, &before) == 0);
    snprintf(fdpath, sizeof fdpath, "/proc/self/fd/%d", fd);
    CHECK_INT(mgpu_atomic_file_write(fdpath, &(struct iovec){" more", 5}, 1, 0, &err), 0);
    close(fd);
    CHECK(stat(file, &st) == 0 && st.st_ino == before.st_ino);
    fd = open(file, O_RDONLY);
    memset(buf, 0, sizeof buf);
    CHECK_INT((int)mgpu_fdio_read_all(fd, buf, sizeof buf - 1), 8);
    close(fd);
    CHECK_STR(buf, "new more");
    /* a folder is refused by name; nothing is left in it */
    CHECK_INT(mgpu_atomic_file_write(dir, &iov, 1, 0, &err), -EISDIR);
    CHECK_CONTAINS(err.msg, "is a folder, expected a file");
    unlink(file);
    CHECK(rmdir(dir) == 0);
}

static void test_path_dirname(void)
{
    char out[64];
    CHECK_INT(mgpu_path_dirname("a/b/c", out, sizeof out), 0);
    CHECK_STR(out, "a/b");
    CHECK_INT(mgpu_path_dirname("c", out, sizeof out), 0);
    CHECK_STR(out, ".");
    CHECK_INT(mgpu_path_dirname("/c", out, sizeof out), 0);
    CHECK_STR(out, "/");
    CHECK_INT(mgpu_path_dirname("abcdef/g", out, 4), -ENAMETOOLONG);
}

static void test_fs_mkdir_p_and_remove_tree(void)
{
    char root[] = "/tmp/mgpu_test_fs_XXXXXX", deep[256], file[300], link[300];
    struct stat st;

    CHECK(mkdtemp(root) != NULL);
    snprintf(deep, sizeof deep, "%s/a/b/c", root);
    CHECK_INT(mgpu_fs_mkdir_p(deep), 0);
    CHECK_INT(mgpu_fs_mkdir_p(deep), 0); /* already there: fine */
    CHECK(stat(deep, &st) == 0 && S_ISDIR(st.st_mode));
    snprintf(file, sizeof file, "%s/a/b/f", root);
    CHECK(mgpu_atomic_file_write(file, NULL, 0, MGPU_ATOMIC_FILE_NO_SYNC, &(mgpu_err_t){0}) == 0);
    /* A link to a folder outside is removed, not followed. */
    snprintf(link, sizeof link, "%s/a/out", root);
    CHECK(symlink("/tmp", link) == 0);
    mgpu_fs_remove_tree(root);
    CHECK(stat(root, &st) != 0 && errno == ENOENT);
    CHECK(stat("/tmp", &st) == 0);
}

/* A segment file with a head naming creator pid (magic: libmgpu's or not). */
static void shm_file(const char *dir, const char *name, int pid, int magic)
{
    char path[400];
    mgpu_shm_head_t h = {.magic = magic ? MGPU_SHM_MAGIC : 1,
                         .version = MGPU_SHM_VERSION,
                         .size = 2,
                         .creator_pid = pid};
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0600);
    CHECK(fd >= 0 && write(fd, &h, sizeof h) == (ssize_t)sizeof h);
    close(fd);
}

static int exists(const char *dir, const char *name)
{
    char path[400];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return stat(path, &st) == 0;
}

/* Only this user's libmgpu segments whose creator is dead go. */
static void test_shm_remove_stale(void)
{
    char dir[] = "/tmp/mgpu_test_shm_XXXXXX", mine[64], other[64];
    unsigned uid = (unsigned)getuid();
    pid_t dead = fork();
    if (dead == 0)
        _exit(0);
    CHECK(dead > 0 && waitpid(dead, NULL, 0) == dead); /* its pid names no process now */
    CHECK(mkdtemp(dir) != NULL);
    snprintf(mine, sizeof mine, "mgpu-%u-", uid);
    snprintf(other, sizeof other, "mgpu-%u-00dead", uid + 1);
    char a[96], b[96], c[96], d[96];
    snprintf(a, sizeof a, "%s00dead", mine);
    snprintf(b, sizeof b, "%s00live", mine);
    snprintf(c, sizeof c, "%s00nohead", mine);
    snprintf(d, sizeof d, "%s00foreign", mine);
    shm_file(dir, a, (int)dead, 1);
    shm_file(dir, b, (int)getpid(), 1);
    shm_file(dir, c, 0, 1);         /* the creator has not written its head yet */
    shm_file(dir, d, (int)dead, 0); /* not libmgpu's */
    shm_file(dir, other, (int)dead, 1);
    CHECK_INT(mgpu_shm_remove_stale(dir, uid), 1);
    CHECK(!exists(dir, a) && exists(dir, b) && exists(dir, c) && exists(dir, d));
    CHECK(exists(dir, other)); /* named for another user */
    CHECK_INT(mgpu_shm_remove_stale("/nonexistent/dir", uid), 0);
    mgpu_fs_remove_tree(dir);
}

static void test_sock_loopback(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001)};
    struct sockaddr_in b = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x0a000001)};
    struct sockaddr_in6 c = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    CHECK_INT(mgpu_sock_addr_is_loopback((struct sockaddr *)&a), 1);
    CHECK_INT(mgpu_sock_addr_is_loopback((struct sockaddr *)&b), 0);
    CHECK_INT(mgpu_sock_addr_is_loopback((struct sockaddr *)&c), 1);
    CHECK_INT(mgpu_sock_is_loopback("127.0.0.2"), 1);
    CHECK_INT(mgpu_sock_is_loopback("localhost"), 1);
    CHECK_INT(mgpu_sock_is_loopback("10.0.0.1"), 0);
    char hp[64];
    CHECK_STR(mgpu_sock_hostport(hp, sizeof hp, "node0", 29500), "node0:29500");
    CHECK_STR(mgpu_sock_hostport(hp, sizeof hp, "10.0.0.1", 1), "10.0.0.1:1");
    CHECK_STR(mgpu_sock_hostport(hp, sizeof hp, "fd00::1", 29400), "[fd00::1]:29400");
}

/* n picks of mgpu_sock_free_port: each within [lo, hi) and outside [skip_lo, skip_hi), and
 * not all the same. */
static void check_free_ports(int n, int lo, int hi, int skip_lo, int skip_hi)
{
    int first = -1, differ = 0;
    for (int i = 0; i < n; i++) {
        const int p = mgpu_sock_free_port();
        if (p < lo || p >= hi || (p >= skip_lo && p < skip_hi)) {
            printf("  free port %d: expected one in [%d, %d) outside [%d, %d)\n", p, lo, hi,
                   skip_lo, skip_hi);
            check_failed++;
            return;
        }
        differ |= first >= 0 && p != first;
        first = first < 0 ? p : first;
    }
    CHECK(differ);
}

/* The free port (a one-node job's MASTER_PORT) lies below the kernel's ephemeral range, where
 * no outgoing connection takes it before a worker listens there; when the range leaves no
 * room below it, the kernel picks. Each range is set in a network namespace of its own (root). */
static void test_sock_free_port_below_the_ephemeral_range(void)
{
    if (netns_enter(40000, 60999) != 0)
        SKIP("no network namespace of its own with its own ephemeral range here");
    check_free_ports(200, 20000, 40000, 29400, 29600);
    CHECK_INT(netns_ephemeral(20500, 60999), 0);
    check_free_ports(50, 20500, 61000, 0, 0);
}

enum { COLOR_RED, COLOR_GREEN, COLOR_HOLE, COLOR_BLUE };

static void test_text_trim_and_append_line(void)
{
    char a[] = " \t x y \t", b[] = "", c[] = "   ";
    CHECK_STR(mgpu_trim(a), "x y");
    CHECK_STR(mgpu_trim(b), "");
    CHECK_STR(mgpu_trim(c), "");
    char buf[12] = "";
    mgpu_append_line(buf, sizeof buf, "a=%d", 1);
    mgpu_append_line(buf, sizeof buf, "%s", "bc");
    CHECK_STR(buf, "a=1\nbc\n");
    mgpu_append_line(buf, sizeof buf, "%s", "defghij"); /* cut to what fits */
    CHECK_STR(buf, "a=1\nbc\ndef\n");
    mgpu_append_line(buf, sizeof buf, "%s", "k"); /* full: dropped */
    CHECK_STR(buf, "a=1\nbc\ndef\n");
}

static void test_names_both_ways(void)
{
    static const char *const names[] = {
        [COLOR_RED] = "red", [COLOR_GREEN] = "green", [COLOR_BLUE] = "blue"};
    CHECK_INT(MGPU_NAMES_COUNT(names), 4);
    CHECK_STR(mgpu_names_get(names, MGPU_NAMES_COUNT(names), COLOR_GREEN, "?"), "green");
    CHECK_STR(mgpu_names_get(names, MGPU_NAMES_COUNT(names), COLOR_HOLE, "?"), "?");
    CHECK_STR(mgpu_names_get(names, MGPU_NAMES_COUNT(names), 4, "?"), "?");
    CHECK_STR(mgpu_names_get(names, MGPU_NAMES_COUNT(names), -1, "none"), "none");
    CHECK_INT(mgpu_names_find(names, MGPU_NAMES_COUNT(names), "Blue"), COLOR_BLUE);
    CHECK_INT(mgpu_names_find(names, MGPU_NAMES_COUNT(names), "purple"), -1);
    /* The tables written with it. */
    CHECK_STR(mgpu_store_op_name(MGPU_STORE_OP_COMPARE_SET), "COMPARE_SET");
    CHECK_STR(mgpu_store_op_name(MGPU_STORE_OP_GET | MGPU_STORE_RESP), "GET");
    CHECK_STR(mgpu_store_op_name(0), "?");
    CHECK_STR(mgpu_store_op_name(200), "?");
    CHECK_STR(mgpu_store_status_name(MGPU_STORE_ST_AUTH), "authentication failed");
    CHECK_INT(mgpu_log_level_parse("WARNING"), MGPU_LOG_WARN);
    CHECK_INT(mgpu_log_level_parse("warn"), MGPU_LOG_WARN);
    CHECK_INT(mgpu_log_level_parse("critical"), MGPU_LOG_ERROR);
    CHECK_INT(mgpu_log_level_parse("Debug"), MGPU_LOG_DEBUG);
    CHECK_INT(mgpu_log_level_parse("loud"), -1);
}

int main(void)
{
    RUN(test_clock_mono_advances);
    RUN(test_text_trim_and_append_line);
    RUN(test_fdio_round_trip_in_pieces);
    RUN(test_fdio_write_to_closed_pipe_is_epipe);
    RUN(test_fdio_raise_limit);
    RUN(test_atomic_file_write_replaces);
    RUN(test_atomic_file_errors_name_the_call);
    RUN(test_atomic_file_devices_links_and_descriptors);
    RUN(test_path_dirname);
    RUN(test_fs_mkdir_p_and_remove_tree);
    RUN(test_sock_loopback);
    RUN(test_sock_free_port_below_the_ephemeral_range);
    RUN(test_names_both_ways);
    RUN(test_shm_remove_stale);
    return check_done();
}
