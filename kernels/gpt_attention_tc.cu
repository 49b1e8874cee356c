/* gpt_attention_tc.cu - the forward of the tensor-core attention (gpt_attention_tc.h): the
 * backend's bf16 precision's (fp32 qkv and out) and the bf16 path's (bf16 qkv and out). */
#include "gpt_attention_tc.h" /* the tiles, fragments, views and planes; cuda_impl */

namespace mgpu_cuda
{
namespace
{

/* Forward: a block of W warps owns 16 MT W queries, MT tiles of 16 a warp; each tile's rows g
 * and g + 8 keep their running maximum (log2 units) and sum in the four lanes of a row (a
 * row's columns are spread over them: shuffles 1 and 2). Blocks are launched last queries
 * first (they have the most keys). q is an fp32 qkv's (q32, which a block of four warps
 * converts) or a bf16 view's (qv, read as k and v are: Q16); out is fp32 or bf16.
 *
 * k and v tiles come in kFwdStages<W * MT> buffers each: tile j is used while tiles up to j +
 * stages - 2 arrive. One barrier a tile: once every warp has passed it, tile j is in and
 * every warp is done with tile j - 1, whose buffer then takes tile j + stages - 1. */
template <int R> constexpr int kFwdStages = R == kTcWarps ? 2 : 3; /* R: 16-row tiles a block */

template <int HS, bool Q16, class OutT, int W, int MT>
__global__ void __launch_bounds__(W * 32, kFwdBlocksW<HS, W, MT>)
    att_fwd_tc_kernel(int t, int c, int nh, const float *q32, View qv, View kv, View vv, OutT *out,
                      float *lse, float scale, bool vec)
{
    static_assert(Q16 || (W == kTcWarps && MT == 1), "q_tile converts a tile with four warps");
    static_assert(W * MT % kTcWarps == 0, "a block's queries are whole tiles");
    using L = Tc<HS>;
    constexpr int NT = W * 32, WR = 16 * MT, ROWS = WR * W;
    extern __shared__ __align__(128) unsigned char tc_smem[];
    bf16 *qs = (bf16 *)tc_smem, *ks = qs + ROWS / kTcRows * L::TILE;
    constexpr int ST = kFwdStages<W * MT>;
    bf16 *vs = ks + ST * L::TILE; /* k, v: ST each */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
    const int h = blockIdx.y, bi = blockIdx.z, hs = c / nh;
    const bf16 *kh = kv.at(bi, h), *vh = vv.at(bi, h);
    const int q0 = (gridDim.x - 1 - blockIdx.x) * ROWS;
    const int wfirst = q0 + warp * WR, wlast = wfirst + WR - 1; /* the warp's queries */
    const int qa = wfirst + g; /* the lane's rows: qa + 16 m (a) and qa + 16 m + 8 (b) */
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
    uint32_t qf[MT][HS / 16][4];
    float o[MT][HS / 8][4];
    float mx[MT][2], l[MT][2]; /* rows a and b of each tile */
#pragma unroll
    for (int m = 0; m < MT; m++) {
#pragma unroll
        for (int n = 0; n < HS / 8; n++)
            o[m][n][0] = o[m][n][1] = o[m][n][2] = o[m][n][3] = 0.0f;
        mx[m][0] = mx[m][1] = -INFINITY;
        l[m][0] = l[m][1] = 0.0f;
    }

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
        if (j == 0) {
#pragma unroll
            for (int m = 0; m < MT; m++)
                load_a<HS>(qf[m], qs, warp * WR + m * 16, lane);
        }
        /* Else every key of the tile comes after the warp's queries. Key 0 is in the first
         * tile of every row: the maxima are finite from then on. */
        if (k0 <= wlast) {
            float s[MT][kTcRows / 8][4];
            rows_by_tile<HS>(s, qf, kt, lane);
            float rx[MT][2], nx[MT][2]; /* the tile's unscaled maxima; the new running ones */
#pragma unroll
            for (int m = 0; m < MT; m++)
                rx[m][0] = rx[m][1] = -INFINITY;
            auto scores = [&](auto masked) {
#pragma unroll
                for (int m = 0; m < MT; m++)
#pragma unroll
                    for (int n = 0; n < kTcRows / 8; n++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const int key = k0 + n * 8 + 2 * tig + (e & 1);
                            const int q = qa + m * 16 + (e >> 1) * 8;
                            /* causal mask; keys past t come after every query below t. The
                             * scores stay unscaled: the scale is a positive factor, so their
                             * maximum scales to the scaled scores' maximum, and the scale
                             * joins the subtraction in one fma below. */
                            const float v =
                                !decltype(masked)::value || key <= q ? s[m][n][e] : -INFINITY;
                            s[m][n][e] = v;
                            rx[m][e >> 1] = fmaxf(rx[m][e >> 1], v);
                        }
            };
            /* the mask only on tiles with keys past the warp's first query */
            if (k0 + kTcRows - 1 <= wfirst)
                scores(std::false_type());
            else
                scores(std::true_type());
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    rx[m][r] = fmaxf(rx[m][r], __shfl_xor_sync(0xffffffffu, rx[m][r], 1));
                    rx[m][r] = fmaxf(rx[m][r], __shfl_xor_sync(0xffffffffu, rx[m][r], 2));
                    nx[m][r] = fmaxf(mx[m][r], rx[m][r] * sl2);
                }
#pragma unroll
            for (int m = 0; m < MT; m++) {
                const float ca = ex2(mx[m][0] - nx[m][0]), cb = ex2(mx[m][1] - nx[m][1]);
                float sa = 0.0f, sb = 0.0f;
#pragma unroll
                for (int n = 0; n < kTcRows / 8; n++) {
                    s[m][n][0] = ex2(fmaf(s[m][n][0], sl2, -nx[m][0]));
                    s[m][n][1] = ex2(fmaf(s[m][n][1], sl2, -nx[m][0]));
                    s[m][n][2] = ex2(fmaf(s[m][n][2], sl2, -nx[m][1]));
                    s[m][n][3] = ex2(fmaf(s[m][n][3], sl2, -nx[m][1]));
                    sa += s[m][n][0] + s[m][n][1];
                    sb += s[m][n][2] + s[m][n][3];
                }
                /* the lane's part of the sum; the row's is summed at the end */
                l[m][0] = l[m][0] * ca + sa;
                l[m][1] = l[m][1] * cb + sb;
                mx[m][0] = nx[m][0], mx[m][1] = nx[m][1];
#pragma unroll
                for (int n = 0; n < HS / 8; n++) {
                    o[m][n][0] *= ca, o[m][n][1] *= ca;
                    o[m][n][2] *= cb, o[m][n][3] *= cb;
                }
            }
            acc_by_tile<HS>(o, s, vt, lane);
        }
    }
    float *lrow = lse + ((size_t)bi * nh + h) * t;
#pragma unroll
    for (int m = 0; m < MT; m++) {
        const int ra = qa + m * 16, rb = ra + 8;
        float la = l[m][0], lb = l[m][1];
        la += __shfl_xor_sync(0xffffffffu, la, 1);
        la += __shfl_xor_sync(0xffffffffu, la, 2);
        lb += __shfl_xor_sync(0xffffffffu, lb, 1);
        lb += __shfl_xor_sync(0xffffffffu, lb, 2);
        store_acc<HS>(o[m], out + (size_t)bi * t * c + (size_t)h * hs, c, ra, t, hs, 1.0f / la,
                      1.0f / lb, tig);
        if (tig == 0 && ra < t)
            lrow[ra] = (mx[m][0] + log2f(la)) / kLog2e;
        if (tig == 0 && rb < t)
            lrow[rb] = (mx[m][1] + log2f(lb)) / kLog2e;
    }
}

