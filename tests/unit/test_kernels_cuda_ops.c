/* test_kernels_cuda_ops.c - elementwise.cu, reduce.cu, xent.cu and optimizers.cu against
 * their references (elementwise.c, reduce.c, xent.c, optimizers.c).
 *
 * Every op against the plain-C reference, both called through kernels.h on the same random
 * inputs of awkward sizes, on 16-byte aligned buffers (the float4 paths) and on buffers one
 * float off (the scalar paths); GPU outputs are poisoned with NaN before each op so an element
 * the kernel forgot to write fails. Skips without CUDA or a CUDA device; run it on a GPU
 * machine. */
#include "kernels_check.h" /* env_t, buffers, close_to */

/* --- activations ------------------------------------------------------------------------------ */

/* Transcendentals differ by a few ulp between glibc and CUDA's libdevice. */
#define ACT_ATOL 2e-6
#define ACT_RTOL 1e-5

static const size_t ew_sizes[] = {1, 3, 127, 1000, 4099, (1u << 20) + 3};

static void test_act_forward(void)
{
    env_t e;
    env_open(&e);
    for (int act = 0; act < MGPU_ACT_COUNT; act++)
        for (size_t s = 0; s < sizeof ew_sizes / sizeof *ew_sizes; s++)
            for (size_t off = 0; off < 2; off++) {
                size_t n = ew_sizes[s];
                void *bx, *by;
                float *x = hrand(n, 6.0f), *want = hbuf(n);
                float *dx = dupd(&e, x, n, off, &bx), *dy = dpoison(&e, n, off, &by);
                OK(&e, mgpu_k_act_forward(e.cpu, act, n, x, want, &e.err));
                OK(&e, mgpu_k_act_forward(e.gpu, act, n, dx, dy, &e.err));
                float *got = down(&e, dy, n);
                char what[96];
                snprintf(what, sizeof what, "act_forward %s n=%zu off=%zu", mgpu_act_name(act), n,
                         off);
                close_to(what, got, want, n, ACT_ATOL, ACT_RTOL);
                free(got);
                /* In place: y == x. */
                OK(&e, mgpu_k_act_forward(e.gpu, act, n, dx, dx, &e.err));
                got = down(&e, dx, n);
                close_to(what, got, want, n, ACT_ATOL, ACT_RTOL);
                free(got);
                free(x);
                free(want);
                mgpu_k_free(e.gpu, bx);
                mgpu_k_free(e.gpu, by);
            }
    env_close(&e);
}

static void test_bias_act_forward(void)
{
    static const int shapes[][2] = {{1, 1}, {3, 5}, {127, 33}, {7, 128}, {1000, 4099}, {4099, 4}};
    env_t e;
    env_open(&e);
    for (int act = 0; act < MGPU_ACT_COUNT; act++)
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
            for (int variant = 0; variant < 3; variant++) {
                /* 0: aligned with bias; 1: one float off with bias; 2: no bias. */
                int rows = shapes[s][0], cols = shapes[s][1];
                size_t n = (size_t)rows * cols, off = variant == 1;
                int has_bias = variant != 2;
                void *bz, *bb = NULL, *by;
                float *z = hrand(n, 4.0f), *bias = hrand(cols, 1.0f), *y = hbuf(n);
                float *dz = dupd(&e, z, n, off, &bz), *dy = dpoison(&e, n, off, &by);
                float *dbias = has_bias ? dupd(&e, bias, cols, off, &bb) : NULL;
                OK(&e, mgpu_k_bias_act_forward(e.cpu, act, rows, cols, z, has_bias ? bias : NULL, y,
                                               &e.err));
                OK(&e, mgpu_k_bias_act_forward(e.gpu, act, rows, cols, dz, dbias, dy, &e.err));
                float *gz = down(&e, dz, n), *gy = down(&e, dy, n);
                char what[112];
                snprintf(what, sizeof what, "bias_act_forward %s %dx%d variant %d z",
                         mgpu_act_name(act), rows, cols, variant);
                close_to(what, gz, z, n, 0.0, 0.0); /* one fp32 add: exact */
                what[strlen(what) - 1] = 'y';
                close_to(what, gy, y, n, ACT_ATOL, ACT_RTOL);
                free(gz);
                free(gy);
                if (act == MGPU_ACT_IDENTITY && has_bias) {
                    /* y == z is allowed for identity: z gets the bias once, in place. */
                    float *z2 = hrand(n, 4.0f), *w = hcopy(z2, n);
                    OK(&e, mgpu_k_copy_to_device(e.gpu, dz, z2, n * sizeof(float), &e.err));
                    OK(&e, mgpu_k_bias_act_forward(e.cpu, act, rows, cols, w, bias, w, &e.err));
                    OK(&e, mgpu_k_bias_act_forward(e.gpu, act, rows, cols, dz, dbias, dz, &e.err));
                    gz = down(&e, dz, n);
                    close_to("bias_act_forward identity in place", gz, w, n, 0.0, 0.0);
                    free(gz);
                    free(z2);
                    free(w);
                }
                free(z);
                free(bias);
                free(y);
                mgpu_k_free(e.gpu, bz);
                mgpu_k_free(e.gpu, bb);
                mgpu_k_free(e.gpu, by);
            }
    env_close(&e);
}

