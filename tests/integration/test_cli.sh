# test_cli.sh - the command line: bad input (exit 2, one line naming it, nothing started), both
# spellings, --opt=v / --opt v, PET_* defaults, the worker's arguments passed unchanged, "--",
# .py / -m / --no_python / --run_path, --legacy_local_rank, --dry-run, --summary, --version,
# --help.

# hermetic: nothing of a surrounding job (Slurm, Open MPI, torchrun, PET_* defaults) leaks in
for v in $(env | grep -oE '^(PET|SLURM|OMPI|PMI|PMIX|TORCHELASTIC)_[A-Za-z0-9_]*'); do unset "$v"; done
unset LOGLEVEL PYTHON_EXEC
export MGPU_SIM_GPUS=0
unset CUDA_VISIBLE_DEVICES OMP_NUM_THREADS

envval() { local l; l=$(grep -m1 "^$2=" "$1") || { echo "<unset>"; return; }; echo "${l#*=}"; }

# bad ARGS... : the launcher refuses: exit 2, one line on stderr, nothing on stdout, no worker
# (the worker would create "started"). $want (grep -E) must be in the message.
bad() {
    local want=$1; shift
    rm -f started.*
    "$LAUNCH" "$@" "$TW" touch started.%l >out 2>err
    rc=$?
    [ "$rc" -eq 2 ] || fail "mgpu-launch $*: exit $rc, expected 2 (stderr: $(head -c 300 err))"
    [ "$(wc -l <err)" -eq 1 ] || fail "mgpu-launch $*: expected a one-line message, got: $(cat err)"
    [ ! -s out ] || fail "mgpu-launch $*: printed on stdout: $(cat out)"
    grep -qE -- "$want" err || fail "mgpu-launch $*: message does not name '$want': $(cat err)"
    sleep 0.05
    ! ls started.* >/dev/null 2>&1 || fail "mgpu-launch $*: a worker was started"
}

t_bad_unknown_option() { bad '--bogus' --bogus; bad '-x' -x; bad '--nproc_per_nodes=2 \(did you mean --nproc_per_node\?' --nproc_per_nodes=2; }
t_bad_missing_value() {
    "$LAUNCH" --nproc_per_node >out 2>err; rc=$?
    expect_eq "$rc" 2
    expect_grep err 'nproc_per_node'
    expect_eq "$(wc -l <err)" 1 "message lines"
    "$LAUNCH" -r >out 2>err; rc=$?
    expect_eq "$rc" 2
    expect_grep err 'redirects|-r'
    "$LAUNCH" --nproc_per_node=2 >out 2>err; rc=$?
    expect_eq "$rc" 2 "no program"
    expect_eq "$(wc -l <err)" 1 "message lines"
}
t_bad_nproc() {
    bad "'0'|=0\b" --nproc_per_node=0
    bad '-1' --nproc_per_node=-1
    bad '99999' --nproc_per_node=99999
    bad 'abc' --nproc_per_node=abc
    bad "''|empty" --nproc_per_node=
    bad '2\.5' --nproc_per_node=2.5
    bad '1e3' --nproc_per_node 1e3
}
t_bad_nnodes() {
    bad '2:1' --nnodes=2:1
    bad '1:2:3' --nnodes=1:2:3
    bad "nnodes.*0" --nnodes=0
    bad 'x' --nnodes=x
    bad ':2' --nnodes=:2
}
t_bad_static_endpoint_without_port() {
    # torchrun's static rendezvous meets at --rdzv_endpoint when given: it needs a port
    bad "rdzv_endpoint='node0'.*port" --nnodes=2 --rdzv_endpoint=node0
}
t_opt_rdzv_endpoint_beats_master_addr() {
    # a job given both: the nodes meet at the endpoint; --master_addr is ignored, and said to be
    "$LAUNCH" --nnodes=2 --node_rank=1 --rdzv_endpoint=10.9.8.7:29911 --master_addr=10.1.1.1 \
        --dry-run "$TW" true >out 2>err || fail "exit $? ($(cat err))"
    expect_grep out 'master: 10\.9\.8\.7:29911'
    expect_grep err 'only used without --rdzv_endpoint: the nodes meet at 10\.9\.8\.7:29911'
    "$LAUNCH" --nnodes=2 --node_rank=1 --rdzv_endpoint=10.9.8.7:29911 --dry-run "$TW" true \
        >out 2>err || fail "exit $? ($(cat err))"
    [ ! -s err ] || fail "a warning without --master_addr: $(cat err)"
}
t_bad_master_port() {
    bad '70000' --master_port=70000
    bad '-5' --master_port=-5
    bad 'http' --master_port=http
}
t_bad_grace_period() { bad '-1' --grace_period=-1; bad 'soon' --grace_period soon; }
t_bad_redirects_tee() {
    bad "redirects.*4|'4'" --redirects=4
    bad '0:9' --redirects=0:9
    bad '0:1,' -t 0:1,
    bad 'abc' --tee=abc
    bad '1:' -r 1:
}
t_bad_node_rank() {
    bad 'node_rank' --nnodes=2 --node_rank=2
    bad 'node_rank' --node_rank=1
    bad '-1' --node_rank=-1
}
t_bad_no_python_with_module() { bad 'no_python.*module|module.*no_python' --no_python -m; }
t_bad_max_restarts() { bad '-1' --max_restarts=-1; bad 'x' --max_restarts x; }
t_bad_local_ranks_filter() { bad 'a' --local_ranks_filter=a; }
t_bad_flag_with_value() { bad 'standalone' --standalone=yes; }
t_bad_pet_env() {
    PET_NPROC_PER_NODE=0 bad 'PET_NPROC_PER_NODE' --max_restarts=0
    PET_NNODES=3:1 bad 'PET_NNODES' --max_restarts=0
    PET_STANDALONE=yes bad 'PET_STANDALONE' --max_restarts=0
}
t_bad_sim_gpus() { MGPU_SIM_GPUS=lots bad 'MGPU_SIM_GPUS' --nproc_per_node=1; }
t_bad_log_dir_is_a_file() {
    touch afile
    bad 'afile' --log_dir afile/logs
}

