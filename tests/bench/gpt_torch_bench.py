#!/usr/bin/env python3
"""gpt_torch_bench.py - PyTorch's side of tests/bench/gpt_bench.sh: a GPT-2 (nanoGPT's model)
trained on one GPU in bf16, and the helpers of the driver.

  python3 gpt_torch_bench.py run [--shapes 124m,small] [--modes eager,compile,gemm]
                                 [--precision bf16|tf32|fp32] [--device cuda|cpu]
                                 [--warmup N] [--steps N] [--windows N] [--window-s S]
                                 [--compile-budget S] [--compile-mode MODE] [--peak-tflops T]
  python3 gpt_torch_bench.py tokens FILE COUNT VOCAB [SEED]   random little-endian uint16 < VOCAB
  python3 gpt_torch_bench.py spec PRECISION SECONDS SHAPE...   a shape's mgpu-worker key=values
  python3 gpt_torch_bench.py mgpu SHAPE RC METRICS STDOUT SMI [PREC]  a worker run's record
  python3 gpt_torch_bench.py peak SHAPE MODE SMI [PRECISION]   one JSON line: a run's peak MiB
  python3 gpt_torch_bench.py kernels IMPL SHAPE STEPS CSV      GEMM time a step, from nsys stats
  python3 gpt_torch_bench.py drop FILE... -- SHAPE...          forget those shapes' records
  python3 gpt_torch_bench.py table FILE...                     the table of the JSON lines

Shapes: 124m, 124m-2k, 350m, 774m, h128, 1.5b (GPT-2's, vocabulary 50304), small (bytes), or
the generic L=layers,D=width,H=heads,T=context,B=batch[,V=vocabulary] (see SHAPES).

The model is nanoGPT's GPT: token and learned position embeddings, pre-LayerNorm blocks
(LayerNorm with bias, eps 1e-5) of causal self-attention through
F.scaled_dot_product_attention(is_causal=True) and a 4x MLP with tanh-GELU, a final LayerNorm,
the output layer tied to the token embedding, biases everywhere GPT-2 has them; init normal
0.02, the c_proj weights 0.02/sqrt(2*n_layer), biases 0. The step is a forward under
torch.autocast(bfloat16), the mean cross-entropy, the backward, clip_grad_norm_(1.0), a fused
AdamW step (torch.optim.AdamW(fused=True), lr 6e-4 with warm-up and cosine decay, betas 0.9,
0.95, weight decay 0.1 on the tensors of two or more dimensions: the linear layers' weights and
both embeddings; none on biases and LayerNorm) and zero_grad. Batches are synthetic tokens
staged on the GPU before timing, the cheapest input path PyTorch has.

Precisions: bf16 (the above), tf32 (no autocast, TF32 products), fp32 (no autocast, no TF32:
PyTorch's default). --device cpu runs the same on the CPU (to check the script where there is
no GPU; attention as a masked softmax where torch has no scaled_dot_product_attention).

Modes: "eager"; "compile" = torch.compile(model) (nanoGPT's way: the model, not the
optimizer), compiled during the first steps under --compile-budget seconds (a compile that
fails or runs past it prints an "error" line and the run goes on); "gemm" = a bare bf16
torch.matmul of every GEMM shape of the step (forward, input gradient and weight gradient of
each linear layer and of the output layer; attention's own products are inside SDPA's kernel
and left out) and of an 8192^3 square, the denominator of "the step's GEMMs at X% of the bare
product".

Timing: --warmup steps, then --windows windows of --steps steps, each timed with CUDA events;
tokens/s is the median window's. With --window-s, the steps per window follow from the last
warm-up step's time (3 to --steps), and the warm-up ends once it took three windows' time. Memory: torch.cuda.max_memory_allocated and
max_memory_reserved from the model's creation to the last step. Model FLOPs per token follow
nanoGPT's estimate_mfu: 6 * (parameters less the position embedding) + 12 * n_layer * n_embd *
context (attention's two products, forward and backward, counted over the full T x T square);
MFU divides by --peak-tflops (default: the H200 SXM's dense bf16 figure, 989.4 TFLOP/s).

Output: one JSON line per measurement on stdout, then (run) a readable summary on stderr.
"""
import json
import math
import os
import signal
import statistics
import sys
import time

SHAPES = {
    # name: GPT-2's shapes with nanoGPT's padded vocabulary (the six of the benchmark), and a
    # byte-level model; "cfg" is the shape's file under configs/
    "124m": {"n_layer": 12, "n_head": 12, "n_embd": 768, "context": 1024, "vocab": 50304,
             "batch": 16, "target": 1.2, "cfg": "bench_gpt_124m.cfg"},
    "124m-2k": {"n_layer": 12, "n_head": 12, "n_embd": 768, "context": 2048, "vocab": 50304,
                "batch": 8, "target": 1.2, "cfg": "bench_gpt_124m_2k.cfg"},
    "350m": {"n_layer": 24, "n_head": 16, "n_embd": 1024, "context": 1024, "vocab": 50304,
             "batch": 8, "target": 1.2, "cfg": "bench_gpt_350m.cfg"},
    "774m": {"n_layer": 36, "n_head": 20, "n_embd": 1280, "context": 1024, "vocab": 50304,
             "batch": 8, "target": 1.2, "cfg": "bench_gpt_774m.cfg"},
    "h128": {"n_layer": 12, "n_head": 12, "n_embd": 1536, "context": 1024, "vocab": 50304,
             "batch": 8, "target": 1.2, "cfg": "bench_gpt_h128.cfg"},
    "1.5b": {"n_layer": 48, "n_head": 25, "n_embd": 1600, "context": 1024, "vocab": 50304,
             "batch": 4, "target": 1.2, "cfg": "bench_gpt_1558m.cfg"},
    "small": {"n_layer": 6, "n_head": 6, "n_embd": 384, "context": 256, "vocab": 256,
              "batch": 64, "target": 1.5, "cfg": "bench_gpt_small.cfg"},
}
# The generic form's letters: L=layers, D=width, H=heads, T=context, B=batch, V=vocabulary
# (optional, 50304); its target is the named GPT-2 shapes' one.
GENERIC = {"L": "n_layer", "D": "n_embd", "H": "n_head", "T": "context", "B": "batch",
           "V": "vocab"}
