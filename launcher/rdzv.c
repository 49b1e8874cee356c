/* rdzv.c - see rdzv.h. Every key is written once per attempt, never reset, so there are no
 * races between rounds: a restarted group uses fresh keys under attempt/<n+1>/. */
#include "rdzv.h"

#include <errno.h>      /* ENOMEM */
#include <pthread.h>    /* pthread_mutex_t */
#include <stdio.h>      /* snprintf */
#include <stdlib.h>     /* calloc */
#include <string.h>     /* strcmp */
#include <sys/random.h> /* getrandom */
#include <unistd.h>     /* close */

#include "sock.h"         /* mgpu_sock_free_port */
#include "log.h"          /* mgpu_info */
#include "store.h"        /* the blocking client */
#include "store_thread.h" /* the server, when this node serves it */

#define MAX_NODES 4096

struct mgpu_rdzv {
    mgpu_store_thread_t *server; /* this node serves the store */
    mgpu_store_t *client;        /* rendezvous, failures, attempt ends: under lock */
    pthread_mutex_t lock;        /* report and end may run on two pool threads at once */
    mgpu_store_t *watch;         /* blocked in mgpu_rdzv_wait_failure */
    int nnodes, node_rank;
    int joined;        /* every node met: leaving is agreed too (mgpu_rdzv_close) */
    char host[256];    /* this node's name, for the others' reports */
    volatile int lost; /* the store went away: no call may wait on it again */
    char where[300];   /* "host:port" for messages */
};

static void random_hex(char *buf, size_t len)
{
    unsigned char b[16] = {0};
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b)
        for (size_t i = 0; i < sizeof b; i++)
            b[i] = (unsigned char)(rand() ^ getpid());
    for (size_t i = 0; i < sizeof b && 2 * i + 2 < len; i++)
        snprintf(buf + 2 * i, 3, "%02x", b[i]);
}

/* "1, 3 and 4" of the nodes whose key is missing now. */
static void missing_nodes(mgpu_rdzv_t *r, int from, int to, char *buf, size_t len)
{
    size_t n = 0;
    int count = 0;
    buf[0] = '\0';
    for (int i = from; i < to && n + 16 < len; i++) {
        char key[64];
        const char *keys[1] = {key};
        int ready = 0;
        snprintf(key, sizeof key, "node/%d", i);
        if (mgpu_store_check(r->client, keys, 1, &ready, NULL) == 0 && !ready)
            n += (size_t)snprintf(buf + n, len - n, "%s%d", count++ ? ", " : "", i);
    }
}

/* A rendezvous waits up to its join timeout (600 s by default) for nodes that may never come:
 * after this long it says, once, what it is still waiting for, then waits the rest. */
#define NOTICE_AFTER_S 10.0

/* The first part of a wait of timeout s (at most NOTICE_AFTER_S). */
static double first_part(double timeout)
{
    return timeout > NOTICE_AFTER_S ? NOTICE_AFTER_S : timeout;
}

/* Static: node ranks given. Node 0 (which serves the store) decides whether the round is
 * complete and tells each node under its own key, so a node that never comes is named by every
 * node at the same moment, and no node asks a store that went away. */
