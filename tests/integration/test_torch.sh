# test_torch.sh - a real PyTorch job under mgpu-launch: init_process_group("gloo") with the
# env:// method and an all_reduce checked on every rank, unchanged from what torchrun runs.
# Debian's python3-torch is importable from /usr/bin/python3 only (the python3 first on PATH
# is a separate build), so the tests name that interpreter through PYTHON_EXEC.

# hermetic: nothing of a surrounding job (Slurm, Open MPI, torchrun, PET_* defaults) leaks in
for v in $(env | grep -oE '^(PET|SLURM|OMPI|PMI|PMIX|TORCHELASTIC)_[A-Za-z0-9_]*'); do unset "$v"; done
unset LOGLEVEL PYTHON_EXEC
export MGPU_SIM_GPUS=0
unset CUDA_VISIBLE_DEVICES PET_NPROC_PER_NODE
export OMP_NUM_THREADS=1


write_job() {
    cat >allreduce.py <<'EOF'
import os, sys, datetime
import torch
import torch.distributed as dist

# env:// reads MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, as under torchrun
dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
assert rank == int(os.environ["RANK"]), (rank, os.environ["RANK"])
assert world == int(os.environ["WORLD_SIZE"]), (world, os.environ["WORLD_SIZE"])
assert torch.distributed.is_torchelastic_launched()
local_rank = int(os.environ["LOCAL_RANK"])

t = torch.tensor([float(rank + 1), 1.0])
dist.all_reduce(t, op=dist.ReduceOp.SUM)
expected = world * (world + 1) / 2
assert t[0].item() == expected and t[1].item() == world, (t, expected)

# and a broadcast and a barrier, for good measure
b = torch.tensor([42.0 if rank == 0 else 0.0])
dist.broadcast(b, src=0)
assert b.item() == 42.0, b
dist.barrier()
print(f"rank {rank}/{world} local {local_rank} sum {t[0].item():g} ok", flush=True)
dist.destroy_process_group()
EOF
}

torch_job() {
    local n=$1; shift
    need_torch
    write_job
    PYTHON_EXEC=$PY run_launch --nproc_per_node=$n "$@" allreduce.py
    expect_eq "$rc" 0 "exit status of the gloo job ($(tail -n 30 err))"
    local r sum=$((n * (n + 1) / 2))
    for r in $(seq 0 $((n - 1))); do
        expect_grep out "^\[rank$r\]:rank $r/$n local $r sum $sum ok$"
    done
}

t_torch_gloo_allreduce_2_ranks() { torch_job 2; }
t_torch_gloo_allreduce_3_ranks() { torch_job 3; }
t_torch_gloo_allreduce_standalone() { torch_job 2 --standalone; }

t_torch_gloo_after_restart() {
    # attempt 0 fails on rank 1 before init; attempt 1 must rendezvous on the same port
    need_torch
    write_job
    sed -i '1i import os, sys\nif os.environ["RANK"] == "1" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0": sys.exit(3)' allreduce.py
    PYTHON_EXEC=$PY run_launch --nproc_per_node=2 --max_restarts=1 allreduce.py
    expect_eq "$rc" 0 "exit status ($(tail -n 30 err))"
    expect_grep out '^\[rank1\]:rank 1/2 local 1 sum 3 ok$'
}

t_torch_failure_exit_code_propagated() {
    # a Python exception in one rank: exit 1 (Python's), the traceback's last line in the report
    need_torch
    cat >boom.py <<'EOF'
import os, time
if os.environ["RANK"] == "1":
    raise RuntimeError("boom from rank 1")
time.sleep(60)
EOF
    PYTHON_EXEC=$PY run_launch --nproc_per_node=2 boom.py
    expect_eq "$rc" 1
    expect_grep err 'RuntimeError: boom from rank 1'
}

t_torch_record_error_file_in_report() {
    # torch's @record writes $TORCHELASTIC_ERROR_FILE; the report and the summary show it
    need_torch
    cat >rec.py <<'EOF2'
import os, time
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    if os.environ["RANK"] == "1":
        raise RuntimeError("boom from rank 1")
    time.sleep(60)

main()
EOF2
    PYTHON_EXEC=$PY run_launch --nproc_per_node=2 --summary s.json rec.py
    expect_eq "$rc" 1
    expect_grep err 'error_file: /.*/attempt_0/1/error.json'
    expect_grep err 'RuntimeError: boom from rank 1'
    expect_grep err 'Traceback'
    python3 -c 'import json
d = json.load(open("s.json"))
ef = d["root_cause"]["error_file"]
assert "boom from rank 1" in ef["message"], ef
assert "Traceback" in ef["traceback"] and ef["timestamp"] > 0, ef
' || fail "summary: $(cat s.json)"
}

t_torch_gloo_two_nodes_on_one_host() {
    # two launchers as nodes 0 and 1 of one static job (2 workers each): world size 4
    need_torch
    write_job
    # P for the launchers' store and P + 1 for MASTER_PORT (lib.sh's free_port)
    local port; port=$(free_port)
    PYTHON_EXEC=$PY "$LAUNCH" --nnodes=2 --node_rank=1 --master_addr=127.0.0.1 --master_port=$port \
        --nproc_per_node=2 allreduce.py >out.1 2>err.1 &
    local p1=$!
    PYTHON_EXEC=$PY run_launch --nnodes=2 --node_rank=0 --master_addr=127.0.0.1 --master_port=$port \
        --nproc_per_node=2 allreduce.py
    wait $p1
    local rc1=$?
    expect_eq "$rc/$rc1" 0/0 "exit statuses ($(tail -n 20 err err.1))"
    expect_grep out '^\[rank0\]:rank 0/4 local 0 sum 10 ok$'
    expect_grep out '^\[rank1\]:rank 1/4 local 1 sum 10 ok$'
    expect_grep out.1 '^\[rank2\]:rank 2/4 local 0 sum 10 ok$'
    expect_grep out.1 '^\[rank3\]:rank 3/4 local 1 sum 10 ok$'
}

t_torch_tcpstore_at_master_port_and_mgpu_store() {
    # one node: rank 0 hosts PyTorch's own TCPStore at MASTER_ADDR:MASTER_PORT and the other
    # ranks reach it with TCPStore clients, while the launcher's store (MGPU_STORE_*, its own
    # protocol) answers the same workers on another port
    need_torch
    cat >stores.py <<'EOF2'
import os, subprocess, datetime
from torch.distributed import TCPStore
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
assert os.environ["MASTER_PORT"] != os.environ["MGPU_STORE_PORT"], os.environ["MASTER_PORT"]
s = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, rank == 0,
             timeout=datetime.timedelta(seconds=30))
s.set(f"k{rank}", str(rank * 10))
s.wait([f"k{r}" for r in range(world)])
vals = [int(s.get(f"k{r}")) for r in range(world)]
subprocess.run([os.environ["SC"], "barrier", "mgpu", str(world), "20"], check=True)
s.add("done", 1)
if rank == 0:  # the host stays until every client is done with it
    while int(s.add("done", 0)) < world:
        pass
print(f"rank {rank} vals {vals} ok", flush=True)
EOF2
    SC="$MGPU_BUILD/tests/store_cli" PYTHON_EXEC=$PY run_launch --nproc_per_node=3 stores.py
    expect_eq "$rc" 0 "exit status ($(tail -n 30 err))"
    local r
    for r in 0 1 2; do expect_grep out "^\[rank$r\]:rank $r vals \[0, 10, 20\] ok$"; done
}
