/* tcp.c - a TCP ring between node leaders: set-up through the store, then collectives.
 *
 * Sockets are non-blocking and every transfer is a poll loop that sends to the next member and
 * receives from the previous one at the same time, so a ring step can never deadlock on full
 * socket buffers, and the loop ends at the collective's deadline. */
#include "tcp.h"

#include <arpa/inet.h>   /* inet_ntop */
#include <errno.h>       /* errno */
#include <fcntl.h>       /* fcntl */
#include <netdb.h>       /* getaddrinfo */
#include <netinet/in.h>  /* sockaddr_in, sockaddr_in6 */
#include <netinet/tcp.h> /* TCP_NODELAY */
#include <poll.h>        /* poll */
#include <stdint.h>      /* uint64_t */
#include <stdio.h>       /* snprintf */
#include <stdlib.h>      /* malloc */
#include <string.h>      /* memcpy */
#include <sys/random.h>  /* getrandom */
#include <sys/socket.h>  /* socket, sendmsg */
#include <sys/uio.h>     /* struct iovec */
#include <time.h>        /* clock_gettime */
#include <unistd.h>      /* close */

#define TCP_MAGIC 0x31706374757067ull /* "gputcp1" */
#define TCP_RELAY_CHUNK (1u << 20)    /* broadcast relays in pieces: a pipeline, not n hops */
#define TCP_LOST_SLICE_MS 50          /* a wait looks at the launcher's lost word this often */

struct tcp_hello {
    uint64_t magic, nonce;
    uint32_t member, n;
};

/* Sent round the ring at the start of every collective: members calling different
 * collectives (or sizes) fail with a message instead of reading each other's data as theirs. */
struct tcp_desc {
    uint64_t magic, seq, n;
    uint32_t kind;
    int32_t root;
};

enum { TCP_ALLREDUCE = 1, TCP_BROADCAST, TCP_ALLGATHER, TCP_BARRIER };
static const char *const tcp_kinds[] = {"?", "all-reduce", "broadcast", "all-gather", "barrier"};

struct mgpu_tcp {
    int member, n, per;
    uint64_t seq; /* collectives started */
    /* This collective's descriptor travels in front of its first bytes each way: */
    struct tcp_desc desc_out, desc_in;
    size_t dsend_left, drecv_left; /* descriptor bytes still to send / to receive */
    int next_fd, prev_fd;
    double timeout_s, deadline;
    const mgpu_progress_page_t *lost; /* the launcher's word that a peer is lost, or NULL */
    const char *what;
    int broken;
    char broken_msg[512];
    float *tmp;
    size_t tmp_len;
};

static double tcp_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int tcp_ms_left(double deadline)
{
    double left = deadline - tcp_now();
    return left <= 0 ? 0 : left > 1e6 ? 1000000000 : (int)(left * 1000) + 1;
}

static int tcp_prev(const mgpu_tcp_t *t)
{
    return (t->member + t->n - 1) % t->n;
}

static int tcp_next(const mgpu_tcp_t *t)
{
    return (t->member + 1) % t->n;
}

