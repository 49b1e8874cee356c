/* status_client.h - `mgpu-launch status [--stacks] [--json]`: asks every running launcher of
 * this user, through its status socket (status_server.h), where its ranks are, and prints the
 * answers for people or, with --json, as one JSON object {"jobs": [...]} for scripts. A
 * socket nobody listens on any more (its launcher was killed) is removed; a folder or socket
 * that another user could have made or read is refused, with a message. */
#ifndef MGPU_STATUS_CLIENT_H
#define MGPU_STATUS_CLIENT_H

#include <stdio.h> /* FILE */

/* argv[0] is "status". Returns the exit status: 0, 1 when a folder or a socket was refused or
 * a launcher did not answer, 2 for bad usage. */
int mgpu_status_client_main(int argc, char **argv, FILE *out);

#endif
