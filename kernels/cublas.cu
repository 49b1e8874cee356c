/* cublas.cu - GEMM's libraries: cuBLAS and cuBLASLt opened at run time, the cuBLASLt planner
 * (plans, heuristic candidates timed on first use, the fused epilogues) and bf16 mode's operand
 * copies (the parameters' mirror, activations' kept copies, the conversion kernels). */
#include "cuda_impl.h"  /* cuda_impl, the device helpers, the other families' functions */
#include "cuda_check.h" /* CUDA_CHECK, CUDA_CHECK_LAUNCH, CUBLAS_CHECK */

#include <dlfcn.h>  /* dlopen: cuBLAS is opened, not linked */
#include <mutex>    /* std::call_once */
#include <stdint.h> /* uintptr_t */
#include <stdio.h>  /* fprintf: MGPU_LT_VERBOSE */

namespace mgpu_cuda
{
namespace
{

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

/* The cached plan for this configuration, created (and its heuristic asked) on first use;
 * NULL when the cache is full. Host-only work: safe inside a stream capture. */
lt_plan *lt_get(cuda_impl *c, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                int lda, int ldb, int ldd, cublasLtEpilogue_t epi, long long aux_ld,
                bool d16 = false)
{
    for (int i = 0; i < c->n_plans; i++) {
        lt_plan *p = &c->plans[i];
        if (!p->g16 && p->m == m && p->n == n && p->k == k && p->lda == lda && p->ldb == ldb &&
            p->ldd == ldd && p->aux_ld == aux_ld && p->ta == ta && p->tb == tb && p->epi == epi &&
            p->prec == c->prec && p->d16 == d16)
            return p;
    }
    if (c->n_plans == kLtPlans)
        return NULL;
    lt_plan *p = &c->plans[c->n_plans++];
    *p = lt_plan{};
    p->m = m, p->n = n, p->k = k, p->lda = lda, p->ldb = ldb, p->ldd = ldd, p->aux_ld = aux_ld;
    p->ta = ta, p->tb = tb, p->epi = epi, p->prec = c->prec, p->d16 = d16;
    cublasComputeType_t ct =
        c->prec == MGPU_PREC_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    cudaDataType_t ab = c->prec == MGPU_PREC_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    bool ok = lt_plan_make(c, p, ct, ab, d16 ? CUDA_R_16BF : CUDA_R_32F);
    if (c->opt.lt_verbose)
        fprintf(stderr, "kernels(cuda): cuBLASLt %s epilogue %d, m=%d n=%d k=%d, %s\n",
                ok ? "fused" : "DECLINED", (int)epi, m, n, k, mgpu_precision_name(c->prec));
    return p;
}

/* Where the bf16 operand (column-major rows_cm x cols_cm, ld) is, converting if needed;
 * *tmp_used: elements of the workspace taken. */
int bf16_operand(cuda_impl *c, int mode, const float *src, int rows_cm, int cols_cm, int ld,
                 __nv_bfloat16 *tmp, size_t *tmp_used, const __nv_bfloat16 **out, int *ld_out,
                 mgpu_err_t *err)
{
    if (mode == kTemp && c->mir != nullptr && c->mir_valid && !c->opt.shadow_off && ld % 8 == 0 &&
        src >= c->mir_src && src + (size_t)(cols_cm - 1) * ld + rows_cm <= c->mir_src + c->mir_n &&
        (size_t)(src - c->mir_src) % 8 == 0) {
        *out = c->mir + (src - c->mir_src);
        *ld_out = ld;
        return 0;
    }
    int ld16 = (rows_cm + 7) / 8 * 8;
    size_t need = (size_t)cols_cm * ld16;
    if (mode != kTemp && !c->opt.shadow_off) {
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
    if (c->opt.tune_off || p->n_cand < 2)
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
        if (c->opt.lt_verbose)
            fprintf(stderr,
                    "kernels(cuda): tune m=%d n=%d k=%d epilogue %d: candidate %d %.2f us\n", p->m,
                    p->n, p->k, (int)p->epi, i, 1000.0 * ms / reps);
        if (ms >= 0 && (best_i < 0 || ms < best))
            best = ms, best_i = i;
    }
    if (best_i >= 0)
        p->algo = p->cand[best_i], p->algo_ws = p->cand_ws[best_i];
    return 0;
}

} /* namespace */

blas_api B;

bool lt_plan_make(cuda_impl *c, lt_plan *p, cublasComputeType_t ct, cudaDataType_t ab,
                  cudaDataType_t dt)
{
    cublasLtMatmulPreference_t pref = NULL;
    uint64_t wsb = kBlasWorkspace;
    int nres = 0;
    cublasLtMatmulHeuristicResult_t res[kLtCand];
    const cublasOperation_t ta = p->ta, tb = p->tb;
    const int m = p->m, n = p->n, k = p->k;
    bool ok =
        B.p_cublasLtMatmulDescCreate(&p->desc, ct, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
        B.p_cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) ==
            CUBLAS_STATUS_SUCCESS &&
        B.p_cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) ==
            CUBLAS_STATUS_SUCCESS &&
        B.p_cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &p->epi,
                                           sizeof p->epi) == CUBLAS_STATUS_SUCCESS &&
        (p->aux_ld == 0 || B.p_cublasLtMatmulDescSetAttribute(
                               p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &p->aux_ld,
                               sizeof(int64_t)) == CUBLAS_STATUS_SUCCESS) &&
        B.p_cublasLtMatrixLayoutCreate(&p->la, ab, ta == CUBLAS_OP_N ? m : k,
                                       ta == CUBLAS_OP_N ? k : m,
                                       p->lda) == CUBLAS_STATUS_SUCCESS &&
        B.p_cublasLtMatrixLayoutCreate(&p->lb, ab, tb == CUBLAS_OP_N ? k : n,
                                       tb == CUBLAS_OP_N ? n : k,
                                       p->ldb) == CUBLAS_STATUS_SUCCESS &&
        B.p_cublasLtMatrixLayoutCreate(&p->ld, dt, m, n, p->ldd) == CUBLAS_STATUS_SUCCESS &&
        B.p_cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS &&
        B.p_cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &wsb, sizeof wsb) == CUBLAS_STATUS_SUCCESS &&
        B.p_cublasLtMatmulAlgoGetHeuristic(c->lt, p->desc, p->la, p->lb, p->ld, p->ld, pref,
                                           kLtCand, res, &nres) == CUBLAS_STATUS_SUCCESS &&
        nres > 0 && res[0].state == CUBLAS_STATUS_SUCCESS;
    if (pref != NULL)
        (void)B.p_cublasLtMatmulPreferenceDestroy(pref);
    for (int i = 0; ok && i < nres; i++)
        if (res[i].state == CUBLAS_STATUS_SUCCESS) {
            p->cand_ws[p->n_cand] = res[i].workspaceSize;
            p->cand[p->n_cand++] = res[i].algo;
        }
    if (ok)
        p->algo = p->cand[0], p->algo_ws = p->cand_ws[0];
    p->ok = ok;
    return ok;
}