# --- accepted forms ---

nworkers() { ls e.* 2>/dev/null | wc -l; }

t_opt_both_spellings_and_value_forms() {
    local form
    for form in "--nproc_per_node=3" "--nproc-per-node=3" "--nproc_per_node 3" "--nproc-per-node 3"; do
        rm -f e.*
        # shellcheck disable=SC2086
        run_launch $form "$TW" env e.%l
        expect_eq "$rc" 0 "$form: exit status ($(cat err))"
        expect_eq "$(nworkers)" 3 "$form: workers"
    done
    for form in "--max-restarts=4" "--max_restarts 4"; do
        rm -f e.*
        # shellcheck disable=SC2086
        run_launch $form "$TW" env e.%l
        expect_eq "$(envval e.0 TORCHELASTIC_MAX_RESTARTS)" 4 "$form"
    done
    for form in "--rdzv-id=abc" "--rdzv_id abc"; do
        rm -f e.*
        # shellcheck disable=SC2086
        run_launch $form "$TW" env e.%l
        expect_eq "$(envval e.0 TORCHELASTIC_RUN_ID)" abc "$form"
    done
    for form in "--master-addr=h1" "--master_addr h1"; do
        rm -f e.*
        # shellcheck disable=SC2086
        run_launch $form "$TW" env e.%l
        expect_eq "$(envval e.0 MASTER_ADDR)" h1 "$form"
    done
    # short options: -r3, -r 3, -t=3 (argparse's forms)
    for form in "-r3" "-r 3" "-t3" "-t 0:3"; do
        rm -rf logs
        # shellcheck disable=SC2086
        run_launch --log_dir logs $form "$TW" print hi
        expect_eq "$rc" 0 "$form: exit status ($(cat err))"
        expect_grep "$(ls -d logs/none_*)/attempt_0/0/stdout.log" '^hi$'
    done
}

t_opt_unique_prefix_accepted() {
    # argparse's abbreviations: the upstream tests use --redirect=3
    run_launch --nproc=2 --redirect=3 --log_dir logs "$TW" env e.%l
    expect_eq "$rc" 0 "exit status ($(cat err))"
    expect_eq "$(nworkers)" 2
}

