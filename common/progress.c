/* progress.c - reading a rank's progress page (see progress.h). */
#include "progress.h"

#include <string.h> /* memcpy */

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
