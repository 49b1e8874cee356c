/* gpt_attention_tc.h - the causal attention of gpt_attention.cu on tensor cores, for the
 * backend's bf16 precision (fp32 qkv, out and dqkv: the table's ops) and for the bf16 path
 * (bf16 qkv, out and dqkv: gpt16_attention_*), in FlashAttention-2's structure: every product
 * is an mma.sync.m16n8k16 of bf16 operands with fp32 accumulation whose fragments stay in
 * registers (a product's accumulator becomes the next product's A operand without leaving the
 * warp), while the softmax (scores, running maximum and sum, probabilities, D) stays fp32, as
 * bf16 mode keeps every statistic in fp32. Exponentials are ex2 (below) with log2(e) folded into
 * the scale.
 *
 * The kernels read tiles of 64 rows of a head with cp.async (16 bytes a thread, rows past t
 * filled with zeros), double-buffered: the next tile arrives while this one is used. Where
 * they read them from is a View: with bf16 operands whose head size is a tile's (32, 64, 128)
 * and whose rows are 16-byte aligned, straight from qkv's and dout's rows (no conversion pass
 * at all); else from planes (b, nh, t, HS) in the backend's workspace that each call first
 * fills head by head with the bf16 of the operands it reads more than once (k and v, and q
 * and dout in the backward; the fp32 forward converts its block's q itself), HS the head size
 * rounded up to 32, 64 or 128 with zeros past it, so that every row of a head is 16-byte
 * chunks. Tiles stay row-major in shared memory (a row of HS + 8 elements, so that the eight
 * rows an ldmatrix reads fall in different banks); ldmatrix gives the fragments,
 * ldmatrix.trans those of a tile used the other way round (v in p . v, q and dout in the
 * backward's sums over queries), so no tile is stored twice. Results are written straight
 * into their rows of out and dqkv, in fp32 or rounded to bf16.
 *
 * A block is four warps and owns 64 rows (queries, or keys in the key pass), 16 a warp. The
 * bf16 path's forward and query pass give a warp 32 queries, two tiles of 16 rows, so that each
 * fragment of k and v read from shared memory serves both (blocks of four warps, 128 queries,
 * over the same tiles of 64 rows; at a head size of 128, eight warps of 16).
 * The backward is two kernels that run side by side on two streams: the query pass (dq over
 * the key tiles) and the key pass (dk, dv over the query tiles), each recomputing the
 * probabilities from lse; D = rowsum(dout * out) is in fp32, computed before them by the
 * conversion where there is one, else by a small kernel of its own. dq has its own pass so
 * that no sum needs atomics: every sum runs in a fixed order and results are the same from
 * run to run.
 *
 * This header holds what gpt_attention_tc.cu (the forward) and gpt_attention_tc_bwd.cu (the
 * backward) share: the tiles, the fragments' helpers, the views and the conversion into
 * planes. Everything here is internal to the file that includes it. */
#ifndef MGPU_GPT_ATTENTION_TC_H
#define MGPU_GPT_ATTENTION_TC_H

#include "gpt_cuda_impl.h" /* cuda_impl, the device helpers, the ops' declarations */
#include "cuda_check.h"    /* CUDA_CHECK, CUDA_CHECK_LAUNCH */

#include <cuda_bf16.h> /* __nv_bfloat16, __floats2bfloat162_rn */
#include <stdint.h>    /* uint32_t, uintptr_t */
#include <type_traits> /* std::is_same */

