/* gpt_attention_tc.cu - the causal attention of gpt_attention.cu on tensor cores, for the
 * backend's bf16 precision, in FlashAttention-2's structure: every product is an
 * mma.sync.m16n8k16 of bf16 operands with fp32 accumulation whose fragments stay in registers
 * (a product's accumulator becomes the next product's A operand without leaving the warp),
 * while the softmax (scores, running maximum and sum, probabilities, D) stays fp32, as bf16
 * mode keeps every statistic in fp32. Exponentials are exp2f with log2(e) folded into the
 * scale.
 *
 * Each call first converts the operands it reads more than once to bf16, into the backend's
 * workspace, head by head: a plane (b, nh, t, HS) for k and v (and q and dout in the
 * backward; the forward converts its block's q itself), HS the head size rounded up to 32, 64
 * or 128 with zeros past it, so that every row of a head is 16-byte chunks and a tile is a
 * block of contiguous rows. A kernel then reads tiles of 64 rows with cp.async (16 bytes a
 * thread, rows past t filled with zeros), double-buffered: the next tile arrives while this
 * one is used. Tiles stay row-major in shared memory (a row of HS + 8
 * elements, so that the eight rows an ldmatrix reads fall in different banks); ldmatrix
 * gives the fragments, ldmatrix.trans those of a tile used the other way round (v in p . v,
 * q and dout in the backward's sums over queries), so no tile is stored twice.
 *
 * A block is four warps and owns 64 rows (queries, or keys in the key pass), 16 a warp.
 * The backward is two kernels: the query pass (dq over the key tiles) and the key pass (dk,
 * dv over the query tiles), each recomputing the probabilities from lse; D = rowsum(dout *
 * out) is computed in fp32 by the conversion. dq has its own pass so that no sum needs
 * atomics: every sum runs in a fixed order and results are the same from run to run. */
#include "gpt_cuda_impl.h" /* cuda_impl, the device helpers, the ops' declarations */
#include "cuda_check.h"    /* CUDA_CHECK, CUDA_CHECK_LAUNCH */

#include <cuda_bf16.h> /* __nv_bfloat16, __floats2bfloat162_rn */
#include <stdint.h>    /* uint32_t */

namespace mgpu_cuda
{
namespace
{

typedef __nv_bfloat16 bf16;

constexpr int kTcWarps = 4;
constexpr int kTcThreads = kTcWarps * 32;
constexpr int kTcRows = 16 * kTcWarps; /* rows a block owns, and rows of a tile */
constexpr float kLog2e = 1.4426950408889634f;
constexpr int kCvtThreads = 256;
/* Blocks an SM is asked to hold (a register budget for ptxas: 128 a thread for 4, 168 for 3):
 * up to a head size of 64 the forward and the key pass fit them with at most a few spilled
 * words; at 128 their fragments alone need more, and spills would cost more than occupancy
 * gains. */
template <int HS> constexpr int kFwdBlocks = HS <= 64 ? 4 : 1;
template <int HS> constexpr int kKvBlocks = HS <= 64 ? 3 : 1;

/* A tile in shared memory: kTcRows rows of HS, row stride LD elements (HS + 8: 16 bytes past
 * the row, which moves each row by 4 banks, so the 8 rows of an 8x8 ldmatrix never collide). */
template <int HS> struct Tc {
    static constexpr int LD = HS + 8;
    static constexpr int TILE = kTcRows * LD; /* elements */
    static constexpr size_t BYTES = (size_t)TILE * sizeof(bf16);
};

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi); /* lo in the low half */
    return *reinterpret_cast<uint32_t *>(&v);
}

/* d += a . b, a 16x16 (row-major fragment), b 16x8 (column-major fragment b0, b1). */
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned smem_addr(const void *p)
{
    return (unsigned)__cvta_generic_to_shared(p);
}

/* Four 8x8 matrices, lanes 8i..8i+7 giving the rows of matrix i; .trans: transposed. */
__device__ __forceinline__ void ldsm4(uint32_t (&r)[4], const bf16 *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p))
                 : "memory");
}

__device__ __forceinline__ void ldsm4t(uint32_t (&r)[4], const bf16 *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p))
                 : "memory");
}

/* 16 bytes (or 4) from global to shared memory, zeros when !valid (src must still point into
 * the buffer). */
