/* gpt_run.c - the training loop of model = gpt: data, resume or broadcast, epochs of sampler
 * shards, gradient accumulation, bucketed averaging, clipping, the schedule, progress,
 * metrics, evaluation, checkpoints and sampling.
 *
 * With cuda_graph on a CUDA backend and grad_accum = 1, a step of a full batch after the first
 * such eager one is replayed from CUDA graphs (gpt_graph.h); a batch that is not full, and
 * grad_accum > 1 (whose micro-steps differ: only the first zeroes the gradients), run eagerly,
 * and anything eager between two replays makes the graphs be captured again.
 *
 * zero = 1 (zero.h) runs every step eagerly: the reduce-scatter, AdamW on the rank's slice
 * and the all-gather follow the backward, on the CPU and on a GPU alike.
 *
 * The gradients' average over the ranks goes by the buckets of mgpu_gpt_buckets (bucket_mb,
 * backward's order) in every step. A replayed step of a world size above 1 holds it in its
 * graph, each bucket's all-reduce overlapping the rest of the backward, where the comm can
 * queue it on a stream (allreduce_avg_stream); an eager step (or a replay without that)
 * all-reduces the same buckets in the same order after its backward. */
#include "gpt_run.h"

#include <cjson/cJSON.h> /* metrics lines */
#include <errno.h>       /* ENOMEM */
#include <math.h>        /* NAN, exp */
#include <stdint.h>      /* int32_t */
#include <stdlib.h>      /* malloc, free */
#include <string.h>      /* memcpy */

#include "checkpoint.h"  /* mgpu_ckpt_* */
#include "gpt_graph.h"   /* mgpu_gpt_graph_*: the step replayed from CUDA graphs */
#include "model_gpt.h"   /* mgpu_gpt_* */
#include "optim.h"       /* MGPU_OPTIM_ADAMW */
#include "rng.h"         /* mgpu_rng_*: sampling */
#include "run_util.h"    /* mgpu_run_*: what the two loops share */
#include "bpe.h"         /* mgpu_bpe_*: prompt and generate through a tokenizer.json */
#include "sampler.h"     /* mgpu_sampler_* */
#include "shards.h"      /* mgpu_shards_*, mgpu_windows_*: the mapped token files */
#include "tokens.h"      /* mgpu_tokens_prompt */
#include "transformer.h" /* mgpu_gpt_lr */
#include "zero.h"        /* mgpu_zero_gpt_*: zero = 1 */
#include "weights.h"     /* mgpu_weights_load, mgpu_weights_export */

typedef struct run {
    mgpu_kernels_t *k;
    const mgpu_cfg_t *cfg;
    const mgpu_ddp_comm_t *comm;
    FILE *out, *metrics;
    mgpu_gpt_t *m;
    mgpu_gpt_graph_t *graph; /* NULL: every step eager (cuda_graph off, not CUDA, grad_accum > 1) */
    mgpu_gpt_bucket_t *buckets; /* the gradients' all-reduce, in backward's order */
    int n_buckets;
    mgpu_shards_t data, val_data; /* val_data: data_val_tokens' files (none: a tail of data) */
    mgpu_windows_t train, eval;   /* the windows of each split */
    mgpu_bpe_t *tokenizer;        /* NULL: prompt and output as ids (tokens) or bytes (text) */
    void *scratch;                /* backend memory for small collectives */
    int32_t *h_tok, *h_tgt;       /* one micro-batch, host */
    float *h_params;
    mgpu_zero_gpt_t *zero; /* zero = 1: AdamW over this rank's slice (else NULL) */
} run_t;

/* b windows of a split into the host batch and the model: the sampler's indices first ..
 * first + b - 1 of epoch, or (samp NULL) the windows first, first + 1, ... The indices are
 * computed one by one (mgpu_sampler_index), so no rank holds a list of the data set's windows. */
static int load_windows(run_t *s, const mgpu_windows_t *split, const mgpu_sampler_t *samp,
                        long long epoch, size_t first, int b, mgpu_err_t *err)
{
    const int T = s->cfg->context;
    int rc;
    for (int i = 0; i < b; i++) {
        size_t win = samp != NULL ? mgpu_sampler_index(samp, (uint64_t)epoch, first + (size_t)i)
                                  : first + (size_t)i;
        if ((rc = mgpu_windows_read(split, win, s->h_tok + (size_t)i * T, s->h_tgt + (size_t)i * T,
                                    err)) < 0)
            return rc;
    }
    return mgpu_gpt_load(s->m, s->h_tok, s->h_tgt, b, T, err);
}

static int save_checkpoint(run_t *s, uint64_t epoch, uint64_t batch, uint64_t step, mgpu_err_t *err)
{
    mgpu_gpt_t *m = s->m;
    float *state = NULL;
    int rc;
    mgpu_progress_phase(s->comm->progress, MGPU_PHASE_CHECKPOINT);
    if (s->cfg->checkpoint[0] == 0 || (s->comm->rank != 0 && s->zero == NULL))
        return 0;
    if (s->zero == NULL)
        state = malloc(sizeof(float) * 2 * m->n_params);
    if (s->zero == NULL && state == NULL)
        return mgpu_err_set(err, -ENOMEM, "gpt: malloc for the checkpoint's optimizer state");
    mgpu_ckpt_t c = {.model_hash = mgpu_gpt_shape_hash(&m->spec),
                     .epoch = epoch,
                     .batch_in_epoch = batch,
                     .step = step,
                     .optim_step = step,
                     .optim_kind = (uint32_t)MGPU_OPTIM_ADAMW,
                     .world_size = (uint32_t)s->comm->world_size,
                     .batch_per_rank = (uint32_t)(s->cfg->batch_size * s->cfg->grad_accum),
                     .seed = s->cfg->seed,
                     .n_params = m->n_params,
                     .params = s->h_params,
                     .n_state = 2 * m->n_params,
                     .state = state};
    if (s->zero != NULL) /* every rank hands rank 0 its slice of the moments */
        return mgpu_zero_save(&s->zero->z, s->k, s->comm, s->zero->moments, 2, m->params, &c,
                              s->cfg->checkpoint, err);
    rc = mgpu_run_checkpoint_write(s->k, s->cfg->checkpoint, &c, m->params, m->moments, err);
    free(state);
    return rc;
}

