# test_store_abuse.sh - the launcher's store under abuse while a job runs: garbage bytes, an
# oversized frame header (payload length 0xFFFFFFFF), requests before HELLO, proofs of a wrong
# token, a wrong version, half frames held open: each such connection is closed with a log line,
# nothing else is harmed (the job ends normally, a good client still gets answers). A flood of
# connections that never authenticate cannot stop a job from forming. And the token rules:
# several nodes on a non-loopback address need --rdzv_token (exit 2 otherwise); a node with the
# wrong token is turned away.

source "$(dirname "${BASH_SOURCE[0]}")/multinode/common.sh"
ABUSE="$(dirname "${BASH_SOURCE[0]}")/multinode/store_abuse.py"
FLOOD="$(dirname "${BASH_SOURCE[0]}")/multinode/store_flood.py"

# abuse_job NNODES TOKEN_OPTION: workers of every node write their env and wait for "go";
# store_abuse.py runs against the store the workers see, then releases them.
abuse_job() {
    local nn=$1 tokopt=$2
    local port; port=$(free_port)
    local k
    for k in $(seq 0 $((nn - 1))); do
        if [ "$nn" -gt 1 ]; then
            start_node $k - --nnodes=$nn --node_rank=$k --master_addr=127.0.0.1 --master_port=$port \
                $tokopt --nproc_per_node=2 "$TW" env e.$k.%l touch up.$k.%l waitfile go exit 0
        else
            start_node $k - --nproc_per_node=2 $tokopt "$TW" env e.$k.%l touch up.$k.%l waitfile go exit 0
        fi
    done
    local ups=()
    for k in $(seq 0 $((nn - 1))); do ups+=(up.$k.0 up.$k.1); done
    wait_until 30 all_exist "${ups[@]}" ||
        { dump_nodes err.*; fail "the workers did not start"; }
    local addr sport tok
    addr=$(envval e.$((nn - 1)).1 MGPU_STORE_ADDR) sport=$(envval e.$((nn - 1)).1 MGPU_STORE_PORT)
    tok=$(envval e.$((nn - 1)).1 MGPU_STORE_TOKEN)
    [ "$addr" != "<unset>" ] && [ "$sport" != "<unset>" ] || fail "MGPU_STORE_ADDR/PORT not given to the workers"
    [ "$tok" != "<unset>" ] || tok=""
    # abuse, then release the workers (touch go) while two bad connections are still held open
    "$PY3" "$ABUSE" "$addr" "$sport" "$tok" released >abuse.out 2>&1 &
    local ap=$!
    MN_KILL+=("$ap")
    wait_until 60 eval "grep -q 'store answers ok after the abuse' abuse.out || ! alive $ap" &&
        grep -q 'store answers ok after the abuse' abuse.out ||
        { cat abuse.out >&2; fail "the abuse script did not finish"; }
    touch go
    for k in $(seq 0 $((nn - 1))); do wait_node $k 40; done
    touch released
    wait $ap || { cat abuse.out >&2; fail "abuse script failed"; }
    cat abuse.out
    for k in $(seq 0 $((nn - 1))); do
        expect_eq "${MN_RC[$k]}" 0 "exit status of node $k after the abuse ($(dump_nodes err.$k abuse.out 2>&1))"
    done
    # the serving launcher (node 0) logged every connection it closed
    expect_grep err.0 'store: .*closing connection from 127\.0\.0\.1:[0-9]+: .*'
    [ -z "$tok" ] || expect_grep err.0 'wrong store token'
    local n want; n=$(grep -c 'store: .*clos' err.0) want=$(grep -c '^closed ok' abuse.out)
    [ "$n" -ge "$want" ] || fail "$n log lines about closed connections for $want abuses: $(cat err.0)"
    echo "$port" >store_port
}

t_store_abuse_mid_job_two_nodes() {
    # a 2-node job on loopback with a token: the store serves both launchers while it is abused,
    # and they need it to end the attempt together
    abuse_job 2 --rdzv_token=abuse-secret
    expect_eq "$(envval e.1.0 MGPU_STORE_TOKEN)" abuse-secret "MGPU_STORE_TOKEN"
}

