# test_multinode.sh - several "nodes" on one machine: launchers meet through node 0's
# store and agree on the world, first on loopback (distinct --node_rank), then each in a network
# namespace of its own with --rdzv_token. Global ranks by node rank with different
# --nproc_per_node, one MASTER_ADDR/MASTER_PORT everywhere (a port other than the store's), a
# real PyTorch gloo job, one failure stopping every node, a missing node, a duplicate node rank,
# restarts on every node together, elastic --nnodes MIN:MAX, and a launcher killed mid-run.

source "$(dirname "${BASH_SOURCE[0]}")/multinode/common.sh"

# static_args NNODES PORT ADDR: the options every node of a static job shares
static_args() { echo "--nnodes=$1 --master_addr=$3 --master_port=$2"; }

# ------------------------------------------------------------------ the world, on loopback

t_mn_loopback_two_nodes_world() {
    local port; port=$(free_port)
    local a; a=$(static_args 2 "$port" 127.0.0.1)
    # node 1 first: it waits for node 0's store
    start_node 1 - $a --node_rank=1 --nproc_per_node=1 "$TW" env e.1.%l print "hello %r"
    start_node 0 - $a --node_rank=0 --nproc_per_node=2 "$TW" env e.0.%l print "hello %r"
    wait_node 0 30; wait_node 1 30
    expect_eq "${MN_RC[0]}/${MN_RC[1]}" 0/0 "exit statuses of nodes 0/1 ($(dump_nodes err.0 err.1 2>&1))"
    check_world "2 1" "$port"
    expect_eq "$(envval e.0.0 MASTER_ADDR)" 127.0.0.1 "MASTER_ADDR"
    expect_eq "$(envval e.1.0 MGPU_STORE_ADDR)" 127.0.0.1 "MGPU_STORE_ADDR"
    # the workers' output carries their global rank
    expect_grep out.1 '^\[rank2\]:hello 2$'
    expect_grep out.0 '^\[rank1\]:hello 1$'
}

t_mn_loopback_ipv6() {
    # node 0 at ::1: the store of a static job and of an elastic one ([::1]:PORT) is served on
    # IPv6, and mgpu-worker's CPU ranks on two nodes reach each other over it
    "$PY3" -c 'import socket; socket.socket(socket.AF_INET6).bind(("::1", 0))' 2>/dev/null ||
        skip "no IPv6 loopback here"
    local port; port=$(free_port)
    local a; a=$(static_args 2 "$port" ::1)
    start_node 1 - $a --node_rank=1 --nproc_per_node=1 --rdzv_conf join_timeout=20 "$TW" env e.1.%l
    start_node 0 - $a --node_rank=0 --nproc_per_node=2 --rdzv_conf join_timeout=20 "$TW" env e.0.%l
    wait_node 0 30; wait_node 1 30
    expect_eq "${MN_RC[0]}/${MN_RC[1]}" 0/0 "static, exit statuses ($(dump_nodes err.0 err.1 2>&1))"
    check_world "2 1" "$port"
    expect_eq "$(envval e.1.0 MASTER_ADDR)" ::1 "MASTER_ADDR"
    rm -f e.*
    port=$(free_port)
    a=$(static_args 2 "$port" ::1)
    start_node w1 - $a --node_rank=1 --nproc_per_node=1 "$WORKER" "$MGPU_ROOT/configs/demo.cfg"
    start_node w0 - $a --node_rank=0 --nproc_per_node=1 "$WORKER" "$MGPU_ROOT/configs/demo.cfg"
    wait_node w0 60; wait_node w1 60
    expect_eq "${MN_RC[w0]}/${MN_RC[w1]}" 0/0 "mgpu-worker, exit statuses ($(dump_nodes err.w0 err.w1 2>&1))"
    expect_grep out.w0 '^\[rank0\]:ddp: '
    port=$(free_port)
    a="--nnodes=1:2 --rdzv_backend=c10d --rdzv_endpoint=[::1]:$port --rdzv_id=v6-$port"
    start_node e0 - $a --rdzv_conf join_timeout=20,last_call_timeout=2 "$TW" env e.%r
    start_node e1 - $a --rdzv_conf join_timeout=20,last_call_timeout=2 "$TW" env e.%r
    wait_node e0 30; wait_node e1 30
    expect_eq "${MN_RC[e0]}/${MN_RC[e1]}" 0/0 "elastic, exit statuses ($(dump_nodes err.e0 err.e1 2>&1))"
    expect_eq "$(envval e.0 WORLD_SIZE)/$(envval e.1 WORLD_SIZE)" 2/2 "WORLD_SIZE of the elastic job"
}

t_mn_loopback_nnodes_mismatch_refused_before_workers() {
    # node 1 says 3 nodes, node 0 says 2: both stop at the rendezvous, naming it, no worker runs
    local port; port=$(free_port)
    start_node 1 - $(static_args 3 "$port" 127.0.0.1) --node_rank=1 --rdzv_conf join_timeout=20 \
        "$TW" touch ran.1
    start_node 0 - $(static_args 2 "$port" 127.0.0.1) --node_rank=0 --rdzv_conf join_timeout=20 \
        "$TW" touch ran.0
    wait_node 0 15; wait_node 1 15
    [ "${MN_RC[0]}" != 0 ] && [ "${MN_RC[1]}" != 0 ] ||
        fail "exit statuses ${MN_RC[0]}/${MN_RC[1]} ($(dump_nodes err.0 err.1 2>&1))"
    for n in 0 1; do
        expect_grep err.$n 'node rank 1 was started with --nnodes=3, node 0 with --nnodes=2'
    done
    [ ! -e ran.0 ] && [ ! -e ran.1 ] || fail "a worker ran"
}

t_mn_loopback_store_bound_to_loopback() {
    # the store of a job whose nodes are all this host listens on loopback only
    local port; port=$(free_port)
    local a; a=$(static_args 2 "$port" 127.0.0.1)
    start_node 0 - $a --node_rank=0 --nproc_per_node=1 "$TW" touch up.0 waitfile go
    start_node 1 - $a --node_rank=1 --nproc_per_node=1 "$TW" touch up.1 waitfile go
    wait_until 30 all_exist up.0 up.1 || { dump_nodes err.0 err.1; fail "workers did not start"; }
    # /proc/net/tcp: listening sockets (state 0A) on the store's port
    local hex; hex=$(printf '%04X' "$port")
    local l; l=$(awk -v p=":$hex" '$4 == "0A" && $2 ~ p"$" {print $2}' /proc/net/tcp /proc/net/tcp6)
    touch go
    wait_node 0 30; wait_node 1 30
    expect_eq "${MN_RC[0]}/${MN_RC[1]}" 0/0 "exit statuses ($(dump_nodes err.0 err.1 2>&1))"
    [ -n "$l" ] || fail "nothing listened on the store's port $port"
    expect_eq "$l" "0100007F:$hex" "the store's listening address (loopback only when every node is this host)"
}

