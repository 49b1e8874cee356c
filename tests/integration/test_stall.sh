# test_stall.sh - --stall_timeout: a hung rank is named (with what the others wait in) within
# the timeout and a check period; --stall_action fail ends the job with 124 and nothing left
# running; a healthy job with slow steps is never reported.

# hermetic: nothing of a surrounding job (Slurm, Open MPI, torchrun, PET_* defaults) leaks in
for v in $(env | grep -oE '^(PET|SLURM|OMPI|PMI|PMIX|TORCHELASTIC)_[A-Za-z0-9_]*'); do unset "$v"; done
unset LOGLEVEL PYTHON_EXEC
export MGPU_SIM_GPUS=0
unset CUDA_VISIBLE_DEVICES PET_NPROC_PER_NODE
export OMP_NUM_THREADS=1

# Four ranks start PyTorch within the 5 s stall timeout; beside another test's ranks on a small
# machine they may not (4 ranks take about 3 s alone, two such jobs at once over 5 s).
# alone: t_stall_gloo_rank_named t_stall_gloo_action_fail

# The request's job: 4 gloo ranks, a step of 0.3 s of "work" and an all_reduce; rank 3 sleeps
# an hour before the all_reduce of step 2.
write_hang() {
    cat >hang.py <<'EOF'
import os, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(4)
for step in range(3):
    if rank == 3 and step == 2:
        time.sleep(3600)
    print(f"step {step}", flush=True)
    time.sleep(0.3)
    dist.all_reduce(t)
EOF
}

# The tool the stacks come from: py-spy (Python frames), gdb or eu-stack (native), or "".
stack_tool() {
    local t
    for t in py-spy gdb eu-stack; do command -v $t >/dev/null && { echo $t; return; }; done
    echo ""
}

# nothing_left MARK: no process of the job is left (the launcher waited for all of them)
nothing_left() {
    local left
    left=$(procs_with_mark "$1")
    [ -z "$left" ] || fail "left running: $(ps -o pid,stat,args -p $(echo $left | tr ' ' ,))"
}

t_stall_gloo_rank_named() {
    need_torch
    write_hang
    local mark=stall-gloo-$$ pid
    PYTHON_EXEC=$PY MGPU_TEST_MARK=$mark "$LAUNCH" --nproc_per_node=4 --stall_timeout 5 \
        --log_dir logs --summary s.json hang.py >out 2>err &
    pid=$!
    wait_until 60 grep -q '^mgpu-launch: stall:' err || fail "no stall report: $(cat err)"
    kill -TERM $pid
    wait $pid
    expect_grep err '^mgpu-launch: stall: rank 3 \(local 3, pid [0-9]+, host [^)]+\) has printed nothing and sent no heartbeat for [5-8] s \(its last line: "step 1"\); ranks 0, 1, 2 have been quiet for [0-9]+ s'
    expect_grep err '^mgpu-launch:   rank 3 \(local 3, pid [0-9]+\) \[stalled\]: '
    [ "$(grep -c '^mgpu-launch: stall:' err)" -eq 1 ] || fail "reported more than once: $(cat err)"
    ls logs/*/stall-0-1.txt >/dev/null || fail "no stall file in the log folder: $(ls -R logs)"
    expect_grep "$(cat logs/*/stall-0-1.txt)" 'stall: rank 3 '
    python3 - s.json <<'EOF' || fail "summary: $(cat s.json)"
import json, sys
d = json.load(open(sys.argv[1]))
s = d["stalls"]
assert len(s) == 1 and s[0]["attempt"] == 0 and s[0]["report"].startswith("stall: rank 3 "), s
r = {x["rank"]: x for x in s[0]["ranks"]}
assert r[3]["culprit"] and r[3]["stalled"] and 5 <= r[3]["since_s"] < 8, r[3]
assert r[3]["last_line"] == "step 1" and r[3]["pid"] > 0 and r[3]["host"], r[3]
assert not any(r[k]["culprit"] for k in (0, 1, 2)), r
EOF
    # every rank's stack follows: the sleeper's user line, the others in all_reduce
    expect_grep err '^mgpu-launch: stack of rank 3 \(local 3, pid [0-9]+\):$'
    python3 - s.json "$(stack_tool)" <<'EOF' || fail "stacks: $(cat s.json)"
