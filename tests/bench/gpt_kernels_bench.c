/* gpt_kernels_bench.c - what the CUDA table of a GPT's ops (kernels/gpt_cuda.h) achieves on
 * this GPU at these model shapes: GPT-2 124M (batch 16, context 1024, width 768, 12 heads,
 * vocabulary 50304) and a small byte-level model (batch 64, context 256, width 384, 6 heads,
 * vocabulary 256), GPT-2 124M at context 2048 (batch 8), and heads of 128 (batch 8, context
 * 1024, width 1536, 12 heads, vocabulary 50304). One row an op: the time a call (median of
 * CUDA-event intervals between back-to-back calls after a warm-up, the fastest beside it), and what
 * it achieves: GB/s of the bytes the op must move at least (each input read once, each output
 * written once) for the memory-bound ops, TFLOP/s for attention (causal: half the score matrix,
 * forward 4 b nh t^2 hs / 2 FLOPs, backward 2.5 times that) and the output layer (its products).
 * Beside attention, PyTorch's F.scaled_dot_product_attention (causal) on the same shape,
 * measured in the same run by tests/bench/gpt_sdpa_bench.py when python3 with a CUDA build of
 * torch is there (MGPU_PYTHON names another interpreter), fp32 and bf16 beside ours in the
 * same precisions (the bf16 attention is gpt_attention_tc.cu's, on tensor cores; its time
 * includes the conversion of its fp32 operands to bf16, which PyTorch's, given bf16 tensors,
 * does not need). The bf16 path's attention (the table's bf16 ops: bf16 qkv, out, dout and
 * dqkv, as PyTorch's) follows as "attention16" rows, in prec bf16.
 *
 * Usage: build/tests/gpt_kernels_bench [gpt2|gpt2-2k|byte|h128|all] (default all), from the
 * repository's root (the helper script's path is relative to it; MGPU_SDPA_SCRIPT names another).
 * Exit status: 0 measured, 1 a CUDA or op failure (the message names it), 2 bad usage, 77 no
 * GPU or a build without CUDA. tests/unit/test_gpt_cuda.c checks that the same ops are
 * right; this program only times them. */
#include "kernels.h"

#include <stdio.h>  /* printf, popen */
#include <stdlib.h> /* malloc, qsort, getenv */
#include <string.h> /* strcmp */

#if !(defined(MGPU_HAVE_CUDA) && MGPU_HAVE_CUDA)
int main(void)
{
    fprintf(stderr, "gpt_kernels_bench: built without CUDA (CUDA=0 or no nvcc): nothing to "
                    "measure\n");
    return 77;
}
#else

#include "gpt_cuda.h"     /* mgpu_gpt_cuda_ops */
#include "transformer.h"  /* mgpu_gpt_to_bf16 */
#include "kernels_cuda.h" /* mgpu_kernels_cuda_stream, _device_count */

#include <cuda_runtime_api.h> /* events, device properties */
#include <stdint.h>           /* int32_t */

#define ITERS 10

typedef struct shape {
    const char *name;
    int b, t, c, nh, vocab, layers;
} shape_t;

static const shape_t shapes[] = {
    {"gpt2", 16, 1024, 768, 12, 50304, 12},
    {"byte", 64, 256, 384, 6, 256, 6},
    {"gpt2-2k", 8, 2048, 768, 12, 50304, 12},
    {"h128", 8, 1024, 1536, 12, 50304, 12},
};

typedef struct bench {
    mgpu_kernels_t *k;
    void *impl;
    cudaStream_t stream;
    cudaEvent_t ev[ITERS + 1];
    mgpu_err_t err;
    const shape_t *s;
    /* device buffers, sized for the shape */
    float *x, *y, *w, *bias, *mean, *rstd, *dx, *dw, *db;
    float *qkv, *att, *lse, *dqkv, *h4, *dh4;
    float *wte, *wpe, *dwte, *dwpe, *logits, *scalar, *m, *v;
    int32_t *tokens;
    /* the bf16 attention's: qkv, out, dout, dqkv in bf16, its own lse */
    mgpu_bf16_t *qkv16, *att16, *dout16, *dqkv16;
    float *lse16;
} bench_t;