namespace mgpu_cuda
{
namespace
{

typedef __nv_bfloat16 bf16;

constexpr int kTcWarps = 4;
constexpr int kTcThreads = kTcWarps * 32;
constexpr int kTcRows = 16 * kTcWarps; /* rows a block owns, and rows of a tile */
constexpr int kCvtThreads = 256;
/* Blocks an SM is asked to hold (a register budget for ptxas: 128 a thread for 4, 168 for 3):
 * up to a head size of 64 the forward and the key pass fit them with at most a few spilled
 * words; at 128 their fragments alone need more, and spills would cost more than occupancy
 * gains. */
template <int HS> constexpr int kFwdBlocks = HS <= 64 ? 4 : 1;
template <int HS> constexpr int kKvBlocks = HS <= 64 ? 3 : 1;
/* The bf16 forward's warps own kFwd16Tiles tiles of 16 queries each (MT): at 2, each k and v
 * fragment read from shared memory serves 32 queries, half the bytes a product of one of 16
 * needs. Its blocks are kFwd16Warps warps over the same 64-key tiles (16 MT W queries). At a
 * head size of 128 the fragments of 32 rows (q, out and the scores) exceed a thread's
 * registers: one tile a warp, eight warps. Measured alone on the H200, two tiles of four
 * warps gained nothing at GPT-2 124M's shape (0.141 ms against 0.142) and lost at the byte
 * model's (0.039 against 0.035): the forward keeps one tile a warp, eight warps, while both
 * backward passes gain from two (below). */
constexpr int kFwd16Tiles = 1;
constexpr int kFwd16Warps = 8;
template <int HS> constexpr int kFwd16MT = HS <= 64 ? kFwd16Tiles : 1;
template <int HS> constexpr int kFwd16W = HS <= 64 ? kFwd16Warps : 8;
/* Warps an SM the forward's register budget is for: with one tile a warp, kFwdBlocks<HS>
 * blocks of four warps' (16 warps up to a head size of 64: 128 registers a thread); with two,
 * eight warps (up to 255 registers), which the scores, q's fragments and out of 32 rows need:
 * at 168 (twelve warps) they spill. Blocks of W warps: as many as make them. */
template <int HS, int MT> constexpr int kFwdWarpsSM = MT > 1 ? 8 : kFwdBlocks<HS> *kTcWarps;
template <int HS, int W, int MT = 1>
constexpr int kFwdBlocksW = kFwdWarpsSM<HS, MT> / W > 0 ? kFwdWarpsSM<HS, MT> / W : 1;
/* The bf16 path's backward passes likewise. The query pass's warps own kBwd16QTiles tiles of
 * 16 queries (MT) and take a key tile kBwd16QKeys keys at a time; its blocks are kBwd16QWarps
 * warps (16 MT W queries) over the same 64-key tiles. Two tiles a warp halve the bytes of k
 * and v fragments read a product, as in the forward; 32 keys a step then keep s and dp of 32
 * rows in registers beside q's and dout's fragments and dq (at 255 registers two words
 * spill, reloaded once a key tile; 64 keys spill hundreds of bytes; 16 fit in 234). At a head size
 * of 128 those alone fill a thread's registers: one tile a warp, eight warps, whole tiles of keys.
 * (1, 8 and 64 give 16 rows a warp at every head size.) The key pass's warps own kBwd16KvTiles
 * tiles of 16 keys and take a query tile kBwd16KvQueries queries at a time, in blocks of
 * kBwd16KvWarps warps over the same 64-query tiles: at 2 tiles, each q and dout fragment read
 * serves 32 keys; k's and v's fragments are read where they are used, as with one tile, and
 * at 255 registers four words spill, reloaded once a query tile (16 queries a step fit in 240
 * registers but read k and v four times a tile). (1, 4 and 64: 16 keys a warp and held k
 * and v fragments, as at a head size of 128.) Eight warps of 16 keys,
 * one block an SM at its 233 registers a thread, measured on the H200 in the GPT-2 124M step,
 * made the step 0.5 ms slower, and the byte model's 2% slower. Measured alone on the H200 at
 * GPT-2 124M's shape, the backward took 0.402 ms with both passes at two tiles, 0.419 with the
 * key pass at one (0.413 with 16 keys a step in the query pass) and 0.468 with both at one;
 * at the byte model's, 0.107, 0.102, 0.110 and 0.112. The 124M step went from 507k to 520k
 * tokens/s. */
constexpr int kBwd16QTiles = 2;
constexpr int kBwd16QWarps = 4;
constexpr int kBwd16QKeys = 32;
template <int HS> constexpr int kBwd16QMT = HS <= 64 ? kBwd16QTiles : 1;
template <int HS> constexpr int kBwd16QW = HS <= 64 ? kBwd16QWarps : 8;
template <int HS> constexpr int kBwd16QKC = HS <= 64 ? kBwd16QKeys : kTcRows;
constexpr int kBwd16KvTiles = 2;
constexpr int kBwd16KvWarps = 4;
constexpr int kBwd16KvQueries = 32;
template <int HS> constexpr int kBwd16KvMT = HS <= 64 ? kBwd16KvTiles : 1;
template <int HS> constexpr int kBwd16KvW = HS <= 64 ? kBwd16KvWarps : 4;
template <int HS> constexpr int kBwd16KvQC = HS <= 64 ? kBwd16KvQueries : kTcRows;
/* Warps an SM the key pass's register budget is for: kKvBlocks<HS> blocks of four warps' with
 * one tile a warp; eight warps (up to 255 registers) with two. */
template <int HS, int MT> constexpr int kKvWarpsSM = MT > 1 ? 8 : kKvBlocks<HS> *kTcWarps;
template <int HS, int W, int MT = 1>
constexpr int kKvBlocksW = kKvWarpsSM<HS, MT> / W > 0 ? kKvWarpsSM<HS, MT> / W : 1;

/* A tile in shared memory: kTcRows rows of HS, row stride LD elements (HS + 8: 16 bytes past
 * the row, which moves each row by 4 banks, so the 8 rows of an 8x8 ldmatrix never collide). */
template <int HS> struct Tc {
    static constexpr int LD = HS + 8;
    static constexpr int TILE = kTcRows * LD; /* elements */
    static constexpr size_t BYTES = (size_t)TILE * sizeof(bf16);
};

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

/* Where a (batch row, head)'s rows of one operand are: at p + bi * sb + h * sh, a row every ld
 * elements, HS of them read (a bf16 plane: sb = nh * t * HS, sh = t * HS, ld = HS; straight
 * from a bf16 qkv: sb = t * 3c, sh = hs, ld = 3c, and p at q, k or v's first column). */
struct View {
    const bf16 *p;
    size_t sb, sh, ld;
    __device__ __forceinline__ const bf16 *at(int bi, int h) const
    {
        return p + (size_t)bi * sb + (size_t)h * sh;
    }
};

inline View plane_view(const bf16 *plane, int t, int nh, int HS)
{
    return View{plane, (size_t)nh * t * HS, (size_t)t * HS, (size_t)HS};
}

inline View row_view(const bf16 *first, int t, size_t ld, int hs)
{
    return View{first, (size_t)t * ld, (size_t)hs, ld};
}

/* Rows r0.. of a head (row stride ld elements, 16-byte aligned rows of HS) into a tile; rows
 * past t: zeros. The whole block takes part; nothing waits here (cp_commit and cp_wait do). */
template <int HS, int NT = kTcThreads>
__device__ __forceinline__ void tile_async(bf16 *dst, const bf16 *rows, size_t ld, int r0, int t)
{
    constexpr int CPR = HS / 8; /* 16-byte chunks a row */
    static_assert(kTcRows * CPR % NT == 0, "a tile is whole 16-byte chunks a thread");
#pragma unroll
    for (int it = 0; it < kTcRows * CPR / NT; it++) {
        const int i = threadIdx.x + it * NT, r = i / CPR, ch = i % CPR;
        const bool in = r0 + r < t;
        cp_async16(dst + r * Tc<HS>::LD + ch * 8, rows + (size_t)(in ? r0 + r : 0) * ld + ch * 8,
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

/* s (16 MT x 8 NB) = 0, as the products below start. */
template <int MT, int NB> __device__ __forceinline__ void zero_acc(float (&s)[MT][NB][4])
{
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int n = 0; n < NB; n++)
            s[m][n][0] = s[m][n][1] = s[m][n][2] = s[m][n][3] = 0.0f;
}

/* s[m][n] and s[m][n + 1] += a[m] . b for each of the MT row tiles, b a 16x16 B fragment (b0,
 * b1 its first 8 columns, b2, b3 the next 8): what both products below do with each B fragment
 * they read, so that it serves every row tile. */
template <int MT, int NB>
__device__ __forceinline__ void mma_rows(float (&s)[MT][NB][4], int n, const uint32_t (&a)[MT][4],
                                         const uint32_t (&b)[4])
{
#pragma unroll
    for (int m = 0; m < MT; m++) {
        mma16816(s[m][n], a[m], b[0], b[1]);
        mma16816(s[m][n + 1], a[m], b[2], b[3]);
    }
}

/* One step of rows_by_tile over the head: s += a . the tile's columns 16 k .. 16 k + 15, a the
 * MT row tiles' A fragments of those columns. */
template <int HS, int MT, int NB>
__device__ __forceinline__ void rows_by_tile_step(float (&s)[MT][NB][4], const uint32_t (&a)[MT][4],
                                                  const bf16 *tile, int k, int lane)
{
    static_assert(NB % 2 == 0, "columns in blocks of 16");
#pragma unroll
    for (int n = 0; n < NB / 2; n++) {
        uint32_t b[4];
        ldsm4(b, tile + n * 16 * Tc<HS>::LD + k * 16 + off_b(lane, Tc<HS>::LD));
        mma_rows(s, 2 * n, a, b);
    }
}

/* s (16 MT x 8 NB) = a . tile^T: the warp's MT tiles of 16 rows by the NB * 8 rows of the tile
 * from tile on, which are the columns of s. Each B fragment read from shared memory serves the
 * MT row tiles: a warp of 32 rows reads half the bytes a product of one of 16 rows does. Each
 * accumulator sums over the head in the same order whatever MT is. */
template <int HS, int MT, int NB>
__device__ __forceinline__ void
rows_by_tile(float (&s)[MT][NB][4], const uint32_t (&a)[MT][HS / 16][4], const bf16 *tile, int lane)
{
    zero_acc(s);
#pragma unroll
    for (int k = 0; k < HS / 16; k++) {
        uint32_t ak[MT][4];
#pragma unroll
        for (int m = 0; m < MT; m++)
            ak[m][0] = a[m][k][0], ak[m][1] = a[m][k][1], ak[m][2] = a[m][k][2],
            ak[m][3] = a[m][k][3];
        rows_by_tile_step<HS>(s, ak, tile, k, lane);
    }
}

/* acc (16 MT x HS) += p . tile, p 16 MT x 8 NB as accumulators (bf16 A operands), the NB * 8
 * rows of the tile from tile on the rows of the sum; each B fragment serves the MT row tiles,
 * and each accumulator sums over the rows in their order whatever MT is. */
template <int HS, int MT, int NB>
__device__ __forceinline__ void acc_by_tile(float (&acc)[MT][HS / 8][4],
                                            const float (&p)[MT][NB][4], const bf16 *tile, int lane)
{
    static_assert(NB % 2 == 0, "rows in blocks of 16");
#pragma unroll
    for (int k = 0; k < NB / 2; k++) {
        uint32_t a[MT][4];
#pragma unroll
        for (int m = 0; m < MT; m++) {
            a[m][0] = pack_bf16(p[m][2 * k][0], p[m][2 * k][1]);
            a[m][1] = pack_bf16(p[m][2 * k][2], p[m][2 * k][3]);
            a[m][2] = pack_bf16(p[m][2 * k + 1][0], p[m][2 * k + 1][1]);
            a[m][3] = pack_bf16(p[m][2 * k + 1][2], p[m][2 * k + 1][3]);
        }
#pragma unroll
        for (int n = 0; n < HS / 16; n++) {
            uint32_t b[4];
            ldsm4t(b, tile + k * 16 * Tc<HS>::LD + n * 16 + off_a(lane, Tc<HS>::LD));
            mma_rows(acc, 2 * n, a, b);
        }
    }
}

/* The same for one row tile (16 rows) and a whole tile of columns or rows. */
template <int HS>
__device__ __forceinline__ void rows_by_tile(float (&s)[kTcRows / 8][4],
                                             const uint32_t (&a)[HS / 16][4], const bf16 *tile,
                                             int lane)
{
    rows_by_tile<HS, 1, kTcRows / 8>(reinterpret_cast<float(&)[1][kTcRows / 8][4]>(s),
                                     reinterpret_cast<const uint32_t(&)[1][HS / 16][4]>(a), tile,
                                     lane);
}

template <int HS>
__device__ __forceinline__ void
acc_by_tile(float (&acc)[HS / 8][4], const float (&p)[kTcRows / 8][4], const bf16 *tile, int lane)
{
    acc_by_tile<HS, 1, kTcRows / 8>(reinterpret_cast<float(&)[1][HS / 8][4]>(acc),
                                    reinterpret_cast<const float(&)[1][kTcRows / 8][4]>(p), tile,
                                    lane);
}

/* base[r * ld + d], d and d + 1 (each below hs) = v0, v1: fp32 as they are, bf16 rounded to
 * nearest (one 4-byte store where the pair is whole and aligned). */
__device__ __forceinline__ void store2(float *p, float v0, float v1, bool in0, bool in1)
{
    if (in0)
        p[0] = v0;
    if (in1)
        p[1] = v1;
}

__device__ __forceinline__ void store2(bf16 *p, float v0, float v1, bool in0, bool in1)
{
    if (in0 && in1 && ((uintptr_t)p & 3u) == 0)
        *reinterpret_cast<uint32_t *>(p) = pack_bf16(v0, v1);
    else {
        if (in0)
            p[0] = __float2bfloat16_rn(v0);
        if (in1)
            p[1] = __float2bfloat16_rn(v1);
    }
}

/* row[d] = mul * acc's element for rows g / g + 8 (rows r0, r0 + 8 of memory; valid below t). */
template <int HS, class T>
__device__ __forceinline__ void store_acc(const float (&acc)[HS / 8][4], T *base, size_t ld, int r0,
                                          int t, int hs, float mul0, float mul1, int tig)
{
#pragma unroll
    for (int n = 0; n < HS / 8; n++)
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int r = r0 + half * 8, d = n * 8 + 2 * tig;
            const float mul = half ? mul1 : mul0;
            if (r < t)
                store2(base + (size_t)r * ld + d, acc[n][2 * half] * mul,
                       acc[n][2 * half + 1] * mul, d < hs, d + 1 < hs);
        }
}

__device__ __forceinline__ float to_f(float v)
{
    return v;
}

__device__ __forceinline__ float to_f(bf16 v)
{
    return __bfloat162float(v);
}

/* The bf16 planes, plane blockIdx.y of section sec0 + blockIdx.y: a thread's chunk (8
 * elements of one row and head) of q, k, v of qkv (sections 0..2) or of dout (section 3, which
 * also sums D = rowsum(dout * out) of the row and head over the HS / 8 lanes of its chunks, a
 * power of two of consecutive lanes). T: float, or bf16 (the fallback of the bf16 ops, for
 * head sizes or buffers their tiles cannot read in place; scalar loads). */
template <int HS, class T>
__global__ void __launch_bounds__(kCvtThreads)
    att_to_heads_kernel(int t, int c, int nh, size_t rows, int sec0, const T *qkv, const T *dout,
                        const T *out, bf16 *planes, float *dsum, bool vec)
{
    constexpr int CPR = HS / 8;
    const int sec = sec0 + blockIdx.y, hs = c / nh;
    const size_t i = (size_t)blockIdx.x * kCvtThreads + threadIdx.x;
    const size_t rh = i / CPR, row = rh / nh;
    const int ch = (int)(i % CPR), h = (int)(rh % nh), d0 = ch * 8;
    const bool in = row < rows;
    float v[8], dot = 0.0f;
    const T *src = sec < 3 ? qkv + row * 3 * (size_t)c + (size_t)sec * c + (size_t)h * hs
                           : dout + row * (size_t)c + (size_t)h * hs;
#pragma unroll
    for (int j = 0; j < 8; j += 4) {
        bool done = false;
        if constexpr (std::is_same<T, float>::value) {
            if (in && vec && d0 + j < hs) {
                const float4 f = *reinterpret_cast<const float4 *>(src + d0 + j);
                v[j] = f.x, v[j + 1] = f.y, v[j + 2] = f.z, v[j + 3] = f.w;
                done = true;
            }
        }
        if (!done) {
#pragma unroll
            for (int e = 0; e < 4; e++)
                v[j + e] = in && d0 + j + e < hs ? to_f(src[d0 + j + e]) : 0.0f;
        }
    }
    if (sec == 3 && dsum != nullptr) {
        const T *orow = out + row * (size_t)c + (size_t)h * hs;
#pragma unroll
        for (int j = 0; j < 8; j++)
            if (in && d0 + j < hs)
                dot += v[j] * to_f(orow[d0 + j]);
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

/* The bf16 planes of sections sec0 .. sec0 + nsec - 1 (q, k, v of qkv; dout, with D into
 * *dsum) into the workspace from byte off on, grown first if need be (after the side streams,
 * which may read a bf16 copy there). */
template <int HS, class T>
int to_heads(cuda_impl *ci, int b, int t, int c, int nh, int sec0, int nsec, const T *qkv,
             const T *dout, const T *out, size_t off, bf16 **planes, float **dsum, mgpu_err_t *err)
{
    const size_t rows = (size_t)b * t, plane = rows * nh * HS;
    const float *base = (const float *)ci->ws;
    int rc;
    if ((rc = cuda_join(ci, err)) < 0 ||
        (rc = ensure_ws(ci, off + nsec * plane * sizeof(bf16), err)) < 0)
        return rc;
    if (dsum != nullptr && *dsum == base) /* D in the workspace's first bytes, which moved */
        *dsum = (float *)ci->ws;
    *planes = (bf16 *)((char *)ci->ws + off);
    const bool vec = std::is_same<T, float>::value && (c / nh) % 4 == 0 && aligned16(qkv) &&
                     (dout == nullptr || aligned16(dout, out));
    const size_t chunks = rows * nh * (HS / 8);
    dim3 grid((unsigned)((chunks + kCvtThreads - 1) / kCvtThreads), (unsigned)nsec);
    att_to_heads_kernel<HS, T><<<grid, kCvtThreads, 0, ci->stream>>>(
        t, c, nh, rows, sec0, qkv, dout, out, *planes, dsum != nullptr ? *dsum : nullptr, vec);
    CUDA_CHECK_LAUNCH(err, "att_to_heads_kernel<%d> (b=%d t=%d c=%d nh=%d)", HS, b, t, c, nh);
    return 0;
}

/* The bf16 ops are called without mgpu_kg_*'s checks (the model checks its shapes once): the
 * kernels' limits, checked here all the same. */
inline int check16(const char *op, int b, int t, int c, int nh, mgpu_err_t *err)
{
    if (nh <= 0 || c <= 0 || c % nh != 0 || c / nh > 128)
        return mgpu_err_set(err, MGPU_E_RANGE,
                            "%s (cuda, bf16): %d heads of %d channels, expected a head size c/nh "
                            "of 1..128",
                            op, nh, c);
    if (b < 0 || t < 0 || b > 65535 || nh > 65535)
        return mgpu_err_set(err, MGPU_E_RANGE,
                            "%s (cuda, bf16): batch %d, length %d, %d heads, expected 0..65535 "
                            "batch rows and heads and a length >= 0",
                            op, b, t, nh);
    return 0;
}
} /* namespace */

/* gpt_attention_wg.cu: the bf16 attention on Hopper's warpgroup MMAs, for q, k and v read
 * straight from a 16-byte aligned qkv (b, t, 3c) whose heads are 64 or 128 wide. _ok: whether
 * its kernels run here (built for sm_90a, a compute capability 9.0 device, MGPU_GPT_WGMMA not
 * 0) for heads of hs; then the forward: */
bool gpt16_attention_wg_ok(const cuda_impl *ci, int hs);
int gpt16_attention_forward_wg(cuda_impl *ci, int b, int t, int c, int nh, const bf16 *qkv,
                               bf16 *out, float *lse, float scale, mgpu_err_t *err);
/* The backward's passes on the same terms (where _ok says so), for dout (b, t, c) 16-byte
 * aligned: _prepare once before the launches (their shared memory, for heads of hs), then each
 * pass on its stream, returning the launch's status. */
int gpt16_attention_backward_wg_prepare(int hs, mgpu_err_t *err);
cudaError_t gpt16_attention_backward_wg_launch(const cuda_impl *ci, bool key_pass,
                                               cudaStream_t stream, int b, int t, int c, int nh,
                                               const bf16 *qkv, const bf16 *dout, const float *lse,
                                               const float *dsum, bf16 *dqkv, float scale);
} /* namespace mgpu_cuda */

#endif
