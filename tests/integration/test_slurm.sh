# test_slurm.sh - mgpu-launch under Slurm: nnodes, node rank, node 0's address and the
# run id come from SLURM_* when not given, explicit options win, --dry-run says what was
# derived. First without a cluster (fake SLURM_* variables), then for real: a one-node cluster
# of Debian's slurm-wlm (slurmctld + slurmd, munge with a private key and socket) started by the
# test in its scratch folder, a job run through srun, and every daemon stopped by its pid.

source "$(dirname "${BASH_SOURCE[0]}")/multinode/common.sh"

# dry_json VAR=VALUE... -- ARGS...: mgpu-launch --dry-run=json under those variables
dry_json() {
    local vars=()
    while [ "$1" != -- ]; do vars+=("$1"); shift; done
    shift
    env "${vars[@]}" "$LAUNCH" --dry-run=json "$@" >out 2>err
    rc=$?
}
# jget KEY...: top-level keys of the JSON in ./out, joined by "/"
jget() { "$PY3" -c 'import json,sys; d=json.load(open("out")); print("/".join(str(d[k]) for k in sys.argv[1:]))' "$@"; }

t_slurm_env_derivation() {
    dry_json SLURM_NNODES=2 SLURM_NODEID=1 'SLURM_JOB_NODELIST=node[3-4]' SLURM_JOB_ID=77 -- \
        --nproc_per_node=1 "$TW" exit 0
    expect_eq "$rc" 0 "dry run ($(cat err))"
    # nnodes from SLURM_NNODES, node_rank from SLURM_NODEID, master_addr the first host of
    # SLURM_JOB_NODELIST, run id from SLURM_JOB_ID
    expect_eq "$(jget nnodes node_rank master_addr run_id)" 2/1/node3/slurm-77 "nnodes/node_rank/master_addr/run_id"
    expect_grep "$(jget derived)" 'SLURM_NNODES'
    "$PY3" -c 'import json
d = json.load(open("out")); e = d["workers"][0]["env"]
assert e["GROUP_RANK"] == "1" and e["MASTER_ADDR"] == "node3" and e["TORCHELASTIC_RUN_ID"] == "slurm-77", e
' || fail "worker env of the plan: $(cat out)"
    # the text form says where it came from
    env SLURM_NNODES=2 SLURM_NODEID=1 'SLURM_JOB_NODELIST=node[3-4]' SLURM_JOB_ID=77 \
        "$LAUNCH" --dry-run --nproc_per_node=1 "$TW" exit 0 >out.txt 2>&1
    expect_grep out.txt 'from the environment'
    expect_grep out.txt 'node_rank=1 \(SLURM_NODEID\)'
}

t_slurm_env_host_lists_and_steps() {
    # zero-padded ranges, several groups, the step's node list and id
    dry_json SLURM_NNODES=3 SLURM_NODEID=2 'SLURM_JOB_NODELIST=gpu[01-02,05]' SLURM_JOB_ID=5 -- \
        --nproc_per_node=1 "$TW" exit 0
    expect_eq "$rc/$(jget master_addr)/$(jget node_rank)" 0/gpu01/2 "gpu[01-02,05]"
    dry_json SLURM_NNODES=3 SLURM_NODEID=0 'SLURM_JOB_NODELIST=a1,b[2-3]' SLURM_JOB_ID=5 -- \
        --nproc_per_node=1 "$TW" exit 0
    expect_eq "$rc/$(jget master_addr)" 0/a1 "a1,b[2-3]"
    dry_json SLURM_NNODES=4 SLURM_STEP_NUM_NODES=2 SLURM_NODEID=1 'SLURM_JOB_NODELIST=n[1-4]' \
        'SLURM_STEP_NODELIST=n[3-4]' SLURM_JOB_ID=9 SLURM_STEP_ID=2 -- --nproc_per_node=1 "$TW" exit 0
    expect_eq "$rc/$(jget nnodes master_addr run_id)" 0/2/n3/slurm-9.2 "a step on 2 of the job's 4 nodes"
}