GENERIC_FORM = "L=24,D=1024,H=16,T=1024,B=8[,V=50304]"
H200_BF16_DENSE_TFLOPS = 989.4  # NVIDIA's H200 SXM data sheet: 1,979 with 2:4 sparsity
# The peak each precision's products run against (the same data sheet, dense): TF32 tensor
# cores, and fp32 without them (torch with allow_tf32 off, mgpu-worker's precision = fp32).
PEAK_TFLOPS = {"bf16": H200_BF16_DENSE_TFLOPS, "tf32": 494.7, "fp32": 66.9}
PRECISIONS = ("bf16", "tf32", "fp32")


def shape_of(name):
    """The spec of a named shape or of the generic form; ValueError naming what is wrong."""
    if name in SHAPES:
        return SHAPES[name]
    if "=" not in name:
        raise ValueError(f"unknown shape '{name}' (expected one of {', '.join(SHAPES)}, "
                         f"or {GENERIC_FORM})")
    s = {"vocab": 50304, "target": 1.2, "cfg": "bench_gpt_124m.cfg"}
    for part in name.split(","):
        k, _, v = part.partition("=")
        if k not in GENERIC or not v.isdigit() or int(v) < 1:
            raise ValueError(f"shape '{name}': '{part}' is not one of L, D, H, T, B, V = a "
                             f"positive integer (expected {GENERIC_FORM})")
        s[GENERIC[k]] = int(v)
    missing = [k for k, f in GENERIC.items() if f not in s]
    if missing:
        raise ValueError(f"shape '{name}': {', '.join(missing)} missing "
                         f"(expected {GENERIC_FORM})")
    if s["n_embd"] % s["n_head"]:
        raise ValueError(f"shape '{name}': D = {s['n_embd']} is not a multiple of "
                         f"H = {s['n_head']}")
    if s["vocab"] > 65536:
        raise ValueError(f"shape '{name}': V = {s['vocab']} is over 65536 (the tokens are "
                         "uint16)")
    return s


def shape_tag(name):
    """A file-name-safe form of a shape's name."""
    return "".join(c if c.isalnum() or c in "-." else "_" for c in name)


def n_params(s):
    """Parameters of the model, the tied output layer counted once (as nanoGPT counts)."""
    c, L = s["n_embd"], s["n_layer"]
    return s["vocab"] * c + s["context"] * c + L * (12 * c * c + 13 * c) + 2 * c


def flops_per_token(s):
    c, L, t = s["n_embd"], s["n_layer"], s["context"]
    return 6 * (n_params(s) - t * c) + 12 * L * c * t


def linears(s):
    """(name, rows, in, out, count) of every linear layer of a step's forward."""
    n = s["batch"] * s["context"]
    c, L = s["n_embd"], s["n_layer"]
    return [("c_attn", n, c, 3 * c, L), ("attn.c_proj", n, c, c, L), ("c_fc", n, c, 4 * c, L),
            ("mlp.c_proj", n, 4 * c, c, L), ("lm_head", n, c, s["vocab"], 1)]