static void tcp_setup_fd(int fd)
{
    int one = 1;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* The launcher says a node is lost: the call fails with its text (which names the ranks). */
static int tcp_lost(const mgpu_tcp_t *t, mgpu_err_t *err)
{
    char text[sizeof t->lost->lost_text];

    mgpu_progress_lost(t->lost, text, sizeof text);
    return mgpu_err_set(err, MGPU_E_PEER, "%s: %s", t->what, text);
}

static int tcp_desc_check(mgpu_tcp_t *t, mgpu_err_t *err)
{
    const struct tcp_desc *a = &t->desc_out, *b = &t->desc_in;

    if (b->magic == TCP_MAGIC && b->seq == a->seq && b->kind == a->kind && b->n == a->n &&
        b->root == a->root)
        return 0;
    return mgpu_err_set(err, MGPU_E_PROTOCOL,
                        "%s: node %d (rank %d) called %s(n=%llu, root=%d) as its collective "
                        "#%llu between nodes: all ranks must call the same collectives with the "
                        "same sizes, in the same order",
                        t->what, tcp_prev(t), tcp_prev(t) * t->per,
                        tcp_kinds[b->kind <= TCP_BARRIER ? b->kind : 0], (unsigned long long)b->n,
                        b->root, (unsigned long long)b->seq);
}

/* Sends slen bytes to the next member while receiving rlen bytes from the previous one; the
 * collective's descriptor goes first each way (once per collective), and the one received
 * is checked before any data behind it is read. */
static int tcp_xfer(mgpu_tcp_t *t, const void *sbuf, size_t slen, void *rbuf, size_t rlen,
                    mgpu_err_t *err)
{
    const char *sp = sbuf;
    char *rp = rbuf;

    while (slen + t->dsend_left > 0 || rlen + t->drecv_left > 0) {
        struct pollfd p[2];
        int np = 0, si = -1, ri = -1, rc;
        if (slen + t->dsend_left > 0) {
            p[np] = (struct pollfd){t->next_fd, POLLOUT, 0};
            si = np++;
        }
        if (rlen + t->drecv_left > 0) {
            p[np] = (struct pollfd){t->prev_fd, POLLIN, 0};
            ri = np++;
        }
        int wait_ms = tcp_ms_left(t->deadline);
        /* With a launcher's page the wait is sliced: a lost node sends nothing and closes
         * nothing, and only the launcher's word ends the wait before the deadline. */
        if (t->lost != NULL && wait_ms > TCP_LOST_SLICE_MS)
            wait_ms = TCP_LOST_SLICE_MS;
        rc = poll(p, (nfds_t)np, wait_ms);
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc < 0)
            return mgpu_err_set(err, -errno, "%s: poll: %s", t->what, strerror(errno));
        if (rc == 0 && mgpu_progress_lost_seq(t->lost) != 0)
            return tcp_lost(t, err);
        if (rc == 0 && tcp_ms_left(t->deadline) > 0)
            continue;
        if (rc == 0) {
            int m = ri >= 0 ? tcp_prev(t) : tcp_next(t);
            return mgpu_err_set(err, MGPU_E_TIMEOUT,
                                "%s: timed out after %.1f s %s node %d (rank %d): it never "
                                "arrived or is stuck",
                                t->what, t->timeout_s,
                                ri >= 0 ? "waiting for data from" : "sending to", m, m * t->per);
        }
        if (si >= 0 && p[si].revents) {
            struct iovec iov[2];
            struct msghdr mh;
            size_t dl = t->dsend_left;
            ssize_t w;
            memset(&mh, 0, sizeof mh);
            iov[0].iov_base = (char *)&t->desc_out + sizeof t->desc_out - dl;
            iov[0].iov_len = dl;
            iov[1].iov_base = (void *)sp;
            iov[1].iov_len = slen;
            mh.msg_iov = dl > 0 ? iov : iov + 1;
            mh.msg_iovlen = dl > 0 ? 2 : 1;
            w = sendmsg(t->next_fd, &mh, MSG_NOSIGNAL);
            if (w < 0 && errno != EAGAIN && errno != EINTR && mgpu_progress_lost_seq(t->lost))
                return tcp_lost(t, err);
            if (w < 0 && errno != EAGAIN && errno != EINTR)
                return mgpu_err_set(err, MGPU_E_PEER, "%s: node %d (rank %d) went away: send: %s",
                                    t->what, tcp_next(t), tcp_next(t) * t->per, strerror(errno));
            if (w > 0) {
                size_t d = (size_t)w < dl ? (size_t)w : dl;
                t->dsend_left -= d;
                sp += (size_t)w - d;
                slen -= (size_t)w - d;
            }
        }
        if (ri >= 0 && p[ri].revents) {
            size_t dl = t->drecv_left;
            char *dst = dl > 0 ? (char *)&t->desc_in + sizeof t->desc_in - dl : rp;
            ssize_t r = recv(t->prev_fd, dst, dl > 0 ? dl : rlen, 0);
            /* A neighbour that gave up because the launcher named a lost node closes its
             * connections: the cause is that word, when this node has it too. */
            if ((r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) &&
                mgpu_progress_lost_seq(t->lost))
                return tcp_lost(t, err);
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
                return mgpu_err_set(err, MGPU_E_PEER, "%s: node %d (rank %d) went away: %s",
                                    t->what, tcp_prev(t), tcp_prev(t) * t->per,
                                    r == 0 ? "connection closed" : strerror(errno));
            if (r > 0 && dl > 0) {
                t->drecv_left -= (size_t)r;
                if (t->drecv_left == 0 && (rc = tcp_desc_check(t, err)) < 0)
                    return rc;
            } else if (r > 0) {
                rp += r;
                rlen -= (size_t)r;
            }
        }
    }
    return 0;
}

