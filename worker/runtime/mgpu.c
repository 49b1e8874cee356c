/* mgpu.c - the context (rank, device, store) and communicators over the backends.
 *
 * mgpu_init reads the rank (rank.c), picks the device (device.c over common/devices.h) and
 * connects to the store when mgpu-launch gave one. Communicators dispatch to a backend: NCCL
 * (comm_nccl.cu, in builds with CUDA) or the CPU backend, which joins the ranks of one host
 * in shared memory (shm.c) and the nodes over TCP (tcp.c). */
#include "mgpu.h"

#include <errno.h>      /* ENOMEM */
#include <stdarg.h>     /* va_list */
#include <stdio.h>      /* snprintf */
#include <stdint.h>     /* SIZE_MAX */
#include <stdlib.h>     /* calloc, getenv */
#include <string.h>     /* memmove */
#include <sys/random.h> /* getrandom */
#include <time.h>       /* clock_gettime */
#include <unistd.h>     /* getppid */

#include "beacon.h"    /* mgpu_beacon_*: the progress page */
#include "comm_nccl.h" /* mgpu_nccl_* (defined in CUDA builds only) */
#include "device.h"    /* mgpu_device_select */
#include "devices.h"   /* mgpu_devices_discover, mgpu_devices_visible */
#include "dtype.h"     /* mgpu_dtype_reduce */
#include "shm.h"       /* mgpu_shm_* */
#include "store.h"     /* mgpu_store_connect_env */
#include "log.h"       /* mgpu_warn */
#include "tcp.h"       /* mgpu_tcp_* */
#include "timeline.h"  /* mgpu_timeline_* */

/* comm_nccl.cu is compiled, and NCCL linked, only where the Makefile found nvcc. */
#if defined(MGPU_HAVE_CUDA) && MGPU_HAVE_CUDA
#define MGPU_NCCL_BUILT 1
#else
#define MGPU_NCCL_BUILT 0
#endif

#define MGPU_DEFAULT_STORE_TIMEOUT_S 60.0
#define MGPU_DEFAULT_COMM_TIMEOUT_S 300.0

struct mgpu_ctx {
    mgpu_rank_info_t rank;
    mgpu_device_info_t dev;
    mgpu_store_t *store; /* NULL without MGPU_STORE_ADDR */
    int comms;           /* communicators created so far: names their segments */
    char token[512];     /* what makes this job's shared-memory names unique on the host */
    mgpu_timeline_t timeline;
    int timeline_warned;  /* one warning for a failing publication, not one per mark */
    mgpu_beacon_t beacon; /* where this rank is, for the launcher */
};

/* Across nodes the CPU backend is hierarchical: ranks of a node meet in shared memory, and
 * the node leaders (local rank 0) in a TCP ring. Ranks are numbered node by node
 * (rank = node * local_size + local_rank), as torchrun and mgpu-launch number them. */
struct mgpu_comm {
    mgpu_ctx_t *ctx;
    mgpu_backend_t backend;
    double timeout_s;
    int rank, world, node, nnodes, local, local_size;
    mgpu_shm_t *shm;   /* the node's ranks; NULL when alone on the node */
    mgpu_tcp_t *tcp;   /* leaders only, when there are several nodes */
    mgpu_nccl_t *nccl; /* the NCCL backend's; then shm and tcp are NULL */
    int depth;         /* collectives in progress: those a collective calls are not counted */
};

static int mgpu_env_flag(const char *name, int *out, mgpu_err_t *err)
{
    const char *v = getenv(name);

    *out = 0;
    if (v == NULL || strcmp(v, "") == 0 || strcmp(v, "0") == 0)
        return 0;
    if (strcmp(v, "1") == 0) {
        *out = 1;
        return 0;
    }
    return mgpu_err_set(err, MGPU_E_USAGE, "%s=\"%s\": expected 0 or 1", name, v);
}

/* Two jobs on one host must never meet in the same segment. With a store, the segment's
 * token is a random value drawn per job (mgpu_shm_token); without, the run id and attempt are
 * part of the name already, and this adds what identifies the job's rendezvous:
 * MASTER_ADDR:MASTER_PORT (torchrun binds that port, so two live jobs cannot share it), else
 * the parent process (ranks started by hand from one shell share it; Slurm and Open MPI give
 * unique run ids anyway). */
static void mgpu_job_token(mgpu_ctx_t *c)
{
    const char *ma = getenv("MASTER_ADDR"), *mp = getenv("MASTER_PORT");

    if (mp != NULL)
        snprintf(c->token, sizeof c->token, "master=%s:%s", ma ? ma : "", mp);
    else if (strcmp(c->rank.run_id, "none") == 0)
        snprintf(c->token, sizeof c->token, "ppid=%d", (int)getppid());
    else
        c->token[0] = '\0';
}

