# test_elastic.sh - a job that survives losing a node. Hosts of their own (network namespaces
# over a bridge), an elastic job (--nnodes MIN:MAX), and a node lost in each way a node goes:
# its machine crashes (its launcher and workers killed: the connection closes), its link is cut
# (no FIN, no RST: only the heartbeat tells), its launcher is stopped (SIGSTOP), the node that
# serves the store goes, one of three goes; and a node that arrives is admitted. Each case
# checks the exit status, the restart count, the surviving world, the time to detect against
# heartbeat_timeout, and that nothing of the job is left on any node. Then real programs ride
# through a node's crash: PyTorch's elastic pattern (a snapshot loaded at start, saved every few
# steps) and mgpu-worker resuming from its checkpoint at the new world size.

source "$(dirname "${BASH_SOURCE[0]}")/multinode/common.sh"

EL_HB=2 # heartbeat_timeout of these jobs, seconds

# el_args PORT ADDR NNODES [RESTARTS]: the options every node of an elastic job shares
el_args() {
    echo "--nnodes=$3 --rdzv_backend=c10d --rdzv_endpoint=$2:$1 --rdzv_id=el-$1 --rdzv_token=el-tok" \
        "--rdzv_conf=last_call_timeout=1,heartbeat_timeout=$EL_HB --max_restarts=${4:-1}" \
        "--grace_period=1 --nproc_per_node=2"
}
# The workers: their environment per attempt, a file once up, then they wait for "go".
EL_W=("$TW" env e.%r.%a touch up.%r.%a waitfile go)

# el_two NNODES: node A (serves the store) and node B in hosts of their own; MGPU_TEST_MARK
# tells their processes apart. Sets EL_PORT.
el_two() {
    mn_netns_setup 2
    EL_PORT=$(free_port)
    local a; a=$(el_args "$EL_PORT" "${MN_ADDR[0]}" "$1" "${2:-1}")
    MGPU_TEST_MARK=elA.$EL_PORT start_node A "${MN_NS[0]}" $a --local_addr="${MN_ADDR[0]}" \
        --summary sum.A "${EL_W[@]}"
    MGPU_TEST_MARK=elB.$EL_PORT start_node B "${MN_NS[1]}" $a --local_addr="${MN_ADDR[1]}" \
        --summary sum.B "${EL_W[@]}"
    wait_until 30 all_exist up.0.0 up.1.0 up.2.0 up.3.0 ||
        { dump_nodes err.A err.B; fail "the 2x2 job did not start"; }
}

# no_leftovers NAME...: nothing carrying the nodes' marks runs 5 s after the end
no_leftovers() {
    local n
    for n; do
        wait_until 5 eval "[ -z \"\$(procs_with_mark $n.$EL_PORT)\" ]" ||
            fail "processes of node $n left: $(procs_with_mark $n.$EL_PORT | xargs -r ps -o pid,args -p)"
    done
}

# launchers_of NAME: the launcher processes of a node (where no cgroup can be made, the
# launcher that runs the job is a child of the one started, which only waits: both are stopped)
launchers_of() {
    local p
    for p in $(procs_with_mark "$1.$EL_PORT"); do
        [ "$(cat /proc/$p/comm 2>/dev/null)" = mgpu-launch ] && echo "$p"
    done
}

# ms_until SECS PATTERN FILE: milliseconds from now until PATTERN is in FILE (fails after SECS)
ms_until() {
    local t0; t0=$(now_ms)
    wait_until "$1" grep -qE -- "$2" "$3" || { dump_nodes "$3"; fail "'$2' not in $3 after $1 s"; }
    echo $(($(now_ms) - t0))
}

# in_time MS: a silent node was given up after heartbeat_timeout, not before (less the time
# since its last ping, at most a fifth of it) and not much after (the store checks leases every
# 250 ms; a busy test machine adds some)
in_time() {
    [ "$1" -ge $((EL_HB * 800 - 100)) ] || fail "node B lost after $1 ms, before heartbeat_timeout=${EL_HB}s could pass"
    [ "$1" -le $((EL_HB * 1000 + 3000)) ] || fail "node B lost after $1 ms (heartbeat_timeout=${EL_HB}s)"
}