/* Rank 0's check that the checkpoint holds this model and was written with this seed. */
static int ckpt_fits(void *ctx, const mgpu_ckpt_t *c, char *msg, size_t cap)
{
    const run_t *s = ctx;
    const mgpu_cfg_t *cfg = s->cfg;
    const mgpu_gpt_t *m = s->m;
    if (c->model_hash != mgpu_gpt_shape_hash(&m->spec) || c->n_params != m->n_params ||
        c->n_state != 2 * m->n_params) {
        snprintf(msg, cap,
                 "checkpoint %.400s holds another model (%zu parameters) than this run's gpt "
                 "with n_layer = %d, n_head = %d, n_embd = %d, context = %d, vocab = %d "
                 "(%zu parameters): remove it or point checkpoint elsewhere",
                 cfg->checkpoint, c->n_params, m->spec.n_layer, m->spec.n_head, m->spec.n_embd,
                 m->spec.context, m->spec.vocab, m->n_params);
        return 0;
    }
    if (c->seed != cfg->seed) {
        snprintf(msg, cap,
                 "checkpoint %.400s was written with seed %llu, this run has seed %llu: "
                 "remove it or point checkpoint elsewhere",
                 cfg->checkpoint, (unsigned long long)c->seed, (unsigned long long)cfg->seed);
        return 0;
    }
    return 1;
}

/* Rank 0 reads the checkpoint and checks that it holds this model; everyone learns the
 * outcome, then the parameters and moments (or rank 0's initial parameters). */
static int resume_or_broadcast(run_t *s, mgpu_run_resume_t *h, mgpu_err_t *err)
{
    mgpu_gpt_t *m = s->m;
    if (s->zero != NULL) /* rank 0 reads all the moments, each rank receives its slice */
        return mgpu_zero_resume(&s->zero->z, s->k, s->comm, s->scratch, s->cfg->checkpoint,
                                ckpt_fits, s, m->params, s->zero->moments, 2, h, err);
    return mgpu_run_resume_or_broadcast(s->k, s->comm, s->scratch, s->cfg->checkpoint, ckpt_fits, s,
                                        m->params, m->n_params, m->moments, 2 * m->n_params, h,
                                        err);
}

/* The parameters before the first step: init_from's weights (every rank reads the file, so
 * a bad one fails every rank alike; rank 0's then go to all as a fresh start's do), or
 * GPT-2's initialisation from the seed, which is also all a run that resumes needs. s->h_params is
 * allocated here, for the checkpoints and the export too. */
static int init_params(run_t *s, const mgpu_gpt_spec_t *spec, mgpu_err_t *err)
{
    mgpu_gpt_t *m = s->m;
    char what[512];
    int rc;
    if ((s->h_params = malloc(sizeof(float) * m->n_params)) == NULL)
        return mgpu_err_set(err, -ENOMEM, "gpt: malloc of %zu floats failed", m->n_params);
    if (s->cfg->init_from[0] == 0)
        return mgpu_gpt_init(m, s->cfg->seed, err);
    if (mgpu_cfg_resumes(s->cfg)) { /* the checkpoint's weights replace any */
        if (s->comm->rank == 0) {
            fprintf(s->out, "init_from: %s not read: %s is there to resume from\n",
                    s->cfg->init_from, s->cfg->checkpoint);
            fflush(s->out);
        }
        return mgpu_gpt_init(m, s->cfg->seed, err);
    }
    if ((rc = mgpu_weights_load(s->cfg->init_from, spec, s->h_params, m->n_params, what,
                                sizeof what, err)) < 0 ||
        (rc = mgpu_k_copy_to_device(s->k, m->params, s->h_params, sizeof(float) * m->n_params,
                                    err)) < 0)
        return rc;
    if (s->comm->rank == 0) {
        fprintf(s->out, "init_from: %s (%s)\n", s->cfg->init_from, what);
        fflush(s->out);
    }
    return mgpu_gpt_params_changed(m, err);
}

/* Rank 0 writes the parameters as a Hugging Face GPT-2 folder's model.safetensors and
 * config.json. */
static int export_model(run_t *s, mgpu_err_t *err)
{
    mgpu_gpt_t *m = s->m;
    int rc;
    if ((rc = mgpu_k_copy_to_host(s->k, s->h_params, m->params, sizeof(float) * m->n_params, err)) <
            0 ||
        (rc = mgpu_weights_export(s->cfg->export_file, &m->spec, s->h_params, m->n_params, err)) <
            0)
        return rc;
    fprintf(s->out, "export: %s and config.json beside it (%zu parameters, F32)\n",
            s->cfg->export_file, m->n_params);
    fflush(s->out);
    return 0;
}

