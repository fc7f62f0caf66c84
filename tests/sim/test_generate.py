"""The generator: the load it promises, the shapes it documents, the same files for the same seed."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from scheduling.sim.generate import generate
from scheduling.sim.traces import read_jobs, read_nodes, read_quotas


def load_of(out: Path) -> float:
    gpus = sum(n.gpus for n in read_nodes(out / "nodes.csv"))
    jobs = read_jobs(out / "jobs.csv")
    submits = [j.submit_s for j in jobs]
    work = sum(j.request.gpus * (j.duration_s or 0) for j in jobs)
    return work / (gpus * (max(submits) - min(submits)))


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
@pytest.mark.parametrize("load", [0.6, 1.0, 1.2])
def test_the_realised_load_is_within_five_percent(tmp_path: Path, seed: int, load: float) -> None:
    generate(tmp_path, seed=seed, days=2, load=load)
    assert load_of(tmp_path) == pytest.approx(load, rel=0.05)


def test_the_same_seed_writes_the_same_files_and_another_seed_does_not(tmp_path: Path) -> None:
    for name, seed in (("a", 5), ("b", 5), ("c", 6)):
        generate(tmp_path / name, seed=seed, days=1, load=1.0)
    for f in ("nodes.csv", "jobs.csv", "quotas.csv"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
    assert (tmp_path / "a" / "jobs.csv").read_bytes() != (tmp_path / "c" / "jobs.csv").read_bytes()


def test_the_default_cluster_is_about_600_mixed_gpus_in_racks(tmp_path: Path) -> None:
    generate(tmp_path, seed=1, days=1, load=1.0)
    nodes = read_nodes(tmp_path / "nodes.csv")
    by_model = Counter()
    for n in nodes:
        by_model[(n.model, n.gpus, n.nvlink_domain)] += n.gpus
    assert set(by_model) == {("H100", 8, 8), ("A100", 8, 4), ("T4", 4, 1)}
    assert 570 <= sum(by_model.values()) <= 630
    assert len({n.rack for n in nodes}) >= 8


def test_the_workload_has_the_documented_shapes(tmp_path: Path) -> None:
    generate(tmp_path, seed=2, days=2, load=1.0)
    jobs = [j.request for j in read_jobs(tmp_path / "jobs.csv")]
    kinds = Counter(j.kind for j in jobs)
    assert 2000 <= len(jobs) <= 3200
    assert kinds.most_common(1)[0][0] == "batch"
    single = sum(1 for j in jobs if j.gpus <= 1)
    assert single / len(jobs) > 0.5  # most jobs ask for one GPU or less
    gang_time = sum(
        t.request.gpus * t.duration_s for t in read_jobs(tmp_path / "jobs.csv") if t.request.gpus >= 8
    )
    all_time = sum(t.request.gpus * t.duration_s for t in read_jobs(tmp_path / "jobs.csv"))
    assert gang_time / all_time > 0.5  # most GPU-time in large jobs
    assert all(not j.preemptible for j in jobs if j.kind == "inference")
    assert any(0 < j.gpus < 1 for j in jobs if j.kind == "inference")
    gangs = [j for j in jobs if j.replicas > 1]
    assert gangs and max(j.gpus for j in gangs) <= 64 and min(j.gpus for j in gangs) >= 8
    assert any(j.topology == "rack" for j in gangs) and any(j.elastic_min_gpus for j in gangs)
    assert any(j.topology == "nvlink" for j in jobs if j.kind == "finetune")
    assert sum(1 for j in jobs if j.time_limit_s is None) > 0
    assert max(t.duration_s for t in read_jobs(tmp_path / "jobs.csv")) <= 7 * 86400
    tenants = {q.tenant for q in read_quotas(tmp_path / "quotas.csv")}
    assert {j.tenant for j in jobs} <= tenants and len(tenants) >= 4


def test_the_quotas_guarantee_about_the_cluster_with_limits_above(tmp_path: Path) -> None:
    generate(tmp_path, seed=3, days=1, load=1.0)
    gpus = sum(n.gpus for n in read_nodes(tmp_path / "nodes.csv"))
    quotas = read_quotas(tmp_path / "quotas.csv")
    assert sum(q.guaranteed for q in quotas) == pytest.approx(gpus, rel=0.02)
    assert all(q.limit > q.guaranteed for q in quotas)
