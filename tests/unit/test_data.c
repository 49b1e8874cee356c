/* test_data.c - data sets: the generators' determinism and statistics, .npy files written
 * byte by byte here (every supported dtype, shapes, and each way a file can be wrong), files
 * written by numpy.save itself when /usr/bin/python3 has numpy, and the held-out split. */
#include "check.h"
#include "tmpdir.h" /* make_tmpdir, tmp, remove_tmpdir */
#include "data.h"

#include <errno.h> /* ENOENT */
#include <math.h>  /* fabs */

#include <fcntl.h>        /* fcntl, FD_CLOEXEC */
#include <sys/resource.h> /* setrlimit */
#include <sys/stat.h>     /* mkfifo */

/* Writes a .npy v1.0 file with this header dict and raw payload. */
static void write_npy(const char *path, const char *dict, const void *data, size_t bytes)
{
    char hdr[256];
    int n = snprintf(hdr, sizeof hdr, "%s", dict);
    int hlen = (10 + n + 1 + 63) / 64 * 64 - 10;
    memset(hdr + n, ' ', (size_t)(hlen - n - 1));
    hdr[hlen - 1] = '\n';
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)hlen, 0};
    FILE *f = fopen(path, "wb");
    fwrite(pre, 1, 10, f);
    fwrite(hdr, 1, (size_t)hlen, f);
    fwrite(data, 1, bytes, f);
    fclose(f);
}

static void test_random_dataset(void)
{
    mgpu_dataset_t a, b;
    CHECK_INT(mgpu_data_random(&a, 90, 5, 2, 0, NULL), 0);
    CHECK_INT(mgpu_data_random(&b, 90, 5, 2, 0, NULL), 0);
    CHECK_INT(a.n, 90);
    CHECK_INT(a.features, 5);
    CHECK(memcmp(a.x, b.x, sizeof(float) * 450) == 0);
    CHECK(memcmp(a.targets, b.targets, sizeof(float) * 180) == 0);
    double s = 0, s2 = 0;
    for (int i = 0; i < 450; i++)
        s += a.x[i], s2 += (double)a.x[i] * a.x[i];
    CHECK(fabs(s / 450) < 0.2);
    CHECK(fabs(s2 / 450 - 1.0) < 0.25);
    for (int i = 0; i < 90; i++)
        CHECK(a.labels[i] == 0 || a.labels[i] == 1);
    mgpu_data_free(&b);
    CHECK_INT(mgpu_data_random(&b, 90, 5, 2, 1, NULL), 0);
    CHECK(memcmp(a.x, b.x, sizeof(float) * 450) != 0);
    mgpu_data_free(&a);
    mgpu_data_free(&b);
    mgpu_data_free(&b); /* safe twice */
    mgpu_err_t err = {0};
    CHECK_INT(mgpu_data_random(&a, 0, 5, 2, 0, &err), -EINVAL);
    CHECK_CONTAINS(err.msg, "0 samples");
}

static void test_synthetic_dataset(void)
{
    mgpu_dataset_t a, b;
    int count[4] = {0};
    CHECK_INT(mgpu_data_synthetic(&a, 2000, 10, 4, 2, 1.0, 1.0, 5, NULL), 0);
    CHECK_INT(mgpu_data_synthetic(&b, 2000, 10, 4, 2, 1.0, 1.0, 5, NULL), 0);
    CHECK(memcmp(a.x, b.x, sizeof(float) * 20000) == 0);
    CHECK(memcmp(a.labels, b.labels, sizeof(int32_t) * 2000) == 0);
    CHECK_INT(a.classes, 4);
    CHECK(a.targets == NULL);
    for (int i = 0; i < 2000; i++) {
        CHECK(a.labels[i] >= 0 && a.labels[i] < 4);
        count[a.labels[i] & 3]++;
    }
    for (int c = 0; c < 4; c++)
        CHECK(count[c] > 400 && count[c] < 600); /* balanced classes */
    mgpu_data_free(&a);
    mgpu_data_free(&b);
    mgpu_err_t err = {0};
    CHECK_INT(mgpu_data_synthetic(&a, 10, 2, 1, 1, 1.0, 1.0, 0, &err), -EINVAL);
    CHECK_CONTAINS(err.msg, "1 classes");
}

