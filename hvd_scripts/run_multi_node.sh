#!/usr/bin/env bash
# Train across several machines: NP Horovod ranks placed by a hostfile.
#
# Usage:   hvd_scripts/run_multi_node.sh HOSTFILE NP CONFIG [CONFIG ...] [-- TRAIN_ARGS...]
# Example: hvd_scripts/run_multi_node.sh ~/hosts.txt 8 configs/models/resnet101_cifar10.yaml \
#              configs/compression/gravac_exp_dgc_eps07.yaml -- --set data.root=/data
#
# Runs, from the repository root:
#   horovodrun -np NP -H HOST:N,... --gloo <repo>/.venv/bin/python <repo>/train.py \
#       --config CONFIG...
# after `train.py --check` has checked the configs and data files here.
# The launcher runs under gravac/util/job.py: a signal to this script stops it and every
# rank, and a rank's gravac error line (config error: ...) is printed again last, after
# the launcher's own traceback.
# Arguments after `--` go to train.py (--set key=value, --dry-run, --resume).
#
# HOSTFILE: one host per line, `HOST slots=N` or `HOST:N` (N = ranks on that host, usually
#   its GPUs or a share of its cores); blank lines and `#` comments are skipped, e.g.
#       node1 slots=4
#       node2:4
#   NP must not exceed the total slots; a bad line is named with its number.
# Every host needs:
#   - the repository, its virtual environment (.venv) and the data set at the SAME absolute
#     paths as here (paths are passed as they are on this machine; config files are made
#     absolute);
#   - passwordless ssh from this machine to every host (`ssh node2 true` must work without
#     a prompt), and the hosts must reach each other on the network.
# Controller (how ranks find each other and agree on collectives):
#   - Gloo (`--gloo`): always available in the build of hvd_scripts/install.sh. Default.
#   - MPI (`--mpi`): only if Horovod was built with MPI; check with
#     `.venv/bin/horovodrun --check-build` ("[X] MPI").
#   Choose with GRAVAC_CONTROLLER=gloo|mpi (default gloo).
#   GPU collectives use NCCL only when Horovod was built with HOROVOD_GPU_OPERATIONS=NCCL
#   (see --check-build, "[X] NCCL"); that is a build-time choice, not a flag here.
# Env: GRAVAC_CONTROLLER=gloo|mpi   controller flag (default gloo)
#      GRAVAC_NICS=eth0[,ib0]       passed as --network-interfaces (which NICs to use)
#      GRAVAC_SSH_PORT=2222         passed as --ssh-port (sshd's port on every host)
#      GRAVAC_SSH_KEY=~/.ssh/key    passed as --ssh-identity-file (the key ssh logs in with)
#      GRAVAC_VENV=/path/.venv      virtual environment (default: <repo>/.venv)
# hvd_scripts/cluster_sandbox.sh sets GRAVAC_NICS, GRAVAC_SSH_PORT and GRAVAC_SSH_KEY (and
# GRAVAC_HOSTFILE) for its hosts: on one machine,
#   hvd_scripts/cluster_sandbox.sh --hosts 2 --slots 2 --link 1gbit -- bash -c \
#       'hvd_scripts/run_multi_node.sh "$GRAVAC_HOSTFILE" 4 configs/demo.yaml'
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
usage_lines=6
# shellcheck source=lib/launch.sh
source "$repo/hvd_scripts/lib/launch.sh"
show_help_if_asked "$@"
[ $# -ge 3 ] || usage

hostfile=$1
np=$2
shift 2
[ -f "$hostfile" ] || die "hostfile '$hostfile' not found (one 'HOST slots=N' per line)"
hostfile=$(cd "$(dirname "$hostfile")" && pwd)/$(basename "$hostfile")
[[ $np =~ ^[1-9][0-9]*$ ]] || die "NP must be a positive integer, got '$np'"

# The hostfile, checked here (horovodrun's own reader fails with a traceback on a blank
# line, a comment or `HOST:N`) and passed on as -H HOST:N,...
hosts=()
total_slots=0
lineno=0
while IFS= read -r line || [ -n "$line" ]; do
    lineno=$((lineno + 1))
    line=${line%%#*}
    line=$(echo "$line" | sed 's/^[[:space:]]*//; s/[[:space:]]*$//')
    [ -n "$line" ] || continue
    if [[ $line =~ ^([A-Za-z0-9._-]+)[[:space:]]+slots=([0-9]+)$ ]] ||
       [[ $line =~ ^([A-Za-z0-9._-]+):([0-9]+)$ ]]; then
        slots=$((10#${BASH_REMATCH[2]}))
        [ "$slots" -ge 1 ] || die "$hostfile:$lineno: a host needs at least 1 slot, got '$line'"
        hosts+=("${BASH_REMATCH[1]}:$slots")
        total_slots=$((total_slots + slots))
    else
        die "$hostfile:$lineno: expected 'HOST slots=N' or 'HOST:N', got '$line'"
    fi
done < "$hostfile"
[ ${#hosts[@]} -ge 1 ] || die "hostfile '$hostfile' lists no host (one 'HOST slots=N' per line)"
host_list=$(IFS=,; echo "${hosts[*]}")
[ "$np" -le "$total_slots" ] || die "NP=$np is more than the $total_slots slots in $hostfile ($host_list); lower NP or add slots"

parse_configs "$@"

case ${GRAVAC_CONTROLLER:-gloo} in
    gloo) controller=--gloo ;;
    mpi) controller=--mpi ;;
    *) die "GRAVAC_CONTROLLER must be gloo or mpi, got '${GRAVAC_CONTROLLER}'" ;;
esac
nics=()
if [ -n "${GRAVAC_NICS:-}" ]; then
    nics=(--network-interfaces "$GRAVAC_NICS")
fi
ssh_args=()
if [ -n "${GRAVAC_SSH_PORT:-}" ]; then
    [[ $GRAVAC_SSH_PORT =~ ^[1-9][0-9]{0,4}$ ]] && [ "$GRAVAC_SSH_PORT" -le 65535 ] \
        || die "GRAVAC_SSH_PORT must be a port number from 1 to 65535, got '$GRAVAC_SSH_PORT'"
    ssh_args+=(--ssh-port "$GRAVAC_SSH_PORT")
fi
if [ -n "${GRAVAC_SSH_KEY:-}" ]; then
    [ -r "$GRAVAC_SSH_KEY" ] || die "GRAVAC_SSH_KEY: cannot read the key '$GRAVAC_SSH_KEY'"
    ssh_args+=(--ssh-identity-file "$GRAVAC_SSH_KEY")
fi

python=$venv/bin/python
[ -x "$python" ] || die "$python not found (run hvd_scripts/install.sh; every host needs it at this path)"
find_horovodrun
check_config "$python" horovodrun "$np"

cd "$repo"
cmd=("$horovodrun" -np "$np" -H "$host_list" "$controller" ${nics[@]+"${nics[@]}"}
     ${ssh_args[@]+"${ssh_args[@]}"}
     "$python" "$repo/train.py" --config "${configs[@]}" ${train_args[@]+"${train_args[@]}"})
echo "+ ${cmd[*]}" >&2
exec_job "$python" "${cmd[@]}"
