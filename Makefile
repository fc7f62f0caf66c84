# Tessera's two commands are `make demo` and `make test`; the rest are conveniences.
# Every target works from a clean clone: it creates .venv and installs the project first.

PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
# Reinstall only when the dependencies change (a stamp older than pyproject.toml). The demo needs
# only the runtime packages (quicker on a fresh clone); tests need the dev extras too.
STAMP := $(VENV)/.installed
RUNTIME_STAMP := $(VENV)/.installed-runtime
PIP := $(BIN)/python -m pip install --disable-pip-version-check -q

.PHONY: help demo test bench bench-e2e bench-requests eval gpu-check lint venv install deps clean-demo

help:
	@echo "make demo   - start the embedded demo cluster (web, scheduler, 12 simulated agents)"
	@echo "make test   - the whole test suite (.venv/bin/pytest; env such as DATABASE_URL passes through)"
	@echo "make bench  - scheduling benchmarks;  make eval - the simulator's evaluation"
	@echo "make bench-e2e - submit-to-running latency through every real part (needs PostgreSQL, Redis)"
	@echo "make bench-requests - web CPU per request, by kind (one daphne; needs PostgreSQL, Redis)"
	@echo "make gpu-check - check discovery and real jobs on this machine's NVIDIA GPUs"
	@echo "make lint   - ruff;  make install - create .venv and install the project"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(PIP) -e '.[dev]'
	@touch $@ $(RUNTIME_STAMP)

$(RUNTIME_STAMP): pyproject.toml | $(BIN)/python
	$(PIP) -e .
	@touch $@

venv install deps: $(STAMP)

demo: $(RUNTIME_STAMP)
	$(BIN)/python scripts/demo.py

test: $(STAMP)
	$(BIN)/pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python -m scheduling.bench

# BENCH_ARGS: e.g. "--jobs 500 --agents 8" (see scripts/bench_e2e.py).
bench-e2e: $(STAMP)
	$(BIN)/python scripts/bench_e2e.py $(BENCH_ARGS)

bench-requests: $(STAMP)
	$(BIN)/python scripts/bench_requests.py

eval: $(STAMP)
	bash scripts/eval.sh

# On a machine with NVIDIA GPUs (and PyTorch): real discovery, jobs, shares, metrics, cancel.
gpu-check: $(STAMP)
	$(BIN)/pytest -m gpu tests/agent/test_inventory.py
	$(BIN)/python scripts/gpu_check.py

lint: $(STAMP)
	$(BIN)/ruff check .

# Forget the demo's database (users, jobs, nodes) and its agents' credentials and job folders.
clean-demo:
	rm -rf var/tessera.sqlite3 var/tessera.sqlite3-wal var/tessera.sqlite3-shm var/agents var/demo-logs
