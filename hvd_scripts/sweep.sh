#!/usr/bin/env bash
# Run a sweep (a grid of trainings, one after another, with a results table and report):
# a thin wrapper that runs hvd_scripts/sweep.py with the repository's virtual environment.
#
# Usage:   hvd_scripts/sweep.sh SWEEP_FILE [--np N] [--dry-run] [--out DIR] [--set KEY=VALUE ...]
#                                       [--overwrite | --resume] [--launcher horovodrun|torchrun]
# Example: hvd_scripts/sweep.sh configs/sweeps/demo_sweep.yaml
#          hvd_scripts/sweep.sh configs/paper/table2_resnet101.yaml --set data.root=data --dry-run
#
# The sweep file format and the results are described in gravac/sweep/__init__.py
# (`hvd_scripts/sweep.sh --help`). Env: GRAVAC_VENV=/path/.venv (default: <repo>/.venv).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${GRAVAC_VENV:-$repo/.venv}/bin/python

if [ $# -eq 0 ]; then
    sed -n '2,/^# Example/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
    exit 2
fi
if [ ! -x "$python" ]; then
    echo "sweep.sh: $python not found; run hvd_scripts/install.sh (or set GRAVAC_VENV)" >&2
    exit 2
fi
exec "$python" "$repo/hvd_scripts/sweep.py" "$@"
