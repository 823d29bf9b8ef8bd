#!/usr/bin/env bash
# Run a command on a small cluster made on this machine: H "hosts" (network namespaces, one
# sshd each) joined by rate-limited links to one switch, so that horovodrun and torchrun
# train across hosts as they would across machines (multi-host tests, slow-link runs).
#
# Usage:   hvd_scripts/cluster_sandbox.sh [--hosts H] [--slots S] [--link RATE] [--each] -- COMMAND [ARGS...]
# Example: hvd_scripts/cluster_sandbox.sh --hosts 2 --slots 2 --link 1gbit -- bash -c \
#              'hvd_scripts/run_multi_node.sh "$GRAVAC_HOSTFILE" 4 configs/demo.yaml'
#          hvd_scripts/cluster_sandbox.sh --hosts 2 --slots 2 --link 1gbit --each -- bash -c \
#              'GRAVAC_NNODES=2 GRAVAC_RDZV_ENDPOINT=$GRAVAC_HOST0_ADDR:29400 hvd_scripts/run_torchrun.sh 2 configs/demo.yaml'
#
# --hosts H    hosts h0 .. h(H-1), 1 to 250 (default 2)
# --slots S    ranks per host in the hostfile (default 1)
# --link RATE  each host's link to the switch, in each direction (full duplex, like
#              Ethernet): a tc rate (100mbit, 1gbit, 10gbit; kbit, mbit, gbit with any
#              number) or `none` (default none). A host's loopback is not limited.
# --each       run COMMAND on every host at once, with GRAVAC_NODE_RANK=k on host hk
#              (torchrun needs one launch per host); the job fails when one of them fails,
#              and the others are then stopped. Without --each COMMAND runs on h0 only
#              (horovodrun starts the ranks of the other hosts over ssh).
# COMMAND runs from the current directory; the hosts share this machine's files (the
# repository and .venv are at the same paths everywhere), only the network is theirs.
# Its environment has:
#   GRAVAC_HOSTFILE       a hostfile, one "hk slots=S" line per host
#   GRAVAC_SANDBOX_HOSTS  the host names, "h0 h1 ..."
#   GRAVAC_HOST0_ADDR     h0's address (10.77.0.1; host hk has 10.77.0.(k+1)/24 on eth0)
#   GRAVAC_NICS=eth0      the one interface name of every host (run_multi_node.sh passes it
#                         as --network-interfaces); GLOO_SOCKET_IFNAME=eth0 for torch's Gloo
#   GRAVAC_SSH_PORT, GRAVAC_SSH_KEY   the sshd port of every host and the throwaway key
#                         (run_multi_node.sh hands both to horovodrun)
# Inside a host `ssh hk` works without options and without a prompt: the host's /etc/hosts
# and /etc/ssh are the sandbox's (files under /etc/netns/NAME/, which `ip netns exec`
# mounts over /etc). Its /etc/hosts also maps this machine's hostname to the host's own
# address: where the hostname is 127.0.0.1, ranks on other hosts would advertise
# 127.0.0.1 and Gloo fails with "connect [127.0.0.1]:PORT: Connection refused".
#
# Needs root (namespaces, /etc/netns, sshd), iproute2 and OpenSSH's client and server
# (hvd_scripts/install.sh installs openssh-server when run as root). Everything is removed
# when COMMAND ends, also on failure, Ctrl-C or TERM: the processes left in the hosts, the
# namespaces, /etc/netns/NAME and the temporary folder (keys, hostfile, sshd configs).
# Names carry this script's pid, so several sandboxes can run at once. The exit status is
# COMMAND's (with --each: the first failure's, else 0).
# Env: GRAVAC_SANDBOX_MTU=9000       MTU of the links (default 9000)
#      GRAVAC_SANDBOX_SSH_PORT=2222  the sshd port (default 2222; every host has its own
#                                    network, so sandboxes do not collide on it)
set -euo pipefail

script=${BASH_SOURCE[0]}
usage_lines=10
usage() {
    sed -n "2,${usage_lines}p" "$script" | sed 's/^# \{0,1\}//' >&2
    echo "See the header of $script (or --help) for details." >&2
    exit 2
}
die() { echo "cluster_sandbox.sh: $*" >&2; exit 2; }
# shellcheck source=lib/sandbox.sh
source "$(dirname "$script")/lib/sandbox.sh"

