/* sock.c - see sock.h. */
#include "sock.h"

#include <netinet/in.h> /* sockaddr_in */
#include <stdio.h>      /* snprintf */
#include <string.h>     /* strcmp, memcmp */
#include <sys/socket.h> /* socket */
#include <unistd.h>     /* close */

int mgpu_sock_free_port(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
    socklen_t len = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), port = -1;

    if (fd < 0)
        return -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
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
