/* test_checkpoint.c - checkpoint round trip, atomic replacement (no temporary left, the old
 * file intact when a write fails), and detection of every kind of damage. */
#include "check.h"
#include "checkpoint.h"

#include <dirent.h>   /* opendir */
#include <errno.h>    /* ENOENT, EBADMSG */
#include <sys/stat.h> /* stat */

static char dir[64];

static const char *path_in(const char *name)
{
    static char p[4][256];
    static int next;
    char *s = p[next++ % 4];
    snprintf(s, sizeof p[0], "%s/%s", dir, name);
    return s;
}

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/mgpu_test_ckpt.XXXXXX");
    if (mkdtemp(dir) == NULL)
        exit(1);
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

static mgpu_ckpt_t sample(float *params, float *state)
{
    for (int i = 0; i < 100; i++)
        params[i] = (float)i * 0.5f - 3.0f;
    for (int i = 0; i < 200; i++)
        state[i] = (float)i * -0.25f;
    return (mgpu_ckpt_t){.model_hash = 0x1234abcd5678ef00ULL,
                         .epoch = 3,
                         .batch_in_epoch = 7,
                         .step = 52,
                         .optim_step = 52,
                         .optim_kind = 1,
                         .world_size = 4,
                         .batch_per_rank = 6,
                         .seed = 99,
                         .rng = {1, 2, 3, 0xffffffffffffffffULL},
                         .n_params = 100,
                         .n_state = 200,
                         .params = params,
                         .state = state};
}

