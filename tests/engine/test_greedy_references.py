"""The fair references: greedy (every job that fits starts, by kind level, priority, arrival) and
greedy-quota (the same, under the quota rules every policy obeys)."""

from __future__ import annotations

from scheduling.engine.registry import make_scheduler
from scheduling.engine.types import JobRequest, NodeSpec, QuotaSpec

NODES = [NodeSpec(f"n{i}", "r1", "A100", 8, nvlink_domain=8) for i in range(2)]


def job(job_id: str, gpus: float, kind: str = "training", at: float = 0.0, **kw) -> JobRequest:
    return JobRequest(job_id, kw.pop("tenant", "vision"), kind, gpus, submitted_at=at, **kw)


def started(policy: str, jobs: list[JobRequest], quotas: list[QuotaSpec] = ()) -> list[str]:
    sched = make_scheduler(policy, NODES, quotas)
    for j in jobs:
        sched.submit(j)
    return [b.job_id for b in sched.decide(100.0).bindings]


def test_a_job_that_fits_starts_behind_one_that_does_not():
    jobs = [job("first", 8, at=0), job("gang", 16, at=1, replicas=2), job("small", 2, at=2)]
    assert started("greedy-quota", jobs) == ["first", "small"]
    assert started("fcfs-device", jobs) == ["first"]  # the gang blocks the head


def test_inference_is_served_before_older_training_and_priority_before_arrival():
    jobs = [
        job("train-old", 8, at=0),
        job("train-urgent", 8, at=5, priority=10),
        job("infer", 8, kind="inference", at=9),
    ]
    assert started("greedy", jobs) == ["infer", "train-urgent"]


def test_greedy_quota_keeps_non_preemptible_work_within_the_guarantee_and_lends_the_rest():
    quotas = [QuotaSpec("vision", "*", guaranteed=4, limit=16)]
    jobs = [
        job("steady", 4, at=0, preemptible=False),
        job("more-steady", 4, at=1, preemptible=False),
        job("borrower", 8, at=2, preemptible=True),
    ]
    assert started("greedy-quota", jobs, quotas) == ["steady", "borrower"]
    assert started("greedy", jobs, quotas) == ["steady", "more-steady", "borrower"]