/* The forward in blocks of W warps of MT tiles: q's tiles, and kFwdStages<W * MT> buffers each
 * of k and v. */
template <int HS, bool Q16, class OutT, int W, int MT>
int launch_fwd(cuda_impl *ci, int b, int t, int c, int nh, const float *q32, View qv, View kv,
               View vv, OutT *out, float *lse, float scale, bool vec, mgpu_err_t *err)
{
    constexpr int ROWS = 16 * MT * W;
    constexpr int TILES = ROWS / kTcRows + 2 * kFwdStages<W * MT>;
    const size_t smem = TILES * Tc<HS>::BYTES;
    int rc = prepare(att_fwd_tc_kernel<HS, Q16, OutT, W, MT>, smem, err);
    if (rc < 0)
        return rc;
    dim3 grid((unsigned)((t + ROWS - 1) / ROWS), (unsigned)nh, (unsigned)b);
    att_fwd_tc_kernel<HS, Q16, OutT, W, MT>
        <<<grid, W * 32, smem, ci->stream>>>(t, c, nh, q32, qv, kv, vv, out, lse, scale, vec);
    CUDA_CHECK_LAUNCH(err, "att_fwd_tc_kernel<%d, %s, %d warps of %d rows> (b=%d t=%d c=%d nh=%d)",
                      HS, Q16 ? "bf16" : "fp32", W, 16 * MT, b, t, c, nh);
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
        return launch_fwd<HS, false, float, kTcWarps, 1>(
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
        if (hs == HS && aligned16(qkv) && gpt16_attention_wg_ok(ci, hs))
            return gpt16_attention_forward_wg(ci, b, t, c, nh, qkv, out, lse, scale, err);
        if (hs == HS && aligned16(qkv)) {
            const size_t ld = 3 * (size_t)c;
            return launch_fwd<HS, true, bf16, kFwd16W<HS>, kFwd16MT<HS>>(
                ci, b, t, c, nh, nullptr, row_view(qkv, t, ld, hs), row_view(qkv + c, t, ld, hs),
                row_view(qkv + 2 * (size_t)c, t, ld, hs), out, lse, scale, false, err);
        }
        const size_t plane = (size_t)b * t * nh * HS;
        bf16 *qh;
        int rc2 =
            to_heads<HS, bf16>(ci, b, t, c, nh, 0, 3, qkv, nullptr, nullptr, 0, &qh, nullptr, err);
        if (rc2 < 0)
            return rc2;
        return launch_fwd<HS, true, bf16, kFwd16W<HS>, kFwd16MT<HS>>(
            ci, b, t, c, nh, nullptr, plane_view(qh, t, nh, HS), plane_view(qh + plane, t, nh, HS),
            plane_view(qh + 2 * plane, t, nh, HS), out, lse, scale, false, err);
    });
}
} /* namespace mgpu_cuda */
