"""gloo_allreduce.py - PyTorch gloo's all-reduce timed the way allreduce_bench times mgpu's.

    /usr/bin/python3 tests/bench/gloo_allreduce.py -n 4 [--min 4K] [--max 64M] [--seconds 0.3]

Starts N local ranks (torch.multiprocessing), init_process_group("gloo") over TCP on
127.0.0.1, float32 sum. Per size: two warm-up calls; the slowest rank's warm-up time sizes the
timed loop so every rank runs the same count; the reported time is the slowest rank's mean.
One more call on integer data is checked exactly (#wrong). Rank 0 prints the same columns as
allreduce_bench. Run it with an interpreter that has torch: Debian's /usr/bin/python3
(python3-torch), not a virtual environment's python3 without it.
"""
import argparse
import os
import socket
import sys
import time


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if s and s[-1].upper() in mult:
        return int(s[:-1]) * mult[s[-1].upper()]
    return int(s)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank, world, port, lo, hi, seconds):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # torchrun's OMP_NUM_THREADS=1 for several workers
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    if rank == 0:
        print(f"# gloo all-reduce (torch {torch.__version__}), float32 sum, {world} ranks")
        print("# %12s %8s %12s %10s %10s %7s" % ("bytes", "iters", "time_us", "algbw_GB/s",
                                                 "busbw_GB/s", "#wrong"), flush=True)
    idx_all = torch.arange(hi // 4, dtype=torch.int64)
    size = lo
    while size <= hi:
        n = size // 4
        idx = idx_all[:n]

        def values(r):
            return ((idx * 7 + r * 13) % 1000 - 500).to(torch.float32)

        buf = values(rank)
        t = time.perf_counter()
        for _ in range(2):
            dist.all_reduce(buf)
        t = torch.tensor([(time.perf_counter() - t) / 2], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        iters = int(max(5, min(20000, seconds / max(t.item(), 1e-7))))
        dist.barrier()
        t = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buf)
        t = torch.tensor([(time.perf_counter() - t) / iters], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        buf = values(rank)
        dist.all_reduce(buf)
        want = sum(values(r) for r in range(world))
        wrong = torch.tensor([int((buf != want).sum().item())], dtype=torch.int64)
        dist.all_reduce(wrong)
        if rank == 0:
            tmax = t.item()
            algbw = size / tmax / 1e9
            print("  %12d %8d %12.1f %10.3f %10.3f %7d" % (size, iters, tmax * 1e6, algbw,
                                                          algbw * 2 * (world - 1) / world,
                                                          wrong.item()), flush=True)
        size *= 4
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, required=True)
    ap.add_argument("--min", default="4K")
    ap.add_argument("--max", default="64M")
    ap.add_argument("--seconds", type=float, default=0.3)
    a = ap.parse_args()
    import torch.multiprocessing as mp

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.start_processes(rank_main, args=(a.n, free_port(), parse_size(a.min), parse_size(a.max),
                                        a.seconds), nprocs=a.n, start_method="fork")
    return 0


if __name__ == "__main__":
    sys.exit(main())
