/* test_weights.c - the safetensors reader and writer (round trip, every kind of damage named),
 * the weights' layout against the GPT's own, the Hugging Face export and load (Conv1D
 * transposes, vocabulary padding, a shorter context, shapes that do not fit refused by name)
 * and llm.c's checkpoint in fp32 and bf16. */
#include "check.h"
#include "dtype.h"
#include "model_gpt.h"
#include "safetensors.h"
#include "weights.h"

#include <math.h>   /* fabsf */
#include <stdint.h> /* int32_t */

static char dir[64];

static const char *path_in(const char *name)
{
    static char p[4][256];
    static int next;
    char *s = p[next++ % 4];
    snprintf(s, sizeof p[0], "%s/%s", dir, name);
    return s;
}

static void setup(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/mgpu_test_weights.XXXXXX", tmp != NULL && *tmp ? tmp : "/tmp");
    if (mkdtemp(dir) == NULL)
        exit(1);
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

static void put(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL && fwrite(data, 1, n, f) == n);
    if (f != NULL)
        fclose(f);
}

/* A file of 8 bytes of header length, the header and data bytes. */
static void put_st(const char *path, const char *header, size_t data_bytes)
{
    size_t h = strlen(header);
    unsigned char *b = calloc(1, 8 + h + data_bytes);
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)((uint64_t)h >> (8 * i));
    memcpy(b + 8, header, h);
    put(path, b, 8 + h + data_bytes);
    free(b);
}

static const mgpu_gpt_spec_t tiny = {
    .n_layer = 2, .n_head = 2, .n_embd = 16, .context = 8, .vocab = 24};

static float *random_params(const mgpu_gpt_spec_t *spec, size_t *n)
{
    mgpu_weights_layout(spec, (mgpu_weights_tensor_t[64]){0}, n);
    float *p = malloc(sizeof(float) * *n);
    uint32_t x = 12345;
    for (size_t i = 0; i < *n; i++) {
        x = x * 1664525u + 1013904223u;
        p[i] = (float)((int)(x >> 9) % 2001 - 1000) / 997.0f;
    }
    return p;
}

static void test_layout_matches_the_model(void)
{
    mgpu_kernels_t *k = NULL;
    mgpu_gpt_t *m = NULL;
    mgpu_err_t err = {0};
    mgpu_weights_tensor_t t[64];
    size_t n;
    CHECK(mgpu_kernels_create(MGPU_KBACKEND_CPU, -1, &k, &err) == 0);
    CHECK(mgpu_gpt_create(k, &tiny, 1, &m, &err) == 0);
    CHECK_INT(mgpu_weights_count(&tiny), m->n_tensors);
    mgpu_weights_layout(&tiny, t, &n);
    CHECK_INT(n, m->n_params);
    for (int i = 0; i < m->n_tensors; i++) {
        CHECK_INT(t[i].off, m->tensors[i].off);
        CHECK_INT((size_t)t[i].rows * (t[i].cols > 0 ? t[i].cols : 1), m->tensors[i].n);
        CHECK_INT(t[i].cols > 0 ? 2 : 1, m->tensors[i].ndim);
    }
    CHECK_INT(t[2 + MGPU_W_PER_LAYER + MGPU_W_QKV_W].off, m->blocks[1].qkv_w);
    CHECK_INT(t[2 + MGPU_W_FCP_B].off, m->blocks[0].fcp_b);
    CHECK_STR(t[2 + MGPU_W_PER_LAYER + MGPU_W_FC_W].hf, "transformer.h.1.mlp.c_fc.weight");
    CHECK(t[2 + MGPU_W_PROJ_W].conv1d && !t[2 + MGPU_W_LN1_W].conv1d && !t[0].conv1d);
    mgpu_gpt_destroy(m);
    mgpu_kernels_destroy(k);
}

