/* test_gpt_beside.c - the bf16 GPT's backward (worker/trainer/model_gpt.c, backward16) with its
 * weight gradients free to run beside the chain of input gradients (gpt_ops.h:
 * linear_back_weight_beside, join), on the CPU over stand-in ops that record what memory each
 * op reads and writes. A weight gradient queued beside is pending until the next join: any op
 * after it that writes what it reads, or reads or writes what it writes, is a hazard (on a GPU
 * the two would race), and so is a hook (DDP's bucket launch) called, or a backward returning,
 * while one is pending. Every layout is covered: recompute 0, 1 and 2 (outputs made again into
 * buffers that later layers share), activations inside the gradients of the block below
 * (reuse_grads) or in buffers of their own, the MLP's bias inside its product or in the
 * epilogue, with and without a hook. A join that does nothing must show hazards: the check
 * itself is checked. */
#include "check.h"
#include "model_gpt.h"

#include <stdint.h> /* uintptr_t */
#include <stdlib.h> /* setenv, unsetenv */
#include <string.h> /* memset */

#define MAX_PENDING 64

/* A range of memory [lo, hi). */
typedef struct span {
    uintptr_t lo, hi;
} span_t;

static struct {
    span_t rd[MAX_PENDING], wr[MAX_PENDING]; /* of the weight gradients queued beside */
    int n_rd, n_wr;
    int queued;     /* weight gradients queued beside, in all */
    int hazards;    /* accesses that would race with a pending one */
    int lazy_join;  /* the control: join leaves them pending */
    const char *op; /* the first hazard's op, for the message */
} hz;

static int overlaps(const span_t *s, int n, uintptr_t lo, uintptr_t hi)
{
    for (int i = 0; i < n; i++)
        if (lo < s[i].hi && s[i].lo < hi)
            return 1;
    return 0;
}

/* An op on the main stream reads (write 0) or writes [p, p + bytes). */
static void touch(const char *op, const void *p, size_t bytes, int write)
{
    if (p == NULL || bytes == 0)
        return;
    const uintptr_t lo = (uintptr_t)p, hi = lo + bytes;
    if (overlaps(hz.wr, hz.n_wr, lo, hi) || (write && overlaps(hz.rd, hz.n_rd, lo, hi))) {
        if (hz.hazards++ == 0)
            hz.op = op;
    }
}

static void pend(span_t *s, int *n, const void *p, size_t bytes)
{
    if (p != NULL && *n < MAX_PENDING)
        s[(*n)++] = (span_t){(uintptr_t)p, (uintptr_t)p + bytes};
}

#define R(p, bytes) touch(__func__, p, bytes, 0)
#define W(p, bytes) touch(__func__, p, bytes, 1)
#define H sizeof(mgpu_bf16_t)
#define F sizeof(float)

static int s_to_bf16(void *impl, size_t n, const float *x, mgpu_bf16_t *y, mgpu_err_t *err)
{
    R(x, F * n);
    W(y, H * n);
    return 0;
}

static int s_to_bf16_2d(void *impl, int rows, int cols, const float *x, size_t ldx, mgpu_bf16_t *y,
                        size_t ldy, mgpu_err_t *err)
{
    R(x, F * ((size_t)(rows - 1) * ldx + cols));
    W(y, H * ((size_t)(rows - 1) * ldy + cols));
    return 0;
}

static int s_ln_fwd(void *impl, int n, int c, const float *x, const float *w, const float *b,
                    mgpu_bf16_t *y, size_t ldy, float *mean, float *rstd, mgpu_err_t *err)
{
    R(x, F * n * c);
    W(y, H * ((size_t)(n - 1) * ldy + c));
    W(mean, F * n);
    W(rstd, F * n);
    return 0;
}

static int s_ln_back(void *impl, int n, int c, const mgpu_bf16_t *dy, const float *x,
                     const float *w, const float *b, const float *mean, const float *rstd,
                     float *dx, mgpu_bf16_t *dx16, float *dw, float *db, float *dsum,
                     mgpu_bf16_t *y, size_t ldy, int fresh, mgpu_err_t *err)
{
    R(dy, H * n * c);
    R(x, F * n * c);
    R(w, F * c);
    R(b, F * c);
    R(mean, F * n);
    R(rstd, F * n);
    W(dx, F * n * c);
    W(dx16, H * n * c);
    W(dw, F * c);
    W(db, F * c);
    W(dsum, F * c);
    W(y, H * ((size_t)(n - 1) * ldy + c));
    return 0;
}

