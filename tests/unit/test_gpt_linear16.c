/* test_gpt_linear16.c - the bf16 path's linear layers (gpt_ops.h's mgpu_gpt_bf16_ops_t:
 * linear, linear_f32, linear_back_data, linear_back_weight; kernels/gpt_linear.cu) against a
 * double-precision reference on the same bf16 values.
 *
 * Inputs are random values rounded to bf16 on the host, so both sides multiply the same
 * numbers; the reference sums in double. Tolerances, relative to the largest expected
 * magnitude (SCALED) plus a relative part:
 *   - outputs stored in bf16 (linear, its GELU pre-activation, the input gradient): 8e-3
 *     relative (bf16 keeps 8 significant bits: one rounding is at most 2^-9 = 2e-3 of the
 *     value, the fp32 sum's own error is far below, GELU and its derivative move it by at most
 *     about 1.2x) and 2e-3 of the scale for values near zero;
 *   - outputs in fp32 (linear_f32, the weight and bias gradients): 1e-5 of the scale, the
 *     fp32 accumulation of up to a few thousand products in another order.
 * Outputs an op overwrites are poisoned with NaN first; those it adds to start from random
 * values. The weight gradient run twice from the same start gives the same bits. Skips
 * without CUDA or a CUDA device. */
#include "kernels_check.h" /* env_t, buffers, close_to */
#include "transformer.h"   /* mgpu_gpt_to_bf16, mgpu_gpt_gelu_forward/backward */

#if defined(MGPU_HAVE_CUDA) && MGPU_HAVE_CUDA
#include "gpt_cuda.h" /* mgpu_gpt_cuda_ops */
#define BOPS (mgpu_gpt_cuda_ops.bf16)
#else
#include "gpt_ops.h" /* mgpu_gpt_bf16_ops_t */
/* Never called: env_open skips every test first in a build without CUDA. */
static const mgpu_gpt_bf16_ops_t no_ops;
#define BOPS (&no_ops)
#endif

#include <string.h> /* memcmp */

#define IMPL(e) ((e)->gpu->impl)

