/* test_kernels_cuda_head.c - head.cu: the fused output layer and its loss (linear_loss)
 * against kernels.c's composition on the CPU backend.
 *
 * Every op against the plain-C reference, both called through kernels.h on the same random
 * inputs of awkward sizes, on 16-byte aligned buffers (the float4 paths) and on buffers one
 * float off (the scalar paths); GPU outputs are poisoned with NaN before each op so an element
 * the kernel forgot to write fails. Skips without CUDA or a CUDA device; run it on a GPU
 * machine. */
#include "kernels_check.h" /* env_t, buffers, close_to */

/* mgpu_k_linear_loss: the CUDA backend's one-kernel output layer (and, for outputs wider than a
 * warp, its composition) against the CPU's composition
 * of the same ops. The input x is act_in of a random z_in, as the layer below leaves it. */
static void linear_loss_case(env_t *e, mgpu_precision_t prec, mgpu_loss_t loss, mgpu_act_t act,
                             int rows, int out, int in, int with_dx, int with_bias)
{
    static const double elem_tol[] = {1e-5, 3e-3, 2e-2};
    const size_t nx = (size_t)rows * in, ny = (size_t)rows * out;
    char what[200];
    void *b[16];
    int nb = 0;
    float *z = hrand(nx, 2.0f), *x = hbuf(nx), *w = hrand((size_t)out * in, 0.5f),
          *bias = hrand((size_t)out, 0.5f), *tg = hrand(ny, 1.0f);
    int32_t *lab = malloc(sizeof(int32_t) * (size_t)rows);
    for (int r = 0; r < rows; r++)
        lab[r] = (int32_t)((unsigned)((frand() + 1.0f) * 0.5f * (float)out) % (unsigned)out);
    OK(e, mgpu_k_act_forward(e->cpu, act, nx, z, x, &e->err));
    OK(e, mgpu_kernels_set_precision(e->gpu, prec, &e->err));
    void *lab_base = NULL;
    OK(e, mgpu_k_alloc(e->gpu, sizeof(int32_t) * (size_t)rows, &lab_base, &e->err));
    OK(e, mgpu_k_copy_to_device(e->gpu, lab_base, lab, sizeof(int32_t) * (size_t)rows, &e->err));
    mgpu_k_head_t g = {.loss = loss, .rows = rows, .out = out, .in = in, .act_in = act};
    g.x = dupd(e, x, nx, 0, &b[nb++]);
    g.w = dupd(e, w, (size_t)out * in, 0, &b[nb++]);
    g.bias = with_bias ? dupd(e, bias, (size_t)out, 0, &b[nb++]) : NULL;
    g.y = dpoison(e, ny, 0, &b[nb++]);
    g.labels = lab_base;
    g.targets = dupd(e, tg, ny, 0, &b[nb++]);
    g.loss_out = dpoison(e, 1, 0, &b[nb++]);
    g.dy = dpoison(e, ny, 0, &b[nb++]);
    g.z_in = dupd(e, z, nx, 0, &b[nb++]);
    g.dx = with_dx ? dpoison(e, nx, 0, &b[nb++]) : NULL;
    g.dbias_in = with_dx > 1 ? dpoison(e, (size_t)in, 0, &b[nb++]) : NULL;
    mgpu_k_head_t c = g;
    c.x = x, c.w = w, c.bias = with_bias ? bias : NULL, c.labels = lab, c.targets = tg, c.z_in = z;
    c.y = hbuf(ny), c.loss_out = hbuf(1), c.dy = hbuf(ny);
    c.dx = with_dx ? hbuf(nx) : NULL;
    c.dbias_in = with_dx > 1 ? hbuf((size_t)in) : NULL;
    OK(e, mgpu_k_linear_loss(e->cpu, &c, &e->err));
    /* The one-kernel version leaves the bias gradient below to the caller, and says so. */
    const int grc = mgpu_k_linear_loss(e->gpu, &g, &e->err);
    const int fused = prec != MGPU_PREC_BF16 && out <= 32;
    CHECK_INT(grc, fused && with_dx > 1 ? MGPU_K_BIAS_LEFT : 0);

    /* The kernel multiplies in fp32 whatever the precision; its composition uses the GEMMs. */
    const double et = elem_tol[fused ? 0 : prec];
    snprintf(what, sizeof what, "linear_loss %s %s act_in %s %dx%d->%d%s%s", mgpu_loss_name_k(loss),
             mgpu_precision_name(prec), mgpu_act_name(act), rows, in, out,
             with_bias ? "" : " no bias", with_dx ? (with_dx > 1 ? " dx db" : " dx") : "");
    const double ty = et * (sqrt((double)in) + 1.0) * 4.0;
    close_to_dev(e, g.y, c.y, ny, ty, 1e-4, "%s: y", what);
    close_to_dev(e, g.loss_out, c.loss_out, 1, ty, 1e-4, "%s: loss", what);
    close_to_dev(e, g.dy, c.dy, ny, ty / rows, 1e-3, "%s: dy", what);
    if (with_dx)
        close_to_dev(e, g.dx, c.dx, nx,
                     et * (sqrt((double)in) + sqrt((double)out) + 1.0) * 8.0 / rows, 1e-3, "%s: dx",
                     what);
    if (with_dx > 1) {
        float *got = down(e, g.dbias_in, (size_t)in);
        if (grc == MGPU_K_BIAS_LEFT) {
            size_t written = 0;
            for (int i = 0; i < in; i++)
                written += !isnan(got[i]);
            if (written) {
                printf("  %s: dbias_in left to the caller, yet %zu of %d written\n", what, written,
                       in);
                check_failed++;
            }
        } else {
            double tb =
                et * (sqrt((double)in) + sqrt((double)out) + 1.0) * 8.0 / sqrt((double)rows);
            char part[240];
            snprintf(part, sizeof part, "%s: dbias_in", what);
            close_to(part, got, c.dbias_in, (size_t)in, tb, 1e-3);
        }
        free(got);
    }
    /* Again: the same bits (the loss's partial sums are added in a fixed order). */
    float *loss1 = down(e, g.loss_out, 1);
    CHECK_INT(mgpu_k_linear_loss(e->gpu, &g, &e->err), grc);
    float *loss2 = down(e, g.loss_out, 1);
    if (memcmp(loss1, loss2, sizeof(float)) != 0) {
        printf("  %s: a second run differs (loss %.9g then %.9g)\n", what, loss1[0], loss2[0]);
        check_failed++;
    }
    free(loss1), free(loss2);
    free(z), free(x), free(w), free(bias), free(tg), free(lab);
    free(c.y), free(c.loss_out), free(c.dy), free(c.dx), free(c.dbias_in);
    for (int i = 0; i < nb; i++)
        mgpu_k_free(e->gpu, b[i]);
    mgpu_k_free(e->gpu, lab_base);
}

