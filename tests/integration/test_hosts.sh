# test_hosts.sh - one command starts a job on several hosts over ssh (--hostfile, --hosts):
# three "hosts" in network namespaces of their own, each with a real OpenSSH server started by
# the test (multinode/sshd.sh). The world and data passed between ranks of a 3x2 job; output
# prefixed by host; a rank failing on the second host stopping every host with its status and
# report; the local launcher killed with SIGKILL leaving nothing on any host; Ctrl-C; a host
# that refuses ssh named before anything starts; hostfile errors; the token on no command
# line; .mgpu_env and --export reaching the workers; hosts by IPv6 address.

source "$(dirname "${BASH_SOURCE[0]}")/multinode/common.sh"
source "$(dirname "${BASH_SOURCE[0]}")/multinode/sshd.sh"

# hostfile N [SLOTS]: the first N hosts' addresses, SLOTS each (default 2), into ./hostfile
hostfile() {
    local i
    {
        echo "# the test's hosts"
        for i in $(seq 0 $(($1 - 1))); do echo "${MN_ADDR[$i]} slots=${2:-2}"; done
    } >hostfile
}

# launch_hosts NAME ARGS...: the local launcher, on host 0, in the background (start_node)
launch_hosts() {
    local name=$1
    shift
    start_node "$name" "${MN_NS[0]}" --ssh "$SSH_CMD" "$@"
}

t_hosts_three_by_two_world() {
    hosts_up 3
    hostfile 3
    local port; port=$(free_port)
    MGPU_TEST_MARK=world-$$ launch_hosts L --hostfile hostfile --master_port "$port" --export MGPU_SIM_GPUS,MGPU_TEST_MARK,TMPDIR \
        --summary run.json "$TW" env "e.%r" print "hello %r"
    wait_node L 60
    expect_eq "${MN_RC[L]}" 0 "exit status ($(dump_nodes err.L out.L 2>&1))"
    # every host ran its two ranks, node rank = the hostfile's order
    local k l
    for k in 0 1 2; do
        for l in 0 1; do
            local f=e.$((2 * k + l))
            [ -f "$f" ] || fail "rank $((2 * k + l)) did not run ($(ls))"
            expect_eq "$(envval $f GROUP_RANK)/$(envval $f LOCAL_RANK)/$(envval $f WORLD_SIZE)" "$k/$l/6" \
                "GROUP_RANK/LOCAL_RANK/WORLD_SIZE of rank $((2 * k + l))"
            expect_eq "$(envval $f MGPU_STORE_ADDR)" "${MN_ADDR[0]}" "the store's address (the first host)"
            expect_eq "$(envval $f MGPU_STORE_PORT)" "$port" "the store's port (--master_port)"
            expect_eq "$(envval $f MASTER_ADDR)" "${MN_ADDR[0]}" "MASTER_ADDR"
            expect_eq "$(envval $f PWD)" "$PWD" "the working directory on host $k"
            expect_grep out.L "^\[${MN_ADDR[$k]//./\\.}:rank$((2 * k + l))\]:hello $((2 * k + l))$"
        done
    done
    # one folder for all (one file system): each host's report apart, host k > 0's with .nodeK
    "$PY3" -c '
import json
for k, f in enumerate(["run.json", "run.node1.json", "run.node2.json"]):
    d = json.load(open(f))
    assert (d["node_rank"], [w["rank"] for w in d["workers"]]) == (k, [2 * k, 2 * k + 1]), (f, d)' ||
        fail "summaries: $(ls run*)"
    expect_eq "$(procs_with_mark world-$$ | wc -l)" 0 "processes left"
}