# --- the model ---------------------------------------------------------------------------------
def build_gpt(s):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(s["n_embd"], 3 * s["n_embd"])
            self.c_proj = nn.Linear(s["n_embd"], s["n_embd"])

        def forward(self, x):
            B, T, C = x.size()
            nh = s["n_head"]
            q, k, v = self.c_attn(x).split(C, dim=2)
            q = q.view(B, T, nh, C // nh).transpose(1, 2)
            k = k.view(B, T, nh, C // nh).transpose(1, 2)
            v = v.view(B, T, nh, C // nh).transpose(1, 2)
            if hasattr(F, "scaled_dot_product_attention"):
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:  # torch before 2.0 (the CPU check on Debian's 1.13): the same product
                att = (q @ k.transpose(-2, -1)) / math.sqrt(C // nh)
                mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
                y = att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v
            return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc = nn.Linear(s["n_embd"], 4 * s["n_embd"])
            self.gelu = nn.GELU(approximate="tanh")
            self.c_proj = nn.Linear(4 * s["n_embd"], s["n_embd"])

        def forward(self, x):
            return self.c_proj(self.gelu(self.c_fc(x)))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(s["n_embd"])
            self.attn = Attention()
            self.ln_2 = nn.LayerNorm(s["n_embd"])
            self.mlp = MLP()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(s["vocab"], s["n_embd"])
            self.wpe = nn.Embedding(s["context"], s["n_embd"])
            self.h = nn.ModuleList([Block() for _ in range(s["n_layer"])])
            self.ln_f = nn.LayerNorm(s["n_embd"])
            self.lm_head = nn.Linear(s["n_embd"], s["vocab"], bias=False)
            self.lm_head.weight = self.wte.weight
            for m in self.modules():
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(m.weight, mean=0.0, std=0.02)
                if isinstance(m, nn.Linear) and m.bias is not None:
                    nn.init.zeros_(m.bias)
            for name, p in self.named_parameters():
                if name.endswith("c_proj.weight"):
                    nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * s["n_layer"]))

        def forward(self, idx, targets):
            pos = torch.arange(idx.size(1), device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for b in self.h:
                x = b(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))

    return GPT()


def lr_at(step, warmup=10, total=1000, lr=6e-4, lr_min=6e-5):
    if step < warmup:
        return lr * (step + 1) / warmup
    r = min(1.0, (step - warmup) / max(1, total - warmup))
    return lr_min + 0.5 * (1.0 + math.cos(math.pi * r)) * (lr - lr_min)


class BudgetExceeded(Exception):
    pass


def run_shape(name, mode, a):
    import torch
    s = shape_of(name)
    cuda = a.device == "cuda"
    torch.manual_seed(0)
    # bf16: products under autocast, the rest fp32 with TF32 products as nanoGPT sets them;
    # tf32: fp32 with TF32 products; fp32: fp32 throughout (PyTorch's own default)
    tf32 = a.precision != "fp32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    model = build_gpt(s).to(a.device)
    count = sum(p.numel() for p in model.parameters())
    if count != n_params(s):
        print(f"warning: {name}: the model has {count} parameters, the formula {n_params(s)}",
              file=sys.stderr)
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    # fused AdamW exists for CUDA tensors only (and not at all in old releases)
    opt = torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), eps=1e-8,
                            **({"fused": True} if cuda else {}))
    B, T = s["batch"], s["context"]
    g = torch.Generator(device=a.device).manual_seed(0)
    data = [torch.randint(0, s["vocab"], (B, T + 1), device=a.device, generator=g)
            for _ in range(8)]
    xs = [d[:, :-1].contiguous() for d in data]
    ys = [d[:, 1:].contiguous() for d in data]
    fwd = model
    peak = a.peak_tflops or PEAK_TFLOPS[a.precision]
    rec = {"impl": "torch", "shape": name, "mode": mode, "precision": a.precision,
           "device": a.device, "batch": B, "context": T, "params": count,
           "flops_per_token": flops_per_token(s)}
    if mode == "compile":
        if not hasattr(torch, "compile"):
            rec["error"] = f"torch {torch.__version__} has no torch.compile"
            return rec
        fwd = torch.compile(model, mode=a.compile_mode)
        rec["compile_mode"] = a.compile_mode
    it = [0]

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def step():
        i = it[0]
        it[0] += 1
        for grp in opt.param_groups:
            grp["lr"] = lr_at(i)
        if a.precision == "bf16":
            with torch.autocast(a.device, dtype=torch.bfloat16):
                loss = fwd(xs[i % len(xs)], ys[i % len(ys)])
        else:
            loss = fwd(xs[i % len(xs)], ys[i % len(ys)])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    t0 = time.time()
    if mode == "compile":
        # The compile happens in the first forward and backward; SIGALRM bounds it.
        def on_alarm(signum, frame):
            raise BudgetExceeded()

        old = signal.signal(signal.SIGALRM, on_alarm)
        signal.alarm(max(1, int(a.compile_budget)))
        try:
            for _ in range(3):
                step()
            sync()
        except BudgetExceeded:
            rec["error"] = f"compile ran past its budget of {a.compile_budget:g} s"
        except Exception as e:  # reported, not fatal: the other modes still run
            rec["error"] = "compile failed: " + repr(e)[:300]
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
        rec["compile_s"] = round(time.time() - t0, 1)
        if "error" in rec:
            return rec
    # Warm-up, each step waited for: with --window-s it ends early once it has taken three
    # windows' time (a large shape's slow steps), and its last step sizes the windows.
    steps, last = a.steps, None
    tw = time.time()
    for i in range(a.warmup):
        t1 = time.time()
        step()
        sync()
        last = time.time() - t1
        if a.window_s and i >= 2 and time.time() - tw > 3 * a.window_s:
            break
    if a.window_s and last:
        steps = max(3, min(a.steps, math.ceil(a.window_s / last)))
    rates, losses = [], []
    for _ in range(a.windows):
        if cuda:
            e0 = torch.cuda.Event(enable_timing=True)
            e1 = torch.cuda.Event(enable_timing=True)
            e0.record()
        else:
            t1 = time.perf_counter()
        for _ in range(steps):
            loss = step()
        if cuda:
            e1.record()
            e1.synchronize()
            sec = e0.elapsed_time(e1) * 1e-3
        else:
            sec = time.perf_counter() - t1
        rates.append(B * T * steps / sec)
        losses.append(loss.item())
    tps = statistics.median(rates)
    rec.update({
        "tokens_per_s": tps, "step_ms": B * T / tps * 1e3,
        "windows_tokens_per_s": [round(r) for r in rates], "warmup": a.warmup,
        "steps": steps, "loss": losses[-1],
        "model_tflops": tps * flops_per_token(s) / 1e12,
        "mfu": tps * flops_per_token(s) / (peak * 1e12),
        "peak_tflops": peak, "setup_s": round(time.time() - t0, 1)})
    if cuda:
        rec.update({"max_memory_allocated": torch.cuda.max_memory_allocated(),
                    "max_memory_reserved": torch.cuda.max_memory_reserved()})
    return rec


