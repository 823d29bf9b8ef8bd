#!/usr/bin/env bash
# Host discovery for Horovod Elastic: prints the hosts that may run workers now, one
# "hostname:slots" per line, read from a file you edit while the job runs (or replace this
# with a query of your scheduler / cloud API). Horovod calls it about once a second.
#
#   echo "localhost:2" > hosts.txt
#   horovodrun -np 2 --min-np 1 --max-np 2 --network-interfaces lo \
#       --host-discovery-script hvd_scripts/discover_hosts.sh \
#       .venv/bin/python train.py --config configs/demo.yaml --set run.elastic=true
#   echo "localhost:1" > hosts.txt     # a slot leaves: training goes on with 1 rank
#
# GRAVAC_HOSTS_FILE names the file (default: hosts.txt in the directory horovodrun runs in);
# blank lines and lines starting with # are skipped.
set -euo pipefail
hosts=${GRAVAC_HOSTS_FILE:-hosts.txt}
if [ ! -r "$hosts" ]; then
    echo "discover_hosts.sh: cannot read $hosts; write one 'hostname:slots' per line there" \
         "or set GRAVAC_HOSTS_FILE" >&2
    exit 1
fi
grep -v '^[[:space:]]*\(#\|$\)' "$hosts" || true
