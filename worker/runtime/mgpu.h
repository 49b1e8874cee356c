/* mgpu.h - libmgpu, the worker runtime: who am I, which device is mine, and collectives.
 *
 * A worker started by mgpu-launch, torchrun, srun or mpirun calls mgpu_init() once; it reads
 * its rank from the environment (RANK/LOCAL_RANK/WORLD_SIZE/..., else SLURM_PROCID/..., else
 * OMPI_COMM_WORLD_*), picks its device (LOCAL_RANK -> visible ordinal -> physical GPU, or the
 * CPU), and connects to the store when one is given. Communicators are created over it.
 *
 * Ownership: mgpu_ctx_t and mgpu_comm_t are created and destroyed by the calls below; nothing
 * returned by a getter outlives its object, and communicators are destroyed before the
 * context they were created from (mgpu_finalize). Every call returns 0 or a negative code (error.h)
 * and fills err with a message that names the operation and the ranks concerned. */
#ifndef MGPU_H
#define MGPU_H

#include <stddef.h> /* size_t */

#include "error.h"    /* mgpu_err_t */
#include "progress.h" /* mgpu_phase_t, MGPU_PHASE_*; the progress page a launcher reads */

typedef struct mgpu_ctx mgpu_ctx_t;
typedef struct mgpu_comm mgpu_comm_t;

typedef struct mgpu_rank_info {
    int rank, world_size;             /* global */
    int local_rank, local_world_size; /* on this node */
    int node_rank, nnodes;
    int restart_count; /* TORCHELASTIC_RESTART_COUNT, 0 elsewhere */
    char run_id[128];  /* TORCHELASTIC_RUN_ID, SLURM_JOB_ID, ... or "none" */
    char source[16];   /* "mgpu-launch", "torchrun", "env" (RANK & co. without a known
                        * launcher), "slurm", "openmpi", "single" */
} mgpu_rank_info_t;

typedef struct mgpu_device_info {
    int is_gpu;        /* 0: this rank computes on the CPU (also on a simulated GPU, whose
                        * ordinal, physical index, uuid... are set as for a real one) */
    int ordinal;       /* CUDA ordinal among the visible devices (-1 on CPU) */
    int physical;      /* physical GPU index (-1 on CPU) */
    int visible_count; /* devices this rank can see */
    int simulated;     /* the GPU is simulated (MGPU_SIM_GPUS) */
    char uuid[80];
    char bus_id[32];
    char name[96];
} mgpu_device_info_t;

typedef enum mgpu_backend {
    MGPU_BACKEND_AUTO = 0,
    MGPU_BACKEND_CPU,
    MGPU_BACKEND_NCCL
} mgpu_backend_t;
/* Reductions, as NCCL's ncclSum, ncclAvg, ncclMax, ncclMin. An average of floats is the sum
 * divided by the world size (on NCCL, ncclAvg's own rounding: it scales each operand by 1/W
 * before summing); of integers, the sum (wrapping on overflow) divided by the world size and
 * truncated toward zero, as NCCL's ncclAvg does for integers. */
typedef enum mgpu_redop { MGPU_SUM = 0, MGPU_AVG, MGPU_MAX, MGPU_MIN } mgpu_redop_t;
/* Element types of the general collectives (NCCL's ncclFloat32, ncclFloat64, ncclFloat16,
 * ncclBfloat16, ncclInt32, ncclInt64). The CPU backend reduces f16 and bf16 in f32 and rounds
 * the result to nearest even; f32 in f32, f64 in f64. */
typedef enum mgpu_dtype {
    MGPU_DTYPE_F32 = 0,
    MGPU_DTYPE_F64,
    MGPU_DTYPE_F16,
    MGPU_DTYPE_BF16,
    MGPU_DTYPE_I32,
    MGPU_DTYPE_I64
} mgpu_dtype_t;
/* Bytes per element (0 for a value that is not a mgpu_dtype_t), and names: "f32", "bf16",
 * ...; "sum", "avg", "max", "min" ("?" for a value out of range). */
size_t mgpu_dtype_size(mgpu_dtype_t dt);
const char *mgpu_dtype_name(mgpu_dtype_t dt);
const char *mgpu_redop_name(mgpu_redop_t op);

typedef struct mgpu_init_opts {
    int want_gpu;           /* 1: use the GPU of LOCAL_RANK when one is visible; 0: CPU only */
    double store_timeout_s; /* connecting to the store (default 60) */
} mgpu_init_opts_t;

