/* gpt_embed.cu - the token + position embedding, forward and a deterministic backward
 * (transformer.c's mgpu_gpt_embed_* is the reference).
 *
 * The backward adds each token's rows of dout into its row of dwte in the order of the rows,
 * as the reference does, with no float atomics: a stable radix sort of the token ids (CUB;
 * stable, so a token's rows stay in ascending order) makes one bucket a token, and a block
 * per bucket adds its rows one after another, starting from dwte's value, so the result is
 * the reference's to the bit. dwpe is a pass per position over the batch rows, in order. */
#include "gpt_cuda_impl.h" /* cuda_impl, the device helpers, the ops' declarations */
#include "cuda_check.h"    /* CUDA_CHECK, CUDA_CHECK_LAUNCH */

#include <cub/device/device_radix_sort.cuh> /* cub::DeviceRadixSort::SortPairs */

namespace mgpu_cuda
{
namespace
{

constexpr int kEmbedThreads = 128; /* a bucket's block: columns, four a thread where they fit */

/* out[row] = wte[tokens[row]] + wpe[row % t]; float4 f.vec(i) when c % 4 == 0. */
struct EmbedFwd {
    const int32_t *tokens;
    const float *wte, *wpe;
    float *out;
    size_t c, t;
    __device__ void vec(size_t i) const
    {
        size_t e = 4 * i, row = e / c, col = e - row * c;
        size_t tok = (size_t)tokens[row], pos = row % t;
        float4 a = ld4(wte, (tok * c + col) / 4), b = ld4(wpe, (pos * c + col) / 4);
        st4(out, i, make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w));
    }
    __device__ void one(size_t i) const
    {
        size_t row = i / c, col = i - row * c;
        out[i] = wte[(size_t)tokens[row] * c + col] + wpe[(row % t) * c + col];
    }
};

__global__ void __launch_bounds__(kThreads) iota_kernel(int n, int32_t *v)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        v[i] = i;
}

/* end[tok] = one past the last sorted row of tok's bucket (only buckets that exist). */
__global__ void __launch_bounds__(kThreads)
    bucket_end_kernel(int n, const uint32_t *keys, int32_t *end)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        if (i == n - 1 || keys[i + 1] != keys[i])
            end[keys[i]] = i + 1;
}

/* A block per bucket (its first sorted row is the bucket's leader; the other blocks of the
 * grid-stride loop skip): dwte[tok] += dout[rows], the rows in ascending order. A frequent
 * token (a space in a byte-level text) has thousands of rows, and the sum must follow them one
 * by one, so the chain's latency is what counts: the bucket's row numbers are staged in shared
 * memory a block-width at a time, and each thread keeps eight rows' loads in flight. */
template <bool VEC>
__global__ void __launch_bounds__(kEmbedThreads)
    bucket_add_kernel(int n, int c, const uint32_t *keys, const int32_t *rows, const int32_t *end,
                      const float *dout, float *dwte)
{
    __shared__ int srow[kEmbedThreads];
    const int w = VEC ? c / 4 : c; /* columns (groups of four with VEC) */
    for (int i = blockIdx.x; i < n; i += gridDim.x) {
        const uint32_t tok = keys[i];
        if (i > 0 && keys[i - 1] == tok)
            continue; /* the same for the whole block */
        const int e = end[tok];
        float *dst = dwte + (size_t)tok * c;
        for (int s0 = i; s0 < e; s0 += kEmbedThreads) {
            const int cnt = min(kEmbedThreads, e - s0);
            __syncthreads(); /* the previous chunk's rows are read */
            if ((int)threadIdx.x < cnt)
                srow[threadIdx.x] = rows[s0 + threadIdx.x];
            __syncthreads();
            for (int j = threadIdx.x; j < w; j += blockDim.x) {
                if (VEC) {
                    float4 acc = reinterpret_cast<const float4 *>(dst)[j];
                    int k = 0;
                    for (; k + 7 < cnt; k += 8) {
                        float4 v[8];
#pragma unroll
                        for (int u = 0; u < 8; u++)
                            v[u] = ld4(dout, (size_t)srow[k + u] * w + j);
#pragma unroll
                        for (int u = 0; u < 8; u++) {
                            acc.x += v[u].x, acc.y += v[u].y;
                            acc.z += v[u].z, acc.w += v[u].w;
                        }
                    }
                    for (; k < cnt; k++) {
                        float4 v = ld4(dout, (size_t)srow[k] * w + j);
                        acc.x += v.x, acc.y += v.y, acc.z += v.z, acc.w += v.w;
                    }
                    reinterpret_cast<float4 *>(dst)[j] = acc;
                } else {
                    float acc = dst[j];
                    int k = 0;
                    for (; k + 7 < cnt; k += 8) {
                        float v[8];
#pragma unroll
                        for (int u = 0; u < 8; u++)
                            v[u] = dout[(size_t)srow[k + u] * c + j];
#pragma unroll
                        for (int u = 0; u < 8; u++)
                            acc += v[u];
                    }
                    for (; k < cnt; k++)
                        acc += dout[(size_t)srow[k] * c + j];
                    dst[j] = acc;
                }
            }
        }
    }
}

