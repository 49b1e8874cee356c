#!/usr/bin/env bash
# tests/gpu/trace_steps.sh - a training step's timeline as the GPU ran it: every kernel of
# mgpu-worker's replayed steps with its start and end relative to the step's first kernel,
# its stream and its duration, medians over the last 50 steps (build/lib/libmgpu_trace.so, a
# CUPTI injection library; `make` builds it where CUPTI is found). Unlike Nsight Compute
# (tests/gpu/profile_steps.sh), kernels run as they do in training: side streams overlap, and
# the gaps between dependent kernels show.
#
#   tests/gpu/trace_steps.sh OUTDIR [CASE ...]   (MGPU_BUILD: build dir; PYTHON: python3)
#
# CASE: mlp_fp32, mlp_tf32, linear, large_bf16, large_tf32, gpt_bf16, gpt_fp32 (GPT-2 124M of
# configs/bench_gpt_124m.cfg over tests/bench/gpt_torch_bench.py's synthetic tokens; its step
# has hundreds of kernels, so they are grouped by name), gpt_bf16:SHAPE and gpt_fp32:SHAPE
# (the model and batch of one of gpt_bench.sh's shapes: 124m, 124m-2k, 350m, 774m, h128, 1.5b)
# (default: the first three).
# Writes OUTDIR/<case>.csv (start_ns,end_ns,stream,kind,name) and prints each timeline.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
BUILD=${MGPU_BUILD:-$root/build}
OUT=${1:?usage: trace_steps.sh OUTDIR [CASE ...]}
shift
PY=${PYTHON:-python3}
LIB=$BUILD/lib/libmgpu_trace.so
[ -f "$LIB" ] || { echo "trace_steps: $LIB not built (CUPTI not found by make)" >&2; exit 2; }
mkdir -p "$OUT"
cases=("$@")
[ ${#cases[@]} -gt 0 ] || cases=(mlp_fp32 mlp_tf32 linear)

timeline() { # CSV
    "$PY" - "$1" <<'EOF'
import csv, sys, statistics as st
rows = []
for r in csv.DictReader(open(sys.argv[1])):
    rows.append((int(r["start_ns"]), int(r["end_ns"]), int(r["stream"]), r["kind"], r["name"]))
rows.sort()
# A step starts with its gather (gpustep.cu's gather_kernel), or, when it reads the data set
# in place, right after the previous step's optimizer update.
starts = [i for i, r in enumerate(rows) if "gather_kernel" in r[4]]
if len(starts) < 3:
    # (a large model's update is several kernels in a row: the step starts after the last)
    upd = lambda r: "sgd" in r[4].lower() or "adamw" in r[4].lower()
    starts = [i + 1 for i, r in enumerate(rows[:-1]) if upd(r) and not upd(rows[i + 1])]
if len(starts) < 3:
    print("  fewer than 3 steps traced"); sys.exit(0)
steps = [rows[a:b] for a, b in zip(starts, starts[1:])]
n = len(steps[-1])
same = [s for s in steps[-51:] if len(s) == n and
        [x[4] for x in s] == [x[4] for x in steps[-1]]]
last = steps[-51:]
period = [b[0][0] - a[0][0] for a, b in zip(last, last[1:])]
print("  %d steps traced; the last %d alike (%d kernels each); step period median %.2f us "
      "(min %.2f, max %.2f)" % (len(steps), len(same), n, st.median(period) / 1e3,
                                min(period) / 1e3, max(period) / 1e3))
streams = {}
for x in steps[-1]:
    streams.setdefault(x[2], len(streams))
if n > 60:
    # A long step (a GPT's): the kernels grouped by name, the largest total first.
    busy = st.median(sum(x[1] - x[0] for x in s) for s in same)
    groups = {}
    for i in range(n):
        d = st.median(s[i][1] - s[i][0] for s in same)
        g = groups.setdefault(steps[-1][i][4][:100], [0, 0.0])
        g[0] += 1
        g[1] += d
    print("  kernels' busy time a step %.2f us (%.1f%% of the period)"
          % (busy / 1e3, 100.0 * busy / st.median(period)))
    print("  %6s %10s %6s  %s" % ("calls", "us", "share", "name"))
    for name, (c, d) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
        print("  %6d %10.2f %5.1f%%  %s" % (c, d / 1e3, 100.0 * d / busy, name))
    sys.exit(0)
print("  %8s %8s %8s  %s  %s" % ("start", "end", "us", "stream", "name"))
for i in range(n):
    s0 = st.median(s[i][0] - s[0][0] for s in same)
    e0 = st.median(s[i][1] - s[0][0] for s in same)
    d = st.median(s[i][1] - s[i][0] for s in same)
    x = steps[-1][i]
    print("  %8.2f %8.2f %8.2f  s%-5d %s" % (s0 / 1e3, e0 / 1e3, d / 1e3, streams[x[2]], x[4][:100]))
EOF
}

run_case() { # NAME CFG [key=value ...]
    local name=$1 cfg=$2
    shift 2
    echo "== $name"
    CUDA_INJECTION64_PATH=$LIB MGPU_TRACE_OUT="$OUT/$name.csv" \
        "$BUILD/bin/mgpu-worker" "$root/configs/$cfg" "$@" >"$OUT/$name.log" 2>&1
    echo "  rc=$?"
    timeline "$OUT/$name.csv"
}

for c in "${cases[@]}"; do
    case $c in
    mlp_fp32) run_case mlp_fp32 bench_mlp.cfg epochs=8 ;;
    mlp_tf32) run_case mlp_tf32 bench_mlp.cfg epochs=8 precision=tf32 ;;
    linear) run_case linear bench_linear.cfg epochs=100 ;;
    large_bf16) run_case large_bf16 bench_large_bf16.cfg epochs=6 ;;
    large_tf32) run_case large_tf32 bench_large_tf32.cfg epochs=6 ;;
    gpt_bf16 | gpt_fp32 | gpt_bf16:* | gpt_fp32:*)
        tokens=$OUT/tokens_50304.bin
        [ -f "$tokens" ] || "$PY" "$root/tests/bench/gpt_torch_bench.py" tokens "$tokens" 8388609 \
            50304 >/dev/null || exit 2
        prec=${c%%:*}
        prec=${prec#gpt_}
        shape=124m
        [[ $c == *:* ]] && shape=${c#*:}
        # the benchmark's model and batch for the shape (gpt_bench.sh's table)
        IFS=$'\t' read -r _ _ cfg args < <("$PY" "$root/tests/bench/gpt_torch_bench.py" spec \
            "$prec" 1 "$shape") || exit 2
        # shellcheck disable=SC2086 # args: key=value words
        run_case "${c/:/_}" "$cfg" $args data_tokens="$tokens" max_steps=80 timing_warmup=10 \
            log_interval=0 ;;
    *) echo "trace_steps: unknown case '$c' (expected mlp_fp32, mlp_tf32, linear, large_bf16, large_tf32, gpt_bf16[:SHAPE], gpt_fp32[:SHAPE])" >&2; exit 2 ;;
    esac
done
