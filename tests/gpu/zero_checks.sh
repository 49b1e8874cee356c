#!/usr/bin/env bash
# tests/gpu/zero_checks.sh [OUTDIR] - zero = 1 (ZeRO stage 1: AdamW's state sharded over the
# ranks, worker/trainer/zero.h) on one NVIDIA GPU, in well under 90 s on an H200. Each check
# prints "ok - NAME" or "not ok - NAME: why" (tests/gpu/lib.sh's format); without a GPU each
# prints its skip and the script exits 77. The status is 1 when a check failed.
#
# One rank on the GPU, mgpu-worker (MGPU_LT_TUNE=0 everywhere: no timing picks a GEMM
# algorithm, so two runs of the same work give the same bits):
#   zero_one_rank_gpt_bf16: a tiny GPT (2 layers, 32 wide, 2 heads, context 16, the bytes of a
#     licence text, batch 8, AdamW with warm-up and grad_clip = 0.5) on the bf16 path, 50
#     steps, zero = 1 against zero = 0 run eagerly (cuda_graph = false): every step's loss
#     exactly (alone, the sharded step is zero = 0's: its norm sums the same floats in the same
#     order, its AdamW is elementwise, and the bf16 copy it makes after the all-gather rounds
#     as AdamW's own writes of it do); against zero = 0 replayed from CUDA graphs, within
#     1e-3 (graph against eager in bf16, as gpt_train_checks.sh allows). zero = 1 must say it
#     runs eagerly, print its optimizer state (2 n floats on one rank) and take the bf16 path.
#   zero_one_rank_gpt_fp32: the same in fp32, zero = 1 against zero = 0 eager, exactly.
#   zero_one_rank_mlp: the MLP through the GPU step (the sharded update in place of the
#     buckets), AdamW, 48 steps, zero = 1 against zero = 0 eager, exactly.
# Several ranks on the one GPU (build/tests/test_zero_gpu: thread-ranks, each with its own CUDA
# stream, whose collectives go through host memory and reduce in rank order, so that the
# reduce-scatter gives each gradient the all-reduce's bits; NCCL cannot put two ranks on one
# GPU):
#   zero_slice_optimizers: optimizers of 2 and 3 slices update as the whole one, bit for bit.
#   zero_two_ranks_gpt_bf16, zero_two_ranks_gpt_fp32: 2 ranks, 50 steps, zero = 1 against
#     zero = 0: without a clip every loss and the final parameters bit for bit; with
#     grad_clip = 1.0 the norm is the slices' sums of squares added over the ranks (another
#     order than one sum), so within 2e-3 in bf16 (a parameter a float step away can round to
#     the next bf16) and 1e-5 in fp32; rank 0's optimizer state halves (2 floor(n / 2) floats
#     against 2 n).
#   zero_three_ranks_tail: 3 ranks of a GPT whose 21,472 parameters leave a tail of 1 float (an
#     all-reduce and a broadcast of its own), the same checks, state a third.
#   zero_two_ranks_mlp: the MLP at 2 ranks, AdamW and SGD with momentum, zero = 1 against
#     zero = 0, bit for bit, state halved.
#   zero_resume_two_ranks_at_one: a zero = 1 checkpoint of 2 ranks (fp32) resumed at world size
#     1 with zero = 1 and with zero = 0 (twice the batch: the same global batch, the checkpoint
#     at an epoch's end, so the same windows in the same steps): both resume at step 16 and
#     follow the 2-rank run that never stopped within 1e-4 relative (the ranks' means summed
#     in another order), and each other exactly.
# Ranks that share the GPU under mgpu-launch (--allow_gpu_sharing) train on the CPU (main.c:
# NCCL cannot put them on one GPU), so these two use the GPU only for the resume:
#   zero_shared_gpu_ranks: 2 ranks sharing the GPU, the tiny GPT in fp32, 50 steps, zero = 1
#     against zero = 0 within 1e-6 relative (the clip's sum order, as above), the optimizer
#     state printed on rank 0 halved.
#   zero_resume_shared_ranks_on_gpu: their zero = 1 checkpoint after 2 epochs (16 steps) resumed
#     by mgpu-worker on the GPU at world size 1 with zero = 1: from step 16, within 1e-4
#     relative of the 2 CPU ranks' straight run (GPU against CPU in fp32, as
#     gpt_train_checks.sh's gpt_gpu_matches_cpu allows).
#
# Every run's output and metrics stay in OUTDIR (default zero-out). MGPU_BUILD names the build
# directory. Run: bash tests/gpu/zero_checks.sh [OUTDIR]
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
BUILD=${MGPU_BUILD:-$root/build}
out=${1:-zero-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
WORKER=$BUILD/bin/mgpu-worker
LAUNCH=$BUILD/bin/mgpu-launch
UNIT=$BUILD/tests/test_zero_gpu
source "$here/lib.sh" # gpu_present
PY=python3
command -v python3 >/dev/null || PY=/usr/bin/python3
export MGPU_LT_TUNE=0 NCCL_NVLS_ENABLE=0
checks="zero_one_rank_gpt_bf16 zero_one_rank_gpt_fp32 zero_one_rank_mlp zero_slice_optimizers
zero_two_ranks_gpt_bf16 zero_two_ranks_gpt_fp32 zero_three_ranks_tail zero_two_ranks_mlp
zero_resume_two_ranks_at_one zero_shared_gpu_ranks zero_resume_shared_ranks_on_gpu"

if ! gpu_present; then
    echo "  skip: no CUDA device"
    for c in $checks; do echo "skip - $c"; done
    exit 77
fi
for b in "$WORKER" "$LAUNCH" "$UNIT"; do
    [ -x "$b" ] && continue
    for c in $checks; do echo "not ok - $c: $b is missing (run make first)"; done
    exit 1
done
t0=$(date +%s)

# The first 1025 bytes of a licence text (or of the repository's sources): 64 windows of
# context 16, all for training.
src=/usr/share/common-licenses/GPL-3
[ -f "$src" ] || src=$(find "$root/kernels" -name '*.c' | sort | head -n 1)
head -c 1025 "$src" >"$out/tiny.txt"
[ "$(stat -c %s "$out/tiny.txt")" -eq 1025 ] || {
    for c in $checks; do echo "not ok - $c: $src holds fewer than 1025 bytes"; done
    exit 1
}
cat >"$out/tiny.cfg" <<EOF
model = gpt
n_layer = 2
n_head = 2
n_embd = 32
context = 16
dataset = text
data_text = tiny.txt
eval_fraction = 0
optimizer = adamw
lr = 0.003
warmup_steps = 5
weight_decay = 0.1
betas = 0.9, 0.95
grad_clip = 0.5
log_interval = 1
seed = 1
EOF
cat >"$out/mlp.cfg" <<EOF
dataset = synthetic
samples = 512
features = 32
classes = 10
eval_fraction = 0
model = mlp
hidden = 64,64
loss = cross_entropy
optimizer = adamw
lr = 0.003
batch_size = 32
epochs = 3
shuffle = true
precision = fp32
log_interval = 1
EOF

# NAME CFG key=value... : one run of mgpu-worker on the GPU; output and metrics in
# $out/NAME.{out,jsonl}
run() {
    local name=$1 cfg=$2
    shift 2
    rm -f "$out/$name.jsonl"
    (cd "$out" && "$WORKER" "$cfg" metrics_file="$out/$name.jsonl" "$@") >"$out/$name.out" 2>&1
}

# NAME ARGS... : mgpu-launch ARGS with metrics in $out/NAME.jsonl, output in $out/NAME.out
launch() {
    local name=$1
    shift
    rm -f "$out/$name.jsonl"
    (cd "$out" && "$LAUNCH" "$@" metrics_file="$out/$name.jsonl") >"$out/$name.out" 2>&1
}

# compare NAME A B TOL FROM TO [WANT...] : run A's losses of steps FROM..TO against run B's
# (relative), then prints the figures and "ok - NAME" or "not ok - NAME: why". Each run must
# have its final metrics line with backend cuda, unless a WANT says cpu:RUN. The other WANTs:
# KEY=VALUE (A's final metrics), +TEXT (a line of A's output holds TEXT).
compare() {
    "$PY" - "$out" "$@" <<'EOF'
import json, sys
out, name, a, b, tol, lo, hi = sys.argv[1:8]
wants = sys.argv[8:]
tol, lo, hi = float(tol), int(lo), int(hi)
def read(run):
    rows, final = {}, None
    try:
        for line in open(f"{out}/{run}.jsonl"):
            try:
                o = json.loads(line)
            except ValueError:
                continue
            if o.get("final"):
                final = o
            elif "step" in o and "loss" in o:
                rows[int(o["step"])] = float(o["loss"])
    except OSError:
        pass
    return rows, final
def fail(why):
    print(f"not ok - {name}: {why}")
    sys.exit(1)
(ra, fa), (rb, fb) = read(a), read(b)
for run, fin in ((a, fa), (b, fb)):
    if fin is None:
        fail(f"{run} has no final metrics line (the run failed: {out}/{run}.out)")
    want = "cpu" if "cpu:" + run in wants else "cuda"
    if fin.get("backend") != want:
        fail(f"{run} ran on backend {fin.get('backend')}, expected {want}")
for w in wants:
    if w.startswith("+"):
        if w[1:] not in open(f"{out}/{a}.out", errors="replace").read():
            fail(f"{a}'s output does not say '{w[1:]}' ({out}/{a}.out)")
    elif "=" in w:
        k, v = w.split("=", 1)
        if str(fa.get(k)).lower() != v.lower():
            fail(f"{a}'s final metrics have {k} = {fa.get(k)}, expected {v}")
missing = [s for s in range(lo, hi + 1) if s not in ra or s not in rb]
if missing:
    fail(f"no loss of step {missing[0]} in {a} or {b} (steps {lo}-{hi} expected)")
rel = {s: abs(ra[s] - rb[s]) / abs(rb[s]) for s in range(lo, hi + 1)}
worst = max(rel, key=lambda s: rel[s])
print(f"  {a} / {b}: steps {lo}-{hi}, first {ra[lo]:.7f} / {rb[lo]:.7f}, last {ra[hi]:.7f} / "
      f"{rb[hi]:.7f}; largest relative difference {rel[worst]:.3g} at step {worst} "
      f"(tolerance {tol:g})")
if rel[worst] > tol:
    fail(f"relative difference {rel[worst]:.3g} > {tol:g}")
print(f"ok - {name}")
EOF
}

# the optimizer state rank 0 printed: N of "optimizer state N floats" in $out/NAME.out
state_of() { sed -n 's/.*optimizer state \([0-9]*\) floats.*/\1/p' "$out/$1.out" | head -n 1; }

# --- one rank on the GPU ---------------------------------------------------------------------
# NAME PRECISION: zero = 1 against zero = 0 eager, exactly (bf16: and against zero = 0's graphs)
one_rank() {
    local name=$1 prec=$2 n
    local args=(tiny.cfg batch_size=8 max_steps=50 epochs=10 precision="$prec")
    run "${prec}_z0e" "${args[@]}" zero=0 cuda_graph=false
    run "${prec}_z1" "${args[@]}" zero=1
    n=$(sed -n 's/^gpt: \([0-9]*\) parameters.*/\1/p' "$out/${prec}_z1.out")
    local wants=(zero=1 cuda_graph=false "+gpt: zero = 1 runs its GPU steps eagerly"
        "+optimizer state $((2 * ${n:-0})) floats")
    [ "$prec" = bf16 ] && wants+=("+bf16 activations")
    [ "$prec" = bf16 ] || {
        compare "$name" "${prec}_z1" "${prec}_z0e" 0 1 50 "${wants[@]}"
        return
    }
    run "${prec}_z0g" "${args[@]}" zero=0
    if compare "$name" "${prec}_z1" "${prec}_z0e" 0 1 50 "${wants[@]}" >"$out/$name.eager"; then
        grep -v '^ok - ' "$out/$name.eager"
        compare "$name" "${prec}_z1" "${prec}_z0g" 1e-3 1 50 cuda_graph=false
    else
        cat "$out/$name.eager"
        return 1
    fi
}
rc=0
one_rank zero_one_rank_gpt_bf16 bf16 || rc=1
one_rank zero_one_rank_gpt_fp32 fp32 || rc=1
run mlp_z0e mlp.cfg zero=0 cuda_graph=false
run mlp_z1 mlp.cfg zero=1
compare zero_one_rank_mlp mlp_z1 mlp_z0e 0 1 48 zero=1 cuda_graph=false \
    "+ddp: zero = 1 runs its GPU steps eagerly" || rc=1

# --- several ranks on the one GPU: thread-ranks ------------------------------------------------
CHECK_ONLY=gpu "$UNIT" >"$out/unit.txt" 2>&1
unit_rc=$?
# CHECK TEST: the unit test's verdict as a check, after its own lines (those between the
# previous verdict and its own)
unit_check() {
    local check=$1 test=$2
    awk -v t="$test" '/^(ok|not ok|skip) - / { if ($0 ~ (" - " t "$")) { found = 1; exit }
                                               buf = ""; next }
                      { buf = buf $0 "\n" } END { if (found) printf "%s", buf }' \
        "$out/unit.txt" | tail -n 12
    if grep -q "^ok - $test\$" "$out/unit.txt"; then
        echo "ok - $check"
        return 0
    fi
    if grep -q "^skip - $test\$" "$out/unit.txt"; then
        echo "not ok - $check: $test skipped on a machine with a GPU"
    elif grep -q "^not ok - $test\$" "$out/unit.txt"; then
        echo "not ok - $check: $test failed ($out/unit.txt)"
    else
        echo "not ok - $check: $test did not report (exit $unit_rc; $out/unit.txt)"
    fi
    return 1
}
unit_check zero_slice_optimizers test_slice_optimizers_on_the_gpu_match_the_whole_one || rc=1
unit_check zero_two_ranks_gpt_bf16 test_gpt_two_ranks_gpu_bf16 || rc=1
unit_check zero_two_ranks_gpt_fp32 test_gpt_two_ranks_gpu_fp32 || rc=1
unit_check zero_three_ranks_tail test_gpt_three_ranks_with_a_tail_gpu || rc=1
unit_check zero_two_ranks_mlp test_mlp_two_ranks_gpu || rc=1
unit_check zero_resume_two_ranks_at_one test_resume_at_world_1_gpu || rc=1