__device__ __forceinline__ void cp_async16(bf16 *dst, const bf16 *src, bool valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
}

__device__ __forceinline__ void cp_async4(float *dst, const float *src, bool valid)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 4 : 0)
                 : "memory");
}

__device__ __forceinline__ void cp_commit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N> __device__ __forceinline__ void cp_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* Where lane l points in an x4 ldmatrix over a 16x16 block (row, column offsets):
 * - off_a: the matrices (rows 0-7, cols 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15): an A
 *   fragment a0..a3 of a row-major block, and, with .trans, the B fragments of a block
 *   stored [k][n] (b0, b1 of columns n 0-7 in r0, r1; of n 8-15 in r2, r3);
 * - off_b: (0-7, 0-7), (0-7, 8-15), (8-15, 0-7), (8-15, 8-15): the B fragments of a block
 *   stored [n][k] (n 0-7 in r0, r1; n 8-15 in r2, r3). */
__device__ __forceinline__ int off_a(int lane, int ld)
{
    return ((lane & 7) + ((lane >> 3) & 1) * 8) * ld + (lane >> 4) * 8;
}

__device__ __forceinline__ int off_b(int lane, int ld)
{
    return ((lane & 7) + (lane >> 4) * 8) * ld + ((lane >> 3) & 1) * 8;
}

/* Rows r0.. of a head's plane (rows of HS, contiguous) into a tile; rows past t: zeros. The
 * whole block takes part; nothing waits here (cp_commit and cp_wait do). */
template <int HS>
__device__ __forceinline__ void tile_async(bf16 *dst, const bf16 *plane, int r0, int t)
{
    constexpr int CPR = HS / 8; /* 16-byte chunks a row */
#pragma unroll
    for (int it = 0; it < kTcRows * CPR / kTcThreads; it++) {
        const int i = threadIdx.x + it * kTcThreads, r = i / CPR, ch = i % CPR;
        const bool in = r0 + r < t;
        cp_async16(dst + r * Tc<HS>::LD + ch * 8, plane + (size_t)(in ? r0 + r : 0) * HS + ch * 8,
                   in);
    }
}

/* Rows r0.. of q (row stride ld floats, hs columns) into a tile as bf16, zeros past hs and t:
 * the forward reads q once a block, so it converts it itself rather than through a plane. */
template <int HS>
__device__ __forceinline__ void q_tile(bf16 *dst, const float *src, size_t ld, int r0, int t,
                                       int hs, bool vec)
{
    constexpr int Q = HS / 4; /* groups of 4 columns a row */
#pragma unroll
    for (int it = 0; it < kTcRows * Q / kTcThreads; it++) {
        const int i = threadIdx.x + it * kTcThreads, r = i / Q, d = i % Q * 4;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (r0 + r < t) {
            const float *p = src + (size_t)(r0 + r) * ld + d;
            if (vec && d < hs) {
                v = *reinterpret_cast<const float4 *>(p);
            } else {
                v.x = d < hs ? p[0] : 0.0f;
                v.y = d + 1 < hs ? p[1] : 0.0f;
                v.z = d + 2 < hs ? p[2] : 0.0f;
                v.w = d + 3 < hs ? p[3] : 0.0f;
            }
        }
        *reinterpret_cast<uint2 *>(dst + r * Tc<HS>::LD + d) =
            make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
    }
}

/* The A fragments of the warp's 16 rows (from row w0 of a tile). */
template <int HS>
__device__ __forceinline__ void load_a(uint32_t (&a)[HS / 16][4], const bf16 *tile, int w0,
                                       int lane)
{
#pragma unroll
    for (int k = 0; k < HS / 16; k++)
        ldsm4(a[k], tile + w0 * Tc<HS>::LD + k * 16 + off_a(lane, Tc<HS>::LD));
}

/* s (16 x 64) = a . tile^T, the tile's rows the columns of s. */
template <int HS>
__device__ __forceinline__ void rows_by_tile(float (&s)[kTcRows / 8][4],
                                             const uint32_t (&a)[HS / 16][4], const bf16 *tile,
                                             int lane)
{
#pragma unroll
    for (int n = 0; n < kTcRows / 8; n++)
        s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int k = 0; k < HS / 16; k++)
