/* sock.c - see sock.h. */
#include "sock.h"

#include <netinet/in.h> /* sockaddr_in */
#include <stdint.h>     /* uint32_t */
#include <stdio.h>      /* snprintf, fopen */
#include <string.h>     /* strcmp, memcmp */
#include <sys/random.h> /* getrandom */
#include <sys/socket.h> /* socket */
#include <unistd.h>     /* close */

/* Below the kernel's ephemeral range, from here up, leaving out PyTorch's default ports (29400
 * of the c10d rendezvous, 29500 of MASTER_PORT, and mgpu's P + 1 next to them). */
enum { kFreeLow = 20000, kTorchLow = 29400, kTorchHigh = 29600 };

/* 1 when port can be bound on every IPv4 address now (nobody listens on it or holds it). */
static int bindable(int port, int *got)
{
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_ANY)};
    socklen_t len = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), ok = 0;

    if (fd < 0)
        return 0;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0) {
        *got = ntohs(a.sin_port);
        ok = 1;
    }
    close(fd);
    return ok;
}

/* The first port of the kernel's ephemeral range (where connect(2) takes source ports), or -1. */
static int ephemeral_low(void)
{
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "re");
    int lo = -1, hi = -1;

    if (f == NULL)
        return -1;
    if (fscanf(f, "%d %d", &lo, &hi) != 2)
        lo = -1;
    fclose(f);
    return lo;
}

int mgpu_sock_free_port(void)
{
    const int lo = ephemeral_low();
    int port = -1;

    /* A port of the ephemeral range, free now, could be any outgoing connection's source port
     * before the worker that is to listen on it does (PyTorch's rank 0 binds it seconds later,
     * after its imports), and a rank that connects to it too early could be handed it and
     * reach itself. Below the range neither can happen. */
    for (int i = 0; lo > kFreeLow + 1000 && lo <= 65536 && i < 64; i++) {
        uint32_t r = 0;
        if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r)
            break;
        const int p = kFreeLow + (int)(r % (uint32_t)(lo - kFreeLow));
        if ((p < kTorchLow || p >= kTorchHigh) && bindable(p, &port))
            return port;
    }
    return bindable(0, &port) ? port : -1; /* what the kernel picks */
}

int mgpu_sock_is_loopback(const char *host)
{
    return strcmp(host, "localhost") == 0 || strncmp(host, "127.", 4) == 0 ||
           strcmp(host, "::1") == 0;
}

int mgpu_sock_addr_is_loopback(const struct sockaddr *a)
{
    static const struct in6_addr lo6 = IN6ADDR_LOOPBACK_INIT;
    if (a->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)a)->sin_addr.s_addr) >> 24) == 127;
    return a->sa_family == AF_INET6 &&
           memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &lo6, sizeof lo6) == 0;
}

int mgpu_sock_is_self_connected(int fd)
{
    struct sockaddr_storage me, peer;
    socklen_t ml = sizeof me, pl = sizeof peer;

    memset(&me, 0, sizeof me);
    memset(&peer, 0, sizeof peer);
    if (getsockname(fd, (struct sockaddr *)&me, &ml) != 0 ||
        getpeername(fd, (struct sockaddr *)&peer, &pl) != 0 || ml != pl)
        return 0;
    if (me.ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)&me,
                                 *b = (const struct sockaddr_in *)&peer;
        return a->sin_port == b->sin_port && a->sin_addr.s_addr == b->sin_addr.s_addr;
    }
    if (me.ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&me,
                                  *b = (const struct sockaddr_in6 *)&peer;
        return a->sin6_port == b->sin6_port &&
               memcmp(&a->sin6_addr, &b->sin6_addr, sizeof a->sin6_addr) == 0;
    }
    return 0;
}

const char *mgpu_sock_hostport(char *buf, size_t n, const char *host, int port)
{
    snprintf(buf, n, strchr(host, ':') != NULL ? "[%s]:%d" : "%s:%d", host, port);
    return buf;
}