import json, sys
r = {x["rank"]: x for x in json.load(open(sys.argv[1]))["stalls"][0]["ranks"]}
tool = sys.argv[2]
if tool == "py-spy":
    assert "hang.py:10" in r[3]["stack"] and "sleep" in r[3]["stack"], r[3]["stack"]
    for k in (0, 1, 2):
        assert "all_reduce" in r[k]["stack"] and "hang.py:13" in r[k]["stack"], r[k]["stack"]
elif tool:
    assert "sleep" in r[3]["stack"], r[3]["stack"]
else:
    assert all(r[k]["stack"].startswith("stack unavailable") for k in r), r
EOF
    nothing_left $mark
}

t_stall_gloo_action_fail() {
    need_torch
    write_hang
    local mark=stall-fail-$$
    PYTHON_EXEC=$PY MGPU_TEST_MARK=$mark run_launch --nproc_per_node=4 --stall_timeout 5 \
        --stall_action fail --grace_period 5 --summary s.json hang.py
    expect_eq "$rc" 124 "exit status after a stall with --stall_action fail ($(tail -n 20 err))"
    expect_grep err 'stall: rank 3 '
    expect_grep err 'exitcode +: 124 \(stalled'
    expect_grep err 'cause +: stall: rank 3 '
    python3 - s.json <<'EOF' || fail "summary: $(cat s.json)"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["exit_code"] == 124 and d["root_cause"]["rank"] == 3 and d["root_cause"]["stalled"], d
EOF
    nothing_left $mark
}

t_stall_fail_restarts_then_124() {
    # every attempt stalls: one restart, then 124
    local mark=stall-restart-$$
    MGPU_TEST_MARK=$mark run_launch --nproc_per_node=2 --stall_timeout 1 --stall_action fail \
        --max_restarts 1 --grace_period 2 "$TW" print "up %r" pause
    expect_eq "$rc" 124 "exit status ($(tail -n 20 err))"
    [ "$(grep -c '^mgpu-launch: stall:' err)" -eq 2 ] || fail "expected a report per attempt: $(cat err)"
    expect_grep err 'restarting: attempt 1'
    nothing_left $mark
}

t_stall_c_program_in_sleep() {
    # rank 1 hangs in sleep(); rank 0 goes on printing: rank 1 is named
    local mark=stall-c-$$
    MGPU_TEST_MARK=$mark run_launch --nproc_per_node=2 --stall_timeout 2 --stall_action fail \
        --grace_period 2 "$TW" print "start %r" only 1 sleep 3600 \
        sleep 1 print a sleep 1 print b sleep 1 print c sleep 1 print d pause
    expect_eq "$rc" 124 "exit status ($(tail -n 20 err))"
    expect_grep err '^mgpu-launch: stall: rank 1 \(local 1, pid [0-9]+, host [^)]+\) has printed nothing and sent no heartbeat for [2-3] s \(its last line: "start 1"\); rank 0 has been quiet'
    # its native stack names the sleep it hangs in
    if [ -n "$(stack_tool)" ]; then
        sed -n '/^mgpu-launch: stack of rank 1 /,/^mgpu-launch: stack of\|^mgpu-launch: warning/p' err >stack1
        expect_grep stack1 'sleep'
    fi
    nothing_left $mark
}

# A libmgpu-like worker without libmgpu: it writes its progress page (common/progress.h's
# layout) itself and waits for its local peers' pages in a pretend all-reduce, so a rank
# stopped in its forward pass leaves the others in all-reduce #N.
write_pages_worker() {
    cat >pages.py <<'EOF'
import mmap, os, struct, sys, time
n = int(os.environ["LOCAL_WORLD_SIZE"])
slot = int(os.environ["MGPU_PROGRESS_SLOT"])
fd = os.open(os.environ["MGPU_PROGRESS_FILE"], os.O_RDWR)
m = mmap.mmap(fd, n * 4096)
base = slot * 4096
FORWARD, ALLREDUCE = 3, 5
seq = moves = 0
def mono():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)
def publish(step, phase, coll=0):
    global seq, moves
    seq += 1
    struct.pack_into("<Q", m, base + 16, seq)
    now = mono()
    moves += 1
    struct.pack_into("<QqqIIq", m, base + 24, moves, now, step, phase, 0, now)
    if coll:
        struct.pack_into("<Q", m, base + 64, coll)
        struct.pack_into("<QIiQq", m, base + 72 + ((coll - 1) % 16) * 32, coll, 1, 0, 4 << 20, now)
    seq += 1
    struct.pack_into("<Q", m, base + 16, seq)
