"""Bounded waits and little lost work: reservations shaped like the gang, preemption that honours
reservations and keeps the room it frees, checkpoint-aware reclaim, the starvation bound."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.engine.config import EngineConfig
from scheduling.engine.policy import TesseraScheduler
from scheduling.engine.types import JobRequest, QuotaSpec
from tests.engine.engine_cases import node


def _racks(n_racks: int = 2, per_rack: int = 2, gpus: int = 4):
    return [
        node(f"r{r}n{i}", gpus=gpus, nvlink=gpus, rack=f"r{r}")
        for r in range(n_racks)
        for i in range(per_rack)
    ]


def _fill(s: TesseraScheduler, now: float = 0.0, **kw) -> None:
    """One job per node, each the node's size; ``kw`` per job id (``limits``, ``submitted``)."""
    limits = kw.get("limits", {})
    for i, n in enumerate(s.nodes):
        s.submit(
            JobRequest(
                f"f{i}",
                "nlp",
                kw.get("kind", "batch"),
                float(n.gpus),
                time_limit_s=limits.get(i),
                checkpoint_s=kw.get("checkpoint_s"),
                submitted_at=kw.get("submitted", now),
            )
        )
    assert len(s.decide(now).bindings) == len(s.nodes)


def test_a_rack_gangs_reservation_lies_in_one_rack_and_a_node_gangs_on_one_node():
    cfg = EngineConfig(aging_s=10.0, preemption=False)
    s = TesseraScheduler(_racks(), config=cfg)
    # the two earliest-ending nodes are in different racks: a rack gang cannot use both
    _fill(s, limits={0: 100.0, 1: 900.0, 2: 200.0, 3: 800.0})
    s.submit(JobRequest("gang", "vision", "training", 8, replicas=2, topology="rack"))
    s.submit(JobRequest("pair", "vision", "training", 4, replicas=2, topology="node"))
    d = s.decide(20.0)
    res = {r.job_id: r for r in s.last_reservations}
    racks = {s.nodes[i].rack for i in res["gang"].nodes}
    assert len(res["gang"].nodes) == 2 and len(racks) == 1
    assert d.pending["gang"].estimated_start == 800.0  # rack r1: its nodes free at 200 and 800
    assert len(res["pair"].nodes) == 1  # the whole job on one node


def test_a_preemption_for_a_rack_gang_frees_room_in_one_rack():
    s = TesseraScheduler(_racks())
    _fill(s, checkpoint_s=600.0)
    rack_of = {jid: s.nodes[a[0].node].rack for jid, a in s.state.allocs.items()}
    by_rack = {r: sorted(j for j in rack_of if rack_of[j] == r) for r in ("r0", "r1")}
    # the two cheapest victims (just checkpointed) are one in each rack
    s.checkpoint(by_rack["r0"][0], 990.0)
    s.checkpoint(by_rack["r1"][0], 990.0)
    s.checkpoint(by_rack["r1"][1], 100.0)
    s.submit(
        JobRequest(
            "serve",
            "vision",
            "inference",
            8,
            replicas=2,
            topology="rack",
            preemptible=False,
            submitted_at=900.0,
        )
    )
    d = s.decide(1000.0)
    victims = sorted(p.job_id for p in d.preemptions)
    assert len(victims) == 2
    assert len({rack_of[v] for v in victims}) == 1
    for v in victims:
        s.release(v, 1030.0)
    assert [b.job_id for b in s.decide(1030.0).bindings] == ["serve"]


