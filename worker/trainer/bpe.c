/* bpe.c - byte-level BPE: tokenizer.json read with cJSON, GPT-2's pre-tokenizer written out
 * as code (its regular expression has no backtracking beyond one step), merges by rank. */
#include "bpe.h"

#include <cjson/cJSON.h> /* the tokenizer.json */
#include <errno.h>       /* ENOMEM, EINTR */
#include <stdio.h>       /* snprintf */
#include <stdlib.h>      /* malloc, free */
#include <string.h>      /* memcmp, strlen */
#include <unistd.h>      /* read, close, access */

#include "data.h" /* mgpu_data_open_regular */
#include "ucd.h"  /* mgpu_ucd_is_* */

typedef struct tok {
    char *s; /* the token as the vocabulary spells it (mapped bytes), NUL-terminated */
    size_t len;
} tok_t;

typedef struct added {
    char *s;
    size_t len;
    int32_t id;
} added_t;

/* (left id, right id) -> the merge's rank and the id it makes. */
typedef struct merge {
    uint64_t key; /* left << 32 | right, 0 for an empty slot (id pairs are stored + 1) */
    int32_t rank, id;
} merge_t;

struct mgpu_bpe {
    tok_t *tok; /* by id; s NULL where an id has no token */
    int n_ids;
    int32_t *tab; /* string -> id: open addressing, -1 empty */
    size_t tab_cap;
    merge_t *merges;
    size_t merge_cap;
    added_t *added;
    int n_added;
    int32_t byte_id[256]; /* the token of each single byte, -1 when the vocabulary has none */
    uint16_t b2u[256];    /* GPT-2's byte -> printable code point */
    int16_t u2b[324];     /* and back (-1: not a mapped character) */
    int add_prefix_space, use_regex, ignore_merges;
};

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static int32_t lookup(const mgpu_bpe_t *t, const char *s, size_t n)
{
    for (size_t i = hash_bytes(s, n) & (t->tab_cap - 1);; i = (i + 1) & (t->tab_cap - 1)) {
        int32_t id = t->tab[i];
        if (id < 0)
            return -1;
        if (t->tok[id].len == n && memcmp(t->tok[id].s, s, n) == 0)
            return id;
    }
}

static void insert(mgpu_bpe_t *t, int32_t id)
{
    size_t i = hash_bytes(t->tok[id].s, t->tok[id].len) & (t->tab_cap - 1);
    while (t->tab[i] >= 0)
        i = (i + 1) & (t->tab_cap - 1);
    t->tab[i] = id;
}

static uint64_t pair_key(int32_t a, int32_t b)
{
    return (uint64_t)(uint32_t)(a + 1) << 32 | (uint32_t)(b + 1);
}

static const merge_t *find_merge(const mgpu_bpe_t *t, int32_t a, int32_t b)
{
    uint64_t k = pair_key(a, b);
    for (size_t i = (k * 0x9e3779b97f4a7c15ull) >> 20 & (t->merge_cap - 1);;
         i = (i + 1) & (t->merge_cap - 1)) {
        if (t->merges[i].key == k)
            return &t->merges[i];
        if (t->merges[i].key == 0)
            return NULL;
    }
}

/* GPT-2's bytes_to_unicode: the printable bytes stand for themselves, the others for 256 + n
 * in byte order. */
static void byte_map(mgpu_bpe_t *t)
{
    int n = 0;
    for (int i = 0; i < 324; i++)
        t->u2b[i] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
        t->b2u[b] = (uint16_t)(printable ? b : 256 + n++);
        t->u2b[t->b2u[b]] = (int16_t)b;
    }
}

/* UTF-8 of code point c (below 0x800 here) into out; its length. */
static int put_utf8(uint32_t c, char *out)
{
    if (c < 0x80) {
        out[0] = (char)c;
        return 1;
    }
    out[0] = (char)(0xc0 | c >> 6);
    out[1] = (char)(0x80 | (c & 0x3f));
    return 2;
}

/* The code point at s[i..n) and its length in bytes; an ill-formed byte counts as one
 * character of its own (the text came from a file that need not be UTF-8). */
