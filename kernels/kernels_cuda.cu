/* kernels_cuda.cu - the CUDA backend of kernels.h: the same table as kernels_cpu.c, with device
 * memory, cuBLAS GEMMs and one kernel per op, all queued in order on one non-blocking stream
 * that the backend owns (mgpu_kernels_cuda_stream hands it to NCCL and to event timing).
 *
 * Arguments arrive checked by the launchers of kernels.c; the host functions here only size
 * grids, pick the vectorised variant where pointers allow it, and check each launch.
 *
 * Design choices, and why:
 * - Elementwise and optimizer kernels are one pass over memory with 16-byte (float4) loads and
 *   stores when every pointer they touch is 16-byte aligned (cudaMalloc's are; a sub-buffer at
 *   an odd offset falls back to scalar accesses), in a grid-stride loop capped at 64 blocks of
 *   256 threads per multiprocessor: one element group per thread for all but huge tensors.
 * - Reductions (sum, MSE, cross-entropy's mean, count_correct, sum_rows) are deterministic:
 *   each block writes one partial to a scratch buffer and one more block adds the partials in
 *   double, in a fixed order. No atomics, so a rerun gives the same bits, which the DDP tests
 *   (every rank must compute the same loss) rely on. A launch of one block writes the result
 *   directly, which saves the second launch on the small models that are launch-bound.
 * - Scalar results stay in device memory; nothing here synchronises but copy_to_host and sync.
 * - softmax cross-entropy keeps each row in registers between its three steps (max, sum of
 *   exponentials, gradient), so logits are read once and the gradient written once: a warp per
 *   row up to 1024 columns (several rows per warp when they are short, so that enough loads
 *   are in flight), a block per row up to 8192; wider rows take an online max-and-sum pass and
 *   a gradient pass (two reads). An out-of-range label cannot be reported from the device
 *   without a sync, so that row's loss and gradient become NaN: loud, never silently wrong.
 * - GEMM: row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, so cuBLAS gets the
 *   operands swapped (B first, then A, n before m) and no data is transposed. fp32 uses
 *   CUBLAS_COMPUTE_32F, tf32 CUBLAS_COMPUTE_32F_FAST_TF32. bf16 mode converts both operands
 *   to bf16 copies in a workspace (round to nearest even) and multiplies them with fp32
 *   accumulation and an fp32 C: the master weights, the activations the backward reads and C
 *   all stay fp32, only the products see bf16. We convert explicitly rather than ask cuBLAS
 *   for CUBLAS_COMPUTE_32F_FAST_16BF on fp32 operands because the bf16 copies are then plain
 *   bf16 GEMM inputs - the operand type cuBLAS's fastest Hopper kernels are built for - and
 *   the conversion (6 bytes per element, ~0.1 ms for two 8192x8192 operands at 4 TB/s) is a
 *   few percent of the product; tests/helper/kernels_bench.c times both to keep this honest.
 *   cuBLAS gets a 32 MiB workspace of our own (what NVIDIA recommends for Hopper) so it never
 *   allocates inside a step, which also keeps the stream capturable in a CUDA graph.
 * - A bf16 GEMM (or a tf32 one with A transposed) larger than any before it grows the operand
 *   workspace (a synchronising cudaFree/cudaMalloc): warm up with the largest shapes before
 *   capturing a graph.
 * - Launch-bound steps are chains of dependent kernels, so the ops that end a step's chain
 *   early are fused where cuBLAS leaves a gap: a narrow output layer (linear_loss) is one
 *   warp-per-row kernel (product, loss, gradient, input gradient), and its weight gradient
 *   another (narrow_dw_kernel) on a side stream. Small weight gradients run on side streams
 *   taken in turn, beside what the model queues after them until its next join: the input
 *   gradient of their layer, or, where the model queues that first (the layer whose join it
 *   skips), the first layer's weight gradient. The hidden layers'
 * products of a launch-bound step are small_gemm.cu's where that measured faster on the H200
 * (tests/bench/GPU_TRAIN_RESULTS.md, sessions 4 and 6): in fp32 the forward and the input
 * gradient (one kernel each, the epilogue inside, where cuBLAS's fp32 kernels take a split-K
 * reduction or an epilogue kernel more) and the weight gradients, all of a step's in one launch
 * at the join (wg_queue, wg_flush); in tf32 the input gradient only (cuBLAS's tensor-core
 * forward and weight gradients are faster).
 * MGPU_SG_FP32 and MGPU_SG_TF32 (bit masks of mgpu_sg::Op) override that choice, MGPU_SG_SPLIT=n
 * its K split, MGPU_SMALL_GEMM=0 turns it off. */
#include "kernels_cuda.h" /* mgpu_kernels_cuda_ops, kernels.h */

#include "cuda_check.h" /* CUDA_CHECK, CUDA_CHECK_LAUNCH, CUBLAS_CHECK */
#include "small_gemm.h" /* mgpu_sg: launch-bound fp32 products with their epilogues */

#include <cublasLt.h>           /* cublasLtMatmul: the fused linear-layer ops' epilogues */
#include <cublas_v2.h>          /* cublasGemmEx */
#include <cuda_bf16.h>          /* __nv_bfloat16, __floats2bfloat162_rn */
#include <cooperative_groups.h> /* this_cluster, map_shared_rank: xent_cluster_kernel */
#include <cuda_runtime.h>       /* streams, cudaMalloc, <<<>>> */

#include <dlfcn.h>     /* dlopen: cuBLAS is opened, not linked */
#include <errno.h>     /* ENOMEM */
#include <math.h>      /* INFINITY, NAN */
#include <stdint.h>    /* uintptr_t */
#include <stdio.h>     /* fprintf: MGPU_LT_VERBOSE */
#include <stdlib.h>    /* calloc, free */
#include <mutex>       /* std::call_once */
#include <type_traits> /* std::integral_constant */

namespace cg = cooperative_groups;

namespace
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
blas_api B;
char blas_why[512]; /* why loading failed; empty once it worked */

#define MGPU_STR_(x) #x
#define MGPU_STR(x) MGPU_STR_(x)

void blas_open()
{
    const char *libs[] = {"libcublasLt.so." MGPU_STR(CUBLAS_VER_MAJOR),
                          "libcublas.so." MGPU_STR(CUBLAS_VER_MAJOR)};
    void *h[2];
    for (int i = 0; i < 2; i++)
        if ((h[i] = dlopen(libs[i], RTLD_NOW | RTLD_LOCAL)) == NULL) {
            snprintf(blas_why, sizeof blas_why,
                     "cannot open %s (cuBLAS %d, which this build needs): %s", libs[i],
                     CUBLAS_VER_MAJOR, dlerror());
            return;
        }
        /* MGPU_STR expands the API's macros first: the symbol of cublasCreate is cublasCreate_v2.
         */
#define MGPU_BLAS_SYM(lib, name)                                                                   \
    if ((B.p_##name = (decltype(B.p_##name))dlsym(h[lib], MGPU_STR(name))) == NULL) {              \
        snprintf(blas_why, sizeof blas_why, "%s has no %s", libs[lib], MGPU_STR(name));            \
        return;                                                                                    \
    }
    MGPU_BLAS_SYM(1, cublasCreate)
    MGPU_BLAS_SYM(1, cublasDestroy)
    MGPU_BLAS_SYM(1, cublasSetStream)
    MGPU_BLAS_SYM(1, cublasSetMathMode)
    MGPU_BLAS_SYM(1, cublasSetWorkspace)
    MGPU_BLAS_SYM(1, cublasGemmEx)
    MGPU_BLAS_SYM(1, cublasGetStatusName)
    MGPU_BLAS_SYM(1, cublasGetStatusString)
    MGPU_BLAS_SYM(0, cublasLtCreate)
    MGPU_BLAS_SYM(0, cublasLtDestroy)
    MGPU_BLAS_SYM(0, cublasLtMatmul)
    MGPU_BLAS_SYM(0, cublasLtMatmulAlgoGetHeuristic)
    MGPU_BLAS_SYM(0, cublasLtMatmulDescCreate)
    MGPU_BLAS_SYM(0, cublasLtMatmulDescDestroy)
    MGPU_BLAS_SYM(0, cublasLtMatmulDescSetAttribute)
    MGPU_BLAS_SYM(0, cublasLtMatmulPreferenceCreate)
    MGPU_BLAS_SYM(0, cublasLtMatmulPreferenceDestroy)
    MGPU_BLAS_SYM(0, cublasLtMatmulPreferenceSetAttribute)
    MGPU_BLAS_SYM(0, cublasLtMatrixLayoutCreate)
    MGPU_BLAS_SYM(0, cublasLtMatrixLayoutDestroy)
#undef MGPU_BLAS_SYM
    blas_why[0] = '\0';
}

/* Opens cuBLAS once per process (the handles stay open: cuBLAS never unloads cleanly). */
int blas_load(mgpu_err_t *err)
{
    static std::once_flag once;
    std::call_once(once, [] {
        snprintf(blas_why, sizeof blas_why, "not loaded");
        blas_open();
    });
    if (blas_why[0] != '\0')
        return mgpu_err_set(err, MGPU_E_DEVICE, "kernels(cuda): %s", blas_why);
    return 0;
}

constexpr int kThreads = 256;                /* every kernel's block size */
constexpr int kEwBlocksPerSm = 64;           /* grid cap of elementwise kernels */
constexpr int kRedBlocksPerSm = 8;           /* grid cap of reductions: one full wave */
constexpr size_t kScratchFloats = 1u << 20;  /* 4 MiB of partial sums */
constexpr size_t kBlasWorkspace = 32u << 20; /* cuBLAS's recommendation for Hopper */
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
    bool ok;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulAlgo_t algo;
    cublasLtMatmulAlgo_t cand[kLtCand];
    int n_cand;
    bool tuned;
};
constexpr int kLtPlans = 64;              /* configurations cached; more are declined */
constexpr size_t kOwnDreluMin = 1u << 20; /* bf16: dx elements from which the input gradient's
                                             ReLU backward is this file's own pass */
constexpr int kLtAux = 64; /* aux masks a fused forward wrote, that backward may read */
constexpr size_t kSgPartFloats = 1u << 20; /* small_gemm.cu's bias partials */
constexpr int kSgCounters = 4096;

struct cuda_impl {
    int device;
    int sms;
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
    bool lt_off, lt_verbose; /* MGPU_CUDA_LT=0: compose every fused op; MGPU_LT_VERBOSE=1 */
    int lt_epi; /* MGPU_LT_EPI: 1 forward, 2 input gradient, 4 weight gradient (default 7) */
    lt_plan plans[kLtPlans];
    int n_plans;
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
    bool mir_valid, shadow_off; /* MGPU_BF16_SHADOW=0: convert every operand every time */
    /* A small weight-gradient product runs on a side stream, forked from `stream` (ev_fork)
     * so that it overlaps the input-gradient product of the same layer, and the next layer's
     * when the model defers the join (the fused output layer); cuda_join waits for the `done`
     * event of each pending one. Four of them, taken in turn (a step's output layer, the
     * layer below with its bias gradient, and the first layer all run beside each other),
     * each with its own cuBLASLt workspace and narrow_dw_kernel's partial sums and counters. */
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
    bool tune_off;                     /* MGPU_LT_TUNE=0: the heuristic's first */
    bool head_off;                     /* MGPU_CUDA_HEAD=0: linear_loss is composed */
    bool sg_off;                       /* MGPU_SMALL_GEMM=0: no small_gemm.cu products */
    int sg_ops_fp32, sg_ops_tf32;      /* which (1 << mgpu_sg::Op) it runs, per precision */
    int sg_forced;                     /* MGPU_SG_SPLIT: its K split, where that fits */
    float *sg_part;                    /* its input gradient's bias partials (kSgPartFloats) */
    unsigned *sg_count;                /* and their counters (kSgCounters, zero between) */
    long long sg_launches;             /* mgpu_kernels_cuda_small_gemms */
};

/* Something wrote [p, p + bytes): copies of it are stale. */
void invalidate(cuda_impl *c, const void *p, size_t bytes)
{
    const char *a = (const char *)p, *b = a + bytes;
    for (int i = 0; i < c->n_shadows; i++) {
        const char *s0 = (const char *)c->shadows[i].src, *s1 = s0 + c->shadows[i].bytes;
        if (a < s1 && s0 < b)
            c->shadows[i].fresh = false;
    }
    if (c->mir != nullptr) {
        const char *m0 = (const char *)c->mir_src, *m1 = m0 + c->mir_n * sizeof(float);
        if (a < m1 && m0 < b)
            c->mir_valid = false;
    }
}

/* --- small helpers --------------------------------------------------------------------------- */

bool is_aligned16(const void *p)
{
    return ((uintptr_t)p & 15u) == 0;
}

template <class... P> bool aligned16(P... p)
{
    return (is_aligned16(p) && ...);
}

/* Blocks of kThreads for `work` items, at most per_sm blocks per multiprocessor (the kernels
 * loop over the rest), at least one. */
unsigned grid_for(const cuda_impl *c, size_t work, int per_sm)
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

__device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
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

__device__ float block_max(float v)
{
    __shared__ float part[32];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    v = warp_max(v);
    if (lane == 0)
        part[w] = v;
    __syncthreads();
    v = lane < nw ? part[lane] : -INFINITY;
    return warp_max(v);
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

/* --- elementwise skeleton ------------------------------------------------------------------ */

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

/* The same skeleton for sums: each thread adds what f returns, then the block reduces. */
template <class F, bool VEC>
__global__ void __launch_bounds__(kThreads)
    reduce_kernel(F f, size_t n, float *part, float *out, double scale)
{
    size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t head = 0;
    float acc = 0.0f;
    if (VEC) {
        size_t n4 = n / 4;
        for (size_t i = tid; i < n4; i += stride)
            acc += f.vec(i);
        head = n4 * 4;
    }
    for (size_t i = head + tid; i < n; i += stride)
        acc += f.one(i);
    acc = block_sum(acc);
    block_result(acc, part, out, scale);
}

template <class F>
int launch_reduce(cuda_impl *c, const F &f, size_t n, bool vec, double scale, float *out,
                  const char *op, mgpu_err_t *err)
{
    unsigned blocks = grid_for(c, vec ? (n + 3) / 4 : n, kRedBlocksPerSm);
    if (vec)
        reduce_kernel<F, true><<<blocks, kThreads, 0, c->stream>>>(f, n, c->scratch, out, scale);
    else
        reduce_kernel<F, false><<<blocks, kThreads, 0, c->stream>>>(f, n, c->scratch, out, scale);
    CUDA_CHECK_LAUNCH(err, "%s (n=%zu, %u blocks)", op, n, blocks);
    return 0; /* the last block wrote the result (block_result) */
}

/* --- activations: the formulas of kernels_cpu.c -------------------------------------------- */

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

template <int A> struct ActFwd {
    const float *x;
    float *y;
    __device__ void vec(size_t i) const
    {
        st4(y, i, act4<A>(ld4(x, i)));
    }
    __device__ void one(size_t i) const
    {
        y[i] = act_f<A>(x[i]);
    }
};

/* z[r, c] += bias[c] (when bias), y = act(z); z is stored back only when bias changed it. */
template <int A> struct BiasAct {
    float *z;
    const float *bias;
    float *y;
    size_t cols;
    __device__ void vec(size_t i) const
    {
        float4 v = ld4(z, i);
        if (bias != nullptr) {
            float4 b = ld4(bias, i % (cols / 4));
            v.x += b.x;
            v.y += b.y;
            v.z += b.z;
            v.w += b.w;
            st4(z, i, v);
        }
        if (A != MGPU_ACT_IDENTITY || y != z)
            st4(y, i, act4<A>(v));
    }
    __device__ void one(size_t i) const
    {
        float v = z[i];
        if (bias != nullptr) {
            v += bias[i % cols];
            z[i] = v;
        }
        if (A != MGPU_ACT_IDENTITY || y != z)
            y[i] = act_f<A>(v);
    }
};

/* Reads only what the activation's derivative needs: z for gelu, y for the others. */
template <int A> struct ActBwd {
    const float *z, *y, *dy;
    float *dz;
    static constexpr bool kNeedZ = A == MGPU_ACT_GELU;
    __device__ void vec(size_t i) const
    {
        float4 d = ld4(dy, i);
        float4 s = kNeedZ ? ld4(z, i) : ld4(y, i);
        float4 r;
        r.x = kNeedZ ? act_b<A>(s.x, 0.0f, d.x) : act_b<A>(0.0f, s.x, d.x);
        r.y = kNeedZ ? act_b<A>(s.y, 0.0f, d.y) : act_b<A>(0.0f, s.y, d.y);
        r.z = kNeedZ ? act_b<A>(s.z, 0.0f, d.z) : act_b<A>(0.0f, s.z, d.z);
        r.w = kNeedZ ? act_b<A>(s.w, 0.0f, d.w) : act_b<A>(0.0f, s.w, d.w);
        st4(dz, i, r);
    }
    __device__ void one(size_t i) const
    {
        dz[i] = kNeedZ ? act_b<A>(z[i], 0.0f, dy[i]) : act_b<A>(0.0f, y[i], dy[i]);
    }
};

struct Scale {
    float *x;
    float alpha;
    __device__ void vec(size_t i) const
    {
        float4 v = ld4(x, i);
        st4(x, i, make_float4(v.x * alpha, v.y * alpha, v.z * alpha, v.w * alpha));
    }
    __device__ void one(size_t i) const
    {
        x[i] *= alpha;
    }
};

struct Sum {
    const float *x;
    __device__ float vec(size_t i) const
    {
        float4 v = ld4(x, i);
        return (v.x + v.y) + (v.z + v.w);
    }
    __device__ float one(size_t i) const
    {
        return x[i];
    }
};

/* Returns (pred - target)^2 and writes dpred = g (pred - target) when dpred is set. */
struct Mse {
    const float *pred, *target;
    float *dpred;
    float g;
    __device__ float vec(size_t i) const
    {
        float4 p = ld4(pred, i), t = ld4(target, i);
        float4 d = make_float4(p.x - t.x, p.y - t.y, p.z - t.z, p.w - t.w);
        if (dpred != nullptr)
            st4(dpred, i, make_float4(g * d.x, g * d.y, g * d.z, g * d.w));
        return (d.x * d.x + d.y * d.y) + (d.z * d.z + d.w * d.w);
    }
    __device__ float one(size_t i) const
    {
        float d = pred[i] - target[i];
        if (dpred != nullptr)
            dpred[i] = g * d;
        return d * d;
    }
};

/* --- optimizers: torch.optim.SGD / AdamW, as kernels_cpu.c -------------------------------- */

/* The flags are uniform across the grid, so their branches cost nothing per element. */
struct Sgd {
    float *p;
    const float *g;
    float *buf;
    __nv_bfloat16 *p16; /* bf16 mode: the bf16 copy of p the GEMMs read, written in the same pass */
    float lr, mom, damp, wd; /* damp = 1 - dampening */
    bool has_mom, first, nesterov;
    __device__ __forceinline__ void upd(float &pi, float gi, float &bi) const
    {
        float d = gi + wd * pi;
        if (!has_mom) {
            pi -= lr * d;
            return;
        }
        /* The first step clones d into the buffer, undamped; the old buffer is not read. */
        float b = first ? d : mom * bi + damp * d;
        bi = b;
        pi -= lr * (nesterov ? d + mom * b : b);
    }
    __device__ void vec(size_t i) const
    {
        float4 pv = ld4(p, i), gv = ld4(g, i), bv = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (has_mom && !first)
            bv = ld4(buf, i);
        upd(pv.x, gv.x, bv.x);
        upd(pv.y, gv.y, bv.y);
        upd(pv.z, gv.z, bv.z);
        upd(pv.w, gv.w, bv.w);
        st4(p, i, pv);
        if (has_mom)
            st4(buf, i, bv);
        if (p16 != nullptr) {
            __nv_bfloat162 lo = __floats2bfloat162_rn(pv.x, pv.y),
                           hi = __floats2bfloat162_rn(pv.z, pv.w);
            uint2 o;
            o.x = *reinterpret_cast<const unsigned int *>(&lo);
            o.y = *reinterpret_cast<const unsigned int *>(&hi);
            reinterpret_cast<uint2 *>(p16)[i] = o;
        }
    }
    __device__ void one(size_t i) const
    {
        float pi = p[i], bi = has_mom && !first ? buf[i] : 0.0f;
        upd(pi, g[i], bi);
        p[i] = pi;
        if (has_mom)
            buf[i] = bi;
        if (p16 != nullptr)
            p16[i] = __float2bfloat16_rn(pi);
    }
};

/* The step's state in device memory: the step number and the two factors that depend on it,
 * so that a CUDA graph's replays advance it (adamw_prep_kernel). */
struct AdamState {
    long long step;
    float step_size, bc2_sqrt;
};

/* step > 0: this is update `step` (an eager call). step == 0: the next one after the stored
 * step (a graph replay). The factors in double, as the CPU reference computes them. */
__global__ void adamw_prep_kernel(AdamState *st, long long step, double beta1, double beta2,
                                  double lr)
{
    long long s = step > 0 ? step : st->step + 1;
    st->step = s;
    st->step_size = (float)(lr / (1.0 - pow(beta1, (double)s)));
    st->bc2_sqrt = (float)sqrt(1.0 - pow(beta2, (double)s));
}

struct AdamW {
    float *p;
    const float *g;
    float *m, *v;
    float b1, b2, eps, decay;
    const AdamState *st;
    __device__ __forceinline__ void upd(float &pi, float gi, float &mi, float &vi) const
    {
        const float step_size = st->step_size, bc2_sqrt = st->bc2_sqrt;
        mi = mi + (1.0f - b1) * (gi - mi); /* m.lerp_(g, 1 - b1) */
        vi = b2 * vi + (1.0f - b2) * gi * gi;
        pi = pi * decay - step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
    }
    __device__ void vec(size_t i) const
    {
        float4 pv = ld4(p, i), gv = ld4(g, i), mv = ld4(m, i), vv = ld4(v, i);
        upd(pv.x, gv.x, mv.x, vv.x);
        upd(pv.y, gv.y, mv.y, vv.y);
        upd(pv.z, gv.z, mv.z, vv.z);
        upd(pv.w, gv.w, mv.w, vv.w);
        st4(p, i, pv);
        st4(m, i, mv);
        st4(v, i, vv);
    }
    __device__ void one(size_t i) const
    {
        float pi = p[i], mi = m[i], vi = v[i];
        upd(pi, g[i], mi, vi);
        p[i] = pi;
        m[i] = mi;
        v[i] = vi;
    }
};

/* --- row kernels ------------------------------------------------------------------------------ */

/* GEMM with k == 0 or alpha == 0: C = beta C, and beta == 0 writes zeros without reading. */
__global__ void __launch_bounds__(kThreads)
    scale_matrix_kernel(int m, int n, float beta, float *c, int ldc)
{
    size_t total = (size_t)m * n, stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        float *p = c + (i / n) * ldc + i % n;
        *p = beta == 0.0f ? 0.0f : beta * *p;
    }
}

