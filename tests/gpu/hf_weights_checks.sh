#!/usr/bin/env bash
# tests/gpu/hf_weights_checks.sh [OUTDIR] - GPT-2 weights between Hugging Face `transformers`
# and mgpu-worker on one GPU (init_from, export), each check "ok - NAME" or "not ok - NAME: why"
# (tests/gpu/lib.sh's format). Needs a Python with torch, transformers and safetensors
# (HF_PYTHON, default python3); nothing is downloaded (HF_HUB_OFFLINE=1): the model is built
# from a GPT2Config.
#
# The model: GPT2LMHeadModel(GPT2Config(vocab 50257, 512 positions, 4 layers, 256 wide, 4 heads
# of 64, no dropout)), its weights drawn wider than GPT-2's init (normal, std 0.1; LayerNorm
# weights 1 + that) so that a wrong name, transpose or row changes the loss by far more than
# the tolerances; saved with save_pretrained (model.safetensors, config.json). The tokens:
# 8 x 128 + 1 random ids below 50257, repeated to 20 windows' worth (uint16). Every loss is
# the mean over windows 0..7 of 128 + 1 tokens at stride 128: mgpu's is step 1's loss of a
# run with lr = 0, no shuffle, batch 8 (logged before the update), transformers' the model's
# cross-entropy on the same windows in fp32 with TF32 off. Differences are relative to the
# larger of transformers' loss and 1.
#
#   hf_init_fp32_exact: mgpu (precision = fp32, vocab = 50257) init_from the saved folder's
#     model.safetensors: the same loss as transformers within 1e-4 relative.
#   hf_init_padded: vocab = 50304 (llm.c's padding; the bf16 path needs a multiple of 8): the
#     extra rows are zero, so their logits are 0 and take part in the softmax; transformers'
#     logits padded with zeros the same way are the reference: fp32 within 1e-4, bf16 within
#     2e-2 (bf16's rounding of activations and weights).
#   hf_export_loads_in_transformers: mgpu in bf16 trains the model 10 steps (lr 3e-4) from
#     the folder and exports it (export = .../model.safetensors, config.json beside it);
#     GPT2LMHeadModel.from_pretrained(folder) must load it with no missing, unexpected or
#     mismatched keys and the same tensors as the file; its loss must have moved from the
#     start's (training happened) and equal that of mgpu reloading the export (init_from,
#     lr = 0): fp32 within 1e-4, bf16 within 2e-2.
#
# MGPU_HF_CHECK_CPU=1 rehearses the checks on a machine without a GPU (mgpu's CPU backend,
# transformers on the CPU; precision = bf16 then computes fp32 there). MGPU_BUILD names the
# build directory; every file stays in OUTDIR (default hf-weights-out). Exit status: 0 all
# passed, 1 a check failed, 77 no GPU (and no rehearsal).
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
BUILD=${MGPU_BUILD:-$root/build}
out=${1:-hf-weights-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
WORKER=$BUILD/bin/mgpu-worker
source "$here/lib.sh" # gpu_present
PY=${HF_PYTHON:-python3}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
checks="hf_init_fp32_exact hf_init_padded hf_export_loads_in_transformers"
cpu=${MGPU_HF_CHECK_CPU:-0}
backend=cuda
[ "$cpu" = 1 ] && backend=cpu

all_fail() {
    for c in $checks; do echo "not ok - $c: $1"; done
    exit 1
}
if [ "$cpu" != 1 ] && ! gpu_present; then
    echo "  skip: no CUDA device (MGPU_HF_CHECK_CPU=1 rehearses on the CPU)"
    for c in $checks; do echo "skip - $c"; done
    exit 77
fi
[ -x "$WORKER" ] || all_fail "$WORKER is missing (run make first)"
"$PY" -c 'import torch, transformers, safetensors' >"$out/imports.txt" 2>&1 ||
    all_fail "$PY cannot import torch, transformers and safetensors: $(tail -n 1 "$out/imports.txt")"
"$PY" -c 'import torch, transformers, safetensors; print("torch", torch.__version__, "transformers", transformers.__version__, "safetensors", safetensors.__version__, "cuda", torch.cuda.is_available())'

cat >"$out/hf.py" <<'EOF'
"""hf.py make DIR TOKENS | loss DIR TOKENS PAD_TO OUT.json | export DIR TOKENS OUT.json"""
import json, os, struct, sys
import torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel

T, B = 128, 8
dev = "cuda" if torch.cuda.is_available() and os.environ.get("MGPU_HF_CHECK_CPU") != "1" else "cpu"
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

def windows(tokens):
    n = os.path.getsize(tokens) // 2
    ids = torch.tensor(struct.unpack("<%dH" % n, open(tokens, "rb").read()), dtype=torch.long)
    x = torch.stack([ids[w * T:w * T + T] for w in range(B)])
    y = torch.stack([ids[w * T + 1:w * T + T + 1] for w in range(B)])
    return x.to(dev), y.to(dev)

def load(d):
    kw = {"local_files_only": True, "output_loading_info": True}
    try:
        m, info = GPT2LMHeadModel.from_pretrained(d, attn_implementation="eager", **kw)
    except (TypeError, ValueError):
        m, info = GPT2LMHeadModel.from_pretrained(d, **kw)
    return m.float().to(dev).eval(), info

def loss_of(m, tokens, pad_to):
    x, y = windows(tokens)
    with torch.no_grad():
        logits = m(x).logits.float()
        V = logits.shape[-1]
        if pad_to > V:  # mgpu's zero rows: logits of 0 in the softmax
            logits = torch.cat([logits, logits.new_zeros(B, T, pad_to - V)], dim=-1)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).item()

