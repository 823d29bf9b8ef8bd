# gravac: `make demo` trains, `make test` tests; both install what is missing first.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.gravac-installed
NP     ?= 2

.PHONY: install test test-unit test-parallel test-faults test-cluster demo demo-sweep bench clean

# Reinstall when the venv is missing or the pins / installer changed.
$(STAMP): requirements.txt requirements-frameworks.txt hvd_scripts/install.sh
	bash hvd_scripts/install.sh
	touch $@

install: $(STAMP)

test: $(STAMP)
	bash tests/run.sh all

test-unit: $(STAMP)
	bash tests/run.sh unit

test-parallel: $(STAMP)
	bash tests/run.sh parallel

test-faults: $(STAMP)
	bash tests/run.sh faults

# Multi-host jobs on network namespaces of this machine (hvd_scripts/cluster_sandbox.sh):
# needs root and sshd; skipped otherwise.
test-cluster: $(STAMP)
	bash tests/run.sh cluster

# GraVAC on the embedded digits data, 2 ranks, across a 100 Mbit/s link where this
# machine allows one (root: hvd_scripts/bandwidth_sandbox.sh); replaces the previous run.
demo: $(STAMP)
	bash hvd_scripts/demo.sh $(NP)

# dense, fp16, GraVAC and controller: auto on an LSTM across 1 Gbit/s (root; else the
# plain loopback, said), a results table naming the fastest (configs/sweeps/demo_sweep.yaml).
demo-sweep: $(STAMP)
	$(PY) hvd_scripts/sweep.py configs/sweeps/demo_sweep.yaml --overwrite --np $(NP)

bench: $(STAMP)
	$(PY) benchmarks/compressors.py
	$(PY) benchmarks/multilevel.py

clean:
	rm -rf $(VENV) .test-results
