# test_env.sh - the environment every worker gets (torchrun's variables, mgpu's own), device
# mapping with simulated GPUs (the article's four scenarios), free ports.
# Each t_* runs in its own subshell, in a fresh folder, with lib.sh sourced.

# CPU workers unless a test asks for simulated GPUs: a CI machine may have real ones.
# hermetic: nothing of a surrounding job (Slurm, Open MPI, torchrun, PET_* defaults) leaks in
for v in $(env | grep -oE '^(PET|SLURM|OMPI|PMI|PMIX|TORCHELASTIC)_[A-Za-z0-9_]*'); do unset "$v"; done
unset LOGLEVEL PYTHON_EXEC
export MGPU_SIM_GPUS=0
unset CUDA_VISIBLE_DEVICES OMP_NUM_THREADS TORCH_NCCL_ASYNC_ERROR_HANDLING PET_NPROC_PER_NODE

# envval FILE VAR: the value of VAR in a file written by "testworker env" ("<unset>" if absent)
envval() { local l; l=$(grep -m1 "^$2=" "$1") || { echo "<unset>"; return; }; echo "${l#*=}"; }
# expect_var FILE VAR VALUE
expect_var() { expect_eq "$(envval "$1" "$2")" "$3" "$2 in $1"; }

t_env_every_variable_of_every_rank() {
    run_launch --nproc_per_node=3 "$TW" env e.%l
    expect_eq "$rc" 0 "exit status"
    local port; port=$(envval e.0 MASTER_PORT)
    [[ "$port" =~ ^[0-9]+$ ]] && [ "$port" -ge 1024 ] && [ "$port" -le 65535 ] || fail "MASTER_PORT '$port'"
    local ef0; ef0=$(envval e.0 TORCHELASTIC_ERROR_FILE)
    local root=${ef0%/attempt_0/0/error.json}
    [ "$root" != "$ef0" ] || fail "TORCHELASTIC_ERROR_FILE '$ef0' is not <dir>/attempt_0/0/error.json"
    for k in 0 1 2; do
        [ -f e.$k ] || fail "rank $k wrote no environment"
        expect_var e.$k LOCAL_RANK $k
        expect_var e.$k RANK $k
        expect_var e.$k GROUP_RANK 0
        expect_var e.$k ROLE_RANK $k
        expect_var e.$k ROLE_NAME default
        expect_var e.$k ROLE_WORLD_SIZE 3
        expect_var e.$k LOCAL_WORLD_SIZE 3
        expect_var e.$k WORLD_SIZE 3
        expect_var e.$k GROUP_WORLD_SIZE 1
        expect_var e.$k MASTER_ADDR 127.0.0.1
        expect_var e.$k MASTER_PORT "$port"
        expect_var e.$k TORCHELASTIC_RESTART_COUNT 0
        expect_var e.$k TORCHELASTIC_MAX_RESTARTS 0
        expect_var e.$k TORCHELASTIC_RUN_ID none
        expect_var e.$k TORCHELASTIC_USE_AGENT_STORE False
        expect_var e.$k TORCH_NCCL_ASYNC_ERROR_HANDLING 1
        expect_var e.$k OMP_NUM_THREADS 1
        expect_var e.$k TORCHELASTIC_ERROR_FILE "$root/attempt_0/$k/error.json"
        expect_var e.$k MGPU_DEVICE cpu
        # no variable set twice
        local dup; dup=$(cut -d= -f1 e.$k | sort | uniq -d)
        [ -z "$dup" ] || fail "rank $k: variables set twice: $dup"
    done
    # torchrun's OMP banner, once, on stderr, since OMP_NUM_THREADS was unset and nproc > 1
    expect_eq "$(grep -c 'Setting OMP_NUM_THREADS environment variable for each process to be 1 in default' err)" 1 "OMP banner count"
    expect_grep err '^\*{41}$'
    expect_no_grep out 'OMP_NUM_THREADS'
}

