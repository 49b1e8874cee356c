#!/usr/bin/env bash
# Scenario 3 of the article: --nproc_per_node=4 with CUDA_VISIBLE_DEVICES unset: every GPU is
# visible and local rank k runs on physical GPU k. On a machine with fewer than 4 GPUs (one,
# say) it runs one process per GPU there is, which shows the same thing.
source "$(dirname "$0")/scenario_lib.sh"
n=$(real_gpus)
if [ "${n:-0}" -ge 1 ] && [ "${n:-0}" -lt 4 ] && [ -z "${MGPU_SIM_GPUS:-}" ]; then
    echo "This machine has $n GPU(s): the scenario runs $n process(es), one per GPU."
    nproc=$n
else
    use_gpus 4
    nproc=4
fi
unset CUDA_VISIBLE_DEVICES
echo "The plan: local rank -> physical GPU"
plan $nproc | sed 's/^/    local rank /; s/ \([0-9]*\)$/ -> GPU \1/'
for ((k = 0; k < nproc; k++)); do
    expect "local rank $k runs on" "$(plan $nproc | awk -v k=$k '$1==k{print $2}')" $k
done
run_demo $nproc || { echo "the demo failed"; exit 1; }
expect "ranks that ran" "$(grep -c '^\[rank[0-9]*\]:local_rank' "$work/out")" $nproc
finish