t_mn_loopback_roles_rank_within_role() {
    # torchrun's roles: ROLE_RANK and ROLE_WORLD_SIZE count the workers of one role over every
    # node (a master 0 of 1, trainers 0-2 of 3), RANK and WORLD_SIZE the whole world
    local port; port=$(free_port)
    local a; a=$(static_args 3 "$port" 127.0.0.1)
    start_node 2 - $a --node_rank=2 --nproc_per_node=1 --role=trainer "$TW" env e.2.%l
    start_node 1 - $a --node_rank=1 --nproc_per_node=2 --role=trainer "$TW" env e.1.%l
    start_node 0 - $a --node_rank=0 --nproc_per_node=1 --role=master "$TW" env e.0.%l
    wait_node 0 30; wait_node 1 30; wait_node 2 30
    expect_eq "${MN_RC[0]}/${MN_RC[1]}/${MN_RC[2]}" 0/0/0 "exit statuses ($(dump_nodes err.0 err.1 err.2 2>&1))"
    local f want
    for want in "e.0.0 master 0 0 1" "e.1.0 trainer 1 0 3" "e.1.1 trainer 2 1 3" "e.2.0 trainer 3 2 3"; do
        set -- $want
        f=$1
        expect_eq "$(envval $f ROLE_NAME)/$(envval $f RANK)/$(envval $f ROLE_RANK)/$(envval $f ROLE_WORLD_SIZE)/$(envval $f WORLD_SIZE)" \
            "$2/$3/$4/$5/4" "ROLE_NAME/RANK/ROLE_RANK/ROLE_WORLD_SIZE/WORLD_SIZE in $f"
    done
}

t_mn_loopback_port_rule() {
    # several nodes: the launchers' store on --master_port P, MASTER_PORT = P + 1 everywhere,
    # a rule a firewall can follow
    local port; port=$(free_port)
    local a; a=$(static_args 2 "$port" 127.0.0.1)
    start_node 1 - $a --node_rank=1 --nproc_per_node=1 "$TW" env e.1.%l
    start_node 0 - $a --node_rank=0 --nproc_per_node=1 "$TW" env e.0.%l
    wait_node 0 30; wait_node 1 30
    expect_eq "${MN_RC[0]}/${MN_RC[1]}" 0/0 "exit statuses ($(dump_nodes err.0 err.1 2>&1))"
    local f
    for f in e.0.0 e.1.0; do
        expect_eq "$(envval $f MGPU_STORE_PORT)" "$port" "the store's port in $f"
        expect_eq "$(envval $f MASTER_PORT)" $((port + 1)) "MASTER_PORT in $f (--master_port + 1)"
    done
    # with --rdzv_endpoint HOST:P, the same rule from the endpoint's port
    port=$(free_port)
    a="--nnodes=1:2 --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:$port --rdzv_id=pr-$port --rdzv_conf=last_call_timeout=1"
    start_node A - $a --nproc_per_node=1 "$TW" env eA.%l
    start_node B - $a --nproc_per_node=1 "$TW" env eB.%l
    wait_node A 30; wait_node B 30
    expect_eq "${MN_RC[A]}/${MN_RC[B]}" 0/0 "elastic exit statuses ($(dump_nodes err.A err.B 2>&1))"
    expect_eq "$(envval eA.0 MASTER_PORT)/$(envval eB.0 MASTER_PORT)" "$((port + 1))/$((port + 1))" \
        "MASTER_PORT of the elastic nodes (the endpoint's port + 1)"
}

t_mn_elastic_last_call_is_said() {
    # --nnodes=1:2: once the minimum came, the wait for more nodes is said, once, by default
    local port; port=$(free_port)
    start_node A - --nnodes=1:2 --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:$port \
        --rdzv_id=lc-$port --rdzv_conf=last_call_timeout=2 --nproc_per_node=1 "$TW" exit 0
    wait_node A 30
    expect_eq "${MN_RC[A]}" 0 "exit status ($(dump_nodes err.A 2>&1))"
    expect_grep err.A 'waiting up to 2 s \(last_call_timeout\) for more nodes'
    expect_eq "$(grep -c 'last_call_timeout' err.A)" 1 "times the last call is said"
}

t_mn_loopback_three_nodes_ranks_by_node_rank() {
    # 2+1+3 workers, nodes started in reverse order: ranks follow node ranks, not arrival
    local port; port=$(free_port)
    local a; a=$(static_args 3 "$port" 127.0.0.1)
    start_node 2 - $a --node_rank=2 --nproc_per_node=3 "$TW" env e.2.%l
    start_node 1 - $a --node_rank=1 --nproc_per_node=1 "$TW" env e.1.%l
    start_node 0 - $a --node_rank=0 --nproc_per_node=2 "$TW" env e.0.%l
    wait_node 0 30; wait_node 1 30; wait_node 2 30
    expect_eq "${MN_RC[0]}/${MN_RC[1]}/${MN_RC[2]}" 0/0/0 "exit statuses ($(dump_nodes err.0 err.1 err.2 2>&1))"
    check_world "2 1 3" "$port"
}

t_mn_loopback_static_rdzv_endpoint() {
    # torchrun's static rendezvous meets at --rdzv_endpoint HOST:PORT when it is given (not at
    # --master_addr:--master_port, here left to their defaults)
    local port; port=$(free_port)
    local a="--nnodes=2 --rdzv_endpoint=127.0.0.1:$port"
    start_node 1 - $a --node_rank=1 --nproc_per_node=1 "$TW" env e.1.%l
    start_node 0 - $a --node_rank=0 --nproc_per_node=2 "$TW" env e.0.%l
    wait_node 0 30; wait_node 1 30
    expect_eq "${MN_RC[0]}/${MN_RC[1]}" 0/0 "exit statuses of nodes 0/1 ($(dump_nodes err.0 err.1 2>&1))"
    check_world "2 1" "$port"
    expect_eq "$(envval e.1.0 MGPU_STORE_PORT)" "$port" "the store's port (the endpoint's)"
}

t_mn_loopback_waiting_is_said() {
    # a node that waits for the others says so, once, after 10 s (not only at the join timeout)
    local port; port=$(free_port)
    local a; a=$(static_args 2 "$port" 127.0.0.1)
    local t0; t0=$(now_ms)
    start_node 0 - $a --node_rank=0 --nproc_per_node=1 "$TW" env e.0.%l
    wait_until 30 grep -q 'waiting for node rank(s) 1 of 2 to join' err.0 ||
        fail "node 0 said nothing while waiting ($(dump_nodes err.0 2>&1))"
    local ms=$(($(now_ms) - t0))
    [ "$ms" -ge 9000 ] || fail "said it after ${ms} ms, before 10 s"
    start_node 1 - $a --node_rank=1 --nproc_per_node=1 "$TW" env e.1.%l
    wait_node 0 30; wait_node 1 30
    expect_eq "${MN_RC[0]}/${MN_RC[1]}" 0/0 "exit statuses of nodes 0/1 ($(dump_nodes err.0 err.1 2>&1))"
    expect_eq "$(grep -c waiting err.0)" 1 "lines saying node 0 waits"
    check_world "1 1" "$port"
}

