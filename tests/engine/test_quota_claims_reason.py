"""A job its quota refuses because the row is claimed for its tenant's aged jobs waiting for
nodes (:meth:`PolicyPass.hold_aged_quota`) is told so: the claims are not counted as use (on a
workload with one scarce model, a tenant holding 1 of its 10 H100 was told it used 10 of 10)."""

from __future__ import annotations

from scheduling.engine.config import EngineConfig
from scheduling.engine.policy import TesseraScheduler
from scheduling.engine.types import JobRequest, QuotaSpec
from tests.engine.engine_cases import node

QUOTAS = [
    QuotaSpec("research", "H100", guaranteed=4, limit=8),
    QuotaSpec("nlp", "H100", guaranteed=8, limit=8),
]


def world(*research: tuple[str, float, float]) -> TesseraScheduler:
    """nlp's service takes 6 of the one node's 8 H100; ``research`` jobs (id, GPUs, submitted)
    follow. No reservations: an aged job that fits nowhere claims its need on the row."""
    s = TesseraScheduler([node("a", gpus=8, nvlink=8)], QUOTAS, EngineConfig(aging_s=60, max_reservations=0))
    s.submit(JobRequest("serve", "nlp", "inference", 6, preemptible=False, submitted_at=0))
    assert [b.job_id for b in s.decide(0.0).bindings] == ["serve"]
    for job_id, gpus, at in research:
        s.submit(JobRequest(job_id, "research", "training", gpus, submitted_at=at))
    return s


def test_a_job_refused_for_room_claimed_for_aged_jobs_is_not_told_it_is_used():
    # big (aged, 8 GPUs, fits nowhere) claims the row's 8; small would fit beside serve
    s = world(("big", 8, 1), ("small", 2, 90))
    d = s.decide(100.0)
    assert not d.bindings  # the decision stands: small waits behind its tenant's aged jobs
    why = d.pending["small"]
    assert why.code == "quota"
    assert (
        why.message == "quota: research uses 0 of 8 H100; 8 held for its aged jobs ahead of it in the queue"
    )
    assert s.quotas.used("research", "H100") == 0  # the claims are given back after the pass


def test_a_job_refused_by_use_alone_is_told_the_use_as_before():
    s = world(("run", 2, 1))
    assert [b.job_id for b in s.decide(1.0).bindings] == ["run"]
    s.submit(JobRequest("more", "research", "training", 8, submitted_at=2))
    assert s.decide(100.0).pending["more"].message == "quota: research uses 2 of 8 H100 (limit)"