def time_call(fn, reps=10, windows=7):
    import torch
    for _ in range(3):
        fn()
    ts = []
    for _ in range(windows):
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(reps):
            fn()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) * 1e3 / reps)
    return statistics.median(ts)


def run_gemms(name, a):
    """Bare bf16 products of the step's shapes, laid out as nn.Linear's forward (x @ W^T),
    input gradient (dy @ W) and weight gradient (dy^T @ x) lay them out."""
    import torch
    s = shape_of(name)
    bf = torch.bfloat16
    out = []
    total_us = total_flops = 0.0
    for lname, n, fin, fout, count in linears(s):
        x = torch.randn(n, fin, device="cuda", dtype=bf)
        w = torch.randn(fout, fin, device="cuda", dtype=bf)
        dy = torch.randn(n, fout, device="cuda", dtype=bf)
        for kind, fn in (("fwd", lambda: torch.matmul(x, w.t())),
                         ("dgrad", lambda: torch.matmul(dy, w)),
                         ("wgrad", lambda: torch.matmul(dy.t(), x))):
            us = time_call(fn)
            f = 2.0 * n * fin * fout
            total_us += count * us
            total_flops += count * f
            out.append({"impl": "torch", "shape": name, "mode": "gemm", "gemm": f"{lname}.{kind}",
                        "rows": n, "in": fin, "out": fout, "count": count, "us": us,
                        "tflops": f / (us * 1e-6) / 1e12})
        del x, w, dy
    sq = torch.randn(8192, 8192, device="cuda", dtype=bf)
    us = time_call(lambda: torch.matmul(sq, sq))
    out.append({"impl": "torch", "shape": name, "mode": "gemm", "gemm": "square_8192",
                "us": us, "tflops": 2.0 * 8192 ** 3 / (us * 1e-6) / 1e12})
    out.append({"impl": "torch", "shape": name, "mode": "gemm_total", "us_per_step": total_us,
                "flops_per_step": total_flops,
                "tflops": total_flops / (total_us * 1e-6) / 1e12})
    del sq
    torch.cuda.empty_cache()
    return out


def cmd_run(argv):
    import argparse
    p = argparse.ArgumentParser(prog="gpt_torch_bench.py run")
    p.add_argument("--shapes", default="124m,small",
                   help=f"named shapes ({', '.join(SHAPES)}) or {GENERIC_FORM}, "
                   "separated by spaces or semicolons (commas where no shape is generic)")
    p.add_argument("--modes", default="eager,compile,gemm")
    p.add_argument("--precision", default="bf16", choices=PRECISIONS,
                   help="bf16: autocast, TF32 elsewhere; tf32: fp32 with TF32 products; "
                   "fp32: fp32 throughout")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                   help="cpu: to check the script where there is no GPU (no gemm mode)")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--steps", type=int, default=20, help="steps per timed window (at most)")
    p.add_argument("--windows", type=int, default=5)
    p.add_argument("--window-s", type=float, default=0.0,
                   help="seconds a timed window should take: the steps per window follow "
                   "from the last warm-up step's time (3 to --steps); 0: --steps")
    p.add_argument("--compile-budget", type=float,
                   default=float(os.environ.get("TORCH_COMPILE_BUDGET_S", "120")),
                   help="seconds each compile may take (default TORCH_COMPILE_BUDGET_S or 120)")
    p.add_argument("--compile-mode", default="default",
                   help="torch.compile's mode: default, reduce-overhead, max-autotune...")
    p.add_argument("--peak-tflops", type=float, default=0.0,
                   help="the MFU's denominator (default: the H200 SXM's dense figure of "
                   "the precision: " + ", ".join(f"{k} {v}" for k, v in PEAK_TFLOPS.items())
                   + ")")
    a = p.parse_args(argv)
    sep = ";" if any("=" in x for x in a.shapes.replace(";", " ").split()) else ","
    shapes = [x for y in a.shapes.split() for x in y.split(sep) if x]
    modes = [x for x in a.modes.split(",") if x]
    for x in shapes:
        try:
            shape_of(x)
        except ValueError as e:
            p.error(f"--shapes: {e}")
    for x in modes:
        if x not in ("eager", "compile", "gemm"):
            p.error(f"--modes: unknown mode '{x}' (expected eager, compile, gemm)")
    if a.device == "cpu" and "gemm" in modes:
        p.error("--modes gemm needs --device cuda")
    if min(a.warmup, a.steps - 1, a.windows - 1) < 0 or a.window_s < 0:
        p.error("--warmup and --window-s must be >= 0, --steps and --windows >= 1")
    import torch
    if a.device == "cuda":
        if not torch.cuda.is_available():
            print("gpt_torch_bench.py: no CUDA device visible to torch", file=sys.stderr)
            return 1
        where = torch.cuda.get_device_name()
    else:
        where = "the CPU"
    print(f"torch {torch.__version__} cuda {torch.version.cuda} on {where}", file=sys.stderr)
    recs = []
    for name in shapes:
        for mode in modes:
            got = run_gemms(name, a) if mode == "gemm" else [run_shape(name, mode, a)]
            for r in got:
                print(json.dumps(r), flush=True)
            recs += got
    print(table(recs), file=sys.stderr)
    return 0


