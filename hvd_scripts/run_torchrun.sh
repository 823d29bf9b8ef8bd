#!/usr/bin/env bash
# Train with torch.distributed under torchrun: on this machine, or across machines.
#
# Usage:   hvd_scripts/run_torchrun.sh NPROC CONFIG [CONFIG ...] [-- TRAIN_ARGS...]
# Example: hvd_scripts/run_torchrun.sh 2 configs/demo.yaml -- --set run.steps=100
#          GRAVAC_NNODES=2 GRAVAC_NODE_RANK=0 GRAVAC_RDZV_ENDPOINT=node1:29400 \
#              hvd_scripts/run_torchrun.sh 4 configs/models/lstm_ptb.yaml -- --set data.root=/data
#
# Runs, from the repository root (single node):
#   torchrun --standalone --nproc-per-node NPROC train.py --config CONFIG... \
#       --set run.backend=torch
# and with GRAVAC_NNODES > 1 (multi-node; run the same command on every node):
#   torchrun --nnodes NNODES --nproc-per-node NPROC --rdzv-backend c10d \
#       --rdzv-endpoint HOST:PORT --rdzv-id RUN_ID train.py --config CONFIG... ...
# or, when GRAVAC_NODE_RANK fixes each node's rank, the static rendezvous (node 0 hosts it
# at HOST:PORT, so HOST must be node 0):
#   torchrun --nnodes NNODES --nproc-per-node NPROC --rdzv-backend static \
#       --rdzv-endpoint HOST:PORT --node-rank K train.py --config CONFIG... ...
# The launcher runs under gravac/util/job.py: a signal to this script stops it and every
# rank, and a rank's gravac error line (config error: ...) is printed again last, after
# the launcher's own traceback.
# NPROC is the number of ranks on EACH node. CONFIG files merge left to right; a relative
# CONFIG path is looked up from the current directory first, then from the repository
# root. Everything after `--` goes to train.py (--set key=value, --dry-run, --resume).
# The transport is gloo on CPU, nccl when the ranks have GPUs. Horovod Elastic
# (run.elastic) is Horovod-only: use run_single_node.sh / run_multi_node.sh for it.
# Env: GRAVAC_VENV=/path/.venv        the virtual environment (default: <repo>/.venv)
#      GRAVAC_NNODES=N               nodes taking part (default 1: --standalone)
#      GRAVAC_RDZV_ENDPOINT=HOST:PORT the rendezvous (a host all nodes reach; multi-node)
#      GRAVAC_RDZV_ID=ID             the job's rendezvous id (default gravac)
#      GRAVAC_NODE_RANK=K            this node's fixed rank, 0..N-1 (static rendezvous at
#                                    GRAVAC_RDZV_ENDPOINT, which must be node 0); unset:
#                                    c10d rendezvous, ranks in the order nodes join
# Every node needs the repository, its .venv and the data at the same absolute paths.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
usage_lines=8
# shellcheck source=lib/launch.sh
source "$repo/hvd_scripts/lib/launch.sh"
show_help_if_asked "$@"
[ $# -ge 2 ] || usage

nproc=$1
shift
[[ $nproc =~ ^[1-9][0-9]*$ ]] || die "NPROC must be a positive integer, got '$nproc'"
parse_configs "$@"

torchrun=$venv/bin/torchrun
if [ ! -x "$torchrun" ]; then
    torchrun=$(command -v torchrun || true)
    [ -n "$torchrun" ] || die "torchrun not found in $venv/bin or on PATH (run hvd_scripts/install.sh)"
fi

nnodes=${GRAVAC_NNODES:-1}
[[ $nnodes =~ ^[1-9][0-9]*$ ]] || die "GRAVAC_NNODES must be a positive integer, got '$nnodes'"
if [ "$nnodes" = 1 ]; then
    launch=(--standalone --nproc-per-node "$nproc")
else
    endpoint=${GRAVAC_RDZV_ENDPOINT:-}
    [ -n "$endpoint" ] || die "GRAVAC_NNODES=$nnodes needs GRAVAC_RDZV_ENDPOINT=HOST:PORT (a host every node reaches)"
    [[ $endpoint == *:* ]] || die "GRAVAC_RDZV_ENDPOINT must be HOST:PORT, got '$endpoint'"
    if [ -n "${GRAVAC_NODE_RANK:-}" ]; then
        [[ $GRAVAC_NODE_RANK =~ ^[0-9]+$ ]] || die "GRAVAC_NODE_RANK must be an integer >= 0, got '$GRAVAC_NODE_RANK'"
        [ "$GRAVAC_NODE_RANK" -lt "$nnodes" ] || die "GRAVAC_NODE_RANK must be below GRAVAC_NNODES ($nnodes), got '$GRAVAC_NODE_RANK'"
        # Fixed node ranks: static rendezvous. c10d ignores --node-rank, and its store
        # lives in the agent that happens to host it: when that node finishes first, the
        # others' rendezvous shutdown talks to a store that is gone.
        launch=(--nnodes "$nnodes" --nproc-per-node "$nproc" --rdzv-backend static
                --rdzv-endpoint "$endpoint" --node-rank "$GRAVAC_NODE_RANK")
    else
        launch=(--nnodes "$nnodes" --nproc-per-node "$nproc" --rdzv-backend c10d
                --rdzv-endpoint "$endpoint" --rdzv-id "${GRAVAC_RDZV_ID:-gravac}")
    fi
fi

python=$venv/bin/python
[ -x "$python" ] || python=$(command -v python3)
# One node: every rank starts here, so its device is checked here too.
check_config "$python" torchrun "$((nproc * nnodes))" "$([ "$nnodes" = 1 ] && echo here)"

cd "$repo"
cmd=("$torchrun" "${launch[@]}" train.py --config "${configs[@]}" --set run.backend=torch
     ${train_args[@]+"${train_args[@]}"})
echo "+ ${cmd[*]}" >&2
exec_job "$python" "${cmd[@]}"
