/* sock.h - small socket facts shared by the launcher's modules. Nothing to own or free. */
#ifndef MGPU_SOCK_H
#define MGPU_SOCK_H

#include <stddef.h> /* size_t */

/* A TCP port nobody listens on now (bind to port 0 on every address, read it, close), or -1.
 * Racy by nature: a process that binds it later must tolerate losing it; PyTorch's TCPStore
 * sets SO_REUSEADDR and mgpu's store reports a taken port by name. */
int mgpu_sock_free_port(void);

/* 1 when host names the loopback interface ("localhost", 127.x.y.z, "::1"). */
int mgpu_sock_is_loopback(const char *host);

/* "HOST:PORT" into buf (size n), "[HOST]:PORT" for an IPv6 address, as messages and
 * endpoints write it; returns buf. */
const char *mgpu_sock_hostport(char *buf, size_t n, const char *host, int port);

/* 1 when the address is on the loopback interface (127.0.0.0/8 or ::1). */
struct sockaddr;
int mgpu_sock_addr_is_loopback(const struct sockaddr *a);

#endif
