/* mgpu.c - the context (rank, device, store) and communicators over the backends.
 *
 * mgpu_init reads the rank (rank.c), picks the device (device.c over common/devices.h) and
 * connects to the store when mgpu-launch gave one. Communicators dispatch to a backend: for
 * now the CPU backend, which joins the ranks of one host in shared memory (shm.c). */
#include "mgpu.h"

#include <errno.h>  /* ENOMEM */
#include <stdio.h>  /* snprintf */
#include <stdlib.h> /* calloc, getenv */
#include <string.h> /* memmove */
#include <unistd.h> /* getppid */

#include "device.h"  /* mgpu_device_select */
#include "devices.h" /* mgpu_devices_discover, mgpu_devices_visible */
#include "shm.h"     /* mgpu_shm_* */
#include "store.h"   /* mgpu_store_connect_env */

#define MGPU_DEFAULT_STORE_TIMEOUT_S 60.0
#define MGPU_DEFAULT_COMM_TIMEOUT_S 300.0

struct mgpu_ctx {
    mgpu_rank_info_t rank;
    mgpu_device_info_t dev;
    mgpu_store_t *store; /* NULL without MGPU_STORE_ADDR */
    int comms;           /* communicators created so far: names their segments */
    char token[512];     /* what makes this job's shared-memory names unique on the host */
};

