/* test_bpe.c - the byte-level BPE on a tokenizer.json built here: every byte a token (ids 0..255
 * in byte order, spelled with GPT-2's byte-to-unicode map), a few merges, one added token, and
 * the ids worked out by hand from GPT-2's split pattern and the merges' ranks (the ids Hugging
 * Face's tokenizers 0.23 gives for the same file); decoding back; pieces of megabytes;
 * the tokenizers it refuses. */
#include "bpe.h"
#include "check.h"
#include "tmpdir.h"   /* make_tmpdir, tmp, remove_tmpdir */
#include "watchdog.h" /* watchdog_start, watchdog_stop */

#include <cjson/cJSON.h> /* the tokenizer.json */

/* GPT-2's map: printable bytes stand for themselves, the rest for 256 + n, as UTF-8. */
static void byte_char(int b, char *out)
{
    int n = 0, c = -1;
    for (int x = 0; x <= b; x++) {
        int printable = (x >= '!' && x <= '~') || (x >= 0xa1 && x <= 0xac) || x >= 0xae;
        c = printable ? x : 256 + n++;
    }
    if (c < 0x80) {
        out[0] = (char)c;
        out[1] = 0;
    } else {
        out[0] = (char)(0xc0 | c >> 6);
        out[1] = (char)(0x80 | (c & 0x3f));
        out[2] = 0;
    }
}

/* Merges, in rank order, and the ids of what they make (256 + rank). */
static const char *const merges[][2] = {
    {"Ġ", "t"},   /* 256 Ġt */
    {"h", "e"},   /* 257 he */
    {"Ġt", "he"}, /* 258 Ġthe */
    {"'", "s"},   /* 259 's */
    {"Ã", "©"},   /* 260 Ã©: é's two bytes */
    {"c", "a"},   /* 261 ca */
    {"Ġ", "Ġ"},   /* 262 ĠĠ */
    {"Ġ", "b"},   /* 263 Ġb */
};
#define N_MERGES 8
#define EOT 264 /* the next id after the merges, as the library numbers added tokens */

/* Writes the tokenizer.json; mutate (may be NULL) changes it first. */
static const char *write_tokenizer(const char *name, void (*mutate)(cJSON *))
{
    static char path[512];
    cJSON *root = cJSON_CreateObject(), *model = cJSON_CreateObject();
    cJSON *vocab = cJSON_CreateObject(), *mlist = cJSON_CreateArray();
    cJSON *added = cJSON_CreateArray(), *eot = cJSON_CreateObject();
    cJSON *pre = cJSON_CreateObject();
    for (int b = 0; b < 256; b++) {
        char c[4];
        byte_char(b, c);
        cJSON_AddNumberToObject(vocab, c, b);
    }
    for (int r = 0; r < N_MERGES; r++) {
        char both[16], one[16];
        snprintf(both, sizeof both, "%s%s", merges[r][0], merges[r][1]);
        snprintf(one, sizeof one, "%s %s", merges[r][0], merges[r][1]);
        cJSON_AddNumberToObject(vocab, both, 256 + r);
        cJSON_AddItemToArray(mlist, cJSON_CreateString(one));
    }
    cJSON_AddStringToObject(eot, "content", "<|endoftext|>");
    cJSON_AddNumberToObject(eot, "id", EOT);
    cJSON_AddBoolToObject(eot, "special", 1);
    cJSON_AddItemToArray(added, eot);
    cJSON_AddStringToObject(pre, "type", "ByteLevel");
    cJSON_AddBoolToObject(pre, "add_prefix_space", 0);
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddItemToObject(model, "vocab", vocab);
    cJSON_AddItemToObject(model, "merges", mlist);
    cJSON_AddItemToObject(root, "added_tokens", added);
    cJSON_AddNullToObject(root, "normalizer");
    cJSON_AddItemToObject(root, "pre_tokenizer", pre);
    cJSON_AddItemToObject(root, "model", model);
    if (mutate != NULL)
        mutate(root);
    char *text = cJSON_Print(root);
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
    free(text);
    cJSON_Delete(root);
    return path;
}

