"""Live = simulated: a generated trace replayed through the live control plane (its database,
its passes, its agents' reports simulated in-process, on the trace's clock) and through the
simulator's long-lived engine decides the same: every start (job, attempt, time, GPUs), every
preemption and every resize. ``make parity`` does the same on a two-day trace
(``scheduling/parity.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path
from urllib.parse import quote

import pytest
from django.db import connection

from scheduling.parity import PassWorker, run_parity
from scheduling.sim.generate import generate
from scheduling.sim.traces import TraceJob, read_jobs, read_nodes, read_quotas


def resizable(jobs: list[TraceJob]) -> list[TraceJob]:
    """The trace with more jobs that change size while running: every gang either elastic (from
    half its replicas) or started with half its replicas (``min_available``), and every third
    preemptible multi-GPU training or fine-tuning job one-GPU replicas, elastic from half."""
    out = []
    for i, tj in enumerate(jobs):
        r = tj.request
        if r.replicas > 1 and r.elastic_max_gpus is None:
            half = max(1, r.replicas // 2)
            if i % 2:
                r = replace(r, elastic_min_gpus=r.gpus / r.replicas * half, elastic_max_gpus=r.gpus)
            else:
                r = replace(r, min_available=half)
        elif r.replicas == 1 and r.gpus >= 2 and r.gpus == int(r.gpus) and r.preemptible and i % 3 == 0:
            g = int(r.gpus)
            if r.kind in ("training", "finetune"):
                r = replace(
                    r, replicas=g, elastic_min_gpus=max(1, g // 2), elastic_max_gpus=g, topology="any"
                )
        out.append(TraceJob(r, tj.submit_s, tj.duration_s))
    return out


def test_a_trace_through_the_live_services_decides_as_the_simulator(db, tmp_path: Path):
    # 236 jobs on 96 GPUs at load 1.5, with quotas, 126 that checkpoint; with resizable(), 40
    # elastic jobs and 7 gangs started at half their replicas: the simulator grows and shrinks
    # running jobs about 80 times on it, and preempts a dozen times
    generate(tmp_path, seed=4, days=0.5, load=1.5, gpus=96)
    nodes, jobs = read_nodes(tmp_path / "nodes.csv"), resizable(read_jobs(tmp_path / "jobs.csv"))
    result = run_parity(nodes, jobs, read_quotas(tmp_path / "quotas.csv"))
    print(json.dumps(result.line()), Counter(d.kind for d in result.simulated))
    kinds = Counter(d.kind for d in result.simulated)
    assert kinds["preempt"] >= 5 and kinds["start"] >= len(jobs) and kinds["resize"] >= 40
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
