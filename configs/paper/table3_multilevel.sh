#!/usr/bin/env bash
# The GraVAC paper's Table 3: multi-level against direct compression time (the candidate
# level from the kept values of the first, against both levels from the whole gradient),
# per model of Table 1 and per compressor, theta_min 10 and theta_c 1000. One process, no
# training and no data (stand-in gradients of each model's layer shapes), so it runs as it
# is on any machine; the paper reports 1.1x to 1.83x.
#
#   bash configs/paper/table3_multilevel.sh [--repeats 5]
set -euo pipefail
cd "$(dirname "$0")/../.."
exec .venv/bin/python benchmarks/multilevel.py \
    --models resnet101_paper vgg16_paper lstm_paper \
    --compressors topk dgc redsync randomk --theta-min 10 --theta-c 1000 --skip-overhead "$@"
