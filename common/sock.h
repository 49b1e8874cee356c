/* sock.h - small socket facts shared by the launcher's modules and the store's client.
 * Nothing to own or free. */
#ifndef MGPU_SOCK_H
#define MGPU_SOCK_H

#include <stddef.h> /* size_t */

/* A TCP port nobody listens on now (bound on every IPv4 address, then closed), or -1: a random
 * one below the kernel's ephemeral range (20000 up, PyTorch's 29400-29599 left out), so that
 * no outgoing connection takes it before its server binds it; the kernel's pick (port 0) when
 * the range leaves no room below it. Racy by nature: a process that binds it later must
 * tolerate losing it; PyTorch's TCPStore sets SO_REUSEADDR and mgpu's store reports a taken
 * port by name. */
int mgpu_sock_free_port(void);

/* 1 when host names the loopback interface ("localhost", 127.x.y.z, "::1"). */
int mgpu_sock_is_loopback(const char *host);

/* "HOST:PORT" into buf (size n), "[HOST]:PORT" for an IPv6 address, as messages and
 * endpoints write it; returns buf. */
const char *mgpu_sock_hostport(char *buf, size_t n, const char *host, int port);

/* 1 when the connected TCP socket fd reached itself: its local address and port are its
 * peer's. A connect(2) to a port of this host that nobody listens on can be given that very
 * port as its source when the port lies in the ephemeral range (TCP's simultaneous open),
 * and the connection then reads back what it writes. A client that retries until a server
 * comes up must treat it as "nobody listens" and close it, which also frees the port for the
 * server. */
int mgpu_sock_is_self_connected(int fd);

/* 1 when the address is on the loopback interface (127.0.0.0/8 or ::1). */
struct sockaddr;
int mgpu_sock_addr_is_loopback(const struct sockaddr *a);

#endif