static int join_static(mgpu_rdzv_t *r, const mgpu_rdzv_opts_t *o, const char *me, mgpu_err_t *err)
{
    char key[64], **keys, verdict[1100];
    void *cur = NULL;
    size_t clen = 0;
    int rc;

    r->nnodes = o->nnodes_max;
    r->node_rank = o->node_rank;
    snprintf(key, sizeof key, "node/%d", o->node_rank);
    rc = mgpu_store_compare_set(r->client, key, "", 0, me, strlen(me), &cur, &clen, err);
    if (rc < 0)
        return rc;
    if (clen != strlen(me) || memcmp(cur, me, clen) != 0) {
        rc = mgpu_err_set(err, MGPU_E_USAGE,
                          "rendezvous at %s: node rank %d is already taken (by '%.*s'); give every "
                          "node its own --node_rank",
                          r->where, o->node_rank, (int)(clen > 200 ? 200 : clen), (char *)cur);
        free(cur);
        return rc;
    }
    free(cur);
    if (r->server == NULL) {
        /* Node 0 answers once every node came or its join timeout passed. */
        snprintf(key, sizeof key, "verdict/%d", r->node_rank);
        const double total = o->join_timeout + 30.0, t1 = first_part(total);
        rc = mgpu_store_get(r->client, key, t1, &cur, &clen, err);
        if (rc == MGPU_E_TIMEOUT && total > t1) {
            if (t1 < o->join_timeout) /* the others may still come */
                mgpu_warn("rendezvous '%s' at %s: node rank %d of %d joined; waiting for the "
                          "other nodes (up to %g s more)",
                          o->run_id, r->where, r->node_rank, r->nnodes, o->join_timeout - t1);
            rc = mgpu_store_get(r->client, key, total - t1, &cur, &clen, err);
        }
        if (rc < 0)
            return mgpu_err_set(err, rc, "rendezvous '%s' at %s: no answer from node 0: %s",
                                o->run_id, r->where, err->msg);
        snprintf(verdict, sizeof verdict, "%.*s", (int)(clen < 1099 ? clen : 1099), (char *)cur);
        free(cur);
        if (strcmp(verdict, "ok") == 0)
            return 0;
        snprintf(key, sizeof key, "ack/%d", r->node_rank);
        mgpu_store_set(r->client, key, "1", 1, NULL);
        return mgpu_err_set(err, MGPU_E_TIMEOUT, "rendezvous '%s' at %s: %s", o->run_id, r->where,
                            verdict);
    }
    keys = calloc((size_t)r->nnodes, sizeof *keys);
    if (keys == NULL)
        return mgpu_err_set(err, -ENOMEM, "out of memory");
    for (int i = 0; i < r->nnodes; i++)
        if (asprintf(&keys[i], "node/%d", i) < 0)
            keys[i] = NULL;
    const double t1 = first_part(o->join_timeout);
    rc = mgpu_store_wait(r->client, (const char *const *)keys, (size_t)r->nnodes, t1, err);
    if (rc == MGPU_E_TIMEOUT && o->join_timeout > t1) {
        char miss[1024];
        missing_nodes(r, 0, r->nnodes, miss, sizeof miss);
        mgpu_warn("rendezvous '%s' at %s: waiting for node rank(s) %s of %d to join (up to %g s "
                  "more)",
                  o->run_id, r->where, miss, r->nnodes, o->join_timeout - t1);
        rc = mgpu_store_wait(r->client, (const char *const *)keys, (size_t)r->nnodes,
                             o->join_timeout - t1, err);
    }
    for (int i = 0; i < r->nnodes; i++)
        free(keys[i]);
    free(keys);
    if (rc == MGPU_E_TIMEOUT) {
        char miss[1024];
        missing_nodes(r, 0, r->nnodes, miss, sizeof miss);
        snprintf(verdict, sizeof verdict,
                 "node rank(s) %s of %d did not join within %g s (start mgpu-launch on every node "
                 "with the same --nnodes, --master_addr and --master_port)",
                 miss, r->nnodes, o->join_timeout);
        rc = mgpu_err_set(err, MGPU_E_TIMEOUT, "rendezvous '%s' at %s: %s", o->run_id, r->where,
                          verdict);
    } else if (rc == 0) {
        snprintf(verdict, sizeof verdict, "ok");
    } else {
        return rc;
    }
    for (int i = 1; i < r->nnodes; i++) {
        snprintf(key, sizeof key, "verdict/%d", i);
        mgpu_store_set(r->client, key, verdict, strlen(verdict), NULL);
    }
    if (rc < 0) {
        /* Stay up a moment, so the nodes that came read the verdict before the store goes. */
        char **acks = calloc((size_t)r->nnodes, sizeof *acks);
        int n = 0;
        for (int i = 1; acks != NULL && i < r->nnodes; i++) {
            const char *k1[1] = {key};
            int ready = 0;
            snprintf(key, sizeof key, "node/%d", i);
            if (mgpu_store_check(r->client, k1, 1, &ready, NULL) == 0 && ready &&
                asprintf(&acks[n], "ack/%d", i) >= 0)
                n++;
        }
        if (n > 0)
            mgpu_store_wait(r->client, (const char *const *)acks, (size_t)n, 2.0, NULL);
        for (int i = 0; acks != NULL && i < n; i++)
            free(acks[i]);
        free(acks);
    }
    return rc;
}