typedef int (*op_fn)(bench_t *b);

static int cmp_double(const void *pa, const void *pb)
{
    double a = *(const double *)pa, c = *(const double *)pb;
    return a < c ? -1 : a > c;
}

/* Median and fastest milliseconds of ITERS calls of fn, after two warm-up calls. */
static int time_op(bench_t *b, op_fn fn, double *med, double *best)
{
    double ms[ITERS];
    int rc;
    for (int i = 0; i < 2; i++)
        if ((rc = fn(b)) != 0)
            return rc;
    for (int i = 0; i < ITERS; i++) {
        if (cudaEventRecord(b->ev[i], b->stream) != cudaSuccess)
            return mgpu_err_set(&b->err, MGPU_E_CUDA, "cudaEventRecord failed");
        if ((rc = fn(b)) != 0)
            return rc;
    }
    cudaError_t ce = cudaEventRecord(b->ev[ITERS], b->stream);
    if (ce == cudaSuccess)
        ce = cudaEventSynchronize(b->ev[ITERS]);
    if (ce != cudaSuccess)
        return mgpu_err_set(&b->err, MGPU_E_CUDA, "cudaEventSynchronize: %s",
                            cudaGetErrorString(ce));
    for (int i = 0; i < ITERS; i++) {
        float f = 0.0f;
        cudaEventElapsedTime(&f, b->ev[i], b->ev[i + 1]);
        ms[i] = f;
    }
    qsort(ms, ITERS, sizeof *ms, cmp_double);
    *med = ms[ITERS / 2];
    *best = ms[0];
    return 0;
}

#define N_ROWS(b) ((b)->s->b * (b)->s->t)
#define OPS (&mgpu_gpt_cuda_ops)

static int op_ln_fwd(bench_t *b)
{
    return OPS->layernorm_forward(b->impl, N_ROWS(b), b->s->c, b->x, b->w, b->bias, b->y, b->mean,
                                  b->rstd, &b->err);
}
static int op_ln_bwd(bench_t *b)
{
    return OPS->layernorm_backward(b->impl, N_ROWS(b), b->s->c, b->y, b->x, b->w, b->mean, b->rstd,
                                   b->dx, b->dw, b->db, &b->err);
}
static int op_gelu_fwd(bench_t *b)
{
    return OPS->gelu_forward(b->impl, (size_t)N_ROWS(b) * 4 * b->s->c, b->h4, b->dh4, &b->err);
}
static int op_gelu_bwd(bench_t *b)
{
    return OPS->gelu_backward(b->impl, (size_t)N_ROWS(b) * 4 * b->s->c, b->h4, b->dh4, b->dh4,
                              &b->err);
}
static int op_add(bench_t *b)
{
    return OPS->add(b->impl, (size_t)N_ROWS(b) * b->s->c, b->x, b->y, b->dx, &b->err);
}
static int op_att_fwd(bench_t *b)
{
    return OPS->attention_forward(b->impl, b->s->b, b->s->t, b->s->c, b->s->nh, b->qkv, b->att,
                                  b->lse, &b->err);
}
static int op_att_bwd(bench_t *b)
{
    return OPS->attention_backward(b->impl, b->s->b, b->s->t, b->s->c, b->s->nh, b->y, b->qkv,
                                   b->att, b->lse, b->dqkv, &b->err);
}
static int op_att16_fwd(bench_t *b)
{
    return OPS->bf16->attention_forward(b->impl, b->s->b, b->s->t, b->s->c, b->s->nh, b->qkv16,
                                        b->att16, b->lse16, &b->err);
}
static int op_att16_bwd(bench_t *b)
{
    return OPS->bf16->attention_backward(b->impl, b->s->b, b->s->t, b->s->c, b->s->nh, b->dout16,
                                         b->qkv16, b->att16, b->lse16, b->dqkv16, &b->err);
}
static int op_embed_fwd(bench_t *b)
{
    return OPS->embed_forward(b->impl, b->s->b, b->s->t, b->s->c, b->tokens, b->wte, b->wpe, b->x,
                              &b->err);
}
static int op_embed_bwd(bench_t *b)
{
    return OPS->embed_backward(b->impl, b->s->b, b->s->t, b->s->c, b->s->vocab, b->tokens, b->dx,
                               b->dwte, b->dwpe, &b->err);
}
static int op_head(bench_t *b)
{
    return OPS->tied_head(b->impl, N_ROWS(b), b->s->c, b->s->vocab, b->x, b->wte, b->tokens,
                          1.0f / (float)N_ROWS(b), b->logits, b->scalar, b->dx, b->dwte, &b->err);
}
static int op_head_fwd(bench_t *b)
{
    return OPS->tied_head(b->impl, N_ROWS(b), b->s->c, b->s->vocab, b->x, b->wte, b->tokens,
                          1.0f / (float)N_ROWS(b), b->logits, b->scalar, NULL, NULL, &b->err);
}