static int s_linear(void *impl, int n, int c, int oc, const mgpu_bf16_t *inp, const mgpu_bf16_t *w,
                    const mgpu_bf16_t *bias, mgpu_bf16_t *out, mgpu_bf16_t *pre, mgpu_err_t *err)
{
    R(inp, H * n * c);
    W(out, H * n * oc);
    W(pre, H * n * oc);
    return 0;
}

static int s_linear_f32(void *impl, int n, int c, int oc, const mgpu_bf16_t *inp,
                        const mgpu_bf16_t *w, const float *bias, const float *res, float *out,
                        mgpu_err_t *err)
{
    R(inp, H * n * c);
    R(res, F * n * oc);
    W(out, F * n * oc);
    return 0;
}

static int s_back_data(void *impl, int n, int c, int oc, const mgpu_bf16_t *dout,
                       const mgpu_bf16_t *w, size_t ldw, const mgpu_bf16_t *pre, mgpu_bf16_t *din,
                       mgpu_err_t *err)
{
    R(dout, H * n * oc);
    R(w, H * ((size_t)(oc - 1) * ldw + c));
    R(pre, H * n * c);
    W(din, H * n * c);
    return 0;
}

static int s_back_weight(void *impl, int n, int c, int oc, const mgpu_bf16_t *dout,
                         const mgpu_bf16_t *inp, size_t ldi, float *dw, float *dbias, int fresh,
                         mgpu_err_t *err)
{
    R(dout, H * n * oc);
    R(inp, H * ((size_t)(n - 1) * ldi + c));
    W(dw, F * oc * c);
    W(dbias, F * oc);
    return 0;
}

/* Ordered after every op called before it (a fork), then pending: what it reads and writes. */
static int s_back_weight_beside(void *impl, int n, int c, int oc, const mgpu_bf16_t *dout,
                                const mgpu_bf16_t *inp, size_t ldi, float *dw, float *dbias,
                                int fresh, mgpu_err_t *err)
{
    pend(hz.rd, &hz.n_rd, dout, H * n * oc);
    pend(hz.rd, &hz.n_rd, inp, H * ((size_t)(n - 1) * ldi + c));
    pend(hz.wr, &hz.n_wr, dw, F * oc * c);
    pend(hz.wr, &hz.n_wr, dbias, F * oc);
    hz.queued++;
    return 0;
}

static int s_join(void *impl, mgpu_err_t *err)
{
    if (!hz.lazy_join)
        hz.n_rd = hz.n_wr = 0;
    return 0;
}

static int s_attn_fwd(void *impl, int b, int t, int c, int nh, const mgpu_bf16_t *qkv,
                      mgpu_bf16_t *out, float *lse, mgpu_err_t *err)
{
    R(qkv, H * b * t * 3 * c);
    W(out, H * b * t * c);
    W(lse, F * b * nh * t);
    return 0;
}

static int s_attn_back(void *impl, int b, int t, int c, int nh, const mgpu_bf16_t *dout,
                       const mgpu_bf16_t *qkv, const mgpu_bf16_t *out, const float *lse,
                       mgpu_bf16_t *dqkv, mgpu_err_t *err)
{
    R(dout, H * b * t * c);
    R(qkv, H * b * t * 3 * c);
    R(out, H * b * t * c);
    R(lse, F * b * nh * t);
    W(dqkv, H * b * t * 3 * c);
    return 0;
}

static int s_xent(void *impl, int rows, int vocab, mgpu_bf16_t *logits, const int32_t *targets,
                  float scale, int grad, float *loss, mgpu_err_t *err)
{
    W(logits, H * rows * vocab);
    loss[0] += 1.0f;
    return 0;
}

static int s_gelu(void *impl, size_t n, const mgpu_bf16_t *pre, mgpu_bf16_t *out, mgpu_err_t *err)
{
    R(pre, H * n);
    W(out, H * n);
    return 0;
}

static const mgpu_gpt_bf16_ops_t beside16 = {
    .to_bf16 = s_to_bf16,
    .to_bf16_2d = s_to_bf16_2d,
    .layernorm_forward = s_ln_fwd,
    .layernorm_backward = s_ln_back,
    .linear = s_linear,
    .linear_f32 = s_linear_f32,
    .linear_back_data = s_back_data,
    .linear_back_weight = s_back_weight,
    .attention_forward = s_attn_fwd,
    .attention_backward = s_attn_back,
    .xent = s_xent,
    .gelu = s_gelu,
    .linear_back_weight_beside = s_back_weight_beside,
    .join = s_join,
};