/* Reads the rank from the environment only (no device, no store). Sources, first match:
 * RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE (+ GROUP_RANK, GROUP_WORLD_SIZE,
 * TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT); OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/
 * LOCAL_SIZE (before Slurm: mpirun inside sbatch leaves a stale SLURM_PROCID=0);
 * SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID/SLURM_NODEID/SLURM_NNODES + SLURM_TASKS_PER_NODE
 * (or SLURM_NTASKS_PER_NODE); else rank 0 of 1. A missing, non-numeric or
 * inconsistent value (RANK >= WORLD_SIZE, ...) fails with MGPU_E_USAGE or MGPU_E_RANGE naming
 * the variable and its value. */
int mgpu_rank_info_from_env(mgpu_rank_info_t *out, mgpu_err_t *err);

/* opts may be NULL: want_gpu = 1, store_timeout_s = 60. The device: LOCAL_RANK is the visible
 * ordinal (CUDA_VISIBLE_DEVICES applied, MGPU_SIM_GPUS=N simulates N GPUs); a LOCAL_RANK with
 * no visible GPU of its own fails with MGPU_E_DEVICE naming the rank, the ordinal and the
 * visible list (the article's scenario 4) unless MGPU_ALLOW_GPU_SHARING=1, which takes
 * ordinal LOCAL_RANK mod the visible count. No visible GPU at all: the CPU. Connects to the
 * store when MGPU_STORE_ADDR is set. */
int mgpu_init(const mgpu_init_opts_t *opts, mgpu_ctx_t **out, mgpu_err_t *err);
void mgpu_finalize(mgpu_ctx_t *ctx);
const mgpu_rank_info_t *mgpu_rank(const mgpu_ctx_t *ctx);
const mgpu_device_info_t *mgpu_device(const mgpu_ctx_t *ctx);
/* The store connection, NULL when MGPU_STORE_ADDR was not set. Owned by ctx (do not close
 * it); its key prefix is "<run id>/<attempt>/". The store client's calls (set, get, add,
 * wait, ...) are declared in <mgpu/store.h>, installed beside this header. */
typedef struct mgpu_store mgpu_store_t;
mgpu_store_t *mgpu_ctx_store(const mgpu_ctx_t *ctx);

/* A communicator over all ranks; every rank calls it (and every collective) in the same
 * order. timeout_s (<= 0: 300 s) bounds joining and every collective: one that does not
 * finish fails with MGPU_E_TIMEOUT naming the operation and the ranks that never arrived; a
 * peer that dies, fails or destroys its communicator makes the others fail fast
 * (MGPU_E_PEER) naming it; so does the launcher's word that a node of the job is lost (the
 * tail of the rank's progress page, <mgpu/progress.h>: collectives waiting when it comes and
 * those started after fail with its text, e.g. "ranks 2-3 (node 1, host h1) lost: ...");
 * ranks calling different collectives fail with MGPU_E_PROTOCOL.
 * After a failure the communicator only fails (MGPU_E_CLOSED): destroy it.
 * MGPU_BACKEND_NCCL needs a real GPU (not a simulated one) and a libmgpu built with CUDA
 * (otherwise MGPU_E_USAGE, "NCCL backend not built"): rank 0 draws NCCL's unique id and the
 * store hands it to the others (key "mgpu/nccl/<n>/id" under the store's prefix, n counting
 * this context's communicators), then cudaSetDevice(ordinal) and ncclCommInitRank in
 * non-blocking mode, bounded by timeout_s (a timeout names the ranks that never came). A
 * watchdog thread polls NCCL's asynchronous error and the oldest collective still pending on
 * the GPU; on an error, or a collective pending longer than timeout_s, it aborts the
 * communicator, and the next call returns MGPU_E_NCCL or MGPU_E_TIMEOUT naming the operation
 * (a timeout also names the ranks of this node that never entered the collective, read from
 * their progress pages, below): the worker should then exit non-zero, which makes the
 * launcher stop the group.
 * MGPU_BACKEND_AUTO is NCCL when the rank has a real GPU and libmgpu was built with CUDA,
 * else CPU. MGPU_BACKEND_CPU joins the ranks of a host in
 * shared memory (tunables: MGPU_SHM_CHUNK bytes per rank slot, MGPU_SHM_SPIN_US,
 * MGPU_SHM_YIELDS) and, across nodes, the nodes' local rank 0 in a TCP ring whose addresses
 * go through the store (so several nodes need mgpu-launch's MGPU_STORE_ADDR; MGPU_CPU_ADDR
 * overrides the address a leader advertises). Across nodes, ranks must be numbered node by
 * node with the same count per node, as torchrun and mgpu-launch number them. Results are
 * bitwise identical on every rank. */