/* Elastic: ranks in arrival order; closes MIN..MAX nodes after the last call. */
static int join_elastic(mgpu_rdzv_t *r, const mgpu_rdzv_opts_t *o, const char *me, mgpu_err_t *err)
{
    char key[64], closed[32];
    const char *ckeys[1] = {"closed"};
    int64_t arrival, total;
    void *val = NULL;
    size_t len = 0;
    int ready = 0, rc;

    if ((rc = mgpu_store_check(r->client, ckeys, 1, &ready, err)) < 0)
        return rc;
    if (ready)
        return mgpu_err_set(err, MGPU_E_PEER,
                            "rendezvous '%s' at %s is closed already: the job started without this "
                            "node",
                            o->run_id, r->where);
    if ((rc = mgpu_store_add(r->client, "arrivals", 1, &arrival, err)) < 0)
        return rc;
    r->node_rank = (int)(arrival - 1);
    if (r->node_rank >= o->nnodes_max)
        return mgpu_err_set(err, MGPU_E_PEER,
                            "rendezvous '%s' at %s already has its maximum of %d nodes", o->run_id,
                            r->where, o->nnodes_max);
    snprintf(key, sizeof key, "node/%d", r->node_rank);
    if ((rc = mgpu_store_set(r->client, key, me, strlen(me), err)) < 0)
        return rc;
    if (r->node_rank == 0) {
        /* The first node decides when the round closes: MIN nodes, then the last call. */
        char **keys = calloc((size_t)o->nnodes_max, sizeof *keys);
        if (keys == NULL)
            return mgpu_err_set(err, -ENOMEM, "out of memory");
        for (int i = 0; i < o->nnodes_max; i++)
            if (asprintf(&keys[i], "node/%d", i) < 0)
                keys[i] = NULL;
        const double t1 = first_part(o->join_timeout);
        rc = mgpu_store_wait(r->client, (const char *const *)keys, (size_t)o->nnodes_min, t1, err);
        if (rc == MGPU_E_TIMEOUT && o->join_timeout > t1) {
            mgpu_store_add(r->client, "arrivals", 0, &total, NULL);
            mgpu_warn("rendezvous '%s' at %s: %lld of at least %d nodes joined; waiting for the "
                      "others (up to %g s more)",
                      o->run_id, r->where, (long long)total, o->nnodes_min, o->join_timeout - t1);
            rc = mgpu_store_wait(r->client, (const char *const *)keys, (size_t)o->nnodes_min,
                                 o->join_timeout - t1, err);
        }
        if (rc == 0 && o->nnodes_max > o->nnodes_min) {
            /* The last call can be long (30 s by default): a silent launcher looks hung. */
            if (mgpu_store_add(r->client, "arrivals", 0, &total, NULL) == 0 &&
                total < o->nnodes_max && o->last_call_timeout > 0)
                mgpu_warn("rendezvous '%s' at %s: %lld nodes joined (at least %d, at most %d); "
                          "waiting up to %g s (last_call_timeout) for more nodes",
                          o->run_id, r->where, (long long)total, o->nnodes_min, o->nnodes_max,
                          o->last_call_timeout);
            rc = mgpu_store_wait(r->client, (const char *const *)keys, (size_t)o->nnodes_max,
                                 o->last_call_timeout, err);
            if (rc == MGPU_E_TIMEOUT)
                rc = 0;
        }
        for (int i = 0; i < o->nnodes_max; i++)
            free(keys[i]);
        free(keys);
        if (rc == MGPU_E_TIMEOUT) {
            mgpu_store_add(r->client, "arrivals", 0, &total, NULL);
            return mgpu_err_set(err, MGPU_E_TIMEOUT,
                                "rendezvous '%s' at %s: %lld of at least %d nodes joined within "
                                "%g s",
                                o->run_id, r->where, (long long)total, o->nnodes_min,
                                o->join_timeout);
        }
        if (rc < 0)
            return rc;
        /* Close: the nodes whose announcement is in count; later arrivals are refused. */
        int n = 0;
        for (int i = 0; i < o->nnodes_max; i++) {
            const char *k1[1] = {key};
            snprintf(key, sizeof key, "node/%d", i);
            if (mgpu_store_check(r->client, k1, 1, &ready, err) == 0 && ready)
                n = i + 1;
            else
                break;
        }
        snprintf(closed, sizeof closed, "%d", n);
        if ((rc = mgpu_store_set(r->client, "closed", closed, strlen(closed), err)) < 0)
            return rc;
    }
    rc = mgpu_store_get(r->client, "closed", o->join_timeout + o->last_call_timeout, &val, &len,
                        err);
    if (rc < 0)
        return rc;
    snprintf(closed, sizeof closed, "%.*s", (int)(len < 31 ? len : 31), (char *)val);
    free(val);
    r->nnodes = atoi(closed);
    if (r->node_rank >= r->nnodes)
        return mgpu_err_set(err, MGPU_E_PEER,
                            "rendezvous '%s' at %s closed with %d nodes before this one arrived",
                            o->run_id, r->where, r->nnodes);
    return 0;
}