t_opt_monitor_interval_and_start_method_accepted() {
    run_launch --monitor_interval=0.1 --start_method=fork --rdzv_backend=static --use_env "$TW" env e.%l
    expect_eq "$rc" 0 "exit status ($(cat err))"
}

t_opt_event_log_handler_and_logs_specs() {
    run_launch --event-log-handler=null --logs-specs=default "$TW" env e.%l
    expect_eq "$rc" 0 "exit status ($(cat err))"
    expect_no_grep err 'info:'
    # console: the launcher's events, its info messages
    PET_EVENT_LOG_HANDLER=console run_launch "$TW" env e.%l
    expect_eq "$rc" 0 "exit status with console ($(cat err))"
    expect_grep err '^mgpu-launch: info: '
    run_launch --event_log_handler=syslog "$TW" touch started
    expect_eq "$rc" 2 "exit status of an unknown handler"
    expect_grep err "event_log_handler='syslog': expected null, console or dynamic_rendezvous"
    run_launch --logs_specs=mypkg "$TW" touch started
    expect_eq "$rc" 2 "exit status of a plug-in layout"
    expect_grep err "logs_specs='mypkg': expected default"
    [ ! -e started ] || fail "a worker started after a refused option"
}

t_opt_pet_env_defaults() {
    PET_NPROC_PER_NODE=3 PET_RDZV_ID=fromenv PET_ROLE=envrole PET_MAX_RESTARTS=2 PET_MASTER_ADDR=envhost \
        run_launch "$TW" env e.%l
    expect_eq "$rc" 0 "exit status ($(cat err))"
    expect_eq "$(nworkers)" 3 "workers from PET_NPROC_PER_NODE"
    expect_eq "$(envval e.0 TORCHELASTIC_RUN_ID)" fromenv
    expect_eq "$(envval e.0 ROLE_NAME)" envrole
    expect_eq "$(envval e.0 TORCHELASTIC_MAX_RESTARTS)" 2
    expect_eq "$(envval e.0 MASTER_ADDR)" envhost
    # the command line wins
    rm -f e.*
    PET_NPROC_PER_NODE=3 PET_RDZV_ID=fromenv run_launch --nproc_per_node=2 --rdzv_id=fromcli "$TW" env e.%l
    expect_eq "$rc" 0
    expect_eq "$(nworkers)" 2 "workers: the command line beats PET_NPROC_PER_NODE"
    expect_eq "$(envval e.0 TORCHELASTIC_RUN_ID)" fromcli
    # flags: PET_STANDALONE=1, PET_NO_PYTHON=1 (torchrun's check_env: an integer)
    rm -f e.*
    PET_STANDALONE=1 run_launch "$TW" env e.%l
    expect_eq "$rc" 0
    [[ "$(envval e.0 TORCHELASTIC_RUN_ID)" =~ ^[0-9a-f-]{36}$ ]] || fail "PET_STANDALONE=1: run id $(envval e.0 TORCHELASTIC_RUN_ID)"
    rm -f e.*
    PET_STANDALONE=0 run_launch "$TW" env e.%l
    expect_eq "$(envval e.0 TORCHELASTIC_RUN_ID)" none "PET_STANDALONE=0"
}

t_opt_everything_after_program_passed_unchanged() {
    run_launch --nproc_per_node=2 "$TW" argv a.%l --nproc_per_node=5 -- --max_restarts=3 "with space" "" \
        'x=$HOME' -m --help --version -r 3 '*'
    expect_eq "$rc" 0 "exit status ($(cat err))"
    [ ! -e e.2 ] || fail "worker options were read by the launcher"
    printf '%s\n' "$TW" argv a.%l --nproc_per_node=5 -- --max_restarts=3 "with space" "" 'x=$HOME' -m \
        --help --version -r 3 '*' >expected
    for k in 0 1; do
        cmp -s expected a.$k || fail "rank $k argv: $(diff expected a.$k)"
    done
    [ ! -e a.2 ] || fail "3 workers"
}