/* The held-out windows, sharded over the ranks: the mean loss per token over all of them. */
static int evaluate(run_t *s, double *loss, mgpu_err_t *err)
{
    const int W = s->comm->world_size, r = s->comm->rank, T = s->cfg->context;
    const int B = (int)s->cfg->batch_size;
    size_t nw = s->eval.n_windows;
    mgpu_progress_phase(s->comm->progress, MGPU_PHASE_EVAL);
    size_t lo = nw * (size_t)r / (size_t)W, hi = nw * (size_t)(r + 1) / (size_t)W;
    double sum = 0;
    int rc;

    for (size_t w = lo; w < hi; w += (size_t)B) {
        int b = hi - w < (size_t)B ? (int)(hi - w) : B;
        float l;
        if ((rc = mgpu_k_zero(s->k, s->m->scalars, sizeof(float), err)) < 0 ||
            (rc = load_windows(s, &s->eval, NULL, 0, w, b, err)) < 0 ||
            (rc = mgpu_gpt_loss(s->m, 1.0f / ((float)b * T), 0, err)) < 0 ||
            (rc = mgpu_k_copy_to_host(s->k, &l, s->m->scalars, sizeof l, err)) < 0)
            return rc;
        sum += (double)l * b;
    }
    float v[2] = {(float)sum, (float)(hi - lo)};
    if ((rc = mgpu_run_reduce_host(s->k, s->comm, s->scratch, v, 2, 0, err)) < 0)
        return rc;
    *loss = v[1] > 0 ? v[0] / v[1] : NAN;
    return 0;
}

static int report_eval(run_t *s, long long epoch, long long step, mgpu_ddp_result_t *res,
                       mgpu_err_t *err)
{
    double loss;
    int rc = evaluate(s, &loss, err);
    if (rc < 0)
        return rc;
    res->eval_loss = loss;
    if (s->comm->rank != 0)
        return 0;
    size_t nw = s->eval.n_windows;
    fprintf(s->out, "eval epoch %lld step %lld: loss %.4f perplexity %.2f on %zu windows\n",
            epoch + 1, step, loss, exp(loss), nw);
    fflush(s->out);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "epoch", (double)epoch + 1);
    cJSON_AddNumberToObject(o, "step", (double)step);
    cJSON_AddNumberToObject(o, "eval_loss", loss);
    cJSON_AddNumberToObject(o, "eval_perplexity", exp(loss));
    mgpu_run_metrics_line(&s->metrics, s->cfg->metrics_file, o);
    return 0;
}

/* A token drawn from logits (vocab floats, changed) at temperature, among the top_k most
 * likely (0: all). */
static int32_t sample(float *logits, int vocab, double temperature, int top_k, mgpu_rng_t *r)
{
    double mx = -INFINITY, sum = 0, cut = -INFINITY;
    if (top_k > 0 && top_k < vocab) {
        /* The k-th largest logit: partial selection by repeated maximum (vocab is small for a
         * CPU run's generation; a tie at the cut keeps every tied token). */
        float *v = malloc(sizeof(float) * vocab);
        if (v != NULL) {
            memcpy(v, logits, sizeof(float) * vocab);
            for (int i = 0; i < top_k; i++) {
                int best = 0;
                for (int j = 1; j < vocab; j++)
                    best = v[j] > v[best] ? j : best;
                cut = v[best];
                v[best] = -INFINITY;
            }
            free(v);
        }
    }
    for (int i = 0; i < vocab; i++)
        mx = logits[i] > mx && logits[i] >= cut ? logits[i] : mx;
    for (int i = 0; i < vocab; i++) {
        double p = logits[i] >= cut ? exp(((double)logits[i] - mx) / temperature) : 0.0;
        logits[i] = (float)p;
        sum += p;
    }
    double u = mgpu_rng_uniform(r) * sum, acc = 0;
    for (int i = 0; i < vocab; i++) {
        acc += logits[i];
        if (u < acc && logits[i] > 0)
            return i;
    }
    for (int i = vocab - 1; i >= 0; i--)
        if (logits[i] > 0)
            return i;
    return 0;
}

/* The length of the printable UTF-8 character that starts at seq[i] (of n bytes), or 0: a
 * well-formed sequence (no overlong form, surrogate or code point past U+10FFFF) that is not
 * a C1 control (U+0080-U+009F, which some terminals obey). */
static int utf8_len(const int32_t *seq, int i, int n)
{
    const int c = seq[i];
    int len, lo = 0x80, hi = 0xbf; /* the second byte's range */
    if (c >= 0xc2 && c <= 0xdf)
        len = 2, lo = c == 0xc2 ? 0xa0 : 0x80;
    else if (c >= 0xe0 && c <= 0xef)
        len = 3, lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
    else if (c >= 0xf0 && c <= 0xf4)
        len = 4, lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
    else
        return 0;
    if (i + len > n || seq[i + 1] < lo || seq[i + 1] > hi)
        return 0;
    for (int j = 2; j < len; j++)
        if (seq[i + j] < 0x80 || seq[i + j] > 0xbf)
            return 0;
    return len;
}

/* Bytes as text: printable ASCII, newlines, tabs and well-formed UTF-8 as they are, anything
 * else escaped (\xNN, and \\ for a backslash), so that no control byte reaches a terminal. */