#pragma unroll
        for (int n = 0; n < kTcRows / 16; n++) {
            uint32_t b[4];
            ldsm4(b, tile + n * 16 * Tc<HS>::LD + k * 16 + off_b(lane, Tc<HS>::LD));
            mma16816(s[2 * n], a[k], b[0], b[1]);
            mma16816(s[2 * n + 1], a[k], b[2], b[3]);
        }
}

/* acc (16 x HS) += p . tile, p 16 x 64 as accumulators (bf16 A operands), the tile's rows
 * the rows of the sum. */
template <int HS>
__device__ __forceinline__ void
acc_by_tile(float (&acc)[HS / 8][4], const float (&p)[kTcRows / 8][4], const bf16 *tile, int lane)
{
#pragma unroll
    for (int k = 0; k < kTcRows / 16; k++) {
        const uint32_t a[4] = {pack_bf16(p[2 * k][0], p[2 * k][1]),
                               pack_bf16(p[2 * k][2], p[2 * k][3]),
                               pack_bf16(p[2 * k + 1][0], p[2 * k + 1][1]),
                               pack_bf16(p[2 * k + 1][2], p[2 * k + 1][3])};
#pragma unroll
        for (int n = 0; n < HS / 16; n++) {
            uint32_t b[4];
            ldsm4t(b, tile + k * 16 * Tc<HS>::LD + n * 16 + off_a(lane, Tc<HS>::LD));
            mma16816(acc[2 * n], a, b[0], b[1]);
            mma16816(acc[2 * n + 1], a, b[2], b[3]);
        }
    }
}

/* row[d] = mul * acc's element for rows g / g + 8 (rows r0, r0 + 8 of memory; valid below t). */
template <int HS>
__device__ __forceinline__ void store_acc(const float (&acc)[HS / 8][4], float *base, size_t ld,
                                          int r0, int t, int hs, float mul0, float mul1, int tig)
{
#pragma unroll
    for (int n = 0; n < HS / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = r0 + (e >> 1) * 8, d = n * 8 + 2 * tig + (e & 1);
            if (r < t && d < hs)
                base[(size_t)r * ld + d] = acc[n][e] * (e >> 1 ? mul1 : mul0);
        }
}

/* The bf16 planes, plane blockIdx.y of section sec0 + blockIdx.y: a thread's chunk (8
 * elements of one row and head) of q, k, v of qkv (sections 0..2) or of dout (section 3, which
 * also sums D = rowsum(dout * out) of the row and head over the HS / 8 lanes of its chunks, a
 * power of two of consecutive lanes). */
template <int HS>
__global__ void __launch_bounds__(kCvtThreads)
    att_to_heads_kernel(int t, int c, int nh, size_t rows, int sec0, const float *qkv,
                        const float *dout, const float *out, bf16 *planes, float *dsum, bool vec)
{
    constexpr int CPR = HS / 8;
    const int sec = sec0 + blockIdx.y, hs = c / nh;
    const size_t i = (size_t)blockIdx.x * kCvtThreads + threadIdx.x;
    const size_t rh = i / CPR, row = rh / nh;
    const int ch = (int)(i % CPR), h = (int)(rh % nh), d0 = ch * 8;
    const bool in = row < rows;
    float v[8], dot = 0.0f;
    const float *src = sec < 3 ? qkv + row * 3 * (size_t)c + (size_t)sec * c + (size_t)h * hs
                               : dout + row * (size_t)c + (size_t)h * hs;
#pragma unroll
    for (int j = 0; j < 8; j += 4) {
        if (in && vec && d0 + j < hs) {
            const float4 f = *reinterpret_cast<const float4 *>(src + d0 + j);
            v[j] = f.x, v[j + 1] = f.y, v[j + 2] = f.z, v[j + 3] = f.w;
        } else {
#pragma unroll
            for (int e = 0; e < 4; e++)
                v[j + e] = in && d0 + j + e < hs ? src[d0 + j + e] : 0.0f;
        }
    }
    if (sec == 3 && dsum != nullptr) {
        const float *orow = out + row * (size_t)c + (size_t)h * hs;
#pragma unroll
        for (int j = 0; j < 8; j++)
            if (in && d0 + j < hs)
                dot += v[j] * orow[d0 + j];
#pragma unroll
        for (int m = 1; m < CPR; m <<= 1)
            dot += __shfl_xor_sync(0xffffffffu, dot, m);
    }
    if (!in)
        return;
    const size_t bi = row / t, q = row % t;
    const size_t plane = rows * nh * HS;
    uint4 w;
    w.x = pack_bf16(v[0], v[1]), w.y = pack_bf16(v[2], v[3]);
    w.z = pack_bf16(v[4], v[5]), w.w = pack_bf16(v[6], v[7]);
    *reinterpret_cast<uint4 *>(planes + blockIdx.y * plane + ((bi * nh + h) * t + q) * HS + d0) = w;
    if (sec == 3 && dsum != nullptr && ch == 0)
        dsum[(bi * nh + h) * t + q] = dot;
}

