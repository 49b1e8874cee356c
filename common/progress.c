/* progress.c - reading a rank's progress page (see progress.h). */
#include "progress.h"

#include <sched.h>  /* sched_yield */
#include <stdio.h>  /* snprintf */
#include <string.h> /* memcpy, strnlen */

int mgpu_progress_read(const mgpu_progress_page_t *page, mgpu_progress_page_t *out)
{
    for (int tries = 0; tries < 1000; tries++) {
        uint64_t before = __atomic_load_n(&page->seq, __ATOMIC_ACQUIRE);
        memcpy(out, (const void *)page, sizeof *out);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if ((before & 1) == 0 && __atomic_load_n(&page->seq, __ATOMIC_RELAXED) == before) {
            out->coll_done = __atomic_load_n(&page->coll_done, __ATOMIC_RELAXED);
            return out->magic == MGPU_PROGRESS_MAGIC && out->version == MGPU_PROGRESS_VERSION ? 0
                                                                                              : -1;
        }
    }
    return -1;
}

void mgpu_progress_set_lost(mgpu_progress_page_t *page, const char *text)
{
    uint32_t seq = __atomic_load_n(&page->lost_seq, __ATOMIC_RELAXED);
    size_t n = text != NULL ? strnlen(text, sizeof page->lost_text - 1) : 0;

    /* Odd while the text changes: a reader that saw an even value before its copy and the
     * same one after it read a whole text. */
    __atomic_store_n(&page->lost_seq, seq | 1u, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    memcpy(page->lost_text, text != NULL ? text : "", n);
    memset(page->lost_text + n, 0, sizeof page->lost_text - n);
    __atomic_store_n(&page->lost_seq, (seq | 1u) + 1, __ATOMIC_RELEASE);
}

int mgpu_progress_lost(const mgpu_progress_page_t *page, char *text, size_t len)
{
    text[0] = '\0';
    if (mgpu_progress_lost_seq(page) == 0)
        return 0;
    /* The launcher writes 256 bytes in one go: a retry is rare and short. */
    for (int tries = 0; tries < 10000; tries++) {
        uint32_t before = __atomic_load_n(&page->lost_seq, __ATOMIC_ACQUIRE);
        char copy[sizeof page->lost_text];
        if ((before & 1) == 0) {
            memcpy(copy, (const void *)page->lost_text, sizeof copy);
            __atomic_thread_fence(__ATOMIC_ACQUIRE);
            if (__atomic_load_n(&page->lost_seq, __ATOMIC_RELAXED) == before) {
                copy[sizeof copy - 1] = '\0';
                snprintf(text, len, "%s", copy[0] ? copy : "a peer was lost (no detail given)");
                return 1;
            }
        }
        if (tries > 100)
            sched_yield();
    }
    snprintf(text, len, "a peer was lost (its description was still being written)");
    return 1;
}

const char *mgpu_progress_phase_name(uint32_t phase)
{
    static const char *const names[MGPU_PHASE_COUNT] = {
        "start",      "init",      "data",       "forward", "backward",
        "all-reduce", "optimizer", "checkpoint", "eval",    "done"};
    return phase < MGPU_PHASE_COUNT ? names[phase] : "?";
}

const char *mgpu_progress_coll_name(uint32_t op)
{
    static const char *const names[MGPU_COLL_COUNT] = {"none",       "all-reduce",     "broadcast",
                                                       "all-gather", "reduce-scatter", "barrier"};
    return op < MGPU_COLL_COUNT ? names[op] : "?";
}

const mgpu_progress_coll_t *mgpu_progress_coll(const mgpu_progress_page_t *p, uint64_t seq)
{
    const mgpu_progress_coll_t *c;

    if (seq == 0 || seq > p->coll_entered || p->coll_entered - seq >= MGPU_PROGRESS_RING)
        return NULL;
    c = &p->ring[(seq - 1) % MGPU_PROGRESS_RING];
    return c->seq == seq ? c : NULL;
}
