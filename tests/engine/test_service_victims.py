"""A service that must preempt waits for its slowest victim to exit: it picks victims by grace.

Every victim keeps its GPUs through its grace period, so a non-preemptible job (a service) starts
only when the last of its victims has exited. It takes the room whose victims' longest grace is
shortest, then the least lost work; a preemptible job still takes the least lost work.
"""

from __future__ import annotations

from scheduling.engine.policy import TesseraScheduler
from scheduling.engine.types import JobRequest
from tests.engine.engine_cases import node


def _two_victims() -> TesseraScheduler:
    s = TesseraScheduler([node("a", gpus=4, nvlink=4), node("b", gpus=4, nvlink=4)])
    # slow: a training job that checkpointed a moment ago (little work lost) but needs 300 s to stop
    s.submit(JobRequest("slow", "nlp", "batch", 4, grace_s=300, checkpoint_s=600))
    # quick: a batch job with more work since its checkpoint that stops within 10 s
    s.submit(JobRequest("quick", "nlp", "batch", 4, grace_s=10))
    assert len(s.decide(0.0).bindings) == 2
    s.checkpoint("slow", 990.0)
    return s


def test_a_service_preempts_the_victim_that_exits_soonest():
    s = _two_victims()
    s.submit(JobRequest("serve", "vision", "inference", 4, preemptible=False, submitted_at=995))
    d = s.decide(1000.0)
    assert [p.job_id for p in d.preemptions] == ["quick"]  # 10 s away, not 300 s


def test_a_preemptible_job_still_preempts_the_least_lost_work():
    s = _two_victims()
    s.submit(JobRequest("train", "vision", "inference", 4, preemptible=True, submitted_at=995))
    d = s.decide(1000.0)
    assert [p.job_id for p in d.preemptions] == ["slow"]  # 10 s of work lost, not 1,000 s