/* 1 when a node's announcement ("nproc host pid role") names role. */
static int node_role_is(const char *val, size_t len, const char *role)
{
    size_t i = 0;

    for (int field = 0; field < 3; field++) {
        while (i < len && val[i] != ' ')
            i++;
        if (i >= len)
            return strcmp(role, "default") == 0; /* no role field: the default role */
        i++;
    }
    return len - i == strlen(role) && memcmp(val + i, role, len - i) == 0;
}

int mgpu_rdzv_join(const mgpu_rdzv_opts_t *o, mgpu_rdzv_t **out, mgpu_rdzv_world_t *w,
                   mgpu_err_t *err)
{
    mgpu_rdzv_t *r = calloc(1, sizeof *r);
    char prefix[300], me[600], token[80] = "", key[64];

    if (r != NULL)
        pthread_mutex_init(&r->lock, NULL);
    int port = o->store_port, rc, elastic = o->elastic;
    void *val = NULL;
    size_t len = 0;

    *out = NULL;
    memset(w, 0, sizeof *w);
    if (r == NULL)
        return mgpu_err_set(err, -ENOMEM, "out of memory");
    if (o->token != NULL && *o->token)
        snprintf(token, sizeof token, "%s", o->token);
    else if (o->nnodes_max == 1)
        random_hex(token, sizeof token); /* handed to the local workers only */
    else if (!mgpu_sock_is_loopback(o->store_host))
        return free(r), mgpu_err_set(err, MGPU_E_USAGE,
                                     "several nodes meet through a store open to the network at "
                                     "%s:%d: give every node the same secret with --rdzv_token "
                                     "(or PET_RDZV_TOKEN, or --rdzv_token_file)",
                                     o->store_host, o->store_port);

    if (o->serve) {
        mgpu_store_server_opts_t so = {
            .bind_host = o->bind_host, .port = port, .token = token, .max_conns = o->max_conns};
        rc = mgpu_store_thread_start(&so, &r->server, &port, err);
        if (rc < 0) {
            free(r);
            return rc;
        }
    }
    snprintf(r->where, sizeof r->where, "%s:%d", o->store_host, port);
    rc = mgpu_store_connect(o->store_host, port, token, o->join_timeout, &r->client, err);
    if (rc < 0) {
        char msg[sizeof err->msg];
        snprintf(msg, sizeof msg, "%s", err->msg);
        mgpu_err_set(err, rc, "rendezvous '%s': could not reach the store at %s within %g s%s: %s",
                     o->run_id, r->where, o->join_timeout,
                     o->serve ? "" : " (has the node that serves it, node 0, started?)", msg);
        goto fail;
    }
    snprintf(prefix, sizeof prefix, "mgpu/%s/", o->run_id);
    mgpu_store_set_prefix(r->client, prefix);
    /* The pid makes two launchers started with the same command line tell each other apart;
     * the role goes last, since it may hold spaces. */
    snprintf(me, sizeof me, "%d %s %d %s", o->nproc, o->hostname, (int)getpid(),
             o->role != NULL ? o->role : "default");
    snprintf(r->host, sizeof r->host, "%s", o->hostname);
    rc = elastic ? join_elastic(r, o, me, err) : join_static(r, o, me, err);
    if (rc < 0)
        goto fail;

    /* Global ranks by node rank: nodes may run different numbers of workers. Role ranks the
     * same way, counting only the nodes of this node's role (torchrun's ROLE_RANK). */
    w->nnodes = r->nnodes;
    w->node_rank = r->node_rank;
    for (int i = 0; i < r->nnodes; i++) {
        int nproc, same;
        snprintf(key, sizeof key, "node/%d", i);
        if ((rc = mgpu_store_get(r->client, key, o->join_timeout, &val, &len, err)) < 0)
            goto fail;
        nproc = atoi(val);
        same = node_role_is(val, len, o->role != NULL ? o->role : "default");
        free(val);
        if (i < r->node_rank)
            w->base_rank += nproc;
        if (i < r->node_rank && same)
            w->role_base_rank += nproc;
        if (same)
            w->role_world_size += nproc;
        w->world_size += nproc;
    }

    /* MASTER_ADDR/MASTER_PORT: a free port on the node of global rank 0, where PyTorch's rank 0
     * hosts its own store (TORCHELASTIC_USE_AGENT_STORE=False). */
    if (r->node_rank == 0) {
        char master[400];
        int mport = o->master_port > 0 ? o->master_port : mgpu_sock_free_port();
        snprintf(master, sizeof master, "%d %s", mport, o->master_addr);
        if ((rc = mgpu_store_set(r->client, "master", master, strlen(master), err)) < 0)
            goto fail;
    }
    if ((rc = mgpu_store_get(r->client, "master", o->join_timeout, &val, &len, err)) < 0)
        goto fail;
    {
        char master[400], *sp;
        snprintf(master, sizeof master, "%.*s", (int)(len < 399 ? len : 399), (char *)val);
        free(val);
        sp = strchr(master, ' ');
        w->master_port = atoi(master);
        snprintf(w->master_addr, sizeof w->master_addr, "%s", sp ? sp + 1 : "127.0.0.1");
    }
    snprintf(w->store_addr, sizeof w->store_addr, "%s", o->store_host);
    w->store_port = port;
    snprintf(w->token, sizeof w->token, "%s", token);
    rc = mgpu_store_connect(o->store_host, port, token, o->join_timeout, &r->watch, err);
    if (rc < 0)
        goto fail;
    mgpu_store_set_prefix(r->watch, prefix);
    mgpu_store_set_reconnect(r->watch, 0); /* its loss means the serving node is gone */
    r->joined = 1;
    *out = r;
    return 0;
fail:
    mgpu_rdzv_close(r);
    return rc;
}

