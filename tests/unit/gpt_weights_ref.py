"""gpt_weights_ref.py COMMAND ... - the real clients' side of mgpu's GPT-2 weights (init_from,
export): files written by Hugging Face's `safetensors` package and in llm.c's layout, and
PyTorch's loss from a file's tensors, to compare with the trainer's.

  make DIR VOCAB CONTEXT N_EMBD N_LAYER N_HEAD SEED DTYPE
      DIR/model.safetensors (GPT2LMHeadModel's names and Conv1D layout, DTYPE F32 or BF16,
      with the tied lm_head.weight left out, as save_pretrained does) and DIR/config.json;
      random weights, large enough that a wrong name or transpose changes the loss
  llmc SAFETENSORS OUT VERSION PADDED_VOCAB
      the same weights in llm.c's gpt2_124M.bin layout (version 3 fp32, 5 bf16)
  loss SAFETENSORS TOKENS CONTEXT BATCH VOCAB [llmc-bf16]
      the mean loss over windows 0..BATCH-1 of TOKENS (uint16, windows of CONTEXT + 1 at
      stride CONTEXT) of the model in the file, its token embedding padded with zero rows to
      VOCAB as mgpu pads it, in float64; prints "loss X" and "untransposed X" (the loss with
      the Conv1D weights read as nn.Linear's, which must differ); llmc-bf16: the weights
      rounded to bf16 first
  same SAFETENSORS CKPT N_LAYER
      the export holds the checkpoint's parameters exactly: every name, shape and transpose
  equal A.safetensors B.safetensors
      the same names, shapes and values (B's dtype may be wider)

Several commands separated by "+" run in one process; a command's last argument out=FILE
sends what it prints to FILE.

PyTorch computes in float64 (transformer_ref_torch.forward). Exits 0 when all is well, 1
otherwise, 77 when torch or safetensors cannot be imported."""
import json
import os
import struct
import sys

try:
    import torch
    from safetensors.torch import load_file, save_file
except ImportError as e:
    print(f"skip - torch or safetensors is not importable: {e}")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from transformer_ref_torch import forward  # noqa: E402

BLOCK = [("ln_1.weight", "ln1.w"), ("ln_1.bias", "ln1.b"), ("attn.c_attn.weight", "qkv.w"),
         ("attn.c_attn.bias", "qkv.b"), ("attn.c_proj.weight", "proj.w"),
         ("attn.c_proj.bias", "proj.b"), ("ln_2.weight", "ln2.w"), ("ln_2.bias", "ln2.b"),
         ("mlp.c_fc.weight", "fc.w"), ("mlp.c_fc.bias", "fc.b"),
         ("mlp.c_proj.weight", "fcproj.w"), ("mlp.c_proj.bias", "fcproj.b")]
