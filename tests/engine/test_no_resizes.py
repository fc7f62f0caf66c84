"""With ``resizes`` off (the live control plane), running jobs keep the size they started with.

The agent cannot add or remove a running job's replicas, so the live pass turns resizing off:
the engine then never shrinks an elastic job to make room (a job that needs its GPUs waits or
preempts it whole, as for any job), never grows one, and never plans a start on GPUs that only
a shrink would have freed. The simulator keeps resizing on (the default).
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.engine.config import EngineConfig
from scheduling.engine.policy import TesseraScheduler
from scheduling.engine.state import placements_of
from scheduling.engine.types import Decisions, JobRequest
from tests.engine.engine_cases import clusters, jobs, node, quota_sets
from tests.engine.engine_world import World, run

LIVE = EngineConfig(resizes=False)


def _elastic_on_every_gpu(config: EngineConfig) -> TesseraScheduler:
    s = TesseraScheduler([node("a", gpus=4, nvlink=4), node("b", gpus=4, nvlink=4)], config=config)
    s.submit(JobRequest("el", "vision", "training", 4, replicas=4, elastic_min_gpus=2, elastic_max_gpus=8))
    d = s.decide(0.0)
    assert len(d.bindings[0].placements) == 8  # an idle cluster: it starts at its maximum
    return s


def _gpus_of(d: Decisions, job_id: str) -> set[tuple[str, int]]:
    return {(p.node, g) for b in d.bindings if b.job_id == job_id for p in b.placements for g in p.gpus}


def test_a_service_shrinks_an_elastic_job_and_starts_on_its_gpus_once_its_replicas_exit():
    s = _elastic_on_every_gpu(EngineConfig())
    s.submit(JobRequest("serve", "speech", "inference", 2, preemptible=False, submitted_at=600))
    d = s.decide(1000.0)
    assert not d.bindings and not d.preemptions
    (resize,) = d.resizes
    assert resize.job_id == "el" and len(resize.placements) == 2  # down to its minimum
    assert d.pending["serve"].code == "reserved" and "shrinking 1 elastic job" in d.pending["serve"].message
    # Invariant 8: the removed replicas' GPUs are held until they have exited...
    assert not s.decide(1010.0).bindings
    held = {(p.node, g) for p in _placements(s, "el") for g in p.gpus}
    s.release_leaving("el", 1020.0)
    d = s.decide(1020.0)  # ... and then the service starts on them
    assert [b.job_id for b in d.bindings] == ["serve"] and not _gpus_of(d, "serve") & held


def test_without_resizes_a_service_preempts_the_elastic_job_whole_instead_of_shrinking_it():
    s = _elastic_on_every_gpu(LIVE)
    held = {(p.node, g) for p in _placements(s, "el") for g in p.gpus}
    s.submit(JobRequest("serve", "speech", "inference", 2, preemptible=False, submitted_at=600))
    d = s.decide(1000.0)
    assert not d.resizes
    assert not _gpus_of(d, "serve") & held  # no binding on GPUs the elastic job holds
    assert not d.bindings
    assert [p.job_id for p in d.preemptions] == ["el"]  # as for any preemptible victim
    assert d.pending["serve"].code == "reserved"
    assert "preempting 1 job(s)" in d.pending["serve"].message


def test_without_resizes_a_training_job_waits_for_the_elastic_job_and_says_so():
    s = _elastic_on_every_gpu(LIVE)
    s.submit(JobRequest("next", "nlp", "training", 2, submitted_at=600))
    d = s.decide(1000.0)
    assert not d.resizes and not d.bindings and not d.preemptions
    assert d.pending["next"].code == "reserved"  # the nodes the elastic job frees, held for it


def test_without_resizes_an_elastic_job_does_not_grow_into_freed_gpus():
    s = TesseraScheduler([node("a", gpus=4, nvlink=4), node("b", gpus=4, nvlink=4)], config=LIVE)
    s.submit(JobRequest("other", "nlp", "batch", 4))
    s.decide(0.0)
    s.submit(
        JobRequest(
            "el", "vision", "training", 4, replicas=4, elastic_min_gpus=2, elastic_max_gpus=8, submitted_at=1
        )
    )
    d = s.decide(1.0)
    assert len(d.bindings[0].placements) == 4  # what fits, between its min and max
    s.release("other", 50.0)
    d = s.decide(50.0)
    assert not d.resizes  # the simulator grows it to 8 here (test_preemption_and_quotas)
    assert len(_placements(s, "el")) == 4


def _placements(s: TesseraScheduler, job_id: str):
    return placements_of(s.state.allocs.get(job_id, []), s.state)


class LiveWorld(World):
    """A driver like the live pass: it has no way to resize a running job, so it applies
    bindings and preemptions only (and counts the resizes it could not apply). Its GPU check
    fails if the engine binds a job on GPUs that only a shrink would have freed."""

    resizes = 0

    def apply(self, d: Decisions) -> None:
        self.resizes += len(d.resizes)
        super().apply(replace(d, resizes=[]))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=clusters(), workload=jobs(), quotas=quota_sets(), seed=st.integers(0, 3))
def test_without_resizes_no_gpu_is_ever_planned_twice_by_a_driver_that_cannot_resize(
    nodes, workload, quotas, seed
):
    sched = TesseraScheduler(nodes, quotas, EngineConfig(seed=seed, resizes=False))
    world = run(sched, LiveWorld(nodes, quotas, workload), workload, seed=seed)
    assert world.resizes == 0