/* n random values in [-scale, scale) rounded to bf16: the bits in *h16, the values in *hf. */
static void rand16(size_t n, float scale, mgpu_bf16_t **h16, float **hf)
{
    *h16 = malloc(sizeof(mgpu_bf16_t) * (n ? n : 1));
    *hf = hbuf(n);
    if (*h16 == NULL) {
        printf("  malloc failed\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++) {
        (*h16)[i] = mgpu_gpt_to_bf16(frand() * scale);
        (*hf)[i] = mgpu_gpt_from_bf16((*h16)[i]);
    }
}

/* A device copy of n bf16 values (NULL: n NaNs, a poisoned output). */
static mgpu_bf16_t *dup16(env_t *e, const mgpu_bf16_t *h, size_t n)
{
    void *p = NULL;
    mgpu_bf16_t *tmp = NULL;
    if (mgpu_k_alloc(e->gpu, (n + 8) * sizeof(mgpu_bf16_t), &p, &e->err) != 0) {
        printf("  mgpu_k_alloc(%zu bf16): %s\n", n + 8, e->err.msg);
        exit(1);
    }
    if (h == NULL) {
        tmp = malloc(sizeof *tmp * (n ? n : 1));
        for (size_t i = 0; tmp != NULL && i < n; i++)
            tmp[i] = 0x7fc0; /* NaN */
        h = tmp;
    }
    OK(e, mgpu_k_copy_to_device(e->gpu, p, h, n * sizeof(mgpu_bf16_t), &e->err));
    free(tmp);
    return p;
}

/* The values of n bf16 on the device, as floats. */
static float *down16(env_t *e, const mgpu_bf16_t *d, size_t n)
{
    mgpu_bf16_t *h = malloc(sizeof *h * (n ? n : 1));
    float *f = hbuf(n);
    OK(e, mgpu_k_copy_to_host(e->gpu, h, d, n * sizeof *h, &e->err));
    for (size_t i = 0; i < n; i++)
        f[i] = mgpu_gpt_from_bf16(h[i]);
    free(h);
    return f;
}

static int close_scaled(const char *what, const float *got, const float *want, size_t n, double tol,
                        double rtol)
{
    double mx = 0.0;
    for (size_t i = 0; i < n; i++)
        mx = fabs((double)want[i]) > mx ? fabs((double)want[i]) : mx;
    return close_to(what, got, want, n, tol * (mx > 0.0 ? mx : 1.0), rtol);
}

static float gelu1(float x)
{
    float y;
    mgpu_gpt_gelu_forward(1, &x, &y);
    return y;
}

static float dgelu1(float x, float dy)
{
    float dx = 0.0f;
    mgpu_gpt_gelu_backward(1, &x, &dy, &dx);
    return dx;
}

/* A GELU product's two bf16 outputs on the device against the reference: pre (the sum, one
 * bf16 rounding) and out (GELU of it, a little more). label names the form. */
static void check_gelu16(env_t *e, const char *label, int n, int c, int oc, const mgpu_bf16_t *dpre,
                         const mgpu_bf16_t *dout, const float *ref, const float *ref_g)
{
    const size_t no = (size_t)n * oc;
    char what[112];
    float *got = down16(e, dpre, no);
    snprintf(what, sizeof what, "%s pre %dx%dx%d", label, n, c, oc);
    close_scaled(what, got, ref, no, 2e-3, 8e-3);
    free(got);
    got = down16(e, dout, no);
    snprintf(what, sizeof what, "%s out %dx%dx%d", label, n, c, oc);
    close_scaled(what, got, ref_g, no, 2e-3, 1e-2);
    free(got);
}

typedef struct shape {
    int n, c, oc;
} shape_t;

/* n = 1 and 37 rows, widths of a GPT-2 block (768, 3 x 768, 4 x 768) and an output layer's
 * vocabulary of 50304 (a few rows: the reference is a plain triple loop). */
static const shape_t shapes[] = {{1, 8, 8},        {37, 64, 96},   {300, 768, 2304},
                                 {129, 3072, 768}, {77, 768, 768}, {24, 64, 50304}};

/* out (n, oc) = inp @ w^T + bias, with and without GELU, and the fp32 form with a residual. */
static void test_linear_forward(void)
{
    env_t e;
    env_open(&e);
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const int n = shapes[s].n, c = shapes[s].c, oc = shapes[s].oc;
        const size_t no = (size_t)n * oc;
        mgpu_bf16_t *hi, *hw, *hb;
        float *fi, *fw, *fb;
        rand16((size_t)n * c, 1.0f, &hi, &fi);
        rand16((size_t)oc * c, 0.1f, &hw, &fw);
        rand16(oc, 0.5f, &hb, &fb);
        float *fb32 = hrand(oc, 0.5f), *res = hrand(no, 1.0f);
        float *ref = hbuf(no), *ref_g = hbuf(no), *ref32 = hbuf(no), *ref_res = hbuf(no);
        for (int i = 0; i < n; i++)
            for (int o = 0; o < oc; o++) {
                double acc = 0.0;
                for (int j = 0; j < c; j++)
                    acc += (double)fi[(size_t)i * c + j] * fw[(size_t)o * c + j];
                ref[(size_t)i * oc + o] = (float)(acc + fb[o]);
                ref_g[(size_t)i * oc + o] = gelu1((float)(acc + fb[o]));
                ref32[(size_t)i * oc + o] = (float)acc;
                ref_res[(size_t)i * oc + o] = (float)(acc + fb32[o] + res[(size_t)i * oc + o]);
            }
        mgpu_bf16_t *di = dup16(&e, hi, (size_t)n * c), *dw = dup16(&e, hw, (size_t)oc * c),
                    *db = dup16(&e, hb, oc), *dout = dup16(&e, NULL, no),
                    *dpre = dup16(&e, NULL, no);
        void *b32base, *resbase, *o32base;
        float *db32 = dupd(&e, fb32, oc, 0, &b32base), *dres = dupd(&e, res, no, 0, &resbase);
        float *do32 = dpoison(&e, no, 0, &o32base);
        char what[96];

        OK(&e, BOPS->linear(IMPL(&e), n, c, oc, di, dw, db, dout, NULL, &e.err));
        float *got = down16(&e, dout, no);
        snprintf(what, sizeof what, "linear %dx%dx%d", n, c, oc);
        close_scaled(what, got, ref, no, 2e-3, 8e-3);
        free(got);

        OK(&e, BOPS->linear(IMPL(&e), n, c, oc, di, dw, db, dout, dpre, &e.err));
        check_gelu16(&e, "linear+gelu", n, c, oc, dpre, dout, ref, ref_g);

        /* the bias inside the product, as the model's MLP input takes it: inp's rows then a 1
         * and zeros, w's rows then the bias and zeros, kp = c + 1 rounded up to 64 wide */
        {
            const int kp = (c + 1 + 63) / 64 * 64;
            mgpu_bf16_t *hik = calloc((size_t)n * kp, sizeof *hik);
            mgpu_bf16_t *hwk = calloc((size_t)oc * kp, sizeof *hwk);
            for (int i = 0; hik != NULL && i < n; i++) {
                memcpy(hik + (size_t)i * kp, hi + (size_t)i * c, sizeof *hik * c);
                hik[(size_t)i * kp + c] = mgpu_gpt_to_bf16(1.0f);
            }
            for (int o = 0; hwk != NULL && o < oc; o++) {
                memcpy(hwk + (size_t)o * kp, hw + (size_t)o * c, sizeof *hwk * c);
                hwk[(size_t)o * kp + c] = hb[o];
            }
            mgpu_bf16_t *dik = dup16(&e, hik, (size_t)n * kp),
                        *dwk = dup16(&e, hwk, (size_t)oc * kp);
            OK(&e, BOPS->linear(IMPL(&e), n, kp, oc, dik, dwk, NULL, dout, dpre, &e.err));
            check_gelu16(&e, "linear+gelu, bias in the product,", n, c, oc, dpre, dout, ref, ref_g);
            mgpu_k_free(e.gpu, dik);
            mgpu_k_free(e.gpu, dwk);
            free(hik), free(hwk);
        }

        OK(&e, BOPS->linear_f32(IMPL(&e), n, c, oc, di, dw, NULL, NULL, do32, &e.err));
        got = down(&e, do32, no);
        snprintf(what, sizeof what, "linear_f32 %dx%dx%d", n, c, oc);
        close_scaled(what, got, ref32, no, 1e-5, 1e-5);
        free(got);
        /* out is res: the residual stream updated in place */
        OK(&e, BOPS->linear_f32(IMPL(&e), n, c, oc, di, dw, db32, dres, dres, &e.err));
        got = down(&e, dres, no);
        snprintf(what, sizeof what, "linear_f32 + bias + residual %dx%dx%d", n, c, oc);
        close_scaled(what, got, ref_res, no, 1e-5, 1e-5);
        free(got);

        mgpu_bf16_t *d16[] = {di, dw, db, dout, dpre};
        for (size_t i = 0; i < sizeof d16 / sizeof *d16; i++)
            mgpu_k_free(e.gpu, d16[i]);
        mgpu_k_free(e.gpu, b32base);
        mgpu_k_free(e.gpu, resbase);
        mgpu_k_free(e.gpu, o32base);
        free(hi), free(hw), free(hb), free(fi), free(fw), free(fb), free(fb32), free(res);
        free(ref), free(ref_g), free(ref32), free(ref_res);
    }
    env_close(&e);
}