static uint32_t get_utf8(const unsigned char *s, size_t i, size_t n, int *len)
{
    unsigned c = s[i];
    int k = c < 0x80                 ? 1
            : c >= 0xc2 && c <= 0xdf ? 2
            : c >= 0xe0 && c <= 0xef ? 3
            : c >= 0xf0 && c <= 0xf4 ? 4
                                     : 0;
    if (k == 0 || i + (size_t)k > n) {
        *len = 1;
        return 0xfffd;
    }
    uint32_t cp = k == 1 ? c : c & (0x7f >> k);
    for (int j = 1; j < k; j++) {
        if ((s[i + j] & 0xc0) != 0x80) {
            *len = 1;
            return 0xfffd;
        }
        cp = cp << 6 | (s[i + j] & 0x3f);
    }
    *len = k;
    return cp;
}

/* --- loading ------------------------------------------------------------------------------ */

static char *read_all(const char *path, size_t *len, mgpu_err_t *err)
{
    size_t size, got = 0;
    int fd;
    if (mgpu_data_open_regular(path, "the tokenizer", &fd, &size, err) < 0)
        return NULL;
    char *buf = malloc(size + 1);
    if (buf == NULL) {
        close(fd);
        mgpu_err_set(err, -ENOMEM, "tokenizer: malloc(%zu) for %s failed", size + 1, path);
        return NULL;
    }
    while (got < size) {
        ssize_t r = read(fd, buf + got, size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            mgpu_err_set(err, MGPU_E_CONFIG, "%s: read: %s", path,
                         r < 0 ? strerror(errno) : "file shrank while read");
            free(buf);
            close(fd);
            return NULL;
        }
        got += (size_t)r;
    }
    close(fd);
    buf[size] = 0;
    *len = size;
    return buf;
}

static int is_type(const cJSON *o, const char *type)
{
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(ty) && strcmp(ty->valuestring, type) == 0;
}

