/* safetensors.h - the safetensors file format (Hugging Face's model.safetensors), read and
 * written from its specification:
 *
 *   8 bytes   N, the header's length, unsigned little-endian
 *   N bytes   a JSON object, UTF-8, starting with '{' and possibly padded with spaces:
 *             "NAME": {"dtype": "F32", "shape": [2, 3], "data_offsets": [BEGIN, END]}, ...
 *             and an optional "__metadata__": {"key": "value", ...} of strings
 *   the rest  the data: tensor NAME is bytes [BEGIN, END) of it, row-major, little-endian
 *
 * The reader checks what the reference implementation checks: a header of at most 100 MB
 * that fits in the file, known dtypes, END - BEGIN = the product of the shape times the dtype's
 * size, and tensors that cover the data exactly, without holes or overlaps. Every failure is
 * MGPU_E_CONFIG naming the file and, where there is one, the tensor. The file is mapped
 * read-only, never copied whole; mgpu_st_read_f32 converts F32, BF16, F16 and F64 to float.
 *
 * The writer puts the tensors in the order given, pads the header with spaces to a multiple
 * of 8 bytes (so that each tensor of these dtypes is aligned in a mapped file, as Hugging
 * Face's writer does) and replaces the file atomically (atomic_file.h).
 *
 * Ownership: mgpu_st_open returns an object freed with mgpu_st_close; the tensors, names and
 * metadata it hands out live until then. The writer only reads the caller's buffers. */
#ifndef MGPU_SAFETENSORS_H
#define MGPU_SAFETENSORS_H

#include <stddef.h> /* size_t */
#include <stdint.h> /* int64_t, uint8_t */

#include "error.h" /* mgpu_err_t */

#define MGPU_ST_MAX_DIMS 8

/* The specification's dtypes; mgpu_st_dtype_name gives their names. */
typedef enum mgpu_st_dtype {
    MGPU_ST_BOOL,
    MGPU_ST_U8,
    MGPU_ST_I8,
    MGPU_ST_F8_E5M2,
    MGPU_ST_F8_E4M3,
    MGPU_ST_I16,
    MGPU_ST_U16,
    MGPU_ST_F16,
    MGPU_ST_BF16,
    MGPU_ST_I32,
    MGPU_ST_U32,
    MGPU_ST_F32,
    MGPU_ST_F64,
    MGPU_ST_I64,
    MGPU_ST_U64,
    MGPU_ST_N_DTYPES
} mgpu_st_dtype_t;

typedef struct mgpu_st_tensor {
    char *name;
    mgpu_st_dtype_t dtype;
    int ndim;
    int64_t shape[MGPU_ST_MAX_DIMS];
    size_t begin, end; /* bytes of the data section */
} mgpu_st_tensor_t;

typedef struct mgpu_st {
    char *path;
    int n;                     /* tensors, in the header's order */
    mgpu_st_tensor_t *tensors; /* n */
    int n_meta;
    char **meta; /* n_meta pairs: key, value */
    const uint8_t *map;
    size_t map_size;
    const uint8_t *data; /* map + 8 + the header's length */
    size_t data_size;
} mgpu_st_t;

/* "F32", "BF16", ...; the bytes of one element. */
const char *mgpu_st_dtype_name(mgpu_st_dtype_t d);
size_t mgpu_st_dtype_size(mgpu_st_dtype_t d);

/* Maps path and checks its header as above. */
int mgpu_st_open(const char *path, mgpu_st_t **out, mgpu_err_t *err);
void mgpu_st_close(mgpu_st_t *st);

/* The tensor named name, or NULL. */
const mgpu_st_tensor_t *mgpu_st_find(const mgpu_st_t *st, const char *name);
/* The value of the metadata's key, or NULL. */
const char *mgpu_st_meta(const mgpu_st_t *st, const char *key);
/* Elements of t: the product of its shape (1 for a scalar). */
size_t mgpu_st_numel(const mgpu_st_tensor_t *t);

/* All elements of t as floats into dst (mgpu_st_numel(t) of them); a dtype other than F32,
 * BF16, F16 and F64 is MGPU_E_CONFIG naming the tensor. */
int mgpu_st_read_f32(const mgpu_st_t *st, const mgpu_st_tensor_t *t, float *dst, mgpu_err_t *err);

/* One tensor to write: data holds numel x the dtype's size bytes, little-endian. */
typedef struct mgpu_st_out {
    const char *name;
    mgpu_st_dtype_t dtype;
    int ndim;
    int64_t shape[MGPU_ST_MAX_DIMS];
    const void *data;
} mgpu_st_out_t;

/* Writes the n tensors and n_meta metadata pairs (meta[2i] the key, meta[2i + 1] the value;
 * none: no __metadata__) to path, atomically; flags as mgpu_atomic_file_write's. */
int mgpu_st_write(const char *path, const mgpu_st_out_t *t, int n, const char *const *meta,
                  int n_meta, int flags, mgpu_err_t *err);

#endif