int mgpu_comm_create(mgpu_ctx_t *ctx, mgpu_backend_t backend, double timeout_s, mgpu_comm_t **out,
                     mgpu_err_t *err);
void mgpu_comm_destroy(mgpu_comm_t *comm);
mgpu_backend_t mgpu_comm_backend(const mgpu_comm_t *comm);

/* In place; op is MGPU_SUM, AVG, MAX or MIN (the same as mgpu_allreduce with MGPU_DTYPE_F32).
 * For NCCL, buf is device memory and stream a cudaStream_t (NULL: default stream):
 * the call enqueues the collective and returns, and its failure may surface at a later call
 * (the watchdog's); for the CPU backend buf is host memory, stream is ignored and the call
 * returns when the collective is done. */
int mgpu_allreduce_f32(mgpu_comm_t *comm, float *buf, size_t count, mgpu_redop_t op, void *stream,
                       mgpu_err_t *err);
int mgpu_broadcast(mgpu_comm_t *comm, void *buf, size_t bytes, int root, void *stream,
                   mgpu_err_t *err);
/* recv holds world_size * bytes; rank r's send lands at recv + r * bytes. */
int mgpu_allgather(mgpu_comm_t *comm, const void *send, void *recv, size_t bytes, void *stream,
                   mgpu_err_t *err);
/* The general collectives, with NCCL's semantics, for every mgpu_dtype_t and mgpu_redop_t.
 * Counts are elements of dtype. Buffers are host memory on the CPU backend (the call returns
 * when the collective is done; stream is ignored) and device memory on NCCL (the call
 * enqueues on stream, NULL: the default stream). A dtype or op out of range, a NULL buffer
 * with a count > 0 or a size that overflows fails with MGPU_E_USAGE naming the argument.
 *
 * mgpu_allreduce: in place, any count. On the CPU backend every rank gets the same bits:
 * f32 sum and avg take the path of mgpu_allreduce_f32; the others gather the operands and
 * reduce element i in rank order 0, 1, ..., W-1.
 * mgpu_reduce_scatter: send holds world_size * recvcount elements; rank r receives the
 * reduction of block r (elements r * recvcount ..). In place when recv == send + rank *
 * recvcount elements; send is left as it was otherwise. The CPU backend all-reduces a copy of
 * send (a temporary of its size) and keeps block r.
 * mgpu_all_gather: recv holds world_size * sendcount elements, rank r's send at element r *
 * sendcount. In place when send == recv + rank * sendcount elements. */
int mgpu_allreduce(mgpu_comm_t *comm, void *buf, size_t count, mgpu_dtype_t dtype, mgpu_redop_t op,
                   void *stream, mgpu_err_t *err);
int mgpu_reduce_scatter(mgpu_comm_t *comm, const void *send, void *recv, size_t recvcount,
                        mgpu_dtype_t dtype, mgpu_redop_t op, void *stream, mgpu_err_t *err);
int mgpu_all_gather(mgpu_comm_t *comm, const void *send, void *recv, size_t sendcount,
                    mgpu_dtype_t dtype, void *stream, mgpu_err_t *err);

/* For programs that launch their own kernels or NCCL calls beside libmgpu's: the NCCL
 * backend's ncclComm_t and the cudaStream_t libmgpu created for it (non-blocking; barriers
 * run on it), both owned by comm; NULL on the CPU backend. Calls made directly on them are
 * not under the watchdog, and the watchdog may abort the communicator after a failure
 * (mgpu_comm_wait then returns the error): do not use them after a failed call. */
void *mgpu_comm_nccl(mgpu_comm_t *comm);
void *mgpu_comm_stream(mgpu_comm_t *comm);

/* Returns when every rank has called it (NCCL: a one-float all-reduce, waited for). */
int mgpu_barrier(mgpu_comm_t *comm, mgpu_err_t *err);
/* NCCL: waits until the work enqueued on stream so far has finished, returning the
 * communicator's failure instead of hanging when a collective on it hangs (use it where a
 * cudaStreamSynchronize would do). CPU: returns 0 (its collectives are synchronous). */
int mgpu_comm_wait(mgpu_comm_t *comm, void *stream, mgpu_err_t *err);
/* NCCL: puts the work enqueued on stream so far under the watchdog's deadline (timeout_s of
 * mgpu_comm_create), named what in the error ("replay of step 7" ...), as every collective
 * called through this API is. For collectives the watchdog cannot see: those inside a CUDA
 * graph, which are not watched while captured; call it after each cudaGraphLaunch.
 * MGPU_E_USAGE while stream is being captured. CPU: returns 0. */
