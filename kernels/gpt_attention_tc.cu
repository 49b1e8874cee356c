/* gpt_attention_tc.cu - the forward of the tensor-core attention (gpt_attention_tc.h): the
 * backend's bf16 precision's (fp32 qkv and out) and the bf16 path's (bf16 qkv and out). */
#include "gpt_attention_tc.h" /* the tiles, fragments, views and planes; cuda_impl */

namespace mgpu_cuda
{
namespace
{

/* Forward: a block of W warps owns 16 W queries, 16 a warp; the warp's rows g and g + 8 keep
 * their running maximum (log2 units) and sum in the four lanes of a row (a row's columns are
 * spread over them: shuffles 1 and 2). Blocks are launched last queries first (they have the
 * most keys). q is an fp32 qkv's (q32, which a block of four warps converts) or a bf16 view's
 * (qv, read as k and v are: Q16); out is fp32 or bf16.
 *
 * k and v tiles come in kFwdStages<W> buffers each: tile j is used while tiles up to j +
 * stages - 2 arrive. One barrier a tile: once every warp has passed it, tile j is in and
 * every warp is done with tile j - 1, whose buffer then takes tile j + stages - 1. */
template <int W> constexpr int kFwdStages = W == kTcWarps ? 2 : 3;

template <int HS, bool Q16, class OutT, int W>
__global__ void __launch_bounds__(W * 32, kFwdBlocksW<HS, W>)
    att_fwd_tc_kernel(int t, int c, int nh, const float *q32, View qv, View kv, View vv, OutT *out,
                      float *lse, float scale, bool vec)
{
    static_assert(Q16 || W == kTcWarps, "q_tile converts a tile with four warps");
    static_assert(W % kTcWarps == 0, "a block's queries are whole tiles");
    using L = Tc<HS>;
    constexpr int NT = W * 32, ROWS = 16 * W;
    extern __shared__ __align__(128) unsigned char tc_smem[];
    bf16 *qs = (bf16 *)tc_smem, *ks = qs + ROWS / kTcRows * L::TILE;
    constexpr int ST = kFwdStages<W>;
    bf16 *vs = ks + ST * L::TILE; /* k, v: ST each */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
    const int h = blockIdx.y, bi = blockIdx.z, hs = c / nh;
    const bf16 *kh = kv.at(bi, h), *vh = vv.at(bi, h);
    const int q0 = (gridDim.x - 1 - blockIdx.x) * ROWS;
    const int qa = q0 + warp * 16 + g, qb = qa + 8; /* the lane's two rows */
    const int wlast = q0 + warp * 16 + 15;
    const float sl2 = scale * kLog2e;

    if constexpr (Q16) {
#pragma unroll
        for (int r = 0; r < ROWS; r += kTcRows)
            tile_async<HS, NT>(qs + r * L::LD, qv.at(bi, h), qv.ld, q0 + r, t);
    }
    const int ntiles = (min(t, q0 + ROWS) + kTcRows - 1) / kTcRows;
    /* tiles 0 .. ST - 2, a commit group each (empty past the last tile, so that group i is
     * always tile i) */
#pragma unroll
    for (int i = 0; i < ST - 1; i++) {
        if (i < ntiles) {
            tile_async<HS, NT>(ks + i * L::TILE, kh, kv.ld, i * kTcRows, t);
            tile_async<HS, NT>(vs + i * L::TILE, vh, vv.ld, i * kTcRows, t);
        }
        cp_commit();
    }
    if constexpr (!Q16)
        q_tile<HS>(qs, q32 + (size_t)bi * t * 3 * c + (size_t)h * hs, 3 * (size_t)c, q0, t, hs,
                   vec);
    uint32_t qf[HS / 16][4];
    float o[HS / 8][4];
#pragma unroll
    for (int n = 0; n < HS / 8; n++)
        o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float ma = -INFINITY, mb = -INFINITY, la = 0.0f, lb = 0.0f;

    int cur = 0; /* tile j's buffer */
    for (int j = 0; j < ntiles; j++) {
        const int k0 = j * kTcRows;
        const bf16 *kt = ks + cur * L::TILE, *vt = vs + cur * L::TILE;
        cp_wait<ST - 2>(); /* groups 0 .. j + ST - 2 committed: all but ST - 2 done, tile j in */
        __syncthreads();
        if (j + ST - 1 < ntiles) { /* into the buffer tile j - 1 left */
            const int nxt = cur == 0 ? ST - 1 : cur - 1;
            tile_async<HS, NT>(ks + nxt * L::TILE, kh, kv.ld, k0 + (ST - 1) * kTcRows, t);
            tile_async<HS, NT>(vs + nxt * L::TILE, vh, vv.ld, k0 + (ST - 1) * kTcRows, t);
        }
        cp_commit();
        cur = cur + 1 == ST ? 0 : cur + 1;
        if (j == 0)
            load_a<HS>(qf, qs, warp * 16, lane);
        if (k0 <= wlast) { /* else every key of the tile comes after the warp's queries */
            float s[kTcRows / 8][4];
            rows_by_tile<HS>(s, qf, kt, lane);
            float mxa = ma, mxb = mb;
            auto scores = [&](auto masked) {
#pragma unroll
                for (int n = 0; n < kTcRows / 8; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int key = k0 + n * 8 + 2 * tig + (e & 1);
                        /* causal mask; keys past t come after every query below t */
                        float v = !decltype(masked)::value || key <= (e >> 1 ? qb : qa)
                                      ? s[n][e] * sl2
                                      : -INFINITY;
                        s[n][e] = v;
                        if (e >> 1)
                            mxb = fmaxf(mxb, v);
                        else
                            mxa = fmaxf(mxa, v);
                    }
            };
            /* the mask only on tiles with keys past the warp's first query */
            if (k0 + kTcRows - 1 <= wlast - 15)
                scores(std::false_type());
            else
                scores(std::true_type());
            mxa = fmaxf(mxa, __shfl_xor_sync(0xffffffffu, mxa, 1));
            mxa = fmaxf(mxa, __shfl_xor_sync(0xffffffffu, mxa, 2));
            mxb = fmaxf(mxb, __shfl_xor_sync(0xffffffffu, mxb, 1));
            mxb = fmaxf(mxb, __shfl_xor_sync(0xffffffffu, mxb, 2));
            /* Key 0 is in the first tile of every row: the maxima are finite from then on. */
            const float ca = exp2f(ma - mxa), cb = exp2f(mb - mxb);
            float sa = 0.0f, sb = 0.0f;
#pragma unroll
            for (int n = 0; n < kTcRows / 8; n++) {
                s[n][0] = exp2f(s[n][0] - mxa);
                s[n][1] = exp2f(s[n][1] - mxa);
                s[n][2] = exp2f(s[n][2] - mxb);
                s[n][3] = exp2f(s[n][3] - mxb);
                sa += s[n][0] + s[n][1];
                sb += s[n][2] + s[n][3];
            }
            la = la * ca + sa; /* the lane's part of the sum; the row's is summed at the end */
            lb = lb * cb + sb;
            ma = mxa, mb = mxb;
#pragma unroll
            for (int n = 0; n < HS / 8; n++) {
                o[n][0] *= ca, o[n][1] *= ca;
                o[n][2] *= cb, o[n][3] *= cb;
            }
            acc_by_tile<HS>(o, s, vt, lane);
        }
    }
    la += __shfl_xor_sync(0xffffffffu, la, 1);
    la += __shfl_xor_sync(0xffffffffu, la, 2);
    lb += __shfl_xor_sync(0xffffffffu, lb, 1);
    lb += __shfl_xor_sync(0xffffffffu, lb, 2);
    store_acc<HS>(o, out + (size_t)bi * t * c + (size_t)h * hs, c, qa, t, hs, 1.0f / la, 1.0f / lb,
                  tig);
    float *lrow = lse + ((size_t)bi * nh + h) * t;
    if (tig == 0 && qa < t)
        lrow[qa] = (ma + log2f(la)) / kLog2e;
    if (tig == 0 && qb < t)
        lrow[qb] = (mb + log2f(lb)) / kLog2e;
}

/* The forward in blocks of W warps: q's tiles, and kFwdStages<W> buffers each of k and v. */
template <int HS, bool Q16, class OutT, int W>
int launch_fwd(cuda_impl *ci, int b, int t, int c, int nh, const float *q32, View qv, View kv,
               View vv, OutT *out, float *lse, float scale, bool vec, mgpu_err_t *err)
{
    constexpr int ROWS = 16 * W;
    constexpr int TILES = ROWS / kTcRows + 2 * kFwdStages<W>;
    const size_t smem = TILES * Tc<HS>::BYTES;
    int rc = prepare(att_fwd_tc_kernel<HS, Q16, OutT, W>, smem, err);
    if (rc < 0)
        return rc;
    dim3 grid((unsigned)((t + ROWS - 1) / ROWS), (unsigned)nh, (unsigned)b);
    att_fwd_tc_kernel<HS, Q16, OutT, W>
        <<<grid, W * 32, smem, ci->stream>>>(t, c, nh, q32, qv, kv, vv, out, lse, scale, vec);
    CUDA_CHECK_LAUNCH(err, "att_fwd_tc_kernel<%d, %s, %d warps> (b=%d t=%d c=%d nh=%d)", HS,
                      Q16 ? "bf16" : "fp32", W, b, t, c, nh);
    return 0;
}
} /* namespace */

int gpt_attention_forward_tc(cuda_impl *ci, int b, int t, int c, int nh, const float *qkv,
                             float *out, float *lse, float scale, mgpu_err_t *err)
{
    return with_tc_hs(c / nh, [&](auto hc) {
        constexpr int HS = decltype(hc)::value;
        const size_t plane = (size_t)b * t * nh * HS;
        bf16 *kh;
        int rc =
            to_heads<HS, float>(ci, b, t, c, nh, 1, 2, qkv, nullptr, nullptr, 0, &kh, nullptr, err);
        if (rc < 0)
            return rc;
        const bool vec = (c / nh) % 4 == 0 && aligned16(qkv);
        return launch_fwd<HS, false, float, kTcWarps>(
            ci, b, t, c, nh, qkv, View{}, plane_view(kh, t, nh, HS),
            plane_view(kh + plane, t, nh, HS), out, lse, scale, vec, err);
    });
}

/* bf16 qkv: where the head size is a tile's (32, 64, 128) and qkv is 16-byte aligned (its rows
 * and each head's columns then are, hs and c being multiples of 8), the kernels read their
 * tiles straight from qkv's rows, with no conversion pass; else (other head sizes, a buffer
 * off 16 bytes) from padded planes copied into the workspace first, as the fp32 op's. */
int gpt16_attention_forward(void *impl, int b, int t, int c, int nh, const mgpu_bf16_t *qkv16,
                            mgpu_bf16_t *out16, float *lse, mgpu_err_t *err)
{
    cuda_impl *ci = (cuda_impl *)impl;
    int rc = check16("attention_forward", b, t, c, nh, err);
    if (rc < 0)
        return rc;
    const bf16 *qkv = reinterpret_cast<const bf16 *>(qkv16);
    bf16 *out = reinterpret_cast<bf16 *>(out16);
    invalidate(ci, out, sizeof(bf16) * b * (size_t)t * c);
    invalidate(ci, lse, sizeof(float) * b * (size_t)nh * t);
    if (b == 0 || t == 0)
        return 0;
    const int hs = c / nh;
    const float scale = (float)(1.0 / sqrt((double)hs));
    return with_tc_hs(hs, [&](auto hc) {
        constexpr int HS = decltype(hc)::value;
        if (hs == HS && aligned16(qkv)) {
            const size_t ld = 3 * (size_t)c;
            return launch_fwd<HS, true, bf16, kFwd16Warps>(
                ci, b, t, c, nh, nullptr, row_view(qkv, t, ld, hs), row_view(qkv + c, t, ld, hs),
                row_view(qkv + 2 * (size_t)c, t, ld, hs), out, lse, scale, false, err);
        }
        const size_t plane = (size_t)b * t * nh * HS;
        bf16 *qh;
        int rc2 =
            to_heads<HS, bf16>(ci, b, t, c, nh, 0, 3, qkv, nullptr, nullptr, 0, &qh, nullptr, err);
        if (rc2 < 0)
            return rc2;
        return launch_fwd<HS, true, bf16, kFwd16Warps>(
            ci, b, t, c, nh, nullptr, plane_view(qh, t, nh, HS), plane_view(qh + plane, t, nh, HS),
            plane_view(qh + 2 * plane, t, nh, HS), out, lse, scale, false, err);
    });
}
} /* namespace mgpu_cuda */