t_opt_double_dash_separator() {
    run_launch --nproc_per_node=2 -- "$TW" argv a.%l -- --x
    expect_eq "$rc" 0 "exit status ($(cat err))"
    printf '%s\n' "$TW" argv a.%l -- --x >expected
    cmp -s expected a.1 || fail "argv after --: $(diff expected a.1)"
    # a program whose name starts with a dash, after --
    cp "$TW" ./-dash-prog
    run_launch -- ./-dash-prog argv d.%l
    expect_eq "$rc" 0 "exit status ($(cat err))"
    [ -e d.0 ] || fail "./-dash-prog did not run"
}

fake_python() {
    # a stand-in interpreter: records its argv (one a line) in pyargv.<RANK>
    mkdir -p bin
    cat >bin/python3 <<'EOF'
#!/bin/sh
out="$PWD/pyargv.$RANK"
printf '%s\n' "$0" "$@" >"$out.tmp" && mv "$out.tmp" "$out"
EOF
    chmod +x bin/python3
    cp bin/python3 bin/fakepy
}

t_opt_py_script_runs_python_u() {
    fake_python
    echo 'print("hi")' >train.py
    PYTHON_EXEC=$PWD/bin/fakepy run_launch --nproc_per_node=2 train.py --lr 0.1 --nproc_per_node=9
    expect_eq "$rc" 0 "exit status ($(cat err))"
    printf '%s\n' "$PWD/bin/fakepy" -u train.py --lr 0.1 --nproc_per_node=9 >expected
    for k in 0 1; do cmp -s expected pyargv.$k || fail "rank $k: $(diff expected pyargv.$k)"; done
    # without PYTHON_EXEC: python3 from PATH
    rm -f pyargv.*
    PATH=$PWD/bin:$PATH run_launch --nproc_per_node=1 train.py a
    expect_eq "$rc" 0 "exit status ($(cat err))"
    expect_eq "$(sed -n 2,4p pyargv.0 | tr '\n' ' ')" "-u train.py a " "python3 argv"
    expect_grep pyargv.0 "^$PWD/bin/python3$|^python3$"
}

t_opt_module() {
    fake_python
    PYTHON_EXEC=$PWD/bin/fakepy run_launch --nproc_per_node=1 -m my.module --flag x
    expect_eq "$rc" 0 "exit status ($(cat err))"
    printf '%s\n' "$PWD/bin/fakepy" -u -m my.module --flag x >expected
    cmp -s expected pyargv.0 || fail "-m: $(diff expected pyargv.0)"
    rm -f pyargv.*
    PYTHON_EXEC=$PWD/bin/fakepy run_launch --module my.module
    expect_eq "$rc" 0
    cmp -s <(printf '%s\n' "$PWD/bin/fakepy" -u -m my.module) pyargv.0 || fail "--module: $(cat pyargv.0)"
}

t_opt_no_python() {
    fake_python
    # a .py file that is really a shell script: --no_python executes it directly
    printf '#!/bin/sh\nprintf "%%s\\n" "$0" "$@" >"$PWD/direct.$RANK"\n' >tool.py
    chmod +x tool.py
    PYTHON_EXEC=$PWD/bin/fakepy run_launch --no_python --nproc_per_node=2 ./tool.py a b
    expect_eq "$rc" 0 "exit status ($(cat err))"
    [ ! -e pyargv.0 ] || fail "--no_python ran the interpreter"
    expect_eq "$(tr '\n' ' ' <direct.1)" "./tool.py a b " "argv with --no_python"
    rm -f direct.*
    PET_NO_PYTHON=1 PYTHON_EXEC=$PWD/bin/fakepy run_launch ./tool.py c
    expect_eq "$rc" 0
    [ -e direct.0 ] && [ ! -e pyargv.0 ] || fail "PET_NO_PYTHON=1 ignored"
}

t_opt_run_path() {
    fake_python
    printf 'print(1)\n' >job.sh
    PYTHON_EXEC=$PWD/bin/fakepy run_launch --run_path job.sh z
    expect_eq "$rc" 0 "exit status ($(cat err))"
    expect_eq "$(tr '\n' ' ' <pyargv.0)" "$PWD/bin/fakepy -u job.sh z " "--run_path argv"
}

