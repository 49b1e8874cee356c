/* gpt_graph.c - model = gpt's step replayed from CUDA graphs, over the schedule of
 * kernels_cuda.h (one per part: its capture, instantiation, replay and release; STEP's also
 * forks the buckets' all-reduces off the backend's stream and joins them back).
 *
 * Ordering of the average inside STEP, and why it is enough (as gpustep.cu's):
 * - Bucket b's all-reduce waits for an event recorded on the backend's stream right after the
 *   backward's work that made its gradients final (the hook runs after that work is queued),
 *   and the update waits for the event recorded on the all-reduce stream after the last
 *   bucket: the all-reduces read final gradients and the update reads averaged ones.
 * - Nothing on the backend's stream writes a bucket's gradients after its event (the hook's
 *   contract, mgpu_gpt_hook_fn), so the all-reduce and the lower layers' backward may run
 *   at once.
 * - The next replay zeroes the gradients only after this replay's update, which waited for
 *   every all-reduce: no extra event.
 * - In the capture the events become the graph's edges; the all-reduce stream joins the
 *   capture through its first wait and leaves it through the join (an unjoined stream fails
 *   the capture's end). */
#include "gpt_graph.h"

#include <errno.h>  /* EINVAL, ENOMEM */
#include <stdio.h>  /* snprintf */
#include <stdlib.h> /* calloc, malloc, free */
#include <string.h> /* memcpy */

#include "mgpu.h" /* mgpu_progress_bucket */

#ifdef MGPU_HAVE_CUDA
#include "kernels_cuda.h" /* mgpu_kernels_cuda_sched_*: capture and replay */
#endif

struct mgpu_gpt_graph {
    mgpu_gpt_t *m;
    float scale, grad_clip;
    mgpu_adamw_hparams_t hp;
    int captures;
    mgpu_gpt_graph_reduce_t reduce; /* fn NULL: none; buckets: g's copy */
    int next_bucket;                /* the next bucket to queue in this backward */
#ifdef MGPU_HAVE_CUDA
    mgpu_kernels_cuda_sched_t *part[MGPU_GPT_GRAPH_PARTS];
#endif
};

#ifdef MGPU_HAVE_CUDA

void mgpu_gpt_graph_destroy(mgpu_gpt_graph_t *g)
{
    if (g == NULL)
        return;
    for (int i = 0; i < MGPU_GPT_GRAPH_PARTS; i++)
        mgpu_kernels_cuda_sched_destroy(g->part[i]);
    free((void *)g->reduce.buckets);
    free(g);
}

int mgpu_gpt_graph_create(mgpu_gpt_t *m, float scale, const mgpu_adamw_hparams_t *hp,
                          float grad_clip, const mgpu_gpt_graph_reduce_t *reduce,
                          mgpu_gpt_graph_t **out, mgpu_err_t *err)
{
    *out = NULL;
    if (mgpu_kernels_cuda_stream(m->k) == NULL)
        return 0;
    if (reduce != NULL && (reduce->fn == NULL || reduce->n_buckets < 1))
        return mgpu_err_set(err, -EINVAL, "gpt graph: a reduce with %d buckets%s, expected >= 1",
                            reduce->n_buckets, reduce->fn == NULL ? " and no function" : "");
    mgpu_gpt_graph_t *g = calloc(1, sizeof *g);
    if (g == NULL)
        return mgpu_err_set(err, -ENOMEM, "gpt graph: calloc failed");
    g->m = m;
    g->scale = scale;
    g->grad_clip = grad_clip;
    g->hp = *hp;
    if (reduce != NULL) {
        size_t bytes = sizeof(mgpu_gpt_bucket_t) * (size_t)reduce->n_buckets;
        mgpu_gpt_bucket_t *b = malloc(bytes);
        if (b == NULL) {
            free(g);
            return mgpu_err_set(err, -ENOMEM, "gpt graph: malloc for %d buckets failed",
                                reduce->n_buckets);
        }
        memcpy(b, reduce->buckets, bytes);
        g->reduce = *reduce;
        g->reduce.buckets = b;
    }
    for (int i = 0; i < MGPU_GPT_GRAPH_PARTS; i++) {
        /* The all-reduce stream and the buckets' events where the average is inside: STEP's
         * (GRADS and UPDATE leave it between them). */
        int nb = i == MGPU_GPT_GRAPH_STEP ? g->reduce.n_buckets : 0;
        int rc = mgpu_kernels_cuda_sched_create(m->k, nb, &g->part[i], err);
        if (rc < 0) {
            mgpu_gpt_graph_destroy(g);
            return rc;
        }
    }
    *out = g;
    return 0;
}

