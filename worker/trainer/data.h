/* data.h - the trainer's data sets, held in host memory: features as float32 rows, integer
 * labels (classification) and/or float targets (regression).
 *
 *   random     the article's RandomDataset: N samples of F values from a seeded normal
 *              generator; with random targets (mse) and random labels (cross_entropy)
 *   synthetic  Gaussian clusters from a seed: each class owns clusters_per_class centers
 *              drawn N(0, class_sep^2) per feature, samples are a center plus N(0, std^2)
 *              noise; separable enough for an MLP to reach >= 95% held-out accuracy
 *   npy        NumPy .npy files (format versions 1-3, C order, little-endian): features
 *              float32/float64/int64/int32/int16/uint8 of shape (N, ...) flattened to (N, F);
 *              labels int64/int32/int16/uint8 of shape (N) or (N, 1); regression targets any
 *              of those dtypes, shape (N) or (N, T)
 *
 * Every generator and the split are deterministic in their seed (rng.h), so all ranks build
 * the same data set and the same held-out split without talking to each other.
 *
 * Ownership: a dataset owns its arrays; mgpu_data_free releases them (and is safe on a
 * zeroed or already freed dataset). */
#ifndef MGPU_DATA_H
#define MGPU_DATA_H

#include <stddef.h> /* size_t */
#include <stdint.h> /* int32_t, uint64_t */

#include "error.h" /* mgpu_err_t */

typedef struct mgpu_dataset {
    size_t n;        /* samples */
    int features;    /* floats per sample */
    int classes;     /* labels lie in [0, classes); 0 when there are no labels */
    int target_dim;  /* floats per target; 0 when there are no targets */
    float *x;        /* n * features */
    int32_t *labels; /* n, or NULL */
    float *targets;  /* n * target_dim, or NULL */
} mgpu_dataset_t;

/* The article's RandomDataset(size=features, length=n), plus targets [n, outputs] drawn
 * N(0, 1) and labels uniform in [0, outputs). */
int mgpu_data_random(mgpu_dataset_t *ds, size_t n, int features, int outputs, uint64_t seed,
                     mgpu_err_t *err);

/* Gaussian clusters (see above); labels only. */
int mgpu_data_synthetic(mgpu_dataset_t *ds, size_t n, int features, int classes,
                        int clusters_per_class, double class_sep, double std, uint64_t seed,
                        mgpu_err_t *err);

/* Features from x_path; from y_path labels when want_labels (classes: 0 infers max + 1, else
 * every label must be below it) or float targets otherwise. Errors name the file, the dtype
 * or shape found and what is accepted. */
int mgpu_data_load_npy(mgpu_dataset_t *ds, const char *x_path, const char *y_path, int want_labels,
                       int classes, mgpu_err_t *err);

/* Every check of mgpu_data_load_npy that needs no features: both files' headers and sizes,
 * the shapes against each other and (want_labels) every label, so a cfg can be refused before
 * a run starts. *n: the samples of x_path; *bad_y: 1 when the fault is in y_path, else 0. */
int mgpu_data_check_npy(const char *x_path, const char *y_path, int want_labels, int classes,
                        size_t *n, int *bad_y, mgpu_err_t *err);

/* Where path is a folder (as Hugging Face's from_pretrained takes one; a trailing / names
 * one, there or not): the file name in it,
 * path/name, into out (cap bytes), and 1; else path itself, and 0. Whether path/name exists
 * is the caller's to see. -ENAMETOOLONG (err says so, naming what) when out is too small. */
int mgpu_data_in_folder(const char *path, const char *name, const char *what, char *out, size_t cap,
                        mgpu_err_t *err);

/* Opens path for reading (what names it in messages, e.g. "the cfg") if it is a regular file:
 * a directory, FIFO, device or socket is MGPU_E_CONFIG "PATH: is a FIFO, not a regular file"
 * (a link names its target), refused before open() so that a FIFO cannot block the reader;
 * other failures are the negated errno. *fd (close-on-exec) is the caller's to close; *size
 * is the file's size when opened. */
int mgpu_data_open_regular(const char *path, const char *what, int *fd, size_t *size,
                           mgpu_err_t *err);

/* A NumPy array read as float32 or int32 (after conversion); shape as stored. */
typedef struct mgpu_npy {
    char descr[16]; /* as in the header, e.g. "<f4" */
    int ndim;
    size_t shape[8];
    size_t count; /* product of shape */
    float *f32;   /* set by mgpu_npy_read_f32 */
    int32_t *i32; /* set by mgpu_npy_read_i32 */
} mgpu_npy_t;

int mgpu_npy_read_f32(const char *path, mgpu_npy_t *out, mgpu_err_t *err);
/* Integer dtypes only; values outside int32 are MGPU_E_CONFIG. A file whose header promises
 * more data than it holds is MGPU_E_CONFIG before anything is allocated for the data. */
int mgpu_npy_read_i32(const char *path, mgpu_npy_t *out, mgpu_err_t *err);
void mgpu_npy_free(mgpu_npy_t *a);

/* Writes a float32 array of shape (rows, cols) (cols 0: shape (rows,)) as .npy v1.0. */
int mgpu_npy_write_f32(const char *path, const float *data, size_t rows, size_t cols,
                       mgpu_err_t *err);

/* Moves round(n * eval_fraction) samples, chosen by a permutation drawn from seed, into
 * eval and the rest into train (both new datasets; all is unchanged). eval_fraction in
 * [0, 1); with 0 eval is empty (n == 0, no arrays). */
int mgpu_data_split(const mgpu_dataset_t *all, double eval_fraction, uint64_t seed,
                    mgpu_dataset_t *train, mgpu_dataset_t *eval, mgpu_err_t *err);

/* Copies the rows idx[0..count) into x [count, features], labels [count] and targets
 * [count, target_dim] (each may be NULL to skip it): a batch in host memory. */
void mgpu_data_gather(const mgpu_dataset_t *ds, const size_t *idx, size_t count, float *x,
                      int32_t *labels, float *targets);

void mgpu_data_free(mgpu_dataset_t *ds);

#endif
