#!/usr/bin/env bash
# tests/bench/hosts_bench.sh - the ssh launch on 3 "hosts" (network namespaces with their own
# sshd, as tests/integration/test_hosts.sh makes them; root and Debian's openssh-server needed):
#
#   1. start to first step of a 3-host x 2-worker CPU job (configs/train.cfg, 20 steps): the
#      clock before the launcher starts to the first step's end as rank 0's metrics file says
#      it (first_step_unix_s); `mgpu-launch --hostfile` against the same job from 3 launchers
#      started by hand (one per namespace, as an admin's script would: no ssh), RUNS each,
#      alternating, median;
#   2. leftovers: KILL_RUNS times, a 3x2 job of workers that wait, the local launcher killed with
#      SIGKILL once all 6 run; the processes of the job (local ssh, the hosts' launchers and
#      workers) still alive 5 s later (their total over all runs), and the time until none was.
#
# usage: tests/bench/hosts_bench.sh [RUNS] [KILL_RUNS]   (default 5 50); MGPU_BUILD=build dir
set -u
here=$(cd "$(dirname "$0")" && pwd)
export MGPU_BUILD=${MGPU_BUILD:-$(cd "$here/../.." && pwd)/build}
export MGPU_ROOT=$(cd "$here/../.." && pwd)
RUNS=${1:-5}
KILL_RUNS=${2:-50}
work=$(mktemp -d)
cd "$work" || exit 1
export TEST_TMP=$work
source "$here/../integration/lib.sh"
source "$here/../integration/multinode/common.sh"
source "$here/../integration/multinode/sshd.sh"
trap 'mn_cleanup; cd /; rm -rf "$work"' EXIT

hosts_up 3
printf '%s slots=2\n' "${MN_ADDR[@]}" >hostfile
MARK=bench-$$ # in the job's processes only (through --export): not in this script's own pipes
EXPORTS=MGPU_SIM_GPUS,MGPU_TEST_MARK,TMPDIR
JOB=("$MGPU_ROOT/configs/train.cfg" max_steps=20 eval_interval=0 metrics_file=m.jsonl)

first_step() { "$PY3" -c 'import json,sys
print([json.loads(l) for l in open(sys.argv[1]) if "\"final\"" in l][0]["first_step_unix_s"])' m.jsonl; }
ms_since() { "$PY3" -c "print(round(($1 - $2) * 1000))"; }

: >ssh.ms
: >hand.ms
for i in $(seq 1 "$RUNS"); do
    port=$(free_port)
    rm -f m.jsonl
    t0=$(date +%s.%N)
    MGPU_TEST_MARK=$MARK start_node L "${MN_NS[0]}" --ssh "$SSH_CMD" --hostfile hostfile \
        --master_port "$port" --export "$EXPORTS" "${JOB[@]}"
    wait_node L 120
    [ "${MN_RC[L]}" = 0 ] || { cat err.L; fail "ssh run $i: exit ${MN_RC[L]}"; }
    ms_since "$(first_step)" "$t0" >>ssh.ms
    port=$(free_port)
    rm -f m.jsonl
    t0=$(date +%s.%N)
    for k in 2 1 0; do
        start_node $k "${MN_NS[$k]}" --nnodes=3 --node_rank=$k --master_addr="${MN_ADDR[0]}" \
            --master_port="$port" --nproc_per_node=2 --local_addr="${MN_ADDR[$k]}" \
            --rdzv_token=bench-token "${JOB[@]}"
    done
    for k in 0 1 2; do wait_node $k 120; [ "${MN_RC[$k]}" = 0 ] || { cat err.$k; fail "hand run $i: node $k exit ${MN_RC[$k]}"; }; done
    ms_since "$(first_step)" "$t0" >>hand.ms
done
# one bare ssh round trip to host 1, for scale (the remote shell's own start-up included)
t0=$(now_ms)
ip netns exec "${MN_NS[0]}" $SSH_CMD -o BatchMode=yes "${MN_ADDR[1]}" true || fail "ssh to host 1"
echo "one 'ssh HOST true' from host 0 to host 1: $(($(now_ms) - t0)) ms"
med() { sort -n "$1" | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
echo "start to first step, 3 hosts x 2 CPU workers, median of $RUNS: --hostfile over ssh $(med ssh.ms) ms ($(tr '\n' ' ' <ssh.ms)), 3 launchers by hand $(med hand.ms) ms ($(tr '\n' ' ' <hand.ms))"

left_total=0
: >gone.ms
for i in $(seq 1 "$KILL_RUNS"); do
    rm -f r.*
    port=$(free_port)
    MGPU_TEST_MARK=$MARK start_node L "${MN_NS[0]}" --ssh "$SSH_CMD" --hostfile hostfile \
        --master_port "$port" --export "$EXPORTS" "$TW" touch r.%r pause
    wait_until 60 all_exist r.0 r.1 r.2 r.3 r.4 r.5 || { cat err.L; fail "kill run $i: the workers did not start"; }
    t0=$(now_ms)
    kill -KILL "${MN_PID[L]}"
    wait "${MN_PID[L]}" 2>/dev/null
    until [ -z "$(procs_with_mark "$MARK")" ] || [ $(($(now_ms) - t0)) -ge 5000 ]; do sleep 0.02; done
    left=$(procs_with_mark "$MARK" | wc -l)
    left_total=$((left_total + left))
    echo $(($(now_ms) - t0)) >>gone.ms
    for p in $(procs_with_mark "$MARK"); do kill -KILL "$p" 2>/dev/null; done
done
echo "SIGKILL of the local launcher, $KILL_RUNS runs: $left_total processes left after 5 s in all; all gone after median $(med gone.ms) ms, max $(sort -n gone.ms | tail -1) ms"