/* linear_back_weight's dw (oc x c) and dbias (oc) against the reference; label follows the
 * op's name in what is printed. */
static void check_back_weight(const char *label, int n, int c, int oc, const float *got_w,
                              const float *want_w, const float *got_b, const float *want_b)
{
    char what[96];
    snprintf(what, sizeof what, "linear_back_weight%s dw %dx%dx%d", label, n, c, oc);
    close_scaled(what, got_w, want_w, (size_t)oc * c, 1e-5, 1e-5);
    snprintf(what, sizeof what, "linear_back_weight%s dbias %dx%dx%d", label, n, c, oc);
    close_scaled(what, got_b, want_b, (size_t)oc, 1e-5, 1e-5);
}

/* din = dout @ w, with and without GELU's derivative at pre; dw += dout^T inp, dbias += the
 * column sums of dout, twice from the same start for the same bits. */
static void test_linear_backward(void)
{
    env_t e;
    env_open(&e);
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const int n = shapes[s].n, c = shapes[s].c, oc = shapes[s].oc;
        const size_t ni = (size_t)n * c, no = (size_t)n * oc, nw = (size_t)oc * c;
        mgpu_bf16_t *hdo, *hw, *hi, *hp;
        float *fdo, *fw, *fi, *fp;
        rand16(no, 1.0f, &hdo, &fdo);
        rand16(nw, 0.1f, &hw, &fw);
        rand16(ni, 1.0f, &hi, &fi);
        rand16(ni, 2.0f, &hp, &fp);
        float *dw0 = hrand(nw, 1.0f), *db0 = hrand(oc, 1.0f);
        float *ref_din = hbuf(ni), *ref_dg = hbuf(ni), *ref_dw = hcopy(dw0, nw),
              *ref_db = hcopy(db0, oc);
        for (int i = 0; i < n; i++)
            for (int j = 0; j < c; j++) {
                double acc = 0.0;
                for (int o = 0; o < oc; o++)
                    acc += (double)fdo[(size_t)i * oc + o] * fw[(size_t)o * c + j];
                ref_din[(size_t)i * c + j] = (float)acc;
                ref_dg[(size_t)i * c + j] = dgelu1(fp[(size_t)i * c + j], (float)acc);
            }
        for (int o = 0; o < oc; o++) {
            double sb = 0.0;
            for (int i = 0; i < n; i++)
                sb += fdo[(size_t)i * oc + o];
            ref_db[o] = (float)(db0[o] + sb);
            for (int j = 0; j < c; j++) {
                double acc = 0.0;
                for (int i = 0; i < n; i++)
                    acc += (double)fdo[(size_t)i * oc + o] * fi[(size_t)i * c + j];
                ref_dw[(size_t)o * c + j] = (float)(dw0[(size_t)o * c + j] + acc);
            }
        }
        mgpu_bf16_t *ddo = dup16(&e, hdo, no), *dw = dup16(&e, hw, nw), *di = dup16(&e, hi, ni),
                    *dp = dup16(&e, hp, ni), *ddin = dup16(&e, NULL, ni);
        void *wbase, *bbase;
        float *ddw = dupd(&e, dw0, nw, 0, &wbase), *ddb = dupd(&e, db0, oc, 0, &bbase);
        char what[96];

        OK(&e, BOPS->linear_back_data(IMPL(&e), n, c, oc, ddo, dw, (size_t)c, NULL, ddin, &e.err));
        float *got = down16(&e, ddin, ni);
        snprintf(what, sizeof what, "linear_back_data %dx%dx%d", n, c, oc);
        close_scaled(what, got, ref_din, ni, 2e-3, 8e-3);
        free(got);
        OK(&e, BOPS->linear_back_data(IMPL(&e), n, c, oc, ddo, dw, (size_t)c, dp, ddin, &e.err));
        got = down16(&e, ddin, ni);
        snprintf(what, sizeof what, "linear_back_data + dgelu %dx%dx%d", n, c, oc);
        close_scaled(what, got, ref_dg, ni, 2e-3, 1e-2);
        free(got);

        OK(&e,
           BOPS->linear_back_weight(IMPL(&e), n, c, oc, ddo, di, (size_t)c, ddw, ddb, 0, &e.err));
        float *got_w = down(&e, ddw, nw), *got_b = down(&e, ddb, oc);
        check_back_weight("", n, c, oc, got_w, ref_dw, got_b, ref_db);
        /* again from the same start: the same bits */
        OK(&e, mgpu_k_copy_to_device(e.gpu, ddw, dw0, nw * sizeof(float), &e.err));
        OK(&e, mgpu_k_copy_to_device(e.gpu, ddb, db0, oc * sizeof(float), &e.err));
        OK(&e,
           BOPS->linear_back_weight(IMPL(&e), n, c, oc, ddo, di, (size_t)c, ddw, ddb, 0, &e.err));
        float *again_w = down(&e, ddw, nw), *again_b = down(&e, ddb, oc);
        if (memcmp(got_w, again_w, nw * sizeof(float)) != 0 ||
            memcmp(got_b, again_b, oc * sizeof(float)) != 0) {
            printf("  linear_back_weight %dx%dx%d: two runs differ\n", n, c, oc);
            check_failed++;
        }
        free(got_w), free(got_b), free(again_w), free(again_b);
        /* fresh: dw and dbias overwritten (NaN before) */
        {
            float *nan_w = hbuf(nw), *want_w = hbuf(nw), *want_b = hbuf(oc);
            for (size_t i = 0; i < nw; i++) {
                nan_w[i] = NAN;
                want_w[i] = (float)((double)ref_dw[i] - dw0[i]);
            }
            for (int o = 0; o < oc; o++)
                want_b[o] = (float)((double)ref_db[o] - db0[o]);
            OK(&e, mgpu_k_copy_to_device(e.gpu, ddw, nan_w, nw * sizeof(float), &e.err));
            OK(&e, mgpu_k_copy_to_device(e.gpu, ddb, nan_w, oc * sizeof(float), &e.err));
            OK(&e, BOPS->linear_back_weight(IMPL(&e), n, c, oc, ddo, di, (size_t)c, ddw, ddb, 1,
                                            &e.err));
            float *fresh_w = down(&e, ddw, nw), *fresh_b = down(&e, ddb, oc);
            check_back_weight(" fresh", n, c, oc, fresh_w, want_w, fresh_b, want_b);
            free(nan_w), free(want_w), free(want_b), free(fresh_w), free(fresh_b);
        }
        /* without a bias gradient: dbias untouched */
        OK(&e,
           BOPS->linear_back_weight(IMPL(&e), n, c, oc, ddo, di, (size_t)c, ddw, NULL, 0, &e.err));
        /* w and inp as the first c columns of rows 16 wider, the rest NaN: never read */
        {
            const size_t ld = (size_t)c + 16;
            mgpu_bf16_t *hwl = malloc(sizeof *hwl * oc * ld), *hil = malloc(sizeof *hil * n * ld);
            for (size_t i = 0; hwl != NULL && i < (size_t)oc * ld; i++)
                hwl[i] = i % ld < (size_t)c ? hw[i / ld * c + i % ld] : 0x7fc0;
            for (size_t i = 0; hil != NULL && i < (size_t)n * ld; i++)
                hil[i] = i % ld < (size_t)c ? hi[i / ld * c + i % ld] : 0x7fc0;
            mgpu_bf16_t *dwl = dup16(&e, hwl, (size_t)oc * ld),
                        *dil = dup16(&e, hil, (size_t)n * ld);
            OK(&e, BOPS->linear_back_data(IMPL(&e), n, c, oc, ddo, dwl, ld, NULL, ddin, &e.err));
            got = down16(&e, ddin, ni);
            snprintf(what, sizeof what, "linear_back_data, w's rows %zu apart, %dx%dx%d", ld, n, c,
                     oc);
            close_scaled(what, got, ref_din, ni, 2e-3, 8e-3);
            free(got);
            OK(&e, mgpu_k_copy_to_device(e.gpu, ddw, dw0, nw * sizeof(float), &e.err));
            OK(&e, mgpu_k_copy_to_device(e.gpu, ddb, db0, oc * sizeof(float), &e.err));
            OK(&e, BOPS->linear_back_weight(IMPL(&e), n, c, oc, ddo, dil, ld, ddw, ddb, 0, &e.err));
            float *lw = down(&e, ddw, nw), *lb = down(&e, ddb, oc);
            check_back_weight(" (inp's rows wider)", n, c, oc, lw, ref_dw, lb, ref_db);
            free(lw), free(lb);
            mgpu_k_free(e.gpu, dwl);
            mgpu_k_free(e.gpu, dil);
            free(hwl), free(hil);
            /* a row stride below c, or not a multiple of 8: refused */
            if (c > 8)
                CHECK_INT(BOPS->linear_back_data(IMPL(&e), n, c, oc, ddo, dw, (size_t)c - 8, NULL,
                                                 ddin, &e.err),
                          MGPU_E_RANGE);
            CHECK_INT(BOPS->linear_back_weight(IMPL(&e), n, c, oc, ddo, di, (size_t)c + 4, ddw,
                                               NULL, 0, &e.err),
                      MGPU_E_RANGE);
        }

        mgpu_bf16_t *d16[] = {ddo, dw, di, dp, ddin};
        for (size_t i = 0; i < sizeof d16 / sizeof *d16; i++)
            mgpu_k_free(e.gpu, d16[i]);
        mgpu_k_free(e.gpu, wbase);
        mgpu_k_free(e.gpu, bbase);
        free(hdo), free(hw), free(hi), free(hp), free(fdo), free(fw), free(fi), free(fp);
        free(dw0), free(db0), free(ref_din), free(ref_dg), free(ref_dw), free(ref_db);
    }
    env_close(&e);
}

