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

const char *mgpu_sock_hostport(char *buf, size_t n, const char *host, int port)
{
    snprintf(buf, n, strchr(host, ':') != NULL ? "[%s]:%d" : "%s:%d", host, port);
    return buf;
}
