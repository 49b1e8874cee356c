# test_status.sh - `mgpu-launch status`: a running job is listed (text and --json) by its
# user alone; a folder or socket another user could reach is refused; a socket left by a
# killed launcher is removed.

# hermetic: nothing of a surrounding job (Slurm, Open MPI, torchrun, PET_* defaults) leaks in
for v in $(env | grep -oE '^(PET|SLURM|OMPI|PMI|PMIX|TORCHELASTIC)_[A-Za-z0-9_]*'); do unset "$v"; done
unset LOGLEVEL PYTHON_EXEC
export MGPU_SIM_GPUS=0
unset CUDA_VISIBLE_DEVICES PET_NPROC_PER_NODE
export OMP_NUM_THREADS=1

# Each test has a runtime folder of its own: other launchers of this user do not show up.
use_own_dir() {
    mkdir -m 0700 run
    export XDG_RUNTIME_DIR=$PWD/run
}

# start_job ARGS...: a job in the background ($job: the launcher's pid), its socket ready
start_job() {
    "$LAUNCH" "$@" >out 2>err &
    job=$!
    wait_until 30 test -S "$XDG_RUNTIME_DIR/mgpu/$job.sock" || fail "no socket: $(cat err)"
}

stop_job() {
    kill -TERM $job
    wait $job || true
}

t_status_lists_running_job() {
    use_own_dir
    start_job --nproc_per_node=2 --stall_timeout 30 "$TW" print "hello %r" pause
    wait_until 30 grep -q 'hello 1' out || fail "workers did not start: $(cat err)"
    "$LAUNCH" status >st 2>st.err || fail "status failed: $(cat st.err)"
    expect_grep st "^job of launcher $job on [^,]+, run id none: .*testworker print hello %r pause$"
    expect_grep st 'stall timeout 30 s, 0 stalls reported'
    expect_grep st '^  RANK +LOCAL +PID +STATE'
    expect_grep st '^  0 +0 +[0-9]+ +running +- +- +[0-9.]+ s +- +"hello 0"$'
    expect_grep st '^  1 +1 +[0-9]+ +running '
    stat -c %a "$XDG_RUNTIME_DIR/mgpu" | grep -qx 700 || fail "folder mode $(stat -c %a run/mgpu)"
    stat -c %a "$XDG_RUNTIME_DIR/mgpu/$job.sock" | grep -qx 600 || fail "socket mode"
    "$LAUNCH" status --json >st.json || fail "status --json failed"
    python3 - st.json $job <<'EOF' || fail "status --json: $(cat st.json)"
import json, sys
d = json.load(open(sys.argv[1]))
# the user's other jobs (in /tmp/mgpu-<uid>) are listed too: this test's is the one of $job
[j] = [x for x in d["jobs"] if x["launcher_pid"] == int(sys.argv[2])]
assert j["launcher_pid"] == int(sys.argv[2]) and j["attempt"] == 0 and j["world_size"] == 2, j
assert [r["rank"] for r in j["ranks"]] == [0, 1], j
for r in j["ranks"]:
    assert r["state"] == "running" and r["pid"] > 0 and r["phase"] is None, r
    assert r["last_line"] == "hello %d" % r["rank"] and r["progress_age_s"] >= 0, r
EOF
    # a paused rank shows as such
    local p1
    p1=$(python3 -c 'import json,sys
[j] = [x for x in json.load(open(sys.argv[1]))["jobs"] if x["launcher_pid"] == int(sys.argv[2])]
print(j["ranks"][1]["pid"])' st.json $job)
    kill -STOP "$p1"
    wait_until 10 grep -q '^[0-9]* (.*) T' /proc/$p1/stat || fail "rank 1 did not stop"
    "$LAUNCH" status >st2 || fail "status failed"
    expect_grep st2 '^  1 +1 +[0-9]+ +paused '
    stop_job
    [ ! -e "$XDG_RUNTIME_DIR/mgpu/$job.sock" ] || fail "socket left after the job"
    "$LAUNCH" status >st3 || fail "status failed"
    expect_no_grep st3 "^job of launcher $job "
    # with no job of the user's anywhere, it says so
    grep -q '^job of launcher' st3 || expect_grep st3 '^no running mgpu-launch job of uid'
}

t_status_tmp_folder_without_xdg() {
    unset XDG_RUNTIME_DIR
    "$LAUNCH" --nproc_per_node=1 "$TW" pause >out 2>err &
    job=$!
    local sock=/tmp/mgpu-$(id -u)/$job.sock
    wait_until 30 test -S "$sock" || fail "no socket $sock: $(cat err)"
    "$LAUNCH" status --json >st.json || fail "status failed"
    python3 -c "import json,sys; assert any(j['launcher_pid'] == $job for j in json.load(open('st.json'))['jobs'])" ||
        fail "job not listed: $(cat st.json)"
    kill -TERM $job
    wait $job || true
    [ ! -e "$sock" ] || fail "socket left after the job"
}

t_status_folder_with_wrong_mode_refused() {
    use_own_dir
    mkdir -m 0755 run/mgpu
    run_launch --nproc_per_node=1 "$TW" print ok
    expect_eq "$rc" 0 "the job runs without its status socket ($(cat err))"
    expect_grep err 'mgpu-launch status. will not see this job: .*run/mgpu belongs to uid [0-9]+ and has mode 0755: expected uid [0-9]+ and mode 0700'
    "$LAUNCH" status >st 2>st.err
    expect_eq "$?" 1 "status exit with a refused folder"
    expect_grep st.err 'refusing the status folder: .*mode 0755'
}

t_status_socket_with_wrong_mode_refused() {
    use_own_dir
    start_job --nproc_per_node=1 "$TW" pause
    chmod 0666 "$XDG_RUNTIME_DIR/mgpu/$job.sock"
    "$LAUNCH" status >st 2>st.err
    expect_eq "$?" 1 "status exit with a refused socket"
    expect_grep st.err "refusing .*/$job.sock: a socket of uid [0-9]+ with mode 0666, expected a socket of uid [0-9]+ with mode 0600"
    expect_no_grep st "launcher $job"
    stop_job
}

t_status_stale_socket_removed() {
    use_own_dir
    mkdir -m 0700 run/mgpu
    python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1])' run/mgpu/999999.sock
    chmod 0600 run/mgpu/999999.sock
    "$LAUNCH" status >st 2>st.err || fail "status failed: $(cat st.err)"
    [ ! -e run/mgpu/999999.sock ] || fail "stale socket not removed"
    expect_no_grep st '^job of launcher 999999 '
    grep -q '^job of launcher' st || expect_grep st '^no running mgpu-launch job'
}