static int flag(const cJSON *o, const char *name, int dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

/* Refuses what would change the ids in ways this reader does not follow. */
static int check_pipeline(mgpu_bpe_t *t, const cJSON *root, const char *path, mgpu_err_t *err)
{
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");

    if (norm != NULL && !cJSON_IsNull(norm) &&
        !(is_type(norm, "Sequence") &&
          cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(norm, "normalizers")) == 0))
        return mgpu_err_set(err, MGPU_E_CONFIG,
                            "%s: normalizer is set, expected none (GPT-2's byte-level BPE)", path);
    if (pre != NULL && is_type(pre, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(pre, "pretokenizers");
        pre = cJSON_GetArraySize(list) == 1 ? cJSON_GetArrayItem(list, 0) : NULL;
    }
    if (pre == NULL || !is_type(pre, "ByteLevel"))
        return mgpu_err_set(err, MGPU_E_CONFIG,
                            "%s: pre_tokenizer is not ByteLevel, expected a byte-level BPE "
                            "(GPT-2's)",
                            path);
    t->add_prefix_space = flag(pre, "add_prefix_space", 0);
    t->use_regex = flag(pre, "use_regex", 1);
    if (model == NULL || !is_type(model, "BPE"))
        return mgpu_err_set(err, MGPU_E_CONFIG, "%s: model.type is not \"BPE\"", path);
    const cJSON *cs = cJSON_GetObjectItemCaseSensitive(model, "continuing_subword_prefix");
    const cJSON *ew = cJSON_GetObjectItemCaseSensitive(model, "end_of_word_suffix");
    if ((cJSON_IsString(cs) && *cs->valuestring != 0) ||
        (cJSON_IsString(ew) && *ew->valuestring != 0))
        return mgpu_err_set(err, MGPU_E_CONFIG,
                            "%s: model has a continuing_subword_prefix or end_of_word_suffix, "
                            "expected neither (byte-level BPE)",
                            path);
    if (flag(model, "byte_fallback", 0))
        return mgpu_err_set(err, MGPU_E_CONFIG, "%s: model.byte_fallback is true, expected false",
                            path);
    t->ignore_merges = flag(model, "ignore_merges", 0);
    return 0;
}

static int set_token(mgpu_bpe_t *t, int32_t id, const char *s, const char *path, mgpu_err_t *err)
{
    if (id < 0 || id >= t->n_ids)
        return mgpu_err_set(err, MGPU_E_CONFIG, "%s: token '%s' has id %d, expected 0..%d", path, s,
                            (int)id, t->n_ids - 1);
    if (t->tok[id].s != NULL)
        return 0; /* an added token that repeats a vocabulary entry */
    if ((t->tok[id].s = strdup(s)) == NULL)
        return mgpu_err_set(err, -ENOMEM, "tokenizer: strdup failed");
    t->tok[id].len = strlen(s);
    return 0;
}

static int load_merges(mgpu_bpe_t *t, const cJSON *merges, const char *path, mgpu_err_t *err)
{
    int n = cJSON_GetArraySize(merges);
    t->merge_cap = 16;
    while (t->merge_cap < 2 * (size_t)n + 16)
        t->merge_cap *= 2;
    if ((t->merges = calloc(t->merge_cap, sizeof *t->merges)) == NULL)
        return mgpu_err_set(err, -ENOMEM, "tokenizer: calloc of %zu merges failed", t->merge_cap);
    for (int r = 0; r < n; r++) {
        const cJSON *m = cJSON_GetArrayItem(merges, r);
        char a[256], b[256];
        if (cJSON_IsString(m)) {
            const char *sp = strchr(m->valuestring, ' ');
            size_t la = sp ? (size_t)(sp - m->valuestring) : 0;
            if (sp == NULL || la >= sizeof a || strlen(sp + 1) >= sizeof b)
                return mgpu_err_set(err, MGPU_E_CONFIG,
                                    "%s: model.merges[%d] = '%.80s', expected 'LEFT RIGHT'", path,
                                    r, m->valuestring);
            memcpy(a, m->valuestring, la);
            a[la] = 0;
            snprintf(b, sizeof b, "%s", sp + 1);
        } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 &&
                   cJSON_IsString(cJSON_GetArrayItem(m, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(m, 1)) &&
                   strlen(cJSON_GetArrayItem(m, 0)->valuestring) < sizeof a &&
                   strlen(cJSON_GetArrayItem(m, 1)->valuestring) < sizeof b) {
            snprintf(a, sizeof a, "%s", cJSON_GetArrayItem(m, 0)->valuestring);
            snprintf(b, sizeof b, "%s", cJSON_GetArrayItem(m, 1)->valuestring);
        } else
            return mgpu_err_set(err, MGPU_E_CONFIG,
                                "%s: model.merges[%d] is neither 'LEFT RIGHT' nor [LEFT, RIGHT]",
                                path, r);
        char ab[512];
        int32_t ia = lookup(t, a, strlen(a)), ib = lookup(t, b, strlen(b));
        int lab = snprintf(ab, sizeof ab, "%s%s", a, b);
        int32_t iab = lookup(t, ab, (size_t)lab);
        if (ia < 0 || ib < 0 || iab < 0)
            return mgpu_err_set(err, MGPU_E_CONFIG,
                                "%s: model.merges[%d] = '%s %s': '%s' is not in model.vocab", path,
                                r, a, b,
                                ia < 0   ? a
                                : ib < 0 ? b
                                         : ab);
        uint64_t k = pair_key(ia, ib);
        size_t i = (k * 0x9e3779b97f4a7c15ull) >> 20 & (t->merge_cap - 1);
        while (t->merges[i].key != 0 && t->merges[i].key != k)
            i = (i + 1) & (t->merge_cap - 1);
        if (t->merges[i].key == 0) /* a repeated merge keeps its first (lowest) rank */
            t->merges[i] = (merge_t){.key = k, .rank = r, .id = iab};
    }
    return 0;
}

/* A folder, as Hugging Face's from_pretrained takes: its tokenizer.json, in file (cap bytes);
 * anything else as it is named. */
static int tokenizer_file(const char *path, char *file, size_t cap, mgpu_err_t *err)
{
    char vocab[4200];
    int rc = mgpu_data_in_folder(path, "tokenizer.json", "tokenizer", file, cap, err);

    if (rc <= 0 || access(file, F_OK) == 0)
        return rc < 0 ? rc : 0;
    if (mgpu_data_in_folder(path, "vocab.json", "tokenizer", vocab, sizeof vocab, err) > 0 &&
        access(vocab, F_OK) == 0)
        return mgpu_err_set(err, MGPU_E_CONFIG,
                            "tokenizer %s: a folder with vocab.json (a slow tokenizer's files) "
                            "and no tokenizer.json: write one with "
                            "AutoTokenizer.from_pretrained(folder).save_pretrained(folder)",
                            path);
    return mgpu_err_set(err, MGPU_E_CONFIG,
                        "tokenizer %s: a folder with no tokenizer.json, expected a tokenizer.json "
                        "or a Hugging Face folder holding one",
                        path);
}

int mgpu_bpe_load(const char *given, mgpu_bpe_t **out, mgpu_err_t *err)
{
    size_t len;
    int rc;
    cJSON *root = NULL;
    char path[4096];

    *out = NULL;
    if (tokenizer_file(given, path, sizeof path, err) < 0)
        return MGPU_E_CONFIG;
    mgpu_bpe_t *t = calloc(1, sizeof *t);
    char *text = read_all(path, &len, err);
    if (text == NULL) {
        free(t);
        return MGPU_E_CONFIG;
    }
    if (t == NULL) {
        free(text);
        return mgpu_err_set(err, -ENOMEM, "tokenizer: calloc failed");
    }
    byte_map(t);
    root = cJSON_ParseWithOpts(text, NULL, 1);
    if (root == NULL) {
        rc = mgpu_err_set(err, MGPU_E_CONFIG, "%s: not valid JSON (expected a tokenizer.json)",
                          path);
        goto out;
    }
    if ((rc = check_pipeline(t, root, path, err)) < 0)
        goto out;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    const cJSON *e;
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges)) {
        rc = mgpu_err_set(err, MGPU_E_CONFIG,
                          "%s: expected model.vocab (an object) and model.merges (an array)", path);
        goto out;
    }
    int max_id = -1;
    cJSON_ArrayForEach(e, vocab) max_id =
        cJSON_IsNumber(e) && e->valueint > max_id ? e->valueint : max_id;
    cJSON_ArrayForEach(e, added)
    {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        max_id = cJSON_IsNumber(id) && id->valueint > max_id ? id->valueint : max_id;
    }
    if (max_id < 0 || max_id >= (1 << 30)) {
        rc = mgpu_err_set(err, MGPU_E_CONFIG, "%s: model.vocab has %s ids", path,
                          max_id < 0 ? "no" : "too large");
        goto out;
    }
    /* Ids index a table: a few gaps are fine (added tokens past the vocabulary), but ids far
     * past the number of tokens are a damaged file, not gigabytes to allocate. */
    const size_t entries = (size_t)cJSON_GetArraySize(vocab) + (size_t)cJSON_GetArraySize(added);
    if ((size_t)max_id >= 2 * entries + 65536) {
        rc = mgpu_err_set(err, MGPU_E_CONFIG,
                          "%s: ids run to %d for %zu tokens (model.vocab and added_tokens): "
                          "ids are expected to number the tokens from 0, with few gaps (a "
                          "damaged file?)",
                          path, max_id, entries);
        goto out;
    }
    t->n_ids = max_id + 1;
    /* One slot an id that has a token, at most half full. */
    for (t->tab_cap = 16; t->tab_cap < 2 * entries; t->tab_cap *= 2)
        ;
    t->tok = calloc((size_t)t->n_ids, sizeof *t->tok);
    t->tab = malloc(sizeof *t->tab * t->tab_cap);
    t->added = calloc((size_t)cJSON_GetArraySize(added) + 1, sizeof *t->added);
    if (t->tok == NULL || t->tab == NULL || t->added == NULL) {
        rc = mgpu_err_set(err, -ENOMEM, "tokenizer: allocation for %d ids failed", t->n_ids);
        goto out;
    }
    memset(t->tab, 0xff, sizeof *t->tab * t->tab_cap);
    cJSON_ArrayForEach(e, vocab)
    {
        if (!cJSON_IsNumber(e)) {
            rc = mgpu_err_set(err, MGPU_E_CONFIG, "%s: model.vocab['%s'] is not a number", path,
                              e->string);
            goto out;
        }
        if ((rc = set_token(t, e->valueint, e->string, path, err)) < 0)
            goto out;
        if (lookup(t, e->string, strlen(e->string)) < 0)
            insert(t, e->valueint);
    }
    cJSON_ArrayForEach(e, added)
    {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(e, "content");
        if (!cJSON_IsNumber(id) || !cJSON_IsString(content) || *content->valuestring == 0) {
            rc = mgpu_err_set(err, MGPU_E_CONFIG,
                              "%s: added_tokens[%d] needs an id and a non-empty content", path,
                              t->n_added);
            goto out;
        }
        /* matched as written: a flag that widens or narrows the match is refused */
        static const char *const flags[] = {"lstrip", "rstrip", "single_word"};
        for (int f = 0; f < 3; f++)
            if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, flags[f]))) {
                rc = mgpu_err_set(err, MGPU_E_CONFIG,
                                  "%s: added_tokens[%d] ('%.100s') has %s = true: only tokens "
                                  "matched exactly as written are supported",
                                  path, t->n_added, content->valuestring, flags[f]);
                goto out;
            }
        if ((rc = set_token(t, id->valueint, content->valuestring, path, err)) < 0)
            goto out;
        added_t *a = &t->added[t->n_added++];
        a->id = id->valueint;
        a->len = strlen(content->valuestring);
        if ((a->s = strdup(content->valuestring)) == NULL) {
            rc = mgpu_err_set(err, -ENOMEM, "tokenizer: strdup failed");
            goto out;
        }
    }
    for (int b = 0; b < 256; b++) {
        char u[2];
        t->byte_id[b] = lookup(t, u, (size_t)put_utf8(t->b2u[b], u));
    }
    rc = load_merges(t, merges, path, err);