# --- the driver's helpers (no torch needed) ------------------------------------------------------
def cmd_tokens(argv):
    if len(argv) < 3:
        print("usage: gpt_torch_bench.py tokens FILE COUNT VOCAB [SEED]", file=sys.stderr)
        return 2
    path, count, vocab = argv[0], int(argv[1]), int(argv[2])
    seed = int(argv[3]) if len(argv) > 3 else 0
    if not 1 <= vocab <= 65536 or count < 1:
        print(f"tokens: COUNT {count} must be >= 1 and VOCAB {vocab} in 1..65536",
              file=sys.stderr)
        return 2
    try:
        import numpy as np
        rng = np.random.default_rng(seed)
        rng.integers(0, vocab, count, dtype="<u2").tofile(path)
    except ImportError:
        import array
        import random
        r = random.Random(seed)
        arr = array.array("H", (r.randrange(vocab) for _ in range(count)))
        if sys.byteorder != "little":
            arr.byteswap()
        with open(path, "wb") as f:
            arr.tofile(f)
    return 0


def json_lines(path):
    try:
        with open(path, errors="replace") as f:
            for line in f:
                try:
                    o = json.loads(line)
                except ValueError:
                    continue
                if isinstance(o, dict):
                    yield o
    except OSError:
        return


def cmd_mgpu(argv):
    """One JSON line for one mgpu-worker run: tokens/s from the final metrics line's step_us
    (CUDA events over the steps after timing_warmup) when it has one, else its tokens_per_s,
    else the last "tokens/s" figure of the worker's output; the process's peak GPU memory from
    the nvidia-smi samples taken during the run (MiB), and the worker's own figure if its
    final line has peak_mem_bytes."""
    if len(argv) not in (5, 6) or (len(argv) == 6 and argv[5] not in PRECISIONS):
        print("usage: gpt_torch_bench.py mgpu SHAPE RC METRICS STDOUT SMI [PRECISION]",
              file=sys.stderr)
        return 2
    import re
    name, rc, metrics, stdout, smi = argv[0], int(argv[1]), argv[2], argv[3], argv[4]
    prec = argv[5] if len(argv) == 6 else "bf16"
    s = shape_of(name)
    rec = {"impl": "mgpu", "shape": name, "mode": "mgpu", "precision": prec, "rc": rc,
           "flops_per_token": flops_per_token(s)}
    final = {}
    for o in json_lines(metrics):
        if o.get("final"):
            final = o
    tps, src = None, None
    if final.get("step_us"):
        tps = s["batch"] * s["context"] / (final["step_us"] * 1e-6)
        src = "step_us"
        rec["step_us"] = final["step_us"]
    elif final.get("tokens_per_s"):
        tps, src = float(final["tokens_per_s"]), "tokens_per_s"
    else:
        try:
            with open(stdout, errors="replace") as f:
                for line in f:
                    m = re.search(r"([0-9][0-9.,]*)\s*(k|M)?\s*tokens/s", line)
                    if m:
                        tps = float(m.group(1).replace(",", "")) * {
                            None: 1, "k": 1e3, "M": 1e6}[m.group(2)]
                        src = "output"
        except OSError:
            pass
    for k in ("backend", "cuda_graph", "loss", "steps", "seconds", "peak_mem_bytes"):
        if k in final:
            rec[k] = final[k]
    if rc == 0 and final.get("backend", "cuda") != "cuda":
        rec["error"] = f"ran on backend {final['backend']}, not on the GPU"
        tps = None
    elif rc != 0 or tps is None:
        why = f"exit {rc}" if rc != 0 else "no tokens/s in its output"
        if rc == 124:
            why += " (stopped by its time limit)"
        try:
            with open(stdout, errors="replace") as f:
                lines = [x.strip() for x in f if x.strip()]
            err = [x for x in lines if "error" in x.lower()] or lines
            if err:
                why += ": " + err[-1][:200]
        except OSError:
            pass
        rec["error"] = why
    if tps is not None:
        rec.update({"tokens_per_s": tps, "tokens_per_s_from": src,
                    "model_tflops": tps * flops_per_token(s) / 1e12,
                    "mfu": tps * flops_per_token(s) / (PEAK_TFLOPS[prec] * 1e12)})
    peak = smi_peak_mib(smi)
    if peak is not None:
        rec["process_peak_mib"] = peak
    print(json.dumps(rec))
    return 0


# cuBLAS/cuBLASLt's product kernels as Nsight Systems names them (cuBLAS's own, CUTLASS and
# xmma kernels); attention, normalisation and elementwise kernels match none of these.
GEMM_KERNEL = r"gemm|gemv|nvjet|xmma|cutlass"


def cmd_kernels(argv):
    """One JSON line of the GEMM time per step in a kernel summary that `nsys stats -r
    cuda_gpu_kern_sum -f csv` printed for a run of STEPS steps."""
    if len(argv) != 4:
        print("usage: gpt_torch_bench.py kernels IMPL SHAPE STEPS CSV", file=sys.stderr)
        return 2
    import csv
    import re
    impl, name, steps, path = argv[0], argv[1], int(argv[2]), argv[3]
    rec = {"impl": impl, "shape": name, "mode": "gemm_profile", "steps": steps}
    hdr, total, gemm, top = None, 0.0, 0.0, []
    try:
        with open(path, errors="replace", newline="") as f:
            for row in csv.reader(f):
                if "Total Time (ns)" in row and "Name" in row:
                    hdr = row
                    continue
                if hdr is None or len(row) != len(hdr):
                    continue
                d = dict(zip(hdr, row))
                try:
                    ns = float(d["Total Time (ns)"].replace(",", ""))
                except ValueError:
                    continue
                total += ns
                if re.search(GEMM_KERNEL, d["Name"], re.I):
                    gemm += ns
                    top.append((ns, d["Name"][:80]))
    except OSError as e:
        rec["error"] = f"cannot read {path}: {e.strerror}"
    if hdr is None and "error" not in rec:
        rec["error"] = f"{path}: no kernel summary (no 'Total Time (ns)' header)"
    if "error" not in rec:
        top.sort(reverse=True)
        rec.update({"gemm_us_per_step": gemm / 1e3 / steps,
                    "kernels_us_per_step": total / 1e3 / steps,
                    "top_gemm_kernels": [n for _, n in top[:5]]})
    print(json.dumps(rec))
    return 0


