/* data.c - data set generators, the .npy reader/writer, the held-out split, batch gathering.
 *
 * A malformed or unsupported .npy file, and one that is no regular file, is MGPU_E_CONFIG (the
 * user's input, like the cfg that names it: the worker exits 2); a file that cannot be read is
 * the negated errno. */
#include "data.h"

#include <errno.h>    /* errno, EINVAL, ENOMEM */
#include <fcntl.h>    /* open, O_NONBLOCK */
#include <limits.h>   /* INT32_MAX */
#include <math.h>     /* floor */
#include <stdio.h>    /* fopen */
#include <stdlib.h>   /* malloc, strtoull, realpath */
#include <string.h>   /* memcpy, strstr */
#include <sys/stat.h> /* stat, S_ISREG */
#include <unistd.h>   /* pread, close */

#include "rng.h" /* mgpu_rng_* */

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the .npy reader assumes a little-endian host"
#endif

/* Streams of mgpu_rng_seed2 for one data seed: the samples and the split draw from their own,
 * so changing eval_fraction never changes the samples. */
#define RNG_STREAM_DATA 0
#define RNG_STREAM_SPLIT 1

void mgpu_data_free(mgpu_dataset_t *ds)
{
    if (ds == NULL)
        return;
    free(ds->x);
    free(ds->labels);
    free(ds->targets);
    memset(ds, 0, sizeof *ds);
}

static int alloc_dataset(mgpu_dataset_t *ds, size_t n, int features, int classes, int target_dim,
                         mgpu_err_t *err)
{
    memset(ds, 0, sizeof *ds);
    ds->n = n;
    ds->features = features;
    ds->classes = classes;
    ds->target_dim = target_dim;
    /* At least one element each, so that an empty split half still has valid pointers. */
    size_t nx = n * (size_t)features, nt = n * (size_t)target_dim;
    ds->x = malloc(sizeof(float) * (nx > 0 ? nx : 1));
    ds->labels = classes > 0 ? malloc(sizeof(int32_t) * (n > 0 ? n : 1)) : NULL;
    ds->targets = target_dim > 0 ? malloc(sizeof(float) * (nt > 0 ? nt : 1)) : NULL;
    if (ds->x == NULL || (classes > 0 && ds->labels == NULL) ||
        (target_dim > 0 && ds->targets == NULL)) {
        mgpu_data_free(ds);
        return mgpu_err_set(err, -ENOMEM, "data: cannot allocate %zu samples of %d features", n,
                            features);
    }
    return 0;
}

int mgpu_data_random(mgpu_dataset_t *ds, size_t n, int features, int outputs, uint64_t seed,
                     mgpu_err_t *err)
{
    mgpu_rng_t rng;
    int rc;

    if (n < 1 || features < 1 || outputs < 1)
        return mgpu_err_set(err, -EINVAL,
                            "data: random with %zu samples, %d features, %d outputs, expected "
                            ">= 1 each",
                            n, features, outputs);
    if ((rc = alloc_dataset(ds, n, features, outputs, outputs, err)) < 0)
        return rc;
    mgpu_rng_seed2(&rng, seed, RNG_STREAM_DATA);
    for (size_t i = 0; i < n * (size_t)features; i++)
        ds->x[i] = (float)mgpu_rng_normal(&rng); /* torch.randn(length, size) */
    for (size_t i = 0; i < n * (size_t)outputs; i++)
        ds->targets[i] = (float)mgpu_rng_normal(&rng);
    for (size_t i = 0; i < n; i++)
        ds->labels[i] = (int32_t)mgpu_rng_below(&rng, (uint64_t)outputs);
    return 0;
}

