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
 * - softmax cross-entropy reads each row three times (max, sum of exponentials, gradient): a
 *   warp per row while a row fits in 1024 columns (it stays in L1 between passes), a block per
 *   row above that. An out-of-range label cannot be reported from the device without a sync,
 *   so that row's loss and gradient become NaN: loud in the loss, never a silent wrong value.
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
 * - A bf16 GEMM larger than any before it grows the bf16 workspace (a synchronising
 *   cudaFree/cudaMalloc): warm up with the largest shapes before capturing a graph. */
#include "kernels_cuda.h" /* mgpu_kernels_cuda_ops, kernels.h */

#include "cuda_check.h" /* CUDA_CHECK, CUDA_CHECK_LAUNCH, CUBLAS_CHECK */

#include <cublas_v2.h>    /* cublasGemmEx */
#include <cuda_bf16.h>    /* __nv_bfloat16, __floats2bfloat162_rn */
#include <cuda_runtime.h> /* streams, cudaMalloc, <<<>>> */

#include <errno.h>     /* ENOMEM */
#include <math.h>      /* INFINITY, NAN */
#include <stdint.h>    /* uintptr_t */
#include <stdlib.h>    /* calloc, free */
#include <type_traits> /* std::integral_constant */

namespace
{

constexpr int kThreads = 256;                /* every kernel's block size */
constexpr int kEwBlocksPerSm = 64;           /* grid cap of elementwise kernels */
constexpr int kRedBlocksPerSm = 8;           /* grid cap of reductions: one full wave */
constexpr size_t kScratchFloats = 1u << 20;  /* 4 MiB of partial sums */
constexpr size_t kBlasWorkspace = 32u << 20; /* cuBLAS's recommendation for Hopper */
constexpr int kXentWarpMaxCols = 1024;       /* above: a block per row */

struct cuda_impl {
    int device;
    int sms;
    cudaStream_t stream;
    cublasHandle_t blas;
    mgpu_precision_t prec;
    float *scratch; /* kScratchFloats: reduction partials, sum_rows' row-split partials */
    void *blas_ws;
    __nv_bfloat16 *bf16; /* bf16 copies of GEMM operands */
    size_t bf16_elems;
};

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

/* A block's share of a reduction: the result itself when the grid is one block, else a
 * partial for finish_kernel. */
__device__ __forceinline__ void block_result(float v, float *part, float *out, double scale)
{
    if (threadIdx.x == 0) {
        if (gridDim.x == 1)
            *out = (float)((double)v * scale);
        else
            part[blockIdx.x] = v;
    }
}

/* *out = scale * sum of part[0..n), added in double in a fixed order. One block. */
__global__ void __launch_bounds__(1024)
    finish_kernel(const float *part, int n, double scale, float *out)
{
    double s = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        s += part[i];
    s = block_sum(s);
    if (threadIdx.x == 0)
        *out = (float)(s * scale);
}

int finish(cuda_impl *c, unsigned blocks, double scale, float *out, const char *op, mgpu_err_t *err)
{
    if (blocks == 1)
        return 0;
    finish_kernel<<<1, 1024, 0, c->stream>>>(c->scratch, (int)blocks, scale, out);
    CUDA_CHECK_LAUNCH(err, "finish_kernel for %s (%u partials)", op, blocks);
    return 0;
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
    return finish(c, blocks, scale, out, op, err);
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
    }
    __device__ void one(size_t i) const
    {
        float pi = p[i], bi = has_mom && !first ? buf[i] : 0.0f;
        upd(pi, g[i], bi);
        p[i] = pi;
        if (has_mom)
            buf[i] = bi;
    }
};