static void test_act_backward(void)
{
    env_t e;
    env_open(&e);
    for (int act = 0; act < MGPU_ACT_COUNT; act++)
        for (size_t s = 0; s < sizeof ew_sizes / sizeof *ew_sizes; s++)
            for (size_t off = 0; off < 2; off++) {
                size_t n = ew_sizes[s];
                void *bz, *by, *bdy, *bdz;
                float *z = hrand(n, 6.0f), *y = hbuf(n), *dy = hrand(n, 1.0f), *want = hbuf(n);
                OK(&e, mgpu_k_act_forward(e.cpu, act, n, z, y, &e.err));
                OK(&e, mgpu_k_act_backward(e.cpu, act, n, z, y, dy, want, &e.err));
                float *dz_ = dupd(&e, z, n, off, &bz), *dy_ = dupd(&e, y, n, off, &by);
                float *ddy = dupd(&e, dy, n, off, &bdy), *ddz = dpoison(&e, n, off, &bdz);
                OK(&e, mgpu_k_act_backward(e.gpu, act, n, dz_, dy_, ddy, ddz, &e.err));
                float *got = down(&e, ddz, n);
                char what[96];
                snprintf(what, sizeof what, "act_backward %s n=%zu off=%zu", mgpu_act_name(act), n,
                         off);
                close_to(what, got, want, n, ACT_ATOL, ACT_RTOL);
                free(got);
                /* In place: dz == dy. */
                OK(&e, mgpu_k_act_backward(e.gpu, act, n, dz_, dy_, ddy, ddy, &e.err));
                got = down(&e, ddy, n);
                close_to(what, got, want, n, ACT_ATOL, ACT_RTOL);
                free(got);
                free(z);
                free(y);
                free(dy);
                free(want);
                mgpu_k_free(e.gpu, bz);
                mgpu_k_free(e.gpu, by);
                mgpu_k_free(e.gpu, bdy);
                mgpu_k_free(e.gpu, bdz);
            }
    env_close(&e);
}

/* --- reductions and losses ---------------------------------------------------------------------
 */

static void test_sum_rows(void)
{
    static const int shapes[][2] = {{1, 1},    {3, 5},      {127, 33}, {1000, 257},
                                    {4099, 3}, {8192, 130}, {0, 5},    {2, 4099}};
    env_t e;
    env_open(&e);
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int with_beta = 0; with_beta < 2; with_beta++) {
            int rows = shapes[s][0], cols = shapes[s][1];
            size_t n = (size_t)rows * cols;
            float beta = with_beta ? 0.5f : 0.0f;
            void *bx, *bo;
            float *x = hrand(n, 1.0f), *out = hrand(cols, 1.0f);
            float *dx = dupd(&e, x, n, 0, &bx);
            float *dout = with_beta ? dupd(&e, out, cols, 0, &bo) : dpoison(&e, cols, 0, &bo);
            OK(&e, mgpu_k_sum_rows(e.cpu, rows, cols, x, beta, out, &e.err));
            OK(&e, mgpu_k_sum_rows(e.gpu, rows, cols, dx, beta, dout, &e.err));
            float *got = down(&e, dout, cols);
            char what[80];
            snprintf(what, sizeof what, "sum_rows %dx%d beta=%g", rows, cols, beta);
            /* fp32 partial sums against the reference's double: error ~ eps * sqrt(rows). */
            close_to(what, got, out, cols, 1e-6 * (sqrt((double)rows) + 1.0), 1e-6);
            free(got);
            free(x);
            free(out);
            mgpu_k_free(e.gpu, bx);
            mgpu_k_free(e.gpu, bo);
        }
    env_close(&e);
}