/* dwpe[pos] += dout[b, pos] for b = 0, 1, ...: a thread a column (four with VEC). */
template <bool VEC>
__global__ void __launch_bounds__(kThreads)
    pos_add_kernel(int b, int t, int c, const float *dout, float *dwpe)
{
    const size_t w = VEC ? c / 4 : c, total = (size_t)t * w, plane = (size_t)t * w;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        if (VEC) {
            float4 acc = ld4(dwpe, i);
#pragma unroll 8
            for (int bi = 0; bi < b; bi++) {
                float4 v = ld4(dout, bi * plane + i);
                acc.x += v.x, acc.y += v.y, acc.z += v.z, acc.w += v.w;
            }
            st4(dwpe, i, acc);
        } else {
            float acc = dwpe[i];
#pragma unroll 8
            for (int bi = 0; bi < b; bi++)
                acc += dout[bi * plane + i];
            dwpe[i] = acc;
        }
    }
}

size_t align256(size_t v)
{
    return (v + 255) / 256 * 256;
}

} /* namespace */

int gpt_embed_forward(void *impl, int b, int t, int c, const int32_t *tokens, const float *wte,
                      const float *wpe, float *out, mgpu_err_t *err)
{
    cuda_impl *ci = (cuda_impl *)impl;
    size_t n = (size_t)b * t * c;
    invalidate(ci, out, n * sizeof(float));
    if (n == 0)
        return 0;
    bool vec = c % 4 == 0 && aligned16(wte, wpe, out);
    return launch_ew(ci, EmbedFwd{tokens, wte, wpe, out, (size_t)c, (size_t)t}, n, vec,
                     "embed_forward", err);
}

int gpt_embed_backward(void *impl, int b, int t, int c, int vocab, const int32_t *tokens,
                       const float *dout, float *dwte, float *dwpe, mgpu_err_t *err)
{
    cuda_impl *ci = (cuda_impl *)impl;
    const long long nl = (long long)b * t;
    invalidate(ci, dwte, sizeof(float) * (size_t)vocab * c);
    invalidate(ci, dwpe, sizeof(float) * (size_t)t * c);
    if (nl == 0 || c == 0)
        return 0;
    if (nl > 0x7fffffff)
        return mgpu_err_set(err, MGPU_E_RANGE,
                            "embed_backward (cuda): %d x %d rows, expected at most 2^31 - 1", b, t);
    const int n = (int)nl;
    int bits = 1;
    while (bits < 31 && (1ll << bits) < vocab)
        bits++;
    /* The workspace: sorted keys, rows before and after the sort, the buckets' ends, CUB's
     * temporary storage (its size is a host computation: no launch, no sync). */
    size_t tmp_bytes = 0;
    CUDA_CHECK(err, cub::DeviceRadixSort::SortPairs(nullptr, tmp_bytes, (const uint32_t *)tokens,
                                                    (uint32_t *)nullptr, (const int32_t *)nullptr,
                                                    (int32_t *)nullptr, n, 0, bits, ci->stream));
    /* The operand workspace may hold a bf16 copy that a weight gradient on a side stream
     * still reads (cublas.cu's temporary copies): join the side streams before reusing it. */
    int rc = cuda_join(impl, err);
    if (rc < 0)
        return rc;
    const size_t nb = align256((size_t)n * 4);
    const size_t bytes = 3 * nb + align256((size_t)vocab * 4) + align256(tmp_bytes);
    if ((rc = ensure_ws(ci, bytes, err)) < 0)
        return rc;
    char *w = (char *)ci->ws;
    uint32_t *keys = (uint32_t *)w;
    int32_t *rows_in = (int32_t *)(w + nb), *rows = (int32_t *)(w + 2 * nb);
    int32_t *end = (int32_t *)(w + 3 * nb);
    void *tmp = w + 3 * nb + align256((size_t)vocab * 4);

    unsigned blocks = grid_for(ci, (size_t)n, kEwBlocksPerSm);
    iota_kernel<<<blocks, kThreads, 0, ci->stream>>>(n, rows_in);
    CUDA_CHECK_LAUNCH(err, "iota_kernel (n=%d)", n);
    /* Token ids are checked to be in 0..vocab-1, so their bits as unsigned sort as the ids. */
    CUDA_CHECK(err, cub::DeviceRadixSort::SortPairs(tmp, tmp_bytes, (const uint32_t *)tokens, keys,
                                                    rows_in, rows, n, 0, bits, ci->stream));
    bucket_end_kernel<<<blocks, kThreads, 0, ci->stream>>>(n, keys, end);
    CUDA_CHECK_LAUNCH(err, "bucket_end_kernel (n=%d)", n);
    const bool vec = c % 4 == 0 && aligned16(dout, dwte, dwpe);
    unsigned nbk = (unsigned)(n < ci->sms * 16 ? n : ci->sms * 16);
    if (vec)
        bucket_add_kernel<true>
            <<<nbk, kEmbedThreads, 0, ci->stream>>>(n, c, keys, rows, end, dout, dwte);
    else
        bucket_add_kernel<false>
            <<<nbk, kEmbedThreads, 0, ci->stream>>>(n, c, keys, rows, end, dout, dwte);
    CUDA_CHECK_LAUNCH(err, "bucket_add_kernel (n=%d c=%d)", n, c);
    size_t cols = vec ? (size_t)t * (c / 4) : (size_t)t * c;
    unsigned pblocks = grid_for(ci, cols, kEwBlocksPerSm);
    if (vec)
        pos_add_kernel<true><<<pblocks, kThreads, 0, ci->stream>>>(b, t, c, dout, dwpe);
    else
        pos_add_kernel<false><<<pblocks, kThreads, 0, ci->stream>>>(b, t, c, dout, dwpe);
    CUDA_CHECK_LAUNCH(err, "pos_add_kernel (b=%d t=%d c=%d)", b, t, c);
    return 0;
}

} /* namespace mgpu_cuda */