# survivor_world: node A restarted alone: ranks 0-1 of 2, one restart counted
survivor_world() {
    local t0=$1 ms
    wait_until 20 all_exist up.0.1 up.1.1 || { dump_nodes err.A; fail "node A did not restart"; }
    ms=$(($(now_ms) - t0))
    local r
    for r in 0 1; do
        expect_eq "$(envval e.$r.1 WORLD_SIZE)/$(envval e.$r.1 GROUP_WORLD_SIZE)/$(envval e.$r.1 GROUP_RANK)" \
            2/1/0 "WORLD_SIZE/GROUP_WORLD_SIZE/GROUP_RANK of rank $r after the restart"
        expect_eq "$(envval e.$r.1 TORCHELASTIC_RESTART_COUNT)" 1 "restart count of rank $r"
    done
    [ ! -e up.2.1 ] || fail "a rank 2 ran after the restart"
    echo "$ms"
}

# a_finishes: node A's job ends well, its summary lists both worlds
a_finishes() {
    touch go
    wait_node A 30
    expect_eq "${MN_RC[A]}" 0 "node A's exit status ($(dump_nodes err.A 2>&1))"
    command -v jq >/dev/null || return 0
    expect_eq "$(jq -r '[.worlds[] | "\(.attempt):\(.world_size):\(.nnodes)"] | join(" ")' sum.A)" \
        "0:4:2 1:2:1" "the worlds in node A's summary"
    expect_grep "$(jq -r '.worlds[0].end' sum.A)" "$1"
    expect_eq "$(jq -r '.worlds[1].end' sum.A)" succeeded "how the second attempt ended"
}

t_el_crash_survivor_restarts() {
    # node B's launcher is killed (a crash: its connection closes); A restarts alone at once
    el_two 1:2
    local t0; t0=$(now_ms)
    kill -KILL "${MN_PID[B]}"
    local det; det=$(ms_until 10 "lost: its launcher's connection closed" err.A)
    local rs; rs=$(survivor_world "$t0")
    wait_node B 5
    no_leftovers elB
    a_finishes "node [01] \(.*\) lost: its launcher's connection closed"
    no_leftovers elA
    expect_grep err.A "ranks [0-9]-[0-9] \(node [01], host ${MN_ADDR[1]//./\\.}\) lost"
    [ "$det" -lt 1500 ] || fail "a killed launcher was seen after ${det} ms (its connection closes at once)"
    echo "crash: node B lost after ${det} ms; node A's workers restarted ${rs} ms after the kill"
}

t_el_partition_link_down() {
    # node B's link goes down: no FIN, no RST; A gives B up after heartbeat_timeout, B gives
    # the store up after it, stops its workers and exits
    el_two 1:2
    local t0; t0=$(now_ms)
    ip -n "${MN_NS[1]}" link set mg0 down || fail "link down"
    local det; det=$(ms_until 10 "lost: heartbeat missed" err.A)
    local rs; rs=$(survivor_world "$t0")
    wait_node B 15
    [ "${MN_RC[B]}" -ne 0 ] || fail "the cut-off node B exited 0"
    expect_grep err.B "lost the store at ${MN_ADDR[0]//./\\.}:$EL_PORT"
    no_leftovers elB
    a_finishes "lost: heartbeat missed"
    no_leftovers elA
    in_time "$det"
    echo "partition (link down): node B lost after ${det} ms; A restarted ${rs} ms after the cut"
}

t_el_partition_dropped() {
    # every packet to and from node B dropped by a firewall (nft), the link up: the same
    command -v nft >/dev/null || skip "no nft (apt-get install nftables)"
    el_two 1:2
    ip netns exec "${MN_NS[1]}" nft -f - <<'EOF' || fail "nft"
table inet cut {
    chain in { type filter hook input priority 0; policy drop; }
    chain out { type filter hook output priority 0; policy drop; }
}
EOF
    local t0; t0=$(now_ms)
    local det; det=$(ms_until 10 "lost: heartbeat missed" err.A)
    local rs; rs=$(survivor_world "$t0")
    wait_node B 15
    [ "${MN_RC[B]}" -ne 0 ] || fail "the cut-off node B exited 0"
    expect_grep err.B "lost the store"
    no_leftovers elB
    a_finishes "lost: heartbeat missed"
    no_leftovers elA
    in_time "$det"
    echo "partition (packets dropped): node B lost after ${det} ms; A restarted ${rs} ms after the cut"
}