static void test_softmax_xent(void)
{
    /* Every path: 1, 2, 4 or 8 lanes per row for rows of up to 4, 8, 16, 32 (one and two rows
     * a lane group: many rows), a warp per row with 2..32 values per lane (up to 64, 128, 256,
     * 512, 1024), a block per row with 8, 16, 32 values per thread (up to 8192), a cluster of
     * 1, 2, 4 or 8 blocks with 16 or 32 values per thread (up to 65536; staged through shared
     * memory when the rows are a multiple of 4 floats: 10000, 32768, 20000 with more rows than
     * clusters; not for 8193, 16385, 20001), and the two-pass kernel for wider rows. */
    static const int shapes[][2] = {
        {1, 1},       {3, 5},     {127, 10},  {4099, 3},  {140000, 3}, {1000, 7},    {999, 13},
        {20000, 32},  {77, 50},   {9, 100},   {65, 200},  {31, 300},   {1000, 1000}, {5, 1025},
        {33, 4099},   {2, 8192},  {1, 8193},  {3, 10000}, {5, 16385},  {3, 32768},   {300, 20000},
        {200, 20001}, {4, 40000}, {2, 65536}, {2, 70000}};
    env_t e;
    env_open(&e);
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int variant = 0; variant < 3; variant++) {
            /* 0: separate dlogits; 1: no dlogits; 2: dlogits == logits. Logits up to +-20
             * so the max subtraction matters. */
            int rows = shapes[s][0], cols = shapes[s][1];
            size_t n = (size_t)rows * cols;
            void *bl, *blab, *bloss, *bd = NULL;
            float *l = hrand(n, 20.0f), *dl = hbuf(n), loss = 0.0f;
            int32_t *lab = malloc(sizeof(int32_t) * rows);
            for (int r = 0; r < rows; r++)
                lab[r] = (int32_t)((frand() * 0.5f + 0.5f) * cols) % cols;
            OK(&e, mgpu_k_softmax_xent(e.cpu, rows, cols, l, lab, &loss, dl, &e.err));
            float *dlog = dupd(&e, l, n, 0, &bl), *dloss = dpoison(&e, 1, 0, &bloss);
            int32_t *dlab = (int32_t *)dalloc(&e, rows, 0, &blab);
            OK(&e, mgpu_k_copy_to_device(e.gpu, dlab, lab, sizeof(int32_t) * rows, &e.err));
            float *ddl = variant == 0 ? dpoison(&e, n, 0, &bd) : variant == 2 ? dlog : NULL;
            OK(&e, mgpu_k_softmax_xent(e.gpu, rows, cols, dlog, dlab, dloss, ddl, &e.err));
            float *gl = down(&e, dloss, 1);
            char what[80];
            snprintf(what, sizeof what, "softmax_xent %dx%d variant %d loss", rows, cols, variant);
            close_to(what, gl, &loss, 1, 1e-5, 1e-5);
            if (ddl != NULL) {
                float *gd = down(&e, ddl, n);
                snprintf(what, sizeof what, "softmax_xent %dx%d variant %d dlogits", rows, cols,
                         variant);
                /* The float log-sum-exp (|lse| <= ~25) is off by up to ~2e-6, which moves every
                 * probability by that much relative: up to ~3e-6 / rows where p is near 1. */
                close_to(what, gd, dl, n, 5e-6 / rows, 2e-5);
                free(gd);
            }
            free(gl);
            free(l);
            free(dl);
            free(lab);
            mgpu_k_free(e.gpu, bl);
            mgpu_k_free(e.gpu, blab);
            mgpu_k_free(e.gpu, bloss);
            mgpu_k_free(e.gpu, bd);
        }
    env_close(&e);
}

