#!/usr/bin/env python3
"""torch_train_bench.py - the PyTorch side of tests/bench/gpu_train_bench.sh.

  python3 torch_train_bench.py steps  CASE [CASE ...]   one JSON line per case and variant
  python3 torch_train_bench.py peak                     bare 8192^3 matmuls, tf32 and bf16
  torchrun --nproc_per_node=1 torch_train_bench.py first_step mlp
  torchrun --nproc_per_node=N torch_train_bench.py ddp_steps CASE
                                                        DDP step time at world size N
                                                        start-to-first-step (JSON line)

CASE is linear | mlp | mlp_tf32 | large_tf32 | large_bf16, the models of configs/bench_*.cfg: the same
layers, batch, loss, optimizer and precision as mgpu-worker runs. The batches are staged on
the GPU before timing (a list of device tensors, the cheapest input path PyTorch has), so
PyTorch's step is forward + loss + backward + SGD step + zero_grad and nothing else.

A step time is the mean over STEPS steps after WARMUP steps, timed with CUDA events around
the whole loop, as mgpu-worker's timing_warmup does. Variants: "eager", and "compile" =
torch.compile(step, mode="reduce-overhead") of the whole step function (CUDA graphs through
Inductor); if that raises, the model alone is compiled and the line says so.
"""
import contextlib
import json
import os
import sys
import time

import torch
import torch.nn as nn

CASES = {
    # name: (features, hidden, outputs, batch, samples, loss, precision, steps, warmup)
    "linear": (5, [], 2, 30, 90, "mse", "fp32", 3000, 300),
    "mlp": (784, [256, 256], 10, 256, 10240, "xent", "fp32", 2000, 200),
    "mlp_tf32": (784, [256, 256], 10, 256, 10240, "xent", "tf32", 2000, 200),
    "large_tf32": (8192, [8192, 8192, 8192], 8192, 8192, 8192, "mse", "tf32", 20, 5),
    "large_bf16": (8192, [8192, 8192, 8192], 8192, 8192, 8192, "mse", "bf16", 20, 5),
}


def build(case):
    feat, hidden, out, batch, samples, loss, prec, _, _ = CASES[case]
    torch.backends.cuda.matmul.allow_tf32 = prec == "tf32"
    torch.backends.cudnn.allow_tf32 = prec == "tf32"
    dims = [feat] + hidden + [out]
    layers = []
    for i in range(len(dims) - 1):
        layers.append(nn.Linear(dims[i], dims[i + 1]))
        if i < len(dims) - 2:
            layers.append(nn.ReLU())
    model = nn.Sequential(*layers).cuda()
    g = torch.Generator(device="cuda").manual_seed(0)
    nb = max(1, samples // batch)
    xs = [torch.randn(batch, feat, device="cuda", generator=g) for _ in range(nb)]
    if loss == "mse":
        ys = [torch.randn(batch, out, device="cuda", generator=g) for _ in range(nb)]
        loss_fn = nn.MSELoss()
    else:
        ys = [torch.randint(0, out, (batch,), device="cuda", generator=g) for _ in range(nb)]
        loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01 if feat < 8192 else 1e-4)
    amp = torch.bfloat16 if prec == "bf16" else None

    def step(x, y):
        ctx = torch.autocast("cuda", dtype=amp) if amp is not None else contextlib.nullcontext()
        with ctx:
            o = model(x)
        l = loss_fn(o.float(), y)
        l.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return l

    return model, step, xs, ys


def time_steps(step, xs, ys, steps, warmup):
    nb = len(xs)
    for i in range(warmup):
        step(xs[i % nb], ys[i % nb])
    torch.cuda.synchronize()
    a = torch.cuda.Event(enable_timing=True)
    b = torch.cuda.Event(enable_timing=True)
    a.record()
    for i in range(steps):
        step(xs[i % nb], ys[i % nb])
    b.record()
    b.synchronize()
    return 1000.0 * a.elapsed_time(b) / steps


def gemm_flops(case):
    feat, hidden, out, batch = CASES[case][:4]
    dims = [feat] + hidden + [out]
    f = 0
    for i in range(len(dims) - 1):
        mnk = 2.0 * batch * dims[i] * dims[i + 1]
        f += mnk * (3 if i > 0 else 2)  # forward, weight gradient, input gradient (not layer 0)
    return f