struct mgpu_comm {
    mgpu_ctx_t *ctx;
    mgpu_backend_t backend;
    double timeout_s;
    mgpu_shm_t *shm; /* NULL when the world is one rank */
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

/* Two jobs on one host must never meet in the same segment. The run id and attempt are
 * part of the name already; add whatever identifies the job's rendezvous: the store's
 * address and token (mgpu-launch), MASTER_ADDR:MASTER_PORT (torchrun binds that port, so two
 * live jobs cannot share it), else the parent process (ranks started by hand from one shell
 * share it; Slurm and Open MPI give unique run ids anyway). */
static void mgpu_job_token(mgpu_ctx_t *c)
{
    const char *sa = getenv("MGPU_STORE_ADDR"), *sp = getenv("MGPU_STORE_PORT");
    const char *st = getenv("MGPU_STORE_TOKEN");
    const char *ma = getenv("MASTER_ADDR"), *mp = getenv("MASTER_PORT");

    if (sa != NULL || mp != NULL)
        snprintf(c->token, sizeof c->token, "store=%s:%s/%s master=%s:%s", sa ? sa : "",
                 sp ? sp : "", st ? st : "", ma ? ma : "", mp ? mp : "");
    else if (strcmp(c->rank.run_id, "none") == 0)
        snprintf(c->token, sizeof c->token, "ppid=%d", (int)getppid());
    else
        c->token[0] = '\0';
}

int mgpu_init(const mgpu_init_opts_t *opts, mgpu_ctx_t **out, mgpu_err_t *err)
{
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
    if ((rc = mgpu_rank_info_from_env(&c->rank, err)) < 0)
        goto fail;
    memset(&req, 0, sizeof req);
    req.rank = c->rank.rank;
    req.local_rank = c->rank.local_rank;
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
    if (getenv(MGPU_ENV_STORE_ADDR) != NULL &&
        (rc = mgpu_store_connect_env(o.store_timeout_s, &c->store, err)) < 0)
        goto fail;
    mgpu_job_token(c);
    free(installed);
    free(vis);
    *out = c;
    return 0;
fail:
    free(installed);
    free(vis);
    free(c);
    return rc;
}

void mgpu_finalize(mgpu_ctx_t *ctx)
{
    if (ctx == NULL)
        return;
    if (ctx->store != NULL)
        mgpu_store_close(ctx->store);
    free(ctx);
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

int mgpu_comm_create(mgpu_ctx_t *ctx, mgpu_backend_t backend, double timeout_s, mgpu_comm_t **out,
                     mgpu_err_t *err)
{
    const mgpu_rank_info_t *r = &ctx->rank;
    mgpu_comm_t *c;
    int rc, index = ctx->comms++;

    if (backend == MGPU_BACKEND_NCCL)
        return mgpu_err_set(err, MGPU_E_USAGE,
                            "mgpu_comm_create(NCCL): this libmgpu has no NCCL backend yet; use "
                            "MGPU_BACKEND_CPU or MGPU_BACKEND_AUTO");
    if (backend != MGPU_BACKEND_AUTO && backend != MGPU_BACKEND_CPU)
        return mgpu_err_set(err, MGPU_E_USAGE, "mgpu_comm_create: unknown backend %d",
                            (int)backend);
    if (r->world_size != r->local_world_size)
        return mgpu_err_set(err, MGPU_E_USAGE,
                            "mgpu_comm_create(CPU): WORLD_SIZE=%d spans %d nodes; the CPU "
                            "backend joins ranks of one host only (TCP between hosts is not "
                            "implemented yet)",
                            r->world_size, r->nnodes);
    if (r->rank != r->local_rank)
        return mgpu_err_set(err, MGPU_E_USAGE,
                            "mgpu_comm_create(CPU): RANK=%d differs from LOCAL_RANK=%d on a "
                            "single node",
                            r->rank, r->local_rank);
    c = calloc(1, sizeof *c);
    if (c == NULL)
        return mgpu_err_set(err, -ENOMEM, "mgpu_comm_create: out of memory");
    c->ctx = ctx;
    c->backend = MGPU_BACKEND_CPU;
    c->timeout_s = timeout_s > 0 ? timeout_s : MGPU_DEFAULT_COMM_TIMEOUT_S;
    if (r->world_size > 1) {
        mgpu_shm_opts_t so;
        char name[64];
        memset(&so, 0, sizeof so);
        mgpu_shm_name(name, sizeof name, r->run_id, r->restart_count, ctx->token, index);
        so.name = name;
        so.rank = r->local_rank;
        so.size = r->local_world_size;
        so.timeout_s = c->timeout_s;
        so.spin_us = -1;
        if ((rc = mgpu_shm_open(&so, &c->shm, err)) < 0) {
            free(c);
            return rc;
        }
    }
    *out = c;
    return 0;
}

void mgpu_comm_destroy(mgpu_comm_t *comm)
{
    if (comm == NULL)
        return;
    mgpu_shm_close(comm->shm);
    free(comm);
}

mgpu_backend_t mgpu_comm_backend(const mgpu_comm_t *comm)
{
    return comm->backend;
}

int mgpu_allreduce_f32(mgpu_comm_t *comm, float *buf, size_t count, mgpu_redop_t op, void *stream,
                       mgpu_err_t *err)
{
    if (op != MGPU_SUM && op != MGPU_AVG)
        return mgpu_err_set(err, MGPU_E_USAGE, "mgpu_allreduce_f32: unknown op %d", (int)op);
    if (buf == NULL && count > 0)
        return mgpu_err_set(err, MGPU_E_USAGE, "mgpu_allreduce_f32(count=%zu): buf is NULL", count);
    if (comm->shm == NULL)
        return 0; /* one rank: the sum and the average are the value itself */
    return mgpu_shm_allreduce_f32(comm->shm, buf, count, op == MGPU_AVG, err);
}

int mgpu_broadcast(mgpu_comm_t *comm, void *buf, size_t bytes, int root, void *stream,
                   mgpu_err_t *err)
{
    if (buf == NULL && bytes > 0)
        return mgpu_err_set(err, MGPU_E_USAGE, "mgpu_broadcast(bytes=%zu): buf is NULL", bytes);
    if (root < 0 || root >= comm->ctx->rank.world_size)
        return mgpu_err_set(err, MGPU_E_RANGE,
                            "mgpu_broadcast(bytes=%zu, root=%d): root is not a rank of a world "
                            "of %d",
                            bytes, root, comm->ctx->rank.world_size);
    if (comm->shm == NULL)
        return 0;
    return mgpu_shm_broadcast(comm->shm, buf, bytes, root, err);
}

int mgpu_allgather(mgpu_comm_t *comm, const void *send, void *recv, size_t bytes, void *stream,
                   mgpu_err_t *err)
{
    if ((send == NULL || recv == NULL) && bytes > 0)
        return mgpu_err_set(err, MGPU_E_USAGE, "mgpu_allgather(bytes=%zu): %s is NULL", bytes,
                            send == NULL ? "send" : "recv");
    if (comm->shm == NULL) {
        if (send != recv)
            memmove(recv, send, bytes);
        return 0;
    }
    return mgpu_shm_allgather(comm->shm, send, recv, bytes, err);
}

int mgpu_barrier(mgpu_comm_t *comm, mgpu_err_t *err)
{
    if (comm->shm == NULL)
        return 0;
    return mgpu_shm_barrier(comm->shm, err);
}
