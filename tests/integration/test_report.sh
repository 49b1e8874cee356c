# test_report.sh - what the failure report hands on: the root cause's error file for a
# scheduler above the launcher ($TORCHELASTIC_ERROR_FILE, torchrun's format with errorCode),
# error_file paths that outlive the run, the Python interpreter the workers ran (--dry-run,
# -v) and a hint naming it when every failed rank lacks a module.

for v in $(env | grep -oE '^(PET|SLURM|OMPI|PMI|PMIX|TORCHELASTIC)_[A-Za-z0-9_]*'); do unset "$v"; done
unset LOGLEVEL PYTHON_EXEC CUDA_VISIBLE_DEVICES
export MGPU_SIM_GPUS=0 OMP_NUM_THREADS=1

# json_check FILE PYTHON-EXPRESSION... : each expression, with d the parsed file, must hold
json_check() {
    local f=$1; shift
    python3 - "$f" "$@" <<'PY' || fail "$(cat "$f")"
import json, sys
d = json.load(open(sys.argv[1]))
for e in sys.argv[2:]:
    assert eval(e), "%s: %r" % (e, d)
PY
}

t_report_parent_error_file_copied_with_error_code() {
    # rank 1 writes torchrun's error file and exits 3: the launcher's own error file gets it,
    # with "errorCode": 3 inside "message" (torch's @record does the same)
    TORCHELASTIC_ERROR_FILE=$PWD/parent.json run_launch --nproc_per_node=2 "$TW" \
        only 1 errfile "RuntimeError: boom from rank %r" only 1 exit 3 pause
    expect_eq "$rc" 3
    json_check parent.json 'd["message"]["message"] == "RuntimeError: boom from rank 1"' \
        'd["message"]["errorCode"] == 3' \
        '"Traceback" in d["message"]["extraInfo"]["py_callstack"]' \
        'int(d["message"]["extraInfo"]["timestamp"]) > 0'
    # the workers wrote their own files, not the launcher's
    expect_no_grep err "error_file: $PWD/parent.json"
}

t_report_parent_error_file_newer_layout_copied() {
    # "message" a plain string: copied as it is (torchrun adds no errorCode there)
    cat >w.sh <<'EOS'
#!/bin/sh
printf '{"message": "ValueError: newer layout", "timestamp": 1700000000}\n' >"$TORCHELASTIC_ERROR_FILE"
exit 2
EOS
    chmod +x w.sh
    TORCHELASTIC_ERROR_FILE=$PWD/parent.json run_launch --nproc_per_node=1 ./w.sh
    expect_eq "$rc" 2
    json_check parent.json 'd["message"] == "ValueError: newer layout"' 'd["timestamp"] == 1700000000'
}

t_report_parent_error_file_written_without_worker_file() {
    # no error file from the worker: one in torchrun's format, the failure in words, the
    # last stderr lines as its call stack, the exit code
    TORCHELASTIC_ERROR_FILE=$PWD/parent.json run_launch --nproc_per_node=2 "$TW" \
        only 0 eprint "the reason it failed" only 0 exit 7 pause
    expect_eq "$rc" 7
    json_check parent.json 'd["message"]["errorCode"] == 7' \
        '"rank 0" in d["message"]["message"] and "exitcode 7" in d["message"]["message"]' \
        '"the reason it failed" in d["message"]["extraInfo"]["py_callstack"]' \
        'int(d["message"]["extraInfo"]["timestamp"]) > 0'
    # killed by a signal: 128+N, as the launcher exits
    TORCHELASTIC_ERROR_FILE=$PWD/parent2.json run_launch --nproc_per_node=1 "$TW" raise KILL
    expect_eq "$rc" 137
    json_check parent2.json 'd["message"]["errorCode"] == 137' '"SIGKILL" in d["message"]["message"]'
    # the launcher stopped by a signal
    TORCHELASTIC_ERROR_FILE=$PWD/parent3.json "$LAUNCH" --nproc_per_node=1 "$TW" touch ready pause >out 2>err &
    local pid=$!
    wait_until 10 test -e ready || fail "worker did not start"
    kill -TERM $pid
    wait $pid
    expect_eq "$?" 143
    json_check parent3.json 'd["message"]["errorCode"] == 143' '"SIGTERM" in d["message"]["message"]'
}