/* Packed bf16 copy of a contiguous fp32 matrix (lds == ldd == cols): a flat float4 -> 4 x bf16
 * stream, 16 bytes in and 8 out per thread, no index arithmetic. */
__global__ void __launch_bounds__(kThreads)
    to_bf16_flat_kernel(size_t n4, const float4 *src, uint2 *dst)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 v = src[i];
        __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
        uint2 o;
        o.x = *reinterpret_cast<const unsigned int *>(&lo);
        o.y = *reinterpret_cast<const unsigned int *>(&hi);
        dst[i] = o;
    }
}

/* Packed bf16 copy of a strided matrix: dst[r * ldd + c] = src[r * lds + c]. Rows along
 * blockIdx.y, columns along x (VEC: four at a time), so no division per element. */
template <bool VEC>
__global__ void __launch_bounds__(kThreads)
    to_bf16_kernel(int rows, int cols, const float *src, int lds, __nv_bfloat16 *dst, int ldd)
{
    int per = VEC ? 4 : 1, groups = cols / per;
    for (int r = blockIdx.y; r < rows; r += gridDim.y) {
        const float *s = src + (size_t)r * lds;
        __nv_bfloat16 *d = dst + (size_t)r * ldd;
        for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < groups;
             i += gridDim.x * blockDim.x) {
            if (VEC) {
                float4 v = *reinterpret_cast<const float4 *>(s + 4 * i);
                __nv_bfloat162 *d2 = reinterpret_cast<__nv_bfloat162 *>(d + 4 * i);
                d2[0] = __floats2bfloat162_rn(v.x, v.y);
                d2[1] = __floats2bfloat162_rn(v.z, v.w);
            } else {
                d[i] = __float2bfloat16_rn(s[i]);
            }
        }
    }
}

/* dst[c * ldd + r] = src[r * lds + c] for a rows x cols matrix, through 32 x 32 tiles of
 * shared memory (padded by one column against bank conflicts) so that both the reads and the
 * writes are coalesced. Block 32 x 8. */
__global__ void __launch_bounds__(kThreads)
    transpose_kernel(int rows, int cols, const float *src, int lds, float *dst, int ldd)
{
    __shared__ float tile[32][33];
    int tiles_y = (rows + 31) / 32;
    for (int ty = blockIdx.y; ty < tiles_y; ty += gridDim.y) {
        int r0 = ty * 32, c0 = blockIdx.x * 32;
        for (int j = threadIdx.y; j < 32; j += 8) {
            int r = r0 + j, c = c0 + threadIdx.x;
            if (r < rows && c < cols)
                tile[j][threadIdx.x] = src[(size_t)r * lds + c];
        }
        __syncthreads();
        for (int j = threadIdx.y; j < 32; j += 8) {
            int c = c0 + j, r = r0 + threadIdx.x;
            if (r < rows && c < cols)
                dst[(size_t)c * ldd + r] = tile[threadIdx.x][j];
        }
        __syncthreads();
    }
}

/* The same through 64 x 64 tiles, 16-byte loads and stores: src's rows (lds) and dst's
 * (ldd) start 16-byte aligned, rows a multiple of 4. A thread moves 16 floats a tile, four
 * 16-byte loads in flight (the 32 x 32 kernel: four 4-byte ones, 78% of the copy bandwidth
 * for 8192^2 on the H200). src's columns past a multiple of 4 are read one at a time. */
__global__ void __launch_bounds__(kThreads)
    transpose4_kernel(int rows, int cols, const float *src, int lds, float *dst, int ldd)
{
    __shared__ float tile[64][65];
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const int tiles_y = (rows + 63) / 64;
    for (int by = blockIdx.y; by < tiles_y; by += gridDim.y) {
        const int r0 = by * 64, c0 = blockIdx.x * 64;
#pragma unroll
        for (int p = 0; p < 4; p++) {
            const int r = r0 + ty + 16 * p, c = c0 + 4 * tx;
            float4 q = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (r < rows) {
                const float *sp = src + (size_t)r * lds + c;
                if (c + 3 < cols)
                    q = *reinterpret_cast<const float4 *>(sp);
                else {
                    q.x = c < cols ? sp[0] : 0.0f;
                    q.y = c + 1 < cols ? sp[1] : 0.0f;
                    q.z = c + 2 < cols ? sp[2] : 0.0f;
                }
            }
            float *t = &tile[ty + 16 * p][4 * tx];
            t[0] = q.x, t[1] = q.y, t[2] = q.z, t[3] = q.w;
        }
        __syncthreads();
#pragma unroll
        for (int p = 0; p < 4; p++) {
            const int c = c0 + ty + 16 * p, r = r0 + 4 * tx;
            if (c < cols && r < rows) {
                const int k = ty + 16 * p;
                float4 o = make_float4(tile[4 * tx][k], tile[4 * tx + 1][k], tile[4 * tx + 2][k],
                                       tile[4 * tx + 3][k]);
                *reinterpret_cast<float4 *>(dst + (size_t)c * ldd + r) = o;
            }
        }
        __syncthreads();
    }
}

/* Column sums of x[rows, cols] over the rows [y * rps, (y + 1) * rps) of this block's split:
 * a block covers 32 columns with 8 row lanes (a warp reads 128 contiguous bytes of a row).
 * direct: one split, so out = beta out + sum; else part[split * cols + col]. */
__global__ void __launch_bounds__(kThreads)
    sum_rows_kernel(int rows, int cols, const float *x, int rps, float *part, float beta,
                    float *out, int direct)
{
    __shared__ float acc[8][33];
    int col = blockIdx.x * 32 + threadIdx.x;
    int r0 = blockIdx.y * rps, r1 = min(rows, r0 + rps);
    float s = 0.0f;
    if (col < cols)
        for (int r = r0 + (int)threadIdx.y; r < r1; r += 8)
            s += x[(size_t)r * cols + col];
    acc[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && col < cols) {
        for (int j = 1; j < 8; j++)
            s += acc[j][threadIdx.x];
        if (direct)
            out[col] = (beta == 0.0f ? 0.0f : beta * out[col]) + s;
        else
            part[(size_t)blockIdx.y * cols + col] = s;
    }
}

__global__ void __launch_bounds__(kThreads)
    sum_rows_finish_kernel(int cols, int splits, const float *part, float beta, float *out)
{
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= cols)
        return;
    double s = beta == 0.0f ? 0.0 : (double)beta * out[col];
    for (int j = 0; j < splits; j++)
        s += part[(size_t)j * cols + col];
    out[col] = (float)s;
}

/* bf16 mode's ReLU backward after the input-gradient GEMM, in one pass (cols % 4 == 0): dx =
 * dx * (y > 0) in place, its bf16 copy into d16 (row stride ld16; may be NULL) for the two
 * GEMMs that read it next, and the column sums (the bias gradient of the layer below; out
 * may be NULL) as partials per split of rows, like sum_rows_kernel's. Four columns a thread
 * (a block: 128 columns, 8 row lanes); the mask from y or, with Y16, from y's bf16 copy (y16,
 * row stride ldy16: the same signs). */
template <bool Y16>
__global__ void __launch_bounds__(kThreads)
    drelu_bgrad4_kernel(int rows, int cols, float *dx, const float *y, const __nv_bfloat16 *y16,
                        int ldy16, __nv_bfloat16 *d16, int ld16, int rps, float *part, float *out,
                        int direct)
{
    __shared__ float4 acc[8][32];
    int col = (blockIdx.x * 32 + threadIdx.x) * 4;
    int r0 = blockIdx.y * rps, r1 = min(rows, r0 + rps);
    float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (col < cols)
        for (int r = r0 + (int)threadIdx.y; r < r1; r += 8) {
            float4 *px = reinterpret_cast<float4 *>(dx + (size_t)r * cols + col);
            float4 v = *px;
            float m0, m1, m2, m3;
            if (Y16) {
                uint2 raw = *reinterpret_cast<const uint2 *>(y16 + (size_t)r * ldy16 + col);
                float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&raw.x));
                float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&raw.y));
                m0 = a.x, m1 = a.y, m2 = b.x, m3 = b.y;
            } else {
                float4 yy = *reinterpret_cast<const float4 *>(y + (size_t)r * cols + col);
                m0 = yy.x, m1 = yy.y, m2 = yy.z, m3 = yy.w;
            }
            v.x = m0 > 0.0f ? v.x : 0.0f;
            v.y = m1 > 0.0f ? v.y : 0.0f;
            v.z = m2 > 0.0f ? v.z : 0.0f;
            v.w = m3 > 0.0f ? v.w : 0.0f;
            *px = v;
            if (d16 != nullptr) {
                __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y),
                               hi = __floats2bfloat162_rn(v.z, v.w);
                uint2 o;
                o.x = *reinterpret_cast<unsigned *>(&lo);
                o.y = *reinterpret_cast<unsigned *>(&hi);
                *reinterpret_cast<uint2 *>(d16 + (size_t)r * ld16 + col) = o;
            }
            s.x += v.x, s.y += v.y, s.z += v.z, s.w += v.w;
        }
    if (out == nullptr)
        return;
    acc[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && col < cols) {
        for (int j = 1; j < 8; j++) {
            float4 t = acc[j][threadIdx.x];
            s.x += t.x, s.y += t.y, s.z += t.z, s.w += t.w;
        }
        float *o = direct ? out + col : part + (size_t)blockIdx.y * cols + col;
        o[0] = s.x, o[1] = s.y, o[2] = s.z, o[3] = s.w;
    }
}

/* The same on a gradient that is already bf16 (the input-gradient product wrote it so, into
 * d16 with row stride ld16): in place, eight columns a thread (a block: 256 columns), the mask
 * from y's bf16 copy (Y16) or from y; the column sums are of the bf16 values. */
template <bool Y16>
__global__ void __launch_bounds__(kThreads)
    drelu16_kernel(int rows, int cols, __nv_bfloat16 *d16, int ld16, const float *y,
                   const __nv_bfloat16 *y16, int ldy16, int rps, float *part, float *out,
                   int direct)
{
    __shared__ float acc[8][32][9];
    int col = (blockIdx.x * 32 + threadIdx.x) * 8;
    int r0 = blockIdx.y * rps, r1 = min(rows, r0 + rps);
    float s[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    if (col < cols)
        for (int r = r0 + (int)threadIdx.y; r < r1; r += 8) {
            uint4 *pd = reinterpret_cast<uint4 *>(d16 + (size_t)r * ld16 + col);
            uint4 raw = *pd;
            __nv_bfloat162 *h = reinterpret_cast<__nv_bfloat162 *>(&raw);
            float m[8];
            if (Y16) {
                uint4 yr = *reinterpret_cast<const uint4 *>(y16 + (size_t)r * ldy16 + col);
                const __nv_bfloat162 *yh = reinterpret_cast<const __nv_bfloat162 *>(&yr);
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    float2 f = __bfloat1622float2(yh[j]);
                    m[2 * j] = f.x, m[2 * j + 1] = f.y;
                }
            } else {
                float4 a = *reinterpret_cast<const float4 *>(y + (size_t)r * cols + col);
                float4 b = *reinterpret_cast<const float4 *>(y + (size_t)r * cols + col + 4);
                m[0] = a.x, m[1] = a.y, m[2] = a.z, m[3] = a.w;
                m[4] = b.x, m[5] = b.y, m[6] = b.z, m[7] = b.w;
            }
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float2 v = __bfloat1622float2(h[j]);
                v.x = m[2 * j] > 0.0f ? v.x : 0.0f;
                v.y = m[2 * j + 1] > 0.0f ? v.y : 0.0f;
                s[2 * j] += v.x, s[2 * j + 1] += v.y;
                h[j] = __floats2bfloat162_rn(v.x, v.y);
            }
            *pd = raw;
        }
    if (out == nullptr)
        return;
#pragma unroll
    for (int j = 0; j < 8; j++)
        acc[threadIdx.y][threadIdx.x][j] = s[j];
    __syncthreads();
    if (threadIdx.y == 0 && col < cols) {
        for (int i = 1; i < 8; i++)
#pragma unroll
            for (int j = 0; j < 8; j++)
                s[j] += acc[i][threadIdx.x][j];
        float *o = direct ? out + col : part + (size_t)blockIdx.y * cols + col;
#pragma unroll
        for (int j = 0; j < 8; j++)
            o[j] = s[j];
    }
}