def cmd_trace(argv):
    """One JSON line of the GEMM time per step from a kernel trace (tests/gpu/kernel_trace.c's
    CSV: start_ns,end_ns,stream,kind,name) of a run: the last STEPS steps, a step ending with
    the kernel whose name matches END (the optimizer's)."""
    if len(argv) != 5:
        print("usage: gpt_torch_bench.py trace IMPL SHAPE STEPS CSV END", file=sys.stderr)
        return 2
    import csv
    import re
    impl, name, steps, path, end = argv[0], argv[1], int(argv[2]), argv[3], argv[4]
    rec = {"impl": impl, "shape": name, "mode": "gemm_profile", "steps": steps,
           "tool": "CUPTI trace"}
    try:
        with open(path, errors="replace", newline="") as f:
            rows = [r for r in csv.DictReader(f) if r.get("kind") == "k"]
    except OSError as e:
        rows, rec["error"] = [], f"cannot read {path}: {e.strerror}"
    rows.sort(key=lambda r: int(r["start_ns"]))
    ends = [i for i, r in enumerate(rows) if re.search(end, r["name"] or "")]
    if "error" not in rec and len(ends) < steps + 1:
        rec["error"] = f"{path}: {len(ends)} steps ending in /{end}/, expected {steps + 1}+"
    if "error" not in rec:
        window = rows[ends[-steps - 1] + 1:ends[-1] + 1]
        dur = [(int(r["end_ns"]) - int(r["start_ns"]), r["name"] or "") for r in window]
        gemm = [(d, n) for d, n in dur if re.search(GEMM_KERNEL, n, re.I)]
        span = int(window[-1]["end_ns"]) - int(window[0]["start_ns"])
        by_name = {}
        for d, n in gemm:
            by_name[n] = by_name.get(n, 0) + d
        rec.update({"gemm_us_per_step": sum(d for d, _ in gemm) / 1e3 / steps,
                    "kernels_us_per_step": sum(d for d, _ in dur) / 1e3 / steps,
                    "span_us_per_step": span / 1e3 / steps,
                    "top_gemm_kernels": [n[:80] for n in sorted(by_name, key=by_name.get,
                                                                 reverse=True)[:5]]})
    print(json.dumps(rec))
    return 0


def cmd_peak(argv):
    """One JSON line giving a PyTorch run's process peak (MiB) for the table."""
    if len(argv) not in (3, 4) or (len(argv) == 4 and argv[3] not in PRECISIONS):
        print("usage: gpt_torch_bench.py peak SHAPE MODE SMI [PRECISION]", file=sys.stderr)
        return 2
    peak = smi_peak_mib(argv[2])
    if peak is not None:
        print(json.dumps({"impl": "torch", "shape": argv[0], "mode": argv[1],
                          "precision": argv[3] if len(argv) == 4 else "bf16",
                          "peak_of_run": True, "process_peak_mib": peak}))
    return 0


# What the driver assumes of a step's speed to size mgpu-worker's runs (model TFLOP/s of the
# whole step: about half the H200's dense peak in bf16 and TF32, and fp32 without tensor
# cores). A run that is slower than this only takes longer; it is still bounded by
# MGPU_TIMEOUT_S and the run's deadline.
PLAN_TFLOPS = {"bf16": 450.0, "tf32": 200.0, "fp32": 40.0}