static void check_ids(const mgpu_bpe_t *t, const char *text, const int32_t *want, size_t n)
{
    int32_t *ids = NULL;
    size_t got = 0;
    mgpu_err_t err = {0};
    CHECK_INT(mgpu_bpe_encode(t, text, strlen(text), &ids, &got, &err), 0);
    CHECK_INT(got, n);
    for (size_t i = 0; i < n && i < got; i++)
        if (ids[i] != want[i]) {
            printf("  '%s': id %zu is %d, expected %d\n", text, i, ids[i], want[i]);
            check_failed++;
        }
    char *back = NULL;
    size_t len = 0;
    CHECK_INT(mgpu_bpe_decode(t, ids, got, &back, &len, &err), 0);
    CHECK_STR(back, text);
    free(back);
    free(ids);
}

static void test_fixed_ids(void)
{
    mgpu_bpe_t *t = NULL;
    mgpu_err_t err = {0};
    make_tmpdir("bpe");
    CHECK_INT(mgpu_bpe_load(write_tokenizer("tok.json", NULL), &t, &err), 0);
    CHECK_INT(mgpu_bpe_vocab_size(t), EOT + 1);
    /* "the" | " cat" | "'s" | " café" (é = C3 A9: rank 4 merges before c a's rank 5),
     * <|endoftext|>, " the" (three merges), "  \n" (whitespace to the end: one piece; its two
     * spaces merge) */
    const int32_t a[] = {'t', 257, ' ', 261, 't', 259, ' ', 261, 'f', 260, EOT, 258, 262, '\n'};
    check_ids(t, "the cat's café<|endoftext|> the  \n", a, sizeof a / sizeof a[0]);
    /* "a" | "  " (the run but its last space, which goes with "b") | " b" */
    const int32_t b[] = {'a', 262, 263};
    check_ids(t, "a   b", b, 3);
    /* a tab before a letter is not the pattern's optional space: "\t" | "b" */
    const int32_t c[] = {'\t', 'b'};
    check_ids(t, "\tb", c, 2);
    /* "x" | "2²" (both numbers) | " !!'" ("'T" is no contraction) | "T" */
    const int32_t d[] = {'x', '2', 0xc2, 0xb2, ' ', '!', '!', '\'', 'T'};
    check_ids(t, "x2² !!'T", d, 9);
    /* letters of any script: " Ωж" is one piece, but no merge joins its bytes */
    const int32_t e[] = {' ', 0xce, 0xa9, 0xd0, 0xb6};
    check_ids(t, " Ωж", e, 5);
    mgpu_bpe_free(t);
    remove_tmpdir();
}

/* A piece of a million pairs (a line without spaces, a run of spaces) in well under the
 * watchdog's time: merging by rescanning the piece took hours at this size. The run of
 * spaces also checks that equal merges pair from the left (an odd count leaves the last). */
static void test_long_pieces(void)
{
    enum { PAIRS = 1000000 };
    mgpu_bpe_t *t = NULL;
    mgpu_err_t err = {0};
    char *text = malloc(2 * PAIRS + 2);
    int32_t *want = malloc(sizeof *want * (PAIRS + 1));
    make_tmpdir("bpe");
    CHECK_INT(mgpu_bpe_load(write_tokenizer("tok.json", NULL), &t, &err), 0);
    pid_t dog = watchdog_start(60);
    for (int i = 0; i < PAIRS; i++) {
        memcpy(text + 2 * i, "he", 2);
        want[i] = 257;
    }
    text[2 * PAIRS] = 0;
    check_ids(t, text, want, PAIRS);
    memset(text, ' ', 2 * PAIRS + 1);
    text[2 * PAIRS + 1] = 0;
    want[PAIRS] = ' ';
    for (int i = 0; i < PAIRS; i++)
        want[i] = 262;
    check_ids(t, text, want, PAIRS + 1);
    watchdog_stop(dog);
    free(want);
    free(text);
    mgpu_bpe_free(t);
    remove_tmpdir();
}

static void prefix_space(cJSON *root)
{
    cJSON *pre = cJSON_GetObjectItem(root, "pre_tokenizer");
    cJSON_ReplaceItemInObject(pre, "add_prefix_space", cJSON_CreateTrue());
}

static void test_add_prefix_space(void)
{
    mgpu_bpe_t *t = NULL;
    mgpu_err_t err = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    make_tmpdir("bpe");
    CHECK_INT(mgpu_bpe_load(write_tokenizer("p.json", prefix_space), &t, &err), 0);
    CHECK_INT(mgpu_bpe_encode(t, "the", 3, &ids, &n, &err), 0);
    CHECK_INT(n, 1);
    CHECK_INT(ids[0], 258); /* " the" */
    free(ids);
    mgpu_bpe_free(t);
    remove_tmpdir();
}

