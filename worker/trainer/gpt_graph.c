/* gpt_graph.c - model = gpt's step replayed from CUDA graphs, over the schedule of
 * kernels_cuda.h (one per part: its capture, instantiation, replay and release). */
#include "gpt_graph.h"

#include <errno.h>  /* ENOMEM */
#include <stdio.h>  /* snprintf */
#include <stdlib.h> /* calloc, free */

#ifdef MGPU_HAVE_CUDA
#include "kernels_cuda.h" /* mgpu_kernels_cuda_sched_*: capture and replay */
#endif

struct mgpu_gpt_graph {
    mgpu_gpt_t *m;
    float scale, grad_clip;
    mgpu_adamw_hparams_t hp;
    int captures;
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
    free(g);
}

int mgpu_gpt_graph_create(mgpu_gpt_t *m, float scale, const mgpu_adamw_hparams_t *hp,
                          float grad_clip, mgpu_gpt_graph_t **out, mgpu_err_t *err)
{
    *out = NULL;
    if (mgpu_kernels_cuda_stream(m->k) == NULL)
        return 0;
    mgpu_gpt_graph_t *g = calloc(1, sizeof *g);
    if (g == NULL)
        return mgpu_err_set(err, -ENOMEM, "gpt graph: calloc failed");
    g->m = m;
    g->scale = scale;
    g->grad_clip = grad_clip;
    g->hp = *hp;
    for (int i = 0; i < MGPU_GPT_GRAPH_PARTS; i++) {
        /* No buckets: the all-reduce of a world size above 1 runs between two parts. */
        int rc = mgpu_kernels_cuda_sched_create(m->k, 0, &g->part[i], err);
        if (rc < 0) {
            mgpu_gpt_graph_destroy(g);
            return rc;
        }
    }
    *out = g;
    return 0;
}

/* Queues part's work on the backend's stream (also while capturing). */
static int queue(mgpu_gpt_graph_t *g, mgpu_gpt_graph_part_t part, mgpu_err_t *err)
{
    int rc;
    if (part != MGPU_GPT_GRAPH_UPDATE && ((rc = mgpu_gpt_zero_grads(g->m, err)) < 0 ||
                                          (rc = mgpu_gpt_loss(g->m, g->scale, 1, err)) < 0))
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
                          float grad_clip, mgpu_gpt_graph_t **out, mgpu_err_t *err)
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
