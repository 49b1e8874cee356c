/* test_gpt_ops16.c - the CUDA bf16 path's conversion, LayerNorm and cross-entropy
 * (gpt_bf16.cu) and adamw_multi's bf16 copy of the weights (gpt_cuda.cu), against the host
 * references: transformer.h's functions and bf16 rounding (mgpu_gpt_to_bf16), and the CPU
 * backend's softmax cross-entropy (double).
 *
 * The reference runs on the inputs the GPU reads, bf16-rounded where the op reads bf16, so
 * that what is left is the op's own error. Shapes are awkward (rows not a multiple of a
 * block, widths not a multiple of 4, vocabularies not a multiple of 8), and every op runs on
 * aligned buffers (the vector paths) and on buffers one element off (the scalar paths).
 * Outputs an op overwrites are poisoned with NaN first; outputs it adds to start from random
 * values. Tolerances:
 *   - to_bf16, adamw_multi's p16: bit-exact (p16 == mgpu_gpt_to_bf16 of the GPU's fp32 p, and
 *     that p bit-identical to a run without p16);
 *   - a bf16 output y of an fp32 computation: |y - ref| <= 2^-8 |ref| (bf16's rounding, half an
 *     ulp of its 8 significant bits) + the fp32 computation's own error (LayerNorm's y: 2e-5 of
 *     the data's scale + 1e-5 relative; the softmax's gradient: 1e-5 relative + 1e-5 * scale
 *     absolute, the fast exponential's and the fp32 sum's error);
 *   - fp32 results: LayerNorm's mean and rstd 1e-5, its backward's dx 1e-4 of the data's scale
 *     (fp32 math on the same bf16 dy), dw, db and dsum (the column sums of dx16) 1e-5 * (1 +
 *     sqrt(rows)) (sums over rows in another order), the loss 1e-5.
 * Determinism: layernorm_backward and xent run twice give the same bits. Skips without CUDA or
 * a CUDA device. */
#include "kernels_check.h" /* env_t, buffers, close_to */
#include "transformer.h"   /* the reference, mgpu_gpt_to_bf16 */

#if defined(MGPU_HAVE_CUDA) && MGPU_HAVE_CUDA
#include "gpt_cuda.h" /* mgpu_gpt_cuda_ops */
#define GOPS (&mgpu_gpt_cuda_ops)
#else
#include "gpt_ops.h" /* mgpu_gpt_ops_t */
/* Never called: env_open skips every test first in a build without CUDA. */
static const mgpu_gpt_ops_t no_ops;
#define GOPS (&no_ops)
#endif

#include <string.h> /* memcmp, memcpy, strstr */

#define IMPL(e) ((e)->gpu->impl)
#define B16 (GOPS->bf16)

static const uint16_t kPoison16 = 0x7fc1; /* a NaN no op writes */

/* close_to with atol = tol * the largest |want| (the scale of the data) and rtol. */
static int close_scaled2(const char *what, const float *got, const float *want, size_t n,
                         double tol, double rtol)
{
    double mx = 0.0;
    for (size_t i = 0; i < n; i++)
        mx = fabs((double)want[i]) > mx ? fabs((double)want[i]) : mx;
    return close_to(what, got, want, n, tol * (mx > 0.0 ? mx : 1.0), rtol);
}

/* got's n rows, ld elements apart, hold want's (n rows of c, packed) bit for bit in their first
 * c elements and the poison d16 left in the rest (nothing written past c). */
static void same_rows(const char *what, const uint16_t *got, size_t ld, const uint16_t *want, int n,
                      int c)
{
    size_t bad = 0;
    for (int r = 0; r < n; r++)
        for (size_t j = 0; j < ld; j++)
            bad += got[(size_t)r * ld + j] != (j < (size_t)c ? want[(size_t)r * c + j] : kPoison16);
    if (bad) {
        printf("  %s, rows %zu apart: %zu elements differ from the packed rows' (or padding "
               "written)\n",
               what, ld, bad);
        check_failed++;
    }
}

static int same_bytes(const char *what, const void *a, const void *b, size_t bytes)
{
    if (memcmp(a, b, bytes) == 0)
        return 1;
    printf("  %s: differ\n", what);
    check_failed++;
    return 0;
}

/* bf16 bits of x[0..n) (host rounding), and their values as floats. */
static uint16_t *to16(const float *x, size_t n)
{
    uint16_t *h = malloc((n ? n : 1) * sizeof *h);
    for (size_t i = 0; i < n; i++)
        h[i] = mgpu_gpt_to_bf16(x[i]);
    return h;
}

static float *from16(const uint16_t *h, size_t n)
{
    float *x = hbuf(n);
    for (size_t i = 0; i < n; i++)
        x[i] = mgpu_gpt_from_bf16(h[i]);
    return x;
}

/* A GPU buffer of n + off bf16s (base in *base, returns base + off) holding h, or kPoison16
 * when h is NULL. off = 1 puts it 2 bytes off: the scalar paths. */
