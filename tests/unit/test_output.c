/* test_output.c - whole prefixed lines out of arbitrary byte chunks. */
#include <errno.h>  /* E2BIG */
#include <stdlib.h> /* malloc */

#include "check.h"
#include "output.h"

static void test_prefix_template(void)
{
    char buf[128];
    mgpu_prefix_format("[rank${rank}]:", "default", 1, 5, buf, sizeof buf);
    CHECK_STR(buf, "[rank5]:");
    mgpu_prefix_format("[${role_name}${local_rank}]: ", "trainer", 3, 7, buf, sizeof buf);
    CHECK_STR(buf, "[trainer3]: ");
    mgpu_prefix_format("${unknown} $", "r", 0, 0, buf, sizeof buf);
    CHECK_STR(buf, "${unknown} $");
    mgpu_prefix_format("${rank}${rank}${rank}", "r", 0, 12345, buf, 8);
    CHECK_STR(buf, "1234512");
}

static void test_lines_split_across_chunks(void)
{
    mgpu_linebuf_t lb = {0};
    mgpu_outbuf_t ob = {0};
    const char *b, *raw;
    size_t n, rn;

    CHECK_INT(mgpu_linebuf_feed(&lb, &ob, "[r0]:", "hel", 3, &b, &n, &raw, &rn), 0);
    CHECK_INT(n, 0);
    CHECK_INT(mgpu_linebuf_feed(&lb, &ob, "[r0]:", "lo\nwor", 6, &b, &n, &raw, &rn), 0);
    CHECK_INT(n, 11);
    CHECK(memcmp(b, "[r0]:hello\n", 11) == 0);
    CHECK_INT(rn, 6);
    CHECK(memcmp(raw, "hello\n", 6) == 0);
    CHECK_INT(mgpu_linebuf_feed(&lb, &ob, "[r0]:", "ld\n\nx\ny", 7, &b, &n, &raw, &rn), 0);
    CHECK_INT(n, (long long)strlen("[r0]:world\n[r0]:\n[r0]:x\n"));
    CHECK(memcmp(b, "[r0]:world\n[r0]:\n[r0]:x\n", n) == 0);
    CHECK_INT(mgpu_linebuf_flush(&lb, &ob, "[r0]:", &b, &n, &raw, &rn), 0);
    CHECK_INT(n, 7);
    CHECK(memcmp(b, "[r0]:y\n", 7) == 0);
    CHECK_INT(mgpu_linebuf_flush(&lb, &ob, "[r0]:", &b, &n, &raw, &rn), 0);
    CHECK_INT(n, 0);
    mgpu_linebuf_free(&lb);
    mgpu_outbuf_free(&ob);
}

static void test_every_split_point(void)
{
    const char *text = "alpha\nbeta gamma\n\ndelta\nend";
    const char *want = "P alpha\nP beta gamma\nP \nP delta\nP end\n";
    size_t len = strlen(text);

    for (size_t cut = 0; cut <= len; cut++) {
        mgpu_linebuf_t lb = {0};
        mgpu_outbuf_t ob = {0};
        char got[256];
        size_t g = 0, n;
        const char *b;
        mgpu_linebuf_feed(&lb, &ob, "P ", text, cut, &b, &n, NULL, NULL);
        if (n)
            memcpy(got + g, b, n), g += n;
        mgpu_linebuf_feed(&lb, &ob, "P ", text + cut, len - cut, &b, &n, NULL, NULL);
        if (n)
            memcpy(got + g, b, n), g += n;
        mgpu_linebuf_flush(&lb, &ob, "P ", &b, &n, NULL, NULL);
        if (n)
            memcpy(got + g, b, n), g += n;
        got[g] = '\0';
        CHECK_STR(got, want);
        mgpu_linebuf_free(&lb);
        mgpu_outbuf_free(&ob);
    }
}

/* A line of 20 x 64 KiB and then its newline, past MGPU_LINE_MAX: the raw bytes (the log
 * files) are exactly the worker's, and the console has it as one line with one prefix. */