# --- ranks sharing the GPU under mgpu-launch (on the CPU), resumed on the GPU -----------------
# (GPU 0 alone visible, so that two ranks share it on a machine with more)
shared=(--nproc_per_node=2 --allow_gpu_sharing tiny.cfg batch_size=4 precision=fp32)
CUDA_VISIBLE_DEVICES=0 launch shared_z0 "${shared[@]}" max_steps=50 epochs=7 zero=0
CUDA_VISIBLE_DEVICES=0 launch shared_z1 "${shared[@]}" max_steps=50 epochs=7 zero=1
s0=$(state_of shared_z0)
s1=$(state_of shared_z1)
echo "  optimizer state on rank 0 of 2 ranks sharing the GPU: zero = 0 ${s0:-?} floats," \
    "zero = 1 ${s1:-?} floats"
if [ -z "$s0" ] || [ -z "$s1" ] || [ $((2 * s1)) -ne "$s0" ]; then
    echo "not ok - zero_shared_gpu_ranks: zero = 1's state is not half of zero = 0's" \
        "($out/shared_z1.out)"
    rc=1
else
    compare zero_shared_gpu_ranks shared_z1 shared_z0 1e-6 1 50 zero=1 world_size=2 \
        "+train on the CPU" cpu:shared_z1 cpu:shared_z0 || rc=1
