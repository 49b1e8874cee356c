/* mgpu-worker: reads a train.cfg and trains, as every rank of an mgpu-launch (or torchrun,
 * srun, mpirun) job. Exit status: 0 done, 2 bad cfg or data, 1 anything else. */
#include <stdio.h>  /* fprintf */
#include <stdlib.h> /* free */
#include <string.h> /* strcmp */

#include "cfg.h"     /* mgpu_cfg_load */
#include "ddp.h"     /* mgpu_ddp_run */
#include "dp.h"      /* mgpu_dp_run */
#include "kernels.h" /* mgpu_kernels_create */
#ifdef MGPU_HAVE_CUDA
#include "kernels_cuda.h" /* mgpu_kernels_cuda_stream */
#endif
#include "log.h"     /* mgpu_log_init */
#include "mgpu.h"    /* mgpu_init, collectives */
#include "version.h" /* MGPU_VERSION */

#include "bpe.h"        /* mgpu_bpe_*: --encode */
#include "checkpoint.h" /* mgpu_ckpt_remove_stale */
#include "run_util.h"   /* mgpu_run_signals_hold */
#include "shards.h"     /* mgpu_shards_*: --encode's input and output */
#include "escape.h"     /* mgpu_escape */

/* The collectives DDP calls, on the kernels backend's stream (NULL on the CPU), so an NCCL
 * collective is ordered after the kernels that wrote its buffer. */
typedef struct comm_on_stream {
    mgpu_comm_t *comm;
    void *stream;
    int rank;
} comm_on_stream_t;

static int avg(void *c, float *b, size_t n, mgpu_err_t *e)
{
    comm_on_stream_t *cs = c;
    return mgpu_allreduce_f32(cs->comm, b, n, MGPU_AVG, cs->stream, e);
}

static int sum(void *c, float *b, size_t n, mgpu_err_t *e)
{
    comm_on_stream_t *cs = c;
    return mgpu_allreduce_f32(cs->comm, b, n, MGPU_SUM, cs->stream, e);
}

static int bcast(void *c, void *b, size_t n, int root, mgpu_err_t *e)
{
    comm_on_stream_t *cs = c;
    return mgpu_broadcast(cs->comm, b, n, root, cs->stream, e);
}

/* The gradient buckets' average, on the all-reduce stream of the GPU step (gpustep.h). */
static int avg_stream(void *c, float *b, size_t n, void *stream, mgpu_err_t *e)
{
    comm_on_stream_t *cs = c;
    return mgpu_allreduce_f32(cs->comm, b, n, MGPU_AVG, stream, e);
}

/* zero = 1: this rank's block of the gradients averaged in place, everyone's block of the
 * parameters gathered in place (mgpu.h's in-place forms). */
static int rs_avg(void *c, float *b, size_t n, mgpu_err_t *e)
{
    comm_on_stream_t *cs = c;
    return mgpu_reduce_scatter(cs->comm, b, b + (size_t)cs->rank * n, n, MGPU_DTYPE_F32, MGPU_AVG,
                               cs->stream, e);
}

static int gather(void *c, float *b, size_t n, mgpu_err_t *e)
{
    comm_on_stream_t *cs = c;
    return mgpu_all_gather(cs->comm, b + (size_t)cs->rank * n, b, n, MGPU_DTYPE_F32, cs->stream, e);
}

static void mark(void *ctx, const char *event)
{
    mgpu_timeline_mark(ctx, event);
}

/* bad names the argument that was not understood (escaped: it may carry control bytes), or is
 * NULL when the cfg is missing. */
static int usage(const char *bad)
{
    char shown[256];

    if (bad != NULL)
        fprintf(stderr,
                "mgpu-worker: error: unknown option '%s' (expected a TRAIN.CFG, --check, "
                "--encode, --help or --version)\n",
                mgpu_escape(bad, shown, sizeof shown));
    fprintf(stderr, "usage: mgpu-worker TRAIN.CFG [key=value ...]\n"
                    "       mgpu-worker --check TRAIN.CFG [key=value ...]\n"
                    "       mgpu-worker --encode TOKENIZER.JSON TEXT OUT.bin\n"
                    "Try 'mgpu-worker --help' for more information.\n");
    return 2;
}

