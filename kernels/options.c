/* options.c - the kernels' MGPU_* knobs (options.h), read in one place. */
#include "options.h"

#include <stdlib.h> /* getenv, strtol */
#include <string.h> /* strcmp */

/* The switches keep the rule they always had: a value that starts with '0' turns the default
 * off (MGPU_LT_VERBOSE: one that starts with '1' turns it on); anything else leaves it. */
static bool starts_with(const char *name, char c)
{
    const char *e = getenv(name);
    return e != NULL && e[0] == c;
}

/* An integer variable: *out = def when unset; else its whole value must be a decimal integer
 * in [lo, hi] (atoi used to read "7x" as 7 and "x" as 0, turning every epilogue off). */
static int read_int(const char *name, int def, int lo, int hi, const char *expected, int *out,
                    mgpu_err_t *err)
{
    const char *e = getenv(name);
    *out = def;
    if (e == NULL)
        return 0;
    char *end = NULL;
    long v = strtol(e, &end, 10);
    if (e[0] == '\0' || *end != '\0' || v < lo || v > hi)
        return mgpu_err_set(err, MGPU_E_USAGE, "kernels: %s=\"%s\", expected %s", name, e,
                            expected);
    *out = (int)v;
    return 0;
}

int mgpu_kernels_options_read(mgpu_kernels_options_t *o, mgpu_err_t *err)
{
    int rc;
    const char *g = getenv("MGPU_CPU_GEMM");
    if (g != NULL && g[0] != '\0' && strcmp(g, "portable") != 0 && strcmp(g, "auto") != 0)
        return mgpu_err_set(err, MGPU_E_USAGE,
                            "kernels: MGPU_CPU_GEMM=\"%s\", expected portable or auto", g);
    o->cpu_gemm_portable = g != NULL && strcmp(g, "portable") == 0;
    o->lt_off = starts_with("MGPU_CUDA_LT", '0');
    o->shadow_off = starts_with("MGPU_BF16_SHADOW", '0');
    o->lt_verbose = starts_with("MGPU_LT_VERBOSE", '1');
    o->tune_off = starts_with("MGPU_LT_TUNE", '0');
    o->slices_off = starts_with("MGPU_GRAPH_SLICES", '0');
    o->head_off = starts_with("MGPU_CUDA_HEAD", '0');
    o->sg_off = starts_with("MGPU_SMALL_GEMM", '0');
    o->wgmma_off = starts_with("MGPU_GPT_WGMMA", '0');
    o->x3_off = starts_with("MGPU_GPT_ATT_X3", '0');
    /* small_gemm.cu's ops (bits 1 << mgpu_sg::Op: 1 forward, 2 input gradient, 4 weight
     * gradient). The defaults were measured faster on an H200 for the launch-bound MLP's step:
     * fp32 51.8 us with the forward and the input gradient, 60.0 with none, and the weight
     * gradients grouped into one launch at the join 49.5 -> 46.4 us; tf32 45.4 us with the
     * input gradient only, 47.2 with none, 49.1 with the forward too (cuBLAS's tensor-core
     * forward and weight gradients are faster). */
    if ((rc = read_int("MGPU_LT_EPI", 7, 0, 7, "a bit mask 0..7", &o->lt_epi, err)) < 0 ||
        (rc = read_int("MGPU_SG_FP32", 7, 0, 7, "a bit mask 0..7", &o->sg_ops_fp32, err)) < 0 ||
        (rc = read_int("MGPU_SG_TF32", 2, 0, 7, "a bit mask 0..7", &o->sg_ops_tf32, err)) < 0 ||
        (rc = read_int("MGPU_SG_SPLIT", 0, 0, 8, "0, 1, 2, 4 or 8", &o->sg_split, err)) < 0 ||
        (rc = read_int("MGPU_GPT_ATT_GROUP_FWD", -1, 0, 1 << 20, "a number of heads >= 0",
                       &o->att_group_fwd, err)) < 0 ||
        (rc = read_int("MGPU_GPT_ATT_GROUP_BWD", -1, 0, 1 << 20, "a number of heads >= 0",
                       &o->att_group_bwd, err)) < 0 ||
        (rc = read_int("MGPU_GPT_WG_BESIDE", -1, 0, 1, "0 or 1", &o->wg_beside, err)) < 0)
        return rc;
    if (o->sg_split & (o->sg_split - 1))
        return mgpu_err_set(err, MGPU_E_USAGE,
                            "kernels: MGPU_SG_SPLIT=\"%s\", expected 0, 1, 2, "
                            "4 or 8",
                            getenv("MGPU_SG_SPLIT"));
    return 0;
}
