/* options.h - the MGPU_* environment variables that tune the kernels, read in one place
 * (mgpu_kernels_options_read, called when a backend is created) into one struct that the
 * backend keeps. kernels/README.md has the table: name, values, default, effect, when to touch.
 *
 * None changes a result beyond the rounding of a different summation order: each picks among
 * implementations that are all tested against the plain-C reference. */
#ifndef MGPU_KERNELS_OPTIONS_H
#define MGPU_KERNELS_OPTIONS_H

#include "error.h" /* mgpu_err_t */

#include <stdbool.h> /* bool */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mgpu_kernels_options {
    bool cpu_gemm_portable; /* MGPU_CPU_GEMM=portable: the 4x8 micro-kernel even with AVX2 */
    bool lt_off;            /* MGPU_CUDA_LT=0: compose every fused linear op from plain ops */
    int lt_epi;             /* MGPU_LT_EPI: cuBLASLt epilogues, 1 forward | 2 input gradient |
                               4 weight gradient (default 7) */
    bool shadow_off;        /* MGPU_BF16_SHADOW=0: convert every bf16 operand every time */
    bool lt_verbose;        /* MGPU_LT_VERBOSE=1: say what cuBLASLt declined, tuning times */
    bool tune_off;          /* MGPU_LT_TUNE=0: cuBLASLt's heuristic's first choice, untimed */
    bool slices_off;        /* MGPU_GRAPH_SLICES=0: captured products share the workspace */
    bool head_off;          /* MGPU_CUDA_HEAD=0: linear_loss and the narrow dW composed */
    bool sg_off;            /* MGPU_SMALL_GEMM=0: no small_gemm.cu products */
    int sg_ops_fp32;        /* MGPU_SG_FP32: which small_gemm.cu ops run in fp32 (bit mask) */
    int sg_ops_tf32;        /* MGPU_SG_TF32: the same in tf32 */
    int sg_split;           /* MGPU_SG_SPLIT: small_gemm.cu's K split forced, 0 its own rule */
    bool wgmma_off;         /* MGPU_GPT_WGMMA=0: the GPT attention's mma.sync kernels on
                               Hopper too */
    bool x3_off;            /* MGPU_GPT_ATT_X3=0: the fp32 and tf32 attention on the CUDA
                               cores (no 3xTF32 tensor-core products) */
    int att_group_fwd;      /* MGPU_GPT_ATT_GROUP_FWD: the warpgroup attention forward's
                               blocks in groups of this many heads (0: head by head; -1,
                               unset: gpt_attention_wg.cu's default) */
    int att_group_bwd;      /* MGPU_GPT_ATT_GROUP_BWD: the same for the backward's passes */
    int wg_beside;          /* MGPU_GPT_WG_BESIDE: 1 the bf16 GPT's captured weight gradients
                               on a side stream beside the backward's chain, 0 on the main
                               stream (-1, unset: gpt_linear.cu's rule, by rows) */
} mgpu_kernels_options_t;

/* Fills *o from the environment, defaults where a variable is unset: 0, or MGPU_E_USAGE
 * naming the variable, its value and what was expected. */
int mgpu_kernels_options_read(mgpu_kernels_options_t *o, mgpu_err_t *err);

#ifdef __cplusplus
}
#endif

#endif