static void test_npy_roundtrip_f32(void)
{
    make_tmpdir("data");
    float x[6] = {1.5f, -2, 3, 4.25f, 5, -6};
    mgpu_npy_t a;
    CHECK_INT(mgpu_npy_write_f32(tmp("x.npy"), x, 3, 2, NULL), 0);
    CHECK_INT(mgpu_npy_read_f32(tmp("x.npy"), &a, NULL), 0);
    CHECK_STR(a.descr, "<f4");
    CHECK_INT(a.ndim, 2);
    CHECK_INT(a.shape[0], 3);
    CHECK_INT(a.shape[1], 2);
    CHECK(memcmp(a.f32, x, sizeof x) == 0);
    mgpu_npy_free(&a);
    CHECK_INT(mgpu_npy_write_f32(tmp("y.npy"), x, 6, 0, NULL), 0);
    CHECK_INT(mgpu_npy_read_f32(tmp("y.npy"), &a, NULL), 0);
    CHECK_INT(a.ndim, 1);
    CHECK_INT(a.shape[0], 6);
    mgpu_npy_free(&a);
    remove_tmpdir();
}

static void test_npy_dtypes(void)
{
    make_tmpdir("data");
    mgpu_npy_t a;
    double f8[3] = {0.5, -1.25, 1e10};
    write_npy(tmp("f8.npy"), "{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }", f8,
              sizeof f8);
    CHECK_INT(mgpu_npy_read_f32(tmp("f8.npy"), &a, NULL), 0);
    CHECK(a.f32[0] == 0.5f && a.f32[1] == -1.25f && a.f32[2] == 1e10f);
    mgpu_npy_free(&a);

    int64_t i8[4] = {0, 9, 3, -1};
    write_npy(tmp("i8.npy"), "{'descr': '<i8', 'fortran_order': False, 'shape': (4,), }", i8,
              sizeof i8);
    CHECK_INT(mgpu_npy_read_i32(tmp("i8.npy"), &a, NULL), 0);
    CHECK(a.i32[0] == 0 && a.i32[1] == 9 && a.i32[2] == 3 && a.i32[3] == -1);
    mgpu_npy_free(&a);
    CHECK_INT(mgpu_npy_read_f32(tmp("i8.npy"), &a, NULL), 0); /* ints as features */
    CHECK(a.f32[1] == 9.0f && a.f32[3] == -1.0f);
    mgpu_npy_free(&a);

    int32_t i4[2] = {7, -8};
    write_npy(tmp("i4.npy"), "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }", i4,
              sizeof i4);
    CHECK_INT(mgpu_npy_read_i32(tmp("i4.npy"), &a, NULL), 0);
    CHECK(a.i32[0] == 7 && a.i32[1] == -8);
    mgpu_npy_free(&a);

    /* uint8 images (N, 2, 2) flatten to 4 features; numpy.save's shape has no trailing comma
     * for more than one dimension. */
    unsigned char u1[8] = {0, 255, 16, 1, 2, 3, 4, 5};
    write_npy(tmp("u1.npy"), "{'descr': '|u1', 'fortran_order': False, 'shape': (2, 2, 2)}", u1,
              sizeof u1);
    int64_t lab[2] = {1, 0};
    write_npy(tmp("lab.npy"), "{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }", lab,
              sizeof lab);
    mgpu_dataset_t ds;
    mgpu_err_t err = {0};
    CHECK_INT(mgpu_data_load_npy(&ds, tmp("u1.npy"), tmp("lab.npy"), 1, 0, &err), 0);
    CHECK_INT(ds.n, 2);
    CHECK_INT(ds.features, 4);
    CHECK_INT(ds.classes, 2); /* inferred: max label + 1 */
    CHECK(ds.x[1] == 255.0f && ds.x[4] == 2.0f);
    CHECK(ds.labels[0] == 1 && ds.labels[1] == 0);
    mgpu_data_free(&ds);
    /* Regression targets from the same file as floats, shape (N,) -> 1 target. */
    CHECK_INT(mgpu_data_load_npy(&ds, tmp("u1.npy"), tmp("lab.npy"), 0, 0, &err), 0);
    CHECK_INT(ds.target_dim, 1);
    CHECK(ds.targets[0] == 1.0f && ds.labels == NULL);
    mgpu_data_free(&ds);
    remove_tmpdir();
}

