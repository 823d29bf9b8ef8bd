#!/usr/bin/env bash
# One rank of the parallel suite (horovodrun or torchrun runs this on every rank): pytest
# with a JUnit file per transport and rank, so tests/summarize.py can count failures on any
# rank of either transport.
results=$1; shift
if [ -n "${HOROVOD_RANK:-}" ]; then transport=horovod rank=$HOROVOD_RANK; else transport=torch rank=${RANK:-0}; fi
exec "${PY:-.venv/bin/python}" -m pytest tests/parallel \
    --junitxml="$results/parallel-$transport-rank$rank.xml" "$@"
