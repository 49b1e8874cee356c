#!/usr/bin/env bash
# Scenario 2 of the article: CUDA_VISIBLE_DEVICES=1,2,3,4 and --nproc_per_node=4.
# Local ranks 0..3 on physical GPUs 1..4: local_rank is a process number, not a GPU number.
# 90 samples over 4 ranks: DistributedSampler pads to 92 (repeating samples from the start), so
# each rank gets 23 samples: one batch of 23.
source "$(dirname "$0")/scenario_lib.sh"
use_gpus 5
export CUDA_VISIBLE_DEVICES=1,2,3,4
echo "The plan: local rank -> physical GPU"
plan 4 | sed 's/^/    local rank /; s/ \([0-9]*\)$/ -> GPU \1/'
for k in 0 1 2 3; do
    expect "local rank $k runs on" "$(plan 4 | awk -v k=$k '$1==k{print $2}')" $((k + 1))
done
run_demo 4 || { echo "the demo failed"; exit 1; }
for k in 0 1 2 3; do expect "rank $k's batches" "$(batches $k)" "23"; done
finish
