#!/usr/bin/env bash
# tests/bench/gpu_train_bench.sh - mgpu-worker's training step on one GPU against PyTorch, in
# one go on the same machine, and start-to-first-step of mgpu-launch + mgpu-worker against
# torchrun + the PyTorch script. Prints a table of figures and ratios last.
#
#   1. step time (forward, backward, SGD step), world size 1, the models of
#      configs/bench_linear.cfg (a), bench_mlp.cfg (b), bench_large_tf32.cfg and
#      bench_large_bf16.cfg (c): mgpu-worker's "step time" (CUDA events over the steps after
#      timing_warmup; CUDA graph replay where the step is eligible) against PyTorch eager and
#      torch.compile(mode="reduce-overhead") (tests/bench/torch_train_bench.py). (a) and (b)
#      also run mgpu-worker eagerly (cuda_graph=false) for reference, and (b) runs a second
#      time with TF32 GEMMs on both sides (mlp_tf32).
#   2. the peak reference of (c): bare 8192^3 matmuls through PyTorch in the same run.
#   3. start to first step, RUNS times each (median): the host clock before the launcher
#      starts to the end of the first step (after a device sync), as each worker reports it
#      (mgpu: the final metrics object's first_step_unix_s; PyTorch: its JSON line), the
#      model of (b); torchrun's worker joins an NCCL process group and wraps the model in DDP
#      as a torchrun script does, mgpu-worker with world size 1 needs no communicator.
# Targets: (a), (b) <= 0.05x PyTorch eager's step time; (c) >= 1.05x PyTorch's
# throughput; first step <= 0.5x torchrun's.
#
# usage: tests/bench/gpu_train_bench.sh [OUTDIR]   (MGPU_BUILD: build dir, RUNS: default 3,
#        PYTHON: default python3, SKIP_TORCH_COMPILE=1 to leave out the compiled variant,
#        TORCH_COMPILE_BUDGET_S=S to skip the compiled variants left after S seconds)
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
BUILD=${MGPU_BUILD:-$root/build}
OUT=${1:-$(mktemp -d)}
RUNS=${RUNS:-3}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
W=$OUT/work
mkdir -p "$W"
log=$OUT/bench.log
: >"$log"

say() { echo "$@" | tee -a "$log"; }
diff_s() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "nan") print "nan"; else printf "%.3f\n", a - b }'; }
source "$root/tests/gpu/lib.sh" # json_last

say "gpu_train_bench: $(date -u '+%Y-%m-%d %H:%M UTC') on $(uname -n)"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader 2>&1 | sed 's/^/  gpu: /' | tee -a "$log"
"$PY" -c 'import torch; print("  torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())' 2>&1 | tee -a "$log"

# --- 1. mgpu-worker ----------------------------------------------------------------------------
mgpu_case() { # NAME CFG [key=value ...]
    local name=$1 cfg=$2
    shift 2
    local t0 t1
    t0=$(date +%s.%N)
    "$BUILD/bin/mgpu-worker" "$root/configs/$cfg" metrics_file="$W/$name.jsonl" "$@" \
        >"$W/$name.out" 2>&1
    local rc=$?
    t1=$(date +%s.%N)
    say "  mgpu $name: rc $rc, $(grep -h 'step time' "$W/$name.out"), wall $(diff_s "$t1" "$t0")s"
    [ $rc -eq 0 ] || sed 's/^/    /' "$W/$name.out" | tail -5 | tee -a "$log"
}
say "1. mgpu-worker"
mgpu_case linear bench_linear.cfg
mgpu_case linear_eager bench_linear.cfg cuda_graph=false
mgpu_case mlp bench_mlp.cfg
mgpu_case mlp_eager bench_mlp.cfg cuda_graph=false
mgpu_case mlp_tf32 bench_mlp.cfg precision=tf32
mgpu_case large_tf32 bench_large_tf32.cfg
mgpu_case large_bf16 bench_large_bf16.cfg

# --- 1b, 2. PyTorch ----------------------------------------------------------------------------
say "2. PyTorch"
"$PY" "$here/torch_train_bench.py" peak 2>"$W/torch_peak.err" | tee "$W/torch.jsonl" | tee -a "$log"
tail -3 "$W/torch_peak.err" >>"$log"
if [ "${SKIP_TORCH_COMPILE:-0}" = 1 ]; then
    export TORCH_BENCH_NO_COMPILE=1
fi
"$PY" "$here/torch_train_bench.py" steps linear mlp mlp_tf32 large_tf32 large_bf16 2>"$W/torch_steps.err" |
    tee -a "$W/torch.jsonl" | tee -a "$log"
grep -v Warning "$W/torch_steps.err" | tail -5 >>"$log"

