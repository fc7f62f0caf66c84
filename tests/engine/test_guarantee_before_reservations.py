"""An inference job its tenant's guarantee holds goes before nodes reserved for lower kinds' jobs:
a guarantee is served before the wait bound of lower work. Not a job past its guarantee, nor
one of the reserving job's level."""

from __future__ import annotations

from scheduling.engine.config import EngineConfig
from scheduling.engine.policy import TesseraScheduler
from scheduling.engine.types import Decisions, JobRequest, QuotaSpec
from tests.engine.engine_cases import node

QUOTAS = [
    *(QuotaSpec(t, "*", guaranteed=4, limit=8) for t in ("vision", "nlp", "research")),
    QuotaSpec("spare", "*", guaranteed=0, limit=8),  # borrows all it runs
]


def world(running_gpus: float) -> TesseraScheduler:
    """One node of 8 GPUs: nlp's preemptible fine-tune runs on ``running_gpus`` of them;
    research's 8-GPU training, submitted at t=1, has aged by t=100 and reserves the node."""
    s = TesseraScheduler([node("a", gpus=8, nvlink=8)], QUOTAS, EngineConfig(aging_s=60))
    s.submit(JobRequest("ft", "nlp", "finetune", running_gpus, preemptible=True, submitted_at=0))
    assert [b.job_id for b in s.decide(0.0).bindings] == ["ft"]
    s.submit(JobRequest("big", "research", "training", 8, preemptible=True, submitted_at=1))
    s.decide(1.0)
    d = s.decide(100.0)
    assert "big" in d.pending and any(r.job_id == "big" for r in s.last_reservations)
    return s


def submit(s: TesseraScheduler, job: JobRequest, now: float = 120.0) -> Decisions:
    s.submit(job)
    return s.decide(now)


def service(job_id: str, tenant: str, gpus: float) -> JobRequest:
    return JobRequest(job_id, tenant, "inference", gpus, preemptible=False, submitted_at=110)


def test_an_inference_job_within_its_guarantee_starts_beside_a_reservation_for_training():
    d = submit(world(6), service("svc", "vision", 1))
    assert [b.job_id for b in d.bindings] == ["svc"]


def test_it_preempts_lower_work_on_the_reserved_node_when_nothing_is_free():
    # (once the fine-tune has run preempt_min_run_s)
    d = submit(world(8), service("svc", "vision", 1), now=1000.0)
    assert [p.job_id for p in d.preemptions] == ["ft"]
    assert d.pending["svc"].message == "reserved: preempting 1 job(s) to make room; starts when they exit"


def test_an_inference_job_past_its_guarantee_keeps_off_the_reserved_node():
    job = JobRequest("svc", "spare", "inference", 1, preemptible=True, submitted_at=110)
    d = submit(world(6), job)
    assert d.pending["svc"].code == "reserved" and not d.bindings


def test_a_job_of_the_reserving_job_s_level_keeps_off_the_reserved_node():
    job = JobRequest("t2", "vision", "training", 1, preemptible=False, submitted_at=110)
    d = submit(world(6), job)
    assert d.pending["t2"].code == "reserved" and not d.bindings