t_env_omp_inherited_no_banner() {
    OMP_NUM_THREADS=7 run_launch --nproc_per_node=2 "$TW" env e.%l
    expect_eq "$rc" 0
    expect_var e.0 OMP_NUM_THREADS 7
    expect_var e.1 OMP_NUM_THREADS 7
    expect_no_grep err 'Setting OMP_NUM_THREADS'
    # one worker: nothing set, no banner (torchrun sets it only when nproc > 1)
    run_launch --nproc_per_node=1 "$TW" env one.%l
    expect_eq "$rc" 0
    expect_var one.0 OMP_NUM_THREADS "<unset>"
    expect_no_grep err 'Setting OMP_NUM_THREADS'
}

t_env_inherited_values_kept_and_launcher_values_win() {
    MY_JOB_SETTING='a b=c' TORCH_NCCL_ASYNC_ERROR_HANDLING=0 RANK=99 LOCAL_RANK=42 WORLD_SIZE=7 \
        TORCHELASTIC_RESTART_COUNT=5 TORCHELASTIC_ERROR_FILE=/nonexistent/x.json MASTER_PORT=1 \
        run_launch --nproc_per_node=2 "$TW" env e.%l
    expect_eq "$rc" 0
    for k in 0 1; do
        expect_var e.$k MY_JOB_SETTING 'a b=c'
        expect_var e.$k TORCH_NCCL_ASYNC_ERROR_HANDLING 0
        expect_var e.$k RANK $k
        expect_var e.$k LOCAL_RANK $k
        expect_var e.$k WORLD_SIZE 2
        expect_var e.$k TORCHELASTIC_RESTART_COUNT 0
        [ "$(envval e.$k MASTER_PORT)" != 1 ] || fail "MASTER_PORT inherited from the launcher's environment"
        [ "$(envval e.$k TORCHELASTIC_ERROR_FILE)" != /nonexistent/x.json ] || fail "TORCHELASTIC_ERROR_FILE inherited"
        expect_eq "$(grep -c '^RANK=' e.$k)" 1 "RANK lines"
    done
}

# nodes N NPROC ARGS... : runs N launchers on this host as nodes 0..N-1 of one job (static
# rendezvous at 127.0.0.1:<free port>); each worker writes its environment to e.<RANK>.
# Exit statuses in rcs[0..N-1]. A launcher still running after 60 s is stopped (SIGTERM), so a
# hang fails with every launcher's own words instead of at the test's deadline.
nodes() {
    local n=$1 nproc=$2; shift 2
    local port; port=$(free_port)
    local pids=() i
    for i in $(seq 0 $((n - 1))); do
        timeout -k 5 60 "$LAUNCH" --nnodes=$n --node_rank=$i --nproc_per_node=$nproc \
            --master_addr=127.0.0.1 --master_port=$port "$@" "$TW" env e.%r >out.$i 2>err.$i &
        pids+=($!)
    done
    rcs=()
    for i in $(seq 0 $((n - 1))); do wait ${pids[$i]}; rcs+=($?); done
    store_port=$port
}

t_env_multi_node_ranks() {
    # 2 nodes x 2 workers on this host: node 1 owns global ranks 2 and 3
    nodes 2 2 --rdzv_id=mn
    expect_eq "${rcs[*]}" "0 0" "exit statuses of the two launchers ($(cat err.0 err.1))"
    local port; port=$(envval e.0 MASTER_PORT)
    [[ "$port" =~ ^[0-9]+$ ]] || fail "MASTER_PORT '$port'"
    for r in 0 1 2 3; do
        [ -f e.$r ] || fail "no worker of global rank $r"
        expect_var e.$r RANK $r
        expect_var e.$r LOCAL_RANK $((r % 2))
        expect_var e.$r GROUP_RANK $((r / 2))
        expect_var e.$r ROLE_RANK $r
        expect_var e.$r LOCAL_WORLD_SIZE 2
        expect_var e.$r WORLD_SIZE 4
        expect_var e.$r ROLE_WORLD_SIZE 4
        expect_var e.$r GROUP_WORLD_SIZE 2
        expect_var e.$r MASTER_ADDR 127.0.0.1
        expect_var e.$r MASTER_PORT "$port"
        expect_var e.$r TORCHELASTIC_RUN_ID mn
    done
}