cmd = sys.argv[1]
if cmd == "make":
    d, tokens = sys.argv[2], sys.argv[3]
    torch.manual_seed(1234)
    cfg = GPT2Config(vocab_size=50257, n_positions=512, n_embd=256, n_layer=4, n_head=4,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    m = GPT2LMHeadModel(cfg)
    with torch.no_grad():
        for name, p in m.named_parameters():
            p.normal_(0.0, 0.1)
            if ".ln_" in name and name.endswith("weight"):
                p.add_(1.0)
    try:
        m.save_pretrained(d, safe_serialization=True)
    except TypeError:  # a version that writes safetensors only, without the argument
        m.save_pretrained(d)
    if not os.path.exists(os.path.join(d, "model.safetensors")):
        sys.exit(f"save_pretrained wrote no {d}/model.safetensors: {os.listdir(d)}")
    g = torch.Generator().manual_seed(99)
    ids = torch.randint(0, 50257, (B * T + 1,), generator=g).tolist()
    ids = (ids * 3)[:20 * T + 1]
    open(tokens, "wb").write(struct.pack("<%dH" % len(ids), *ids))
    print("made", d, "with", sum(p.numel() for p in m.parameters()), "parameters")
elif cmd == "loss":
    d, tokens, pad_to, res = sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    m, _ = load(d)
    json.dump({"loss": loss_of(m, tokens, pad_to)}, open(res, "w"))
    print(open(res).read())
elif cmd == "export":
    from safetensors.torch import load_file
    d, tokens, res = sys.argv[2], sys.argv[3], sys.argv[4]
    m, info = load(d)
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys",
                                                   "mismatched_keys") and len(v) > 0}
    sd, f = m.state_dict(), load_file(os.path.join(d, "model.safetensors"))
    def same(a, b):  # a version that keeps Conv1D's weights as nn.Linear's holds the transpose
        return torch.equal(a, b) or (a.dim() == 2 and a.t().shape == b.shape and torch.equal(a.t(), b))
    differ = [k for k, v in f.items() if k not in sd or not same(sd[k].cpu(), v.float())]
    if not m.transformer.wte.weight.data_ptr() == m.lm_head.weight.data_ptr():
        differ.append("lm_head.weight is not tied to transformer.wte.weight")
    out = {"loss": loss_of(m, tokens, 0), "loading_info": {k: list(map(str, v)) for k, v in bad.items()},
           "differ": differ, "vocab_size": m.config.vocab_size}
    json.dump(out, open(res, "w"))
    print(json.dumps(out))
EOF

# NAME key=value... : one mgpu-worker run of $out/base.cfg; output and metrics in $out/NAME.*
run() {
    local name=$1
    shift
    rm -f "$out/$name.jsonl"
    "$WORKER" "$out/base.cfg" metrics_file="$out/$name.jsonl" "$@" >"$out/$name.out" 2>&1 ||
        echo "  $name: mgpu-worker exited $? ($(grep -v '^{' "$out/$name.out" | tail -n 1))"
}

# verdict NAME TOL MGPU_RUN REF.json [MGPU_RUN REF.json TOL]...: mgpu's step-1 loss of each run
# (which must have run on $backend) against the reference's within TOL relative
verdict() {
    "$PY" - "$backend" "$out" "$@" <<'EOF'
import json, sys
backend, out, name = sys.argv[1], sys.argv[2], sys.argv[3]
args, bad, lines = sys.argv[4:], [], []
for i in range(0, len(args), 3):
    tol, run, ref = float(args[i]), args[i + 1], args[i + 2]
    steps, final = {}, {}
    try:
        for l in open(f"{out}/{run}.jsonl"):
            o = json.loads(l)
            if o.get("final"):
                final = o
            elif "step" in o and "loss" in o:
                steps[o["step"]] = o["loss"]
    except (OSError, ValueError):
        pass
    try:
        want = json.load(open(ref))["loss"]
    except (OSError, ValueError, KeyError):
        bad.append(f"{ref}: no reference loss")
        continue
    if 1 not in steps or not final:
        bad.append(f"{run}: no step-1 loss or final line (see {out}/{run}.out)")
        continue
    if final.get("backend") != backend:
        bad.append(f"{run} ran on backend {final.get('backend')}, expected {backend}")
        continue
    rel = abs(steps[1] - want) / max(abs(want), 1.0)
    lines.append(f"  {run}: mgpu {steps[1]:.6f} transformers {want:.6f} relative {rel:.2e} "
                 f"(tolerance {tol:g})")
    if not rel <= tol:
        bad.append(f"{run}: loss {steps[1]:.6f}, transformers' {want:.6f} (relative {rel:.2e} > {tol:g})")
print("\n".join(lines))
print(f"not ok - {name}: " + "; ".join(bad) if bad else f"ok - {name}")
sys.exit(1 if bad else 0)
EOF
}