out:
    cJSON_Delete(root);
    free(text);
    if (rc < 0)
        mgpu_bpe_free(t);
    else
        *out = t;
    return rc;
}

void mgpu_bpe_free(mgpu_bpe_t *t)
{
    if (t == NULL)
        return;
    for (int i = 0; t->tok != NULL && i < t->n_ids; i++)
        free(t->tok[i].s);
    for (int i = 0; i < t->n_added; i++)
        free(t->added[i].s);
    free(t->tok);
    free(t->tab);
    free(t->merges);
    free(t->added);
    free(t);
}

int mgpu_bpe_vocab_size(const mgpu_bpe_t *t)
{
    return t->n_ids;
}

int mgpu_bpe_has_id(const mgpu_bpe_t *t, int32_t id)
{
    return id >= 0 && id < t->n_ids && t->tok[id].s != NULL;
}

/* --- encoding ----------------------------------------------------------------------------- */

typedef struct ids {
    int32_t *v;
    size_t n, cap;
} ids_t;

static int push(ids_t *o, int32_t id, mgpu_err_t *err)
{
    if (o->n == o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 256;
        int32_t *v = realloc(o->v, sizeof *v * cap);
        if (v == NULL)
            return mgpu_err_set(err, -ENOMEM, "tokenizer: realloc of %zu ids failed", cap);
        o->v = v;
        o->cap = cap;
    }
    o->v[o->n++] = id;
    return 0;
}

