# multinode/sshd.sh - "hosts" reachable over ssh for test_hosts.sh, sourced after common.sh:
# Debian's OpenSSH server (openssh-server, installed by scripts/setup.sh) started by the test in
# each network namespace of mn_netns_setup, on its own port, with a host key, a client key and
# the client's configuration made in the test's folder. The daemons are recorded in MN_KILL,
# so the test's EXIT trap stops them.

SSHD=/usr/sbin/sshd

# ssh_setup: the keys and ssh_config (this folder); sets SSH_PORT and SSH_CMD (for --ssh).
ssh_setup() {
    [ -x "$SSHD" ] || skip "no $SSHD (apt-get install openssh-server)"
    command -v ssh >/dev/null && command -v ssh-keygen >/dev/null || skip "no ssh client"
    ssh-keygen -q -t ed25519 -N '' -C mgpu-test-host -f "$PWD/ssh_host_key" || fail "ssh-keygen (host key)"
    ssh-keygen -q -t ed25519 -N '' -C mgpu-test-client -f "$PWD/ssh_id" || fail "ssh-keygen (client key)"
    cp ssh_id.pub ssh_authorized_keys
    SSH_PORT=$(free_port)
    # the test's own: no agent, no known_hosts of the user, nothing asked
    cat >ssh_config <<EOF
Host *
    IdentityFile $PWD/ssh_id
    IdentitiesOnly yes
    IdentityAgent none
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    GlobalKnownHostsFile /dev/null
    LogLevel ERROR
EOF
    SSH_CMD="ssh -F $PWD/ssh_config -p $SSH_PORT"
    # sshd refuses to start without its privilege separation folder (the package's service
    # makes it at boot)
    mkdir -p /run/sshd 2>/dev/null || skip "cannot make /run/sshd"
}

# sshd_start I: sshd in namespace MN_NS[I] on MN_ADDR[I]:SSH_PORT; waits until it answers.
sshd_start() {
    local i=$1 ns=${MN_NS[$1]} addr=${MN_ADDR[$1]}
    cat >"sshd_config.$i" <<EOF
ListenAddress $addr:$SSH_PORT
${MN_ADDR6[$1]:+ListenAddress [${MN_ADDR6[$1]}]:$SSH_PORT}
HostKey $PWD/ssh_host_key
AuthorizedKeysFile $PWD/ssh_authorized_keys
PermitRootLogin yes
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile none
PrintMotd no
LogLevel ERROR
EOF
    ip netns exec "$ns" "$SSHD" -D -e -f "$PWD/sshd_config.$i" 2>"sshd.err.$i" &
    MN_KILL+=($!)
    disown $! # stopped by the EXIT trap: no "Killed" notice
    wait_until 10 ip netns exec "$ns" timeout 2 bash -c "</dev/tcp/$addr/$SSH_PORT" 2>/dev/null ||
        { cat "sshd.err.$i" >&2; fail "sshd of host $i did not listen on $addr:$SSH_PORT"; }
}

# hosts_up N: N hosts in namespaces, each with its sshd (N - 1 .. 0 started in parallel).
hosts_up() {
    local i
    mn_netns_setup "$1"
    ssh_setup
    for i in $(seq 0 $(($1 - 1))); do sshd_start "$i"; done
}
