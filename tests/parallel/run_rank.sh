#!/usr/bin/env bash
# One rank of the parallel suite (horovodrun runs this on every rank): pytest with a
# JUnit file per rank, so tests/summarize.py can count failures on any rank.
results=$1; shift
exec "${PY:-.venv/bin/python}" -m pytest tests/parallel --junitxml="$results/parallel-rank${HOROVOD_RANK:-0}.xml" "$@"