static void test_overlong_line_passes_whole(void)
{
    mgpu_linebuf_t lb = {0};
    mgpu_outbuf_t ob = {0};
    const size_t chunk = 65536, all = 20 * chunk + 1;
    size_t con = 0, rawn = 0, n, rn;
    char *data = malloc(chunk), *c = malloc(all + 16), *r = malloc(all + 16);
    const char *b, *raw;
    int early = 0;

    memset(data, 'a', chunk);
    for (int i = 0; i < 21; i++) {
        int last = i == 20;
        CHECK_INT(mgpu_linebuf_feed(&lb, &ob, "P ", last ? "\n" : data, last ? 1 : chunk, &b, &n,
                                    &raw, &rn),
                  0);
        early += !last && n > 0;
        memcpy(c + con, b, n);
        con += n;
        memcpy(r + rawn, raw, rn);
        rawn += rn;
    }
    mgpu_linebuf_flush(&lb, &ob, "P ", &b, &n, &raw, &rn);
    CHECK_INT(n, 0);
    CHECK(early > 0); /* not held until the newline */
    CHECK_INT(rawn, all);
    CHECK(r[all - 1] == '\n' && memchr(r, '\n', all - 1) == NULL && r[0] == 'a');
    CHECK_INT(con, all + 2);
    CHECK(memcmp(c, "P a", 3) == 0 && memchr(c, '\n', con - 1) == NULL && c[con - 1] == '\n');
    free(data);
    free(c);
    free(r);
    mgpu_linebuf_free(&lb);
    mgpu_outbuf_free(&ob);
}

/* Concatenates what a sequence of feed/live/flush calls hands the console. */
typedef struct {
    char con[512], raw[512];
    size_t n, rn;
} sink_t;

static void put(sink_t *s, const char *b, size_t n, const char *raw, size_t rn)
{
    if (n > 0) /* b is only set when there is something */
        memcpy(s->con + s->n, b, n);
    s->n += n;
    s->con[s->n] = '\0';
    if (raw != NULL && rn > 0) {
        memcpy(s->raw + s->rn, raw, rn);
        s->rn += rn;
        s->raw[s->rn] = '\0';
    }
}

static void feed(mgpu_linebuf_t *lb, mgpu_outbuf_t *ob, sink_t *s, const char *text)
{
    const char *b, *raw;
    size_t n, rn;
    CHECK_INT(mgpu_linebuf_feed(lb, ob, "P:", text, strlen(text), &b, &n, &raw, &rn), 0);
    put(s, b, n, raw, rn);
}

static void live(mgpu_linebuf_t *lb, mgpu_outbuf_t *ob, sink_t *s, int all)
{
    const char *b;
    size_t n;
    CHECK_INT(mgpu_linebuf_live(lb, ob, "P:", all, &b, &n), 0);
    put(s, b, n, NULL, 0);
}

static void test_live_progress_bar(void)
{
    /* tqdm's way: each update starts with '\r'; the line ends with a newline at the end */
    mgpu_linebuf_t lb = {0};
    mgpu_outbuf_t ob = {0};
    sink_t s = {0};

    feed(&lb, &ob, &s, "\r 10%");
    live(&lb, &ob, &s, 0); /* only a '\r' is complete: nothing to see yet */
    CHECK_STR(s.con, "");
    live(&lb, &ob, &s, 1); /* quiet: the update shows, prefixed */
    CHECK_STR(s.con, "\rP: 10%");
    CHECK_INT(mgpu_linebuf_unshown(&lb), 0);
    feed(&lb, &ob, &s, "\r 20%\r 30");
    live(&lb, &ob, &s, 0); /* complete updates pass at once, each redrawn with its prefix */
    CHECK_STR(s.con, "\rP: 10%\rP: 20%\r");
    CHECK_INT(mgpu_linebuf_unshown(&lb), 3);
    feed(&lb, &ob, &s, "%\n");
    CHECK_STR(s.con, "\rP: 10%\rP: 20%\rP: 30%\n");
    /* the log file and the stderr tail get the line as the worker wrote it */
    CHECK_STR(s.raw, "\r 10%\r 20%\r 30%\n");
    feed(&lb, &ob, &s, "next\n");
    CHECK_STR(s.con, "\rP: 10%\rP: 20%\rP: 30%\nP:next\n");
    mgpu_linebuf_free(&lb);
    mgpu_outbuf_free(&ob);
}

static void test_live_partial_line_and_detach(void)
{
    mgpu_linebuf_t lb = {0};
    mgpu_outbuf_t ob = {0};
    sink_t s = {0};

    feed(&lb, &ob, &s, "Password:");
    live(&lb, &ob, &s, 1);
    CHECK_STR(s.con, "P:Password:");
    CHECK_INT(lb.live, 1);
    /* continued while the console still shows it: no second prefix */
    feed(&lb, &ob, &s, " ok");
    live(&lb, &ob, &s, 1);
    CHECK_STR(s.con, "P:Password: ok");
    /* another stream ended the console line: the rest comes with a prefix of its own */
    mgpu_linebuf_detach(&lb);
    feed(&lb, &ob, &s, " done\nx\n");
    CHECK_STR(s.con, "P:Password: okP: done\nP:x\n");
    CHECK_STR(s.raw, "Password: ok done\nx\n");
    /* a shown line whose newline alone remains after a detach: nothing more to print */
    s = (sink_t){0};
    feed(&lb, &ob, &s, "abc");
    live(&lb, &ob, &s, 1);
    mgpu_linebuf_detach(&lb);
    feed(&lb, &ob, &s, "\n");
    CHECK_STR(s.con, "P:abc");
    CHECK_STR(s.raw, "abc\n");
    mgpu_linebuf_free(&lb);
    mgpu_outbuf_free(&ob);
}