void mgpu_timeline_mark(mgpu_ctx_t *ctx, const char *event)
{
    int rc = mgpu_timeline_add(&ctx->timeline, event, mgpu_timeline_now_us());
    char key[64], text[MGPU_TIMELINE_MAX * (MGPU_TIMELINE_NAME + 24)];
    mgpu_err_t err;
    size_t len;

    if (rc < 0) {
        mgpu_warn("mgpu_timeline_mark(\"%s\"): %s", event ? event : "(null)",
                  rc == MGPU_E_RANGE ? "the timeline is full"
                                     : "a name is 1 to 31 letters, digits, '_', '-' or '.'");
        return;
    }
    if (rc == 0 || ctx->store == NULL)
        return;
    len = mgpu_timeline_format(&ctx->timeline, text, sizeof text);
    snprintf(key, sizeof key, "timeline/%d", ctx->rank.rank);
    if (mgpu_store_set(ctx->store, key, text, len < sizeof text ? len : sizeof text - 1, &err) <
            0 &&
        !ctx->timeline_warned++)
        mgpu_warn("rank %d: publishing the startup timeline: %s", ctx->rank.rank, err.msg);
}

size_t mgpu_timeline_get(const mgpu_ctx_t *ctx, char *buf, size_t len)
{
    return mgpu_timeline_format(&ctx->timeline, buf, len);
}

int mgpu_init(const mgpu_init_opts_t *opts, mgpu_ctx_t **out, mgpu_err_t *err)
{
    int64_t init_us = mgpu_timeline_now_us(), exec_us = mgpu_timeline_process_start_us();
    mgpu_init_opts_t o = {1, MGPU_DEFAULT_STORE_TIMEOUT_S};
    mgpu_gpu_list_t *installed = NULL;
    mgpu_visible_t *vis = NULL;
    mgpu_device_req_t req;
    char described[1024];
    mgpu_ctx_t *c;
    int rc;

    if (opts != NULL) {
        o = *opts;
        if (o.store_timeout_s <= 0)
            o.store_timeout_s = MGPU_DEFAULT_STORE_TIMEOUT_S;
    }
    c = calloc(1, sizeof *c);
    installed = malloc(sizeof *installed); /* ~20 KiB each: not on a worker's stack */
    vis = malloc(sizeof *vis);
    if (c == NULL || installed == NULL || vis == NULL) {
        rc = mgpu_err_set(err, -ENOMEM, "mgpu_init: out of memory");
        goto fail;
    }
    if (exec_us > 0)
        mgpu_timeline_add(&c->timeline, "exec", exec_us);
    mgpu_timeline_add(&c->timeline, "init", init_us);
    if ((rc = mgpu_rank_info_from_env(&c->rank, err)) < 0)
        goto fail;
    mgpu_beacon_attach(&c->beacon, c->rank.rank);
    memset(&req, 0, sizeof req);
    req.rank = c->rank.rank;
    req.local_rank = mgpu_device_virtual_local_rank() ? 0 : c->rank.local_rank;
    req.local_world_size = c->rank.local_world_size;
    req.want_gpu = o.want_gpu;
    if ((rc = mgpu_env_flag("MGPU_ALLOW_GPU_SHARING", &req.allow_sharing, err)) < 0)
        goto fail;
    if ((rc = mgpu_devices_discover(installed, getenv("MGPU_SIM_GPUS"), NULL, err)) < 0)
        goto fail;
    mgpu_devices_visible(installed, getenv("CUDA_VISIBLE_DEVICES"), vis);
    mgpu_devices_describe(installed, vis, described, sizeof described);
    req.described = described;
    if ((rc = mgpu_device_select(installed, vis, &req, &c->dev, err)) < 0)
        goto fail;
    mgpu_timeline_mark(c, "device");
    if (getenv(MGPU_ENV_STORE_ADDR) != NULL) {
        if ((rc = mgpu_store_connect_env(o.store_timeout_s, &c->store, err)) < 0)
            goto fail;
        mgpu_timeline_mark(c, "store"); /* publishes the marks so far too */
    }
    mgpu_job_token(c);
    free(installed);
    free(vis);
    *out = c;
    return 0;
fail:
    free(installed);
    free(vis);
    if (c != NULL)
        mgpu_beacon_detach(&c->beacon);
    free(c);
    return rc;
}

void mgpu_finalize(mgpu_ctx_t *ctx)
{
    if (ctx == NULL)
        return;
    if (ctx->store != NULL)
        mgpu_store_close(ctx->store);
    mgpu_beacon_detach(&ctx->beacon);
    free(ctx);
}

/* The progress calls: one test (MGPU_PROGRESS=0, or no context) and a few stores. */
void mgpu_progress_step(mgpu_ctx_t *ctx, long long step)
{
    if (ctx != NULL && ctx->beacon.page != NULL)
        mgpu_beacon_step(ctx->beacon.page, step);
}

void mgpu_progress_phase(mgpu_ctx_t *ctx, mgpu_phase_t phase)
{
    if (ctx != NULL && ctx->beacon.page != NULL)
        mgpu_beacon_phase(ctx->beacon.page, (uint32_t)phase);
}

void mgpu_progress_label(mgpu_ctx_t *ctx, const char *label)
{
    mgpu_progress_page_t *p;
    int64_t now;
    size_t i = 0;

    if (ctx == NULL || (p = ctx->beacon.page) == NULL)
        return;
    now = mgpu_beacon_now_ns();
    mgpu_progress_write_begin(p);
    for (; label != NULL && label[i] != '\0' && i < sizeof p->label - 1; i++)
        p->label[i] = label[i];
    p->label[i] = '\0';
    p->moves++;
    p->moved_ns = now;
    mgpu_progress_write_end(p);
}

void mgpu_progress_bucket(mgpu_ctx_t *ctx, int bucket)
{
    if (ctx != NULL)
        ctx->beacon.bucket = bucket >= 0 ? bucket : -1;
}