/* A product large enough to be tuned (its first call times the candidates, writing D each
 * time) must leave what it accumulates into as it was: the first call (tuning, then the
 * product) and a second one from the same start give the same bits, and sampled elements
 * match a double reference. The weight gradient (beta 1) and the residual add in place. */
static void test_linear_tuning_keeps_accumulators(void)
{
    env_t e;
    env_open(&e);
    const int n = 4096, c = 768, oc = 3072; /* 2 n c oc = 19 GFLOP */
    const size_t ni = (size_t)n * c, no = (size_t)n * oc, nw = (size_t)oc * c;
    mgpu_bf16_t *hdo, *hi, *hw;
    float *fdo, *fi, *fw;
    rand16(no, 1.0f, &hdo, &fdo);
    rand16(ni, 1.0f, &hi, &fi);
    rand16(nw, 0.05f, &hw, &fw);
    float *dw0 = hrand(nw, 1.0f), *res0 = hrand(no, 1.0f);
    mgpu_bf16_t *ddo = dup16(&e, hdo, no), *di = dup16(&e, hi, ni), *dw16 = dup16(&e, hw, nw);
    void *wbase, *rbase;
    float *ddw = dupd(&e, dw0, nw, 0, &wbase), *dres = dupd(&e, res0, no, 0, &rbase);
    float *got[2][2];
    for (int r = 0; r < 2; r++) {
        OK(&e, mgpu_k_copy_to_device(e.gpu, ddw, dw0, nw * sizeof(float), &e.err));
        OK(&e, mgpu_k_copy_to_device(e.gpu, dres, res0, no * sizeof(float), &e.err));
        OK(&e,
           BOPS->linear_back_weight(IMPL(&e), n, c, oc, ddo, di, (size_t)c, ddw, NULL, 0, &e.err));
        OK(&e,
           BOPS->linear_f32(IMPL(&e), n, oc, c, ddo, dw16 /* (c, oc) */, NULL, dres, dres, &e.err));
        got[r][0] = down(&e, ddw, nw);
        got[r][1] = down(&e, dres, (size_t)n * c);
    }
    if (memcmp(got[0][0], got[1][0], nw * sizeof(float)) != 0 ||
        memcmp(got[0][1], got[1][1], (size_t)n * c * sizeof(float)) != 0) {
        printf("  the tuned first call and the second differ\n");
        check_failed++;
    }
    /* 64 sampled elements of each against double sums */
    for (int k = 0; k < 64; k++) {
        const int o = (int)((k * 2654435761u) % (unsigned)oc), j = (k * 40503) % c;
        const int i = (int)((k * 2246822519u) % (unsigned)n);
        double a = dw0[(size_t)o * c + j], b = res0[(size_t)i * c + j];
        for (int r = 0; r < n; r++)
            a += (double)fdo[(size_t)r * oc + o] * fi[(size_t)r * c + j];
        for (int q = 0; q < oc; q++)
            b += (double)fdo[(size_t)i * oc + q] * fw[(size_t)j * oc + q];
        float wa = (float)a, wb = (float)b;
        close_to("tuned weight gradient", &got[0][0][(size_t)o * c + j], &wa, 1, 2e-3, 1e-4);
        close_to("tuned residual add", &got[0][1][(size_t)i * c + j], &wb, 1, 2e-4, 1e-4);
    }
    for (int r = 0; r < 2; r++)
        free(got[r][0]), free(got[r][1]);
    mgpu_k_free(e.gpu, ddo), mgpu_k_free(e.gpu, di), mgpu_k_free(e.gpu, dw16);
    mgpu_k_free(e.gpu, wbase), mgpu_k_free(e.gpu, rbase);
    free(hdo), free(hi), free(hw), free(fdo), free(fi), free(fw), free(dw0), free(res0);
    env_close(&e);
}