void lt_plan_release(lt_plan *p)
{
    if (p->la != NULL)
        (void)B.p_cublasLtMatrixLayoutDestroy(p->la);
    if (p->lb != NULL)
        (void)B.p_cublasLtMatrixLayoutDestroy(p->lb);
    if (p->ld != NULL)
        (void)B.p_cublasLtMatrixLayoutDestroy(p->ld);
    if (p->desc != NULL)
        (void)B.p_cublasLtMatmulDescDestroy(p->desc);
    *p = lt_plan{};
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
    /* four at a time: 16-byte loads, and 4-byte stores of pairs, so dst's rows stay even */
    bool vec = cols % 4 == 0 && lds % 4 == 0 && aligned16(src) && ldd % 2 == 0 &&
               ((uintptr_t)dst & 3u) == 0;
    if (vec && lds == cols && ldd == cols && ((uintptr_t)dst & 7u) == 0) {
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

/* D = op(A) op(B) with the epilogue, column-major, queued on st with the cuBLASLt workspace
 * ws (kBlasWorkspace bytes); returns MGPU_K_DECLINED when cuBLASLt has no algorithm for it
 * (nothing queued then). mode_a, mode_b: how bf16 mode gets each operand (kTemp, kStore,
 * kReuse above; bf16 operands are converted on c->stream, so bf16 products use it). */
int lt_matmul(cuda_impl *c, cudaStream_t st, void *ws, cublasOperation_t ta, cublasOperation_t tb,
              int m, int n, int k, const float *a, int lda, const float *b, int ldb, void *d,
              int ldd, cublasLtEpilogue_t epi, const void *bias, const void *aux, long long aux_ld,
              int mode_a, int mode_b, mgpu_err_t *err, bool d16)
{
    if (c->opt.lt_off)
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
        if (c->opt.lt_verbose)
            fprintf(stderr, "kernels(cuda): cuBLASLt NOT_SUPPORTED at launch, epilogue %d\n",
                    (int)epi);
        return MGPU_K_DECLINED;
    }
    CUBLAS_CHECK(err, bst);
    return 0;
}

} /* namespace mgpu_cuda */

using namespace mgpu_cuda;

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
