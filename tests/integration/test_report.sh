# test_report.sh - what the failure report hands on: the Python interpreter the workers ran
# (--dry-run, -v) and a hint naming it when every failed rank lacks a module.

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
