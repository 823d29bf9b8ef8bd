#!/usr/bin/env bash
# Train on this machine with NP Horovod ranks (Gloo controller).
#
# Usage:   hvd_scripts/run_single_node.sh NP CONFIG [CONFIG ...] [-- TRAIN_ARGS...]
# Example: hvd_scripts/run_single_node.sh 2 configs/demo.yaml -- --set run.steps=100
#          hvd_scripts/run_single_node.sh 2 configs/models/resnet101_cifar10.yaml \
#              configs/compression/gravac_exp_dgc_eps07.yaml -- --set data.root=/data --resume
#
# Runs, from the repository root:
#   horovodrun -np NP -H localhost:NP --gloo .venv/bin/python train.py --config CONFIG...
# The launcher runs under gravac/util/job.py: a signal to this script stops it and every
# rank, and a rank's gravac error line (config error: ...) is printed again last, after
# the launcher's own traceback.
# CONFIG files merge left to right; a relative CONFIG path is looked up from the current
# directory first, then from the repository root. Everything after `--` goes to train.py
# (--set key=value, --dry-run, --resume); train.py runs from the repository root, so
# relative paths inside TRAIN_ARGS (run.output_dir, data.root) are relative to it.
# Env: GRAVAC_VENV=/path/.venv   the virtual environment (default: <repo>/.venv); its
#      horovodrun is used when present, else the one on PATH.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
usage_lines=7
# shellcheck source=lib/launch.sh
source "$repo/hvd_scripts/lib/launch.sh"
show_help_if_asked "$@"
[ $# -ge 2 ] || usage

np=$1
shift
[[ $np =~ ^[1-9][0-9]*$ ]] || die "NP must be a positive integer, got '$np'"

parse_configs "$@"

python=$venv/bin/python
if [ ! -x "$python" ]; then
    python=$(command -v python3 || true)
    [ -n "$python" ] || die "no python: $venv/bin/python is missing (run hvd_scripts/install.sh)"
    echo "run_single_node.sh: warning: $venv/bin/python not found, using $python" >&2
fi
find_horovodrun
check_config "$python" horovodrun "$np" here

cd "$repo"
cmd=("$horovodrun" -np "$np" -H "localhost:$np" --gloo "$python" train.py --config "${configs[@]}"
     ${train_args[@]+"${train_args[@]}"})
echo "+ ${cmd[*]}" >&2
exec_job "$python" "${cmd[@]}"
