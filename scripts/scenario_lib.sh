# scenario_lib.sh - shared by scripts/scenario1.sh .. scenario4.sh: the article's four
# scenarios of local_rank, run with mgpu-launch and the article's demo (configs/demo.cfg).
#
# On a machine with GPUs the scenarios use them: with 5 or more, exactly the article's ids
# (CUDA_VISIBLE_DEVICES=1,2,3,4); with fewer, the ids that exist. Without GPUs (or with too
# few for a scenario) they simulate the article's 8-GPU machine (MGPU_SIM_GPUS=8) and say so.
# Each script exits 0 when it reproduced what it demonstrates, 1 when it did not.
set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LAUNCH=${MGPU_LAUNCH:-$root/build/bin/mgpu-launch}
DEMO=$root/configs/demo.cfg
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
[ -x "$LAUNCH" ] || { echo "no $LAUNCH: run make first" >&2; exit 2; }

# Real GPUs, as the launcher sees them (no CUDA initialised): the count of installed ones.
real_gpus() {
    env -u MGPU_SIM_GPUS -u CUDA_VISIBLE_DEVICES "$LAUNCH" --dry-run=json /bin/true 2>/dev/null |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["gpus_installed"])'
}

# use_gpus NEEDED: real GPUs when at least NEEDED are installed, else the simulated 8.
use_gpus() {
    local need=$1 n
    n=$(real_gpus)
    if [ "${n:-0}" -ge "$need" ] && [ -z "${MGPU_SIM_GPUS:-}" ]; then
        echo "This machine has $n GPU(s): the scenario runs on them."
        unset MGPU_SIM_GPUS
        GPUS=$n
    else
        echo "This machine has ${n:-0} GPU(s), fewer than the $need this scenario needs: it runs on"
        echo "a simulated 8-GPU machine like the article's (MGPU_SIM_GPUS=8; reports say 'simulated')."
        export MGPU_SIM_GPUS=8
        GPUS=8
    fi
}

# plan NPROC: the launcher's plan as "local_rank physical_gpu" lines (nothing is started).
plan() {
    "$LAUNCH" --nproc_per_node="$1" --dry-run=json "$DEMO" |
        python3 -c 'import json,sys
p = json.load(sys.stdin)
for w in p["workers"]:
    print(w["local_rank"], w["physical_gpu"] if w["physical_gpu"] is not None else "cpu")'
}

# run_demo NPROC [extra options]: runs the demo; its output in $work/out.
run_demo() {
    local n=$1; shift
    echo "\$ CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-<unset>} mgpu-launch --nproc_per_node=$n $* configs/demo.cfg"
    "$LAUNCH" -q --nproc_per_node="$n" "$@" "$DEMO" >"$work/out" 2>"$work/err"
    local rc=$?
    sed 's/^/    /' "$work/out"
    [ -s "$work/err" ] && sed 's/^/    /' "$work/err"
    return $rc
}

# batches RANK: the batch sizes rank RANK saw, "30 15"
batches() {
    grep "^\[rank$1\]:Outside: input size" "$work/out" | sed -E 's/.*size \[([0-9]+),.*/\1/' | tr '\n' ' ' | sed 's/ $//'
}

ok=1
expect() { # expect WHAT GOT WANTED
    if [ "$2" == "$3" ]; then echo "  ok: $1: $2"; else echo "  NOT REPRODUCED: $1: got '$2', expected '$3'"; ok=0; fi
}
finish() {
    if [ $ok -eq 1 ]; then echo "Reproduced."; exit 0; fi
    echo "Not reproduced."; exit 1
}