t_slurm_env_explicit_options_win() {
    dry_json SLURM_NNODES=2 SLURM_NODEID=1 'SLURM_JOB_NODELIST=node[3-4]' SLURM_JOB_ID=77 -- \
        --nnodes=3 --node_rank=2 --master_addr=10.1.2.3 --rdzv_id=mine --nproc_per_node=1 "$TW" exit 0
    expect_eq "$rc" 0 "dry run ($(cat err))"
    expect_eq "$(jget nnodes node_rank master_addr run_id)" 3/2/10.1.2.3/mine \
        "explicit options over SLURM_*"
    # a node id that does not fit the node count is a usage error
    dry_json SLURM_NNODES=2 SLURM_NODEID=2 'SLURM_JOB_NODELIST=node[3-4]' -- --nproc_per_node=1 "$TW" exit 0
    expect_eq "$rc" 2 "SLURM_NODEID=2 of 2 nodes"
    expect_grep err 'node rank 2'
    # a broken node list is a usage error too, named
    dry_json SLURM_NNODES=2 SLURM_NODEID=0 'SLURM_JOB_NODELIST=node[3-' -- --nproc_per_node=1 "$TW" exit 0
    expect_eq "$rc" 2 "an unbalanced SLURM_JOB_NODELIST"
    expect_grep err 'node\[3-'
}

# ------------------------------------------------------------------ a real one-node cluster

SL_DIR="" SL_PIDFILES=()
mn_extra_cleanup() {
    [ -n "$SL_DIR" ] || return 0
    SLURM_CONF=$SL_DIR/slurm.conf scancel --user="$(id -un)" >/dev/null 2>&1
    local f p left
    for f in "${SL_PIDFILES[@]}"; do
        p=$(cat "$f" 2>/dev/null) && [ -n "$p" ] && kill -TERM "$p" 2>/dev/null
    done
    for f in "${SL_PIDFILES[@]}"; do
        p=$(cat "$f" 2>/dev/null) || continue
        [ -n "$p" ] || continue
        wait_until 10 eval "! alive $p" || kill -KILL "$p" 2>/dev/null
    done
    left=$(for f in "${SL_PIDFILES[@]}"; do p=$(cat "$f" 2>/dev/null) && alive "$p" && echo "$p"; done)
    [ -z "$left" ] || echo "daemons still running: $left" >&2
    SL_DIR=""
}