static void test_safetensors_round_trip(void)
{
    setup();
    float a[6] = {1, -2, 3.5f, 4, 5, 6e-3f}, s = 7.25f;
    uint16_t b[4], h[4];
    for (int i = 0; i < 4; i++) {
        b[i] = mgpu_dtype_f32_to_bf16((float)i - 1.5f);
        h[i] = mgpu_dtype_f32_to_f16((float)i * 0.25f);
    }
    mgpu_st_out_t o[4] = {
        {.name = "a", .dtype = MGPU_ST_F32, .ndim = 2, .shape = {2, 3}, .data = a},
        {.name = "b.bf", .dtype = MGPU_ST_BF16, .ndim = 1, .shape = {4}, .data = b},
        {.name = "h", .dtype = MGPU_ST_F16, .ndim = 2, .shape = {1, 4}, .data = h},
        {.name = "scalar", .dtype = MGPU_ST_F32, .ndim = 0, .data = &s}};
    const char *meta[] = {"format", "pt", "note", "x"};
    mgpu_err_t err = {0};
    CHECK(mgpu_st_write(path_in("r.safetensors"), o, 4, meta, 2, 0, &err) == 0);
    mgpu_st_t *st = NULL;
    CHECK(mgpu_st_open(path_in("r.safetensors"), &st, &err) == 0);
    if (st == NULL) {
        printf("  %s\n", err.msg);
        teardown();
        return;
    }
    CHECK_INT((8 + (st->data - st->map - 8)) % 8, 0); /* the header padded */
    CHECK_INT(st->n, 4);
    CHECK_STR(mgpu_st_meta(st, "format"), "pt");
    CHECK_STR(mgpu_st_meta(st, "note"), "x");
    CHECK(mgpu_st_meta(st, "none") == NULL);
    const mgpu_st_tensor_t *t = mgpu_st_find(st, "a");
    float out[6];
    CHECK(t != NULL && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 3);
    CHECK(t != NULL && mgpu_st_read_f32(st, t, out, &err) == 0 && memcmp(out, a, sizeof a) == 0);
    t = mgpu_st_find(st, "b.bf");
    CHECK(t != NULL && t->dtype == MGPU_ST_BF16 && mgpu_st_read_f32(st, t, out, &err) == 0);
    for (int i = 0; t != NULL && i < 4; i++)
        CHECK(out[i] == (float)i - 1.5f);
    t = mgpu_st_find(st, "h");
    CHECK(t != NULL && t->dtype == MGPU_ST_F16 && mgpu_st_read_f32(st, t, out, &err) == 0);
    for (int i = 0; t != NULL && i < 4; i++)
        CHECK(out[i] == (float)i * 0.25f);
    t = mgpu_st_find(st, "scalar");
    CHECK(t != NULL && t->ndim == 0 && mgpu_st_numel(t) == 1);
    CHECK(t != NULL && mgpu_st_read_f32(st, t, out, &err) == 0 && out[0] == 7.25f);
    mgpu_st_close(st);
    teardown();
}

/* Opening path fails with MGPU_E_CONFIG and a message that contains want. */
static void refused(const char *path, const char *want)
{
    mgpu_st_t *st = NULL;
    mgpu_err_t err = {0};
    int rc = mgpu_st_open(path, &st, &err);
    CHECK_INT(rc, MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, want);
    CHECK(st == NULL);
}

static void test_safetensors_damage_is_named(void)
{
    setup();
    const char *p = path_in("bad.safetensors");
    put(p, "abc", 3);
    refused(p, "3 bytes, fewer than the 8");
    put(p, "\xff\xff\xff\xff\0\0\0\0{}", 10);
    refused(p, "header length 4294967295");
    put_st(p, "[1, 2]", 0);
    refused(p, "does not start with '{'");
    put_st(p, "{\"a\": {\"dtype\": \"F32\"", 0);
    refused(p, "is not a JSON object");
    put_st(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}x", 8);
    refused(p, "are not padding spaces");
    put_st(p, "{\"a\": {\"dtype\": \"Q7\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 8);
    refused(p, "tensor 'a': dtype 'Q7' is none of the format's");
    put_st(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 8]}}", 8);
    refused(p, "tensor 'a': data_offsets [0, 8] hold 8 bytes, its dtype F32 and shape need 12");
    put_st(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 4);
    refused(p, "end past the 4 bytes of data");
    put_st(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}", 8);
    refused(p, "tensor 'a' begins at byte 4 of the data, expected 0");
    put_st(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 8);
    refused(p, "the tensors end at byte 4 of the data, the file holds 8");
    put_st(p,
           "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}, \"a\": "
           "{\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}",
           8);
    refused(p, "tensor 'a' appears twice");
    put_st(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}}", 4);
    refused(p, "shape[0] is not a whole number");
    put_st(p, "{\"__metadata__\": {\"k\": 1}}", 0);
    refused(p, "__metadata__ 'k': expected a string value");
    /* I64 parses, but is no float to read */
    put_st(p, "{\"i\": {\"dtype\": \"I64\", \"shape\": [1], \"data_offsets\": [0, 8]}}", 8);
    mgpu_st_t *st = NULL;
    mgpu_err_t err = {0};
    float f[2];
    CHECK(mgpu_st_open(p, &st, &err) == 0);
    CHECK(st != NULL && mgpu_st_read_f32(st, &st->tensors[0], f, &err) == MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, "tensor 'i' has dtype I64, expected F32, BF16, F16 or F64");
    mgpu_st_close(st);
    teardown();
}