template <int G> __device__ __forceinline__ float group_max(float v)
{
    for (int o = G / 2; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

template <int G> __device__ __forceinline__ float group_sum(float v)
{
    for (int o = G / 2; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Softmax cross-entropy, G lanes per row (G = 32: a warp; short rows: 32 / G rows side by
 * side, so a warp's loads and shuffles serve several rows): each lane holds V values of a row
 * (columns g, g + G, ...), R rows at a time, so the row is read from memory once and R * V
 * loads per lane are in flight together, with the rows' labels. A warp takes 32 / G * R
 * consecutive rows an iteration. Nothing is read after the reductions: the lane holding the
 * label's logit adds that row's loss, and the gradient is exp(v - max) / sum, kept from the
 * sum. dlogits may alias logits (a lane writes only what it read itself). */
template <int G, int V, int R>
__global__ void __launch_bounds__(kThreads)
    xent_warp_kernel(int rows, int cols, const float *logits, const int32_t *labels, float *dlogits,
                     float inv_rows, float *part, float *out, double scale)
{
    constexpr int kPerWarp = 32 / G * R;
    const int lane = threadIdx.x & 31, g = lane & (G - 1), sub = lane / G;
    long warp = ((long)blockIdx.x * kThreads + threadIdx.x) >> 5;
    long nwarps = ((long)gridDim.x * kThreads) >> 5;
    float loss = 0.0f;
    for (long base = warp * kPerWarp; base < rows; base += nwarps * kPerWarp) {
        float v[R][V], mx[R], s[R], ly[R];
        int y[R];
#pragma unroll
        for (int i = 0; i < R; i++) {
            const long r = base + sub * R + i;
            y[i] = r < rows ? __ldg(labels + r) : 0;
            mx[i] = -INFINITY;
#pragma unroll
            for (int j = 0; j < V; j++) {
                const int c = g + G * j;
                /* (rows past the end: zeros, so that their unused sums stay finite) */
                v[i][j] = r >= rows ? 0.0f : c < cols ? logits[(size_t)r * cols + c] : -INFINITY;
                mx[i] = fmaxf(mx[i], v[i][j]);
            }
        }
#pragma unroll
        for (int i = 0; i < R; i++) {
            mx[i] = group_max<G>(mx[i]);
            s[i] = 0.0f;
            ly[i] = 0.0f;
#pragma unroll
            for (int j = 0; j < V; j++) {
                if (g + G * j == y[i])
                    ly[i] = v[i][j];
                v[i][j] = g + G * j < cols ? expf(v[i][j] - mx[i]) : 0.0f;
                s[i] += v[i][j];
            }
        }
#pragma unroll
        for (int i = 0; i < R; i++)
            s[i] = group_sum<G>(s[i]);
#pragma unroll
        for (int i = 0; i < R; i++) {
            const long r = base + sub * R + i;
            if (r >= rows)
                break;
            const float lse = mx[i] + logf(s[i]), gs = inv_rows / s[i];
            const bool ok = y[i] >= 0 && y[i] < cols;
            if (dlogits != nullptr) {
                float *d = dlogits + (size_t)r * cols;
#pragma unroll
                for (int j = 0; j < V; j++) {
                    const int c = g + G * j;
                    if (c < cols)
                        d[c] = ok ? v[i][j] * gs - (c == y[i] ? inv_rows : 0.0f) : NAN;
                }
            }
            if (!ok ? g == 0 : (y[i] & (G - 1)) == g)
                loss += ok ? lse - ly[i] : NAN;
        }
    }
    loss = block_sum(loss);
    block_result(loss, part, out, scale);
}

/* The same with a block per row and V values per thread (rows of up to kThreads * V); the
 * thread holding the label's logit adds the row's loss. */
template <int V>
__global__ void __launch_bounds__(kThreads)
    xent_block_kernel(int rows, int cols, const float *logits, const int32_t *labels,
                      float *dlogits, float inv_rows, float *part, float *out, double scale)
{
    int t = threadIdx.x;
    float loss = 0.0f;
    for (long r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *l = logits + (size_t)r * cols;
        const int y = __ldg(labels + r);
        float v[V], mx = -INFINITY, s = 0.0f, ly = 0.0f;
#pragma unroll
        for (int j = 0; j < V; j++) {
            int c = t + kThreads * j;
            v[j] = c < cols ? l[c] : -INFINITY;
            mx = fmaxf(mx, v[j]);
        }
        mx = block_max(mx);
#pragma unroll
        for (int j = 0; j < V; j++) {
            if (t + kThreads * j == y)
                ly = v[j];
            v[j] = t + kThreads * j < cols ? expf(v[j] - mx) : 0.0f;
            s += v[j];
        }
        s = block_sum(s);
        const float lse = mx + logf(s), g = inv_rows / s;
        const bool ok = y >= 0 && y < cols;
        if (dlogits != nullptr) {
            float *d = dlogits + (size_t)r * cols;
#pragma unroll
            for (int j = 0; j < V; j++) {
                int c = t + kThreads * j;
                if (c < cols)
                    d[c] = ok ? v[j] * g - (c == y ? inv_rows : 0.0f) : NAN;
            }
        }
        if (!ok ? t == 0 : y % kThreads == t)
            loss += ok ? lse - ly : NAN;
    }
    loss = block_sum(loss);
    block_result(loss, part, out, scale);
}

/* Hopper's transaction barriers in shared memory (PTX mbarrier), for xent_cluster_kernel: a
 * value stored into another block's shared memory with st.async counts its bytes on that
 * block's barrier, so the receiver waits for exactly those stores; a cluster barrier would
 * also wait for every global store the blocks made before it (their gradients). */
__device__ __forceinline__ unsigned smem_addr(const void *p)
{
    return (unsigned)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void mbar_init(uint64_t *bar, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count)
                 : "memory");
}

/* This thread's arrival for the barrier's current phase, which then also waits for bytes. */
__device__ __forceinline__ void mbar_arrive_expect(uint64_t *bar, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
                 "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t *bar, unsigned parity)
{
    asm volatile("{\n\t.reg .pred p;\n"
                 "wait:\n\t"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n\t"
                 "@!p bra wait;\n}" ::"r"(smem_addr(bar)),
                 "r"(parity)
                 : "memory");
}

/* bytes (a multiple of 16, both addresses 16-byte aligned) from global src into this block's
 * shared dst by the copy engine (TMA), counted on *bar. */
__device__ __forceinline__ void bulk_load(void *dst, const void *src, unsigned bytes, uint64_t *bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], "
                 "%2, [%3];" ::"r"(smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(smem_addr(bar))
                 : "memory");
}

/* v into block `rank`'s copy of *dst, counted on its copy of *bar. */
__device__ __forceinline__ void st_async_to(float *dst, uint64_t *bar, unsigned rank, float v)
{
    unsigned rd, rb;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                 : "=r"(rd)
                 : "r"(smem_addr(dst)), "r"(rank));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                 : "=r"(rb)
                 : "r"(smem_addr(bar)), "r"(rank));
    asm volatile(
        "st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [%0], %1, [%2];" ::"r"(rd),
        "f"(v), "r"(rb)
        : "memory");
}

/* Thread 0 sends v, the same in every thread, into slots[rank] of each of the cluster's n
 * blocks; every thread then waits until this block's slots[0 .. n) hold all n values (its
 * barrier's phase `phase`). */
__device__ __forceinline__ void cluster_exchange(float v, float *slots, uint64_t *bar,
                                                 unsigned phase, int rank, int n)
{
    if (threadIdx.x == 0) {
        mbar_arrive_expect(bar, sizeof(float) * n);
        for (int k = 0; k < n; k++)
            st_async_to(&slots[rank], bar, (unsigned)k, v);
    }
    mbar_wait(bar, phase);
}

/* Rows too wide for a block's registers: a cluster of n blocks per row, each holding
 * kThreads * V of its columns (block rank k: columns k * kThreads * V ...), which send each
 * other their maximum, then their sum of exponentials (st.async into every block's slot,
 * added in rank order: the same bits every run). One read of each row, and several rows in
 * flight on each multiprocessor, where a block of 1024 threads per row left the SM idle
 * between rows (60% of the copy bandwidth at 32768 columns on the H200; a cluster barrier in
 * place of st.async, which also waits for the blocks' earlier gradient stores: 53%).
 * STAGED (rows of a multiple of 4 floats, 16-byte aligned): the copy engine brings each
 * block's share of its next row into shared memory while the block works on this one, so
 * memory is read while the blocks wait for each other (without: 64% at 32768 columns). A
 * buffer is refilled one row after it was read, by then past the block's barriers.
 * A block's slots are rewritten only after it read them: block A sends row r + 1's maximum
 * after it has every sum of row r, so after each block read its maxima of row r; likewise
 * for the sums. Each barrier completes once a row, so its phase is the row's parity. (One
 * exchange a row, of each block's maximum and sum combined, measured slower: 71%.) */
template <int V, bool STAGED>
__global__ void __launch_bounds__(kThreads, V <= 16 ? 4 : 2)
    xent_cluster_kernel(int rows, int cols, const float *logits, const int32_t *labels,
                        float *dlogits, float inv_rows, float *part, float *out, double scale)
{
    cg::cluster_group cl = cg::this_cluster();
    __shared__ __align__(8) uint64_t bar[2]; /* the maxima, the sums */
    __shared__ float slot[2][kXentClusterMax];
    __shared__ __align__(128) float buf[STAGED ? 2 : 1][STAGED ? kThreads * V : 1];
    __shared__ __align__(8) uint64_t ld[2]; /* buf's */
    const int t = threadIdx.x, rank = (int)cl.block_rank(), n = (int)cl.num_blocks();
    const int c0 = rank * kThreads * V;
    const long clusters = gridDim.x / n;
    const int share = min(max(cols - c0, 0), kThreads * V); /* this block's columns */
    auto stage = [&](long row, int b) {
        if (share > 0)
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        mbar_arrive_expect(&ld[b], sizeof(float) * share);
        if (share > 0)
            bulk_load(buf[b], logits + (size_t)row * cols + c0, sizeof(float) * share, &ld[b]);
    };
    if (t == 0) {
        mbar_init(&bar[0], 1);
        mbar_init(&bar[1], 1);
        mbar_init(&ld[0], 1);
        mbar_init(&ld[1], 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    cl.sync(); /* every block's barriers are ready before anything is sent to them */
    float loss = 0.0f;
    unsigned it = 0, phase = 0;
    if (STAGED && t == 0 && blockIdx.x / n < rows)
        stage(blockIdx.x / n, 0);
    /* The same rows for every block of a cluster. */
    for (long r = blockIdx.x / n; r < rows; r += clusters, it++, phase ^= 1) {
        const float *l = logits + (size_t)r * cols;
        const int y = __ldg(labels + r);
        float v[V], mx = -INFINITY, s = 0.0f, ly = 0.0f;
        if (STAGED) {
            if (t == 0 && r + clusters < rows)
                stage(r + clusters, (it + 1) & 1);
            mbar_wait(&ld[it & 1], (it >> 1) & 1);
        }
#pragma unroll
        for (int j = 0; j < V; j++) {
            const int c = c0 + t + kThreads * j;
            v[j] = c >= cols ? -INFINITY : STAGED ? buf[it & 1][t + kThreads * j] : l[c];
            mx = fmaxf(mx, v[j]);
        }
        cluster_exchange(block_max(mx), slot[0], &bar[0], phase, rank, n);
        mx = -INFINITY;
        for (int k = 0; k < n; k++)
            mx = fmaxf(mx, slot[0][k]);
#pragma unroll
        for (int j = 0; j < V; j++) {
            const int c = c0 + t + kThreads * j;
            if (c == y)
                ly = v[j];
            v[j] = c < cols ? expf(v[j] - mx) : 0.0f;
            s += v[j];
        }
        cluster_exchange(block_sum(s), slot[1], &bar[1], phase, rank, n);
        s = 0.0f;
        for (int k = 0; k < n; k++)
            s += slot[1][k];
        const float lse = mx + logf(s), gs = inv_rows / s;
        const bool ok = y >= 0 && y < cols;
        if (dlogits != nullptr) {
            float *d = dlogits + (size_t)r * cols;
#pragma unroll
            for (int j = 0; j < V; j++) {
                const int c = c0 + t + kThreads * j;
                if (c < cols)
                    d[c] = ok ? v[j] * gs - (c == y ? inv_rows : 0.0f) : NAN;
            }
        }
        const int own = y - c0;
        if (!ok ? rank == 0 && t == 0 : own >= 0 && own < kThreads * V && own % kThreads == t)
            loss += ok ? lse - ly : NAN;
    }
    cl.sync(); /* no block leaves while another may still address its shared memory */
    loss = block_sum(loss);
    block_result(loss, part, out, scale);
}

/* Rows too wide for registers: one online pass for the maximum and the sum of exponentials
 * (the sum rescaled whenever the maximum grows), then the gradient pass; two reads per row. */
__global__ void __launch_bounds__(kThreads)
    xent_wide_kernel(int rows, int cols, const float *logits, const int32_t *labels, float *dlogits,
                     float inv_rows, float *part, float *out, double scale)
{
    int t = threadIdx.x;
    float loss = 0.0f;
    for (long r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *l = logits + (size_t)r * cols;
        float m = -INFINITY, s = 0.0f;
        for (int c = t; c < cols; c += kThreads) {
            float x = l[c];
            if (x > m) {
                s = s * expf(m - x) + 1.0f;
                m = x;
            } else if (m != -INFINITY) {
                s += expf(x - m);
            }
        }
        float mx = block_max(m);
        s = m == -INFINITY ? 0.0f : s * expf(m - mx);
        s = block_sum(s);
        float lse = mx + logf(s);
        int y = labels[r];
        bool ok = y >= 0 && y < cols;
        float ly = ok ? l[y] : NAN;
        __syncthreads();
        if (dlogits != nullptr) {
            float *d = dlogits + (size_t)r * cols;
            for (int c = t; c < cols; c += kThreads)
                d[c] = ok ? (expf(l[c] - lse) - (c == y ? 1.0f : 0.0f)) * inv_rows : NAN;
        }
        if (t == 0)
            loss += lse - ly;
    }
    loss = block_sum(loss);
    block_result(loss, part, out, scale);
}

/* First index of the row's largest value, over a warp; every lane gets it. */
__device__ int warp_argmax(const float *row, int cols, int lane)
{
    float best = -INFINITY;
    int bi = 0x7fffffff;
    if (lane < cols) {
        best = row[lane];
        bi = lane;
    }
    for (int c = lane + 32; c < cols; c += 32)
        if (row[c] > best) {
            best = row[c];
            bi = c;
        }
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > best || (ov == best && oi < bi)) {
            best = ov;
            bi = oi;
        }
    }
    return bi;
}

__global__ void __launch_bounds__(kThreads)
    argmax_kernel(int rows, int cols, const float *x, int32_t *out)
{
    int lane = threadIdx.x & 31;
    long nw = (long)gridDim.x * (kThreads / 32);
    for (long r = (long)blockIdx.x * (kThreads / 32) + threadIdx.x / 32; r < rows; r += nw) {
        int a = warp_argmax(x + (size_t)r * cols, cols, lane);
        if (lane == 0)
            out[r] = a;
    }
}

__global__ void __launch_bounds__(kThreads)
    count_correct_kernel(int rows, int cols, const float *x, const int32_t *labels, float *part,
                         float *out)
{
    int lane = threadIdx.x & 31;
    long nw = (long)gridDim.x * (kThreads / 32);
    float n = 0.0f;
    for (long r = (long)blockIdx.x * (kThreads / 32) + threadIdx.x / 32; r < rows; r += nw) {
        int a = warp_argmax(x + (size_t)r * cols, cols, lane);
        if (lane == 0 && a == labels[r])
            n += 1.0f;
    }
    n = block_sum(n);
    block_result(n, part, out, 1.0);
}

/* --- the output layer, its loss and its input's gradient in one kernel (linear_loss) ------ */

constexpr int kHeadMaxOut = 32; /* a row's outputs fit a warp: lane j writes output j */
constexpr int kHeadThreads = 128;
constexpr int kHeadWarps = kHeadThreads / 32;
constexpr int kHeadBlocksPerSm = 4;

struct HeadArgs {
    int rows, out, in;
    const float *x, *w, *bias;
    float *y;
    const int32_t *labels;
    const float *targets;
    float *loss, *dy;
    const float *z_in;
    float *dx;
    float g;      /* dLoss/dy's factor: 1 / rows (cross-entropy), 2 / (rows * out) (mse) */
    double scale; /* the loss's: 1 / rows, 1 / (rows * out) */
};

/* A warp per row (rows warp, warp + all warps, ...). Each lane multiplies the columns lane,
 * lane + 32, ... of x's row with W's rows into NJ accumulators; a butterfly sum gives every
 * lane every output, bit for bit the same. Then the loss and its gradient (softmax
 * cross-entropy or mean squared error; lane j writes y and dy of output j), and, with
 * A >= 0 (the activation below), dx over the row's columns: (dy . W) * act'(z_in, x). The
 * loss: a partial a block, which head_loss_kernel adds up.
 * Outputs j >= out read W's last row instead (their sums are never used, their gradients are
 * 0): every load is unconditional, so a lane's loads are all in flight together; loads
 * behind a branch per output each waited for the one before, 30 us for the article's MLP. */
template <int NJ, bool XENT, int A>
__global__ void __launch_bounds__(kHeadThreads) head_kernel(HeadArgs a, float *part)
{
    const int lane = threadIdx.x & 31, in = a.in, out = a.out;
    const float *wr[NJ];
    float bias[NJ];
#pragma unroll
    for (int j = 0; j < NJ; j++) {
        const int jj = j < out ? j : out - 1;
        wr[j] = a.w + (size_t)jj * in;
        bias[j] = a.bias != nullptr ? __ldg(a.bias + jj) : 0.0f;
    }
    float loss = 0.0f;
    const long nwarps = (long)gridDim.x * kHeadWarps;
    for (long r = (long)blockIdx.x * kHeadWarps + (threadIdx.x >> 5); r < a.rows; r += nwarps) {
        const float *xr = a.x + (size_t)r * in;
        const int y = XENT ? a.labels[r] : 0;
        float v[NJ];
#pragma unroll
        for (int j = 0; j < NJ; j++)
            v[j] = 0.0f;
#pragma unroll 2
        for (int k = lane; k < in; k += 32) {
            const float h = xr[k];
#pragma unroll
            for (int j = 0; j < NJ; j++)
                v[j] = fmaf(h, __ldg(wr[j] + k), v[j]);
        }
#pragma unroll
        for (int j = 0; j < NJ; j++)
            if (j < out)
                v[j] = warp_sum(v[j]) + bias[j];
        /* v: the row's outputs; g: dLoss/dv */
        float g[NJ], lr = 0.0f;
        if constexpr (XENT) {
            float mx = -INFINITY, s = 0.0f;
#pragma unroll
            for (int j = 0; j < NJ; j++)
                if (j < out)
                    mx = fmaxf(mx, v[j]);
#pragma unroll
            for (int j = 0; j < NJ; j++)
                if (j < out)
                    s += expf(v[j] - mx);
            const float lse = mx + logf(s);
            const bool ok = y >= 0 && y < out;
            float ly = NAN;
#pragma unroll
            for (int j = 0; j < NJ; j++) {
                if (ok && j == y)
                    ly = v[j];
                g[j] = j >= out ? 0.0f
                       : ok     ? (expf(v[j] - lse) - (j == y ? 1.0f : 0.0f)) * a.g
                                : NAN;
            }
            lr = lse - ly;
        } else {
            const float *t = a.targets + (size_t)r * out;
#pragma unroll
            for (int j = 0; j < NJ; j++) {
                const float tj = t[j < out ? j : out - 1];
                const float d = j < out ? v[j] - tj : 0.0f;
                g[j] = a.g * d;
                lr += d * d;
            }
        }
        if (lane == 0)
            loss += lr;
        float vy = 0.0f, vg = 0.0f;
#pragma unroll
        for (int j = 0; j < NJ; j++)
            if (j == lane)
                vy = v[j], vg = g[j];
        if (lane < out) {
            a.y[(size_t)r * out + lane] = vy;
            a.dy[(size_t)r * out + lane] = vg;
        }
        if constexpr (A >= 0) {
            float *dxr = a.dx + (size_t)r * in;
            const float *zr = a.z_in + (size_t)r * in;
#pragma unroll 2
            for (int k = lane; k < in; k += 32) {
                float s = 0.0f;
#pragma unroll
                for (int j = 0; j < NJ; j++)
                    s = fmaf(g[j], __ldg(wr[j] + k), s);
                dxr[k] = act_b<A>(A == MGPU_ACT_GELU ? zr[k] : 0.0f, xr[k], s);
            }
        }
    }
    /* The loss: this block's share into part[block]; head_loss_kernel adds them up on a side
     * stream, so the step's chain does not wait for the last block's sum. */
    loss = block_sum(loss);
    if (threadIdx.x == 0) {
        if (gridDim.x == 1)
            *a.loss = (float)((double)loss * a.scale);
        else
            part[blockIdx.x] = loss;
    }
}

/* head_kernel's loss: its n blocks' partials added in the order block_result adds a
 * reduction's (the same bits as when head_kernel finished it in its last block). */
__global__ void __launch_bounds__(kHeadThreads)
    head_loss_kernel(const float *part, int n, float *out, double scale)
{
    double s = 0.0;
    for (int i = (int)threadIdx.x; i < n; i += (int)blockDim.x)
        s += part[i];
    s = block_sum(s);
    if (threadIdx.x == 0)
        *out = (float)(s * scale);
}

/* --- the output layer's weight gradient: dz narrow enough for a lane to keep all of a row -- */

constexpr int kNarrowWarps = 8;
constexpr size_t kNarrowPartFloats = 1u << 18; /* per side stream: the row splits' sums */
constexpr int kNarrowCounters = 1024;          /* one per group of 32 columns */

struct NarrowArgs {
    int rows, out, in, rps; /* rps: rows per split */
    const float *dz, *x;
    float *dw, *dbias;
    float *part;
    unsigned *count;
};

/* dW [out, in] = dz^T . x and dbias = column sums of dz, for out <= NJ <= 32. Block (cx, ry)
 * takes columns 32 cx .. 32 cx + 31 of x, a lane each, and the rows of split ry; its warps take
 * every 8th row, each lane keeping NJ sums (dz's loads are the same for the warp's lanes, as
 * the head's W loads, unconditional). The warps' sums are added in warp order in shared
 * memory; with several splits each block writes its sums and the last block of the column
 * group adds the splits in order: the same bits on every run. */
template <int NJ>
__global__ void __launch_bounds__(kThreads, NJ <= 16 ? 4 : 1) narrow_dw_kernel(NarrowArgs a)
{
    __shared__ float sm[kNarrowWarps][NJ][33];
    __shared__ float sb[kNarrowWarps][NJ];
    __shared__ bool last;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, out = a.out, in = a.in;
    const int k = blockIdx.x * 32 + lane;
    const int r0 = blockIdx.y * a.rps, r1 = min(a.rows, r0 + a.rps);
    float acc[NJ] = {}, bacc[NJ] = {};
#pragma unroll 2
    for (int r = r0 + w; r < r1; r += kNarrowWarps) {
        const float xv = k < in ? a.x[(size_t)r * in + k] : 0.0f;
        const float *d = a.dz + (size_t)r * out;
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            const float dj = __ldg(d + (j < out ? j : out - 1));
            acc[j] = fmaf(dj, xv, acc[j]);
            bacc[j] += dj;
        }
    }
#pragma unroll
    for (int j = 0; j < NJ; j++)
        sm[w][j][lane] = acc[j];
    if (lane == 0)
#pragma unroll
        for (int j = 0; j < NJ; j++)
            sb[w][j] = bacc[j];
    __syncthreads();
    /* Thread t: output (j, lane) = (t / 32, t % 32) and j + 8, ...; threads < NJ: dbias[t]. */
    constexpr int kPer = (NJ * 32 + kThreads - 1) / kThreads;
    float v[kPer], vb = 0.0f;
#pragma unroll
    for (int q = 0; q < kPer; q++) {
        const int i = threadIdx.x + kThreads * q;
        float s = 0.0f;
        if (i < NJ * 32)
            for (int ww = 0; ww < kNarrowWarps; ww++)
                s += sm[ww][i / 32][i % 32];
        v[q] = s;
    }
    const bool bias_here = a.dbias != nullptr && blockIdx.x == 0 && threadIdx.x < NJ;
    if (bias_here)
        for (int ww = 0; ww < kNarrowWarps; ww++)
            vb += sb[ww][threadIdx.x];
    if (gridDim.y > 1) {
        /* the split's sums: [column group][split][NJ * 32 + NJ] */
        const size_t stride = NJ * 32 + NJ;
        float *mine = a.part + ((size_t)blockIdx.x * gridDim.y + blockIdx.y) * stride;
#pragma unroll
        for (int q = 0; q < kPer; q++)
            if (threadIdx.x + kThreads * q < NJ * 32)
                mine[threadIdx.x + kThreads * q] = v[q];
        if (bias_here)
            mine[NJ * 32 + threadIdx.x] = vb;
        __threadfence(); /* the sums are visible before the count says so */
        __syncthreads();
        if (threadIdx.x == 0)
            last = atomicAdd(&a.count[blockIdx.x], 1u) == gridDim.y - 1;
        __syncthreads();
        if (!last)
            return;
        __threadfence();
        const float *all = a.part + (size_t)blockIdx.x * gridDim.y * stride;
#pragma unroll
        for (int q = 0; q < kPer; q++) {
            const int i = threadIdx.x + kThreads * q;
            float s = 0.0f;
            if (i < NJ * 32)
                for (unsigned y = 0; y < gridDim.y; y++)
                    s += __ldcg(all + y * stride + i);
            v[q] = s;
        }
        if (bias_here) {
            vb = 0.0f;
            for (unsigned y = 0; y < gridDim.y; y++)
                vb += __ldcg(all + y * stride + NJ * 32 + threadIdx.x);
        }
        if (threadIdx.x == 0)
            a.count[blockIdx.x] = 0;
    }
#pragma unroll
    for (int q = 0; q < kPer; q++) {
        const int i = threadIdx.x + kThreads * q, j = i / 32, col = blockIdx.x * 32 + i % 32;
        if (i < NJ * 32 && j < out && col < in)
            a.dw[(size_t)j * in + col] = v[q];
    }
    if (bias_here && threadIdx.x < out)
        a.dbias[threadIdx.x] = vb;
}

/* --- the table's functions ---------------------------------------------------------------- */

void cuda_impl_destroy(void *impl)
{
    cuda_impl *c = (cuda_impl *)impl;
    if (c == NULL)
        return;
    /* Errors here have nowhere to go: destroy cannot fail. Work still queued finishes first
     * so that nothing in flight reads freed memory. */
    if (c->stream != NULL)
        (void)cudaStreamSynchronize(c->stream);
    for (cuda_impl::side_stream &sd : c->side) {
        if (sd.s != NULL) {
            (void)cudaStreamSynchronize(sd.s);
            (void)cudaStreamDestroy(sd.s);
        }
        if (sd.done != NULL)
            (void)cudaEventDestroy(sd.done);
        (void)cudaFree(sd.ws);
        (void)cudaFree(sd.nw_part);
        (void)cudaFree(sd.nw_count);
    }
    (void)cudaFree(c->adam);
    (void)cudaFree(c->sg_part);
    (void)cudaFree(c->sg_count);
    cudaEvent_t evs[] = {c->ev_fork, c->ev_wg, c->ev_t0, c->ev_t1};
    for (cudaEvent_t ev : evs)
        if (ev != NULL)
            (void)cudaEventDestroy(ev);
    if (c->blas != NULL)
        (void)B.p_cublasDestroy(c->blas);
    for (int i = 0; i < c->n_shadows; i++)
        (void)cudaFree(c->shadows[i].bf);
    (void)cudaFree(c->mir);
    for (int i = 0; i < c->n_plans; i++) {
        lt_plan *p = &c->plans[i];
        if (p->la != NULL)
            (void)B.p_cublasLtMatrixLayoutDestroy(p->la);
        if (p->lb != NULL)
            (void)B.p_cublasLtMatrixLayoutDestroy(p->lb);
        if (p->ld != NULL)
            (void)B.p_cublasLtMatrixLayoutDestroy(p->ld);
        if (p->desc != NULL)
            (void)B.p_cublasLtMatmulDescDestroy(p->desc);
    }
    if (c->lt != NULL)
        (void)B.p_cublasLtDestroy(c->lt);
    (void)cudaFree(c->ws);
    (void)cudaFree(c->scratch);
    (void)cudaFree(c->head_part);
    (void)cudaFree(c->blas_ws);
    if (c->stream != NULL)
        (void)cudaStreamDestroy(c->stream);
    free(c);
}

int impl_init(cuda_impl *c, mgpu_err_t *err)
{
    /* The calling thread's current device becomes c->device; ops launch on the current
     * device, so a thread that drives backends of several devices sets it between them. */
    CUDA_CHECK(err, cudaSetDevice(c->device));
    CUDA_CHECK(err, cudaDeviceGetAttribute(&c->sms, cudaDevAttrMultiProcessorCount, c->device));
    CUDA_CHECK(err, cudaDeviceGetAttribute(&c->l2_bytes, cudaDevAttrL2CacheSize, c->device));
    /* Non-blocking: no implicit ordering with the legacy default stream that other code in
     * the process (a data loader's cudaMemcpy) may use. */
    CUDA_CHECK(err, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    CUBLAS_CHECK(err, B.p_cublasCreate(&c->blas));
    CUBLAS_CHECK(err, B.p_cublasSetStream(c->blas, c->stream));
    CUBLAS_CHECK(err, B.p_cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH));
    CUDA_CHECK(err, cudaMalloc(&c->blas_ws, kBlasWorkspace));
    CUBLAS_CHECK(err, B.p_cublasSetWorkspace(c->blas, c->blas_ws, kBlasWorkspace));
    CUDA_CHECK(err, cudaMalloc((void **)&c->scratch, kScratchFloats * sizeof(float)));
    CUDA_CHECK(
        err, cudaMalloc((void **)&c->head_part, (size_t)c->sms * kHeadBlocksPerSm * sizeof(float)));
    /* The last word is block_result's counter. */
    CUDA_CHECK(err, cudaMemset(c->scratch, 0, kScratchFloats * sizeof(float)));
    CUBLAS_CHECK(err, B.p_cublasLtCreate(&c->lt));
    for (cuda_impl::side_stream &sd : c->side) {
        CUDA_CHECK(err, cudaStreamCreateWithFlags(&sd.s, cudaStreamNonBlocking));
        CUDA_CHECK(err, cudaMalloc(&sd.ws, kBlasWorkspace));
        CUDA_CHECK(err, cudaEventCreateWithFlags(&sd.done, cudaEventDisableTiming));
        CUDA_CHECK(err, cudaMalloc((void **)&sd.nw_part, kNarrowPartFloats * sizeof(float)));
        CUDA_CHECK(err, cudaMalloc((void **)&sd.nw_count, kNarrowCounters * sizeof(unsigned)));
        CUDA_CHECK(err, cudaMemset(sd.nw_count, 0, kNarrowCounters * sizeof(unsigned)));
    }
    CUDA_CHECK(err, cudaEventCreateWithFlags(&c->ev_fork, cudaEventDisableTiming));
    CUDA_CHECK(err, cudaEventCreateWithFlags(&c->ev_wg, cudaEventDisableTiming));
    CUDA_CHECK(err, cudaMalloc((void **)&c->sg_part, kSgPartFloats * sizeof(float)));
    CUDA_CHECK(err, cudaMalloc((void **)&c->sg_count, kSgCounters * sizeof(unsigned)));
    CUDA_CHECK(err, cudaMemset(c->sg_count, 0, kSgCounters * sizeof(unsigned)));
    CUDA_CHECK(err, cudaMalloc((void **)&c->adam, sizeof(AdamState)));
    CUDA_CHECK(err, cudaMemset(c->adam, 0, sizeof(AdamState)));
    CUDA_CHECK(err, cudaEventCreate(&c->ev_t0));
    CUDA_CHECK(err, cudaEventCreate(&c->ev_t1));
    const char *e = getenv("MGPU_CUDA_LT");
    c->lt_off = e != NULL && e[0] == '0';
    e = getenv("MGPU_LT_EPI");
    c->lt_epi = e != NULL ? atoi(e) : 7;
    e = getenv("MGPU_BF16_SHADOW");
    c->shadow_off = e != NULL && e[0] == '0';
    e = getenv("MGPU_LT_VERBOSE");
    c->lt_verbose = e != NULL && e[0] == '1';
    e = getenv("MGPU_LT_TUNE");
    c->tune_off = e != NULL && e[0] == '0';
    e = getenv("MGPU_CUDA_HEAD");
    c->head_off = e != NULL && e[0] == '0';
    e = getenv("MGPU_SMALL_GEMM");
    c->sg_off = e != NULL && e[0] == '0';
    /* Measured on the H200 ((b)'s step, session 4): fp32 51.8 us with the forward and the
     * input gradient here, 55.0 with the 32 x 32 weight gradient too (its blocks then took
     * the multiprocessors the input gradient waits for), 60.0 with none; tf32 45.4 us with
     * the input gradient only, 47.2 with none, 49.1 with the forward too. Session 6: the
     * weight gradients grouped into one launch at the join, fp32 49.5 -> 46.4 us (tf32
     * unchanged: it keeps cuBLAS's there); the tf32 ops on the tensor cores (mma.sync),
     * 41.8 -> 43.7 us, dropped. */
    e = getenv("MGPU_SG_FP32");
    c->sg_ops_fp32 = e != NULL ? atoi(e)
                               : (1 << mgpu_sg::kForward) | (1 << mgpu_sg::kInputGrad) |
                                     (1 << mgpu_sg::kWeightGrad);
    e = getenv("MGPU_SG_TF32");
    c->sg_ops_tf32 = e != NULL ? atoi(e) : 1 << mgpu_sg::kInputGrad;
    e = getenv("MGPU_SG_SPLIT");
    c->sg_forced = e != NULL ? atoi(e) : 0;
    /* A device that cannot give the kernel its shared memory runs cuBLAS's products. */
    if (!c->sg_off && mgpu_sg::prepare() != cudaSuccess) {
        (void)cudaGetLastError();
        c->sg_off = true;
    }
    c->prec = MGPU_PREC_FP32;
    return 0;
}

int cuda_impl_create(int device, void **out, mgpu_err_t *err)
{
    int count = 0, rc;
    cudaError_t crc = cudaGetDeviceCount(&count);
    if (crc != cudaSuccess || count == 0)
        return mgpu_err_set(err, MGPU_E_DEVICE, "kernels(cuda): no CUDA device (%s)",
                            crc != cudaSuccess ? cudaGetErrorString(crc)
                                               : "cudaGetDeviceCount returned 0");
    if (device < 0 || device >= count)
        return mgpu_err_set(err, MGPU_E_DEVICE,
                            "kernels(cuda): device %d, expected 0..%d (this process sees %d)",
                            device, count - 1, count);
    if ((rc = blas_load(err)) < 0)
        return rc;
    cuda_impl *c = (cuda_impl *)calloc(1, sizeof *c);
    if (c == NULL)
        return mgpu_err_set(err, -ENOMEM, "kernels(cuda): calloc(%zu) failed", sizeof *c);
    c->device = device;
    if ((rc = impl_init(c, err)) < 0) {
        cuda_impl_destroy(c);
        return rc;
    }
    *out = c;
    return 0;
}

int cuda_set_precision(void *impl, mgpu_precision_t prec, mgpu_err_t *err)
{
    ((cuda_impl *)impl)->prec = prec;
    return 0;
}

int cuda_alloc(void *impl, size_t bytes, void **out, mgpu_err_t *err)
{
    cuda_impl *c = (cuda_impl *)impl;
    /* Never managed memory: oversubscribing it can hang the GPU for every user of it. */
    cudaError_t rc = cudaMalloc(out, bytes ? bytes : 1);
    if (rc != cudaSuccess) {
        size_t free_b = 0, total_b = 0;
        (void)cudaGetLastError(); /* an allocation failure is not sticky; clear it */
        (void)cudaMemGetInfo(&free_b, &total_b);
        *out = NULL;
        return mgpu_err_set(err, rc == cudaErrorMemoryAllocation ? -ENOMEM : MGPU_E_CUDA,
                            "kernels(cuda): cudaMalloc(%zu bytes) on device %d: %s (%zu of %zu "
                            "bytes free)",
                            bytes, c->device, cudaGetErrorString(rc), free_b, total_b);
    }
    return 0;
}

void cuda_free(void *impl, void *p)
{
    /* cudaFree waits for the device, so no queued op still reads p. */
    (void)cudaFree(p);
}

/* Copies are ordered on the stream with the ops. A copy from pageable host memory has taken
 * its source by the time it returns; from pinned memory the source must stay unchanged until
 * the next sync, as for any asynchronous op. */
int cuda_join(void *impl, mgpu_err_t *err);

/* The copies and the fill join the side streams first (cuda_join): a weight gradient still
 * running there is never read before it is written, nor its operands overwritten. */

int cuda_copy_to_device(void *impl, void *dst, const void *src, size_t bytes, mgpu_err_t *err)
{
    int rc = cuda_join(impl, err);
    if (rc < 0)
        return rc;
    invalidate((cuda_impl *)impl, dst, bytes);
    CUDA_CHECK(
        err, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ((cuda_impl *)impl)->stream));
    return 0;
}