const mgpu_rank_info_t *mgpu_rank(const mgpu_ctx_t *ctx)
{
    return &ctx->rank;
}

const mgpu_device_info_t *mgpu_device(const mgpu_ctx_t *ctx)
{
    return &ctx->dev;
}

mgpu_store_t *mgpu_ctx_store(const mgpu_ctx_t *ctx)
{
    return ctx->store;
}

/* The shared-memory name's job token: with a store, a random one that local rank 0 of the
 * node draws and publishes, which no other job can share; without, the environment's. */
static int mgpu_shm_token(mgpu_ctx_t *ctx, int index, char *tok, size_t len, double timeout_s,
                          mgpu_err_t *err)
{
    const mgpu_rank_info_t *r = &ctx->rank;
    char key[128];
    void *v = NULL;
    size_t vl = 0;
    int rc;

    if (ctx->store == NULL) {
        snprintf(tok, len, "%s node=%d", ctx->token, r->node_rank);
        return 0;
    }
    snprintf(key, sizeof key, "mgpu/cpu/%d/shm/%d", index, r->node_rank);
    if (r->local_rank == 0) {
        unsigned long long nonce;
        if (getrandom(&nonce, sizeof nonce, 0) != sizeof nonce)
            return mgpu_err_set(err, -errno, "getrandom: %s", strerror(errno));
        snprintf(tok, len, "%016llx", nonce);
        return mgpu_store_set(ctx->store, key, tok, strlen(tok), err);
    }
    if ((rc = mgpu_store_get(ctx->store, key, timeout_s, &v, &vl, err)) < 0)
        return rc;
    snprintf(tok, len, "%.*s", (int)(vl < len ? vl : len - 1), (char *)v);
    free(v);
    return 0;
}

static void mgpu_comm_after_leaders(mgpu_comm_t *c);

static int mgpu_comm_create_nccl(mgpu_ctx_t *ctx, int index, double timeout_s, mgpu_comm_t **out,
                                 mgpu_err_t *err)
{
#if MGPU_NCCL_BUILT
    const mgpu_rank_info_t *r = &ctx->rank;
    mgpu_nccl_opts_t o;
    mgpu_comm_t *c;
    char key[64];
    int rc;

    if (!ctx->dev.is_gpu)
        return mgpu_err_set(err, MGPU_E_DEVICE,
                            "mgpu_comm_create(NCCL): rank %d (LOCAL_RANK=%d) has no %sGPU "
                            "(%d visible); use MGPU_BACKEND_CPU or AUTO",
                            r->rank, r->local_rank,
                            ctx->dev.simulated ? "real (only a simulated) " : "",
                            ctx->dev.visible_count);
    c = calloc(1, sizeof *c);
    if (c == NULL)
        return mgpu_err_set(err, -ENOMEM, "mgpu_comm_create: out of memory");
    c->ctx = ctx;
    c->backend = MGPU_BACKEND_NCCL;
    c->timeout_s = timeout_s;
    c->rank = r->rank;
    c->world = r->world_size;
    c->node = r->node_rank;
    c->nnodes = r->nnodes;
    c->local = r->local_rank;
    c->local_size = r->local_world_size;
    snprintf(key, sizeof key, "mgpu/nccl/%d/id", index);
    memset(&o, 0, sizeof o);
    o.ctx = ctx;
    o.store = ctx->store;
    o.id_key = key;
    o.rank = r->rank;
    o.world = r->world_size;
    o.ordinal = ctx->dev.ordinal;
    o.timeout_s = timeout_s;
    o.beacon = &ctx->beacon;
    if ((rc = mgpu_nccl_open(&o, &c->nccl, err)) < 0) {
        free(c);
        return rc;
    }
    mgpu_timeline_mark(ctx, "comm");
    *out = c;
    return 0;
#else
    return mgpu_err_set(err, MGPU_E_USAGE,
                        "mgpu_comm_create(NCCL): NCCL backend not built: this libmgpu was "
                        "compiled without CUDA (CUDA=0, or no nvcc when it was built); rebuild "
                        "with nvcc on the PATH, or use MGPU_BACKEND_CPU or AUTO");
#endif
}

