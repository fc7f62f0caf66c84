"""The allocation ceiling: hand-computed cases, and no policy's measured allocation above it."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduling.engine.types import JobRequest
from scheduling.sim.ceiling import allocation_ceiling
from scheduling.sim.generate import generate
from scheduling.sim.runner import run_replay
from scheduling.sim.traces import TraceJob, read_jobs


def tj(job_id: str, gpus: float, duration: float, submit: float, **kw: object) -> TraceJob:
    req = JobRequest(id=job_id, tenant="t", kind="batch", gpus=gpus, submitted_at=submit, **kw)  # type: ignore[arg-type]
    return TraceJob(req, submit, duration)


def test_a_job_arriving_late_leaves_the_start_idle() -> None:
    # 8 GPUs over [0, 100]; one 8-GPU job arrives at 50 and runs 1000 s: at most half the span.
    assert allocation_ceiling([tj("a", 8, 1000, 50), tj("z", 0, 1, 100)], 8, 0, 100) == pytest.approx(0.5)


def test_work_shorter_than_the_span_bounds_it() -> None:
    # Two 4-GPU jobs of 25 s at t=0 on 8 GPUs over 100 s: 200 GPU-s of 800.
    jobs = [tj("a", 4, 25, 0), tj("b", 4, 25, 0), tj("z", 0, 1, 100)]
    assert allocation_ceiling(jobs, 8, 0, 100) == pytest.approx(0.25)


def test_more_demand_than_capacity_caps_at_one() -> None:
    jobs = [tj(f"j{i}", 8, 1000, 0) for i in range(3)]
    assert allocation_ceiling(jobs, 8, 0, 100) == pytest.approx(1.0)


def test_a_time_limit_and_an_elastic_maximum_count() -> None:
    # 2 GPUs asked, may grow to 4, 100 s of work: 200 GPU-s, held at most at 4 GPUs (50 s).
    elastic = tj("e", 2, 100, 0, elastic_min_gpus=1, elastic_max_gpus=4)
    assert allocation_ceiling([elastic, tj("z", 0, 1, 100)], 8, 0, 100) == pytest.approx(200 / 800)
    # A 1-hour job with a 10 s limit fails at 10 s: 80 GPU-s of 800.
    limited = tj("l", 8, 3600, 0, time_limit_s=10)
    assert allocation_ceiling([limited, tj("z", 0, 1, 100)], 8, 0, 100) == pytest.approx(0.1)


def test_fractional_jobs_count_their_share() -> None:
    jobs = [tj("h", 0.5, 1000, 0), tj("z", 0, 1, 100)]
    assert allocation_ceiling(jobs, 1, 0, 100) == pytest.approx(0.5)


@pytest.mark.parametrize("policy", ["fcfs-device", "best-fit", "tessera"])
def test_no_policy_allocates_more_than_the_ceiling(tmp_path: Path, policy: str) -> None:
    work = tmp_path / "w"
    generate(work, seed=7, days=0.5, load=1.1, gpus=64)
    summary = run_replay(
        work / "nodes.csv", work / "jobs.csv", work / "quotas.csv", policy, tmp_path / policy
    )
    ceiling = summary["gpu_allocation_ceiling_while_arriving"]
    first, last = _arrival_span(work / "jobs.csv")
    assert ceiling == pytest.approx(
        allocation_ceiling(read_jobs(work / "jobs.csv"), summary["gpus"], first, last)
    )
    # Work thrown away by preemption (and the grace periods around it) is allocation no
    # work-conserving policy needs: it may sit above the ceiling by that much, never more.
    span_gpu_s = summary["gpus"] * (last - first)
    slack = summary["lost_gpu_seconds"] / span_gpu_s + summary["preemptions"] * 8 * 120 / span_gpu_s
    assert summary["gpu_allocation_rate_while_arriving"] <= ceiling + slack + 1e-9
    assert 0 < ceiling <= 1


def _arrival_span(jobs_csv: Path) -> tuple[float, float]:
    submits = [j.submit_s for j in read_jobs(jobs_csv)]
    return min(submits), max(submits)
