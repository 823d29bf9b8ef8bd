# Shared by bandwidth_sandbox.sh and cluster_sandbox.sh (sourced, not run): how a tc rate
# is read and how large a token bucket it gets. The caller defines `die MESSAGE`.

# tbf_burst RATE: prints the tbf burst in bytes for RATE (a tc rate: 100mbit, 1gbit,
# 10gbit; bit, kbit, mbit, gbit with any number); returns 1, printing nothing, when RATE is
# not one. The burst is at least one kernel timer tick of traffic at RATE (tbf refills per
# tick; HZ >= 100 here) and at least 256 KiB (a burst below the MTU stalls TCP).
tbf_burst() {
    [[ $1 =~ ^([0-9]+(\.[0-9]+)?)(kbit|mbit|gbit|bit)$ ]] || return 1
    local number=${BASH_REMATCH[1]} scale
    case ${BASH_REMATCH[3]} in
        bit) scale=1 ;; kbit) scale=1000 ;; mbit) scale=1000000 ;; gbit) scale=1000000000 ;;
    esac
    local bytes_per_s burst
    bytes_per_s=$(awk -v n="$number" -v s="$scale" 'BEGIN { printf "%d", n * s / 8 }')
    burst=$(( bytes_per_s / 100 ))
    [ "$burst" -ge 262144 ] || burst=262144
    echo "$burst"
}

# require_tools TOOL...: dies on the first tool not on PATH, naming the Debian package
# that has it.
require_tools() {
    local tool package
    for tool in "$@"; do
        command -v "$tool" >/dev/null 2>&1 && continue
        case $tool in
            ip | tc) package=iproute2 ;;
            ssh | ssh-keygen) package=openssh-client ;;
            sshd) package=openssh-server ;;
            setsid) package=util-linux ;;
            *) package=$tool ;;
        esac
        die "'$tool' not found: install $package (as root: apt-get install -y $package)"
    done
}