t_report_parent_error_file_untouched_on_success() {
    TORCHELASTIC_ERROR_FILE=$PWD/parent.json run_launch --nproc_per_node=2 "$TW" exit 0
    expect_eq "$rc" 0
    [ ! -e parent.json ] || fail "a run that succeeded wrote $(cat parent.json)"
}

t_report_error_file_path_exists_after_exit() {
    # without --log_dir the error files live in a temporary folder: the report names one,
    # so it must still be there once the launcher exits
    local tmp; tmp=$(mktemp -d)
    TMPDIR=$tmp run_launch --nproc_per_node=2 "$TW" only 1 errfile "RuntimeError: kept %r" only 1 exit 1 pause
    expect_eq "$rc" 1
    local path; path=$(sed -n 's/^ *error_file: \(\/.*\)$/\1/p' err | head -n 1)
    [ -n "$path" ] || fail "no error_file path in: $(cat err)"
    case "$path" in "$tmp"/*) ;; *) fail "error file '$path' not under TMPDIR" ;; esac
    [ -f "$path" ] || fail "error_file: $path printed, gone after exit"
    expect_grep "$path" 'RuntimeError: kept 1'
    rm -rf "$tmp"
    # no error file: the temporary folder still goes
    tmp=$(mktemp -d)
    TMPDIR=$tmp run_launch --nproc_per_node=2 "$TW" only 1 exit 1 pause
    expect_eq "$rc" 1
    expect_grep err 'error_file: <N/A>'
    expect_eq "$(ls -A "$tmp")" "" "leftovers in TMPDIR"
    rm -rf "$tmp"
}

t_report_python_interpreter_in_dry_run_and_banner() {
    command -v python3 >/dev/null || skip "python3 needed"
    local py; py=$(command -v python3)
    echo 'print("hi")' >x.py
    run_launch --nproc_per_node=1 --dry-run x.py
    expect_eq "$rc" 0
    expect_grep out "^  python: $py "
    run_launch --nproc_per_node=1 --dry-run=json x.py
    json_check out "d[\"python\"] == \"$py\""
    # PYTHON_EXEC, relative: shown as a full path
    mkdir -p venv/bin && ln -s "$py" venv/bin/python3
    PYTHON_EXEC=venv/bin/python3 run_launch --nproc_per_node=1 --dry-run=json x.py
    json_check out "d[\"python\"] == \"$PWD/venv/bin/python3\""
    # not a Python worker: none
    run_launch --nproc_per_node=1 --dry-run=json "$TW" exit 0
    json_check out 'd["python"] is None'
    # the -v banner
    run_launch --nproc_per_node=1 -v x.py
    expect_eq "$rc" 0
    expect_grep err "python: $py"
}

t_report_hint_for_the_local_rank_argument() {
    # a script written for torch.distributed.launch (argparse wants --local_rank, or torch 2's
    # --local-rank): the report ends with the option that passes it; with --legacy_local_rank
    # given to a script that takes no such argument, the advice to drop it; a script that fails
    # otherwise gets no hint
    command -v python3 >/dev/null || skip "python3 needed"
    local a
    for a in local_rank local-rank; do
        cat >"$a.py" <<EOS
import argparse
p = argparse.ArgumentParser()
p.add_argument("--$a", type=int, required=True)
print("local rank", vars(p.parse_args())["local_rank"])
EOS
    done
    echo 'import argparse; argparse.ArgumentParser().parse_args()' >none.py
    run_launch --nproc_per_node=2 local_rank.py
    expect_eq "$rc" 2
    expect_eq "$(tail -n 1 err)" "hint: the script wants torch.distributed.launch's --local_rank argument: give --legacy_local_rank, or have it read LOCAL_RANK from its environment (torchrun's way)"
    run_launch --nproc_per_node=2 --legacy_local_rank local-rank.py
    expect_eq "$rc" 2
    expect_eq "$(tail -n 1 err)" "hint: the script wants torch.distributed.launch's --local-rank argument: give --legacy_local_rank=dash, or have it read LOCAL_RANK from its environment (torchrun's way)"
    run_launch --nproc_per_node=2 --legacy_local_rank local_rank.py
    expect_eq "$rc" 0 "with --legacy_local_rank ($(cat err))"
    expect_grep out '^\[rank1\]:local rank 1$'
    run_launch --nproc_per_node=2 --legacy_local_rank=dash local-rank.py
    expect_eq "$rc" 0 "with --legacy_local_rank=dash ($(cat err))"
    expect_grep out '^\[rank1\]:local rank 1$'
    run_launch --nproc_per_node=2 --legacy_local_rank none.py
    expect_eq "$rc" 2
    expect_eq "$(tail -n 1 err)" "hint: the script takes no --local_rank argument: drop --legacy_local_rank (LOCAL_RANK is in every worker's environment), or give --legacy_local_rank=dash if it takes --local-rank"
    run_launch --nproc_per_node=2 none.py --bogus
    expect_eq "$rc" 2
    expect_no_grep err '^hint:'
}

t_report_hint_when_master_port_is_taken() {
    # rank 0's PyTorch store could not listen on MASTER_PORT (torch 1.x's words, then 2.x's):
    # the hint names the port and the option; another port in the message: no hint
    local p; p=$(free_port)
    run_launch --nproc_per_node=2 --master_port "$p" -- sh -c '[ "$RANK" = 0 ] || sleep 5
echo "RuntimeError: The server socket has failed to bind to [::]:$MASTER_PORT (errno: 98 - Address already in use)." >&2; exit 1'
    expect_eq "$rc" 1
    expect_eq "$(tail -n 1 err)" "hint: MASTER_PORT $p, where rank 0's PyTorch store listens, is taken on $(hostname) by another program: give another --master_port"
    run_launch --nproc_per_node=1 --master_port "$p" -- sh -c 'echo "RuntimeError: The server socket has failed to listen on any local network address. port: $MASTER_PORT, useIpv6: 0, code: -98, name: EADDRINUSE, message: address already in use" >&2; exit 1'
    expect_grep err "^hint: MASTER_PORT $p, "
    run_launch --nproc_per_node=1 --master_port "$p" -- sh -c 'echo "bind to 0.0.0.0:1$MASTER_PORT (errno: 98 - Address already in use)" >&2; exit 1'
    expect_eq "$rc" 1
    expect_no_grep err '^hint:'
}

t_report_hint_when_nccl_is_asked_for_without_it() {
    # PyTorch's words where its build has no NCCL (Debian's) or no GPU is seen: the hint says
    # gloo, and why the host has no GPU
    run_launch --nproc_per_node=2 -- sh -c 'echo "RuntimeError: Distributed package doesn'"'"'t have NCCL built in" >&2; exit 1'
    expect_eq "$rc" 1
    expect_eq "$(tail -n 1 err)" 'hint: the workers asked PyTorch for NCCL, which needs GPUs and a CUDA build of torch: on CPUs, init_process_group("gloo"); here: no GPU is installed'
    run_launch --nproc_per_node=1 -- sh -c 'echo "RuntimeError: ProcessGroupNCCL is only supported with GPUs, no GPUs found!" >&2; exit 1'
    expect_grep err '^hint: the workers asked PyTorch for NCCL'
}

t_report_hint_when_every_rank_lacks_a_module() {
    command -v python3 >/dev/null || skip "python3 needed"
    local py; py=$(command -v python3)
    echo 'import mgpu_no_such_module_xyz' >x.py
    run_launch --nproc_per_node=2 x.py
    expect_eq "$rc" 1
    expect_grep err "ModuleNotFoundError"
    expect_eq "$(tail -n 1 err)" "hint: no module named 'mgpu_no_such_module_xyz' for $py, the interpreter used; to choose another: PYTHON_EXEC=/path/to/python3"
    # the root cause failed of something else: no hint
    cat >y.py <<'EOS'
import os, time
if os.environ["RANK"] == "0":
    time.sleep(0.5)
    import mgpu_no_such_module_xyz
raise SystemExit(5)
EOS
    run_launch --nproc_per_node=2 y.py
    expect_eq "$rc" 5
    expect_no_grep err '^hint:'
}
