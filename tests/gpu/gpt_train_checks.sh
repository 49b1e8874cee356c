#!/usr/bin/env bash
# tests/gpu/gpt_train_checks.sh [OUTDIR] - short GPT trainings (model = gpt) on one GPU, checked
# against the CPU reference and bf16 against fp32. Each check prints "ok - NAME" or
# "not ok - NAME: why" (tests/gpu/lib.sh's format); without a GPU each prints its skip and the
# script exits 77. The status is 1 when a check failed.
#
#   gpt_gpu_matches_cpu: a tiny GPT (2 layers, 32 wide, 2 heads, context 16, bytes of a licence
#     text, batch 8, AdamW with warm-up, cosine decay and grad_clip = 0.5 so that clipping
#     acts) trained 20 steps with precision = fp32 on the GPU and on the CPU backend
#     (CUDA_VISIBLE_DEVICES="" hides the GPU): every step's loss within 1e-4 relative.
#   gpt_bf16_tracks_fp32: the small byte model of configs/bench_gpt_small.cfg (6 layers, 384
#     wide, 6 heads, context 256), batch 16, 500 steps on the repository's own sources and
#     documents (the C, CUDA and Markdown files under common/, kernels/, launcher/ and worker/,
#     in path order: the same text on every machine at a given commit; over 2 MB, so that the
#     500 steps of 16 x 256 bytes read it about once and the model learns rather than
#     memorises), bf16 against fp32 on the GPU. Both runs see the same batches in the same
#     order (same seed), so their curves differ by precision alone; each curve is smoothed by
#     averaging its losses over 20 blocks of 25 steps, and every block's mean must be within 2%
#     of fp32's. The bf16 run must have taken the bf16 path (its first line says "bf16
#     activations"): activations stored in bf16, the products' epilogues fused.
#   gpt_graph_matches_eager: the step replayed from CUDA graphs (cuda_graph = true, the
#     default, which the two checks above use) against the same step run eagerly
#     (cuda_graph = false): the tiny GPT of the first check in fp32 (every step's loss within
#     1e-6 relative over 20 steps) and the small model in bf16 (20 steps of batch 16, within
#     1e-3: bf16 noise); the graph runs' metrics must say cuda_graph = true, the eager ones
#     false.
#   gpt_bf16_resume_matches: the tiny GPT in bf16 (the bf16 path, whose weights' bf16 copy must
#     be made again from a checkpoint's parameters) at a constant learning rate, 40 steps
#     straight against 20 steps with a checkpoint then resumed to 40: steps 21-40 give the
#     same losses (MGPU_LT_TUNE=0: no timing decides an algorithm in either process).
#
# The texts are cut to a whole number of batches of windows (eval_fraction = 0), so every
# batch is full and the step can be replayed from a CUDA graph. Every run's output and metrics
# stay in OUTDIR (default gpt-train-out). MGPU_BUILD names the build directory.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
BUILD=${MGPU_BUILD:-$root/build}
out=${1:-gpt-train-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
WORKER=$BUILD/bin/mgpu-worker
source "$here/lib.sh" # gpu_present
PY=python3
command -v python3 >/dev/null || PY=/usr/bin/python3
checks="gpt_gpu_matches_cpu gpt_bf16_tracks_fp32 gpt_graph_matches_eager gpt_bf16_resume_matches"

if ! gpu_present; then
    echo "  skip: no CUDA device"
    for c in $checks; do echo "skip - $c"; done
    exit 77
fi
[ -x "$WORKER" ] || {
    for c in $checks; do echo "not ok - $c: $WORKER is missing (run make first)"; done
    exit 1
}

# FILE SRC... : the sources concatenated, cut to 1 + a multiple of UNIT bytes
text_of() {
    local file=$1 unit=$2 size
    shift 2
    cat "$@" >"$file.all" 2>/dev/null
    size=$(stat -c %s "$file.all")
    head -c $(((size - 1) / unit * unit + 1)) "$file.all" >"$file"
    rm -f "$file.all"
    [ "$(stat -c %s "$file")" -gt "$unit" ]
}
gpl=/usr/share/common-licenses/GPL-3
if [ ! -f "$gpl" ]; then
    # a machine without Debian's licence texts: the repository's own sources are text too
    echo "  note: no $gpl here: the tiny GPT trains on the repository's sources"
    gpl=$(find "$root/kernels" "$root/worker" "$root/launcher" -name '*.[ch]' | LC_ALL=C sort)
fi

# NAME CFG key=value... : one run; its output and metrics in $out/NAME.{out,jsonl}
run() {
    local name=$1 cfg=$2
    shift 2
    rm -f "$out/$name.jsonl"
    "$WORKER" "$cfg" metrics_file="$out/$name.jsonl" "$@" >"$out/$name.out" 2>&1
}

# compare NAME KIND A.jsonl B.jsonl TOL BLOCK STEPS : prints the verdict line (A is checked
# against B, the reference), with each run's backend checked first
compare() {
    "$PY" - "$@" <<'EOF'
import json, sys
name, kind, fa, fb, tol, block, steps = sys.argv[1:8]
tol, block, steps = float(tol), int(block), int(steps)
def read(path):
    rows, final = {}, {}
    try:
        for line in open(path):
            try:
                o = json.loads(line)
            except ValueError:
                continue
            if o.get("final"):
                final = o
            elif "step" in o and "loss" in o and "eval_loss" not in o:
                rows[int(o["step"])] = float(o["loss"])
    except OSError:
        pass
    return [rows[k] for k in sorted(rows)], final
(a, fa_), (b, fb_) = read(fa), read(fb)
want = {"gpu_cpu": ("cuda", "cpu"), "bf16_fp32": ("cuda", "cuda"),
        "graph_eager": ("cuda", "cuda"), "resume": ("cuda", "cuda")}[kind]
for path, fin, w in ((fa, fa_, want[0]), (fb, fb_, want[1])):
    if not fin:
        print(f"not ok - {name}: {path} has no final metrics line (the run failed)")
        sys.exit(1)
    if fin.get("backend") != w:
        # said without the JSON form that lib.sh's judge reads as a CPU run
        print(f"not ok - {name}: {path} ran on backend {fin.get('backend')}, expected {w}")
        sys.exit(1)
if kind == "graph_eager" and (fa_.get("cuda_graph") is not True or fb_.get("cuda_graph")):
    print(f"not ok - {name}: cuda_graph {fa_.get('cuda_graph')} in {fa} and "
          f"{fb_.get('cuda_graph')} in {fb}, expected true and false")
    sys.exit(1)
if kind == "resume":  # the resumed run's steps are the straight run's last ones
    b = b[len(b) - len(a):] if len(a) <= len(b) else b
for path, rows in ((fa, a), (fb, b)):
    if len(rows) != steps:
        print(f"not ok - {name}: {path} has {len(rows)} losses of steps, expected {steps} "
              "(one a step with log_interval = 1)")
        sys.exit(1)
labels = {"resume": "resumed / straight", "graph_eager": "graph / eager", "gpu_cpu": "GPU / CPU"}
if kind in labels:  # step by step
    rel = [abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b)]
    worst = max(range(steps), key=lambda i: rel[i])
    if kind == "resume":
        print(f"  losses, {labels[kind]}: first {a[0]:.7f} / {b[0]:.7f}, last "
              f"{a[-1]:.7f} / {b[-1]:.7f}; largest relative difference {rel[worst]:.2e} "
              f"(tolerance {tol:g})")
    else:
        print(f"  losses, {labels[kind]}: step 1 {a[0]:.7f} / {b[0]:.7f}, step {steps} "
              f"{a[-1]:.7f} / {b[-1]:.7f}; largest relative difference {rel[worst]:.2e} "
              f"at step {worst + 1} (tolerance {tol:g})")
else:
    ma = [sum(a[i:i + block]) / block for i in range(0, steps, block)]
    mb = [sum(b[i:i + block]) / block for i in range(0, steps, block)]
    rel = [abs(x - y) / y for x, y in zip(ma, mb)]
    worst = max(range(len(rel)), key=lambda i: rel[i])
    print("  block means (25 steps), bf16 / fp32: " + ", ".join(
        f"{x:.3f}/{y:.3f}" for x, y in list(zip(ma, mb))[::4]))
    print(f"  largest relative difference {100 * rel[worst]:.2f}% in block {worst + 1} "
          f"(steps {worst * block + 1}-{(worst + 1) * block}; tolerance {100 * tol:g}%)")
if rel[worst] <= tol:
    print(f"ok - {name}")
else:
    print(f"not ok - {name}: relative difference {rel[worst]:.3g} > {tol:g}")
    sys.exit(1)
EOF
}