/* The model's parameters (124M for the GPT-2 shape), updated as one tensor. */
static size_t n_params(const shape_t *s)
{
    size_t c = (size_t)s->c, layer = 12 * c * c + 13 * c;
    return (size_t)s->vocab * c + (size_t)s->t * c + (size_t)s->layers * layer + 2 * c;
}
static int op_sumsq(bench_t *b)
{
    return OPS->sumsq(b->impl, n_params(b->s), b->dwte, b->scalar, &b->err);
}
static int op_adamw(bench_t *b)
{
    static const mgpu_adamw_hparams_t hp = {6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f};
    return OPS->adamw(b->impl, n_params(b->s), b->wte, b->dwte, b->m, b->v, &hp, 10, NULL, &b->err);
}

/* PyTorch's SDPA on the shape: "fp32_fwd fp32_bwd bf16_fwd bf16_bwd" in ms into out, or "". */
static void torch_sdpa(const shape_t *s, char *out, size_t cap)
{
    const char *py = getenv("MGPU_PYTHON"), *script = getenv("MGPU_SDPA_SCRIPT");
    char cmd[512], line[256];
    out[0] = '\0';
    snprintf(cmd, sizeof cmd, "%s %s %d %d %d %d 2>/dev/null", py ? py : "python3",
             script ? script : "tests/bench/gpt_sdpa_bench.py", s->b, s->t, s->nh, s->c / s->nh);
    FILE *f = popen(cmd, "r");
    if (f == NULL)
        return;
    while (fgets(line, sizeof line, f) != NULL)
        if (strncmp(line, "sdpa ", 5) == 0) {
            snprintf(out, cap, "%s", line + 5);
            out[strcspn(out, "\n")] = '\0';
        }
    pclose(f);
}

#define BALLOC(b, p, n)                                                                            \
    do {                                                                                           \
        if (mgpu_k_alloc((b)->k, (size_t)(n) * sizeof(*(p)), (void **)&(p), &(b)->err) != 0)       \
            return -1;                                                                             \
    } while (0)

/* n floats of d uniform in [-a, a), written from the host once. */
static int fill(bench_t *b, float *d, size_t n, float a)
{
    const size_t chunk = 1u << 24;
    float *h = malloc(chunk * sizeof *h);
    unsigned long long st = 0x9e3779b97f4a7c15ULL ^ n;
    if (h == NULL)
        return mgpu_err_set(&b->err, MGPU_E_RANGE, "malloc(%zu floats) failed", chunk);
    for (size_t i = 0; i < n; i += chunk) {
        size_t m = n - i < chunk ? n - i : chunk;
        for (size_t j = 0; j < m; j++) {
            st = st * 6364136223846793005ULL + 1442695040888963407ULL;
            h[j] = ((float)((st >> 40) / (double)(1ULL << 24)) * 2.0f - 1.0f) * a;
        }
        if (mgpu_k_copy_to_device(b->k, d + i, h, m * sizeof *h, &b->err) != 0) {
            free(h);
            return -1;
        }
    }
    free(h);
    return 0;
}

