#!/usr/bin/env bash
# Scenario 4 of the article: --nproc_per_node=5 with 4 visible GPUs. In PyTorch, rank 4 dies in
# torch.cuda.set_device(4) with "invalid device ordinal" after the others started. mgpu-launch
# refuses before it starts anything, naming the visible devices and why (exit 2). With
# --allow_gpu_sharing it runs anyway and says local rank 4 shares ordinal 0 (4 mod 4).
# On a one-GPU machine: --nproc_per_node=2 on that GPU, the same refusal for real.
source "$(dirname "$0")/scenario_lib.sh"
n=$(real_gpus)
if [ "${n:-0}" -ge 1 ] && [ "${n:-0}" -lt 5 ] && [ -z "${MGPU_SIM_GPUS:-}" ]; then
    echo "This machine has $n GPU(s): all visible, and one process more than GPUs."
    unset CUDA_VISIBLE_DEVICES
    vis=$n
else
    use_gpus 5
    export CUDA_VISIBLE_DEVICES=1,2,3,4
    vis=4
fi
nproc=$((vis + 1))
run_demo $nproc
rc=$?
expect "exit status of the refusal" "$rc" 2
expect "the refusal names the count" "$(grep -c "nproc_per_node=$nproc but only $vis" "$work/err")" 1
expect "nothing started" "$(wc -l <"$work/out")" 0
echo "With --allow_gpu_sharing, local rank k runs on ordinal k mod $vis:"
plan_sharing() {
    "$LAUNCH" --nproc_per_node=$nproc --allow_gpu_sharing --dry-run=json "$DEMO" |
        python3 -c 'import json,sys
for w in json.load(sys.stdin)["workers"]: print(w["local_rank"], w["cuda_ordinal"])'
}
plan_sharing | sed 's/^/    local rank /; s/ \([0-9]*\)$/ -> ordinal \1/'
expect "local rank $vis shares ordinal" "$(plan_sharing | awk -v k=$vis '$1==k{print $2}')" 0
run_demo $nproc --allow_gpu_sharing || { echo "the shared run failed"; exit 1; }
expect "ranks that ran with sharing" "$(grep -c '^\[rank[0-9]*\]:local_rank' "$work/out")" $nproc
finish
