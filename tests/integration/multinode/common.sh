# multinode/common.sh - helpers of the multi-node integration tests (test_multinode.sh,
# test_store_abuse.sh, test_slurm.sh, test_mpi.sh), sourced after lib.sh.
#
# "Nodes" are several mgpu-launch processes on this machine: on loopback (127.0.0.1, distinct
# --node_rank), or each in a network namespace of its own, linked by veth pairs to a bridge in
# one more namespace (addresses 10.<n>.0.<node+1>), when this machine allows `ip netns`.
# Every process and namespace a test makes is recorded and removed by its id when the test
# ends (the EXIT/TERM trap), whatever way it ends.

# hermetic: nothing of a surrounding job (Slurm, Open MPI, torchrun, PET_* defaults) leaks in
for v in $(env | grep -oE '^(PET|SLURM|OMPI|PMI|PMIX|TORCHELASTIC|MGPU_STORE)_[A-Za-z0-9_]*'); do unset "$v"; done
unset LOGLEVEL PYTHON_EXEC CUDA_VISIBLE_DEVICES SLURM_CONF
export MGPU_SIM_GPUS=0
export OMP_NUM_THREADS=1
# the launchers' run folders (mgpu_<run id>_XXXXXX) of launchers that a test kills stay in the
# test's own scratch folder
export TMPDIR=${TEST_TMP:-$PWD}

MN_PY=${MGPU_TEST_TORCH_PYTHON:-/usr/bin/python3} # Debian's python3-torch lives there
# any Python 3 for small helpers: /usr/bin/python3 starts fastest (the first on PATH may be a shim)
PY3=$(command -v /usr/bin/python3 || command -v python3)
declare -A MN_PID=() MN_RC=()
MN_NETNS=()
MN_KILL=() # other pids to kill at the end (daemons record their own stop)

now_ms() { echo $(($(date +%s%N) / 1000000)); }
alive() { kill -0 "$1" 2>/dev/null && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }
all_exist() { local f; for f; do [ -e "$f" ] || return 1; done; }
# envval FILE VAR: the value of VAR in a file written by "testworker env", or <unset>
envval() { local l; l=$(grep -m1 "^$2=" "$1" 2>/dev/null) || { echo "<unset>"; return; }; echo "${l#*=}"; }

