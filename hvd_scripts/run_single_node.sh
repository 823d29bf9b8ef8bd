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
# CONFIG files merge left to right; a relative CONFIG path is looked up from the current
# directory first, then from the repository root. Everything after `--` goes to train.py
# (--set key=value, --dry-run, --resume); train.py runs from the repository root, so
# relative paths inside TRAIN_ARGS (run.output_dir, data.root) are relative to it.
# Env: GRAVAC_VENV=/path/.venv   the virtual environment (default: <repo>/.venv); its
#      horovodrun is used when present, else the one on PATH.
set -euo pipefail

usage() {
    sed -n '2,7p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
    echo "See the header of ${BASH_SOURCE[0]} for details." >&2
    exit 2
}
die() { echo "run_single_node.sh: $*" >&2; exit 2; }

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
looked_in() { if [ "$PWD" = "$repo" ]; then echo "$repo"; else echo "$PWD and $repo"; fi; }
venv=${GRAVAC_VENV:-$repo/.venv}
# shellcheck source=lib/launch.sh
source "$repo/hvd_scripts/lib/launch.sh"

if [ $# -ge 1 ] && { [ "$1" = -h ] || [ "$1" = --help ]; }; then
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | grep '^#' | sed 's/^# \{0,1\}//'
    exit 0
fi
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

cd "$repo"
cmd=("$horovodrun" -np "$np" -H "localhost:$np" --gloo "$python" train.py --config "${configs[@]}"
     ${train_args[@]+"${train_args[@]}"})
echo "+ ${cmd[*]}" >&2
exec "${cmd[@]}"
