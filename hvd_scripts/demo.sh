#!/usr/bin/env bash
# The demo (`make demo`): GraVAC trains a small CNN on scikit-learn's digits on NP ranks
# (configs/demo.yaml), across a 100 Mbit/s link where this machine allows one, and says
# which link it crossed.
#
# Usage:   hvd_scripts/demo.sh [NP] [train.py ARGS...]
# Example: hvd_scripts/demo.sh 2 --set run.steps=300
#
# Why a link: compression buys time only where the exchange is slow, and ranks on one
# machine exchange over loopback, which nothing limits. As root the ranks run inside
# hvd_scripts/bandwidth_sandbox.sh 100mbit (a loopback limited to 100 Mbit/s); elsewhere
# on the plain loopback, where GraVAC's gain test still works but there is no time to
# win. `make demo-sweep` compares dense, fp16, GraVAC and the automatic choice where
# compression pays (an LSTM across 1 Gbit/s). Env: GRAVAC_VENV=/path/.venv (default: <repo>/.venv), DEMO_LINK=RATE
# (default 100mbit; none for the plain loopback).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${GRAVAC_VENV:-$repo/.venv}
np=${1:-2}
[ $# -gt 0 ] && shift
cd "$repo"

# The link's plan as the sweeps make it (gravac/sweep/link.py): the sandbox's command
# prefix, or none, and the line that says which link it is.
plan=$("$venv/bin/python" - "${DEMO_LINK:-100mbit}" <<'EOF'
import sys
from gravac.sweep import SweepError
from gravac.sweep.link import check_rate, link_plan
try:
    plan = link_plan(check_rate("DEMO_LINK", sys.argv[1]))
except SweepError as exc:
    print(f"demo.sh: {exc}", file=sys.stderr)
    sys.exit(2)
print(" ".join(plan.prefix))
print(plan.description)
EOF
)
prefix=$(sed -n 1p <<<"$plan")
echo "demo: GraVAC on $np ranks; link: $(sed -n 2p <<<"$plan")"
# shellcheck disable=SC2086  # the prefix is words: bash, the script, the rate, --
$prefix "$venv/bin/horovodrun" -np "$np" -H "localhost:$np" --gloo "$venv/bin/python" \
    train.py --config configs/demo.yaml --set run.overwrite=true "$@"
echo "demo: to see when compression pays: make demo-sweep (dense, fp16, GraVAC and" \
     "controller: auto on an LSTM across 1 Gbit/s, a results table naming the fastest)"