t_env_multi_node_three_nodes() {
    nodes 3 1
    expect_eq "${rcs[*]}" "0 0 0" "exit statuses ($(cat err.*))"
    for r in 0 1 2; do
        expect_var e.$r RANK $r
        expect_var e.$r GROUP_RANK $r
        expect_var e.$r LOCAL_RANK 0
        expect_var e.$r WORLD_SIZE 3
        expect_var e.$r GROUP_WORLD_SIZE 3
    done
}

t_env_role_and_rdzv_id() {
    run_launch --role trainer --rdzv_id=job-42 --max_restarts=3 --nproc_per_node=2 "$TW" env e.%l
    expect_eq "$rc" 0
    for k in 0 1; do
        expect_var e.$k ROLE_NAME trainer
        expect_var e.$k TORCHELASTIC_RUN_ID job-42
        expect_var e.$k TORCHELASTIC_MAX_RESTARTS 3
        expect_var e.$k TORCHELASTIC_RESTART_COUNT 0
    done
}

t_env_master_addr_port_given() {
    run_launch --master_addr=node7.example --master_port=29777 --nproc_per_node=2 "$TW" env e.%l
    expect_eq "$rc" 0
    expect_var e.1 MASTER_ADDR node7.example
    expect_var e.1 MASTER_PORT 29777
}

t_env_standalone() {
    local uuid='^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
    run_launch --standalone --rdzv_id=ignored --nproc_per_node=2 "$TW" env a.%l
    expect_eq "$rc" 0
    run_launch --standalone --nproc_per_node=2 "$TW" env b.%l
    expect_eq "$rc" 0
    local ida idb; ida=$(envval a.0 TORCHELASTIC_RUN_ID); idb=$(envval b.0 TORCHELASTIC_RUN_ID)
    [[ "$ida" =~ $uuid ]] || fail "--standalone run id '$ida' is not a random uuid"
    [[ "$idb" =~ $uuid ]] || fail "--standalone run id '$idb' is not a random uuid"
    [ "$ida" != "$idb" ] || fail "two --standalone runs got the same run id $ida"
    expect_var a.1 TORCHELASTIC_RUN_ID "$ida"
    local port; port=$(envval a.0 MASTER_PORT)
    [[ "$port" =~ ^[0-9]+$ ]] && [ "$port" -ge 1024 ] || fail "--standalone MASTER_PORT '$port'"
    [ "$port" != 29500 ] && [ "$port" != 29400 ] || fail "--standalone uses the fixed port $port, not a free one"
    expect_var a.1 MASTER_PORT "$port"
    expect_var a.0 WORLD_SIZE 2
    expect_var a.0 GROUP_WORLD_SIZE 1
}

t_env_free_port_is_free_and_differs_between_jobs() {
    # Two jobs on one host at the same time: each worker group waits for the other's, so
    # both run together; their MASTER_PORTs must differ.
    local i
    for i in 1 2 3; do
        "$LAUNCH" --nproc_per_node=2 "$TW" env a$i.%l touch a$i.ready.%l waitall b$i.ready. 2 >outa 2>erra &
        local pa=$!
        "$LAUNCH" --nproc_per_node=2 "$TW" env b$i.%l touch b$i.ready.%l waitall a$i.ready. 2 >outb 2>errb &
        local pb=$!
        wait $pa; local ra=$?
        wait $pb; local rb=$?
        expect_eq "$ra/$rb" 0/0 "exit status of the two jobs (round $i)"
        local porta portb
        porta=$(envval a$i.0 MASTER_PORT); portb=$(envval b$i.0 MASTER_PORT)
        [ "$porta" != "$portb" ] || fail "two concurrent jobs share MASTER_PORT $porta"
        expect_var a$i.1 MASTER_PORT "$porta"
        expect_var b$i.1 MASTER_PORT "$portb"
    done
}

