#!/usr/bin/env python3
"""gpt_sdpa_bench.py B T NH HS - PyTorch's causal F.scaled_dot_product_attention on q, k, v of
(B, NH, T, HS), forward and backward, in fp32 and in bf16, timed with CUDA events (median of 10
calls after 3 warm-ups). Prints one line: "sdpa FP32_FWD FP32_BWD BF16_FWD BF16_BWD" in ms.
Run by build/tests/gpt_kernels_bench, which prints the figures beside its own attention's."""
import statistics
import sys

import torch
import torch.nn.functional as F


def timed(fn, iters=10, warm=3):
    for _ in range(warm):
        fn()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def measure(b, t, nh, hs, dtype):
    q, k, v = (torch.randn(b, nh, t, hs, device="cuda", dtype=dtype, requires_grad=True)
               for _ in range(3))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    dout = torch.randn_like(out)
    fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    # the backward alone: autograd.grad over a graph kept from one forward
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    bwd = timed(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
    return fwd, bwd


def main():
    if len(sys.argv) != 5:
        sys.exit("usage: gpt_sdpa_bench.py B T NH HS")
    if not torch.cuda.is_available():
        sys.exit("gpt_sdpa_bench.py: torch has no CUDA device")
    b, t, nh, hs = (int(a) for a in sys.argv[1:])
    f32 = measure(b, t, nh, hs, torch.float32)
    b16 = measure(b, t, nh, hs, torch.bfloat16)
    print("sdpa %.4f %.4f %.4f %.4f" % (f32[0], f32[1], b16[0], b16[1]))


if __name__ == "__main__":
    main()
