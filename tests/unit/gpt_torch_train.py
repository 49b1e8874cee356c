"""gpt_torch_train.py FILE K=V... - trains with PyTorch the GPT that mgpu-worker trains from
configs/gpt_text.cfg-like settings, so a test can set the two held-out losses side by side:
the same architecture and initialisation scheme (GPT-2's: normal 0.02, residual projections
0.02/sqrt(2 n_layer); its own random numbers), the same data (FILE's bytes are the tokens, the
tail of eval_fraction held out, windows of context + 1 tokens at stride context), the same
optimizer (AdamW with weight decay on the 2-D tensors, clip_grad_norm_, linear warm-up then
cosine decay to lr_min over steps), global batches of `batch` windows drawn from a permutation
per epoch. Prints "eval_loss X" after `steps` steps. Exits 77 when torch cannot be imported.

Keys: eval_fraction n_layer n_head n_embd context batch steps lr lr_min warmup grad_clip
weight_decay seed."""
import math
import os
import sys

try:
    import torch
except ImportError as e:
    print(f"skip - torch is not importable: {e}")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_torch_ref import lr_at  # noqa: E402
from transformer_ref_torch import forward, shapes  # noqa: E402


def main():
    path = sys.argv[1]
    a = dict(kv.split("=", 1) for kv in sys.argv[2:])
    L, NH, C, T = (int(a[k]) for k in ("n_layer", "n_head", "n_embd", "context"))
    B, steps, warmup = int(a["batch"]), int(a["steps"]), int(a["warmup"])
    lr, lr_min, clip = float(a["lr"]), float(a["lr_min"]), float(a["grad_clip"])
    wd, frac = float(a["weight_decay"]), float(a["eval_fraction"])
    torch.manual_seed(int(a.get("seed", "0")))
    torch.set_num_threads(1)
    data = torch.tensor(list(open(path, "rb").read()), dtype=torch.long)
    n_eval = int(len(data) * frac + 0.5)
    train, held = data[:len(data) - n_eval], data[len(data) - n_eval:]

    def windows(d):
        n = (len(d) - 1) // T
        return torch.stack([d[i * T:i * T + T + 1] for i in range(n)])

    wtr, wev = windows(train), windows(held)
    V = 256
    spec = shapes(T, C, V, L)
    P = {}
    for name, shape in spec:
        if len(shape) >= 2:
            std = 0.02 / math.sqrt(2 * L) if name.endswith(("proj.w", "fcproj.w")) else 0.02
            P[name] = torch.randn(shape) * std
        else:
            P[name] = torch.ones(shape) if name.endswith(("ln1.w", "ln2.w", "lnf.w")) \
                else torch.zeros(shape)
        P[name].requires_grad_()
    decay = [P[n] for n, s in spec if len(s) >= 2]
    no_decay = [P[n] for n, s in spec if len(s) < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8)
    order, pos = torch.randperm(len(wtr)), 0
    for s in range(steps):
        if pos + B > len(order):
            order, pos = torch.randperm(len(wtr)), 0
        w = wtr[order[pos:pos + B]]
        pos += B
        for g in opt.param_groups:
            g["lr"] = lr_at(s, warmup, steps, lr, lr_min)
        opt.zero_grad()
        loss = forward(P, w[:, :-1], w[:, 1:], len(w), T, C, NH, L)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(P.values()), clip)
        opt.step()
    with torch.no_grad():
        total = 0.0
        for i in range(0, len(wev), 64):
            w = wev[i:i + 64]
            total += forward(P, w[:, :-1], w[:, 1:], len(w), T, C, NH, L).item() * len(w)
    print(f"train_loss {loss.item():.4f}")
    print(f"eval_loss {total / len(wev):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