t_mn_loopback_waiting_for_the_store_is_said() {
    # a node that comes before node 0's store says so after 10 s, then joins when it comes
    local port; port=$(free_port)
    local a; a=$(static_args 2 "$port" 127.0.0.1)
    start_node 1 - $a --node_rank=1 --nproc_per_node=1 "$TW" env e.1.%l
    wait_until 30 grep -q "no store at 127.0.0.1:$port yet" err.1 ||
        fail "node 1 said nothing while waiting ($(dump_nodes err.1 2>&1))"
    start_node 0 - $a --node_rank=0 --nproc_per_node=1 "$TW" env e.0.%l
    wait_node 0 30; wait_node 1 30
    expect_eq "${MN_RC[0]}/${MN_RC[1]}" 0/0 "exit statuses of nodes 0/1 ($(dump_nodes err.0 err.1 2>&1))"
    expect_eq "$(grep -c 'no store' err.1)" 1 "lines saying node 1 waits"
    check_world "1 1" "$port"
}

# ------------------------------------------------------------------ network namespaces

t_mn_netns_three_nodes_with_token() {
    mn_netns_setup 3
    local port; port=$(free_port)
    local a; a=$(static_args 3 "$port" "${MN_ADDR[0]}")
    local k np=(2 1 3)
    for k in 2 1 0; do
        start_node $k "${MN_NS[$k]}" $a --node_rank=$k --nproc_per_node=${np[k]} \
            --rdzv_token=s3cret-mn --local_addr="${MN_ADDR[$k]}" "$TW" env e.$k.%l
    done
    wait_node 0 40; wait_node 1 40; wait_node 2 40
    expect_eq "${MN_RC[0]}/${MN_RC[1]}/${MN_RC[2]}" 0/0/0 "exit statuses ($(dump_nodes err.0 err.1 err.2 2>&1))"
    check_world "2 1 3" "$port"
    expect_eq "$(envval e.2.0 MASTER_ADDR)" "${MN_ADDR[0]}" "MASTER_ADDR (node 0's address)"
    expect_eq "$(envval e.1.0 MGPU_STORE_ADDR)" "${MN_ADDR[0]}" "MGPU_STORE_ADDR"
    expect_eq "$(envval e.1.0 MGPU_STORE_TOKEN)" s3cret-mn "MGPU_STORE_TOKEN given to the workers"
}

t_mn_netns_token_required() {
    # several nodes on a non-loopback address without a token: refused before anything starts
    mn_netns_setup 2
    local port; port=$(free_port)
    local a; a=$(static_args 2 "$port" "${MN_ADDR[0]}")
    start_node 0 "${MN_NS[0]}" $a --node_rank=0 --nproc_per_node=1 "$TW" touch ran.0
    start_node 1 "${MN_NS[1]}" $a --node_rank=1 --nproc_per_node=1 "$TW" touch ran.1
    wait_node 0 20; wait_node 1 20
    expect_eq "${MN_RC[0]}/${MN_RC[1]}" 2/2 "exit statuses without --rdzv_token"
    expect_grep err.0 'rdzv_token'
    expect_grep err.1 'rdzv_token'
    [ ! -e ran.0 ] && [ ! -e ran.1 ] || fail "workers started without a token"
}

t_mn_netns_torch_gloo_two_nodes() {
    # a real PyTorch job: init_process_group("gloo", env://) across 2 nodes, world size 4
    [ -x "$MN_PY" ] || skip "$MN_PY not found"
    "$MN_PY" -c 'import torch, torch.distributed as d; assert d.is_available()' >/dev/null 2>&1 ||
        skip "torch.distributed is not importable from $MN_PY (apt-get install python3-torch)"
    local ns0=- ns1=- addr=127.0.0.1 tok=""
    if ip netns add "mgpu$$probe" 2>/dev/null; then
        ip netns del "mgpu$$probe"
        mn_netns_setup 2
        ns0=${MN_NS[0]} ns1=${MN_NS[1]} addr=${MN_ADDR[0]} tok=--rdzv_token=gloo-tok
        export GLOO_SOCKET_IFNAME=mg0 # gloo would otherwise resolve the host name
    fi
    cat >allreduce.py <<'EOF'
import os, datetime
import torch
import torch.distributed as dist
dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])
t = torch.tensor([float(rank + 1), 1.0])
dist.all_reduce(t, op=dist.ReduceOp.SUM)
assert t[0].item() == world * (world + 1) / 2 and t[1].item() == world, t
g = [torch.zeros(1) for _ in range(world)]
dist.all_gather(g, torch.tensor([float(rank)]))
assert [x.item() for x in g] == [float(r) for r in range(world)], g
dist.barrier()
print(f"rank {rank}/{world} node {os.environ['GROUP_RANK']} sum {t[0].item():g} ok", flush=True)
dist.destroy_process_group()
EOF
    local port; port=$(free_port)
    local a; a=$(static_args 2 "$port" "$addr")
    export PYTHON_EXEC=$MN_PY
    start_node 1 "$ns1" $a --node_rank=1 --nproc_per_node=2 $tok allreduce.py
    start_node 0 "$ns0" $a --node_rank=0 --nproc_per_node=2 $tok allreduce.py
    wait_node 0 90; wait_node 1 90
    expect_eq "${MN_RC[0]}/${MN_RC[1]}" 0/0 "exit statuses of the gloo job ($(dump_nodes err.0 err.1 2>&1))"
    expect_grep out.0 '^\[rank0\]:rank 0/4 node 0 sum 10 ok$'
    expect_grep out.0 '^\[rank1\]:rank 1/4 node 0 sum 10 ok$'
    expect_grep out.1 '^\[rank2\]:rank 2/4 node 1 sum 10 ok$'
    expect_grep out.1 '^\[rank3\]:rank 3/4 node 1 sum 10 ok$'
}

# ------------------------------------------------------------------ failures