int mgpu_comm_create(mgpu_ctx_t *ctx, mgpu_backend_t backend, double timeout_s, mgpu_comm_t **out,
                     mgpu_err_t *err)
{
    const mgpu_rank_info_t *r = &ctx->rank;
    mgpu_comm_t *c;
    int rc, index = ctx->comms++;

    /* NCCL cannot put two ranks of one communicator on one GPU ("Duplicate GPU detected"):
     * ranks that share GPUs (--allow_gpu_sharing) meet on the CPU backend instead. */
    if (backend == MGPU_BACKEND_AUTO)
        backend = ctx->dev.is_gpu && !ctx->dev.simulated && MGPU_NCCL_BUILT &&
                          r->local_world_size <= ctx->dev.visible_count
                      ? MGPU_BACKEND_NCCL
                      : MGPU_BACKEND_CPU;
    if (backend == MGPU_BACKEND_NCCL)
        return mgpu_comm_create_nccl(
            ctx, index, timeout_s > 0 ? timeout_s : MGPU_DEFAULT_COMM_TIMEOUT_S, out, err);
    if (backend != MGPU_BACKEND_CPU)
        return mgpu_err_set(err, MGPU_E_USAGE, "mgpu_comm_create: unknown backend %d",
                            (int)backend);
    if (r->world_size != r->nnodes * r->local_world_size ||
        r->rank != r->node_rank * r->local_world_size + r->local_rank)
        return mgpu_err_set(err, MGPU_E_USAGE,
                            "mgpu_comm_create(CPU): RANK=%d, LOCAL_RANK=%d, node %d of %d, "
                            "LOCAL_WORLD_SIZE=%d, WORLD_SIZE=%d: the CPU backend needs the same "
                            "number of ranks on every node, numbered node by node (RANK = node "
                            "* LOCAL_WORLD_SIZE + LOCAL_RANK)",
                            r->rank, r->local_rank, r->node_rank, r->nnodes, r->local_world_size,
                            r->world_size);
    if (r->nnodes > 1 && ctx->store == NULL)
        return mgpu_err_set(err, MGPU_E_USAGE,
                            "mgpu_comm_create(CPU): %d nodes need mgpu's store to find each "
                            "other (MGPU_STORE_ADDR, set by mgpu-launch); PyTorch's TCPStore "
                            "at MASTER_ADDR is not spoken",
                            r->nnodes);
    c = calloc(1, sizeof *c);
    if (c == NULL)
        return mgpu_err_set(err, -ENOMEM, "mgpu_comm_create: out of memory");
    c->ctx = ctx;
    c->backend = MGPU_BACKEND_CPU;
    c->timeout_s = timeout_s > 0 ? timeout_s : MGPU_DEFAULT_COMM_TIMEOUT_S;
    c->rank = r->rank;
    c->world = r->world_size;
    c->node = r->node_rank;
    c->nnodes = r->nnodes;
    c->local = r->local_rank;
    c->local_size = r->local_world_size;
    if (c->local_size > 1) {
        mgpu_shm_opts_t so;
        char name[64], tok[600];
        memset(&so, 0, sizeof so);
        if ((rc = mgpu_shm_token(ctx, index, tok, sizeof tok, c->timeout_s, err)) < 0)
            goto fail;
        mgpu_shm_name(name, sizeof name, r->run_id, r->restart_count, tok, index);
        so.name = name;
        so.rank = c->local;
        so.size = c->local_size;
        so.timeout_s = c->timeout_s;
        so.spin_us = -1;
        so.lost = ctx->beacon.lost;
        if ((rc = mgpu_shm_open(&so, &c->shm, err)) < 0)
            goto fail;
    }
    if (c->nnodes > 1 && c->local == 0) {
        mgpu_tcp_opts_t to;
        char key[64];
        memset(&to, 0, sizeof to);
        snprintf(key, sizeof key, "mgpu/cpu/%d/ring", index);
        to.store = ctx->store;
        to.key = key;
        to.member = c->node;
        to.n = c->nnodes;
        to.ranks_per_member = c->local_size;
        to.advertise = getenv("MGPU_CPU_ADDR");
        to.route_host = getenv(MGPU_ENV_STORE_ADDR);
        to.timeout_s = c->timeout_s;
        to.lost = ctx->beacon.lost;
        if ((rc = mgpu_tcp_open(&to, &c->tcp, err)) < 0)
            goto fail;
    }
    /* Across nodes, creating the communicator is itself collective: without this barrier a
     * node whose leader cannot reach the ring would look fine to its other ranks until their
     * first collective. */
    if (c->nnodes > 1) {
        mgpu_comm_after_leaders(c); /* the leader's set-up took part of the deadline */
        if ((rc = mgpu_barrier(c, err)) < 0)
            goto fail;
    }
    mgpu_timeline_mark(ctx, "comm");
    *out = c;
    return 0;
fail:
    /* The node's other ranks learn why at once (instead of "closed the communicator"). */
    if (c->shm != NULL)
        mgpu_shm_abort(c->shm, rc, err ? err->msg : mgpu_strerror(rc));
    mgpu_shm_close(c->shm);
    mgpu_tcp_close(c->tcp);
    free(c);
    return rc;
}

void mgpu_comm_destroy(mgpu_comm_t *comm)
{
    if (comm == NULL)
        return;
#if MGPU_NCCL_BUILT
    mgpu_nccl_close(comm->nccl);
#endif
    mgpu_shm_close(comm->shm);
    mgpu_tcp_close(comm->tcp);
    free(comm);
}

mgpu_backend_t mgpu_comm_backend(const mgpu_comm_t *comm)
{
    return comm->backend;
}

/* A collective across nodes is a chain of steps; a leader whose step between nodes fails
 * breaks its node's shared memory too, so the node's other ranks fail at once with its
 * reason instead of waiting for their deadline. */
static int mgpu_comm_step_failed(mgpu_comm_t *c, int rc, mgpu_err_t *err)
{
    if (rc < 0 && c->shm != NULL)
        mgpu_shm_abort(c->shm, rc, err ? err->msg : mgpu_strerror(rc));
    return rc;
}