t_el_sigstop_launcher() {
    # node B's launcher stopped: its heartbeats stop, A goes on without it; B, continued, learns
    # it was given up, stops its workers and exits
    el_two 1:2
    local stopped; stopped=$(launchers_of elB)
    local t0; t0=$(now_ms)
    kill -STOP $stopped
    local det; det=$(ms_until 10 "lost: heartbeat missed" err.A)
    local rs; rs=$(survivor_world "$t0")
    kill -CONT $stopped
    wait_node B 15
    [ "${MN_RC[B]}" -ne 0 ] || fail "node B exited 0 after the others gave it up"
    expect_grep err.B "gave this node up|lost the store"
    no_leftovers elB
    a_finishes "lost: heartbeat missed"
    no_leftovers elA
    in_time "$det"
    echo "SIGSTOP: node B lost after ${det} ms; A restarted ${rs} ms after the stop"
}

t_el_store_host_lost() {
    # the node that serves the store dies: the other fails at once, naming it, and leaves
    # nothing (torchrun's single point too: see launcher/README.md)
    el_two 1:2
    local t0; t0=$(now_ms)
    kill -KILL "${MN_PID[A]}"
    wait_node B 10
    local ms=$(($(now_ms) - t0))
    [ "${MN_RC[B]}" -ne 0 ] || fail "node B exited 0 without its store"
    expect_grep err.B "store at ${MN_ADDR[0]//./\\.}:$EL_PORT went away"
    [ "$ms" -lt 5000 ] || fail "node B took ${ms} ms to give up its store"
    wait_node A 5
    no_leftovers elA elB
    echo "store host killed: node B stopped and exited ${MN_RC[B]} after ${ms} ms"
}

t_el_static_node_lost_stops_all() {
    # a static job (--nnodes=2) keeps stopping everywhere; the silent node is named, in time
    mn_netns_setup 2
    EL_PORT=$(free_port)
    local a="--nnodes=2 --master_addr=${MN_ADDR[0]} --master_port=$EL_PORT --rdzv_token=el-tok --rdzv_conf=heartbeat_timeout=$EL_HB --grace_period=1 --nproc_per_node=1"
    MGPU_TEST_MARK=elA.$EL_PORT start_node A "${MN_NS[0]}" $a --node_rank=0 "$TW" touch up.%r waitfile go
    MGPU_TEST_MARK=elB.$EL_PORT start_node B "${MN_NS[1]}" $a --node_rank=1 "$TW" touch up.%r waitfile go
    wait_until 30 all_exist up.0 up.1 || { dump_nodes err.A err.B; fail "the job did not start"; }
    local stopped; stopped=$(launchers_of elB)
    local t0; t0=$(now_ms)
    kill -STOP $stopped
    wait_node A 10
    local ms=$(($(now_ms) - t0))
    [ "${MN_RC[A]}" -ne 0 ] || fail "node A exited 0 after node B went silent"
    expect_grep err.A "rank 1 \(node 1, host [^)]*\) lost: heartbeat missed"
    [ "$ms" -ge $((EL_HB * 1000 - 500)) ] || fail "node A stopped after ${ms} ms, before heartbeat_timeout"
    kill -CONT $stopped
    wait_node B 15
    no_leftovers elA elB
    echo "static job: node 1 silent, node 0 stopped and exited after ${ms} ms"
}