t_hosts_ipv6_hostfile() {
    # hosts by IPv6 address: ssh to each, node 0's store on IPv6, the world as over IPv4
    hosts_up 2
    [ -n "${MN_ADDR6[0]}" ] && [ -n "${MN_ADDR6[1]}" ] || skip "no IPv6 in the test's namespaces"
    wait_until 10 eval 'ip netns exec "${MN_NS[1]}" timeout 2 bash -c "</dev/tcp/${MN_ADDR6[0]}/$SSH_PORT" 2>/dev/null' ||
        fail "node 1 cannot reach node 0's sshd at [${MN_ADDR6[0]}]:$SSH_PORT"
    printf '%s slots=2\n%s slots=2\n' "${MN_ADDR6[0]}" "${MN_ADDR6[1]}" >hostfile
    local port; port=$(free_port)
    MGPU_TEST_MARK=v6-$$ launch_hosts L --hostfile hostfile --master_port "$port" --export $EXPORTS \
        "$TW" env "e.%r" print "hello %r"
    wait_node L 60
    expect_eq "${MN_RC[L]}" 0 "exit status ($(dump_nodes err.L out.L 2>&1))"
    local r
    for r in 0 1 2 3; do
        [ -f e.$r ] || fail "rank $r did not run ($(ls))"
        expect_eq "$(envval e.$r GROUP_RANK)/$(envval e.$r WORLD_SIZE)" "$((r / 2))/4" "GROUP_RANK/WORLD_SIZE of rank $r"
        expect_eq "$(envval e.$r MASTER_ADDR)" "${MN_ADDR6[0]}" "MASTER_ADDR"
        expect_grep out.L "^\[${MN_ADDR6[$((r / 2))]}:rank$r\]:hello $r$"
    done
    wait_until 5 eval '[ -z "$(procs_with_mark v6-'$$')" ]' || fail "left running: $(procs_with_mark v6-$$)"
}

# every process of the job carries MGPU_TEST_MARK (the local launcher and its ssh, and through
# --export the launchers and workers on the hosts)
EXPORTS=MGPU_SIM_GPUS,MGPU_TEST_MARK,TMPDIR