def cmd_steps(cases):
    start = time.time()
    # Compiling costs tens of seconds a model: once the run has taken TORCH_COMPILE_BUDGET_S
    # seconds, the remaining compiled variants are skipped so that a run's length stays bounded.
    compile_s = float(os.environ.get("TORCH_COMPILE_BUDGET_S", "1e9"))
    for case in cases:
        steps, warmup = CASES[case][7], CASES[case][8]
        for variant in ("eager", "compile"):
            if variant == "compile" and (os.environ.get("TORCH_BENCH_NO_COMPILE") == "1" or
                                         time.time() - start > compile_s):
                print(json.dumps({"case": case, "variant": variant, "skipped": "budget"}),
                      flush=True)
                continue
            torch.manual_seed(0)
            model, step, xs, ys = build(case)
            what = "step"
            fn = step
            t0 = time.time()
            try:
                if variant == "compile":
                    fn = torch.compile(step, mode="reduce-overhead")
                    fn(xs[0], ys[0])  # compile now, not inside the warm-up count
                us = time_steps(fn, xs, ys, steps, warmup)
            except Exception as e:  # report, then try the model alone
                print(json.dumps({"case": case, "variant": variant, "error": repr(e)[:300]}),
                      flush=True)
                if variant != "compile":
                    continue
                torch.manual_seed(0)
                model, step, xs, ys = build(case)
                model.forward = torch.compile(model.forward, mode="reduce-overhead")
                what = "model only"
                t0 = time.time()
                step(xs[0], ys[0])
                us = time_steps(step, xs, ys, steps, warmup)
            rec = {"case": case, "variant": variant, "compiled": what if variant == "compile"
                   else "", "step_us": us, "steps": steps, "warmup": warmup,
                   "setup_s": time.time() - t0}
            if case.startswith("large"):
                rec["tflops"] = gemm_flops(case) / (us * 1e-6) / 1e12
            print(json.dumps(rec), flush=True)
            del model, step, fn, xs, ys
            torch.cuda.empty_cache()


def cmd_peak():
    n = 8192
    for prec in ("tf32", "bf16"):
        torch.backends.cuda.matmul.allow_tf32 = prec == "tf32"
        dt = torch.bfloat16 if prec == "bf16" else torch.float32
        a = torch.randn(n, n, device="cuda", dtype=dt)
        b = torch.randn(n, n, device="cuda", dtype=dt)
        for _ in range(3):
            a @ b
        times = []
        for _ in range(10):
            e0 = torch.cuda.Event(enable_timing=True)
            e1 = torch.cuda.Event(enable_timing=True)
            e0.record()
            a @ b
            e1.record()
            e1.synchronize()
            times.append(e0.elapsed_time(e1))
        times.sort()
        ms = times[len(times) // 2]
        print(json.dumps({"case": "matmul_8192", "precision": prec, "ms": ms,
                          "tflops": 2.0 * n ** 3 / (ms * 1e-3) / 1e12}), flush=True)
        del a, b


def ddp_setup(case):
    """What a torchrun script does first: its GPU from LOCAL_RANK, an NCCL process group, the
    case's model wrapped in DDP. Returns (dist, ddp model, inputs, targets, loss function)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    model, _, xs, ys = build(case)
    loss_fn = nn.CrossEntropyLoss() if CASES[case][5] == "xent" else nn.MSELoss()
    return dist, DDP(model, device_ids=[local]), xs, ys, loss_fn


def cmd_first_step(case):
    dist, ddp, xs, ys, loss_fn = ddp_setup(case)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    l = loss_fn(ddp(xs[0]), ys[0])
    l.backward()
    opt.step()
    torch.cuda.synchronize()
    t = time.time()
    if dist.get_rank() == 0:
        print(json.dumps({"first_step_unix_s": t, "loss": l.item()}), flush=True)
    dist.destroy_process_group()


def cmd_ddp_steps(case):
    """Under torchrun: DDP over NCCL at the launcher's world size, each rank with the case's
    batch (weak scaling, as mgpu-launch + mgpu-worker run it); rank 0 prints the step time
    over the timed steps (CUDA events) and the host time of the end of the first step."""
    dist, ddp, xs, ys, loss_fn = ddp_setup(case)
    feat, hidden, out, batch, samples, loss, prec, steps, warmup = CASES[case]
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01 if feat < 8192 else 1e-4)
    amp = torch.bfloat16 if prec == "bf16" else None
    nb = len(xs)

    def step(i):
        ctx = torch.autocast("cuda", dtype=amp) if amp is not None else contextlib.nullcontext()
        with ctx:
            o = ddp(xs[i % nb])
        l = loss_fn(o.float(), ys[i % nb])
        l.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return l

    step(0)
    torch.cuda.synchronize()
    first = time.time()
    for i in range(1, warmup):
        step(i)
    torch.cuda.synchronize()
    a = torch.cuda.Event(enable_timing=True)
    b = torch.cuda.Event(enable_timing=True)
    a.record()
    for i in range(steps):
        step(i)
    b.record()
    torch.cuda.synchronize()
    if dist.get_rank() == 0:
        print(json.dumps({"case": case, "variant": "ddp", "world_size": dist.get_world_size(),
                          "step_us": 1000.0 * a.elapsed_time(b) / steps, "steps": steps,
                          "first_step_unix_s": first}), flush=True)
    dist.destroy_process_group()


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    cmd = sys.argv[1]
    if cmd == "steps":
        cmd_steps(sys.argv[2:] or list(CASES))
    elif cmd == "peak":
        cmd_peak()
    elif cmd == "first_step":
        cmd_first_step(sys.argv[2] if len(sys.argv) > 2 else "mlp")
    elif cmd == "ddp_steps":
        cmd_ddp_steps(sys.argv[2] if len(sys.argv) > 2 else "large_bf16")
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
