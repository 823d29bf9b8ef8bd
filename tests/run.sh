#!/usr/bin/env bash
# Run the test suites: `tests/run.sh all|unit|parallel` (what `make test` calls).
# Unit tests run in one process; parallel tests under horovodrun -np 2 --gloo. Ends with
# one plain line "tests: N passed, N failed, N skipped" counting both.
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
PY=${PY:-.venv/bin/python}
HOROVODRUN=${HOROVODRUN:-.venv/bin/horovodrun}
results=.test-results
rm -rf "$results" && mkdir -p "$results"
status=0

if [ "$what" = all ] || [ "$what" = unit ]; then
    echo "== unit tests =="
    "$PY" -m pytest tests/unit -q -p no:cacheprovider --junitxml="$results/unit.xml" || status=1
fi
if [ "$what" = all ] || [ "$what" = parallel ]; then
    echo "== parallel tests (horovodrun -np 2 --gloo) =="
    # A guard, not a speed limit: a collective mismatch must fail the run, never hang CI.
    timeout -k 30 1500 "$HOROVODRUN" -np 2 -H localhost:2 --gloo \
        bash tests/parallel/run_rank.sh "$results" -q -p no:cacheprovider || status=1
fi
"$PY" tests/summarize.py "$results" || status=1
exit $status