# tail of a failed run, without its JSON (a CPU run's metrics would read as a GPU check on the CPU)
why() { grep -v '^{' "$out/$1.out" | tail -n 5 | sed 's/^/    /'; }

# CHECK NAME: true when run NAME took the bf16 path (its first line says so), else CHECK's
# verdict and the run's tail
on_bf16_path() {
    grep -q 'bf16 activations' "$out/$2.out" && return 0
    echo "not ok - $1: the bf16 run did not take the bf16 path:"
    why "$2"
    return 1
}

rc=0
# --- (a) fp32 on the GPU against the CPU -------------------------------------------------------
# shellcheck disable=SC2086 # one file, or the list of the repository's sources
text_of "$out/tiny.txt" $((16 * 8)) $gpl
cat >"$out/tiny.cfg" <<EOF
model = gpt
n_layer = 2
n_head = 2
n_embd = 32
context = 16
dataset = text
data_text = tiny.txt
eval_fraction = 0
batch_size = 8
optimizer = adamw
lr = 0.001
lr_min = 0.0001
warmup_steps = 5
weight_decay = 0.1
betas = 0.9, 0.95
grad_clip = 0.5
max_steps = 20
log_interval = 1
precision = fp32
seed = 1
EOF
run tiny_gpu "$out/tiny.cfg" || why tiny_gpu
CUDA_VISIBLE_DEVICES='' run tiny_cpu "$out/tiny.cfg" || why tiny_cpu
compare gpt_gpu_matches_cpu gpu_cpu "$out/tiny_gpu.jsonl" "$out/tiny_cpu.jsonl" 1e-4 1 20 || rc=1

