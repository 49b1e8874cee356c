#!/usr/bin/env python3
"""store_flood.py - floods an mgpu store with connections that never authenticate.

    store_flood.py HOST PORT IDLE GARBAGE HOLD_UNTIL_FILE [SECONDS]

Opens IDLE connections that send nothing and GARBAGE connections that send an HTTP request,
and keeps IDLE of them open: each one the server closes is opened again, as a determined
client would. Prints "flooding with N idle and M garbage connections" once they are open, then
"reopened K" at the end; stops when HOLD_UNTIL_FILE exists or after SECONDS (default 60).
Loopback only: the host must be 127.0.0.1 or ::1.
"""
import os
import resource
import selectors
import socket
import sys
import time

host, port, idle, garbage, hold = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
limit = float(sys.argv[6]) if len(sys.argv) > 6 else 60.0
assert host in ("127.0.0.1", "::1"), "store_flood.py floods loopback only"

soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
want = idle + garbage + 64
if soft < want:
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))

sel = selectors.DefaultSelector()


def open_idle():
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    s.connect((host, port))
    s.setblocking(False)
    sel.register(s, selectors.EVENT_READ)


failed = 0
for _ in range(idle):
    try:
        open_idle()
    except OSError:
        failed += 1
junk = []
for _ in range(garbage):
    try:
        s = socket.create_connection((host, port), timeout=5)
        s.sendall(b"GET / HTTP/1.1\r\nHost: store\r\n\r\n")
        junk.append(s)
    except OSError:
        failed += 1
print("flooding with %d idle and %d garbage connections (%d failed to open)" % (idle, garbage, failed), flush=True)

reopened = 0
end = time.time() + limit
while not os.path.exists(hold) and time.time() < end:
    for key, _ in sel.select(timeout=0.05):
        s = key.fileobj
        sel.unregister(s)
        s.close()
        try:
            open_idle()
            reopened += 1
        except OSError:
            pass
print("reopened %d idle connections the server closed" % reopened, flush=True)
