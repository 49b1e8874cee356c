/* gpt_attention_tc_bwd.cu - the backward of the tensor-core attention (gpt_attention_tc.h):
 * the backend's bf16 precision's (fp32 dout, qkv, out and dqkv) and the bf16 path's (bf16). */
#include "gpt_attention_tc.h" /* the tiles, fragments, views and planes; cuda_impl */

namespace mgpu_cuda
{
namespace
{

/* D = rowsum(dout * out) of bf16 dout (row stride ldd) and out (row stride c) whose head rows
 * are 16-byte chunks (hs = HS), a float a (batch row, head, query), before the backward's two
 * passes (which then run side by side and both read it): a thread a chunk of a row and head,
 * the HS / 8 consecutive lanes of a row's chunks adding their parts in a fixed order. */
template <int HS>
__global__ void __launch_bounds__(kCvtThreads)
    att_dsum16_kernel(int t, int c, int nh, size_t rows, const bf16 *dout, size_t ldd,
                      const bf16 *out, float *dsum)
{
    constexpr int CPR = HS / 8;
    const size_t i = (size_t)blockIdx.x * kCvtThreads + threadIdx.x;
    const size_t rh = i / CPR, row = rh / nh;
    const int ch = (int)(i % CPR), h = (int)(rh % nh);
    const bool in = row < rows;
    float dot = 0.0f;
    if (in) {
        const size_t col = (size_t)h * HS + ch * 8;
        const uint4 a = *reinterpret_cast<const uint4 *>(dout + row * ldd + col);
        const uint4 o = *reinterpret_cast<const uint4 *>(out + row * (size_t)c + col);
        const __nv_bfloat162 *pa = reinterpret_cast<const __nv_bfloat162 *>(&a);
        const __nv_bfloat162 *po = reinterpret_cast<const __nv_bfloat162 *>(&o);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float2 fa = __bfloat1622float2(pa[k]), fo = __bfloat1622float2(po[k]);
            dot += fa.x * fo.x + fa.y * fo.y;
        }
    }
#pragma unroll
    for (int m = 1; m < CPR; m <<= 1) /* every lane of the warp is here: no early return */
        dot += __shfl_xor_sync(0xffffffffu, dot, m);
    if (in && ch == 0)
        dsum[(row / t * nh + h) * t + row % t] = dot;
}

/* Backward, query pass: dq = scale * ds . k over the key tiles, ds = p * (dp - D), p =
 * exp(scale * s - lse), s = q . k^T and dp = dout . v^T. A block of W warps owns 16 MT W
 * queries, MT tiles of 16 a warp (q's and dout's fragments and dq in registers), and takes a
 * key tile KC keys at a time (s and dp of 16 MT x KC: with two row tiles, 32 keys keep them in
 * registers beside the rest), skipping those past the warp's last query. Blocks are launched
 * last queries first (they have the most keys). */
template <int HS, class OutT, int W, int MT, int KC>
__global__ void __launch_bounds__(W * 32)
    att_bwd_q_tc_kernel(int t, int c, int nh, View qv, View kv, View vv, View dov, const float *lse,
                        const float *dsum, OutT *dqkv, float scale)
{
    static_assert(W * MT % kTcWarps == 0, "a block's queries are whole tiles");
    static_assert(kTcRows % KC == 0 && KC % 16 == 0, "a tile is whole steps of 16 keys");
    using L = Tc<HS>;
    constexpr int NT = W * 32, WR = 16 * MT, ROWS = WR * W;
    extern __shared__ __align__(128) unsigned char tc_smem[];
    bf16 *qs = (bf16 *)tc_smem, *dos = qs + ROWS / kTcRows * L::TILE;
    bf16 *ks = dos + ROWS / kTcRows * L::TILE, *vs = ks + 2 * L::TILE; /* k, v: 2 each */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
    const int h = blockIdx.y, bi = blockIdx.z, hs = c / nh;
    const bf16 *kh = kv.at(bi, h), *vh = vv.at(bi, h);
    const size_t lbase = ((size_t)bi * nh + h) * t;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * ROWS;
    const int wfirst = q0 + warp * WR, wlast = wfirst + WR - 1; /* the warp's queries */
    const int qa = wfirst + g; /* the lane's rows: qa + 16 m + 8 r */
    const float sl2 = scale * kLog2e;

#pragma unroll
    for (int r = 0; r < ROWS; r += kTcRows) {
        tile_async<HS, NT>(qs + r * L::LD, qv.at(bi, h), qv.ld, q0 + r, t);
        tile_async<HS, NT>(dos + r * L::LD, dov.at(bi, h), dov.ld, q0 + r, t);
    }
    tile_async<HS, NT>(ks, kh, kv.ld, 0, t);
    tile_async<HS, NT>(vs, vh, vv.ld, 0, t);
    cp_commit();
    /* rows past t: p and ds are not stored; any finite value does */
    float ls[MT][2], dd[MT][2];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int q = qa + m * 16 + r * 8;
            ls[m][r] = q < t ? lse[lbase + q] * kLog2e : 0.0f;
            dd[m][r] = q < t ? dsum[lbase + q] : 0.0f;
        }
    uint32_t qf[MT][HS / 16][4], df[MT][HS / 16][4];
    float dq[MT][HS / 8][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int n = 0; n < HS / 8; n++)
            dq[m][n][0] = dq[m][n][1] = dq[m][n][2] = dq[m][n][3] = 0.0f;

