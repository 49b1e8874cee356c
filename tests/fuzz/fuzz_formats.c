/* fuzz_formats.c - libFuzzer target for the readers of files a user hands mgpu-worker: Hugging
 * Face's model.safetensors (worker/trainer/safetensors.c), a tokenizer.json of a byte-level BPE
 * (bpe.c), llm.c's token shards (shards.c), NumPy arrays (data.c), train.cfg itself (cfg.c)
 * and a GPT's weights to start from (weights.c: safetensors or llm.c's checkpoint).
 * Each may come from anywhere, so none may crash, read outside its file or leak on any input:
 * it is read whole, or refused with a message.
 *
 * Input layout: byte 0 picks the reader (0 safetensors, 1 tokenizer, 2 shard, 3 .npy as
 * float32, 4 .npy as int32, 5 train.cfg, 6 weights for a GPT of 2 layers, 2 heads, width 8,
 * context 8 and 64 tokens; the rest modulo 7), the other bytes are the file,
 * written to a temporary file that the reader opens by path (as it opens the user's; the cfg
 * parser is given the text). What it reads is then used: every tensor converted to floats and
 * found by its name, a text encoded and its ids decoded, every window of the shard read.
 *
 *   tests/fuzz/run.sh 20    builds it with clang -fsanitize=fuzzer,address,undefined and runs */
#include <stdint.h> /* uint8_t */
#include <stdio.h>  /* snprintf */
#include <stdlib.h> /* mkstemp, malloc */
#include <string.h> /* memcpy */
#include <unistd.h> /* pwrite, ftruncate */

#include "bpe.h"
#include "cfg.h"
#include "data.h"
#include "safetensors.h"
#include "shards.h"
#include "weights.h"

static char path[64];
static int fd = -1;

static void put_file(const uint8_t *p, size_t n)
{
    if (fd < 0) {
        const char *dir = getenv("TMPDIR");
        snprintf(path, sizeof path, "%s/mgpu-fuzz-XXXXXX", dir && *dir ? dir : "/tmp");
        if ((fd = mkstemp(path)) < 0)
            abort();
    }
    if (ftruncate(fd, 0) != 0 || (n > 0 && pwrite(fd, p, n, 0) != (ssize_t)n))
        abort();
}

static void safetensors(void)
{
    mgpu_st_t *st = NULL;
    mgpu_err_t err = {0};
    if (mgpu_st_open(path, &st, &err) < 0)
        return;
    for (int i = 0; i < st->n; i++) {
        const mgpu_st_tensor_t *t = &st->tensors[i];
        size_t numel = mgpu_st_numel(t);
        float *dst = malloc((numel ? numel : 1) * sizeof *dst);
        if (dst != NULL)
            mgpu_st_read_f32(st, t, dst, &err);
        free(dst);
        if (mgpu_st_find(st, t->name) == NULL)
            abort(); /* a tensor of the header must be found by its name */
    }
    mgpu_st_meta(st, "format");
    mgpu_st_close(st);
}

static void tokenizer(void)
{
    static const char text[] = "Hello, world! It's 2026: naïve café, \xf0\x9f\x98\x80 ok\n\n  x";
    mgpu_bpe_t *t = NULL;
    mgpu_err_t err = {0};
    int32_t *ids = NULL;
    size_t n = 0, len = 0;
    char *back = NULL;

    if (mgpu_bpe_load(path, &t, &err) < 0)
        return;
    /* Not checked to give the text back: a vocabulary may give two tokens one id, which
     * Hugging Face's tokenizers load too. */
    if (mgpu_bpe_encode(t, text, sizeof text - 1, &ids, &n, &err) == 0)
        mgpu_bpe_decode(t, ids, n, &back, &len, &err);
    free(ids);
    free(back);
    const int32_t probe[] = {
        0, 1, 255, 256, 50256, mgpu_bpe_vocab_size(t) - 1, mgpu_bpe_vocab_size(t), -1};
    for (size_t i = 0; i < sizeof probe / sizeof probe[0]; i++) {
        back = NULL;
        mgpu_bpe_has_id(t, probe[i]);
        mgpu_bpe_decode(t, &probe[i], 1, &back, &len, &err);
        free(back);
    }
    mgpu_bpe_free(t);
}

static void shard(void)
{
    mgpu_shards_t s = {0};
    mgpu_windows_t train = {0}, eval = {0};
    mgpu_err_t err = {0};
    int32_t tok[9], tgt[9];

    if (mgpu_shards_open(&s, path, "data_tokens", 0, 50304, &err) == 0 &&
        mgpu_windows_split(&s, 8, 0.25, &train, &eval, &err) == 0) {
        for (size_t w = 0; w < train.n_windows && w < 4096; w++)
            mgpu_windows_read(&train, w, tok, tgt, &err);
        for (size_t w = 0; w < eval.n_windows && w < 4096; w++)
            mgpu_windows_read(&eval, w, tok, NULL, &err);
    }
    mgpu_windows_free(&train);
    mgpu_windows_free(&eval);
    mgpu_shards_close(&s);
}

static void npy(int ints)
{
    mgpu_npy_t a = {0};
    mgpu_err_t err = {0};
    if ((ints ? mgpu_npy_read_i32(path, &a, &err) : mgpu_npy_read_f32(path, &a, &err)) == 0 &&
        a.count > 0)
        (void)(ints ? a.i32[a.count - 1] : a.f32[a.count - 1]); /* read where it says it ends */
    mgpu_npy_free(&a);
}

static void cfg(const uint8_t *p, size_t n)
{
    static mgpu_cfg_t c; /* large: not on the stack */
    mgpu_err_t err = {0};
    char *text = malloc(n + 1);
    if (text == NULL)
        return;
    memcpy(text, p, n);
    text[n] = 0;
    mgpu_cfg_defaults(&c);
    mgpu_cfg_parse(text, "train.cfg", "/nonexistent", &c, &err);
    free(text);
}

static void weights(void)
{
    const mgpu_gpt_spec_t spec = {
        .n_layer = 2, .n_head = 2, .n_embd = 8, .context = 8, .vocab = 64};
    mgpu_err_t err = {0};
    size_t n = 0;
    char what[256];
    mgpu_weights_tensor_t *t = calloc((size_t)mgpu_weights_count(&spec), sizeof *t);
    if (t == NULL)
        return;
    mgpu_weights_layout(&spec, t, &n);
    free(t);
    float *params = malloc(n * sizeof *params);
    if (params != NULL && mgpu_weights_check(path, &spec, &err) == 0)
        mgpu_weights_load(path, &spec, params, n, what, sizeof what, &err);
    free(params);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    put_file(data + 1, size - 1);
    switch (data[0] % 7) {
    case 0:
        safetensors();
        break;
    case 1:
        tokenizer();
        break;
    case 2:
        shard();
        break;
    case 3:
    case 4:
        npy(data[0] % 7 == 4);
        break;
    case 5:
        cfg(data + 1, size - 1);
        break;
    default:
        weights();
        break;
    }
    return 0;
}
