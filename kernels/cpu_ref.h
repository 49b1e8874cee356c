/* cpu_ref.h - the plain-C backend's internals, shared by its .c files (kernels_cpu.c and one
 * file per family): its state and the reference functions the op table of kernels_cpu.c holds.
 * Every function has the signature of its slot in mgpu_kernels_ops_t (kernels.h). */
#ifndef MGPU_CPU_REF_H
#define MGPU_CPU_REF_H

#include "kernels.h" /* mgpu_err_t, mgpu_act_t, the hyperparameters */

#include <stddef.h> /* size_t */
#include <stdint.h> /* int32_t */

/* GCC 12 at -O2 leaves plain elementwise loops scalar (its "very cheap" vectoriser gives up
 * on them); these functions ask for the vectoriser explicitly. Not on the GEMM, whose
 * micro-kernel is vectorised by hand and measured slower with it (packing loops). */
#if defined(__GNUC__) && !defined(__clang__)
#define VECTORIZE __attribute__((optimize("tree-vectorize", "vect-cost-model=dynamic")))
#else
#define VECTORIZE
#endif

/* tanh-GELU's constants in fp32: 0.5 x (1 + tanh(GELU_K (x + GELU_C x^3))). */
#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_C 0.044715f

/* GEMM blocking: C is computed in MR x NR register tiles from packed panels of op(A) (MC x KC)
 * and op(B) (KC x NC). KC x NR floats of B (8-16 KiB) stay in L1 while a panel of A streams
 * by; the MC x KC block of A (64 KiB) stays in L2. NR is 16 with AVX2 + FMA (about 70-80
 * GFLOP/s on one core of the dev machine's EPYC), else 8 with SSE (about 30 GFLOP/s). */
#define MR 4
#define NR_MAX 16 /* the AVX2 kernel's panel width; the portable one uses 8 */
#define MC 64
#define KC 256
#define NC 512

/* GCC/Clang vector extension: four floats, one SSE register on any x86-64 (two halves of a
 * NEON pair on arm64), so the micro-kernel vectorises at -O2 without intrinsics. */
typedef float v4f __attribute__((vector_size(16)));

typedef struct cpu_impl {
    float *apack; /* MC x KC, panels of MR rows */
    float *bpack; /* KC x NC, panels of nr columns */
    int nr;       /* panel width of the micro-kernel this CPU runs: 16 (AVX2 + FMA) or 8 */
    /* The GPT table's attention scratch (gpt_cpu.c): one batch row's probabilities and their
     * gradients, grown when a larger shape comes, freed with the backend. */
    float *gpt_scratch;
    size_t gpt_scratch_n; /* floats */
} cpu_impl_t;
int mgpu_cpu_gemm(void *impl, int trans_a, int trans_b, int m, int n, int k, float alpha,
                  const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc,
                  mgpu_err_t *err);
int mgpu_cpu_bias_act_forward(void *impl, mgpu_act_t act, int rows, int cols, float *z,
                              const float *bias, float *y, mgpu_err_t *err);
int mgpu_cpu_act_forward(void *impl, mgpu_act_t act, size_t n, const float *x, float *y,
                         mgpu_err_t *err);
int mgpu_cpu_act_backward(void *impl, mgpu_act_t act, size_t n, const float *z, const float *y,
                          const float *dy, float *dz, mgpu_err_t *err);
int mgpu_cpu_scale(void *impl, size_t n, float alpha, float *x, mgpu_err_t *err);
int mgpu_cpu_sum_rows(void *impl, int rows, int cols, const float *x, float beta, float *out,
                      mgpu_err_t *err);
int mgpu_cpu_mse(void *impl, int rows, int cols, const float *pred, const float *target,
                 float *loss, float *dpred, mgpu_err_t *err);
int mgpu_cpu_sum(void *impl, size_t n, const float *x, float *out, mgpu_err_t *err);
int mgpu_cpu_argmax_rows(void *impl, int rows, int cols, const float *x, int32_t *out,
                         mgpu_err_t *err);
int mgpu_cpu_count_correct(void *impl, int rows, int cols, const float *logits,
                           const int32_t *labels, float *out, mgpu_err_t *err);
int mgpu_cpu_softmax_xent(void *impl, int rows, int cols, const float *logits,
                          const int32_t *labels, float *loss, float *dlogits, mgpu_err_t *err);
int mgpu_cpu_sgd_step(void *impl, size_t n, float *p, const float *g, float *buf,
                      const mgpu_sgd_hparams_t *hp, long long step, mgpu_err_t *err);
int mgpu_cpu_adamw_step(void *impl, size_t n, float *p, const float *g, float *m, float *v,
                        const mgpu_adamw_hparams_t *hp, long long step, mgpu_err_t *err);

#endif