struct.pack_into("<ii", m, base + 8, os.getpid(), int(os.environ["RANK"]))
struct.pack_into("<q", m, base + 40, -1)
struct.pack_into("<II", m, base, 0x4d475055, 1)  # attached: written last
open(f"pid.{slot}", "w").write(str(os.getpid()))
for step in range(100000):
    publish(step, FORWARD)
    time.sleep(0.1)
    publish(step, ALLREDUCE, step + 1)
    while any(struct.unpack_from("<Q", m, k * 4096 + 64)[0] < step + 1 for k in range(n)):
        time.sleep(0.01)
    struct.pack_into("<Q", m, base + 648, step + 1)  # coll_done
    if step == 10:
        open(f"ready.{slot}", "w").close()
EOF
}

t_stall_stopped_rank_named_from_pages() {
    write_pages_worker
    local mark=stall-pages-$$ pid t0 t1 S=3
    MGPU_TEST_MARK=$mark "$LAUNCH" --nproc_per_node=4 --stall_timeout $S --summary s.json \
        --no_python "$PY" pages.py >out 2>err &
    pid=$!
    wait_until 60 test -e ready.2 || fail "the workers did not start: $(cat err)"
    t0=$(date +%s.%N)
    kill -STOP "$(cat pid.2)"
    wait_until 30 grep -q '^mgpu-launch: stall:' err || fail "no stall report: $(cat err)"
    t1=$(date +%s.%N)
    kill -TERM $pid
    wait $pid
    echo "stall of rank 2 reported $(echo "$t1 - $t0" | bc) s after its SIGSTOP (S = $S)"
    expect_grep err '^mgpu-launch: stall: rank 2 \(local 2, pid [0-9]+, host [^)]+\) is stopped \(SIGSTOP, Ctrl-Z or a debugger\) and has been in forward of step [0-9]+ for [3-4] s; ranks 0, 1, 3 have waited in all-reduce #[0-9]+ \(bucket 0, 4 MiB\) for [2-4] s'
    # within S + 1 s of the rank's last progress, by the launcher's own clock
    python3 - s.json $S <<'EOF' || fail "summary: $(cat s.json)"
import json, sys
d = json.load(open(sys.argv[1])); S = float(sys.argv[2])
r = {x["rank"]: x for x in d["stalls"][0]["ranks"]}
assert r[2]["culprit"] and r[2]["phase"] == "forward" and S <= r[2]["since_s"] <= S + 1, r[2]
for k in (0, 1, 3):
    assert r[k]["waiting_in"]["op"] == "all-reduce" and not r[k]["culprit"], r[k]
    assert r[k]["waiting_in"]["seq"] == r[2]["step"] + 1, (r[k], r[2])
EOF
    nothing_left $mark
}

# rank_field FIELD RANK: the field of that rank in `mgpu-launch status --json`, in the job of
# launcher $pid (the user's other jobs, in /tmp/mgpu-<uid>, are listed too), or nothing
rank_field() {
    "$LAUNCH" status --json 2>/dev/null | python3 -c '
import json, sys
jobs = [j for j in json.load(sys.stdin)["jobs"] if j["launcher_pid"] == int(sys.argv[3])]
v = jobs[0]["ranks"][int(sys.argv[2])][sys.argv[1]] if jobs else None
print("" if v is None else v)' "$1" "$2" "$pid"
}

rank2_stepped() {
    local v
    sleep 0.2 # each look starts a client: not every 20 ms
    v=$(rank_field step 2)
    [ -n "$v" ] && [ "$v" -ge 3 ]
}