/* n bf16 of d uniform in [-a, a), written from the host once. */
static int fill16(bench_t *b, mgpu_bf16_t *d, size_t n, float a)
{
    mgpu_bf16_t *h = malloc((n ? n : 1) * sizeof *h);
    unsigned long long st = 0x9e3779b97f4a7c15ULL ^ n;
    if (h == NULL)
        return mgpu_err_set(&b->err, MGPU_E_RANGE, "malloc(%zu bf16) failed", n);
    for (size_t j = 0; j < n; j++) {
        st = st * 6364136223846793005ULL + 1442695040888963407ULL;
        h[j] = mgpu_gpt_to_bf16(((float)((st >> 40) / (double)(1ULL << 24)) * 2.0f - 1.0f) * a);
    }
    int rc = mgpu_k_copy_to_device(b->k, d, h, n * sizeof *h, &b->err);
    free(h);
    return rc;
}

static int setup(bench_t *b, const shape_t *s)
{
    b->s = s;
    size_t n = (size_t)s->b * s->t, c = (size_t)s->c, nv = (size_t)s->vocab * c;
    size_t np = n_params(s) > nv ? n_params(s) : nv;
    BALLOC(b, b->x, n * c);
    BALLOC(b, b->y, n * c);
    BALLOC(b, b->dx, n * c);
    BALLOC(b, b->w, c);
    BALLOC(b, b->bias, c);
    BALLOC(b, b->dw, c);
    BALLOC(b, b->db, c);
    BALLOC(b, b->mean, n);
    BALLOC(b, b->rstd, n);
    BALLOC(b, b->qkv, n * 3 * c);
    BALLOC(b, b->dqkv, n * 3 * c);
    BALLOC(b, b->att, n * c);
    BALLOC(b, b->lse, n * s->nh);
    BALLOC(b, b->h4, n * 4 * c);
    BALLOC(b, b->dh4, n * 4 * c);
    BALLOC(b, b->wte, np);
    BALLOC(b, b->dwte, np);
    BALLOC(b, b->m, np);
    BALLOC(b, b->v, np);
    BALLOC(b, b->wpe, (size_t)s->t * c);
    BALLOC(b, b->dwpe, (size_t)s->t * c);
    BALLOC(b, b->logits, n * s->vocab);
    BALLOC(b, b->scalar, 1);
    BALLOC(b, b->tokens, n);
    BALLOC(b, b->qkv16, n * 3 * c);
    BALLOC(b, b->att16, n * c);
    BALLOC(b, b->dout16, n * c);
    BALLOC(b, b->dqkv16, n * 3 * c);
    BALLOC(b, b->lse16, n * s->nh);
    if (fill16(b, b->qkv16, n * 3 * c, 1.0f) != 0 || fill16(b, b->dout16, n * c, 1.0f) != 0)
        return -1;
    float *fs[] = {b->x, b->y, b->dx, b->w, b->bias, b->qkv, b->h4, b->wte, b->dwte, b->wpe};
    size_t ns[] = {n * c, n * c, n * c, c, c, n * 3 * c, n * 4 * c, np, np, (size_t)s->t * c};
    for (size_t i = 0; i < sizeof fs / sizeof *fs; i++)
        if (fill(b, fs[i], ns[i], 1.0f) != 0)
            return -1;
    if (mgpu_k_zero(b->k, b->m, np * sizeof(float), &b->err) != 0 ||
        mgpu_k_zero(b->k, b->v, np * sizeof(float), &b->err) != 0 ||
        mgpu_k_zero(b->k, b->scalar, sizeof(float), &b->err) != 0)
        return -1;
    int32_t *tok = malloc(n * sizeof *tok);
    if (tok == NULL)
        return mgpu_err_set(&b->err, MGPU_E_RANGE, "malloc(%zu tokens) failed", n);
    unsigned long long st = 12345;
    for (size_t i = 0; i < n; i++) {
        st = st * 6364136223846793005ULL + 1442695040888963407ULL;
        tok[i] = (int32_t)((st >> 33) % (unsigned long long)s->vocab);
    }
    int rc = mgpu_k_copy_to_device(b->k, b->tokens, tok, n * sizeof *tok, &b->err);
    free(tok);
    if (rc != 0)
        return rc;
    if (OPS->bf16 == NULL)
        return mgpu_err_set(&b->err, MGPU_E_USAGE, "the CUDA table has no bf16 path");
    /* the backwards' out and lse */
    return op_att_fwd(b) != 0 || op_att16_fwd(b) != 0 ? -1 : 0;
}

