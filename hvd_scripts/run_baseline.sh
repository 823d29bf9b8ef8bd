#!/usr/bin/env bash
# The baselines for one model config, one run after another: dense SGD, Horovod fp16
# compression, and static Top-k / DGC / RedSync / Random-k at CF 10 and CF 1000.
#
# Usage:   hvd_scripts/run_baseline.sh MODEL_CONFIG [NP] [-- TRAIN_ARGS...]
# Example: hvd_scripts/run_baseline.sh configs/models/resnet101_cifar10.yaml 2 -- --set data.root=data
#          hvd_scripts/run_baseline.sh configs/demo.yaml -- --set run.steps=50 --set run.eval_interval=0
#
# Each compression config is a separate run via hvd_scripts/run_single_node.sh NP
# MODEL_CONFIG COMPRESSION_CONFIG -- --set run.name={model}-{data}-{tag} TRAIN_ARGS, so
# every run gets its own directory under run.output_dir (the tag comes from the
# compression config, e.g. resnet101-cifar10-static_topk_10x). NP defaults to 2.
# TRAIN_ARGS go to every run (a --set there wins over the files). A directory that already
# holds a run is refused: add `-- --set run.overwrite=true` to replace it. `-- --resume`
# continues a stopped series (the same command plus --resume): a run that finished its
# steps is kept, one with a checkpoint continues from it, one without starts again, and
# the runs not started yet start. Every run's config and data are checked before any
# starts: a problem is one line naming the runs it applies to, and exit 2. A failing run
# does not stop the others; at the end the script lists the failures and exits 1
# (Ctrl-C stops the whole series).
set -euo pipefail

compression_files() {
    printf '%s\n' configs/compression/dense.yaml configs/compression/horovod_fp16.yaml \
        configs/compression/static_{topk,dgc,redsync,randomk}_{10,1000}x.yaml
}

# shellcheck source=lib/series.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/series.sh"
run_series "${BASH_SOURCE[0]}" "$@"