static void print_bytes(FILE *out, const int32_t *seq, int n)
{
    for (int i = 0; i < n;) {
        const int c = seq[i], u = c >= 0x80 ? utf8_len(seq, i, n) : 0;
        if (u > 0) {
            for (int j = 0; j < u; j++)
                fputc(seq[i + j], out);
            i += u;
            continue;
        }
        if (c == '\n' || c == '\t' || (c >= 0x20 && c < 0x7f && c != '\\'))
            fputc(c, out);
        else if (c == '\\')
            fputs("\\\\", out);
        else
            fprintf(out, "\\x%02x", c);
        i++;
    }
}

/* The prompt's ids into seq (at most max): through the tokenizer when there is one (the
 * prompt's escapes read as for text first), else as mgpu_tokens_prompt reads it. */
static int prompt_ids(run_t *s, int32_t *seq, int max, int *n, mgpu_err_t *err)
{
    const mgpu_cfg_t *cfg = s->cfg;
    if (s->tokenizer == NULL)
        return mgpu_tokens_prompt(cfg->prompt, cfg->dataset == MGPU_DATASET_TEXT, cfg->vocab, seq,
                                  max, n, err);
    int32_t *ids = NULL;
    size_t k;
    int rc, nb;
    char *bytes = malloc((size_t)max);
    if (bytes == NULL)
        return mgpu_err_set(err, -ENOMEM, "gpt: malloc for the prompt failed");
    if ((rc = mgpu_tokens_prompt(cfg->prompt, 1, 256, seq, max, &nb, err)) == 0) {
        for (int i = 0; i < nb; i++)
            bytes[i] = (char)seq[i];
        rc = mgpu_bpe_encode(s->tokenizer, bytes, (size_t)nb, &ids, &k, err);
    }
    if (rc == 0 && (k == 0 || k > (size_t)max))
        rc = mgpu_err_set(err, MGPU_E_CONFIG, "prompt = '%s': %zu tokens, expected 1 to %d",
                          cfg->prompt, k, max);
    if (rc == 0) {
        memcpy(seq, ids, sizeof *ids * k);
        *n = (int)k;
    }
    free(ids);
    free(bytes);
    return rc;
}

/* ids as the tokenizer decodes them, printed as print_bytes prints bytes. */
static int print_decoded(run_t *s, const int32_t *ids, int n, mgpu_err_t *err)
{
    char *text;
    size_t len;
    int rc = mgpu_bpe_decode(s->tokenizer, ids, (size_t)n, &text, &len, err);
    if (rc < 0)
        return rc;
    int32_t *b = malloc(sizeof *b * (len ? len : 1));
    if (b == NULL) {
        free(text);
        return mgpu_err_set(err, -ENOMEM, "gpt: malloc for the decoded text failed");
    }
    for (size_t i = 0; i < len; i++)
        b[i] = (unsigned char)text[i];
    print_bytes(s->out, b, (int)len);
    free(b);
    free(text);
    return 0;
}

/* Rank 0: generate tokens after the prompt, one forward of the last context tokens each. */
static int generate(run_t *s, mgpu_err_t *err)
{
    const mgpu_cfg_t *cfg = s->cfg;
    const int T = cfg->context, V = cfg->vocab, text = cfg->dataset == MGPU_DATASET_TEXT;
    size_t cap = (size_t)cfg->generate + 4096;
    int32_t *seq = malloc(sizeof(int32_t) * cap);
    float *logits = malloc(sizeof(float) * V);
    mgpu_rng_t r;
    int n = 0, rc = 0;

    if (seq == NULL || logits == NULL) {
        rc = mgpu_err_set(err, -ENOMEM, "gpt: malloc for generation failed");
        goto out;
    }
    if ((rc = prompt_ids(s, seq, 4096, &n, err)) < 0)
        goto out;
    int start = n;
    mgpu_rng_seed2(&r, cfg->seed, 0x67656e6572617465ull); /* "generate": its own stream */
    for (long long i = 0; i < cfg->generate; i++) {
        int t = n < T ? n : T;
        if ((rc = mgpu_gpt_load(s->m, seq + n - t, NULL, 1, t, err)) < 0 ||
            (rc = mgpu_gpt_forward(s->m, err)) < 0 ||
            (rc = mgpu_gpt_last_logits(s->m, logits, err)) < 0)
            goto out;
        /* only what the tokenizer can spell: the model's vocabulary is often padded past it
         * (GPT-2's 50257 to 50304), and those rows' logits need not lose */
        for (int v = 0; s->tokenizer != NULL && v < V; v++)
            logits[v] = mgpu_bpe_has_id(s->tokenizer, v) ? logits[v] : -INFINITY;
        seq[n++] = sample(logits, V, cfg->temperature, cfg->top_k, &r);
    }
    /* The prompt and what followed it, as one text (as nanoGPT's sample.py prints it). */
    fprintf(s->out,
            "generate: %lld tokens after a prompt of %d (temperature %g, top_k %d, seed %llu):\n",
            cfg->generate, start, cfg->temperature, cfg->top_k, (unsigned long long)cfg->seed);
    if (s->tokenizer != NULL)
        rc = print_decoded(s, seq, n, err);
    else if (text)
        print_bytes(s->out, seq, n);
    for (int i = 0; !text && s->tokenizer == NULL && i < n; i++)
        fprintf(s->out, "%s%d", i > 0 ? " " : "", seq[i]);
    fputc('\n', s->out);
    fflush(s->out);
out:
    free(seq);
    free(logits);
    return rc;
}

/* The gradient's average over the ranks after the backward, bucket by bucket in the order a
 * replayed step queues them during its backward. */
