#!/usr/bin/env bash
# scripts/main_job.sh - the main job: configs/train.cfg with 4 workers, on GPUs where there
# are some (one worker per GPU when fewer than 4 are visible: mgpu-launch refuses more workers
# than GPUs), on CPU workers otherwise. It prints the command it runs.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
launch=$root/build/bin/mgpu-launch
[ -x "$launch" ] || { echo "main_job.sh: no $launch: run make first" >&2; exit 2; }
gpus=$("$launch" --dry-run=json /bin/true | python3 -c 'import json,sys; print(json.load(sys.stdin)["gpus_visible"])')
nproc=4
[ "$gpus" -ge 1 ] && [ "$gpus" -lt 4 ] && nproc=$gpus
echo "+ mgpu-launch --nproc_per_node=$nproc configs/train.cfg   ($gpus GPU(s) visible)"
exec "$launch" --nproc_per_node=$nproc "$root/configs/train.cfg" "$@"
