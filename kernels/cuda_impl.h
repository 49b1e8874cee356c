/* cuda_impl.h - the CUDA backend's internals, shared by its .cu files (C++ only; nothing
 * outside kernels/ includes it): the backend's state (cuda_impl), the constants its kernels
 * and launchers agree on, the device helpers every family uses (vector loads, warp and block
 * sums, the elementwise and reduction skeletons, the activations), and the functions one
 * family calls in another. kernels/README.md lists the families and the design.
 *
 * Kernels and the helpers only one file needs stay in that file's anonymous namespace. */
#ifndef MGPU_CUDA_IMPL_H
#define MGPU_CUDA_IMPL_H

#include "cuda_check.h"   /* CUDA_CHECK_LAUNCH: launch_ew's check */
#include "kernels_cuda.h" /* kernels.h (with C linkage): mgpu_err_t, the op table's types */
#include "options.h"      /* mgpu_kernels_options_t */
#include "small_gemm.h"   /* mgpu_sg: the queued weight-gradient group in cuda_impl */

#include <cublasLt.h>     /* cublasLtMatmul: the fused linear-layer ops' epilogues */
#include <cublas_v2.h>    /* cublasGemmEx */
#include <cuda_bf16.h>    /* __nv_bfloat16 */
#include <cuda_runtime.h> /* streams, events */

#include <math.h>      /* INFINITY */
#include <stdint.h>    /* uintptr_t */
#include <type_traits> /* std::integral_constant */

