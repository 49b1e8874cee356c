/* testworker.c - the program the integration tests start under mgpu-launch.
 *
 * It runs a list of actions, left to right:   testworker ACTION [ARGS] ACTION [ARGS] ...
 * In string arguments %r is $RANK, %l $LOCAL_RANK, %a $TORCHELASTIC_RESTART_COUNT, %p the pid.
 *
 *   only R[,R...]           the next action runs only on these RANKs
 *   env FILE                writes the whole environment, one VAR=value a line
 *   argv FILE               writes argv (argv[0] included), one a line, then exits 0
 *   touch FILE              creates FILE (a "ready" marker)
 *   fds FILE                writes the open descriptors, "N -> target" a line
 *   ids FILE                writes "pid pgid sid ppid"
 *   cuda FILE               asks the CUDA driver (libcuda.so.1, loaded at run time) what this
 *                           process sees: "count N", then "ORDINAL GPU-uuid" a line (count 0
 *                           when cuInit says CUDA_ERROR_NO_DEVICE); or "nodriver" / "error CODE"
 *   waitall PREFIX N        waits until files PREFIX0 .. PREFIX<N-1> all exist
 *   waitfile FILE           waits until FILE exists
 *   print TEXT / eprint TEXT      a line to stdout / stderr
 *   noeol TEXT / enoeol TEXT      the text without a newline
 *   exit N                  exits with status N
 *   raise SIG               dies by SIG sent to itself (default disposition restored first)
 *   segv                    a real invalid memory access
 *   trap FILE SIGS          SIGS (TERM,INT,...): append "NAME <CLOCK_MONOTONIC ns>" to FILE, then
 *                           die by that signal (USR1/USR2: record and go on)
 *   ignore FILE SIGS        SIGS: append the record to FILE and go on
 *   sleep SECS              sleeps SECS in all, whatever signals arrive
 *   pause                   sleeps forever
 *   spawn MODE PIDFILE SIGFILE   forks a grandchild that writes its pid to PIDFILE, records
 *                           TERM,INT,HUP,QUIT,USR1,USR2 to SIGFILE, and sleeps forever. MODE:
 *                           pg (stays in the worker's process group), setsid (a session of its
 *                           own); "-stubborn" (pg-stubborn, setsid-stubborn) ignores TERM,INT,HUP
 *   fail_until N CODE       exits CODE while TORCHELASTIC_RESTART_COUNT < N
 *   errfile MSG             writes torchrun's JSON error file at $TORCHELASTIC_ERROR_FILE
 *   stamp_exit FILE CODE    writes CLOCK_MONOTONIC ns to FILE, then _exit(CODE)
 *   output NLINES SEED      writes NLINES lines to stdout and NLINES to stderr, 0 B to 100 KB
 *                           long, in write() calls of random sizes that split lines, then one
 *                           line to each without a newline
 *   output_short NLINES SEED     the same with lines of 0..120 bytes only
 *   allreduce_loop SECS     ignores SIGTERM (the launcher's SIGKILL after its grace period
 *                           ends it), joins libmgpu from the environment (mgpu_init, a CPU
 *                           communicator of the whole world, libmgpu's default 300 s timeout),
 *                           then sums 64 floats (and a flag) over the world every 10 ms,
 *                           checking the sums, until SECS have passed since the action began
 *                           (on any rank: every rank stops after the same all-reduce): then
 *                           "allreduce_loop: N all-reduces in X.X s" on stdout and the next
 *                           action. The first error ends the process with status 3 after
 *                           "allreduce_loop: error after X.X s: MESSAGE" on stderr (X.X:
 *                           seconds since the action began, mgpu_init included)
 *
 * And a checker, run outside the launcher:
 *   testworker verify FILE STREAM RANKS NLINES SEED TEMPLATE ROLE [pieces]
 *     FILE holds what the launcher wrote for STREAM (1 stdout, 2 stderr) of the local ranks in
 *     RANKS (a comma list, rank = local rank), made by "output NLINES SEED"; every line must
 *     start with the rank's prefix (TEMPLATE expanded as the launcher does; "" = no prefix,
 *     then RANKS must be one rank) and every rank's lines must arrive whole, once, in order.
 *     With "pieces" (the launcher's console, which shows a line its writer paused in for the
 *     quiet time, and ends it there when another rank writes): a line may also arrive as
 *     consecutive pieces of that rank, each on a console line of its own with the prefix, its
 *     bytes exact and in order, but in at most 1% of a rank's lines (plus one).
 *     Prints "verify ok: ..." and exits 0, or says what is wrong and exits 1.
 *
 * And a stopwatch for the benchmark:
 *   testworker timeit N OUTFILE CMD [ARGS...]
 *     runs CMD N times, one after the other (fork, execvp, waitpid), and writes one line a run
 *     to OUTFILE: "<start-to-exit ns> <exit status> <start> <end>" (exit status 128+N when
 *     killed by N; start and end in CLOCK_MONOTONIC ns). */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "atomic_file.h" /* mgpu_atomic_file_write */
