"""Fair share is live within a pass: each start raises its tenant's share, and the next job of
the same level and priority is the one of the tenant with the lowest share now."""

from __future__ import annotations

from scheduling.engine.policy import TesseraScheduler
from scheduling.engine.types import JobRequest, QuotaSpec
from tests.engine.engine_cases import node


def _started(weights: tuple[float, float]) -> list[str]:
    """Two tenants with equal guarantees, 20 one-GPU jobs each (all of A's submitted first),
    10 free GPUs: the tenants of the jobs started, in start order."""
    quotas = [QuotaSpec("A", "H100", 10, 20, weights[0]), QuotaSpec("B", "H100", 10, 20, weights[1])]
    s = TesseraScheduler([node("a", gpus=8), node("b", gpus=2, nvlink=2)], quotas)
    for t in ("A", "B"):
        for i in range(20):
            s.submit(JobRequest(f"{t}{i:02d}", t, "training", 1, submitted_at=(0 if t == "A" else 100) + i))
    d = s.decide(200.0)
    return [b.job_id[0] for b in d.bindings]


def test_equal_weights_split_the_free_gpus_evenly_in_one_pass():
    assert _started((1.0, 1.0)) == list("ABABABABAB")  # ties go to the earlier arrival (A)


def test_weights_two_to_one_split_them_seven_to_three():
    # A's share grows by 1/20 a start, B's by 1/10: A, B, A, A, B, A, A, B, A, A
    assert _started((2.0, 1.0)) == list("ABAABAABAA")


def test_each_tenant_still_starts_its_own_jobs_oldest_first():
    quotas = [QuotaSpec("A", "H100", 10, 20), QuotaSpec("B", "H100", 10, 20)]
    s = TesseraScheduler([node("a", gpus=8)], quotas)
    for t in ("A", "B"):
        for i in (3, 1, 2, 0):
            s.submit(JobRequest(f"{t}{i}", t, "training", 1, submitted_at=i + (0.5 if t == "B" else 0)))
    d = s.decide(10.0)
    assert [b.job_id for b in d.bindings] == ["A0", "B0", "A1", "B1", "A2", "B2", "A3", "B3"]


def test_priority_still_comes_before_the_share():
    quotas = [QuotaSpec("A", "H100", 10, 20), QuotaSpec("B", "H100", 10, 20)]
    s = TesseraScheduler([node("a", gpus=4, nvlink=4)], quotas)
    for i in range(4):
        s.submit(JobRequest(f"A{i}", "A", "training", 1, priority=1, submitted_at=i))
        s.submit(JobRequest(f"B{i}", "B", "training", 1, submitted_at=i))
    d = s.decide(10.0)
    assert sorted(b.job_id for b in d.bindings) == ["A0", "A1", "A2", "A3"]
