# Shared by run_single_node.sh and run_multi_node.sh (sourced, not run). The caller sets
# `repo` (the repository root) and `usage_lines` (the last header line of its usage text)
# before sourcing; this file answers -h/--help and provides `die`, `usage`, `looked_in`,
# `venv`, `parse_configs`, `check_config`, `find_horovodrun` and `exec_job`.

script_path=${BASH_SOURCE[1]}
script_name=$(basename "$script_path")
venv=${GRAVAC_VENV:-$repo/.venv}

die() { echo "$script_name: $*" >&2; exit 2; }

# usage: the usage lines of the caller's header, then where to read more; exit 2.
usage() {
    sed -n "2,${usage_lines}p" "$script_path" | sed 's/^# \{0,1\}//' >&2
    echo "See the header of $script_path for details." >&2
    exit 2
}

looked_in() { if [ "$PWD" = "$repo" ]; then echo "$repo"; else echo "$PWD and $repo"; fi; }

# show_help_if_asked "$@": the caller's whole header on -h/--help; exit 0.
show_help_if_asked() {
    if [ $# -ge 1 ] && { [ "$1" = -h ] || [ "$1" = --help ]; }; then
        sed -n '2,/^set -euo/p' "$script_path" | grep '^#' | sed 's/^# \{0,1\}//'
        exit 0
    fi
}

# parse_configs CONFIG [CONFIG ...] [-- TRAIN_ARGS...]: fills `configs` (absolute paths,
# looked up in the current directory, then the repo) and `train_args`.
parse_configs() {
    configs=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do
        # "--set ..." or "--resume" without the `--` before it is no config file
        [[ $1 == -* ]] && die "unexpected argument '$1'; train.py arguments go after '--'"
        if [ -f "$1" ]; then
            configs+=("$(cd "$(dirname "$1")" && pwd)/$(basename "$1")")
        elif [[ $1 != /* ]] && [ -f "$repo/$1" ]; then
            configs+=("$repo/$1")
        else
            die "config file '$1' not found (looked in $(looked_in))"
        fi
        shift
    done
    [ ${#configs[@]} -ge 1 ] || usage
    [ $# -gt 0 ] && shift   # the `--`
    train_args=("$@")
}

# find_horovodrun: sets `horovodrun` (the venv's, else the one on PATH).
find_horovodrun() {
    if [ -x "$venv/bin/horovodrun" ]; then
        horovodrun=$venv/bin/horovodrun
    else
        horovodrun=$(command -v horovodrun || true)
        [ -n "$horovodrun" ] || die "horovodrun not found in $venv/bin or on PATH (run hvd_scripts/install.sh)"
    fi
}

# check_config PYTHON LAUNCHER RANKS [here]: `train.py --check LAUNCHER` with the configs
# and train.py arguments, before the launcher (horovodrun or torchrun) starts: a bad config
# or data file, an option the launcher's transport lacks, or a --resume whose checkpoint
# another number of ranks wrote (`--ranks RANKS`, the job's) is its one line (exit 2), not a
# line buried under every rank's output and the launcher's own traceback. From the repo,
# where the job runs: relative paths in the config (run.output_dir, data.root) mean there
# what they will. `here`: the job starts on this host only, so run.device=cuda is checked
# here too (`--here`).
check_config() {
    local here=()
    [ "${4:-}" = here ] && here=(--here)
    (cd "$repo" && "$1" "$repo/train.py" --config "${configs[@]}" ${train_args[@]+"${train_args[@]}"} \
        ${here[@]+"${here[@]}"} --ranks "$3" --check "$2" >/dev/null) || exit $?
}

# exec_job PYTHON COMMAND...: becomes gravac/util/job.py running COMMAND (the launcher):
# a signal to this script stops the launcher and every rank, and when a rank failed with
# gravac's one-line error, that line is printed last, after the launcher's own traceback
# (horovodrun's is 25 lines).
exec_job() {
    local python=$1
    shift
    exec "$python" "$repo/gravac/util/job.py" -- "$@"
}
