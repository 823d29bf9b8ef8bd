# Shared by run_baseline.sh, run_gravac.sh and run_accordion.sh (sourced, not run):
# parse `MODEL_CONFIG [NP] [-- TRAIN_ARGS...]`, check every run (gravac/sweep/check.py),
# then run one compression config after another through run_single_node.sh, each in its
# own run directory.
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
        local where=$PWD
        [ "$PWD" = "$repo" ] || where="$PWD and $repo"
        die "model config '$model_config' not found (looked in $where)"
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
    # `--resume` continues the series: each run is kept, resumed, started again or started,
    # as a sweep's --resume decides (gravac/sweep/plan.py); handed to every run as it is,
    # the runs that had not started yet would fail with nothing to resume.
    local train_args=() resume=0 arg
    for arg in "$@"; do
        if [ "$arg" = --resume ]; then resume=1; else train_args+=("$arg"); fi
    done
    local model_path=$repo/$model_config
    if [ -f "$model_config" ]; then
        model_path=$(cd "$(dirname "$model_config")" && pwd)/$(basename "$model_config")
    fi
    local python=${GRAVAC_VENV:-$repo/.venv}/bin/python
    [ -x "$python" ] || python=$(command -v python3)
    local compression=()
    mapfile -t compression < <(compression_files "$model_config")

    trap "echo '$name: interrupted' >&2; exit 130" INT
    local failed=() total=${#compression[@]} k=0 comp plan more
    local run_name=(--set 'run.name="{model}-{data}-{tag}"')
    # Every run is checked before any starts, as train.py runs it (from the repository root):
    # a problem the runs share, such as a data.root without the data, is one line naming
    # them (gravac/sweep/check.py), and nothing is launched.
    (cd "$repo" && "$python" -m gravac.sweep.check horovodrun "$model_path" \
        "${compression[@]/#/$repo/}" -- "${run_name[@]}" ${train_args[@]+"${train_args[@]}"}) \
        || exit $?
    for comp in "${compression[@]}"; do
        k=$((k + 1))
        echo "=== [$k/$total] $(basename "$model_config") + $(basename "$comp") ===" >&2
        more=()
        if [ "$resume" = 1 ]; then
            # train.py resolves run.output_dir from the repository root: so does the plan
            if ! plan=$(cd "$repo" && "$python" -m gravac.sweep.plan --config "$model_path" \
                    "$repo/$comp" "${run_name[@]}" ${train_args[@]+"${train_args[@]}"}); then
                failed+=("$comp")
                echo "=== $(basename "$comp"): FAILED ===" >&2
                continue
            fi
            case $plan in
                skip) echo "=== $(basename "$comp"): finished earlier, kept ===" >&2; continue ;;
                resume) more=(--resume) ;;
                restart) more=(--set run.overwrite=true)
                         echo "=== $(basename "$comp"): no checkpoint, started again ===" >&2 ;;
            esac
        fi
        if ! bash "$repo/hvd_scripts/run_single_node.sh" "$np" "$model_config" "$repo/$comp" -- \
                "${run_name[@]}" ${train_args[@]+"${train_args[@]}"} ${more[@]+"${more[@]}"}; then
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