# -- arguments: every bad one is refused before anything is created -------------------------
hosts=2 slots=1 link=none each=0
while [ $# -gt 0 ]; do
    case $1 in
        -h | --help)
            sed -n '2,/^set -euo/p' "$script" | grep '^#' | sed 's/^# \{0,1\}//'
            exit 0 ;;
        --hosts | --slots | --link)
            [ $# -ge 2 ] || die "$1 needs a value, e.g. $1 $(case $1 in --link) echo 1gbit ;; *) echo 2 ;; esac)"
            printf -v "${1#--}" '%s' "$2"
            shift 2 ;;
        --each) each=1; shift ;;
        --) shift; break ;;
        -*) die "unknown option '$1'; the options are --hosts H, --slots S, --link RATE and --each, then -- COMMAND" ;;
        *) break ;;
    esac
done
[ $# -ge 1 ] || usage
if [[ ! $hosts =~ ^[1-9][0-9]{0,2}$ ]] || [ "$hosts" -gt 250 ]; then
    die "--hosts must be a whole number from 1 to 250, got '$hosts'"
fi
[[ $slots =~ ^[1-9][0-9]{0,3}$ ]] || die "--slots must be a whole number from 1 to 9999, got '$slots'"
burst=
if [ "$link" != none ]; then
    burst=$(tbf_burst "$link") \
        || die "--link '$link' not understood; use a tc rate such as 100mbit, 1gbit or 10gbit, or none"
fi
mtu=${GRAVAC_SANDBOX_MTU:-9000}
if [[ ! $mtu =~ ^[0-9]{3,5}$ ]] || [ "$mtu" -lt 576 ] || [ "$mtu" -gt 65535 ]; then
    die "GRAVAC_SANDBOX_MTU must be a number from 576 to 65535, got '$mtu'"
fi
port=${GRAVAC_SANDBOX_SSH_PORT:-2222}
if [[ ! $port =~ ^[1-9][0-9]{0,4}$ ]] || [ "$port" -gt 65535 ]; then
    die "GRAVAC_SANDBOX_SSH_PORT must be a port number from 1 to 65535, got '$port'"
fi

# -- rights and tools ------------------------------------------------------------------------
[ "$(id -u)" = 0 ] \
    || die "needs root (it creates network namespaces, writes /etc/netns/ and starts sshd); run it with sudo"
# ip, tc and sshd live in /usr/sbin, which some root shells' PATH lacks
PATH=$PATH:/usr/sbin:/sbin
require_tools ip tc ssh ssh-keygen setsid
command -v sshd >/dev/null 2>&1 \
    || die "'sshd' not found: install openssh-server (as root: apt-get install -y openssh-server; hvd_scripts/install.sh does it when run as root)"
sshd=$(command -v sshd)     # an absolute path: sshd refuses to start without one

# -- the sandbox ------------------------------------------------------------------------------
prefix=gravac-cl-$$
switch_ns=$prefix-sw
host_ns=() addr=() names=()
for ((k = 0; k < hosts; k++)); do
    host_ns+=("$prefix-h$k")
    addr+=("10.77.0.$((k + 1))")
    names+=("h$k")
done
tmp=
sshd_pids=()
etc_netns_existed=0
[ ! -d /etc/netns ] || etc_netns_existed=1
running=()            # COMMAND's pids still running (each the leader of its own group)
declare -A host_of    # pid -> host name

# stop_commands SIGNAL: SIGNAL to every running COMMAND's process group, SIGKILL to those
# still running 10 s later; reaps them.
stop_commands() {
    [ ${#running[@]} -gt 0 ] || return 0
    local pid tries alive stat
    for pid in "${running[@]}"; do kill -s "$1" -- "-$pid" 2>/dev/null || true; done
    for ((tries = 0; tries < 100; tries++)); do
        alive=0
        for pid in "${running[@]}"; do
            # a zombie (ended, not yet reaped) counts as gone; its state follows "(comm) "
            stat=$(cat "/proc/$pid/stat" 2>/dev/null) || continue
            stat=${stat##*) }
            [ "${stat%% *}" = Z ] || alive=1
        done
        [ "$alive" = 1 ] || break
        sleep 0.1
    done
    for pid in "${running[@]}"; do kill -s KILL -- "-$pid" 2>/dev/null || true; done
    wait "${running[@]}" 2>/dev/null || true
    running=()
}

cleanup() {
    set +e
    trap - EXIT
    trap '' INT TERM      # the clean-up is short: let it finish
    stop_commands TERM
    local pid ns tries pids
    for pid in ${sshd_pids[@]+"${sshd_pids[@]}"}; do kill "$pid" 2>/dev/null; done
    # Whatever still runs in a host (ranks started over ssh, a command's children) would
    # keep its namespace alive after `ip netns del`: TERM, and KILL after 2 s.
    for ((tries = 0; tries < 50; tries++)); do
        pids=$(for ns in "${host_ns[@]}"; do ip netns pids "$ns" 2>/dev/null; done)
        [ -n "$pids" ] || break
        # shellcheck disable=SC2086
        if [ "$tries" -lt 20 ]; then kill -s TERM $pids 2>/dev/null; else kill -s KILL $pids 2>/dev/null; fi
        sleep 0.1
    done
    for ns in "${host_ns[@]}" "$switch_ns"; do
        ip netns del "$ns" 2>/dev/null
        rm -rf "/etc/netns/$ns"
    done
    # only if this sandbox made it and it is empty (no other sandbox uses it)
    [ "$etc_netns_existed" = 1 ] || rmdir /etc/netns 2>/dev/null
    [ -z "$tmp" ] || rm -rf "$tmp"
}
on_signal() {  # SIGNAL EXIT_STATUS
    trap '' INT TERM
    echo "[sandbox] $1: stopping COMMAND and removing the sandbox" >&2
    stop_commands "$1"
    exit "$2"
}
trap cleanup EXIT
trap 'on_signal INT 130' INT
trap 'on_signal TERM 143' TERM

if ! err=$(ip netns add "$switch_ns" 2>&1); then
    die "cannot create a network namespace ($err). This needs root with CAP_SYS_ADMIN and CAP_NET_ADMIN; a container must allow it (e.g. docker run --privileged)."
fi
ip -n "$switch_ns" link add br0 type bridge \
    || die "cannot create the switch (a bridge): the kernel needs bridge support (modprobe bridge)"
ip -n "$switch_ns" link set br0 mtu "$mtu" up

tmp=$(mktemp -d /tmp/gravac-cluster.XXXXXX)
ssh-keygen -q -t ed25519 -N '' -C gravac-cluster-sandbox -f "$tmp/id_ed25519"
ssh-keygen -q -t ed25519 -N '' -C gravac-cluster-sandbox-host -f "$tmp/host_ed25519"
: >"$tmp/hostfile"
# sshd refuses to start without its privilege separation directory, which the package
# leaves to systemd-tmpfiles (absent in containers).
[ -d /run/sshd ] || mkdir -p -m 0755 /run/sshd

for ((k = 0; k < hosts; k++)); do
    ns=${host_ns[k]}
    ip netns add "$ns"
    # The veth pair: eth0 in the host, hk on the switch's bridge.
    ip -n "$switch_ns" link add "h$k" type veth peer name eth0 netns "$ns" \
        || die "cannot create h$k's link (a veth pair): the kernel needs veth support (modprobe veth)"
    ip -n "$switch_ns" link set "h$k" mtu "$mtu" master br0 up
    ip -n "$ns" link set lo up
    ip -n "$ns" link set eth0 mtu "$mtu" up
    ip -n "$ns" addr add "${addr[k]}/24" dev eth0
    if [ -n "$burst" ]; then
        # one bucket per direction: the host's egress, and the switch port's towards it
        tc -n "$ns" qdisc add dev eth0 root tbf rate "$link" burst "$burst" latency 20ms \
            || die "tc could not set rate $link on h$k's link"
        tc -n "$switch_ns" qdisc add dev "h$k" root tbf rate "$link" burst "$burst" latency 20ms \
            || die "tc could not set rate $link on the switch's port to h$k"
    fi
    echo "h$k slots=$slots" >>"$tmp/hostfile"

    etc=/etc/netns/$ns
    # twice: another sandbox's clean-up may remove an empty /etc/netns in between
    mkdir -p "$etc/ssh" 2>/dev/null || mkdir -p "$etc/ssh"
    mkdir -p "$tmp/h$k"
    {
        echo "127.0.0.1 localhost"
        echo "::1 localhost ip6-localhost ip6-loopback"
        for ((j = 0; j < hosts; j++)); do
            # this machine's hostname is the host's own address (see the header)
            if [ "$j" = "$k" ]; then echo "${addr[j]} h$j $(uname -n)"; else echo "${addr[j]} h$j"; fi
        done
    } >"$etc/hosts"
    cat >"$etc/ssh/ssh_config" <<EOF
# cluster_sandbox.sh: every host is reached on the sandbox's port with its throwaway key
Host *
    Port $port
    IdentityFile $tmp/id_ed25519
    IdentitiesOnly yes
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    BatchMode yes
    LogLevel ERROR
EOF
    cat >"$tmp/h$k/sshd_config" <<EOF
Port $port
ListenAddress ${addr[k]}
HostKey $tmp/host_ed25519
PidFile $tmp/h$k/sshd.pid
AuthorizedKeysFile $tmp/id_ed25519.pub
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
StrictModes no
UsePAM no
PrintMotd no
LogLevel ERROR
EOF
    # -D: stays a child of this script, so its pid is known for the clean-up.
    setsid ip netns exec "$ns" "$sshd" -D -e -f "$tmp/h$k/sshd_config" \
        </dev/null >"$tmp/h$k/sshd.log" 2>&1 &
    sshd_pids+=($!)
done

# Ready when h0 reaches every host's sshd (this also checks the links and the names).
ssh_check=(ssh -p "$port" -i "$tmp/id_ed25519" -o StrictHostKeyChecking=no
           -o UserKnownHostsFile=/dev/null -o BatchMode=yes -o ConnectTimeout=5 -o LogLevel=ERROR)
for ((k = 0; k < hosts; k++)); do
    for ((tries = 0; ; tries++)); do
        ip netns exec "${host_ns[0]}" "${ssh_check[@]}" "h$k" true </dev/null 2>"$tmp/ssh.err" && break
        if ! kill -0 "${sshd_pids[k]}" 2>/dev/null || [ "$tries" -ge 100 ]; then
            die "ssh from h0 to h$k failed: $(tail -n 1 "$tmp/ssh.err") (sshd: $(tail -n 1 "$tmp/h$k/sshd.log"))"
        fi
        sleep 0.1
    done
done
echo "[sandbox] $prefix: hosts ${names[*]} (${addr[0]}..${addr[hosts - 1]} on eth0), link" \
     "${link}$( [ -n "$burst" ] && echo " each way (burst $burst B)"), MTU $mtu, sshd on port" \
     "$port, hostfile $tmp/hostfile" >&2

# -- COMMAND ----------------------------------------------------------------------------------
# Each runs in the background in a session (process group) of its own, so that the whole of
# it can be stopped; the terminal's Ctrl-C reaches this script, which passes it on. Bash
# ignores INT and QUIT in background jobs: `trap -` gives them back their defaults, so that
# COMMAND reacts to them as in the foreground (horovodrun then stops its workers).
environment=(GRAVAC_HOSTFILE="$tmp/hostfile" GRAVAC_NICS=eth0 GLOO_SOCKET_IFNAME=eth0
             GRAVAC_SSH_PORT="$port" GRAVAC_SSH_KEY="$tmp/id_ed25519"
             GRAVAC_SANDBOX_HOSTS="${names[*]}" GRAVAC_HOST0_ADDR="${addr[0]}")
if [ "$each" = 1 ]; then
    for ((k = 0; k < hosts; k++)); do
        (trap - INT QUIT; exec setsid ip netns exec "${host_ns[k]}" env "${environment[@]}" \
            GRAVAC_NODE_RANK="$k" "$@") </dev/null &
        running+=($!)
        host_of[$!]=h$k
    done
else
    # A background job's stdin is /dev/null unless given explicitly: hand it ours.
    exec 3<&0
    (trap - INT QUIT; exec setsid ip netns exec "${host_ns[0]}" env "${environment[@]}" "$@") \
        <&3 3<&- &
    running+=($!)
    host_of[$!]=h0
    exec 3<&-
fi

status=0
while [ ${#running[@]} -gt 0 ]; do
    done_pid=
    wait -n -p done_pid "${running[@]}" && rc=0 || rc=$?
    if [ -z "$done_pid" ]; then     # nothing left to wait for (cannot happen; no endless loop)
        [ "$status" -ne 0 ] || status=${rc/#0/1}
        break
    fi
    left=()
    for pid in "${running[@]}"; do [ "$pid" = "$done_pid" ] || left+=("$pid"); done
    running=(${left[@]+"${left[@]}"})
    if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then
        status=$rc
        if [ ${#running[@]} -gt 0 ]; then
            echo "[sandbox] COMMAND on ${host_of[$done_pid]} failed (exit $rc): stopping it on the other hosts" >&2
            stop_commands TERM
        fi
    fi
done
exit "$status"