int cuda_copy_to_host(void *impl, void *dst, const void *src, size_t bytes, mgpu_err_t *err)
{
    cuda_impl *c = (cuda_impl *)impl;
    int rc = cuda_join(impl, err);
    if (rc < 0)
        return rc;
    /* The caller reads dst right after: this is the one op that waits. */
    CUDA_CHECK(err, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream));
    CUDA_CHECK(err, cudaStreamSynchronize(c->stream));
    return 0;
}

int cuda_copy(void *impl, void *dst, const void *src, size_t bytes, mgpu_err_t *err)
{
    int rc = cuda_join(impl, err);
    if (rc < 0)
        return rc;
    invalidate((cuda_impl *)impl, dst, bytes);
    if (dst == src)
        return 0;
    CUDA_CHECK(err, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
                                    ((cuda_impl *)impl)->stream));
    return 0;
}

int cuda_zero(void *impl, void *dst, size_t bytes, mgpu_err_t *err)
{
    int rc = cuda_join(impl, err);
    if (rc < 0)
        return rc;
    invalidate((cuda_impl *)impl, dst, bytes);
    CUDA_CHECK(err, cudaMemsetAsync(dst, 0, bytes, ((cuda_impl *)impl)->stream));
    return 0;
}

int cuda_sync(void *impl, mgpu_err_t *err)
{
    /* Also where a fault of an earlier kernel (an illegal address) surfaces. */
    cuda_impl *c = (cuda_impl *)impl;
    int rc = cuda_join(impl, err);
    if (rc < 0)
        return rc;
    CUDA_CHECK(err, cudaStreamSynchronize(c->stream));
    for (const cuda_impl::side_stream &sd : c->side)
        CUDA_CHECK(err, cudaStreamSynchronize(sd.s));
    return 0;
}

