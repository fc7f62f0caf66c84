"""An inference job takes the room that frees soonest: a shrink's or a preemption's.

A shrink removes an elastic job's replicas, but they keep their GPUs through the job's grace
period, as a preempted job's do; so a service that needs room starts when the slowest of what
it displaces has exited. It takes the shrink (no work lost) unless preempting frees the room
sooner, by the victims' grace periods; jobs of the other levels still shrink before preempting.
"""

from __future__ import annotations

from scheduling.engine.policy import TesseraScheduler
from scheduling.engine.types import Decisions, JobRequest
from tests.engine.engine_cases import node


def _elastic_beside_batch(elastic_grace: float, batch_grace: float) -> TesseraScheduler:
    s = TesseraScheduler([node("a", gpus=4, nvlink=4), node("b", gpus=4, nvlink=4)])
    # el: elastic, 1 GPU a replica, 2..4 GPUs; running at 4, so a shrink frees 2 GPUs
    s.submit(
        JobRequest(
            "el", "vision", "training", 4, replicas=4, topology="node", grace_s=elastic_grace,
            elastic_min_gpus=2, elastic_max_gpus=4,
        )
    )  # fmt: skip
    s.submit(JobRequest("job", "nlp", "batch", 4, topology="node", grace_s=batch_grace))
    d = s.decide(0.0)
    assert sorted(b.job_id for b in d.bindings) == ["el", "job"]
    assert {p.node for b in d.bindings if b.job_id == "el" for p in b.placements} == {"a"}
    return s


def _service(s: TesseraScheduler, kind: str = "inference", now: float = 1000.0) -> Decisions:
    s.submit(JobRequest("serve", "speech", kind, 2, preemptible=False, submitted_at=now - 5))
    return s.decide(now)


def test_a_service_preempts_when_that_frees_its_room_before_a_shrink_would():
    s = _elastic_beside_batch(elastic_grace=300, batch_grace=10)
    d = _service(s)
    assert not d.resizes  # el keeps its 4 GPUs: its removed replicas would hold them 300 s
    assert [p.job_id for p in d.preemptions] == ["job"]
    assert d.pending["serve"].estimated_start == 1010.0
    s.release("job", 1010.0)  # the victim has exited, 10 s on
    d = s.decide(1010.0)
    assert [b.job_id for b in d.bindings] == ["serve"]  # not 300 s on


def test_a_service_shrinks_when_that_frees_its_room_as_soon():
    s = _elastic_beside_batch(elastic_grace=10, batch_grace=300)
    d = _service(s)
    assert not d.preemptions  # no work lost when a shrink is as quick
    assert [r.job_id for r in d.resizes] == ["el"]
    assert d.pending["serve"].estimated_start == 1010.0


def test_a_service_shrinks_on_a_tie_rather_than_lose_work():
    s = _elastic_beside_batch(elastic_grace=30, batch_grace=30)
    d = _service(s)
    assert not d.preemptions and [r.job_id for r in d.resizes] == ["el"]


def test_a_starving_training_job_still_shrinks_before_it_preempts():
    s = _elastic_beside_batch(elastic_grace=300, batch_grace=10)
    # submitted before both (they are younger), it has waited past the starvation bound
    s.submit(JobRequest("old", "speech", "training", 2, submitted_at=-1.0))
    d = s.decide(s.config.starve_s + 1000.0)
    assert not d.preemptions and [r.job_id for r in d.resizes] == ["el"]
