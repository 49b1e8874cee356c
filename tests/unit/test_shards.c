/* test_shards.c - token files mapped: llm.c headers (uint16 and uint32) and raw files, lists
 * and globs, windows that never cross a file, the held-out tail across files, ids checked as
 * windows are read, the shard writer, and every way a header can be wrong. */
#include "check.h"
#include "tmpdir.h" /* make_tmpdir, tmp, remove_tmpdir */
#include "shards.h"

#include <stdint.h> /* uint32_t */

/* An llm.c header (magic, version, count as given) and n tokens token(i) of width bytes. */
static void write_file(const char *path, int header, uint32_t magic, uint32_t version,
                       uint32_t count, int width, size_t n, uint32_t (*token)(size_t))
{
    FILE *f = fopen(path, "wb");
    if (f == NULL) {
        perror(path);
        exit(1);
    }
    if (header) {
        uint32_t h[256] = {magic, version, count};
        fwrite(h, sizeof h, 1, f);
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t t = token(i);
        fwrite(&t, (size_t)width, 1, f); /* little-endian host: the low bytes first */
    }
    fclose(f);
}

static size_t file_k;
/* A token that says where it came from: file file_k, position i. */
static uint32_t where(size_t i)
{
    return (uint32_t)(file_k * 10000 + i);
}

static void test_windows_stay_inside_each_file(void)
{
    mgpu_shards_t s;
    mgpu_windows_t tr, ev;
    mgpu_err_t err = {0};
    const size_t n[3] = {1000, 777, 1500};
    const int T = 16;
    make_tmpdir("shards");
    /* the three kinds: llm.c uint16, raw uint16, llm.c uint32 */
    file_k = 0;
    write_file(tmp("d_000.bin"), 1, MGPU_SHARD_MAGIC, 1, (uint32_t)n[0], 2, n[0], where);
    file_k = 1;
    write_file(tmp("d_001.bin"), 0, 0, 0, 0, 2, n[1], where);
    file_k = 2;
    write_file(tmp("d_002.bin"), 1, MGPU_SHARD_MAGIC_U32, 7, (uint32_t)n[2], 4, n[2], where);
    char spec[600];
    snprintf(spec, sizeof spec, "%s/d_*.bin", tmpdir);
    CHECK_INT(mgpu_shards_open(&s, spec, "data_tokens", 0, 40000, &err), 0);
    CHECK_INT(s.n_files, 3);
    CHECK_INT(s.n_tokens, 1000 + 777 + 1500);
    CHECK_INT(s.f[0].width, 2);
    CHECK_INT(s.f[1].header, 0);
    CHECK_INT(s.f[2].width, 4);
    CHECK_INT(mgpu_windows_split(&s, T, 0, &tr, &ev, &err), 0);
    /* 62 + 48 + 93, not the 204 of the files end to end */
    CHECK_INT(tr.n_windows, 999 / 16 + 776 / 16 + 1499 / 16);
    CHECK_INT(ev.n_windows, 0);
    int32_t tok[16], tgt[16];
    size_t w = 0;
    for (int k = 0; k < 3; k++)
        for (size_t j = 0; j < (n[k] - 1) / T; j++, w++) {
            CHECK_INT(mgpu_windows_read(&tr, w, tok, tgt, &err), 0);
            for (int i = 0; i < T; i++) {
                CHECK_INT(tok[i], k * 10000 + (int)(j * T) + i);
                CHECK_INT(tgt[i], k * 10000 + (int)(j * T) + i + 1);
            }
        }
    CHECK_INT(w, tr.n_windows);
    CHECK(mgpu_windows_read(&tr, w, tok, tgt, &err) < 0);
    mgpu_windows_free(&tr);
    mgpu_windows_free(&ev);

    /* the same files as a list, in another order: the list's order is kept */
    snprintf(spec, sizeof spec, "%s/d_002.bin, %s/d_000.bin", tmpdir, tmpdir);
    mgpu_shards_close(&s);
    CHECK_INT(mgpu_shards_open(&s, spec, "data_tokens", 0, 40000, &err), 0);
    CHECK_INT(s.n_files, 2);
    CHECK_INT(mgpu_windows_split(&s, T, 0, &tr, &ev, &err), 0);
    CHECK_INT(mgpu_windows_read(&tr, 0, tok, NULL, &err), 0);
    CHECK_INT(tok[0], 20000);
    CHECK_INT(mgpu_windows_read(&tr, 1499 / 16, tok, NULL, &err), 0);
    CHECK_INT(tok[0], 0);
    mgpu_windows_free(&tr);
    mgpu_windows_free(&ev);
    mgpu_shards_close(&s);
    mgpu_shards_close(&s); /* safe twice */
    remove_tmpdir();
}

