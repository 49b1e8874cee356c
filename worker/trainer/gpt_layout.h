/* gpt_layout.h - where the bf16 GPT keeps buffers inside other buffers' memory, each in memory
 * that is idle for as long as the buffer lives (model_gpt.h's in_logits and in_grads). Called
 * by mgpu_gpt_create_with before it allocates what is not placed. */
#ifndef MGPU_GPT_LAYOUT_H
#define MGPU_GPT_LAYOUT_H

#include <stddef.h> /* size_t */

#include "model_gpt.h" /* mgpu_gpt_t */

/* The blocks' backward scratch (dres, d4_16, dqkv16) inside logits16, as much as fits, for
 * batches of n rows: the head's backward has read the logits before the blocks' backward
 * starts (dln16, which the head writes, stays out). Sets those pointers and in_logits. */
void mgpu_gpt_layout_scratch(mgpu_gpt_t *m, size_t n);
/* With spec.reuse_grads: block l's activations (l >= 1) inside block l - 1's gradients, as
 * many as fit, for batches of n rows. Block l - 1's backward writes those gradients after
 * block l's backward has read the activations, and the next forward writes the activations
 * after the update has read the gradients. Pointers already set (spec.recompute's shared
 * buffers) stay; ln2_16 with fc_kp stays out: its column of ones is written once, at
 * creation. Sets the pointers placed and in_grads. */
void mgpu_gpt_layout_acts(mgpu_gpt_t *m, size_t n);
/* Whether p lies inside the gradients or the logits (placed there: not freed on its own). */
int mgpu_gpt_layout_inside(const mgpu_gpt_t *m, const void *p);

#endif