t_store_abuse_mid_job_single_node() {
    # one node: the store is the launcher's own, on loopback, with a generated token
    abuse_job 1 ""
    local tok; tok=$(envval e.0.0 MGPU_STORE_TOKEN)
    [ ${#tok} -ge 16 ] || fail "single-node store token '$tok': expected a generated secret"
    expect_eq "$(envval e.0.1 MGPU_STORE_TOKEN)" "$tok" "one token for every local worker"
    expect_eq "$(envval e.0.0 MGPU_STORE_ADDR)" 127.0.0.1 "single-node store address"
}

t_store_abuse_two_nodes_without_token_on_loopback() {
    # all nodes on this host: no token needed, the abuse is still refused frame by frame
    abuse_job 2 ""
}

# a non-loopback address of this machine, or nothing
host_addr() { hostname -I 2>/dev/null | tr ' ' '\n' | grep -E '^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$' | grep -v '^127\.' | head -n 1; }

t_store_token_required_off_loopback() {
    # several nodes on a non-loopback address without --rdzv_token: exit 2, nothing started
    local port; port=$(free_port)
    local addr; addr=$(host_addr)
    [ -n "$addr" ] || addr=10.255.255.1
    local k
    for k in 0 1; do
        run_launch --nnodes=2 --node_rank=$k --master_addr=$addr --master_port=$port --nproc_per_node=1 \
            --rdzv_conf join_timeout=2 "$TW" touch ran
        expect_eq "$rc" 2 "exit status of node $k on $addr without a token ($(cat err))"
        expect_grep err '--rdzv_token'
    done
    # the elastic form too
    run_launch --nnodes=1:2 --rdzv_backend=c10d --rdzv_endpoint=$addr:$port --nproc_per_node=1 \
        --rdzv_conf join_timeout=2 "$TW" touch ran
    expect_eq "$rc" 2 "exit status of an elastic node on $addr without a token ($(cat err))"
    expect_grep err '--rdzv_token'
    [ ! -e ran ] || fail "a worker started without a token"
}

t_store_token_from_env_off_loopback() {
    # PET_RDZV_TOKEN is as good as --rdzv_token: two nodes on this host's own non-loopback
    # address meet and run
    local addr; addr=$(host_addr)
    [ -n "$addr" ] || skip "this machine has no non-loopback IPv4 address"
    local port; port=$(free_port)
    export PET_RDZV_TOKEN=env-secret
    start_node 1 - --nnodes=2 --node_rank=1 --master_addr=$addr --master_port=$port --nproc_per_node=1 \
        --rdzv_conf join_timeout=20 "$TW" env e.1.%l
    start_node 0 - --nnodes=2 --node_rank=0 --master_addr=$addr --master_port=$port --nproc_per_node=1 \
        --rdzv_conf join_timeout=20 "$TW" env e.0.%l
    wait_node 0 30; wait_node 1 30
    expect_eq "${MN_RC[0]}/${MN_RC[1]}" 0/0 "exit statuses ($(dump_nodes err.0 err.1 2>&1))"
    check_world "1 1" "$port"
    expect_eq "$(envval e.1.0 MGPU_STORE_TOKEN)" env-secret "MGPU_STORE_TOKEN"
    expect_eq "$(envval e.1.0 MASTER_ADDR)" "$addr" "MASTER_ADDR"
}

t_store_wrong_token_node_refused() {
    # node 1 brings the wrong token: it is turned away at once with a message about the token,
    # node 0 logs the refusal and gives up after its join timeout, naming node 1
    local addr; addr=$(host_addr)
    [ -n "$addr" ] || skip "this machine has no non-loopback IPv4 address"
    local port; port=$(free_port)
    start_node 0 - --nnodes=2 --node_rank=0 --master_addr=$addr --master_port=$port --nproc_per_node=1 \
        --rdzv_token=right --rdzv_conf join_timeout=6 "$TW" touch ran.0
    local t0; t0=$(now_ms)
    start_node 1 - --nnodes=2 --node_rank=1 --master_addr=$addr --master_port=$port --nproc_per_node=1 \
        --rdzv_token=wrong --rdzv_conf join_timeout=6 "$TW" touch ran.1
    wait_node 1 20
    local ms=$(($(now_ms) - t0))
    wait_node 0 20
    [ "${MN_RC[1]}" -ne 0 ] || fail "node 1 with the wrong token exited 0"
    [ "${MN_RC[0]}" -ne 0 ] || fail "node 0 exited 0 without node 1"
    expect_grep err.1 'token'
    [ "$ms" -lt 4500 ] || fail "node 1 took ${ms} ms to give up on a wrong token (it cannot get better by retrying)"
    expect_grep err.0 'wrong store token'
    expect_grep err.0 'node rank\(s\) 1 of 2'
    [ ! -e ran.0 ] && [ ! -e ran.1 ] || fail "workers started"
}

t_store_connection_flood_mid_job() {
    # 2,000 idle connections (reopened as the store closes them) and 200 garbage ones, held
    # while a 2-node job ends: the store turns away the oldest beyond its budget for
    # unauthenticated connections, with a few log lines (not one per connection), and the
    # launchers, already connected, finish
    local port; port=$(free_port)
    local k
    for k in 0 1; do
        start_node $k - --nnodes=2 --node_rank=$k --master_addr=127.0.0.1 --master_port=$port \
            --rdzv_token=flood --nproc_per_node=2 "$TW" touch up.$k.%l waitfile go exit 0
    done
    wait_until 30 all_exist up.0.0 up.0.1 up.1.0 up.1.1 || { dump_nodes err.0 err.1; fail "the workers did not start"; }
    "$PY3" "$FLOOD" 127.0.0.1 "$port" 2000 200 released >flood.out 2>&1 &
    local fp=$!
    MN_KILL+=("$fp")
    wait_until 60 grep -q '^flooding' flood.out || { cat flood.out >&2; fail "the flood did not start"; }
    sleep 1
    touch go
    wait_node 0 40; wait_node 1 40
    touch released
    wait $fp
    cat flood.out
    expect_eq "${MN_RC[0]}/${MN_RC[1]}" 0/0 "exit statuses during the flood ($(dump_nodes err.0 err.1 2>&1 | tail -n 20))"
    expect_grep err.0 'too many connections'
    local lines; lines=$(grep -c 'store: ' err.0)
    [ "$lines" -lt 60 ] || fail "$lines store log lines during the flood: expected a few a second, not one per connection"
}

# node_peak_rss_kb PID: the largest resident set a live process has had, in kB
node_peak_rss_kb() { awk '/^VmHWM:/ {print $2}' "/proc/$1/status"; }

t_store_join_under_flood() {
    # node 0 serves the store and waits for node 1; 2,000 idle connections (kept open) and 200
    # garbage ones hit the store; node 1 then joins at once rather than failing with "too many
    # connections", and node 0's memory stays small
    local port; port=$(free_port)
    start_node 0 - --nnodes=2 --node_rank=0 --master_addr=127.0.0.1 --master_port=$port \
        --rdzv_token=flood --rdzv_conf join_timeout=25 --nproc_per_node=1 "$TW" env e.0.%l waitfile go exit 0
    wait_until 20 "$PY3" -c "import socket; socket.create_connection(('127.0.0.1', $port), timeout=1)" ||
        { dump_nodes err.0; fail "node 0's store did not listen"; }
    "$PY3" "$FLOOD" 127.0.0.1 "$port" 2000 200 released >flood.out 2>&1 &
    local fp=$!
    MN_KILL+=("$fp")
    wait_until 60 grep -q '^flooding' flood.out || { cat flood.out >&2; fail "the flood did not start"; }
    local t0; t0=$(now_ms)
    LOGLEVEL=INFO start_node 1 - --nnodes=2 --node_rank=1 --master_addr=127.0.0.1 --master_port=$port \
        --rdzv_token=flood --rdzv_conf join_timeout=25 --nproc_per_node=1 "$TW" env e.1.%l waitfile go exit 0
    wait_until 20 all_exist e.0.0 e.1.0 || { dump_nodes err.0 err.1 flood.out; fail "the job did not form under the flood"; }
    local ms=$(($(now_ms) - t0))
    local rss; rss=$(node_peak_rss_kb "${MN_PID[0]}")
    touch go
    wait_node 0 30; wait_node 1 30
    touch released
    wait $fp
    cat flood.out
    echo "join under flood: ${ms} ms from node 1's start to both workers running; node 0 peak RSS ${rss} kB"
    expect_eq "${MN_RC[0]}/${MN_RC[1]}" 0/0 "exit statuses under the flood ($(dump_nodes err.0 err.1 2>&1 | tail -n 20))"
    [ "$rss" -lt 32768 ] || fail "node 0's RSS is ${rss} kB under the flood (expected < 32 MB)"
    # a launcher's start, rendezvous and a worker's start on a loaded machine: seconds at most,
    # far below the join timeout (the store client's own join under flood is timed in
    # test_store_auth: under 1 s)
    [ "$ms" -lt 5000 ] || fail "node 1 joined in ${ms} ms under the flood"
    check_world "1 1" "$port"
}

# procs_with_text TEXT FILE: pids of live processes whose /proc/PID/FILE holds TEXT
procs_with_text() {
    local p
    for p in /proc/[0-9]*; do
        grep -qaF -- "$1" "$p/$2" 2>/dev/null && echo "${p#/proc/}"
    done
}

t_store_token_file_rules() {
    # --rdzv_token_file: refused when others can read it, or when it is missing or empty
    local secret="tf-$RANDOM$RANDOM"
    echo "$secret" >tok
    chmod 644 tok
    run_launch --rdzv_token_file tok --dry-run "$TW" exit 0
    expect_eq "$rc" 2 "exit status with a token file of mode 0644"
    expect_grep err "tok is readable by others \(mode 0644\); chmod 600 tok"
    chmod 640 tok
    run_launch --rdzv_token_file=tok --dry-run "$TW" exit 0
    expect_eq "$rc" 2 "exit status with a token file of mode 0640"
    expect_grep err "readable by others \(mode 0640\)"
    run_launch --rdzv_token_file=missing --dry-run "$TW" exit 0
    expect_eq "$rc" 2 "exit status with a missing token file"
    expect_grep err "open\(missing\)"
    : >empty
    chmod 600 empty tok
    run_launch --rdzv_token_file=empty --dry-run "$TW" exit 0
    expect_eq "$rc" 2 "exit status with an empty token file"
    expect_grep err "empty is empty"
    PET_RDZV_TOKEN_FILE=tok run_launch --dry-run "$TW" exit 0
    expect_eq "$rc" 0 "PET_RDZV_TOKEN_FILE of mode 0600 ($(cat err))"
    ! grep -qF "$secret" out err || fail "--dry-run printed the token"
}

t_store_token_kept_secret() {
    # The token reaches the store and the workers, and nothing else: not the command line of
    # any process (/proc/PID/cmdline, what ps shows, of the launchers and their keepers), not
    # --dry-run (text or json), not the logs at debug level, not --summary. The workers get it
    # in their environment, which only their user can read, and connect with it.
    local secret="sk-$RANDOM$RANDOM$RANDOM"
    local port; port=$(free_port)
    local k
    printf '%s\n' "$secret" >tok
    chmod 600 tok
    for k in json text; do
        "$LAUNCH" --dry-run=$k --nnodes=2 --node_rank=0 --master_addr=127.0.0.1 --master_port=$port \
            --rdzv_token="$secret" --nproc_per_node=1 "$TW" exit 0 >dry.$k 2>&1 || fail "--dry-run=$k: $(cat dry.$k)"
        ! grep -qF "$secret" dry.$k || fail "--dry-run=$k printed the token: $(cat dry.$k)"
    done
    # node 0 with the token on its command line, node 1 with a token file
    LOGLEVEL=DEBUG start_node 0 - --nnodes=2 --node_rank=0 --master_addr=127.0.0.1 --master_port=$port \
        --rdzv_token "$secret" --summary sum.0 --nproc_per_node=1 "$TW" env e.0.%l waitfile go exit 0
    LOGLEVEL=DEBUG start_node 1 - --nnodes=2 --node_rank=1 --master_addr=127.0.0.1 --master_port=$port \
        --rdzv_token_file tok --summary sum.1 --nproc_per_node=1 "$TW" env e.1.%l waitfile go exit 0
    wait_until 30 all_exist e.0.0 e.1.0 || { dump_nodes err.0 err.1; fail "the job did not start"; }
    local shown; shown=$(procs_with_text "$secret" cmdline)
    [ -z "$shown" ] || fail "the token is in the command line of: $(for p in $shown; do tr '\0' ' ' <"/proc/$p/cmdline"; echo; done)"
    tr '\0' ' ' <"/proc/${MN_PID[0]}/cmdline" | grep -qF -- '--rdzv_token ***' ||
        fail "node 0's command line: $(tr '\0' ' ' <"/proc/${MN_PID[0]}/cmdline")"
    local p n=0
    for p in $(procs_with_text "MGPU_STORE_TOKEN=$secret" environ); do
        n=$((n + 1))
        expect_eq "$(stat -c %a "/proc/$p/environ")" 400 "mode of /proc/$p/environ (a worker's environment)"
    done
    [ "$n" -ge 2 ] || fail "$n processes hold MGPU_STORE_TOKEN: expected the two workers"
    touch go
    wait_node 0 30; wait_node 1 30
    expect_eq "${MN_RC[0]}/${MN_RC[1]}" 0/0 "exit statuses ($(dump_nodes err.0 err.1 2>&1))"
    expect_eq "$(envval e.1.0 MGPU_STORE_TOKEN)" "$secret" "MGPU_STORE_TOKEN of node 1's worker"
    grep -q 'store' err.0 || fail "no debug lines about the store in node 0's log: $(cat err.0)"
    for f in out.0 err.0 out.1 err.1 sum.0 sum.1; do
        [ -e "$f" ] || fail "$f missing"
        ! grep -qF "$secret" "$f" || fail "$f holds the token: $(grep -F "$secret" "$f")"
    done
    # workers connect with the token they are given: a barrier of the two nodes' workers through
    # the store, PET_RDZV_TOKEN this time
    local SC="$MGPU_BUILD/tests/store_cli"
    port=$(free_port)
    for k in 0 1; do
        PET_RDZV_TOKEN="$secret" start_node b$k - --nnodes=2 --node_rank=$k --master_addr=127.0.0.1 \
            --master_port=$port --nproc_per_node=1 "$SC" barrier meet 2 20
    done
    wait_node b0 40; wait_node b1 40
    expect_eq "${MN_RC[b0]}/${MN_RC[b1]}" 0/0 "workers meeting through the store ($(dump_nodes err.b0 err.b1 2>&1))"
}