t_el_three_nodes_lose_one() {
    # 3 hosts, --nnodes 2:3: the last node's launcher dies; the other two go on as a world of 4,
    # keeping their node ranks
    mn_netns_setup 3
    EL_PORT=$(free_port)
    local a; a=$(el_args "$EL_PORT" "${MN_ADDR[0]}" 2:3)
    local n
    for n in 0 1 2; do
        MGPU_TEST_MARK=el$n.$EL_PORT start_node $n "${MN_NS[$n]}" $a --local_addr="${MN_ADDR[$n]}" \
            "$TW" env e.%r.%a touch up.%r.%a waitfile go
        [ $n = 0 ] && sleep 0.3 # node 0 serves the store
    done
    wait_until 30 all_exist up.0.0 up.1.0 up.2.0 up.3.0 up.4.0 up.5.0 ||
        { dump_nodes err.0 err.1 err.2; fail "the 3x2 job did not start"; }
    # the node with ranks 4-5 goes (its workers' environment names it)
    local mark vnode; mark=$(envval e.4.0 MGPU_TEST_MARK)
    vnode=${mark#el}; vnode=${vnode%%.*}
    [[ "$vnode" =~ ^[012]$ ]] || fail "which node runs rank 4: '$mark'"
    local t0; t0=$(now_ms)
    kill -KILL "${MN_PID[$vnode]}"
    wait_until 20 all_exist up.0.1 up.1.1 up.2.1 up.3.1 ||
        { dump_nodes err.0 err.1 err.2; fail "the two nodes left did not restart"; }
    local rs=$(($(now_ms) - t0)) r
    for r in 0 1 2 3; do
        expect_eq "$(envval e.$r.1 WORLD_SIZE)/$(envval e.$r.1 GROUP_WORLD_SIZE)/$(envval e.$r.1 TORCHELASTIC_RESTART_COUNT)" \
            4/2/1 "WORLD_SIZE/GROUP_WORLD_SIZE/restart count of rank $r after the restart"
    done
    [ ! -e up.4.1 ] || fail "a rank 4 ran after the restart"
    touch go
    for n in 0 1 2; do
        [ "$n" = "$vnode" ] && continue
        wait_node $n 30
        expect_eq "${MN_RC[$n]}" 0 "node $n's exit status ($(dump_nodes err.$n 2>&1))"
    done
    wait_node "$vnode" 5
    EL_PORT=$EL_PORT no_leftovers el0 el1 el2
    echo "3 nodes, one killed: the two left restarted as a world of 4 after ${rs} ms"
}

t_el_node_arrival_admitted() {
    # a node started while a 1:2 job runs on one node is admitted at a restart of the group
    mn_netns_setup 2
    EL_PORT=$(free_port)
    local a; a=$(el_args "$EL_PORT" "${MN_ADDR[0]}" 1:2)
    MGPU_TEST_MARK=elA.$EL_PORT start_node A "${MN_NS[0]}" $a --local_addr="${MN_ADDR[0]}" "${EL_W[@]}"
    wait_until 30 all_exist up.0.0 up.1.0 || { dump_nodes err.A; fail "node A did not start"; }
    expect_eq "$(envval e.0.0 WORLD_SIZE)" 2 "world of node A alone"
    rm -f e.0.0 e.1.0
    local t0; t0=$(now_ms)
    MGPU_TEST_MARK=elB.$EL_PORT start_node B "${MN_NS[1]}" $a --local_addr="${MN_ADDR[1]}" "${EL_W[@]}"
    wait_until 30 all_exist e.0.0 e.1.0 e.2.0 e.3.0 || { dump_nodes err.A err.B; fail "node B was not admitted"; }
    local ms=$(($(now_ms) - t0)) r
    for r in 0 1 2 3; do
        expect_eq "$(envval e.$r.0 WORLD_SIZE)/$(envval e.$r.0 TORCHELASTIC_RESTART_COUNT)/$(envval e.$r.0 MGPU_ATTEMPT)" \
            4/0/1 "WORLD_SIZE/restart count/attempt of rank $r once B is in"
    done
    touch go
    wait_node A 30; wait_node B 30
    expect_eq "${MN_RC[A]}/${MN_RC[B]}" 0/0 "exit statuses ($(dump_nodes err.A err.B 2>&1))"
    no_leftovers elA elB
    echo "arrival: node B's workers ran in a world of 4 ${ms} ms after it started"
}

t_el_torch_elastic_script_survives_a_crash() {
    # PyTorch's elastic pattern (torch.distributed.elastic's examples: load a snapshot at start,
    # save one every few steps) under --nnodes 1:2: node B crashes mid-run; node A restarts
    # alone, resumes from the snapshot and finishes, as under torchrun
    need_torch
    mn_netns_setup 2
    export GLOO_SOCKET_IFNAME=mg0 # gloo would otherwise resolve the host name
    EL_PORT=$(free_port)
    cat >elastic.py <<'PY'
import os, sys, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
snap = "snapshot.pt"
step, w = 0, torch.zeros(4)
if os.path.exists(snap):
    s = torch.load(snap)
    step, w = s["step"], s["w"]
print(f"start rank={rank} world={world} step={step} "
      f"restart={os.environ['TORCHELASTIC_RESTART_COUNT']}", flush=True)
while step < 40:
    g = torch.ones(4)
    dist.all_reduce(g)
    w += g / world  # one a step, whatever the world
    step += 1
    if rank == 0 and step % 5 == 0:
        torch.save({"step": step, "w": w}, snap + ".tmp")
        os.replace(snap + ".tmp", snap)
    time.sleep(0.05)
print(f"done rank={rank} step={step} w={w[0].item():.1f}", flush=True)
PY
    local a; a=$(el_args "$EL_PORT" "${MN_ADDR[0]}" 1:2)
    a=${a/--nproc_per_node=2/--nproc_per_node=1}
    PYTHON_EXEC=$MN_PY MGPU_TEST_MARK=elA.$EL_PORT start_node A "${MN_NS[0]}" $a --local_addr="${MN_ADDR[0]}" elastic.py
    PYTHON_EXEC=$MN_PY MGPU_TEST_MARK=elB.$EL_PORT start_node B "${MN_NS[1]}" $a --local_addr="${MN_ADDR[1]}" elastic.py
    # mid-run: a snapshot exists, the job is not done
    wait_until 60 all_exist snapshot.pt || { dump_nodes err.A err.B out.A out.B; fail "no snapshot"; }
    grep -q "done" out.A out.B && fail "the job ended before the crash could come"
    kill -KILL "${MN_PID[B]}"
    wait_node A 60
    wait_node B 5
    expect_eq "${MN_RC[A]}" 0 "node A's exit status ($(dump_nodes err.A out.A 2>&1))"
    expect_grep out.A 'start rank=0 world=1 step=[1-9][0-9]* restart=1'
    expect_grep out.A 'done rank=0 step=40 w=40\.0'
    no_leftovers elA elB
}

t_el_mgpu_worker_resumes_at_the_new_world_size() {
    # mgpu-worker on 2 nodes x 2 CPU ranks with a checkpoint: node B's workers never get past
    # their start and its launcher dies; node A restarts as a world of 2 and resumes from the
    # checkpoint. Its result is byte for byte that of a 2-rank run resumed from the same
    # checkpoint by hand: the same data order a one-node resume gives.
    mn_netns_setup 2
    EL_PORT=$(free_port)
    local cfg="$MGPU_ROOT/configs/train.cfg" over="epochs=2 log_interval=10 metrics_file="
    local a; a=$(el_args "$EL_PORT" "${MN_ADDR[0]}" 1:2)
    # first part: both nodes train to step 20 and save the checkpoint
    start_node A "${MN_NS[0]}" $a --local_addr="${MN_ADDR[0]}" --rdzv_id=first "$WORKER" "$cfg" $over checkpoint="$PWD/ck.bin" max_steps=20
    start_node B "${MN_NS[1]}" $a --local_addr="${MN_ADDR[1]}" --rdzv_id=first "$WORKER" "$cfg" $over checkpoint="$PWD/ck.bin" max_steps=20
    wait_node A 60; wait_node B 60
    expect_eq "${MN_RC[A]}/${MN_RC[B]}" 0/0 "the first part ($(dump_nodes err.A err.B 2>&1))"
    cp ck.bin ref.bin
    # second part, to step 40: node B's workers stop themselves at once, then B's launcher dies
    MGPU_TEST_MARK=elA.$EL_PORT start_node A "${MN_NS[0]}" $a --local_addr="${MN_ADDR[0]}" "$WORKER" "$cfg" $over checkpoint="$PWD/ck.bin" max_steps=40
    MGPU_TEST_MARK=elB.$EL_PORT start_node B "${MN_NS[1]}" $a --local_addr="${MN_ADDR[1]}" \
        /bin/sh -c 'kill -STOP $$; exec "$0" "$@"' "$WORKER" "$cfg" $over checkpoint="$PWD/ck.bin" max_steps=40
    local p stopped=0
    for _ in $(seq 100); do
        stopped=0
        for p in $(procs_with_mark elB.$EL_PORT); do
            [ "$(awk '{print $3}' /proc/$p/stat 2>/dev/null)" = T ] && stopped=$((stopped + 1))
        done
        [ "$stopped" -ge 2 ] && break
        sleep 0.05
    done
    [ "$stopped" -ge 2 ] || { dump_nodes err.A err.B; fail "node B's workers did not start"; }
    kill -KILL "${MN_PID[B]}"
    wait_node A 60
    wait_node B 5
    expect_eq "${MN_RC[A]}" 0 "node A's exit status ($(dump_nodes err.A out.A 2>&1))"
    expect_grep out.A 'resumed from .*ck\.bin at epoch [0-9]+, step 20'
    no_leftovers elA elB
    # the reference: 2 ranks on one node resume from the same checkpoint
    "$LAUNCH" --nproc_per_node=2 "$WORKER" "$cfg" $over checkpoint="$PWD/ref.bin" max_steps=40 >out.ref 2>err.ref ||
        { cat err.ref; fail "the reference run failed"; }
    cmp ck.bin ref.bin || fail "the elastic run's checkpoint differs from a 2-rank resume's"
}

t_el_workers_hear_the_lost_ranks() {
    # libmgpu workers in a CPU all-reduce across the nodes when node B's link is cut: the
    # collective would wait out its own timeout (300 s); node A's launcher names the lost ranks
    # on its workers' pages once the heartbeat is missed, and their all-reduce fails with them
    mn_netns_setup 2
    EL_PORT=$(free_port)
    local a; a=$(el_args "$EL_PORT" "${MN_ADDR[0]}" 1:2 0)
    MGPU_TEST_MARK=elA.$EL_PORT start_node A "${MN_NS[0]}" $a --local_addr="${MN_ADDR[0]}" "$TW" ids ids.%r allreduce_loop 120
    MGPU_TEST_MARK=elB.$EL_PORT start_node B "${MN_NS[1]}" $a --local_addr="${MN_ADDR[1]}" "$TW" ids ids.%r allreduce_loop 120
    wait_until 30 all_exist ids.0 ids.1 ids.2 ids.3 || { dump_nodes err.A err.B; fail "the job did not start"; }
    sleep 0.5 # all-reduces under way
    # the ranks node B runs: 2-3, or 0-1 when it came first
    local lost=2
    if tr '\0' '\n' </proc/"$(cut -d' ' -f1 ids.0)"/environ | grep -qx "MGPU_TEST_MARK=elB.$EL_PORT"; then lost=0; fi
    local t0; t0=$(now_ms)
    ip -n "${MN_NS[1]}" link set mg0 down || fail "link down"
    wait_until 10 grep -q "allreduce_loop: error" err.A || { dump_nodes err.A; fail "node A's workers did not hear of the loss"; }
    local ms=$(($(now_ms) - t0))
    expect_grep err.A "^\[rank[0-9]\]:allreduce_loop: error after [0-9.]+ s: .*ranks $lost-$((lost + 1)) \(node [01], host ${MN_ADDR[1]//./\\.}\) lost: heartbeat missed for $EL_HB s"
    [ "$ms" -le $((EL_HB * 1000 + 3000)) ] || fail "the workers heard of the loss after ${ms} ms (heartbeat_timeout=${EL_HB}s)"
    wait_node A 15; wait_node B 15
    [ "${MN_RC[A]}" -ne 0 ] || fail "node A exited 0 with no restart left"
    no_leftovers elA elB
    echo "workers: the all-reduce failed naming the lost ranks ${ms} ms after the cut"
}