/* --help, in the layout help2man turns into mgpu-worker(1). */
static int help(void)
{
    printf("Usage: mgpu-worker TRAIN.CFG [KEY=VALUE ...]\n"
           "  or:  mgpu-worker --check TRAIN.CFG [KEY=VALUE ...]\n"
           "  or:  mgpu-worker --encode TOKENIZER.JSON TEXT OUT.bin\n"
           "Train a model data-parallel as one rank of a job, with the settings of TRAIN.CFG.\n"
           "\n"
           "mgpu-worker is what 'mgpu-launch --nproc_per_node=N TRAIN.CFG' runs on every rank.\n"
           "It reads its rank and device from the environment that mgpu-launch, torchrun,\n"
           "srun or mpirun set (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, ...; the\n"
           "device is LOCAL_RANK among CUDA_VISIBLE_DEVICES), reads TRAIN.CFG, applies the\n"
           "KEY=VALUE overrides that follow it (the keys of the file, applied after it), and\n"
           "trains: data, DistributedSampler, model, loss, gradient all-reduce, optimizer.\n"
           "\n"
           "Options:\n"
           "      --check    only check TRAIN.CFG and the overrides (keys, values, data\n"
           "                 files) and exit; nothing starts (mgpu-launch runs this before\n"
           "                 it starts any worker)\n"
           "      --encode   encode the file TEXT with the byte-level BPE of TOKENIZER.JSON\n"
           "                 (Hugging Face's format, GPT-2's tokenizer) into OUT.bin, an\n"
           "                 llm.c token shard (uint16 ids, or uint32 past 65535), for\n"
           "                 data_tokens\n"
           "  -h, --help     display this help and exit\n"
           "      --version  output version information and exit\n"
           "\n"
           "Exit status:\n"
           "  0  training finished, or --check found the cfg valid\n"
           "  1  any other failure (a device, a collective, a peer that died)\n"
           "  2  bad usage, or a bad cfg or data file (the message names file:line, the\n"
           "     value and what is accepted)\n"
           "\n"
           "The keys of TRAIN.CFG, their defaults and meaning: see train.cfg(5).\n");
    return 0;
}

typedef struct {
    const mgpu_bpe_t *t;
    const mgpu_shard_t *text;
    int32_t *ids;
    size_t n;
} encode_job_t;

static int encode_text(void *ctx, mgpu_err_t *err)
{
    encode_job_t *j = ctx;
    return mgpu_bpe_encode(j->t, (const char *)j->text->map, j->text->n, &j->ids, &j->n, err);
}

/* --encode: TEXT through the tokenizer into an llm.c shard. 2 for a bad tokenizer or input,
 * 1 when the output cannot be written. */
static int encode(const char *tokenizer, const char *in, const char *out)
{
    mgpu_err_t err = {0};
    mgpu_bpe_t *t = NULL;
    mgpu_shards_t text = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    int version = 0, rc;

    if ((rc = mgpu_bpe_load(tokenizer, &t, &err)) < 0 ||
        (rc = mgpu_shards_open(&text, in, "the text", 1, 256, &err)) < 0)
        goto out;
    if (text.n_files != 1) {
        rc = mgpu_err_set(&err, MGPU_E_USAGE, "--encode: '%s' names %d files, expected one", in,
                          text.n_files);
        goto out;
    }
    /* the text is mapped: read under a guard in case it is cut short meanwhile */
    encode_job_t job = {.t = t, .text = &text.f[0]};
    rc = mgpu_shards_guarded(&text, 0, encode_text, &job, &err);
    ids = job.ids;
    n = job.n;
    if (rc < 0 || (rc = mgpu_shards_write(out, ids, n, &version, &err)) < 0)
        goto out;
    printf("encode: %zu bytes of %s into %zu tokens, %s (llm.c shard version %d)\n", text.f[0].n,
           in, n, out, version);
out:
    free(ids);
    mgpu_shards_close(&text);
    mgpu_bpe_free(t);
    if (rc < 0)
        mgpu_error("%s", err.msg);
    return rc == 0 ? 0 : rc == MGPU_E_CONFIG || rc == MGPU_E_USAGE ? 2 : 1;
}

