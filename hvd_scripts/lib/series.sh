# Shared by run_baseline.sh, run_gravac.sh and run_accordion.sh (sourced, not run):
# parse `MODEL_CONFIG [NP] [-- TRAIN_ARGS...]` and run one compression config after
# another through run_single_node.sh, each in its own run directory.
#
# The caller defines `compression_files MODEL_CONFIG` (prints repo-relative compression
# configs, one per line) and then calls `run_series "${BASH_SOURCE[0]}" "$@"`.

run_series() {
    local script=$1
    shift
    local name
    name=$(basename "$script")
    local repo
    repo=$(cd "$(dirname "$script")/.." && pwd)
    usage() {
        sed -n '2,/^# Example/p' "$script" | sed 's/^# \{0,1\}//' >&2
        echo "         (see the header of $script for details)" >&2
        exit 2
    }
    die() { echo "$name: $*" >&2; exit 2; }

    if [ $# -ge 1 ] && { [ "$1" = -h ] || [ "$1" = --help ]; }; then
        sed -n '2,/^set -euo/p' "$script" | grep '^#' | sed 's/^# \{0,1\}//'
        exit 0
    fi
    [ $# -ge 1 ] && [ "$1" != "--" ] || usage

    local model_config=$1
    shift
    if [ ! -f "$model_config" ] && { [[ $model_config == /* ]] || [ ! -f "$repo/$model_config" ]; }; then
        die "model config '$model_config' not found (looked in $PWD and $repo)"
    fi
    local np=2
    if [ $# -gt 0 ] && [ "$1" != "--" ]; then
        np=$1
        shift
    fi
    [[ $np =~ ^[1-9][0-9]*$ ]] || die "NP must be a positive integer, got '$np'"
    if [ $# -gt 0 ]; then
        [ "$1" = "--" ] || die "unexpected argument '$1'; train.py arguments go after '--'"
        shift
    fi
    local train_args=("$@")
    local compression=()
    mapfile -t compression < <(compression_files "$model_config")

    trap "echo '$name: interrupted' >&2; exit 130" INT
    local failed=() total=${#compression[@]} k=0 comp
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
        echo "$name: ${#failed[@]} of $total runs failed: ${failed[*]}" >&2
        exit 1
    fi
    echo "$name: all $total runs finished" >&2
}
