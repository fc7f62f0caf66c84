# Tessera's two commands are `make demo` and `make test`; the rest are conveniences.
# Every target works from a clean clone: it creates .venv and installs the project first.

PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
# Installs take the exact versions of requirements/lock.txt (`make lock` regenerates it from
# pyproject.toml). Reinstall only when the dependencies change (a stamp older than pyproject.toml
# or the lock). The demo needs only the runtime packages, at the lock's versions (quicker on a
# fresh clone); tests need the dev and sim extras too: the whole lock.
LOCK := requirements/lock.txt
STAMP := $(VENV)/.installed
RUNTIME_STAMP := $(VENV)/.installed-runtime
PIP := $(BIN)/python -m pip install --disable-pip-version-check -q

.PHONY: help demo test bench bench-e2e bench-requests bench-dashboard eval eval-matrix parity gpu-check lint venv install deps lock clean-demo

help:
	@echo "make demo   - start the embedded demo cluster (web, scheduler, 12 simulated agents)"
	@echo "make test   - the whole test suite (.venv/bin/pytest; env such as DATABASE_URL passes through)"
	@echo "make bench  - scheduling benchmarks;  make eval - the simulator's evaluation"
	@echo "make bench-e2e - submit-to-running latency through every real part (needs PostgreSQL, Redis)"
	@echo "make bench-requests - web CPU per request, by kind (one daphne; needs PostgreSQL, Redis)"
	@echo "make bench-dashboard - the dashboard at 1,000 nodes in headless Chromium (needs Redis, Chromium)"
	@echo "make gpu-check - check discovery and real jobs on this machine's NVIDIA GPUs"
	@echo "make parity - a two-day trace through the live services and the simulator: differing decisions"
	@echo "make lint   - ruff check, ruff format --check, import contracts, mypy"
	@echo "make install - create .venv and install the project (requirements/lock.txt)"
	@echo "make lock   - regenerate requirements/lock.txt after changing pyproject.toml's dependencies"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml clients/cli/pyproject.toml $(LOCK) | $(BIN)/python
	$(PIP) -r $(LOCK)
	$(PIP) --no-deps -e . -e ./clients/cli
	@touch $@ $(RUNTIME_STAMP)

$(RUNTIME_STAMP): pyproject.toml clients/cli/pyproject.toml $(LOCK) | $(BIN)/python
	$(PIP) -c $(LOCK) -e . -e ./clients/cli
	@touch $@

# Regenerate the lock after a change to pyproject.toml's dependencies: uv resolves for every
# platform and Python version the project supports, keeping the versions already locked where
# the bounds still allow them (`make lock UV_ARGS=--upgrade` moves everything to the newest).
lock: | $(BIN)/python
	$(PIP) uv
	$(BIN)/uv pip compile pyproject.toml --extra dev --universal --python-version 3.11 \
		--custom-compile-command 'make lock' --quiet $(UV_ARGS) -o $(LOCK)

venv install deps: $(STAMP)

demo: $(RUNTIME_STAMP)
	$(BIN)/python scripts/demo.py

test: $(STAMP)
	$(BIN)/pytest $(PYTEST_ARGS)

# The pass benchmark's JSON lines, then the cold and growth passes beside the reference commit
# (scripts/bench_reference.py: CPU ratios and the speed verdicts).
bench: $(STAMP)
	$(BIN)/python -m scheduling.bench
	$(BIN)/python scripts/bench_reference.py

# BENCH_ARGS: e.g. "--jobs 500 --agents 8" (see scripts/bench_e2e.py).
bench-e2e: $(STAMP)
	$(BIN)/python scripts/bench_e2e.py $(BENCH_ARGS)

# BENCH_ARGS: e.g. "--nodes 1000 --seconds 60" (see scripts/bench_dashboard.py).
bench-dashboard: $(STAMP)
	$(BIN)/python scripts/bench_dashboard.py $(BENCH_ARGS)

# A trace through the live control plane and through the simulator: prints, last,
# {"jobs": N, "decisions": D, "differing_decisions": K}. Default: a generated two-day trace;
# PARITY_ARGS: e.g. "--nodes N.csv --jobs J.csv --quotas Q.csv", or "--days 1 --seed 3".
parity: $(STAMP)
	$(BIN)/python manage.py parity $(PARITY_ARGS)

bench-requests: $(STAMP)
	$(BIN)/python scripts/bench_requests.py

eval: $(STAMP)
	bash scripts/eval.sh

# The policy beside fair references on 15 bent workloads x 3 seeds (27 CPU-min: ~14 min on 2 idle cores; not in CI):
# OUT/matrix.md, each goal with its verdict. MATRIX_ARGS: e.g. "--only skew-1.0 --seeds 1".
MATRIX_OUT ?= var/eval-matrix
eval-matrix: $(STAMP)
	$(BIN)/python -m scheduling.sim.matrix $(MATRIX_OUT) $(MATRIX_ARGS)

# On a machine with NVIDIA GPUs (and PyTorch): real discovery, jobs, shares, metrics, cancel.
gpu-check: $(STAMP)
	$(BIN)/pytest -m gpu tests/agent/test_inventory.py
	$(BIN)/python scripts/gpu_check.py

# Lint, format, the import contracts and the types (pyproject.toml: [tool.importlinter], [tool.mypy]).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy

# Forget the demo's database (users, jobs, nodes) and its agents' credentials and job folders.
clean-demo:
	rm -rf var/tessera.sqlite3 var/tessera.sqlite3-wal var/tessera.sqlite3-shm var/agents var/demo-logs