static void test_held_out_tail_spans_files(void)
{
    mgpu_shards_t s;
    mgpu_windows_t tr, ev;
    mgpu_err_t err = {0};
    make_tmpdir("shards");
    file_k = 0;
    write_file(tmp("a.bin"), 1, MGPU_SHARD_MAGIC, 1, 600, 2, 600, where);
    file_k = 1;
    write_file(tmp("b.bin"), 1, MGPU_SHARD_MAGIC, 1, 400, 2, 400, where);
    char spec[600];
    snprintf(spec, sizeof spec, "%s,%s", tmp("a.bin"), tmp("b.bin"));
    CHECK_INT(mgpu_shards_open(&s, spec, "data_tokens", 0, 20000, &err), 0);
    /* 0.5 of 1000 tokens: a's last 100 and all of b */
    CHECK_INT(mgpu_windows_split(&s, 8, 0.5, &tr, &ev, &err), 0);
    CHECK_INT(tr.n_tokens, 500);
    CHECK_INT(ev.n_tokens, 500);
    CHECK_INT(tr.n_windows, 499 / 8);
    CHECK_INT(ev.n_windows, 99 / 8 + 399 / 8);
    int32_t tok[8];
    CHECK_INT(mgpu_windows_read(&ev, 0, tok, NULL, &err), 0);
    CHECK_INT(tok[0], 500);
    CHECK_INT(mgpu_windows_read(&ev, 99 / 8, tok, NULL, &err), 0);
    CHECK_INT(tok[0], 10000);
    mgpu_windows_free(&tr);
    mgpu_windows_free(&ev);
    mgpu_shards_close(&s);
    remove_tmpdir();
}

static uint32_t bad_at_700(size_t i)
{
    return i == 700 ? 300 : (uint32_t)(i % 256);
}

static void test_id_past_vocab_names_file_and_position(void)
{
    mgpu_shards_t s;
    mgpu_windows_t tr, ev;
    mgpu_err_t err = {0};
    make_tmpdir("shards");
    write_file(tmp("bad.bin"), 1, MGPU_SHARD_MAGIC, 1, 1000, 2, 1000, bad_at_700);
    CHECK_INT(mgpu_shards_open(&s, tmp("bad.bin"), "data_tokens", 0, 256, &err), 0);
    CHECK_INT(mgpu_windows_split(&s, 100, 0, &tr, &ev, &err), 0);
    int32_t tok[100], tgt[100];
    CHECK_INT(mgpu_windows_read(&tr, 5, tok, tgt, &err), 0); /* tokens 500..600 */
    /* window 6 holds 600..700: the target of its last token is the bad one */
    CHECK_INT(mgpu_windows_read(&tr, 6, tok, tgt, &err), MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, "bad.bin: token 300 at position 700 (byte offset 2424), expected "
                            "below vocab = 256");
    mgpu_windows_free(&tr);
    mgpu_windows_free(&ev);
    mgpu_shards_close(&s);
    remove_tmpdir();
}

static void expect_open_error(const char *path, const char *want)
{
    mgpu_shards_t s;
    mgpu_err_t err = {0};
    CHECK_INT(mgpu_shards_open(&s, path, "data_tokens", 0, 256, &err), MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, want);
    CHECK_INT(s.n_files, 0);
}

