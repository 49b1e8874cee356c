/* safetensors.c - the safetensors format's reader (a mapped file and its checked header) and
 * writer (a cJSON header padded to 8 bytes, then the tensors). */
#include "safetensors.h"

#include <cjson/cJSON.h> /* the header */
#include <errno.h>       /* ENOMEM */
#include <stdlib.h>      /* calloc, free, qsort */
#include <string.h>      /* strcmp, strdup, memcpy */
#include <sys/mman.h>    /* mmap, munmap */
#include <sys/uio.h>     /* struct iovec */
#include <unistd.h>      /* close */

#include "atomic_file.h" /* mgpu_atomic_file_write */
#include "data.h"        /* mgpu_data_open_regular */
#include "dtype.h"       /* mgpu_dtype_bf16_to_f32, mgpu_dtype_f16_to_f32 */

/* The reference implementation's limit: a larger header is refused before it is read. */
#define MAX_HEADER ((uint64_t)100 * 1000 * 1000)
/* Offsets and sizes pass through JSON numbers (doubles): exact below 2^53. */
#define MAX_EXACT 9007199254740992.0

static const char *const dtype_names[MGPU_ST_N_DTYPES] = {
    "BOOL", "U8",  "I8",  "F8_E5M2", "F8_E4M3", "I16", "U16", "F16",
    "BF16", "I32", "U32", "F32",     "F64",     "I64", "U64"};
static const size_t dtype_sizes[MGPU_ST_N_DTYPES] = {1, 1, 1, 1, 1, 2, 2, 2, 2, 4, 4, 4, 8, 8, 8};

const char *mgpu_st_dtype_name(mgpu_st_dtype_t d)
{
    return (unsigned)d < MGPU_ST_N_DTYPES ? dtype_names[d] : "?";
}

size_t mgpu_st_dtype_size(mgpu_st_dtype_t d)
{
    return (unsigned)d < MGPU_ST_N_DTYPES ? dtype_sizes[d] : 0;
}

size_t mgpu_st_numel(const mgpu_st_tensor_t *t)
{
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= (size_t)t->shape[i];
    return n;
}

void mgpu_st_close(mgpu_st_t *st)
{
    if (st == NULL)
        return;
    for (int i = 0; st->tensors != NULL && i < st->n; i++)
        free(st->tensors[i].name);
    for (int i = 0; st->meta != NULL && i < 2 * st->n_meta; i++)
        free(st->meta[i]);
    free(st->tensors);
    free(st->meta);
    if (st->map != NULL)
        munmap((void *)st->map, st->map_size);
    free(st->path);
    free(st);
}

/* A JSON number that is a whole number in [0, 2^53): 0 and *v, else -1. */
static int whole(const cJSON *j, double *v)
{
    if (!cJSON_IsNumber(j) || !(j->valuedouble >= 0) || j->valuedouble >= MAX_EXACT ||
        j->valuedouble != (double)(int64_t)j->valuedouble)
        return -1;
    *v = j->valuedouble;
    return 0;
}

/* One tensor's entry of the header into t. */
static int parse_tensor(const mgpu_st_t *st, const cJSON *e, mgpu_st_tensor_t *t, mgpu_err_t *err)
{
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    const char *name = e->string;
    double v, b, en, bytes;

    if (!cJSON_IsObject(e) || !cJSON_IsString(dt) || !cJSON_IsArray(shape) || !cJSON_IsArray(offs))
        return mgpu_err_set(err, MGPU_E_CONFIG,
                            "%s: tensor '%.200s': expected an object with a dtype (string), a "
                            "shape (array) and data_offsets (array)",
                            st->path, name);
    t->dtype = MGPU_ST_N_DTYPES;
    for (int d = 0; d < MGPU_ST_N_DTYPES; d++)
        if (strcmp(dt->valuestring, dtype_names[d]) == 0)
            t->dtype = (mgpu_st_dtype_t)d;
    if (t->dtype == MGPU_ST_N_DTYPES)
        return mgpu_err_set(err, MGPU_E_CONFIG,
                            "%s: tensor '%.200s': dtype '%.40s' is none of the format's (BOOL, "
                            "U8, I8, F8_E5M2, F8_E4M3, I16, U16, F16, BF16, I32, U32, F32, F64, "
                            "I64, U64)",
                            st->path, name, dt->valuestring);
    t->ndim = cJSON_GetArraySize(shape);
    if (t->ndim > MGPU_ST_MAX_DIMS)
        return mgpu_err_set(err, MGPU_E_CONFIG, "%s: tensor '%.200s': %d dimensions, at most %d",
                            st->path, name, t->ndim, MGPU_ST_MAX_DIMS);
    bytes = (double)dtype_sizes[t->dtype];
    for (int i = 0; i < t->ndim; i++) {
        if (whole(cJSON_GetArrayItem(shape, i), &v) < 0)
            return mgpu_err_set(err, MGPU_E_CONFIG,
                                "%s: tensor '%.200s': shape[%d] is not a whole number >= 0",
                                st->path, name, i);
        t->shape[i] = (int64_t)v;
        bytes *= v;
    }
    if (cJSON_GetArraySize(offs) != 2 || whole(cJSON_GetArrayItem(offs, 0), &b) < 0 ||
        whole(cJSON_GetArrayItem(offs, 1), &en) < 0 || en < b)
        return mgpu_err_set(err, MGPU_E_CONFIG,
                            "%s: tensor '%.200s': data_offsets must be [BEGIN, END], whole "
                            "numbers with BEGIN <= END",
                            st->path, name);
    if (en - b != bytes)
        return mgpu_err_set(err, MGPU_E_CONFIG,
                            "%s: tensor '%.200s': data_offsets [%.0f, %.0f] hold %.0f bytes, its "
                            "dtype %s and shape need %.0f",
                            st->path, name, b, en, en - b, dtype_names[t->dtype], bytes);
    if (en > (double)st->data_size)
        return mgpu_err_set(err, MGPU_E_CONFIG,
                            "%s: tensor '%.200s': data_offsets [%.0f, %.0f] end past the %zu bytes "
                            "of data (a truncated file?)",
                            st->path, name, b, en, st->data_size);
    t->begin = (size_t)b;
    t->end = (size_t)en;
    if ((t->name = strdup(name)) == NULL)
        return mgpu_err_set(err, -ENOMEM, "%s: strdup of a tensor's name failed", st->path);
    return 0;
}

