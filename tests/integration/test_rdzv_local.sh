# test_rdzv_local.sh - the store of a job of one node: the launcher writes its own keys into the
# table in place and never connects to it (no client, no failure watch, no heartbeat), and its
# thread starts once the workers are forked; the workers still reach it at MGPU_STORE_ADDR:
# MGPU_STORE_PORT from their first instruction, with the token, in every attempt.

export MGPU_SIM_GPUS=0 OMP_NUM_THREADS=1
unset CUDA_VISIBLE_DEVICES PET_NPROC_PER_NODE LOGLEVEL
SC="$MGPU_BUILD/tests/store_cli"

# envval FILE VAR: the value of VAR in a file written by "testworker env", or <unset>
envval() { local l; l=$(grep -m1 "^$2=" "$1" 2>/dev/null) || { echo "<unset>"; return; }; echo "${l#*=}"; }
# conns FILE: how many connections the launcher's store accepted (its debug lines)
conns() { grep -c 'store: connection from 127\.0\.0\.1:' "$1"; }

t_local_store_no_connection_of_its_own() {
    # workers that never use the store: the store accepts no connection at all (before, the
    # launcher connected to it twice: a client and a failure watch that only several nodes need)
    LOGLEVEL=DEBUG run_launch --nproc_per_node=3 -- true
    expect_eq "$rc" 0 "exit status ($(cat err))"
    expect_grep err 'store: listening on 127\.0\.0\.1 port [0-9]+'
    expect_eq "$(conns err)" 0 "connections to a store no worker used ($(cat err))"
}

t_local_store_answers_workers_at_once() {
    # 4 workers meet at a barrier in the store the moment they run, then count its keys: every
    # connection is a worker's (one each), the launcher's own keys are where the static
    # rendezvous puts them
    LOGLEVEL=DEBUG run_launch --nproc_per_node=4 -- bash -c \
        "$SC barrier b 4 20 && $SC -P mgpu/none/ get master && $SC -P mgpu/none/ get node/0"
    expect_eq "$rc" 0 "exit status ($(cat err))"
    expect_eq "$(conns err)" 12 "store connections (3 a worker: $(cat err))"
    local r port
    port=$(grep -oE 'store: listening on 127\.0\.0\.1 port [0-9]+' err | grep -oE '[0-9]+$')
    for r in 0 1 2 3; do
        expect_grep out "^\[rank$r\]:[0-9]+ 127\.0\.0\.1$"
        expect_grep out "^\[rank$r\]:4 [^ ]+ [0-9]+ default$"
    done
    [ -n "$port" ] || fail "no store port in the debug lines"
}

t_local_store_env_and_token() {
    # MGPU_STORE_* name the store; a wrong token is refused, the right one answers; MASTER_PORT
    # (PyTorch's own store, hosted by rank 0) is another free port
    run_launch --nproc_per_node=2 "$TW" env e.%l
    expect_eq "$rc" 0 "exit status ($(cat err))"
    local sp mp tok
    sp=$(envval e.0 MGPU_STORE_PORT) mp=$(envval e.0 MASTER_PORT) tok=$(envval e.0 MGPU_STORE_TOKEN)
    expect_eq "$(envval e.0 MGPU_STORE_ADDR)" 127.0.0.1 "MGPU_STORE_ADDR"
    expect_eq "$(envval e.1 MGPU_STORE_TOKEN)" "$tok" "one token for every worker"
    [ "${#tok}" -ge 16 ] || fail "token '$tok': expected a generated secret"
    [ "$sp" -gt 0 ] && [ "$mp" -gt 0 ] && [ "$sp" != "$mp" ] ||
        fail "MGPU_STORE_PORT=$sp MASTER_PORT=$mp: expected two ports"
    # a job whose worker checks the store with the wrong token, then the right one
    run_launch --nproc_per_node=1 -- bash -c \
        "! $SC -a \$MGPU_STORE_ADDR -p \$MGPU_STORE_PORT -t wrong ping 2>wrong.err && $SC ping"
    expect_eq "$rc" 0 "exit status ($(cat err) $(cat wrong.err 2>/dev/null))"
    expect_grep wrong.err 'token'
}

t_local_store_every_attempt() {
    # attempt 0 fails after a barrier, attempt 1 meets at its own: the store's thread, started
    # with the first attempt, serves the next one too
    run_launch --nproc_per_node=2 --max_restarts=1 -- bash -c \
        "$SC barrier b 2 20 || exit 9; [ \$TORCHELASTIC_RESTART_COUNT = 1 ] || exit 3; echo met"
    expect_eq "$rc" 0 "exit status ($(cat err))"
    expect_grep out '^\[rank0\]:met$'
    expect_grep out '^\[rank1\]:met$'
}

t_local_store_early_client_waits() {
    # a worker that connects before the launcher serves (its store is listening, its thread not
    # yet started) is answered once it is: 16 workers, each connecting at once
    run_launch --nproc_per_node=16 -- "$SC" set k v
    expect_eq "$rc" 0 "exit status ($(cat err))"
}