struct AdamW {
    float *p;
    const float *g;
    float *m, *v;
    float b1, b2, eps, decay, step_size, bc2_sqrt;
    __device__ __forceinline__ void upd(float &pi, float gi, float &mi, float &vi) const
    {
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

/* Packed bf16 copy of a rows x cols fp32 matrix: dst[r * ldd + c] = src[r * lds + c]. */
template <bool VEC>
__global__ void __launch_bounds__(kThreads)
    to_bf16_kernel(int rows, int cols, const float *src, int lds, __nv_bfloat16 *dst, int ldd)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (VEC) {
        size_t cols4 = cols / 4, total = (size_t)rows * cols4;
        for (size_t i = tid; i < total; i += stride) {
            size_t r = i / cols4, c = (i % cols4) * 4;
            float4 v = *reinterpret_cast<const float4 *>(src + r * lds + c);
            __nv_bfloat162 *d = reinterpret_cast<__nv_bfloat162 *>(dst + r * ldd + c);
            d[0] = __floats2bfloat162_rn(v.x, v.y);
            d[1] = __floats2bfloat162_rn(v.z, v.w);
        }
    } else {
        size_t total = (size_t)rows * cols;
        for (size_t i = tid; i < total; i += stride) {
            size_t r = i / cols, c = i % cols;
            dst[r * ldd + c] = __float2bfloat16_rn(src[r * lds + c]);
        }
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

/* Reductions across a group of G threads working on one row: a warp or the whole block. */
template <int G> __device__ __forceinline__ float group_max(float v)
{
    if constexpr (G == 32)
        return warp_max(v);
    else
        return block_max(v);
}

template <int G> __device__ __forceinline__ float group_sum(float v)
{
    if constexpr (G == 32)
        return warp_sum(v);
    else
        return block_sum(v);
}

template <int G> __device__ __forceinline__ void group_sync()
{
    if constexpr (G == 32)
        __syncwarp();
    else
        __syncthreads();
}

/* Softmax cross-entropy, G threads per row (32 or kThreads). Each row: max, sum of
 * exponentials, log-sum-exp, then dlogits = (softmax - onehot) / rows. dlogits may alias
 * logits: each thread overwrites only the elements it reads itself, after the group has read
 * the label's logit (the barrier before the gradient pass). */
template <int G>
__global__ void __launch_bounds__(kThreads)
    xent_kernel(int rows, int cols, const float *logits, const int32_t *labels, float *dlogits,
                float inv_rows, float *part, float *out, double scale)
{
    constexpr int groups = kThreads / G;
    int t = threadIdx.x % G;
    long ngroups = (long)gridDim.x * groups;
    float loss = 0.0f;
    for (long r = (long)blockIdx.x * groups + threadIdx.x / G; r < rows; r += ngroups) {
        const float *l = logits + (size_t)r * cols;
        float mx = -INFINITY;
        for (int c = t; c < cols; c += G)
            mx = fmaxf(mx, l[c]);
        mx = group_max<G>(mx);
        float s = 0.0f;
        for (int c = t; c < cols; c += G)
            s += expf(l[c] - mx);
        s = group_sum<G>(s);
        float lse = mx + logf(s);
        int y = labels[r];
        bool ok = y >= 0 && y < cols;
        float ly = ok ? l[y] : NAN;
        group_sync<G>();
        if (dlogits != nullptr) {
            float *d = dlogits + (size_t)r * cols;
            for (int c = t; c < cols; c += G) {
                float p = expf(l[c] - lse);
                d[c] = ok ? (p - (c == y ? 1.0f : 0.0f)) * inv_rows : NAN;
            }
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
    if (c->blas != NULL)
        (void)cublasDestroy(c->blas);
    (void)cudaFree(c->bf16);
    (void)cudaFree(c->scratch);
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
    /* Non-blocking: no implicit ordering with the legacy default stream that other code in
     * the process (a data loader's cudaMemcpy) may use. */
    CUDA_CHECK(err, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    CUBLAS_CHECK(err, cublasCreate(&c->blas));
    CUBLAS_CHECK(err, cublasSetStream(c->blas, c->stream));
    CUBLAS_CHECK(err, cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH));
    CUDA_CHECK(err, cudaMalloc(&c->blas_ws, kBlasWorkspace));
    CUBLAS_CHECK(err, cublasSetWorkspace(c->blas, c->blas_ws, kBlasWorkspace));
    CUDA_CHECK(err, cudaMalloc((void **)&c->scratch, kScratchFloats * sizeof(float)));
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
int cuda_copy_to_device(void *impl, void *dst, const void *src, size_t bytes, mgpu_err_t *err)
{
    CUDA_CHECK(
        err, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ((cuda_impl *)impl)->stream));
    return 0;
}

int cuda_copy_to_host(void *impl, void *dst, const void *src, size_t bytes, mgpu_err_t *err)
{
    cuda_impl *c = (cuda_impl *)impl;
    /* The caller reads dst right after: this is the one op that waits. */
    CUDA_CHECK(err, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream));
    CUDA_CHECK(err, cudaStreamSynchronize(c->stream));
    return 0;
}

int cuda_copy(void *impl, void *dst, const void *src, size_t bytes, mgpu_err_t *err)
{
    if (dst == src)
        return 0;
    CUDA_CHECK(err, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
                                    ((cuda_impl *)impl)->stream));
    return 0;
}

int cuda_zero(void *impl, void *dst, size_t bytes, mgpu_err_t *err)
{
    CUDA_CHECK(err, cudaMemsetAsync(dst, 0, bytes, ((cuda_impl *)impl)->stream));
    return 0;
}

int cuda_sync(void *impl, mgpu_err_t *err)
{
    /* Also where a fault of an earlier kernel (an illegal address) surfaces. */
    CUDA_CHECK(err, cudaStreamSynchronize(((cuda_impl *)impl)->stream));
    return 0;
}

int ensure_bf16(cuda_impl *c, size_t elems, mgpu_err_t *err)
{
    if (elems <= c->bf16_elems)
        return 0;
    size_t want = elems > 2 * c->bf16_elems ? elems : 2 * c->bf16_elems;
    /* The old copies may still be read by a queued GEMM. */
    CUDA_CHECK(err, cudaStreamSynchronize(c->stream));
    CUDA_CHECK(err, cudaFree(c->bf16));
    c->bf16 = NULL;
    c->bf16_elems = 0;
    CUDA_CHECK(err, cudaMalloc((void **)&c->bf16, want * sizeof(__nv_bfloat16)));
    c->bf16_elems = want;
    return 0;
}

int to_bf16(cuda_impl *c, int rows, int cols, const float *src, int lds, __nv_bfloat16 *dst,
            int ldd, mgpu_err_t *err)
{
    bool vec = cols % 4 == 0 && lds % 4 == 0 && aligned16(src);
    unsigned blocks = grid_for(c, (size_t)rows * (vec ? cols / 4 : cols), kEwBlocksPerSm);
    if (vec)
        to_bf16_kernel<true><<<blocks, kThreads, 0, c->stream>>>(rows, cols, src, lds, dst, ldd);
    else
        to_bf16_kernel<false><<<blocks, kThreads, 0, c->stream>>>(rows, cols, src, lds, dst, ldd);
    CUDA_CHECK_LAUNCH(err, "to_bf16_kernel (%d x %d, ld %d)", rows, cols, lds);
    return 0;
}

int cuda_gemm(void *impl, int trans_a, int trans_b, int m, int n, int k, float alpha,
              const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc,
              mgpu_err_t *err)
{
    cuda_impl *ci = (cuda_impl *)impl;
    cublasOperation_t opa = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t opb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;

    if (k == 0 || alpha == 0.0f) {
        unsigned blocks = grid_for(ci, (size_t)m * n, kEwBlocksPerSm);
        scale_matrix_kernel<<<blocks, kThreads, 0, ci->stream>>>(m, n, beta, c, ldc);
        CUDA_CHECK_LAUNCH(err, "scale_matrix_kernel (%d x %d)", m, n);
        return 0;
    }
    if (ci->prec != MGPU_PREC_BF16) {
        cublasComputeType_t ct =
            ci->prec == MGPU_PREC_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
        /* Swapped operands: see the top of this file. */
        CUBLAS_CHECK(err, cublasGemmEx(ci->blas, opb, opa, n, m, k, &alpha, b, CUDA_R_32F, ldb, a,
                                       CUDA_R_32F, lda, &beta, c, CUDA_R_32F, ldc, ct,
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
    if ((rc = ensure_bf16(ci, a_elems + b_elems, err)) < 0)
        return rc;
    __nv_bfloat16 *a16 = ci->bf16, *b16 = ci->bf16 + a_elems;
    if ((rc = to_bf16(ci, ar, ac, a, lda, a16, lda16, err)) < 0 ||
        (rc = to_bf16(ci, br, bc, b, ldb, b16, ldb16, err)) < 0)
        return rc;
    CUBLAS_CHECK(err, cublasGemmEx(ci->blas, opb, opa, n, m, k, &alpha, b16, CUDA_R_16BF, ldb16,
                                   a16, CUDA_R_16BF, lda16, &beta, c, CUDA_R_32F, ldc,
                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return 0;
}

int cuda_bias_act_forward(void *impl, mgpu_act_t act, int rows, int cols, float *z,
                          const float *bias, float *y, mgpu_err_t *err)
{
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
    cuda_impl *c = (cuda_impl *)impl;
    if (act == MGPU_ACT_IDENTITY)
        return cuda_copy(impl, dz, dy, n * sizeof(float), err);
    bool vec = aligned16(dy, dz, act == MGPU_ACT_GELU ? z : y);
    return with_act(act, [&](auto a) {
        constexpr int A = decltype(a)::value;
        return launch_ew(c, ActBwd<A>{z, y, dy, dz}, n, vec, "act_backward", err);
    });
}

int cuda_sum_rows(void *impl, int rows, int cols, const float *x, float beta, float *out,
                  mgpu_err_t *err)
{
    cuda_impl *c = (cuda_impl *)impl;
    /* Split the rows so the grid fills the chip (about 8 blocks per multiprocessor), at
     * least 32 rows per split and no more partials than the scratch holds. */
    int col_blocks = (cols + 31) / 32;
    long target = (long)c->sms * kRedBlocksPerSm;
    long splits = (target + col_blocks - 1) / col_blocks;
    long max_by_rows = (rows + 31) / 32, max_by_scratch = (long)(kScratchFloats / cols);
    if (splits > max_by_rows)
        splits = max_by_rows;
    if (splits > max_by_scratch)
        splits = max_by_scratch;
    if (splits < 1)
        splits = 1;
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

int cuda_softmax_xent(void *impl, int rows, int cols, const float *logits, const int32_t *labels,
                      float *loss, float *dlogits, mgpu_err_t *err)
{
    cuda_impl *c = (cuda_impl *)impl;
    float inv_rows = 1.0f / (float)rows;
    double scale = 1.0 / rows;
    unsigned blocks;
    if (cols <= kXentWarpMaxCols) {
        blocks = grid_for(c, (size_t)rows * 32, kRedBlocksPerSm);
        xent_kernel<32><<<blocks, kThreads, 0, c->stream>>>(rows, cols, logits, labels, dlogits,
                                                            inv_rows, c->scratch, loss, scale);
    } else {
        size_t cap = (size_t)c->sms * kRedBlocksPerSm;
        blocks = (unsigned)((size_t)rows < cap ? (size_t)rows : cap);
        xent_kernel<kThreads><<<blocks, kThreads, 0, c->stream>>>(
            rows, cols, logits, labels, dlogits, inv_rows, c->scratch, loss, scale);
    }
    CUDA_CHECK_LAUNCH(err, "xent_kernel (%d x %d, %u blocks)", rows, cols, blocks);
    return finish(c, blocks, scale, loss, "softmax_xent", err);
}

int cuda_mse(void *impl, int rows, int cols, const float *pred, const float *target, float *loss,
             float *dpred, mgpu_err_t *err)
{
    size_t n = (size_t)rows * cols;
    bool vec = aligned16(pred, target, dpred);
    return launch_reduce((cuda_impl *)impl, Mse{pred, target, dpred, 2.0f / (float)n}, n, vec,
                         1.0 / (double)n, loss, "mse", err);
}

int cuda_sgd_step(void *impl, size_t n, float *p, const float *g, float *buf,
                  const mgpu_sgd_hparams_t *hp, long long step, mgpu_err_t *err)
{
    bool has_mom = hp->momentum != 0.0f;
    Sgd f{p,
          g,
          has_mom ? buf : nullptr,
          hp->lr,
          hp->momentum,
          1.0f - hp->dampening,
          hp->weight_decay,
          has_mom,
          step == 1,
          hp->nesterov != 0};
    bool vec = aligned16(p, g, f.buf);
    return launch_ew((cuda_impl *)impl, f, n, vec, "sgd_step", err);
}

int cuda_adamw_step(void *impl, size_t n, float *p, const float *g, float *m, float *v,
                    const mgpu_adamw_hparams_t *hp, long long step, mgpu_err_t *err)
{
    /* Bias corrections in double on the host, exactly as the CPU reference computes them. */
    double bc1 = 1.0 - pow(hp->beta1, (double)step), bc2 = 1.0 - pow(hp->beta2, (double)step);
    AdamW f{p,
            g,
            m,
            v,
            hp->beta1,
            hp->beta2,
            hp->eps,
            1.0f - hp->lr * hp->weight_decay,
            (float)(hp->lr / bc1),
            (float)sqrt(bc2)};
    bool vec = aligned16(p, g, m, v);
    return launch_ew((cuda_impl *)impl, f, n, vec, "adamw_step", err);
}

int cuda_scale(void *impl, size_t n, float alpha, float *x, mgpu_err_t *err)
{
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
    return finish(c, blocks, 1.0, out, "count_correct", err);
}

} /* namespace */

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
};