static void teardown(bench_t *b)
{
    void *ps[] = {b->x,     b->y,     b->dx,     b->w,      b->bias,   b->dw,
                  b->db,    b->mean,  b->rstd,   b->qkv,    b->dqkv,   b->att,
                  b->lse,   b->h4,    b->dh4,    b->wte,    b->dwte,   b->m,
                  b->v,     b->wpe,   b->dwpe,   b->logits, b->scalar, b->tokens,
                  b->qkv16, b->att16, b->dout16, b->dqkv16, b->lse16};
    for (size_t i = 0; i < sizeof ps / sizeof *ps; i++)
        mgpu_k_free(b->k, ps[i]);
}

typedef struct row {
    const char *name;
    op_fn fn;
    double bytes; /* the fewest it must move, or 0 */
    double flops; /* or 0 */
} row_t;

static int print_row(bench_t *b, const row_t *r, const char *prec)
{
    double med = 0, best = 0;
    if (time_op(b, r->fn, &med, &best) != 0)
        return -1;
    if (r->flops > 0)
        printf("%-24s %5s %10.3f %10.3f %9.1f TFLOP/s\n", r->name, prec, med, best,
               r->flops / (med * 1e-3) / 1e12);
    else
        printf("%-24s %5s %10.3f %10.3f %9.0f GB/s\n", r->name, prec, med, best,
               r->bytes / (med * 1e-3) / 1e9);
    return 0;
}

static int run_shape(bench_t *b, const shape_t *s)
{
    if (setup(b, s) != 0)
        return -1;
    const double n = (double)s->b * s->t, c = s->c, f4 = 4.0, hs = (double)s->c / s->nh;
    const double np = (double)n_params(s), v = s->vocab;
    const double att_f = 4.0 * s->b * s->nh * (double)s->t * s->t * hs / 2.0;
    const row_t rows[] = {
        {"layernorm_forward", op_ln_fwd, f4 * (2 * n * c + 2 * c + 2 * n), 0},
        {"layernorm_backward", op_ln_bwd, f4 * (4 * n * c + 2 * n + 5 * c), 0},
        {"gelu_forward (n x 4c)", op_gelu_fwd, f4 * 2 * n * 4 * c, 0},
        {"gelu_backward (n x 4c)", op_gelu_bwd, f4 * 3 * n * 4 * c, 0},
        {"add (n x c)", op_add, f4 * 3 * n * c, 0},
        {"attention_forward", op_att_fwd, 0, att_f},
        {"attention_backward", op_att_bwd, 0, 2.5 * att_f},
        {"embed_forward", op_embed_fwd, f4 * (2 * n * c + n), 0},
        {"embed_backward", op_embed_bwd, f4 * (n * c + n), 0},
        {"sumsq (all params)", op_sumsq, f4 * np, 0},
        {"adamw (all params)", op_adamw, f4 * 7 * np, 0},
    };
    const row_t att16[] = {{"attention16_forward", op_att16_fwd, 0, att_f},
                           {"attention16_backward", op_att16_bwd, 0, 2.5 * att_f}};
    const row_t head[] = {{"tied_head (loss)", op_head_fwd, 0, 2.0 * n * c * v},
                          {"tied_head (loss+grad)", op_head, 0, 6.0 * n * c * v}};
    char sdpa[200];
    torch_sdpa(s, sdpa, sizeof sdpa);
    printf("\n%s: b=%d t=%d c=%d nh=%d vocab=%d (%.1fM parameters)\n", s->name, s->b, s->t, s->c,
           s->nh, s->vocab, np / 1e6);
    printf("%-24s %5s %10s %10s %17s\n", "op", "prec", "ms (med)", "ms (best)", "achieved");
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++)
        if (print_row(b, &rows[i], "fp32") != 0)
            return -1;
    /* fp32_fwd fp32_bwd bf16_fwd bf16_bwd */
    double tf[4];
    if (sdpa[0] != '\0' && sscanf(sdpa, "%lf %lf %lf %lf", &tf[0], &tf[1], &tf[2], &tf[3]) == 4) {
        const char *names[] = {"torch sdpa forward", "torch sdpa backward"};
        for (int i = 0; i < 4; i++)
            printf("%-24s %5s %10.3f %10s %9.1f TFLOP/s\n", names[i % 2], i < 2 ? "fp32" : "bf16",
                   tf[i], "", (i % 2 ? 2.5 : 1.0) * att_f / (tf[i] * 1e-3) / 1e12);
    } else {
        printf("torch sdpa: not measured (no python3 with a CUDA build of torch)\n");
    }
    /* The output layer's products in each precision, and the attention in bf16 (tensor
     * cores); the other ops do not depend on the precision. */
    for (int p = MGPU_PREC_FP32; p <= MGPU_PREC_BF16; p++) {
        const char *pn = mgpu_precision_name((mgpu_precision_t)p);
        if (mgpu_kernels_set_precision(b->k, (mgpu_precision_t)p, &b->err) != 0)
            return -1;
        for (size_t i = 0; i < sizeof head / sizeof *head; i++)
            if (print_row(b, &head[i], pn) != 0)
                return -1;
        if (p == MGPU_PREC_BF16) {
            for (size_t i = 5; i <= 6; i++) /* rows[5], rows[6]: the attention */
                if (print_row(b, &rows[i], pn) != 0)
                    return -1;
            for (size_t i = 0; i < sizeof att16 / sizeof *att16; i++)
                if (print_row(b, &att16[i], pn) != 0)
                    return -1;
        }
    }
    if (mgpu_kernels_set_precision(b->k, MGPU_PREC_FP32, &b->err) != 0)
        return -1;
    teardown(b);
    return 0;
}

