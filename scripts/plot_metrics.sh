#!/usr/bin/env bash
# plot_metrics.sh METRICS.jsonl [OUT.png] - plots a run's metrics_file (JSON lines written by
# mgpu-worker's rank 0) with gnuplot: training loss by step on the left axis, held-out
# accuracy (or loss, for mse) by step on the right. Needs gnuplot and jq.
set -euo pipefail
in=${1:?usage: plot_metrics.sh METRICS.jsonl [OUT.png]}
out=${2:-${in%.jsonl}.png}
for tool in gnuplot jq; do
    command -v "$tool" >/dev/null || { echo "plot_metrics.sh: $tool not found (apt-get install $tool)" >&2; exit 2; }
done
[ -r "$in" ] || { echo "plot_metrics.sh: cannot read $in" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# One two-column table per series; lines without the field are skipped, the final line too.
jq -r 'select(.loss != null and .final != true) | "\(.step) \(.loss)"' "$in" >"$tmp/loss"
jq -r 'select(.eval_accuracy != null and .final != true) | "\(.step) \(.eval_accuracy * 100)"' "$in" >"$tmp/acc"
jq -r 'select(.eval_loss != null and .final != true) | "\(.step) \(.eval_loss)"' "$in" >"$tmp/eloss"
final=$(jq -r 'select(.final == true) | "world size \(.world_size // 1), \(.steps) steps, \(.samples_per_s | floor) samples/s"' "$in" | tail -n 1)
[ -s "$tmp/loss" ] || [ -s "$tmp/eloss" ] || { echo "plot_metrics.sh: no loss lines in $in (log_interval = 0?)" >&2; exit 1; }
plots=()
y2=""
[ -s "$tmp/loss" ] && plots+=("'$tmp/loss' using 1:2 with lines lw 2 title 'training loss' axes x1y1")
if [ -s "$tmp/acc" ]; then
    plots+=("'$tmp/acc' using 1:2 with linespoints lw 2 pt 7 title 'held-out accuracy (%)' axes x1y2")
    y2="set y2label 'accuracy (%)'; set y2tics; set ytics nomirror"
elif [ -s "$tmp/eloss" ]; then
    plots+=("'$tmp/eloss' using 1:2 with linespoints lw 2 pt 7 title 'held-out loss' axes x1y1")
fi
spec=$(IFS=,; echo "${plots[*]}")
gnuplot <<GP
set terminal pngcairo size 900,540 enhanced font 'sans,11'
set output '$out'
set title "$(basename "$in")${final:+ — $final}" noenhanced
set xlabel 'step'
set ylabel 'loss'
$y2
set grid
set key center right
plot $spec
GP
echo "wrote $out"