static void test_live_then_end_of_stream(void)
{
    mgpu_linebuf_t lb = {0};
    mgpu_outbuf_t ob = {0};
    sink_t s = {0};
    const char *b, *raw;
    size_t n, rn;

    feed(&lb, &ob, &s, "last words");
    live(&lb, &ob, &s, 1);
    CHECK_INT(mgpu_linebuf_flush(&lb, &ob, "P:", &b, &n, &raw, &rn), 0);
    put(&s, b, n, raw, rn);
    CHECK_STR(s.con, "P:last words\n");
    CHECK_STR(s.raw, "last words\n");
    /* "\r\n" ends a shown bar where it is */
    s = (sink_t){0};
    feed(&lb, &ob, &s, "bar\r");
    live(&lb, &ob, &s, 0);
    feed(&lb, &ob, &s, "\n");
    CHECK_STR(s.con, "P:bar\r\n");
    mgpu_linebuf_free(&lb);
    mgpu_outbuf_free(&ob);
}

static void test_whole_lines_unchanged_by_live(void)
{
    /* a '\r' inside a line that arrives whole passes as it is, with one prefix */
    mgpu_linebuf_t lb = {0};
    mgpu_outbuf_t ob = {0};
    sink_t s = {0};

    feed(&lb, &ob, &s, "a\rb\n");
    live(&lb, &ob, &s, 0);
    live(&lb, &ob, &s, 1);
    CHECK_STR(s.con, "P:a\rb\n");
    mgpu_linebuf_free(&lb);
    mgpu_outbuf_free(&ob);
}

/* --duplicate_std{out,err}_filters: torchrun's comma list, ",," a comma, substring match. */
static void test_line_filters(void)
{
    mgpu_line_filters_t f;
    const char line[] = "NCCL WARN a,b\n";
    CHECK_INT(mgpu_line_filters_parse("apple,orange", &f), 0);
    CHECK_INT(f.n, 2);
    CHECK_STR(f.buf, "apple");
    CHECK_STR(f.buf + 6, "orange");
    CHECK_INT(mgpu_line_filters_match(&f, "an orange\n", 10), 1);
    CHECK_INT(mgpu_line_filters_match(&f, "an orang", 8), 0);
    CHECK_INT(mgpu_line_filters_match(&f, "app\0le", 6), 0);
    /* ",," is a comma inside a substring; ",,," a comma, then the next one */
    CHECK_INT(mgpu_line_filters_parse("a,,b", &f), 0);
    CHECK_INT(f.n, 1);
    CHECK_STR(f.buf, "a,b");
    CHECK_INT(mgpu_line_filters_match(&f, line, sizeof line - 1), 1);
    CHECK_INT(mgpu_line_filters_parse("x,,,NCCL", &f), 0);
    CHECK_INT(f.n, 2);
    CHECK_STR(f.buf, "x,");
    CHECK_STR(f.buf + 3, "NCCL");
    /* only the n bytes given are searched: the match must not run past them */
    CHECK_INT(mgpu_line_filters_match(&f, line, 3), 0);
    /* empty entries are left out: "" copies nothing (not every line) */
    CHECK_INT(mgpu_line_filters_parse("", &f), 0);
    CHECK_INT(f.n, 0);
    CHECK_INT(mgpu_line_filters_match(&f, line, sizeof line - 1), 0);
    CHECK_INT(mgpu_line_filters_parse(",a,,,", &f), 0);
    CHECK_INT(f.n, 1);
    CHECK_STR(f.buf, "a,");
    char big[2000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    CHECK_INT(mgpu_line_filters_parse(big, &f), -E2BIG);
    CHECK_INT(f.n, 0);
}

int main(void)
{
    RUN(test_prefix_template);
    RUN(test_lines_split_across_chunks);
    RUN(test_every_split_point);
    RUN(test_overlong_line_passes_whole);
    RUN(test_live_progress_bar);
    RUN(test_live_partial_line_and_detach);
    RUN(test_live_then_end_of_stream);
    RUN(test_whole_lines_unchanged_by_live);
    RUN(test_line_filters);
    return check_done();
}
