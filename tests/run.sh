#!/usr/bin/env bash
# Run the test suites: `tests/run.sh all|unit|parallel|faults|cluster` (`make test` runs all).
# Unit tests run in one process (the Triton kernels' interpreted tests in one more);
# parallel tests twice, on each transport: under
# horovodrun -np 2 --gloo and under torchrun --nproc-per-node 2 (gloo); fault tests
# (tests/faults: killed and frozen ranks, property-based tests) launch their own jobs;
# cluster tests (tests/cluster) launch jobs across the hosts of
# hvd_scripts/cluster_sandbox.sh (root only: skipped, with the reason, elsewhere). Ends
# with one plain line "tests: N passed, N failed, N skipped" counting all of them.
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
case $what in
    all | unit | parallel | faults | cluster) ;;
    *) echo "tests/run.sh: unknown part '$what'; use all, unit, parallel, faults or cluster" >&2
       exit 2 ;;
esac
PY=${PY:-.venv/bin/python}
HOROVODRUN=${HOROVODRUN:-.venv/bin/horovodrun}
TORCHRUN=${TORCHRUN:-.venv/bin/torchrun}
results=.test-results
rm -rf "$results" && mkdir -p "$results"
status=0

if [ "$what" = all ] || [ "$what" = unit ]; then
    echo "== unit tests =="
    "$PY" -m pytest tests/unit -q -p no:cacheprovider --junitxml="$results/unit.xml" || status=1
    echo "== Triton kernels in Triton's CPU interpreter (a process of their own) =="
    "$PY" -m pytest tests/triton -q -p no:cacheprovider --junitxml="$results/triton.xml" || status=1
fi
if [ "$what" = all ] || [ "$what" = parallel ]; then
    echo "== parallel tests, Horovod (horovodrun -np 2 --gloo) =="
    # A guard, not a speed limit: a collective mismatch must fail the run, never hang CI.
    # Dynamic process sets: the sub-group tests make Horovod process sets at run time.
    HOROVOD_DYNAMIC_PROCESS_SETS=1 timeout -k 30 1500 "$HOROVODRUN" -np 2 -H localhost:2 --gloo \
        bash tests/parallel/run_rank.sh "$results" -q -p no:cacheprovider || status=1
    echo "== parallel tests, torch.distributed (torchrun --nproc-per-node 2, gloo) =="
    timeout -k 30 1500 "$TORCHRUN" --standalone --nproc-per-node 2 --no-python \
        bash tests/parallel/run_rank.sh "$results" -q -p no:cacheprovider || status=1
fi
if [ "$what" = all ] || [ "$what" = faults ]; then
    echo "== fault tests =="
    "$PY" -m pytest tests/faults -q -p no:cacheprovider --junitxml="$results/faults.xml" || status=1
fi
if [ "$what" = all ] || [ "$what" = cluster ]; then
    echo "== cluster tests (network namespaces as hosts: Horovod, torchrun, Elastic) =="
    "$PY" -m pytest tests/cluster -q -p no:cacheprovider --junitxml="$results/cluster.xml" || status=1
fi
"$PY" tests/summarize.py "$results" || status=1
exit $status