static int tcp_end(mgpu_tcp_t *t, int rc, mgpu_err_t *err);

/* sends/receives: whether this member sends to the next / receives from the previous one
 * in this collective; the descriptor rides on that traffic, costing no extra round trip. */
static int tcp_begin(mgpu_tcp_t *t, int kind, uint64_t n, int root, int sends, int receives,
                     const char *what, mgpu_err_t *err)
{
    t->what = what;
    t->deadline = tcp_now() + t->timeout_s;
    if (t->broken)
        return mgpu_err_set(err, MGPU_E_CLOSED,
                            "%s: the ring between nodes is unusable after an earlier failure "
                            "(%.400s)",
                            what, t->broken_msg);
    /* One load: a collective started after the loss fails at once. */
    if (mgpu_progress_lost_seq(t->lost) != 0)
        return tcp_end(t, tcp_lost(t, err), err);
    memset(&t->desc_out, 0, sizeof t->desc_out);
    t->desc_out.magic = TCP_MAGIC;
    t->desc_out.seq = ++t->seq;
    t->desc_out.n = n;
    t->desc_out.kind = (uint32_t)kind;
    t->desc_out.root = root;
    t->dsend_left = t->n > 1 && sends ? sizeof t->desc_out : 0;
    t->drecv_left = t->n > 1 && receives ? sizeof t->desc_in : 0;
    return 0;
}

static int tcp_end(mgpu_tcp_t *t, int rc, mgpu_err_t *err)
{
    if (rc < 0 && rc != MGPU_E_CLOSED && !t->broken) {
        /* The stream is out of step now: no later collective may read it. Closing also
         * tells the neighbours at once instead of at their deadline. */
        t->broken = rc;
        snprintf(t->broken_msg, sizeof t->broken_msg, "%.*s", (int)sizeof t->broken_msg - 1,
                 err ? err->msg : mgpu_strerror(rc));
        shutdown(t->next_fd, SHUT_RDWR);
        shutdown(t->prev_fd, SHUT_RDWR);
    }
    return rc;
}

static size_t tcp_seg_lo(size_t count, int n, int k)
{
    return count * (size_t)k / (size_t)n;
}

int mgpu_tcp_allreduce_sum_f32(mgpu_tcp_t *t, float *buf, size_t count, const char *what,
                               mgpu_err_t *err)
{
    int rc, n = t->n;
    size_t maxseg = count / (size_t)n + 1;

    float none = 0;

    /* Even for count 0 the steps run (moving nothing): the descriptors still meet, so a
     * node that passes another count is caught instead of left waiting. */
    if (buf == NULL)
        buf = &none;
    if ((rc = tcp_begin(t, TCP_ALLREDUCE, count, -1, 1, 1, what, err)) < 0 || n == 1)
        return rc;
    if (t->tmp_len < maxseg) {
        float *p = realloc(t->tmp, maxseg * sizeof *p);
        if (p == NULL)
            return mgpu_err_set(err, -ENOMEM, "%s: out of memory", what);
        t->tmp = p;
        t->tmp_len = maxseg;
    }
    /* Reduce-scatter: after step s, the segment received has s + 2 contributions. */
    for (int s = 0; s < n - 1; s++) {
        int ss = (t->member - s + n) % n, rs = (t->member - s - 1 + 2 * n) % n;
        size_t slo = tcp_seg_lo(count, n, ss), shi = tcp_seg_lo(count, n, ss + 1);
        size_t rlo = tcp_seg_lo(count, n, rs), rhi = tcp_seg_lo(count, n, rs + 1);
        if ((rc = tcp_xfer(t, buf + slo, (shi - slo) * sizeof(float), t->tmp,
                           (rhi - rlo) * sizeof(float), err)) < 0)
            return tcp_end(t, rc, err);
        for (size_t i = 0; i < rhi - rlo; i++)
            buf[rlo + i] += t->tmp[i];
    }
    /* All-gather: member m owns the finished segment m + 1 and passes it on. */
    for (int s = 0; s < n - 1; s++) {
        int ss = (t->member + 1 - s + n) % n, rs = (t->member - s + n) % n;
        size_t slo = tcp_seg_lo(count, n, ss), shi = tcp_seg_lo(count, n, ss + 1);
        size_t rlo = tcp_seg_lo(count, n, rs), rhi = tcp_seg_lo(count, n, rs + 1);
        if ((rc = tcp_xfer(t, buf + slo, (shi - slo) * sizeof(float), buf + rlo,
                           (rhi - rlo) * sizeof(float), err)) < 0)
            return tcp_end(t, rc, err);
    }
    return 0;
}

