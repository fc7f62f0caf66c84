"""A job that accepts several models starts off the models a job blocked earlier in the pass
needs, where it fits there: on accurate-1.2 A100 and T4 idled while H100-only gangs waited and
jobs that would have run on A100 held H100 (docs/benchmarks/eval-matrix.md, session 12)."""

from __future__ import annotations

from scheduling.engine.config import EngineConfig
from scheduling.engine.policy import TesseraScheduler
from scheduling.engine.types import JobRequest, Placement, QuotaSpec
from tests.engine.engine_cases import node


def world(blocked: bool) -> TesseraScheduler:
    """h1 held until t=3600, h2 and a1 free; no reservations, so only the new rule keeps h2.
    With ``blocked``, an H100-only 16-GPU gang waits ahead of a job taking H100, else A100."""
    nodes = [node("h1", "H100", rack="r1"), node("h2", "H100", rack="r1"), node("a1", "A100", rack="r2")]
    s = TesseraScheduler(nodes, [], EngineConfig(max_reservations=0))
    s.submit(JobRequest("long", "t", "training", 8, accelerators=("H100",), time_limit_s=3600))
    assert [b.job_id for b in s.decide(0.0).bindings] == ["long"]
    if blocked:
        s.submit(JobRequest("gang", "t", "training", 16, replicas=2, accelerators=("H100",), submitted_at=1))
    s.submit(JobRequest("flex", "t", "training", 8, accelerators=("H100", "A100"), submitted_at=2))
    return s


def placed(s: TesseraScheduler, now: float) -> dict[str, set[str]]:
    d = s.decide(now)
    return {b.job_id: {p.node for p in b.placements} for b in d.bindings}


def test_a_flexible_job_leaves_the_blocked_jobs_model_alone():
    s = world(blocked=True)
    assert placed(s, 10.0) == {"flex": {"a1"}}


def test_without_a_blocked_job_it_takes_its_preferred_model():
    assert placed(world(blocked=False), 10.0) == {"flex": {"h2"}}


def test_it_still_starts_on_the_contested_model_when_nothing_else_holds_it():
    s = world(blocked=True)
    s.submit(JobRequest("fill", "t", "training", 8, accelerators=("A100",), submitted_at=0.5))
    # fill, ahead in the queue, takes a1: flex has only H100 left, and takes it
    assert placed(s, 10.0) == {"fill": {"a1"}, "flex": {"h2"}}


def waited_last_pass() -> TesseraScheduler:
    """The H100-only gang is left waiting for nodes by one pass; then a flexible job of higher
    priority arrives, ahead of the gang in the queue."""
    s = world(blocked=True)
    s.cancel("flex")
    d = s.decide(5.0)
    assert not d.bindings and d.pending["gang"].code not in ("quota", "borrow-limit")
    s.submit(
        JobRequest("flex2", "t", "training", 8, accelerators=("H100", "A100"), priority=10, submitted_at=6)
    )
    return s


def test_a_job_ahead_of_one_left_waiting_last_pass_leaves_its_model_alone():
    # only the last pass's memory says the gang waits: flex2 is decided before the gang is met
    assert placed(waited_last_pass(), 10.0) == {"flex2": {"a1"}}


def test_the_last_pass_waiter_contests_nothing_once_gone():
    s = waited_last_pass()
    s.cancel("gang")
    assert placed(s, 10.0) == {"flex2": {"h2"}}


def test_the_waiter_is_remembered_across_a_rebuilt_scheduler():
    # live, a scheduler is built every pass from the snapshot and the last pass's memory
    s = waited_last_pass()
    assert dict(s.memory().last_codes)["gang"] not in ("quota", "borrow-limit")
    fresh = TesseraScheduler(s.nodes, [], s.config)
    fresh.restore(s.memory())
    for job in s.pending.values():
        fresh.submit(job, note=False)
    run = s.running["long"]
    fresh.adopt(run.job, (Placement(0, "h1", tuple(range(8))),), run.started_at, note=False)
    assert placed(fresh, 10.0) == {"flex2": {"a1"}}


def quota_world() -> TesseraScheduler:
    """Tenant t's aged A100-only gang ``big`` waits for t's A100 row (``hog`` holds 8 of its 16);
    tenant u's H100-only gang waits for nodes (``long`` holds h1)."""
    nodes = [node(n, m, rack=m) for n, m in (("h1", "H100"), ("h2", "H100"), ("a1", "A100"), ("a2", "A100"))]
    quotas = [QuotaSpec("t", "H100", 16, 16), QuotaSpec("t", "A100", 8, 16), QuotaSpec("u", "H100", 32, 32)]
    s = TesseraScheduler(nodes, quotas, EngineConfig(max_reservations=0))
    s.submit(
        JobRequest("hog", "t", "training", 8, accelerators=("A100",), preemptible=False, time_limit_s=36000)
    )
    s.submit(
        JobRequest("long", "u", "training", 8, accelerators=("H100",), preemptible=False, time_limit_s=72000)
    )
    assert {b.job_id for b in s.decide(0.0).bindings} == {"hog", "long"}
    s.submit(JobRequest("big", "t", "training", 16, replicas=2, accelerators=("A100",), submitted_at=1))
    s.submit(JobRequest("gang", "u", "training", 16, replicas=2, accelerators=("H100",), submitted_at=2))
    return s


def test_it_is_not_moved_onto_the_quota_row_its_tenants_aged_job_waits_for():
    s = quota_world()
    s.submit(
        JobRequest(
            "flex", "t", "training", 8, accelerators=("H100", "A100"), time_limit_s=180000, submitted_at=17990
        )
    )
    d = s.decide(18000.0)
    assert d.pending["big"].code == "quota" and d.pending["gang"].code not in ("quota", "borrow-limit")
    # on A100 it would take the row big waits for until long after hog ends: it keeps its own order
    assert {b.job_id: {p.node for p in b.placements} for b in d.bindings} == {"flex": {"h2"}}


def test_a_job_ending_before_the_row_frees_is_still_moved():
    s = quota_world()
    s.submit(
        JobRequest(
            "flex", "t", "training", 8, accelerators=("H100", "A100"), time_limit_s=600, submitted_at=17990
        )
    )
    assert placed(s, 18000.0) == {"flex": {"a2"}}