static void test_npy_errors(void)
{
    make_tmpdir("data");
    mgpu_npy_t a;
    mgpu_dataset_t ds;
    mgpu_err_t err = {0};
    float f4[4] = {1, 2, 3, 4};

    CHECK_INT(mgpu_npy_read_f32(tmp("missing.npy"), &a, &err), -ENOENT);
    CHECK_CONTAINS(err.msg, "missing.npy");
    CHECK_CONTAINS(err.msg, "No such file");

    write_npy(tmp("be.npy"), "{'descr': '>f4', 'fortran_order': False, 'shape': (4,), }", f4,
              sizeof f4);
    CHECK_INT(mgpu_npy_read_f32(tmp("be.npy"), &a, &err), MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, "dtype '>f4' is not supported, expected one of <f4");

    write_npy(tmp("c8.npy"), "{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }", f4,
              sizeof f4);
    CHECK_INT(mgpu_npy_read_f32(tmp("c8.npy"), &a, &err), MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, "'<c8'");

    write_npy(tmp("fo.npy"), "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", f4,
              sizeof f4);
    CHECK_INT(mgpu_npy_read_f32(tmp("fo.npy"), &a, &err), MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, "Fortran-ordered");

    write_npy(tmp("short.npy"), "{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }", f4,
              sizeof f4);
    CHECK_INT(mgpu_npy_read_f32(tmp("short.npy"), &a, &err), MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, "16 bytes of data, expected 20");

    FILE *f = fopen(tmp("text.npy"), "w");
    fputs("1,2,3\n4,5,6\n", f);
    fclose(f);
    CHECK_INT(mgpu_npy_read_f32(tmp("text.npy"), &a, &err), MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, "not a NumPy .npy file");

    /* Float labels, labels out of range, label count != sample count. */
    CHECK_INT(mgpu_npy_write_f32(tmp("x.npy"), f4, 2, 2, NULL), 0);
    CHECK_INT(mgpu_npy_write_f32(tmp("yf.npy"), f4, 2, 0, NULL), 0);
    CHECK_INT(mgpu_data_load_npy(&ds, tmp("x.npy"), tmp("yf.npy"), 1, 0, &err), MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, "labels of dtype '<f4', expected integers");
    int64_t lab[2] = {0, 3};
    write_npy(tmp("lab.npy"), "{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }", lab,
              sizeof lab);
    CHECK_INT(mgpu_data_load_npy(&ds, tmp("x.npy"), tmp("lab.npy"), 1, 3, &err), MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, "label 3 at sample 1, expected 0..2");
    int64_t lab3[3] = {0, 1, 1};
    write_npy(tmp("lab3.npy"), "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }", lab3,
              sizeof lab3);
    CHECK_INT(mgpu_data_load_npy(&ds, tmp("x.npy"), tmp("lab3.npy"), 1, 0, &err), MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, "shape (3), expected (N) or (N, 1) with N = 2");
    int64_t one[2] = {0, 0};
    write_npy(tmp("one.npy"), "{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }", one,
              sizeof one);
    CHECK_INT(mgpu_data_load_npy(&ds, tmp("x.npy"), tmp("one.npy"), 1, 0, &err), MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, "at least 2 classes");
    CHECK(ds.x == NULL); /* nothing left half-loaded */
    remove_tmpdir();
}