int ensure_ws(cuda_impl *c, size_t bytes, mgpu_err_t *err)
{
    if (bytes <= c->ws_bytes)
        return 0;
    size_t want = bytes > 2 * c->ws_bytes ? bytes : 2 * c->ws_bytes;
    /* The old copies may still be read by a queued GEMM. */
    CUDA_CHECK(err, cudaStreamSynchronize(c->stream));
    CUDA_CHECK(err, cudaFree(c->ws));
    c->ws = NULL;
    c->ws_bytes = 0;
    CUDA_CHECK(err, cudaMalloc(&c->ws, want));
    c->ws_bytes = want;
    return 0;
}

int to_bf16(cuda_impl *c, int rows, int cols, const float *src, int lds, __nv_bfloat16 *dst,
            int ldd, mgpu_err_t *err)
{
    bool vec = cols % 4 == 0 && lds % 4 == 0 && aligned16(src);
    if (vec && lds == cols && ldd == cols) {
        size_t n4 = (size_t)rows * cols / 4;
        to_bf16_flat_kernel<<<grid_for(c, n4, kEwBlocksPerSm), kThreads, 0, c->stream>>>(
            n4, reinterpret_cast<const float4 *>(src), reinterpret_cast<uint2 *>(dst));
        CUDA_CHECK_LAUNCH(err, "to_bf16_flat_kernel (%d x %d)", rows, cols);
        return 0;
    }
    int groups = vec ? cols / 4 : cols;
    dim3 grid((unsigned)((groups + kThreads - 1) / kThreads),
              (unsigned)(rows < 65535 ? rows : 65535));
    if (vec)
        to_bf16_kernel<true><<<grid, kThreads, 0, c->stream>>>(rows, cols, src, lds, dst, ldd);
    else
        to_bf16_kernel<false><<<grid, kThreads, 0, c->stream>>>(rows, cols, src, lds, dst, ldd);
    CUDA_CHECK_LAUNCH(err, "to_bf16_kernel (%d x %d, ld %d)", rows, cols, lds);
    return 0;
}

/* dst (cols x rows, ld rows) = src (rows x cols, ld lds) transposed; 16 bytes at a time where
 * the layout allows. */
int transpose(cuda_impl *c, int rows, int cols, const float *src, int lds, float *dst,
              mgpu_err_t *err)
{
    if (((uintptr_t)src | (uintptr_t)dst) % 16 == 0 && lds % 4 == 0 && rows % 4 == 0) {
        int tiles_y = (rows + 63) / 64;
        dim3 grid((unsigned)((cols + 63) / 64), (unsigned)(tiles_y < 65535 ? tiles_y : 65535));
        transpose4_kernel<<<grid, kThreads, 0, c->stream>>>(rows, cols, src, lds, dst, rows);
        CUDA_CHECK_LAUNCH(err, "transpose4_kernel (%d x %d, ld %d)", rows, cols, lds);
        return 0;
    }
    int tiles_y = (rows + 31) / 32;
    dim3 grid((unsigned)((cols + 31) / 32), (unsigned)(tiles_y < 65535 ? tiles_y : 65535));
    transpose_kernel<<<grid, dim3(32, 8), 0, c->stream>>>(rows, cols, src, lds, dst, rows);
    CUDA_CHECK_LAUNCH(err, "transpose_kernel (%d x %d, ld %d)", rows, cols, lds);
    return 0;
}

int cuda_gemm(void *impl, int trans_a, int trans_b, int m, int n, int k, float alpha,
              const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc,
              mgpu_err_t *err)
{
    invalidate((cuda_impl *)impl, c, sizeof(float) * ((size_t)(m > 0 ? m - 1 : 0) * ldc + n));
    cuda_impl *ci = (cuda_impl *)impl;
    cublasOperation_t opa = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t opb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;

    if (k == 0 || alpha == 0.0f) {
        unsigned blocks = grid_for(ci, (size_t)m * n, kEwBlocksPerSm);
        scale_matrix_kernel<<<blocks, kThreads, 0, ci->stream>>>(m, n, beta, c, ldc);
        CUDA_CHECK_LAUNCH(err, "scale_matrix_kernel (%d x %d)", m, n);
        return 0;
    }
    if (ci->prec == MGPU_PREC_TF32 && trans_a) {
        /* Measured on the H200 (cuBLAS 13.1, 8192^3): with A transposed, which reaches cuBLAS
         * as an MN-major second operand, tf32 ran at 55% of the plain product - Hopper's tf32
         * tensor-core instructions take K-major operands only, and the kernel cuBLAS picks
         * pays for it. A transposed copy (one pass over A, ~0.13 ms for 8192^2) restores the
         * fast layout. bf16 has no such penalty (16-bit operands may be MN-major). */
        int rc;
        if ((rc = ensure_ws(ci, (size_t)m * k * sizeof(float), err)) < 0 ||
            (rc = transpose(ci, k, m, a, lda, (float *)ci->ws, err)) < 0)
            return rc;
        a = (const float *)ci->ws;
        lda = k;
        opa = CUBLAS_OP_N;
    }
    if (ci->prec != MGPU_PREC_BF16) {
        cublasComputeType_t ct =
            ci->prec == MGPU_PREC_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
        /* Swapped operands: see the top of this file. */
        CUBLAS_CHECK(err, B.p_cublasGemmEx(ci->blas, opb, opa, n, m, k, &alpha, b, CUDA_R_32F, ldb,
                                           a, CUDA_R_32F, lda, &beta, c, CUDA_R_32F, ldc, ct,
                                           CUBLAS_GEMM_DEFAULT));
        return 0;
    }
    /* bf16: packed copies with rows padded to 8 elements (16 bytes), the alignment cuBLAS's
     * tensor-core kernels want whatever the fp32 leading dimensions were. */
    int ar = trans_a ? k : m, ac = trans_a ? m : k;
    int br = trans_b ? n : k, bc = trans_b ? k : n;
    int lda16 = (ac + 7) / 8 * 8, ldb16 = (bc + 7) / 8 * 8;
    size_t a_elems = ((size_t)ar * lda16 + 127) / 128 * 128, b_elems = (size_t)br * ldb16;
    int rc;
    if ((rc = ensure_ws(ci, (a_elems + b_elems) * sizeof(__nv_bfloat16), err)) < 0)
        return rc;
    __nv_bfloat16 *a16 = (__nv_bfloat16 *)ci->ws, *b16 = a16 + a_elems;
    if ((rc = to_bf16(ci, ar, ac, a, lda, a16, lda16, err)) < 0 ||
        (rc = to_bf16(ci, br, bc, b, ldb, b16, ldb16, err)) < 0)
        return rc;
    CUBLAS_CHECK(err, B.p_cublasGemmEx(ci->blas, opb, opa, n, m, k, &alpha, b16, CUDA_R_16BF, ldb16,
                                       a16, CUDA_R_16BF, lda16, &beta, c, CUDA_R_32F, ldc,
                                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return 0;
}

int cuda_bias_act_forward(void *impl, mgpu_act_t act, int rows, int cols, float *z,
                          const float *bias, float *y, mgpu_err_t *err)
{
    invalidate((cuda_impl *)impl, z, sizeof(float) * rows * (size_t)cols);
    invalidate((cuda_impl *)impl, y, sizeof(float) * rows * (size_t)cols);
    cuda_impl *c = (cuda_impl *)impl;
    size_t n = (size_t)rows * cols;
    if (act == MGPU_ACT_IDENTITY && bias == NULL)
        return y == z ? 0 : cuda_copy(impl, y, z, n * sizeof(float), err);
    bool vec = cols % 4 == 0 && aligned16(z, y, bias);
    return with_act(act, [&](auto a) {
        constexpr int A = decltype(a)::value;
        return launch_ew(c, BiasAct<A>{z, bias, y, (size_t)cols}, n, vec, "bias_act_forward", err);
    });
}

int cuda_act_forward(void *impl, mgpu_act_t act, size_t n, const float *x, float *y,
                     mgpu_err_t *err)
{
    invalidate((cuda_impl *)impl, y, sizeof(float) * n);
    cuda_impl *c = (cuda_impl *)impl;
    if (act == MGPU_ACT_IDENTITY)
        return cuda_copy(impl, y, x, n * sizeof(float), err);
    bool vec = aligned16(x, y);
    return with_act(act, [&](auto a) {
        constexpr int A = decltype(a)::value;
        return launch_ew(c, ActFwd<A>{x, y}, n, vec, "act_forward", err);
    });
}

int cuda_act_backward(void *impl, mgpu_act_t act, size_t n, const float *z, const float *y,
                      const float *dy, float *dz, mgpu_err_t *err)
{
    invalidate((cuda_impl *)impl, dz, sizeof(float) * n);
    cuda_impl *c = (cuda_impl *)impl;
    if (act == MGPU_ACT_IDENTITY)
        return cuda_copy(impl, dz, dy, n * sizeof(float), err);
    bool vec = aligned16(dy, dz, act == MGPU_ACT_GELU ? z : y);
    return with_act(act, [&](auto a) {
        constexpr int A = decltype(a)::value;
        return launch_ew(c, ActBwd<A>{z, y, dy, dz}, n, vec, "act_backward", err);
    });
}

/* Row splits of a column reduction of rows x cols, cols_per_block columns a block: about
 * per_sm blocks per multiprocessor, at least 32 rows per split, no more partials than the
 * scratch holds (its last word is block_result's counter). */
long row_splits(const cuda_impl *c, int rows, int cols, int cols_per_block, int per_sm)
{
    long col_blocks = (cols + cols_per_block - 1) / cols_per_block;
    long splits = ((long)c->sms * per_sm + col_blocks - 1) / col_blocks;
    long max_by_rows = (rows + 31) / 32, max_by_scratch = (long)((kScratchFloats - 1) / cols);
    if (splits > max_by_rows)
        splits = max_by_rows;
    if (splits > max_by_scratch)
        splits = max_by_scratch;
    return splits < 1 ? 1 : splits;
}

int cuda_sum_rows(void *impl, int rows, int cols, const float *x, float beta, float *out,
                  mgpu_err_t *err)
{
    cuda_impl *c = (cuda_impl *)impl;
    int col_blocks = (cols + 31) / 32;
    long splits = row_splits(c, rows, cols, 32, kRedBlocksPerSm);
    int rps = (int)((rows + splits - 1) / splits);
    dim3 grid((unsigned)col_blocks, (unsigned)splits), block(32, 8);
    sum_rows_kernel<<<grid, block, 0, c->stream>>>(rows, cols, x, rps, c->scratch, beta, out,
                                                   splits == 1);
    CUDA_CHECK_LAUNCH(err, "sum_rows_kernel (%d x %d, %ld splits)", rows, cols, splits);
    if (splits > 1) {
        sum_rows_finish_kernel<<<(cols + kThreads - 1) / kThreads, kThreads, 0, c->stream>>>(
            cols, (int)splits, c->scratch, beta, out);
        CUDA_CHECK_LAUNCH(err, "sum_rows_finish_kernel (%d columns)", cols);
    }
    return 0;
}

/* Launches xent_warp_kernel<G, V, R> with R = 8 / V rows per lane group for short rows (at
 * least 8 loads in flight per lane) and one row for long ones. */
template <int G, int V>
unsigned launch_xent_warp(cuda_impl *c, int rows, int cols, const float *logits,
                          const int32_t *labels, float *dlogits, float *loss)
{
    constexpr int R = G < 32 ? 4 : V >= 8 ? 1 : 8 / V, kGroups = 32 / G;
    /* Fewer rows than lane groups in one wave: a row per group, the latency of one row. */
    if (R > 1 && (size_t)rows <= (size_t)c->sms * 32 * kGroups) {
        size_t warps = ((size_t)rows + kGroups - 1) / kGroups;
        unsigned blocks = (unsigned)((warps * 32 + kThreads - 1) / kThreads);
        xent_warp_kernel<G, V, 1><<<blocks, kThreads, 0, c->stream>>>(
            rows, cols, logits, labels, dlogits, 1.0f / (float)rows, c->scratch, loss, 1.0 / rows);
        return blocks;
    }
    size_t warps = ((size_t)rows + kGroups * R - 1) / (kGroups * R);
    unsigned blocks = grid_for(c, warps * 32, kRedBlocksPerSm);
    xent_warp_kernel<G, V, R><<<blocks, kThreads, 0, c->stream>>>(
        rows, cols, logits, labels, dlogits, 1.0f / (float)rows, c->scratch, loss, 1.0 / rows);
    return blocks;
}

template <int V>
unsigned launch_xent_block(cuda_impl *c, int rows, int cols, const float *logits,
                           const int32_t *labels, float *dlogits, float *loss)
{
    size_t cap = (size_t)c->sms * kRedBlocksPerSm;
    unsigned blocks = (unsigned)((size_t)rows < cap ? (size_t)rows : cap);
    xent_block_kernel<V><<<blocks, kThreads, 0, c->stream>>>(
        rows, cols, logits, labels, dlogits, 1.0f / (float)rows, c->scratch, loss, 1.0 / rows);
    return blocks;
}

/* xent_cluster_kernel<V> with clusters of 1, 2, 4 or 8 blocks (cols <= 8 * kThreads * V),
 * staged where the rows allow it and the buffers fit the 48 KiB of static shared memory. */
template <int V>
cudaError_t launch_xent_cluster(cuda_impl *c, int rows, int cols, const float *logits,
                                const int32_t *labels, float *dlogits, float *loss,
                                unsigned *blocks)
{
    int n = (cols + kThreads * V - 1) / (kThreads * V);
    n = n <= 2 ? n : n <= 4 ? 4 : kXentClusterMax;
    size_t clusters = (size_t)c->sms * kRedBlocksPerSm / n;
    clusters = (size_t)rows < clusters ? (size_t)rows : clusters;
    *blocks = (unsigned)(clusters * n);
    const bool staged = V <= 16 && cols % 4 == 0 && ((uintptr_t)logits & 15) == 0;
    return mgpu_sg::launch_clustered(
        staged ? xent_cluster_kernel<V, V <= 16> : xent_cluster_kernel<V, false>,
        dim3(*blocks, 1, 1), kThreads, 0, c->stream, (unsigned)n, rows, cols, logits, labels,
        dlogits, 1.0f / (float)rows, c->scratch, loss, 1.0 / rows);
}

int cuda_softmax_xent(void *impl, int rows, int cols, const float *logits, const int32_t *labels,
                      float *loss, float *dlogits, mgpu_err_t *err)
{
    if (dlogits != nullptr)
        invalidate((cuda_impl *)impl, dlogits, sizeof(float) * rows * (size_t)cols);
    cuda_impl *c = (cuda_impl *)impl;
    unsigned blocks;
    if (cols <= 4)
        blocks = launch_xent_warp<1, 4>(c, rows, cols, logits, labels, dlogits, loss);
    else if (cols <= 8)
        blocks = launch_xent_warp<2, 4>(c, rows, cols, logits, labels, dlogits, loss);
    else if (cols <= 16)
        blocks = launch_xent_warp<4, 4>(c, rows, cols, logits, labels, dlogits, loss);
    else if (cols <= 32)
        blocks = launch_xent_warp<8, 4>(c, rows, cols, logits, labels, dlogits, loss);
    else if (cols <= 64)
        blocks = launch_xent_warp<32, 2>(c, rows, cols, logits, labels, dlogits, loss);
    else if (cols <= 128)
        blocks = launch_xent_warp<32, 4>(c, rows, cols, logits, labels, dlogits, loss);
    else if (cols <= 256)
        blocks = launch_xent_warp<32, 8>(c, rows, cols, logits, labels, dlogits, loss);
    else if (cols <= 512)
        blocks = launch_xent_warp<32, 16>(c, rows, cols, logits, labels, dlogits, loss);
    else if (cols <= kXentWarpMaxCols)
        blocks = launch_xent_warp<32, 32>(c, rows, cols, logits, labels, dlogits, loss);
    else if (cols <= kThreads * 8)
        blocks = launch_xent_block<8>(c, rows, cols, logits, labels, dlogits, loss);
    else if (cols <= kThreads * 16)
        blocks = launch_xent_block<16>(c, rows, cols, logits, labels, dlogits, loss);
    else if (cols <= kThreads * 32)
        blocks = launch_xent_block<32>(c, rows, cols, logits, labels, dlogits, loss);
    else if (cols <= kXentClusterMax * kThreads * 32) {
        cudaError_t le =
            cols <= kXentClusterMax * kThreads * 16
                ? launch_xent_cluster<16>(c, rows, cols, logits, labels, dlogits, loss, &blocks)
                : launch_xent_cluster<32>(c, rows, cols, logits, labels, dlogits, loss, &blocks);
        if (le != cudaSuccess) {
            (void)cudaGetLastError();
            return mgpu_err_set(err, MGPU_E_CUDA,
                                "launch of softmax_xent's cluster kernel (%d x %d, %u blocks): %s",
                                rows, cols, blocks, cudaGetErrorString(le));
        }
    } else {
        /* Two reads of each row: the second hits L2 only while the rows in flight fit in half
         * of it (a full wave of 1056 rows of 32768 floats, 138 MB, read every row twice from
         * memory on the H200: 41% of the copy bandwidth). */
        size_t cap = (size_t)c->sms * kRedBlocksPerSm, row_bytes = sizeof(float) * (size_t)cols;
        size_t fit = (size_t)c->l2_bytes / 2 / row_bytes;
        cap = fit < cap ? (fit > (size_t)c->sms ? fit : (size_t)c->sms) : cap;
        blocks = (unsigned)((size_t)rows < cap ? (size_t)rows : cap);
        xent_wide_kernel<<<blocks, kThreads, 0, c->stream>>>(
            rows, cols, logits, labels, dlogits, 1.0f / (float)rows, c->scratch, loss, 1.0 / rows);
    }
    CUDA_CHECK_LAUNCH(err, "softmax_xent kernel (%d x %d, %u blocks)", rows, cols, blocks);
    return 0;
}

int cuda_mse(void *impl, int rows, int cols, const float *pred, const float *target, float *loss,
             float *dpred, mgpu_err_t *err)
{
    if (dpred != nullptr)
        invalidate((cuda_impl *)impl, dpred, sizeof(float) * rows * (size_t)cols);
    size_t n = (size_t)rows * cols;
    bool vec = aligned16(pred, target, dpred);
    return launch_reduce((cuda_impl *)impl, Mse{pred, target, dpred, 2.0f / (float)n}, n, vec,
                         1.0 / (double)n, loss, "mse", err);
}

int cuda_sgd_step(void *impl, size_t n, float *p, const float *g, float *buf,
                  const mgpu_sgd_hparams_t *hp, long long step, mgpu_err_t *err)
{
    cuda_impl *c = (cuda_impl *)impl;
    bool has_mom = hp->momentum != 0.0f;
    invalidate(c, p, sizeof(float) * n);
    /* bf16 mode: the update also writes the bf16 mirror of p that the GEMMs read (one pass,
     * no conversion of the weights in any GEMM). Made on the first update of bf16 mode, which
     * runs eagerly (a capture cannot allocate); a mirror of another range is replaced. */
    __nv_bfloat16 *p16 = nullptr;
    if (c->prec == MGPU_PREC_BF16 && !c->shadow_off && !c->lt_off && n > 0) {
        if (c->mir == nullptr || c->mir_src != p || c->mir_n != n) {
            cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
            CUDA_CHECK(err, cudaStreamIsCapturing(c->stream, &cs));
            if (cs == cudaStreamCaptureStatusNone) {
                CUDA_CHECK(err, cudaStreamSynchronize(c->stream));
                CUDA_CHECK(err, cudaFree(c->mir));
                c->mir = nullptr;
                CUDA_CHECK(err, cudaMalloc((void **)&c->mir, (n + 8) * sizeof(__nv_bfloat16)));
                c->mir_src = p;
                c->mir_n = n;
            }
        }
        if (c->mir != nullptr && c->mir_src == p && c->mir_n == n)
            p16 = c->mir;
    }
    Sgd f{p,
          g,
          has_mom ? buf : nullptr,
          p16,
          hp->lr,
          hp->momentum,
          1.0f - hp->dampening,
          hp->weight_decay,
          has_mom,
          step == 1,
          hp->nesterov != 0};
    bool vec = aligned16(p, g, f.buf);
    int rc = launch_ew(c, f, n, vec, "sgd_step", err);
    if (rc == 0 && p16 != nullptr)
        c->mir_valid = true;
    return rc;
}

int cuda_adamw_step(void *impl, size_t n, float *p, const float *g, float *m, float *v,
                    const mgpu_adamw_hparams_t *hp, long long step, mgpu_err_t *err)
{
    cuda_impl *c = (cuda_impl *)impl;
    invalidate(c, p, sizeof(float) * n);
    if (n == 0)
        return 0;
    /* Inside a capture the step number comes from device memory, so that every replay of
     * the graph is the next update; eager calls set it. */
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    CUDA_CHECK(err, cudaStreamIsCapturing(c->stream, &cs));
    adamw_prep_kernel<<<1, 1, 0, c->stream>>>(c->adam, cs == cudaStreamCaptureStatusNone ? step : 0,
                                              hp->beta1, hp->beta2, hp->lr);
    CUDA_CHECK_LAUNCH(err, "adamw_prep_kernel");
    AdamW f{p, g, m, v, hp->beta1, hp->beta2, hp->eps, 1.0f - hp->lr * hp->weight_decay, c->adam};
    bool vec = aligned16(p, g, m, v);
    return launch_ew(c, f, n, vec, "adamw_step", err);
}

int cuda_scale(void *impl, size_t n, float alpha, float *x, mgpu_err_t *err)
{
    invalidate((cuda_impl *)impl, x, sizeof(float) * n);
    return launch_ew((cuda_impl *)impl, Scale{x, alpha}, n, aligned16(x), "scale", err);
}

int cuda_sum(void *impl, size_t n, const float *x, float *out, mgpu_err_t *err)
{
    if (n == 0)
        return cuda_zero(impl, out, sizeof(float), err);
    return launch_reduce((cuda_impl *)impl, Sum{x}, n, aligned16(x), 1.0, out, "sum", err);
}

int cuda_argmax_rows(void *impl, int rows, int cols, const float *x, int32_t *out, mgpu_err_t *err)
{
    cuda_impl *c = (cuda_impl *)impl;
    unsigned blocks = grid_for(c, (size_t)rows * 32, kEwBlocksPerSm);
    argmax_kernel<<<blocks, kThreads, 0, c->stream>>>(rows, cols, x, out);
    CUDA_CHECK_LAUNCH(err, "argmax_kernel (%d x %d)", rows, cols);
    return 0;
}

int cuda_count_correct(void *impl, int rows, int cols, const float *logits, const int32_t *labels,
                       float *out, mgpu_err_t *err)
{
    cuda_impl *c = (cuda_impl *)impl;
    if (rows == 0)
        return cuda_zero(impl, out, sizeof(float), err);
    unsigned blocks = grid_for(c, (size_t)rows * 32, kRedBlocksPerSm);
    count_correct_kernel<<<blocks, kThreads, 0, c->stream>>>(rows, cols, logits, labels, c->scratch,
                                                             out);
    CUDA_CHECK_LAUNCH(err, "count_correct_kernel (%d x %d)", rows, cols);
    return 0;
}

/* --- fused linear layer: cuBLASLt epilogues ------------------------------------------------ */
/* Row-major y[rows, out] = x W^T is column-major y^T (out x rows) = W^T(op T of the stored
 * in x out) . x^T (in x rows): features are cuBLAS's rows (m), so the bias and bias-gradient
 * vectors of the epilogues (length m) and the relu mask (m x rows bits, ld a multiple of 128)
 * line up with our columns with no transposes. Forward: RELU_AUX_BIAS (or BIAS for identity)
 * writes y and the mask. Input gradient: DRELU_BGRAD reads the mask of the layer below and
 * writes its dz and bias gradient. Weight gradient: BGRADB writes the output layer's bias
 * gradient from the same pass. Whatever cuBLASLt declines (no algorithm for an epilogue,
 * type or shape) is composed by the launcher from the plain ops, so results never depend on
 * it; MGPU_LT_VERBOSE=1 says what was declined. bf16 converts both operands as cuda_gemm does. */

long long round128(int v)
{
    return ((long long)v + 127) / 128 * 128;
}

bool aux_known(const cuda_impl *c, const void *aux)
{
    for (int i = 0; i < c->n_aux; i++)
        if (c->lt_aux[i] == aux)
            return true;
    return false;
}

void aux_mark(cuda_impl *c, const void *aux, bool written)
{
    for (int i = 0; i < c->n_aux; i++)
        if (c->lt_aux[i] == aux) {
            if (!written)
                c->lt_aux[i] = c->lt_aux[--c->n_aux];
            return;
        }
    if (written && c->n_aux < kLtAux)
        c->lt_aux[c->n_aux++] = aux;
}

/* The cached plan for this configuration, created (and its heuristic asked) on first use;
 * NULL when the cache is full. Host-only work: safe inside a stream capture. */
lt_plan *lt_get(cuda_impl *c, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                int lda, int ldb, int ldd, cublasLtEpilogue_t epi, long long aux_ld,
                bool d16 = false)
{
    for (int i = 0; i < c->n_plans; i++) {
        lt_plan *p = &c->plans[i];
        if (p->m == m && p->n == n && p->k == k && p->lda == lda && p->ldb == ldb &&
            p->ldd == ldd && p->aux_ld == aux_ld && p->ta == ta && p->tb == tb && p->epi == epi &&
            p->prec == c->prec && p->d16 == d16)
            return p;
    }
    if (c->n_plans == kLtPlans)
        return NULL;
    lt_plan *p = &c->plans[c->n_plans++];
    *p = lt_plan{};
    p->m = m, p->n = n, p->k = k, p->lda = lda, p->ldb = ldb, p->ldd = ldd, p->aux_ld = aux_ld;
    p->ta = ta, p->tb = tb, p->epi = epi, p->prec = c->prec, p->d16 = d16, p->ok = false;
    cublasComputeType_t ct =
        c->prec == MGPU_PREC_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    cudaDataType_t ab = c->prec == MGPU_PREC_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    cublasLtMatmulPreference_t pref = NULL;
    uint64_t wsb = kBlasWorkspace;
    int nres = 0;
    cublasLtMatmulHeuristicResult_t res[kLtCand];
    bool ok =
        B.p_cublasLtMatmulDescCreate(&p->desc, ct, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
        B.p_cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) ==
            CUBLAS_STATUS_SUCCESS &&
        B.p_cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) ==
            CUBLAS_STATUS_SUCCESS &&
        B.p_cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                           sizeof epi) == CUBLAS_STATUS_SUCCESS &&
        (aux_ld == 0 ||
         B.p_cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld,
                                            sizeof(int64_t)) == CUBLAS_STATUS_SUCCESS) &&
        B.p_cublasLtMatrixLayoutCreate(&p->la, ab, ta == CUBLAS_OP_N ? m : k,
                                       ta == CUBLAS_OP_N ? k : m, lda) == CUBLAS_STATUS_SUCCESS &&
        B.p_cublasLtMatrixLayoutCreate(&p->lb, ab, tb == CUBLAS_OP_N ? k : n,
                                       tb == CUBLAS_OP_N ? n : k, ldb) == CUBLAS_STATUS_SUCCESS &&
        B.p_cublasLtMatrixLayoutCreate(&p->ld, d16 ? CUDA_R_16BF : CUDA_R_32F, m, n, ldd) ==
            CUBLAS_STATUS_SUCCESS &&
        B.p_cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS &&
        B.p_cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &wsb, sizeof wsb) == CUBLAS_STATUS_SUCCESS &&
        B.p_cublasLtMatmulAlgoGetHeuristic(c->lt, p->desc, p->la, p->lb, p->ld, p->ld, pref,
                                           kLtCand, res, &nres) == CUBLAS_STATUS_SUCCESS &&
        nres > 0 && res[0].state == CUBLAS_STATUS_SUCCESS;
    if (pref != NULL)
        (void)B.p_cublasLtMatmulPreferenceDestroy(pref);
    for (int i = 0; ok && i < nres; i++)
        if (res[i].state == CUBLAS_STATUS_SUCCESS)
            p->cand[p->n_cand++] = res[i].algo;
    if (ok)
        p->algo = p->cand[0];
    p->ok = ok;
    if (c->lt_verbose)
        fprintf(stderr, "kernels(cuda): cuBLASLt %s epilogue %d, m=%d n=%d k=%d, %s\n",
                ok ? "fused" : "DECLINED", (int)epi, m, n, k, mgpu_precision_name(c->prec));
    return p;
}

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