static void mgpu_comm_context(mgpu_comm_t *c, char *what, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void mgpu_comm_context(mgpu_comm_t *c, char *what, size_t len, const char *fmt, ...)
{
    va_list ap;
    int n;
    va_start(ap, fmt);
    n = vsnprintf(what, len, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < len)
        snprintf(what + n, len - (size_t)n, " across %d nodes, rank %d", c->nnodes, c->rank);
    if (c->shm != NULL)
        mgpu_shm_set_context(c->shm, what);
}

static int mgpu_comm_done(mgpu_comm_t *c, int rc)
{
    if (c->shm != NULL) {
        mgpu_shm_set_context(c->shm, NULL);
        mgpu_shm_set_timeout(c->shm, c->timeout_s);
    }
    return rc;
}

/* The node step after the step between nodes waits longer than the leader's deadline: when a
 * node is missing, its leader knows which one and says so (its failure reaches the node at
 * once); the other ranks' own deadline is only the fallback if the leader is stuck. */
static void mgpu_comm_after_leaders(mgpu_comm_t *c)
{
    if (c->shm != NULL)
        mgpu_shm_set_timeout(c->shm, c->timeout_s + (c->timeout_s / 4 > 2 ? c->timeout_s / 4 : 2));
}

static int mgpu_allreduce_f32_run(mgpu_comm_t *comm, float *buf, size_t count, mgpu_redop_t op,
                                  void *stream, mgpu_err_t *err)
{
    char what[160];
    int rc = 0;

    if (op == MGPU_MAX || op == MGPU_MIN)
        return mgpu_allreduce(comm, buf, count, MGPU_DTYPE_F32, op, stream, err);
    if (op != MGPU_SUM && op != MGPU_AVG)
        return mgpu_err_set(err, MGPU_E_USAGE,
                            "mgpu_allreduce_f32: op %d is not an mgpu_redop_t (MGPU_SUM, MGPU_AVG, "
                            "MGPU_MAX, MGPU_MIN)",
                            (int)op);
    if (buf == NULL && count > 0)
        return mgpu_err_set(err, MGPU_E_USAGE, "mgpu_allreduce_f32(count=%zu): buf is NULL", count);
#if MGPU_NCCL_BUILT
    if (comm->nccl != NULL)
        return mgpu_nccl_allreduce_f32(comm->nccl, buf, count, op == MGPU_AVG, stream, err);
#endif
    if (comm->nnodes == 1)
        return comm->shm == NULL
                   ? 0 /* one rank: the sum and the average are the value */
                   : mgpu_shm_allreduce_f32(comm->shm, buf, count, op == MGPU_AVG, err);
    mgpu_comm_context(comm, what, sizeof what, "mgpu_allreduce_f32(count=%zu, %s)", count,
                      op == MGPU_AVG ? "avg" : "sum");
    /* Sum on the node, sum between the leaders, then the leader's result to the node: every
     * rank ends with the leader's bits. */
    if (comm->shm != NULL && (rc = mgpu_shm_allreduce_f32(comm->shm, buf, count, 0, err)) < 0)
        return mgpu_comm_done(comm, rc);
    if (comm->tcp != NULL) {
        if ((rc = mgpu_tcp_allreduce_sum_f32(comm->tcp, buf, count, what, err)) < 0)
            return mgpu_comm_done(comm, mgpu_comm_step_failed(comm, rc, err));
        if (op == MGPU_AVG)
            for (size_t i = 0; i < count; i++)
                buf[i] /= (float)comm->world;
    }
    mgpu_comm_after_leaders(comm);
    if (comm->shm != NULL)
        rc = mgpu_shm_broadcast(comm->shm, buf, count * sizeof *buf, 0, err);
    return mgpu_comm_done(comm, rc);
}

const char *mgpu_redop_name(mgpu_redop_t op)
{
    static const char *const names[] = {"sum", "avg", "max", "min"};
    return (int)op >= 0 && (int)op < 4 ? names[op] : "?";
}

/* The checks every general collective makes: dtype and op in range, buffers, and that
 * count * world elements of dtype fit a size_t. Fills *esz. */
static int mgpu_coll_check(const char *fn, mgpu_comm_t *comm, const void *a, const char *aname,
                           const void *b, const char *bname, size_t count, int dtype, int op,
                           size_t *esz, mgpu_err_t *err)
{
    if (comm == NULL)
        return mgpu_err_set(err, MGPU_E_USAGE, "%s(count=%zu): comm is NULL", fn, count);
    if (!mgpu_dtype_valid(dtype))
        return mgpu_err_set(err, MGPU_E_USAGE,
                            "%s(count=%zu): dtype %d is not an mgpu_dtype_t (MGPU_DTYPE_F32, "
                            "F64, F16, BF16, I32, I64)",
                            fn, count, dtype);
    if (op >= 0 && op != MGPU_SUM && op != MGPU_AVG && op != MGPU_MAX && op != MGPU_MIN)
        return mgpu_err_set(err, MGPU_E_USAGE,
                            "%s(count=%zu, %s): op %d is not an mgpu_redop_t (MGPU_SUM, MGPU_AVG, "
                            "MGPU_MAX, MGPU_MIN)",
                            fn, count, mgpu_dtype_name((mgpu_dtype_t)dtype), op);
    if (count > 0 && (a == NULL || (bname != NULL && b == NULL)))
        return mgpu_err_set(err, MGPU_E_USAGE, "%s(count=%zu, %s): %s is NULL", fn, count,
                            mgpu_dtype_name((mgpu_dtype_t)dtype), a == NULL ? aname : bname);
    *esz = mgpu_dtype_size((mgpu_dtype_t)dtype);
    if (count > SIZE_MAX / *esz / (size_t)comm->world)
        return mgpu_err_set(err, MGPU_E_USAGE,
                            "%s(count=%zu, %s): %d ranks times count elements overflow size_t", fn,
                            count, mgpu_dtype_name((mgpu_dtype_t)dtype), comm->world);
    return 0;
}

/* The CPU backend's general all-reduce: a chunk of every rank's operands is gathered, then
 * each rank reduces it in rank order, so every rank computes the same bits (W times the data
 * crosses shared memory, as in its small-message path: simple, and the same across nodes,
 * where the gather already works). */
#define MGPU_COLL_CHUNK (256u << 10) /* bytes per rank per round */

static int mgpu_cpu_allreduce(mgpu_comm_t *comm, void *buf, size_t count, mgpu_dtype_t dt,
                              mgpu_redop_t op, mgpu_err_t *err)
{
    size_t esz = mgpu_dtype_size(dt), per = MGPU_COLL_CHUNK / esz, w = (size_t)comm->world;
    const void **src;
    char *tmp, what[160];
    int rc = 0;

    if (comm->world == 1 || count == 0)
        return 0; /* one rank: every reduction is the value (an average divides by 1) */
    tmp = malloc(w * (count < per ? count : per) * esz);
    src = malloc(w * sizeof *src);
    if (tmp == NULL || src == NULL) {
        free(tmp);
        free(src);
        return mgpu_err_set(err, -ENOMEM, "mgpu_allreduce(count=%zu, %s, %s): out of memory", count,
                            mgpu_dtype_name(dt), mgpu_redop_name(op));
    }
    snprintf(what, sizeof what, "mgpu_allreduce(count=%zu, %s, %s)", count, mgpu_dtype_name(dt),
             mgpu_redop_name(op));
    for (size_t off = 0; off < count && rc == 0; off += per) {
        size_t m = count - off < per ? count - off : per;
        char *p = (char *)buf + off * esz;
        /* Within a node the messages name this call; across nodes the gather names itself. */
        if (comm->shm != NULL && comm->nnodes == 1)
            mgpu_shm_set_context(comm->shm, what);
        rc = mgpu_allgather(comm, p, tmp, m * esz, NULL, err);
        mgpu_comm_done(comm, rc);
        if (rc < 0)
            break;
        for (size_t q = 0; q < w; q++)
            src[q] = tmp + q * m * esz;
        mgpu_dtype_reduce(p, src, comm->world, m, dt, op);
    }
    free(tmp);
    free(src);
    return rc;
}

static int mgpu_allreduce_run(mgpu_comm_t *comm, void *buf, size_t count, mgpu_dtype_t dtype,
                              mgpu_redop_t op, void *stream, mgpu_err_t *err)
{
    size_t esz;
    int rc;

    if ((rc = mgpu_coll_check("mgpu_allreduce", comm, buf, "buf", NULL, NULL, count, (int)dtype,
                              (int)op, &esz, err)) < 0)
        return rc;
#if MGPU_NCCL_BUILT
    if (comm->nccl != NULL)
        return mgpu_nccl_allreduce(comm->nccl, buf, buf, count, dtype, op, stream, err);
#endif
    if (dtype == MGPU_DTYPE_F32 && (op == MGPU_SUM || op == MGPU_AVG))
        return mgpu_allreduce_f32(comm, buf, count, op, stream, err);
    return mgpu_cpu_allreduce(comm, buf, count, dtype, op, err);
}

static int mgpu_reduce_scatter_run(mgpu_comm_t *comm, const void *send, void *recv,
                                   size_t recvcount, mgpu_dtype_t dtype, mgpu_redop_t op,
                                   void *stream, mgpu_err_t *err)
{
    size_t esz, block;
    char *tmp;
    int rc;

    if ((rc = mgpu_coll_check("mgpu_reduce_scatter", comm, send, "send", recv, "recv", recvcount,
                              (int)dtype, (int)op, &esz, err)) < 0)
        return rc;
#if MGPU_NCCL_BUILT
    if (comm->nccl != NULL)
        return mgpu_nccl_reduce_scatter(comm->nccl, send, recv, recvcount, dtype, op, stream, err);
#endif
    /* An all-reduce of a copy, then this rank's block: the copy keeps send intact (NCCL's
     * contract) and makes the in-place call (recv inside send) safe. */
    block = recvcount * esz;
    if (recvcount == 0)
        return mgpu_cpu_allreduce(comm, NULL, 0, dtype, op, err);
    if ((tmp = malloc(block * (size_t)comm->world)) == NULL)
        return mgpu_err_set(err, -ENOMEM, "mgpu_reduce_scatter(recvcount=%zu, %s): out of memory",
                            recvcount, mgpu_dtype_name(dtype));
    memcpy(tmp, send, block * (size_t)comm->world);
    rc = mgpu_allreduce(comm, tmp, recvcount * (size_t)comm->world, dtype, op, stream, err);
    if (rc == 0)
        memmove(recv, tmp + (size_t)comm->rank * block, block);
    free(tmp);
    return rc;
}

int mgpu_all_gather(mgpu_comm_t *comm, const void *send, void *recv, size_t sendcount,
                    mgpu_dtype_t dtype, void *stream, mgpu_err_t *err)
{
    size_t esz;
    int rc;

    if ((rc = mgpu_coll_check("mgpu_all_gather", comm, send, "send", recv, "recv", sendcount,
                              (int)dtype, -1, &esz, err)) < 0)
        return rc;
    return mgpu_allgather(comm, send, recv, sendcount * esz, stream, err);
}

void *mgpu_comm_nccl(mgpu_comm_t *comm)
{
#if MGPU_NCCL_BUILT
    if (comm != NULL && comm->nccl != NULL)
        return mgpu_nccl_comm(comm->nccl);
#endif
    return NULL;
}

void *mgpu_comm_stream(mgpu_comm_t *comm)
{
#if MGPU_NCCL_BUILT
    if (comm != NULL && comm->nccl != NULL)
        return mgpu_nccl_stream(comm->nccl);
#endif
    return NULL;
}

static int mgpu_broadcast_run(mgpu_comm_t *comm, void *buf, size_t bytes, int root, void *stream,
                              mgpu_err_t *err)
{
    char what[160];
    int rc = 0, root_node, root_local;

    if (buf == NULL && bytes > 0)
        return mgpu_err_set(err, MGPU_E_USAGE, "mgpu_broadcast(bytes=%zu): buf is NULL", bytes);
    if (root < 0 || root >= comm->world)
        return mgpu_err_set(err, MGPU_E_RANGE,
                            "mgpu_broadcast(bytes=%zu, root=%d): root is not a rank of a world "
                            "of %d",
                            bytes, root, comm->world);
#if MGPU_NCCL_BUILT
    if (comm->nccl != NULL)
        return mgpu_nccl_broadcast(comm->nccl, buf, bytes, root, stream, err);
#endif
    if (comm->nnodes == 1)
        return comm->shm == NULL ? 0 : mgpu_shm_broadcast(comm->shm, buf, bytes, root, err);
    root_node = root / comm->local_size;
    root_local = root % comm->local_size;
    mgpu_comm_context(comm, what, sizeof what, "mgpu_broadcast(bytes=%zu, root=%d)", bytes, root);
    /* To the root node's leader, between leaders, then from each leader to its node. */
    if (comm->node == root_node && root_local != 0 && comm->shm != NULL &&
        (rc = mgpu_shm_broadcast(comm->shm, buf, bytes, root_local, err)) < 0)
        return mgpu_comm_done(comm, rc);
    if (comm->tcp != NULL &&
        (rc = mgpu_tcp_broadcast(comm->tcp, buf, bytes, root_node, what, err)) < 0)
        return mgpu_comm_done(comm, mgpu_comm_step_failed(comm, rc, err));
    /* The root node's ranks have it already when the root is not its leader. */
    mgpu_comm_after_leaders(comm);
    if ((comm->node != root_node || root_local == 0) && comm->shm != NULL)
        rc = mgpu_shm_broadcast(comm->shm, buf, bytes, 0, err);
    return mgpu_comm_done(comm, rc);
}

static int mgpu_allgather_run(mgpu_comm_t *comm, const void *send, void *recv, size_t bytes,
                              void *stream, mgpu_err_t *err)
{
    char what[160], *node_block;
    size_t block = bytes * (size_t)comm->local_size;
    int rc = 0;

    if ((send == NULL || recv == NULL) && bytes > 0)
        return mgpu_err_set(err, MGPU_E_USAGE, "mgpu_allgather(bytes=%zu): %s is NULL", bytes,
                            send == NULL ? "send" : "recv");
#if MGPU_NCCL_BUILT
    if (comm->nccl != NULL)
        return mgpu_nccl_allgather(comm->nccl, send, recv, bytes, stream, err);
#endif
    if (comm->nnodes == 1) {
        if (comm->shm != NULL)
            return mgpu_shm_allgather(comm->shm, send, recv, bytes, err);
        if (send != recv)
            memmove(recv, send, bytes);
        return 0;
    }
    mgpu_comm_context(comm, what, sizeof what, "mgpu_allgather(bytes=%zu)", bytes);
    /* The node's ranks are contiguous: gather them into the node's block, exchange blocks
     * between leaders, give the whole to the node. */
    node_block = (char *)recv + (size_t)comm->node * block;
    if (comm->shm != NULL)
        rc = mgpu_shm_allgather(comm->shm, send, node_block, bytes, err);
    else if (send != node_block)
        memmove(node_block, send, bytes);
    if (rc < 0)
        return mgpu_comm_done(comm, rc);
    if (comm->tcp != NULL && (rc = mgpu_tcp_allgather(comm->tcp, recv, block, what, err)) < 0)
        return mgpu_comm_done(comm, mgpu_comm_step_failed(comm, rc, err));
    mgpu_comm_after_leaders(comm);
    if (comm->shm != NULL)
        rc = mgpu_shm_broadcast(comm->shm, recv, block * (size_t)comm->nnodes, 0, err);
    return mgpu_comm_done(comm, rc);
}

static int mgpu_barrier_run(mgpu_comm_t *comm, mgpu_err_t *err)
{
    char what[160];
    int rc = 0;

#if MGPU_NCCL_BUILT
    if (comm->nccl != NULL)
        return mgpu_nccl_barrier(comm->nccl, err);
#endif
    if (comm->nnodes == 1)
        return comm->shm == NULL ? 0 : mgpu_shm_barrier(comm->shm, err);
    mgpu_comm_context(comm, what, sizeof what, "mgpu_barrier()");
    /* Node, leaders, node again: nobody leaves before every node has arrived. */
    if (comm->shm != NULL && (rc = mgpu_shm_barrier(comm->shm, err)) < 0)
        return mgpu_comm_done(comm, rc);
    if (comm->tcp != NULL && (rc = mgpu_tcp_barrier(comm->tcp, what, err)) < 0)
        return mgpu_comm_done(comm, mgpu_comm_step_failed(comm, rc, err));
    mgpu_comm_after_leaders(comm);
    if (comm->shm != NULL)
        rc = mgpu_shm_barrier(comm->shm, err);
    return mgpu_comm_done(comm, rc);
}

/* Every collective of the API is counted on the progress page once: entered here, done when
 * the CPU backend returns it (NCCL: when the watchdog sees it finish on the GPU). One that
 * another calls (an all-reduce made of all-gathers) is part of its caller's. */
static uint64_t mgpu_coll_enter(mgpu_comm_t *c, mgpu_coll_op_t op, uint64_t bytes)
{
    return c->depth++ > 0 ? 0 : mgpu_beacon_coll_enter(&c->ctx->beacon, (uint32_t)op, bytes);
}

static int mgpu_coll_leave(mgpu_comm_t *c, uint64_t seq, int rc)
{
    if (--c->depth == 0 && rc == 0 && c->nccl == NULL)
        mgpu_beacon_coll_done(c->ctx->beacon.page, seq);
    return rc;
}

int mgpu_allreduce_f32(mgpu_comm_t *comm, float *buf, size_t count, mgpu_redop_t op, void *stream,
                       mgpu_err_t *err)
{
    uint64_t seq = mgpu_coll_enter(comm, MGPU_COLL_ALLREDUCE, count * sizeof *buf);
    return mgpu_coll_leave(comm, seq, mgpu_allreduce_f32_run(comm, buf, count, op, stream, err));
}

int mgpu_allreduce(mgpu_comm_t *comm, void *buf, size_t count, mgpu_dtype_t dtype, mgpu_redop_t op,
                   void *stream, mgpu_err_t *err)
{
    uint64_t seq;

    if (comm == NULL)
        return mgpu_allreduce_run(comm, buf, count, dtype, op, stream, err);
    seq = mgpu_coll_enter(comm, MGPU_COLL_ALLREDUCE, count * mgpu_dtype_size(dtype));
    return mgpu_coll_leave(comm, seq, mgpu_allreduce_run(comm, buf, count, dtype, op, stream, err));
}

int mgpu_reduce_scatter(mgpu_comm_t *comm, const void *send, void *recv, size_t recvcount,
                        mgpu_dtype_t dtype, mgpu_redop_t op, void *stream, mgpu_err_t *err)
{
    uint64_t seq;

    if (comm == NULL)
        return mgpu_reduce_scatter_run(comm, send, recv, recvcount, dtype, op, stream, err);
    seq = mgpu_coll_enter(comm, MGPU_COLL_REDUCE_SCATTER,
                          recvcount * (uint64_t)comm->world * mgpu_dtype_size(dtype));
    return mgpu_coll_leave(
        comm, seq, mgpu_reduce_scatter_run(comm, send, recv, recvcount, dtype, op, stream, err));
}

int mgpu_broadcast(mgpu_comm_t *comm, void *buf, size_t bytes, int root, void *stream,
                   mgpu_err_t *err)
{
    uint64_t seq = mgpu_coll_enter(comm, MGPU_COLL_BROADCAST, bytes);
    return mgpu_coll_leave(comm, seq, mgpu_broadcast_run(comm, buf, bytes, root, stream, err));
}

int mgpu_allgather(mgpu_comm_t *comm, const void *send, void *recv, size_t bytes, void *stream,
                   mgpu_err_t *err)
{
    uint64_t seq = mgpu_coll_enter(comm, MGPU_COLL_ALLGATHER, bytes);
    return mgpu_coll_leave(comm, seq, mgpu_allgather_run(comm, send, recv, bytes, stream, err));
}

int mgpu_barrier(mgpu_comm_t *comm, mgpu_err_t *err)
{
    uint64_t seq = mgpu_coll_enter(comm, MGPU_COLL_BARRIER, 0);
    return mgpu_coll_leave(comm, seq, mgpu_barrier_run(comm, err));
}

int mgpu_comm_wait(mgpu_comm_t *comm, void *stream, mgpu_err_t *err)
{
#if MGPU_NCCL_BUILT
    if (comm->nccl != NULL)
        return mgpu_nccl_wait(comm->nccl, stream, err);
#endif
    return 0;
}

int mgpu_comm_watch(mgpu_comm_t *comm, void *stream, const char *what, mgpu_err_t *err)
{
#if MGPU_NCCL_BUILT
    if (comm->nccl != NULL)
        return mgpu_nccl_watch(comm->nccl, stream, what, err);
#endif
    return 0;
}

void mgpu_comm_set_label(mgpu_comm_t *comm, const char *label)
{
    int bucket = -1, end = 0;

    /* "bucket N" also goes into the progress page's record of each collective. */
    if (label != NULL && sscanf(label, "bucket %d%n", &bucket, &end) == 1 && label[end] == '\0')
        mgpu_progress_bucket(comm->ctx, bucket);
    else
        mgpu_progress_bucket(comm->ctx, -1);
#if MGPU_NCCL_BUILT
    if (comm->nccl != NULL)
        mgpu_nccl_set_label(comm->nccl, label);
#endif
}
