"""Live = simulated: a generated trace replayed through the live control plane (its database,
its passes, its agents' reports simulated in-process, on the trace's clock) and through the
simulator's long-lived engine decides the same: every start (job, attempt, time, GPUs) and every
preemption. ``make parity`` does the same on a two-day trace (``scheduling/parity.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from urllib.parse import quote

import pytest
from django.db import connection

from scheduling.parity import PassWorker, run_parity
from scheduling.sim.generate import generate
from scheduling.sim.traces import read_jobs, read_nodes, read_quotas


def test_a_trace_through_the_live_services_decides_as_the_simulator(db, tmp_path: Path):
    # 236 jobs on 96 GPUs at load 1.5, with quotas: 14 gangs, 7 elastic jobs, 126 that
    # checkpoint; the simulator preempts 23 times on it
    generate(tmp_path, seed=4, days=0.5, load=1.5, gpus=96)
    nodes, jobs = read_nodes(tmp_path / "nodes.csv"), read_jobs(tmp_path / "jobs.csv")
    result = run_parity(nodes, jobs, read_quotas(tmp_path / "quotas.csv"))
    print(json.dumps(result.line()))
    kinds = Counter(d.kind for d in result.simulated)
    assert kinds["preempt"] >= 10 and kinds["start"] >= len(jobs)
    assert result.first_difference is None
    assert result.differing == 0
    assert (result.pending_codes_differing, result.unpaired_passes) == (0, 0), result.notes[:3]


@pytest.mark.postgresql("the pass worker, a process of its own, shares the harness's database")
def test_a_pass_worker_killed_and_restarted_mid_trace_decides_as_if_it_had_not_been(
    transactional_db, require_postgres, tmp_path: Path
):
    generate(tmp_path, seed=2, days=0.3, load=1.5, gpus=64)
    nodes, jobs = read_nodes(tmp_path / "nodes.csv"), read_jobs(tmp_path / "jobs.csv")
    db = connection.settings_dict  # the test database, as the worker must reach it
    who = quote(db["USER"]) + (f":{quote(db['PASSWORD'])}" if db.get("PASSWORD") else "")
    worker = PassWorker(f"postgres://{who}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}")
    kills = frozenset(range(10, 100_000, 25))  # SIGKILL after the 10th pass, the 35th, ...
    result = run_parity(nodes, jobs, read_quotas(tmp_path / "quotas.csv"), worker=worker, kill_after=kills)
    print(json.dumps(result.line()), worker.started)
    assert worker.started > 4
    assert Counter(d.kind for d in result.simulated)["preempt"] >= 1
    assert (result.first_difference, result.differing) == (None, 0)
    assert (result.pending_codes_differing, result.unpaired_passes) == (0, 0), result.notes[:3]


def test_make_parity_prints_its_json_line_last_and_refuses_bad_arguments(tmp_path: Path):
    def parity(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "manage.py", "parity", *args], capture_output=True, text=True, timeout=300
        )

    done = parity("--days", "0.05", "--gpus", "16", "--seed", "3", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(line) == {"jobs", "decisions", "differing_decisions"}
    assert line["jobs"] > 0 and line["differing_decisions"] == 0
    refused = parity("--nodes", str(tmp_path / "none.csv"))
    assert refused.returncode != 0 and "--nodes and --jobs go together" in refused.stderr
    assert "Traceback" not in refused.stderr
    missing = parity("--nodes", str(tmp_path / "none.csv"), "--jobs", str(tmp_path / "none.csv"))
    assert missing.returncode != 0 and "none.csv" in missing.stderr and "Traceback" not in missing.stderr