/* The GPU cannot report a bad label without a sync: that row's loss and gradient are NaN. */
static void test_softmax_xent_bad_label_is_nan(void)
{
    env_t e;
    env_open(&e);
    float l[6] = {1, 2, 3, 4, 5, 6};
    int32_t lab[2] = {1, 3}; /* 3 is out of range for 3 classes */
    void *bl, *blab, *bloss;
    float *dl = dupd(&e, l, 6, 0, &bl), *dloss = dalloc(&e, 1, 0, &bloss);
    int32_t *dlab = (int32_t *)dalloc(&e, 2, 0, &blab);
    OK(&e, mgpu_k_copy_to_device(e.gpu, dlab, lab, sizeof lab, &e.err));
    OK(&e, mgpu_k_softmax_xent(e.gpu, 2, 3, dl, dlab, dloss, dl, &e.err));
    float *loss = down(&e, dloss, 1), *grad = down(&e, dl, 6);
    CHECK(isnan(loss[0]));
    CHECK(!isnan(grad[0]) && !isnan(grad[2]));
    CHECK(isnan(grad[3]) && isnan(grad[5]));
    free(loss);
    free(grad);
    mgpu_k_free(e.gpu, bl);
    mgpu_k_free(e.gpu, blab);
    mgpu_k_free(e.gpu, bloss);
    env_close(&e);
}

static void test_mse(void)
{
    static const int shapes[][2] = {{1, 1}, {3, 5}, {127, 1}, {1000, 2}, {4099, 7}, {1024, 1025}};
    env_t e;
    env_open(&e);
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int variant = 0; variant < 3; variant++) {
            /* 0: aligned with dpred; 1: one float off with dpred; 2: no dpred. */
            int rows = shapes[s][0], cols = shapes[s][1];
            size_t n = (size_t)rows * cols, off = variant == 1;
            void *bp, *bt, *bloss, *bd = NULL;
            float *p = hrand(n, 3.0f), *t = hrand(n, 3.0f), *dp = hbuf(n), loss = 0.0f;
            OK(&e, mgpu_k_mse(e.cpu, rows, cols, p, t, &loss, dp, &e.err));
            float *gp = dupd(&e, p, n, off, &bp), *gt = dupd(&e, t, n, off, &bt);
            float *gloss = dpoison(&e, 1, 0, &bloss);
            float *gd = variant == 2 ? NULL : dpoison(&e, n, off, &bd);
            OK(&e, mgpu_k_mse(e.gpu, rows, cols, gp, gt, gloss, gd, &e.err));
            float *hl = down(&e, gloss, 1);
            char what[80];
            snprintf(what, sizeof what, "mse %dx%d variant %d loss", rows, cols, variant);
            close_to(what, hl, &loss, 1, 0.0, 1e-5);
            if (gd != NULL) {
                float *hd = down(&e, gd, n);
                snprintf(what, sizeof what, "mse %dx%d variant %d dpred", rows, cols, variant);
                close_to(what, hd, dp, n, 0.0, 1e-6);
                free(hd);
            }
            free(hl);
            free(p);
            free(t);
            free(dp);
            mgpu_k_free(e.gpu, bp);
            mgpu_k_free(e.gpu, bt);
            mgpu_k_free(e.gpu, bloss);
            mgpu_k_free(e.gpu, bd);
        }
    env_close(&e);
}

static void test_scale_and_sum(void)
{
    static const size_t sizes[] = {0, 1, 3, 127, 1000, 4099, (1u << 22) + 3};
    env_t e;
    env_open(&e);
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
        for (size_t off = 0; off < 2; off++) {
            size_t n = sizes[s];
            void *bx, *bs;
            float *x = hrand(n, 1.0f), sum = 0.0f;
            float *dx = dupd(&e, x, n, off, &bx), *ds = dpoison(&e, 1, 0, &bs);
            double abs_sum = 0.0;
            for (size_t i = 0; i < n; i++)
                abs_sum += fabs(x[i]);
            OK(&e, mgpu_k_sum(e.cpu, n, x, &sum, &e.err));
            OK(&e, mgpu_k_sum(e.gpu, n, dx, ds, &e.err));
            float *got = down(&e, ds, 1);
            char what[64];
            snprintf(what, sizeof what, "sum n=%zu off=%zu", n, off);
            /* Float partials against double: bounded by a few eps of the sum of |x|. */
            close_to(what, got, &sum, 1, 1e-6 * abs_sum + 1e-7, 0.0);
            free(got);
            if (n > 0) {
                OK(&e, mgpu_k_scale(e.cpu, n, -0.375f, x, &e.err));
                OK(&e, mgpu_k_scale(e.gpu, n, -0.375f, dx, &e.err));
                got = down(&e, dx, n);
                snprintf(what, sizeof what, "scale n=%zu off=%zu", n, off);
                close_to(what, got, x, n, 0.0, 0.0);
                free(got);
            }
            free(x);
            mgpu_k_free(e.gpu, bx);
            mgpu_k_free(e.gpu, bs);
        }
    env_close(&e);
}

