#!/usr/bin/env bash
# tests/gpu/profile_steps.sh - where a training step's time goes, kernel by kernel, on a GPU
# machine: Nsight Compute's gpu__time_duration of every kernel of mgpu-worker's steps
# (configs/bench_mlp.cfg in fp32 and tf32: two replayed steps after the first step's tuning;
# configs/bench_large_*.cfg: three steps), PyTorch's profiler over the same models, and the
# launcher's start-up steps (LOGLEVEL=debug) with 7, 8 and 16 workers. Kernels run one at a
# time under ncu, so the figures are the kernels' own durations without the gaps between them.
#
#   tests/gpu/profile_steps.sh OUTDIR     (MGPU_BUILD: build dir; PYTHON: default python3)
#
# Writes OUTDIR/<case>.csv (ncu's raw CSV) and prints a per-kernel summary of each.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
BUILD=${MGPU_BUILD:-$root/build}
OUT=${1:?usage: profile_steps.sh OUTDIR}
PY=${PYTHON:-python3}
NCU=${NCU:-ncu}
mkdir -p "$OUT"

summary() { # CSV: kernel name, launches, total and mean us
    "$PY" - "$1" <<'EOF'
import csv, sys, collections
rows = list(csv.reader(open(sys.argv[1])))
hdr = None
agg = collections.OrderedDict()
order = []
for r in rows:
    if "Kernel Name" in r and "Metric Name" in r:
        hdr = r
        continue
    if hdr is None or len(r) != len(hdr):
        continue
    d = dict(zip(hdr, r))
    if d.get("Metric Name") != "gpu__time_duration.sum":
        continue
    v = float(d["Metric Value"].replace(",", ""))
    unit = d.get("Metric Unit", "ns")
    us = v / 1000 if unit in ("nsecond", "ns") else v * 1000 if unit in ("msecond", "ms") else v
    name = d["Kernel Name"][:90]
    order.append((name, us))
    a = agg.setdefault(name, [0, 0.0])
    a[0] += 1
    a[1] += us
tot = sum(u for _, u in order)
print("  %d kernels, %.1f us in all" % (len(order), tot))
for name, (n, s) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
    print("  %8.1f us %4d x %7.2f us  %s" % (s, n, s / n, name))
print("  in order (the last 45):")
for name, us in order[-45:]:
    print("    %8.2f  %s" % (us, name))
EOF
}

ncu_case() { # NAME SKIP COUNT CFG [key=value ...]
    local name=$1 skip=$2 count=$3 cfg=$4
    shift 4
    echo "== $name"
    "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv --launch-skip "$skip" \
        --launch-count "$count" "$BUILD/bin/mgpu-worker" "$root/configs/$cfg" "$@" \
        >"$OUT/$name.csv" 2>"$OUT/$name.err"
    echo "  rc=$?"
    summary "$OUT/$name.csv"
}

# The first eager step tunes each GEMM (thousands of launches inside CUDA graphs): skip
# past it into the replayed steps. 40 epochs are 1600 steps of about 14 kernels, so the skip
# lands in the replays however many kernels a step has (8 epochs of a build that tuned
# nothing once gave "No kernels were profiled" at a skip of 3000).
ncu_case mlp_fp32 6000 28 bench_mlp.cfg epochs=40
ncu_case mlp_tf32 6000 28 bench_mlp.cfg epochs=40 precision=tf32
ncu_case large_bf16 0 600 bench_large_bf16.cfg epochs=3
ncu_case large_tf32 0 600 bench_large_tf32.cfg epochs=3

echo "== torch profiler"
"$PY" - "$root/tests/bench" <<'EOF'
import sys
import torch
from torch.profiler import profile, ProfilerActivity
sys.path.insert(0, sys.argv[1])
from torch_train_bench import build  # the same models, data and step as the benchmark

for case in ("mlp", "large_bf16", "large_tf32"):
    _, step, xs, ys = build(case)
    for i in range(3):
        step(xs[i % len(xs)], ys[i % len(ys)])
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for i in range(2):
            step(xs[i % len(xs)], ys[i % len(ys)])
        torch.cuda.synchronize()
    print("--", case)
    print(p.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=80))
EOF

echo "== launcher start-up steps, 7/8/16 workers of /bin/true, LOGLEVEL=debug"
for n in 7 8 16; do
    for i in 1 2 3; do
        t0=$(date +%s%N)
        LOGLEVEL=debug MGPU_SIM_GPUS=0 "$BUILD/bin/mgpu-launch" --nproc_per_node=$n -- /bin/true \
            >"$OUT/launch_${n}_$i.log" 2>&1
        t1=$(date +%s%N)
        echo "  $n workers run $i: $(((t1 - t0) / 1000)) us"
    done
done