# slurm_cluster_start: munged, slurmctld and slurmd of a one-node cluster in ./slurm; exports
# SLURM_CONF. Skips when the packages are missing or the daemons cannot start here.
slurm_cluster_start() {
    local c
    export PATH=$PATH:/usr/sbin:/sbin # munged, slurmctld, slurmd
    for c in munged munge slurmctld slurmd srun sinfo scancel; do
        command -v $c >/dev/null || skip "no $c here (apt-get install slurm-wlm munge)"
    done
    [ "$(id -u)" = 0 ] || skip "the test cluster runs its daemons as root"
    SL_DIR=$PWD/slurm
    mkdir -p "$SL_DIR"/{munge,state,spool,log,run}
    chmod 700 "$SL_DIR/munge"
    # munge: a private 1024-byte key, socket, pid and log in the scratch folder
    head -c 1024 /dev/urandom >"$SL_DIR/munge/munge.key"
    chmod 400 "$SL_DIR/munge/munge.key"
    SL_PIDFILES+=("$SL_DIR/munge/munged.pid")
    munged -f --socket="$SL_DIR/munge/munge.sock" --key-file="$SL_DIR/munge/munge.key" \
        --log-file="$SL_DIR/munge/munged.log" --pid-file="$SL_DIR/munge/munged.pid" \
        --seed-file="$SL_DIR/munge/munged.seed" >"$SL_DIR/munge/start.log" 2>&1 ||
        skip "munged does not start here: $(tail -n 3 "$SL_DIR/munge/start.log" "$SL_DIR/munge/munged.log" 2>/dev/null | tr '\n' ' ')"
    wait_until 10 eval "munge -S '$SL_DIR/munge/munge.sock' -n | unmunge -S '$SL_DIR/munge/munge.sock' | grep -q Success" ||
        skip "munge does not work here: $(tail -n 3 "$SL_DIR/munge/munged.log")"
    local host; host=$(hostname -s)
    local cport dport; cport=$(free_port) dport=$(free_port)
    while [ "$dport" = "$cport" ]; do dport=$(free_port); done
    cat >"$SL_DIR/slurm.conf" <<EOF
ClusterName=mgputest
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$SL_DIR/munge/munge.sock
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmctldPort=$cport
SlurmdPort=$dport
StateSaveLocation=$SL_DIR/state
SlurmdSpoolDir=$SL_DIR/spool
SlurmctldPidFile=$SL_DIR/run/slurmctld.pid
SlurmdPidFile=$SL_DIR/run/slurmd.pid
SlurmctldLogFile=$SL_DIR/log/slurmctld.log
SlurmdLogFile=$SL_DIR/log/slurmd.log
JobCompType=jobcomp/none
NodeName=$host CPUs=$(nproc) State=UNKNOWN
PartitionName=mgpu Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
    export SLURM_CONF=$SL_DIR/slurm.conf
    SL_PIDFILES+=("$SL_DIR/run/slurmctld.pid" "$SL_DIR/run/slurmd.pid")
    slurmctld -f "$SLURM_CONF" >"$SL_DIR/log/start.log" 2>&1 ||
        skip "slurmctld does not start here: $(tail -n 5 "$SL_DIR/log/start.log" "$SL_DIR/log/slurmctld.log" 2>/dev/null | tr '\n' ' ')"
    slurmd -f "$SLURM_CONF" >>"$SL_DIR/log/start.log" 2>&1 ||
        skip "slurmd does not start here: $(tail -n 5 "$SL_DIR/log/start.log" "$SL_DIR/log/slurmd.log" 2>/dev/null | tr '\n' ' ')"
    wait_until 40 eval "sinfo -h -o '%t' 2>/dev/null | grep -qx idle" ||
        skip "the node did not come up idle in 40 s: $(sinfo 2>&1 | tail -n 2 | tr '\n' ' ') $(tail -n 5 "$SL_DIR/log/slurmd.log" "$SL_DIR/log/slurmctld.log" 2>/dev/null | tr '\n' ' ')"
}