/* src's kept bf16 copy when it is fresh and of this geometry, else NULL. */
cuda_impl::shadow *fresh_copy(cuda_impl *c, const float *src, int rows_cm, int cols_cm, int ld)
{
    for (int i = 0; i < c->n_shadows; i++) {
        cuda_impl::shadow *sh = &c->shadows[i];
        if (sh->src == src && sh->fresh && sh->rows_cm == rows_cm && sh->cols_cm == cols_cm &&
            sh->ld == ld)
            return sh;
    }
    return nullptr;
}

/* The bf16 copy kept for src (column-major rows_cm x cols_cm, ld), allocated or grown on
 * first use; NULL while a capture runs and none is big enough (the GEMM that reads src then
 * converts it itself), or when every slot is taken. Not yet fresh: the caller writes it. */
cuda_impl::shadow *shadow_slot(cuda_impl *c, const float *src, int rows_cm, int cols_cm, int ld,
                               mgpu_err_t *err, int *rc)
{
    *rc = 0;
    int ld16 = (rows_cm + 7) / 8 * 8;
    size_t need = (size_t)cols_cm * ld16;
    cuda_impl::shadow *sh = nullptr;
    for (int i = 0; i < c->n_shadows; i++)
        if (c->shadows[i].src == src)
            sh = &c->shadows[i];
    if (sh == nullptr || sh->cap < need) {
        cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        cudaError_t ce = cudaStreamIsCapturing(c->stream, &cs);
        if (ce != cudaSuccess) {
            *rc =
                mgpu_err_set(err, MGPU_E_CUDA, "cudaStreamIsCapturing: %s", cudaGetErrorString(ce));
            return nullptr;
        }
        if (cs != cudaStreamCaptureStatusNone || (sh == nullptr && c->n_shadows == kLtAux))
            return nullptr;
        if (sh == nullptr) {
            sh = &c->shadows[c->n_shadows++];
            *sh = cuda_impl::shadow{};
            sh->src = src;
        }
        if ((ce = cudaStreamSynchronize(c->stream)) != cudaSuccess ||
            (ce = cudaFree(sh->bf)) != cudaSuccess ||
            (sh->bf = nullptr, sh->cap = 0,
             ce = cudaMalloc((void **)&sh->bf, need * sizeof(__nv_bfloat16))) != cudaSuccess) {
            *rc = mgpu_err_set(err, MGPU_E_CUDA, "bf16 copy of %zu elements: %s", need,
                               cudaGetErrorString(ce));
            return nullptr;
        }
        sh->cap = need;
    }
    sh->fresh = false;
    sh->rows_cm = rows_cm, sh->cols_cm = cols_cm, sh->ld = ld, sh->ld16 = ld16;
    sh->bytes = sizeof(float) * ((size_t)(cols_cm - 1) * ld + rows_cm);
    return sh;
}

/* Where the bf16 operand (column-major rows_cm x cols_cm, ld) is, converting if needed;
 * *tmp_used: elements of the workspace taken. */
int bf16_operand(cuda_impl *c, int mode, const float *src, int rows_cm, int cols_cm, int ld,
                 __nv_bfloat16 *tmp, size_t *tmp_used, const __nv_bfloat16 **out, int *ld_out,
                 mgpu_err_t *err)
{
    if (mode == kTemp && c->mir != nullptr && c->mir_valid && !c->shadow_off && ld % 8 == 0 &&
        src >= c->mir_src && src + (size_t)(cols_cm - 1) * ld + rows_cm <= c->mir_src + c->mir_n &&
        (size_t)(src - c->mir_src) % 8 == 0) {
        *out = c->mir + (src - c->mir_src);
        *ld_out = ld;
        return 0;
    }
    int ld16 = (rows_cm + 7) / 8 * 8;
    size_t need = (size_t)cols_cm * ld16;
    if (mode != kTemp && !c->shadow_off) {
        cuda_impl::shadow *sh;
        if ((mode == kReuse || mode == kFresh) &&
            (sh = fresh_copy(c, src, rows_cm, cols_cm, ld)) != nullptr) {
            *out = sh->bf;
            *ld_out = sh->ld16;
            return 0;
        }
        int rc = 0;
        if ((sh = shadow_slot(c, src, rows_cm, cols_cm, ld, err, &rc)) != nullptr) {
            rc = to_bf16(c, cols_cm, rows_cm, src, ld, sh->bf, ld16, err);
            sh->fresh = rc == 0;
            *out = sh->bf;
            *ld_out = ld16;
            return rc;
        }
        if (rc < 0)
            return rc;
        /* No slot (none may be allocated inside a capture): a temporary copy, same numbers. */
    }
    *out = tmp + *tmp_used;
    *ld_out = ld16;
    *tmp_used += (need + 127) / 128 * 128;
    return to_bf16(c, cols_cm, rows_cm, src, ld, (__nv_bfloat16 *)*out, ld16, err);
}

/* GPU time of `reps` back-to-back runs of candidate i, in ms; < 0 when it fails to launch
 * or to be captured. Small products are timed as a CUDA graph of `reps` runs, as the step
 * replays them (timed eagerly, the host's launch cost would hide the kernels' own); large
 * ones eagerly after one warm-up run. On c->stream, which the caller has synchronised. */