static void test_export_then_load(void)
{
    setup();
    size_t n, n2;
    float *p = random_params(&tiny, &n), *q = malloc(sizeof(float) * n);
    mgpu_err_t err = {0};
    char what[512];
    const int C = tiny.n_embd;
    CHECK(mgpu_weights_export(path_in("model.safetensors"), &tiny, p, n, &err) == 0);
    CHECK(mgpu_weights_check(path_in("model.safetensors"), &tiny, &err) == 0);
    CHECK(mgpu_weights_load(path_in("model.safetensors"), &tiny, q, n, what, sizeof what, &err) ==
          0);
    CHECK(memcmp(p, q, sizeof(float) * n) == 0);
    CHECK_CONTAINS(what, "Hugging Face safetensors, F32, 28 tensors; wte 24 of the cfg's 24 rows");
    /* In the file: Conv1D's [in, out], the transpose of mgpu's [out, in]. */
    mgpu_st_t *st = NULL;
    mgpu_weights_tensor_t t[64];
    mgpu_weights_layout(&tiny, t, &n2);
    CHECK(mgpu_st_open(path_in("model.safetensors"), &st, &err) == 0);
    const mgpu_st_tensor_t *a = st ? mgpu_st_find(st, "transformer.h.1.attn.c_attn.weight") : NULL;
    CHECK(a != NULL && a->shape[0] == C && a->shape[1] == 3 * C);
    float *f = malloc(sizeof(float) * 3 * C * C);
    const size_t off = t[2 + MGPU_W_PER_LAYER + MGPU_W_QKV_W].off;
    CHECK(a != NULL && mgpu_st_read_f32(st, a, f, &err) == 0);
    CHECK(a != NULL && f[1 * 3 * C + 5] == p[off + 5 * C + 1]);
    CHECK(a != NULL && f[7 * 3 * C + 40] == p[off + 40 * C + 7]);
    CHECK(st != NULL && mgpu_st_find(st, "lm_head.weight") == NULL);
    CHECK_STR(st ? mgpu_st_meta(st, "format") : NULL, "pt");
    mgpu_st_close(st);
    free(f);
    FILE *cf = fopen(path_in("config.json"), "r");
    char cfg[2048] = {0};
    CHECK(cf != NULL && fread(cfg, 1, sizeof cfg - 1, cf) > 0);
    if (cf != NULL)
        fclose(cf);
    CHECK_CONTAINS(cfg, "\"model_type\":\t\"gpt2\"");
    CHECK_CONTAINS(cfg, "\"n_head\":\t2");
    CHECK_CONTAINS(cfg, "\"vocab_size\":\t24");
    CHECK_CONTAINS(cfg, "\"n_positions\":\t8");
    CHECK_CONTAINS(cfg, "\"activation_function\":\t\"gelu_new\"");
    free(p);
    free(q);
    teardown();
}

/* mgpu_weights_check of path against spec fails with MGPU_E_CONFIG naming want. */
static void misfit(const char *path, const mgpu_gpt_spec_t *spec, const char *want)
{
    mgpu_err_t err = {0};
    CHECK_INT(mgpu_weights_check(path, spec, &err), MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, want);
}