static void test_bad_headers_are_named(void)
{
    make_tmpdir("shards");
    file_k = 0;
    write_file(tmp("v2.bin"), 1, MGPU_SHARD_MAGIC, 2, 10, 2, 10, where);
    expect_open_error(tmp("v2.bin"), "v2.bin: llm.c header version 2 at byte 4 with magic "
                                     "20240520, expected 1 (uint16 tokens)");
    write_file(tmp("v1w.bin"), 1, MGPU_SHARD_MAGIC_U32, 1, 10, 4, 10, where);
    expect_open_error(tmp("v1w.bin"), "version 1 at byte 4 with magic 20240801, expected 7");
    write_file(tmp("count.bin"), 1, MGPU_SHARD_MAGIC, 1, 11, 2, 10, where);
    expect_open_error(tmp("count.bin"), "count.bin: llm.c header says 11 tokens at byte 8 (1046 "
                                        "bytes with the header), the file has 1044 bytes");
    write_file(tmp("neg.bin"), 1, MGPU_SHARD_MAGIC, 1, 0xffffffffu, 2, 10, where);
    expect_open_error(tmp("neg.bin"), "neg.bin: llm.c header says -1 tokens");
    FILE *f = fopen(tmp("short.bin"), "wb");
    uint32_t h[3] = {MGPU_SHARD_MAGIC, 1, 0};
    fwrite(h, sizeof h, 1, f);
    fclose(f);
    expect_open_error(tmp("short.bin"), "short.bin: llm.c shard magic 20240520 but 12 bytes");
    f = fopen(tmp("odd.bin"), "wb");
    fputs("abc", f);
    fclose(f);
    expect_open_error(tmp("odd.bin"), "odd.bin: 3 bytes and no llm.c header");
    expect_open_error(tmp("none_*.bin"), "no file matches the pattern");
    expect_open_error(tmp("nodir/x_*.bin"), "needs the folder '");
    expect_open_error(tmp("nodir/x_*.bin"), "nodir': No such file or directory");
    expect_open_error(tmp("missing.bin"), "missing.bin: cannot open data_tokens");
    expect_open_error(" , ", "expected a file, a list or a pattern");
    /* a list fails on its bad member, naming it */
    char spec[600];
    write_file(tmp("ok.bin"), 1, MGPU_SHARD_MAGIC, 1, 10, 2, 10, where);
    snprintf(spec, sizeof spec, "%s,%s", tmp("ok.bin"), tmp("count.bin"));
    expect_open_error(spec, "count.bin: llm.c header says 11");
    remove_tmpdir();
}

static void test_writer_round_trips_both_widths(void)
{
    mgpu_shards_t s;
    mgpu_windows_t tr, ev;
    mgpu_err_t err = {0};
    int32_t small[5] = {0, 1, 65535, 7, 8}, wide[5] = {0, 70000, 128255, 3, 4}, got[4];
    int version = 0;
    make_tmpdir("shards");
    CHECK_INT(mgpu_shards_write(tmp("s.bin"), small, 5, &version, &err), 0);
    CHECK_INT(version, 1);
    CHECK_INT(mgpu_shards_write(tmp("w.bin"), wide, 5, &version, &err), 0);
    CHECK_INT(version, 7);
    CHECK_INT(mgpu_shards_open(&s, tmp("s.bin"), "x", 0, 65536, &err), 0);
    CHECK_INT(s.f[0].map_len, 1024 + 10);
    CHECK_INT(mgpu_windows_split(&s, 4, 0, &tr, &ev, &err), 0);
    CHECK_INT(mgpu_windows_read(&tr, 0, got, NULL, &err), 0);
    for (int i = 0; i < 4; i++)
        CHECK_INT(got[i], small[i]);
    mgpu_windows_free(&tr);
    mgpu_windows_free(&ev);
    mgpu_shards_close(&s);
    CHECK_INT(mgpu_shards_open(&s, tmp("w.bin"), "x", 0, 128256, &err), 0);
    CHECK_INT(s.f[0].map_len, 1024 + 20);
    CHECK_INT(mgpu_windows_split(&s, 4, 0, &tr, &ev, &err), 0);
    CHECK_INT(mgpu_windows_read(&tr, 0, NULL, got, &err), 0);
    for (int i = 0; i < 4; i++)
        CHECK_INT(got[i], wide[i + 1]);
    mgpu_windows_free(&tr);
    mgpu_windows_free(&ev);
    mgpu_shards_close(&s);
    /* text: bytes are tokens, no header even where the bytes spell a magic */
    CHECK_INT(mgpu_shards_open(&s, tmp("s.bin"), "data_text", 1, 256, &err), 0);
    CHECK_INT(s.n_tokens, 1024 + 10);
    mgpu_shards_close(&s);
    remove_tmpdir();
}

int main(void)
{
    RUN(test_windows_stay_inside_each_file);
    RUN(test_held_out_tail_spans_files);
    RUN(test_id_past_vocab_names_file_and_position);
    RUN(test_bad_headers_are_named);
    RUN(test_writer_round_trips_both_widths);
    return check_done();
}
