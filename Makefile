# burstbuffer: `make demo` runs the local demo, `make test` runs the tests.
# Both set themselves up: a Python >= 3.12 is found (PATH, then pyenv), a venv is
# made in .venv, the project is installed into it, and missing system tools are
# installed with apt-get when run as root: the demo's alone for `make demo`, the
# test tools (the demo's among them) for the rest. The sidecar's Rust core
# (sidecar/core/) is built by the install with the machine's cargo (a Rust toolchain
# >= 1.85 on PATH).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
DEMO_STAMP := $(VENV)/.demo-stamp
PYTEST_ARGS ?=
CORE := sidecar/core
# The core's sources too: an editable install builds the extension once, so a change
# of the Rust is built by installing again.
CORE_SOURCES := $(CORE)/Cargo.toml $(CORE)/Cargo.lock $(shell find $(CORE)/src -name "*.rs")
# cargo's tests link the core against the venv's Python (>= 3.12, as the module's ABI).
CARGO := cd $(CORE) && PYO3_PYTHON=$(abspath $(PY)) cargo

.PHONY: demo test bench setup clean cluster cluster-down

setup: $(STAMP)

$(PY):
	@python=$$(.ci/find-python) && echo "using $$python" && $$python -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(STAMP): pyproject.toml $(CORE_SOURCES) | $(PY)
	$(PY) -m pip install -q -e '.[test,bench]'
	@.ci/system-deps test
	@touch $@

$(DEMO_STAMP): pyproject.toml $(CORE_SOURCES) | $(PY)
	$(PY) -m pip install -q -e '.[demo]'
	@.ci/system-deps demo
	@touch $@

demo: $(DEMO_STAMP)
	$(PY) -m bench.demo

test: $(STAMP)
	$(PY) -m ruff check sidecar injector certs tests bench
	$(PY) -m mypy
	$(VENV)/bin/lint-imports
	$(CARGO) clippy --locked --all-targets -- -D warnings
	$(CARGO) test --locked
	$(PY) -m tests.cluster prepare
	$(PY) -m pytest $(PYTEST_ARGS); status=$$?; \
	  if [ $$status -eq 5 ]; then echo "error: no tests were collected" >&2; exit 1; fi; exit $$status

# A one-node Kubernetes cluster on this machine (root): built once from pinned sources
# into ~/.cache/burstbuffer/cluster, left running; .cluster/kubeconfig and .cluster/bin.
cluster: $(STAMP)
	$(PY) -m tests.cluster up

cluster-down: $(STAMP)
	$(PY) -m tests.cluster down

bench: $(STAMP)
	$(PY) -m bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache $(CORE)/target $(CORE)/*.so
