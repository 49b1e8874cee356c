#!/usr/bin/env bash
# tests/bench/collectives_bench.sh [cpu|nccl] [RANKS ...] - libmgpu's all-reduce,
# reduce-scatter and all-gather for every dtype and reduction, nccl-tests style, with the
# workers started by mgpu-launch: for each rank count (cpu default: 2 4; nccl default: every
# visible GPU, "gpu"), one run of build/tests/collectives_bench, whose table is printed with
# the host and the command. Every size checks its own results (#wrong); any wrong element or
# failed call fails the script.
#
# Environment: MGPU_BUILD (default build/), OPS, DTYPES, REDOPS (lists, default all), MIN,
#   MAX (default 4K, 16M), STEP (default 4), SECONDS_PER_SIZE (timed seconds per size,
#   default 0.05). Needs: make (CUDA build for nccl).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${MGPU_BUILD:-$root/build}
bin=$build/tests/collectives_bench
launch=$build/bin/mgpu-launch
backend=cpu
case "${1:-}" in cpu | nccl) backend=$1; shift ;; esac
if [ "$backend" = nccl ]; then ranks=${*:-gpu}; else ranks=${*:-2 4}; fi

for f in "$bin" "$launch"; do
    [ -x "$f" ] || { echo "collectives_bench.sh: $f missing: run make first" >&2; exit 2; }
done
args=(--backend "$backend" --ops "${OPS:-all}" --dtypes "${DTYPES:-all}" --redops "${REDOPS:-all}"
    --min "${MIN:-4K}" --max "${MAX:-16M}" --step "${STEP:-4}" --seconds "${SECONDS_PER_SIZE:-0.05}")

echo "# host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), kernel $(uname -r)"
if [ "$backend" = nccl ] && command -v nvidia-smi >/dev/null; then
    echo "# GPUs: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | sort | uniq -c | tr -s ' ' | paste -sd';')"
fi
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'); load average: $(cut -d' ' -f1-3 /proc/loadavg)"
status=0
for n in $ranks; do
    echo "# mgpu-launch --nproc_per_node=$n --no_prefix --local_ranks_filter=0 -- collectives_bench ${args[*]}"
    "$launch" --nproc_per_node="$n" --no_prefix --local_ranks_filter=0 -q -- "$bin" "${args[@]}" ||
        { echo "collectives_bench.sh: $n ranks: exit status $?" >&2; status=1; }
done
exit $status