#include "clock.h"       /* mgpu_clock_mono_ns */
#include "fdio.h"        /* mgpu_fdio_write_all */
#include "mgpu.h"        /* mgpu_init, mgpu_allreduce_f32: allreduce_loop */

extern char **environ;

/* ---------------------------------------------------------------- helpers */

static void die(const char *fmt, const char *a)
{
    fprintf(stderr, "testworker: ");
    fprintf(stderr, fmt, a);
    fprintf(stderr, "\n");
    exit(99);
}

static const char *envs(const char *name, const char *dflt)
{
    const char *v = getenv(name);
    return v ? v : dflt;
}

/* Expands %r %l %a %p %% into a static buffer (one at a time is enough). */
static const char *expand(const char *s)
{
    static char buf[4][4096];
    static int which;
    char *out = buf[which++ & 3];
    size_t n = 0;

    for (; *s && n < 4000; s++) {
        if (*s == '%' && s[1]) {
            const char *v = NULL;
            char pid[32];
            switch (s[1]) {
            case 'r': v = envs("RANK", "x"); break;
            case 'l': v = envs("LOCAL_RANK", "x"); break;
            case 'a': v = envs("TORCHELASTIC_RESTART_COUNT", "x"); break;
            case 'p': snprintf(pid, sizeof pid, "%d", (int)getpid()); v = pid; break;
            case '%': v = "%"; break;
            }
            if (v != NULL) {
                n += (size_t)snprintf(out + n, 4096 - n, "%s", v);
                s++;
                continue;
            }
        }
        out[n++] = *s;
    }
    out[n] = '\0';
    return out;
}

static void write_file(const char *path, const char *text, int append)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC), 0644);
    if (fd < 0)
        die("cannot open %s", path);
    mgpu_fdio_write_all(fd, text, strlen(text));
    close(fd);
}

/* Written to a temporary name, then renamed: a reader never sees half a file. */
static void write_file_atomic(const char *path, const char *text)
{
    struct iovec iov = {.iov_base = (void *)text, .iov_len = strlen(text)};
    if (mgpu_atomic_file_write(path, &iov, 1, MGPU_ATOMIC_FILE_NO_SYNC, NULL) < 0)
        die("cannot write %s", path);
}