t_env_free_port_can_be_bound() {
    # the picked port is free: a worker can listen on it (python's socket, as TCPStore would)
    command -v python3 >/dev/null || skip "python3 not found"
    cat >bind.sh <<'EOF'
#!/bin/sh
exec python3 -c 'import os,socket
s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(os.environ["MASTER_PORT"]))); s.listen(1); print("bound", os.environ["MASTER_PORT"])'
EOF
    chmod +x bind.sh
    run_launch --nproc_per_node=1 ./bind.sh
    expect_eq "$rc" 0 "binding MASTER_PORT: $(cat err)"
    expect_grep out '^\[rank0\]:bound [0-9]+$'
}

# --- devices: MGPU_SIM_GPUS and CUDA_VISIBLE_DEVICES (the article's scenarios) ---

t_devices_simulated_no_cvd() {
    # scenario 3: 4 GPUs, CUDA_VISIBLE_DEVICES unset, 4 workers: local rank k on physical GPU k
    MGPU_SIM_GPUS=4 run_launch --nproc_per_node=4 "$TW" env e.%l
    expect_eq "$rc" 0 "exit status ($(cat err))"
    for k in 0 1 2 3; do
        expect_var e.$k MGPU_GPU_ORDINAL $k
        expect_var e.$k MGPU_PHYSICAL_GPU $k
        expect_var e.$k MGPU_GPU_SIMULATED 1
        expect_var e.$k CUDA_VISIBLE_DEVICES "<unset>"
        [ "$(envval e.$k MGPU_GPU_UUID)" != "<unset>" ] || fail "rank $k: no MGPU_GPU_UUID"
        [ "$(envval e.$k MGPU_DEVICE)" != cpu ] || fail "rank $k on the CPU with 4 simulated GPUs"
    done
    [ "$(envval e.0 MGPU_GPU_UUID)" != "$(envval e.1 MGPU_GPU_UUID)" ] || fail "two GPUs with one uuid"
}

t_devices_scenario1_two_of_four_visible() {
    # scenario 1: CUDA_VISIBLE_DEVICES=1,2,3,4 and 2 workers: local ranks 0,1 on GPUs 1,2
    MGPU_SIM_GPUS=5 CUDA_VISIBLE_DEVICES=1,2,3,4 run_launch --nproc_per_node=2 "$TW" env e.%l
    expect_eq "$rc" 0 "exit status ($(cat err))"
    for k in 0 1; do
        expect_var e.$k LOCAL_RANK $k
        expect_var e.$k MGPU_GPU_ORDINAL $k
        expect_var e.$k MGPU_PHYSICAL_GPU $((k + 1))
        expect_var e.$k CUDA_VISIBLE_DEVICES 1,2,3,4
    done
}

t_devices_scenario2_four_of_four_visible() {
    # scenario 2: 4 workers: local rank k on physical GPU k+1 (local_rank is not a GPU number)
    MGPU_SIM_GPUS=5 CUDA_VISIBLE_DEVICES=1,2,3,4 run_launch --nproc_per_node=4 "$TW" env e.%l
    expect_eq "$rc" 0 "exit status ($(cat err))"
    for k in 0 1 2 3; do
        expect_var e.$k MGPU_GPU_ORDINAL $k
        expect_var e.$k MGPU_PHYSICAL_GPU $((k + 1))
        expect_var e.$k CUDA_VISIBLE_DEVICES 1,2,3,4
    done
}