# fail_on NODE NS0 NS1 ADDR TOKEN: a worker of node NODE exits 3 once all 4 workers run; the
# others wait forever. Both nodes must stop promptly and exit non-zero; node 0's report and
# summary name the node and rank that failed first.
fail_on() {
    local bad=$1 ns0=$2 ns1=$3 addr=$4 tok=$5
    local port; port=$(free_port)
    local a; a=$(static_args 2 "$port" "$addr")
    local badrank=$((bad == 0 ? 1 : 3)) t0
    # ready files live in this folder, seen by every namespace: all 4 workers run before the failure
    start_node 0 "$ns0" $a --node_rank=0 --nproc_per_node=2 --grace_period=1 --summary=s.0.json $tok \
        "$TW" trap sig.%r TERM touch r.%r only $badrank waitall r. 4 only $badrank exit 3 pause
    start_node 1 "$ns1" $a --node_rank=1 --nproc_per_node=2 --grace_period=1 --summary=s.1.json $tok \
        "$TW" trap sig.%r TERM touch r.%r only $badrank waitall r. 4 only $badrank exit 3 pause
    wait_until 30 all_exist r.0 r.1 r.2 r.3 || { dump_nodes err.0 err.1; fail "the 4 workers did not start"; }
    t0=$(now_ms)
    wait_node 0 20; wait_node 1 20
    local ms=$(($(now_ms) - t0))
    [ "${MN_RC[0]}" -ne 0 ] && [ "${MN_RC[1]}" -ne 0 ] ||
        fail "exit statuses ${MN_RC[0]}/${MN_RC[1]}: both nodes must fail ($(dump_nodes err.0 err.1 2>&1))"
    expect_eq "${MN_RC[$bad]}" 3 "exit status of the failing node"
    [ "$ms" -lt 15000 ] || fail "teardown of both nodes took ${ms} ms (grace period 1 s)"
    # the others were stopped with SIGTERM, on both nodes
    local r
    for r in 0 1 2 3; do
        [ "$r" = "$badrank" ] && continue
        expect_grep sig.$r '^TERM'
    done
    # node 0's report names the node and rank that failed first
    expect_grep err.0 'Root Cause'
    expect_grep err.0 "node +: $bad of 2"
    expect_grep err.0 "rank +: $badrank \(local_rank: 1\)"
    "$PY3" - s.0.json "$bad" "$badrank" <<'EOF' || fail "node 0's summary: $(cat s.0.json)"
import json, sys
d = json.load(open(sys.argv[1])); bad, badrank = int(sys.argv[2]), int(sys.argv[3])
assert d["result"] == "failed" and d["exit_code"] != 0, d
rc = d["root_cause"]
assert rc is not None and rc["node_rank"] == bad and rc["rank"] == badrank and rc["exit_code"] == 3, rc
assert d["nnodes"] == 2 and d["world_size"] == 4 and d["node_rank"] == 0, d
EOF
}

t_mn_failure_on_node1_stops_node0() { fail_on 1 - - 127.0.0.1 ""; }
t_mn_failure_on_node0_stops_node1() { fail_on 0 - - 127.0.0.1 ""; }

t_mn_netns_failure_on_node1_stops_node0() {
    mn_netns_setup 2
    fail_on 1 "${MN_NS[0]}" "${MN_NS[1]}" "${MN_ADDR[0]}" --rdzv_token=fail-tok
}

t_mn_missing_node() {
    # node 1 never comes: node 0 says so after the join timeout, naming it, and exits non-zero
    local port; port=$(free_port)
    local t0; t0=$(now_ms)
    start_node 0 - $(static_args 2 "$port" 127.0.0.1) --node_rank=0 --nproc_per_node=1 \
        --rdzv_conf join_timeout=2 "$TW" touch ran
    wait_node 0 20
    local ms=$(($(now_ms) - t0))
    [ "${MN_RC[0]}" -ne 0 ] || fail "exit status 0 with a node missing"
    [ "$ms" -ge 1500 ] || fail "gave up after ${ms} ms, before the join timeout of 2 s"
    [ "$ms" -lt 10000 ] || fail "took ${ms} ms with join_timeout=2"
    expect_grep err.0 'node rank\(s\) 1 of 2|node 1\b|node rank 1\b'
    expect_grep err.0 'join'
    [ ! -e ran ] || fail "a worker started without the whole world"
}

t_mn_missing_node_three() {
    # nodes 0 and 1 come, node 2 never: both fail after the join timeout, both naming node 2
    local port; port=$(free_port)
    local a t0; a=$(static_args 3 "$port" 127.0.0.1)
    t0=$(now_ms)
    start_node 0 - $a --node_rank=0 --nproc_per_node=1 --rdzv_conf join_timeout=3 "$TW" touch ran
    start_node 1 - $a --node_rank=1 --nproc_per_node=1 --rdzv_conf join_timeout=3 "$TW" touch ran
    wait_node 0 30; wait_node 1 30
    local ms=$(($(now_ms) - t0))
    [ "${MN_RC[0]}" -ne 0 ] && [ "${MN_RC[1]}" -ne 0 ] || fail "exit statuses ${MN_RC[0]}/${MN_RC[1]}"
    expect_grep err.0 'node rank\(s\) 2 of 3'
    expect_grep err.1 'node rank\(s\) 2 of 3'
    [ "$ms" -lt 12000 ] || fail "both nodes gave up after ${ms} ms with join_timeout=3 ($(dump_nodes err.0 err.1 2>&1))"
    [ ! -e ran ] || fail "a worker started without the whole world"
}

t_mn_missing_node0() {
    # the node that serves the store never comes: a clear error, no hang
    local port; port=$(free_port)
    start_node 1 - $(static_args 2 "$port" 127.0.0.1) --node_rank=1 --nproc_per_node=1 \
        --rdzv_conf join_timeout=2 "$TW" touch ran
    wait_node 1 20
    [ "${MN_RC[1]}" -ne 0 ] || fail "exit status 0 without node 0"
    expect_grep err.1 "127.0.0.1:$port"
    expect_grep err.1 'node 0'
    [ ! -e ran ] || fail "a worker started without node 0"
}

t_mn_duplicate_node_rank() {
    # the same command line started twice as node 1 (same host, same --nproc_per_node): the
    # second is refused at once; the first goes on and the job succeeds once node 2 comes
    local port; port=$(free_port)
    local a; a=$(static_args 3 "$port" 127.0.0.1)
    start_node 0 - $a --node_rank=0 --nproc_per_node=1 --rdzv_conf join_timeout=30 "$TW" env e.0.%l
    start_node 1 - $a --node_rank=1 --nproc_per_node=1 --rdzv_conf join_timeout=30 "$TW" env e.1.%l
    start_node 1b - $a --node_rank=1 --nproc_per_node=1 --rdzv_conf join_timeout=30 "$TW" env e.1.%l
    # one of the two node-1 launchers must be refused well before the join timeout
    local end=$((SECONDS + 15)) loser=""
    while [ $SECONDS -lt $end ] && [ -z "$loser" ]; do
        alive "${MN_PID[1]}" || loser=1
        alive "${MN_PID[1b]}" || loser=1b
        [ -z "$loser" ] && sleep 0.05
    done
    [ -n "$loser" ] || fail "both launchers with --node_rank=1 were accepted (still waiting after 15 s)"
    wait_node $loser 5
    [ "${MN_RC[$loser]}" -ne 0 ] || fail "the duplicate exited 0"
    expect_grep err.$loser 'node rank 1 is already taken'
    start_node 2 - $a --node_rank=2 --nproc_per_node=1 --rdzv_conf join_timeout=30 "$TW" env e.2.%l
    local winner=1; [ "$loser" = 1 ] && winner=1b
    wait_node 0 30; wait_node $winner 30; wait_node 2 30
    expect_eq "${MN_RC[0]}/${MN_RC[$winner]}/${MN_RC[2]}" 0/0/0 "the job after the refusal ($(dump_nodes err.0 err.$winner err.2 2>&1))"
    check_world "1 1 1" "$port"
}

