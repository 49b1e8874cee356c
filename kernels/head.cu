/* head.cu - the classifier head of a launch-bound step: the output layer, its loss and its
 * input's gradient in one kernel (linear_loss), and its narrow weight gradient. The reference
 * is kernels.c's composition of the plain ops. */
#include "cuda_impl.h"  /* cuda_impl, the device helpers, the other families' functions */
#include "cuda_check.h" /* CUDA_CHECK, CUDA_CHECK_LAUNCH, CUBLAS_CHECK */

namespace mgpu_cuda
{
namespace
{

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

} /* namespace */

/* The output layer's weight gradient as narrow_dw_kernel: dz at most 32 wide (a classifier's
 * logits), launch-bound sizes, fp32 math (so not bf16 mode). cuBLAS gives such a product 8
 * blocks of 32 x 32 and a second kernel for the bias gradient: 15 us on the H200. */
bool narrow_dw(const cuda_impl *c, int rows, int out, int in)
{
    return !c->opt.head_off && c->prec != MGPU_PREC_BF16 && out <= 32 &&
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

/* The output layer and its loss (mgpu_k_linear_loss) as head_kernel, for outputs that fit a
 * warp; fp32 math (TF32 allows it), so bf16 mode, whose products round their operands,
 * composes it. The step of a launch-bound classifier then waits on one launch where the
 * composition queues four: the product, its epilogue, the loss and the input-gradient
 * product with its own epilogue. */
int cuda_linear_loss(void *impl, const mgpu_k_head_t *h, mgpu_err_t *err)
{
    cuda_impl *c = (cuda_impl *)impl;
    if (c->opt.head_off || c->prec == MGPU_PREC_BF16 || h->out > kHeadMaxOut)
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

} /* namespace mgpu_cuda */