rc=0
src=$out/hf_src
rm -rf "$src" "$out/export"
mkdir -p "$out/export"
"$PY" "$out/hf.py" make "$src" "$out/tokens.bin" >"$out/make.txt" 2>&1 ||
    all_fail "building the model with transformers failed: $(tail -n 3 "$out/make.txt")"
cat "$out/make.txt"
cat >"$out/base.cfg" <<EOF
model = gpt
dataset = tokens
data_tokens = $out/tokens.bin
vocab = 50304
n_layer = 4
n_head = 4
n_embd = 256
context = 128
batch_size = 8
max_steps = 1
lr = 0
weight_decay = 0
shuffle = false
eval_fraction = 0
log_interval = 1
init_from = $src/model.safetensors
EOF
[ "$cpu" = 1 ] && echo "backend = cpu" >>"$out/base.cfg"

# --- transformers' model into mgpu -------------------------------------------------------------
"$PY" "$out/hf.py" loss "$src" "$out/tokens.bin" 0 "$out/ref_exact.json" >"$out/ref_exact.txt" 2>&1 ||
    echo "  transformers' loss failed: $(tail -n 3 "$out/ref_exact.txt")"
"$PY" "$out/hf.py" loss "$src" "$out/tokens.bin" 50304 "$out/ref_padded.json" >"$out/ref_padded.txt" 2>&1 ||
    echo "  transformers' padded loss failed: $(tail -n 3 "$out/ref_padded.txt")"
run init_fp32_exact precision=fp32 vocab=50257
verdict hf_init_fp32_exact 1e-4 init_fp32_exact "$out/ref_exact.json" || rc=1
run init_fp32_padded precision=fp32
run init_bf16_padded precision=bf16
if [ "$cpu" != 1 ] && ! grep -q 'bf16 activations' "$out/init_bf16_padded.out"; then
    echo "not ok - hf_init_padded: the bf16 run did not take the bf16 path (no 'bf16 activations' in $out/init_bf16_padded.out)"
    rc=1
else
    verdict hf_init_padded 1e-4 init_fp32_padded "$out/ref_padded.json" \
        2e-2 init_bf16_padded "$out/ref_padded.json" || rc=1
fi

# --- mgpu's export into transformers -----------------------------------------------------------
run train_export precision=bf16 max_steps=10 lr=3e-4 weight_decay=0.1 shuffle=true \
    export="$out/export/model.safetensors"
"$PY" "$out/hf.py" export "$out/export" "$out/tokens.bin" "$out/ref_export.json" \
    >"$out/ref_export.txt" 2>&1 || echo "  loading the export failed: $(tail -n 3 "$out/ref_export.txt")"
cat "$out/ref_export.txt" | tail -n 1
run export_fp32 precision=fp32 init_from="$out/export/model.safetensors"
run export_bf16 precision=bf16 init_from="$out/export/model.safetensors"
why=$("$PY" - "$out/ref_export.json" "$out/ref_padded.json" <<'EOF'
import json, sys
try:
    e, start = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
except (OSError, ValueError) as x:
    print(f"no result from transformers ({x})"); sys.exit()
if e["loading_info"]:
    print(f"from_pretrained reported {e['loading_info']}")
elif e["differ"]:
    print(f"the loaded model differs from the file: {e['differ'][:5]}")
elif e["vocab_size"] != 50304:
    print(f"config.json's vocab_size {e['vocab_size']}, expected 50304")
elif abs(e["loss"] - start["loss"]) < 1e-3 * start["loss"]:
    print(f"the exported model's loss {e['loss']:.6f} is the start's {start['loss']:.6f}: no training in it")
EOF
)
if [ -n "$why" ]; then
    echo "not ok - hf_export_loads_in_transformers: $why"
    rc=1
else
    verdict hf_export_loads_in_transformers 1e-4 export_fp32 "$out/ref_export.json" \
        2e-2 export_bf16 "$out/ref_export.json" || rc=1
fi
exit $rc
