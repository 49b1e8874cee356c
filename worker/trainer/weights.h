/* weights.h - a GPT's parameters in and out of the ecosystem's files (init_from, export):
 *
 *   Hugging Face  model.safetensors of GPT2LMHeadModel (or GPT2Model: names with or without
 *                 "transformer."), any of F32, BF16, F16 or F64; the Conv1D weights (c_attn,
 *                 c_proj, c_fc) are [in, out] there, transposed against mgpu's [out, in];
 *                 lm_head.weight, where present, must equal wte (mgpu ties them); the causal
 *                 mask buffers (attn.bias, attn.masked_bias) of older files are skipped. A
 *                 config.json beside the file, where there is one, must have the cfg's n_head.
 *   llm.c         gpt2_124M.bin: a 256 x int32 header (magic 20240326, version 3 = fp32 or
 *                 5 = bf16, max_seq_len, vocab, layers, heads, channels, padded vocab), then
 *                 wte, wpe and each kind of tensor for all layers in turn (ln1w, ln1b, qkvw,
 *                 qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb), lnfw,
 *                 lnfb; its weights are [out, in] as mgpu's.
 *
 * The format is told by the file's first bytes, not its name. The cfg's shape must fit: the
 * same n_layer, n_embd (and n_head where the file says), context at most the file's positions
 * (wpe's first context rows are taken, as nanoGPT's crop_block_size does), vocab at least the
 * file's vocabulary; the token embedding's rows past the file's are zero (llm.c's padding).
 * What does not fit is MGPU_E_CONFIG naming the file, the tensor and both shapes.
 *
 * mgpu_weights_export writes the parameters as a GPT2LMHeadModel's model.safetensors (F32,
 * "transformer." names, Conv1D layout, no lm_head: tied) and a config.json for it in the same
 * folder, so that GPT2LMHeadModel.from_pretrained(folder) loads the model unchanged.
 *
 * Parameters are host floats in model_gpt.h's layout (mgpu_weights_layout lists it); the
 * caller owns every buffer. */
#ifndef MGPU_WEIGHTS_H
#define MGPU_WEIGHTS_H

#include <stddef.h> /* size_t */

#include "error.h"     /* mgpu_err_t */
#include "model_gpt.h" /* mgpu_gpt_spec_t */

/* The tensors of one block, in the layout's order. */
enum {
    MGPU_W_LN1_W,
    MGPU_W_LN1_B,
    MGPU_W_QKV_W,
    MGPU_W_QKV_B,
    MGPU_W_PROJ_W,
    MGPU_W_PROJ_B,
    MGPU_W_LN2_W,
    MGPU_W_LN2_B,
    MGPU_W_FC_W,
    MGPU_W_FC_B,
    MGPU_W_FCP_W,
    MGPU_W_FCP_B,
    MGPU_W_PER_LAYER
};

/* One parameter tensor of the layout: where it lies (in floats), its shape in mgpu ([rows,
 * cols], or [rows] when cols is 0), and its name in a Hugging Face file, which holds the
 * transpose where conv1d is set. */
typedef struct mgpu_weights_tensor {
    char hf[64];
    size_t off;
    int rows, cols, conv1d;
} mgpu_weights_tensor_t;

/* The spec's tensors in the layout's order into t (room for mgpu_weights_count(spec)); the
 * parameters they add up to into *n_params (may be NULL). */
int mgpu_weights_count(const mgpu_gpt_spec_t *spec);
void mgpu_weights_layout(const mgpu_gpt_spec_t *spec, mgpu_weights_tensor_t *t, size_t *n_params);

/* Checks that path holds weights that fit spec, without reading them. */
int mgpu_weights_check(const char *path, const mgpu_gpt_spec_t *spec, mgpu_err_t *err);

/* Reads path's weights into params (host, n_params floats of spec's layout); what (cap
 * bytes, may be NULL) receives a line that says what was read. */
int mgpu_weights_load(const char *path, const mgpu_gpt_spec_t *spec, float *params, size_t n_params,
                      char *what, size_t cap, mgpu_err_t *err);

/* Writes params (host, spec's layout) to path (a .safetensors file) and config.json beside
 * it, each atomically. */
int mgpu_weights_export(const char *path, const mgpu_gpt_spec_t *spec, const float *params,
                        size_t n_params, mgpu_err_t *err);

#endif