static void sleep_s(double secs)
{
    struct timespec ts = {(time_t)secs, (long)((secs - (double)(time_t)secs) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static const struct {
    const char *name;
    int sig;
} signames[] = {
    {"TERM", SIGTERM}, {"INT", SIGINT},   {"HUP", SIGHUP},   {"QUIT", SIGQUIT},
    {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"KILL", SIGKILL}, {"SEGV", SIGSEGV},
    {"ABRT", SIGABRT}, {"BUS", SIGBUS},   {"FPE", SIGFPE},   {"ALRM", SIGALRM},
    {"PIPE", SIGPIPE}, {"ILL", SIGILL},   {"TRAP", SIGTRAP}, {"SYS", SIGSYS},
};
#define NSIGNAMES (sizeof signames / sizeof signames[0])

static int parse_sig(const char *s)
{
    if (strncmp(s, "SIG", 3) == 0)
        s += 3;
    for (size_t i = 0; i < NSIGNAMES; i++)
        if (strcmp(signames[i].name, s) == 0)
            return signames[i].sig;
    int n = atoi(s);
    if (n <= 0 || n >= 65)
        die("unknown signal %s", s);
    return n;
}

static const char *sig_name(int sig)
{
    for (size_t i = 0; i < NSIGNAMES; i++)
        if (signames[i].sig == sig)
            return signames[i].name;
    return "?";
}

/* ---------------------------------------------------------------- signal recording */

static char sig_file[65][4096];
static int sig_die[65];

/* Async-signal-safe: formats by hand, one write with O_APPEND. */
static void on_sig(int sig)
{
    int saved = errno;
    char line[96];
    size_t n = 0;
    const char *name = sig_name(sig);
    char digits[32];
    int nd = 0;
    int64_t t = mgpu_clock_mono_ns();

    while (*name)
        line[n++] = *name++;
    line[n++] = ' ';
    do {
        digits[nd++] = (char)('0' + t % 10);
        t /= 10;
    } while (t > 0);
    while (nd > 0)
        line[n++] = digits[--nd];
    line[n++] = '\n';
    int fd = open(sig_file[sig], O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) {
        ssize_t w = write(fd, line, n);
        (void)w;
        close(fd);
    }
    if (sig_die[sig]) {
        signal(sig, SIG_DFL);
        raise(sig); /* delivered when the handler returns */
    }
    errno = saved;
}

static void install(const char *file, const char *sigs, int die_after)
{
    char buf[256], *save = NULL;
    snprintf(buf, sizeof buf, "%s", sigs);
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int sig = parse_sig(tok);
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_sig;
        /* one handler at a time: a second signal must not cut the first one's record short */
        sigfillset(&sa.sa_mask);
        snprintf(sig_file[sig], sizeof sig_file[sig], "%s", file);
        sig_die[sig] = die_after && sig != SIGUSR1 && sig != SIGUSR2;
        sigaction(sig, &sa, NULL);
    }
}

/* ---------------------------------------------------------------- output generator */

typedef struct {
    uint64_t s;
} rng_t;

static uint64_t rng_next(rng_t *r) /* splitmix64 */
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t rng_range(rng_t *r, uint64_t lo, uint64_t hi) /* [lo, hi] */
{
    return lo + rng_next(r) % (hi - lo + 1);
}

#define MAXLINE (100 * 1024)
static int short_lines; /* "output_short": lines of 0..120 bytes only (benchmark) */

/* Line i of one (rank, stream): its length and bytes come from the stream's generator only,
 * so the checker regenerates the same sequence. Returns the length (no newline). */
static size_t gen_line(rng_t *r, long i, int rank, int stream, char *buf)
{
    uint64_t u = rng_next(r) % 1000;
    size_t len;
    if (short_lines)
        len = (size_t)rng_range(r, 0, 120);
    else if (u == 0)
        len = MAXLINE;
    else if (u == 1)
        len = 1;
    else if (u == 2)
        len = 0;
    else if (u < 8)
        len = (size_t)rng_range(r, 1000, MAXLINE);
    else if (u < 60)
        len = (size_t)rng_range(r, 121, 8192);
    else
        len = (size_t)rng_range(r, 0, 120);
    /* A readable head when there is room: which rank, stream and line. */
    char head[64];
    int hn = snprintf(head, sizeof head, "r%d s%d #%ld ", rank, stream, i);
    size_t k = 0;
    if ((size_t)hn <= len) {
        memcpy(buf, head, (size_t)hn);
        k = (size_t)hn;
    }
    uint64_t x = rng_next(r);
    for (; k < len; k++) {
        if ((k & 7) == 0)
            x = rng_next(r);
        buf[k] = (char)(' ' + 1 + (x & 0x3f)); /* printable, never a newline */
        x >>= 8;
    }
    return len;
}

static uint64_t stream_seed(uint64_t seed, int rank, int stream)
{
    return seed * 1000003ull + (uint64_t)rank * 7919ull + (uint64_t)stream * 104729ull;
}

static void tail_line(int rank, int stream, char *buf, size_t len)
{
    snprintf(buf, len, "tail without newline r%d s%d", rank, stream);
}

typedef struct {
    int fd;
    rng_t content;
    long next;     /* next line index to generate */
    char *pend;    /* bytes generated but not yet written */
    size_t plen, pcap, poff;
} gstream_t;

static void do_output(long nlines, uint64_t seed)
{
    int rank = atoi(envs("RANK", "0"));
    gstream_t g[2];
    rng_t chunk = {seed ^ 0xabcdef12345ull ^ (uint64_t)rank * 31ull};
    char *line = malloc(MAXLINE + 1);

    for (int i = 0; i < 2; i++) {
        g[i].fd = i + 1;
        g[i].content.s = stream_seed(seed, rank, i + 1);
        g[i].next = 0;
        g[i].pcap = 4 * MAXLINE;
        g[i].pend = malloc(g[i].pcap);
        g[i].plen = g[i].poff = 0;
    }
    for (;;) {
        int live = 0;
        for (int i = 0; i < 2; i++)
            live += g[i].next < nlines || g[i].poff < g[i].plen;
        if (!live)
            break;
        gstream_t *s = &g[rng_next(&chunk) & 1];
        if (s->next >= nlines && s->poff >= s->plen)
            s = s == &g[0] ? &g[1] : &g[0];
        /* Keep a line or two pending, so that writes cross line boundaries. */
        while (s->next < nlines && s->plen - s->poff < 200) {
            if (s->poff > 0) {
                memmove(s->pend, s->pend + s->poff, s->plen - s->poff);
                s->plen -= s->poff;
                s->poff = 0;
            }
            size_t l = gen_line(&s->content, s->next, rank, s->fd, line);
            line[l] = '\n';
            memcpy(s->pend + s->plen, line, l + 1);
            s->plen += l + 1;
            s->next++;
        }
        size_t avail = s->plen - s->poff, n;
        if (avail == 0)
            continue;
        switch (rng_next(&chunk) % 4) {
        case 0: n = (size_t)rng_range(&chunk, 1, 8); break;
        case 1: n = (size_t)rng_range(&chunk, 1, 100); break;
        case 2: n = (size_t)rng_range(&chunk, 1, 4096); break;
        default: n = (size_t)rng_range(&chunk, 1, 70000); break;
        }
        if (n > avail)
            n = avail;
        if (mgpu_fdio_write_all(s->fd, s->pend + s->poff, n) < 0)
            exit(98);
        s->poff += n;
    }
    for (int i = 0; i < 2; i++) {
        tail_line(rank, i + 1, line, MAXLINE);
        mgpu_fdio_write_all(i + 1, line, strlen(line));
        free(g[i].pend);
    }
    free(line);
}

/* ---------------------------------------------------------------- the checker */

static void prefix_format(const char *tmpl, const char *role, int lr, int rank, char *out,
                          size_t len)
{
    size_t n = 0;
    out[0] = '\0';
    while (*tmpl && n + 1 < len) {
        if (strncmp(tmpl, "${role_name}", 12) == 0) {
            n += (size_t)snprintf(out + n, len - n, "%s", role);
            tmpl += 12;
        } else if (strncmp(tmpl, "${local_rank}", 13) == 0) {
            n += (size_t)snprintf(out + n, len - n, "%d", lr);
            tmpl += 13;
        } else if (strncmp(tmpl, "${rank}", 7) == 0) {
            n += (size_t)snprintf(out + n, len - n, "%d", rank);
            tmpl += 7;
        } else {
            out[n++] = *tmpl++;
            out[n] = '\0';
        }
    }
}

static int verify(int argc, char **argv)
{
    if (argc != 9 && !(argc == 10 && strcmp(argv[9], "pieces") == 0)) {
        fprintf(stderr,
                "usage: testworker verify FILE STREAM RANKS NLINES SEED TEMPLATE ROLE [pieces]\n");
        return 2;
    }
    const char *file = argv[2];
    int stream = atoi(argv[3]);
    long nlines = atol(argv[5]);
    uint64_t seed = strtoull(argv[6], NULL, 10);
    const char *tmpl = argv[7], *role = argv[8];
    const int pieces = argc == 10;
    int ranks[64], nr = 0;
    char prefix[64][300];
    size_t plen[64];
    rng_t rng[64];
    long idx[64], split[64];
    /* Per rank: the line expected next, its length and how much of it has arrived (pieces). */
    char *exp[64];
    size_t elen[64], off[64];
    char buf[256];

    snprintf(buf, sizeof buf, "%s", argv[4]);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t && nr < 64;
         t = strtok_r(NULL, ",", &save))
        ranks[nr++] = atoi(t);
    if (tmpl[0] == '\0' && nr != 1) {
        fprintf(stderr, "verify: without a prefix RANKS must be one rank\n");
        return 2;
    }
    for (int i = 0; i < nr; i++) {
        prefix_format(tmpl, role, ranks[i], ranks[i], prefix[i], sizeof prefix[i]);
        plen[i] = strlen(prefix[i]);
        rng[i].s = stream_seed(seed, ranks[i], stream);
        idx[i] = split[i] = 0;
        off[i] = elen[i] = 0;
        exp[i] = malloc(MAXLINE + 200);
        if (exp[i] == NULL) {
            fprintf(stderr, "verify: out of memory\n");
            return 1;
        }
    }

    FILE *f = fopen(file, "r");
    if (f == NULL) {
        fprintf(stderr, "verify: cannot open %s\n", file);
        return 1;
    }
    char *lineptr = NULL;
    size_t cap = 0;
    ssize_t got;
    long lineno = 0, bad = 0;
    while ((got = getline(&lineptr, &cap, f)) > 0) {
        lineno++;
        if (lineptr[got - 1] != '\n') {
            fprintf(stderr, "verify: %s line %ld: the file ends without a newline\n", file, lineno);
            bad++;
            break;
        }
        lineptr[--got] = '\0';
        int who = -1;
        size_t best = 0;
        for (int i = 0; i < nr; i++)
            if (strncmp(lineptr, prefix[i], plen[i]) == 0 && (who < 0 || plen[i] > best)) {
                who = i;
                best = plen[i];
            }
        if (who < 0) {
            fprintf(stderr, "verify: %s line %ld: no rank's prefix: '%.80s' (%zd bytes)\n", file,
                    lineno, lineptr, got);
            if (++bad > 5)
                break;
            continue;
        }
        const char *content = lineptr + plen[who];
        size_t clen = (size_t)got - plen[who];
        if (off[who] == 0) { /* the rank's next line starts here */
            if (idx[who] < nlines) {
                elen[who] = gen_line(&rng[who], idx[who], ranks[who], stream, exp[who]);
            } else if (idx[who] == nlines) {
                tail_line(ranks[who], stream, exp[who], MAXLINE);
                elen[who] = strlen(exp[who]);
            } else {
                fprintf(stderr,
                        "verify: %s line %ld: rank %d has more lines than written: '%.80s'\n", file,
                        lineno, ranks[who], content);
                bad++;
                break;
            }
        }
        const char *want = exp[who] + off[who];
        const size_t left = elen[who] - off[who];
        if (pieces && clen > 0 && clen < left && memcmp(content, want, clen) == 0) {
            if (off[who] == 0)
                split[who]++;
            off[who] += clen; /* a piece: the rest comes on a later line of the rank's */
            continue;
        }
        if (clen != left || memcmp(content, want, left) != 0) {
            size_t d = 0;
            while (d < clen && d < left && content[d] == want[d])
                d++;
            fprintf(stderr,
                    "verify: %s line %ld: rank %d stream %d line #%ld from byte %zu: expected "
                    "%zu bytes '%.40s...', got %zu bytes '%.40s...' (first difference at byte "
                    "%zu)\n",
                    file, lineno, ranks[who], stream, idx[who], off[who], left, want, clen, content,
                    d);
            bad++;
            break; /* the rank's sequence is lost from here */
        }
        off[who] = 0;
        idx[who]++;
    }
    free(lineptr);
    fclose(f);
    long joined = 0;
    for (int i = 0; i < nr && !bad; i++) {
        if (idx[i] != nlines + 1) {
            fprintf(stderr, "verify: %s: rank %d stream %d: %ld of %ld lines arrived%s\n", file,
                    ranks[i], stream, idx[i], nlines + 1,
                    off[i] > 0 ? " (the last of them in part only)" : "");
            bad++;
        } else if (split[i] > (nlines + 1) / 100 + 1) {
            fprintf(stderr,
                    "verify: %s: rank %d stream %d: %ld of %ld lines arrived in pieces, expected "
                    "at most %ld (pieces only where a writer paused mid-line)\n",
                    file, ranks[i], stream, split[i], nlines + 1, (nlines + 1) / 100 + 1);
            bad++;
        }
        joined += split[i];
    }
    for (int i = 0; i < nr; i++)
        free(exp[i]);
    if (bad)
        return 1;
    printf("verify ok: %s: %d rank(s) x %ld lines, stream %d", file, nr, nlines + 1, stream);
    if (pieces)
        printf(", %ld line(s) in pieces", joined);
    printf("\n");
    return 0;
}

/* ---------------------------------------------------------------- stopwatch */

static int timeit(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: testworker timeit N OUTFILE CMD [ARGS...]\n");
        return 2;
    }
    int n = atoi(argv[2]);
    FILE *out = fopen(argv[3], "w");
    if (out == NULL) {
        fprintf(stderr, "timeit: cannot open %s\n", argv[3]);
        return 2;
    }
    for (int i = 0; i < n; i++) {
        int status;
        int64_t t0 = mgpu_clock_mono_ns();
        pid_t pid = fork();
        if (pid == 0) {
            execvp(argv[4], argv + 4);
            _exit(127);
        }
        if (pid < 0 || waitpid(pid, &status, 0) != pid)
            return 3;
        int64_t t1 = mgpu_clock_mono_ns();
        fprintf(out, "%lld %d %lld %lld\n", (long long)(t1 - t0),
                WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), (long long)t0,
                (long long)t1);
    }
    fclose(out);
    return 0;
}