/* The class of the character at i: 'L', 'N', 's' (space) or 'o' (other); its length. */
static int cls(const unsigned char *s, size_t i, size_t n, int *len)
{
    uint32_t c = get_utf8(s, i, n, len);
    return mgpu_ucd_is_letter(c)   ? 'L'
           : mgpu_ucd_is_number(c) ? 'N'
           : mgpu_ucd_is_space(c)  ? 's'
                                   : 'o';
}

/* The end of the longest run of characters of class k from i. */
static size_t run_of(const unsigned char *s, size_t i, size_t n, int k)
{
    int len;
    while (i < n && cls(s, i, n, &len) == k)
        i += (size_t)len;
    return i;
}

/* The end of GPT-2's pattern's match at i (i < n), its alternatives tried in order. */
static size_t next_piece(const unsigned char *s, size_t i, size_t n)
{
    static const char *const contractions[] = {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"};
    int len;
    if (s[i] == '\'')
        for (int k = 0; k < 7; k++) {
            size_t l = strlen(contractions[k]);
            if (i + l <= n && memcmp(s + i, contractions[k], l) == 0)
                return i + l;
        }
    /* ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': an optional space, then a run of one
     * class ('o' stands for the last). */
    size_t j = s[i] == ' ' && i + 1 < n ? i + 1 : i;
    for (;;) {
        int k = cls(s, j, n, &len);
        if (k != 's')
            return run_of(s, j, n, k);
        if (j == i)
            break;
        j = i; /* the space was no prefix: the class of the space itself is 's' */
    }
    /* '\s+(?!\S)': the whitespace run but its last character when something follows it;
     * '\s+': the whole run when that leaves nothing. */
    size_t e = run_of(s, i, n, 's');
    if (e == n)
        return e;
    size_t last = i;
    for (size_t p = i; p < e; p += (size_t)len) {
        get_utf8(s, p, n, &len);
        if (p + (size_t)len == e)
            last = p;
    }
    return last > i ? last : e;
}

/* A pair of neighbouring symbols that a merge joins: symbol pos (its id left) and the next
 * one (its id right), queued by the merge's rank, then by position (leftmost first). */
typedef struct pair {
    int32_t rank, pos, left, right;
} pair_t;

/* A piece's working memory, grown to the longest piece so far: pieces are short, texts not,
 * but a line without spaces (base64, minified JSON) is one piece. */
typedef struct work {
    int32_t *sym, *next, *prev;
    pair_t *heap; /* at most 3 pairs a byte: one a neighbour at the start, two a merge */
    size_t cap;
} work_t;

static int pair_less(const pair_t *a, const pair_t *b)
{
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(pair_t *h, int *n, pair_t p)
{
    int i = (*n)++;
    while (i > 0 && pair_less(&p, &h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = p;
}

static pair_t heap_pop(pair_t *h, int *n)
{
    pair_t top = h[0], last = h[--(*n)];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && pair_less(&h[c + 1], &h[c]))
            c++;
        if (!pair_less(&h[c], &last))
            break;
        h[i] = h[c];
        i = c;
    }
    h[i] = last;
    return top;
}

/* Queues the merge of symbol i with the next one, if the merges have one. */
static void queue_pair(const mgpu_bpe_t *t, work_t *w, int *nh, int i)
{
    if (i < 0 || w->next[i] < 0)
        return;
    const merge_t *mg = find_merge(t, w->sym[i], w->sym[w->next[i]]);
    if (mg != NULL)
        heap_push(
            w->heap, nh,
            (pair_t){.rank = mg->rank, .pos = i, .left = w->sym[i], .right = w->sym[w->next[i]]});
}

/* One piece: its bytes' tokens, then the merges, the lowest rank first and, among equal
 * ranks, the leftmost, as the library applies them; O(n log n) through a queue of the
 * neighbouring pairs, where a pair made stale by an earlier merge is skipped when it comes
 * up. */
static int encode_piece(const mgpu_bpe_t *t, const unsigned char *s, size_t n, ids_t *o, work_t *w,
                        mgpu_err_t *err)
{
    int m = 0, nh = 0;
    if (t->ignore_merges && n <= 256) {
        char u[512];
        size_t l = 0;
        for (size_t i = 0; i < n; i++)
            l += (size_t)put_utf8(t->b2u[s[i]], u + l);
        int32_t id = lookup(t, u, l);
        if (id >= 0)
            return push(o, id, err);
    }
    for (size_t i = 0; i < n; i++)
        if (t->byte_id[s[i]] >= 0) /* as the library does: a byte with no token is dropped */
            w->sym[m++] = t->byte_id[s[i]];
    for (int i = 0; i < m; i++) {
        w->prev[i] = i - 1;
        w->next[i] = i + 1 < m ? i + 1 : -1;
    }
    for (int i = 0; i + 1 < m; i++)
        queue_pair(t, w, &nh, i);
    while (nh > 0) {
        const pair_t p = heap_pop(w->heap, &nh);
        const int i = p.pos, j = w->next[i];
        /* stale: symbol i or its neighbour changed (or went) since the pair was queued */
        if (w->sym[i] != p.left || j < 0 || w->sym[j] != p.right)
            continue;
        const merge_t *mg = find_merge(t, p.left, p.right);
        w->sym[i] = mg->id;
        w->sym[j] = -1; /* gone: no live pair names it */
        w->next[i] = w->next[j];
        if (w->next[j] >= 0)
            w->prev[w->next[j]] = i;
        queue_pair(t, w, &nh, w->prev[i]);
        queue_pair(t, w, &nh, i);
    }
    for (int i = m > 0 ? 0 : -1; i >= 0; i = w->next[i]) {
        int rc = push(o, w->sym[i], err);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int work_grow(work_t *w, size_t n, mgpu_err_t *err)
{
    int32_t *a = realloc(w->sym, sizeof *a * n);
    w->sym = a != NULL ? a : w->sym;
    int32_t *b = a != NULL ? realloc(w->next, sizeof *b * n) : NULL;
    w->next = b != NULL ? b : w->next;
    int32_t *c = b != NULL ? realloc(w->prev, sizeof *c * n) : NULL;
    w->prev = c != NULL ? c : w->prev;
    pair_t *h = c != NULL ? realloc(w->heap, sizeof *h * 3 * n) : NULL;
    if (h == NULL)
        return mgpu_err_set(err, -ENOMEM, "tokenizer: realloc for a piece of %zu bytes failed", n);
    w->heap = h;
    w->cap = n;
    return 0;
}

/* A stretch with no added token in it: prefix space, pattern, pieces. */
static int encode_plain(const mgpu_bpe_t *t, const unsigned char *s, size_t n, ids_t *o,
                        mgpu_err_t *err)
{
    unsigned char *buf = NULL;
    work_t w = {0};
    int rc = 0;
    if (n == 0)
        return 0;
    if (t->add_prefix_space && s[0] != ' ') {
        if ((buf = malloc(n + 1)) == NULL)
            return mgpu_err_set(err, -ENOMEM, "tokenizer: malloc(%zu) failed", n + 1);
        buf[0] = ' ';
        memcpy(buf + 1, s, n);
        s = buf;
        n++;
    }
    for (size_t i = 0; i < n && rc == 0;) {
        size_t e = t->use_regex ? next_piece(s, i, n) : n;
        if (e - i > w.cap && (rc = work_grow(&w, e - i, err)) < 0)
            break;
        rc = encode_piece(t, s + i, e - i, o, &w, err);
        i = e;
    }
    free(w.sym);
    free(w.next);
    free(w.prev);
    free(w.heap);
    free(buf);
    return rc;
}

int mgpu_bpe_encode(const mgpu_bpe_t *t, const char *text, size_t len, int32_t **ids, size_t *n,
                    mgpu_err_t *err)
{
    const unsigned char *s = (const unsigned char *)text;
    ids_t o = {0};
    size_t from = 0;
    int rc = 0;

    *ids = NULL;
    *n = 0;
    for (size_t i = 0; i < len && rc == 0;) {
        const added_t *best = NULL;
        for (int a = 0; a < t->n_added; a++)
            if (t->added[a].len <= len - i && memcmp(s + i, t->added[a].s, t->added[a].len) == 0 &&
                (best == NULL || t->added[a].len > best->len))
                best = &t->added[a];
        if (best == NULL) {
            i++;
            continue;
        }
        if ((rc = encode_plain(t, s + from, i - from, &o, err)) == 0)
            rc = push(&o, best->id, err);
        i += best->len;
        from = i;
    }
    if (rc == 0)
        rc = encode_plain(t, s + from, len - from, &o, err);
    if (rc < 0) {
        free(o.v);
        return rc;
    }
    *ids = o.v != NULL ? o.v : malloc(sizeof(int32_t));
    if (*ids == NULL)
        return mgpu_err_set(err, -ENOMEM, "tokenizer: malloc failed");
    *n = o.n;
    return 0;
}

int mgpu_bpe_decode(const mgpu_bpe_t *t, const int32_t *ids, size_t n, char **text, size_t *len,
                    mgpu_err_t *err)
{
    size_t cap = 1, at = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_ids || t->tok[ids[i]].s == NULL)
            return mgpu_err_set(err, MGPU_E_CONFIG, "tokenizer: id %d at position %zu has no token",
                                (int)ids[i], i);
        cap += t->tok[ids[i]].len;
    }
    char *out = malloc(cap);
    if (out == NULL)
        return mgpu_err_set(err, -ENOMEM, "tokenizer: malloc(%zu) failed", cap);
    for (size_t i = 0; i < n; i++) {
        const unsigned char *s = (const unsigned char *)t->tok[ids[i]].s;
        size_t l = t->tok[ids[i]].len, start = at;
        int ok = 1, k;
        for (size_t j = 0; j < l && ok; j += (size_t)k) {
            uint32_t c = get_utf8(s, j, l, &k);
            ok = c < 324 && t->u2b[c] >= 0;
            if (ok)
                out[at++] = (char)t->u2b[c];
        }
        if (!ok) { /* a character outside the map: the token's own UTF-8, as the library does */
            memcpy(out + start, s, l);
            at = start + l;
        }
    }
    out[at] = 0;
    *text = out;
    *len = at;
    return 0;
}