# --- 3. start to first step ----------------------------------------------------------------------
say "3. start to first step (model of (b)), $RUNS runs each"
: >"$W/first_mgpu"
: >"$W/first_torch"
for i in $(seq "$RUNS"); do
    rm -f "$W/first.jsonl"
    t0=$(date +%s.%N)
    "$BUILD/bin/mgpu-launch" --nproc_per_node=1 "$root/configs/bench_mlp.cfg" max_steps=1 \
        timing_warmup=0 metrics_file="$W/first.jsonl" >"$W/first_mgpu.out" 2>&1
    t1=$(json_last "$W/first.jsonl" first_step_unix_s)
    diff_s "$t1" "$t0" >>"$W/first_mgpu"
    t0=$(date +%s.%N)
    "$PY" -m torch.distributed.run --nproc_per_node=1 "$here/torch_train_bench.py" first_step mlp \
        >"$W/first_torch.out" 2>&1
    t1=$(json_last "$W/first_torch.out" first_step_unix_s)
    diff_s "$t1" "$t0" >>"$W/first_torch"
done
say "  mgpu-launch + mgpu-worker: $(tr '\n' ' ' <"$W/first_mgpu")s"
say "  torchrun + PyTorch:        $(tr '\n' ' ' <"$W/first_torch")s"
tail -3 "$W/first_torch.out" >>"$log"

# --- table -------------------------------------------------------------------------------------
"$PY" - "$W" <<'EOF' | tee -a "$log"
import json, statistics, sys
W = sys.argv[1]
def last(path, key):
    v = None
    try:
        for l in open(path):
            try:
                o = json.loads(l)
            except Exception:
                continue
            if key in o:
                v = o[key]
    except OSError:
        pass
    return v
torch = {}
peak = {}
for l in open(W + "/torch.jsonl"):
    try:
        o = json.loads(l)
    except Exception:
        continue
    if o.get("case") == "matmul_8192":
        peak[o["precision"]] = o["tflops"]
    elif "step_us" in o:
        torch[(o["case"], o["variant"])] = o
flops = {"large_tf32": 11 * 2 * 8192.0 ** 3, "large_bf16": 11 * 2 * 8192.0 ** 3}
print()
print("| case | mgpu step us | graph | torch eager us | torch compile us | mgpu/eager time | mgpu/compile time |")
print("| --- | ---: | --- | ---: | ---: | ---: | ---: |")
for case in ("linear", "mlp", "mlp_tf32", "large_tf32", "large_bf16"):
    us = last(f"{W}/{case}.jsonl", "step_us")
    g = last(f"{W}/{case}.jsonl", "cuda_graph")
    te = torch.get((case, "eager"), {}).get("step_us")
    tc = torch.get((case, "compile"), {}).get("step_us")
    r = lambda a, b: f"{a / b:.3f}x" if a and b else "-"
    f = lambda v: f"{v:.2f}" if v else "-"
    print(f"| {case} | {f(us)} | {g} | {f(te)} | {f(tc)} | {r(us, te)} | {r(us, tc)} |")
    if case in ("linear", "mlp"):
        ue = last(f"{W}/{case}_eager.jsonl", "step_us")
        print(f"| {case} (mgpu eager) | {f(ue)} | False | {f(te)} | {f(tc)} | {r(ue, te)} | {r(ue, tc)} |")
print()
print("| case | mgpu TFLOP/s | torch eager TFLOP/s | torch compile TFLOP/s | bare matmul TFLOP/s | mgpu/eager throughput | mgpu/compile | mgpu % of matmul |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for case in ("large_tf32", "large_bf16"):
    us = last(f"{W}/{case}.jsonl", "step_us")
    m = flops[case] / (us * 1e-6) / 1e12 if us else None
    te = torch.get((case, "eager"), {}).get("tflops")
    tc = torch.get((case, "compile"), {}).get("tflops")
    p = peak.get(case.split("_")[1])
    f = lambda v: f"{v:.1f}" if v else "-"
    r = lambda a, b: f"{a / b:.3f}x" if a and b else "-"
    pc = f"{100 * m / p:.1f}%" if m and p else "-"
    print(f"| {case} | {f(m)} | {f(te)} | {f(tc)} | {f(p)} | {r(m, te)} | {r(m, tc)} | {pc} |")
def med(path):
    v = []
    for l in open(path):
        try:
            v.append(float(l))
        except ValueError:
            pass
    return statistics.median(v) if v else None
a, b = med(W + "/first_mgpu"), med(W + "/first_torch")
print()
if a and b:
    print(f"start to first step (median): mgpu-launch + mgpu-worker {a:.3f} s, torchrun + PyTorch {b:.3f} s, ratio {a / b:.3f}x")
EOF
