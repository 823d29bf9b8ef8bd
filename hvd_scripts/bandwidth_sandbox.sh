#!/usr/bin/env bash
# Run a command in a network namespace whose loopback is rate-limited, so that the traffic
# between ranks on this machine crosses a slow link (benchmarks of compression).
#
# Usage:   hvd_scripts/bandwidth_sandbox.sh RATE [--] COMMAND [ARGS...]
# Example: hvd_scripts/bandwidth_sandbox.sh 1gbit -- .venv/bin/horovodrun -np 2 \
#              -H localhost:2 --gloo .venv/bin/python train.py --config configs/demo.yaml
#
# RATE is a tc rate: 100mbit, 1gbit, 10gbit (also kbit, mbit, gbit with any number).
# Inside the namespace only `lo` exists: it is brought up with MTU 9000 and a token-bucket
# filter (tbf) at RATE. All loopback traffic shares that one bucket, so RATE is the total
# over both directions, like a half-duplex link. The burst is at least 256 KiB and at least
# one timer tick of traffic at RATE (a burst below the MTU stalls TCP). netem (delay,
# loss) is not used: it is not available here.
#
# Needs root (or CAP_NET_ADMIN + CAP_SYS_ADMIN) and iproute2 (`ip`, `tc`). The namespace is
# removed when the command ends, also on failure or Ctrl-C. The command's exit status is
# the script's. GRAVAC_SANDBOX_MTU overrides the MTU (default 9000).
set -euo pipefail

usage() {
    sed -n '2,/^# Example/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
    exit 2
}
die() { echo "bandwidth_sandbox.sh: $*" >&2; exit 2; }
# shellcheck source=lib/sandbox.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/sandbox.sh"

[ $# -ge 2 ] || usage
rate=$1
shift
[ "${1:-}" = "--" ] && shift
[ $# -ge 1 ] || usage

# tc's rate spellings; the burst rule (above) lives in hvd_scripts/lib/sandbox.sh.
burst=$(tbf_burst "$rate") || die "rate '$rate' not understood; use e.g. 100mbit, 1gbit or 10gbit"
mtu=${GRAVAC_SANDBOX_MTU:-9000}

require_tools ip tc

ns="gravac-bw-$$"
if ! err=$(ip netns add "$ns" 2>&1); then
    die "cannot create a network namespace ($err). This needs root or CAP_SYS_ADMIN + CAP_NET_ADMIN; run it as root (sudo) or on a machine that allows network namespaces."
fi
cleanup() { ip netns del "$ns" 2>/dev/null || true; }
trap cleanup EXIT
trap 'cleanup; exit 130' INT
trap 'cleanup; exit 143' TERM

ip netns exec "$ns" ip link set lo mtu "$mtu"
ip netns exec "$ns" ip link set lo up
ip netns exec "$ns" tc qdisc add dev lo root tbf rate "$rate" burst "$burst" latency 20ms \
    || die "tc could not set rate $rate on the namespace's loopback"
echo "[sandbox] $ns: loopback limited to $rate (burst ${burst} B, MTU $mtu)" >&2

set +e
ip netns exec "$ns" "$@"
status=$?
set -e
exit $status
