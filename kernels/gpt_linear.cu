/* gpt_linear.cu - the bf16 path's linear layers (gpt_ops.h, mgpu_gpt_bf16_ops_t): every product
 * on bf16 operands with fp32 accumulation through cuBLASLt, with what follows it in the
 * epilogue: the bias, GELU (keeping the pre-activation for the backward), the residual add
 * (C = the residual stream, beta 1, D fp32), GELU's derivative on the input gradient, and the
 * weight gradient's accumulation into fp32 (beta 1). Only the bias gradient is a kernel of
 * ours: a column sum of the bf16 output gradient, in a fixed order, added to fp32 (cuBLASLt's
 * BGRADB epilogue runs as a separate, slower reduction kernel on the H200).
 *
 * Row-major (n, oc) = (n, c) @ w^T, w (oc, c), is column-major out^T (oc x n) = w^T . inp^T:
 * cuBLAS's m is the layer's output features, so the epilogue's bias and the GELU
 * pre-activation (m x n, ld m) line up with the row-major tensors without a transpose.
 *
 * Plans (descriptors, layouts, the heuristic's first algorithm) are cached in the backend's
 * plan table beside the MLP's, created on first use: host-only work, safe inside a capture. */
#include "gpt_cuda_impl.h" /* cuda_impl, the device helpers, the ops' declarations */
#include "cuda_check.h"    /* CUDA_CHECK, CUDA_CHECK_LAUNCH, CUBLAS_CHECK */

#include <limits.h> /* INT_MAX */

namespace mgpu_cuda
{
namespace
{

/* Column-sum geometry: a thread takes 8 adjacent columns (one 16-byte load a row), a block
 * 32 such groups by 8 row lanes; the rows are split in slices of at least kColRowsPerSlice
 * rows (more when the partials would not fit the scratch) whose partials land in the
 * backend's scratch and are added in slice order. */
constexpr int kColVec = 8;
constexpr int kColRowsPerSlice = 256;

/* part[slice][col] = the sum of dout's rows of the slice (rps rows) in column col (cols % 8
 * == 0). */
__global__ void __launch_bounds__(kThreads)
    colsum16_kernel(int rows, int cols, int rps, const bf16_t *dout, float *part)
{
    __shared__ float acc[8][32][kColVec + 1];
    const int col = (blockIdx.x * 32 + threadIdx.x) * kColVec;
    const int r0 = blockIdx.y * rps, r1 = min(rows, r0 + rps);
    float s[kColVec] = {};
    if (col < cols)
        for (int r = r0 + (int)threadIdx.y; r < r1; r += 8) {
            uint4 raw = *reinterpret_cast<const uint4 *>(dout + (size_t)r * cols + col);
            const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&raw);
#pragma unroll
            for (int j = 0; j < kColVec / 2; j++) {
                float2 f = __bfloat1622float2(h[j]);
                s[2 * j] += f.x, s[2 * j + 1] += f.y;
            }
        }
#pragma unroll
    for (int j = 0; j < kColVec; j++)
        acc[threadIdx.y][threadIdx.x][j] = s[j];
    __syncthreads();
    if (threadIdx.y != 0 || col >= cols)
        return;
    for (int i = 1; i < 8; i++)
#pragma unroll
        for (int j = 0; j < kColVec; j++)
            s[j] += acc[i][threadIdx.x][j];
#pragma unroll
    for (int j = 0; j < kColVec; j++)
        part[(size_t)blockIdx.y * cols + col + j] = s[j];
}

/* The same for any width: a thread a column. */
__global__ void __launch_bounds__(kThreads)
    colsum16_any_kernel(int rows, int cols, int rps, const bf16_t *dout, float *part)
{
    const int col = blockIdx.x * blockDim.x + threadIdx.x;
    const int r0 = blockIdx.y * rps, r1 = min(rows, r0 + rps);
    if (col >= cols)
        return;
    float s = 0.0f;
    for (int r = r0; r < r1; r++)
        s += __bfloat162float(dout[(size_t)r * cols + col]);
    part[(size_t)blockIdx.y * cols + col] = s;
}

/* out[col] += the slices' partials of col, in slice order (= with fresh). */
__global__ void __launch_bounds__(kThreads)
    colsum_finish_kernel(int cols, int slices, const float *part, float *out, bool fresh)
{
    const int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= cols)
        return;
    float s = 0.0f;
    for (int k = 0; k < slices; k++)
        s += part[(size_t)k * cols + col];
    out[col] = fresh ? s : out[col] + s;
}