def test_the_room_a_preemption_frees_is_held_for_the_job_it_was_made_for():
    s = TesseraScheduler([node("a", gpus=4, nvlink=4), node("b", gpus=4, nvlink=4)])
    _fill(s)
    s.submit(JobRequest("serve", "vision", "inference", 4, preemptible=False, submitted_at=990))
    d = s.decide(1000.0)
    [victim] = [p.job_id for p in d.preemptions]
    # a job ahead of it in the queue arrives while the victim is in its grace period
    s.submit(
        JobRequest("urgent", "speech", "inference", 4, priority=200, preemptible=False, submitted_at=1001)
    )
    s.decide(1001.0)
    s.release(victim, 1030.0)
    d = s.decide(1030.0)
    assert "serve" in [b.job_id for b in d.bindings]
    assert "urgent" not in [b.job_id for b in d.bindings]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    limits=st.lists(st.sampled_from([600.0, 2000.0, 5000.0]), min_size=4, max_size=4),
    later=st.lists(
        st.tuples(st.sampled_from([1, 2, 4]), st.sampled_from(["inference", "batch"])), min_size=1, max_size=6
    ),
)
def test_a_reservation_is_never_delayed_by_a_preemption_driven_start(limits, later):
    cfg = EngineConfig(aging_s=50.0, preempt_min_run_s=0.0)
    s = TesseraScheduler([node(f"n{i}", gpus=4, nvlink=4, rack=f"r{i // 2}") for i in range(4)], config=cfg)
    _fill(s, limits=dict(enumerate(limits)))
    s.submit(JobRequest("big", "vision", "training", 8, replicas=2))
    s.decide(100.0)  # big is aged: it gets a reservation
    [res] = [r for r in s.last_reservations if r.job_id == "big"]
    reserved = {s.nodes[i].name for i in res.nodes}
    for k, (g, kind) in enumerate(later):
        s.submit(
            JobRequest(
                f"late{k}", "speech", kind, float(g), preemptible=kind != "inference", submitted_at=101.0 + k
            )
        )
    now = 101.0
    for _ in range(3):  # decide, let the victims go, decide again
        d = s.decide(now)
        for b in d.bindings:
            if b.job_id != "big":  # no time limit: it may not start on a reserved node at all
                assert not {p.node for p in b.placements} & reserved
        for p in d.preemptions:
            assert p.for_job == "big" or not (
                {s.nodes[a.node].name for a in s.state.allocs.get(p.job_id, ())} & reserved
            )
            s.release(p.job_id, now + 30)
        now += 30.0


def test_reclaim_waits_for_the_borrowers_checkpoint_and_spares_one_about_to_end():
    quotas = [QuotaSpec("vision", "H100", 8, 8), QuotaSpec("nlp", "H100", 0, 8)]
    s = TesseraScheduler([node("a")], quotas)
    s.submit(JobRequest("borrow", "nlp", "training", 8, checkpoint_s=3600.0))
    assert s.decide(0.0).bindings
    s.submit(JobRequest("own", "vision", "training", 8, submitted_at=10))
    assert not s.decide(2500.0).preemptions  # its work since the start (2500 s) would be lost
    s.checkpoint("borrow", 3600.0)
    d = s.decide(3700.0)  # just checkpointed: a reclaim now loses 100 s
    assert [p.job_id for p in d.preemptions] == ["borrow"]

    s = TesseraScheduler([node("a")], quotas)
    s.submit(JobRequest("ending", "nlp", "training", 8, time_limit_s=6000.0))
    s.decide(0.0)
    s.submit(JobRequest("own", "vision", "training", 8, submitted_at=10))
    assert not s.decide(3000.0).preemptions  # its limit ends it within the hour: wait for it


def test_a_starving_gang_preempts_younger_jobs_only_and_starts():
    # without backfill the gang holds no nodes, so a younger job can start ahead of it
    cfg = EngineConfig(starve_s=3600.0, aging_s=600.0, backfill=False)
    s = TesseraScheduler(_racks(1, 2), config=cfg)
    s.submit(JobRequest("old", "nlp", "batch", 4, time_limit_s=10 * 3600.0, submitted_at=0.0))
    s.decide(0.0)
    s.submit(JobRequest("gang", "vision", "training", 8, replicas=2, submitted_at=10.0))
    s.submit(JobRequest("young", "speech", "batch", 4, time_limit_s=10 * 3600.0, submitted_at=20.0))
    s.decide(20.0)
    assert "young" in s.running and "gang" in s.pending
    assert not s.decide(3000.0).preemptions  # not starving yet: same level, no preemption
    d = s.decide(3700.0)
    # "old" was submitted before the gang: seniority never preempts it, so there is no room
    assert not d.preemptions
    s.release("old", 4000.0)
    d = s.decide(4000.0)
    assert [p.job_id for p in d.preemptions] == ["young"]
    assert d.preemptions[0].reason.startswith("seniority:")
    s.release("young", 4030.0)
    assert [b.job_id for b in s.decide(4030.0).bindings] == ["gang"]


