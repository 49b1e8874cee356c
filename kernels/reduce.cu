/* reduce.cu - deterministic reductions: sum, mean squared error, column sums, argmax and the
 * count of correct rows (kernels/reduce.c is the reference). */
#include "cuda_impl.h"  /* cuda_impl, the device helpers, the other families' functions */
#include "cuda_check.h" /* CUDA_CHECK, CUDA_CHECK_LAUNCH, CUBLAS_CHECK */

namespace mgpu_cuda
{
namespace
{

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

} /* namespace */

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

int sum_rows_finish(cuda_impl *c, int cols, int splits, float beta, float *out, mgpu_err_t *err)
{
    sum_rows_finish_kernel<<<(cols + kThreads - 1) / kThreads, kThreads, 0, c->stream>>>(
        cols, splits, c->scratch, beta, out);
    CUDA_CHECK_LAUNCH(err, "sum_rows_finish_kernel (%d columns)", cols);
    return 0;
}

cudaError_t sum_rows_on(cudaStream_t st, int rows, int cols, const float *x, float *out)
{
    sum_rows_kernel<<<(unsigned)((cols + 31) / 32), dim3(32, 8), 0, st>>>(rows, cols, x, rows,
                                                                          nullptr, 0.0f, out, 1);
    return cudaGetLastError();
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

} /* namespace mgpu_cuda */