static uint16_t *d16(env_t *e, const uint16_t *h, size_t n, size_t off, void **base)
{
    void *p = NULL;
    if (mgpu_k_alloc(e->gpu, (n + off + 8) * sizeof(uint16_t), &p, &e->err) != 0) {
        printf("  mgpu_k_alloc(%zu bf16s): %s\n", n + off + 8, e->err.msg);
        exit(1);
    }
    *base = p;
    uint16_t *d = (uint16_t *)p + off;
    uint16_t *fill = NULL;
    if (h == NULL) {
        fill = malloc((n ? n : 1) * sizeof *fill);
        for (size_t i = 0; i < n; i++)
            fill[i] = kPoison16;
        h = fill;
    }
    OK(e, mgpu_k_copy_to_device(e->gpu, d, h, n * sizeof(uint16_t), &e->err));
    free(fill);
    return d;
}

/* d[0..n) = kPoison16 again. */
static void poison16(env_t *e, uint16_t *d, size_t n)
{
    uint16_t *h = malloc((n ? n : 1) * sizeof *h);
    for (size_t i = 0; i < n; i++)
        h[i] = kPoison16;
    OK(e, mgpu_k_copy_to_device(e->gpu, d, h, n * sizeof(uint16_t), &e->err));
    free(h);
}

static uint16_t *down16(env_t *e, const uint16_t *d, size_t n)
{
    uint16_t *h = malloc((n ? n : 1) * sizeof *h);
    OK(e, mgpu_k_copy_to_host(e->gpu, h, d, n * sizeof(uint16_t), &e->err));
    return h;
}

static int32_t *dints(env_t *e, const int32_t *h, size_t n, void **base)
{
    void *p = NULL;
    if (mgpu_k_alloc(e->gpu, (n + 1) * sizeof(int32_t), &p, &e->err) != 0) {
        printf("  mgpu_k_alloc(%zu ints): %s\n", n + 1, e->err.msg);
        exit(1);
    }
    OK(e, mgpu_k_copy_to_device(e->gpu, p, h, n * sizeof(int32_t), &e->err));
    *base = p;
    return (int32_t *)p;
}

