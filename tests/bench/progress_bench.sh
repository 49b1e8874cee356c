#!/usr/bin/env bash
# tests/bench/progress_bench.sh - what publishing progress costs (mgpu_progress_*, and the
# record of every collective), the calls alone and in a training step.
#
#   cpu (default): 1. ns per call (build/tests/progress_bench): the page attached to a shared
#                     file as under mgpu-launch, the private page of any other launcher, and
#                     MGPU_PROGRESS=0;
#                  2. the CPU main job (configs/train.cfg, mgpu-launch --nproc_per_node=4):
#                     rank 0's "step time" (host clock after a sync, over the steps after
#                     timing_warmup) with MGPU_PROGRESS=0 and 1, runs alternating.
#   gpu:           the GPU (b) step (configs/bench_mlp.cfg on one GPU, CUDA graph replay, as
#                  gpu_train_bench.sh runs it) with MGPU_PROGRESS=0 and 1, runs alternating.
# Prints the medians side by side, the overhead of 1 against 0, and the median of the
# overheads of each pair of runs (a 1 run against the 0 run just before it).
#
# usage: tests/bench/progress_bench.sh [cpu|gpu] [RUNS (default 7)]   (MGPU_BUILD: build dir)
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
BUILD=${MGPU_BUILD:-$root/build}
what=${1:-cpu}
RUNS=${2:-7}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# step_us MODE LOG CMD...: runs CMD with MGPU_PROGRESS=MODE and prints its "step time" in us
step_us() {
    local mode=$1 log=$2
    shift 2
    MGPU_PROGRESS=$mode "$@" >"$log" 2>&1 || { echo "failed (MGPU_PROGRESS=$mode): $*" >&2; tail -5 "$log" >&2; return 1; }
    grep -h 'step time:' "$log" | head -1 | sed -E 's/.*step time: ([0-9.]+) us.*/\1/'
}

# alternate NAME CMD...: RUNS runs each of MGPU_PROGRESS=0 and 1, alternating, then the medians
alternate() {
    local name=$1 i
    shift
    : >"$W/off" && : >"$W/on"
    for i in $(seq "$RUNS"); do
        step_us 0 "$W/run.log" "$@" >>"$W/off" || return 1
        step_us 1 "$W/run.log" "$@" >>"$W/on" || return 1
    done
    local off on
    off=$(median <"$W/off")
    on=$(median <"$W/on")
    # Each 1 run against the 0 run just before it: a machine whose load drifts during the
    # runs moves both alike.
    local paired
    paired=$(paste "$W/off" "$W/on" | awk '{ print 100 * ($2 - $1) / $1 }' | median)
    printf '%-34s %12s %12s %9s %9s\n' "$name" "$off" "$on" \
        "$(awk -v a="$off" -v b="$on" 'BEGIN { printf "%+.2f%%", 100 * (b - a) / a }')" \
        "$(awk -v p="$paired" 'BEGIN { printf "%+.2f%%", p }')"
    echo "  runs (us), MGPU_PROGRESS=0: $(tr '\n' ' ' <"$W/off")"
    echo "  runs (us), MGPU_PROGRESS=1: $(tr '\n' ' ' <"$W/on")"
}

echo "progress_bench $what: $(date -u '+%Y-%m-%d %H:%M UTC') on $(uname -n), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
case $what in
cpu)
    "$BUILD/tests/progress_bench" | tee "$W/calls" || exit 1
    # The bound: the page writes a step makes (moves, counted on the main job's rank 0 under
    # progress_peek) times the dearest attached call.
    "$BUILD/tests/progress_peek" -n 4 -i 1000 -- "$BUILD/bin/mgpu-worker" "$root/configs/train.cfg" \
        metrics_file= >"$W/peek" 2>&1 || { tail -5 "$W/peek"; exit 1; }
    awk '/^peek final slot=0/ { for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] } }
         END { printf "page writes per step (main job, rank 0): %.1f (%d moves over %d steps)\n",
               v["moves"] / v["step"], v["moves"], v["step"] }' "$W/peek" | tee "$W/writes"
    awk 'NR == FNR { if ($1 ~ /^mgpu_progress_(step|phase|label)$/ || $1 == "collective") {
                         x = ($1 == "collective") ? $3 : $2; if (x > m) m = x } ; next }
         /page writes per step/ { printf "bound: %.1f writes x %.1f ns = %.2f us per step\n", $9, m, $9 * m / 1000 }' \
        "$W/calls" "$W/writes"
    echo
    printf '%-34s %12s %12s %9s %9s\n' "step time, median of $RUNS (us)" "PROGRESS=0" "PROGRESS=1" "overhead" "paired"
    alternate "CPU main job, 1 rank" "$BUILD/bin/mgpu-worker" "$root/configs/train.cfg" \
        timing_warmup=50 metrics_file= || exit 1
    alternate "CPU main job, 4 ranks" "$BUILD/bin/mgpu-launch" --nproc_per_node=4 \
        "$root/configs/train.cfg" timing_warmup=50 metrics_file= || exit 1
    ;;
gpu)
    printf '%-34s %12s %12s %9s %9s\n' "step time, median of $RUNS (us)" "PROGRESS=0" "PROGRESS=1" "overhead" "paired"
    alternate "GPU (b) MLP, graph replay" "$BUILD/bin/mgpu-worker" "$root/configs/bench_mlp.cfg" \
        metrics_file= || exit 1
    alternate "GPU (b) MLP, eager" "$BUILD/bin/mgpu-worker" "$root/configs/bench_mlp.cfg" \
        metrics_file= cuda_graph=false || exit 1
    ;;
*)
    echo "usage: tests/bench/progress_bench.sh [cpu|gpu] [RUNS]" >&2
    exit 2
    ;;
esac