static void failure_text(const mgpu_rdzv_failure_t *f, char *buf, size_t len)
{
    snprintf(buf, len, "%d %d %d %d %s", f->node_rank, f->rank, f->local_rank, f->exit_code,
             f->host);
}

static int failure_parse(const char *v, size_t len, mgpu_rdzv_failure_t *f)
{
    char buf[400];
    snprintf(buf, sizeof buf, "%.*s", (int)(len < 399 ? len : 399), v);
    memset(f, 0, sizeof *f);
    return sscanf(buf, "%d %d %d %d %255s", &f->node_rank, &f->rank, &f->local_rank, &f->exit_code,
                  f->host) == 5
               ? 0
               : MGPU_E_PROTOCOL;
}

static int report_locked(mgpu_rdzv_t *r, int attempt, const mgpu_rdzv_failure_t *f, int *first,
                         mgpu_err_t *err)
{
    char key[64], text[400];
    void *cur = NULL;
    size_t clen = 0;
    int rc;

    failure_text(f, text, sizeof text);
    snprintf(key, sizeof key, "attempt/%d/failure", attempt);
    rc = mgpu_store_compare_set(r->client, key, "", 0, text, strlen(text), &cur, &clen, err);
    if (rc < 0)
        return rc;
    *first = clen == strlen(text) && memcmp(cur, text, clen) == 0;
    free(cur);
    if (!*first)
        return 0;
    /* Wake every node's watcher (each waits on its own key; see mgpu_rdzv_wait_failure). */
    for (int i = 0; i < r->nnodes; i++) {
        snprintf(key, sizeof key, "attempt/%d/watch/%d", attempt, i);
        mgpu_store_compare_set(r->client, key, "", 0, text, strlen(text), NULL, NULL, NULL);
    }
    return 0;
}

/* Waits on this node's own key, which either the first failure anywhere or this node's own
 * end of the attempt sets: GET waits for one key, and this gives it "either" semantics. */