int mgpu_comm_watch(mgpu_comm_t *comm, void *stream, const char *what, mgpu_err_t *err);
/* Names the collectives called from now on in error messages, e.g. "bucket 3" gives
 * "all-reduce (avg) of 1048576 floats (bucket 3), collective #12 of rank 0 of 2 did not
 * finish in 30 s". NULL or "" for none; copied. NCCL only (CPU messages name the call); on
 * both, "bucket N" is also the bucket of the progress page's records (mgpu_progress_bucket). */
void mgpu_comm_set_label(mgpu_comm_t *comm, const char *label);

/* The startup timeline: wall-clock instants (CLOCK_REALTIME) of this rank's start, recorded
 * by libmgpu - "exec" (the process's start, from /proc/self/stat: 10 ms resolution), "init"
 * (mgpu_init entered), "device" (device chosen), "store" (store connected), "cuda" (CUDA
 * device set and its context created, NCCL only), "comm" (the first communicator ready) - and
 * by the program through mgpu_timeline_mark ("first_step"). Each mark is published, when a
 * store is connected, with one SET of the key "timeline/<rank>" under the store's prefix,
 * i.e. "<run id>/<attempt>/timeline/<rank>", whose value is the whole timeline so far as text:
 *     exec=1764433367.120000;init=1764433367.131544;device=1764433367.131872;...
 * events in the order marked, seconds.microseconds since the epoch, no spaces. The launcher
 * reads these keys at the end of a run. Event names are letters, digits, '_', '-', '.' (at
 * most 31); a name already marked keeps its first time (so a mark per step costs nothing);
 * at most 16 events. A bad name, a full timeline or a failed SET is logged, never fatal. */
void mgpu_timeline_mark(mgpu_ctx_t *ctx, const char *event);
/* The timeline's text (as published) into buf, NUL-terminated when len > 0; returns the length
 * it needs, as snprintf does. */
size_t mgpu_timeline_get(const mgpu_ctx_t *ctx, char *buf, size_t len);

/* Progress: where this rank is, for the launcher that supervises it (mgpu-launch's stall
 * detection and `mgpu-launch status`). mgpu_init attaches the rank's page of the shared file
 * the launcher names in MGPU_PROGRESS_FILE (slot MGPU_PROGRESS_SLOT; <mgpu/progress.h> is the
 * page's layout); under another launcher, or none, the calls write a private page of the
 * process, at the same cost. A bad variable is a warning, never an error. MGPU_PROGRESS=0
 * turns publishing off (the calls return at once: for measuring what they cost).
 *
 * Every libmgpu collective is recorded by itself: its sequence number (1, 2, ... in the order
 * this process called them), operation, bytes and bucket when entered, and when it finished
 * (CPU: when the call returns; NCCL: when the GPU has finished it, as the watchdog sees). A
 * rank waiting in mgpu_comm_wait or mgpu_barrier stays in the phase it was in.
 *
 * The calls cost one read of CLOCK_MONOTONIC (the vDSO, no system call) and a few stores: no
 * lock, no system call; call them as often as the program moves (every phase of every step).
 * Each bumps the page's move counter: a rank that calls none for a long while, while others
 * do, is what a stall detector looks for. ctx may be NULL (nothing is written). One thread
 * (the one calling the collectives) calls them. */
/* The step in progress (-1 before the first); the phase stays. */
void mgpu_progress_step(mgpu_ctx_t *ctx, long long step);
/* What the rank does now: MGPU_PHASE_DATA, _FORWARD, _BACKWARD, _ALLREDUCE (waiting for the
 * gradients), _OPTIMIZER, _CHECKPOINT, _EVAL, _DONE, ... (progress.h). */
void mgpu_progress_phase(mgpu_ctx_t *ctx, mgpu_phase_t phase);
/* Free text shown beside the phase ("epoch 3", "loading shard 12"); at most 63 bytes are
 * kept, NULL or "" clears it. Copied. */
void mgpu_progress_label(mgpu_ctx_t *ctx, const char *label);
/* The gradient bucket of the collectives called from now on (-1: none), recorded with them;
 * mgpu_comm_set_label(comm, "bucket N") sets it too. */
void mgpu_progress_bucket(mgpu_ctx_t *ctx, int bucket);

#endif