int mgpu_data_synthetic(mgpu_dataset_t *ds, size_t n, int features, int classes,
                        int clusters_per_class, double class_sep, double std, uint64_t seed,
                        mgpu_err_t *err)
{
    mgpu_rng_t rng;
    float *centers;
    int rc, n_centers;

    if (n < 1 || features < 1 || classes < 2 || clusters_per_class < 1)
        return mgpu_err_set(err, -EINVAL,
                            "data: synthetic with %zu samples, %d features, %d classes, %d "
                            "clusters per class, expected >= 1, >= 1, >= 2, >= 1",
                            n, features, classes, clusters_per_class);
    if (!(class_sep > 0.0) || !(std >= 0.0))
        return mgpu_err_set(err, -EINVAL,
                            "data: synthetic with class_sep %g and std %g, expected > 0 and >= 0",
                            class_sep, std);
    n_centers = classes * clusters_per_class;
    centers = malloc(sizeof(float) * (size_t)n_centers * features);
    if (centers == NULL)
        return mgpu_err_set(err, -ENOMEM, "data: cannot allocate %d cluster centers", n_centers);
    if ((rc = alloc_dataset(ds, n, features, classes, 0, err)) < 0) {
        free(centers);
        return rc;
    }
    mgpu_rng_seed2(&rng, seed, RNG_STREAM_DATA);
    for (size_t i = 0; i < (size_t)n_centers * features; i++)
        centers[i] = (float)(class_sep * mgpu_rng_normal(&rng));
    for (size_t i = 0; i < n; i++) {
        int c = (int)mgpu_rng_below(&rng, (uint64_t)classes);
        int q = (int)mgpu_rng_below(&rng, (uint64_t)clusters_per_class);
        const float *ctr = centers + (size_t)(c * clusters_per_class + q) * features;
        ds->labels[i] = c;
        for (int f = 0; f < features; f++)
            ds->x[i * features + f] = ctr[f] + (float)(std * mgpu_rng_normal(&rng));
    }
    free(centers);
    return 0;
}

/* --- files ----------------------------------------------------------------------------------- */

/* What a file that is not a regular one is, for the message. */
static const char *file_kind(mode_t mode)
{
    if (S_ISDIR(mode))
        return "a directory";
    if (S_ISFIFO(mode))
        return "a FIFO";
    if (S_ISCHR(mode))
        return "a character device";
    if (S_ISBLK(mode))
        return "a block device";
    if (S_ISSOCK(mode))
        return "a socket";
    return "a special file";
}

static int not_regular(const char *path, mode_t mode, mgpu_err_t *err)
{
    /* Name the target of a link: "x.cfg -> /dev/zero" says why x.cfg is a device. */
    struct stat lst;
    char *target = NULL;
    if (lstat(path, &lst) == 0 && S_ISLNK(lst.st_mode))
        target = realpath(path, NULL);
    int rc = mgpu_err_set(err, MGPU_E_CONFIG, "%s%s%s: is %s, not a regular file", path,
                          target ? " -> " : "", target ? target : "", file_kind(mode));
    free(target);
    return rc;
}

int mgpu_data_in_folder(const char *path, const char *name, const char *what, char *out, size_t cap,
                        mgpu_err_t *err)
{
    struct stat st;
    const size_t len = strlen(path);
    const char *sep = len > 0 && path[len - 1] == '/' ? "" : "/";
    /* a trailing / names a folder, there or not */
    const int folder =
        (len > 0 && path[len - 1] == '/') || (stat(path, &st) == 0 && S_ISDIR(st.st_mode));
    int n = folder ? snprintf(out, cap, "%s%s%s", path, sep, name) : snprintf(out, cap, "%s", path);
    if (n < 0 || (size_t)n >= cap)
        return mgpu_err_set(err, -ENAMETOOLONG, "%s: path too long: %s", what, path);
    return folder;
}

