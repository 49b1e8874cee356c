/* test_gpt_graph.c - model = gpt's step replayed from one CUDA graph with the gradients'
 * average inside it (worker/trainer/gpt_graph.c, STEP with a reduce), at world size 1: a
 * stand-in for the all-reduce, called from the backward's hook as each bucket is made, queues
 * on the stream it is given a copy of the bucket into a snapshot buffer (and, in place, back
 * into the gradients, as NCCL's all-reduce writes them).
 *
 * Checked, in fp32 and on the bf16 path (whose LayerNorm backward adds into the bias gradient
 * of the block below): the stand-in is called once per bucket of mgpu_gpt_buckets, in its
 * order, during the one capture, with the schedule's all-reduce stream (not the backend's);
 * after every replay each bucket's snapshot equals the step's final gradients bit for bit (a
 * bucket forked off before its last write would copy an earlier value); and the losses and the
 * final parameters equal those of the plain STEP graph of world size 1 bit for bit (the copies
 * change nothing, and nothing in the step may read or write differently because the backward
 * is hooked), with the buckets during the backward, after it (bucket_overlap = false) and
 * written back in place. The plain run is repeated last: if the step itself is not
 * reproducible here, that is said apart. And the products' workspace slices of a capture
 * (kernels/schedule.cu) against the shared workspace, and the activations and scratch kept
 * inside the gradients and logits (reuse_grads) against buffers of their own, and the weight
 * gradients beside the backward's chain against after it, bit for bit.
 *
 * Skips without CUDA or a CUDA device. Run it on a GPU machine: build/tests/test_gpt_graph. */
#include "check.h"
#include "kernels_check.h" /* need_gpu, beside_products */
#include "gpt_graph.h"     /* mgpu_gpt_graph_* */
#include "model_gpt.h"     /* mgpu_gpt_*, mgpu_gpt_buckets */

#if defined(MGPU_HAVE_CUDA) && MGPU_HAVE_CUDA
#include "kernels_cuda.h"     /* mgpu_kernels_cuda_stream */
#include <cuda_runtime_api.h> /* cudaMemcpyAsync: the stand-in all-reduce */
#endif

#include <math.h>   /* fabs */
#include <stdint.h> /* int32_t */
#include <stdlib.h> /* setenv, malloc, free */
#include <string.h> /* memcmp */

#define STEPS 6
#define B 4
#define MAX_BUCKETS 16

static const mgpu_gpt_spec_t spec = {
    .n_layer = 3, .n_head = 4, .n_embd = 64, .context = 32, .vocab = 256};

/* 0.1 MiB: a block (49984 floats) is a bucket, the final LayerNorm goes with the top one. */
static const double bucket_mb = 0.1;

typedef enum mode { PLAIN, SNAPSHOT, AFTER_BACKWARD, IN_PLACE } run_mode_t;
static const char *const mode_names[] = {"plain", "snapshot", "after backward", "in place"};

typedef struct standin {
    mgpu_gpt_t *m;
    float *snap; /* backend memory, n_params */
    int in_place;
    int calls, wrong_stream;
    mgpu_gpt_bucket_t seen[MAX_BUCKETS];
} standin_t;

/* The all-reduce's stand-in (mgpu_gpt_graph_reduce_t's fn): the bucket into the snapshot,
 * and back in place, on stream. */
static int standin_reduce(void *ctx, float *buf, size_t count, void *stream, mgpu_err_t *err)
{
#if defined(MGPU_HAVE_CUDA) && MGPU_HAVE_CUDA
    standin_t *s = ctx;
    const size_t off = (size_t)(buf - s->m->grads), bytes = sizeof(float) * count;
    if (s->calls < MAX_BUCKETS)
        s->seen[s->calls] = (mgpu_gpt_bucket_t){.off = off, .n = count};
    s->calls++;
    s->wrong_stream += stream == NULL || stream == mgpu_kernels_cuda_stream(s->m->k);
    cudaStream_t st = (cudaStream_t)stream;
    cudaError_t ce = cudaMemcpyAsync(s->snap + off, buf, bytes, cudaMemcpyDeviceToDevice, st);
    if (ce == cudaSuccess && s->in_place)
        ce = cudaMemcpyAsync(buf, s->snap + off, bytes, cudaMemcpyDeviceToDevice, st);
    if (ce != cudaSuccess)
        return mgpu_err_set(err, MGPU_E_CUDA, "stand-in all-reduce of %zu floats: %s", count,
                            cudaGetErrorString(ce));
    return 0;
#else
    return mgpu_err_set(err, MGPU_E_USAGE, "stand-in all-reduce: a build without CUDA");
#endif
}