/* More shapes than the backend's plan table holds (sampling runs the forward at every length
 * up to the context): plans are replaced, and every result is still right. */
static void test_linear_many_shapes(void)
{
    env_t e;
    env_open(&e);
    const int c = 16, oc = 8, max_n = 150;
    mgpu_bf16_t *hi, *hw;
    float *fi, *fw;
    rand16((size_t)max_n * c, 1.0f, &hi, &fi);
    rand16((size_t)oc * c, 0.5f, &hw, &fw);
    mgpu_bf16_t *di = dup16(&e, hi, (size_t)max_n * c), *dw = dup16(&e, hw, (size_t)oc * c);
    void *obase;
    float *dout = dpoison(&e, (size_t)max_n * oc, 0, &obase), *ref = hbuf((size_t)max_n * oc);
    for (int i = 0; i < max_n; i++)
        for (int o = 0; o < oc; o++) {
            double acc = 0.0;
            for (int j = 0; j < c; j++)
                acc += (double)fi[(size_t)i * c + j] * fw[(size_t)o * c + j];
            ref[(size_t)i * oc + o] = (float)acc;
        }
    for (int n = 1; n <= max_n && check_failed == 0; n++) {
        OK(&e, BOPS->linear_f32(IMPL(&e), n, c, oc, di, dw, NULL, NULL, dout, &e.err));
        close_to_dev(&e, dout, ref, (size_t)n * oc, 1e-5, 1e-5, "linear_f32 of %d rows", n);
    }
    mgpu_k_free(e.gpu, di);
    mgpu_k_free(e.gpu, dw);
    mgpu_k_free(e.gpu, obase);
    free(hi), free(hw), free(fi), free(fw), free(ref);
    env_close(&e);
}

/* Widths that are not a multiple of 8 are refused with a message naming them. */
static void test_linear_refuses_unaligned_widths(void)
{
    env_t e;
    env_open(&e);
    mgpu_bf16_t *d = dup16(&e, NULL, 64);
    int rc = BOPS->linear(IMPL(&e), 2, 12, 8, d, d, NULL, d, NULL, &e.err);
    CHECK(rc < 0);
    CHECK(strstr(e.err.msg, "c 12") != NULL);
    e.err.msg[0] = '\0';
    mgpu_k_free(e.gpu, d);
    env_close(&e);
}

int main(void)
{
    RUN(test_linear_forward);
    RUN(test_linear_backward);
    RUN(test_linear_tuning_keeps_accumulators);
    RUN(test_linear_many_shapes);
    RUN(test_linear_refuses_unaligned_widths);
    return check_done();
}