int mgpu_data_open_regular(const char *path, const char *what, int *fd, size_t *size,
                           mgpu_err_t *err)
{
    struct stat st;
    int e;

    *fd = -1;
    *size = 0;
    /* Refused before open(): opening a FIFO for reading blocks until a writer comes, and a
     * device such as /dev/zero reads as an endless (or empty) file. */
    if (stat(path, &st) != 0) {
        e = errno;
        return mgpu_err_set(err, -e, "%s: cannot open %s: %s", path, what, strerror(e));
    }
    if (!S_ISREG(st.st_mode))
        return not_regular(path, st.st_mode, err);
    /* O_NONBLOCK and a second look at what was opened: a file replaced by a FIFO between
     * stat() and open() cannot block the reader either. */
    int f = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (f < 0) {
        e = errno;
        return mgpu_err_set(err, -e, "%s: cannot open %s: %s", path, what, strerror(e));
    }
    if (fstat(f, &st) != 0) {
        e = errno;
        close(f);
        return mgpu_err_set(err, -e, "%s: fstat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(f);
        return not_regular(path, st.st_mode, err);
    }
    *fd = f;
    *size = (size_t)st.st_size;
    return 0;
}

/* pread(2) until len bytes or the end of the file; the number read, or -errno. */
static ssize_t read_at(int fd, void *buf, size_t len, size_t off)
{
    size_t done = 0;
    while (done < len) {
        ssize_t n = pread(fd, (char *)buf + done, len - done, (off_t)(off + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        if (n == 0)
            break;
        done += (size_t)n;
    }
    return (ssize_t)done;
}

/* --- .npy ---------------------------------------------------------------------------------- */

/* Finds 'key': in the header dict and returns a pointer just past the colon and spaces. */
static const char *dict_value(const char *hdr, const char *key)
{
    char pat[32];
    const char *p;
    snprintf(pat, sizeof pat, "'%s'", key);
    p = strstr(hdr, pat);
    if (p == NULL)
        return NULL;
    p += strlen(pat);
    while (*p == ' ')
        p++;
    if (*p != ':')
        return NULL;
    p++;
    while (*p == ' ')
        p++;
    return p;
}

typedef struct npy_raw {
    unsigned char *file; /* the data bytes (NULL when only the header was read) */
    const unsigned char *data;
    size_t itemsize;
} npy_raw_t;

#define NPY_ACCEPTED "<f4, <f8, <i8, <i4, <i2, |u1, |i1"
/* numpy writes headers of a few hundred bytes (np.load refuses over 10000 by default). */
#define NPY_MAX_HEADER (1 << 20)

static int npy_itemsize(const char *descr)
{
    if (strcmp(descr, "<f4") == 0 || strcmp(descr, "<i4") == 0)
        return 4;
    if (strcmp(descr, "<f8") == 0 || strcmp(descr, "<i8") == 0)
        return 8;
    if (strcmp(descr, "<i2") == 0)
        return 2;
    if (strcmp(descr, "|u1") == 0 || strcmp(descr, "|i1") == 0)
        return 1;
    return 0;
}

/* Reads and checks the header of path (magic, version, dtype, order, shape) and that the file
 * holds every byte the shape implies; with want_data, reads those bytes into raw->file. The
 * sizes come from the file, never from the header alone, so a damaged shape is an error and
 * not an allocation of 2^63 bytes. */
static int npy_open(const char *path, mgpu_npy_t *a, npy_raw_t *raw, int want_data, mgpu_err_t *err)
{
    unsigned char pre[12];
    size_t len = 0, hlen, off, bytes;
    char *hdr = NULL;
    const char *v;
    ssize_t got;
    int rc, fd;

    memset(a, 0, sizeof *a);
    memset(raw, 0, sizeof *raw);
    if ((rc = mgpu_data_open_regular(path, "the data file", &fd, &len, err)) < 0)
        return rc;
    if ((got = read_at(fd, pre, len < sizeof pre ? len : sizeof pre, 0)) < 0) {
        rc = mgpu_err_set(err, (int)got, "%s: read: %s", path, strerror((int)-got));
        goto out;
    }
    if (got < 10 || memcmp(pre, "\x93NUMPY", 6) != 0) {
        rc = mgpu_err_set(err, MGPU_E_CONFIG,
                          "%s: not a NumPy .npy file (no \\x93NUMPY magic); save arrays with "
                          "numpy.save",
                          path);
        goto out;
    }
    if (pre[6] == 1) {
        hlen = (size_t)pre[8] | (size_t)pre[9] << 8;
        off = 10;
    } else if ((pre[6] == 2 || pre[6] == 3) && got >= 12) {
        hlen = (size_t)pre[8] | (size_t)pre[9] << 8 | (size_t)pre[10] << 16 | (size_t)pre[11] << 24;
        off = 12;
    } else {
        rc = mgpu_err_set(err, MGPU_E_CONFIG, "%s: .npy format version %d.%d, expected 1, 2 or 3",
                          path, pre[6], pre[7]);
        goto out;
    }
    if (hlen == 0 || hlen > NPY_MAX_HEADER) {
        rc = mgpu_err_set(err, MGPU_E_CONFIG, "%s: header of %zu bytes, expected 1 to %d", path,
                          hlen, NPY_MAX_HEADER);
        goto out;
    }
    if (off + hlen > len) {
        rc = mgpu_err_set(err, MGPU_E_CONFIG, "%s: header of %zu bytes runs past the end (%zu)",
                          path, hlen, len);
        goto out;
    }
    hdr = malloc(hlen + 1);
    if (hdr == NULL) {
        rc = mgpu_err_set(err, -ENOMEM, "%s: cannot allocate a %zu-byte header", path, hlen);
        goto out;
    }
    if ((got = read_at(fd, hdr, hlen, off)) != (ssize_t)hlen) {
        rc = mgpu_err_set(err, got < 0 ? (int)got : MGPU_E_CONFIG, "%s: read of the header: %s",
                          path, got < 0 ? strerror((int)-got) : "the file got shorter");
        goto out;
    }
    /* The header is text; terminate it (its last byte is a '\n'). */
    hdr[hlen - 1] = 0;
    hdr[hlen] = 0;
    off += hlen;

    v = dict_value(hdr, "descr");
    if (v == NULL || (*v != '\'' && *v != '"')) {
        rc = mgpu_err_set(err, MGPU_E_CONFIG, "%s: no 'descr' in the header {%.200s}", path, hdr);
        goto out;
    }
    {
        char q = *v++;
        size_t i = 0;
        while (*v && *v != q && i + 1 < sizeof a->descr)
            a->descr[i++] = *v++;
        a->descr[i] = 0;
    }
    raw->itemsize = (size_t)npy_itemsize(a->descr);
    if (raw->itemsize == 0) {
        rc = mgpu_err_set(err, MGPU_E_CONFIG,
                          "%s: dtype '%s' is not supported, expected one of " NPY_ACCEPTED
                          " (little-endian float32/float64/int64/int32/int16/uint8/int8); "
                          "convert with arr.astype(numpy.float32)",
                          path, a->descr);
        goto out;
    }
    v = dict_value(hdr, "fortran_order");
    if (v == NULL || (strncmp(v, "False", 5) != 0 && strncmp(v, "True", 4) != 0)) {
        rc = mgpu_err_set(err, MGPU_E_CONFIG, "%s: no 'fortran_order' in the header", path);
        goto out;
    }
    int fortran = strncmp(v, "True", 4) == 0;
    v = dict_value(hdr, "shape");
    if (v == NULL || *v != '(') {
        rc = mgpu_err_set(err, MGPU_E_CONFIG, "%s: no 'shape' in the header", path);
        goto out;
    }
    v++;
    a->count = 1;
    int overflow = 0;
    for (;;) {
        while (*v == ' ' || *v == ',')
            v++;
        if (*v == ')')
            break;
        char *end;
        errno = 0;
        unsigned long long d = strtoull(v, &end, 10);
        if (end == v || *v == '-' || errno != 0 || a->ndim == 8) {
            rc = mgpu_err_set(err, MGPU_E_CONFIG, "%s: cannot read the shape in {%.200s}", path,
                              hdr);
            goto out;
        }
        a->shape[a->ndim++] = (size_t)d;
        overflow |= __builtin_mul_overflow(a->count, (size_t)d, &a->count);
        v = end;
    }
    if (fortran) {
        int big_dims = 0;
        for (int i = 0; i < a->ndim; i++)
            big_dims += a->shape[i] > 1;
        if (big_dims > 1) {
            rc = mgpu_err_set(err, MGPU_E_CONFIG,
                              "%s: Fortran-ordered array, expected C order; save "
                              "numpy.ascontiguousarray(arr)",
                              path);
            goto out;
        }
    }
    overflow |= __builtin_mul_overflow(a->count, raw->itemsize, &bytes);
    if (overflow || len - off < bytes) {
        if (overflow)
            rc = mgpu_err_set(err, MGPU_E_CONFIG,
                              "%s: %zu bytes of data, but the shape in {%.200s} needs more than "
                              "2^64: damaged header",
                              path, len - off, hdr);
        else
            rc = mgpu_err_set(err, MGPU_E_CONFIG,
                              "%s: %zu bytes of data, expected %zu (%zu elements of %s): "
                              "truncated",
                              path, len - off, bytes, a->count, a->descr);
        goto out;
    }
    if (want_data) {
        raw->file = malloc(bytes ? bytes : 1);
        if (raw->file == NULL) {
            rc = mgpu_err_set(err, -ENOMEM, "%s: cannot allocate %zu bytes of data", path, bytes);
            goto out;
        }
        if ((got = read_at(fd, raw->file, bytes, off)) != (ssize_t)bytes) {
            rc = mgpu_err_set(err, got < 0 ? (int)got : MGPU_E_CONFIG, "%s: read of the data: %s",
                              path, got < 0 ? strerror((int)-got) : "the file got shorter");
            free(raw->file);
            raw->file = NULL;
            goto out;
        }
        raw->data = raw->file;
    }
    rc = 0;
out:
    free(hdr);
    close(fd);
    return rc;
}

static int npy_is_float(const char *descr)
{
    return descr[1] == 'f';
}

/* Element i of the raw array as a double (exact for every supported integer up to 2^53). */
static double npy_get(const npy_raw_t *raw, const char *descr, size_t i)
{
    const unsigned char *p = raw->data + i * raw->itemsize;
    switch (descr[1]) {
    case 'f':
        if (raw->itemsize == 4) {
            float f;
            memcpy(&f, p, 4);
            return f;
        } else {
            double d;
            memcpy(&d, p, 8);
            return d;
        }
    case 'u':
        return *p;
    default:
        switch (raw->itemsize) {
        case 1:
            return (int8_t)*p;
        case 2: {
            int16_t v;
            memcpy(&v, p, 2);
            return v;
        }
        case 4: {
            int32_t v;
            memcpy(&v, p, 4);
            return v;
        }
        default: {
            int64_t v;
            memcpy(&v, p, 8);
            return (double)v;
        }
        }
    }
}

int mgpu_npy_read_f32(const char *path, mgpu_npy_t *out, mgpu_err_t *err)
{
    npy_raw_t raw;
    int rc = npy_open(path, out, &raw, 1, err);
    if (rc < 0)
        return rc;
    out->f32 = malloc(sizeof(float) * (out->count ? out->count : 1));
    if (out->f32 == NULL) {
        free(raw.file);
        return mgpu_err_set(err, -ENOMEM, "%s: cannot allocate %zu floats", path, out->count);
    }
    if (strcmp(out->descr, "<f4") == 0)
        memcpy(out->f32, raw.data, sizeof(float) * out->count);
    else
        for (size_t i = 0; i < out->count; i++)
            out->f32[i] = (float)npy_get(&raw, out->descr, i);
    free(raw.file);
    return 0;
}

int mgpu_npy_read_i32(const char *path, mgpu_npy_t *out, mgpu_err_t *err)
{
    npy_raw_t raw;
    int rc = npy_open(path, out, &raw, 1, err);
    if (rc < 0)
        return rc;
    if (npy_is_float(out->descr)) {
        rc = mgpu_err_set(err, MGPU_E_CONFIG,
                          "%s: labels of dtype '%s', expected integers (<i8, <i4, <i2, |u1, "
                          "|i1); convert with arr.astype(numpy.int64)",
                          path, out->descr);
        free(raw.file);
        return rc;
    }
    out->i32 = malloc(sizeof(int32_t) * (out->count ? out->count : 1));
    if (out->i32 == NULL) {
        free(raw.file);
        return mgpu_err_set(err, -ENOMEM, "%s: cannot allocate %zu labels", path, out->count);
    }
    for (size_t i = 0; i < out->count; i++) {
        double v = npy_get(&raw, out->descr, i);
        if (v < INT32_MIN || v > INT32_MAX) {
            rc = mgpu_err_set(err, MGPU_E_CONFIG, "%s: element %zu is %.0f, outside int32", path, i,
                              v);
            free(raw.file);
            mgpu_npy_free(out);
            return rc;
        }
        out->i32[i] = (int32_t)v;
    }
    free(raw.file);
    return 0;
}

void mgpu_npy_free(mgpu_npy_t *a)
{
    if (a == NULL)
        return;
    free(a->f32);
    free(a->i32);
    a->f32 = NULL;
    a->i32 = NULL;
}

int mgpu_npy_write_f32(const char *path, const float *data, size_t rows, size_t cols,
                       mgpu_err_t *err)
{
    char hdr[128];
    int n;
    size_t count = cols ? rows * cols : rows;
    FILE *f;

    if (cols)
        n = snprintf(hdr, sizeof hdr,
                     "{'descr': '<f4', 'fortran_order': False, 'shape': (%zu, %zu), }", rows, cols);
    else
        n = snprintf(hdr, sizeof hdr, "{'descr': '<f4', 'fortran_order': False, 'shape': (%zu,), }",
                     rows);
    /* Pad with spaces and a final '\n' so that the data starts at a multiple of 64. */
    int total = (10 + n + 1 + 63) / 64 * 64;
    int hlen = total - 10;
    memset(hdr + n, ' ', (size_t)(hlen - 1 - n));
    hdr[hlen - 1] = '\n';
    unsigned char pre[10] = {0x93,
                             'N',
                             'U',
                             'M',
                             'P',
                             'Y',
                             1,
                             0,
                             (unsigned char)(hlen & 0xff),
                             (unsigned char)(hlen >> 8)};
    f = fopen(path, "wb");
    if (f == NULL)
        return mgpu_err_set(err, -errno, "data: fopen(%s): %s", path, strerror(errno));
    if (fwrite(pre, 1, 10, f) != 10 || fwrite(hdr, 1, (size_t)hlen, f) != (size_t)hlen ||
        fwrite(data, sizeof(float), count, f) != count) {
        int e = errno ? errno : EIO;
        fclose(f);
        return mgpu_err_set(err, -e, "data: fwrite(%s): %s", path, strerror(e));
    }
    if (fclose(f) != 0)
        return mgpu_err_set(err, -errno, "data: fclose(%s): %s", path, strerror(errno));
    return 0;
}

/* The features' shape (N, ...) as n samples of feat values. */
static int check_x_shape(const mgpu_npy_t *xa, const char *x_path, size_t *n, size_t *feat,
                         mgpu_err_t *err)
{
    if (xa->ndim < 1 || xa->shape[0] == 0)
        return mgpu_err_set(err, MGPU_E_CONFIG,
                            "%s: %d-dimensional array of %zu samples, "
                            "expected shape (N, features) with N >= 1",
                            x_path, xa->ndim, xa->ndim ? xa->shape[0] : 0);
    *n = xa->shape[0];
    *feat = 1;
    for (int i = 1; i < xa->ndim; i++)
        *feat *= xa->shape[i];
    if (*feat < 1 || *feat > INT32_MAX)
        return mgpu_err_set(err, MGPU_E_CONFIG, "%s: %zu features per sample, expected 1..%d",
                            x_path, *feat, INT32_MAX);
    return 0;
}

/* The labels' or targets' shape against the n samples of x_path; *ycols: values per sample. */
static int check_y_shape(const mgpu_npy_t *ya, const char *y_path, size_t n, const char *x_path,
                         int want_labels, size_t *ycols, mgpu_err_t *err)
{
    *ycols = ya->ndim >= 2 ? ya->count / (ya->shape[0] ? ya->shape[0] : 1) : 1;
    if (ya->ndim >= 1 && ya->ndim <= 2 && ya->shape[0] == n && (!want_labels || *ycols == 1))
        return 0;
    char shape[64] = "(";
    for (int i = 0; i < ya->ndim; i++)
        snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%zu", i ? ", " : "",
                 ya->shape[i]);
    strncat(shape, ")", sizeof shape - strlen(shape) - 1);
    return mgpu_err_set(err, MGPU_E_CONFIG, "%s: shape %s, expected %s with N = %zu as in %s",
                        y_path, shape, want_labels ? "(N) or (N, 1)" : "(N) or (N, targets)", n,
                        x_path);
}

/* Every label in [0, classes) (classes 0: any >= 0); *k: the number of classes. */
static int check_labels(const int32_t *lab, size_t n, int classes, const char *y_path, int *k,
                        mgpu_err_t *err)
{
    int32_t mx = -1;
    for (size_t i = 0; i < n; i++) {
        int32_t l = lab[i];
        if (l < 0 || (classes > 0 && l >= classes))
            return mgpu_err_set(err, MGPU_E_CONFIG, "%s: label %d at sample %zu, expected 0..%d%s",
                                y_path, (int)l, i, classes > 0 ? classes - 1 : INT32_MAX - 1,
                                classes > 0 ? " (classes in the cfg)" : "");
        mx = l > mx ? l : mx;
    }
    *k = classes > 0 ? classes : mx + 1;
    if (*k < 2)
        return mgpu_err_set(err, MGPU_E_CONFIG,
                            "%s: every label is %d, expected at least 2 classes", y_path, (int)mx);
    return 0;
}

int mgpu_data_check_npy(const char *x_path, const char *y_path, int want_labels, int classes,
                        size_t *n, int *bad_y, mgpu_err_t *err)
{
    mgpu_npy_t xa, ya;
    npy_raw_t raw;
    size_t feat, ycols;
    int rc, k;

    *n = 0;
    *bad_y = 0;
    if ((rc = npy_open(x_path, &xa, &raw, 0, err)) < 0 ||
        (rc = check_x_shape(&xa, x_path, n, &feat, err)) < 0)
        return rc;
    *bad_y = 1;
    /* Labels are read (one integer per sample) to check their values; targets, like the
     * features, only as far as the header and the file's size. */
    if (want_labels)
        rc = mgpu_npy_read_i32(y_path, &ya, err);
    else
        rc = npy_open(y_path, &ya, &raw, 0, err);
    if (rc < 0)
        return rc;
    if ((rc = check_y_shape(&ya, y_path, *n, x_path, want_labels, &ycols, err)) == 0 && want_labels)
        rc = check_labels(ya.i32, *n, classes, y_path, &k, err);
    mgpu_npy_free(&ya);
    if (rc == 0)
        *bad_y = 0;
    return rc;
}

int mgpu_data_load_npy(mgpu_dataset_t *ds, const char *x_path, const char *y_path, int want_labels,
                       int classes, mgpu_err_t *err)
{
    mgpu_npy_t xa, ya;
    size_t n, feat, ycols;
    int rc, k;

    memset(ds, 0, sizeof *ds);
    memset(&ya, 0, sizeof ya);
    if ((rc = mgpu_npy_read_f32(x_path, &xa, err)) < 0)
        return rc;
    if ((rc = check_x_shape(&xa, x_path, &n, &feat, err)) < 0)
        goto out;
    rc = want_labels ? mgpu_npy_read_i32(y_path, &ya, err) : mgpu_npy_read_f32(y_path, &ya, err);
    if (rc < 0)
        goto out;
    if ((rc = check_y_shape(&ya, y_path, n, x_path, want_labels, &ycols, err)) < 0)
        goto out;
    if (want_labels) {
        if ((rc = check_labels(ya.i32, n, classes, y_path, &k, err)) < 0)
            goto out;
        ds->classes = k;
        ds->labels = ya.i32;
        ya.i32 = NULL;
    } else {
        ds->target_dim = (int)ycols;
        ds->targets = ya.f32;
        ya.f32 = NULL;
    }
    ds->n = n;
    ds->features = (int)feat;
    ds->x = xa.f32;
    xa.f32 = NULL;
    rc = 0;
out:
    mgpu_npy_free(&xa);
    mgpu_npy_free(&ya);
    return rc;
}

/* --- split and gather ---------------------------------------------------------------------- */

void mgpu_data_gather(const mgpu_dataset_t *ds, const size_t *idx, size_t count, float *x,
                      int32_t *labels, float *targets)
{
    for (size_t i = 0; i < count; i++) {
        size_t r = idx[i];
        if (x != NULL)
            memcpy(x + i * ds->features, ds->x + r * ds->features, sizeof(float) * ds->features);
        if (labels != NULL && ds->labels != NULL)
            labels[i] = ds->labels[r];
        if (targets != NULL && ds->targets != NULL)
            memcpy(targets + i * ds->target_dim, ds->targets + r * ds->target_dim,
                   sizeof(float) * ds->target_dim);
    }
}

int mgpu_data_split(const mgpu_dataset_t *all, double eval_fraction, uint64_t seed,
                    mgpu_dataset_t *train, mgpu_dataset_t *eval, mgpu_err_t *err)
{
    size_t n_eval, *perm;
    mgpu_rng_t rng;
    int rc;

    memset(train, 0, sizeof *train);
    memset(eval, 0, sizeof *eval);
    if (!(eval_fraction >= 0.0 && eval_fraction < 1.0))
        return mgpu_err_set(err, -EINVAL, "data: eval_fraction %g, expected in [0, 1)",
                            eval_fraction);
    n_eval = (size_t)floor((double)all->n * eval_fraction + 0.5);
    if (n_eval >= all->n)
        return mgpu_err_set(err, -EINVAL,
                            "data: eval_fraction %g of %zu samples leaves none to train on",
                            eval_fraction, all->n);
    perm = malloc(sizeof *perm * all->n);
    if (perm == NULL)
        return mgpu_err_set(err, -ENOMEM, "data: cannot allocate the split permutation");
    mgpu_rng_seed2(&rng, seed, RNG_STREAM_SPLIT);
    mgpu_rng_permutation(&rng, perm, all->n);
    /* Both halves keep the original order of their samples (sorted positions), so a split
     * is a subset, never a reshuffle: the sampler does the shuffling. */
    int *is_eval = calloc(all->n, sizeof *is_eval);
    if (is_eval == NULL) {
        free(perm);
        return mgpu_err_set(err, -ENOMEM, "data: cannot allocate the split mask");
    }
    for (size_t i = 0; i < n_eval; i++)
        is_eval[perm[i]] = 1;
    size_t *tr_idx = perm, *ev_idx = perm + (all->n - n_eval), ti = 0, ei = 0;
    for (size_t i = 0; i < all->n; i++) {
        if (is_eval[i])
            ev_idx[ei++] = i;
        else
            tr_idx[ti++] = i;
    }
    free(is_eval);
    rc = alloc_dataset(train, all->n - n_eval, all->features, all->labels ? all->classes : 0,
                       all->targets ? all->target_dim : 0, err);
    if (rc == 0 && n_eval > 0)
        rc = alloc_dataset(eval, n_eval, all->features, all->labels ? all->classes : 0,
                           all->targets ? all->target_dim : 0, err);
    if (rc < 0) {
        mgpu_data_free(train);
        free(perm);
        return rc;
    }
    eval->features = all->features;
    eval->classes = all->classes;
    eval->target_dim = all->target_dim;
    mgpu_data_gather(all, tr_idx, train->n, train->x, train->labels, train->targets);
    if (n_eval > 0)
        mgpu_data_gather(all, ev_idx, n_eval, eval->x, eval->labels, eval->targets);
    free(perm);
    return 0;
}
