#!/usr/bin/python3
"""tcpstore_bench.py - PyTorch's TCPStore through the same steps as store_bench.c.

    /usr/bin/python3 tcpstore_bench.py [SECONDS [CLIENTS [RDZV]]]

The TCPStore server runs in its own process (a master TCPStore whose daemon thread serves);
clients are processes forked after torch is imported, connected before the clock starts and
released together by closing a pipe. Each get is checked against the value set. Output lines
are those of store_bench.c: "<what> <clients> <figure> <wrong>".
"""
import datetime
import os
import sys
import time

import torch.distributed as dist

HOST = "127.0.0.1"
VALUE = b"0123456789abcdef"
TIMEOUT = datetime.timedelta(seconds=120)


def client(port):
    return dist.TCPStore(HOST, port, None, False, TIMEOUT)


def start_server():
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            store = dist.TCPStore(HOST, 0, None, True, TIMEOUT, False)
            os.write(w, str(store.port).encode() + b"\n")
            os.close(w)
            while True:  # the store's daemon thread serves; this thread only keeps it alive
                time.sleep(3600)
        finally:
            os._exit(1)
    os.close(w)
    port = int(os.read(r, 32).decode().strip())
    os.close(r)
    return pid, port


def reap(n):
    bad = 0
    for _ in range(n):
        _, st = os.wait()
        bad += not (os.WIFEXITED(st) and os.WEXITSTATUS(st) == 0)
    return bad


def tp_client(port, is_get, secs, i, ready_w, go_r, res_w):
    try:
        s = client(port)
        key = "tp/%d" % i
        s.set(key, VALUE)
        os.write(ready_w, b"r")
        os.read(go_r, 1)
        ops = wrong = 0
        end = time.monotonic() + secs
        while time.monotonic() < end:
            for _ in range(32):
                if is_get:
                    wrong += s.get(key) != VALUE
                else:
                    s.set(key, VALUE)
                ops += 1
        os.write(res_w, b"%d %d\n" % (ops, wrong))
        os._exit(0)
    except BaseException as e:  # a child must never return into the parent's code
        print("tcpstore_bench: client: %r" % e, file=sys.stderr)
        os._exit(1)


def throughput(port, is_get, n, secs):
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    res_r, res_w = os.pipe()
    for i in range(n):
        if os.fork() == 0:
            os.close(go_w)
            tp_client(port, is_get, secs, i, ready_w, go_r, res_w)
    os.close(go_r)
    for _ in range(n):
        assert os.read(ready_r, 1) == b"r"
    os.close(go_w)
    ops = wrong = 0
    f = os.fdopen(res_r)
    for _ in range(n):
        a, b = f.readline().split()
        ops += int(a)
        wrong += int(b)
    wrong += reap(n)
    print("%s %d %.0f %d" % ("get" if is_get else "set", n, ops / secs, wrong), flush=True)
    for fd in (ready_r, ready_w, res_w):
        os.close(fd)
    f.close()


def rdzv_client(port, n, rank, go_r, res_w):
    try:
        os.read(go_r, 1)
        s = client(port)
        s.set("rdzv/rank/%d" % rank, b"1")
        if s.add("rdzv/count", 1) == n:
            s.set("rdzv/done", b"1")
        s.wait(["rdzv/done"])
        os.write(res_w, b"d")
        os._exit(0)
    except BaseException as e:
        print("tcpstore_bench: rendezvous client: %r" % e, file=sys.stderr)
        os._exit(1)


def rendezvous(port, n):
    go_r, go_w = os.pipe()
    res_r, res_w = os.pipe()
    for i in range(n):
        if os.fork() == 0:
            os.close(go_w)
            rdzv_client(port, n, i, go_r, res_w)
    os.close(go_r)
    t0 = time.monotonic()
    os.close(go_w)
    got = 0
    while got < n:
        b = os.read(res_r, n - got)
        if not b:
            break
        got += len(b)
    t1 = time.monotonic()
    wrong = (n - got) + reap(n)
    s = client(port)
    wrong += sum(s.get("rdzv/rank/%d" % i) != b"1" for i in range(n))
    print("rdzv %d %.4f %d" % (n, t1 - t0, wrong), flush=True)


def main():
    secs = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
    nclients = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    nrdzv = int(sys.argv[3]) if len(sys.argv) > 3 else 1024
    srv, port = start_server()
    try:
        throughput(port, True, 1, secs)
        throughput(port, False, 1, secs)
        throughput(port, True, nclients, secs)
        throughput(port, False, nclients, secs)
        rendezvous(port, nrdzv)
    finally:
        os.kill(srv, 9)
        os.waitpid(srv, 0)


if __name__ == "__main__":
    main()