/* Products below this many FLOPs are not tuned (see tune). */
constexpr double kTuneMinFlops = 1e10;

/* What a product's D (and C) hold. */
enum Dtype { kD16 = 0, kD32 = 1 };

lt_plan *no_algorithm(int m, int n, int k, cublasLtEpilogue_t epi, Dtype dt, mgpu_err_t *err,
                      int *rc)
{
    *rc = mgpu_err_set(err, MGPU_E_DEVICE,
                       "gpt bf16: cuBLASLt has no algorithm for m=%d n=%d k=%d (epilogue %d, D %s)",
                       m, n, k, (int)epi, dt == kD16 ? "bf16" : "fp32");
    return nullptr;
}

/* The cached plan of this configuration (its descriptor and layouts made, the heuristic's
 * candidates kept, the first in use until tune picks); NULL with an error when cuBLASLt has
 * no algorithm for it or every plan of the table is the MLP's. */
lt_plan *plan(cuda_impl *c, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
              int lda, int ldb, int ldd, cublasLtEpilogue_t epi, long long aux_ld, Dtype dt,
              mgpu_err_t *err, int *rc)
{
    *rc = 0;
    for (int i = 0; i < c->n_plans; i++) {
        lt_plan *p = &c->plans[i];
        if (p->g16 && p->m == m && p->n == n && p->k == k && p->lda == lda && p->ldb == ldb &&
            p->ldd == ldd && p->aux_ld == aux_ld && p->ta == ta && p->tb == tb && p->epi == epi &&
            p->d16 == (dt == kD16))
            return p->ok ? p : no_algorithm(m, n, k, epi, dt, err, rc);
    }
    lt_plan *p = nullptr;
    if (c->n_plans < kLtPlans) {
        p = &c->plans[c->n_plans++];
    } else {
        /* Full (sampling runs the forward at every length up to the context): replace one of
         * ours, in turn. A plan is host state only, read when a product is queued, so no
         * queued or captured product still needs the one replaced. */
        for (int i = 0; i < kLtPlans && p == nullptr; i++) {
            lt_plan *q = &c->plans[(c->g16_evict + i) % kLtPlans];
            if (q->g16) {
                p = q;
                c->g16_evict = (c->g16_evict + i + 1) % kLtPlans;
            }
        }
        if (p == nullptr) {
            *rc = mgpu_err_set(err, MGPU_E_DEVICE, "gpt bf16: the %d product plans are taken",
                               kLtPlans);
            return nullptr;
        }
        lt_plan_release(p);
    }
    *p = lt_plan{};
    p->m = m, p->n = n, p->k = k, p->lda = lda, p->ldb = ldb, p->ldd = ldd, p->aux_ld = aux_ld;
    p->ta = ta, p->tb = tb, p->epi = epi, p->prec = MGPU_PREC_BF16, p->d16 = dt == kD16;
    p->g16 = true;
    const bool ok =
        lt_plan_make(c, p, CUBLAS_COMPUTE_32F, CUDA_R_16BF, dt == kD16 ? CUDA_R_16BF : CUDA_R_32F);
    /* Products under kTuneMinFlops keep the first choice: the heuristic is close for them,
     * and sampling (a forward at every length) would pay a tuning per length. */
    p->tuned = c->opt.tune_off || p->n_cand < 2 || 2.0 * m * n * k < kTuneMinFlops;
    return ok ? p : no_algorithm(m, n, k, epi, dt, err, rc);
}

/* One product with the plan's current algorithm, in the shared workspace or (ws_bytes > 0)
 * in ws. */