static void test_hf_padding_crop_and_misfits(void)
{
    setup();
    size_t n, n2;
    float *p = random_params(&tiny, &n);
    mgpu_err_t err = {0};
    const char *f = path_in("model.safetensors");
    CHECK(mgpu_weights_export(f, &tiny, p, n, &err) == 0);
    /* a padded vocabulary and a shorter context */
    mgpu_gpt_spec_t big = tiny;
    big.vocab = 32;
    big.context = 5;
    mgpu_weights_tensor_t t[64];
    mgpu_weights_layout(&big, t, &n2);
    float *q = malloc(sizeof(float) * n2);
    char what[512];
    CHECK(mgpu_weights_load(f, &big, q, n2, what, sizeof what, &err) == 0);
    CHECK_CONTAINS(what, "wte 24 of the cfg's 32 rows (the rest zero), wpe 5 of 8 positions");
    const size_t C = (size_t)tiny.n_embd;
    CHECK(memcmp(q, p, sizeof(float) * 24 * C) == 0);
    for (size_t i = 24 * C; i < 32 * C; i++)
        CHECK(q[i] == 0.0f);
    CHECK(memcmp(q + t[1].off, p + 24 * C, sizeof(float) * 5 * C) == 0);
    CHECK(memcmp(q + t[2].off, p + 24 * C + 8 * C, sizeof(float) * (n2 - t[2].off)) == 0);
    free(q);
    mgpu_gpt_spec_t s = tiny;
    s.vocab = 16;
    misfit(f, &s,
           "tensor 'transformer.wte.weight' has shape [24, 16], expected [at most vocab "
           "= 16, n_embd = 16]");
    s = tiny;
    s.context = 9;
    misfit(f, &s,
           "tensor 'transformer.wpe.weight' has shape [8, 16], expected [at least "
           "context = 9");
    s = tiny;
    s.n_layer = 3;
    misfit(f, &s, "no tensor 'transformer.h.2.ln_1.weight' (the cfg's GPT-2 has n_layer = 3)");
    s.n_layer = 1;
    misfit(f, &s, "unexpected tensor 'transformer.h.1.");
    s = tiny;
    s.n_head = 4;
    misfit(f, &s, "config.json: n_head 2, the cfg has n_head = 4");
    const char *by_layer = "{\"n_head\": 2, \"scale_attn_by_inverse_layer_idx\": true}";
    put(path_in("config.json"), by_layer, strlen(by_layer));
    misfit(f, &tiny, "config.json: scale_attn_by_inverse_layer_idx true or scale_attn_weights");
    const char *relu = "{\"n_head\": 2, \"activation_function\": \"relu\"}";
    put(path_in("config.json"), relu, strlen(relu));
    misfit(f, &tiny, "config.json: activation_function 'relu', expected gelu_new");
    CHECK(remove(path_in("config.json")) == 0);
    CHECK(mgpu_weights_check(f, &s, &err) == 0); /* without config.json, n_head is not told */
    /* a wider model's first tensor that differs is named with both shapes */
    mgpu_gpt_spec_t wide = tiny;
    wide.n_embd = 8;
    wide.n_head = 2;
    misfit(f, &wide,
           "tensor 'transformer.wte.weight' has shape [24, 16], expected [at most vocab "
           "= 24, n_embd = 8]");
    /* a Conv1D weight stored as nn.Linear's [out, in] is refused by name */
    mgpu_st_t *st = NULL;
    CHECK(mgpu_st_open(f, &st, &err) == 0);
    mgpu_st_out_t *o = calloc((size_t)st->n, sizeof *o);
    float *buf = malloc(sizeof(float) * n);
    size_t at = 0;
    for (int i = 0; i < st->n; i++) {
        const mgpu_st_tensor_t *x = &st->tensors[i];
        o[i] = (mgpu_st_out_t){
            .name = x->name, .dtype = MGPU_ST_F32, .ndim = x->ndim, .data = buf + at};
        memcpy(o[i].shape, x->shape, sizeof x->shape);
        if (strcmp(x->name, "transformer.h.0.mlp.c_fc.weight") == 0)
            o[i].shape[0] = x->shape[1], o[i].shape[1] = x->shape[0];
        CHECK(mgpu_st_read_f32(st, x, buf + at, &err) == 0);
        at += mgpu_st_numel(x);
    }
    CHECK(mgpu_st_write(path_in("t.safetensors"), o, st->n, NULL, 0, 0, &err) == 0);
    misfit(path_in("t.safetensors"), &tiny,
           "tensor 'transformer.h.0.mlp.c_fc.weight' has shape [64, 16], expected [16, 64] "
           "(n_embd = 16; Conv1D's [in, out])");
    /* GPT-2's own files: no "transformer." prefix, mask buffers, an lm_head equal to wte */
    mgpu_st_out_t *o2 = calloc((size_t)st->n + 2, sizeof *o2);
    float mask[64] = {0};
    for (int i = 0; i < st->n; i++) {
        o2[i] = o[i];
        o2[i].name = o[i].name + strlen("transformer.");
        if (strcmp(o2[i].name, "h.0.mlp.c_fc.weight") == 0)
            o2[i].shape[0] = o[i].shape[1], o2[i].shape[1] = o[i].shape[0];
    }
    o2[st->n] = (mgpu_st_out_t){.name = "h.0.attn.bias",
                                .dtype = MGPU_ST_F32,
                                .ndim = 4,
                                .shape = {1, 1, 8, 8},
                                .data = mask};
    o2[st->n + 1] = (mgpu_st_out_t){.name = "lm_head.weight",
                                    .dtype = MGPU_ST_F32,
                                    .ndim = 2,
                                    .shape = {24, 16},
                                    .data = buf}; /* wte comes first */
    CHECK(mgpu_st_write(path_in("g.safetensors"), o2, st->n + 2, NULL, 0, 0, &err) == 0);
    q = malloc(sizeof(float) * n);
    CHECK(mgpu_weights_load(path_in("g.safetensors"), &tiny, q, n, NULL, 0, &err) == 0);
    CHECK(memcmp(p, q, sizeof(float) * n) == 0);
    mask[0] = 1; /* an lm_head that is not wte */
    o2[st->n + 1].data = mask;
    o2[st->n + 1].shape[0] = 4;
    CHECK(mgpu_st_write(path_in("g.safetensors"), o2, st->n + 2, NULL, 0, 0, &err) == 0);
    misfit(path_in("g.safetensors"), &tiny,
           "tensor 'lm_head.weight' has shape [4, 16], expected wte's [24, 16]");
    o2[st->n].name = "h.0.attn.extra";
    CHECK(mgpu_st_write(path_in("g.safetensors"), o2, st->n + 2, NULL, 0, 0, &err) == 0);
    misfit(path_in("g.safetensors"), &tiny, "unexpected tensor 'h.0.attn.extra'");
    mgpu_st_close(st);
    free(o);
    free(o2);
    free(buf);
    free(q);
    free(p);
    teardown();
}

