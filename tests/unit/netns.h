/* netns.h - a network namespace of the test's own, for the tests that change what the kernel
 * does with ports: each test runs in its own process (check.h), so the namespace, its loopback
 * and its ephemeral range (where connect(2) takes source ports) end with the test. Needs root;
 * a test skips when netns_enter fails. Included after check.h. */
#ifndef MGPU_TEST_NETNS_H
#define MGPU_TEST_NETNS_H

#include <net/if.h>     /* ifreq, IFF_UP */
#include <netinet/in.h> /* IPPROTO_TCP */
#include <sched.h>      /* unshare, CLONE_NEWNET */
#include <stdio.h>      /* fopen */
#include <sys/ioctl.h>  /* SIOCGIFFLAGS */
#include <sys/socket.h> /* socket */
#include <unistd.h>     /* close */

/* This process's ephemeral range (its namespace's); 0 or -1. */
static inline int netns_ephemeral(int lo, int hi)
{
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "w");
    if (f == NULL)
        return -1;
    fprintf(f, "%d %d\n", lo, hi);
    return fclose(f) == 0 ? 0 : -1;
}

/* A namespace of this process's own with its loopback up and the ephemeral range lo..hi;
 * 0 or -1. */
static inline int netns_enter(int lo, int hi)
{
    struct ifreq ifr = {0};
    int fd, rc = -1;
    if (unshare(CLONE_NEWNET) != 0 || (fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0)) < 0)
        return -1;
    snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "lo");
    if (ioctl(fd, SIOCGIFFLAGS, &ifr) == 0) {
        ifr.ifr_flags |= IFF_UP;
        rc = ioctl(fd, SIOCSIFFLAGS, &ifr);
    }
    close(fd);
    return rc == 0 ? netns_ephemeral(lo, hi) : -1;
}

#endif
