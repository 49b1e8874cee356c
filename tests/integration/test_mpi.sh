# test_mpi.sh - mgpu-launch under Open MPI's mpirun: one launcher per MPI rank, each a
# "node"; nnodes and node rank come from OMPI_COMM_WORLD_*, node 0's address is loopback when
# every rank is on this host, explicit options win; two launchers on one host are refused
# unless --allow_multiple_launchers, which the tests give to stand two "nodes" on this host.
# Debian's openmpi-bin runs the launchers for real.

source "$(dirname "${BASH_SOURCE[0]}")/multinode/common.sh"

need_mpirun() {
    command -v mpirun >/dev/null || skip "no mpirun here (apt-get install openmpi-bin)"
    mpirun --version 2>&1 | grep -qi 'open mpi\|open-mpi\|openrte' || skip "mpirun is not Open MPI's: $(mpirun --version 2>&1 | head -n 1)"
}
# mpirun as root, more ranks than cores allowed, no network probing of other hosts
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --mca btl self,tcp --mca btl_tcp_if_include lo
        --mca oob_tcp_if_include lo)

t_mpi_two_launchers() {
    need_mpirun
    local port; port=$(free_port)
    timeout -k 5 90 "${MPIRUN[@]}" -np 2 "$LAUNCH" --allow_multiple_launchers --nproc_per_node=2 \
        --master_port=$port "$TW" env e.%r >out 2>err
    rc=$?
    expect_eq "$rc" 0 "mpirun -np 2 mgpu-launch ($(tail -n 30 err))"
    local r node maddr mport runid
    maddr=$(envval e.0 MASTER_ADDR) mport=$(envval e.0 MASTER_PORT) runid=$(envval e.0 TORCHELASTIC_RUN_ID)
    for r in 0 1 2 3; do
        [ -f e.$r ] || fail "rank $r did not run: $(ls)"
        node=$((r / 2))
        expect_eq "$(envval e.$r RANK)" $r "RANK"
        expect_eq "$(envval e.$r WORLD_SIZE)" 4 "WORLD_SIZE"
        expect_eq "$(envval e.$r LOCAL_RANK)" $((r % 2)) "LOCAL_RANK of rank $r"
        expect_eq "$(envval e.$r LOCAL_WORLD_SIZE)" 2 "LOCAL_WORLD_SIZE"
        expect_eq "$(envval e.$r GROUP_RANK)" $node "GROUP_RANK of rank $r"
        expect_eq "$(envval e.$r GROUP_WORLD_SIZE)" 2 "GROUP_WORLD_SIZE"
        # the node rank is the launcher's MPI rank
        expect_eq "$(envval e.$r OMPI_COMM_WORLD_RANK)" $node "OMPI_COMM_WORLD_RANK of rank $r's launcher"
        expect_eq "$(envval e.$r MASTER_ADDR)" "$maddr" "MASTER_ADDR of rank $r"
        expect_eq "$(envval e.$r MASTER_PORT)" "$mport" "MASTER_PORT of rank $r"
        expect_eq "$(envval e.$r TORCHELASTIC_RUN_ID)" "$runid" "run id of rank $r"
        expect_eq "$(envval e.$r MGPU_STORE_PORT)" "$port" "MGPU_STORE_PORT of rank $r"
    done
    expect_eq "$maddr" 127.0.0.1 "MASTER_ADDR with every MPI rank on this host"
    [ "$mport" != "$port" ] || fail "MASTER_PORT is the store's --master_port"
    [ ! -e e.4 ] || fail "a fifth rank ran"
}

t_mpi_failure_stops_both() {
    # rank 3 (second launcher) exits 3 once all run: the other launcher stops its workers,
    # mpirun ends promptly and non-zero
    need_mpirun
    local port; port=$(free_port)
    local t0; t0=$(now_ms)
    timeout -k 5 90 "${MPIRUN[@]}" -np 2 "$LAUNCH" --allow_multiple_launchers --nproc_per_node=2 --master_port=$port --grace_period=1 \
        "$TW" trap sig.%r TERM touch r.%r only 3 waitall r. 4 only 3 exit 3 pause >out 2>err
    rc=$?
    local ms=$(($(now_ms) - t0))
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "mpirun exit status $rc ($(tail -n 30 err))"
    [ "$ms" -lt 30000 ] || fail "took ${ms} ms"
    local r
    for r in 0 1 2; do expect_grep sig.$r '^TERM'; done
    expect_grep err 'node 1 .*rank 3|rank 3'
}

t_mpi_two_launchers_on_one_host_are_refused() {
    # mpirun -np 2 maps both ranks to this host: two launchers would put their workers on the
    # same GPUs (as srun -n2 on one node); refused before anything starts, naming the fix
    need_mpirun
    local port; port=$(free_port)
    timeout -k 5 90 "${MPIRUN[@]}" -np 2 "$LAUNCH" --nproc_per_node=2 --master_port=$port \
        "$TW" touch ran.%r >out 2>err
    rc=$?
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "mpirun exit status $rc ($(tail -n 30 err))"
    expect_grep err 'mpirun started 2 launchers on this host \(OMPI_COMM_WORLD_LOCAL_SIZE=2\)'
    expect_grep err 'mpirun --map-by ppr:1:node mgpu-launch'
    [ -z "$(ls ran.* 2>/dev/null)" ] || fail "workers ran: $(ls ran.*)"
}

t_mpi_env_derivation() {
    # no mpirun needed: OMPI_COMM_WORLD_* as mpirun sets them
    env OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_LOCAL_SIZE=2 \
        "$LAUNCH" --dry-run=json --allow_multiple_launchers --nproc_per_node=1 "$TW" exit 0 >out 2>err
    expect_eq "$?" 0 "dry run ($(cat err))"
    "$PY3" -c 'import json
d = json.load(open("out"))
assert d["nnodes"] == 2 and d["node_rank"] == 1, d
assert d["master_addr"] in ("127.0.0.1", "localhost"), d["master_addr"]
assert "OMPI_COMM_WORLD_RANK" in d["derived"], d["derived"]
' || fail "plan: $(cat out)"
    # across hosts without --master_addr: a usage error that says what to give
    env OMPI_COMM_WORLD_SIZE=4 OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_LOCAL_SIZE=1 \
        "$LAUNCH" --dry-run=json --nproc_per_node=1 "$TW" exit 0 >out 2>err
    expect_eq "$?" 2 "mpirun across hosts without --master_addr"
    expect_grep err -- '--master_addr'
    # explicit options win
    env OMPI_COMM_WORLD_SIZE=4 OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_LOCAL_SIZE=1 \
        "$LAUNCH" --dry-run=json --nnodes=2 --node_rank=0 --master_addr=10.9.9.9 --nproc_per_node=1 \
        "$TW" exit 0 >out 2>err
    expect_eq "$?" 0 "explicit options under mpirun ($(cat err))"
    "$PY3" -c 'import json
d = json.load(open("out"))
assert (d["nnodes"], d["node_rank"], d["master_addr"]) == (2, 0, "10.9.9.9"), d
' || fail "plan: $(cat out)"
}