t_mn_duplicate_node_rank0() {
    # a second node 0: refused (its store cannot serve the same address), non-zero, named
    local port; port=$(free_port)
    local a; a=$(static_args 2 "$port" 127.0.0.1)
    start_node 0 - $a --node_rank=0 --nproc_per_node=1 --rdzv_conf join_timeout=30 "$TW" touch up.0 waitfile go
    wait_until 10 eval "awk '\$4 == \"0A\"' /proc/net/tcp | grep -q ':$(printf '%04X' "$port") '" ||
        fail "node 0's store did not listen"
    start_node 0b - $a --node_rank=0 --nproc_per_node=1 --rdzv_conf join_timeout=30 "$TW" touch up.0b
    wait_node 0b 15
    [ "${MN_RC[0b]}" -ne 0 ] || fail "a second node 0 exited 0"
    expect_grep err.0b "$port"
    [ ! -e up.0b ] || fail "the second node 0 started workers"
    start_node 1 - $a --node_rank=1 --nproc_per_node=1 --rdzv_conf join_timeout=30 "$TW" touch up.1 waitfile go
    wait_until 30 all_exist up.0 up.1 || fail "the job did not start after the refusal"
    touch go
    wait_node 0 30; wait_node 1 30
    expect_eq "${MN_RC[0]}/${MN_RC[1]}" 0/0 "the job after the refusal ($(dump_nodes err.0 err.1 2>&1))"
}

t_mn_netns_duplicate_node_rank0() {
    # a second "node 0" on another host: it can serve a store of its own there, but must be
    # refused by node 0's store (node rank 0 is taken), and the real job must go on
    mn_netns_setup 3
    local port; port=$(free_port)
    local a; a=$(static_args 2 "$port" "${MN_ADDR[0]}")
    local hex; hex=$(printf '%04X' "$port")
    # --local_addr: each "host" has a name of its own, as real hosts do (this test is not about
    # two launchers with the same descriptor; t_mn_duplicate_node_rank is)
    start_node 0 "${MN_NS[0]}" $a --node_rank=0 --nproc_per_node=1 --rdzv_token=dup0 \
        --local_addr="${MN_ADDR[0]}" --rdzv_conf join_timeout=30 "$TW" touch up.0 waitfile go
    wait_until 10 eval "ip netns exec ${MN_NS[0]} awk '\$4 == \"0A\"' /proc/net/tcp | grep -q ':$hex '" ||
        fail "node 0's store did not listen"
    start_node 0b "${MN_NS[1]}" $a --node_rank=0 --nproc_per_node=1 --rdzv_token=dup0 \
        --local_addr="${MN_ADDR[1]}" --rdzv_conf join_timeout=30 "$TW" touch up.0b
    wait_node 0b 15
    [ "${MN_RC[0b]}" -ne 0 ] || fail "a second node 0 on another host exited 0"
    expect_grep err.0b 'node rank 0 is already taken'
    [ ! -e up.0b ] || fail "the second node 0 started workers"
    start_node 1 "${MN_NS[2]}" $a --node_rank=1 --nproc_per_node=1 --rdzv_token=dup0 \
        --local_addr="${MN_ADDR[2]}" --rdzv_conf join_timeout=30 "$TW" touch up.1 waitfile go
    wait_until 30 all_exist up.0 up.1 || { dump_nodes err.0 err.1; fail "the job did not start after the refusal"; }
    touch go
    wait_node 0 30; wait_node 1 30
    expect_eq "${MN_RC[0]}/${MN_RC[1]}" 0/0 "the job after the refusal ($(dump_nodes err.0 err.1 2>&1))"
}

t_mn_restart_on_both_nodes() {
    # rank 3 (node 1) fails in attempt 0: both nodes restart together and succeed in attempt 1
    local port; port=$(free_port)
    local a; a=$(static_args 2 "$port" 127.0.0.1)
    local w=("$TW" env e.%r.%a touch r.%a.%r waitall r.%a. 4 only 3 fail_until 1 5 exit 0)
    start_node 1 - $a --node_rank=1 --nproc_per_node=2 --max_restarts=1 --grace_period=1 --summary=s.1.json "${w[@]}"
    start_node 0 - $a --node_rank=0 --nproc_per_node=2 --max_restarts=1 --grace_period=1 --summary=s.0.json "${w[@]}"
    wait_node 0 40; wait_node 1 40
    expect_eq "${MN_RC[0]}/${MN_RC[1]}" 0/0 "exit statuses ($(dump_nodes err.0 err.1 2>&1))"
    local r at
    for at in 0 1; do
        for r in 0 1 2 3; do
            [ -f e.$r.$at ] || fail "rank $r did not run in attempt $at: $(ls)"
            expect_eq "$(envval e.$r.$at TORCHELASTIC_RESTART_COUNT)" $at "restart count of rank $r in attempt $at"
            expect_eq "$(envval e.$r.$at RANK)" $r "rank in attempt $at"
            expect_eq "$(envval e.$r.$at WORLD_SIZE)" 4 "world size in attempt $at"
        done
        expect_eq "$(envval e.3.$at MASTER_PORT)" "$(envval e.0.$at MASTER_PORT)" "MASTER_PORT of both nodes in attempt $at"
    done
    [ ! -e e.0.2 ] && [ ! -e e.3.2 ] || fail "a third attempt ran"
    expect_grep err.0 'restarting'
    expect_grep err.1 'restarting'
    "$PY3" - s.0.json s.1.json <<'EOF' || fail "summaries: $(cat s.0.json s.1.json)"
import json, sys
for p in sys.argv[1:]:
    d = json.load(open(p))
    assert d["result"] == "succeeded" and d["attempts"] == 2, (p, d["attempts"], d["result"])
EOF
}