static void test_linear_loss(void)
{
    /* rows, out, in: the article's MLP head, one row, a partial block, more rows than warps
     * in the grid, one output, a full warp of outputs, a composed one (33 outputs), a wide
     * input. */
    static const int shapes[][3] = {{256, 10, 256}, {1, 3, 5},       {9, 2, 37},   {3000, 7, 130},
                                    {70, 1, 64},    {129, 32, 1024}, {40, 33, 20}, {20, 4, 3000}};
    env_t e;
    env_open(&e);
    for (int p = 0; p < 2; p++)
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
            for (int l = 0; l < 2; l++) {
                const int *sh = shapes[s];
                if (l == MGPU_LOSS_CROSS_ENTROPY && sh[1] < 2)
                    continue;
                linear_loss_case(&e, (mgpu_precision_t)p, (mgpu_loss_t)l, MGPU_ACT_RELU, sh[0],
                                 sh[1], sh[2], 2, 1);
                linear_loss_case(&e, (mgpu_precision_t)p, (mgpu_loss_t)l,
                                 (mgpu_act_t)(s % MGPU_ACT_COUNT), sh[0], sh[1], sh[2],
                                 (int)(s % 3), (int)(s % 2));
            }
    /* bf16 composes it. */
    linear_loss_case(&e, MGPU_PREC_BF16, MGPU_LOSS_CROSS_ENTROPY, MGPU_ACT_RELU, 256, 10, 256, 2,
                     1);
    env_close(&e);
}

/* A label out of range: the kernel's loss is NaN, as softmax_xent's (the CPU refuses it). */
static void test_linear_loss_bad_label_is_nan(void)
{
    env_t e;
    env_open(&e);
    OK(&e, mgpu_kernels_set_precision(e.gpu, MGPU_PREC_FP32, &e.err));
    const int rows = 40, out = 10, in = 16;
    void *b[8];
    int nb = 0;
    float *x = hrand((size_t)rows * in, 1.0f), *w = hrand((size_t)out * in, 1.0f);
    int32_t lab[40];
    for (int r = 0; r < rows; r++)
        lab[r] = r % out;
    lab[17] = out; /* one past the last class */
    mgpu_k_head_t g = {.loss = MGPU_LOSS_CROSS_ENTROPY, .rows = rows, .out = out, .in = in};
    g.x = dupd(&e, x, (size_t)rows * in, 0, &b[nb++]);
    g.w = dupd(&e, w, (size_t)out * in, 0, &b[nb++]);
    g.y = dpoison(&e, (size_t)rows * out, 0, &b[nb++]);
    g.dy = dpoison(&e, (size_t)rows * out, 0, &b[nb++]);
    g.loss_out = dpoison(&e, 1, 0, &b[nb++]);
    void *dl = NULL;
    OK(&e, mgpu_k_alloc(e.gpu, sizeof lab, &dl, &e.err));
    b[nb++] = dl;
    OK(&e, mgpu_k_copy_to_device(e.gpu, dl, lab, sizeof lab, &e.err));
    g.labels = dl;
    OK(&e, mgpu_k_linear_loss(e.gpu, &g, &e.err));
    float *loss = down(&e, g.loss_out, 1), *dy = down(&e, g.dy, (size_t)rows * out);
    CHECK(isnan(loss[0]));
    CHECK(isnan(dy[17 * out]) && !isnan(dy[16 * out]));
    free(loss), free(dy), free(x), free(w);
    for (int i = 0; i < nb; i++)
        mgpu_k_free(e.gpu, b[i]);
    env_close(&e);
}

int main(void)
{
    RUN(test_linear_loss);
    RUN(test_linear_loss_bad_label_is_nan);
    return check_done();
}
