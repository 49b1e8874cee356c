#!/usr/bin/env bash
# Scenario 1 of the article: CUDA_VISIBLE_DEVICES=1,2,3,4 and --nproc_per_node=2.
# Two processes, local ranks 0 and 1; each sees 4 GPUs ("Let's use 4 GPUs!") but uses one:
# local rank k runs on visible ordinal k, physical GPU k+1. DistributedSampler gives each rank
# 90/2 = 45 samples: a batch of 30, then one of 15.
source "$(dirname "$0")/scenario_lib.sh"
use_gpus 5
export CUDA_VISIBLE_DEVICES=1,2,3,4
echo "The plan: local rank -> physical GPU"
plan 2 | sed 's/^/    local rank /; s/ \([0-9]*\)$/ -> GPU \1/'
expect "local rank 0 runs on" "$(plan 2 | awk '$1==0{print $2}')" 1
expect "local rank 1 runs on" "$(plan 2 | awk '$1==1{print $2}')" 2
run_demo 2 || { echo "the demo failed"; exit 1; }
expect "GPUs each rank sees" "$(grep -c "Let's use 4 GPUs!" "$work/out")" 2
expect "rank 0's batches" "$(batches 0)" "30 15"
expect "rank 1's batches" "$(batches 1)" "30 15"
finish