t_mn_elastic_two_of_three() {
    # --nnodes 2:3 with the c10d endpoint: 2 launchers form a world after the last call; ranks
    # are dense whichever arrives first
    local port; port=$(free_port)
    local a="--nnodes=2:3 --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:$port --rdzv_id=el-$port --rdzv_conf=last_call_timeout=1"
    local t0; t0=$(now_ms)
    start_node A - $a --nproc_per_node=2 "$TW" env eA.%l
    start_node B - $a --nproc_per_node=1 "$TW" env eB.%l
    wait_node A 30; wait_node B 30
    local ms=$(($(now_ms) - t0))
    expect_eq "${MN_RC[A]}/${MN_RC[B]}" 0/0 "exit statuses ($(dump_nodes err.A err.B 2>&1))"
    [ "$ms" -lt 15000 ] || fail "took ${ms} ms with last_call_timeout=1"
    local f ranks="" groups="" runid
    runid=$(envval eA.0 TORCHELASTIC_RUN_ID)
    expect_eq "$runid" "el-$port" "run id"
    for f in eA.0 eA.1 eB.0; do
        [ -f $f ] || fail "$f missing: $(ls)"
        expect_eq "$(envval $f WORLD_SIZE)" 3 "WORLD_SIZE in $f"
        expect_eq "$(envval $f GROUP_WORLD_SIZE)" 2 "GROUP_WORLD_SIZE in $f"
        expect_eq "$(envval $f MASTER_ADDR)" "$(envval eA.0 MASTER_ADDR)" "MASTER_ADDR in $f"
        expect_eq "$(envval $f MASTER_PORT)" "$(envval eA.0 MASTER_PORT)" "MASTER_PORT in $f"
        expect_eq "$(envval $f TORCHELASTIC_RUN_ID)" "$runid" "run id in $f"
        ranks+="$(envval $f RANK) "
    done
    expect_eq "$(echo $ranks | tr ' ' '\n' | sort -n | tr '\n' ' ')" "0 1 2 " "global ranks"
    # a node's ranks are contiguous and follow its group rank
    local ga gb; ga=$(envval eA.0 GROUP_RANK) gb=$(envval eB.0 GROUP_RANK)
    expect_eq "$(echo "$ga $gb" | tr ' ' '\n' | sort | tr '\n' ' ')" "0 1 " "group ranks"
    expect_eq "$(envval eA.1 RANK)" $(($(envval eA.0 RANK) + 1)) "node A's ranks contiguous"
    if [ "$ga" = 0 ]; then expect_eq "$(envval eA.0 RANK)/$(envval eB.0 RANK)" 0/2 "ranks by group rank"
    else expect_eq "$(envval eB.0 RANK)/$(envval eA.0 RANK)" 0/1 "ranks by group rank"; fi
    [ "$(envval eA.0 MASTER_PORT)" != "$port" ] || fail "MASTER_PORT is the rendezvous endpoint's port"
}

t_mn_elastic_third_node_within_last_call() {
    # --nnodes 2:3: a third launcher that comes during the last call joins the same world
    local port; port=$(free_port)
    local a="--nnodes=2:3 --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:$port --rdzv_id=el3-$port --rdzv_conf=last_call_timeout=20"
    start_node A - $a --nproc_per_node=1 "$TW" env eA.%l
    start_node B - $a --nproc_per_node=1 "$TW" env eB.%l
    start_node C - $a --nproc_per_node=2 "$TW" env eC.%l
    local t0; t0=$(now_ms)
    wait_node A 40; wait_node B 40; wait_node C 40
    expect_eq "${MN_RC[A]}/${MN_RC[B]}/${MN_RC[C]}" 0/0/0 "exit statuses ($(dump_nodes err.A err.B err.C 2>&1))"
    local ms=$(($(now_ms) - t0))
    [ "$ms" -lt 15000 ] || fail "${ms} ms: MAX nodes had come, the last call should end at once"
    local f ranks=""
    for f in eA.0 eB.0 eC.0 eC.1; do
        expect_eq "$(envval $f WORLD_SIZE)" 4 "WORLD_SIZE in $f"
        expect_eq "$(envval $f GROUP_WORLD_SIZE)" 3 "GROUP_WORLD_SIZE in $f"
        ranks+="$(envval $f RANK) "
    done
    expect_eq "$(echo $ranks | tr ' ' '\n' | sort -n | tr '\n' ' ')" "0 1 2 3 " "global ranks"
}

t_mn_elastic_late_node_admitted() {
    # a launcher that comes after the round closed, while the job has fewer than MAX nodes, is
    # admitted at a restart of the group (torchrun's membership change): a new world of 3, and
    # the restart count not consumed
    local port; port=$(free_port)
    local a="--nnodes=2:3 --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:$port --rdzv_id=late-$port --rdzv_conf=last_call_timeout=1 --nproc_per_node=1"
    local w=("$TW" env e.%r.\$MGPU_ATTEMPT touch up.%r waitfile go)
    start_node A - $a "$TW" env e.%r touch up.%r waitfile go
    start_node B - $a "$TW" env e.%r touch up.%r waitfile go
    wait_until 30 all_exist up.0 up.1 || { dump_nodes err.A err.B; fail "the first two nodes did not start"; }
    rm -f e.0 e.1 up.0 up.1
    start_node C - $a "$TW" env e.%r touch up.%r waitfile go
    wait_until 30 all_exist up.0 up.1 up.2 || { dump_nodes err.A err.B err.C; fail "the late node was not admitted"; }
    touch go
    wait_node A 30; wait_node B 30; wait_node C 30
    expect_eq "${MN_RC[A]}/${MN_RC[B]}/${MN_RC[C]}" 0/0/0 "exit statuses ($(dump_nodes err.A err.B err.C 2>&1))"
    local r
    for r in 0 1 2; do
        expect_eq "$(envval e.$r WORLD_SIZE)/$(envval e.$r GROUP_WORLD_SIZE)" 3/3 "world of rank $r after the restart"
        expect_eq "$(envval e.$r TORCHELASTIC_RESTART_COUNT)" 0 "restart count of rank $r (an arrival is no failure)"
        expect_eq "$(envval e.$r MGPU_ATTEMPT)" 1 "attempt of rank $r"
    done
    expect_grep err.C 'waits to join at its next restart'
    expect_grep err.A 'waiting to join'
}

t_mn_elastic_late_node_full_round() {
    # a late node when the job has its maximum of nodes waits, and hears when the job ends
    local port; port=$(free_port)
    local a="--nnodes=1:2 --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:$port --rdzv_id=full-$port --rdzv_conf=last_call_timeout=1 --nproc_per_node=1"
    start_node A - $a "$TW" touch up.%r waitfile go
    start_node B - $a "$TW" touch up.%r waitfile go
    wait_until 30 all_exist up.0 up.1 || { dump_nodes err.A err.B; fail "the first two nodes did not start"; }
    start_node C - $a "$TW" touch late
    wait_until 10 grep -q 'maximum of nodes' err.C || { dump_nodes err.C; fail "the late node did not say it waits"; }
    [ ! -e late ] || fail "the late node started a worker"
    touch go
    wait_node A 30; wait_node B 30; wait_node C 15
    expect_eq "${MN_RC[A]}/${MN_RC[B]}" 0/0 "the job that formed ($(dump_nodes err.A err.B 2>&1))"
    [ "${MN_RC[C]}" -ne 0 ] || fail "the late node exited 0"
    expect_grep err.C 'the job ended before this node could join'
    [ ! -e late ] || fail "the late node started a worker"
}

t_mn_elastic_min_not_reached() {
    # --nnodes 2:3 and only one launcher: a clear error after the join timeout
    local port; port=$(free_port)
    local t0; t0=$(now_ms)
    start_node A - --nnodes=2:3 --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:$port \
        --rdzv_conf=join_timeout=2 --nproc_per_node=1 "$TW" touch ran
    wait_node A 20
    local ms=$(($(now_ms) - t0))
    [ "${MN_RC[A]}" -ne 0 ] || fail "exit 0 with 1 of at least 2 nodes"
    [ "$ms" -lt 10000 ] || fail "took ${ms} ms with join_timeout=2"
    expect_grep err.A '1 of at least 2 nodes'
    [ ! -e ran ] || fail "a worker started"
}