cublasStatus_t launch(cuda_impl *c, lt_plan *p, const cublasLtMatmulAlgo_t *algo, const void *a,
                      const void *b, float beta, const void *cmat, void *d, void *ws = nullptr,
                      size_t ws_bytes = 0, cudaStream_t s = nullptr)
{
    const float one = 1.0f;
    if (ws == nullptr)
        ws = c->blas_ws, ws_bytes = kBlasWorkspace;
    return B.p_cublasLtMatmul(c->lt, p->desc, &one, a, p->la, b, p->lb, &beta,
                              cmat != nullptr ? cmat : d, p->ld, d, p->ld, algo, ws, ws_bytes,
                              s != nullptr ? s : c->stream);
}

/* The first eager product of a plan times the heuristic's candidates on its real operands
 * (a warm-up, then kTuneReps runs each) and keeps the fastest: the heuristic's first choice
 * is not always the fastest for the step's shapes. What the product accumulates into (beta 1,
 * or C the same memory as D) is saved first and put back after, so the real product that
 * follows sees nothing of it; everything else the candidates write, that product overwrites.
 * Never inside a capture (it synchronises): such a plan keeps its first choice until an eager
 * call, and only products of kTuneMinFlops or more. MGPU_LT_TUNE=0 keeps the heuristic's
 * first choice; MGPU_LT_VERBOSE=1 prints times. */
constexpr int kTuneReps = 3;

int tune(cuda_impl *c, lt_plan *p, const void *a, const void *b, float beta, const void *cmat,
         void *d, mgpu_err_t *err)
{
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    CUDA_CHECK(err, cudaStreamIsCapturing(c->stream, &cs));
    if (cs != cudaStreamCaptureStatusNone)
        return 0;
    p->tuned = true;
    const size_t dbytes = (size_t)p->ldd * p->n * (p->d16 ? 2 : 4);
    void *saved = nullptr;
    if (beta != 0.0f || cmat == d) {
        CUDA_CHECK(err, cudaMalloc(&saved, dbytes));
        CUDA_CHECK(err, cudaMemcpyAsync(saved, d, dbytes, cudaMemcpyDeviceToDevice, c->stream));
    }
    float best = 0.0f;
    int best_i = -1;
    for (int i = 0; i < p->n_cand; i++) {
        float ms = -1.0f;
        bool ok = launch(c, p, &p->cand[i], a, b, beta, cmat, d) == CUBLAS_STATUS_SUCCESS &&
                  cudaEventRecord(c->ev_t0, c->stream) == cudaSuccess;
        for (int r = 0; ok && r < kTuneReps; r++)
            ok = launch(c, p, &p->cand[i], a, b, beta, cmat, d) == CUBLAS_STATUS_SUCCESS;
        ok = ok && cudaEventRecord(c->ev_t1, c->stream) == cudaSuccess &&
             cudaEventSynchronize(c->ev_t1) == cudaSuccess &&
             cudaEventElapsedTime(&ms, c->ev_t0, c->ev_t1) == cudaSuccess;
        (void)cudaGetLastError(); /* a candidate's failure is not ours to report */
        if (c->opt.lt_verbose)
            fprintf(stderr,
                    "kernels(cuda): gpt bf16 tune m=%d n=%d k=%d epilogue %d: candidate %d "
                    "%.2f us%s\n",
                    p->m, p->n, p->k, (int)p->epi, i, ok ? 1000.0 * ms / kTuneReps : 0.0,
                    ok ? "" : " (failed)");
        if (ok && (best_i < 0 || ms < best))
            best = ms, best_i = i;
    }
    if (best_i >= 0)
        p->algo = p->cand[best_i], p->algo_ws = p->cand_ws[best_i];
    if (saved != nullptr) {
        CUDA_CHECK(err, cudaMemcpyAsync(d, saved, dbytes, cudaMemcpyDeviceToDevice, c->stream));
        CUDA_CHECK(err, cudaStreamSynchronize(c->stream));
        CUDA_CHECK(err, cudaFree(saved));
    }
    return 0;
}