t_slurm_cluster_srun_job() {
    slurm_cluster_start
    # one launcher (task) on the one node: 2 workers
    timeout -k 5 60 srun -N1 -n1 "$LAUNCH" --nproc_per_node=2 "$TW" env e.%r >out 2>err
    rc=$?
    expect_eq "$rc" 0 "srun mgpu-launch ($(cat err; tail -n 5 "$SL_DIR/log/slurmd.log"))"
    local r jobid
    for r in 0 1; do
        [ -f e.$r ] || fail "rank $r did not run: $(ls)"
        expect_eq "$(envval e.$r RANK)" $r "RANK"
        expect_eq "$(envval e.$r LOCAL_RANK)" $r "LOCAL_RANK"
        expect_eq "$(envval e.$r WORLD_SIZE)" 2 "WORLD_SIZE"
        expect_eq "$(envval e.$r GROUP_RANK)" 0 "GROUP_RANK (SLURM_NODEID)"
        expect_eq "$(envval e.$r GROUP_WORLD_SIZE)" 1 "GROUP_WORLD_SIZE (SLURM_NNODES)"
    done
    jobid=$(envval e.0 SLURM_JOB_ID)
    [[ "$jobid" =~ ^[0-9]+$ ]] || fail "the workers did not run inside a Slurm job (SLURM_JOB_ID=$jobid)"
    case "$(envval e.0 TORCHELASTIC_RUN_ID)" in
        slurm-$jobid|slurm-$jobid.*) ;;
        *) fail "run id $(envval e.0 TORCHELASTIC_RUN_ID), expected slurm-$jobid[.step]" ;;
    esac
    expect_eq "$(envval e.1 TORCHELASTIC_RUN_ID)" "$(envval e.0 TORCHELASTIC_RUN_ID)" "one run id"
    # --dry-run through srun says what it took from the environment
    timeout -k 5 60 srun -N1 -n1 "$LAUNCH" --dry-run --nproc_per_node=2 "$TW" exit 0 >dry 2>&1
    expect_eq "$?" 0 "srun mgpu-launch --dry-run ($(cat dry))"
    expect_grep dry 'from the environment'
    expect_grep dry 'SLURM_NNODES'
    expect_grep dry 'rdzv_id=slurm-[0-9]+'
    # a failing worker's exit status comes back through srun
    timeout -k 5 60 srun -N1 -n1 "$LAUNCH" --nproc_per_node=2 "$TW" only 1 exit 3 >out2 2>err2
    expect_eq "$?" 3 "srun's exit status when rank 1 exits 3 ($(cat err2))"
    expect_grep err2 'Root Cause'
    # two tasks on the one node would be two launchers, two jobs: each refuses, naming the fix
    timeout -k 5 60 srun -N1 -n2 --overcommit "$LAUNCH" --nproc_per_node=1 "$TW" env m.%r >out3 2>err3
    rc=$?
    [ "$rc" -ne 0 ] || fail "srun -n2 on one node ran ($(cat err3))"
    expect_grep err3 'srun --nodes=1 --ntasks-per-node=1 mgpu-launch'
    ! ls m.* >/dev/null 2>&1 || fail "srun -n2 started workers"
}

t_slurm_env_several_launchers_per_node_refused() {
    # srun -n2 on one node starts two launchers: two independent jobs on the same GPUs. Refused
    # with the right srun line, unless --allow_multiple_launchers.
    dry_json SLURM_NNODES=1 SLURM_NODEID=0 SLURM_JOB_NODELIST=node1 SLURM_JOB_ID=8 SLURM_STEP_ID=0 \
        SLURM_STEP_TASKS_PER_NODE=2 SLURM_LOCALID=1 -- --nproc_per_node=1 "$TW" exit 0
    expect_eq "$rc" 2 "srun -n2 on one node ($(cat err))"
    expect_grep err 'runs 2 tasks on this node \(SLURM_STEP_TASKS_PER_NODE\)'
    expect_grep err 'srun --nodes=1 --ntasks-per-node=1 mgpu-launch'
    dry_json SLURM_NNODES=3 SLURM_NODEID=2 'SLURM_JOB_NODELIST=n[1-3]' SLURM_JOB_ID=8 SLURM_STEP_ID=0 \
        'SLURM_STEP_TASKS_PER_NODE=2(x3)' -- --nproc_per_node=1 "$TW" exit 0
    expect_eq "$rc" 2 "2(x3)"
    expect_grep err 'srun --nodes=3 --ntasks-per-node=1'
    dry_json SLURM_NNODES=1 SLURM_NODEID=0 SLURM_JOB_NODELIST=node1 SLURM_JOB_ID=8 SLURM_STEP_ID=0 \
        SLURM_STEP_TASKS_PER_NODE=2 -- --allow_multiple_launchers --nproc_per_node=1 "$TW" exit 0
    expect_eq "$rc" 0 "--allow_multiple_launchers ($(cat err))"
    dry_json SLURM_NNODES=2 SLURM_NODEID=1 'SLURM_JOB_NODELIST=n[1-2]' SLURM_JOB_ID=8 SLURM_STEP_ID=0 \
        'SLURM_STEP_TASKS_PER_NODE=1(x2)' -- --nproc_per_node=1 "$TW" exit 0
    expect_eq "$rc" 0 "one task per node ($(cat err))"
}