int mgpu_tcp_broadcast(mgpu_tcp_t *t, void *buf, size_t bytes, int root, const char *what,
                       mgpu_err_t *err)
{
    int rc;
    char *p = buf;

    if ((rc = tcp_begin(t, TCP_BROADCAST, bytes, root, tcp_next(t) != root, t->member != root, what,
                        err)) < 0 ||
        t->n == 1)
        return rc;
    /* One pass even for 0 bytes, for the descriptors. */
    for (size_t off = 0; off < bytes || off == 0; off += TCP_RELAY_CHUNK) {
        size_t m = bytes - off < TCP_RELAY_CHUNK ? bytes - off : TCP_RELAY_CHUNK;
        if (t->member != root && (rc = tcp_xfer(t, NULL, 0, p + off, m, err)) < 0)
            return tcp_end(t, rc, err);
        if (tcp_next(t) != root && (rc = tcp_xfer(t, p + off, m, NULL, 0, err)) < 0)
            return tcp_end(t, rc, err);
    }
    return 0;
}

static int tcp_allgather_steps(mgpu_tcp_t *t, char *p, size_t block, mgpu_err_t *err)
{
    int rc, n = t->n;

    for (int s = 0; s < n - 1; s++) {
        int ss = (t->member - s + n) % n, rs = (t->member - s - 1 + 2 * n) % n;
        if ((rc = tcp_xfer(t, p + (size_t)ss * block, block, p + (size_t)rs * block, block, err)) <
            0)
            return tcp_end(t, rc, err);
    }
    return 0;
}

int mgpu_tcp_allgather(mgpu_tcp_t *t, void *buf, size_t block, const char *what, mgpu_err_t *err)
{
    int rc;

    if ((rc = tcp_begin(t, TCP_ALLGATHER, block, -1, 1, 1, what, err)) < 0)
        return rc;
    return tcp_allgather_steps(t, buf, block, err);
}

int mgpu_tcp_barrier(mgpu_tcp_t *t, const char *what, mgpu_err_t *err)
{
    char stack[256], *b;
    int rc;

    if ((rc = tcp_begin(t, TCP_BARRIER, 0, -1, 1, 1, what, err)) < 0 || t->n == 1)
        return rc;
    b = t->n <= (int)sizeof stack ? stack : malloc((size_t)t->n);
    if (b == NULL)
        return mgpu_err_set(err, -ENOMEM, "%s: out of memory", what);
    /* Everyone's byte reaches everyone: nobody leaves before all have arrived. */
    rc = tcp_allgather_steps(t, b, 1, err);
    if (b != stack)
        free(b);
    return rc;
}

/* ---- set-up ------------------------------------------------------------------------- */

/* This host's address on the route to host: connect() on a UDP socket picks the source
 * address without sending anything. */
