"""gpt_torch_ref.py FILE - recomputes with PyTorch what `test_model_gpt --dump FILE` computed
with the trainer's GPT (worker/trainer/model_gpt.c on the CPU backend): from the same weights
and tokens, the loss and every parameter's gradient (to 1e-5 relative to the tensor's largest
magnitude), then 20 steps of torch.optim.AdamW (weight decay on the 2-D tensors only) with
clip_grad_norm_ and the warm-up + cosine learning rate, over the batches the C run used, in
the same order (they are in the file: no shuffle to reproduce), whose losses must agree to
1e-4 relative. PyTorch computes in float64. Exits 0 when all agree, 1 otherwise, 77 when torch
cannot be imported."""
import math
import os
import sys

try:
    import torch
except ImportError as e:
    print(f"skip - torch is not importable: {e}")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from transformer_ref_torch import Reader, forward, read_params, rel, shapes  # noqa: E402

GRAD_TOL, LOSS_TOL = 1e-5, 1e-4


def lr_at(step, warmup, total, lr_max, lr_min):
    """nanoGPT's schedule, as mgpu_gpt_lr: linear warm-up, then cosine decay to lr_min."""
    if step < warmup:
        return lr_max * (step + 1) / warmup
    if step >= total or total <= warmup:
        return lr_min
    ratio = (step - warmup) / (total - warmup)
    return lr_min + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr_max - lr_min)


def main():
    data = open(sys.argv[1], "rb").read()
    if data[:8] != b"GPTRUN1\0":
        print(f"{sys.argv[1]}: not a GPTRUN1 file (starts {data[:8]!r})")
        return 1
    r = Reader(data)
    r.pos = 8
    B, T, C, NH, V, L, steps, warmup, total = r.take(torch.int32, 9).tolist()
    lr, lr_min, beta1, beta2, eps, wd, clip = r.take(torch.float32, 7).tolist()
    spec = shapes(T, C, V, L)
    params = read_params(r, spec)
    tok = r.take(torch.int32, B * T).long().reshape(B, T)
    tgt = r.take(torch.int32, B * T).long().reshape(B, T)
    c_loss = r.take(torch.float32, 1)
    c_grads = read_params(r, spec)
    batches = []
    for _ in range(steps):
        bt = r.take(torch.int32, B * T).long().reshape(B, T)
        bg = r.take(torch.int32, B * T).long().reshape(B, T)
        batches.append((bt, bg, r.take(torch.float32, 1).item()))
    if r.pos != len(data):
        print(f"{sys.argv[1]}: {len(data) - r.pos} bytes left over: the layouts differ")
        return 1

    bad, worst = [], 0.0

    def report(what, e, tol):
        nonlocal worst
        worst = max(worst, e / tol * GRAD_TOL)
        print(f"{what:<16} {e:.2e}{'  FAIL' if e > tol else ''}")
        if e > tol:
            bad.append(what)

    P = {n: t.double().requires_grad_() for n, t in params.items()}
    loss = forward(P, tok, tgt, B, T, C, NH, L)
    loss.backward()
    print(f"model: B {B} T {T} C {C} heads {NH} vocab {V} layers {L}; loss C "
          f"{c_loss.item():.7f} torch {loss.item():.7f}")
    report("loss", rel(c_loss, loss.detach().reshape(1)), GRAD_TOL)
    for name, _ in spec:
        report("d" + name, rel(c_grads[name], P[name].grad), GRAD_TOL)

    Q = {n: t.double().clone().requires_grad_() for n, t in params.items()}
    decay = [Q[n] for n, s in spec if len(s) >= 2]
    no_decay = [Q[n] for n, s in spec if len(s) < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(beta1, beta2), eps=eps)
    clipped = 0
    for s, (bt, bg, c_l) in enumerate(batches):
        for g in opt.param_groups:
            g["lr"] = lr_at(s, warmup, total, lr, lr_min)
        opt.zero_grad()
        l = forward(Q, bt, bg, B, T, C, NH, L)
        l.backward()
        norm = torch.nn.utils.clip_grad_norm_(list(Q.values()), clip)
        clipped += norm.item() > clip
        opt.step()
        report(f"step {s + 1} loss", abs(c_l - l.item()) / abs(l.item()), LOSS_TOL)
        print(f"  C {c_l:.6f} torch {l.item():.6f} lr {opt.param_groups[0]['lr']:.3g} "
              f"norm {norm.item():.3f}")
    if clipped == 0:
        print("no step's gradient norm was over grad_clip: the clip went untested")
        return 1
    print(f"{clipped} of {steps} steps clipped; largest relative difference (scaled to "
          f"{GRAD_TOL:g}) {worst:.2e}")
    if bad:
        print("over the tolerance: " + ", ".join(bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