t_hosts_failure_on_host2_stops_every_host() {
    hosts_up 3
    hostfile 3
    local port mark=fail-$$; port=$(free_port)
    # rank 3 (host 2, local rank 1) exits 3 once all 6 run; the others wait for a signal
    MGPU_TEST_MARK=$mark launch_hosts L --hostfile hostfile --master_port "$port" --export $EXPORTS \
        --grace_period=1 "$TW" trap sig.%r TERM,HUP,INT touch r.%r only 3 waitall r. 6 only 3 exit 3 pause
    wait_until 30 all_exist r.0 r.1 r.2 r.3 r.4 r.5 || { dump_nodes err.L; fail "the 6 workers did not start"; }
    local t0; t0=$(now_ms)
    wait_node L 30
    local ms=$(($(now_ms) - t0))
    expect_eq "${MN_RC[L]}" 3 "exit status (the failing rank's) ($(dump_nodes err.L 2>&1))"
    [ "$ms" -lt 15000 ] || fail "stopping every host took ${ms} ms (grace period 1 s)"
    local r
    for r in 0 1 2 4 5; do expect_grep sig.$r '^(TERM|HUP)'; done
    # the failing host's report, prefixed with its host; node 0's names node 1, rank 3
    local h1=${MN_ADDR[1]//./\\.} h0=${MN_ADDR[0]//./\\.}
    expect_grep err.L "^\[$h1\]: +rank +: 3 \(local_rank: 1\)"
    expect_grep err.L "^\[$h1\]: +exitcode +: 3"
    expect_grep err.L "^\[$h0\]: +node +: 1 of 3"
    expect_grep err.L "host 10\.[0-9.]+ \(node rank [0-2]\) exited with status 3; stopping every host"
    wait_until 5 eval '[ -z "$(procs_with_mark '$mark')" ]' || fail "left running: $(procs_with_mark $mark)"
}

t_hosts_sigkill_of_the_local_launcher_leaves_nothing() {
    hosts_up 3
    hostfile 3
    local port mark=kill-$$; port=$(free_port)
    MGPU_TEST_MARK=$mark launch_hosts L --hostfile hostfile --master_port "$port" --export $EXPORTS \
        "$TW" touch r.%r pause
    wait_until 30 all_exist r.0 r.1 r.2 r.3 r.4 r.5 || { dump_nodes err.L; fail "the 6 workers did not start"; }
    local n; n=$(procs_with_mark $mark | wc -l)
    # the local launcher, 3 ssh, 3 launchers (and their keepers), 6 workers
    [ "$n" -ge 13 ] || fail "only $n processes of the job before the kill"
    kill -KILL "${MN_PID[L]}"
    wait_until 5 eval '[ -z "$(procs_with_mark '$mark')" ]' ||
        fail "5 s after SIGKILL of the local launcher, left: $(for p in $(procs_with_mark $mark); do tr '\0' ' ' </proc/$p/cmdline | cut -c1-80; echo; done)"
}

t_hosts_ctrl_c_stops_every_host() {
    hosts_up 2
    hostfile 2
    local port mark=int-$$; port=$(free_port)
    MGPU_TEST_MARK=$mark launch_hosts L --hostfile hostfile --master_port "$port" --export $EXPORTS \
        "$TW" trap sig.%r INT,HUP,TERM touch r.%r pause
    wait_until 30 all_exist r.0 r.1 r.2 r.3 || { dump_nodes err.L; fail "the 4 workers did not start"; }
    kill -INT "${MN_PID[L]}"
    wait_node L 20
    expect_eq "${MN_RC[L]}" 130 "exit status after SIGINT ($(dump_nodes err.L 2>&1))"
    # every worker stopped by a signal: SIGINT as passed on to each host, or SIGTERM from a host
    # that learnt the stop through the store first
    local r
    for r in 0 1 2 3; do expect_grep sig.$r '^(INT|TERM)'; done
    cat sig.* | grep -q '^INT' || fail "no worker got SIGINT: $(cat sig.*)"
    wait_until 5 eval '[ -z "$(procs_with_mark '$mark')" ]' || fail "left running: $(procs_with_mark $mark)"
}

t_hosts_unreachable_host_is_named_before_anything_starts() {
    mn_netns_setup 3
    ssh_setup
    sshd_start 0
    sshd_start 1 # host 2 has no sshd: ssh is refused there
    hostfile 3
    local port; port=$(free_port)
    MGPU_TEST_MARK=unreach-$$ launch_hosts L --hostfile hostfile --master_port "$port" --export $EXPORTS \
        "$TW" touch ran.%r
    wait_node L 30
    expect_eq "${MN_RC[L]}" 255 "exit status ($(dump_nodes err.L 2>&1))"
    expect_grep err.L "host ${MN_ADDR[2]//./\\.} \(hostfile:4\) cannot be reached: ssh exited with status 255: .*Connection refused"
    expect_no_grep err.L "host ${MN_ADDR[0]//./\\.} "
    expect_no_grep err.L "host ${MN_ADDR[1]//./\\.} "
    [ -z "$(ls ran.* 2>/dev/null)" ] || fail "workers ran: $(ls ran.*)"
}

t_hosts_token_env_file_and_export() {
    hosts_up 2
    hostfile 2 1
    local port; port=$(free_port)
    printf '# for every host\nFROM_FILE=a b=c\n\nSHARED=file\n' >.mgpu_env
    MGPU_TEST_MARK=tok-$$ MY_VAR="x'y" SHARED=env NCCL_TEST_KNOB=7 NOT_SENT=1 \
        launch_hosts L --hostfile hostfile --master_port "$port" --export $EXPORTS,MY_VAR,SHARED \
        "$TW" env e.%r touch r.%r waitfile go
    wait_until 30 all_exist r.0 r.1 || { dump_nodes err.L; fail "the workers did not start"; }
    local tok; tok=$(envval e.1 MGPU_STORE_TOKEN)
    [ ${#tok} -ge 16 ] || fail "token '$tok'"
    # on no command line of any process, here or on any host (one /proc: the namespaces share
    # the pid namespace)
    local hits; hits=$(grep -laF -- "$tok" /proc/[0-9]*/cmdline 2>/dev/null)
    touch go
    [ -z "$hits" ] || fail "the token is on the command line of $hits"
    wait_node L 30
    expect_eq "${MN_RC[L]}" 0 "exit status ($(dump_nodes err.L 2>&1))"
    local f
    for f in e.0 e.1; do
        expect_eq "$(envval $f FROM_FILE)" "a b=c" ".mgpu_env's FROM_FILE in $f"
        expect_eq "$(envval $f SHARED)" "file" ".mgpu_env wins over --export in $f"
        expect_eq "$(envval $f MY_VAR)" "x'y" "--export MY_VAR in $f"
        expect_eq "$(envval $f NCCL_TEST_KNOB)" 7 "NCCL_* in $f"
        expect_eq "$(envval $f NOT_SENT)" "<unset>" "a variable neither exported nor of a prefix in $f"
        expect_eq "$(envval $f WORLD_SIZE)" 2 "WORLD_SIZE in $f (1 slot a host)"
    done
}

t_hosts_three_by_two_trains() {
    # data between ranks: mgpu-worker's data-parallel training, its gradients averaged over the
    # 6 ranks of 3 hosts at every step
    hosts_up 3
    hostfile 3
    local port; port=$(free_port)
    MGPU_TEST_MARK=train-$$ launch_hosts L --hostfile hostfile --master_port "$port" --export $EXPORTS \
        "$MGPU_ROOT/configs/train.cfg" max_steps=30 eval_interval=0 metrics_file=m.jsonl
    wait_node L 90
    expect_eq "${MN_RC[L]}" 0 "exit status ($(dump_nodes err.L out.L 2>&1))"
    expect_grep out.L "^\[${MN_ADDR[0]//./\\.}:rank0\]:eval epoch 1 step 30: loss"
    # the same job on one host, 6 ranks: the same world, so the same training (a rank whose
    # gradients were not averaged with the other hosts' would end elsewhere)
    "$LAUNCH" --nproc_per_node=6 "$MGPU_ROOT/configs/train.cfg" max_steps=30 eval_interval=0 \
        metrics_file=ref.jsonl >out.ref 2>err.ref || { cat err.ref >&2; fail "the one-host run: exit $?"; }
    "$PY3" - m.jsonl ref.jsonl <<'EOF' || fail "3 hosts x 2 and 1 host x 6 differ: $(tail -1 m.jsonl) / $(tail -1 ref.jsonl)"
import json, sys
a, b = ([json.loads(l) for l in open(f) if '"final"' in l][0] for f in sys.argv[1:3])
assert a["world_size"] == b["world_size"] == 6, (a, b)
assert abs(a["loss"] - b["loss"]) <= 1e-5 * max(1.0, abs(b["loss"])), (a["loss"], b["loss"])
assert abs(a["eval_accuracy"] - b["eval_accuracy"]) <= 1e-6, (a["eval_accuracy"], b["eval_accuracy"])
EOF
}

# ------------------------------------------------------------------ before any ssh

t_hosts_hostfile_errors_name_file_and_line() {
    local out
    # each: the hostfile, then the message expected (exit 2, nothing started: no ssh is tried,
    # --ssh names a program that would record a call)
    printf '#!/bin/sh\ntouch ssh_called\n' >fake_ssh
    chmod +x fake_ssh
    check() {
        printf "$1" >hf
        run_launch --hostfile hf --ssh "$PWD/fake_ssh" "$TW" exit 0
        expect_eq "$rc" 2 "exit status for a hostfile '$1' ($(cat err))"
        expect_grep err "$2"
        [ ! -e ssh_called ] || fail "ssh was started for a bad hostfile '$1'"
    }
    check 'a slots=2\nb slots=1\na slots=4\n' "hf:3: host 'a' is already listed at hf:1"
    check '# hosts\n\na slots=two\n' "hf:3: 'slots=two': expected 'HOST slots=N'"
    check 'a slots=2 gpus=1\n' "hf:1: 'gpus=1': expected 'HOST slots=N'"
    check 'a slots=0\n' "hf:1: 'slots=0': expected 'HOST slots=N'"
    check '# nothing\n\n' "hf lists no host"
    check 'a;rm slots=1\n' "hf:1: 'a;rm': expected a host name"
    run_launch --hostfile missing.hf "$TW" exit 0
    expect_eq "$rc" 2 "exit status for a missing hostfile"
    expect_grep err "fopen\(missing.hf\): No such file"
    # selections and the environment
    printf 'a slots=2\nb slots=2\n' >hf
    run_launch --hostfile hf --include 'c' --ssh "$PWD/fake_ssh" "$TW" exit 0
    expect_eq "$rc/$(cat err)" "2/mgpu-launch: error: --include: host 'c' is not in the host list" "unknown --include host"
    run_launch --hostfile hf --exclude 'a:2' --ssh "$PWD/fake_ssh" "$TW" exit 0
    expect_grep err "--exclude: host 'a': slot '2': expected a slot from 0 to 1"
    run_launch --hostfile hf --export NOT_SET_ANYWHERE --ssh "$PWD/fake_ssh" "$TW" exit 0
    expect_eq "$rc" 2 "exit status for --export of an unset variable"
    expect_grep err "NOT_SET_ANYWHERE is not set here"
    printf 'GOOD=1\nbad line\n' >.mgpu_env
    run_launch --hostfile hf --ssh "$PWD/fake_ssh" "$TW" exit 0
    expect_eq "$rc" 2 "exit status for a bad .mgpu_env"
    expect_grep err "\.mgpu_env:2: 'bad line': expected KEY=VALUE"
    rm .mgpu_env
    run_launch --hostfile hf --nnodes 2 --ssh "$PWD/fake_ssh" "$TW" exit 0
    expect_grep err "--nnodes and --node_rank come from the host list"
    run_launch --include a "$TW" exit 0
    expect_eq "$rc" 2 "exit status of --include without a host list"
    expect_grep err "--include, --exclude, --ssh and --export go with --hostfile or --hosts"
    [ ! -e ssh_called ] || fail "ssh was started"
}

t_hosts_dry_run_prints_each_hosts_command() {
    printf 'n1 slots=4 # the first\nn2 slots=4\nn3 slots=2\n' >hf
    PET_RDZV_TOKEN=s3cret-dry NCCL_IB_HCA=mlx5 run_launch --hostfile hf --exclude 'n1:1,3@n3' \
        --ssh "ssh -p 2222" --max_restarts=1 --dry-run "$TW" print "a b"
    expect_eq "$rc" 0 "exit status ($(cat err))"
    expect_grep out '^2 hosts; the store.s token is sent on each ssh.s standard input'
    expect_grep out '^host n1 \(node rank 0, hf:1\):$'
    expect_grep out '^host n2 \(node rank 1, hf:2\):$'
    # host n3 nowhere: no line starts with it, no command goes to it (the folder's random name may
    # hold those letters)
    expect_no_grep out '^host n3'
    expect_no_grep out "BatchMode=yes .* n3 '"
    expect_no_grep out 's3cret-dry'
    local l1 l2 want; l1=$(sed -n 3p out) l2=$(sed -n 5p out)
    expect_grep "$l1" "^  ssh -p 2222 -o BatchMode=yes .* n1 'cd $PWD && exec env .*NCCL_IB_HCA=mlx5 .*CUDA_VISIBLE_DEVICES=0,2 $LAUNCH --nnodes=2 --node_rank=0 --master_addr=n1 --master_port=29500 --nproc_per_node=2 --local_addr=n1 --rdzv_token_file=- --watch_stdin"
    # the host's shell reads the template and the worker's arguments as they were given
    want="'\\''--log_line_prefix_template=[n1:rank\${rank}]:'\\'' --max_restarts=1 -- $TW print '\\''a b'\\'''"
    grep -qF -- "$want" <<<"$l1" || fail "quoting of the template or of the worker's arguments: $l1"
    expect_grep "$l2" "--node_rank=1 --master_addr=n1 --master_port=29500 --nproc_per_node=4 --local_addr=n2"
    expect_no_grep "$l2" "CUDA_VISIBLE_DEVICES"
    # Horovod's list, with --nproc_per_node for every host
    run_launch --hosts a:8,b --nproc_per_node 3 --master_addr 10.0.0.9 --master_port 4000 --dry-run "$TW"
    expect_eq "$rc" 0 "exit status ($(cat err))"
    expect_grep out "^host b \(node rank 1, --hosts\):$"
    expect_grep out "--master_addr=10.0.0.9 --master_port=4000 --nproc_per_node=3 --local_addr=b"
}

t_hosts_launcher_missing_on_a_host_is_named() {
    # an ssh stand-in that runs each host's command here, but on host b a launcher path that
    # does not exist (as on a host without mgpu at that path): b is named, host a's launcher
    # (waiting for the token) stops, nothing starts, exit status 127
    cat >fake_ssh <<'SH'
#!/bin/sh
for last; do :; done
eval "host=\${$(($# - 1))}"
case $host in
b) exec sh -c 'exec /nonexistent/mgpu-launch' ;;
*) exec sh -c "$last" ;;
esac
SH
    chmod +x fake_ssh
    MGPU_TEST_MARK=missing-$$ run_launch --hosts a,b --ssh "$PWD/fake_ssh" --export $EXPORTS "$TW" touch ran.%r
    expect_eq "$rc" 127 "exit status ($(cat err))"
    expect_grep err "host b \(--hosts\): mgpu-launch cannot run there \(status 127: .*/nonexistent/mgpu-launch.*\); it must be installed at the same path on every host"
    expect_no_grep err "host a"
    [ -z "$(ls ran.* 2>/dev/null)" ] || fail "workers ran: $(ls ran.*)"
    wait_until 5 eval '[ -z "$(procs_with_mark missing-'$$')" ]' || fail "left running: $(procs_with_mark missing-$$)"
    # the ssh command itself missing
    run_launch --hosts a,b --ssh /nonexistent/ssh "$TW" exit 0
    expect_eq "$rc" 127 "exit status without ssh ($(cat err))"
    expect_grep err "host a \(--hosts\): cannot run /nonexistent/ssh here: no such file or directory"
}

t_hosts_ctrl_c_while_ssh_still_connects_stops_at_once() {
    # an ssh stand-in that runs host a's command here but on host b hangs, reading nothing, as
    # ssh does while it connects to a host that does not answer (ConnectTimeout=30): Ctrl-C
    # ends the run within seconds, says so, and leaves neither ssh nor host a's launcher
    cat >fake_ssh <<'SH'
#!/bin/sh
for last; do :; done
eval "host=\${$(($# - 1))}"
case $host in
b) exec sleep 120 ;;
*) exec sh -c "$last" ;;
esac
SH
    chmod +x fake_ssh
    local mark=connecting-$$ pid t0
    MGPU_TEST_MARK=$mark "$LAUNCH" --hosts a,b --ssh "$PWD/fake_ssh" --export $EXPORTS "$TW" touch ran.%r \
        >out 2>err &
    pid=$!
    wait_until 10 eval '[ "$(procs_with_mark '$mark' | wc -l)" -ge 3 ]' || fail "hosts not started: $(cat err)"
    sleep 0.5
    t0=$SECONDS
    kill -INT $pid
    wait $pid
    rc=$?
    expect_eq "$rc" 130 "exit status after SIGINT ($(cat err))"
    [ $((SECONDS - t0)) -le 5 ] || fail "SIGINT took $((SECONDS - t0)) s to end the run"
    expect_grep err "signal 2 \(Interrupt\) before the job started: stopping every host"
    [ -z "$(ls ran.* 2>/dev/null)" ] || fail "workers ran: $(ls ran.*)"
    wait_until 5 eval '[ -z "$(procs_with_mark '$mark')" ]' || fail "left running: $(procs_with_mark $mark)"
}