t_stall_mgpu_worker_sigstop() {
    # the real trainer, publishing its progress page through libmgpu
    local mark=stall-worker-$$ pid victim S=3
    mkdir -m 0700 run
    export XDG_RUNTIME_DIR=$PWD/run
    cp "$MGPU_ROOT/configs/train.cfg" .
    MGPU_TEST_MARK=$mark "$LAUNCH" --nproc_per_node=4 --stall_timeout $S --summary s.json \
        train.cfg epochs=1000 >out 2>err &
    pid=$!
    # mid-run: rank 2 has published a few steps
    wait_until 60 rank2_stepped || fail "rank 2 made no step: $(tail err)"
    victim=$(rank_field pid 2)
    kill -STOP "$victim"
    wait_until 30 grep -q '^mgpu-launch: stall:' err || fail "no stall report: $(tail err)"
    kill -TERM $pid
    wait $pid
    expect_grep err "^mgpu-launch: stall: rank 2 \(local 2, pid $victim, host [^)]+\) is stopped \(SIGSTOP, Ctrl-Z or a debugger\) and has been in [a-z-]+ of step [0-9]+"
    python3 - s.json $S <<'EOF' || fail "summary: $(cat s.json)"
import json, sys
d = json.load(open(sys.argv[1])); S = float(sys.argv[2])
r = {x["rank"]: x for x in d["stalls"][0]["ranks"]}
assert r[2]["culprit"] and S <= r[2]["since_s"] <= S + 1, r[2]
assert not any(r[k]["culprit"] for k in (0, 1, 3)), r
EOF
    nothing_left $mark
}

t_stall_none_with_slow_steps() {
    skip_under_sanitizers "20 s of waiting; the detector's code runs in the other stall tests"
    # 2 s steps for 20 s, S = 5: rank 0 prints a line each step, rank 1 only touches its
    # heartbeat file (the one-line mechanism a program without libmgpu uses). The detector
    # looks every second, so 20 looks see each rank quiet for up to 2 s, never 5.
    cat >slow.sh <<'EOF'
#!/bin/bash
for i in $(seq 10); do
    if [ "$RANK" = 0 ]; then echo "step $i"; else touch "$MGPU_HEARTBEAT_FILE"; fi
    sleep 2
done
EOF
    chmod +x slow.sh
    run_launch --nproc_per_node=2 --stall_timeout 5 --summary s.json ./slow.sh
    expect_eq "$rc" 0 "exit status ($(tail -n 20 err))"
    expect_no_grep err 'stall'
    python3 -c 'import json,sys; assert json.load(open("s.json"))["stalls"] == []' ||
        fail "summary: $(cat s.json)"
}

t_stall_heartbeat_from_python() {
    # the documented Python line keeps a silent rank alive; the rank that stops touching is named
    cat >hb.py <<'EOF'
import os, time
for i in range(40 if os.environ["RANK"] == "0" else 3):
    os.utime(os.environ["MGPU_HEARTBEAT_FILE"])
    time.sleep(0.25)
time.sleep(3600)
EOF
    run_launch --nproc_per_node=2 --stall_timeout 2 --stall_action fail --grace_period 2 \
        --summary s.json --no_python "$PY" hb.py
    expect_eq "$rc" 124 "exit status ($(tail -n 20 err))"
    expect_grep err '^mgpu-launch: stall: rank 1 \(local 1, '
    python3 - s.json <<'EOF' || fail "summary: $(cat s.json)"
import json, sys
r = {x["rank"]: x for x in json.load(open(sys.argv[1]))["stalls"][0]["ranks"]}
assert r[1]["culprit"] and r[1]["heartbeats"] and r[0]["heartbeats"] and not r[0]["culprit"], r
EOF
}

t_stall_bad_options() {
    run_launch --stall_timeout -1 "$TW" exit 0
    expect_eq "$rc" 2
    expect_grep err "stall_timeout='-1': expected seconds"
    run_launch --stall_action retry "$TW" exit 0
    expect_eq "$rc" 2
    expect_grep err "stall_action='retry': expected report or fail"
    PET_STALL_TIMEOUT=abc run_launch "$TW" exit 0
    expect_eq "$rc" 2
    expect_grep err "PET_STALL_TIMEOUT='abc'"
}

t_stall_env_of_workers() {
    run_launch --nproc_per_node=2 "$TW" env env.%r
    expect_eq "$rc" 0
    local lp
    lp=$(grep '^MGPU_LAUNCHER_PID=' env.1 | cut -d= -f2)
    expect_grep env.1 "^MGPU_PROGRESS_FILE=/proc/$lp/fd/[0-9]+$"
    expect_grep env.1 '^MGPU_PROGRESS_SLOT=1$'
    expect_grep env.1 "^MGPU_HEARTBEAT_FILE=/proc/$lp/fd/[0-9]+$"
    [ "$(grep ^MGPU_HEARTBEAT_FILE= env.0)" != "$(grep ^MGPU_HEARTBEAT_FILE= env.1)" ] ||
        fail "ranks share a heartbeat file"
}
