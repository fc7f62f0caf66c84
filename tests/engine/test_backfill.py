"""Aging, reservations and backfill: a reservation is never delayed by a job started after it."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.engine.config import EngineConfig
from scheduling.engine.policy import TesseraScheduler
from scheduling.engine.types import JobRequest
from tests.engine.engine_cases import node


def _cluster():
    return [node(f"n{i}", gpus=4, nvlink=4, rack=f"r{i // 2}") for i in range(4)]


def test_an_aged_job_gets_a_reservation_with_an_estimated_start():
    cfg = EngineConfig(aging_s=100.0)
    s = TesseraScheduler(_cluster(), config=cfg)
    for i in range(4):
        s.submit(JobRequest(f"r{i}", "nlp", "training", 3, time_limit_s=1000.0))
    s.decide(0.0)
    s.submit(JobRequest("big", "vision", "batch", 4, submitted_at=0.0))
    d = s.decide(200.0)
    assert d.pending["big"].code == "reserved"
    assert d.pending["big"].estimated_start == 1000.0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    limits=st.lists(st.sampled_from([300.0, 900.0, 2000.0, None]), min_size=4, max_size=4),
    later=st.lists(
        st.tuples(st.sampled_from([1, 2, 0.5]), st.sampled_from([100.0, 500.0, 5000.0, None])),
        min_size=1,
        max_size=12,
    ),
)
def test_an_aged_jobs_reservation_is_never_delayed_by_a_later_start(limits, later):
    cfg = EngineConfig(aging_s=50.0, default_runtime_s=3000.0, preemption=False)
    s = TesseraScheduler(_cluster(), config=cfg)
    for i, lim in enumerate(limits):
        s.submit(JobRequest(f"run{i}", "nlp", "training", 3, time_limit_s=lim))
    s.decide(0.0)
    s.submit(JobRequest("big", "vision", "batch", 8, replicas=2, submitted_at=0.0))
    s.decide(100.0)  # big is aged: it gets a reservation
    reservations = [r for r in s.last_reservations if r.job_id == "big"]
    assert reservations, "the aged job got no reservation"
    res = reservations[0]
    for k, (g, lim) in enumerate(later):
        s.submit(JobRequest(f"late{k}", "speech", "batch", g, time_limit_s=lim, submitted_at=101.0 + k))
    limits_by_id = {f"late{k}": lim for k, (_g, lim) in enumerate(later)}
    d = s.decide(101.0)
    for b in d.bindings:
        if b.job_id == "big":
            continue
        job_limit = limits_by_id[b.job_id]
        on_reserved = {p.node for p in b.placements} & {s.nodes[i].name for i in res.nodes}
        if on_reserved:  # it may only use a reserved node if it is sure to be gone in time
            assert job_limit is not None and 101.0 + job_limit <= res.start


def test_a_cpu_only_reservation_holds_the_nodes_cpus_not_its_gpus():
    """Three CPU-only jobs (no time limits) run on a node of 4 CPUs; a waiting 4-CPU job holds the
    node's CPUs for when they end. A GPU job that takes no CPU starts there at once, however long
    it runs; one that would take a CPU the reserved job needs waits for it."""
    cfg = EngineConfig(default_runtime_s=4 * 3600.0)
    s = TesseraScheduler([node("n0", gpus=2, nvlink=2, cpus=4, memory_gib=64)], config=cfg)
    for i in range(3):
        s.submit(JobRequest(f"cpu{i}", "nlp", "batch", 0, cpus=1, submitted_at=0.0))
    assert len(s.decide(0.0).bindings) == 3
    s.submit(JobRequest("wide", "nlp", "batch", 0, cpus=4, submitted_at=1.0))
    assert s.decide(1.0).pending["wide"].code == "reserved"
    s.submit(JobRequest("takes-cpu", "vision", "batch", 1, cpus=1, submitted_at=2.0))
    s.submit(JobRequest("gpu-only", "vision", "batch", 1, submitted_at=3.0))
    d = s.decide(4.0)
    assert [b.job_id for b in d.bindings] == ["gpu-only"]
    assert d.pending["takes-cpu"].code == "reserved"
    assert d.pending["wide"].code == "reserved"
    assert d.pending["wide"].estimated_start == 4 * 3600.0


def _full(s: TesseraScheduler, limits: list[float]) -> None:
    """Every node of :func:`_cluster` held by one job of its 4 GPUs, ending at ``limits``."""
    for i, lim in enumerate(limits):
        s.submit(JobRequest(f"run{i}", "nlp", "training", 4, time_limit_s=lim))
    assert len(s.decide(0.0).bindings) == len(limits)


def test_a_blocked_job_holds_one_reservation_and_leaves_the_others_theirs():
    # big is reserved pass after pass; with its copies kept it filled both slots and big2,
    # aged too, never got one
    s = TesseraScheduler(_cluster(), config=EngineConfig(aging_s=100.0, max_reservations=2, preemption=False))
    _full(s, [1000.0, 1000.0, 2000.0, 2000.0])
    s.submit(JobRequest("big", "vision", "batch", 8, replicas=2, submitted_at=0.0))
    s.submit(JobRequest("big2", "speech", "batch", 8, replicas=2, submitted_at=300.0))
    for t in (200.0, 300.0, 400.0, 500.0):
        d = s.decide(t)
    assert [r.job_id for r in s.last_reservations].count("big") == 1
    assert d.pending["big"].estimated_start == 1000.0
    assert d.pending["big2"].code == "reserved"
    assert d.pending["big2"].estimated_start == 2000.0


def test_far_off_sticky_nodes_are_given_up_for_nodes_freeing_far_sooner():
    # big's nodes (n0, n1) were to free at 1000; their holders have no time limit and run past
    # their estimate, so each pass expects them to run as long again: the start recedes. n2
    # and n3 free at 2500: a fresh search halves the wait, and big moves there.
    cfg = EngineConfig(aging_s=100.0, default_runtime_s=1000.0, preemption=False)
    s = TesseraScheduler(_cluster(), config=cfg)
    for i in range(2):
        s.submit(JobRequest(f"open{i}", "nlp", "training", 4, node_selector=(("rack", "r0"),)))
        s.submit(
            JobRequest(f"late{i}", "nlp", "training", 4, time_limit_s=2500.0, node_selector=(("rack", "r1"),))
        )
    s.decide(0.0)
    s.submit(JobRequest("big", "vision", "batch", 8, replicas=2, submitted_at=0.0))
    s.decide(200.0)
    (first,) = [r for r in s.last_reservations if r.job_id == "big"]
    assert {s.nodes[i].name for i in first.nodes} == {"n0", "n1"}
    d = s.decide(1500.0)  # open0/1 now expected to run to 3000: n0/n1 free then
    assert d.pending["big"].estimated_start == 3000.0  # n2/n3 at 2500 would not halve 1,500 s
    d = s.decide(2400.0)  # expected at 4800 on n0/n1 now: n2/n3 (2500) are far sooner
    (moved,) = [r for r in s.last_reservations if r.job_id == "big"]
    assert {s.nodes[i].name for i in moved.nodes} == {"n2", "n3"}
    assert d.pending["big"].estimated_start == 2500.0