static int by_offset(const void *a, const void *b)
{
    const mgpu_st_tensor_t *x = *(const mgpu_st_tensor_t *const *)a;
    const mgpu_st_tensor_t *y = *(const mgpu_st_tensor_t *const *)b;
    return x->begin != y->begin ? (x->begin < y->begin ? -1 : 1)
                                : (x->end < y->end ? -1 : x->end > y->end);
}

/* The tensors cover the data exactly: sorted by offset, each begins where the one before
 * ends, and the last ends at the data's end. */
static int check_cover(const mgpu_st_t *st, mgpu_err_t *err)
{
    const mgpu_st_tensor_t **s = malloc(sizeof *s * (size_t)(st->n ? st->n : 1));
    size_t at = 0;
    int rc = 0;
    if (s == NULL)
        return mgpu_err_set(err, -ENOMEM, "%s: malloc for %d tensors failed", st->path, st->n);
    for (int i = 0; i < st->n; i++)
        s[i] = &st->tensors[i];
    qsort(s, (size_t)st->n, sizeof *s, by_offset);
    for (int i = 0; i < st->n && rc == 0; i++) {
        if (s[i]->begin != at)
            rc = mgpu_err_set(err, MGPU_E_CONFIG,
                              "%s: tensor '%.200s' begins at byte %zu of the data, expected %zu "
                              "(the tensors must cover the data without holes or overlaps)",
                              st->path, s[i]->name, s[i]->begin, at);
        at = s[i]->end;
    }
    if (rc == 0 && at != st->data_size)
        rc = mgpu_err_set(err, MGPU_E_CONFIG,
                          "%s: the tensors end at byte %zu of the data, the file holds %zu "
                          "(the tensors must cover the data exactly)",
                          st->path, at, st->data_size);
    free(s);
    return rc;
}

static int parse_meta(mgpu_st_t *st, const cJSON *m, mgpu_err_t *err)
{
    const cJSON *e;
    if (!cJSON_IsObject(m))
        return mgpu_err_set(err, MGPU_E_CONFIG, "%s: __metadata__ is not an object", st->path);
    st->n_meta = cJSON_GetArraySize(m);
    if ((st->meta = calloc((size_t)2 * st->n_meta + 1, sizeof *st->meta)) == NULL)
        return mgpu_err_set(err, -ENOMEM, "%s: calloc for the metadata failed", st->path);
    int i = 0;
    cJSON_ArrayForEach(e, m)
    {
        if (!cJSON_IsString(e))
            return mgpu_err_set(err, MGPU_E_CONFIG,
                                "%s: __metadata__ '%.200s': expected a string value", st->path,
                                e->string);
        if ((st->meta[i++] = strdup(e->string)) == NULL ||
            (st->meta[i++] = strdup(e->valuestring)) == NULL)
            return mgpu_err_set(err, -ENOMEM, "%s: strdup of the metadata failed", st->path);
    }
    return 0;
}

