# test_k8s.sh - mgpu-launch in the pods of Kubernetes' training controllers, run unchanged
# (`mgpu-launch [the container's options] PROGRAM`): each "pod" is a network namespace whose
# /etc/hosts names the pods as the job's headless service does, and its launcher gets exactly
# the environment the controller sets (each test cites the controller's source), plus what
# the kubelet gives every pod (KUBERNETES_SERVICE_HOST/PORT, HOSTNAME = the pod's name) and
# the store's token from a Secret of the user's (PET_RDZV_TOKEN: no controller makes one).

source "$(dirname "${BASH_SOURCE[0]}")/multinode/common.sh"

# pods NAME0 NAME1 ...: one namespace per pod, each resolving every pod's name to its address
pods() {
    local i n=$#
    mn_netns_setup "$n"
    POD=("$@")
    for i in "${!MN_NS[@]}"; do
        mkdir -p "/etc/netns/${MN_NS[$i]}" 2>/dev/null || skip "cannot write /etc/netns (per-namespace /etc/hosts)"
        {
            echo "127.0.0.1 localhost"
            local j
            for j in $(seq 0 $((n - 1))); do echo "${MN_ADDR[$j]} ${POD[$j]}"; done
        } >"/etc/netns/${MN_NS[$i]}/hosts"
    done
    ip netns exec "${MN_NS[0]}" getent hosts "${POD[1]}" | grep -q "^${MN_ADDR[1]//./\\.} " ||
        skip "ip netns exec does not give a namespace its own /etc/hosts here"
}