t_mn_elastic_restart_on_both_nodes() {
    # elastic mode with --max_restarts: a failure in attempt 0 restarts both nodes together
    local port; port=$(free_port)
    local a="--nnodes=2:3 --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:$port --rdzv_id=elr-$port --rdzv_conf=last_call_timeout=1 --nproc_per_node=2 --max_restarts=1 --grace_period=1"
    local w=("$TW" env e.%r.%a touch r.%a.%r waitall r.%a. 4 only 3 fail_until 1 5 exit 0)
    start_node A - $a "${w[@]}"
    start_node B - $a "${w[@]}"
    wait_node A 40; wait_node B 40
    expect_eq "${MN_RC[A]}/${MN_RC[B]}" 0/0 "exit statuses ($(dump_nodes err.A err.B 2>&1))"
    local r at
    for at in 0 1; do
        for r in 0 1 2 3; do
            [ -f e.$r.$at ] || fail "rank $r did not run in attempt $at: $(ls)"
            expect_eq "$(envval e.$r.$at TORCHELASTIC_RESTART_COUNT)" $at "restart count of rank $r"
            expect_eq "$(envval e.$r.$at WORLD_SIZE)" 4 "world size in attempt $at"
        done
    done
    [ ! -e e.0.2 ] || fail "a third attempt ran"
}

t_mn_restarts_exhausted_on_both_nodes() {
    # rank 1 (node 1) fails in every attempt: 3 attempts on both nodes, then both exit with its
    # code; both summaries name node 1 and rank 1
    local port; port=$(free_port)
    local a; a=$(static_args 2 "$port" 127.0.0.1)
    start_node 1 - $a --node_rank=1 --nproc_per_node=1 --max_restarts=2 --grace_period=1 --summary=s.1.json \
        "$TW" env e.%r.%a touch r.%a.%r waitall r.%a. 2 only 1 exit 6
    start_node 0 - $a --node_rank=0 --nproc_per_node=1 --max_restarts=2 --grace_period=1 --summary=s.0.json \
        "$TW" env e.%r.%a touch r.%a.%r waitall r.%a. 2 pause
    wait_node 0 60; wait_node 1 60
    expect_eq "${MN_RC[0]}/${MN_RC[1]}" 6/6 "exit statuses ($(dump_nodes err.0 err.1 2>&1))"
    local at
    for at in 0 1 2; do all_exist e.0.$at e.1.$at || fail "attempt $at did not run on both nodes: $(ls)"; done
    [ ! -e e.0.3 ] && [ ! -e e.1.3 ] || fail "a fourth attempt ran"
    "$PY3" - s.0.json s.1.json <<'EOF' || fail "summaries: $(cat s.0.json s.1.json)"
import json, sys
d0, d1 = (json.load(open(p)) for p in sys.argv[1:])
for d in (d0, d1):
    assert d["result"] == "failed" and d["exit_code"] == 6 and d["attempts"] == 3, d
    rc = d["root_cause"]
    assert rc["node_rank"] == 1 and rc["rank"] == 1 and rc["exit_code"] == 6, rc
assert len(d1["failed_attempts"]) == 3, d1["failed_attempts"]
EOF
}

t_mn_netns_elastic_two_hosts() {
    # --nnodes 2:2 with the c10d endpoint on host A's address: A serves the store (its
    # --local_addr is the endpoint's host), B joins; MASTER_ADDR is the address of the node
    # that got group rank 0
    mn_netns_setup 2
    local port; port=$(free_port)
    local a="--nnodes=2:2 --rdzv_backend=c10d --rdzv_endpoint=${MN_ADDR[0]}:$port --rdzv_id=eln-$port --rdzv_token=el-tok --nproc_per_node=1"
    start_node A "${MN_NS[0]}" $a --local_addr="${MN_ADDR[0]}" "$TW" env eA.%l
    start_node B "${MN_NS[1]}" $a --local_addr="${MN_ADDR[1]}" "$TW" env eB.%l
    wait_node A 40; wait_node B 40
    expect_eq "${MN_RC[A]}/${MN_RC[B]}" 0/0 "exit statuses ($(dump_nodes err.A err.B 2>&1))"
    local ga; ga=$(envval eA.0 GROUP_RANK)
    expect_eq "$(envval eA.0 WORLD_SIZE)/$(envval eB.0 WORLD_SIZE)" 2/2 "WORLD_SIZE"
    expect_eq "$(envval eA.0 MASTER_ADDR)" "$(envval eB.0 MASTER_ADDR)" "one MASTER_ADDR"
    expect_eq "$(envval eA.0 MASTER_PORT)" "$(envval eB.0 MASTER_PORT)" "one MASTER_PORT"
    if [ "$ga" = 0 ]; then expect_eq "$(envval eA.0 MASTER_ADDR)" "${MN_ADDR[0]}" "MASTER_ADDR (A has group rank 0)"
    else expect_eq "$(envval eA.0 MASTER_ADDR)" "${MN_ADDR[1]}" "MASTER_ADDR (B has group rank 0)"; fi
    expect_eq "$(envval eB.0 MGPU_STORE_ADDR)" "${MN_ADDR[0]}" "MGPU_STORE_ADDR"
    expect_eq "$(envval eB.0 MGPU_STORE_TOKEN)" el-tok "MGPU_STORE_TOKEN"
}

t_mn_netns_elastic_endpoint_is_host_ip() {
    # torchrun's c10d host decision (its rendezvous handler's is-host test): a launcher hosts the rendezvous
    # store when the endpoint's host is this machine's host name or IP. Here each "host" is a
    # namespace whose host name resolves to its own address, and the endpoint is host A's IP,
    # given to both the same way (no --local_addr, no is_host): A must serve, B join
    mn_netns_setup 2
    mn_netns_hosts
    local port; port=$(free_port)
    local a="--nnodes=2:2 --rdzv_backend=c10d --rdzv_endpoint=${MN_ADDR[0]}:$port --rdzv_id=ip-$port --rdzv_token=ip-tok --rdzv_conf=join_timeout=5 --nproc_per_node=1"
    start_node A "${MN_NS[0]}" $a "$TW" env eA.%l
    start_node B "${MN_NS[1]}" $a "$TW" env eB.%l
    wait_node A 40; wait_node B 40
    expect_eq "${MN_RC[A]}/${MN_RC[B]}" 0/0 "exit statuses: nobody hosted the endpoint ${MN_ADDR[0]}:$port? ($(dump_nodes err.A err.B 2>&1))"
    expect_eq "$(envval eA.0 WORLD_SIZE)/$(envval eB.0 WORLD_SIZE)" 2/2 "WORLD_SIZE"
}

# ------------------------------------------------------------------ a launcher killed