/* The header (len bytes at h) into st's tensors and metadata. */
static int parse_header(mgpu_st_t *st, const char *h, size_t len, mgpu_err_t *err)
{
    const char *end = NULL;
    const cJSON *e;
    int rc = 0, i = 0;

    if (len == 0 || h[0] != '{')
        return mgpu_err_set(err, MGPU_E_CONFIG,
                            "%s: the header does not start with '{': not a safetensors file",
                            st->path);
    cJSON *root = cJSON_ParseWithLengthOpts(h, len, &end, 0);
    if (root == NULL || !cJSON_IsObject(root)) {
        size_t at = end != NULL && end >= h ? (size_t)(end - h) : 0;
        cJSON_Delete(root);
        return mgpu_err_set(err, MGPU_E_CONFIG,
                            "%s: the %zu-byte header is not a JSON object (error near byte %zu)",
                            st->path, len, 8 + at);
    }
    for (const char *p = end; p < h + len; p++)
        if (*p != ' ' && *p != '\0') {
            cJSON_Delete(root);
            return mgpu_err_set(err, MGPU_E_CONFIG,
                                "%s: bytes after the header's JSON object (at byte %zu) are "
                                "not padding spaces",
                                st->path, 8 + (size_t)(p - h));
        }
    int n = cJSON_GetArraySize(root);
    st->tensors = calloc((size_t)(n ? n : 1), sizeof *st->tensors);
    if (st->tensors == NULL) {
        cJSON_Delete(root);
        return mgpu_err_set(err, -ENOMEM, "%s: calloc for %d tensors failed", st->path, n);
    }
    cJSON_ArrayForEach(e, root)
    {
        if (strcmp(e->string, "__metadata__") == 0) {
            if (st->meta != NULL)
                rc = mgpu_err_set(err, MGPU_E_CONFIG, "%s: __metadata__ appears twice", st->path);
            else
                rc = parse_meta(st, e, err);
        } else if (mgpu_st_find(st, e->string) != NULL) {
            rc = mgpu_err_set(err, MGPU_E_CONFIG, "%s: tensor '%.200s' appears twice", st->path,
                              e->string);
        } else if ((rc = parse_tensor(st, e, &st->tensors[i], err)) == 0) {
            st->n = ++i;
        }
        if (rc < 0)
            break;
    }
    cJSON_Delete(root);
    return rc < 0 ? rc : check_cover(st, err);
}

int mgpu_st_open(const char *path, mgpu_st_t **out, mgpu_err_t *err)
{
    int fd = -1, rc;
    size_t size;
    uint64_t hlen = 0;

    *out = NULL;
    mgpu_st_t *st = calloc(1, sizeof *st);
    if (st == NULL || (st->path = strdup(path)) == NULL) {
        free(st);
        return mgpu_err_set(err, -ENOMEM, "%s: calloc failed", path);
    }
    if ((rc = mgpu_data_open_regular(path, "the safetensors file", &fd, &size, err)) < 0)
        goto fail;
    if (size < 8) {
        rc = mgpu_err_set(err, MGPU_E_CONFIG,
                          "%s: %zu bytes, fewer than the 8 of a safetensors header's length", path,
                          size);
        goto fail;
    }
    st->map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (st->map == MAP_FAILED) {
        st->map = NULL;
        rc = mgpu_err_set(err, -errno, "mmap(%s, %zu bytes): %s", path, size, strerror(errno));
        goto fail;
    }
    st->map_size = size;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | st->map[i];
    if (hlen > MAX_HEADER || hlen > size - 8) {
        rc = mgpu_err_set(err, MGPU_E_CONFIG,
                          "%s: header length %llu (the first 8 bytes), expected at most %llu and "
                          "at most the %zu bytes that follow: not a safetensors file, or a "
                          "truncated one",
                          path, (unsigned long long)hlen, (unsigned long long)MAX_HEADER, size - 8);
        goto fail;
    }
    st->data = st->map + 8 + hlen;
    st->data_size = size - 8 - (size_t)hlen;
    if ((rc = parse_header(st, (const char *)st->map + 8, (size_t)hlen, err)) < 0)
        goto fail;
    close(fd);
    *out = st;
    return 0;
fail:
    if (fd >= 0)
        close(fd);
    mgpu_st_close(st);
    return rc;
}

const mgpu_st_tensor_t *mgpu_st_find(const mgpu_st_t *st, const char *name)
{
    for (int i = 0; i < st->n; i++)
        if (strcmp(st->tensors[i].name, name) == 0)
            return &st->tensors[i];
    return NULL;
}

const char *mgpu_st_meta(const mgpu_st_t *st, const char *key)
{
    for (int i = 0; i < st->n_meta; i++)
        if (strcmp(st->meta[2 * i], key) == 0)
            return st->meta[2 * i + 1];
    return NULL;
}