static int files_in_dir(void)
{
    int n = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

static void test_roundtrip(void)
{
    setup();
    float params[100], state[200];
    mgpu_ckpt_t c = sample(params, state), r;
    mgpu_err_t err = {0};
    CHECK_INT(mgpu_ckpt_write(path_in("a.ckpt"), &c, &err), 0);
    CHECK_INT(files_in_dir(), 1); /* no temporary left behind */
    CHECK_INT(mgpu_ckpt_read(path_in("a.ckpt"), &r, &err), 0);
    CHECK(r.model_hash == c.model_hash && r.epoch == 3 && r.batch_in_epoch == 7 && r.step == 52 &&
          r.optim_step == 52 && r.optim_kind == 1 && r.world_size == 4 && r.batch_per_rank == 6 &&
          r.seed == 99);
    CHECK(memcmp(r.rng, c.rng, sizeof r.rng) == 0);
    CHECK_INT(r.n_params, 100);
    CHECK_INT(r.n_state, 200);
    CHECK(memcmp(r.params, params, sizeof params) == 0);
    CHECK(memcmp(r.state, state, sizeof state) == 0);
    mgpu_ckpt_free(&r);
    /* Overwrite in place, then a plain SGD checkpoint without state. */
    c.step = 60;
    c.n_state = 0;
    c.state = NULL;
    CHECK_INT(mgpu_ckpt_write(path_in("a.ckpt"), &c, &err), 0);
    CHECK_INT(mgpu_ckpt_read(path_in("a.ckpt"), &r, &err), 0);
    CHECK_INT(r.step, 60);
    CHECK_INT(r.n_state, 0);
    CHECK(r.state == NULL);
    mgpu_ckpt_free(&r);
    mgpu_ckpt_free(&r); /* safe twice */
    struct stat st;
    CHECK(stat(path_in("a.ckpt"), &st) == 0 && st.st_size == 136 + 400);
    teardown();
}

static void flip_byte(const char *p, long off)
{
    FILE *f = fopen(p, "r+b");
    fseek(f, off, SEEK_SET);
    int ch = fgetc(f);
    fseek(f, off, SEEK_SET);
    fputc(ch ^ 0x01, f);
    fclose(f);
}

static void test_corruption_detected(void)
{
    setup();
    float params[100], state[200];
    mgpu_ckpt_t c = sample(params, state), r;
    mgpu_err_t err = {0};
    const char *p = path_in("c.ckpt");
    long offsets[] = {136 + 4 * 50, 136 + 400 + 4 * 199 + 3, 40 /* header: epoch */,
                      128 /* header: batch_per_rank */};
    for (int i = 0; i < 4; i++) {
        CHECK_INT(mgpu_ckpt_write(p, &c, &err), 0);
        flip_byte(p, offsets[i]);
        CHECK_INT(mgpu_ckpt_read(p, &r, &err), -EBADMSG);
        CHECK_CONTAINS(err.msg, "checksum mismatch");
        CHECK(r.params == NULL && r.state == NULL);
    }
    /* Truncated. */
    CHECK_INT(mgpu_ckpt_write(p, &c, &err), 0);
    CHECK(truncate(p, 136 + 400) == 0);
    CHECK_INT(mgpu_ckpt_read(p, &r, &err), -EBADMSG);
    CHECK_CONTAINS(err.msg, "536 bytes, expected 1336");
    CHECK(truncate(p, 130) == 0); /* version 2's header cut in its last 8 bytes */
    CHECK_INT(mgpu_ckpt_read(p, &r, &err), -EBADMSG);
    CHECK_CONTAINS(err.msg, "shorter than its header");
    CHECK(truncate(p, 20) == 0);
    CHECK_INT(mgpu_ckpt_read(p, &r, &err), -EBADMSG);
    CHECK_CONTAINS(err.msg, "shorter than its header");
    /* Not a checkpoint. */
    FILE *f = fopen(p, "wb");
    for (int i = 0; i < 200; i++)
        fputc('x', f);
    fclose(f);
    CHECK_INT(mgpu_ckpt_read(p, &r, &err), -EBADMSG);
    CHECK_CONTAINS(err.msg, "bad magic");
    /* Another version. */
    CHECK_INT(mgpu_ckpt_write(p, &c, &err), 0);
    flip_byte(p, 9);
    CHECK_INT(mgpu_ckpt_read(p, &r, &err), -EBADMSG);
    CHECK_CONTAINS(err.msg, "expected version 2 with 136 (or 1 with 128)");
    /* None at all: a fresh start, not damage. */
    CHECK_INT(mgpu_ckpt_read(path_in("none.ckpt"), &r, &err), -ENOENT);
    teardown();
}

/* A version 1 file (the 128-byte header, no batch_per_rank), as runs before version 2 wrote
 * them: read, its batch unknown (0). */
static void test_version1_still_read(void)
{
    setup();
    float params[100], state[200];
    mgpu_ckpt_t c = sample(params, state), r;
    mgpu_err_t err = {0};
    const char *p = path_in("v1.ckpt");
    CHECK_INT(mgpu_ckpt_write(p, &c, &err), 0);
    unsigned char buf[136 + 1200];
    FILE *f = fopen(p, "rb");
    CHECK(fread(buf, 1, sizeof buf, f) == sizeof buf);
    fclose(f);
    uint32_t v1 = 1, bytes = 128;
    uint64_t sum = 0;
    memcpy(buf + 8, &v1, 4);
    memcpy(buf + 12, &bytes, 4);
    memcpy(buf + 120, &sum, 8);
    memmove(buf + 128, buf + 136, 1200);
    sum = mgpu_fnv1a(mgpu_fnv1a(MGPU_FNV_OFFSET, buf, 128), buf + 128, 1200);
    memcpy(buf + 120, &sum, 8);
    f = fopen(p, "wb");
    CHECK(fwrite(buf, 1, 128 + 1200, f) == 128 + 1200);
    fclose(f);
    CHECK_INT(mgpu_ckpt_read(p, &r, &err), 0);
    CHECK(r.epoch == 3 && r.batch_in_epoch == 7 && r.world_size == 4 && r.batch_per_rank == 0);
    CHECK(memcmp(r.state, state, sizeof state) == 0);
    mgpu_ckpt_free(&r);
    teardown();
}

static void test_failed_write_keeps_old(void)
{
    setup();
    float params[100], state[200];
    mgpu_ckpt_t c = sample(params, state), r;
    mgpu_err_t err = {0};
    CHECK_INT(mgpu_ckpt_write(path_in("k.ckpt"), &c, &err), 0);
    /* A write that fails (state NULL) leaves the old checkpoint and no temporary. */
    mgpu_ckpt_t bad = c;
    bad.state = NULL;
    CHECK_INT(mgpu_ckpt_write(path_in("k.ckpt"), &bad, &err), -EINVAL);
    CHECK_CONTAINS(err.msg, "state is NULL");
    /* A directory as the target: refused before a temporary is written. */
    char sub[256];
    snprintf(sub, sizeof sub, "%s", path_in("sub"));
    CHECK(mkdir(sub, 0755) == 0);
    CHECK(mkdir(path_in("sub/x"), 0755) == 0);
    CHECK(mgpu_ckpt_write(sub, &c, &err) < 0);
    CHECK_CONTAINS(err.msg, "is a folder, expected a file");
    CHECK_INT(files_in_dir(), 2); /* k.ckpt and sub: the temporary was removed */
    CHECK_INT(mgpu_ckpt_read(path_in("k.ckpt"), &r, &err), 0);
    CHECK_INT(r.step, 52);
    mgpu_ckpt_free(&r);
    /* No such directory. */
    CHECK_INT(mgpu_ckpt_write(path_in("nodir/k.ckpt"), &c, &err), -ENOENT);
    CHECK_CONTAINS(err.msg, "nodir/k.ckpt.tmp.");
    teardown();
}

static void test_fnv(void)
{
    /* FNV-1a 64 test vectors: "" and "a". */
    CHECK(mgpu_fnv1a(MGPU_FNV_OFFSET, "", 0) == 0xcbf29ce484222325ULL);
    CHECK(mgpu_fnv1a(MGPU_FNV_OFFSET, "a", 1) == 0xaf63dc4c8601ec8cULL);
    CHECK(mgpu_fnv1a(MGPU_FNV_OFFSET, "foobar", 6) == 0x85944171f73967e8ULL);
}

int main(void)
{
    RUN(test_roundtrip);
    RUN(test_corruption_detected);
    RUN(test_version1_still_read);
    RUN(test_failed_write_keeps_old);
    RUN(test_fnv);
    return check_done();
}