/* Every truncation of an export is refused, and every byte of its header changed is refused or
 * (inside the metadata's strings, which the loader does not read) loaded, never read out of
 * bounds: ASan watches. */
static void test_truncated_and_garbled_files_are_refused(void)
{
    setup();
    size_t n, size;
    float *p = random_params(&tiny, &n), *q = malloc(sizeof(float) * n);
    mgpu_err_t err = {0};
    const char *f = path_in("model.safetensors"), *g = path_in("g.safetensors");
    CHECK(mgpu_weights_export(f, &tiny, p, n, &err) == 0);
    FILE *in = fopen(f, "rb");
    unsigned char *b = malloc(1 << 20);
    size = in != NULL ? fread(b, 1, 1 << 20, in) : 0;
    if (in != NULL)
        fclose(in);
    CHECK(size > 1000 && size < (1 << 20));
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | b[i];
    int refused_n = 0, tried = 0;
    for (size_t cut = 0; cut < size; cut += cut < 8 + hlen + 64 ? 1 : 997) {
        put(g, b, cut);
        tried++;
        refused_n += mgpu_weights_check(g, &tiny, &err) == MGPU_E_CONFIG;
    }
    CHECK_INT(refused_n, tried);
    int loaded = 0;
    for (size_t i = 0; i < 8 + hlen; i++) {
        unsigned char was = b[i];
        b[i] = was == '"' ? '}' : was == '}' ? '"' : i % 2 ? '"' : 0x7f; /* never itself */
        put(g, b, size);
        int rc = mgpu_weights_load(g, &tiny, q, n, NULL, 0, &err);
        CHECK(rc == 0 || rc == MGPU_E_CONFIG);
        loaded += rc == 0;
        b[i] = was;
    }
    printf("  %d truncations refused; %zu header bytes changed, %d of them still loaded\n", tried,
           (size_t)(8 + hlen), loaded);
    free(b);
    free(p);
    free(q);
    teardown();
}

