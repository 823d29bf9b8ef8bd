#!/usr/bin/env bash
# Device check: the GPU tests of this tree, the two-rank suite, then gpu_step.py of the
# tree before (.before: `git archive a25c136 gravac benchmarks`) and of this tree,
# alternately, twice. Everything lands in $OUT as it goes.
set -u
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
L=$OUT/all.log
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader | tee -a $L
echo "== tests $(date +%T)" | tee -a $L
PYTHONPATH=$PWD:/tmp/site timeout 120 python3 -m pytest -q -p no:cacheprovider tests/unit/test_cuda_compressors.py tests/unit/test_cuda_engine.py >> $L 2>&1; tail -n 1 $L
echo "== two ranks $(date +%T)" | tee -a $L
(cd tests/parallel && PYTHONPATH=$PWD/../..:/tmp/site timeout 80 python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m pytest -q -p no:cacheprovider test_cuda_two_ranks.py) >> $L 2>&1; tail -n 2 $L
M="plain topk10 gravac10"
for r in 1 2; do
  echo "== before $r $(date +%T)" | tee -a $L
  PYTHONPATH=$PWD/.before:/tmp/site timeout 60 python3 .before/benchmarks/gpu_step.py --models resnet101 lstm --methods $M --json $OUT/before$r.json >> $L 2>&1
  echo "== after $r $(date +%T)" | tee -a $L
  PYTHONPATH=$PWD:/tmp/site timeout 60 python3 benchmarks/gpu_step.py --models resnet101 lstm --methods $M --json $OUT/after$r.json >> $L 2>&1
done
echo "== done $(date +%T)" | tee -a $L
grep -E "^\| (resnet|lstm)" $L | cut -d'|' -f2,5,7-11,13-16