/* Files from numpy.save itself (any header padding and version numpy picks), when present. */
static void test_npy_from_numpy(void)
{
    make_tmpdir("data");
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 -c \"import numpy as np; "
             "np.save('%s/x.npy', np.arange(24, dtype=np.float64).reshape(6, 2, 2)); "
             "np.save('%s/y.npy', np.array([0, 2, 1, 2, 0, 1], dtype=np.int64)); "
             "np.save('%s/t.npy', np.arange(12, dtype=np.float32).reshape(6, 2)); "
             "np.save('%s/f.npy', np.asfortranarray(np.ones((3, 2), dtype=np.float32)))\" "
             "2>/dev/null",
             tmpdir, tmpdir, tmpdir, tmpdir);
    if (system(cmd) != 0) {
        remove_tmpdir();
        SKIP("no /usr/bin/python3 with numpy here: numpy.save files not checked");
    }
    mgpu_dataset_t ds;
    mgpu_err_t err = {0};
    CHECK_INT(mgpu_data_load_npy(&ds, tmp("x.npy"), tmp("y.npy"), 1, 3, &err), 0);
    CHECK_INT(ds.n, 6);
    CHECK_INT(ds.features, 4);
    CHECK(ds.x[23] == 23.0f && ds.x[5] == 5.0f);
    CHECK(ds.labels[1] == 2 && ds.labels[5] == 1);
    mgpu_data_free(&ds);
    CHECK_INT(mgpu_data_load_npy(&ds, tmp("x.npy"), tmp("t.npy"), 0, 0, &err), 0);
    CHECK_INT(ds.target_dim, 2);
    CHECK(ds.targets[11] == 11.0f);
    mgpu_data_free(&ds);
    mgpu_npy_t a;
    CHECK_INT(mgpu_npy_read_f32(tmp("f.npy"), &a, &err), MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, "Fortran-ordered");
    remove_tmpdir();
}

static void test_split(void)
{
    mgpu_dataset_t all, tr, ev, tr2, ev2;
    mgpu_err_t err = {0};
    CHECK_INT(mgpu_data_random(&all, 100, 3, 2, 4, NULL), 0);
    /* Tag each sample with its index to follow it through the split. */
    for (int i = 0; i < 100; i++)
        all.x[i * 3] = (float)i;
    CHECK_INT(mgpu_data_split(&all, 0.25, 9, &tr, &ev, &err), 0);
    CHECK_INT(tr.n, 75);
    CHECK_INT(ev.n, 25);
    int seen[100] = {0};
    for (size_t i = 0; i < tr.n; i++) {
        int id = (int)tr.x[i * 3];
        seen[id]++;
        CHECK(tr.labels[i] == all.labels[id]);
        CHECK(tr.targets[i * 2 + 1] == all.targets[id * 2 + 1]);
        if (i > 0)
            CHECK(tr.x[i * 3] > tr.x[(i - 1) * 3]); /* original order kept */
    }
    for (size_t i = 0; i < ev.n; i++)
        seen[(int)ev.x[i * 3]]++;
    for (int i = 0; i < 100; i++)
        CHECK_INT(seen[i], 1); /* disjoint and complete */
    CHECK_INT(mgpu_data_split(&all, 0.25, 9, &tr2, &ev2, &err), 0);
    CHECK(memcmp(ev.x, ev2.x, sizeof(float) * 75) == 0); /* deterministic */
    mgpu_data_free(&tr2), mgpu_data_free(&ev2);
    CHECK_INT(mgpu_data_split(&all, 0.25, 10, &tr2, &ev2, &err), 0);
    CHECK(memcmp(ev.x, ev2.x, sizeof(float) * 75) != 0);
    mgpu_data_free(&tr2), mgpu_data_free(&ev2);
    CHECK_INT(mgpu_data_split(&all, 0.0, 9, &tr2, &ev2, &err), 0);
    CHECK_INT(tr2.n, 100);
    CHECK_INT(ev2.n, 0);
    mgpu_data_free(&tr2), mgpu_data_free(&ev2);
    CHECK_INT(mgpu_data_split(&all, 1.0, 9, &tr2, &ev2, &err), -EINVAL);
    CHECK_CONTAINS(err.msg, "eval_fraction 1");
    /* Gather a batch. */
    size_t idx[2] = {7, 3};
    float xb[6];
    int32_t lb[2];
    mgpu_data_gather(&all, idx, 2, xb, lb, NULL);
    CHECK(xb[0] == 7.0f && xb[3] == 3.0f && lb[1] == all.labels[3]);
    mgpu_data_free(&tr), mgpu_data_free(&ev), mgpu_data_free(&all);
}