int mgpu_rdzv_wait_failure(mgpu_rdzv_t *r, int attempt, mgpu_rdzv_failure_t *f, mgpu_err_t *err)
{
    char key[64];
    void *val = NULL;
    size_t len = 0;
    int rc;

    /* If this launcher dies, the store itself tells the others: on this connection's close it
     * records the failure, wakes every other node's watcher and ends this node's attempt. */
    {
        int n = r->nnodes + 2, k = 0;
        char **keys = calloc((size_t)n, sizeof *keys), dead[320];
        const char **vals = calloc((size_t)n, sizeof *vals);
        snprintf(dead, sizeof dead, "%d -1 -1 137 %s", r->node_rank, r->host);
        for (int i = 0; keys && vals && i < r->nnodes; i++) {
            if (asprintf(&keys[k], i == r->node_rank ? "attempt/%d/end/%d" : "attempt/%d/watch/%d",
                         attempt, i) < 0)
                break;
            vals[k++] = dead;
        }
        if (keys && vals && asprintf(&keys[k], "attempt/%d/failure", attempt) >= 0)
            vals[k++] = dead;
        if (keys && vals && asprintf(&keys[k], "left/%d", r->node_rank) >= 0)
            vals[k++] = dead; /* the serving node need not wait for it at the end */
        if (keys && vals)
            mgpu_store_on_close(r->watch, (const char *const *)keys, vals, (size_t)k, NULL);
        for (int i = 0; keys && i < k; i++)
            free(keys[i]);
        free(keys);
        free(vals);
    }
    snprintf(key, sizeof key, "attempt/%d/watch/%d", attempt, r->node_rank);
    rc = mgpu_store_get(r->watch, key, -1, &val, &len, err);
    if (rc < 0 && r->server == NULL)
        r->lost = 1;
    if (rc < 0 && r->server == NULL)
        return mgpu_err_set(err, MGPU_E_PEER,
                            "the store at %s went away (node 0's launcher, which serves it, died?)",
                            r->where);
    if (rc < 0)
        return rc;
    if (len == 3 && memcmp(val, "end", 3) == 0) {
        free(val);
        return MGPU_E_CLOSED;
    }
    rc = failure_parse(val, len, f);
    free(val);
    return rc;
}

static int end_locked(mgpu_rdzv_t *r, int attempt, double timeout, int *failed,
                      mgpu_rdzv_failure_t *f, mgpu_err_t *err)
{
    char key[64], **keys;
    const char *fk[1] = {key};
    int rc, ready = 0;
    void *val = NULL;
    size_t len = 0;

    *failed = 0;
    /* Release this node's watcher, unless a failure set its key first. */
    snprintf(key, sizeof key, "attempt/%d/watch/%d", attempt, r->node_rank);
    mgpu_store_compare_set(r->client, key, "", 0, "end", 3, NULL, NULL, NULL);
    snprintf(key, sizeof key, "attempt/%d/end/%d", attempt, r->node_rank);
    if ((rc = mgpu_store_set(r->client, key, "1", 1, err)) < 0)
        return rc;
    keys = calloc((size_t)r->nnodes, sizeof *keys);
    if (keys == NULL)
        return mgpu_err_set(err, -ENOMEM, "out of memory");
    for (int i = 0; i < r->nnodes; i++)
        if (asprintf(&keys[i], "attempt/%d/end/%d", attempt, i) < 0)
            keys[i] = NULL;
    rc = mgpu_store_wait(r->client, (const char *const *)keys, (size_t)r->nnodes, timeout, err);
    if (rc == MGPU_E_TIMEOUT) {
        char miss[1024] = "";
        size_t n = 0;
        for (int i = 0; i < r->nnodes; i++) {
            const char *k1[1] = {keys[i]};
            if (mgpu_store_check(r->client, k1, 1, &ready, NULL) == 0 && !ready)
                n += (size_t)snprintf(miss + n, sizeof miss - n, "%s%d", n ? ", " : "", i);
        }
        rc = mgpu_err_set(err, MGPU_E_PEER,
                          "node(s) %s did not finish attempt %d within %g s (their launcher died "
                          "or lost the store at %s)",
                          miss, attempt, timeout, r->where);
    }
    for (int i = 0; i < r->nnodes; i++)
        free(keys[i]);
    free(keys);
    if (rc < 0)
        return rc;
    snprintf(key, sizeof key, "attempt/%d/failure", attempt);
    if ((rc = mgpu_store_check(r->client, fk, 1, &ready, err)) < 0 || !ready)
        return rc;
    if ((rc = mgpu_store_get(r->client, key, timeout, &val, &len, err)) < 0)
        return rc;
    *failed = 1;
    rc = failure_parse(val, len, f);
    free(val);
    return rc;
}