t_devices_scenario2_dry_run_json() {
    MGPU_SIM_GPUS=5 CUDA_VISIBLE_DEVICES=1,2,3,4 run_launch --dry-run=json --nproc_per_node=4 "$TW" touch started
    expect_eq "$rc" 0
    [ ! -e started ] || fail "--dry-run started a worker"
    python3 - out <<'EOF' || fail "dry-run JSON: $(head -c 600 out)"
import json, sys
d = json.load(open(sys.argv[1]))
ws = d["workers"]
assert len(ws) == 4, ws
for k, w in enumerate(ws):
    assert w["local_rank"] == k and w["rank"] == k, w
    assert w["cuda_ordinal"] == k, w
    assert w["physical_gpu"] == k + 1, w
    assert w["env"]["LOCAL_RANK"] == str(k), w["env"]
assert d["simulated"] is True
EOF
}

t_devices_scenario4_refused() {
    # scenario 4: 5 workers, 4 visible GPUs: refused before anything starts
    MGPU_SIM_GPUS=5 CUDA_VISIBLE_DEVICES=1,2,3,4 run_launch --nproc_per_node=5 "$TW" touch started.%l
    expect_eq "$rc" 2 "exit status"
    sleep 0.2
    ls started.* >/dev/null 2>&1 && fail "a worker was started: $(ls started.*)"
    expect_grep err 'nproc_per_node=5|nproc_per_node 5'
    expect_grep err 'CUDA_VISIBLE_DEVICES'
    expect_grep err "1,2,3,4"
    expect_grep err 'simulated'
    # it names the visible devices (physical GPUs 1..4) and says 4 are visible
    expect_grep err '\b4\b.*visible|visible.*\b4\b'
    expect_eq "$(wc -l <out)" 0 "stdout lines"
}

t_devices_scenario4_unset_cvd_refused() {
    MGPU_SIM_GPUS=2 run_launch --nproc_per_node=3 "$TW" touch started.%l
    expect_eq "$rc" 2
    ls started.* >/dev/null 2>&1 && fail "a worker was started"
    expect_grep err 'nproc_per_node=3'
    expect_grep err 'CUDA_VISIBLE_DEVICES'
}

t_devices_sharing_k_mod_n() {
    MGPU_SIM_GPUS=5 CUDA_VISIBLE_DEVICES=1,2,3,4 run_launch --allow_gpu_sharing --nproc_per_node=6 "$TW" env e.%l
    expect_eq "$rc" 0 "exit status ($(cat err))"
    for k in 0 1 2 3 4 5; do
        expect_var e.$k LOCAL_RANK $k
        expect_var e.$k MGPU_GPU_ORDINAL $((k % 4))
        expect_var e.$k MGPU_PHYSICAL_GPU $((k % 4 + 1))
    done
    # and the plan says so
    MGPU_SIM_GPUS=5 CUDA_VISIBLE_DEVICES=1,2,3,4 run_launch --dry-run --allow_gpu_sharing --nproc_per_node=6 "$TW" touch started
    expect_eq "$rc" 0
    expect_grep out 'sharing|shared'
    [ ! -e started ] || fail "--dry-run started a worker"
}