/* Data files that are no regular files are refused by name before they are read (a FIFO
 * would block the reader); the kind and a link's target are named. */
static void test_npy_file_kinds(void)
{
    make_tmpdir("data");
    mgpu_npy_t a;
    mgpu_err_t err = {0};
    char want[600];
    int fd;
    size_t size;
    alarm(20); /* a blocked open fails the test instead of hanging it */
    CHECK(mkfifo(tmp("fifo.npy"), 0600) == 0);
    CHECK_INT(mgpu_npy_read_f32(tmp("fifo.npy"), &a, &err), MGPU_E_CONFIG);
    snprintf(want, sizeof want, "%s: is a FIFO, not a regular file", tmp("fifo.npy"));
    CHECK_CONTAINS(err.msg, want);
    CHECK_INT(mgpu_npy_read_f32(tmpdir, &a, &err), MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, "is a directory, not a regular file");
    CHECK(symlink("/dev/zero", tmp("zero.npy")) == 0);
    CHECK_INT(mgpu_npy_read_i32(tmp("zero.npy"), &a, &err), MGPU_E_CONFIG);
    snprintf(want, sizeof want, "%s -> /dev/zero: is a character device, not a regular file",
             tmp("zero.npy"));
    CHECK_CONTAINS(err.msg, want);
    CHECK_INT(mgpu_data_open_regular(tmp("missing"), "the thing", &fd, &size, &err), -ENOENT);
    CHECK_CONTAINS(err.msg, "missing: cannot open the thing: No such file");
    FILE *f = fopen(tmp("r"), "w");
    fputs("12345", f);
    fclose(f);
    CHECK_INT(mgpu_data_open_regular(tmp("r"), "r", &fd, &size, &err), 0);
    CHECK_INT(size, 5);
    CHECK(fd >= 0 && (fcntl(fd, F_GETFD) & FD_CLOEXEC));
    close(fd);
    remove_tmpdir();
}

/* A damaged header is an error that says so, never an allocation of what it claims. */
static void test_npy_damaged_headers(void)
{
    make_tmpdir("data");
    mgpu_npy_t a;
    mgpu_err_t err = {0};
    float f4[4] = {0};
    /* With the address space capped at 4 GiB an allocation sized by the header fails instead
     * of succeeding lazily (under ASan, which reserves terabytes of shadow at start, an
     * oversized malloc aborts by itself). */
#ifndef __SANITIZE_ADDRESS__
    struct rlimit rl = {1UL << 32, 1UL << 32};
    setrlimit(RLIMIT_AS, &rl);
#endif
    write_npy(tmp("huge.npy"),
              "{'descr': '<f4', 'fortran_order': False, 'shape': "
              "(4611686018427387904, 4), }",
              f4, sizeof f4);
    CHECK_INT(mgpu_npy_read_f32(tmp("huge.npy"), &a, &err), MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, "16 bytes of data, but the shape in {");
    CHECK_CONTAINS(err.msg, "needs more than 2^64: damaged header");
    write_npy(tmp("big.npy"),
              "{'descr': '<i8', 'fortran_order': False, 'shape': (1099511627776,), }", f4,
              sizeof f4);
    CHECK_INT(mgpu_npy_read_i32(tmp("big.npy"), &a, &err), MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, "16 bytes of data, expected 8796093022208");
    write_npy(tmp("neg.npy"), "{'descr': '<f4', 'fortran_order': False, 'shape': (-4,), }", f4,
              sizeof f4);
    CHECK_INT(mgpu_npy_read_f32(tmp("neg.npy"), &a, &err), MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, "cannot read the shape");
    FILE *f = fopen(tmp("h0.npy"), "wb");
    fwrite("\x93NUMPY\x01\x00\x00\x00", 1, 10, f);
    fclose(f);
    CHECK_INT(mgpu_npy_read_f32(tmp("h0.npy"), &a, &err), MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, "header of 0 bytes, expected 1 to 1048576");
    f = fopen(tmp("h2.npy"), "wb");
    fwrite("\x93NUMPY\x02\x00\xff\xff\xff\x7f{{{{", 1, 16, f);
    fclose(f);
    CHECK_INT(mgpu_npy_read_f32(tmp("h2.npy"), &a, &err), MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, "header of 2147483647 bytes, expected 1 to 1048576");
    /* A label outside int32 is the data's fault (exit 2), not a range error of the program. */
    int64_t big[2] = {0, (int64_t)1 << 40};
    write_npy(tmp("l.npy"), "{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }", big,
              sizeof big);
    CHECK_INT(mgpu_npy_read_i32(tmp("l.npy"), &a, &err), MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, "element 1 is 1099511627776, outside int32");
    remove_tmpdir();
}

