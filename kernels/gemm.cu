/* gemm.cu - products: the plain GEMM (cuBLAS, with tf32's transposed copy and bf16's operand
 * conversion) and the fused linear-layer ops (small_gemm.cu or cuBLASLt epilogues), with the
 * kernels they need of their own (C = beta C, transposes, bf16 mode's ReLU backward). */
#include "cuda_impl.h"  /* cuda_impl, the device helpers, the other families' functions */
#include "cuda_check.h" /* CUDA_CHECK, CUDA_CHECK_LAUNCH, CUBLAS_CHECK */

namespace mgpu_cuda
{
namespace
{

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

/* The split small_gemm.cu would use for op (0: not for it): fp32 and tf32 (whose products it
 * computes in full fp32), identity or ReLU. */
int sg_split(const cuda_impl *c, mgpu_sg::Op op, const mgpu_sg::Args &a)
{
    const int ops = c->prec == MGPU_PREC_FP32   ? c->opt.sg_ops_fp32
                    : c->prec == MGPU_PREC_TF32 ? c->opt.sg_ops_tf32
                                                : 0;
    if (c->opt.sg_off || !(ops & (1 << (int)op)))
        return 0;
    return mgpu_sg::split_for(op, a, c->sms, c->opt.sg_split);
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

/* Whether the ReLU backward into a layer of `cols` features (rows x cols) is gemm.cu's own
 * pass (drelu_bgrad4_kernel / drelu16_kernel) rather than cuBLASLt's DRELU_BGRAD epilogue:
 * bf16, large, four-column rows. The forward then keeps no ReLU mask. */
bool own_relu_backward(const cuda_impl *c, mgpu_act_t act, int rows, int cols)
{
    return c->prec == MGPU_PREC_BF16 && act == MGPU_ACT_RELU && !c->opt.lt_off &&
           (c->opt.lt_epi & 2) && cols % 4 == 0 && (size_t)rows * cols >= kOwnDreluMin;
}

/* Whether cuBLASLt's bias/ReLU epilogue (forward) or ReLU-derivative epilogue (input gradient)
 * of a product with rows x cols outputs is slower than the product alone and gemm.cu's
 * elementwise passes: tf32, large. cuBLASLt then runs the epilogue as a kernel of its own:
 * 470-520 us for 8192 x 8192 on the H200, which moves its 537 MB of fp32 in and out at about
 * 1.1 TB/s, a quarter of the copy bandwidth; declining it took the 8192-wide MLP's TF32 step
 * from 36.7 to 35.1 ms. */
bool lt_epilogue_slower(const cuda_impl *c, int rows, int cols)
{
    return c->prec == MGPU_PREC_TF32 && (size_t)rows * cols >= kOwnDreluMin;
}

} /* namespace */

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
        /* Swapped operands: row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T. */
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
    if ((act != MGPU_ACT_RELU && act != MGPU_ACT_IDENTITY) || !(c->opt.lt_epi & 1) ||
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
        !c->opt.shadow_off && c->opt.lt_epi == 7 && out % 8 == 0 &&
        (size_t)rows * out >= kOwnDreluMin) {
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
        if (!c->opt.shadow_off && c->opt.lt_epi == 7 && in % 8 == 0 &&
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
            if (xs == nullptr && !c->opt.shadow_off &&
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
            int rc = sum_rows_finish(c, in, (int)splits, 0.0f, dbias, err);
            if (rc < 0)
                return rc;
        }
        if (xs != nullptr)
            xs->fresh = true;
        return 0;
    }
    /* Only with the mask a fused forward wrote into aux_in. */
    if (act != MGPU_ACT_RELU || aux_in == nullptr || !aux_known(c, aux_in) ||
        !(c->opt.lt_epi & 2) || lt_epilogue_slower(c, rows, in))
        return MGPU_K_DECLINED;
    cublasLtEpilogue_t epi =
        dbias != nullptr ? CUBLASLT_EPILOGUE_DRELU_BGRAD : CUBLASLT_EPILOGUE_DRELU;
    return lt_matmul(c, c->stream, c->blas_ws, CUBLAS_OP_N, CUBLAS_OP_N, in, rows, out, w, in, dz,
                     out, dx, in, epi, dbias, aux_in, round128(in), kTemp, kReuse, err);
}

} /* namespace mgpu_cuda */