static void test_argmax_and_count_correct(void)
{
    static const int shapes[][2] = {{1, 1},     {3, 5},     {127, 10}, {1000, 1000},
                                    {17, 4099}, {4099, 33}, {0, 4}};
    env_t e;
    env_open(&e);
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int ties = 0; ties < 2; ties++) {
            int rows = shapes[s][0], cols = shapes[s][1];
            size_t n = (size_t)rows * cols;
            /* ties: values from {-2, -1, 0, 1}, so most rows hold their maximum more than once
             * and only "the first index" decides. */
            float *x = hrand(n, 2.0f);
            if (ties)
                for (size_t i = 0; i < n; i++)
                    x[i] = floorf(x[i]);
            int32_t *lab = malloc(sizeof(int32_t) * (rows + 1)),
                    *want = malloc(sizeof(int32_t) * (rows + 1));
            for (int r = 0; r < rows; r++)
                lab[r] = (int32_t)((frand() * 0.5f + 0.5f) * cols) % cols;
            float count = -1.0f;
            void *bx, *blab, *bout, *bc;
            float *dx = dupd(&e, x, n, 0, &bx);
            int32_t *dlab = (int32_t *)dalloc(&e, rows, 0, &blab);
            int32_t *dout = (int32_t *)dalloc(&e, rows, 0, &bout);
            float *dcount = dpoison(&e, 1, 0, &bc);
            OK(&e, mgpu_k_copy_to_device(e.gpu, dlab, lab, sizeof(int32_t) * rows, &e.err));
            OK(&e, mgpu_k_argmax_rows(e.cpu, rows, cols, x, want, &e.err));
            OK(&e, mgpu_k_count_correct(e.cpu, rows, cols, x, lab, &count, &e.err));
            OK(&e, mgpu_k_argmax_rows(e.gpu, rows, cols, dx, dout, &e.err));
            OK(&e, mgpu_k_count_correct(e.gpu, rows, cols, dx, dlab, dcount, &e.err));
            if (rows > 0) {
                int32_t *got = malloc(sizeof(int32_t) * rows);
                OK(&e, mgpu_k_copy_to_host(e.gpu, got, dout, sizeof(int32_t) * rows, &e.err));
                int bad = 0;
                for (int r = 0; r < rows; r++)
                    if (got[r] != want[r] && bad++ < 5)
                        printf("  argmax_rows %dx%d ties=%d: row %d = %d, expected %d\n", rows,
                               cols, ties, r, got[r], want[r]);
                CHECK_INT(bad, 0);
                free(got);
            }
            float *gc = down(&e, dcount, 1);
            char what[80];
            snprintf(what, sizeof what, "count_correct %dx%d ties=%d", rows, cols, ties);
            close_to(what, gc, &count, 1, 0.0, 0.0);
            free(gc);
            free(x);
            free(lab);
            free(want);
            mgpu_k_free(e.gpu, bx);
            mgpu_k_free(e.gpu, blab);
            mgpu_k_free(e.gpu, bout);
            mgpu_k_free(e.gpu, bc);
        }
    env_close(&e);
}

/* --- optimizers ------------------------------------------------------------------------------ */

/* FMA contraction on the GPU and separate rounding on the CPU differ by an ulp or so a step. */
#define OPT_ATOL 1e-6
#define OPT_RTOL 1e-5

