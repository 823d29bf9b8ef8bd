# Shared by run_single_node.sh and run_multi_node.sh (sourced, not run). The caller has
# set `repo` and `venv` and defined `die`, `usage` and `looked_in`.

# parse_configs CONFIG [CONFIG ...] [-- TRAIN_ARGS...]: fills `configs` (absolute paths,
# looked up in the current directory, then the repo) and `train_args`.
parse_configs() {
    configs=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do
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