int mgpu_rdzv_report_failure(mgpu_rdzv_t *r, int attempt, const mgpu_rdzv_failure_t *f, int *first,
                             mgpu_err_t *err)
{
    if (r->lost)
        return mgpu_err_set(err, MGPU_E_PEER, "the store at %s is gone", r->where);
    pthread_mutex_lock(&r->lock);
    int rc = report_locked(r, attempt, f, first, err);
    pthread_mutex_unlock(&r->lock);
    return rc;
}

int mgpu_rdzv_end_attempt(mgpu_rdzv_t *r, int attempt, double timeout, int *failed,
                          mgpu_rdzv_failure_t *f, mgpu_err_t *err)
{
    if (r->lost)
        return mgpu_err_set(err, MGPU_E_PEER, "the store at %s is gone", r->where);
    pthread_mutex_lock(&r->lock);
    int rc = end_locked(r, attempt, timeout, failed, f, err);
    pthread_mutex_unlock(&r->lock);
    return rc;
}

int mgpu_rdzv_read_timeline(mgpu_rdzv_t *r, const char *run_id, int attempt, int rank, char *buf,
                            size_t len)
{
    char prefix[300], key[64];
    const char *k1[1] = {key};
    void *val = NULL;
    size_t n = 0;
    int rc, ready = 0;

    if (r->lost)
        return MGPU_E_PEER;
    snprintf(prefix, sizeof prefix, "%s/%d/", run_id, attempt);
    snprintf(key, sizeof key, "timeline/%d", rank);
    pthread_mutex_lock(&r->lock);
    /* Workers' keys carry their own prefix (mgpu_store_connect_env): switch to it briefly. */
    mgpu_store_set_prefix(r->client, prefix);
    rc = mgpu_store_check(r->client, k1, 1, &ready, NULL);
    if (rc == 0 && !ready)
        rc = -ENOENT;
    if (rc == 0)
        rc = mgpu_store_get(r->client, key, 1.0, &val, &n, NULL);
    snprintf(prefix, sizeof prefix, "mgpu/%s/", run_id);
    mgpu_store_set_prefix(r->client, prefix);
    pthread_mutex_unlock(&r->lock);
    if (rc == 0)
        snprintf(buf, len, "%.*s", (int)(n < len ? n : len - 1), (char *)val);
    free(val);
    return rc;
}

int mgpu_rdzv_num_keys(mgpu_rdzv_t *r, long long *n)
{
    int64_t v = 0;
    int rc;

    if (r->lost)
        return MGPU_E_PEER;
    pthread_mutex_lock(&r->lock);
    rc = mgpu_store_num_keys(r->client, &v, NULL);
    pthread_mutex_unlock(&r->lock);
    *n = (long long)v;
    return rc;
}

void mgpu_rdzv_close(mgpu_rdzv_t *r)
{
    if (r == NULL)
        return;
    if (r->joined && r->nnodes > 1 && !r->lost) {
        /* The serving node keeps the store up until every node has read its last answer
         * (bounded: a node that died must not keep this one forever). */
        char key[64], **keys = calloc((size_t)r->nnodes, sizeof *keys);
        snprintf(key, sizeof key, "left/%d", r->node_rank);
        mgpu_store_set(r->client, key, "1", 1, NULL);
        if (r->server != NULL && keys != NULL) {
            for (int i = 0; i < r->nnodes; i++)
                if (asprintf(&keys[i], "left/%d", i) < 0)
                    keys[i] = NULL;
            mgpu_store_wait(r->client, (const char *const *)keys, (size_t)r->nnodes, 10.0, NULL);
            for (int i = 0; i < r->nnodes; i++)
                free(keys[i]);
        }
        free(keys);
    }
    if (r->watch != NULL && !r->lost)
        mgpu_store_on_close(r->watch, NULL, NULL, 0, NULL); /* a normal end is no death */
    mgpu_store_close(r->watch);
    mgpu_store_close(r->client);
    mgpu_store_thread_stop(r->server);
    pthread_mutex_destroy(&r->lock);
    free(r);
}
