/* kernel_trace.c - a CUPTI injection library: the start, end and stream of every kernel,
 * memset and memcpy a process runs on the GPU, as the device ran them (graph replays
 * included, concurrency kept), written as CSV when the process exits. Nsight Compute times
 * kernels one at a time; this shows where a step's time goes when they overlap: which branch
 * is the longest and how long the gaps between dependent kernels are.
 *
 *   CUDA_INJECTION64_PATH=build/lib/libmgpu_trace.so MGPU_TRACE_OUT=trace.csv prog ...
 *
 * The CSV: start_ns,end_ns,stream,kind,name (times from CUPTI's clock, in the order the
 * buffers came back; sort by start). tests/gpu/trace_steps.sh reads it. */
#include <cupti.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BUF_SIZE (8u << 20)

typedef struct rec {
    uint64_t start, end;
    uint32_t stream;
    char kind; /* 'k' kernel, 's' memset, 'c' memcpy */
    const char *name;
} rec_t;

static rec_t *recs;
static size_t n_recs, cap_recs;

static void add(uint64_t start, uint64_t end, uint32_t stream, char kind, const char *name)
{
    if (n_recs == cap_recs) {
        size_t cap = cap_recs ? 2 * cap_recs : 1u << 16;
        rec_t *r = realloc(recs, cap * sizeof *r);
        if (r == NULL)
            return; /* out of memory: the trace loses records, the program runs on */
        recs = r;
        cap_recs = cap;
    }
    recs[n_recs++] = (rec_t){start, end, stream, kind, name ? strdup(name) : NULL};
}

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
    *buffer = aligned_alloc(8, BUF_SIZE);
    *size = *buffer ? BUF_SIZE : 0;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size,
                                      size_t valid)
{
    (void)ctx;
    (void)stream;
    (void)size;
    CUpti_Activity *a = NULL;
    while (cuptiActivityGetNextRecord(buffer, valid, &a) == CUPTI_SUCCESS) {
        switch (a->kind) {
        case CUPTI_ACTIVITY_KIND_KERNEL:
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
            const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)a;
            add(k->start, k->end, k->streamId, 'k', k->name);
            break;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
            const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)a;
            add(m->start, m->end, m->streamId, 's', "memset");
            break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
            const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)a;
            add(m->start, m->end, m->streamId, 'c', "memcpy");
            break;
        }
        default:
            break;
        }
    }
    free(buffer);
}

static void dump(void)
{
    cuptiActivityFlushAll(1);
    const char *path = getenv("MGPU_TRACE_OUT");
    FILE *f = fopen(path && *path ? path : "kernel_trace.csv", "w");
    if (f == NULL) {
        perror("kernel_trace: MGPU_TRACE_OUT");
        return;
    }
    fprintf(f, "start_ns,end_ns,stream,kind,name\n");
    for (size_t i = 0; i < n_recs; i++) {
        const char *name = recs[i].name ? recs[i].name : "?";
        /* Kernel names may hold commas (template arguments): quote them. */
        fprintf(f, "%llu,%llu,%u,%c,\"", (unsigned long long)recs[i].start,
                (unsigned long long)recs[i].end, recs[i].stream, recs[i].kind);
        for (const char *p = name; *p; p++)
            fputc(*p == '"' ? '\'' : *p, f);
        fputs("\"\n", f);
    }
    fclose(f);
}

/* Called by the CUDA driver when CUDA_INJECTION64_PATH names this library. */
int InitializeInjection(void)
{
    if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "kernel_trace: CUPTI did not start; no trace\n");
        return 0;
    }
    (void)cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET);
    (void)cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
    atexit(dump);
    return 1;
}
