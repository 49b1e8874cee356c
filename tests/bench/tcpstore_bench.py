#!/usr/bin/python3
"""tcpstore_bench.py - PyTorch's TCPStore through the same steps as store_bench.c.

    /usr/bin/python3 tcpstore_bench.py [SECONDS [CLIENTS [RDZV [REPS]]]]

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


def throughput_once(port, is_get, n, secs):
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    res_r, res_w = os.pipe()
    for i in range(n):
        if os.fork() == 0:
            os.close(go_w)
            tp_client(port, is_get, secs, i, ready_w, go_r, res_w)
    os.close(go_r)
    os.close(ready_w)  # a client that dies makes the reads below end, not hang
    os.close(res_w)
    for _ in range(n):
        if os.read(ready_r, 1) != b"r":
            raise SystemExit("tcpstore_bench: a client failed before it was ready")
    os.close(go_w)
    ops = wrong = 0
    f = os.fdopen(res_r)
    for _ in range(n):
        line = f.readline().split()
        if len(line) != 2:
            raise SystemExit("tcpstore_bench: a client failed")
        a, b = line
        ops += int(a)
        wrong += int(b)
    wrong += reap(n)
    os.close(ready_r)
    f.close()
    return ops / secs, wrong


def throughput(port, is_get, n, secs, reps):
    """The median of reps measurements, as store_bench.c does."""
    runs = [throughput_once(port, is_get, n, secs) for _ in range(reps)]
    what = "get" if is_get else "set"
    print("# %s %d: %s" % (what, n, " ".join("%.0f" % r[0] for r in runs)))
    med = sorted(r[0] for r in runs)[reps // 2]
    print("%s %d %.0f %d" % (what, n, med, sum(r[1] for r in runs)), flush=True)


def rdzv_client(port, n, rnd, rank, go_r, res_w):
    try:
        os.read(go_r, 1)
        s = client(port)
        s.set("rdzv%d/rank/%d" % (rnd, rank), b"1")
        if s.add("rdzv%d/count" % rnd, 1) == n:
            s.set("rdzv%d/done" % rnd, b"1")
        s.wait(["rdzv%d/done" % rnd])
        os.write(res_w, b"d")
        os._exit(0)
    except BaseException as e:
        print("tcpstore_bench: rendezvous client: %r" % e, file=sys.stderr)
        os._exit(1)


def rendezvous_once(port, n, rnd):
    go_r, go_w = os.pipe()
    res_r, res_w = os.pipe()
    for i in range(n):
        if os.fork() == 0:
            os.close(go_w)
            os.close(res_r)
            rdzv_client(port, n, rnd, i, go_r, res_w)
    os.close(go_r)
    os.close(res_w)  # a client that dies makes the reads below end, not hang
    t0 = time.monotonic()
    os.close(go_w)
    got = 0
    while got < n:
        b = os.read(res_r, n - got)
        if not b:
            break
        got += len(b)
    t1 = time.monotonic()
    os.close(res_r)
    wrong = (n - got) + reap(n)
    s = client(port)
    wrong += sum(s.get("rdzv%d/rank/%d" % (rnd, i)) != b"1" for i in range(n))
    return t1 - t0, wrong


def rendezvous(port, n, reps):
    runs = [rendezvous_once(port, n, r) for r in range(reps)]
    print("# rdzv %d: %s" % (n, " ".join("%.4f" % r[0] for r in runs)))
    med = sorted(r[0] for r in runs)[reps // 2]
    print("rdzv %d %.4f %d" % (n, med, sum(r[1] for r in runs)), flush=True)


def main():
    secs = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
    nclients = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    nrdzv = int(sys.argv[3]) if len(sys.argv) > 3 else 1024
    reps = max(1, int(sys.argv[4]) if len(sys.argv) > 4 else 3)
    srv, port = start_server()
    try:
        throughput(port, True, 1, secs, reps)
        throughput(port, False, 1, secs, reps)
        throughput(port, True, nclients, secs, reps)
        throughput(port, False, nclients, secs, reps)
        rendezvous(port, nrdzv, reps)
    finally:
        os.kill(srv, 9)
        os.waitpid(srv, 0)


if __name__ == "__main__":
    main()