int main(int argc, char **argv)
{
    const char *which = argc > 1 ? argv[1] : "all";
    bench_t b = {0};
    int known = strcmp(which, "all") == 0;
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        known = known || strcmp(which, shapes[i].name) == 0;
    if (!known) {
        fprintf(stderr, "usage: gpt_kernels_bench [gpt2|gpt2-2k|byte|h128|all], got '%s'\n", which);
        return 2;
    }
    if (mgpu_kernels_cuda_device_count(&b.err) <= 0) {
        fprintf(stderr, "gpt_kernels_bench: no CUDA device: %s\n", b.err.msg);
        return 77;
    }
    if (mgpu_kernels_create(MGPU_KBACKEND_CUDA, 0, &b.k, &b.err) != 0) {
        fprintf(stderr, "gpt_kernels_bench: %s\n", b.err.msg);
        return 1;
    }
    b.impl = b.k->impl;
    b.stream = (cudaStream_t)mgpu_kernels_cuda_stream(b.k);
    for (int i = 0; i <= ITERS; i++)
        if (cudaEventCreate(&b.ev[i]) != cudaSuccess) {
            fprintf(stderr, "gpt_kernels_bench: cudaEventCreate failed\n");
            return 1;
        }
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
        printf("gpt_kernels_bench: %s, %d SMs; times are medians of %d calls\n", prop.name,
               prop.multiProcessorCount, ITERS);
    int rc = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes && rc == 0; i++)
        if ((strcmp(which, "all") == 0 || strcmp(which, shapes[i].name) == 0) &&
            run_shape(&b, &shapes[i]) != 0)
            rc = 1;
    if (rc != 0)
        fprintf(stderr, "gpt_kernels_bench: %s\n", b.err.msg);
    for (int i = 0; i <= ITERS; i++)
        cudaEventDestroy(b.ev[i]);
    mgpu_kernels_destroy(b.k);
    return rc;
}
#endif