/* The backward's hook (mgpu_gpt_hook_fn): queues every bucket that layer completes on the
 * all-reduce stream, forked off the backend's stream after the work that made it. */
static int on_layer(void *ctx, int layer, mgpu_err_t *err)
{
    mgpu_gpt_graph_t *g = ctx;
    mgpu_kernels_cuda_sched_t *sc = g->part[MGPU_GPT_GRAPH_STEP];
    const mgpu_gpt_graph_reduce_t *r = &g->reduce;
    while (g->next_bucket < r->n_buckets && r->buckets[g->next_bucket].layer == layer) {
        const int b = g->next_bucket++;
        const mgpu_gpt_bucket_t *bk = &r->buckets[b];
        /* Work the backend runs beside its stream (kernels.h: mgpu_k_join) is joined first,
         * so the bucket's event follows every write of its gradients. */
        int rc = mgpu_k_join(g->m->k, err);
        if (rc == 0)
            rc = mgpu_kernels_cuda_sched_bucket(sc, b, err);
        mgpu_progress_bucket(g->m->progress, b);
        if (rc == 0)
            rc = r->fn(r->ctx, g->m->grads + bk->off, bk->n,
                       mgpu_kernels_cuda_sched_comm_stream(sc), err);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* STEP's gradients averaged inside it: backward with the buckets' all-reduces, then the
 * all-reduce stream joined back (before the update reads the gradients). */
static int queue_averaged(mgpu_gpt_graph_t *g, mgpu_err_t *err)
{
    const mgpu_gpt_graph_reduce_t *r = &g->reduce;
    int rc;
    g->next_bucket = 0;
    if ((rc = mgpu_gpt_loss_hooked(g->m, g->scale, 1, r->overlap ? on_layer : NULL, g, err)) < 0)
        return rc;
    /* Without the overlap: every bucket now, in the same order. */
    while (!r->overlap && g->next_bucket < r->n_buckets)
        if ((rc = on_layer(g, r->buckets[g->next_bucket].layer, err)) < 0)
            return rc;
    if (g->next_bucket != r->n_buckets)
        return mgpu_err_set(err, -EINVAL, "gpt graph: backward launched %d of %d buckets",
                            g->next_bucket, r->n_buckets);
    if ((rc = mgpu_kernels_cuda_sched_comm_join(g->part[MGPU_GPT_GRAPH_STEP], err)) < 0)
        return rc;
    mgpu_progress_bucket(g->m->progress, -1);
    return 0;
}

/* Queues part's work on the backend's stream (also while capturing). */
static int queue(mgpu_gpt_graph_t *g, mgpu_gpt_graph_part_t part, mgpu_err_t *err)
{
    int rc;
    if (part != MGPU_GPT_GRAPH_UPDATE && (rc = mgpu_gpt_zero_grads(g->m, err)) < 0)
        return rc;
    if (part == MGPU_GPT_GRAPH_STEP && g->reduce.fn != NULL)
        rc = queue_averaged(g, err);
    else if (part != MGPU_GPT_GRAPH_UPDATE)
        rc = mgpu_gpt_loss(g->m, g->scale, 1, err);
    else
        rc = 0;
    if (rc < 0)
        return rc;
    if (part != MGPU_GPT_GRAPH_GRADS && (rc = mgpu_gpt_update(g->m, &g->hp, g->grad_clip, err)) < 0)
        return rc;
    return 0;
}

static int capture(mgpu_gpt_graph_t *g, mgpu_gpt_graph_part_t part, mgpu_err_t *err)
{
    mgpu_kernels_cuda_sched_t *sc = g->part[part];
    char msg[sizeof err->msg];
    int rc;
    /* Every replay changes the parameters, so the captured products must convert them
     * (bf16 copies) rather than trust a copy the backend made before the capture (after an
     * evaluation, say). Everything else a product reads, the step writes first. */
    if ((rc = mgpu_gpt_params_changed(g->m, err)) < 0 ||
        (rc = mgpu_kernels_cuda_sched_capture_begin(sc, err)) < 0)
        return rc;
    rc = queue(g, part, err);
    /* Ended also when the step failed (what was captured is then dropped, err kept). */
    const int ce = mgpu_kernels_cuda_sched_capture_end(sc, rc == 0, err);
    if (rc < 0 || ce < 0) {
        snprintf(msg, sizeof msg, "%s", err->msg);
        return mgpu_err_set(err, rc < 0 ? rc : ce,
                            "gpt: capturing the step in a CUDA graph: %s (set cuda_graph = false "
                            "to run eagerly)",
                            msg);
    }
    if ((rc = mgpu_kernels_cuda_sched_graph_instantiate(sc, err)) < 0)
        return rc;
    g->captures++;
    return 0;
}

int mgpu_gpt_graph_run(mgpu_gpt_graph_t *g, mgpu_gpt_graph_part_t part, mgpu_err_t *err)
{
    int rc;
    if (part < 0 || part >= MGPU_GPT_GRAPH_PARTS)
        return mgpu_err_set(err, MGPU_E_USAGE, "gpt graph: part %d, expected 0..%d", (int)part,
                            MGPU_GPT_GRAPH_PARTS - 1);
    if (g->m->b != g->m->max_b || g->m->t != g->m->spec.context)
        return mgpu_err_set(err, MGPU_E_USAGE,
                            "gpt graph: a batch of %d x %d tokens, the graph's is %d x %d (run "
                            "a batch that is not full eagerly)",
                            g->m->b, g->m->t, g->m->max_b, g->m->spec.context);
    if (!mgpu_kernels_cuda_sched_graphed(g->part[part]) && (rc = capture(g, part, err)) < 0)
        return rc;
    return mgpu_kernels_cuda_sched_graph_launch(g->part[part], err);
}

int mgpu_gpt_graph_drop(mgpu_gpt_graph_t *g, mgpu_err_t *err)
{
    int rc;
    for (int i = 0; i < MGPU_GPT_GRAPH_PARTS; i++)
        if ((rc = mgpu_kernels_cuda_sched_graph_drop(g->part[i], err)) < 0)
            return rc;
    return 0;
}

#else /* a build without CUDA: no backend can capture */

void mgpu_gpt_graph_destroy(mgpu_gpt_graph_t *g)
{
    free(g);
}

int mgpu_gpt_graph_create(mgpu_gpt_t *m, float scale, const mgpu_adamw_hparams_t *hp,
                          float grad_clip, const mgpu_gpt_graph_reduce_t *reduce,
                          mgpu_gpt_graph_t **out, mgpu_err_t *err)
{
    *out = NULL;
    return 0;
}

int mgpu_gpt_graph_run(mgpu_gpt_graph_t *g, mgpu_gpt_graph_part_t part, mgpu_err_t *err)
{
    return mgpu_err_set(err, MGPU_E_USAGE, "gpt graph: this build has no CUDA");
}

int mgpu_gpt_graph_drop(mgpu_gpt_graph_t *g, mgpu_err_t *err)
{
    return 0;
}

#endif

int mgpu_gpt_graph_captures(const mgpu_gpt_graph_t *g)
{
    return g != NULL ? g->captures : 0;
}

int mgpu_gpt_graph_reduces(const mgpu_gpt_graph_t *g)
{
    return g != NULL && g->reduce.fn != NULL;
}