fi
rm -f "$out/shared.ckpt"
CUDA_VISIBLE_DEVICES=0 launch shared_ref "${shared[@]}" epochs=4 zero=1
CUDA_VISIBLE_DEVICES=0 launch shared_first "${shared[@]}" epochs=2 zero=1 \
    checkpoint="$out/shared.ckpt"
run shared_resumed tiny.cfg batch_size=8 precision=fp32 epochs=4 zero=1 \
    checkpoint="$out/shared.ckpt"
compare zero_resume_shared_ranks_on_gpu shared_resumed shared_ref 1e-4 17 32 zero=1 \
    world_size=1 steps=32 "+resumed from $out/shared.ckpt at epoch 3, step 16" \
    cpu:shared_ref || rc=1

# --- two GPUs, where there are: NCCL's reduce-scatter and all-gather --------------------------
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "${ngpu:-0}" -lt 2 ]; then
    echo "  skip: fewer than 2 CUDA devices (${ngpu:-0})"
    echo "skip - zero_nccl_two_gpus"
else
    nccl=(--nproc_per_node=2 tiny.cfg batch_size=4 max_steps=50 epochs=7 precision=bf16)
    CUDA_VISIBLE_DEVICES=0,1 launch nccl_z0 "${nccl[@]}" zero=0 cuda_graph=false
    CUDA_VISIBLE_DEVICES=0,1 launch nccl_z1 "${nccl[@]}" zero=1
    s0=$(state_of nccl_z0)
    s1=$(state_of nccl_z1)
    echo "  optimizer state on rank 0 of 2 GPUs: zero = 0 ${s0:-?} floats," \
        "zero = 1 ${s1:-?} floats"
    if [ -z "$s0" ] || [ -z "$s1" ] || [ $((2 * s1)) -ne "$s0" ]; then
        echo "not ok - zero_nccl_two_gpus: zero = 1's state is not half of zero = 0's" \
            "($out/nccl_z1.out)"
        rc=1
    else
        # NCCL's reduce-scatter need not average as its all-reduce does: bf16's tolerance
        compare zero_nccl_two_gpus nccl_z1 nccl_z0 2e-3 1 50 zero=1 world_size=2 || rc=1
    fi
fi

echo "zero_checks: $(($(date +%s) - t0)) s"
exit $rc