    const int ntiles = (min(t, q0 + ROWS) + kTcRows - 1) / kTcRows;
    for (int j = 0; j < ntiles; j++) {
        const int k0 = j * kTcRows;
        const bf16 *kt = ks + (j & 1) * L::TILE, *vt = vs + (j & 1) * L::TILE;
        if (j + 1 < ntiles) {
            tile_async<HS, NT>(ks + ((j + 1) & 1) * L::TILE, kh, kv.ld, k0 + kTcRows, t);
            tile_async<HS, NT>(vs + ((j + 1) & 1) * L::TILE, vh, vv.ld, k0 + kTcRows, t);
            cp_commit();
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
        if (j == 0) {
#pragma unroll
            for (int m = 0; m < MT; m++) {
                load_a<HS>(qf[m], qs, warp * WR + m * 16, lane);
                load_a<HS>(df[m], dos, warp * WR + m * 16, lane);
            }
        }
#pragma unroll
        for (int c0 = 0; c0 < kTcRows; c0 += KC) {
            if (k0 + c0 > wlast) /* every key from here on comes after the warp's queries */
                break;
            const bf16 *kc = kt + c0 * L::LD, *vc = vt + c0 * L::LD;
            float s[MT][KC / 8][4], dp[MT][KC / 8][4];
            rows_by_tile<HS>(s, qf, kc, lane);
            rows_by_tile<HS>(dp, df, vc, lane);
            auto grads = [&](auto masked) {
#pragma unroll
                for (int m = 0; m < MT; m++)
#pragma unroll
                    for (int n = 0; n < KC / 8; n++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const int key = k0 + c0 + n * 8 + 2 * tig + (e & 1), r = e >> 1;
                            const float p = !decltype(masked)::value || key <= qa + m * 16 + r * 8
                                                ? ex2(fmaf(s[m][n][e], sl2, -ls[m][r]))
                                                : 0.0f;
                            s[m][n][e] = p * (dp[m][n][e] - dd[m][r]);
                        }
            };
            /* the mask only on keys past the warp's first query */
            if (k0 + c0 + KC - 1 <= wfirst)
                grads(std::false_type());
            else
                grads(std::true_type());
            acc_by_tile<HS>(dq, s, kc, lane);
        }
        __syncthreads();
    }
#pragma unroll
    for (int m = 0; m < MT; m++)
        store_acc<HS>(dq[m], dqkv + (size_t)bi * t * 3 * c + (size_t)h * hs, 3 * (size_t)c,
                      qa + m * 16, t, hs, scale, scale, tig);
}

/* s (16 MT x 8 NB) = a . tile^T as rows_by_tile, a's fragments read from shared memory (MT
 * tiles of 16 rows from arows on) step by step rather than held. */
template <int HS, int MT, int NB>
__device__ __forceinline__ void rows_by_tile_s(float (&s)[MT][NB][4], const bf16 *arows,
                                               const bf16 *tile, int lane)
{
    zero_acc(s);
#pragma unroll
    for (int k = 0; k < HS / 16; k++) {
        uint32_t a[MT][4];
#pragma unroll
        for (int m = 0; m < MT; m++)
            ldsm4(a[m], arows + m * 16 * Tc<HS>::LD + k * 16 + off_a(lane, Tc<HS>::LD));
        rows_by_tile_step<HS>(s, a, tile, k, lane);
    }
}

/* Backward, key pass: a warp owns 16 MT keys, MT tiles of 16; over the query tiles from the
 * block's first key on, QC queries at a time, dv += p^T . dout and dk += ds^T . q, with s^T =
 * k . q^T and dp^T = v . dout^T computed keys by queries, so that p^T and ds^T are
 * accumulators ready to be A operands; dk is scaled at the end. k's and v's fragments are
 * read from their tiles where they are used rather than held (registers go to dk and dv). A
 * block of W warps owns 16 MT W keys. Blocks are launched first keys first (they have the
 * most queries). Queries past t read zeros (q, dout, lse, D), so their p is 1 and their terms
 * are 0. */
template <int HS, class OutT, int W, int MT, int QC>
__global__ void __launch_bounds__(W * 32, kKvBlocksW<HS, W, MT>)
    att_bwd_kv_tc_kernel(int t, int c, int nh, View qv, View kv, View vv, View dov,
                         const float *lse, const float *dsum, OutT *dqkv, float scale)
{
    static_assert(W * MT % kTcWarps == 0, "a block's keys are whole tiles");
    static_assert(kTcRows % QC == 0 && QC % 16 == 0, "a tile is whole steps of 16 queries");
    using L = Tc<HS>;
    constexpr int NT = W * 32, WR = 16 * MT, ROWS = WR * W;
    extern __shared__ __align__(128) unsigned char tc_smem[];
    bf16 *ks = (bf16 *)tc_smem, *vs = ks + ROWS / kTcRows * L::TILE;
    bf16 *qs = vs + ROWS / kTcRows * L::TILE, *dos = qs + 2 * L::TILE; /* q, dout: 2 each */
    float *ls = (float *)(dos + 2 * L::TILE), *dd = ls + 2 * kTcRows;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
    const int h = blockIdx.y, bi = blockIdx.z, hs = c / nh;
    const bf16 *qh = qv.at(bi, h), *doh = dov.at(bi, h);
    const size_t lbase = ((size_t)bi * nh + h) * t;
    const int k0 = blockIdx.x * ROWS, w0 = warp * WR;
    const int wfirst = k0 + w0, wlast = wfirst + WR - 1; /* the warp's keys */
    const int ka = wfirst + g;                           /* the lane's rows: ka + 16 m + 8 r */
    const float sl2 = scale * kLog2e;

#pragma unroll
    for (int r = 0; r < ROWS; r += kTcRows) {
        tile_async<HS, NT>(ks + r * L::LD, kv.at(bi, h), kv.ld, k0 + r, t);
        tile_async<HS, NT>(vs + r * L::LD, vv.at(bi, h), vv.ld, k0 + r, t);
    }
    float dk[MT][HS / 8][4], dv[MT][HS / 8][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int n = 0; n < HS / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                dk[m][n][e] = dv[m][n][e] = 0.0f;

    const int ntiles = (t - k0 + kTcRows - 1) / kTcRows;
    for (int j = 0; j < ntiles + 1; j++) {
        /* step j issues query tile j (buffer j & 1) and uses tile j - 1 */
        if (j < ntiles) {
            const int q0 = k0 + j * kTcRows, bsel = j & 1;
            tile_async<HS, NT>(qs + bsel * L::TILE, qh, qv.ld, q0, t);
            tile_async<HS, NT>(dos + bsel * L::TILE, doh, dov.ld, q0, t);
            if (threadIdx.x < kTcRows) {
                const int qi = q0 + threadIdx.x;
                const bool in = qi < t;
                cp_async4(ls + bsel * kTcRows + threadIdx.x, lse + lbase + (in ? qi : 0), in);
                cp_async4(dd + bsel * kTcRows + threadIdx.x, dsum + lbase + (in ? qi : 0), in);
            }
            cp_commit();
        }
        if (j == 0)
            continue;
        if (j < ntiles)
            cp_wait<1>();
        else
            cp_wait<0>();
        __syncthreads();
        const int q0 = k0 + (j - 1) * kTcRows, bsel = (j - 1) & 1;
        const bf16 *qt = qs + bsel * L::TILE, *dot = dos + bsel * L::TILE;
        const float *lt = ls + bsel * kTcRows, *dt = dd + bsel * kTcRows;
#pragma unroll
        for (int c0 = 0; c0 < kTcRows; c0 += QC) {
            /* else every query of the step comes before the warp's keys */
            if (q0 + c0 + QC - 1 < wfirst)
                continue;
            float s[MT][QC / 8][4], dp[MT][QC / 8][4];
            if constexpr (MT == 1) { /* one tile's fragments held for the step */
                uint32_t af[1][HS / 16][4];
                load_a<HS>(af[0], ks, w0, lane);
                rows_by_tile<HS>(s, af, qt + c0 * L::LD, lane); /* s^T: keys x queries */
                load_a<HS>(af[0], vs, w0, lane);
                rows_by_tile<HS>(dp, af, dot + c0 * L::LD, lane); /* dp^T */
            } else {
                rows_by_tile_s<HS>(s, ks + w0 * L::LD, qt + c0 * L::LD, lane);
                rows_by_tile_s<HS>(dp, vs + w0 * L::LD, dot + c0 * L::LD, lane);
            }
            auto grads = [&](auto masked) {
#pragma unroll
                for (int m = 0; m < MT; m++)
#pragma unroll
                    for (int n = 0; n < QC / 8; n++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const int col = c0 + n * 8 + 2 * tig + (e & 1);
                            const int key = ka + m * 16 + (e >> 1) * 8;
                            const float p = !decltype(masked)::value || key <= q0 + col
                                                ? ex2(fmaf(s[m][n][e], sl2, -lt[col] * kLog2e))
                                                : 0.0f;
                            s[m][n][e] = p;
                            dp[m][n][e] = p * (dp[m][n][e] - dt[col]);
                        }
            };
            /* the mask only on steps with queries before the warp's last key */
            if (q0 + c0 >= wlast)
                grads(std::false_type());
            else
                grads(std::true_type());
            acc_by_tile<HS>(dv, s, dot + c0 * L::LD, lane);
            acc_by_tile<HS>(dk, dp, qt + c0 * L::LD, lane);
        }
        __syncthreads(); /* the buffer is free for step j + 1's tile */
    }
    OutT *rows = dqkv + (size_t)bi * t * 3 * c + (size_t)h * hs;
#pragma unroll
    for (int m = 0; m < MT; m++) {
        store_acc<HS>(dk[m], rows + c, 3 * (size_t)c, ka + m * 16, t, hs, scale, scale, tig);
        store_acc<HS>(dv[m], rows + 2 * (size_t)c, 3 * (size_t)c, ka + m * 16, t, hs, 1.0f, 1.0f,
                      tig);
    }
}

/* The key pass's stream and its two events (cuda_impl's att_*), created on the first call
 * outside a graph capture, which cannot hold their creation; *ready: they exist (else the
 * passes run one after the other on ci->stream). */
int att_side_ready(cuda_impl *ci, bool *ready, mgpu_err_t *err)
{
    *ready = false;
    if (ci->att_join == nullptr) {
        cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
        CUDA_CHECK(err, cudaStreamIsCapturing(ci->stream, &st));
        if (st != cudaStreamCaptureStatusNone)
            return 0;
        if (ci->att_side == nullptr)
            CUDA_CHECK(err, cudaStreamCreateWithFlags(&ci->att_side, cudaStreamNonBlocking));
        if (ci->att_fork == nullptr)
            CUDA_CHECK(err, cudaEventCreateWithFlags(&ci->att_fork, cudaEventDisableTiming));
        CUDA_CHECK(err, cudaEventCreateWithFlags(&ci->att_join, cudaEventDisableTiming));
    }
    *ready = true;
    return 0;
}

/* The backward: D first where out is given (bf16 out, dout a row view; else D is in dsum
 * already), then the query pass in blocks of WQ warps of MQ row tiles, KQ keys a step
 * (att_bwd_q_tc_kernel's W, MT, KC), on ci->stream and the key pass in blocks of WKV warps of
 * MKV row tiles, QKV queries a step, beside it on att_side, forked from ci->stream after D and
 * joined back, so that the next op on ci->stream waits for both. The passes read the same
 * inputs and write disjoint columns of dqkv (dq; dk, dv), each in its fixed order, and each
 * leaves SMs idle in its tail and at its low occupancy that the other fills. Each holds its
 * own rows' tiles (two of q and dout; or of k and v) and two buffers each of the other two.
 * wg_asked (bf16 row views only): the same passes on the same streams run as
 * gpt_attention_wg.cu's warpgroup kernels instead. */
template <int HS, class OutT, int WQ, int MQ, int KQ, int WKV, int MKV, int QKV>
int launch_bwd(cuda_impl *ci, int b, int t, int c, int nh, View qv, View kv, View vv, View dov,
               const float *lse, float *dsum, const bf16 *out, OutT *dqkv, float scale,
               mgpu_err_t *err, bool wg_asked = false)
{
    using L = Tc<HS>;
    const bool wg = wg_asked && std::is_same<OutT, bf16>::value; /* the wgmma passes are bf16 */
    constexpr int RQ = 16 * MQ * WQ, RKV = 16 * MKV * WKV;
    const size_t smem = (2 * RQ / kTcRows + 4) * L::BYTES;
    const size_t smem_kv = (2 * RKV / kTcRows + 4) * L::BYTES + 4 * kTcRows * sizeof(float);
    bool side = false;
    int rc;
    if ((rc = wg ? gpt16_attention_backward_wg_prepare(HS, err)
                 : prepare(att_bwd_q_tc_kernel<HS, OutT, WQ, MQ, KQ>, smem, err)) < 0 ||
        (!wg && (rc = prepare(att_bwd_kv_tc_kernel<HS, OutT, WKV, MKV, QKV>, smem_kv, err)) < 0) ||
        (rc = att_side_ready(ci, &side, err)) < 0)
        return rc;
    const char *tn = std::is_same<OutT, float>::value ? "fp32" : "bf16";
    if (out != nullptr) {
        const size_t rows = (size_t)b * t, chunks = rows * nh * (HS / 8);
        att_dsum16_kernel<HS>
            <<<(unsigned)((chunks + kCvtThreads - 1) / kCvtThreads), kCvtThreads, 0, ci->stream>>>(
                t, c, nh, rows, dov.p, dov.ld, out, dsum);
        CUDA_CHECK_LAUNCH(err, "att_dsum16_kernel<%d> (b=%d t=%d c=%d nh=%d)", HS, b, t, c, nh);
    }
    cudaStream_t kv_stream = ci->stream;
    if (side) {
        CUDA_CHECK(err, cudaEventRecord(ci->att_fork, ci->stream));
        CUDA_CHECK(err, cudaStreamWaitEvent(ci->att_side, ci->att_fork, 0));
        kv_stream = ci->att_side;
    }
    /* The key pass first: it is the longer. The launches' statuses are reported after the
     * join, which is made whatever they were, so that ci->stream never runs ahead of
     * att_side. */
    cudaError_t kv_rc = cudaSuccess, q_rc = cudaSuccess;
    if constexpr (std::is_same<OutT, bf16>::value) {
        if (wg) { /* q, k, v and dout row views of qkv and dout (gpt16_attention_backward) */
            kv_rc = gpt16_attention_backward_wg_launch(ci, true, kv_stream, b, t, c, nh, qv.p,
                                                       dov.p, lse, dsum, dqkv, scale);
            q_rc = gpt16_attention_backward_wg_launch(ci, false, ci->stream, b, t, c, nh, qv.p,
                                                      dov.p, lse, dsum, dqkv, scale);
        }
    }
    if (!wg) {
        dim3 grid_kv((unsigned)((t + RKV - 1) / RKV), (unsigned)nh, (unsigned)b);
        att_bwd_kv_tc_kernel<HS, OutT, WKV, MKV, QKV><<<grid_kv, WKV * 32, smem_kv, kv_stream>>>(
            t, c, nh, qv, kv, vv, dov, lse, dsum, dqkv, scale);
        kv_rc = cudaGetLastError();
        dim3 grid_q((unsigned)((t + RQ - 1) / RQ), (unsigned)nh, (unsigned)b);
        att_bwd_q_tc_kernel<HS, OutT, WQ, MQ, KQ><<<grid_q, WQ * 32, smem, ci->stream>>>(
            t, c, nh, qv, kv, vv, dov, lse, dsum, dqkv, scale);
        q_rc = cudaGetLastError();
    }
    if (side) {
        CUDA_CHECK(err, cudaEventRecord(ci->att_join, ci->att_side));
        CUDA_CHECK(err, cudaStreamWaitEvent(ci->stream, ci->att_join, 0));
    }
    const bool kv_bad = kv_rc != cudaSuccess;
    if (kv_bad || q_rc != cudaSuccess)
        return mgpu_err_set(
            err, MGPU_E_CUDA,
            "%s:%d: launch of %s<%d, %s, %d warps of %d rows> (b=%d t=%d c=%d nh=%d): %s "
            "(%s)",
            __FILE__, __LINE__,
            wg ? (kv_bad ? "att_bwd_kv_wg_kernel" : "att_bwd_q_wg_kernel")
               : (kv_bad ? "att_bwd_kv_tc_kernel" : "att_bwd_q_tc_kernel"),
            HS, tn, kv_bad ? WKV : WQ, 16 * (kv_bad ? MKV : MQ), b, t, c, nh,
            cudaGetErrorString(kv_bad ? kv_rc : q_rc), cudaGetErrorName(kv_bad ? kv_rc : q_rc));
    return 0;
}
} /* namespace */

int gpt_attention_backward_tc(cuda_impl *ci, int b, int t, int c, int nh, const float *dout,
                              const float *qkv, const float *out, const float *lse, float *dqkv,
                              float *dsum, float scale, mgpu_err_t *err)
{
    return with_tc_hs(c / nh, [&](auto hc) {
        constexpr int HS = decltype(hc)::value;
        const size_t plane = (size_t)b * t * nh * HS;
        /* D may be in the workspace (the caller's choice for long shapes): the planes follow */
        const size_t off =
            (void *)dsum == ci->ws ? ((size_t)b * nh * t * sizeof(float) + 255) / 256 * 256 : 0;
        bf16 *qh;
        int rc = to_heads<HS, float>(ci, b, t, c, nh, 0, 4, qkv, dout, out, off, &qh, &dsum, err);
        if (rc < 0)
            return rc;
        return launch_bwd<HS, float, kTcWarps, 1, kTcRows, kTcWarps, 1, kTcRows>(
            ci, b, t, c, nh, plane_view(qh, t, nh, HS), plane_view(qh + plane, t, nh, HS),
            plane_view(qh + 2 * plane, t, nh, HS), plane_view(qh + 3 * plane, t, nh, HS), lse, dsum,
            nullptr, dqkv, scale, err);
    });
}

int gpt16_attention_backward(void *impl, int b, int t, int c, int nh, const mgpu_bf16_t *dout16,
                             const mgpu_bf16_t *qkv16, const mgpu_bf16_t *out16, const float *lse,
                             mgpu_bf16_t *dqkv16, mgpu_err_t *err)
{
    cuda_impl *ci = (cuda_impl *)impl;
    int rc = check16("attention_backward", b, t, c, nh, err);
    if (rc < 0)
        return rc;
    const bf16 *dout = reinterpret_cast<const bf16 *>(dout16);
    const bf16 *qkv = reinterpret_cast<const bf16 *>(qkv16);
    const bf16 *out = reinterpret_cast<const bf16 *>(out16);
    bf16 *dqkv = reinterpret_cast<bf16 *>(dqkv16);
    invalidate(ci, dqkv, sizeof(bf16) * b * (size_t)t * 3 * c);
    if (b == 0 || t == 0)
        return 0;
    /* D = rowsum(dout * out) in fp32, a float a (batch row, head, query): in the backend's
     * scratch when it fits below the reductions' counter (the GPT-2 shapes), else in the
     * workspace's first bytes, grown on a first eager call. */
    const size_t nd = (size_t)b * nh * t;
    float *dsum = ci->scratch;
    if (nd > kScratchFloats - 1) {
        if ((rc = cuda_join(impl, err)) < 0 || (rc = ensure_ws(ci, nd * sizeof(float), err)) < 0)
            return rc;
        dsum = (float *)ci->ws;
    }
    const int hs = c / nh;
    const float scale = (float)(1.0 / sqrt((double)hs));
    return with_tc_hs(hs, [&](auto hc) {
        constexpr int HS = decltype(hc)::value;
        if (hs == HS && aligned16(qkv, dout, out)) {
            const size_t ld = 3 * (size_t)c;
            return launch_bwd<HS, bf16, kBwd16QW<HS>, kBwd16QMT<HS>, kBwd16QKC<HS>, kBwd16KvW<HS>,
                              kBwd16KvMT<HS>, kBwd16KvQC<HS>>(
                ci, b, t, c, nh, row_view(qkv, t, ld, hs), row_view(qkv + c, t, ld, hs),
                row_view(qkv + 2 * (size_t)c, t, ld, hs), row_view(dout, t, (size_t)c, hs), lse,
                dsum, out, dqkv, scale, err, gpt16_attention_wg_ok(ci, hs));
        }
        const size_t plane = (size_t)b * t * nh * HS;
        const size_t off = (void *)dsum == ci->ws ? (nd * sizeof(float) + 255) / 256 * 256 : 0;
        bf16 *qh;
        int rc2 = to_heads<HS, bf16>(ci, b, t, c, nh, 0, 4, qkv, dout, out, off, &qh, &dsum, err);
        if (rc2 < 0)
            return rc2;
        return launch_bwd<HS, bf16, kBwd16QW<HS>, kBwd16QMT<HS>, kBwd16QKC<HS>, kBwd16KvW<HS>,
                          kBwd16KvMT<HS>, kBwd16KvQC<HS>>(
            ci, b, t, c, nh, plane_view(qh, t, nh, HS), plane_view(qh + plane, t, nh, HS),
            plane_view(qh + 2 * plane, t, nh, HS), plane_view(qh + 3 * plane, t, nh, HS), lse, dsum,
            nullptr, dqkv, scale, err);
    });
}
} /* namespace mgpu_cuda */