static void test_sgd(void)
{
    static const mgpu_sgd_hparams_t hps[] = {
        {.lr = 0.1f, .momentum = 0.0f, .dampening = 0.0f, .weight_decay = 0.01f, .nesterov = 0},
        {.lr = 0.05f, .momentum = 0.9f, .dampening = 0.1f, .weight_decay = 0.0f, .nesterov = 0},
        {.lr = 0.05f, .momentum = 0.9f, .dampening = 0.0f, .weight_decay = 1e-3f, .nesterov = 1},
    };
    static const size_t sizes[] = {1, 3, 127, 4099, (1u << 20) + 1};
    env_t e;
    env_open(&e);
    for (size_t h = 0; h < sizeof hps / sizeof *hps; h++)
        for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
            for (size_t off = 0; off < 2; off++) {
                size_t n = sizes[s];
                void *bp, *bg, *bb;
                float *p = hrand(n, 1.0f), *buf = hbuf(n);
                float *dp = dupd(&e, p, n, off, &bp), *dg = dalloc(&e, n, off, &bg);
                /* The first step must not read the buffer: NaN there must not leak. */
                float *dbuf = dpoison(&e, n, off, &bb);
                for (long long step = 1; step <= 3; step++) {
                    float *g = hrand(n, 1.0f);
                    OK(&e, mgpu_k_copy_to_device(e.gpu, dg, g, n * sizeof(float), &e.err));
                    OK(&e, mgpu_k_sgd_step(e.cpu, n, p, g, buf, &hps[h], step, &e.err));
                    OK(&e, mgpu_k_sgd_step(e.gpu, n, dp, dg, dbuf, &hps[h], step, &e.err));
                    free(g);
                }
                float *gp = down(&e, dp, n);
                char what[80];
                snprintf(what, sizeof what, "sgd hp%zu n=%zu off=%zu p", h, n, off);
                close_to(what, gp, p, n, OPT_ATOL, OPT_RTOL);
                if (hps[h].momentum != 0.0f) {
                    float *gb = down(&e, dbuf, n);
                    what[strlen(what) - 1] = 'b';
                    close_to(what, gb, buf, n, OPT_ATOL, OPT_RTOL);
                    free(gb);
                }
                free(gp);
                free(p);
                free(buf);
                mgpu_k_free(e.gpu, bp);
                mgpu_k_free(e.gpu, bg);
                mgpu_k_free(e.gpu, bb);
            }
    env_close(&e);
}

static void test_adamw(void)
{
    static const mgpu_adamw_hparams_t hp = {
        .lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f};
    static const size_t sizes[] = {1, 3, 127, 4099, (1u << 20) + 1};
    env_t e;
    env_open(&e);
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
        for (size_t off = 0; off < 2; off++) {
            size_t n = sizes[s];
            void *bp, *bg, *bm, *bv;
            float *p = hrand(n, 1.0f), *m = hbuf(n), *v = hbuf(n);
            for (size_t i = 0; i < n; i++)
                m[i] = v[i] = 0.0f;
            float *dp = dupd(&e, p, n, off, &bp), *dg = dalloc(&e, n, off, &bg);
            float *dm = dupd(&e, m, n, off, &bm), *dv = dupd(&e, v, n, off, &bv);
            for (long long step = 1; step <= 3; step++) {
                float *g = hrand(n, 1.0f);
                OK(&e, mgpu_k_copy_to_device(e.gpu, dg, g, n * sizeof(float), &e.err));
                OK(&e, mgpu_k_adamw_step(e.cpu, n, p, g, m, v, &hp, step, &e.err));
                OK(&e, mgpu_k_adamw_step(e.gpu, n, dp, dg, dm, dv, &hp, step, &e.err));
                free(g);
            }
            float *gp = down(&e, dp, n), *gm = down(&e, dm, n), *gv = down(&e, dv, n);
            char what[80];
            snprintf(what, sizeof what, "adamw n=%zu off=%zu p", n, off);
            close_to(what, gp, p, n, OPT_ATOL, OPT_RTOL);
            what[strlen(what) - 1] = 'm';
            close_to(what, gm, m, n, OPT_ATOL, OPT_RTOL);
            what[strlen(what) - 1] = 'v';
            close_to(what, gv, v, n, OPT_ATOL, OPT_RTOL);
            free(gp);
            free(gm);
            free(gv);
            free(p);
            free(m);
            free(v);
            mgpu_k_free(e.gpu, bp);
            mgpu_k_free(e.gpu, bg);
            mgpu_k_free(e.gpu, bm);
            mgpu_k_free(e.gpu, bv);
        }
    env_close(&e);
}

int main(void)
{
    RUN(test_act_forward);
    RUN(test_bias_act_forward);
    RUN(test_act_backward);
    RUN(test_sum_rows);
    RUN(test_softmax_xent);
    RUN(test_softmax_xent_bad_label_is_nan);
    RUN(test_mse);
    RUN(test_scale_and_sum);
    RUN(test_argmax_and_count_correct);
    RUN(test_sgd);
    RUN(test_adamw);
    return check_done();
}