# kill9 VICTIM SURVIVOR: kill -9 of node VICTIM's launcher while every worker waits; node
# SURVIVOR must stop its workers and exit non-zero within a bounded time, not hang.
kill9() {
    local victim=$1 survivor=$2
    local port; port=$(free_port)
    local a; a=$(static_args 2 "$port" 127.0.0.1)
    start_node 0 - $a --node_rank=0 --nproc_per_node=1 --grace_period=1 "$TW" trap sig.%r TERM touch r.%r pause
    start_node 1 - $a --node_rank=1 --nproc_per_node=1 --grace_period=1 "$TW" trap sig.%r TERM touch r.%r pause
    wait_until 30 all_exist r.0 r.1 || { dump_nodes err.0 err.1; fail "workers did not start"; }
    kill -KILL "${MN_PID[$victim]}"
    local t0; t0=$(now_ms)
    wait_node "$victim" 5
    # the issue: "one failure anywhere stops the group everywhere (every launcher watches the
    # store)"; a launcher's death is seen at once by the store (its connections close)
    wait_node "$survivor" "${MGPU_TEST_KILL9_DEADLINE:-30}"
    local ms=$(($(now_ms) - t0))
    [ "${MN_RC[$survivor]}" -ne 0 ] || fail "node $survivor exited 0 after node $victim's launcher died"
    expect_grep sig.$survivor '^TERM'
    # names the node that went, or (node 0) the store it served
    expect_grep err.$survivor "node.* $victim|node\(s\) $victim$([ "$victim" = 0 ] && echo "|store|127\.0\.0\.1:$port")"
    echo "node $survivor exited ${MN_RC[$survivor]} ${ms} ms after node $victim's launcher was killed"
}

t_mn_kill9_node1_launcher() { kill9 1 0; }
t_mn_kill9_node0_launcher() { kill9 0 1; }

t_mn_sigterm_node0_stops_node1() {
    # SIGTERM to node 0's launcher (a scheduler's cancel): node 1 stops too, both non-zero
    local port; port=$(free_port)
    local a; a=$(static_args 2 "$port" 127.0.0.1)
    start_node 0 - $a --node_rank=0 --nproc_per_node=1 --grace_period=1 "$TW" trap sig.%r TERM touch r.%r pause
    start_node 1 - $a --node_rank=1 --nproc_per_node=1 --grace_period=1 "$TW" trap sig.%r TERM touch r.%r pause
    wait_until 30 all_exist r.0 r.1 || { dump_nodes err.0 err.1; fail "workers did not start"; }
    kill -TERM "${MN_PID[0]}"
    wait_node 0 15; wait_node 1 15
    expect_eq "${MN_RC[0]}" 143 "node 0's exit status (SIGTERM)"
    [ "${MN_RC[1]}" -ne 0 ] || fail "node 1 exited 0"
    expect_grep sig.0 '^TERM'
    expect_grep sig.1 '^TERM'
    expect_grep err.1 'node 0'
}

# ------------------------------------------------------------ one node done before the others

t_mn_node_done_first_waits_as_long_as_the_others_run() {
    # node 1's workers succeed at once; node 0's run 33 s more (a final checkpoint, an
    # evaluation): node 1 waits for them, well past its grace period + 30 s, saying so once,
    # and both exit 0
    skip_under_sanitizers "33 s of waiting, no more code than the tests beside it"
    local port; port=$(free_port)
    local a; a=$(static_args 2 "$port" 127.0.0.1)
    start_node 0 - $a --node_rank=0 --nproc_per_node=1 --grace_period=1 "$TW" sleep 33
    start_node 1 - $a --node_rank=1 --nproc_per_node=1 --grace_period=1 "$TW" touch done.%r
    wait_node 1 60; wait_node 0 15
    expect_eq "${MN_RC[0]}/${MN_RC[1]}" 0/0 "exit statuses of nodes 0/1 ($(dump_nodes err.0 err.1 2>&1))"
    [ -f done.1 ] || fail "node 1's worker did not run"
    # says why it is still there, once, after 10 s
    expect_grep err.1 "attempt 0: this node's workers are done; waiting for node rank\(s\) 0 to finish theirs"
    expect_eq "$(grep -c 'waiting for node rank' err.1)" 1 "times node 1 says it waits"
}

t_mn_node_done_first_leaves_on_sigterm() {
    # SIGTERM to the launcher of a node whose workers are over, while it waits for the others:
    # it leaves at once (143), and the others hear it as that node stopped, as during the run
    local port; port=$(free_port)
    local a; a=$(static_args 2 "$port" 127.0.0.1)
    start_node 0 - $a --node_rank=0 --nproc_per_node=1 --grace_period=1 "$TW" trap sig.%r TERM touch r.%r pause
    start_node 1 - $a --node_rank=1 --nproc_per_node=1 --grace_period=1 "$TW" touch done.%r
    wait_until 30 all_exist r.0 done.1 || { dump_nodes err.0 err.1; fail "workers did not start"; }
    sleep 0.5 # node 1's worker exits and its launcher waits for node 0's
    local t0; t0=$(now_ms)
    kill -TERM "${MN_PID[1]}"
    wait_node 1 10
    local ms=$(($(now_ms) - t0))
    wait_node 0 15
    expect_eq "${MN_RC[1]}" 143 "node 1's exit status (SIGTERM) ($(dump_nodes err.1 2>&1))"
    [ "$ms" -lt 3000 ] || fail "node 1 left ${ms} ms after its SIGTERM"
    expect_grep err.1 'received SIGTERM while waiting for the other nodes to finish'
    [ "${MN_RC[0]}" -ne 0 ] || fail "node 0 exited 0"
    expect_grep sig.0 '^TERM'
    expect_grep err.0 'node 1.*stopped by signal 15'
}

t_mn_node_done_first_hears_node0_die() {
    # node 0's launcher (the store's) is killed while node 1, its workers over, waits for it:
    # node 1 says so at once and fails, not after its grace period + 30 s
    local port; port=$(free_port)
    local a; a=$(static_args 2 "$port" 127.0.0.1)
    start_node 0 - $a --node_rank=0 --nproc_per_node=1 --grace_period=1 "$TW" touch r.%r pause
    start_node 1 - $a --node_rank=1 --nproc_per_node=1 --grace_period=1 "$TW" touch done.%r
    wait_until 30 all_exist r.0 done.1 || { dump_nodes err.0 err.1; fail "workers did not start"; }
    sleep 0.5
    local t0; t0=$(now_ms)
    kill -KILL "${MN_PID[0]}"
    wait_node 1 20
    local ms=$(($(now_ms) - t0))
    expect_eq "${MN_RC[1]}" 1 "node 1's exit status ($(dump_nodes err.1 2>&1))"
    [ "$ms" -lt 5000 ] || fail "node 1 heard of node 0's death ${ms} ms after it"
    expect_grep err.1 "while it waited for the other nodes to finish attempt 0, this node lost the store at 127\.0\.0\.1:$port"
    echo "node 1 left ${ms} ms after node 0's launcher was killed"
}