t_opt_legacy_local_rank() {
    run_launch --legacy_local_rank --nproc_per_node=2 "$TW" argv a.%l --x 1
    expect_eq "$rc" 0 "exit status ($(cat err))"
    for k in 0 1; do
        printf '%s\n' "$TW" "--local_rank=$k" argv a.%l --x 1 >expected
        cmp -s expected a.$k || fail "rank $k argv: $(diff expected a.$k)"
    done
    # the article's scripts: python script.py --local_rank=N args
    fake_python
    echo 'pass' >demo.py
    PYTHON_EXEC=$PWD/bin/fakepy run_launch --legacy_local_rank --nproc_per_node=2 demo.py --epochs 2
    expect_eq "$rc" 0
    expect_eq "$(tr '\n' ' ' <pyargv.1)" "$PWD/bin/fakepy -u demo.py --local_rank=1 --epochs 2 " "legacy .py argv"
    # off by default
    rm -f a.*
    run_launch --nproc_per_node=1 "$TW" argv a.%l
    expect_no_grep a.0 'local_rank'
}

t_opt_dry_run_text() {
    run_launch --dry-run --nproc_per_node=3 "$TW" touch started.%l
    expect_eq "$rc" 0 "exit status ($(cat err))"
    sleep 0.1
    ! ls started.* >/dev/null 2>&1 || fail "--dry-run started workers"
    for k in 0 1 2; do expect_grep out "rank $k"; done
    expect_grep out 'LOCAL_RANK=2'
    expect_grep out 'MASTER_PORT='
    expect_grep out "$TW touch started"
    run_launch --dry_run --nproc_per_node=1 "$TW" touch started.%l
    expect_eq "$rc" 0 "--dry_run spelling"
    [ ! -e started.0 ] || fail "--dry_run started a worker"
}

t_opt_dry_run_json() {
    MGPU_SIM_GPUS=4 run_launch --dry-run=json --nproc_per_node=2 --nnodes=2 --node_rank=1 --master_port=1234 \
        "$TW" touch started.%l x "y z"
    expect_eq "$rc" 0 "exit status ($(cat err))"
    [ ! -e started.0 ] || fail "--dry-run=json started a worker"
    python3 -c 'import json,sys
d = json.load(open("out"))
ws = d["workers"]
assert len(ws) == 2, ws
assert [w["rank"] for w in ws] == [2, 3], ws
assert ws[1]["local_rank"] == 1 and ws[1]["env"]["RANK"] == "3" and ws[1]["env"]["WORLD_SIZE"] == "4"
# several nodes: the store on --master_port, MASTER_PORT one above it
assert ws[1]["env"]["MASTER_PORT"] == "1235" and ws[1]["env"]["GROUP_RANK"] == "1"
assert d["store_port"] == 1234 and d["master_port"] == 1235, d
assert ws[1]["argv"][-3:] == ["started.%l", "x", "y z"], ws[1]["argv"]
assert ws[0]["cuda_ordinal"] == 0 and ws[1]["physical_gpu"] == 1, ws
assert d["world_size"] == 4
' || fail "dry-run JSON: $(head -c 1000 out)"
}

t_opt_summary_success_atomic() {
    run_launch --nproc_per_node=2 --summary "$PWD/sum.json" "$TW" exit 0
    expect_eq "$rc" 0
    python3 -c 'import json
d = json.load(open("sum.json"))
assert d["result"] == "succeeded" and d["exit_code"] == 0, d
assert d["attempts"] == 1 and d["root_cause"] is None, d
assert len(d["workers"]) == 2 and all(w["exit_code"] == 0 for w in d["workers"]), d["workers"]
' || fail "summary: $(cat sum.json)"
    expect_eq "$(find . -maxdepth 1 -name 'sum.json?*' | wc -l)" 0 "temporary files left next to the summary"
    # an existing summary is replaced whole
    echo garbage >sum.json
    run_launch --nproc_per_node=1 --summary sum.json "$TW" exit 3
    expect_eq "$rc" 3
    python3 -c 'import json; assert json.load(open("sum.json"))["exit_code"] == 3' || fail "summary not replaced: $(cat sum.json)"
    expect_eq "$(find . -maxdepth 1 -name 'sum.json?*' | wc -l)" 0 "temporary files left"
}