static int allreduce_grads(run_t *s, mgpu_err_t *err)
{
    int rc;
    if (s->comm->world_size == 1)
        return 0;
    for (int b = 0; b < s->n_buckets; b++) {
        mgpu_progress_bucket(s->comm->progress, b);
        if ((rc = s->comm->allreduce_avg(s->comm->ctx, s->m->grads + s->buckets[b].off,
                                         s->buckets[b].n, err)) < 0)
            return rc;
    }
    mgpu_progress_bucket(s->comm->progress, -1);
    return 0;
}

/* A step of one full batch (the sampler's batch `batch` of epoch) replayed
 * from the graphs: the batch and AdamW's step into device memory, then the replays. The
 * progress marks are the host's: it queues the graphs and goes on, so the GPU's work is in
 * the collectives' records. */
static int graph_step(run_t *s, const mgpu_sampler_t *samp, long long epoch, size_t batch,
                      const mgpu_adamw_hparams_t *hp, long long step, mgpu_err_t *err)
{
    const mgpu_ddp_comm_t *comm = s->comm;
    size_t start, count;
    int rc;
    mgpu_progress_phase(comm->progress, MGPU_PHASE_DATA);
    mgpu_sampler_batch(samp, s->cfg->batch_size, batch, &start, &count);
    if ((rc = load_windows(s, &s->train, samp, epoch, start, (int)count, err)) < 0 ||
        (rc = mgpu_gpt_set_step(s->m, hp, step, err)) < 0)
        return rc;
    mgpu_progress_phase(comm->progress, MGPU_PHASE_FORWARD);
    if (comm->world_size == 1 || mgpu_gpt_graph_reduces(s->graph))
        return mgpu_gpt_graph_run(s->graph, MGPU_GPT_GRAPH_STEP, err);
    /* No all-reduce that a graph can hold: the average runs eagerly between the two halves. */
    if ((rc = mgpu_gpt_graph_run(s->graph, MGPU_GPT_GRAPH_GRADS, err)) < 0)
        return rc;
    mgpu_progress_phase(comm->progress, MGPU_PHASE_ALLREDUCE);
    if ((rc = allreduce_grads(s, err)) < 0)
        return rc;
    mgpu_progress_phase(comm->progress, MGPU_PHASE_OPTIMIZER);
    return mgpu_gpt_graph_run(s->graph, MGPU_GPT_GRAPH_UPDATE, err);
}

/* The token files mapped and split into windows (data_val_tokens: all of its windows are
 * held out), and the tokenizer when the cfg names one. */
static int open_data(run_t *s, mgpu_err_t *err)
{
    const mgpu_cfg_t *cfg = s->cfg;
    const int text = cfg->dataset == MGPU_DATASET_TEXT, T = cfg->context;
    mgpu_windows_t none;
    int rc;

    if ((rc = mgpu_shards_open(&s->data, text ? cfg->data_text : cfg->data_tokens,
                               text ? "data_text" : "data_tokens", text, cfg->vocab, err)) < 0)
        return rc;
    if (cfg->data_val_tokens[0] == 0) {
        if ((rc = mgpu_windows_split(&s->data, T, cfg->eval_fraction, &s->train, &s->eval, err)) <
            0)
            return rc;
    } else {
        if ((rc = mgpu_windows_split(&s->data, T, 0, &s->train, &none, err)) < 0 ||
            (rc = mgpu_shards_open(&s->val_data, cfg->data_val_tokens, "data_val_tokens", 0,
                                   cfg->vocab, err)) < 0 ||
            (rc = mgpu_windows_split(&s->val_data, T, 0, &s->eval, &none, err)) < 0)
            return rc;
    }
    if (s->train.n_windows == 0)
        return mgpu_err_set(err, MGPU_E_CONFIG,
                            "gpt: %zu training tokens hold no window of context + 1 = %d",
                            s->train.n_tokens, T + 1);
    if (cfg->tokenizer[0] != 0 && (rc = mgpu_bpe_load(cfg->tokenizer, &s->tokenizer, err)) < 0)
        return rc;
    return 0;
}

/* The model's reuse_grads (model_gpt.h): on where each step's one backward follows the
 * gradients' zeroing and comes before the step's update (grad_accum = 1), unless
 * MGPU_GPT_REUSE_GRADS=0 (to compare; 1 is the default). */
static int reuse_grads(const mgpu_cfg_t *cfg, mgpu_err_t *err)
{
    const char *e = getenv("MGPU_GPT_REUSE_GRADS");
    if (e != NULL && strcmp(e, "0") != 0 && strcmp(e, "1") != 0)
        return mgpu_err_set(err, -EINVAL, "MGPU_GPT_REUSE_GRADS=%s: expected 1 or 0", e);
    return cfg->grad_accum == 1 && (e == NULL || strcmp(e, "1") == 0);
}

