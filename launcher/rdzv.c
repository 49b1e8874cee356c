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

#include "clock.h"        /* mgpu_clock_mono_ns */
#include "sock.h"         /* mgpu_sock_free_port, mgpu_sock_hostport */
#include "log.h"          /* mgpu_info */
#include "store.h"        /* the blocking client */
#include "store_thread.h" /* the server, when this node serves it */
#include "rdzv_impl.h"    /* struct mgpu_rdzv */

#define MAX_NODES 4096

static void random_hex(char *buf, size_t len)
{
    unsigned char b[16] = {0};
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b)
        for (size_t i = 0; i < sizeof b; i++)
            b[i] = (unsigned char)(rand() ^ getpid());
    for (size_t i = 0; i < sizeof b && 2 * i + 2 < len; i++)
        snprintf(buf + 2 * i, 3, "%02x", b[i]);
}

/* "1, 3, 4": the nodes i whose key PREFIXi is missing now ("node/": not joined; an attempt's
 * "attempt/N/end/": not ended). */
static void missing_nodes(mgpu_rdzv_t *r, const char *prefix, char *buf, size_t len)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < r->nnodes && n + 16 < len; i++) {
        char key[96];
        const char *keys[1] = {key};
        int ready = 0;
        snprintf(key, sizeof key, "%s%d", prefix, i);
        if (mgpu_store_check(r->client, keys, 1, &ready, NULL) == 0 && !ready)
            n += (size_t)snprintf(buf + n, len - n, "%s%d", n ? ", " : "", i);
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

/* Node 0, every node in: each was started with node 0's --nnodes. Otherwise verdict says which
 * was not (every node stops before it starts a worker) and err has it too. */
static int same_nnodes(mgpu_rdzv_t *r, char *verdict, size_t cap, mgpu_err_t *err)
{
    for (int i = 1; i < r->nnodes; i++) {
        char key[32];
        void *v = NULL;
        size_t len = 0;
        snprintf(key, sizeof key, "nnodes/%d", i);
        if (mgpu_store_get(r->client, key, 1.0, &v, &len, NULL) < 0)
            continue; /* a launcher of an older mgpu: nothing to compare */
        char buf[16];
        snprintf(buf, sizeof buf, "%.*s", (int)(len < 15 ? len : 15), (char *)v);
        free(v);
        const int theirs = atoi(buf);
        if (theirs != r->nnodes) {
            snprintf(verdict, cap,
                     "node rank %d was started with --nnodes=%d, node 0 with --nnodes=%d: start "
                     "mgpu-launch on every node with the same --nnodes",
                     i, theirs, r->nnodes);
            return mgpu_err_set(err, MGPU_E_USAGE, "rendezvous at %s: %s", r->where, verdict);
        }
    }
    return 0;
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
    /* the --nnodes it was started with, for node 0 to compare with its own */
    char count[16];
    snprintf(key, sizeof key, "nnodes/%d", o->node_rank);
    snprintf(count, sizeof count, "%d", r->nnodes);
    if ((rc = mgpu_store_set(r->client, key, count, strlen(count), err)) < 0)
        return rc;
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
        missing_nodes(r, "node/", miss, sizeof miss);
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
        missing_nodes(r, "node/", miss, sizeof miss);
        snprintf(verdict, sizeof verdict,
                 "node rank(s) %s of %d did not join within %g s (start mgpu-launch on every node "
                 "with the same --nnodes, --master_addr and --master_port)",
                 miss, r->nnodes, o->join_timeout);
        rc = mgpu_err_set(err, MGPU_E_TIMEOUT, "rendezvous '%s' at %s: %s", o->run_id, r->where,
                          verdict);
    } else if (rc == 0) {
        snprintf(verdict, sizeof verdict, "ok");
        rc = same_nnodes(r, verdict, sizeof verdict, err);
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

/* A node's announcement: "nproc host pid role" (static) or "nproc host pid prev role"
 * (elastic rounds: prev is its node rank in the round before, -1 for a new node). The role goes
 * last, since it may hold spaces; an announcement without one is of the default role. */
int mgpu_rdzv_parse_node(const char *val, size_t len, int fields, rdzv_node_t *n, int *prev,
                         const char *role, int *same_role)
{
    char buf[700];
    int pid = 0, pv = -1, used = 0;

    snprintf(buf, sizeof buf, "%.*s", (int)(len < sizeof buf - 1 ? len : sizeof buf - 1), val);
    memset(n, 0, sizeof *n);
    if ((fields == 4 ? sscanf(buf, "%d %255s %d %d %n", &n->nproc, n->host, &pid, &pv, &used)
                     : sscanf(buf, "%d %255s %d %n", &n->nproc, n->host, &pid, &used)) < fields)
        return MGPU_E_PROTOCOL;
    if (prev != NULL)
        *prev = pv;
    if (same_role != NULL)
        *same_role =
            used > 0 && buf[used] ? strcmp(buf + used, role) == 0 : strcmp(role, "default") == 0;
    return 0;
}

int mgpu_rdzv_world_fill(mgpu_rdzv_t *r, char **vals, size_t *lens, int fields,
                         const char *master_key, mgpu_rdzv_world_t *w, mgpu_err_t *err)
{
    const char *role = r->role[0] ? r->role : "default";
    rdzv_node_t *nodes = calloc((size_t)r->nnodes, sizeof *nodes);
    void *val = NULL;
    size_t len = 0, hn = 0;
    int rc;

    if (nodes == NULL)
        return mgpu_err_set(err, -ENOMEM, "out of memory");
    memset(w, 0, sizeof *w);
    w->nnodes = r->nnodes;
    w->node_rank = r->node_rank;
    /* Global ranks by node rank: nodes may run different numbers of workers. Role ranks the
     * same way, counting only the nodes of this node's role (torchrun's ROLE_RANK). */
    for (int i = 0; i < r->nnodes; i++) {
        int same = 0;
        if (mgpu_rdzv_parse_node(vals[i], lens[i], fields, &nodes[i], NULL, role, &same) < 0) {
            free(nodes);
            return mgpu_err_set(err, MGPU_E_PROTOCOL, "rendezvous at %s: node %d announced '%.*s'",
                                r->where, i, (int)(lens[i] > 200 ? 200 : lens[i]), vals[i]);
        }
        nodes[i].base = w->world_size;
        if (i < r->node_rank)
            w->base_rank += nodes[i].nproc;
        if (i < r->node_rank && same)
            w->role_base_rank += nodes[i].nproc;
        if (same)
            w->role_world_size += nodes[i].nproc;
        w->world_size += nodes[i].nproc;
        if (hn + strlen(nodes[i].host) + 2 < sizeof w->hosts)
            hn += (size_t)snprintf(w->hosts + hn, sizeof w->hosts - hn, "%s%s", i ? "," : "",
                                   nodes[i].host);
    }
    free(r->nodes);
    r->nodes = nodes;

    /* MASTER_ADDR/MASTER_PORT: a port on the node of global rank 0, where PyTorch's rank 0
     * hosts its own store (TORCHELASTIC_USE_AGENT_STORE=False). */
    if (r->node_rank == 0) {
        char master[400];
        int mport = r->o.master_port > 0 ? r->o.master_port : mgpu_sock_free_port();
        snprintf(master, sizeof master, "%d %s", mport, r->master_addr);
        if ((rc = mgpu_store_set(r->client, master_key, master, strlen(master), err)) < 0)
            return rc;
    }
    if ((rc = mgpu_store_get(r->client, master_key, r->o.join_timeout, &val, &len, err)) < 0)
        return rc;
    {
        char master[400], *sp;
        snprintf(master, sizeof master, "%.*s", (int)(len < 399 ? len : 399), (char *)val);
        free(val);
        sp = strchr(master, ' ');
        w->master_port = atoi(master);
        snprintf(w->master_addr, sizeof w->master_addr, "%s", sp ? sp + 1 : "127.0.0.1");
    }
    snprintf(w->store_addr, sizeof w->store_addr, "%s", r->store_host);
    w->store_port = r->store_port;
    snprintf(w->token, sizeof w->token, "%s", r->token);
    w->round = r->round;
    w->restarts = r->restarts;
    return 0;
}

/* Static: the nodes' announcements under node/<i>, in node rank order. */
static int world_static(mgpu_rdzv_t *r, mgpu_rdzv_world_t *w, mgpu_err_t *err)
{
    char key[64], **vals = calloc((size_t)r->nnodes, sizeof *vals);
    size_t *lens = calloc((size_t)r->nnodes, sizeof *lens);
    int rc = 0;

    if (vals == NULL || lens == NULL)
        rc = mgpu_err_set(err, -ENOMEM, "out of memory");
    for (int i = 0; rc == 0 && i < r->nnodes; i++) {
        void *v = NULL;
        snprintf(key, sizeof key, "node/%d", i);
        rc = mgpu_store_get(r->client, key, r->o.join_timeout, &v, &lens[i], err);
        vals[i] = v;
    }
    if (rc == 0)
        rc = mgpu_rdzv_world_fill(r, vals, lens, 3, "master", w, err);
    for (int i = 0; vals != NULL && i < r->nnodes; i++)
        free(vals[i]);
    free(vals);
    free(lens);
    return rc;
}

/* One node: nobody to meet. The store listens before any worker can need it, and this node's
 * keys (node/0, master: what the static rendezvous writes) go into its table in place, with
 * no connection and no round trip; its thread starts with mgpu_rdzv_serve, once the workers
 * are forked (a client that connects before waits in the listen backlog). */
static int join_local(mgpu_rdzv_t *r, const mgpu_rdzv_opts_t *o, const char *token,
                      mgpu_rdzv_world_t *w, mgpu_err_t *err)
{
    mgpu_store_server_opts_t so = {.bind_host = o->bind_host,
                                   .port = o->store_port,
                                   .token = token,
                                   .max_conns = o->max_conns};
    char key[400], val[700];
    int port = 0, mport, rc;

    if ((rc = mgpu_store_thread_open(&so, &r->server, &port, err)) < 0)
        return rc;
    r->local = 1;
    r->store_port = port;
    mgpu_sock_hostport(r->where, sizeof r->where, o->store_host, port);
    snprintf(r->prefix, sizeof r->prefix, "mgpu/%s/", o->run_id);
    snprintf(r->host, sizeof r->host, "%s", o->hostname);
    r->nnodes = 1;
    r->node_rank = 0;
    if ((r->nodes = calloc(1, sizeof *r->nodes)) == NULL)
        return mgpu_err_set(err, -ENOMEM, "out of memory");
    r->nodes[0].nproc = o->nproc;
    snprintf(r->nodes[0].host, sizeof r->nodes[0].host, "%s", o->hostname);
    mport = o->master_port > 0 ? o->master_port : mgpu_sock_free_port();
    snprintf(key, sizeof key, "%snode/0", r->prefix);
    snprintf(val, sizeof val, "%d %s %d %s", o->nproc, o->hostname, (int)getpid(), r->role);
    rc = mgpu_store_thread_put(r->server, key, val, strlen(val));
    snprintf(key, sizeof key, "%smaster", r->prefix);
    snprintf(val, sizeof val, "%d %s", mport, r->master_addr);
    if (rc == 0)
        rc = mgpu_store_thread_put(r->server, key, val, strlen(val));
    if (rc < 0)
        return mgpu_err_set(err, rc, "store: %s", strerror(-rc));

    memset(w, 0, sizeof *w);
    w->nnodes = 1;
    w->world_size = w->role_world_size = o->nproc;
    snprintf(w->hosts, sizeof w->hosts, "%s", o->hostname);
    w->master_port = mport;
    snprintf(w->master_addr, sizeof w->master_addr, "%s", r->master_addr);
    snprintf(w->store_addr, sizeof w->store_addr, "%s", r->store_host);
    w->store_port = port;
    snprintf(w->token, sizeof w->token, "%s", token);
    return 0;
}

int mgpu_rdzv_join(const mgpu_rdzv_opts_t *o, mgpu_rdzv_t **out, mgpu_rdzv_world_t *w,
                   mgpu_err_t *err)
{
    mgpu_rdzv_t *r = calloc(1, sizeof *r);
    char me[600], token[80] = "";
    int port = o->store_port, rc;

    *out = NULL;
    memset(w, 0, sizeof *w);
    if (r == NULL)
        return mgpu_err_set(err, -ENOMEM, "out of memory");
    pthread_mutex_init(&r->lock, NULL);
    pthread_mutex_init(&r->hb_lock, NULL);
    pthread_cond_init(&r->hb_cond, NULL);
    r->hb_attempt = -1;
    r->o = *o;
    snprintf(r->run_id, sizeof r->run_id, "%s", o->run_id);
    snprintf(r->role, sizeof r->role, "%s", o->role != NULL ? o->role : "default");
    snprintf(r->master_addr, sizeof r->master_addr, "%s",
             o->master_addr != NULL ? o->master_addr : "127.0.0.1");
    snprintf(r->store_host, sizeof r->store_host, "%s", o->store_host);
    r->o.run_id = r->run_id;
    r->o.role = r->role;
    r->o.master_addr = r->master_addr;
    r->o.store_host = r->store_host;
    r->o.hostname = r->host;
    r->o.token = NULL; /* not kept: the world carries it */
    r->elastic = o->elastic;
    if (o->token != NULL && *o->token)
        snprintf(token, sizeof token, "%s", o->token);
    else if (o->nnodes_max == 1)
        random_hex(token, sizeof token); /* handed to the local workers only */
    else if (!mgpu_sock_is_loopback(o->store_host))
        return mgpu_rdzv_close(r), mgpu_err_set(err, MGPU_E_USAGE,
                                                "several nodes meet through a store open to the "
                                                "network at %s:%d: give every node the same secret "
                                                "with --rdzv_token (or PET_RDZV_TOKEN, or "
                                                "--rdzv_token_file)",
                                                o->store_host, o->store_port);
    snprintf(r->token, sizeof r->token, "%s", token);

    if (o->nnodes_max == 1 && o->serve) {
        if ((rc = join_local(r, o, token, w, err)) < 0) {
            mgpu_rdzv_close(r);
            return rc;
        }
        r->joined = 1;
        *out = r;
        return 0;
    }
    if (o->serve) {
        mgpu_store_server_opts_t so = {
            .bind_host = o->bind_host, .port = port, .token = token, .max_conns = o->max_conns};
        rc = mgpu_store_thread_start(&so, &r->server, &port, err);
        if (rc < 0) {
            mgpu_rdzv_close(r);
            return rc;
        }
    }
    r->store_port = port;
    mgpu_sock_hostport(r->where, sizeof r->where, o->store_host, port);
    /* A node that waits for node 0's store says so after a while, as node 0 does for them. */
    const double t1 = o->serve ? o->join_timeout : first_part(o->join_timeout);
    const int64_t t0 = mgpu_clock_mono_ns();
    rc = mgpu_store_connect(o->store_host, port, token, t1, &r->client, err);
    if (rc < 0 && o->join_timeout > t1 && (double)(mgpu_clock_mono_ns() - t0) >= 0.9e9 * t1) {
        mgpu_warn("rendezvous '%s': no store at %s yet (node 0 serves it: is it started, and are "
                  "--master_addr and --master_port, or --rdzv_endpoint, its?); waiting up to %g s "
                  "more (last attempt: %s)",
                  o->run_id, r->where, o->join_timeout - t1, err->msg);
        rc = mgpu_store_connect(o->store_host, port, token, o->join_timeout - t1, &r->client, err);
    }
    if (rc < 0) {
        char msg[sizeof err->msg];
        snprintf(msg, sizeof msg, "%s", err->msg);
        mgpu_err_set(err, rc, "rendezvous '%s': could not reach the store at %s within %g s%s: %s",
                     o->run_id, r->where, o->join_timeout,
                     o->serve ? "" : " (has the node that serves it, node 0, started?)", msg);
        goto fail;
    }
    snprintf(r->prefix, sizeof r->prefix, "mgpu/%s/", o->run_id);
    mgpu_store_set_prefix(r->client, r->prefix);
    /* Reached once: from now on a store that stays away for heartbeat_timeout is lost (not
     * retried for the whole join timeout, as while it may still be starting). */
    if (o->nnodes_max > 1)
        mgpu_store_set_io_timeout(r->client, o->heartbeat_timeout);
    snprintf(r->host, sizeof r->host, "%s", o->hostname);
    if (r->elastic) {
        rc = mgpu_rdzv_join_rounds(r, 0, w, err);
    } else {
        /* The pid makes two launchers started with the same command line tell each other
         * apart; the role goes last, since it may hold spaces. */
        snprintf(me, sizeof me, "%d %s %d %s", o->nproc, o->hostname, (int)getpid(), r->role);
        rc = join_static(r, o, me, err);
        if (rc == 0)
            rc = world_static(r, w, err);
    }
    if (rc < 0)
        goto fail;
    rc = mgpu_store_connect(o->store_host, port, token, o->join_timeout, &r->watch, err);
    if (rc < 0)
        goto fail;
    mgpu_store_set_prefix(r->watch, r->prefix);
    mgpu_store_set_reconnect(r->watch, 0); /* its loss means the serving node is gone */
    if (o->nnodes_max > 1) {
        rc = mgpu_store_connect(o->store_host, port, token, o->heartbeat_timeout, &r->hb, err);
        if (rc == 0) {
            mgpu_store_set_prefix(r->hb, r->prefix);
            mgpu_store_set_reconnect(r->hb, 0);
            rc = mgpu_rdzv_beat_start(r, err);
        }
        if (rc < 0)
            goto fail;
    }
    r->joined = 1;
    *out = r;
    return 0;
fail:
    mgpu_rdzv_close(r);
    return rc;
}

void mgpu_rdzv_failure_text(const mgpu_rdzv_failure_t *f, char *buf, size_t len)
{
    snprintf(buf, len, "%d %d %d %d %s%s%s", f->node_rank, f->rank, f->local_rank, f->exit_code,
             f->host[0] ? f->host : "?", f->how[0] ? " " : "", f->how);
}

int mgpu_rdzv_failure_parse(const char *v, size_t len, mgpu_rdzv_failure_t *f)
{
    char buf[700];
    int used = 0;
    snprintf(buf, sizeof buf, "%.*s", (int)(len < sizeof buf - 1 ? len : sizeof buf - 1), v);
    memset(f, 0, sizeof *f);
    if (sscanf(buf, "%d %d %d %d %255s %n", &f->node_rank, &f->rank, &f->local_rank, &f->exit_code,
               f->host, &used) < 5)
        return MGPU_E_PROTOCOL;
    if (used > 0)
        snprintf(f->how, sizeof f->how, "%s", buf + used);
    return 0;
}

void mgpu_rdzv_give_up(mgpu_rdzv_t *r, const char *why)
{
    if (__atomic_exchange_n(&r->lost, 1, __ATOMIC_ACQ_REL))
        return;
    snprintf(r->lost_why, sizeof r->lost_why, "%s", why);
    r->cancel = 1;
    if (r->watch != NULL)
        mgpu_store_interrupt(r->watch);
    if (r->client != NULL)
        mgpu_store_interrupt(r->client);
}

const char *mgpu_rdzv_lost_why(const mgpu_rdzv_t *r)
{
    return r->lost ? r->lost_why : "";
}

/* A job of one node has no other node to agree with: the calls below that do are its
 * caller's mistake (the supervisor makes them only for several nodes). */
static int local_refused(const mgpu_rdzv_t *r, const char *what, mgpu_err_t *err)
{
    return mgpu_err_set(err, MGPU_E_USAGE,
                        "rendezvous at %s: %s: a job of one node has no other "
                        "node to agree with",
                        r->where, what);
}

int mgpu_rdzv_serve(mgpu_rdzv_t *r, mgpu_err_t *err)
{
    return r != NULL && r->server != NULL ? mgpu_store_thread_run(r->server, err) : 0;
}

void mgpu_rdzv_quiesce(mgpu_rdzv_t *r)
{
    if (r != NULL && r->local)
        mgpu_store_thread_halt_begin(r->server);
}

static int report_locked(mgpu_rdzv_t *r, int attempt, const mgpu_rdzv_failure_t *f, int *first,
                         mgpu_err_t *err)
{
    char key[64], text[700];
    void *cur = NULL;
    size_t clen = 0;
    int rc;

    mgpu_rdzv_failure_text(f, text, sizeof text);
    if (f->rank == MGPU_RDZV_NODE) {
        /* This node leaves (its launcher was stopped): a next round does not wait for it. */
        snprintf(key, sizeof key, "attempt/%d/lost/%d", attempt, f->node_rank);
        mgpu_store_set(r->client, key, f->how, strlen(f->how), NULL);
    }
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

    if (r->local)
        return local_refused(r, "waiting for a failure", err);
    /* If this launcher dies or goes silent, the store itself tells the others (the leases of
     * rdzv_beat.c). */
    if (!r->lost && (rc = mgpu_rdzv_beat_lease(r, attempt, err)) < 0)
        mgpu_warn("could not register this node's heartbeat lease: %s", err->msg);
    snprintf(key, sizeof key, "attempt/%d/watch/%d", attempt, r->node_rank);
    rc = r->lost ? MGPU_E_CLOSED : mgpu_store_get(r->watch, key, -1, &val, &len, err);
    if (rc < 0 && r->lost)
        return mgpu_err_set(err, MGPU_E_PEER, "%s", r->lost_why);
    if (rc < 0 && r->server == NULL) {
        char why[400];
        snprintf(why, sizeof why,
                 "the store at %s went away (the launcher that serves it, on %s, died?)", r->where,
                 r->store_host);
        mgpu_rdzv_give_up(r, why);
        return mgpu_err_set(err, MGPU_E_PEER, "%s", why);
    }
    if (rc < 0)
        return rc;
    if (len == 3 && memcmp(val, "end", 3) == 0) {
        free(val);
        return MGPU_E_CLOSED;
    }
    rc = mgpu_rdzv_failure_parse(val, len, f);
    free(val);
    return rc;
}

/* Every node's end of the attempt comes to the store: each node sets its own, and the store
 * sets a lost node's itself (rdzv_beat.c). So the wait has no deadline while no failure is
 * recorded: a node whose workers still run keeps its lease, and one whose workers finished
 * first waits as long as the others' run, however long that is. Once a failure is recorded
 * every node stops its workers within its grace period: the others get after_failure seconds
 * from then. The wait goes in slices, so that mgpu_rdzv_cancel (a signal to this launcher) is
 * heard within one. */
#define END_SLICE_S 1.0

static int end_locked(mgpu_rdzv_t *r, int attempt, double after_failure, int *failed,
                      mgpu_rdzv_failure_t *f, mgpu_err_t *err)
{
    char key[64], ends[48], **keys;
    const char *fk[1] = {key};
    int rc, ready = 0;
    void *val = NULL;
    size_t len = 0;
    double failed_at = -1.0, t0 = mgpu_clock_mono();
    int said = 0;

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
    snprintf(ends, sizeof ends, "attempt/%d/end/", attempt);
    for (int i = 0; i < r->nnodes; i++)
        if (asprintf(&keys[i], "%s%d", ends, i) < 0)
            keys[i] = NULL;
    snprintf(key, sizeof key, "attempt/%d/failure", attempt);
    for (;;) {
        rc = mgpu_store_wait(r->client, (const char *const *)keys, (size_t)r->nnodes, END_SLICE_S,
                             err);
        if (rc != MGPU_E_TIMEOUT)
            break;
        if (r->cancel) {
            rc = mgpu_err_set(err, MGPU_E_CLOSED,
                              "stopped while it waited for the other nodes to finish attempt %d",
                              attempt);
            break;
        }
        if ((rc = mgpu_store_check(r->client, fk, 1, &ready, err)) < 0)
            break;
        const double now = mgpu_clock_mono();
        if (!ready && !said && now - t0 >= NOTICE_AFTER_S) {
            /* as torchrun's "waiting for other agents to finish", once */
            char miss[1024];
            missing_nodes(r, ends, miss, sizeof miss);
            mgpu_warn("attempt %d: this node's workers are done; waiting for node rank(s) %s "
                      "to finish theirs",
                      attempt, miss);
            said = 1;
        }
        if (ready && failed_at < 0)
            failed_at = now;
        if (ready && now - failed_at >= after_failure) {
            rc = MGPU_E_TIMEOUT;
            break;
        }
    }
    if (rc == MGPU_E_TIMEOUT) {
        char miss[1024];
        missing_nodes(r, ends, miss, sizeof miss);
        rc = mgpu_err_set(err, MGPU_E_PEER,
                          "node(s) %s did not finish attempt %d within %g s of its failure "
                          "(their launcher is stuck?)",
                          miss, attempt, after_failure);
    } else if (rc < 0 && (r->lost || !r->cancel || rc != MGPU_E_CLOSED)) {
        char why[sizeof err->msg - 200];
        snprintf(why, sizeof why, "%s", err->msg);
        if (r->lost) /* the heartbeat said so first, and why */
            rc = mgpu_err_set(err, MGPU_E_PEER,
                              "while it waited for the other nodes to finish attempt %d, %s",
                              attempt, r->lost_why);
        else
            rc = mgpu_err_set(err, MGPU_E_PEER,
                              "while it waited for the other nodes to finish attempt %d, this "
                              "node lost the store at %s: %s",
                              attempt, r->where, why);
    }
    for (int i = 0; i < r->nnodes; i++)
        free(keys[i]);
    free(keys);
    if (rc < 0)
        return rc;
    if ((rc = mgpu_store_check(r->client, fk, 1, &ready, err)) < 0 || !ready)
        return rc;
    if ((rc = mgpu_store_get(r->client, key, after_failure, &val, &len, err)) < 0)
        return rc;
    *failed = 1;
    rc = mgpu_rdzv_failure_parse(val, len, f);
    free(val);
    return rc;
}

int mgpu_rdzv_report_failure(mgpu_rdzv_t *r, int attempt, const mgpu_rdzv_failure_t *f, int *first,
                             mgpu_err_t *err)
{
    if (r->lost)
        return mgpu_err_set(err, MGPU_E_PEER, "%s", r->lost_why);
    if (r->local)
        return local_refused(r, "reporting a failure", err);
    pthread_mutex_lock(&r->lock);
    int rc = report_locked(r, attempt, f, first, err);
    pthread_mutex_unlock(&r->lock);
    return rc;
}

int mgpu_rdzv_end_attempt(mgpu_rdzv_t *r, int attempt, double after_failure, int *failed,
                          mgpu_rdzv_failure_t *f, mgpu_err_t *err)
{
    if (r->lost)
        return mgpu_err_set(err, MGPU_E_PEER, "%s", r->lost_why);
    if (r->local)
        return local_refused(r, "ending an attempt", err);
    pthread_mutex_lock(&r->lock);
    int rc = end_locked(r, attempt, after_failure, failed, f, err);
    pthread_mutex_unlock(&r->lock);
    if (rc == 0)
        mgpu_rdzv_beat_lease(r, -1, NULL); /* over: silence or an exit is no loss now */
    return rc;
}

int mgpu_rdzv_next_round(mgpu_rdzv_t *r, int attempt, mgpu_rdzv_world_t *w, mgpu_err_t *err)
{
    if (r->lost)
        return mgpu_err_set(err, MGPU_E_PEER, "%s", r->lost_why);
    if (r->local)
        return local_refused(r, "a next round", err);
    pthread_mutex_lock(&r->lock);
    int rc = mgpu_rdzv_join_rounds(r, attempt + 1, w, err);
    pthread_mutex_unlock(&r->lock);
    if (rc < 0 && r->cancel && !r->lost)
        return mgpu_err_set(err, MGPU_E_CLOSED, "rendezvous cancelled");
    return rc;
}

void mgpu_rdzv_cancel(mgpu_rdzv_t *r)
{
    if (r != NULL)
        r->cancel = 1;
}

void mgpu_rdzv_leave(mgpu_rdzv_t *r, const char *why)
{
    if (r == NULL || !r->elastic || r->lost)
        return;
    pthread_mutex_lock(&r->lock);
    mgpu_store_set(r->client, "over", why, strlen(why), NULL);
    pthread_mutex_unlock(&r->lock);
}

void mgpu_rdzv_node_ranks(const mgpu_rdzv_t *r, int node, char *buf, size_t len)
{
    if (r == NULL || r->nodes == NULL || node < 0 || node >= r->nnodes) {
        snprintf(buf, len, "the ranks of node %d", node);
        return;
    }
    const rdzv_node_t *n = &r->nodes[node];
    if (n->nproc == 1)
        snprintf(buf, len, "rank %d", n->base);
    else
        snprintf(buf, len, "ranks %d-%d", n->base, n->base + n->nproc - 1);
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
    if (r->local) {
        /* Every worker has ended: the store stops answering, and its table is read in place. */
        char full[400];
        snprintf(full, sizeof full, "%s%s", prefix, key);
        mgpu_store_thread_halt(r->server);
        rc = mgpu_store_thread_get(r->server, full, &val, &n);
        if (rc == 0)
            snprintf(buf, len, "%.*s", (int)(n < len ? n : len - 1), (char *)val);
        free(val);
        return rc;
    }
    pthread_mutex_lock(&r->lock);
    /* Workers' keys carry their own prefix (mgpu_store_connect_env): switch to it briefly. */
    mgpu_store_set_prefix(r->client, prefix);
    rc = mgpu_store_check(r->client, k1, 1, &ready, NULL);
    if (rc == 0 && !ready)
        rc = -ENOENT;
    if (rc == 0)
        rc = mgpu_store_get(r->client, key, 1.0, &val, &n, NULL);
    mgpu_store_set_prefix(r->client, r->prefix);
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
    if (r->local) {
        *n = mgpu_store_thread_num_keys(r->server);
        return 0;
    }
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
    mgpu_rdzv_beat_stop(r); /* its leases cleared first: a normal end is no loss */
    if (r->joined && r->nnodes > 1 && !r->lost) {
        /* The serving node keeps the store up until every node has read its last answer
         * (bounded: a node that died must not keep this one forever). */
        char key[64], **keys = calloc((size_t)r->nnodes, sizeof *keys);
        snprintf(key, sizeof key, "left/%d/%d", r->attempt, r->node_rank);
        mgpu_store_set(r->client, key, "1", 1, NULL);
        if (r->server != NULL && keys != NULL) {
            for (int i = 0; i < r->nnodes; i++)
                if (asprintf(&keys[i], "left/%d/%d", r->attempt, i) < 0)
                    keys[i] = NULL;
            mgpu_store_wait(r->client, (const char *const *)keys, (size_t)r->nnodes, 10.0, NULL);
            for (int i = 0; i < r->nnodes; i++)
                free(keys[i]);
            if (r->elastic)
                mgpu_rdzv_wait_over_seen(r, 2.0);
        }
        free(keys);
    }
    mgpu_store_close(r->watch);
    mgpu_store_close(r->client);
    mgpu_store_thread_stop(r->server);
    pthread_mutex_destroy(&r->lock);
    pthread_mutex_destroy(&r->hb_lock);
    pthread_cond_destroy(&r->hb_cond);
    free(r->nodes);
    free(r);
}
