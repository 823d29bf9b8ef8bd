#!/usr/bin/env bash
# gravac on one CUDA GPU, every check in one go: the GPU tests, a training run of train.py
# on the GPU with a checkpoint resume, the compressor benchmark against one pass over the
# tensor, and the training-step breakdown (docs/BENCHMARKS.md §7 reports its results).
#
#   bash benchmarks/cuda_check.sh [OUT_DIR]        # default runs/cuda_check
#
# Uses the python3 on PATH (PYTHON=... to choose), which must hold a CUDA build of torch;
# Horovod is not needed (one process, run.backend=local). Logs and JSON under OUT_DIR; the
# last lines printed are the two benchmark tables. Each part runs even if one before failed;
# the exit status is non-zero if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/cuda_check}
PY=${PYTHON:-python3}
mkdir -p "$out"
status=0
export PYTHONUNBUFFERED=1
# gravac from this checkout, also where it is not pip-installed (a GPU machine's own python)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

part() {   # part NAME COMMAND...: run, log to $out/NAME.log, remember a failure
    local name=$1; shift
    echo "== $name: $* ($(date +%T))"
    "$@" > "$out/$name.log" 2>&1
    local rc=$?
    tail -n "${TAIL:-6}" "$out/$name.log"
    [ $rc -eq 0 ] || { echo "!! $name failed (rc=$rc)"; status=1; }
}

"$PY" - <<'EOF' || exit 2
import torch
assert torch.cuda.is_available(), "cuda_check.sh: this python's torch sees no CUDA GPU"
p = torch.cuda.get_device_properties(0)
print(f"torch {torch.__version__}, {p.name}, {p.total_memory / 2**30:.0f} GiB, "
      f"{p.multi_processor_count} SMs")
EOF

TAIL=12 part tests "$PY" -m pytest -q -p no:cacheprovider -rs tests/unit/test_cuda_compressors.py \
    tests/unit/test_cuda_engine.py tests/unit/test_cuda_train.py
# What a user runs: train.py on the GPU, then a resume that continues it.
part train "$PY" train.py --config configs/demo.yaml --set run.backend=local \
    --set run.device=cuda --set run.steps=300 --set run.checkpoint_interval=150 \
    --set run.output_dir="$out" --set run.name=demo_gpu --set run.overwrite=true \
    --set run.progress=plain --set run.report=false
part resume "$PY" train.py --config configs/demo.yaml --set run.backend=local \
    --set run.device=cuda --set run.steps=400 --set run.checkpoint_interval=150 \
    --set run.output_dir="$out" --set run.name=demo_gpu --set run.progress=plain \
    --set run.report=false --resume
TAIL=60 part compressors "$PY" benchmarks/compressors.py --device cuda --json "$out/compressors.json"
TAIL=30 part step "$PY" benchmarks/gpu_step.py --models resnet101 lstm resnet101_b128 lstm_b80 \
    --methods plain dense topk10 gravac10 topk10_per_layer gravac10_per_layer topk10_triton \
    --json "$out/gpu_step.json"
exit $status