t_hosts_network_loss_stops_every_host() {
    # host 2's network goes away mid-job (its link down): ssh here gives it up after 3
    # keepalives, the other hosts are stopped, and host 2's launcher, hearing nothing on its
    # stdin for 3 keepalive periods, stops its own job although its sshd never noticed.
    # MGPU_SSH_KEEPALIVE=1: a period of 1 s instead of 10, to keep the test short.
    hosts_up 3
    hostfile 3
    local port mark=net-$$; port=$(free_port)
    MGPU_SSH_KEEPALIVE=1 MGPU_TEST_MARK=$mark launch_hosts L --hostfile hostfile --master_port "$port" \
        --export $EXPORTS "$TW" trap sig.%r HUP,TERM touch r.%r pause
    wait_until 30 all_exist r.0 r.1 r.2 r.3 r.4 r.5 || { dump_nodes err.L; fail "the 6 workers did not start"; }
    ip -n "${MN_NS[2]}" link set mg0 down || fail "link down on host 2"
    local t0; t0=$(now_ms)
    wait_node L 30
    expect_eq "${MN_RC[L]}" 255 "exit status ($(dump_nodes err.L 2>&1))"
    expect_grep err.L "host ${MN_ADDR[2]//./\\.} \(node rank 2\): ssh exited with status 255 \(the connection failed or was lost\)"
    # host 2's ranks stopped by their launcher (SIGHUP) once its stdin went silent
    wait_until 15 all_exist sig.4 sig.5 || fail "host 2's workers were not stopped"
    expect_grep sig.4 '^HUP'
    wait_until 10 eval '[ -z "$(procs_with_mark '$mark')" ]' ||
        fail "left running $(($(now_ms) - t0)) ms after the link went down: $(for p in $(procs_with_mark $mark); do tr '\0' ' ' </proc/$p/cmdline | cut -c1-80; echo; done)"
}