def cmd_spec(argv):
    """For gpt_bench.sh: per SHAPE, one line of its tag, vocabulary, cfg file and the
    mgpu-worker key=values of the shape at PRECISION (the model, the batch, and max_steps and
    timing_warmup so that the timed steps take about SECONDS); an unknown or malformed shape
    is an error naming it and listing the known ones (exit 2)."""
    if len(argv) < 3 or argv[0] not in PRECISIONS:
        print("usage: gpt_torch_bench.py spec PRECISION SECONDS SHAPE...", file=sys.stderr)
        return 2
    prec, secs = argv[0], float(argv[1])
    out = []
    for name in argv[2:]:
        try:
            s = shape_of(name)
        except ValueError as e:
            print(f"gpt_bench: {e}", file=sys.stderr)
            return 2
        step_s = flops_per_token(s) * s["batch"] * s["context"] / (PLAN_TFLOPS[prec] * 1e12)
        timed = max(10, min(200, round(secs / step_s)))
        warm = max(5, min(20, timed // 5))
        args = (f"n_layer={s['n_layer']} n_head={s['n_head']} n_embd={s['n_embd']} "
                f"context={s['context']} vocab={s['vocab']} batch_size={s['batch']} "
                f"precision={prec} max_steps={timed + warm} timing_warmup={warm}")
        out.append(f"{shape_tag(name)}\t{s['vocab']}\t{s['cfg']}\t{args}")
    print("\n".join(out))
    return 0


def cmd_drop(argv):
    """Rewrites each FILE of JSON lines without the records of the SHAPEs: a run of those
    shapes into an OUTDIR that holds others' results replaces theirs and keeps the rest."""
    if "--" not in argv:
        print("usage: gpt_torch_bench.py drop FILE... -- SHAPE...", file=sys.stderr)
        return 2
    i = argv.index("--")
    files, shapes = argv[:i], set(argv[i + 1:])
    for path in files:
        try:
            with open(path, errors="replace") as f:
                lines = f.readlines()
        except FileNotFoundError:
            continue
        keep = []
        for line in lines:
            try:
                o = json.loads(line)
            except ValueError:
                o = None
            if not (isinstance(o, dict) and o.get("shape") in shapes):
                keep.append(line)
        with open(path + ".tmp", "w") as f:
            f.writelines(keep)
        os.replace(path + ".tmp", path)
    return 0


def smi_peak_mib(prefix):
    """The run's peak GPU memory in MiB from gpt_bench.sh's nvidia-smi samples: the largest
    used_memory of a process in PREFIX.apps ("pid, MiB" lines), or, when nvidia-smi listed no
    process (as in some containers), the largest device use in PREFIX.gpu less PREFIX.base,
    the device's use before the run."""
    def numbers(path, col):
        try:
            with open(path, errors="replace") as f:
                rows = [[x.strip() for x in line.split(",")] for line in f]
        except OSError:
            return []
        return [int(r[col]) for r in rows if len(r) > col and r[col].isdigit()]
    apps = numbers(prefix + ".apps", 1)
    if apps:
        return max(apps)
    gpu, base = numbers(prefix + ".gpu", 0), numbers(prefix + ".base", 0)
    if gpu and base:
        return max(0, max(gpu) - base[0])
    return None


def fmt_rate(v):
    if v is None:
        return "-"
    return f"{v / 1e6:.3f}M" if v >= 1e6 else f"{v / 1e3:.1f}k"


def describe(name):
    s = shape_of(name)
    return (f"{s['n_layer']} layers x {s['n_embd']}, {s['n_head']} heads of "
            f"{s['n_embd'] // s['n_head']}, context {s['context']}, vocab {s['vocab']}, "
            f"batch {s['batch']}")


def cell_error(text):
    """An error inside a table cell: short, and no '|' to break the row."""
    text = text.replace("|", "/").replace("\n", " ")
    return text if len(text) <= 90 else text[:87] + "..."


def table(recs):
    """The readable summary: per shape and precision mgpu (median of its runs), PyTorch eager
    and compiled, ratios against the targets, MFU, peak memory; then the bare GEMMs. A shape
    or variant that gave no figure is a row with its message, never left out."""
    lines = []
    prec = lambda r: r.get("precision", "bf16")
    key = lambda r: (r.get("shape"), r.get("mode"), prec(r))
    peaks = {key(r): r["process_peak_mib"] for r in recs if r.get("peak_of_run")}
    recs = [dict(r, process_peak_mib=peaks[key(r)])
            if r.get("impl") == "torch" and not r.get("peak_of_run") and key(r) in peaks
            else r for r in recs if not r.get("peak_of_run")]
    seen = []
    for r in recs:
        n = r.get("shape")
        if n is not None and n not in seen and r.get("mode") not in ("gemm", "gemm_total",
                                                                     "gemm_profile"):
            try:
                shape_of(n)
                seen.append(n)
            except ValueError:
                pass
    shapes = [n for n in SHAPES if n in seen] + [n for n in seen if n not in SHAPES]
    lines.append("| shape | precision | mgpu tokens/s | torch eager | torch compiled "
                 "| mgpu / compiled | mgpu / eager | target | met | MFU mgpu / eager / compiled |")
    lines.append("| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- | --- |")
    notes = []
    mem = []
    for n in shapes:
        s = shape_of(n)
        fl = flops_per_token(s)
        precs = [p for p in PRECISIONS if any(r.get("shape") == n and prec(r) == p
                                              for r in recs)]
        for p in precs:
            mine = [r for r in recs if r.get("shape") == n and prec(r) == p]
            mg = [r for r in mine if r.get("impl") == "mgpu"]
            ok = [r for r in mg if "error" not in r and r.get("tokens_per_s")]
            m = statistics.median([r["tokens_per_s"] for r in ok]) if ok else None
            if mg and not ok:
                err = mg[-1].get("error", "no figure")
                notes.append(f"{n} {p}: mgpu-worker did not run the GPT on the GPU here "
                             f"({err}): no mgpu figure")
                mcell = "not run: " + cell_error(err)
            elif not mg:
                notes.append(f"{n} {p}: mgpu-worker was not run")
                mcell = "-"
            else:
                mcell = fmt_rate(m)
                if len(ok) > 1:
                    notes.append(f"{n} {p}: mgpu tokens/s of {len(ok)} runs: "
                                 + ", ".join(fmt_rate(r["tokens_per_s"]) for r in ok)
                                 + f" (from {ok[0]['tokens_per_s_from']})")
            t, tcell = {}, {}
            for mode in ("eager", "compile"):
                rs = [r for r in mine if r.get("impl") == "torch" and r.get("mode") == mode]
                t[mode] = rs[-1] if rs and "error" not in rs[-1] else {}
                tcell[mode] = fmt_rate(t[mode].get("tokens_per_s"))
                if rs and "error" in rs[-1]:
                    notes.append(f"{n} {p}: torch {mode}: {rs[-1]['error']}")
                    tcell[mode] = "error: " + cell_error(rs[-1]["error"])
            e, c = t["eager"].get("tokens_per_s"), t["compile"].get("tokens_per_s")
            ratio = lambda x, y: f"{x / y:.3f}x" if x and y else "-"
            # bf16 against PyTorch compiled; fp32 and tf32 against PyTorch eager
            if p == "bf16":
                want, got = f">= {s['target']}x compiled", m / c if m and c else None
                goal = s["target"]
            else:
                want, got, goal = ">= 1.0x eager", m / e if m and e else None, 1.0
            met = "-" if got is None else "yes" if got >= goal else "no"
            pk = PEAK_TFLOPS[p]
            mfu = lambda v: f"{100 * v * fl / (pk * 1e12):.1f}%" if v else "-"
            lines.append(f"| {n} | {p} | {mcell} | {tcell['eager']} | {tcell['compile']} "
                         f"| {ratio(m, c)} | {ratio(m, e)} | {want} | {met} "
                         f"| {mfu(m)} / {mfu(e)} / {mfu(c)} |")
            mib = lambda v: f"{v:,}" if v is not None else "-"
            mb = lambda v: f"{v / 2 ** 20:,.0f}" if v else "-"
            mp = [r["process_peak_mib"] for r in mg if "process_peak_mib" in r]
            mw = [r["peak_mem_bytes"] for r in mg if "peak_mem_bytes" in r]
            mpk, cpk = max(mp) if mp else None, t["compile"].get("process_peak_mib")
            below = "-" if mpk is None or cpk is None else "yes" if mpk <= cpk else "no"
            mem.append(f"| {n} | {p} | {mib(mpk)} | {mb(max(mw) if mw else None)} "
                       f"| {mib(t['eager'].get('process_peak_mib'))} "
                       f"| {mb(t['eager'].get('max_memory_allocated'))} "
                       f"| {mib(cpk)} | {mb(t['compile'].get('max_memory_allocated'))} "
                       f"| {below} |")
    lines.append("")
    lines.append("Shapes: " + "; ".join(f"{n}: {describe(n)}" for n in shapes))
    lines.append("")
    lines.append("Peak GPU memory, MiB (process: nvidia-smi's used_memory of the process, the "
                 "largest sample; worker: its own figure; allocated: "
                 "torch.cuda.max_memory_allocated); target: mgpu's process at or below "
                 "compiled's")
    lines.append("| shape | precision | mgpu process | mgpu worker | eager process "
                 "| eager allocated | compiled process | compiled allocated "
                 "| mgpu <= compiled |")
    lines.append("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    lines += mem
    gem = [r for r in recs if r.get("mode") == "gemm" and "gemm" in r]
    notes += [f"{r['shape']}: bare GEMMs: {r['error']}" for r in recs
              if r.get("mode") == "gemm" and "error" in r]
    if gem:
        lines.append("")
        lines.append("Bare bf16 torch.matmul of the step's GEMM shapes (median of 7 windows "
                     "of 10 calls)")
        lines.append("| shape | GEMM | rows x in x out | per step | us | TFLOP/s |")
        lines.append("| --- | --- | --- | ---: | ---: | ---: |")
        for r in gem:
            dims = f"{r['rows']} x {r['in']} x {r['out']}" if "rows" in r else "8192^3"
            lines.append(f"| {r['shape']} | {r['gemm']} | {dims} | {r.get('count', 1)} "
                         f"| {r['us']:.1f} | {r['tflops']:.1f} |")
    for r in recs:
        if r.get("mode") == "gemm_total":
            n = r["shape"]
            lines.append(f"{n}: the step's GEMMs take {r['us_per_step'] / 1e3:.3f} ms as "
                         f"bare products ({r['tflops']:.1f} TFLOP/s over "
                         f"{r['flops_per_step'] / 1e12:.3f} TFLOP): the denominator of "
                         "the GEMMs' share of the bare product")
            for q in recs:
                if q.get("mode") == "gemm_profile" and q.get("shape") == n:
                    if "error" in q:
                        lines.append(f"{n}: {q['impl']} GEMMs under "
                                     f"{q.get('tool', 'nsys')}: {q['error']}")
                        continue
                    g = q["gemm_us_per_step"]
                    lines.append(f"{n}: {q['impl']}'s GEMM kernels take {g / 1e3:.3f} ms "
                                 f"a step ({q.get('tool', 'nsys')}, {q['steps']} steps; all kernels "
                                 f"{q['kernels_us_per_step'] / 1e3:.3f} ms): at "
                                 f"{100 * r['us_per_step'] / g:.1f}% of the bare products"
                                 if g > 0 else f"{n}: {q['impl']}: no GEMM kernel found")
    lines.append("")
    lines.append("MFU: model FLOPs (6 x parameters less wpe + 12 x n_layer x n_embd x context "
                 "per token) over the H200 SXM's dense peak of the precision: "
                 + ", ".join(f"{k} {v} TFLOP/s" for k, v in PEAK_TFLOPS.items()))
    lines += notes
    return "\n".join(lines)


def cmd_table(argv):
    recs = []
    for path in argv:
        recs += list(json_lines(path))
    print(table(recs))
    return 0


def main():
    cmds = {"run": cmd_run, "tokens": cmd_tokens, "mgpu": cmd_mgpu, "peak": cmd_peak,
            "kernels": cmd_kernels, "trace": cmd_trace, "table": cmd_table,
            "spec": cmd_spec, "drop": cmd_drop}
    if len(sys.argv) < 2 or sys.argv[1] not in cmds:
        print(__doc__, file=sys.stderr)
        return 2
    return cmds[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
