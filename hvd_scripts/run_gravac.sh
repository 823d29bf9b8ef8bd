#!/usr/bin/env bash
# The GraVAC variants for one model config, one run after another: exponential DGC at
# epsilon 0.7 and 0.9, geometric RedSync, and the Random-k special case.
#
# Usage:   hvd_scripts/run_gravac.sh MODEL_CONFIG [NP] [-- TRAIN_ARGS...]
# Example: hvd_scripts/run_gravac.sh configs/models/resnet101_cifar10.yaml 2 -- --set data.root=data
#          hvd_scripts/run_gravac.sh configs/demo.yaml -- --set run.steps=50 --set run.eval_interval=0
#
# Each compression config is a separate run via hvd_scripts/run_single_node.sh NP
# MODEL_CONFIG COMPRESSION_CONFIG -- --set run.name={model}-{data}-{tag} TRAIN_ARGS, so
# every run gets its own directory under run.output_dir (the tag comes from the
# compression config, e.g. resnet101-cifar10-static_topk_10x). NP defaults to 2.
# TRAIN_ARGS go to every run (a --set there wins over the files). A directory that already
# holds a run is refused: add `-- --set run.overwrite=true` to replace it or `-- --resume`
# to continue it. A failing run does not stop the others; at the end the script lists the
# failures and exits 1 (Ctrl-C stops the whole series).
set -euo pipefail

usage() {
    sed -n '2,/^# Example/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
    echo "         (see the header of ${BASH_SOURCE[0]} for details)" >&2
    exit 2
}
die() { echo "run_gravac.sh: $*" >&2; exit 2; }

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

if [ $# -ge 1 ] && { [ "$1" = -h ] || [ "$1" = --help ]; }; then
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | grep '^#' | sed 's/^# \{0,1\}//'
    exit 0
fi
[ $# -ge 1 ] && [ "$1" != "--" ] || usage

model_config=$1
shift
if [ ! -f "$model_config" ] && { [[ $model_config == /* ]] || [ ! -f "$repo/$model_config" ]; }; then
    die "model config '$model_config' not found (looked in $PWD and $repo)"
fi
np=2
if [ $# -gt 0 ] && [ "$1" != "--" ]; then
    np=$1
    shift
fi
[[ $np =~ ^[1-9][0-9]*$ ]] || die "NP must be a positive integer, got '$np'"
if [ $# -gt 0 ]; then
    [ "$1" = "--" ] || die "unexpected argument '$1'; train.py arguments go after '--'"
    shift
fi
train_args=("$@")

compression=(
    configs/compression/gravac_exp_dgc_eps07.yaml
    configs/compression/gravac_exp_dgc_eps09.yaml
    configs/compression/gravac_geo_redsync.yaml
    configs/compression/gravac_randomk.yaml
)

trap 'echo "run_gravac.sh: interrupted" >&2; exit 130' INT
failed=()
total=${#compression[@]}
k=0
for comp in "${compression[@]}"; do
    k=$((k + 1))
    echo "=== [$k/$total] $(basename "$model_config") + $(basename "$comp") ===" >&2
    if ! bash "$repo/hvd_scripts/run_single_node.sh" "$np" "$model_config" "$repo/$comp" -- \
            --set 'run.name="{model}-{data}-{tag}"' ${train_args[@]+"${train_args[@]}"}; then
        failed+=("$comp")
        echo "=== $(basename "$comp"): FAILED ===" >&2
    fi
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "run_gravac.sh: ${#failed[@]} of $total runs failed: ${failed[*]}" >&2
    exit 1
fi
echo "run_gravac.sh: all $total runs finished" >&2