/* A captured product's workspace slice of its own (cuda_impl::gws): nothing else in the
 * graph uses it, so the product may run beside any other. False when not capturing or when
 * the slices are full. */
bool take_slice(cuda_impl *c, const lt_plan *p, void **ws)
{
    const size_t take = (p->algo_ws + kGwsAlign - 1) / kGwsAlign * kGwsAlign;
    if (!c->gws_on || c->gws_used + take > kBlasWorkspace)
        return false;
    *ws = c->gws + c->gws_used;
    c->gws_used += take;
    return true;
}

/* D = op(A) op(B) (+ beta C, C = cmat in D's layout) with the plan's epilogue, on c->stream. */
int matmul(cuda_impl *c, lt_plan *p, const void *a, const void *b, float beta, const void *cmat,
           void *d, const void *bias, const void *aux, mgpu_err_t *err)
{
    if (bias != nullptr)
        CUBLAS_CHECK(err, B.p_cublasLtMatmulDescSetAttribute(
                              p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    if (aux != nullptr)
        CUBLAS_CHECK(err,
                     B.p_cublasLtMatmulDescSetAttribute(
                         p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
    int rc;
    if (!p->tuned && (rc = tune(c, p, a, b, beta, cmat, d, err)) < 0)
        return rc;
    /* In a capture, a slice of the capture's workspace of its own (take_slice), as big as the
     * algorithm needs; past the slices' end, or for an algorithm that needs none, the shared
     * one. */
    void *ws = nullptr;
    const bool sliced = p->algo_ws > 0 && take_slice(c, p, &ws);
    CUBLAS_CHECK(err, launch(c, p, &p->algo, a, b, beta, cmat, d, ws, sliced ? p->algo_ws : 0));
    return 0;
}

/* out (cols) += (fresh: =) the column sums of dout (rows x cols, bf16): slices of rows into the
 * scratch (slices x cols floats, below its counter word), then added in slice order. */
int colsum16(cuda_impl *c, int rows, int cols, const bf16_t *dout, float *out, bool fresh,
             mgpu_err_t *err)
{
    const long max_slices = (long)((kScratchFloats - 1) / (size_t)cols);
    if (max_slices < 1)
        return mgpu_err_set(err, MGPU_E_RANGE,
                            "gpt bf16 bias gradient: %d columns, expected at most %zu", cols,
                            kScratchFloats - 1);
    int rps = kColRowsPerSlice;
    if ((rows + rps - 1) / rps > max_slices)
        rps = (int)((rows + max_slices - 1) / max_slices);
    const int slices = (rows + rps - 1) / rps;
    const bool vec = cols % kColVec == 0 && aligned16(dout);
    if (vec) {
        dim3 grid((unsigned)((cols / kColVec + 31) / 32), (unsigned)slices);
        colsum16_kernel<<<grid, dim3(32, 8), 0, c->stream>>>(rows, cols, rps, dout, c->scratch);
    } else {
        dim3 grid((unsigned)((cols + kThreads - 1) / kThreads), (unsigned)slices);
        colsum16_any_kernel<<<grid, kThreads, 0, c->stream>>>(rows, cols, rps, dout, c->scratch);
    }
    CUDA_CHECK_LAUNCH(err, "colsum16_kernel (%d x %d)", rows, cols);
    colsum_finish_kernel<<<(unsigned)((cols + kThreads - 1) / kThreads), kThreads, 0, c->stream>>>(
        cols, slices, c->scratch, out, fresh);
    CUDA_CHECK_LAUNCH(err, "colsum_finish_kernel (%d columns, %d slices)", cols, slices);
    return 0;
}

/* cuBLASLt wants 16-byte aligned bf16 matrices with leading dimensions a multiple of 8. */
int check_shape(const char *op, int n, int c, int oc, mgpu_err_t *err)
{
    if (n < 1 || c < 1 || oc < 1 || c % 8 != 0 || oc % 8 != 0)
        return mgpu_err_set(err, MGPU_E_RANGE,
                            "gpt bf16 %s: n %d, c %d, oc %d: expected n >= 1 and c, oc positive "
                            "multiples of 8",
                            op, n, c, oc);
    return 0;
}

/* A matrix's row stride: at least its row, a multiple of 8 (16-byte aligned rows). */
int check_ld(const char *op, const char *name, size_t ld, int c, mgpu_err_t *err)
{
    if (ld < (size_t)c || ld % 8 != 0 || ld > (size_t)INT_MAX)
        return mgpu_err_set(err, MGPU_E_RANGE,
                            "gpt bf16 %s: %s's rows %zu elements apart, expected a multiple of 8 "
                            "of at least c = %d",
                            op, name, ld, c);
    return 0;
}

} /* namespace */

int gpt16_linear(void *impl, int n, int c, int oc, const mgpu_bf16_t *inp, const mgpu_bf16_t *w,
                 const mgpu_bf16_t *bias, mgpu_bf16_t *out, mgpu_bf16_t *pre, mgpu_err_t *err)
{
    cuda_impl *ci = (cuda_impl *)impl;
    int rc;
    if ((rc = check_shape("linear", n, c, oc, err)) < 0)
        return rc;
    cublasLtEpilogue_t epi = pre != nullptr    ? (bias != nullptr ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                                                  : CUBLASLT_EPILOGUE_GELU_AUX)
                             : bias != nullptr ? CUBLASLT_EPILOGUE_BIAS
                                               : CUBLASLT_EPILOGUE_DEFAULT;
    lt_plan *p = plan(ci, CUBLAS_OP_T, CUBLAS_OP_N, oc, n, c, c, c, oc, epi,
                      pre != nullptr ? oc : 0, kD16, err, &rc);
    if (p == nullptr)
        return rc;
    return matmul(ci, p, w, inp, 0.0f, nullptr, out, bias, pre, err);
}

int gpt16_linear_f32(void *impl, int n, int c, int oc, const mgpu_bf16_t *inp, const mgpu_bf16_t *w,
                     const float *bias, const float *res, float *out, mgpu_err_t *err)
{
    cuda_impl *ci = (cuda_impl *)impl;
    int rc;
    if ((rc = check_shape("linear_f32", n, c, oc, err)) < 0)
        return rc;
    invalidate(ci, out, sizeof(float) * (size_t)n * oc);
    cublasLtEpilogue_t epi = bias != nullptr ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    lt_plan *p = plan(ci, CUBLAS_OP_T, CUBLAS_OP_N, oc, n, c, c, c, oc, epi, 0, kD32, err, &rc);
    if (p == nullptr)
        return rc;
    return matmul(ci, p, w, inp, res != nullptr ? 1.0f : 0.0f, res, out, bias, nullptr, err);
}

int gpt16_linear_back_data(void *impl, int n, int c, int oc, const mgpu_bf16_t *dout,
                           const mgpu_bf16_t *w, size_t ldw, const mgpu_bf16_t *pre,
                           mgpu_bf16_t *din, mgpu_err_t *err)
{
    cuda_impl *ci = (cuda_impl *)impl;
    int rc;
    if ((rc = check_shape("linear_back_data", n, c, oc, err)) < 0 ||
        (rc = check_ld("linear_back_data", "w", ldw, c, err)) < 0)
        return rc;
    /* din^T (c x n) = w (column-major c x oc, ldw) . dout^T (oc x n) */
    cublasLtEpilogue_t epi = pre != nullptr ? CUBLASLT_EPILOGUE_DGELU : CUBLASLT_EPILOGUE_DEFAULT;
    lt_plan *p = plan(ci, CUBLAS_OP_N, CUBLAS_OP_N, c, n, oc, (int)ldw, oc, c, epi,
                      pre != nullptr ? c : 0, kD16, err, &rc);
    if (p == nullptr)
        return rc;
    return matmul(ci, p, w, dout, 0.0f, nullptr, din, nullptr, pre, err);
}

namespace
{

/* Whole GPT steps on an H100, weight gradients beside against after (tests/bench/GPT_RESULTS.md):
 * 1.6-1.9% faster at 16,384 tokens a step (124M at contexts 1024 and 2048), 1.0-1.7% at 8,192
 * with heads of 128 and at 774M, level at 350M; 0.7-1.1% slower at 1.5B's 4,096. */
constexpr int kBesideMinRows = 8192;

int back_weight(void *impl, int n, int c, int oc, const mgpu_bf16_t *dout, const mgpu_bf16_t *inp,
                size_t ldi, float *dw, float *dbias, int fresh, bool beside, mgpu_err_t *err)
{
    cuda_impl *ci = (cuda_impl *)impl;
    int rc;
    if ((rc = check_shape("linear_back_weight", n, c, oc, err)) < 0 ||
        (rc = check_ld("linear_back_weight", "inp", ldi, c, err)) < 0)
        return rc;
    invalidate(ci, dw, sizeof(float) * (size_t)oc * c);
    /* dw^T (c x oc) += (fresh: beta 0, =) inp^T (c x n) . dout (n x oc, dout^T stored oc x n).
     * cuBLASLt's own bias gradient (BGRADB) is a separate reduction kernel on the H200, slower than
     * ours. */
    if (dbias != nullptr)
        invalidate(ci, dbias, sizeof(float) * oc);
    lt_plan *p = plan(ci, CUBLAS_OP_N, CUBLAS_OP_T, c, oc, n, (int)ldi, oc, c,
                      CUBLASLT_EPILOGUE_DEFAULT, 0, kD32, err, &rc);
    if (p == nullptr)
        return rc;
    const float beta = fresh ? 0.0f : 1.0f;
    /* Beside the main stream (gpt_ops.h: linear_back_weight_beside): a captured product whose
     * plan was tuned eagerly before, on side stream 0 (in the order queued; cuda_join makes
     * the main stream wait). The column sums stay on the main stream, in the backend's
     * scratch: after the product on the side stream they made the joins wait longer (no gain
     * measured). By default only from kBesideMinRows rows (tokens a step) up. */
    beside = beside && (ci->opt.wg_beside == 1 || (ci->opt.wg_beside < 0 && n >= kBesideMinRows));
    void *ws = nullptr;
    if (beside && p->tuned && take_slice(ci, p, &ws)) {
        cuda_impl::side_stream &sd = ci->side[0];
        CUDA_CHECK(err, cudaEventRecord(ci->ev_fork, ci->stream));
        CUDA_CHECK(err, cudaStreamWaitEvent(sd.s, ci->ev_fork, 0));
        const cublasStatus_t st =
            launch(ci, p, &p->algo, inp, dout, beta, nullptr, dw, ws, p->algo_ws, sd.s);
        /* recorded whatever happened: a side stream that joined a capture must leave it */
        CUDA_CHECK(err, cudaEventRecord(sd.done, sd.s));
        sd.pending = true;
        CUBLAS_CHECK(err, st);
        ci->beside_products++;
    } else if ((rc = matmul(ci, p, inp, dout, beta, nullptr, dw, nullptr, nullptr, err)) < 0) {
        return rc;
    }
    return dbias == nullptr ? 0 : colsum16(ci, n, oc, (const bf16_t *)dout, dbias, fresh != 0, err);
}

} /* namespace */

int gpt16_linear_back_weight(void *impl, int n, int c, int oc, const mgpu_bf16_t *dout,
                             const mgpu_bf16_t *inp, size_t ldi, float *dw, float *dbias, int fresh,
                             mgpu_err_t *err)
{
    return back_weight(impl, n, c, oc, dout, inp, ldi, dw, dbias, fresh, false, err);
}

int gpt16_linear_back_weight_beside(void *impl, int n, int c, int oc, const mgpu_bf16_t *dout,
                                    const mgpu_bf16_t *inp, size_t ldi, float *dw, float *dbias,
                                    int fresh, mgpu_err_t *err)
{
    return back_weight(impl, n, c, oc, dout, inp, ldi, dw, dbias, fresh, true, err);
}

} /* namespace mgpu_cuda */