mn_cleanup() {
    local n p
    for n in "${!MN_PID[@]}"; do
        p=${MN_PID[$n]}
        alive "$p" && kill -KILL "$p" 2>/dev/null
    done
    for p in "${MN_KILL[@]}"; do alive "$p" && kill -KILL "$p" 2>/dev/null; done
    [ "$(type -t mn_extra_cleanup)" = function ] && mn_extra_cleanup
    [ ${#MN_NETNS[@]} -gt 0 ] || return 0
    for n in "${MN_NETNS[@]}"; do
        ip netns del "$n" 2>/dev/null
        [ -d "/etc/netns/$n" ] && rm -rf "/etc/netns/$n"
    done
    rmdir /etc/netns 2>/dev/null
    return 0
}
trap 'mn_cleanup' EXIT
trap 'mn_cleanup; exit 143' TERM INT

# start_node NAME NETNS|- ARGS...: starts "mgpu-launch ARGS" in the background (inside the
# network namespace NETNS unless "-"), stdout to out.NAME, stderr to err.NAME.
start_node() {
    local name=$1 ns=$2
    shift 2
    if [ "$ns" = - ]; then
        "$LAUNCH" "$@" >"out.$name" 2>"err.$name" &
    else
        # ip netns exec execs the command: the pid is the launcher's
        ip netns exec "$ns" "$LAUNCH" "$@" >"out.$name" 2>"err.$name" &
    fi
    MN_PID[$name]=$!
}

# wait_node NAME SECS: waits for the node's launcher to exit, its status in MN_RC[NAME]; fails
# the test (killing it) if it is still running after SECS seconds.
wait_node() {
    local name=$1 secs=$2 p=${MN_PID[$1]}
    if ! wait_until "$secs" eval "! alive $p"; then
        echo "--- err.$name:" >&2; tail -n 20 "err.$name" >&2
        kill -KILL "$p" 2>/dev/null
        wait "$p" 2>/dev/null
        fail "node $name (pid $p) still running after ${secs}s: a hang"
    fi
    wait "$p"
    MN_RC[$name]=$?
}

dump_nodes() {
    local f
    for f in "$@"; do echo "--- $f:"; tail -n 40 "$f"; done >&2
}

# mn_netns_setup N: N namespaces linked by a bridge; sets MN_NS[0..N-1] and MN_ADDR[0..N-1];
# the interface inside each is "mg0". Skips the test when this machine does not allow it.
MN_NS=() MN_ADDR=()
mn_netns_setup() {
    local n=$1 i base="mgpu$$x$RANDOM" oct=$((100 + RANDOM % 150))
    command -v ip >/dev/null || skip "no 'ip' command (apt-get install iproute2)"
    ip netns add "${base}sw" 2>/dev/null || skip "cannot create network namespaces here (ip netns add: not root or not allowed)"
    MN_NETNS+=("${base}sw")
    ip -n "${base}sw" link add br0 type bridge 2>/dev/null || skip "cannot create a bridge in a network namespace here"
    ip -n "${base}sw" link set br0 up || fail "bridge up"
    for i in $(seq 0 $((n - 1))); do
        MN_NS[$i]="${base}n$i"
        MN_ADDR[$i]="10.$oct.0.$((i + 1))"
        MN_ADDR6[$i]="fd77:$oct::$((i + 1))"
        ip netns add "${MN_NS[$i]}" || fail "ip netns add ${MN_NS[$i]}"
        MN_NETNS+=("${MN_NS[$i]}")
        ip link add mg0 netns "${MN_NS[$i]}" type veth peer name "p$i" netns "${base}sw" 2>/dev/null ||
            skip "cannot create veth pairs here"
        ip -n "${base}sw" link set "p$i" master br0 up || fail "veth p$i on the bridge"
        ip -n "${MN_NS[$i]}" addr add "${MN_ADDR[$i]}/24" dev mg0 || fail "address of node $i"
        # an IPv6 address too, where the kernel has IPv6 (nodad: usable at once); else none
        ip -n "${MN_NS[$i]}" -6 addr add "${MN_ADDR6[$i]}/64" dev mg0 nodad 2>/dev/null ||
            MN_ADDR6[$i]=
        ip -n "${MN_NS[$i]}" link set mg0 up || fail "mg0 up in node $i"
        ip -n "${MN_NS[$i]}" link set lo up || fail "lo up in node $i"
    done
    # the link is up when node 0 answers a TCP connect (refused is an answer) from the last node
    local last=$((n - 1))
    wait_until 10 mn_reaches "${MN_NS[$last]}" "${MN_ADDR[0]}" ||
        fail "node $last cannot reach node 0 at ${MN_ADDR[0]} through the bridge"
}
# mn_netns_hosts: in each node's namespace this machine's host name resolves to that node's own
# address (ip netns exec bind-mounts /etc/netns/<ns>/hosts over /etc/hosts), as on real hosts.
mn_netns_hosts() {
    local i h; h=$(hostname)
    for i in "${!MN_NS[@]}"; do
        mkdir -p "/etc/netns/${MN_NS[$i]}" 2>/dev/null || skip "cannot write /etc/netns (per-namespace /etc/hosts)"
        printf '127.0.0.1 localhost\n%s %s %s\n' "${MN_ADDR[$i]}" "$h" "${h%%.*}" >"/etc/netns/${MN_NS[$i]}/hosts"
    done
    ip netns exec "${MN_NS[0]}" getent hosts "$h" | grep -q "^${MN_ADDR[0]//./\\.} " ||
        skip "ip netns exec does not give a namespace its own /etc/hosts here"
}
mn_reaches() {
    local out
    out=$(ip netns exec "$1" timeout 2 bash -c "</dev/tcp/$2/9" 2>&1)
    [[ "$out" == *refused* ]]
}

# check_world DIR_PREFIX "NPROC0 NPROC1 ..." STORE_PORT: the env files e.<node>.<local> written
# by "testworker env e.<node>.%l" on every node tell the world torchrun would give: global
# ranks by node rank, every size, and one MASTER_ADDR/MASTER_PORT/run id on every node.
check_world() {
    local nprocs=($1) store_port=$2 nn=${#nprocs[@]} total=0 base=0 k l f
    for k in "${nprocs[@]}"; do total=$((total + k)); done
    local maddr mport runid saddr
    maddr=$(envval e.0.0 MASTER_ADDR) mport=$(envval e.0.0 MASTER_PORT)
    runid=$(envval e.0.0 TORCHELASTIC_RUN_ID) saddr=$(envval e.0.0 MGPU_STORE_ADDR)
    [[ "$mport" =~ ^[0-9]+$ ]] || fail "MASTER_PORT '$mport'"
    [ "$mport" != "$store_port" ] || fail "MASTER_PORT is the store's --master_port $store_port: PyTorch's rank 0 could not bind it"
    for k in $(seq 0 $((nn - 1))); do
        for l in $(seq 0 $((nprocs[k] - 1))); do
            f=e.$k.$l
            [ -f "$f" ] || fail "node $k local rank $l did not run (files: $(ls))"
            expect_eq "$(envval $f RANK)" $((base + l)) "RANK of node $k local $l"
            expect_eq "$(envval $f LOCAL_RANK)" "$l" "LOCAL_RANK of node $k local $l"
            expect_eq "$(envval $f WORLD_SIZE)" "$total" "WORLD_SIZE on node $k"
            expect_eq "$(envval $f LOCAL_WORLD_SIZE)" "${nprocs[k]}" "LOCAL_WORLD_SIZE on node $k"
            expect_eq "$(envval $f GROUP_RANK)" "$k" "GROUP_RANK on node $k"
            expect_eq "$(envval $f GROUP_WORLD_SIZE)" "$nn" "GROUP_WORLD_SIZE on node $k"
            expect_eq "$(envval $f ROLE_RANK)" $((base + l)) "ROLE_RANK of node $k local $l"
            expect_eq "$(envval $f ROLE_WORLD_SIZE)" "$total" "ROLE_WORLD_SIZE on node $k"
            expect_eq "$(envval $f MASTER_ADDR)" "$maddr" "MASTER_ADDR on node $k (node 0 has $maddr)"
            expect_eq "$(envval $f MASTER_PORT)" "$mport" "MASTER_PORT on node $k (node 0 has $mport)"
            expect_eq "$(envval $f TORCHELASTIC_RUN_ID)" "$runid" "run id on node $k"
            expect_eq "$(envval $f TORCHELASTIC_RESTART_COUNT)" 0 "restart count on node $k"
            expect_eq "$(envval $f MGPU_NODE_RANK)" "$k" "MGPU_NODE_RANK on node $k"
            expect_eq "$(envval $f MGPU_NNODES)" "$nn" "MGPU_NNODES on node $k"
            expect_eq "$(envval $f MGPU_STORE_ADDR)" "$saddr" "MGPU_STORE_ADDR on node $k"
            expect_eq "$(envval $f MGPU_STORE_PORT)" "$store_port" "MGPU_STORE_PORT on node $k"
        done
        base=$((base + nprocs[k]))
    done
    [ "$saddr" != "<unset>" ] && [ -n "$saddr" ] || fail "MGPU_STORE_ADDR unset"
    [ ! -e "e.$nn.0" ] || fail "an extra node ran"
}