/* Forward: the warp's rows g and g + 8 keep their running maximum (log2 units) and sum in
 * the four lanes of a row (a row's columns are spread over them: shuffles 1 and 2). Blocks
 * are launched last queries first (they have the most keys). */
template <int HS>
__global__ void __launch_bounds__(kTcThreads, kFwdBlocks<HS>)
    att_fwd_tc_kernel(int t, int c, int nh, const float *qkv, const bf16 *kh, const bf16 *vh,
                      float *out, float *lse, float scale, bool vec)
{
    using L = Tc<HS>;
    extern __shared__ __align__(128) unsigned char tc_smem[];
    bf16 *qs = (bf16 *)tc_smem, *ks = qs + L::TILE, *vs = ks + 2 * L::TILE; /* k, v: 2 each */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
    const int h = blockIdx.y, bi = blockIdx.z, hs = c / nh;
    const size_t pl = ((size_t)bi * nh + h) * t * HS;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * kTcRows;
    const int qa = q0 + warp * 16 + g, qb = qa + 8; /* the lane's two rows */
    const int wlast = q0 + warp * 16 + 15;
    const float sl2 = scale * kLog2e;

    tile_async<HS>(ks, kh + pl, 0, t);
    tile_async<HS>(vs, vh + pl, 0, t);
    cp_commit();
    q_tile<HS>(qs, qkv + (size_t)bi * t * 3 * c + (size_t)h * hs, 3 * (size_t)c, q0, t, hs, vec);
    uint32_t qf[HS / 16][4];
    float o[HS / 8][4];
#pragma unroll
    for (int n = 0; n < HS / 8; n++)
        o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float ma = -INFINITY, mb = -INFINITY, la = 0.0f, lb = 0.0f;

    const int ntiles = (min(t, q0 + kTcRows) + kTcRows - 1) / kTcRows;
    for (int j = 0; j < ntiles; j++) {
        const int k0 = j * kTcRows;
        const bf16 *kt = ks + (j & 1) * L::TILE, *vt = vs + (j & 1) * L::TILE;
        if (j + 1 < ntiles) { /* the next tile, into the buffer the previous one left */
            tile_async<HS>(ks + ((j + 1) & 1) * L::TILE, kh + pl, k0 + kTcRows, t);
            tile_async<HS>(vs + ((j + 1) & 1) * L::TILE, vh + pl, k0 + kTcRows, t);
            cp_commit();
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
        if (j == 0)
            load_a<HS>(qf, qs, warp * 16, lane);
        if (k0 <= wlast) { /* else every key of the tile comes after the warp's queries */
            float s[kTcRows / 8][4];
            rows_by_tile<HS>(s, qf, kt, lane);
            float mxa = ma, mxb = mb;
#pragma unroll
            for (int n = 0; n < kTcRows / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int key = k0 + n * 8 + 2 * tig + (e & 1);
                    /* causal mask; keys past t come after every query below t */
                    float v = key <= (e >> 1 ? qb : qa) ? s[n][e] * sl2 : -INFINITY;
                    s[n][e] = v;
                    if (e >> 1)
                        mxb = fmaxf(mxb, v);
                    else
                        mxa = fmaxf(mxa, v);
                }
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
        __syncthreads(); /* every warp is done with the tile before it is written again */
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

/* Backward, query pass: dq = scale * ds . k over the key tiles, ds = p * (dp - D), p =
 * exp(scale * s - lse), s = q . k^T and dp = dout . v^T. */
template <int HS>
__global__ void __launch_bounds__(kTcThreads)
    att_bwd_q_tc_kernel(int t, int c, int nh, const bf16 *qh, const bf16 *kh, const bf16 *vh,
                        const bf16 *doh, const float *lse, const float *dsum, float *dqkv,
                        float scale)
{
    using L = Tc<HS>;
    extern __shared__ __align__(128) unsigned char tc_smem[];
    bf16 *qs = (bf16 *)tc_smem, *dos = qs + L::TILE;
    bf16 *ks = dos + L::TILE, *vs = ks + 2 * L::TILE; /* k, v: 2 each */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
    const int h = blockIdx.y, bi = blockIdx.z, hs = c / nh;
    const size_t pl = ((size_t)bi * nh + h) * t * HS;
    const size_t lbase = ((size_t)bi * nh + h) * t;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * kTcRows;
    const int qa = q0 + warp * 16 + g, qb = qa + 8;
    const int wlast = q0 + warp * 16 + 15;
    const float sl2 = scale * kLog2e;

    tile_async<HS>(qs, qh + pl, q0, t);
    tile_async<HS>(dos, doh + pl, q0, t);
    tile_async<HS>(ks, kh + pl, 0, t);
    tile_async<HS>(vs, vh + pl, 0, t);
    cp_commit();
    /* rows past t: p and ds are not stored; any finite value does */
    const float lsa = qa < t ? lse[lbase + qa] * kLog2e : 0.0f;
    const float lsb = qb < t ? lse[lbase + qb] * kLog2e : 0.0f;
    const float da = qa < t ? dsum[lbase + qa] : 0.0f, db = qb < t ? dsum[lbase + qb] : 0.0f;
    uint32_t qf[HS / 16][4], df[HS / 16][4];
    float dq[HS / 8][4];
#pragma unroll
    for (int n = 0; n < HS / 8; n++)
        dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;

    const int ntiles = (min(t, q0 + kTcRows) + kTcRows - 1) / kTcRows;
    for (int j = 0; j < ntiles; j++) {
        const int k0 = j * kTcRows;
        const bf16 *kt = ks + (j & 1) * L::TILE, *vt = vs + (j & 1) * L::TILE;
        if (j + 1 < ntiles) {
            tile_async<HS>(ks + ((j + 1) & 1) * L::TILE, kh + pl, k0 + kTcRows, t);
            tile_async<HS>(vs + ((j + 1) & 1) * L::TILE, vh + pl, k0 + kTcRows, t);
            cp_commit();
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
        if (j == 0) {
            load_a<HS>(qf, qs, warp * 16, lane);
            load_a<HS>(df, dos, warp * 16, lane);
        }
        if (k0 <= wlast) {
            float s[kTcRows / 8][4], dp[kTcRows / 8][4];
            rows_by_tile<HS>(s, qf, kt, lane);
            rows_by_tile<HS>(dp, df, vt, lane);
#pragma unroll
            for (int n = 0; n < kTcRows / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int key = k0 + n * 8 + 2 * tig + (e & 1);
                    const bool b2 = e >> 1;
                    const float p =
                        key <= (b2 ? qb : qa) ? exp2f(s[n][e] * sl2 - (b2 ? lsb : lsa)) : 0.0f;
                    s[n][e] = p * (dp[n][e] - (b2 ? db : da));
                }
            acc_by_tile<HS>(dq, s, kt, lane);
        }
        __syncthreads();
    }
    store_acc<HS>(dq, dqkv + (size_t)bi * t * 3 * c + (size_t)h * hs, 3 * (size_t)c, qa, t, hs,
                  scale, scale, tig);
}

/* Backward, key pass: a warp owns 16 keys; over the query tiles from the block's first key
 * on, dv += p^T . dout and dk += ds^T . q, with s^T = k . q^T and dp^T = v . dout^T computed
 * keys by queries, so that p^T and ds^T are accumulators ready to be A operands; dk is scaled
 * at the end. k's and v's fragments are read from their tiles where they are used rather
 * than held (registers go to dk and dv). Blocks are launched first keys first (they have the
 * most queries). Queries past t read zeros (q, dout, lse, D), so their p is 1 and their terms
 * are 0. */
template <int HS>
__global__ void __launch_bounds__(kTcThreads, kKvBlocks<HS>)
    att_bwd_kv_tc_kernel(int t, int c, int nh, const bf16 *qh, const bf16 *kh, const bf16 *vh,
                         const bf16 *doh, const float *lse, const float *dsum, float *dqkv,
                         float scale)
{
    using L = Tc<HS>;
    extern __shared__ __align__(128) unsigned char tc_smem[];
    bf16 *ks = (bf16 *)tc_smem, *vs = ks + L::TILE;
    bf16 *qs = vs + L::TILE, *dos = qs + 2 * L::TILE; /* q, dout: 2 each */
    float *ls = (float *)(dos + 2 * L::TILE), *dd = ls + 2 * kTcRows;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
    const int h = blockIdx.y, bi = blockIdx.z, hs = c / nh;
    const size_t pl = ((size_t)bi * nh + h) * t * HS;
    const size_t lbase = ((size_t)bi * nh + h) * t;
    const int k0 = blockIdx.x * kTcRows, w0 = warp * 16;
    const int ka = k0 + w0 + g, kb = ka + 8;
    const float sl2 = scale * kLog2e;

    tile_async<HS>(ks, kh + pl, k0, t);
    tile_async<HS>(vs, vh + pl, k0, t);
    float dk[HS / 8][4], dv[HS / 8][4];
#pragma unroll
    for (int n = 0; n < HS / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            dk[n][e] = dv[n][e] = 0.0f;

    const int ntiles = (t - k0 + kTcRows - 1) / kTcRows;
    for (int j = 0; j < ntiles + 1; j++) {
        /* step j issues query tile j (buffer j & 1) and uses tile j - 1 */
        if (j < ntiles) {
            const int q0 = k0 + j * kTcRows, bsel = j & 1;
            tile_async<HS>(qs + bsel * L::TILE, qh + pl, q0, t);
            tile_async<HS>(dos + bsel * L::TILE, doh + pl, q0, t);
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
        float s[kTcRows / 8][4], dp[kTcRows / 8][4];
        {
            uint32_t af[HS / 16][4];
            load_a<HS>(af, ks, w0, lane);
            rows_by_tile<HS>(s, af, qt, lane); /* s^T: keys x queries */
            load_a<HS>(af, vs, w0, lane);
            rows_by_tile<HS>(dp, af, dot, lane); /* dp^T */
        }
#pragma unroll
        for (int n = 0; n < kTcRows / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int col = n * 8 + 2 * tig + (e & 1);
                const float p =
                    (e >> 1 ? kb : ka) <= q0 + col ? exp2f(s[n][e] * sl2 - lt[col] * kLog2e) : 0.0f;
                s[n][e] = p;
                dp[n][e] = p * (dp[n][e] - dt[col]);
            }
        acc_by_tile<HS>(dv, s, dot, lane);
        acc_by_tile<HS>(dk, dp, qt, lane);
        __syncthreads(); /* the buffer is free for step j + 1's tile */
    }
    float *rows = dqkv + (size_t)bi * t * 3 * c + (size_t)h * hs;
    store_acc<HS>(dk, rows + c, 3 * (size_t)c, ka, t, hs, scale, scale, tig);
    store_acc<HS>(dv, rows + 2 * (size_t)c, 3 * (size_t)c, ka, t, hs, 1.0f, 1.0f, tig);
}

template <class K> int prepare(K kern, size_t smem, mgpu_err_t *err)
{
    /* More than the default 48 KiB of dynamic shared memory must be asked for. */
    if (smem > 48 * 1024)
        CUDA_CHECK(err, cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)smem));
    return 0;
}

template <class Fn> int with_tc_hs(int hs, Fn fn)
{
    if (hs <= 32)
        return fn(std::integral_constant<int, 32>());
    if (hs <= 64)
        return fn(std::integral_constant<int, 64>());
    return fn(std::integral_constant<int, 128>());
}

/* The bf16 planes of k and v (the forward), or of q, k, v and dout with D into dsum (the
 * backward, dout not NULL), into the workspace from byte off on, grown first if need be (after
 * the side streams, which may read a bf16 copy there). */
template <int HS>
int to_heads(cuda_impl *ci, int b, int t, int c, int nh, const float *qkv, const float *dout,
             const float *out, size_t off, bf16 **planes, float **dsum, mgpu_err_t *err)
{
    const size_t rows = (size_t)b * t, plane = rows * nh * HS;
    const int sec0 = dout != nullptr ? 0 : 1, nsec = dout != nullptr ? 4 : 2;
    const float *base = (const float *)ci->ws;
    int rc;
    if ((rc = cuda_join(ci, err)) < 0 ||
        (rc = ensure_ws(ci, off + nsec * plane * sizeof(bf16), err)) < 0)
        return rc;
    if (dsum != nullptr && *dsum == base) /* D in the workspace's first bytes, which moved */
        *dsum = (float *)ci->ws;
    *planes = (bf16 *)((char *)ci->ws + off);
    const bool vec =
        (c / nh) % 4 == 0 && aligned16(qkv) && (dout == nullptr || aligned16(dout, out));
    const size_t chunks = rows * nh * (HS / 8);
    dim3 grid((unsigned)((chunks + kCvtThreads - 1) / kCvtThreads), (unsigned)nsec);
    att_to_heads_kernel<HS><<<grid, kCvtThreads, 0, ci->stream>>>(
        t, c, nh, rows, sec0, qkv, dout, out, *planes, dsum != nullptr ? *dsum : nullptr, vec);
    CUDA_CHECK_LAUNCH(err, "att_to_heads_kernel<%d> (b=%d t=%d c=%d nh=%d)", HS, b, t, c, nh);
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
        int rc = to_heads<HS>(ci, b, t, c, nh, qkv, nullptr, nullptr, 0, &kh, nullptr, err);
        if (rc < 0)
            return rc;
        const bool vec = (c / nh) % 4 == 0 && aligned16(qkv);
        const size_t smem = 5 * Tc<HS>::BYTES;
        if ((rc = prepare(att_fwd_tc_kernel<HS>, smem, err)) < 0)
            return rc;
        dim3 grid((unsigned)((t + kTcRows - 1) / kTcRows), (unsigned)nh, (unsigned)b);
        att_fwd_tc_kernel<HS><<<grid, kTcThreads, smem, ci->stream>>>(t, c, nh, qkv, kh, kh + plane,
                                                                      out, lse, scale, vec);
        CUDA_CHECK_LAUNCH(err, "att_fwd_tc_kernel<%d> (b=%d t=%d c=%d nh=%d)", HS, b, t, c, nh);
        return 0;
    });
}

int gpt_attention_backward_tc(cuda_impl *ci, int b, int t, int c, int nh, const float *dout,
                              const float *qkv, const float *out, const float *lse, float *dqkv,
                              float *dsum, float scale, mgpu_err_t *err)
{
    return with_tc_hs(c / nh, [&](auto hc) {
        constexpr int HS = decltype(hc)::value;
        using L = Tc<HS>;
        const size_t plane = (size_t)b * t * nh * HS;
        /* D may be in the workspace (the caller's choice for long shapes): the planes follow */
        const size_t off =
            (void *)dsum == ci->ws ? ((size_t)b * nh * t * sizeof(float) + 255) / 256 * 256 : 0;
        bf16 *qh;
        int rc = to_heads<HS>(ci, b, t, c, nh, qkv, dout, out, off, &qh, &dsum, err);
        if (rc < 0)
            return rc;
        const bf16 *kh = qh + plane, *vh = qh + 2 * plane, *doh = qh + 3 * plane;
        const size_t smem = 6 * L::BYTES, smem_kv = 6 * L::BYTES + 4 * kTcRows * sizeof(float);
        if ((rc = prepare(att_bwd_q_tc_kernel<HS>, smem, err)) < 0 ||
            (rc = prepare(att_bwd_kv_tc_kernel<HS>, smem_kv, err)) < 0)
            return rc;
        dim3 grid((unsigned)((t + kTcRows - 1) / kTcRows), (unsigned)nh, (unsigned)b);
        att_bwd_kv_tc_kernel<HS><<<grid, kTcThreads, smem_kv, ci->stream>>>(
            t, c, nh, qh, kh, vh, doh, lse, dsum, dqkv, scale);
        CUDA_CHECK_LAUNCH(err, "att_bwd_kv_tc_kernel<%d> (b=%d t=%d c=%d nh=%d)", HS, b, t, c, nh);
        att_bwd_q_tc_kernel<HS><<<grid, kTcThreads, smem, ci->stream>>>(t, c, nh, qh, kh, vh, doh,
                                                                        lse, dsum, dqkv, scale);
        CUDA_CHECK_LAUNCH(err, "att_bwd_q_tc_kernel<%d> (b=%d t=%d c=%d nh=%d)", HS, b, t, c, nh);
        return 0;
    });
}

} /* namespace mgpu_cuda */