t_devices_virtual_local_rank() {
    # torchrun --virtual-local-rank: LOCAL_RANK=0 everywhere, each worker sees its GPU alone
    # (files named by RANK: every LOCAL_RANK is 0)
    MGPU_SIM_GPUS=5 CUDA_VISIBLE_DEVICES=1,2,3,4 run_launch --virtual_local_rank --nproc_per_node=4 "$TW" env e.%r
    expect_eq "$rc" 0 "exit status ($(cat err))"
    for k in 0 1 2 3; do
        expect_var e.$k LOCAL_RANK 0
        expect_var e.$k RANK $k
        expect_var e.$k CUDA_VISIBLE_DEVICES $((k + 1))
        expect_var e.$k MGPU_GPU_ORDINAL 0
        expect_var e.$k MGPU_PHYSICAL_GPU $((k + 1))
        expect_var e.$k MGPU_LOCAL_RANK $k
    done
    # unset: entry k is k; blanks trimmed; shared GPUs repeat; hidden GPUs stay hidden
    MGPU_SIM_GPUS=2 PET_VIRTUAL_LOCAL_RANK=1 run_launch --nproc_per_node=2 "$TW" env u.%r
    expect_eq "$rc" 0 "exit status, unset ($(cat err))"
    expect_var u.1 CUDA_VISIBLE_DEVICES 1
    MGPU_SIM_GPUS=4 CUDA_VISIBLE_DEVICES=' 3 , 0' run_launch --virtual-local-rank --allow_gpu_sharing --nproc_per_node=3 "$TW" env s.%r
    expect_eq "$rc" 0 "exit status, shared ($(cat err))"
    expect_var s.0 CUDA_VISIBLE_DEVICES 3
    expect_var s.1 CUDA_VISIBLE_DEVICES 0
    expect_var s.2 CUDA_VISIBLE_DEVICES 3
    MGPU_SIM_GPUS=4 CUDA_VISIBLE_DEVICES= run_launch --virtual_local_rank --nproc_per_node=2 "$TW" env h.%r
    expect_eq "$rc" 0 "exit status, hidden ($(cat err))"
    expect_var h.1 CUDA_VISIBLE_DEVICES ""
    expect_var h.1 LOCAL_RANK 0
    # libmgpu takes each worker's place on the node from MGPU_LOCAL_RANK: mgpu-worker trains
    MGPU_SIM_GPUS=4 run_launch --virtual_local_rank --nproc_per_node=4 "$MGPU_ROOT/configs/train.cfg" epochs=1
    expect_eq "$rc" 0 "exit status of train.cfg ($(tail -3 err))"
    expect_grep out 'eval epoch 1 step'
}

t_devices_cvd_uuid_and_truncation() {
    # a UUID prefix selects a GPU; the list ends at the first invalid entry (driver rules)
    MGPU_SIM_GPUS=4 run_launch --dry-run=json --nproc_per_node=1 "$TW" exit 0
    expect_eq "$rc" 0
    local uuid2; uuid2=$(python3 -c 'import json,sys; print([g["uuid"] for g in json.load(open("out"))["visible"] if g["physical"]==2][0])')
    MGPU_SIM_GPUS=4 CUDA_VISIBLE_DEVICES="${uuid2},abc,0" run_launch --nproc_per_node=1 "$TW" env e.%l
    expect_eq "$rc" 0 "exit status ($(cat err))"
    expect_var e.0 MGPU_PHYSICAL_GPU 2
    # 2 requested but the list stops at "abc": one visible -> refused
    MGPU_SIM_GPUS=4 CUDA_VISIBLE_DEVICES="${uuid2},abc,0" run_launch --nproc_per_node=2 "$TW" touch started
    expect_eq "$rc" 2
    [ ! -e started ] || fail "started"
}

t_devices_repeated_device_refused() {
    MGPU_SIM_GPUS=4 CUDA_VISIBLE_DEVICES=0,0 run_launch --nproc_per_node=1 "$TW" touch started
    expect_eq "$rc" 2
    [ ! -e started ] || fail "started"
    expect_grep err 'CUDA_VISIBLE_DEVICES'
}

t_devices_none_visible_runs_on_cpu() {
    # CUDA_VISIBLE_DEVICES="" hides every GPU: the workers run on the CPU, with a warning
    MGPU_SIM_GPUS=2 CUDA_VISIBLE_DEVICES='' run_launch --nproc_per_node=3 "$TW" env e.%l
    expect_eq "$rc" 0 "exit status ($(cat err))"
    expect_var e.2 MGPU_DEVICE cpu
    expect_var e.2 CUDA_VISIBLE_DEVICES ""
    expect_grep err 'CPU'
}
