/* elementwise.cu - activations (forward, with the bias, backward) and scale: one pass over
 * memory, float4 where the pointers allow (kernels/elementwise.c is the reference). */
#include "cuda_impl.h"  /* cuda_impl, the device helpers, the other families' functions */
#include "cuda_check.h" /* CUDA_CHECK, CUDA_CHECK_LAUNCH, CUBLAS_CHECK */

namespace mgpu_cuda
{
namespace
{

template <int A> struct ActFwd {
    const float *x;
    float *y;
    __device__ void vec(size_t i) const
    {
        st4(y, i, act4<A>(ld4(x, i)));
    }
    __device__ void one(size_t i) const
    {
        y[i] = act_f<A>(x[i]);
    }
};

/* z[r, c] += bias[c] (when bias), y = act(z); z is stored back only when bias changed it. */
template <int A> struct BiasAct {
    float *z;
    const float *bias;
    float *y;
    size_t cols;
    __device__ void vec(size_t i) const
    {
        float4 v = ld4(z, i);
        if (bias != nullptr) {
            float4 b = ld4(bias, i % (cols / 4));
            v.x += b.x;
            v.y += b.y;
            v.z += b.z;
            v.w += b.w;
            st4(z, i, v);
        }
        if (A != MGPU_ACT_IDENTITY || y != z)
            st4(y, i, act4<A>(v));
    }
    __device__ void one(size_t i) const
    {
        float v = z[i];
        if (bias != nullptr) {
            v += bias[i % cols];
            z[i] = v;
        }
        if (A != MGPU_ACT_IDENTITY || y != z)
            y[i] = act_f<A>(v);
    }
};

/* Reads only what the activation's derivative needs: z for gelu, y for the others. */
template <int A> struct ActBwd {
    const float *z, *y, *dy;
    float *dz;
    static constexpr bool kNeedZ = A == MGPU_ACT_GELU;
    __device__ void vec(size_t i) const
    {
        float4 d = ld4(dy, i);
        float4 s = kNeedZ ? ld4(z, i) : ld4(y, i);
        float4 r;
        r.x = kNeedZ ? act_b<A>(s.x, 0.0f, d.x) : act_b<A>(0.0f, s.x, d.x);
        r.y = kNeedZ ? act_b<A>(s.y, 0.0f, d.y) : act_b<A>(0.0f, s.y, d.y);
        r.z = kNeedZ ? act_b<A>(s.z, 0.0f, d.z) : act_b<A>(0.0f, s.z, d.z);
        r.w = kNeedZ ? act_b<A>(s.w, 0.0f, d.w) : act_b<A>(0.0f, s.w, d.w);
        st4(dz, i, r);
    }
    __device__ void one(size_t i) const
    {
        dz[i] = kNeedZ ? act_b<A>(z[i], 0.0f, dy[i]) : act_b<A>(0.0f, y[i], dy[i]);
    }
};

struct Scale {
    float *x;
    float alpha;
    __device__ void vec(size_t i) const
    {
        float4 v = ld4(x, i);
        st4(x, i, make_float4(v.x * alpha, v.y * alpha, v.z * alpha, v.w * alpha));
    }
    __device__ void one(size_t i) const
    {
        x[i] *= alpha;
    }
};

} /* namespace */

int cuda_bias_act_forward(void *impl, mgpu_act_t act, int rows, int cols, float *z,
                          const float *bias, float *y, mgpu_err_t *err)
{
    invalidate((cuda_impl *)impl, z, sizeof(float) * rows * (size_t)cols);
    invalidate((cuda_impl *)impl, y, sizeof(float) * rows * (size_t)cols);
    cuda_impl *c = (cuda_impl *)impl;
    size_t n = (size_t)rows * cols;
    if (act == MGPU_ACT_IDENTITY && bias == NULL)
        return y == z ? 0 : cuda_copy(impl, y, z, n * sizeof(float), err);
    bool vec = cols % 4 == 0 && aligned16(z, y, bias);
    return with_act(act, [&](auto a) {
        constexpr int A = decltype(a)::value;
        return launch_ew(c, BiasAct<A>{z, bias, y, (size_t)cols}, n, vec, "bias_act_forward", err);
    });
}

int cuda_act_forward(void *impl, mgpu_act_t act, size_t n, const float *x, float *y,
                     mgpu_err_t *err)
{
    invalidate((cuda_impl *)impl, y, sizeof(float) * n);
    cuda_impl *c = (cuda_impl *)impl;
    if (act == MGPU_ACT_IDENTITY)
        return cuda_copy(impl, y, x, n * sizeof(float), err);
    bool vec = aligned16(x, y);
    return with_act(act, [&](auto a) {
        constexpr int A = decltype(a)::value;
        return launch_ew(c, ActFwd<A>{x, y}, n, vec, "act_forward", err);
    });
}

int cuda_act_backward(void *impl, mgpu_act_t act, size_t n, const float *z, const float *y,
                      const float *dy, float *dz, mgpu_err_t *err)
{
    invalidate((cuda_impl *)impl, dz, sizeof(float) * n);
    cuda_impl *c = (cuda_impl *)impl;
    if (act == MGPU_ACT_IDENTITY)
        return cuda_copy(impl, dz, dy, n * sizeof(float), err);
    bool vec = aligned16(dy, dz, act == MGPU_ACT_GELU ? z : y);
    return with_act(act, [&](auto a) {
        constexpr int A = decltype(a)::value;
        return launch_ew(c, ActBwd<A>{z, y, dy, dz}, n, vec, "act_backward", err);
    });
}

int cuda_scale(void *impl, size_t n, float alpha, float *x, mgpu_err_t *err)
{
    invalidate((cuda_impl *)impl, x, sizeof(float) * n);
    return launch_ew((cuda_impl *)impl, Scale{x, alpha}, n, aligned16(x), "scale", err);
}

} /* namespace mgpu_cuda */
