#!/usr/bin/env bash
# Run the test suites: `tests/run.sh all|unit|parallel|faults|cluster` (`make test` runs all).
# Unit tests run in two processes side by side where there are two cores (the Triton
# kernels' interpreted tests in one more);
# parallel tests twice, on each transport: under
# horovodrun -np 2 --gloo and under torchrun --nproc-per-node 2 (gloo); fault tests
# (tests/faults: killed and frozen ranks, property-based tests) launch their own jobs;
# cluster tests (tests/cluster) launch jobs across the hosts of
# hvd_scripts/cluster_sandbox.sh (root only: skipped, with the reason, elsewhere); with two
# cores or more, `all` runs the fault and cluster tests side by side. Ends
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
    # A unit test process runs on one core (one torch thread). With two cores or more the
    # unit tests run as two pytest processes side by side, each on its own files (about
    # half of the time each: the files below, and all the others); their output follows,
    # one process after the other. The Triton kernels' interpreted tests run in a process
    # of their own after the first.
    split=(tests/unit/test_configs_dry_run.py
           tests/unit/test_resume_config.py tests/unit/test_train_local.py
           tests/unit/test_scripts.py tests/unit/test_horovod_examples.py
           tests/unit/test_result_set.py)
    unit_a() {
        "$PY" -m pytest "${split[@]}" -q -p no:cacheprovider --junitxml="$results/unit-a.xml"
    }
    unit_b() {
        "$PY" -m pytest tests/unit "${split[@]/#/--ignore=}" -q -p no:cacheprovider \
            --junitxml="$results/unit-b.xml"
    }
    triton() {
        echo "== Triton kernels in Triton's CPU interpreter (a process of their own) =="
        "$PY" -m pytest tests/triton -q -p no:cacheprovider --junitxml="$results/triton.xml"
    }
    if [ "$(nproc 2>/dev/null || echo 1)" -ge 2 ]; then
        echo "== unit tests (two processes side by side) =="
        { unit_a; a=$?; triton; t=$?; [ $a = 0 ] && [ $t = 0 ]; } > "$results/unit-a.log" 2>&1 &
        pid_a=$!
        unit_b > "$results/unit-b.log" 2>&1 || status=1
        wait $pid_a || status=1
        echo "-- ${split[*]}"
        cat "$results/unit-a.log"
        echo "-- tests/unit (the other files)"
        cat "$results/unit-b.log"
    else
        echo "== unit tests =="
        unit_a || status=1
        unit_b || status=1
        triton || status=1
    fi
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
faults() {
    echo "== fault tests =="
    "$PY" -m pytest tests/faults -q -p no:cacheprovider --junitxml="$results/faults.xml" "$@"
}
cluster() {
    echo "== cluster tests (network namespaces as hosts: Horovod, torchrun, Elastic) =="
    "$PY" -m pytest tests/cluster -q -p no:cacheprovider --junitxml="$results/cluster.xml"
}
if [ "$what" = all ] && [ "$(nproc 2>/dev/null || echo 1)" -ge 2 ]; then
    # Side by side: much of a fault test is waiting (for a watchdog, a launcher's grace
    # period, a rendezvous), which the cluster tests' training fills. Their bounds are on
    # how a job ends after a fault, not on speed; the cluster hosts are network
    # namespaces of their own, so the two share no ports. The signal tests follow the
    # cluster tests, so that both lanes end about together.
    late=tests/faults/test_signals.py
    faults --ignore="$late" > "$results/faults.log" 2>&1 &
    pid_faults=$!
    { cluster; c=$?
      echo "== fault tests: $late =="
      "$PY" -m pytest "$late" -q -p no:cacheprovider --junitxml="$results/faults-late.xml"
      l=$?; [ $c = 0 ] && [ $l = 0 ]; } > "$results/cluster.log" 2>&1 || status=1
    wait $pid_faults || status=1
    cat "$results/faults.log" "$results/cluster.log"
else
    if [ "$what" = all ] || [ "$what" = faults ]; then
        faults || status=1
    fi
    if [ "$what" = all ] || [ "$what" = cluster ]; then
        cluster || status=1
    fi
fi
"$PY" tests/summarize.py "$results" || status=1
exit $status