/* ---------------------------------------------------------------- the CUDA driver's view */

static void cuda_view(const char *path)
{
    typedef int (*init_t)(unsigned);
    typedef int (*count_t)(int *);
    typedef int (*get_t)(int *, int);
    typedef int (*uuid_t_)(unsigned char *, int);
    char text[8192];
    size_t n = 0;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);

    if (h == NULL) {
        write_file_atomic(path, "nodriver\n");
        return;
    }
    init_t cu_init = (init_t)dlsym(h, "cuInit");
    count_t cu_count = (count_t)dlsym(h, "cuDeviceGetCount");
    get_t cu_get = (get_t)dlsym(h, "cuDeviceGet");
    uuid_t_ cu_uuid = (uuid_t_)dlsym(h, "cuDeviceGetUuid_v2");
    if (cu_uuid == NULL)
        cu_uuid = (uuid_t_)dlsym(h, "cuDeviceGetUuid");
    if (cu_init == NULL || cu_count == NULL || cu_get == NULL || cu_uuid == NULL) {
        write_file_atomic(path, "nodriver\n");
        return;
    }
    int rc = cu_init(0), count = 0;
    if (rc == 100) /* CUDA_ERROR_NO_DEVICE: nothing visible */
        rc = 0;
    else if (rc == 0)
        rc = cu_count(&count);
    if (rc != 0) {
        snprintf(text, sizeof text, "error %d\n", rc);
        write_file_atomic(path, text);
        return;
    }
    n += (size_t)snprintf(text + n, sizeof text - n, "count %d\n", count);
    for (int k = 0; k < count && n < sizeof text - 100; k++) {
        int dev;
        unsigned char u[16];
        if (cu_get(&dev, k) != 0 || cu_uuid(u, dev) != 0)
            continue;
        n += (size_t)snprintf(text + n, sizeof text - n,
                              "%d GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x\n",
                              k, u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10],
                              u[11], u[12], u[13], u[14], u[15]);
    }
    write_file_atomic(path, text);
}

