#!/usr/bin/env bash
# gravac on one CUDA GPU, every check in one go: the GPU tests, the parallel exactness
# tests with two ranks sharing the GPU (torch.distributed over gloo: NCCL refuses two ranks
# on one device), a training run of train.py on the GPU with a checkpoint resume, the
# compressor benchmark against one pass over the tensor (torch and Triton paths), the
# step's batched paths against their per-layer loops, and the training-step breakdown
# (docs/notes/2026-11-benchmarks.md §7 reports its results).
#
#   bash benchmarks/cuda_check.sh [OUT_DIR]        # default runs/cuda_check
#   QUICK=1 bash benchmarks/cuda_check.sh          # the paper's batch sizes only
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

"$PY" - <<'EOF' 2>&1 | tee "$out/device.txt"; [ "${PIPESTATUS[0]}" = 0 ] || exit 2
import subprocess
import torch
assert torch.cuda.is_available(), "cuda_check.sh: this python's torch sees no CUDA GPU"
p = torch.cuda.get_device_properties(0)
driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                        capture_output=True, text=True).stdout.strip()
try:
    import triton
    triton_version = triton.__version__
except ImportError:
    triton_version = "not installed"
print(f"{p.name}, {p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs, "
      f"driver {driver}; torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"triton {triton_version}")
EOF

TAIL=12 part tests "$PY" -m pytest -q -p no:cacheprovider -rs tests/unit/test_cuda_compressors.py \
    tests/unit/test_cuda_engine.py tests/unit/test_cuda_train.py
# Two ranks on the one GPU, each step on CUDA tensors against the same step on the CPU.
TAIL=12 part two_ranks bash -c "cd tests/parallel && OMP_NUM_THREADS=1 \
    '$PY' -m torch.distributed.run --standalone --nproc-per-node 2 \
    -m pytest -q -p no:cacheprovider -rs test_cuda_two_ranks.py"
# What a user runs: train.py on the GPU, then a resume that continues it.
part train "$PY" train.py --config configs/demo.yaml --set run.backend=local \
    --set run.device=cuda --set run.steps=300 --set run.checkpoint_interval=150 \
    --set run.output_dir="$out" --set run.name=demo_gpu --set run.overwrite=true \
    --set run.progress=plain --set run.report=false
part resume "$PY" train.py --config configs/demo.yaml --set run.backend=local \
    --set run.device=cuda --set run.steps=400 --set run.checkpoint_interval=150 \
    --set run.output_dir="$out" --set run.name=demo_gpu --set run.progress=plain \
    --set run.report=false --resume
# The batched paths of the step against the per-layer loops they replace, each alone.
TAIL=20 part batched_paths "$PY" benchmarks/batched_paths.py --json "$out/batched_paths.json"
TAIL=60 part compressors "$PY" benchmarks/compressors.py --device cuda --json "$out/compressors.json"
# The paper's batch sizes with every method (the flat residual update against the
# layer-by-layer one, one gather of the kept values against one per layer, the Triton
# candidates against torch.topk), in interleaved rounds, then 4x the batch.
TAIL=32 part step "$PY" benchmarks/gpu_step.py --models resnet101 lstm \
    --methods plain dense topk10 topk10_layerwise_residual topk10_layerwise_gather gravac10 \
    gravac10_layerwise_residual gravac10_layerwise_gather topk10_triton gravac10_triton \
    powersgd4 powersgd4_layerwise_orthogonalize auto \
    --json "$out/gpu_step.json" --profile "$out/profiles"
[ -n "${QUICK:-}" ] || TAIL=14 part step_large "$PY" benchmarks/gpu_step.py \
    --models resnet101_b128 lstm_b80 --methods plain topk10 gravac10 powersgd4 \
    --json "$out/gpu_step_large.json"
exit $status