int mgpu_st_read_f32(const mgpu_st_t *st, const mgpu_st_tensor_t *t, float *dst, mgpu_err_t *err)
{
    const uint8_t *p = st->data + t->begin;
    size_t n = mgpu_st_numel(t);
    /* Element by element through memcpy: the data need not be aligned in the map, and the
     * format is little-endian like every host mgpu runs on. */
    switch (t->dtype) {
    case MGPU_ST_F32:
        memcpy(dst, p, sizeof(float) * n);
        return 0;
    case MGPU_ST_BF16:
    case MGPU_ST_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] =
                t->dtype == MGPU_ST_BF16 ? mgpu_dtype_bf16_to_f32(h) : mgpu_dtype_f16_to_f32(h);
        }
        return 0;
    case MGPU_ST_F64:
        for (size_t i = 0; i < n; i++) {
            double d;
            memcpy(&d, p + 8 * i, 8);
            dst[i] = (float)d;
        }
        return 0;
    default:
        return mgpu_err_set(err, MGPU_E_CONFIG,
                            "%s: tensor '%.200s' has dtype %s, expected F32, BF16, F16 or F64",
                            st->path, t->name, mgpu_st_dtype_name(t->dtype));
    }
}

/* The header's JSON for the tensors and metadata, with the data offsets they will have. */
static char *header_json(const mgpu_st_out_t *t, int n, const char *const *meta, int n_meta,
                         size_t *data_bytes)
{
    cJSON *root = cJSON_CreateObject(), *e;
    size_t at = 0;
    int ok = root != NULL;

    if (ok && n_meta > 0) {
        cJSON *m = cJSON_AddObjectToObject(root, "__metadata__");
        for (int i = 0; m != NULL && i < n_meta; i++)
            ok &= cJSON_AddStringToObject(m, meta[2 * i], meta[2 * i + 1]) != NULL;
        ok &= m != NULL;
    }
    for (int i = 0; ok && i < n; i++) {
        size_t bytes = dtype_sizes[t[i].dtype];
        cJSON *shape = cJSON_CreateArray(), *offs = cJSON_CreateArray();
        for (int d = 0; shape != NULL && d < t[i].ndim; d++) {
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t[i].shape[d]));
            bytes *= (size_t)t[i].shape[d];
        }
        if (offs != NULL) {
            cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)at));
            cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(at + bytes)));
        }
        at += bytes;
        e = cJSON_AddObjectToObject(root, t[i].name);
        ok &= e != NULL && shape != NULL && offs != NULL &&
              cJSON_AddStringToObject(e, "dtype", dtype_names[t[i].dtype]) != NULL;
        if (ok) {
            cJSON_AddItemToObject(e, "shape", shape);
            cJSON_AddItemToObject(e, "data_offsets", offs);
        } else {
            cJSON_Delete(shape);
            cJSON_Delete(offs);
        }
    }
    char *s = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    *data_bytes = at;
    return s;
}

int mgpu_st_write(const char *path, const mgpu_st_out_t *t, int n, const char *const *meta,
                  int n_meta, int flags, mgpu_err_t *err)
{
    size_t data_bytes;
    for (int i = 0; i < n; i++)
        if ((unsigned)t[i].dtype >= MGPU_ST_N_DTYPES || t[i].ndim < 0 ||
            t[i].ndim > MGPU_ST_MAX_DIMS)
            return mgpu_err_set(err, -EINVAL, "%s: tensor '%.200s': dtype %d, %d dimensions", path,
                                t[i].name, (int)t[i].dtype, t[i].ndim);
    char *json = header_json(t, n, meta, n_meta, &data_bytes);
    if (json == NULL)
        return mgpu_err_set(err, -ENOMEM, "%s: building the header failed", path);
    size_t len = strlen(json), padded = (len + 7) / 8 * 8;
    struct iovec *iov = calloc((size_t)n + 1, sizeof *iov);
    uint8_t *head = malloc(8 + padded);
    int rc;
    if (iov == NULL || head == NULL) {
        rc = mgpu_err_set(err, -ENOMEM, "%s: malloc of the header failed", path);
        goto out;
    }
    for (int i = 0; i < 8; i++)
        head[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    memcpy(head + 8, json, len);
    memset(head + 8 + len, ' ', padded - len);
    iov[0] = (struct iovec){.iov_base = head, .iov_len = 8 + padded};
    for (int i = 0; i < n; i++) {
        size_t bytes = dtype_sizes[t[i].dtype];
        for (int d = 0; d < t[i].ndim; d++)
            bytes *= (size_t)t[i].shape[d];
        iov[i + 1] = (struct iovec){.iov_base = (void *)t[i].data, .iov_len = bytes};
    }
    rc = mgpu_atomic_file_write(path, iov, n + 1, flags, err);
out:
    free(iov);
    free(head);
    free(json);
    return rc;
}