float lt_time(cuda_impl *c, lt_plan *p, int i, const void *pa, const void *pb, void *d, void *ws,
              int reps, bool graph)
{
    const float one = 1.0f, zero = 0.0f;
    cudaStream_t st = c->stream;
    cudaGraph_t g = nullptr;
    cudaGraphExec_t ge = nullptr;
    cublasStatus_t bs = CUBLAS_STATUS_SUCCESS;
    float ms = -1.0f;
    if (graph && cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
        return -1.0f;
    for (int r = 0; r < (graph ? reps : reps + 1) && bs == CUBLAS_STATUS_SUCCESS; r++) {
        if (!graph && r == 1)
            (void)cudaEventRecord(c->ev_t0, st);
        bs = B.p_cublasLtMatmul(c->lt, p->desc, &one, pa, p->la, pb, p->lb, &zero, d, p->ld, d,
                                p->ld, &p->cand[i], ws, kBlasWorkspace, st);
    }
    bool ok = bs == CUBLAS_STATUS_SUCCESS;
    if (graph) {
        ok = cudaStreamEndCapture(st, &g) == cudaSuccess && ok &&
             cudaGraphInstantiate(&ge, g, 0) == cudaSuccess &&
             cudaGraphLaunch(ge, st) == cudaSuccess && /* warm-up */
             cudaEventRecord(c->ev_t0, st) == cudaSuccess && cudaGraphLaunch(ge, st) == cudaSuccess;
    }
    ok = cudaEventRecord(c->ev_t1, st) == cudaSuccess &&
         cudaEventSynchronize(c->ev_t1) == cudaSuccess && ok &&
         cudaEventElapsedTime(&ms, c->ev_t0, c->ev_t1) == cudaSuccess;
    if (ge != nullptr)
        (void)cudaGraphExecDestroy(ge);
    if (g != nullptr)
        (void)cudaGraphDestroy(g);
    (void)cudaGetLastError(); /* a candidate's failure is not ours to report */
    return ok ? ms : -1.0f;
}

/* The first eager call of a plan times each of the heuristic's candidates on the real
 * operands and keeps the fastest: for the small products of a launch-bound model the
 * heuristic's first choice is not always the fastest. Every run writes the same outputs (D,
 * the mask, the bias gradient: all overwritten, none accumulated), so the call that follows
 * sees nothing of it. Never inside a capture (it synchronises); such a plan stays untuned
 * until an eager call. MGPU_LT_TUNE=0 keeps the heuristic's first choice. */
int lt_tune(cuda_impl *c, lt_plan *p, const void *pa, const void *pb, void *d, cudaStream_t st,
            void *ws, mgpu_err_t *err)
{
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    CUDA_CHECK(err, cudaStreamIsCapturing(st, &cs));
    if (cs != cudaStreamCaptureStatusNone)
        return 0;
    p->tuned = true;
    if (c->tune_off || p->n_cand < 2)
        return 0;
    /* The operands are ready on whichever stream made them: wait for both. */
    CUDA_CHECK(err, cudaStreamSynchronize(c->stream));
    for (const cuda_impl::side_stream &sd : c->side)
        CUDA_CHECK(err, cudaStreamSynchronize(sd.s));
    const double flops = 2.0 * p->m * p->n * p->k;
    const bool graph = flops < 1e10;
    const int reps = graph ? 20 : flops > 1e11 ? 1 : 3;
    float best = 0;
    int best_i = -1;
    for (int i = 0; i < p->n_cand; i++) {
        float ms = lt_time(c, p, i, pa, pb, d, ws, reps, graph);
        if (c->lt_verbose)
            fprintf(stderr,
                    "kernels(cuda): tune m=%d n=%d k=%d epilogue %d: candidate %d %.2f us\n", p->m,
                    p->n, p->k, (int)p->epi, i, 1000.0 * ms / reps);
        if (ms >= 0 && (best_i < 0 || ms < best))
            best = ms, best_i = i;
    }
    if (best_i >= 0)
        p->algo = p->cand[best_i];
    return 0;
}

/* D = op(A) op(B) with the epilogue, column-major, queued on st with the cuBLASLt workspace
 * ws (kBlasWorkspace bytes); returns MGPU_K_DECLINED when cuBLASLt has no algorithm for it
 * (nothing queued then). mode_a, mode_b: how bf16 mode gets each operand (kTemp, kStore,
 * kReuse above; bf16 operands are converted on c->stream, so bf16 products use it). */
int lt_matmul(cuda_impl *c, cudaStream_t st, void *ws, cublasOperation_t ta, cublasOperation_t tb,
              int m, int n, int k, const float *a, int lda, const float *b, int ldb, void *d,
              int ldd, cublasLtEpilogue_t epi, const void *bias, const void *aux, long long aux_ld,
              int mode_a, int mode_b, mgpu_err_t *err, bool d16 = false)
{
    if (c->lt_off)
        return MGPU_K_DECLINED;
    if (!d16) /* a bf16 D is a kept copy: its caller says what it copies */
        invalidate(c, d, sizeof(float) * ((size_t)(n - 1) * ldd + m));
    const void *pa = a, *pb = b;
    int ra = ta == CUBLAS_OP_N ? m : k, ca = ta == CUBLAS_OP_N ? k : m;
    int rb = tb == CUBLAS_OP_N ? k : n, cb = tb == CUBLAS_OP_N ? n : k;
    if (c->prec == MGPU_PREC_BF16) {
        /* Decide before converting, with the padded leading dimensions a conversion gives:
         * a declined plan must queue nothing. */
        int la16 = (ra + 7) / 8 * 8, lb16 = (rb + 7) / 8 * 8;
        lt_plan *p = lt_get(c, ta, tb, m, n, k, la16, lb16, ldd, epi, aux_ld, d16);
        if (p == NULL || !p->ok)
            return MGPU_K_DECLINED;
        size_t a_elems = ((size_t)ca * la16 + 127) / 128 * 128, b_elems = (size_t)cb * lb16;
        int rc;
        if ((rc = ensure_ws(c, (a_elems + b_elems) * sizeof(__nv_bfloat16), err)) < 0)
            return rc;
        size_t used = 0;
        const __nv_bfloat16 *a16, *b16;
        if ((rc = bf16_operand(c, mode_a, a, ra, ca, lda, (__nv_bfloat16 *)c->ws, &used, &a16, &lda,
                               err)) < 0 ||
            (rc = bf16_operand(c, mode_b, b, rb, cb, ldb, (__nv_bfloat16 *)c->ws, &used, &b16, &ldb,
                               err)) < 0)
            return rc;
        pa = a16, pb = b16;
    }
    lt_plan *p = lt_get(c, ta, tb, m, n, k, lda, ldb, ldd, epi, aux_ld, d16);
    if (p == NULL || !p->ok)
        return MGPU_K_DECLINED;
    if (bias != nullptr)
        CUBLAS_CHECK(err, B.p_cublasLtMatmulDescSetAttribute(
                              p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    if (aux != nullptr)
        CUBLAS_CHECK(err,
                     B.p_cublasLtMatmulDescSetAttribute(
                         p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
    const float one = 1.0f, zero = 0.0f;
    if (!p->tuned) {
        int rc = lt_tune(c, p, pa, pb, d, st, ws, err);
        if (rc < 0)
            return rc;
    }
    cublasStatus_t bst = B.p_cublasLtMatmul(c->lt, p->desc, &one, pa, p->la, pb, p->lb, &zero, d,
                                            p->ld, d, p->ld, &p->algo, ws, kBlasWorkspace, st);
    if (bst == CUBLAS_STATUS_NOT_SUPPORTED) {
        p->ok = false;
        if (c->lt_verbose)
            fprintf(stderr, "kernels(cuda): cuBLASLt NOT_SUPPORTED at launch, epilogue %d\n",
                    (int)epi);
        return MGPU_K_DECLINED;
    }
    CUBLAS_CHECK(err, bst);
    return 0;
}

/* The split small_gemm.cu would use for op (0: not for it): fp32 and tf32 (whose products it
 * computes in full fp32), identity or ReLU. */
int sg_split(const cuda_impl *c, mgpu_sg::Op op, const mgpu_sg::Args &a)
{
    const int ops = c->prec == MGPU_PREC_FP32   ? c->sg_ops_fp32
                    : c->prec == MGPU_PREC_TF32 ? c->sg_ops_tf32
                                                : 0;
    if (c->sg_off || !(ops & (1 << (int)op)))
        return 0;
    return mgpu_sg::split_for(op, a, c->sms, c->sg_forced);
}

int sg_launch(cuda_impl *c, mgpu_sg::Op op, const mgpu_sg::Args &a, int split, cudaStream_t st,
              mgpu_err_t *err)
{
    cudaError_t ce = mgpu_sg::launch(op, a, split, st);
    if (ce != cudaSuccess)
        return mgpu_err_set(err, MGPU_E_CUDA, "small_gemm (op %d, %d x %d x %d, split %d): %s",
                            (int)op, a.M, a.N, a.K, split, cudaGetErrorString(ce));
    invalidate(c, a.c, sizeof(float) * ((size_t)(a.M - 1) * a.ldc + a.N));
    c->sg_launches++;
    return 0;
}

/* Whether the ReLU backward into a layer of `cols` features (rows x cols) is this file's own
 * pass (drelu_bgrad4_kernel / drelu16_kernel) rather than cuBLASLt's DRELU_BGRAD epilogue:
 * bf16, large, four-column rows. The forward then keeps no ReLU mask. */
bool own_relu_backward(const cuda_impl *c, mgpu_act_t act, int rows, int cols)
{
    return c->prec == MGPU_PREC_BF16 && act == MGPU_ACT_RELU && !c->lt_off && (c->lt_epi & 2) &&
           cols % 4 == 0 && (size_t)rows * cols >= kOwnDreluMin;
}

/* Whether cuBLASLt's bias/ReLU epilogue (forward) or ReLU-derivative epilogue (input gradient)
 * of a product with rows x cols outputs is slower than the product alone and this file's
 * elementwise passes: tf32, large. cuBLASLt then runs the epilogue as a kernel of its own:
 * 470-520 us for 8192 x 8192 on the H200, which moves its 537 MB of fp32 in and out at about
 * 1.1 TB/s, a quarter of the copy bandwidth; declining it took (c)'s TF32 step from 36.7 to
 * 35.1 ms. */
bool lt_epilogue_slower(const cuda_impl *c, int rows, int cols)
{
    return c->prec == MGPU_PREC_TF32 && (size_t)rows * cols >= kOwnDreluMin;
}

int cuda_linear_forward(void *impl, mgpu_act_t act, int rows, int out, int in, const float *x,
                        const float *w, const float *bias, float *z, float *y, void *aux,
                        mgpu_err_t *err)
{
    cuda_impl *c = (cuda_impl *)impl;
    if (act == MGPU_ACT_RELU || act == MGPU_ACT_IDENTITY) {
        mgpu_sg::Args a{};
        a.M = rows, a.N = out, a.K = in, a.a = x, a.lda = in, a.b = w, a.ldb = in, a.c = y;
        a.ldc = out, a.bias = bias, a.relu = act == MGPU_ACT_RELU;
        if (int split = sg_split(c, mgpu_sg::kForward, a)) {
            /* No mask: the input gradient takes ReLU's derivative from y. */
            if (aux != nullptr)
                aux_mark(c, aux, false);
            return sg_launch(c, mgpu_sg::kForward, a, split, c->stream, err);
        }
    }
    if ((act != MGPU_ACT_RELU && act != MGPU_ACT_IDENTITY) || !(c->lt_epi & 1) ||
        lt_epilogue_slower(c, rows, out)) {
        if (aux != nullptr)
            aux_mark(c, aux, false);
        return MGPU_K_DECLINED;
    }
    bool relu = act == MGPU_ACT_RELU, b = bias != nullptr;
    /* bf16's large layers take their ReLU backward from y (own_relu_backward): no mask. */
    if (aux != nullptr && own_relu_backward(c, act, rows, out)) {
        aux_mark(c, aux, false);
        aux = nullptr;
    }
    cublasLtEpilogue_t epi =
        relu ? (aux != nullptr ? (b ? CUBLASLT_EPILOGUE_RELU_AUX_BIAS : CUBLASLT_EPILOGUE_RELU_AUX)
                               : (b ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU))
             : (b ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT);
    long long aux_ld = relu && aux != nullptr ? round128(out) : 0;
    /* bf16, a large hidden layer: y goes straight to its bf16 copy (D in bf16), which is all
     * that reads it later: the next layer's product (kFresh), this layer's weight gradient
     * (kReuse) and drelu_bgrad4_kernel. The fp32 y is left unwritten. The bias is read from
     * the parameters' bf16 mirror, as autocast rounds it, so only once SGD has written that
     * mirror, and only while the copy exists (an eager step makes it). */
    const __nv_bfloat16 *b16 = nullptr;
    if (bias != nullptr && c->mir != nullptr && c->mir_valid && bias >= c->mir_src &&
        bias + out <= c->mir_src + c->mir_n && (bias - c->mir_src) % 8 == 0)
        b16 = c->mir + (bias - c->mir_src);
    if (relu && (bias == nullptr || b16 != nullptr) && c->prec == MGPU_PREC_BF16 &&
        !c->shadow_off && c->lt_epi == 7 && out % 8 == 0 && (size_t)rows * out >= kOwnDreluMin) {
        int rc = 0;
        cuda_impl::shadow *sh = shadow_slot(c, y, out, rows, out, err, &rc);
        if (rc < 0)
            return rc;
        if (sh != nullptr) {
            invalidate(c, y, sizeof(float) * (size_t)rows * out);
            rc = lt_matmul(c, c->stream, c->blas_ws, CUBLAS_OP_T, CUBLAS_OP_N, out, rows, in, w, in,
                           x, in, sh->bf, sh->ld16, epi, b16, nullptr, 0, kTemp, kFresh, err, true);
            if (rc <= 0) {
                sh->fresh = rc == 0;
                return rc;
            }
        }
    }
    int rc = lt_matmul(c, c->stream, c->blas_ws, CUBLAS_OP_T, CUBLAS_OP_N, out, rows, in, w, in, x,
                       in, y, out, epi, bias, aux_ld ? aux : nullptr, aux_ld, kTemp, kFresh, err);
    if (aux != nullptr)
        aux_mark(c, aux, rc == 0 && aux_ld != 0);
    return rc;
}

/* bf16 mode, large layers: cuBLASLt's DRELU_BGRAD runs as a separate pass over an fp32 D
 * (measured on the H200 at 0.55 ms for 8192 x 8192, plus 0.09 ms to convert the result for
 * the next GEMMs). Instead: the plain product into dx, then one pass that applies the ReLU
 * mask, writes dx's bf16 copy for the next two GEMMs (kFresh, kReuse) and the bias gradient. */

int cuda_linear_backward_data(void *impl, mgpu_act_t act, int rows, int out, int in,
                              const float *dz, const float *w, const float *z_in, const float *y_in,
                              const void *aux_in, float *dx, float *dbias, mgpu_err_t *err)
{
    cuda_impl *c = (cuda_impl *)impl;
    if (act == MGPU_ACT_RELU || act == MGPU_ACT_IDENTITY) {
        mgpu_sg::Args a{};
        a.M = rows, a.N = in, a.K = out, a.a = dz, a.lda = out, a.b = w, a.ldb = in, a.c = dx;
        a.ldc = in, a.y = y_in, a.ldy = in, a.relu = act == MGPU_ACT_RELU;
        a.dbias = dbias, a.part = c->sg_part, a.count = c->sg_count;
        /* The bias gradient's partials: a row per 32 rows of dx, a counter per 32 columns. */
        const bool fits =
            (size_t)((rows + 31) / 32) * in <= kSgPartFloats && (in + 31) / 32 <= kSgCounters;
        if (int split = fits ? sg_split(c, mgpu_sg::kInputGrad, a) : 0)
            return sg_launch(c, mgpu_sg::kInputGrad, a, split, c->stream, err);
    }
    if (own_relu_backward(c, act, rows, in) && y_in != nullptr) {
        /* y's kept copy, when the forward wrote only that (see cuda_linear_forward). */
        const cuda_impl::shadow *ysh = fresh_copy(c, y_in, in, rows, in);
        int rc = 0;
        /* Best: the product writes dx in bf16 straight into its kept copy (what the next two
         * GEMMs read), and the ReLU backward and bias gradient run on that, in place; the
         * fp32 dx is left unwritten, as y is in the forward. Else the fp32 product, and the
         * pass writes dx and its copy. */
        cuda_impl::shadow *xs = nullptr;
        bool d16 = false;
        if (!c->shadow_off && c->lt_epi == 7 && in % 8 == 0 &&
            (xs = shadow_slot(c, dx, in, rows, in, err, &rc)) != nullptr) {
            invalidate(c, dx, sizeof(float) * (size_t)rows * in);
            rc = lt_matmul(c, c->stream, c->blas_ws, CUBLAS_OP_N, CUBLAS_OP_N, in, rows, out, w, in,
                           dz, out, xs->bf, xs->ld16, CUBLASLT_EPILOGUE_DEFAULT, nullptr, nullptr,
                           0, kTemp, kReuse, err, true);
            d16 = rc == 0;
        }
        if (rc < 0)
            return rc;
        if (!d16) {
            rc = lt_matmul(c, c->stream, c->blas_ws, CUBLAS_OP_N, CUBLAS_OP_N, in, rows, out, w, in,
                           dz, out, dx, in, CUBLASLT_EPILOGUE_DEFAULT, nullptr, nullptr, 0, kTemp,
                           kReuse, err);
            if (rc != 0)
                return rc; /* declined: nothing was queued, the launcher composes it all */
            if (xs == nullptr && !c->shadow_off &&
                (xs = shadow_slot(c, dx, in, rows, in, err, &rc)) == nullptr && rc < 0)
                return rc;
        }
        /* About 16 blocks per multiprocessor: enough loads in flight. */
        const int per_block = d16 ? 256 : 128;
        long splits = row_splits(c, rows, in, per_block, 16);
        int rps = (int)((rows + splits - 1) / splits);
        dim3 grid((unsigned)((in + per_block - 1) / per_block), (unsigned)splits), block(32, 8);
        const __nv_bfloat16 *y16 = ysh != nullptr ? ysh->bf : nullptr;
        const int ldy16 = ysh != nullptr ? ysh->ld16 : 0;
        if (d16 && ysh != nullptr)
            drelu16_kernel<true><<<grid, block, 0, c->stream>>>(rows, in, xs->bf, xs->ld16, nullptr,
                                                                y16, ldy16, rps, c->scratch, dbias,
                                                                splits == 1);
        else if (d16)
            drelu16_kernel<false><<<grid, block, 0, c->stream>>>(
                rows, in, xs->bf, xs->ld16, y_in, nullptr, 0, rps, c->scratch, dbias, splits == 1);
        else if (ysh != nullptr)
            drelu_bgrad4_kernel<true><<<grid, block, 0, c->stream>>>(
                rows, in, dx, nullptr, y16, ldy16, xs != nullptr ? xs->bf : nullptr,
                xs != nullptr ? xs->ld16 : 0, rps, c->scratch, dbias, splits == 1);
        else
            drelu_bgrad4_kernel<false><<<grid, block, 0, c->stream>>>(
                rows, in, dx, y_in, nullptr, 0, xs != nullptr ? xs->bf : nullptr,
                xs != nullptr ? xs->ld16 : 0, rps, c->scratch, dbias, splits == 1);
        CUDA_CHECK_LAUNCH(err, "ReLU backward pass (%d x %d, %s, %ld splits)", rows, in,
                          d16 ? "bf16" : "fp32", splits);
        if (dbias != nullptr && splits > 1) {
            sum_rows_finish_kernel<<<(in + kThreads - 1) / kThreads, kThreads, 0, c->stream>>>(
                in, (int)splits, c->scratch, 0.0f, dbias);
            CUDA_CHECK_LAUNCH(err, "sum_rows_finish_kernel (%d columns)", in);
        }
        if (xs != nullptr)
            xs->fresh = true;
        return 0;
    }
    /* Only with the mask a fused forward wrote into aux_in. */
    if (act != MGPU_ACT_RELU || aux_in == nullptr || !aux_known(c, aux_in) || !(c->lt_epi & 2) ||
        lt_epilogue_slower(c, rows, in))
        return MGPU_K_DECLINED;
    cublasLtEpilogue_t epi =
        dbias != nullptr ? CUBLASLT_EPILOGUE_DRELU_BGRAD : CUBLASLT_EPILOGUE_DRELU;
    return lt_matmul(c, c->stream, c->blas_ws, CUBLAS_OP_N, CUBLAS_OP_N, in, rows, out, w, in, dz,
                     out, dx, in, epi, dbias, aux_in, round128(in), kTemp, kReuse, err);
}

/* Launch-bound sizes: their weight-gradient product runs on a side stream (see cuda_impl). */
constexpr double kSideMaxFlops = 2.0 * (1 << 26);
/* Up to this many rows (a pass of sum_rows_kernel's 8 row groups) the bias gradient of such a
 * product runs on a side stream of its own (cuda_linear_backward_weight). */
constexpr int kSideBiasRows = 4096;

/* Takes the next side stream (cuda_impl::side) and makes it wait for ev_fork: the main stream
 * as it was when the caller recorded it. */
int side_fork(cuda_impl *c, int *i, mgpu_err_t *err)
{
    *i = c->side_next;
    c->side_next = (*i + 1) % (int)(sizeof c->side / sizeof c->side[0]);
    CUDA_CHECK(err, cudaStreamWaitEvent(c->side[*i].s, c->ev_fork, 0));
    return 0;
}

/* What side stream i was given is for cuda_join to wait for (also after a failed launch: a
 * side stream that joined a capture must leave it). */
int side_queued(cuda_impl *c, int i, mgpu_err_t *err)
{
    CUDA_CHECK(err, cudaEventRecord(c->side[i].done, c->side[i].s));
    c->side[i].pending = true;
    return 0;
}

/* The output layer's weight gradient as narrow_dw_kernel: dz at most 32 wide (a classifier's
 * logits), launch-bound sizes, fp32 math (so not bf16 mode). cuBLAS gives such a product 8
 * blocks of 32 x 32 and a second kernel for the bias gradient: 15 us on the H200. */
bool narrow_dw(const cuda_impl *c, int rows, int out, int in)
{
    return !c->head_off && c->prec != MGPU_PREC_BF16 && out <= 32 &&
           2.0 * rows * out * in <= kSideMaxFlops;
}

/* On side stream i (forked by the caller), with that stream's partial sums. */
int launch_narrow_dw(cuda_impl *c, int i, int rows, int out, int in, const float *dz,
                     const float *x, float *dw, float *dbias, mgpu_err_t *err)
{
    const long groups = (in + 31) / 32;
    /* Splits of at least 16 rows (two a warp), about a block per two multiprocessors in all:
     * this product runs beside the layer below's input gradient, whose blocks need the rest
     * of a multiprocessor (registers: at most 64 a thread here, NJ <= 16). */
    long splits = (c->sms / 2 + groups - 1) / groups, by_rows = (rows + 15) / 16;
    const int nj = out <= 4 ? 4 : out <= 16 ? 16 : 32;
    const long by_part = (long)(kNarrowPartFloats / ((size_t)groups * (nj * 32 + nj)));
    splits = splits < by_rows ? splits : by_rows;
    splits = splits < by_part ? splits : by_part;
    if (splits < 1)
        splits = 1;
    if (groups > kNarrowCounters)
        return MGPU_K_DECLINED;
    NarrowArgs a{rows,
                 out,
                 in,
                 (int)((rows + splits - 1) / splits),
                 dz,
                 x,
                 dw,
                 dbias,
                 c->side[i].nw_part,
                 c->side[i].nw_count};
    dim3 grid((unsigned)groups, (unsigned)splits);
    if (nj == 4)
        narrow_dw_kernel<4><<<grid, kThreads, 0, c->side[i].s>>>(a);
    else if (nj == 16)
        narrow_dw_kernel<16><<<grid, kThreads, 0, c->side[i].s>>>(a);
    else
        narrow_dw_kernel<32><<<grid, kThreads, 0, c->side[i].s>>>(a);
    CUDA_CHECK_LAUNCH(err, "narrow_dw_kernel (%d x %d -> %d, %ld x %ld blocks)", rows, in, out,
                      groups, splits);
    invalidate(c, dw, sizeof(float) * (size_t)out * in);
    return 0;
}

/* Launches the queued weight gradients (cuda_impl::wg) as one group on the next side stream. */
int wg_flush(cuda_impl *c, mgpu_err_t *err)
{
    if (c->wg.n == 0)
        return 0;
    mgpu_sg::Group g = c->wg;
    c->wg.n = 0;
    const int split = mgpu_sg::group_split(g, c->sms, c->sg_forced);
    const int i = c->side_next;
    c->side_next = (i + 1) % (int)(sizeof c->side / sizeof c->side[0]);
    CUDA_CHECK(err, cudaStreamWaitEvent(c->side[i].s, c->ev_wg, 0));
    cudaError_t ce =
        split > 0 ? mgpu_sg::group_launch(g, split, c->side[i].s) : cudaErrorInvalidConfiguration;
    /* Joined even when it failed: a side stream that joined a capture must leave it. */
    CUDA_CHECK(err, cudaEventRecord(c->side[i].done, c->side[i].s));
    c->side[i].pending = true;
    if (ce != cudaSuccess)
        return mgpu_err_set(err, MGPU_E_CUDA,
                            "small_gemm weight gradients (%d layers, K %d, split %d): %s", g.n, g.K,
                            split, cudaGetErrorString(ce));
    c->sg_launches++;
    return 0;
}

/* Queues a weight gradient for small_gemm.cu's group launch (MGPU_K_DECLINED: not for it, where
 * the op is off, the job does not fit, or alone it would need a second wave of blocks). */
int wg_queue(cuda_impl *c, const mgpu_sg::Job &j, int K, mgpu_err_t *err)
{
    const int ops = c->prec == MGPU_PREC_FP32   ? c->sg_ops_fp32
                    : c->prec == MGPU_PREC_TF32 ? c->sg_ops_tf32
                                                : 0;
    if (c->sg_off || !(ops & (1 << (int)mgpu_sg::kWeightGrad)) || !mgpu_sg::job_fits(j, K))
        return MGPU_K_DECLINED;
    for (int pass = 0; pass < 2; pass++) {
        mgpu_sg::Group g = c->wg;
        if (g.n == mgpu_sg::kWgMaxJobs || (g.n > 0 && g.K != K))
            g.n = -1; /* full, or another K: launch those first */
        else {
            g.K = K;
            g.job[g.n++] = j;
        }
        if (g.n > 0 && mgpu_sg::group_split(g, c->sms, c->sg_forced) > 0) {
            c->wg = g;
            CUDA_CHECK(err, cudaEventRecord(c->ev_wg, c->stream));
            invalidate(c, j.c, sizeof(float) * (size_t)j.M * j.ldc);
            return 0;
        }
        if (c->wg.n == 0)
            return MGPU_K_DECLINED; /* alone it needs more than a wave */
        int rc = wg_flush(c, err);
        if (rc < 0)
            return rc;
    }
    return MGPU_K_DECLINED;
}

int cuda_linear_backward_weight(void *impl, int rows, int out, int in, const float *dz,
                                const float *x, float *dw, float *dbias, mgpu_err_t *err)
{
    cuda_impl *c = (cuda_impl *)impl;
    /* Large tf32 products keep cuda_gemm's transposed copy of dz (see there). */
    double flops = 2.0 * rows * out * in;
    const bool narrow = narrow_dw(c, rows, out, in);
    if (!narrow && flops <= kSideMaxFlops) {
        int rc = wg_queue(c, mgpu_sg::Job{out, in, dz, out, x, in, dw, in, dbias}, rows, err);
        if (rc != MGPU_K_DECLINED)
            return rc;
    }
    if (!narrow && (!(c->lt_epi & 4) || (c->prec == MGPU_PREC_TF32 && flops > 2.0 * (1u << 27))))
        return MGPU_K_DECLINED;
    cublasLtEpilogue_t epi =
        dbias != nullptr ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_DEFAULT;
    /* bf16 converts its operands on c->stream: no fork there. */
    if (!narrow && (c->prec == MGPU_PREC_BF16 || flops > kSideMaxFlops))
        return lt_matmul(c, c->stream, c->blas_ws, CUBLAS_OP_N, CUBLAS_OP_T, in, out, rows, x, in,
                         dz, out, dw, in, epi, dbias, nullptr, 0, kReuse, kFresh, err);
    /* The side stream's previous GEMM was joined (cuda_join) or is ordered before this fork
     * by its own stream; the join after this layer's input gradient waits for this one. */
    CUDA_CHECK(err, cudaEventRecord(c->ev_fork, c->stream));
    int i, j, rc;
    if ((rc = side_fork(c, &i, err)) < 0)
        return rc;
    /* cuBLASLt's bias gradient (BGRADB) is a kernel of its own after the product's (2 us at
     * (b)'s sizes, the last of the step's chain): the column sums of dz run on the next side
     * stream instead, beside the product, in one pass (no partials); only once the product is
     * queued (a declined one leaves both to the launcher's composition). */
    const bool side_bias = !narrow && dbias != nullptr && rows <= kSideBiasRows;
    if (side_bias)
        epi = CUBLASLT_EPILOGUE_DEFAULT;
    rc = narrow ? launch_narrow_dw(c, i, rows, out, in, dz, x, dw, dbias, err)
                : lt_matmul(c, c->side[i].s, c->side[i].ws, CUBLAS_OP_N, CUBLAS_OP_T, in, out, rows,
                            x, in, dz, out, dw, in, epi, side_bias ? nullptr : dbias, nullptr, 0,
                            kReuse, kFresh, err);
    const int qc = side_queued(c, i, err); /* even when declined */
    if (qc < 0)
        return qc;
    if (rc != 0 || !side_bias)
        return rc;
    if ((rc = side_fork(c, &j, err)) < 0)
        return rc;
    sum_rows_kernel<<<(unsigned)((out + 31) / 32), dim3(32, 8), 0, c->side[j].s>>>(
        rows, out, dz, rows, nullptr, 0.0f, dbias, 1);
    cudaError_t le = cudaGetLastError();
    if ((rc = side_queued(c, j, err)) < 0)
        return rc;
    if (le != cudaSuccess)
        return mgpu_err_set(err, MGPU_E_CUDA, "launch of sum_rows_kernel (%d x %d): %s", rows, out,
                            cudaGetErrorString(le));
    return 0;
}

/* The output layer and its loss (mgpu_k_linear_loss) as head_kernel, for outputs that fit a
 * warp; fp32 math (TF32 allows it), so bf16 mode, whose products round their operands,
 * composes it. The step of a launch-bound classifier then waits on one launch where the
 * composition queues four: the product, its epilogue, the loss and the input-gradient
 * product with its own epilogue. */
int cuda_linear_loss(void *impl, const mgpu_k_head_t *h, mgpu_err_t *err)
{
    cuda_impl *c = (cuda_impl *)impl;
    if (c->head_off || c->prec == MGPU_PREC_BF16 || h->out > kHeadMaxOut)
        return MGPU_K_DECLINED;
    /* An earlier call's head_loss_kernel may still read head_part on its side stream: joined
     * first (a no-op in a training step, whose backward ends with a join). */
    int jrc = cuda_join(c, err);
    if (jrc < 0)
        return jrc;
    const bool xent = h->loss == MGPU_LOSS_CROSS_ENTROPY;
    HeadArgs a{h->rows,
               h->out,
               h->in,
               h->x,
               h->w,
               h->bias,
               h->y,
               h->labels,
               h->targets,
               h->loss_out,
               h->dy,
               h->z_in,
               h->dx,
               xent ? 1.0f / (float)h->rows : 2.0f / (float)((size_t)h->rows * h->out),
               xent ? 1.0 / h->rows : 1.0 / ((double)h->rows * h->out)};
    invalidate(c, h->y, sizeof(float) * (size_t)h->rows * h->out);
    invalidate(c, h->dy, sizeof(float) * (size_t)h->rows * h->out);
    if (h->dx != nullptr)
        invalidate(c, h->dx, sizeof(float) * (size_t)h->rows * h->in);
    long blocks = ((long)h->rows + kHeadWarps - 1) / kHeadWarps;
    long cap = (long)c->sms * kHeadBlocksPerSm;
    blocks = blocks < cap ? blocks : cap;
    auto go = [&](auto nj) {
        constexpr int NJ = decltype(nj)::value;
        auto with_loss = [&](auto x) {
            constexpr bool X = decltype(x)::value;
            if (h->dx == nullptr) {
                head_kernel<NJ, X, -1>
                    <<<(unsigned)blocks, kHeadThreads, 0, c->stream>>>(a, c->head_part);
                return 0;
            }
            return with_act(h->act_in, [&](auto act) {
                constexpr int A = decltype(act)::value;
                head_kernel<NJ, X, A>
                    <<<(unsigned)blocks, kHeadThreads, 0, c->stream>>>(a, c->head_part);
                return 0;
            });
        };
        return xent ? with_loss(std::true_type()) : with_loss(std::false_type());
    };
    if (h->out <= 4)
        go(std::integral_constant<int, 4>());
    else if (h->out <= 16)
        go(std::integral_constant<int, 16>());
    else
        go(std::integral_constant<int, 32>());
    CUDA_CHECK_LAUNCH(err, "head_kernel (%d x %d -> %d, %s, %ld blocks)", h->rows, h->in, h->out,
                      xent ? "cross_entropy" : "mse", blocks);
    if (blocks > 1) {
        /* The loss's sum on the next side stream (joined with the weight gradients). */
        int i, rc;
        CUDA_CHECK(err, cudaEventRecord(c->ev_fork, c->stream));
        if ((rc = side_fork(c, &i, err)) < 0)
            return rc;
        head_loss_kernel<<<1, kHeadThreads, 0, c->side[i].s>>>(c->head_part, (int)blocks,
                                                               h->loss_out, a.scale);
        cudaError_t le = cudaGetLastError();
        if ((rc = side_queued(c, i, err)) < 0)
            return rc;
        if (le != cudaSuccess)
            return mgpu_err_set(err, MGPU_E_CUDA, "launch of head_loss_kernel (%ld partials): %s",
                                blocks, cudaGetErrorString(le));
    }
    return h->dx != nullptr && h->dbias_in != nullptr ? MGPU_K_BIAS_LEFT : 0;
}

/* Memory written outside this backend's ops (the training step's gather into the batch):
 * copies of it are stale. */
int cuda_written(void *impl, const void *p, size_t bytes, mgpu_err_t *err)
{
    invalidate((cuda_impl *)impl, p, bytes);
    return 0;
}

/* The main stream waits for the side stream's work (a no-op when none is pending). */
int cuda_join(void *impl, mgpu_err_t *err)
{
    cuda_impl *c = (cuda_impl *)impl;
    int rc = wg_flush(c, err);
    if (rc < 0)
        return rc;
    for (cuda_impl::side_stream &sd : c->side)
        if (sd.pending) {
            CUDA_CHECK(err, cudaStreamWaitEvent(c->stream, sd.done, 0));
            sd.pending = false;
        }
    c->side_next = 0;
    return 0;
}

} /* namespace */

const char *mgpu_cublas_status_string(cublasStatus_t rc)
{
    return B.p_cublasGetStatusString != NULL ? B.p_cublasGetStatusString(rc)
                                             : "(cuBLAS not loaded)";
}

const char *mgpu_cublas_status_name(cublasStatus_t rc)
{
    return B.p_cublasGetStatusName != NULL ? B.p_cublasGetStatusName(rc) : "?";
}

extern "C" int mgpu_kernels_cuda_blas_load(mgpu_err_t *err)
{
    return blas_load(err);
}

extern "C" int mgpu_kernels_cuda_device_count(mgpu_err_t *err)
{
    int n = 0;
    cudaError_t rc = cudaGetDeviceCount(&n);
    if (rc != cudaSuccess) {
        mgpu_err_set(err, MGPU_E_DEVICE, "cudaGetDeviceCount: %s (%s)", cudaGetErrorString(rc),
                     cudaGetErrorName(rc));
        return 0;
    }
    return n;
}

extern "C" int mgpu_kernels_cuda_transpose(mgpu_kernels_t *k, int rows, int cols, const float *src,
                                           int lds, float *dst, mgpu_err_t *err)
{
    if (k == NULL || k->backend != MGPU_KBACKEND_CUDA || k->impl == NULL)
        return mgpu_err_set(err, MGPU_E_USAGE, "transpose: not a CUDA backend");
    if (rows < 0 || cols < 0 || lds < cols)
        return mgpu_err_set(err, MGPU_E_RANGE, "transpose: %d x %d with ld %d, expected ld >= cols",
                            rows, cols, lds);
    if (rows == 0 || cols == 0)
        return 0;
    invalidate((cuda_impl *)k->impl, dst, sizeof(float) * (size_t)rows * cols);
    return transpose((cuda_impl *)k->impl, rows, cols, src, lds, dst, err);
}

extern "C" void *mgpu_kernels_cuda_stream(const mgpu_kernels_t *k)
{
    if (k == NULL || k->backend != MGPU_KBACKEND_CUDA || k->impl == NULL)
        return NULL;
    return (void *)((const cuda_impl *)k->impl)->stream;
}

/* Positional, in the order of mgpu_kernels_ops_t (C++17 has no designated initialisers). */
extern "C" const mgpu_kernels_ops_t mgpu_kernels_cuda_ops = {
    "cuda",
    cuda_impl_create,
    cuda_impl_destroy,
    cuda_set_precision,
    cuda_alloc,
    cuda_free,
    cuda_copy_to_device,
    cuda_copy_to_host,
    cuda_copy,
    cuda_zero,
    cuda_sync,
    cuda_gemm,
    cuda_bias_act_forward,
    cuda_act_forward,
    cuda_act_backward,
    cuda_sum_rows,
    cuda_softmax_xent,
    cuda_mse,
    cuda_sgd_step,
    cuda_adamw_step,
    cuda_scale,
    cuda_sum,
    cuda_argmax_rows,
    cuda_count_correct,
    cuda_linear_forward,
    cuda_linear_backward_data,
    cuda_linear_backward_weight,
    cuda_join,
    cuda_written,
    cuda_linear_loss,
};

extern "C" long long mgpu_kernels_cuda_small_gemms(const mgpu_kernels_t *k)
{
    if (k == NULL || k->backend != MGPU_KBACKEND_CUDA || k->impl == NULL)
        return 0;
    return ((const cuda_impl *)k->impl)->sg_launches;
}

extern "C" int mgpu_kernels_cuda_small_gemm_split(int op, int m, int n, int k, const void *a,
                                                  int lda, const void *b, int ldb, int sms,
                                                  int forced)
{
    if (op < mgpu_sg::kForward || op > mgpu_sg::kWeightGrad)
        return 0;
    mgpu_sg::Args g{};
    g.M = m, g.N = n, g.K = k, g.a = (const float *)a, g.lda = lda, g.b = (const float *)b;
    g.ldb = ldb;
    return mgpu_sg::split_for((mgpu_sg::Op)op, g, sms, forced);
}