/* DDP's hook reads the gradients it is called for: none may still be pending. */
static int hook(void *ctx, int layer, mgpu_err_t *err)
{
    (*(int *)ctx)++;
    if (hz.n_wr > 0 && hz.hazards++ == 0)
        hz.op = "the hook";
    return 0;
}

/* One backward of the model spec s over a batch of 2 x 16 tokens through beside16: the
 * hazards seen, and how many weight gradients were queued beside (*queued). */
static int hazards_of(const mgpu_gpt_spec_t *s, int hooked, int lazy, int *queued)
{
    mgpu_kernels_t *k = NULL;
    mgpu_err_t err = {0};
    mgpu_gpt_t *m = NULL;
    const int b = 2, t = 16;
    int32_t tok[32], tgt[32];
    for (int i = 0; i < b * t; i++)
        tok[i] = (i * 7) % s->vocab, tgt[i] = (i * 7 + 1) % s->vocab;
    memset(&hz, 0, sizeof hz);
    hz.lazy_join = lazy;
    int calls = 0;
    CHECK_INT(mgpu_kernels_create(MGPU_KBACKEND_CPU, -1, &k, &err), 0);
    if (k != NULL)
        CHECK_INT(mgpu_gpt_create_with(k, s, b, &beside16, &m, &err), 0);
    if (m != NULL) {
        CHECK_INT(mgpu_gpt_init(m, 5, &err), 0);
        CHECK_INT(mgpu_gpt_load(m, tok, tgt, b, t, &err), 0);
        CHECK_INT(mgpu_gpt_zero_grads(m, &err), 0);
        CHECK_INT(mgpu_gpt_loss_hooked(m, 1.0f / (b * t), 1, hooked ? hook : NULL, &calls, &err),
                  0);
        if (hooked)
            CHECK_INT(calls, s->n_layer + 2);
    }
    /* the backward returned: nothing may be left pending */
    if (hz.n_wr > 0 && hz.hazards++ == 0)
        hz.op = "the backward's end";
    if (hz.hazards > 0 && !lazy)
        printf("  recompute %d, reuse_grads %d, hook %d: %d hazards, the first at %s\n",
               s->recompute, s->reuse_grads, hooked, hz.hazards, hz.op);
    mgpu_gpt_destroy(m);
    mgpu_kernels_destroy(k);
    *queued = hz.queued;
    return hz.hazards;
}

static void test_joins_before_every_overwrite(void)
{
    int runs = 0;
    for (int re = 0; re < 3; re++)
        for (int reuse = 0; reuse < 2; reuse++)
            for (int fc = 0; fc < 2; fc++)
                for (int hooked = 0; hooked < 2; hooked++) {
                    const mgpu_gpt_spec_t s = {.n_layer = 3,
                                               .n_head = 2,
                                               .n_embd = 32,
                                               .context = 16,
                                               .vocab = 1024,
                                               .recompute = re,
                                               .reuse_grads = reuse};
                    if (fc)
                        setenv("MGPU_GPT_FC_BIAS", "epilogue", 1);
                    else
                        unsetenv("MGPU_GPT_FC_BIAS");
                    int queued = 0;
                    CHECK_INT(hazards_of(&s, hooked, 0, &queued), 0);
                    CHECK_INT(queued, 4 * s.n_layer);
                    runs++;
                }
    unsetenv("MGPU_GPT_FC_BIAS");
    CHECK_INT(runs, 24);
}

/* The control: with joins that leave the weight gradients pending, the next LayerNorm
 * backward overwrites dres16, which the first two read. */
static void test_missing_joins_are_seen(void)
{
    const mgpu_gpt_spec_t s = {
        .n_layer = 2, .n_head = 2, .n_embd = 32, .context = 16, .vocab = 1024};
    int queued = 0;
    const int n = hazards_of(&s, 0, 1, &queued);
    printf("  joins that do nothing: %d hazards\n", n);
    CHECK(n > 0);
    CHECK_INT(queued, 4 * s.n_layer);
}

int main(void)
{
    RUN(test_joins_before_every_overwrite);
    RUN(test_missing_joins_are_seen);
    return check_done();
}