static int tcp_route_addr(const char *host, char *buf, size_t len, mgpu_err_t *err)
{
    struct addrinfo hints, *ai = NULL;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int fd, rc;

    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_DGRAM;
    if ((rc = getaddrinfo(host, "9", &hints, &ai)) != 0)
        return mgpu_err_set(err, MGPU_E_USAGE, "getaddrinfo(%s): %s", host, gai_strerror(rc));
    fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    rc = fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen) < 0 ||
         getsockname(fd, (struct sockaddr *)&ss, &sl) < 0;
    freeaddrinfo(ai);
    if (rc) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return mgpu_err_set(err, -e, "finding this host's address towards %s: %s", host,
                            strerror(e));
    }
    close(fd);
    if (ss.ss_family == AF_INET6)
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, buf, (socklen_t)len);
    else
        inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, buf, (socklen_t)len);
    return 0;
}

static int tcp_connect(const char *host, int port, double deadline, int *out, mgpu_err_t *err)
{
    struct addrinfo hints, *ai = NULL;
    char ps[16];
    int fd, rc;

    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    snprintf(ps, sizeof ps, "%d", port);
    if ((rc = getaddrinfo(host, ps, &hints, &ai)) != 0)
        return mgpu_err_set(err, MGPU_E_USAGE, "getaddrinfo(%s): %s", host, gai_strerror(rc));
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        freeaddrinfo(ai);
        return mgpu_err_set(err, -errno, "socket: %s", strerror(errno));
    }
    rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
    freeaddrinfo(ai);
    if (rc < 0 && errno == EINPROGRESS) {
        struct pollfd p = {fd, POLLOUT, 0};
        int e = 0;
        socklen_t el = sizeof e;
        if (poll(&p, 1, tcp_ms_left(deadline)) <= 0)
            e = ETIMEDOUT;
        else
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el);
        rc = e ? -1 : 0;
        errno = e;
    }
    if (rc < 0) {
        int e = errno;
        close(fd);
        return mgpu_err_set(err, -e, "connect(%s:%d): %s", host, port, strerror(e));
    }
    tcp_setup_fd(fd);
    *out = fd;
    return 0;
}

/* Listens on every address of the family of the one this member publishes (an IPv6 address:
 * "::", which takes IPv4 too where the kernel allows it). */
static int tcp_listen(const char *host, int *fd_out, int *port_out, mgpu_err_t *err)
{
    const int v6 = strchr(host, ':') != NULL;
    struct sockaddr_storage a;
    socklen_t al = v6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
    int fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    memset(&a, 0, sizeof a);
    a.ss_family = v6 ? AF_INET6 : AF_INET; /* the any address and port 0: all zeros */
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, al) < 0 || listen(fd, 16) < 0 ||
        getsockname(fd, (struct sockaddr *)&a, &al) < 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return mgpu_err_set(err, -e, "listen(%s:0): %s", v6 ? "[::]" : "0.0.0.0", strerror(e));
    }
    *fd_out = fd;
    *port_out =
        ntohs(v6 ? ((struct sockaddr_in6 *)&a)->sin6_port : ((struct sockaddr_in *)&a)->sin_port);
    return 0;
}

/* Accepts the previous member's connection: the first one that proves itself with our
 * nonce and the right member number; anything else is dropped. */
static int tcp_accept_prev(mgpu_tcp_t *t, int lfd, uint64_t nonce, double deadline, mgpu_err_t *err)
{
    for (;;) {
        struct pollfd p = {lfd, POLLIN, 0};
        struct tcp_hello h;
        int fd;
        if (poll(&p, 1, tcp_ms_left(deadline)) <= 0)
            return mgpu_err_set(err, MGPU_E_TIMEOUT,
                                "CPU communicator: node %d (rank %d) did not connect within "
                                "%.1f s",
                                tcp_prev(t), tcp_prev(t) * t->per, t->timeout_s);
        fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        tcp_setup_fd(fd);
        t->prev_fd = fd;
        t->deadline = deadline;
        t->what = "CPU communicator set-up";
        if (tcp_xfer(t, NULL, 0, &h, sizeof h, err) == 0 && h.magic == TCP_MAGIC &&
            h.nonce == nonce && (int)h.member == tcp_prev(t) && (int)h.n == t->n)
            return 0;
        close(fd);
        t->prev_fd = -1;
        if (tcp_now() >= deadline)
            return mgpu_err_set(err, MGPU_E_TIMEOUT,
                                "CPU communicator: node %d (rank %d) did not connect within "
                                "%.1f s",
                                tcp_prev(t), tcp_prev(t) * t->per, t->timeout_s);
    }
}