# A launcher that ends while it is asked (it removes its socket, then drops the connection
# unread) is not an error: status lists the others and exits 0. One that drops the connection
# and stays is named.
t_status_job_ending_while_asked_is_skipped() {
    use_own_dir
    mkdir -m 0700 run/mgpu
    python3 -c 'import os, socket, sys, time
path, keep = sys.argv[1], sys.argv[2] == "keep"
s = socket.socket(socket.AF_UNIX); s.bind(path); os.chmod(path, 0o600); s.listen(4)
open("ready", "w").close()
c, _ = s.accept(); time.sleep(0.2)
if not keep: os.unlink(path)
c.close()
if keep: time.sleep(30)' "run/mgpu/$$.sock" end &
    local fake=$!
    wait_until 10 test -e ready || fail "fake launcher did not start"
    "$LAUNCH" status >st 2>st.err || fail "status failed: $(cat st.err)"
    expect_no_grep st.err 'error'
    grep -q '^job of launcher' st || expect_grep st '^no running mgpu-launch job'
    wait $fake
    rm -f ready
    python3 -c 'import os, socket, sys, time
s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); os.chmod(sys.argv[1], 0o600); s.listen(4)
open("ready", "w").close()
c, _ = s.accept(); c.close(); time.sleep(30)' "run/mgpu/$$.sock" &
    fake=$!
    wait_until 10 test -e ready || fail "fake launcher did not start"
    "$LAUNCH" status >st 2>st.err
    expect_eq "$?" 1 "status exit when a launcher drops the connection"
    expect_grep st.err "error: .*/$$.sock"
    kill $fake; wait $fake 2>/dev/null || true
}

t_status_other_user_cannot_connect() {
    [ "$(id -u)" = 0 ] || skip "needs root to run a client as another user"
    command -v setpriv >/dev/null || skip "setpriv not installed"
    # a runtime folder the other user may traverse (the test's own folder is closed to it)
    export XDG_RUNTIME_DIR=$(mktemp -d /tmp/mgpu-status-test.XXXXXX)
    chmod 0711 "$XDG_RUNTIME_DIR"
    trap 'rm -rf "$XDG_RUNTIME_DIR"' EXIT
    start_job --nproc_per_node=1 "$TW" pause
    local sock=$XDG_RUNTIME_DIR/mgpu/$job.sock
    setpriv --reuid=nobody --regid=nogroup --clear-groups /usr/bin/python3 - "$sock" <<'EOF' >o 2>&1
import socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
    s.sendall(b'{"stacks": false}\n')
    print("answer:", s.recv(65536))
except OSError as e:
    print("refused:", e)
EOF
    expect_grep o '^refused: .*Permission denied'
    # nor with the folder and socket opened up by hand: the peer's uid is checked
    chmod 0755 "$XDG_RUNTIME_DIR/mgpu"
    chmod 0666 "$sock"
    setpriv --reuid=nobody --regid=nogroup --clear-groups /usr/bin/python3 - "$sock" <<'EOF' >o2 2>&1
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
try:
    s.sendall(b'{"stacks": false}\n')
    answer = s.recv(65536)
except (ConnectionResetError, BrokenPipeError):
    answer = b""
print("closed without an answer" if answer == b"" else "answer: %r" % answer)
EOF
    expect_grep o2 '^closed without an answer$'
    wait_until 10 grep -q 'refused a connection from uid' err || fail "no refusal: $(cat err)"
    stop_job
}

t_status_bad_option() {
    "$LAUNCH" status --frobnicate >st 2>st.err
    expect_eq "$?" 2
    expect_grep st.err "status: unknown option '--frobnicate': expected --stacks or --json"
}

t_status_stacks() {
    command -v gdb >/dev/null || command -v eu-stack >/dev/null || command -v py-spy >/dev/null ||
        skip "no stack tool (py-spy, gdb, eu-stack) installed"
    use_own_dir
    start_job --nproc_per_node=2 "$TW" print "up %r" sleep 3600
    wait_until 30 grep -q 'up 1' out || fail "workers did not start: $(cat err)"
    "$LAUNCH" status --stacks >st 2>st.err || fail "status --stacks failed: $(cat st.err)"
    expect_grep st '^    stack of rank 0 \(pid [0-9]+\):$'
    expect_grep st '^    stack of rank 1 \(pid [0-9]+\):$'
    expect_grep st 'sleep'
    "$LAUNCH" status --stacks --json >st.json || fail "status --stacks --json failed"
    python3 -c 'import json, sys
[j] = [x for x in json.load(open("st.json"))["jobs"] if x["launcher_pid"] == int(sys.argv[1])]
assert all("sleep" in r["stack"] for r in j["ranks"]), j' $job ||
        fail "stacks: $(cat st.json)"
    stop_job
}