static void with_normalizer(cJSON *root)
{
    cJSON *n = cJSON_CreateObject();
    cJSON_AddStringToObject(n, "type", "NFC");
    cJSON_ReplaceItemInObject(root, "normalizer", n);
}

static void with_wordpiece(cJSON *root)
{
    cJSON *m = cJSON_GetObjectItem(root, "model");
    cJSON_ReplaceItemInObject(m, "type", cJSON_CreateString("WordPiece"));
}

static void with_bad_merge(cJSON *root)
{
    cJSON *m = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "model"), "merges");
    cJSON_AddItemToArray(m, cJSON_CreateString("zz q"));
}

static void with_metaspace(cJSON *root)
{
    cJSON *p = cJSON_GetObjectItem(root, "pre_tokenizer");
    cJSON_ReplaceItemInObject(p, "type", cJSON_CreateString("Metaspace"));
}

static void with_lstrip(cJSON *root)
{
    cJSON *eot = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "added_tokens"), 0);
    cJSON_AddBoolToObject(eot, "lstrip", 1);
}

/* The added token's id moved to id. */
static int eot_id;
static void with_eot_id(cJSON *root)
{
    cJSON *eot = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "added_tokens"), 0);
    cJSON_ReplaceItemInObject(eot, "id", cJSON_CreateNumber(eot_id));
}

static void test_refused_tokenizers(void)
{
    mgpu_bpe_t *t = NULL;
    mgpu_err_t err = {0};
    make_tmpdir("bpe");
    CHECK_INT(mgpu_bpe_load(write_tokenizer("n.json", with_normalizer), &t, &err), MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, "n.json: normalizer is set, expected none");
    CHECK_INT(mgpu_bpe_load(write_tokenizer("w.json", with_wordpiece), &t, &err), MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, "w.json: model.type is not \"BPE\"");
    CHECK_INT(mgpu_bpe_load(write_tokenizer("m.json", with_bad_merge), &t, &err), MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, "m.json: model.merges[8] = 'zz q': 'zz' is not in model.vocab");
    CHECK_INT(mgpu_bpe_load(write_tokenizer("s.json", with_metaspace), &t, &err), MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, "s.json: pre_tokenizer is not ByteLevel");
    /* RoBERTa's <mask> takes the spaces before it: not what a literal match gives */
    CHECK_INT(mgpu_bpe_load(write_tokenizer("l.json", with_lstrip), &t, &err), MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, "l.json: added_tokens[0] ('<|endoftext|>') has lstrip = true");
    /* an id far past the 265 tokens (a digit too many): refused, not gigabytes of table */
    eot_id = 400000000;
    CHECK_INT(mgpu_bpe_load(write_tokenizer("far.json", with_eot_id), &t, &err), MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, "far.json: ids run to 400000000 for 265 tokens");
    CHECK(t == NULL);
    /* a gap is fine: the added token at 60000, ids 265..59999 without a token */
    eot_id = 60000;
    CHECK_INT(mgpu_bpe_load(write_tokenizer("gap.json", with_eot_id), &t, &err), 0);
    if (t != NULL) {
        CHECK_INT(mgpu_bpe_vocab_size(t), 60001);
        CHECK(mgpu_bpe_has_id(t, 60000) && !mgpu_bpe_has_id(t, 59999));
        mgpu_bpe_free(t);
        t = NULL;
    }
    char path[600];
    snprintf(path, sizeof path, "%s/j.json", tmpdir);
    FILE *f = fopen(path, "w");
    fputs("{\"model\": ", f);
    fclose(f);
    CHECK_INT(mgpu_bpe_load(path, &t, &err), MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, "j.json: not valid JSON");
    CHECK(t == NULL);
    CHECK(mgpu_bpe_load("/nonexistent/tokenizer.json", &t, &err) < 0);
    CHECK_CONTAINS(err.msg, "cannot open the tokenizer");
    remove_tmpdir();
}

int main(void)
{
    RUN(test_fixed_ids);
    RUN(test_add_prefix_space);
    RUN(test_long_pieces);
    RUN(test_refused_tokenizers);
    return check_done();
}