static uint32_t ubits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float fbits(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* --- to_bf16 -------------------------------------------------------------------------------- */

/* Values whose rounding is easy to get wrong: ties to even both ways, the largest float
 * (rounds to inf), infinities, NaNs with payloads (signalling, negative), denormals and their
 * ties, zeros of both signs. */
static const uint32_t specials[] = {
    0x3f808000u, 0x3f818000u, 0xbf808000u, 0xbf818000u, 0x3f807fffu, 0x3f808001u,
    0x7f7fffffu, 0xff7fffffu, 0x7f7f8000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
    0x7fa00001u, 0xffc12345u, 0x7f800001u, 0x00000001u, 0x00008000u, 0x00018000u,
    0x807fffffu, 0x007f8000u, 0x00000000u, 0x80000000u, 0x00800000u, 0x33800000u,
};
#define N_SPECIALS (sizeof specials / sizeof *specials)

static void test_to_bf16(void)
{
    static const size_t sizes[] = {1, 3, 7, 127, 4099, (1u << 20) + 3};
    env_t e;
    env_open(&e);
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
        for (size_t off = 0; off < 2; off++) {
            size_t n = sizes[s];
            float *x = hrand(n, 3.0f);
            /* every special at the head (the vector path) and at the tail (the n % 4 rest) */
            for (size_t i = 0; i < N_SPECIALS && i < n; i++) {
                x[i] = fbits(specials[i]);
                x[n - 1 - i] = fbits(specials[(i + 5) % N_SPECIALS]);
            }
            uint16_t *want = to16(x, n);
            void *bx, *by;
            float *d_x = dupd(&e, x, n, off, &bx);
            uint16_t *d_y = d16(&e, NULL, n, off, &by);
            OK(&e, B16->to_bf16(IMPL(&e), n, d_x, d_y, &e.err));
            uint16_t *got = down16(&e, d_y, n);
            size_t bad = 0;
            for (size_t i = 0; i < n; i++)
                if (got[i] != want[i] && bad++ < 5)
                    printf("  to_bf16 n=%zu off=%zu [%zu]: 0x%08x -> 0x%04x, expected 0x%04x\n", n,
                           off, i, (unsigned)ubits(x[i]), got[i], want[i]);
            if (bad) {
                printf("  to_bf16 n=%zu off=%zu: %zu of %zu differ\n", n, off, bad, n);
                check_failed++;
            }
            mgpu_k_free(e.gpu, bx);
            mgpu_k_free(e.gpu, by);
            free(x);
            free(want);
            free(got);
        }
    env_close(&e);
}

/* to_bf16_2d: rows of x (ldx apart, or ldx 0: every row from x's first) into rows of y ldy
 * apart, the columns between untouched; 70000 rows: more than a grid's second dimension. */
static void test_to_bf16_2d(void)
{
    static const int dims[][4] = {{5, 7, 9, 12}, {3, 1, 1, 25}, {70000, 3, 0, 8}, {4, 16, 16, 16}};
    env_t e;
    env_open(&e);
    for (size_t s = 0; s < sizeof dims / sizeof *dims; s++) {
        const int rows = dims[s][0], cols = dims[s][1];
        const size_t ldx = (size_t)dims[s][2], ldy = (size_t)dims[s][3];
        const size_t nx = ldx > 0 ? rows * ldx : (size_t)cols, ny = rows * ldy;
        float *x = hrand(nx, 3.0f);
        void *bx, *by;
        float *d_x = dupd(&e, x, nx, 0, &bx);
        uint16_t *d_y = d16(&e, NULL, ny, 0, &by);
        OK(&e, B16->to_bf16_2d(IMPL(&e), rows, cols, d_x, ldx, d_y, ldy, &e.err));
        uint16_t *got = down16(&e, d_y, ny);
        size_t bad = 0;
        for (size_t i = 0; i < ny; i++) {
            const size_t r = i / ldy, j = i % ldy;
            const uint16_t want = j < (size_t)cols ? mgpu_gpt_to_bf16(x[r * ldx + j]) : kPoison16;
            bad += got[i] != want;
        }
        if (bad) {
            printf("  to_bf16_2d %d x %d (ldx %zu, ldy %zu): %zu of %zu differ\n", rows, cols, ldx,
                   ldy, bad, ny);
            check_failed++;
        }
        mgpu_k_free(e.gpu, bx);
        mgpu_k_free(e.gpu, by);
        free(x);
        free(got);
    }
    CHECK_INT(B16->to_bf16_2d(IMPL(&e), 2, 8, NULL, 8, NULL, 4, &e.err), MGPU_E_RANGE);
    env_close(&e);
}

/* --- LayerNorm ------------------------------------------------------------------------------ */

static void test_layernorm16(void)
{
    /* rows 1, 3, 1001 are not a multiple of a block's 8; c = 37 and 6 take the scalar path;
     * c a multiple of 8 up to 2048 (32, 64, 384, 768 and GPT-2's wider 1280, 1536, 1600, the
     * last with lanes idle in its last chunk) the register paths when aligned, 2056 the
     * float4 path; 5000 rows of 768: more rows than warps in flight, so a warp adds several
     * rows into its dw, db partials */
    static const int shapes[][2] = {{1, 32},   {3, 64},     {1001, 32},  {129, 768},  {64, 37},
                                    {5, 1600}, {17, 6},     {1024, 384}, {5000, 768}, {3, 1280},
                                    {7, 1536}, {300, 1600}, {2, 2056}};
    env_t e;
    env_open(&e);
    for (size_t sh = 0; sh < sizeof shapes / sizeof *shapes; sh++)
        for (size_t off = 0; off < 2; off++) {
            int n = shapes[sh][0], c = shapes[sh][1];
            size_t nc = (size_t)n * c;
            float *x = hrand(nc, 2.0f), *w = hrand(c, 1.0f), *b = hrand(c, 1.0f);
            for (size_t i = 0; i < nc; i++)
                x[i] += 0.5f; /* a mean away from zero */
            float *y = hbuf(nc), *mean = hbuf(n), *rstd = hbuf(n);
            mgpu_gpt_layernorm_forward(n, c, x, w, b, y, mean, rstd);
            void *bx, *bw, *bb, *by, *bm, *br;
            float *d_x = dupd(&e, x, nc, off, &bx), *d_w = dupd(&e, w, c, off, &bw);
            float *d_b = dupd(&e, b, c, off, &bb);
            uint16_t *d_y = d16(&e, NULL, nc, off, &by);
            float *d_m = dpoison(&e, n, off, &bm), *d_r = dpoison(&e, n, off, &br);
            OK(&e, B16->layernorm_forward(IMPL(&e), n, c, d_x, d_w, d_b, d_y, (size_t)c, d_m, d_r,
                                          &e.err));
            char what[96];
            uint16_t *y16 = down16(&e, d_y, nc);
            float *got = from16(y16, nc);
            snprintf(what, sizeof what, "layernorm16_forward %dx%d off=%zu y", n, c, off);
            close_scaled2(what, got, y, nc, 2e-5, 1.0 / 256 + 1e-5);
            free(got);
            free(y16);
            close_to_dev(&e, d_m, mean, n, 1e-6, 1e-5, "layernorm16_forward %dx%d off=%zu mean", n,
                         c, off);
            close_to_dev(&e, d_r, rstd, n, 1e-6, 1e-5, "layernorm16_forward %dx%d off=%zu rstd", n,
                         c, off);
            /* rows 8 elements wider than c: the same bits in the first c, the rest untouched */
            {
                const size_t ld = (size_t)c + 8, nw = (size_t)n * ld;
                void *bw16;
                uint16_t *d_wide = d16(&e, NULL, nw, off, &bw16);
                OK(&e, B16->layernorm_forward(IMPL(&e), n, c, d_x, d_w, d_b, d_wide, ld, d_m, d_r,
                                              &e.err));
                uint16_t *wide = down16(&e, d_wide, nw), *y16b = down16(&e, d_y, nc);
                snprintf(what, sizeof what, "layernorm16_forward %dx%d off=%zu", n, c, off);
                same_rows(what, wide, ld, y16b, n, c);
                free(wide);
                free(y16b);
                mgpu_k_free(e.gpu, bw16);
            }

            /* backward from a bf16 dy; dx, dw, db start from random values (the op adds) */
            float *gy0 = hrand(nc, 1.0f);
            uint16_t *gy16 = to16(gy0, nc);
            float *gy = from16(gy16, nc);
            float *gx0 = hrand(nc, 0.5f), *gw0 = hrand(c, 0.5f), *gb0 = hrand(c, 0.5f);
            float *gx = hcopy(gx0, nc), *gw = hcopy(gw0, c), *gb = hcopy(gb0, c);
            mgpu_gpt_layernorm_backward(n, c, gy, x, w, mean, rstd, gx, gw, gb);
            void *bgy, *bgx, *bgw, *bgb, *bmean, *brstd, *bx16;
            uint16_t *d_gy = d16(&e, gy16, nc, off, &bgy);
            float *d_gx = dupd(&e, gx0, nc, off, &bgx), *d_gw = dupd(&e, gw0, c, off, &bgw);
            float *d_gb = dupd(&e, gb0, c, off, &bgb);
            float *d_mean = dupd(&e, mean, n, off, &bmean),
                  *d_rstd = dupd(&e, rstd, n, off, &brstd);
            uint16_t *d_x16 = d16(&e, NULL, nc, off, &bx16);
            /* dsum (the next layer's bias gradient) starts from random values too */
            float *ds0 = hrand(c, 0.5f), *ds[2];
            void *bds;
            float *d_ds = dupd(&e, ds0, c, off, &bds);
            /* runs 0 and 1 with dx16 and dsum (the same bits twice), run 2 without (the same
             * dx, dw, db) */
            float *runs[3][3];
            uint16_t *x16[2];
            for (int r = 0; r < 3; r++) {
                OK(&e, mgpu_k_copy_to_device(e.gpu, d_gx, gx0, nc * sizeof(float), &e.err));
                OK(&e, mgpu_k_copy_to_device(e.gpu, d_gw, gw0, c * sizeof(float), &e.err));
                OK(&e, mgpu_k_copy_to_device(e.gpu, d_gb, gb0, c * sizeof(float), &e.err));
                OK(&e, mgpu_k_copy_to_device(e.gpu, d_ds, ds0, c * sizeof(float), &e.err));
                OK(&e, B16->layernorm_backward(IMPL(&e), n, c, d_gy, d_x, d_w, NULL, d_mean, d_rstd,
                                               d_gx, r < 2 ? d_x16 : NULL, d_gw, d_gb,
                                               r < 2 ? d_ds : NULL, NULL, 0, 0, &e.err));
                runs[r][0] = down(&e, d_gx, nc);
                runs[r][1] = down(&e, d_gw, c);
                runs[r][2] = down(&e, d_gb, c);
                if (r < 2) {
                    x16[r] = down16(&e, d_x16, nc);
                    ds[r] = down(&e, d_ds, c);
                    poison16(&e, d_x16, nc);
                }
            }
            /* dsum += the column sums of dx16 as stored */
            float *want_ds = hbuf(c);
            for (int j = 0; j < c; j++) {
                double acc = ds0[j];
                for (int i = 0; i < n; i++)
                    acc += mgpu_gpt_from_bf16(x16[0][(size_t)i * c + j]);
                want_ds[j] = (float)acc;
            }
            snprintf(what, sizeof what, "layernorm16_backward %dx%d off=%zu dsum", n, c, off);
            close_scaled2(what, ds[0], want_ds, c, 1e-5 * (1.0 + sqrt((double)n)), 1e-5);
            same_bytes("layernorm16_backward dsum twice", ds[0], ds[1], c * sizeof(float));
            /* fresh: dw, db and dsum overwritten (NaN before), dx still added to */
            {
                float *nan_c = hbuf(c), *fw[4], *wf[3] = {hbuf(c), hbuf(c), hbuf(c)};
                for (int j = 0; j < c; j++) {
                    nan_c[j] = NAN;
                    wf[0][j] = (float)((double)gw[j] - gw0[j]);
                    wf[1][j] = (float)((double)gb[j] - gb0[j]);
                    wf[2][j] = (float)((double)want_ds[j] - ds0[j]);
                }
                OK(&e, mgpu_k_copy_to_device(e.gpu, d_gx, gx0, nc * sizeof(float), &e.err));
                float *outs[] = {d_gw, d_gb, d_ds};
                for (int k = 0; k < 3; k++)
                    OK(&e, mgpu_k_copy_to_device(e.gpu, outs[k], nan_c, c * sizeof(float), &e.err));
                OK(&e, B16->layernorm_backward(IMPL(&e), n, c, d_gy, d_x, d_w, NULL, d_mean, d_rstd,
                                               d_gx, d_x16, d_gw, d_gb, d_ds, NULL, 0, 1, &e.err));
                for (int k = 0; k < 3; k++)
                    fw[k] = down(&e, outs[k], c);
                fw[3] = down(&e, d_gx, nc);
                const char *names[] = {"dw", "db", "dsum"};
                for (int k = 0; k < 3; k++) {
                    snprintf(what, sizeof what, "layernorm16_backward %dx%d off=%zu fresh %s", n, c,
                             off, names[k]);
                    close_scaled2(what, fw[k], wf[k], c, 1e-5 * (1.0 + sqrt((double)n)), 1e-4);
                }
                same_bytes("layernorm16_backward dx fresh", fw[3], runs[0][0], nc * sizeof(float));
                for (int k = 0; k < 4; k++)
                    free(fw[k]);
                for (int k = 0; k < 3; k++)
                    free(wf[k]);
                free(nan_c);
            }
            /* y: the forward's output made again from the forward's own mean and rstd, the
             * same bits as layernorm_forward gave, rows c and c + 8 apart (the padding left as
             * it was); dx, dw and db the same bits as without it */
            {
                uint16_t *fy = down16(&e, d_y, nc);
                float *plain[3] = {NULL, NULL, NULL};
                for (int r = 0; r < 3; r++) {
                    const size_t ld = r == 2 ? (size_t)c + 8 : (size_t)c, ny = (size_t)n * ld;
                    void *byy;
                    uint16_t *d_yy = d16(&e, NULL, ny, off, &byy);
                    OK(&e, mgpu_k_copy_to_device(e.gpu, d_gx, gx0, nc * sizeof(float), &e.err));
                    OK(&e, mgpu_k_copy_to_device(e.gpu, d_gw, gw0, c * sizeof(float), &e.err));
                    OK(&e, mgpu_k_copy_to_device(e.gpu, d_gb, gb0, c * sizeof(float), &e.err));
                    OK(&e, mgpu_k_copy_to_device(e.gpu, d_ds, ds0, c * sizeof(float), &e.err));
                    OK(&e, B16->layernorm_backward(IMPL(&e), n, c, d_gy, d_x, d_w, d_b, d_m, d_r,
                                                   d_gx, d_x16, d_gw, d_gb, d_ds,
                                                   r > 0 ? d_yy : NULL, ld, 0, &e.err));
                    float *res[3] = {down(&e, d_gx, nc), down(&e, d_gw, c), down(&e, d_gb, c)};
                    if (r == 0) {
                        memcpy(plain, res, sizeof res);
                    } else {
                        snprintf(what, sizeof what, "layernorm16_backward %dx%d off=%zu ld=%zu: dx",
                                 n, c, off, ld);
                        same_bytes(what, res[0], plain[0], nc * sizeof(float));
                        same_bytes("layernorm16_backward with y: dw", res[1], plain[1],
                                   c * sizeof(float));
                        same_bytes("layernorm16_backward with y: db", res[2], plain[2],
                                   c * sizeof(float));
                        uint16_t *yy = down16(&e, d_yy, ny);
                        snprintf(what, sizeof what, "layernorm16_backward %dx%d off=%zu y", n, c,
                                 off);
                        same_rows(what, yy, ld, fy, n, c);
                        free(yy);
                        for (int k = 0; k < 3; k++)
                            free(res[k]);
                    }
                    mgpu_k_free(e.gpu, byy);
                }
                for (int k = 0; k < 3; k++)
                    free(plain[k]);
                free(fy);
            }
            free(ds[0]), free(ds[1]), free(want_ds), free(ds0);
            mgpu_k_free(e.gpu, bds);
            snprintf(what, sizeof what, "layernorm16_backward %dx%d off=%zu dx", n, c, off);
            close_scaled2(what, runs[0][0], gx, nc, 1e-4, 1e-4);
            snprintf(what, sizeof what, "layernorm16_backward %dx%d off=%zu dw", n, c, off);
            close_scaled2(what, runs[0][1], gw, c, 1e-5 * (1.0 + sqrt((double)n)), 1e-4);
            snprintf(what, sizeof what, "layernorm16_backward %dx%d off=%zu db", n, c, off);
            close_scaled2(what, runs[0][2], gb, c, 1e-5 * (1.0 + sqrt((double)n)), 1e-4);
            uint16_t *want16 = to16(runs[0][0], nc);
            snprintf(what, sizeof what, "layernorm16_backward %dx%d off=%zu dx16 vs bf16(dx)", n, c,
                     off);
            same_bytes(what, x16[0], want16, nc * sizeof(uint16_t));
            same_bytes("layernorm16_backward dx16 twice", x16[0], x16[1], nc * sizeof(uint16_t));
            /* dx is row by row: the same bits with and without dx16 and dsum; dw and db are
             * summed over blocks whose number follows the shared memory a block takes (more
             * with dsum), so only to the tolerance */
            for (int k = 0; k < 3; k++)
                same_bytes("layernorm16_backward twice", runs[0][k], runs[1][k],
                           (k == 0 ? nc : (size_t)c) * sizeof(float));
            same_bytes("layernorm16_backward dx with and without dx16", runs[0][0], runs[2][0],
                       nc * sizeof(float));
            close_scaled2("layernorm16_backward dw with and without dx16", runs[2][1], runs[0][1],
                          c, 1e-5 * (1.0 + sqrt((double)n)), 1e-5);
            close_scaled2("layernorm16_backward db with and without dx16", runs[2][2], runs[0][2],
                          c, 1e-5 * (1.0 + sqrt((double)n)), 1e-5);
            for (int r = 0; r < 3; r++)
                for (int k = 0; k < 3; k++)
                    free(runs[r][k]);
            free(x16[0]);
            free(x16[1]);
            free(want16);
            void *bases[] = {bx, bw, bb, by, bm, br, bgy, bgx, bgw, bgb, bmean, brstd, bx16};
            for (size_t i = 0; i < sizeof bases / sizeof *bases; i++)
                mgpu_k_free(e.gpu, bases[i]);
            float *hs[] = {x, w, b, y, mean, rstd, gy0, gy, gx0, gw0, gb0, gx, gw, gb};
            for (size_t i = 0; i < sizeof hs / sizeof *hs; i++)
                free(hs[i]);
            free(gy16);
        }
    env_close(&e);
}

/* dsum sums dx16: asked for without dx16, the op refuses, naming it; y likewise without b or
 * with rows closer than c. */
static void test_layernorm16_backward_refuses(void)
{
    env_t e;
    env_open(&e);
    void *b;
    float *d = dalloc(&e, 64, 0, &b);
    int rc = B16->layernorm_backward(IMPL(&e), 2, 8, (const mgpu_bf16_t *)d, d, d, d, d, d, d, NULL,
                                     d, d, d, NULL, 0, 0, &e.err);
    CHECK(rc < 0);
    CHECK(strstr(e.err.msg, "dsum") != NULL);
    e.err.msg[0] = '\0';
    /* and the output y without the bias, or with rows closer than c */
    mgpu_bf16_t *y = (mgpu_bf16_t *)(d + 32);
    rc = B16->layernorm_backward(IMPL(&e), 2, 8, (const mgpu_bf16_t *)d, d, d, NULL, d, d, d, NULL,
                                 d, d, NULL, y, 8, 0, &e.err);
    CHECK_INT(rc, MGPU_E_USAGE);
    CHECK(strstr(e.err.msg, "needs the bias b") != NULL);
    e.err.msg[0] = '\0';
    rc = B16->layernorm_backward(IMPL(&e), 2, 8, (const mgpu_bf16_t *)d, d, d, d, d, d, d, NULL, d,
                                 d, NULL, y, 4, 0, &e.err);
    CHECK_INT(rc, MGPU_E_RANGE);
    CHECK(strstr(e.err.msg, "y's rows 4 elements apart") != NULL);
    e.err.msg[0] = '\0';
    mgpu_k_free(e.gpu, b);
    env_close(&e);
}

/* --- cross-entropy -------------------------------------------------------------------------- */

static void xent_case(env_t *e, int rows, int vocab, size_t off)
{
    const size_t nl = (size_t)rows * vocab;
    float *l0 = hrand(nl, 4.0f);
    uint16_t *l16 = to16(l0, nl);
    float *lg = from16(l16, nl), *dref = hbuf(nl), ref_loss = 0.0f;
    int32_t *tg = malloc((size_t)rows * sizeof *tg);
    for (int i = 0; i < rows; i++)
        tg[i] = (int32_t)((frand() + 1.0f) * 0.5f * (float)vocab) % vocab;
    tg[rows - 1] = vocab - 1; /* the last column, in the vector path's last word */
    OK(e, mgpu_k_softmax_xent(e->cpu, rows, vocab, lg, tg, &ref_loss, dref, &e->err));
    const float scale = 1.0f / (float)rows, loss0 = 0.25f;
    const float want_loss = loss0 + ref_loss;
    void *bl, *bt, *bloss;
    uint16_t *d_l = d16(e, l16, nl, off, &bl);
    int32_t *d_t = dints(e, tg, rows, &bt);
    float *d_loss = dupd(e, &loss0, 1, 0, &bloss);
    char what[96];
    uint16_t *g16[2];
    float lossbits[2];
    for (int r = 0; r < 2; r++) {
        OK(e, mgpu_k_copy_to_device(e->gpu, d_l, l16, nl * sizeof(uint16_t), &e->err));
        OK(e, mgpu_k_copy_to_device(e->gpu, d_loss, &loss0, sizeof loss0, &e->err));
        OK(e, B16->xent(IMPL(e), rows, vocab, d_l, d_t, scale, 1, d_loss, &e->err));
        g16[r] = down16(e, d_l, nl);
        OK(e, mgpu_k_copy_to_host(e->gpu, &lossbits[r], d_loss, sizeof(float), &e->err));
    }
    snprintf(what, sizeof what, "xent16 rows=%d vocab=%d off=%zu loss", rows, vocab, off);
    close_to(what, &lossbits[0], &want_loss, 1, 0.0, 1e-5);
    float *got = from16(g16[0], nl);
    snprintf(what, sizeof what, "xent16 rows=%d vocab=%d off=%zu dlogits", rows, vocab, off);
    close_to(what, got, dref, nl, 1e-5 * scale, 1.0 / 256 + 1e-5);
    free(got);
    same_bytes("xent16 loss twice", &lossbits[0], &lossbits[1], sizeof(float));
    same_bytes("xent16 dlogits twice", g16[0], g16[1], nl * sizeof(uint16_t));
    free(g16[0]);
    free(g16[1]);
    /* without grad: the loss alone, the logits untouched */
    OK(e, mgpu_k_copy_to_device(e->gpu, d_l, l16, nl * sizeof(uint16_t), &e->err));
    OK(e, mgpu_k_copy_to_device(e->gpu, d_loss, &loss0, sizeof loss0, &e->err));
    OK(e, B16->xent(IMPL(e), rows, vocab, d_l, d_t, scale, 0, d_loss, &e->err));
    snprintf(what, sizeof what, "xent16 rows=%d vocab=%d off=%zu loss only", rows, vocab, off);
    close_to_dev(e, d_loss, &want_loss, 1, 0.0, 1e-5, "%s", what);
    uint16_t *after = down16(e, d_l, nl);
    same_bytes("xent16 without grad leaves the logits", after, l16, nl * sizeof(uint16_t));
    free(after);
    mgpu_k_free(e->gpu, bl);
    mgpu_k_free(e->gpu, bt);
    mgpu_k_free(e->gpu, bloss);
    free(l0);
    free(l16);
    free(lg);
    free(dref);
    free(tg);
}

/* A target outside 0..vocab-1 (-1, vocab) makes the loss NaN and its row's gradient NaN; the
 * other rows' gradients stay finite. */
static void xent_bad_target(env_t *e, int vocab)
{
    enum { ROWS = 3 };
    const size_t nl = (size_t)ROWS * vocab;
    float *l0 = hrand(nl, 4.0f);
    uint16_t *l16 = to16(l0, nl);
    for (int bad = 0; bad < 2; bad++) {
        int32_t tg[ROWS] = {0, bad == 0 ? -1 : vocab, vocab / 2};
        void *bl, *bt, *bloss;
        uint16_t *d_l = d16(e, l16, nl, 0, &bl);
        int32_t *d_t = dints(e, tg, ROWS, &bt);
        float loss0 = 0.25f, loss = 0.0f;
        float *d_loss = dupd(e, &loss0, 1, 0, &bloss);
        OK(e, B16->xent(IMPL(e), ROWS, vocab, d_l, d_t, 1.0f / ROWS, 1, d_loss, &e->err));
        OK(e, mgpu_k_copy_to_host(e->gpu, &loss, d_loss, sizeof loss, &e->err));
        uint16_t *g = down16(e, d_l, nl);
        size_t nan_row = 0, nan_other = 0;
        for (size_t i = 0; i < nl; i++) {
            int nan = isnan(mgpu_gpt_from_bf16(g[i]));
            if (i / (size_t)vocab == 1)
                nan_row += nan;
            else
                nan_other += nan;
        }
        if (!isnan(loss) || nan_row != (size_t)vocab || nan_other != 0) {
            printf("  xent16 vocab=%d target %d: loss %g, %zu of %d NaN in its row, %zu in the "
                   "others; expected NaN, all, none\n",
                   vocab, tg[1], loss, nan_row, vocab, nan_other);
            check_failed++;
        }
        free(g);
        mgpu_k_free(e->gpu, bl);
        mgpu_k_free(e->gpu, bt);
        mgpu_k_free(e->gpu, bloss);
    }
    free(l0);
    free(l16);
}

static void test_xent16(void)
{
    /* rows, vocab: a block a row with the row in shared memory (50304; 1030: not a multiple
     * of 8; 300 rows: more than the 264 blocks in flight on an H200, so a block takes
     * several rows), a warp a row (256, 100, 1024), the small model's 16384 rows of 256. A
     * device with 227 KB of shared memory a block (H100, H200) holds rows of up to 116096
     * logits (16 bytes a word of 8 and 256 for the block's sums); 116104 takes the two-pass
     * block kernel there (and any wider row on any device). */
    static const int shapes[][2] = {{5, 50304},  {40, 50304}, {300, 50304}, {3, 1030},
                                    {37, 256},   {33, 100},   {9, 1024},    {16384, 256},
                                    {2, 116096}, {3, 116104}, {2, 200000}};
    env_t e;
    env_open(&e);
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (size_t off = 0; off < 2; off++)
            xent_case(&e, shapes[s][0], shapes[s][1], off);
    xent_bad_target(&e, 50304);
    xent_bad_target(&e, 116104);
    xent_bad_target(&e, 256);
    env_close(&e);
}

/* --- adamw_multi's bf16 copy ------------------------------------------------------------------ */

/* A model-like list of 301 tensors (about 200 segments: more than one launch), their fp32
 * arrays contiguous, stepped twice from the same state: with p16 and without. p, m, v must be the
 * same bits, and p16 = bf16(p) where a tensor has one. Every 5th tensor has none (its slot must
 * stay untouched), and every 7th tensor's p16 starts one element after its neighbour's end (the
 * fp32 arrays contiguous, the bf16 not: the segments must not merge there). Some tensors' copies
 * are rows inside a wider matrix (p16_cols 16 with rows 40 apart, or 1 with rows 25 apart: a
 * weight or a bias column), whose other elements must stay untouched. The p16 array is
 * aligned or 2 bytes off. */
static void test_adamw_p16(void)
{
    enum { NT = 301 };
    static const size_t sizes[] = {1, 3, 127, 4099, 64, 768};
    mgpu_adamw_hparams_t hp = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
    env_t e;
    env_open(&e);
    size_t n_of[NT], o16[NT], ld16[NT], total = 0, total16 = 0;
    int c16[NT];
    for (int i = 0; i < NT; i++) {
        n_of[i] = i == NT / 2 ? (1u << 20) + 3 : sizes[i % (sizeof sizes / sizeof *sizes)];
        total16 += i % 7 == 6 ? 1 : 0;
        o16[i] = total16;
        total += n_of[i];
        /* some copies as rows inside wider ones: 16 (float4 stores) or 1 (a column) wide */
        c16[i] = n_of[i] % 16 == 0 && i % 4 == 1 ? (i % 8 == 1 ? 16 : 1) : 0;
        ld16[i] = c16[i] == 16 ? 40 : c16[i] == 1 ? 25 : 0;
        total16 += c16[i] > 0 ? n_of[i] / c16[i] * ld16[i] : n_of[i];
    }
    for (size_t off = 0; off < 2; off++)
        for (size_t off16 = 0; off16 < 2; off16++) {
            float *p = hrand(total, 1.0f), *z = hbuf(total);
            memset(z, 0, total * sizeof(float));
            void *b[8] = {0};
            float *d_p[2], *d_m[2], *d_v[2];
            for (int k = 0; k < 2; k++) {
                d_p[k] = dupd(&e, p, total, off, &b[3 * k]);
                d_m[k] = dupd(&e, z, total, off, &b[3 * k + 1]);
                d_v[k] = dupd(&e, z, total, off, &b[3 * k + 2]);
            }
            float *d_g = dalloc(&e, total, off, &b[6]);
            uint16_t *d_p16 = d16(&e, NULL, total16, off16, &b[7]);
            void *bnow;
            OK(&e, mgpu_k_alloc(e.gpu, sizeof(mgpu_gpt_adamw_now_t), &bnow, &e.err));
            mgpu_gpt_adamw_now_t *d_now = bnow;
            mgpu_gpt_adamw_tensor_t t[2][NT];
            size_t o = 0;
            for (int i = 0; i < NT; i++) {
                for (int k = 0; k < 2; k++)
                    t[k][i] = (mgpu_gpt_adamw_tensor_t){.p = d_p[k] + o,
                                                        .g = d_g + o,
                                                        .m = d_m[k] + o,
                                                        .v = d_v[k] + o,
                                                        .p16 = k == 0 && i % 5 != 4 ? d_p16 + o16[i]
                                                                                    : NULL,
                                                        .n = n_of[i],
                                                        .decay = i % 3 != 0,
                                                        .p16_cols = c16[i],
                                                        .p16_ld = ld16[i]};
                o += n_of[i];
            }
            for (long long step = 1; step <= 3; step++) {
                float *g = hrand(total, 1.0f);
                OK(&e, mgpu_k_copy_to_device(e.gpu, d_g, g, total * sizeof(float), &e.err));
                mgpu_adamw_hparams_t h = hp;
                h.lr = 1e-3f * (float)step;
                mgpu_gpt_adamw_now_t now;
                mgpu_kg_adamw_now(&h, step, &now);
                OK(&e, mgpu_k_copy_to_device(e.gpu, d_now, &now, sizeof now, &e.err));
                for (int k = 0; k < 2; k++)
                    OK(&e, GOPS->adamw_multi(IMPL(&e), NT, t[k], &hp, d_now, NULL, &e.err));
                free(g);
            }
            char what[96];
            for (int j = 0; j < 3; j++) {
                float *a = down(&e, j == 0 ? d_p[0] : j == 1 ? d_m[0] : d_v[0], total);
                float *c = down(&e, j == 0 ? d_p[1] : j == 1 ? d_m[1] : d_v[1], total);
                snprintf(what, sizeof what, "adamw_multi off=%zu off16=%zu %s with p16 vs without",
                         off, off16,
                         j == 0   ? "p"
                         : j == 1 ? "m"
                                  : "v");
                same_bytes(what, a, c, total * sizeof(float));
                free(a);
                free(c);
            }
            float *pg = down(&e, d_p[0], total);
            uint16_t *got = down16(&e, d_p16, total16);
            uint16_t *want = malloc(total16 * sizeof *want);
            for (size_t i = 0; i < total16; i++)
                want[i] = kPoison16;
            o = 0;
            for (int i = 0; i < NT; i++) {
                if (i % 5 != 4)
                    for (size_t j = 0; j < n_of[i]; j++) {
                        const size_t at = c16[i] > 0 ? j / c16[i] * ld16[i] + j % c16[i] : j;
                        want[o16[i] + at] = mgpu_gpt_to_bf16(pg[o + j]);
                    }
                o += n_of[i];
            }
            size_t bad = 0;
            for (size_t i = 0; i < total16; i++)
                if (got[i] != want[i] && bad++ < 5)
                    printf("  adamw_multi off=%zu off16=%zu p16[%zu] = 0x%04x, expected 0x%04x\n",
                           off, off16, i, got[i], want[i]);
            if (bad) {
                printf("  adamw_multi off=%zu off16=%zu: %zu of %zu bf16s differ (bf16(p), or "
                       "untouched where a tensor has no p16)\n",
                       off, off16, bad, total16);
                check_failed++;
            }
            free(pg);
            free(got);
            free(want);
            for (int j = 0; j < 8; j++)
                mgpu_k_free(e.gpu, b[j]);
            mgpu_k_free(e.gpu, bnow);
            free(p);
            free(z);
        }
    env_close(&e);
}

int main(void)
{
    RUN(test_to_bf16);
    RUN(test_to_bf16_2d);
    RUN(test_layernorm16);
    RUN(test_layernorm16_backward_refuses);
    RUN(test_xent16);
    RUN(test_adamw_p16);
    return check_done();
}
