/* small_gemm.h - fp32 products of launch-bound linear layers with their epilogues, for the
 * CUDA backend (kernels/small_gemm.cu; C++, included by the backend's .cu files
 * through cuda_impl.h).
 *
 * C[M x N] (row-major, ldc) = sum over k of A(m, k) B(k, n), where each operand is either
 * "k-contiguous" (A(m, k) = a[m * lda + k]) or "row-contiguous" (A(m, k) = a[k * lda + m]),
 * and likewise for B with n. The three ops of a linear layer:
 *   forward          y = act(x . W^T + b)    A = x  (k-contig),  B = W  (k-contig)
 *   input gradient   dx = (dz . W) * act'(y), db_below = column sums of dx
 *                                            A = dz (k-contig),  B = W  (row-contig)
 *   weight gradient  dW = dz^T . x, db = column sums of dz
 *                                            A = dz (row-contig), B = x (row-contig)
 * Activations: identity and ReLU (its derivative from y, as everywhere in this backend).
 *
 * Why: at a launch-bound model's sizes (a batch of 256, layers of 256-784) cuBLAS's fp32
 * kernels take 6-10 us each, and its split-K ones a second kernel for the reduction and the
 * epilogue. Here one kernel: 32 x 32 output tiles, K split over a thread-block cluster of up
 * to 8 blocks, each staging its whole K slice (at most kMaxSlice) in shared memory with all
 * its loads in flight at once, eight groups of 64 threads each taking every eighth k of it,
 * then the groups' and the cluster's partial tiles added in a fixed order through distributed
 * shared memory (so reruns give the same bits), and the epilogue. */
#ifndef MGPU_SMALL_GEMM_H
#define MGPU_SMALL_GEMM_H

#include <cuda_runtime.h> /* cudaStream_t, cudaError_t, cudaLaunchKernelEx */

#include <utility> /* std::forward */

namespace mgpu_sg
{

/* kernel<<<grid, threads, smem, st>>>(args...) in thread-block clusters of `cluster` blocks
 * along x (small_gemm.cu's split K, xent.cu's cross-entropy rows); the launch's own
 * error, as cudaLaunchKernelEx returns it. */
template <class... P, class... A>
cudaError_t launch_clustered(void (*kernel)(P...), dim3 grid, unsigned threads, size_t smem,
                             cudaStream_t st, unsigned cluster, A &&...args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(threads, 1, 1);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = cluster;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...);
}

enum Op { kForward = 0, kInputGrad = 1, kWeightGrad = 2 };

constexpr int kMaxSlice = 512;      /* k per block */
constexpr int kMaxCluster = 8;      /* blocks per cluster (the portable limit) */
constexpr double kMaxFlops = 2.7e8; /* 2 M N K above which cuBLAS's kernels are the better bet */

/* One product's operands and output: C [M x N] (ldc) from A (lda) and B (ldb), in the layouts
 * of the op (top of this file). */
struct Job {
    int M, N;
    const float *a;
    int lda;
    const float *b;
    int ldb;
    float *c;
    int ldc;
    /* kWeightGrad: [M] = sums over k of A(m, k); kInputGrad: [N] = the column sums of C (the
     * layer below's bias gradient), with Args's part and count. May be NULL. */
    float *dbias;
};

struct Args : Job {
    int K;
    const float *bias; /* kForward: [N], may be NULL */
    const float *y;    /* kInputGrad with relu: the layer's output [M x N], ld ldy */
    int ldy;
    /* kInputGrad's dbias: part (M tiles x N floats) and count (N tiles counters, zero between
     * launches, which the launch leaves zero) of the caller's. */
    float *part;
    unsigned *count;
    bool relu;
};

/* Weight gradients of several layers with the same K (the batch) in one launch (kWeightGrad's
 * kernel: 64 x 32 output tiles, every job's in one grid): dW [M x N] = dz^T . x with dz
 * [K x M] (lda) and x [K x N] (ldb), row-major, and dbias [M] = dz's column sums where not
 * NULL. Each job's M and N a multiple of 4, its operands 16-byte aligned. */
constexpr int kWgMaxJobs = 4;
constexpr int kWgMaxSlice = 256; /* k per block */
struct Group {
    int K, n;
    Job job[kWgMaxJobs];
    int tile0[kWgMaxJobs]; /* the first tile of each job (group_split and group_launch set it) */
};
/* Whether a job may join a group of this K (alignment, launch-bound size). */
bool job_fits(const Job &j, int K);
/* The group's K split, or 0 when its tiles need more than one wave of blocks on `sms`
 * multiprocessors or a job does not fit; forced as in split_for. */
int group_split(Group &g, int sms, int forced);
/* Queues the group on st with `split` blocks per cluster (group_split's answer). */
cudaError_t group_launch(Group &g, int split, cudaStream_t st);

/* Blocks per cluster (the K split) for this shape on a device of `sms` multiprocessors, or 0
 * when the op is not for this kernel: too many flops, K over kMaxCluster * kMaxSlice, more
 * blocks than multiprocessors (a second wave, where cuBLAS's larger tiles win), or an operand
 * whose float4 loads would be misaligned (pointers, leading dimensions, and the dimension each
 * float4 runs along: k for a k-contiguous operand, m or n for the other). forced (a power of
 * two; 0: none) overrides the split where it fits. */
int split_for(Op op, const Args &a, int sms, int forced);

/* Lets every variant of the kernel take the shared memory of the largest slice on the current
 * device; once per device before the first launch there. */
cudaError_t prepare();

/* Queues the op on st with `split` blocks per cluster (split_for's answer). */
cudaError_t launch(Op op, const Args &a, int split, cudaStream_t st);

} // namespace mgpu_sg

#endif