int mgpu_tcp_open(const mgpu_tcp_opts_t *o, mgpu_tcp_t **out, mgpu_err_t *err)
{
    char host[256], key[512], val[400];
    double deadline = tcp_now() + o->timeout_s;
    int lfd = -1, port = 0, rc;
    uint64_t nonce;
    mgpu_tcp_t *t = calloc(1, sizeof *t);

    if (t == NULL)
        return mgpu_err_set(err, -ENOMEM, "mgpu_tcp_open: out of memory");
    t->member = o->member;
    t->n = o->n;
    t->per = o->ranks_per_member;
    t->timeout_s = o->timeout_s;
    t->lost = o->lost;
    t->next_fd = t->prev_fd = -1;
    if (o->n == 1) {
        *out = t;
        return 0;
    }
    if (getrandom(&nonce, sizeof nonce, 0) != sizeof nonce) {
        rc = mgpu_err_set(err, -errno, "getrandom: %s", strerror(errno));
        goto fail;
    }
    if (o->advertise != NULL)
        snprintf(host, sizeof host, "%s", o->advertise);
    else if ((rc = tcp_route_addr(o->route_host, host, sizeof host, err)) < 0)
        goto fail;
    if ((rc = tcp_listen(host, &lfd, &port, err)) < 0)
        goto fail;
    snprintf(key, sizeof key, "%s/%d", o->key, o->member);
    snprintf(val, sizeof val, "%s %d %llu", host, port, (unsigned long long)nonce);
    if ((rc = mgpu_store_set(o->store, key, val, strlen(val), err)) < 0)
        goto fail;
    {
        void *v = NULL;
        size_t vl = 0;
        char nhost[256];
        int nport;
        unsigned long long nnonce;
        struct tcp_hello h;
        snprintf(key, sizeof key, "%s/%d", o->key, tcp_next(t));
        if ((rc = mgpu_store_get(o->store, key, o->timeout_s, &v, &vl, err)) < 0) {
            char tmp[sizeof err->msg];
            snprintf(tmp, sizeof tmp, "%s", err->msg);
            mgpu_err_set(err, rc,
                         "CPU communicator: node %d (rank %d) never published its address "
                         "(did it create the communicator?): %.700s",
                         tcp_next(t), tcp_next(t) * t->per, tmp);
            goto fail;
        }
        snprintf(val, sizeof val, "%.*s", (int)(vl < sizeof val ? vl : sizeof val - 1), (char *)v);
        free(v);
        if (sscanf(val, "%255s %d %llu", nhost, &nport, &nnonce) != 3) {
            rc = mgpu_err_set(err, MGPU_E_PROTOCOL, "store key %s: malformed address \"%s\"", key,
                              val);
            goto fail;
        }
        if ((rc = tcp_connect(nhost, nport, deadline, &t->next_fd, err)) < 0) {
            char tmp[sizeof err->msg];
            snprintf(tmp, sizeof tmp, "%s", err->msg);
            mgpu_err_set(err, rc, "CPU communicator: node %d (rank %d): %s", tcp_next(t),
                         tcp_next(t) * t->per, tmp);
            goto fail;
        }
        h = (struct tcp_hello){TCP_MAGIC, (uint64_t)nnonce, (uint32_t)t->member, (uint32_t)t->n};
        t->deadline = deadline;
        t->what = "CPU communicator set-up";
        if ((rc = tcp_xfer(t, &h, sizeof h, NULL, 0, err)) < 0)
            goto fail;
    }
    if ((rc = tcp_accept_prev(t, lfd, nonce, deadline, err)) < 0)
        goto fail;
    close(lfd);
    *out = t;
    return 0;
fail:
    if (lfd >= 0)
        close(lfd);
    mgpu_tcp_close(t);
    return rc;
}

void mgpu_tcp_close(mgpu_tcp_t *t)
{
    if (t == NULL)
        return;
    if (t->next_fd >= 0)
        close(t->next_fd);
    if (t->prev_fd >= 0)
        close(t->prev_fd);
    free(t->tmp);
    free(t);
}