# start_pod I VAR=VALUE... -- ARGS...: pod I's launcher with only the kubelet's variables, the
# given ones and the test's own (PATH, simulated GPUs, TMPDIR)
start_pod() {
    local i=$1 envs=()
    shift
    while [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    ip netns exec "${MN_NS[$i]}" env -i PATH="$PATH" TMPDIR="$TMPDIR" MGPU_SIM_GPUS="${SIM_GPUS:-0}" \
        KUBERNETES_SERVICE_HOST=10.96.0.1 KUBERNETES_SERVICE_PORT=443 HOSTNAME="${POD[$i]}" \
        PET_RDZV_TOKEN=from-a-secret "${envs[@]}" "$LAUNCH" "$@" >"out.$i" 2>"err.$i" &
    MN_PID[$i]=$!
}

wait_pods() {
    local i rcs=""
    for i in "${!POD[@]}"; do wait_node "$i" 40; rcs+="${MN_RC[$i]} "; done
    expect_eq "$rcs" "$(printf '0 %.0s' "${POD[@]}")" "the pods' exit statuses ($(dump_nodes err.* 2>&1))"
}

# world NPOD NPROC MASTER: every rank's torchrun variables (files e.<pod>.<local rank>)
world() {
    local np=$1 nl=$2 master=$3 k l f
    for k in $(seq 0 $((np - 1))); do
        for l in $(seq 0 $((nl - 1))); do
            f=e.$k.$l
            [ -f "$f" ] || fail "pod $k local rank $l did not run ($(ls))"
            expect_eq "$(envval $f RANK)/$(envval $f LOCAL_RANK)/$(envval $f GROUP_RANK)" "$((k * nl + l))/$l/$k" \
                "RANK/LOCAL_RANK/GROUP_RANK of pod $k local rank $l"
            expect_eq "$(envval $f WORLD_SIZE)/$(envval $f LOCAL_WORLD_SIZE)/$(envval $f GROUP_WORLD_SIZE)" \
                "$((np * nl))/$nl/$np" "WORLD_SIZE/LOCAL_WORLD_SIZE/GROUP_WORLD_SIZE in pod $k"
            expect_eq "$(envval $f MASTER_ADDR)" "$master" "MASTER_ADDR in pod $k"
        done
    done
}

t_k8s_pytorchjob_current_operator() {
    # Kubeflow training-operator v1, PyTorchJob with a Master (1) and a Worker (1) replica,
    # nprocPerNode 2, the container's port (23456 by default; a free one here):
    # pkg/controller.v1/pytorch/envvar.go setPodEnv (PYTHONUNBUFFERED,
    # WORLD_SIZE = replicas x nprocPerNode, RANK and PET_NODE_RANK = the replica's index, +1
    # for workers, PET_NPROC_PER_NODE, PET_NNODES = replicas) and master.go (MASTER_PORT,
    # MASTER_ADDR, PET_MASTER_PORT, PET_MASTER_ADDR = <job>-master-0)
    pods job-master-0 job-worker-0
    local i port; port=$(free_port)
    for i in 1 0; do
        start_pod $i PYTHONUNBUFFERED=0 MASTER_PORT=$port MASTER_ADDR=job-master-0 \
            PET_MASTER_PORT=$port PET_MASTER_ADDR=job-master-0 WORLD_SIZE=4 RANK=$i \
            PET_NPROC_PER_NODE=2 PET_NODE_RANK=$i PET_NNODES=2 -- "$TW" env e.$i.%l
    done
    wait_pods
    world 2 2 job-master-0
}

t_k8s_pytorchjob_earlier_operator_world_counts_pods() {
    # the same job under an operator that sets no PET_ variable for a job that is not elastic:
    # WORLD_SIZE = the number of pods, RANK = the pod's index (envvar.go before PET_NODE_RANK,
    # getTotalReplicas); the container's command gives --nproc_per_node. The workers get
    # torchrun's WORLD_SIZE and RANK (processes), not the operator's (pods).
    pods job-master-0 job-worker-0
    local i port; port=$(free_port)
    for i in 1 0; do
        start_pod $i PYTHONUNBUFFERED=0 MASTER_PORT=$port MASTER_ADDR=job-master-0 WORLD_SIZE=2 \
            RANK=$i -- --nproc_per_node=2 "$TW" env e.$i.%l
    done
    wait_pods
    world 2 2 job-master-0
    expect_eq "$(envval e.0.0 MGPU_STORE_PORT)" "$port" "the store's port (MASTER_PORT)"
}

t_k8s_pytorchjob_elastic() {
    # elasticPolicy {minReplicas 2, maxReplicas 2, maxRestarts 3, nProcPerNode 1}, Worker
    # replicas only, the container's port: elastic.go (PET_RDZV_ENDPOINT = <job>-worker-0:<port>,
    # PET_RDZV_BACKEND = c10d, PET_NNODES = min:max, PET_MAX_RESTARTS, PET_NPROC_PER_NODE) and
    # envvar.go (PYTHONUNBUFFERED; no MASTER_*, WORLD_SIZE or RANK without a Master replica)
    pods job-worker-0 job-worker-1
    local i port; port=$(free_port)
    for i in 1 0; do
        start_pod $i PYTHONUNBUFFERED=0 PET_RDZV_ENDPOINT=job-worker-0:$port PET_RDZV_BACKEND=c10d \
            PET_NNODES=2:2 PET_MAX_RESTARTS=3 PET_NPROC_PER_NODE=1 -- "$TW" env e.%r
    done
    wait_pods
    local r
    for r in 0 1; do
        [ -f e.$r ] || fail "rank $r did not run ($(ls))"
        expect_eq "$(envval e.$r WORLD_SIZE)/$(envval e.$r LOCAL_WORLD_SIZE)" 2/1 "WORLD_SIZE/LOCAL_WORLD_SIZE of rank $r"
        expect_eq "$(envval e.$r TORCHELASTIC_MAX_RESTARTS)" 3 "max restarts (PET_MAX_RESTARTS)"
        expect_eq "$(envval e.$r MGPU_STORE_PORT)" "$port" "the store's port (the endpoint's)"
    done
}

t_k8s_trainer_v2_torch_plugin() {
    # Kubeflow Trainer v2, the torch plugin (pkg/runtime/framework/plugins/torch/torch.go): PET_NNODES,
    # PET_NPROC_PER_NODE (the runtime's numProcPerNode, here auto), PET_NODE_RANK = the Job's
    # completion index, PET_MASTER_ADDR = <trainjob>-node-0-0.<trainjob>, PET_MASTER_PORT =
    # constants.ContainerTrainerPort (29500; a free port here); no MASTER_ADDR, WORLD_SIZE or RANK. auto is one worker per GPU (2 simulated here).
    pods tj-node-0-0.tj tj-node-0-1.tj
    local i port; port=$(free_port)
    for i in 1 0; do
        SIM_GPUS=2 start_pod $i PET_NNODES=2 PET_NPROC_PER_NODE=auto PET_NODE_RANK=$i \
            PET_MASTER_ADDR=tj-node-0-0.tj PET_MASTER_PORT=$port -- "$TW" env e.$i.%l
    done
    wait_pods
    world 2 2 tj-node-0-0.tj
}