int main(int argc, char **argv)
{
    mgpu_cfg_t cfg;
    mgpu_err_t err = {0};
    mgpu_ctx_t *ctx = NULL;
    mgpu_comm_t *comm = NULL;
    mgpu_kernels_t *k = NULL;
    int rc;

    mgpu_log_init("mgpu-worker", MGPU_LOG_WARN);
    if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0))
        return help();
    if (argc == 2 && strcmp(argv[1], "--version") == 0) {
        printf("mgpu-worker %s\n", MGPU_VERSION);
        return 0;
    }
    if (argc >= 2 && strcmp(argv[1], "--encode") == 0) {
        if (argc != 5) {
            fprintf(stderr, "mgpu-worker: error: --encode takes TOKENIZER.JSON TEXT OUT.bin\n");
            return usage(NULL);
        }
        return encode(argv[2], argv[3], argv[4]);
    }
    /* --check: validate only (mgpu-launch runs this before it starts any worker). */
    int check = argc >= 3 && strcmp(argv[1], "--check") == 0;
    argv += check;
    argc -= check;
    if (argc < 2)
        return usage(NULL);
    if (argv[1][0] == '-')
        return usage(argv[1]);
    /* Step 1: the cfg and the command-line overrides. */
    if ((rc = mgpu_cfg_read(argv[1], &cfg, &err)) < 0)
        goto fail;
    for (int i = 2; i < argc; i++)
        if ((rc = mgpu_cfg_override(&cfg, argv[i], &err)) < 0)
            goto fail;
    if ((rc = mgpu_cfg_check(&cfg, &err)) < 0)
        goto fail;
    if (check)
        return 0;
    mgpu_run_signals_hold(); /* before any thread: the loop takes SIGUSR1/2 between steps */
    /* Step 2: who am I, which device. */
    if ((rc = mgpu_init(NULL, &ctx, &err)) < 0)
        goto fail;
    const mgpu_rank_info_t *ri = mgpu_rank(ctx);
    const mgpu_device_info_t *dev = mgpu_device(ctx);
    if (cfg.demo_prints) {
        printf("local_rank %d\n", ri->local_rank);
        printf("Let's use %d GPUs!\n", dev->visible_count);
        fflush(stdout);
    }
    /* A kill during a checkpoint write leaves "<checkpoint>.tmp.<pid>" behind: the rank that
     * writes the checkpoint removes those of dead writers before it writes its own. */
    if (cfg.checkpoint[0] != 0 && ri->rank == 0 && mgpu_ckpt_remove_stale(cfg.checkpoint, &err) < 0)
        mgpu_warn("%s", err.msg);
    /* Step 3: train. */
    if (cfg.mode == MGPU_MODE_DP) {
        int n = cfg.dp_devices > 0 ? cfg.dp_devices : dev->is_gpu ? dev->visible_count : 2;
        mgpu_dp_result_t res;
        rc = mgpu_dp_run(dev->is_gpu ? MGPU_KBACKEND_CUDA : MGPU_KBACKEND_CPU, &cfg, n, stdout, ctx,
                         &res, &err);
        if (rc == 0)
            free(res.run.params);
    } else {
        mgpu_ddp_result_t res;
        /* A real GPU computes unless the cfg asks for CPU collectives, whose buffers are host
         * memory; a simulated GPU stands in for one on the CPU. Ranks that share a GPU
         * (--allow_gpu_sharing) cannot meet in NCCL ("Duplicate GPU detected"), so with
         * backend = auto they train on the CPU, and say so. */
        int gpu = dev->is_gpu && !dev->simulated && cfg.backend != MGPU_BACKEND_CPU;
        int shared = ri->local_world_size > dev->visible_count;
        if (gpu && shared && ri->world_size > 1 && cfg.backend == MGPU_BACKEND_AUTO) {
            if (ri->local_rank == 0)
                mgpu_warn("%d ranks share %d GPU(s) (--allow_gpu_sharing): NCCL cannot put two "
                          "ranks on one GPU, so they train on the CPU",
                          ri->local_world_size, dev->visible_count);
            gpu = 0;
        }
        /* A world of one rank exchanges nothing: with backend = auto its collectives are the
         * CPU communicator's no-ops, since an NCCL communicator would take its set-up time and
         * about 0.6 GiB of device memory for buffers no collective uses (backend = nccl still
         * makes one). */
        mgpu_backend_t cb = gpu ? cfg.backend : MGPU_BACKEND_CPU;
        if (gpu && ri->world_size == 1 && cfg.backend == MGPU_BACKEND_AUTO)
            cb = MGPU_BACKEND_CPU;
        if ((rc = mgpu_kernels_create(gpu ? MGPU_KBACKEND_CUDA : MGPU_KBACKEND_CPU, dev->ordinal,
                                      &k, &err)) < 0 ||
            (rc = mgpu_comm_create(ctx, cb, cfg.timeout_s, &comm, &err)) < 0)
            goto fail;
        if (gpu && ri->world_size > 1 && mgpu_comm_backend(comm) != MGPU_BACKEND_NCCL) {
            rc = mgpu_err_set(&err, MGPU_E_CONFIG,
                              "mgpu-worker: rank %d trains on GPU %d but its communicator is not "
                              "NCCL (backend = %s): set backend = cpu to train on the CPU",
                              ri->rank, dev->ordinal,
                              cfg.backend == MGPU_BACKEND_AUTO ? "auto" : "nccl");
            goto fail;
        }
        comm_on_stream_t cs = {.comm = comm, .stream = NULL, .rank = ri->rank};
#ifdef MGPU_HAVE_CUDA
        cs.stream = mgpu_kernels_cuda_stream(k);
#endif
        mgpu_ddp_comm_t dc = {.rank = ri->rank,
                              .world_size = ri->world_size,
                              .ctx = &cs,
                              .allreduce_avg = avg,
                              .allreduce_sum = sum,
                              .broadcast = bcast,
                              .allreduce_avg_stream = avg_stream,
                              .reduce_scatter_avg = rs_avg,
                              .all_gather = gather,
                              .mark = mark,
                              .mark_ctx = ctx,
                              .progress = ctx};
        rc = mgpu_ddp_run(k, &cfg, &dc, stdout, &res, &err);
        if (rc == 0)
            free(res.params);
    }
    if (rc < 0)
        goto fail;
    mgpu_comm_destroy(comm);
    mgpu_kernels_destroy(k);
    mgpu_finalize(ctx);
    return 0;
fail:
    mgpu_error("%s", err.msg);
    mgpu_comm_destroy(comm);
    mgpu_kernels_destroy(k);
    mgpu_finalize(ctx);
    return rc == MGPU_E_CONFIG ? 2 : 1;
}