t_opt_summary_to_stdout_a_device_or_a_link() {
    # --summary=/dev/stdout with stdout on a log: the report goes into the log, whose file the
    # shell keeps writing (a rename over /dev/stdout would have put a file in /dev, as root)
    "$LAUNCH" --nproc_per_node=1 --summary=/dev/stdout "$TW" exit 0 >log 2>err ||
        fail "exit $?: $(cat err)"
    [ -L /dev/stdout ] || fail "/dev/stdout is no longer a link"
    python3 -c 'import json, sys
t = open("log").read()
d = json.loads(t[t.index("{"):])
assert d["result"] == "succeeded", d' || fail "the log holds no report: $(cat log)"
    run_launch --nproc_per_node=1 --summary=/dev/null "$TW" exit 0
    expect_eq "$rc" 0 "--summary=/dev/null"
    [ -c /dev/null ] || fail "/dev/null is no longer a device"
    # a link to a file: the file is replaced, the link kept
    echo old >target.json && ln -s target.json link.json
    run_launch --nproc_per_node=1 --summary=link.json "$TW" exit 0
    expect_eq "$rc" 0 "--summary through a link"
    [ -L link.json ] || fail "link.json was replaced by a file"
    python3 -c 'import json; assert json.load(open("target.json"))["result"] == "succeeded"' ||
        fail "target.json: $(cat target.json)"
}