def test_borrowing_is_refused_only_for_owners_jobs_the_free_capacity_could_start():
    quotas = [QuotaSpec("vision", "H100", 24, 24), QuotaSpec("nlp", "H100", 0, 16)]
    # (no reservations here: only the quota rule is looked at)
    s = TesseraScheduler([node("a"), node("b")], quotas, EngineConfig(backfill=False))
    s.submit(JobRequest("v1", "vision", "batch", 4))
    s.decide(0.0)
    # vision waits, within its guarantee, with a gang the 12 free GPUs cannot start: that does
    # not hold the model idle, nlp borrows meanwhile
    s.submit(JobRequest("vgang", "vision", "training", 16, replicas=2, submitted_at=1))
    s.submit(JobRequest("n1", "nlp", "batch", 4, submitted_at=2))
    d = s.decide(10.0)
    assert [b.job_id for b in d.bindings] == ["n1"]
    # a vision job that the free capacity could start makes H100 owed: nlp may not borrow it,
    # even though its training job comes first in the queue
    s.submit(JobRequest("v2", "vision", "batch", 4, submitted_at=11))
    s.submit(JobRequest("n2", "nlp", "training", 4, submitted_at=12))
    d = s.decide(20.0)
    assert [b.job_id for b in d.bindings] == ["v2"]
    assert d.pending["n2"].code == "borrow-limit" and "vision" in d.pending["n2"].message


def test_a_gang_that_has_waited_long_starts_by_its_reservations_estimate():
    cfg = EngineConfig(aging_s=100.0, preemption=False)
    s = TesseraScheduler(_racks(1, 2), config=cfg)
    _fill(s, limits={0: 1000.0, 1: 1500.0})
    s.submit(JobRequest("gang", "vision", "training", 8, replicas=2, submitted_at=10.0))
    d = s.decide(200.0)
    estimate = d.pending["gang"].estimated_start
    assert estimate == 1500.0
    for k, t in enumerate((400.0, 1000.0, 1200.0)):  # jobs keep arriving; the holders leave by their limits
        if t >= 1000.0 and "f0" in s.running:
            s.release("f0", t)
        s.submit(JobRequest(f"late{k}", "speech", "batch", 4, time_limit_s=600.0, submitted_at=t))
        s.submit(JobRequest(f"long{k}", "speech", "batch", 4, time_limit_s=9000.0, submitted_at=t))
        for b in s.decide(t).bindings:  # only what is gone by the estimate may backfill
            assert b.job_id.startswith("late") and t + 600.0 <= estimate
    s.release("f1", estimate)
    for jid in [j for j in s.running if j.startswith("late")]:
        s.release(jid, estimate)
    assert "gang" in [b.job_id for b in s.decide(estimate).bindings]


def test_on_a_starving_jobs_nodes_only_what_it_could_preempt_or_a_hard_limit_backfills():
    cfg = EngineConfig(aging_s=10.0, starve_s=50.0)
    s = TesseraScheduler(_racks(1, 2), config=cfg)
    s.submit(JobRequest("old", "vision", "training", 4, preemptible=False, time_limit_s=1000.0))
    s.submit(JobRequest("svc0", "speech", "inference", 4, preemptible=False))
    assert len(s.decide(0.0).bindings) == 2
    s.release("svc0", 100.0)  # speech's services are predicted to run 100 s
    s.submit(JobRequest("gang", "vision", "training", 8, replicas=2, submitted_at=1.0))
    d = s.decide(150.0)
    assert d.pending["gang"].estimated_start == 1000.0  # it cannot preempt "old"
    # a service predicted to end in time could still overstay, and nothing could remove it:
    # only one whose hard limit ends it by then backfills the starving gang's node
    s.submit(JobRequest("svc1", "speech", "inference", 4, preemptible=False, submitted_at=160.0))
    s.submit(
        JobRequest(
            "svc2", "speech", "inference", 4, preemptible=False, time_limit_s=300.0, submitted_at=160.0
        )
    )
    assert [b.job_id for b in s.decide(160.0).bindings] == ["svc2"]


def test_non_preemptible_work_keeps_off_the_racks_a_rack_gang_could_use():
    # racks r0-r2 hold 8 GPUs each (a rack gang of 8 fits), rack r3 only 4
    s = TesseraScheduler(_racks(3, 2) + [node("small", gpus=4, nvlink=4, rack="r3")])
    s.submit(JobRequest("gang", "vision", "training", 8, replicas=2, topology="rack", held=True))

    def start(jid: str, t: float) -> str:
        s.submit(JobRequest(jid, "speech", "inference", 4, preemptible=False, submitted_at=t))
        [b] = s.decide(t).bindings
        return s.nodes[s.state.by_name[b.placements[0].node]].rack

    assert start("svc1", 1.0) == "r3"  # a rack too small for the gang first
    dirty = start("svc2", 2.0)  # then one rack gives up being clear ...
    assert start("svc3", 3.0) == dirty  # ... and the next service goes there too
    # the two other racks stay clear for the gang
    assert len({s.nodes[a.node].rack for allocs in s.state.allocs.values() for a in allocs}) == 2


