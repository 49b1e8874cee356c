/* test_output.c - whole prefixed lines out of arbitrary byte chunks. */
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

static void test_overlong_line_is_cut(void)
{
    mgpu_linebuf_t lb = {0};
    mgpu_outbuf_t ob = {0};
    size_t chunk = 65536, total = 0, n;
    char *data = malloc(chunk);
    const char *b;
    int emitted = 0;

    memset(data, 'a', chunk);
    /* 20 chunks without a newline: cut once the line reaches MGPU_LINE_MAX */
    for (int i = 0; i < 20; i++) {
        CHECK_INT(mgpu_linebuf_feed(&lb, &ob, "", data, chunk, &b, &n, NULL, NULL), 0);
        if (n > 0) {
            emitted++;
            CHECK(b[n - 1] == '\n');
            total += n - 1;
        }
    }
    mgpu_linebuf_flush(&lb, &ob, "", &b, &n, NULL, NULL);
    total += n ? n - 1 : 0;
    CHECK_INT(emitted, 1);
    CHECK_INT(total, 20 * chunk);
    free(data);
    mgpu_linebuf_free(&lb);
    mgpu_outbuf_free(&ob);
}

int main(void)
{
    RUN(test_prefix_template);
    RUN(test_lines_split_across_chunks);
    RUN(test_every_split_point);
    RUN(test_overlong_line_is_cut);
    return check_done();
}