t_opt_summary_path_checked_before_anything_starts() {
    # a summary that could not be written at the end is refused at the start: exit 2, the path
    # and the reason named, no worker started
    mkdir ro && chmod 555 ro
    local f want
    for f in nowhere/s.json "$PWD" "$TW/s.json" ro/s.json; do
        case $f in
        nowhere/*) want="folder 'nowhere': No such file or directory" ;;
        "$PWD") want="is a directory, expected a file" ;;
        "$TW"/*) want="'$TW' is not a folder" ;;
        ro/*) [ "$(id -u)" = 0 ] && continue; want="cannot write in 'ro': Permission denied" ;;
        esac
        run_launch --nproc_per_node=2 --summary "$f" "$TW" touch started.%l
        expect_eq "$rc" 2 "exit status for --summary $f"
        grep -qF -- "mgpu-launch: error: --summary '$f': $want" err || fail "for $f: $(cat err)"
        [ ! -e started.0 ] || fail "a worker started despite --summary $f"
    done
    # a bare file name is written in the current folder
    run_launch --nproc_per_node=1 --summary s.json "$TW" exit 0
    expect_eq "$rc" 0
    [ -s s.json ] || fail "s.json not written"
}

t_opt_summary_after_signal() {
    "$LAUNCH" --nproc_per_node=2 --summary s.json "$TW" touch ready.%l pause >out 2>err &
    local lp=$!
    wait_until 20 eval '[ -e ready.0 ] && [ -e ready.1 ]' || fail "not ready"
    kill -TERM $lp
    wait $lp; rc=$?
    expect_eq "$rc" 143
    python3 -c 'import json
d = json.load(open("s.json"))
assert d["exit_code"] == 143 and d["result"] == "failed", d
assert d.get("launcher_signal") in ("TERM", "SIGTERM"), d
' || fail "summary: $(cat s.json)"
}

t_opt_version_and_help() {
    run_launch --version
    expect_eq "$rc" 0
    expect_grep out '^mgpu-launch [0-9]+\.[0-9]+\.[0-9]+'
    run_launch --help
    expect_eq "$rc" 0
    for o in nproc_per_node nnodes node_rank master_addr master_port standalone max_restarts \
        log_dir redirects tee local_ranks_filter no_python module dry_run grace_period summary \
        allow_gpu_sharing signals_to_handle numa_binding duplicate_stdout_filters \
        duplicate_stderr_filters; do
        expect_grep out "$o"
    done
    run_launch -h
    expect_eq "$rc" 0
    # --help with a program: help, nothing started
    run_launch --help "$TW" touch started
    expect_eq "$rc" 0
    [ ! -e started ] || fail "--help started a worker"
}

t_opt_quiet_no_banner() {
    run_launch --quiet --nproc_per_node=2 "$TW" exit 0
    expect_eq "$rc" 0
    expect_eq "$(cat err)" "" "stderr with --quiet"
}

t_opt_nproc_cpu_auto() {
    local n; n=$(getconf _NPROCESSORS_ONLN)
    run_launch --nproc_per_node=cpu "$TW" env e.%l
    expect_eq "$rc" 0
    expect_eq "$(nworkers)" "$n" "--nproc_per_node=cpu"
    rm -f e.*
    run_launch --nproc_per_node=auto "$TW" env e.%l
    expect_eq "$(nworkers)" "$n" "--nproc_per_node=auto without GPUs"
    rm -f e.*
    MGPU_SIM_GPUS=3 run_launch --nproc_per_node=gpu "$TW" env e.%l
    expect_eq "$rc" 0
    expect_eq "$(nworkers)" 3 "--nproc_per_node=gpu with 3 simulated GPUs"
    rm -f e.*
    MGPU_SIM_GPUS=3 CUDA_VISIBLE_DEVICES=2,0 run_launch --nproc_per_node=auto "$TW" env e.%l
    expect_eq "$(nworkers)" 2 "--nproc_per_node=auto with 2 visible"
    rm -f e.*
    MGPU_SIM_GPUS=0 bad 'gpu' --nproc_per_node=gpu
}

t_opt_repeated_option_last_wins() {
    # argparse: the last occurrence wins
    run_launch --nproc_per_node=4 --nproc_per_node=2 --rdzv_id=a --rdzv_id=b "$TW" env e.%l
    expect_eq "$rc" 0
    expect_eq "$(nworkers)" 2 "workers"
    expect_eq "$(envval e.0 TORCHELASTIC_RUN_ID)" b
}

t_opt_rdzv_conf_torchrun_keys() {
    # torchrun passes --rdzv_conf keys on and ignores those it does not use; -v says so
    run_launch -v --rdzv-conf=use_libuv=0 --nproc_per_node=1 "$TW" touch started.%l
    expect_eq "$rc" 0 "use_libuv=0 ($(cat err))"
    expect_grep err 'rdzv_conf: ignoring use_libuv=0 \(not used by mgpu\)'
    [ -e started.0 ] || fail "the worker did not start"
    for conf in read_timeout=5 close_timeout=5 timeout=5 \
        "'join_timeout=5,last_call_timeout=1,timeout=5'" '"timeout=5"' "join_timeout='5'"; do
        run_launch --rdzv_conf="$conf" --nproc_per_node=1 "$TW" exit 0
        expect_eq "$rc" 0 "--rdzv_conf=$conf ($(cat err))"
    done
    run_launch --rdzv_conf=read_timeout=5 --nproc_per_node=1 "$TW" exit 0
    [ ! -s err ] || fail "ignored keys are said only with -v: $(cat err)"
    bad 'KEY=VALUE' --rdzv_conf=join_timeout
    bad 'empty key' --rdzv_conf==5
    # a bad value is named with its key
    bad "rdzv_conf: timeout='abc'" --rdzv_conf=timeout=abc
    bad "rdzv_conf: last_call_timeout='-1'" --rdzv_conf=join_timeout=5,last_call_timeout=-1
}

t_opt_python_script_without_py() {
    # torchrun runs any script under Python unless --no_python: a non-executable "train"
    printf 'import sys\nopen("ran.%%s" %% sys.argv[1], "w").write(" ".join(sys.argv))\n' >train
    chmod 644 train
    run_launch -v --nproc_per_node=1 ./train a b
    expect_eq "$rc" 0 "./train under python ($(cat err))"
    expect_grep ran.a 'train a b'
    expect_grep err "'\./train' is not executable: running it with python3"
    # also found in the current folder by its bare name, as python would
    rm -f ran.a
    run_launch --nproc_per_node=1 train a
    expect_eq "$rc" 0 "train under python ($(cat err))"
    [ -e ran.a ] || fail "train did not run"
    # executables still run as they are; --no_python keeps exec (126: not executable)
    printf '#!/bin/sh\ntouch ran.sh\n' >prog
    chmod 755 prog
    run_launch --nproc_per_node=1 ./prog
    expect_eq "$rc" 0 "./prog ($(cat err))"
    [ -e ran.sh ] || fail "./prog did not run"
    run_launch --no_python --nproc_per_node=1 ./train a
    expect_eq "$rc" 126 "--no_python ./train"
}

t_bad_option_like_values() {
    # argparse: "argument --log_dir: expected one argument"; a value with "=" is a value
    bad 'argument --log_dir: expected one argument' --log_dir --standalone=1
    bad 'argument --role: expected one argument' --role --legacy_local_rank=yes
    bad 'argument -r: expected one argument' -r --tee=3
    run_launch --role=--x --nproc_per_node=1 "$TW" env e.%l
    expect_eq "$rc" 0 "--role=--x ($(cat err))"
    expect_eq "$(envval e.0 ROLE_NAME)" "--x" "ROLE_NAME"
}

t_bad_fuzz_control_bytes() {
    # arguments carrying control bytes (terminal escapes, newlines, NUL-free): whatever the
    # launcher says on stderr quotes them escaped, never raw
    python3 - "$LAUNCH" "$TW" <<'PYEOF' || fail "control bytes reached stderr"
import random, subprocess, sys
launch, tw = sys.argv[1], sys.argv[2]
random.seed(7)
opts = ["--nproc_per_node", "--nnodes", "--node_rank", "--master_addr", "--master_port",
        "--rdzv_id", "--rdzv_endpoint", "--rdzv_conf", "--rdzv_backend", "--role", "--log_dir",
        "--redirects", "--tee", "--local_ranks_filter", "--summary", "--local_addr",
        "--max_restarts", "--grace_period", "--start_method", "--nnodes=2 --node_rank",
        "--bog", "-"]
ctl = [chr(c) for c in range(1, 32)] + ["\x1b[31m", "\x1b]0;t\x07", "\x1b[2J", "\x7f"]
bad = 0
for i in range(300):
    args = ["--dry-run", "-v"]
    for _ in range(random.randint(1, 3)):
        o = random.choice(opts)
        v = "".join(random.choice(ctl + list("ab1:=,-")) for _ in range(random.randint(1, 6)))
        if o == "-":
            args.append("-" + random.choice(ctl))
        elif " " in o:
            a, b = o.split(" ")
            args += [a, b + "=" + v]
        else:
            args.append(o + "=" + v)
    prog = random.choice([tw, "./no\x1bsuch", "x\n.py", "c\x1b[0m.cfg", "pr\tog"])
    p = subprocess.run([launch] + args + [prog, "exit", "0"], capture_output=True, timeout=30)
    raw = [c for c in p.stderr if c < 0x20 and c != 0x0a]
    if raw:
        bad += 1
        if bad <= 3:
            print("raw control bytes for", args + [prog], ":", p.stderr[:300], file=sys.stderr)
print("fuzzed 300 runs, %d with raw control bytes" % bad, file=sys.stderr)
sys.exit(1 if bad else 0)
PYEOF
}

t_opt_help_states_port_rule() {
    run_launch --help
    expect_grep out 'MASTER_PORT is P\+1'
    run_launch --dry-run --nnodes=2 --node_rank=1 --master_port=29611 "$TW" exit 0
    expect_eq "$rc" 0 "dry run ($(cat err))"
    expect_grep out 'store listens on 29611; MASTER_PORT is that port \+ 1 \(29612\)'
    expect_grep out 'MASTER_PORT=29612'
}

t_opt_readme_lists_every_option() {
    # launcher/README.md's options table names every option --help shows (in either spelling).
    run_launch --help
    expect_eq "$rc" 0
    local o u d missing=
    for o in $(grep -oE '^ +(-[a-z], )?--[a-z_]+' out | grep -oE -- '--[a-z_]+'); do
        u=$o; d="--$(echo "${o#--}" | tr _ -)"
        grep -qE -- "^\|.*\`(-[a-z]/)?($u|$d)[\` =\[]" "$MGPU_ROOT/launcher/README.md" || missing="$missing $o"
    done
    [ -z "$missing" ] || fail "launcher/README.md's options table lacks:$missing"
}
