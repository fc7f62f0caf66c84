"""``scripts/heldout_shapes.py``: the scarce-model workload, seeded and in the simulator's formats."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

from scheduling.sim.traces import read_jobs, read_nodes, read_quotas

ROOT = Path(__file__).resolve().parents[2]


def build(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "scripts/heldout_shapes.py", str(out), "--hours", "6", *args],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip


def test_the_same_seed_writes_the_same_files_and_the_scarce_model_gets_its_share(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for out in (a, b):
        assert build(out, "--seed", "3", "--scarce", "H100:0.7").returncode == 0
    for name in ("nodes.csv", "jobs.csv", "quotas.csv"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    nodes, jobs, quotas = (
        read_nodes(a / "nodes.csv"),
        read_jobs(a / "jobs.csv"),
        read_quotas(a / "quotas.csv"),
    )
    assert sum(n.gpus for n in nodes if n.model == "H100") == 24
    gpu_jobs = [t.request for t in jobs if t.request.gpus > 0]
    only_h100 = [j for j in gpu_jobs if j.accelerators == ("H100",)]
    assert 0.6 < len(only_h100) / len(gpu_jobs) < 0.8
    assert all("H100" not in j.accelerators for j in gpu_jobs if j not in only_h100)
    rows = {(q.tenant, q.model): q for q in quotas}
    assert (rows["research", "H100"].guaranteed, rows["research", "H100"].limit) == (4, 10)
    assert (rows["prod", "H100"].guaranteed, rows["prod", "H100"].limit) == (8, 20)


def test_a_scarce_model_without_nodes_is_refused_with_a_message(tmp_path):
    got = build(tmp_path / "w", "--nodes", "A100=2", "--scarce", "H100:0.5")
    assert got.returncode == 2 and "--scarce: H100 has no nodes" in got.stderr
    assert not (tmp_path / "w").exists()
    got = build(tmp_path / "w", "--scarce", "H100:2")
    assert got.returncode == 2 and "--scarce" in got.stderr and "Traceback" not in got.stderr


def test_other_seeds_differ(tmp_path):
    build(tmp_path / "a", "--seed", "1")
    build(tmp_path / "b", "--seed", "2")
    with open(tmp_path / "a" / "jobs.csv") as fa, open(tmp_path / "b" / "jobs.csv") as fb:
        assert list(csv.reader(fa)) != list(csv.reader(fb))