typedef struct run {
    float loss[STEPS];
    float *params; /* host, malloc'd */
    size_t n_params;
    size_t snap_differ;         /* floats of the snapshots that differ from the final gradients */
    size_t in_grads, in_logits; /* the model's (model_gpt.h) */
    int ok;                     /* the run got to its end */
} run_t;

#define RUN_OK(call)                                                                               \
    do {                                                                                           \
        if ((call) < 0) {                                                                          \
            printf("  %s:%d: %s: %s\n", __FILE__, __LINE__, #call, err.msg);                       \
            check_failed++;                                                                        \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

/* STEPS steps of the model from seed 3 over the batches tok / tgt (STEPS x B x context): the
 * first eager (it sizes the backend's workspaces), the others replayed from STEP, with the
 * stand-in inside it unless mode is PLAIN. */
static void train(mgpu_kernels_t *k, const mgpu_gpt_spec_t *sp, run_mode_t mode, const int32_t *tok,
                  const int32_t *tgt, run_t *r)
{
    mgpu_err_t err = {0};
    mgpu_gpt_t *m = NULL;
    mgpu_gpt_graph_t *g = NULL;
    mgpu_gpt_bucket_t *plan = NULL;
    float *grads = NULL, *snap = NULL;
    int nb = 0;
    const int T = sp->context;
    const float scale = 1.0f / ((float)B * T), clip = 1.0f;
    mgpu_adamw_hparams_t hp = {
        .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
    standin_t s = {.in_place = mode == IN_PLACE};
    memset(r, 0, sizeof *r);

    RUN_OK(mgpu_gpt_create(k, sp, B, &m, &err));
    if ((k->precision == MGPU_PREC_BF16) != (m->b16 != NULL)) {
        printf("  precision %d but the %s path\n", (int)k->precision, m->b16 ? "bf16" : "fp32");
        check_failed++;
        goto out;
    }
    s.m = m;
    r->in_grads = m->in_grads;
    r->in_logits = m->in_logits;
    RUN_OK(mgpu_gpt_init(m, 3, &err));
    RUN_OK(mgpu_gpt_buckets(m, bucket_mb, &plan, &nb, &err));
    CHECK_INT(nb, sp->n_layer + 1);
    void *p = NULL;
    RUN_OK(mgpu_k_alloc(k, sizeof(float) * m->n_params, &p, &err));
    s.snap = p;
    RUN_OK(mgpu_k_zero(k, s.snap, sizeof(float) * m->n_params, &err));
    grads = malloc(sizeof(float) * m->n_params);
    snap = malloc(sizeof(float) * m->n_params);
    r->params = malloc(sizeof(float) * m->n_params);
    r->n_params = m->n_params;
    mgpu_gpt_graph_reduce_t reduce = {.fn = standin_reduce,
                                      .ctx = &s,
                                      .buckets = plan,
                                      .n_buckets = nb,
                                      .overlap = mode != AFTER_BACKWARD};
    RUN_OK(mgpu_gpt_graph_create(m, scale, &hp, clip, mode == PLAIN ? NULL : &reduce, &g, &err));
    if (g == NULL) {
        printf("  mgpu_gpt_graph_create: no graph on a CUDA backend\n");
        check_failed++;
        goto out;
    }
    CHECK_INT(mgpu_gpt_graph_reduces(g), mode != PLAIN);
    for (int step = 1; step <= STEPS; step++) {
        const size_t at = (size_t)(step - 1) * B * T;
        RUN_OK(mgpu_gpt_load(m, tok + at, tgt + at, B, T, &err));
        if (step == 1) {
            RUN_OK(mgpu_gpt_zero_grads(m, &err));
            RUN_OK(mgpu_gpt_loss(m, scale, 1, &err));
            RUN_OK(mgpu_gpt_step(m, &hp, step, clip, NULL, &err));
        } else {
            RUN_OK(mgpu_gpt_set_step(m, &hp, step, &err));
            RUN_OK(mgpu_gpt_graph_run(g, MGPU_GPT_GRAPH_STEP, &err));
        }
        /* A copy on the backend's stream: after the replay, whose update waited for the
         * all-reduce stream. */
        RUN_OK(mgpu_k_copy_to_host(k, &r->loss[step - 1], m->scalars, sizeof(float), &err));
        if (mode != PLAIN && step > 1) {
            RUN_OK(mgpu_k_copy_to_host(k, grads, m->grads, sizeof(float) * m->n_params, &err));
            RUN_OK(mgpu_k_copy_to_host(k, snap, s.snap, sizeof(float) * m->n_params, &err));
            for (size_t i = 0; i < m->n_params; i++)
                r->snap_differ += memcmp(&grads[i], &snap[i], sizeof(float)) != 0;
        }
    }
    RUN_OK(mgpu_k_copy_to_host(k, r->params, m->params, sizeof(float) * m->n_params, &err));
    CHECK_INT(mgpu_gpt_graph_captures(g), 1);
    if (mode != PLAIN) {
        /* One capture: each bucket once, in the plan's order, on the all-reduce stream. */
        CHECK_INT(s.calls, nb);
        CHECK_INT(s.wrong_stream, 0);
        for (int i = 0; i < nb && i < s.calls && i < MAX_BUCKETS; i++)
            CHECK(s.seen[i].off == plan[i].off && s.seen[i].n == plan[i].n);
    }
    r->ok = 1;
out:
    mgpu_gpt_graph_destroy(g);
    if (s.snap != NULL)
        mgpu_k_free(k, s.snap);
    mgpu_gpt_destroy(m);
    free(plan);
    free(grads);
    free(snap);
}

/* Whether a and b are the same bits; prints the first difference. */
static int same_run(const char *what, const run_t *a, const run_t *b)
{
    for (int i = 0; i < STEPS; i++)
        if (memcmp(&a->loss[i], &b->loss[i], sizeof(float)) != 0) {
            printf("  %s: step %d's loss %.9g vs %.9g\n", what, i + 1, a->loss[i], b->loss[i]);
            return 0;
        }
    for (size_t i = 0; i < a->n_params; i++)
        if (memcmp(&a->params[i], &b->params[i], sizeof(float)) != 0) {
            printf("  %s: parameter %zu %.9g vs %.9g\n", what, i, a->params[i], b->params[i]);
            return 0;
        }
    return 1;
}

/* STEPS batches of tokens and targets below 256 (malloc'd) for sp's context, the same every
 * call. */
static void batches(const mgpu_gpt_spec_t *sp, int32_t **tok, int32_t **tgt)
{
    const size_t n = (size_t)STEPS * B * sp->context;
    *tok = malloc(sizeof(int32_t) * n);
    *tgt = malloc(sizeof(int32_t) * n);
    uint32_t x = 12345;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        (*tok)[i] = (int32_t)(x >> 24);
        (*tgt)[i] = (int32_t)((x >> 16) & 0xff);
    }
}

/* A CUDA backend in prec with MGPU_LT_TUNE=0 set (the caller unsets it): the heuristic's first
 * algorithm everywhere, so that no timing decides a product's bits. NULL, and a failed check,
 * when it cannot be made. */
static mgpu_kernels_t *cuda_backend(mgpu_precision_t prec)
{
    mgpu_kernels_t *k = NULL;
    mgpu_err_t err = {0};
    setenv("MGPU_LT_TUNE", "0", 1);
    CHECK_INT(mgpu_kernels_create(MGPU_KBACKEND_CUDA, 0, &k, &err), 0);
    if (k != NULL && mgpu_kernels_set_precision(k, prec, &err) == 0)
        return k;
    printf("  %s\n", err.msg);
    check_failed++;
    mgpu_kernels_destroy(k);
    return NULL;
}

static void average_in_step(mgpu_precision_t prec)
{
    need_gpu();
    int32_t *tok, *tgt;
    batches(&spec, &tok, &tgt);
    mgpu_kernels_t *k = cuda_backend(prec);
    if (k == NULL)
        goto out;
    run_t plain, again, r;
    train(k, &spec, PLAIN, tok, tgt, &plain);
    for (int mode = SNAPSHOT; mode <= IN_PLACE && plain.ok; mode++) {
        train(k, &spec, (run_mode_t)mode, tok, tgt, &r);
        if (r.ok) {
            printf("  %s, %s: losses %.6f .. %.6f; %zu floats of the snapshots differ from "
                   "the final gradients\n",
                   prec == MGPU_PREC_BF16 ? "bf16" : "fp32", mode_names[mode], r.loss[0],
                   r.loss[STEPS - 1], r.snap_differ);
            CHECK(r.snap_differ == 0);
            CHECK(same_run(mode_names[mode], &r, &plain));
        }
        free(r.params);
    }
    train(k, &spec, PLAIN, tok, tgt, &again);
    if (plain.ok && again.ok && !same_run("plain, run again", &again, &plain))
        printf("  the plain step is not reproducible on this GPU: the comparisons above "
               "cannot be bit for bit\n");
    free(plain.params);
    free(again.params);
out:
    unsetenv("MGPU_LT_TUNE");
    mgpu_kernels_destroy(k);
    free(tok);
    free(tgt);
}

static void test_average_in_step_fp32(void)
{
    average_in_step(MGPU_PREC_FP32);
}

static void test_average_in_step_bf16(void)
{
    average_in_step(MGPU_PREC_BF16);
}

/* spec.recompute 1 and 2 (activations made again in the backward, on layers that share their
 * buffers), replayed from the STEP graph: in fp32 the same bits as recompute 0; on the bf16
 * path 2 gives 1's bits (the LayerNorms' outputs made again by their backward from the
 * forward's statistics, before the weight gradients that read them), and 1 the same
 * first loss as 0 (the forward is the same) and losses within bf16's rounding after it (its
 * GELU output is made from the pre-activation kept in bf16, not from the product's fp32 sum
 * as the forward's epilogue makes it). */
static void recompute_in_step(mgpu_precision_t prec)
{
    need_gpu();
    int32_t *tok, *tgt;
    batches(&spec, &tok, &tgt);
    mgpu_kernels_t *k = cuda_backend(prec);
    if (k == NULL)
        goto out;
    run_t r[3];
    memset(r, 0, sizeof r);
    for (int re = 0; re <= 2; re++) {
        mgpu_gpt_spec_t sp = spec;
        sp.recompute = re;
        train(k, &sp, PLAIN, tok, tgt, &r[re]);
        CHECK(r[re].ok);
    }
    if (r[0].ok && r[1].ok && r[2].ok) {
        printf("  %s: last losses %.7f (recompute 0), %.7f (1), %.7f (2)\n",
               prec == MGPU_PREC_BF16 ? "bf16" : "fp32", r[0].loss[STEPS - 1], r[1].loss[STEPS - 1],
               r[2].loss[STEPS - 1]);
        CHECK(same_run("recompute 2 against 1", &r[2], &r[1]));
        if (prec != MGPU_PREC_BF16) {
            CHECK(same_run("recompute 1 against 0", &r[1], &r[0]));
        } else {
            CHECK(memcmp(&r[1].loss[0], &r[0].loss[0], sizeof(float)) == 0);
            for (int i = 1; i < STEPS; i++)
                CHECK(fabs(r[1].loss[i] - r[0].loss[i]) <= 1e-3 * fabs(r[0].loss[i]));
        }
    }
    for (int re = 0; re <= 2; re++)
        free(r[re].params);
out:
    unsetenv("MGPU_LT_TUNE");
    mgpu_kernels_destroy(k);
    free(tok);
    free(tgt);
}

static void test_recompute_in_step_fp32(void)
{
    recompute_in_step(MGPU_PREC_FP32);
}

static void test_recompute_in_step_bf16(void)
{
    recompute_in_step(MGPU_PREC_BF16);
}

/* The bf16 step's products captured each with a workspace slice of its own, the memsets
 * cuBLASLt queued on those slices replaced by one at the graph's start (kernels/schedule.cu):
 * the same bits as with the one shared workspace (MGPU_GRAPH_SLICES=0), which replaces none.
 * GPT-2's width and vocabulary, two layers: products large enough that cuBLASLt 13 queues
 * such memsets on a Hopper GPU, where some must have been replaced. */
static void test_workspace_slices_bf16(void)
{
    need_gpu();
    static const mgpu_gpt_spec_t wide = {
        .n_layer = 2, .n_head = 12, .n_embd = 768, .context = 256, .vocab = 50304};
    mgpu_err_t err = {0};
    int32_t *tok, *tgt;
    batches(&wide, &tok, &tgt);
    run_t r[2];
    memset(r, 0, sizeof r);
    int replaced[2] = {-1, -1};
    setenv("MGPU_LT_TUNE", "0", 1);
    for (int shared = 0; shared < 2; shared++) {
        mgpu_kernels_t *k = NULL;
        if (shared)
            setenv("MGPU_GRAPH_SLICES", "0", 1);
        CHECK_INT(mgpu_kernels_create(MGPU_KBACKEND_CUDA, 0, &k, &err), 0);
        if (k != NULL && mgpu_kernels_set_precision(k, MGPU_PREC_BF16, &err) == 0) {
            train(k, &wide, PLAIN, tok, tgt, &r[shared]);
#if defined(MGPU_HAVE_CUDA) && MGPU_HAVE_CUDA
            replaced[shared] = mgpu_kernels_cuda_graph_memsets_replaced(k);
#endif
        } else {
            printf("  %s\n", err.msg);
            check_failed++;
        }
        mgpu_kernels_destroy(k);
    }
    unsetenv("MGPU_GRAPH_SLICES");
    unsetenv("MGPU_LT_TUNE");
    printf("  memsets replaced: %d with a slice a product, %d with the shared workspace\n",
           replaced[0], replaced[1]);
    CHECK_INT(replaced[1], 0);
    CHECK(replaced[0] >= 0);
#if defined(MGPU_HAVE_CUDA) && MGPU_HAVE_CUDA
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess &&
        major == 9)
        CHECK(replaced[0] > 0);
#endif
    if (r[0].ok && r[1].ok)
        CHECK(same_run("slices against the shared workspace", &r[0], &r[1]));
    else
        CHECK(r[0].ok && r[1].ok);
    free(r[0].params);
    free(r[1].params);
    free(tok);
    free(tgt);
}

/* Two runs that must agree bit for bit (a: the variant, b: the reference), the variant's
 * bucket snapshots equal to its final gradients; both runs' parameters freed. */
static void check_pair(const char *what, run_t *a, run_t *b)
{
    if (a->ok && b->ok) {
        CHECK(same_run(what, a, b));
        CHECK(a->snap_differ == 0);
    } else {
        CHECK(a->ok && b->ok);
    }
    free(a->params);
    free(b->params);
}

/* spec.reuse_grads on the bf16 path (activations inside the gradients of the block below,
 * the backward's scratch inside the logits: a vocabulary of 1024 makes them large enough): the
 * same bits as every buffer in memory of its own, eager (the first step) and replayed, with the
 * buckets' stand-in all-reduce during and after the backward, and with recompute = 2. */
static void test_reuse_grads_bf16(void)
{
    need_gpu();
    mgpu_gpt_spec_t sp = spec;
    sp.vocab = 1024;
    int32_t *tok, *tgt;
    batches(&sp, &tok, &tgt);
    mgpu_kernels_t *k = cuda_backend(MGPU_PREC_BF16);
    if (k == NULL)
        goto out;
    const run_mode_t modes[] = {PLAIN, SNAPSHOT, AFTER_BACKWARD, PLAIN};
    for (int i = 0; i < 4; i++) {
        run_t r[2];
        sp.recompute = i == 3 ? 2 : 0;
        for (int reuse = 0; reuse < 2; reuse++) {
            sp.reuse_grads = reuse;
            train(k, &sp, modes[i], tok, tgt, &r[reuse]);
        }
        if (r[0].ok && r[1].ok) {
            printf("  %s, recompute %d: %zu bytes of activations inside the gradients, %zu of "
                   "scratch inside the logits; losses %.6f .. %.6f\n",
                   mode_names[modes[i]], sp.recompute, r[1].in_grads, r[1].in_logits, r[1].loss[0],
                   r[1].loss[STEPS - 1]);
            CHECK(r[1].in_grads > 0 && r[0].in_grads == 0 && r[1].in_logits > 0);
        }
        check_pair("reuse_grads against buffers of their own", &r[1], &r[0]);
    }
out:
    unsetenv("MGPU_LT_TUNE");
    mgpu_kernels_destroy(k);
    free(tok);
    free(tgt);
}

/* The weight gradients beside the backward's chain (MGPU_GPT_WG_BESIDE=1: every captured one
 * on the backend's side stream, joined where model_gpt.c's backward16 says) against all on the
 * main stream: the same losses and parameters bit for bit, with the hook's copies during the
 * backward and after it, with the activations inside the gradients (which the block below's
 * weight gradients overwrite) and with recompute = 2 (whose outputs a later block's pass
 * writes again). */
static void test_weight_grads_beside_bf16(void)
{
    need_gpu();
    mgpu_gpt_spec_t sp = spec;
    sp.vocab = 1024;
    sp.reuse_grads = 1;
    int32_t *tok, *tgt;
    batches(&sp, &tok, &tgt);
    mgpu_kernels_t *k[2];
    for (int b = 0; b < 2; b++) {
        setenv("MGPU_GPT_WG_BESIDE", b ? "1" : "0", 1);
        k[b] = cuda_backend(MGPU_PREC_BF16);
    }
    unsetenv("MGPU_GPT_WG_BESIDE");
    if (k[0] == NULL || k[1] == NULL)
        goto out;
    const run_mode_t modes[] = {PLAIN, SNAPSHOT, AFTER_BACKWARD, PLAIN};
    for (int i = 0; i < 4; i++) {
        run_t r[2];
        sp.recompute = i == 3 ? 2 : 0;
        const long long before = beside_products(k[1]);
        for (int b = 0; b < 2; b++)
            train(k[b], &sp, modes[i], tok, tgt, &r[b]);
        const long long beside = beside_products(k[1]) - before;
        if (r[0].ok && r[1].ok) {
            printf("  %s, recompute %d: %lld weight gradients beside; losses %.6f .. %.6f\n",
                   mode_names[modes[i]], sp.recompute, beside, r[1].loss[0], r[1].loss[STEPS - 1]);
            /* four a block, in each capture (one, or one a bucket plan) */
            CHECK(beside >= 4 * sp.n_layer);
            CHECK(beside_products(k[0]) == 0);
        }
        check_pair("weight gradients beside against after", &r[1], &r[0]);
    }
out:
    unsetenv("MGPU_LT_TUNE");
    mgpu_kernels_destroy(k[0]);
    mgpu_kernels_destroy(k[1]);
    free(tok);
    free(tgt);
}

int main(void)
{
    RUN(test_average_in_step_fp32);
    RUN(test_average_in_step_bf16);
    RUN(test_recompute_in_step_fp32);
    RUN(test_recompute_in_step_bf16);
    RUN(test_workspace_slices_bf16);
    RUN(test_reuse_grads_bf16);
    RUN(test_weight_grads_beside_bf16);
    return check_done();
}
