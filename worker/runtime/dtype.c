/* dtype.c - element types and reductions of the CPU backend's collectives (see dtype.h). */
#include "dtype.h"

#include <string.h> /* memcpy */

static const char *const dtype_names[] = {"f32", "f64", "f16", "bf16", "i32", "i64"};
static const size_t dtype_sizes[] = {4, 8, 2, 2, 4, 8};

int mgpu_dtype_valid(int dt)
{
    return dt >= 0 && dt < (int)(sizeof dtype_sizes / sizeof dtype_sizes[0]);
}

size_t mgpu_dtype_size(mgpu_dtype_t dt)
{
    return mgpu_dtype_valid((int)dt) ? dtype_sizes[dt] : 0;
}

const char *mgpu_dtype_name(mgpu_dtype_t dt)
{
    return mgpu_dtype_valid((int)dt) ? dtype_names[dt] : "?";
}

float mgpu_dtype_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
    float f;

    if (e == 0) {
        /* Zero or subnormal: m * 2^-24, exact in f32. */
        f = (float)m * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    if (e == 31)
        x = sign | 0x7f800000u | (m << 13);
    else
        x = sign | ((e - 15 + 127) << 23) | (m << 13);
    memcpy(&f, &x, sizeof f);
    return f;
}

uint16_t mgpu_dtype_f32_to_f16(float f)
{
    uint32_t x, sign, h, rem;

    memcpy(&x, &f, sizeof x);
    sign = (x >> 16) & 0x8000u;
    x &= 0x7fffffffu;
    if (x >= 0x7f800000u) /* inf, NaN (kept quiet) */
        return (uint16_t)(sign | 0x7c00u | (x > 0x7f800000u ? 0x200u : 0));
    if (x >= 0x477ff000u) /* 65520 and up round to inf (65520 is the tie, 65504 is odd) */
        return (uint16_t)(sign | 0x7c00u);
    if (x < 0x38800000u) {
        /* Below the smallest normal, 2^-14: a subnormal of (1.m * 2^(e-127)) / 2^-24 =
         * mant >> (126 - e) units, rounded to nearest even by hand (nearbyintf would do it,
         * at the cost of saving and restoring the floating-point environment per element).
         * A carry to 1024 lands on the smallest normal, which is also right. */
        uint32_t e = x >> 23, mant = (x & 0x7fffffu) | 0x800000u, shift = 126 - e, q, r, half;
        if (e == 0 || shift > 24)
            return (uint16_t)sign; /* under 2^-25: rounds to zero */
        q = mant >> shift;
        r = mant & ((1u << shift) - 1);
        half = 1u << (shift - 1);
        if (r > half || (r == half && (q & 1u)))
            q++;
        return (uint16_t)(sign | q);
    }
    h = (((x >> 23) - 127 + 15) << 10) | ((x & 0x7fffffu) >> 13);
    rem = x & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++; /* a carry into the exponent is the right rounding too */
    return (uint16_t)(sign | h);
}

float mgpu_dtype_bf16_to_f32(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

uint16_t mgpu_dtype_f32_to_bf16(float f)
{
    uint32_t x;

    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u); /* NaN: keep it a (quiet) NaN */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* One loop per type; acc is the accumulator's type, LOAD and STORE convert. */
#define DTYPE_REDUCE(T, ACC, LOAD, STORE, DIV)                                                     \
    do {                                                                                           \
        T *o = out;                                                                                \
        for (size_t i = 0; i < count; i++) {                                                       \
            ACC a = LOAD(((const T *)src[0])[i]);                                                  \
            for (int q = 1; q < n; q++) {                                                          \
                ACC b = LOAD(((const T *)src[q])[i]);                                              \
                if (op == MGPU_MAX)                                                                \
                    a = b > a ? b : a;                                                             \
                else if (op == MGPU_MIN)                                                           \
                    a = b < a ? b : a;                                                             \
                else                                                                               \
                    a = a + b;                                                                     \
            }                                                                                      \
            if (op == MGPU_AVG)                                                                    \
                a = DIV(a, n);                                                                     \
            o[i] = STORE(a);                                                                       \
        }                                                                                          \
    } while (0)

#define ID(x) (x)
#define FDIV(a, n) ((a) / (n))
/* Integers: the sum wraps as unsigned arithmetic does (a signed overflow would be undefined),
 * the average truncates toward zero (C's division), as NCCL's integer ncclAvg. */
#define I32_ADD(a, b) ((int32_t)((uint32_t)(a) + (uint32_t)(b)))
#define I64_ADD(a, b) ((int64_t)((uint64_t)(a) + (uint64_t)(b)))

#define DTYPE_REDUCE_INT(T, ADD)                                                                   \
    do {                                                                                           \
        T *o = out;                                                                                \
        for (size_t i = 0; i < count; i++) {                                                       \
            T a = ((const T *)src[0])[i];                                                          \
            for (int q = 1; q < n; q++) {                                                          \
                T b = ((const T *)src[q])[i];                                                      \
                if (op == MGPU_MAX)                                                                \
                    a = b > a ? b : a;                                                             \
                else if (op == MGPU_MIN)                                                           \
                    a = b < a ? b : a;                                                             \
                else                                                                               \
                    a = ADD(a, b);                                                                 \
            }                                                                                      \
            if (op == MGPU_AVG)                                                                    \
                a = (T)(a / (T)n);                                                                 \
            o[i] = a;                                                                              \
        }                                                                                          \
    } while (0)

void mgpu_dtype_reduce(void *out, const void *const *src, int n, size_t count, mgpu_dtype_t dt,
                       mgpu_redop_t op)
{
    switch (dt) {
    case MGPU_DTYPE_F32:
        DTYPE_REDUCE(float, float, ID, ID, FDIV);
        break;
    case MGPU_DTYPE_F64:
        DTYPE_REDUCE(double, double, ID, ID, FDIV);
        break;
    case MGPU_DTYPE_F16:
        DTYPE_REDUCE(uint16_t, float, mgpu_dtype_f16_to_f32, mgpu_dtype_f32_to_f16, FDIV);
        break;
    case MGPU_DTYPE_BF16:
        DTYPE_REDUCE(uint16_t, float, mgpu_dtype_bf16_to_f32, mgpu_dtype_f32_to_bf16, FDIV);
        break;
    case MGPU_DTYPE_I32:
        DTYPE_REDUCE_INT(int32_t, I32_ADD);
        break;
    case MGPU_DTYPE_I64:
        DTYPE_REDUCE_INT(int64_t, I64_ADD);
        break;
    }
}
