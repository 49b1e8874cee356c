"""transformer_ref_torch.py FILE - recomputes with PyTorch what `test_transformer_ref --dump
FILE` computed with kernels/transformer.c: a tiny GPT-2-style model's loss and every
parameter's gradient from the same weights and tokens, then one step of gradient clipping and
torch.optim.AdamW (weight decay on the 2-D tensors only) with the learning rate of the
schedule. PyTorch computes in float64, so the differences printed are the C reference's own
error. Exits 0 when every figure is within TOL (1e-5) relative to its tensor's largest
magnitude, 1 otherwise, 77 when torch cannot be imported."""
import math
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:
    print(f"skip - torch is not importable: {e}")
    sys.exit(77)

TOL = 1e-5
PER_LAYER = ["ln1.w", "ln1.b", "qkv.w", "qkv.b", "proj.w", "proj.b",
             "ln2.w", "ln2.b", "fc.w", "fc.b", "fcproj.w", "fcproj.b"]


class Reader:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, dtype, n):
        size = torch.tensor([], dtype=dtype).element_size() * n
        t = torch.frombuffer(bytearray(self.data[self.pos:self.pos + size]), dtype=dtype)
        self.pos += size
        return t


def shapes(T, C, V, L):
    out = [("wte", (V, C)), ("wpe", (T, C))]
    dims = {"ln1.w": (C,), "ln1.b": (C,), "qkv.w": (3 * C, C), "qkv.b": (3 * C,),
            "proj.w": (C, C), "proj.b": (C,), "ln2.w": (C,), "ln2.b": (C,),
            "fc.w": (4 * C, C), "fc.b": (4 * C,), "fcproj.w": (C, 4 * C), "fcproj.b": (C,)}
    for layer in range(L):
        out += [(f"h{layer}.{n}", dims[n]) for n in PER_LAYER]
    return out + [("lnf.w", (C,)), ("lnf.b", (C,))]


def read_params(r, spec):
    return {name: r.take(torch.float32, math.prod(shape)).reshape(shape) for name, shape in spec}


def forward(P, tok, tgt, B, T, C, NH, L):
    x = P["wte"][tok] + P["wpe"][:T]
    hs = C // NH
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for layer in range(L):
        p = lambda n: P[f"h{layer}.{n}"]
        h = F.layer_norm(x, (C,), p("ln1.w"), p("ln1.b"), eps=1e-5)
        q, k, v = F.linear(h, p("qkv.w"), p("qkv.b")).split(C, dim=2)
        q, k, v = (t.view(B, T, NH, hs).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + F.linear(y, p("proj.w"), p("proj.b"))
        h = F.layer_norm(x, (C,), p("ln2.w"), p("ln2.b"), eps=1e-5)
        h = F.gelu(F.linear(h, p("fc.w"), p("fc.b")), approximate="tanh")
        x = x + F.linear(h, p("fcproj.w"), p("fcproj.b"))
    x = F.layer_norm(x, (C,), P["lnf.w"], P["lnf.b"], eps=1e-5)
    logits = x @ P["wte"].t()  # the output layer tied to the token embedding
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1))


def rel(a, b):
    """largest |a - b| over the largest |b|"""
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30)).item()


def main():
    data = open(sys.argv[1], "rb").read()
    if data[:8] != b"GPTREF1\0":
        print(f"{sys.argv[1]}: not a GPTREF1 file (starts {data[:8]!r})")
        return 1
    r = Reader(data)
    r.pos = 8
    B, T, C, NH, V, L = r.take(torch.int32, 6).tolist()
    spec = shapes(T, C, V, L)
    params = read_params(r, spec)
    tok = r.take(torch.int32, B * T).long().reshape(B, T)
    tgt = r.take(torch.int32, B * T).long().reshape(B, T)
    c_loss = r.take(torch.float32, 1)
    c_grads = read_params(r, spec)
    lr, beta1, beta2, eps, wd, max_norm, c_norm = r.take(torch.float32, 7).tolist()
    step = r.take(torch.int32, 1).item()
    c_after = read_params(r, spec)
    if r.pos != len(data):
        print(f"{sys.argv[1]}: {len(data) - r.pos} bytes left over: the layouts differ")
        return 1

    P = {n: t.double().requires_grad_() for n, t in params.items()}
    loss = forward(P, tok, tgt, B, T, C, NH, L)
    loss.backward()
    worst, bad = 0.0, []

    def report(what, e):
        nonlocal worst
        worst = max(worst, e)
        print(f"{what:<12} {e:.2e}{'  FAIL' if e > TOL else ''}")
        if e > TOL:
            bad.append(what)

    print(f"model: B {B} T {T} C {C} heads {NH} vocab {V} layers {L}; loss C {c_loss.item():.7f}"
          f" torch {loss.item():.7f}")
    report("loss", rel(c_loss, loss.detach().reshape(1)))
    for name, _ in spec:
        report("d" + name, rel(c_grads[name], P[name].grad))

    # one optimizer step on the C gradients, so that it checks the optimizer alone
    Q = {n: t.double().clone().requires_grad_() for n, t in params.items()}
    for n in Q:
        Q[n].grad = c_grads[n].double().clone()
    norm = torch.nn.utils.clip_grad_norm_(list(Q.values()), max_norm)
    report("grad norm", abs(norm.item() - c_norm) / norm.item())
    print(f"gradients' norm {norm.item():.4f}, clipped to {max_norm:g}; lr {lr:.6g}")
    if norm.item() <= max_norm:
        print("the gradients' norm is under max_norm: the clip went untested")
        return 1
    decay = [Q[n] for n, s in spec if len(s) >= 2]
    no_decay = [Q[n] for n, s in spec if len(s) < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(beta1, beta2), eps=eps)
    assert step == 1, step
    opt.step()
    for name, _ in spec:
        report("adamw " + name, rel(c_after[name], Q[name].detach()))
    print(f"largest relative difference {worst:.2e} (tolerance {TOL:g})")
    if bad:
        print("over the tolerance: " + ", ".join(bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
