/* gpt_layout.c - the bf16 GPT's buffers inside other buffers' idle memory (gpt_layout.h). */
#include "gpt_layout.h"

#include <stdint.h> /* uintptr_t */

/* A buffer to place inside another's memory: its pointer (f or h) and its size in bytes. */
typedef struct slot {
    float **f;
    mgpu_bf16_t **h;
    size_t bytes;
} slot_t;

#define SLOT_ALIGN 256 /* as cudaMalloc's */

/* Places the slots inside [base, base + bytes), the largest first, one after the other, each
 * SLOT_ALIGN-aligned, passing over those that no longer fit; sets the pointers of those placed
 * (the others are left as they are) and returns their bytes. */
static size_t place_inside(void *base, size_t bytes, slot_t *s, int n)
{
    const uintptr_t end = (uintptr_t)base + bytes;
    uintptr_t at = (uintptr_t)base;
    size_t placed = 0;
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && s[j].bytes > s[j - 1].bytes; j--) {
            slot_t t = s[j];
            s[j] = s[j - 1];
            s[j - 1] = t;
        }
    for (int i = 0; i < n; i++) {
        uintptr_t q = (at + SLOT_ALIGN - 1) / SLOT_ALIGN * SLOT_ALIGN;
        if (q > end || s[i].bytes > end - q)
            continue;
        if (s[i].f != NULL)
            *s[i].f = (float *)q;
        else
            *s[i].h = (mgpu_bf16_t *)q;
        at = q + s[i].bytes;
        placed += s[i].bytes;
    }
    return placed;
}

void mgpu_gpt_layout_scratch(mgpu_gpt_t *m, size_t n)
{
    const size_t NC = n * (size_t)m->spec.n_embd, H = sizeof(mgpu_bf16_t);
    slot_t s[] = {{&m->dres, NULL, sizeof(float) * NC},
                  {NULL, &m->d4_16, H * 4 * NC},
                  {NULL, &m->dqkv16, H * 3 * NC}};
    m->in_logits = place_inside(m->logits16, H * (size_t)m->head_rows * m->spec.vocab, s, 3);
}

void mgpu_gpt_layout_acts(mgpu_gpt_t *m, size_t n)
{
    const size_t C = (size_t)m->spec.n_embd, NC = n * C, NH = n * (size_t)m->spec.n_head;
    const size_t F = sizeof(float), H = sizeof(mgpu_bf16_t);
    for (int l = 1; l < m->spec.n_layer; l++) {
        mgpu_gpt_acts_t *a = &m->acts[l];
        char *lo = (char *)(m->grads + m->blocks[l - 1].ln1_w);
        char *hi = (char *)(m->grads + m->blocks[l].ln1_w);
        slot_t s[13];
        int k = 0;
        s[k++] = (slot_t){&a->x, NULL, F * NC};
        s[k++] = (slot_t){&a->res2, NULL, F * NC};
        s[k++] = (slot_t){&a->lse, NULL, F * NH};
        s[k++] = (slot_t){&a->ln1_mean, NULL, F * n};
        s[k++] = (slot_t){&a->ln1_rstd, NULL, F * n};
        s[k++] = (slot_t){&a->ln2_mean, NULL, F * n};
        s[k++] = (slot_t){&a->ln2_rstd, NULL, F * n};
        s[k++] = (slot_t){NULL, &a->qkv16, H * 3 * NC};
        s[k++] = (slot_t){NULL, &a->atty16, H * NC};
        s[k++] = (slot_t){NULL, &a->fch16, H * 4 * NC};
        if (a->ln1_16 == NULL)
            s[k++] = (slot_t){NULL, &a->ln1_16, H * NC};
        if (a->ln2_16 == NULL && m->fc_kp == 0)
            s[k++] = (slot_t){NULL, &a->ln2_16, H * NC};
        if (a->gelu16 == NULL)
            s[k++] = (slot_t){NULL, &a->gelu16, H * 4 * NC};
        m->in_grads += place_inside(lo, (size_t)(hi - lo), s, k);
    }
}

int mgpu_gpt_layout_inside(const mgpu_gpt_t *m, const void *p)
{
    const uintptr_t a = (uintptr_t)p, g = (uintptr_t)m->grads, h = (uintptr_t)m->logits16;
    return (m->grads != NULL && a >= g && a < g + sizeof(float) * m->n_params) ||
           (m->logits16 != NULL && a >= h &&
            a < h + sizeof(mgpu_bf16_t) * (size_t)m->head_rows * m->spec.vocab);
}