/* ---------------------------------------------------------------- grandchildren */

static void spawn(const char *mode, const char *pidfile, const char *sigfile)
{
    pid_t pid = fork();
    if (pid < 0)
        die("fork failed%s", "");
    if (pid > 0)
        return;
    if (strncmp(mode, "setsid", 6) == 0)
        setsid();
    else if (strncmp(mode, "pg", 2) != 0)
        die("spawn: unknown mode %s", mode);
    if (strstr(mode, "stubborn") != NULL) {
        install(sigfile, "USR1,USR2", 0);
        install(sigfile, "TERM,INT,HUP,QUIT", 0);
    } else {
        install(sigfile, "TERM,INT,HUP,QUIT,USR1,USR2", 1);
    }
    char text[32];
    snprintf(text, sizeof text, "%d\n", (int)getpid());
    write_file_atomic(pidfile, text);
    for (;;)
        pause();
}

/* ---------------------------------------------------------------- allreduce_loop */

/* 0 when SECS passed, 3 after the first error (said on stderr). */
static int allreduce_loop(double secs)
{
    mgpu_init_opts_t o = {0, 60};
    mgpu_ctx_t *ctx = NULL;
    mgpu_comm_t *comm = NULL;
    mgpu_err_t err = {0, ""};
    int64_t t0 = mgpu_clock_mono_ns();
    long done = 0;
    float buf[65];
    int rc, world, rank;

    /* The launcher's SIGTERM must not end the loop: what a worker sees of a lost peer is the
     * point, and the SIGKILL after the grace period is the backstop. */
    signal(SIGTERM, SIG_IGN);
    if ((rc = mgpu_init(&o, &ctx, &err)) == 0)
        rc = mgpu_comm_create(ctx, MGPU_BACKEND_CPU, 0, &comm, &err);
    world = ctx != NULL ? mgpu_rank(ctx)->world_size : 1;
    rank = ctx != NULL ? mgpu_rank(ctx)->rank : 0;
    /* The ranks' clocks disagree on when SECS have passed: each all-reduce also sums who
     * thinks so, and every rank stops after the same one. */
    while (rc == 0) {
        for (int i = 0; i < 64; i++)
            buf[i] = (float)(rank + 1 + i);
        buf[64] = (double)(mgpu_clock_mono_ns() - t0) / 1e9 >= secs;
        if ((rc = mgpu_allreduce_f32(comm, buf, 65, MGPU_SUM, NULL, &err)) < 0)
            break;
        for (int i = 0; i < 64 && rc == 0; i++) {
            /* Small integers: the sum is exact in any order. */
            float want = (float)(world * (world + 1) / 2 + world * i);
            if (buf[i] != want)
                rc = mgpu_err_set(&err, MGPU_E_PROTOCOL,
                                  "all-reduce #%ld: element %d is %g, expected %g", done + 1, i,
                                  (double)buf[i], (double)want);
        }
        done += rc == 0;
        if (rc == 0 && buf[64] > 0)
            break;
        sleep_s(0.01); /* a worker between steps: the loop must not take a shared CPU */
    }
    if (rc < 0) {
        fprintf(stderr, "allreduce_loop: error after %.1f s: %s\n",
                (double)(mgpu_clock_mono_ns() - t0) / 1e9, err.msg);
        fflush(stderr);
        return 3;
    }
    printf("allreduce_loop: %ld all-reduces in %.1f s\n", done,
           (double)(mgpu_clock_mono_ns() - t0) / 1e9);
    fflush(stdout);
    mgpu_comm_destroy(comm);
    mgpu_finalize(ctx);
    return 0;
}

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv)
{
    struct rlimit nocore = {0, 0};
    int only = 0; /* the next action is filtered */
    int skip = 0;

    setrlimit(RLIMIT_CORE, &nocore); /* SEGV/ABRT/QUIT: no core dumps */
    if (argc > 1 && strcmp(argv[1], "verify") == 0)
        return verify(argc, argv);
    if (argc > 1 && strcmp(argv[1], "timeit") == 0)
        return timeit(argc, argv);

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
#define ARG(n) (i + (n) < argc ? argv[i + (n)] : (die("%s: missing argument", a), ""))
        if (strncmp(a, "--local_rank=", 13) == 0 || strncmp(a, "--local-rank=", 13) == 0)
            continue; /* torch.distributed.launch's legacy first argument */
        if (strcmp(a, "only") == 0) {
            char list[256], want[64];
            snprintf(list, sizeof list, ",%s,", ARG(1));
            snprintf(want, sizeof want, ",%s,", envs("RANK", ""));
            skip = strstr(list, want) == NULL;
            only = 1;
            i += 1;
            continue;
        }
        int run = !(only && skip);
        only = 0;
        skip = 0;
#define DO(n) (i += (n), run)
        if (strcmp(a, "env") == 0) {
            if (DO(1)) {
                size_t cap = 1 << 16, n = 0;
                char *text = malloc(cap);
                for (char **e = environ; *e; e++) {
                    size_t l = strlen(*e);
                    if (n + l + 2 > cap)
                        text = realloc(text, cap = 2 * (cap + l));
                    memcpy(text + n, *e, l);
                    n += l;
                    text[n++] = '\n';
                }
                text[n] = '\0';
                write_file_atomic(expand(argv[i]), text);
                free(text);
            }
        } else if (strcmp(a, "argv") == 0) {
            if (DO(1)) {
                size_t n = 0;
                char *text;
                for (int k = 0; k < argc; k++)
                    n += strlen(argv[k]) + 1;
                text = malloc(n + 1);
                n = 0;
                for (int k = 0; k < argc; k++)
                    n += (size_t)sprintf(text + n, "%s\n", argv[k]);
                write_file_atomic(expand(argv[i]), text);
                free(text);
                return 0;
            }
        } else if (strcmp(a, "touch") == 0) {
            if (DO(1))
                write_file_atomic(expand(argv[i]), "");
        } else if (strcmp(a, "waitall") == 0) {
            if (DO(2)) {
                int n = atoi(argv[i]);
                char prefix[4096], path[4200];
                struct stat st;
                snprintf(prefix, sizeof prefix, "%s", expand(argv[i - 1]));
                for (int k = 0; k < n; k++) {
                    snprintf(path, sizeof path, "%s%d", prefix, k);
                    while (stat(path, &st) != 0)
                        sleep_s(0.002);
                }
            }
        } else if (strcmp(a, "fds") == 0) {
            if (DO(1)) {
                char text[65536], path[64], target[4096];
                size_t n = 0;
                for (int fd = 0; fd < 65536 && n < sizeof text - 5000; fd++) {
                    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
                    ssize_t l = readlink(path, target, sizeof target - 1);
                    if (l < 0)
                        continue;
                    target[l] = '\0';
                    if (strncmp(target, "/proc/", 6) == 0 && strstr(target, "/fd") != NULL)
                        continue; /* the directory being read, if any */
                    n += (size_t)snprintf(text + n, sizeof text - n, "%d -> %s\n", fd, target);
                }
                text[n] = '\0';
                write_file_atomic(expand(argv[i]), text);
            }
        } else if (strcmp(a, "ids") == 0) {
            if (DO(1)) {
                char text[128];
                snprintf(text, sizeof text, "%d %d %d %d\n", (int)getpid(), (int)getpgid(0),
                         (int)getsid(0), (int)getppid());
                write_file_atomic(expand(argv[i]), text);
            }
        } else if (strcmp(a, "cuda") == 0) {
            if (DO(1))
                cuda_view(expand(argv[i]));
        } else if (strcmp(a, "waitfile") == 0) {
            if (DO(1)) {
                struct stat st;
                const char *path = expand(argv[i]);
                while (stat(path, &st) != 0)
                    sleep_s(0.002);
            }
        } else if (strcmp(a, "print") == 0 || strcmp(a, "eprint") == 0 ||
                   strcmp(a, "noeol") == 0 || strcmp(a, "enoeol") == 0) {
            if (DO(1)) {
                char text[4200];
                snprintf(text, sizeof text, "%s%s", expand(argv[i]), a[strlen(a) - 1] == 't' ? "\n" : "");
                mgpu_fdio_write_all(a[0] == 'e' ? 2 : 1, text, strlen(text));
            }
        } else if (strcmp(a, "exit") == 0) {
            if (DO(1))
                _exit(atoi(argv[i]));
        } else if (strcmp(a, "raise") == 0) {
            if (DO(1)) {
                int sig = parse_sig(argv[i]);
                sigset_t set;
                signal(sig, SIG_DFL);
                sigemptyset(&set);
                sigaddset(&set, sig);
                sigprocmask(SIG_UNBLOCK, &set, NULL);
                raise(sig);
                sleep_s(5);
                _exit(97);
            }
        } else if (strcmp(a, "segv") == 0) {
            if (DO(0)) {
                signal(SIGSEGV, SIG_DFL);
                /* An unmapped address in page 0 that is not NULL: UBSan's null check (make asan)
                 * would turn a NULL store into its own report instead of the signal. */
                volatile int *volatile p = (volatile int *)(uintptr_t)16;
                *p = 1;
                _exit(97);
            }
        } else if (strcmp(a, "trap") == 0 || strcmp(a, "ignore") == 0) {
            if (DO(2))
                install(expand(argv[i - 1]), argv[i], a[0] == 't');
        } else if (strcmp(a, "sleep") == 0) {
            if (DO(1)) {
                int64_t end = mgpu_clock_mono_ns() + (int64_t)(atof(argv[i]) * 1e9);
                int64_t left;
                while ((left = end - mgpu_clock_mono_ns()) > 0)
                    sleep_s((double)left / 1e9);
            }
        } else if (strcmp(a, "pause") == 0) {
            if (DO(0))
                for (;;)
                    pause();
        } else if (strcmp(a, "spawn") == 0) {
            if (DO(3)) {
                char pf[4096], sf[4096];
                snprintf(pf, sizeof pf, "%s", expand(argv[i - 1]));
                snprintf(sf, sizeof sf, "%s", expand(argv[i]));
                spawn(argv[i - 2], pf, sf);
            }
        } else if (strcmp(a, "fail_until") == 0) {
            if (DO(2) && atoi(envs("TORCHELASTIC_RESTART_COUNT", "0")) < atoi(argv[i - 1]))
                _exit(atoi(argv[i]));
        } else if (strcmp(a, "errfile") == 0) {
            if (DO(1)) {
                const char *path = getenv("TORCHELASTIC_ERROR_FILE");
                char text[8192];
                if (path == NULL || *path == '\0')
                    die("errfile: TORCHELASTIC_ERROR_FILE is %s", path ? "empty" : "unset");
                snprintf(text, sizeof text,
                         "{\"message\": {\"message\": \"%s\", \"extraInfo\": {\"py_callstack\": "
                         "\"Traceback (most recent call last):\\n  File \\\"train.py\\\", line 7, "
                         "in <module>\\n    main()\\n%s\\n\", \"timestamp\": \"%ld\"}}}",
                         expand(argv[i]), expand(argv[i]), (long)time(NULL));
                write_file(path, text, 0);
            }
        } else if (strcmp(a, "stamp_exit") == 0) {
            if (DO(2)) {
                char text[64];
                const char *path = expand(argv[i - 1]);
                int code = atoi(argv[i]);
                int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
                /* the stamp is taken as late as possible: right before _exit */
                snprintf(text, sizeof text, "%lld\n", (long long)mgpu_clock_mono_ns());
                mgpu_fdio_write_all(fd, text, strlen(text));
                close(fd);
                _exit(code);
            }
        } else if (strcmp(a, "allreduce_loop") == 0) {
            if (DO(1)) {
                int rc = allreduce_loop(atof(argv[i]));
                if (rc != 0)
                    _exit(rc);
            }
        } else if (strcmp(a, "output") == 0 || strcmp(a, "output_short") == 0) {
            short_lines = a[6] == '_';
            if (DO(2))
                do_output(atol(argv[i - 1]), strtoull(argv[i], NULL, 10));
        } else {
            die("unknown action '%s'", a);
        }
    }
    return 0;
}