# --- (b) bf16 against fp32 over 500 steps ------------------------------------------------------
sources=$(cd "$root" && find common kernels launcher worker -type f \
    \( -name '*.[ch]' -o -name '*.cu' -o -name '*.cuh' -o -name '*.md' \) | LC_ALL=C sort)
# shellcheck disable=SC2086 # the list of the repository's files, relative to it
(cd "$root" && text_of "$out/sources.txt" $((256 * 16)) $sources)
echo "  text: $(stat -c %s "$out/sources.txt") bytes of $(echo "$sources" | wc -w) files"
cat >"$out/small.cfg" <<EOF
model = gpt
n_layer = 6
n_head = 6
n_embd = 384
context = 256
dataset = text
data_text = sources.txt
eval_fraction = 0
batch_size = 16
optimizer = adamw
lr = 0.001
lr_min = 0.0001
warmup_steps = 50
weight_decay = 0.1
betas = 0.9, 0.95
grad_clip = 1.0
max_steps = 500
log_interval = 1
seed = 1
EOF
run small_fp32 "$out/small.cfg" precision=fp32 || why small_fp32
run small_bf16 "$out/small.cfg" precision=bf16 || why small_bf16
on_bf16_path gpt_bf16_tracks_fp32 small_bf16 &&
    compare gpt_bf16_tracks_fp32 bf16_fp32 "$out/small_bf16.jsonl" "$out/small_fp32.jsonl" \
        0.02 25 500 || rc=1
tail -n 1 "$out/small_bf16.jsonl" 2>/dev/null

# --- (c) the step replayed from CUDA graphs against the eager step ----------------------------
run tiny_eager "$out/tiny.cfg" cuda_graph=false || why tiny_eager
run small_graph20 "$out/small.cfg" precision=bf16 max_steps=20 || why small_graph20
run small_eager20 "$out/small.cfg" precision=bf16 max_steps=20 cuda_graph=false ||
    why small_eager20
# one verdict for both precisions: fp32's figures, then bf16's comparison and the verdict
if compare gpt_graph_matches_eager graph_eager "$out/tiny_gpu.jsonl" "$out/tiny_eager.jsonl" \
    1e-6 1 20 >"$out/graph_fp32.txt"; then
    grep -v '^ok - ' "$out/graph_fp32.txt" | sed 's/losses, graph/fp32 losses, graph/'
    compare gpt_graph_matches_eager graph_eager "$out/small_graph20.jsonl" \
        "$out/small_eager20.jsonl" 1e-3 1 20 || rc=1
else
    cat "$out/graph_fp32.txt"
    rc=1
fi

# --- (d) the bf16 path resumed from a checkpoint against the same run straight ----------------
rm -f "$out/resume.ckpt"
resume=(precision=bf16 lr_min=0.001 warmup_steps=0)
MGPU_LT_TUNE=0 run bf16_straight "$out/tiny.cfg" "${resume[@]}" max_steps=40 ||
    why bf16_straight
MGPU_LT_TUNE=0 run bf16_first "$out/tiny.cfg" "${resume[@]}" max_steps=20 \
    checkpoint="$out/resume.ckpt" || why bf16_first
MGPU_LT_TUNE=0 run bf16_resumed "$out/tiny.cfg" "${resume[@]}" max_steps=40 \
    checkpoint="$out/resume.ckpt" || why bf16_resumed
on_bf16_path gpt_bf16_resume_matches bf16_resumed &&
    compare gpt_bf16_resume_matches resume "$out/bf16_resumed.jsonl" "$out/bf16_straight.jsonl" \
        0 1 20 || rc=1
exit $rc