/* llm.c's file of spec's params: header, then its order (each kind across the layers). */
static void put_llmc(const char *path, const mgpu_gpt_spec_t *spec, const float *p, int version,
                     int maxT, int Vp, size_t trim)
{
    mgpu_weights_tensor_t t[64];
    size_t n;
    mgpu_weights_layout(spec, t, &n);
    int32_t h[256] = {20240326,      version,      maxT,         spec->vocab,
                      spec->n_layer, spec->n_head, spec->n_embd, Vp};
    const size_t C = (size_t)spec->n_embd, es = version == 3 ? 4 : 2;
    size_t total = (size_t)Vp * C + (size_t)maxT * C + n - t[2].off, at = 0;
    unsigned char *b = calloc(1, 1024 + total * es);
    float *f = calloc(total, sizeof(float));
    memcpy(f, p, sizeof(float) * spec->vocab * C); /* padded rows stay zero */
    at = (size_t)Vp * C;
    memcpy(f + at, p + t[1].off, sizeof(float) * spec->context * C); /* later rows zero */
    at += (size_t)maxT * C;
    for (int k = 0; k < MGPU_W_PER_LAYER; k++)
        for (int l = 0; l < spec->n_layer; l++) {
            const mgpu_weights_tensor_t *w = &t[2 + l * MGPU_W_PER_LAYER + k];
            size_t e = (size_t)w->rows * (size_t)(w->cols > 0 ? w->cols : 1);
            memcpy(f + at, p + w->off, sizeof(float) * e);
            at += e;
        }
    memcpy(f + at, p + n - 2 * C, sizeof(float) * 2 * C);
    memcpy(b, h, sizeof h);
    for (size_t i = 0; i < total; i++) {
        if (es == 4) {
            memcpy(b + 1024 + 4 * i, &f[i], 4);
        } else {
            uint16_t v = mgpu_dtype_f32_to_bf16(f[i]);
            memcpy(b + 1024 + 2 * i, &v, 2);
        }
    }
    put(path, b, 1024 + total * es - trim);
    free(f);
    free(b);
}

static void test_llmc_checkpoint(void)
{
    setup();
    size_t n;
    float *p = random_params(&tiny, &n), *q = malloc(sizeof(float) * n);
    mgpu_err_t err = {0};
    char what[512];
    const char *f = path_in("gpt2.bin");
    put_llmc(f, &tiny, p, 3, 10, 32, 0);
    CHECK(mgpu_weights_load(f, &tiny, q, n, what, sizeof what, &err) == 0);
    CHECK(memcmp(p, q, sizeof(float) * n) == 0);
    CHECK_CONTAINS(what, "llm.c checkpoint, fp32; wte 24 of the cfg's 24 rows (padded vocab 32), "
                         "wpe 8 of 10 positions");
    put_llmc(f, &tiny, p, 5, 8, 24, 0);
    CHECK(mgpu_weights_load(f, &tiny, q, n, what, sizeof what, &err) == 0);
    float worst = 0;
    for (size_t i = 0; i < n; i++)
        worst = fmaxf(worst, fabsf(q[i] - mgpu_dtype_bf16_to_f32(mgpu_dtype_f32_to_bf16(p[i]))));
    CHECK(worst == 0.0f);
    CHECK_CONTAINS(what, "llm.c checkpoint, bf16");
    put_llmc(f, &tiny, p, 3, 8, 24, 4);
    misfit(f, &tiny,
           "gpt2.bin: 29436 bytes, expected 29440 (a 1024-byte header and 7104 fp32 "
           "parameters): truncated");
    put_llmc(f, &tiny, p, 4, 8, 24, 0);
    misfit(f, &tiny, "llm.c checkpoint version 4, expected 3 (fp32) or 5 (bf16)");
    put_llmc(f, &tiny, p, 3, 8, 24, 0);
    mgpu_gpt_spec_t s = tiny;
    s.context = 9;
    misfit(f, &s, "tensor wpe has 8 positions (max_seq_len), fewer than the cfg's context = 9");
    s = tiny;
    s.n_head = 4;
    misfit(f, &s, "2 layers, 2 heads, 16 channels; the cfg has n_layer = 2, n_head = 4");
    s = tiny;
    s.vocab = 20;
    misfit(f, &s, "tensor wte holds a vocabulary of 24, more than the cfg's vocab = 20");
    put(f, "neither a safetensors file nor llm.c's", 38);
    misfit(f, &tiny, "(expected a safetensors file or llm.c's weights, magic 20240326)");
    free(p);
    free(q);
    teardown();
}

int main(void)
{
    RUN(test_layout_matches_the_model);
    RUN(test_safetensors_round_trip);
    RUN(test_safetensors_damage_is_named);
    RUN(test_export_then_load);
    RUN(test_hf_padding_crop_and_misfits);
    RUN(test_llmc_checkpoint);
    RUN(test_truncated_and_garbled_files_are_refused);
    return check_done();
}