CONV1D = {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"}


def hf_names(n_layer):
    """GPT2LMHeadModel's parameter names in mgpu's layout order."""
    out = ["transformer.wte.weight", "transformer.wpe.weight"]
    for layer in range(n_layer):
        out += [f"transformer.h.{layer}.{n}" for n, _ in BLOCK]
    return out + ["transformer.ln_f.weight", "transformer.ln_f.bias"]


def n_layers(sd):
    return 1 + max(int(k.split(".")[2]) for k in sd if k.startswith("transformer.h."))


def make(d, vocab, context, C, L, NH, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for name in hf_names(L):
        short = name.split(".", 3)[-1] if ".h." in name else name.split(".", 1)[1]
        if name.endswith("wte.weight"):
            shape = (vocab, C)
        elif name.endswith("wpe.weight"):
            shape = (context, C)
        elif short == "attn.c_attn.weight":
            shape = (C, 3 * C)
        elif short == "attn.c_attn.bias":
            shape = (3 * C,)
        elif short == "mlp.c_fc.weight":
            shape = (C, 4 * C)
        elif short == "mlp.c_fc.bias":
            shape = (4 * C,)
        elif short == "mlp.c_proj.weight":
            shape = (4 * C, C)
        elif short == "attn.c_proj.weight":
            shape = (C, C)
        else:
            shape = (C,)
        t = torch.randn(shape, generator=g, dtype=torch.float64) * 0.3
        if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or \
                name.endswith("ln_f.weight"):
            t = 1.0 + t
        sd[name] = t.to(torch.bfloat16 if dtype == "BF16" else torch.float32).contiguous()
    os.makedirs(d, exist_ok=True)
    save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    json.dump({"model_type": "gpt2", "vocab_size": vocab, "n_positions": context, "n_embd": C,
               "n_layer": L, "n_head": NH, "activation_function": "gelu_new",
               "layer_norm_epsilon": 1e-5}, open(os.path.join(d, "config.json"), "w"))
    return 0


def llmc(src, out, version, padded):
    sd = {k: v.float() for k, v in load_file(src).items()}
    L = n_layers(sd)
    wte, wpe = sd["transformer.wte.weight"], sd["transformer.wpe.weight"]
    V, C = wte.shape
    NH = json.load(open(os.path.join(os.path.dirname(src), "config.json")))["n_head"]
    header = [20240326, version, wpe.shape[0], V, L, NH, C, padded] + [0] * 248
    # llm.c's write_model: the token embedding padded with zero rows, then each kind of tensor
    # for every layer in turn, in nn.Linear's [out, in]
    ts = [torch.cat([wte, torch.zeros(padded - V, C)]), wpe]
    for short, _ in BLOCK:
        for layer in range(L):
            t = sd[f"transformer.h.{layer}.{short}"]
            ts.append(t.t() if short in CONV1D else t)
    ts += [sd["transformer.ln_f.weight"], sd["transformer.ln_f.bias"]]
    flat = torch.cat([t.contiguous().reshape(-1) for t in ts])
    with open(out, "wb") as f:
        f.write(struct.pack("<256i", *header))
        if version == 3:
            f.write(flat.numpy().tobytes())
        else:  # bf16: the upper half of each float32 after rounding
            f.write(flat.to(torch.bfloat16).view(torch.int16).numpy().tobytes())
    return 0


def ref_params(sd, vocab, transpose=True, bf16=False):
    """transformer_ref_torch's names, nn.Linear layout, float64, wte padded to vocab."""
    get = lambda k: sd[k] if k in sd else sd[k[len("transformer."):]]
    cvt = (lambda t: t.float().to(torch.bfloat16).double()) if bf16 else (lambda t: t.double())
    wte = cvt(get("transformer.wte.weight"))
    P = {"wte": torch.cat([wte, torch.zeros(vocab - wte.shape[0], wte.shape[1],
                                            dtype=torch.float64)]),
         "wpe": cvt(get("transformer.wpe.weight")),
         "lnf.w": cvt(get("transformer.ln_f.weight")), "lnf.b": cvt(get("transformer.ln_f.bias"))}
    for layer in range(sum(1 for k in sd if k.endswith("ln_1.weight"))):
        for short, ref in BLOCK:
            t = cvt(get(f"transformer.h.{layer}.{short}"))
            P[f"h{layer}.{ref}"] = t.t().contiguous() if short in CONV1D and transpose else t
    return P


def loss(path, tokens, T, B, vocab, mode=""):
    sd = load_file(path)
    ids = torch.tensor(struct.unpack("<%dH" % (os.path.getsize(tokens) // 2),
                                     open(tokens, "rb").read()), dtype=torch.long)
    tok = torch.stack([ids[w * T:w * T + T] for w in range(B)])
    tgt = torch.stack([ids[w * T + 1:w * T + T + 1] for w in range(B)])
    P = ref_params(sd, vocab, bf16=mode == "llmc-bf16")
    C = P["wte"].shape[1]
    NH = json.load(open(os.path.join(os.path.dirname(path), "config.json")))["n_head"]
    L = sum(1 for k in P if k.endswith(".ln1.w"))
    with torch.no_grad():
        good = forward(P, tok, tgt, B, T, C, NH, L).item()
        Q = ref_params(sd, vocab, transpose=False, bf16=mode == "llmc-bf16")
        # a square Conv1D weight read untransposed still runs: only its values differ
        Q = {k: (v if v.shape == P[k].shape else P[k]) for k, v in Q.items()}
        bad = forward(Q, tok, tgt, B, T, C, NH, L).item()
    print(f"loss {good:.9f}")
    print(f"untransposed {bad:.9f}")
    return 0


def same(path, ckpt, L):
    sd = load_file(path)
    data = open(ckpt, "rb").read()
    (n, header) = struct.unpack_from("<Q", data, 24)[0], struct.unpack_from("<I", data, 12)[0]
    flat = torch.frombuffer(bytearray(data[header:header + 4 * n]), dtype=torch.float32)
    names, at, bad = hf_names(L), 0, []
    if sorted(sd) != sorted(names):
        print(f"names differ: {sorted(set(sd) ^ set(names))}")
        return 1
    for name in names:
        t = sd[name]
        if t.dtype != torch.float32:
            bad.append(f"{name}: dtype {t.dtype}")
            continue
        short = name.split(".", 3)[-1]
        mine = t.t() if short in CONV1D else t  # mgpu holds nn.Linear's [out, in]
        piece = flat[at:at + mine.numel()].reshape(mine.shape)
        at += mine.numel()
        if not torch.equal(piece, mine):
            bad.append(f"{name}: differs from the checkpoint's (largest difference "
                       f"{(piece - mine).abs().max().item():.3g})")
    if at != n:
        bad.append(f"the export holds {at} parameters, the checkpoint {n}")
    print("\n".join(bad) if bad else f"same: {len(names)} tensors, {n} parameters, exactly")
    return 1 if bad else 0


def equal(a, b):
    x, y = load_file(a), load_file(b)
    x = {k if k.startswith("transformer.") else "transformer." + k: v for k, v in x.items()}
    bad = [k for k in sorted(set(x) | set(y))
           if k not in x or k not in y or x[k].shape != y[k].shape or
           not torch.equal(x[k].double(), y[k].double())]
    print("differ: " + ", ".join(bad) if bad else f"equal: {len(x)} tensors")
    return 1 if bad else 0


def main():
    """Commands separated by "+" run in one process (importing torch is most of the time)."""
    rc, cmds, cur = 0, [], []
    for arg in sys.argv[1:] + ["+"]:
        if arg == "+":
            cmds.append(cur)
            cur = []
        else:
            cur.append(arg)
    for c in cmds:
        rc = rc or run(c[0], c[1:])
    return rc


def run(cmd, a):
    if a and a[-1].startswith("out="):  # this command's output into a file
        path, a = a[-1][4:], a[:-1]
        saved, sys.stdout = sys.stdout, open(path, "w")
        try:
            return run(cmd, a)
        finally:
            sys.stdout.close()
            sys.stdout = saved
    if cmd == "make":
        return make(a[0], int(a[1]), int(a[2]), int(a[3]), int(a[4]), int(a[5]), int(a[6]), a[7])
    if cmd == "llmc":
        return llmc(a[0], a[1], int(a[2]), int(a[3]))
    if cmd == "loss":
        return loss(a[0], a[1], int(a[2]), int(a[3]), int(a[4]), a[5] if len(a) > 5 else "")
    if cmd == "same":
        return same(a[0], a[1], int(a[2]))
    if cmd == "equal":
        return equal(a[0], a[1])
    print(f"unknown command {cmd}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
