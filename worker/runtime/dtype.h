/* dtype.h - element types and reductions of the CPU backend's collectives.
 *
 * The reductions every CPU collective shares, so that results are the same on every rank and
 * for every message size: element i of the result is src[0][i] op src[1][i] op ... in source
 * (rank) order. f16 and bf16 are widened to f32, reduced in f32 and rounded to nearest even
 * once at the end; f32 reduces in f32, f64 in f64. Integer sums wrap (two's complement) on
 * overflow; an integer average is the wrapped sum divided by the number of sources,
 * truncated toward zero, as NCCL's ncclAvg does for integers. Max and min of floats compare
 * with < and > (a NaN in the first source stays, later NaNs are skipped).
 *
 * Nothing here allocates; the caller owns every buffer. */
#ifndef MGPU_DTYPE_H
#define MGPU_DTYPE_H

#include <stddef.h> /* size_t */
#include <stdint.h> /* uint16_t */

#include "mgpu.h" /* mgpu_dtype_t, mgpu_redop_t */

/* 1 when dt is one of mgpu_dtype_t's values. */
int mgpu_dtype_valid(int dt);

/* out[i] = src[0][i] op ... op src[n-1][i] for i < count; out may be any of the sources (each
 * element is read from every source before it is written). dt and op must be valid. */
void mgpu_dtype_reduce(void *out, const void *const *src, int n, size_t count, mgpu_dtype_t dt,
                       mgpu_redop_t op);

/* IEEE binary16 and bfloat16 to and from f32, rounding to nearest even (NaN stays NaN). */
float mgpu_dtype_f16_to_f32(uint16_t h);
uint16_t mgpu_dtype_f32_to_f16(float f);
float mgpu_dtype_bf16_to_f32(uint16_t h);
uint16_t mgpu_dtype_f32_to_bf16(float f);

#endif