namespace mgpu_cuda
{

/* --- cuBLAS, opened at the first CUDA backend ---------------------------------------------- */
/* Linked, libcublasLt alone cost every process that carries it about 60 ms at start (its
 * loading and static initialisation: on the 2-core VM a bare main() starts in 1.9 ms, 62 ms
 * with libcublasLt), CPU workers and tools that never touch a GPU included. So cuBLAS and
 * cuBLASLt are dlopen'ed when a CUDA backend is created, through the executable's run path
 * (CUDA_HOME/lib64) as the link would have found them, and called through this table. The
 * member p_NAME is NAME's pointer, its type from the header; the symbol looked up is NAME
 * after cublas_v2.h's macros (cublasCreate is cublasCreate_v2). */
struct blas_api {
#define MGPU_BLAS_FN(name) decltype(&::name) p_##name
    MGPU_BLAS_FN(cublasCreate);
    MGPU_BLAS_FN(cublasDestroy);
    MGPU_BLAS_FN(cublasSetStream);
    MGPU_BLAS_FN(cublasSetMathMode);
    MGPU_BLAS_FN(cublasSetWorkspace);
    /* (C++ also sees an inline overload with a cudaDataType compute type: name the C one.) */
    cublasStatus_t (*p_cublasGemmEx)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                     int, const void *, const void *, cudaDataType, int,
                                     const void *, cudaDataType, int, const void *, void *,
                                     cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
    MGPU_BLAS_FN(cublasGetStatusName);
    MGPU_BLAS_FN(cublasGetStatusString);
    MGPU_BLAS_FN(cublasLtCreate);
    MGPU_BLAS_FN(cublasLtDestroy);
    MGPU_BLAS_FN(cublasLtMatmul);
    MGPU_BLAS_FN(cublasLtMatmulAlgoGetHeuristic);
    MGPU_BLAS_FN(cublasLtMatmulDescCreate);
    MGPU_BLAS_FN(cublasLtMatmulDescDestroy);
    MGPU_BLAS_FN(cublasLtMatmulDescSetAttribute);
    MGPU_BLAS_FN(cublasLtMatmulPreferenceCreate);
    MGPU_BLAS_FN(cublasLtMatmulPreferenceDestroy);
    MGPU_BLAS_FN(cublasLtMatmulPreferenceSetAttribute);
    MGPU_BLAS_FN(cublasLtMatrixLayoutCreate);
    MGPU_BLAS_FN(cublasLtMatrixLayoutDestroy);
#undef MGPU_BLAS_FN
};
/* The table, filled once per process by blas_load (cublas.cu). */
extern blas_api B;

constexpr int kThreads = 256;                /* every kernel's block size */
constexpr int kEwBlocksPerSm = 64;           /* grid cap of elementwise kernels */
constexpr int kRedBlocksPerSm = 8;           /* grid cap of reductions: one full wave */
constexpr size_t kScratchFloats = 1u << 20;  /* 4 MiB of partial sums */
constexpr size_t kBlasWorkspace = 32u << 20; /* cuBLAS's recommendation for Hopper */
constexpr size_t kGwsAlign = 256;            /* a captured product's workspace slice */
constexpr int kXentWarpMaxCols = 1024;       /* above: a block per row */
constexpr int kXentClusterMax = 8;           /* blocks a row at most (a portable cluster) */

constexpr int kLtCand = 16; /* heuristic candidates timed per configuration (lt_tune) */

/* One cuBLASLt matmul configuration (column-major, as cuBLAS sees it), its descriptors, the
 * heuristic's candidates and the one in use (the fastest once tuned); ok is false when
 * cuBLASLt declined it. */
struct lt_plan {
    int m, n, k, lda, ldb, ldd;
    long long aux_ld;
    cublasOperation_t ta, tb;
    cublasLtEpilogue_t epi;
    mgpu_precision_t prec;
    bool d16; /* D (and C) in bf16 rather than fp32 */
    bool g16; /* a GPT bf16 path's product (gpt_linear.cu): operands always bf16 */
    bool ok;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulAlgo_t algo;
    cublasLtMatmulAlgo_t cand[kLtCand];
    size_t algo_ws, cand_ws[kLtCand]; /* the workspace bytes each algorithm needs */
    int n_cand;
    bool tuned;
};
constexpr int kLtPlans = 64;              /* configurations cached; more are declined */
constexpr size_t kOwnDreluMin = 1u << 20; /* bf16: dx elements from which the input gradient's
                                             ReLU backward is gemm.cu's own pass */
constexpr int kLtAux = 64; /* aux masks a fused forward wrote, that backward may read */
constexpr size_t kSgPartFloats = 1u << 20; /* small_gemm.cu's bias partials */
constexpr int kSgCounters = 4096;

struct cuda_impl {
    int device;
    mgpu_kernels_options_t opt; /* the MGPU_* knobs (options.h), read at creation */
    int sms;
    int cc;       /* compute capability, major * 10 + minor */
    int l2_bytes; /* the L2 cache's size */
    cudaStream_t stream;
    cublasHandle_t blas;
    mgpu_precision_t prec;
    float *scratch;   /* kScratchFloats: reduction partials, sum_rows' row-split partials */
    float *head_part; /* head_kernel's loss partials, a float a block (sms * kHeadBlocksPerSm) */
    void *blas_ws;
    void *ws; /* GEMM operand copies: bf16 conversions, tf32 transposes */
    size_t ws_bytes;
    /* cuBLASLt for the fused linear ops (shares blas_ws: both run in order on stream). */
    cublasLtHandle_t lt;
    lt_plan plans[kLtPlans];
    int n_plans;
    int g16_evict; /* where gpt_linear.cu looks first for a plan of its own to replace */
    const void *lt_aux[kLtAux]; /* masks written by the last fused forward into them */
    int n_aux;
    /* bf16 mode (see "bf16 operands" below): copies of activations and gradients kept from
     * their first GEMM to their second, and the parameters' bf16 mirror written by SGD. */
    struct shadow {
        const float *src;
        size_t bytes; /* of the fp32 range it copies */
        __nv_bfloat16 *bf;
        size_t cap; /* elements */
        int rows_cm, cols_cm, ld, ld16;
        bool fresh;
    } shadows[kLtAux];
    int n_shadows;
    const float *mir_src;
    size_t mir_n;
    __nv_bfloat16 *mir;
    bool mir_valid;
    /* A small weight-gradient product runs on a side stream, forked from `stream` (ev_fork)
     * so that it overlaps the input-gradient product of the same layer, and the next layer's
     * when the model defers the join (the fused output layer); cuda_join waits for the `done`
     * event of each pending one. Four of them, taken in turn (a step's output layer, the
     * layer below with its bias gradient, and the first layer all run beside each other),
     * each with its own cuBLASLt workspace and narrow_dw_kernel's partial sums and counters.
     * The workspaces (kBlasWorkspace each) are allocated by the first product that runs on a
     * side stream (side_ws): a model whose products are all large (the GPT) never needs them.
     * The bf16 GPT's captured weight gradients run on side stream 0 in turn (gpt_linear.cu's
     * back_weight), each in a workspace slice of its own (gws below). */
    struct side_stream {
        cudaStream_t s;
        void *ws;
        cudaEvent_t done;
        bool pending;
        float *nw_part;
        unsigned *nw_count;
    } side[4];
    int side_next; /* the one the next weight gradient takes */
    /* small_gemm.cu's weight gradients, queued and launched as one group at the join (or
     * sooner, when the next would not fit it) on a side stream that waits for ev_wg, the main
     * stream as it was when the last of them was queued. */
    mgpu_sg::Group wg;
    cudaEvent_t ev_wg;
    cudaEvent_t ev_fork, ev_t0, ev_t1; /* t0, t1: lt_tune's timing */
    struct AdamState *adam;            /* AdamW's step, in device memory */
    float *sg_part;                    /* its input gradient's bias partials (kSgPartFloats) */
    unsigned *sg_count;                /* and their counters (kSgCounters, zero between) */
    long long sg_launches;             /* mgpu_kernels_cuda_small_gemms */
    long long beside_products;         /* mgpu_kernels_cuda_beside_products */
    /* gpt_attention_tc.cu: the attention backward's key pass runs on att_side, beside the
     * query pass on `stream` (att_fork: `stream` before them; att_join: att_side after its
     * pass). Created on the first backward outside a graph capture. */
    cudaStream_t att_side;
    cudaEvent_t att_fork, att_join;
    /* While a graph is captured (gws_on), each bf16 product takes a slice of its own of gws
     * (kBlasWorkspace bytes, allocated by the first capture after a bf16 product ran; off
     * with MGPU_GRAPH_SLICES=0) for its cuBLASLt workspace, as
     * much as its algorithm needs; one that does not fit takes blas_ws. cuBLASLt queues a
     * memset of a product's workspace before many of its kernels; with a slice no other
     * product uses, the capture's end replaces those memsets by one of the slices at the
     * graph's start (gws_hoist), so the products follow the kernels before them directly. */
    char *gws;
    size_t gws_used;
    bool gws_on;
    int gws_replaced; /* the memsets the last capture's end replaced */
};

/* The step's state in device memory: the step number and the two factors that depend on it,
 * so that a CUDA graph's replays advance it (adamw_prep_kernel). */
struct AdamState {
    long long step;
    float step_size, bc2_sqrt;
};

constexpr int kHeadMaxOut = 32; /* a row's outputs fit a warp: lane j writes output j */
constexpr int kHeadThreads = 128;
constexpr int kHeadWarps = kHeadThreads / 32;
constexpr int kHeadBlocksPerSm = 4;

constexpr int kNarrowWarps = 8;
constexpr size_t kNarrowPartFloats = 1u << 18; /* per side stream: the row splits' sums */
constexpr int kNarrowCounters = 1024;          /* one per group of 32 columns */

/* bf16 operands. A weight (inside the parameter range SGD mirrors, with a leading dimension
 * and an offset that keep 16-byte rows) is read from the mirror; otherwise it is converted
 * into the workspace. An activation or gradient is used by two GEMMs of a step (x: forward,
 * then the weight gradient; dz: the weight gradient, then the input gradient), so its first
 * GEMM converts it into a copy of its own (kStore) and the second reuses that copy (kReuse)
 * unless something this backend ran wrote the fp32 buffer in between (invalidate). Writes
 * from outside the backend are not seen: the model's order (nothing writes x or dz between
 * their two GEMMs) is what makes kReuse safe, and kStore always converts. */
enum { kTemp = 0, kStore = 1, kReuse = 2, kFresh = 3 };
/* kFresh: a buffer only the backend's ops write (a gradient between layers): its copy is
 * reused while no op wrote the buffer since the copy was made, else it is converted again. */

/* Launch-bound sizes: their weight-gradient product runs on a side stream (see cuda_impl). */
constexpr double kSideMaxFlops = 2.0 * (1 << 26);
/* Up to this many rows (a pass of sum_rows_kernel's 8 row groups) the bias gradient of such a
 * product runs on a side stream of its own (cuda_linear_backward_weight). */
constexpr int kSideBiasRows = 4096;

/* --- what one family calls in another ------------------------------------------------------ */

/* schedule.cu: side stream i's cuBLASLt workspace, allocating every side stream's on the first
 * call (which must not be inside a capture: the trainers run a step eagerly first). */
int side_ws(cuda_impl *c, int i, void **ws, mgpu_err_t *err);

/* cublas.cu: the loader, the cuBLASLt planner and the bf16 operand copies. */
int blas_load(mgpu_err_t *err);
/* Something wrote [p, p + bytes): bf16 copies of it are stale. */
void invalidate(cuda_impl *c, const void *p, size_t bytes);
int ensure_ws(cuda_impl *c, size_t bytes, mgpu_err_t *err);
int to_bf16(cuda_impl *c, int rows, int cols, const float *src, int lds, __nv_bfloat16 *dst,
            int ldd, mgpu_err_t *err);
long long round128(int v);
bool aux_known(const cuda_impl *c, const void *aux);
void aux_mark(cuda_impl *c, const void *aux, bool written);
cuda_impl::shadow *fresh_copy(cuda_impl *c, const float *src, int rows_cm, int cols_cm, int ld);
cuda_impl::shadow *shadow_slot(cuda_impl *c, const float *src, int rows_cm, int cols_cm, int ld,
                               mgpu_err_t *err, int *rc);
/* Makes p's descriptor and layouts (its shape, transposes, epilogue and aux_ld set; A and B
 * of type ab, C and D of type dt, compute type ct) and keeps the heuristic's candidates, the
 * first in use; sets and returns p->ok. lt_plan_release destroys what it made and clears p. */
bool lt_plan_make(cuda_impl *c, lt_plan *p, cublasComputeType_t ct, cudaDataType_t ab,
                  cudaDataType_t dt);
void lt_plan_release(lt_plan *p);
int lt_matmul(cuda_impl *c, cudaStream_t st, void *ws, cublasOperation_t ta, cublasOperation_t tb,
              int m, int n, int k, const float *a, int lda, const float *b, int ldb, void *d,
              int ldd, cublasLtEpilogue_t epi, const void *bias, const void *aux, long long aux_ld,
              int mode_a, int mode_b, mgpu_err_t *err, bool d16 = false);

/* gemm.cu */
int transpose(cuda_impl *c, int rows, int cols, const float *src, int lds, float *dst,
              mgpu_err_t *err);
int cuda_gemm(void *impl, int trans_a, int trans_b, int m, int n, int k, float alpha,
              const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc,
              mgpu_err_t *err);
int cuda_linear_forward(void *impl, mgpu_act_t act, int rows, int out, int in, const float *x,
                        const float *w, const float *bias, float *z, float *y, void *aux,
                        mgpu_err_t *err);
int cuda_linear_backward_data(void *impl, mgpu_act_t act, int rows, int out, int in,
                              const float *dz, const float *w, const float *z_in, const float *y_in,
                              const void *aux_in, float *dx, float *dbias, mgpu_err_t *err);

/* elementwise.cu */
int cuda_bias_act_forward(void *impl, mgpu_act_t act, int rows, int cols, float *z,
                          const float *bias, float *y, mgpu_err_t *err);
int cuda_act_forward(void *impl, mgpu_act_t act, size_t n, const float *x, float *y,
                     mgpu_err_t *err);
int cuda_act_backward(void *impl, mgpu_act_t act, size_t n, const float *z, const float *y,
                      const float *dy, float *dz, mgpu_err_t *err);
int cuda_scale(void *impl, size_t n, float alpha, float *x, mgpu_err_t *err);

/* optimizers.cu */
int cuda_sgd_step(void *impl, size_t n, float *p, const float *g, float *buf,
                  const mgpu_sgd_hparams_t *hp, long long step, mgpu_err_t *err);
int cuda_adamw_step(void *impl, size_t n, float *p, const float *g, float *m, float *v,
                    const mgpu_adamw_hparams_t *hp, long long step, mgpu_err_t *err);

/* reduce.cu */
long row_splits(const cuda_impl *c, int rows, int cols, int cols_per_block, int per_sm);
/* out[col] = beta out[col] + the sum of the splits' partials in c->scratch, on c->stream. */
int sum_rows_finish(cuda_impl *c, int cols, int splits, float beta, float *out, mgpu_err_t *err);
/* out = the column sums of x[rows, cols] in one pass (no partials) queued on st; the launch's
 * error, for a caller that must record its side stream's event whatever happened. */
cudaError_t sum_rows_on(cudaStream_t st, int rows, int cols, const float *x, float *out);
int cuda_sum_rows(void *impl, int rows, int cols, const float *x, float beta, float *out,
                  mgpu_err_t *err);
int cuda_mse(void *impl, int rows, int cols, const float *pred, const float *target, float *loss,
             float *dpred, mgpu_err_t *err);
int cuda_sum(void *impl, size_t n, const float *x, float *out, mgpu_err_t *err);
int cuda_argmax_rows(void *impl, int rows, int cols, const float *x, int32_t *out, mgpu_err_t *err);
int cuda_count_correct(void *impl, int rows, int cols, const float *logits, const int32_t *labels,
                       float *out, mgpu_err_t *err);

/* xent.cu */
int cuda_softmax_xent(void *impl, int rows, int cols, const float *logits, const int32_t *labels,
                      float *loss, float *dlogits, mgpu_err_t *err);

/* head.cu */
bool narrow_dw(const cuda_impl *c, int rows, int out, int in);
int launch_narrow_dw(cuda_impl *c, int i, int rows, int out, int in, const float *dz,
                     const float *x, float *dw, float *dbias, mgpu_err_t *err);
int cuda_linear_loss(void *impl, const mgpu_k_head_t *h, mgpu_err_t *err);

/* schedule.cu: the side streams (the step's all-reduce stream and graph: kernels_cuda.h) */
int side_fork(cuda_impl *c, int *i, mgpu_err_t *err);
int side_queued(cuda_impl *c, int i, mgpu_err_t *err);
int cuda_linear_backward_weight(void *impl, int rows, int out, int in, const float *dz,
                                const float *x, float *dw, float *dbias, mgpu_err_t *err);
int cuda_written(void *impl, const void *p, size_t bytes, mgpu_err_t *err);
int cuda_join(void *impl, mgpu_err_t *err);

/* kernels_cuda.cu: the backend's memory and copies */
int cuda_copy(void *impl, void *dst, const void *src, size_t bytes, mgpu_err_t *err);
int cuda_zero(void *impl, void *dst, size_t bytes, mgpu_err_t *err);

/* --- helpers of every family --------------------------------------------------------------- */

inline bool is_aligned16(const void *p)
{
    return ((uintptr_t)p & 15u) == 0;
}

template <class... P> bool aligned16(P... p)
{
    return (is_aligned16(p) && ...);
}

/* Blocks of kThreads for `work` items, at most per_sm blocks per multiprocessor (the kernels
 * loop over the rest), at least one. */
inline unsigned grid_for(const cuda_impl *c, size_t work, int per_sm)
{
    size_t blocks = (work + kThreads - 1) / kThreads;
    size_t cap = (size_t)c->sms * per_sm;
    if (blocks > cap)
        blocks = cap;
    return blocks ? (unsigned)blocks : 1u;
}

__device__ __forceinline__ float4 ld4(const float *p, size_t i)
{
    return reinterpret_cast<const float4 *>(p)[i];
}

__device__ __forceinline__ void st4(float *p, size_t i, float4 v)
{
    reinterpret_cast<float4 *>(p)[i] = v;
}

template <class T> __device__ __forceinline__ T warp_sum(T v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32); every thread gets it. The leading
 * barrier lets a kernel call it more than once. */
template <class T> __device__ T block_sum(T v)
{
    __shared__ T part[32];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    v = warp_sum(v);
    if (lane == 0)
        part[w] = v;
    __syncthreads();
    v = lane < nw ? part[lane] : T(0);
    return warp_sum(v);
}

/* A block's share of a reduction, called by every thread of the block with the block's sum
 * in v (thread 0's counts): the result itself when the grid is one block; else a partial in
 * part[blockIdx.x], and the block that finishes last (the counter in the scratch's last word,
 * zero between reductions) adds the partials in double and writes *out = scale * sum. That
 * saves each reduction a second launch; reductions run one at a time on the backend's
 * stream, so one counter serves them all. */
__device__ __forceinline__ void block_result(float v, float *part, float *out, double scale)
{
    __shared__ bool last;
    if (gridDim.x == 1) {
        if (threadIdx.x == 0)
            *out = (float)((double)v * scale);
        return;
    }
    unsigned *done = reinterpret_cast<unsigned *>(part + kScratchFloats - 1);
    if (threadIdx.x == 0) {
        part[blockIdx.x] = v;
        __threadfence(); /* the partial is visible before the count says so */
        last = atomicAdd(done, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last)
        return;
    __threadfence();
    double s = 0.0;
    for (unsigned i = threadIdx.x; i < gridDim.x; i += blockDim.x)
        s += __ldcg(part + i);
    s = block_sum(s);
    if (threadIdx.x == 0) {
        *out = (float)(s * scale);
        *done = 0;
    }
}

/* f.vec(i) handles floats 4i..4i+3, f.one(i) float i. With VEC the float4 part runs first and
 * the n % 4 tail after it, in the same launch. */
template <class F, bool VEC> __global__ void __launch_bounds__(kThreads) ew_kernel(F f, size_t n)
{
    size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t head = 0;
    if (VEC) {
        size_t n4 = n / 4;
        for (size_t i = tid; i < n4; i += stride)
            f.vec(i);
        head = n4 * 4;
    }
    for (size_t i = head + tid; i < n; i += stride)
        f.one(i);
}

template <class F>
int launch_ew(cuda_impl *c, const F &f, size_t n, bool vec, const char *op, mgpu_err_t *err)
{
    unsigned blocks = grid_for(c, vec ? (n + 3) / 4 : n, kEwBlocksPerSm);
    if (vec)
        ew_kernel<F, true><<<blocks, kThreads, 0, c->stream>>>(f, n);
    else
        ew_kernel<F, false><<<blocks, kThreads, 0, c->stream>>>(f, n);
    CUDA_CHECK_LAUNCH(err, "%s (n=%zu, %u blocks)", op, n, blocks);
    return 0;
}

#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_C 0.044715f

__device__ __forceinline__ float sigmoid_f(float x)
{
    /* Never exponentiates a large positive number, as the CPU reference. */
    if (x >= 0.0f)
        return 1.0f / (1.0f + expf(-x));
    float e = expf(x);
    return e / (1.0f + e);
}

template <int A> __device__ __forceinline__ float act_f(float x)
{
    if constexpr (A == MGPU_ACT_RELU)
        return x > 0.0f ? x : 0.0f;
    else if constexpr (A == MGPU_ACT_GELU)
        return 0.5f * x * (1.0f + tanhf(GELU_K * (x + GELU_C * x * x * x)));
    else if constexpr (A == MGPU_ACT_TANH)
        return tanhf(x);
    else if constexpr (A == MGPU_ACT_SIGMOID)
        return sigmoid_f(x);
    else
        return x;
}

/* dz = dy * act'(z), from z (gelu) or y = act(z) (the others). */
template <int A> __device__ __forceinline__ float act_b(float z, float y, float dy)
{
    if constexpr (A == MGPU_ACT_RELU) {
        return y > 0.0f ? dy : 0.0f;
    } else if constexpr (A == MGPU_ACT_GELU) {
        float u = GELU_K * (z + GELU_C * z * z * z);
        float t = tanhf(u);
        return dy * (0.5f * (1.0f + t) +
                     0.5f * z * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * GELU_C * z * z));
    } else if constexpr (A == MGPU_ACT_TANH) {
        return dy * (1.0f - y * y);
    } else if constexpr (A == MGPU_ACT_SIGMOID) {
        return dy * (y * (1.0f - y));
    } else {
        return dy;
    }
}

template <int A> __device__ __forceinline__ float4 act4(float4 v)
{
    return make_float4(act_f<A>(v.x), act_f<A>(v.y), act_f<A>(v.z), act_f<A>(v.w));
}

/* Runs fn(std::integral_constant<int, act>) so that each activation is its own kernel. */
template <class Fn> int with_act(mgpu_act_t act, Fn fn)
{
    switch (act) {
    case MGPU_ACT_RELU:
        return fn(std::integral_constant<int, MGPU_ACT_RELU>());
    case MGPU_ACT_GELU:
        return fn(std::integral_constant<int, MGPU_ACT_GELU>());
    case MGPU_ACT_TANH:
        return fn(std::integral_constant<int, MGPU_ACT_TANH>());
    case MGPU_ACT_SIGMOID:
        return fn(std::integral_constant<int, MGPU_ACT_SIGMOID>());
    default:
        return fn(std::integral_constant<int, MGPU_ACT_IDENTITY>());
    }
}

} /* namespace mgpu_cuda */

#endif