/* mgpu_data_check_npy finds what mgpu_data_load_npy would refuse, and in which file. */
static void test_data_check_npy(void)
{
    make_tmpdir("data");
    mgpu_err_t err = {0};
    float f6[6] = {0};
    int64_t lab[3] = {0, 1, 2}, lab2[2] = {0, 1};
    size_t n;
    int bad_y;
    CHECK_INT(mgpu_npy_write_f32(tmp("x.npy"), f6, 3, 2, NULL), 0);
    write_npy(tmp("y.npy"), "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }", lab,
              sizeof lab);
    write_npy(tmp("y2.npy"), "{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }", lab2,
              sizeof lab2);
    CHECK_INT(mgpu_data_check_npy(tmp("x.npy"), tmp("y.npy"), 1, 0, &n, &bad_y, &err), 0);
    CHECK_INT(n, 3);
    CHECK_INT(bad_y, 0);
    CHECK_INT(mgpu_data_check_npy(tmp("x.npy"), tmp("y.npy"), 1, 2, &n, &bad_y, &err),
              MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, "label 2 at sample 2, expected 0..1 (classes in the cfg)");
    CHECK_INT(bad_y, 1);
    CHECK_INT(mgpu_data_check_npy(tmp("x.npy"), tmp("y2.npy"), 0, 0, &n, &bad_y, &err),
              MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, "shape (2), expected (N) or (N, targets) with N = 3");
    CHECK_INT(bad_y, 1);
    CHECK_INT(mgpu_data_check_npy(tmp("y.npy"), tmpdir, 0, 0, &n, &bad_y, &err), MGPU_E_CONFIG);
    CHECK_CONTAINS(err.msg, "is a directory");
    CHECK_INT(bad_y, 1);
    CHECK_INT(mgpu_data_check_npy(tmpdir, tmp("y.npy"), 0, 0, &n, &bad_y, &err), MGPU_E_CONFIG);
    CHECK_INT(bad_y, 0);
    /* Targets (mse) are checked by header and size only. */
    CHECK_INT(mgpu_data_check_npy(tmp("x.npy"), tmp("x.npy"), 0, 0, &n, &bad_y, &err), 0);
    remove_tmpdir();
}

int main(void)
{
    RUN(test_random_dataset);
    RUN(test_synthetic_dataset);
    RUN(test_npy_roundtrip_f32);
    RUN(test_npy_dtypes);
    RUN(test_npy_errors);
    RUN(test_npy_from_numpy);
    RUN(test_split);
    RUN(test_npy_file_kinds);
    RUN(test_npy_damaged_headers);
    RUN(test_data_check_npy);
    return check_done();
}