def test_a_starving_gang_preempts_an_older_job_only_once_it_has_run_starve_s():
    # served seniority: a job submitted before the gang but running for starve_s has had its
    # turn; one that started starving is never taken back for seniority (no loop)
    cfg = EngineConfig(starve_s=3600.0, aging_s=600.0, backfill=False)
    s = TesseraScheduler(_racks(1, 2), config=cfg)
    old = JobRequest(
        "old", "nlp", "training", 4, time_limit_s=10 * 3600.0, checkpoint_s=600.0, submitted_at=0.0
    )
    s.submit(old)
    assert len(s.decide(500.0).bindings) == 1
    s.submit(JobRequest("gang", "vision", "training", 8, replicas=2, submitted_at=10.0))
    assert not s.decide(3700.0).preemptions  # starving, but "old" has run 3200 s only
    s.checkpoint("old", 4000.0)  # (preempted within the window after a checkpoint: see below)
    d = s.decide(4100.0)
    assert [p.job_id for p in d.preemptions] == ["old"]
    assert d.preemptions[0].reason.startswith("seniority:")
    s.release("old", 4130.0)
    s.requeue(old)
    assert [b.job_id for b in s.decide(4130.0).bindings] == ["gang"]
    # "old" is older and starving now, but the gang started starving: it is not taken back
    d = s.decide(5000.0)
    assert not d.preemptions and "old" in s.pending


def _quota_world(cfg: EngineConfig) -> TesseraScheduler:
    quotas = [QuotaSpec("research", "H100", 0, 8), QuotaSpec("nlp", "H100", 0, 100)]
    s = TesseraScheduler(_racks(1, 3), quotas, cfg)
    for n in ("n1", "n2"):
        s.submit(JobRequest(n, "nlp", "training", 4, time_limit_s=36000.0))
    return s


def test_an_aged_job_that_waits_for_nodes_keeps_its_quota_from_its_tenants_later_jobs():
    s = _quota_world(EngineConfig(aging_s=600.0, starve_s=0.0, backfill=False, preemption=False))
    assert len(s.decide(0.0).bindings) == 2
    s.submit(JobRequest("gang", "research", "training", 8, replicas=2, submitted_at=10.0))
    s.submit(JobRequest("small", "research", "batch", 4, submitted_at=690.0))
    d = s.decide(700.0)  # the gang's quota admits it, the free node does not hold it
    assert not d.bindings and d.pending["small"].code == "quota"
    s.release("n1", 800.0)
    assert [b.job_id for b in s.decide(800.0).bindings] == ["gang"]


def test_a_starving_gang_preempts_a_checkpointing_job_just_after_its_checkpoint():
    # young checkpoints every 1,800 s: preempted long after its last checkpoint it would lose up
    # to that much of its work. The starving gang waits for its next checkpoint (within the
    # reclaim window after it), or, if none comes, one interval past the starvation bound.
    cfg = EngineConfig(starve_s=3600.0, aging_s=600.0, backfill=False, reclaim_checkpoint_window_s=300.0)

    def world() -> TesseraScheduler:
        s = TesseraScheduler(_racks(1, 2), config=cfg)
        s.submit(JobRequest("old", "nlp", "batch", 4, time_limit_s=10 * 3600.0, submitted_at=0.0))
        s.decide(0.0)
        s.submit(JobRequest("gang", "vision", "training", 8, replicas=2, submitted_at=10.0))
        young = JobRequest("young", "speech", "batch", 4, submitted_at=20.0, checkpoint_s=1800.0)
        s.submit(young)
        s.decide(20.0)
        s.release("old", 3000.0)
        return s

    s = world()
    s.checkpoint("young", 1820.0)
    assert not s.decide(3700.0).preemptions  # starving, but young's checkpoint is 1,880 s old
    s.checkpoint("young", 3620.0)
    assert [p.job_id for p in s.decide(3710.0).preemptions] == ["young"]  # 90 s of work lost

    s = world()  # young never reports a checkpoint: preempted once the interval is over
    assert not s.decide(5000.0).preemptions
    assert [p.job_id for p in s.decide(5420.0).preemptions] == ["young"]