int mgpu_gpt_run(mgpu_kernels_t *k, const mgpu_cfg_t *cfg, const mgpu_ddp_comm_t *comm, FILE *out,
                 mgpu_ddp_result_t *result, mgpu_err_t *err)
{
    run_t s = {.k = k, .cfg = cfg, .comm = comm, .out = out ? out : stdout};
    mgpu_ddp_result_t res_local, *res = result ? result : &res_local;
    mgpu_sampler_t samp;
    mgpu_run_resume_t h;
    const int W = comm->world_size, rank = comm->rank, T = cfg->context;
    const size_t B = (size_t)cfg->batch_size, accum = (size_t)cfg->grad_accum;
    int rc;

    mgpu_run_result_init(res);
    if ((rc = mgpu_run_check_comm("gpt", comm, err)) < 0 ||
        (cfg->zero && (rc = mgpu_zero_check("gpt", k, comm, err)) < 0))
        return rc;
    mgpu_gpt_spec_t spec = {.n_layer = cfg->n_layer,
                            .n_head = cfg->n_head,
                            .n_embd = cfg->n_embd,
                            .context = T,
                            .vocab = cfg->vocab,
                            .sharded_optimizer = cfg->zero,
                            .recompute = cfg->recompute};
    if ((rc = reuse_grads(cfg, err)) < 0)
        goto out;
    spec.reuse_grads = rc;
    if ((rc = mgpu_kernels_set_precision(k, cfg->precision, err)) < 0 ||
        (rc = open_data(&s, err)) < 0)
        goto out;
    size_t n_windows = s.train.n_windows;
    if ((rc = mgpu_gpt_create(k, &spec, (int)B, &s.m, err)) < 0 ||
        (rc = init_params(&s, &spec, err)) < 0 ||
        (cfg->zero && (rc = mgpu_zero_gpt_create(s.m, rank, W, &s.zero, err)) < 0) ||
        (rc = mgpu_gpt_buckets(s.m, cfg->bucket_mb, &s.buckets, &s.n_buckets, err)) < 0 ||
        (rc = mgpu_sampler_init(&samp, n_windows, W, rank, cfg->shuffle, cfg->seed, cfg->drop_last,
                                err)) < 0 ||
        (rc = mgpu_k_alloc(k, sizeof h, &s.scratch, err)) < 0)
        goto out;
    s.m->progress = comm->progress;
    s.h_tok = malloc(sizeof(int32_t) * B * T);
    s.h_tgt = malloc(sizeof(int32_t) * B * T);
    if (s.h_tok == NULL || s.h_tgt == NULL) {
        rc = mgpu_err_set(err, -ENOMEM, "gpt: cannot allocate the host buffers");
        goto out;
    }
    if ((rc = resume_or_broadcast(&s, &h, err)) < 0 || (rc = mgpu_gpt_params_changed(s.m, err)) < 0)
        goto out;
    if ((rc = mgpu_run_metrics_open("gpt", cfg, rank, h.status == 1 ? (long long)h.step : -1,
                                    &s.metrics, err)) < 0)
        goto out;
    size_t nb = mgpu_sampler_num_batches(&samp, B, cfg->drop_last_batch);
    long long per_epoch = (long long)(nb / accum);
    if (per_epoch < 1) {
        rc = mgpu_err_set(err, MGPU_E_CONFIG,
                          "gpt: rank %d has %zu batches of %zu windows per epoch, fewer than "
                          "grad_accum = %zu: lower batch_size or grad_accum",
                          rank, nb, B, accum);
        goto out;
    }
    long long planned = cfg->epochs * per_epoch;
    if (cfg->max_steps > 0 && cfg->max_steps < planned)
        planned = cfg->max_steps;
    long long total = cfg->max_steps > 0 ? cfg->max_steps : planned; /* the schedule's length */
    long long step = (long long)h.step, epoch = (long long)h.epoch, batch = (long long)h.batch;
    if (rank == 0) {
        fprintf(s.out,
                "gpt: %zu parameters (%d layers, %d heads, %d wide, context %d, vocab %d%s); %zu "
                "training windows, %zu held out; %lld steps of %zu x %zu x %d windows\n",
                s.m->n_params, spec.n_layer, spec.n_head, spec.n_embd, T, spec.vocab,
                s.m->b16 != NULL ? "; bf16 activations" : "", n_windows, s.eval.n_windows, planned,
                (size_t)W, B, (int)accum);
        fflush(s.out);
        mgpu_zero_print_state(s.out, "gpt", cfg->zero, W,
                              s.zero != NULL ? s.zero->n_moments : 2 * s.m->n_params,
                              2 * s.m->n_params);
        if (s.zero != NULL && cfg->cuda_graph && accum == 1 && k->backend == MGPU_KBACKEND_CUDA)
            mgpu_zero_print_eager(s.out, "gpt");
        if (h.status == 1)
            mgpu_run_print_resumed(s.out, cfg->checkpoint, epoch, step);
    }
    if (h.status == 1) {
        res->resumed_step = step;
        const mgpu_run_place_t then = {h.world_size, h.batch_per_rank},
                               now = {W, (long long)(B * accum)};
        mgpu_run_rescale_position(rank == 0 ? s.out : NULL, &then, &now, per_epoch, &epoch, &batch);
    }
    /* The epochs the run reaches from where it starts (epochs is only a bound where max_steps
     * sets the length; a run resumed at another world size starts at a new place in its
     * epoch). */
    long long left = planned > step ? planned - step : 0;
    long long epochs_run = epoch + (batch + left + per_epoch - 1) / per_epoch;
    if (epochs_run > cfg->epochs)
        epochs_run = cfg->epochs;
    mgpu_adamw_hparams_t hp = {.beta1 = (float)cfg->beta1,
                               .beta2 = (float)cfg->beta2,
                               .eps = (float)cfg->eps,
                               .weight_decay = (float)cfg->weight_decay};
    long long evaluated_at = -1, steps_run = 0;
    int stopped = 0, grown = 0; /* grown: an eager step of a full batch has run */
    /* The average inside the replayed step where the comm can queue it on a stream. */
    mgpu_gpt_graph_reduce_t in_graph = {.fn = comm->allreduce_avg_stream,
                                        .ctx = comm->ctx,
                                        .buckets = s.buckets,
                                        .n_buckets = s.n_buckets,
                                        .overlap = cfg->bucket_overlap};
    if (cfg->cuda_graph && accum == 1 && s.zero == NULL &&
        (rc = mgpu_gpt_graph_create(s.m, 1.0f / ((float)B * T), &hp, (float)cfg->grad_clip,
                                    W > 1 && in_graph.fn != NULL ? &in_graph : NULL, &s.graph,
                                    err)) < 0)
        goto out;
    double t0 = mgpu_run_now_s(), tokens_run = 0, timer_t0 = 0;
    for (; epoch < cfg->epochs && !stopped; epoch++, batch = 0) {
        for (; batch < per_epoch; batch++) {
            if (cfg->max_steps > 0 && step >= cfg->max_steps) {
                stopped = 1;
                break;
            }
            size_t rows = 0, start, count;
            for (size_t j = 0; j < accum; j++) {
                mgpu_sampler_batch(&samp, B, (size_t)batch * accum + j, &start, &count);
                rows += count;
            }
            mgpu_progress_step(comm->progress, step + 1); /* numbered as the progress lines */
            hp.lr = mgpu_gpt_lr(step, cfg->warmup_steps, total, (float)cfg->lr, (float)cfg->lr_min);
            if (s.graph != NULL && grown && rows == B * accum) {
                if ((rc = graph_step(&s, &samp, epoch, (size_t)batch, &hp, step + 1, err)) < 0)
                    goto out;
                res->graphed = 1;
            } else {
                /* Eager work between replays: the graphs are captured again after it. */
                if (s.graph != NULL && (rc = mgpu_gpt_graph_drop(s.graph, err)) < 0)
                    goto out;
                if ((rc = mgpu_gpt_zero_grads(s.m, err)) < 0)
                    goto out;
                /* The micro-batches add their share of the step's mean; only the last one's
                 * gradient is averaged over the ranks (DDP's no_sync on the others). */
                for (size_t j = 0; j < accum; j++) {
                    mgpu_sampler_batch(&samp, B, (size_t)batch * accum + j, &start, &count);
                    mgpu_progress_phase(comm->progress, MGPU_PHASE_DATA);
                    if ((rc = load_windows(&s, &s.train, &samp, epoch, start, (int)count, err)) <
                            0 ||
                        (rc = mgpu_gpt_loss(s.m, 1.0f / ((float)rows * T), 1, err)) < 0)
                        goto out;
                }
                if (s.zero != NULL) {
                    if ((rc = mgpu_zero_gpt_step(s.zero, comm, s.m, &hp, step + 1,
                                                 (float)cfg->grad_clip, err)) < 0)
                        goto out;
                } else {
                    mgpu_progress_phase(comm->progress, MGPU_PHASE_ALLREDUCE);
                    if ((rc = allreduce_grads(&s, err)) < 0)
                        goto out;
                    mgpu_progress_phase(comm->progress, MGPU_PHASE_OPTIMIZER);
                    if ((rc = mgpu_gpt_step(s.m, &hp, step + 1, (float)cfg->grad_clip, NULL, err)) <
                        0)
                        goto out;
                }
                grown |= rows == B * accum;
            }
            step++;
            steps_run++;
            tokens_run += (double)rows * T * W;
            if (steps_run == 1 && comm->mark != NULL) {
                if ((rc = mgpu_k_sync(k, err)) < 0)
                    goto out;
                comm->mark(comm->mark_ctx, "first_step");
            }
            if (cfg->timing_warmup > 0 && steps_run == cfg->timing_warmup) {
                /* The timed steps start once the warm-up's have finished. */
                if ((rc = mgpu_k_sync(k, err)) < 0)
                    goto out;
                timer_t0 = mgpu_run_now_s();
            }
            int log = cfg->log_interval > 0 && step % cfg->log_interval == 0;
            if (log || step == planned) {
                float loss;
                if ((rc = mgpu_k_copy_to_host(k, &loss, s.m->scalars, sizeof loss, err)) < 0 ||
                    (rc = mgpu_run_reduce_host(k, comm, s.scratch, &loss, 1, 1, err)) < 0)
                    goto out;
                res->loss = loss;
                if (log && rank == 0) {
                    double el, tps, eta;
                    mgpu_run_pace(t0, tokens_run, planned, step, steps_run, &el, &tps, &eta);
                    fprintf(s.out,
                            "epoch %lld/%lld step %lld/%lld loss %.4f lr %.3g tokens/s %.0f eta "
                            "%.1fs\n",
                            epoch + 1, epochs_run, step, planned, loss, hp.lr, tps, eta);
                    fflush(s.out);
                    cJSON *o = cJSON_CreateObject();
                    cJSON_AddNumberToObject(o, "epoch", (double)epoch + 1);
                    cJSON_AddNumberToObject(o, "step", (double)step);
                    cJSON_AddNumberToObject(o, "loss", loss);
                    cJSON_AddNumberToObject(o, "lr", hp.lr);
                    cJSON_AddNumberToObject(o, "tokens_per_s", tps);
                    cJSON_AddNumberToObject(o, "elapsed_s", el);
                    mgpu_run_metrics_line(&s.metrics, cfg->metrics_file, o);
                }
            }
            if (cfg->checkpoint_interval > 0 && step % cfg->checkpoint_interval == 0 &&
                (rc = save_checkpoint(&s, (uint64_t)epoch, (uint64_t)batch + 1, (uint64_t)step,
                                      err)) < 0)
                goto out;
            if (mgpu_run_signal_checkpoint(s.out, cfg, rank, step) &&
                (rc = save_checkpoint(&s, (uint64_t)epoch, (uint64_t)batch + 1, (uint64_t)step,
                                      err)) < 0)
                goto out;
        }
        /* The run's end is saved too (where checkpoint_interval's steps did not just save
         * it): a run that max_steps ends mid-epoch can be continued with a larger max_steps. */
        const int saved = cfg->checkpoint_interval > 0 && step % cfg->checkpoint_interval == 0;
        if (stopped) {
            if (!saved && (rc = save_checkpoint(&s, (uint64_t)epoch, (uint64_t)batch,
                                                (uint64_t)step, err)) < 0)
                goto out;
            break;
        }
        if ((cfg->checkpoint_interval == 0 || (!saved && epoch + 1 == cfg->epochs)) &&
            (rc = save_checkpoint(&s, (uint64_t)epoch + 1, 0, (uint64_t)step, err)) < 0)
            goto out;
        if (s.eval.n_windows > 0 && cfg->eval_interval > 0 &&
            (epoch + 1) % cfg->eval_interval == 0) {
            if ((rc = report_eval(&s, epoch, step, res, err)) < 0 ||
                (s.graph != NULL && (rc = mgpu_gpt_graph_drop(s.graph, err)) < 0))
                goto out;
            evaluated_at = step;
        }
    }
    if (cfg->timing_warmup > 0 && steps_run > cfg->timing_warmup) {
        if ((rc = mgpu_k_sync(k, err)) < 0)
            goto out;
        res->timed_steps = steps_run - cfg->timing_warmup;
        res->step_us = 1e6 * (mgpu_run_now_s() - timer_t0) / (double)res->timed_steps;
        if (rank == 0) {
            fprintf(s.out,
                    "step time: %.2f us per step over %lld steps (host clock after a sync, "
                    "%s), %.0f tokens/s\n",
                    res->step_us, res->timed_steps, k->ops->name,
                    (double)B * accum * T * W / (res->step_us * 1e-6));
            fflush(s.out);
        }
    }
    res->seconds = mgpu_run_now_s() - t0;
    if (s.eval.n_windows > 0 && evaluated_at != step &&
        (rc = report_eval(&s, mgpu_run_last_epoch(stopped, epoch, batch), step, res, err)) < 0)
        goto out;
    res->steps = step;
    res->samples_per_s = mgpu_run_rate(tokens_run, res->seconds);
    if (rank == 0) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddBoolToObject(o, "final", 1);
        if (!isnan(res->loss)) /* a resumed run with no step left has none */
            cJSON_AddNumberToObject(o, "loss", res->loss);
        if (!isnan(res->eval_loss)) {
            cJSON_AddNumberToObject(o, "eval_loss", res->eval_loss);
            cJSON_AddNumberToObject(o, "eval_perplexity", exp(res->eval_loss));
        }
        cJSON_AddNumberToObject(o, "steps", (double)step);
        cJSON_AddNumberToObject(o, "tokens_per_s", res->samples_per_s);
        cJSON_AddNumberToObject(o, "seconds", res->seconds);
        cJSON_AddNumberToObject(o, "world_size", W);
        cJSON_AddNumberToObject(o, "zero", cfg->zero);
        cJSON_AddNumberToObject(o, "recompute", cfg->recompute);
        cJSON_AddNumberToObject(o, "optimizer_state_floats",
                                (double)(s.zero != NULL ? s.zero->n_moments : 2 * s.m->n_params));
        if (res->timed_steps > 0) {
            cJSON_AddNumberToObject(o, "step_us", res->step_us);
            cJSON_AddNumberToObject(o, "timed_steps", (double)res->timed_steps);
        }
        cJSON_AddStringToObject(o, "backend", k->ops->name);
        cJSON_AddBoolToObject(o, "cuda_graph", res->graphed);
        mgpu_run_metrics_line(&s.metrics, cfg->metrics_file, o);
    }
    mgpu_progress_phase(comm->progress, MGPU_PHASE_DONE);
    if (rank == 0 && cfg->export_file[0] != 0 && (rc = export_model(&s, err)) < 0)
        goto out;
    if (rank == 0 && cfg->generate > 0 && (rc = generate(&s, err)) < 0)
        goto out;
    rc = mgpu_run_result_params(k, "gpt", s.m->params, s.m->n_params, res, err);
out:
    mgpu_gpt_graph_destroy(s.graph);
    mgpu_zero_gpt_destroy(s.zero);
    if (s.metrics != NULL)
        fclose(s.metrics);
    if (s.scratch != NULL)
        mgpu_k_free(k, s.scratch);
    free(s.h_tok);
    free(s.h_tgt);
    free(s.h_params);
    free(s.buckets);
    mgpu_gpt_destroy(s.m);
    mgpu_windows_free(&s.train);
    mgpu_windows_free(&s.eval);
    mgpu_shards_close(&s.data);
    mgpu_shards_close(&s.val_data);
    mgpu_bpe_free(s.tokenizer);
    if (rc < 0 && result != NULL) {
        free(res->params);
        res->params = NULL;
    }
    if (result == NULL)
        free(res_local.params);
    return rc;
}
