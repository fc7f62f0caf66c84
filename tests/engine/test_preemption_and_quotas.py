"""Preemption, reclaim, elastic shrink and quota borrowing, on small literal clusters."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from scheduling.engine.config import EngineConfig
from scheduling.engine.policy import TesseraScheduler
from scheduling.engine.types import JobRequest, QuotaSpec
from tests.engine.engine_cases import clusters, jobs, node


def _full(s: TesseraScheduler, now: float = 0.0, **kw) -> None:
    for i, n in enumerate(s.nodes):
        s.submit(
            JobRequest(
                f"fill{i}",
                kw.get("tenant", "nlp"),
                kw.get("kind", "batch"),
                float(n.gpus),
                preemptible=kw.get("preemptible", True),
                submitted_at=now,
            )
        )
    d = s.decide(now)
    assert len(d.bindings) == len(s.nodes)


def test_inference_preempts_the_batch_job_that_loses_the_least_work():
    s = TesseraScheduler([node("a", gpus=4, nvlink=4), node("b", gpus=4, nvlink=4)])
    _full(s)
    s.checkpoint("fill1", 900.0)  # fill1 checkpointed recently: it loses less
    s.submit(JobRequest("serve", "vision", "inference", 4, preemptible=False, submitted_at=950))
    d = s.decide(1000.0)
    assert [p.job_id for p in d.preemptions] == ["fill1"]
    assert d.pending["serve"].code == "reserved"
    assert not d.bindings  # the victim keeps its GPUs through its grace period
    d = s.decide(1001.0)
    assert not d.preemptions  # no second victim while the first is terminating
    s.release("fill1", 1030.0)
    d = s.decide(1030.0)
    assert [b.job_id for b in d.bindings] == ["serve"]


def test_a_non_preemptible_job_is_never_a_victim_and_min_run_time_protects_new_jobs():
    s = TesseraScheduler([node("a", gpus=4, nvlink=4)])
    _full(s, preemptible=False)
    s.submit(JobRequest("serve", "vision", "inference", 4, preemptible=False, submitted_at=1))
    d = s.decide(5000.0)
    assert not d.preemptions
    s2 = TesseraScheduler([node("a", gpus=4, nvlink=4)], config=EngineConfig(preempt_min_run_s=600))
    _full(s2)
    s2.submit(JobRequest("serve", "vision", "inference", 4, preemptible=False, submitted_at=1))
    assert not s2.decide(100.0).preemptions
    assert s2.decide(700.0).preemptions


def test_borrowed_capacity_is_reclaimed_for_its_owner_and_not_taken_back():
    quotas = [QuotaSpec("vision", "H100", 8, 8), QuotaSpec("nlp", "H100", 0, 8)]
    s = TesseraScheduler([node("a")], quotas)
    s.submit(JobRequest("borrow", "nlp", "training", 8))
    assert s.decide(0.0).bindings  # nlp borrows vision's idle guarantee
    s.submit(JobRequest("own", "vision", "training", 8, submitted_at=10))
    assert not s.decide(1000.0).preemptions  # reclaim waits reclaim_after_s (capacity may free)
    d = s.decide(2000.0)
    assert [p.job_id for p in d.preemptions] == ["borrow"]
    assert d.preemptions[0].reason.startswith("reclaim:")
    s.release("borrow", 2030.0)
    s.requeue(JobRequest("borrow", "nlp", "training", 8))
    d = s.decide(2030.0)
    assert [b.job_id for b in d.bindings] == ["own"]
    d = s.decide(5000.0)  # vision is within its guarantee: nlp cannot reclaim it back
    assert not d.preemptions
    assert d.pending["borrow"].code in ("capacity", "fragmentation", "reserved")


def test_a_non_preemptible_job_may_not_borrow_and_one_above_the_guarantee_is_refused():
    s = TesseraScheduler([node("a")], [QuotaSpec("nlp", "*", 4, 8)])
    s.submit(JobRequest("svc", "nlp", "inference", 2, preemptible=False))
    s.decide(0.0)
    s.submit(JobRequest("serve", "nlp", "inference", 4, preemptible=False, submitted_at=1))
    s.submit(JobRequest("huge", "nlp", "inference", 6, preemptible=False, submitted_at=2))
    d = s.decide(0.0)
    assert d.pending["serve"].code == "borrow-limit"
    assert d.pending["serve"].message.startswith(
        "borrow-limit: nlp's non-preemptible jobs use 2 of 4 guaranteed"
    )
    assert "huge" in d.rejections


def test_the_guarantee_goes_to_non_preemptible_jobs_first():
    s = TesseraScheduler([node("a")], [QuotaSpec("nlp", "*", 4, 8)])
    s.submit(JobRequest("batch", "nlp", "batch", 4))
    s.decide(0.0)
    # nlp's batch job fills its guarantee; the service starts at once and the batch job is
    # now the one borrowing (it alone could be reclaimed)
    s.submit(JobRequest("serve", "nlp", "inference", 4, preemptible=False, submitted_at=1))
    d = s.decide(1.0)
    assert [b.job_id for b in d.bindings] == ["serve"] and not d.preemptions
    assert s.quotas.borrowed("nlp", "H100") == 4000


def test_an_elastic_job_starts_with_what_fits_grows_and_shrinks_before_anyone_is_preempted():
    s = TesseraScheduler([node("a", gpus=4, nvlink=4), node("b", gpus=4, nvlink=4)])
    s.submit(JobRequest("other", "nlp", "batch", 4))
    s.decide(0.0)
    s.submit(
        JobRequest(
            "el", "vision", "training", 4, replicas=4, elastic_min_gpus=2, elastic_max_gpus=8, submitted_at=1
        )
    )
    d = s.decide(1.0)
    assert len(d.bindings[0].placements) == 4  # 4 of at most 8 one-GPU replicas fit
    s.release("other", 50.0)
    d = s.decide(50.0)
    assert [len(r.placements) for r in d.resizes] == [8]  # grew into the freed node
    s.submit(JobRequest("serve", "speech", "inference", 4, preemptible=False, submitted_at=60))
    d = s.decide(1000.0)
    assert not d.preemptions and not d.bindings  # shrunk, not preempted: it starts once they exit
    assert d.resizes and len(d.resizes[0].placements) >= 2
    s.release_leaving("el", 1005.0)
    assert [b.job_id for b in s.decide(1005.0).bindings] == ["serve"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=clusters(), workload=jobs())
def test_releasing_every_job_restores_every_nodes_buddy_lists_exactly(nodes, workload):
    s = TesseraScheduler(nodes)
    before = [[isl.blocks() for isl in n.islands] for n in s.state.nodes]
    for j in workload:
        s.submit(j)
    s.decide(0.0)
    s.decide(100.0)
    for jid in sorted(s.running):
        s.release(jid, 200.0)
    assert [[isl.blocks() for isl in n.islands] for n in s.state.nodes] == before
    assert all(v == 1000 for n in s.state.nodes for v in n.free)
    assert s.state.total_free == sum(1000 * n.gpus for n in nodes if n.schedulable)


def test_inference_makes_quota_room_by_preempting_its_own_tenants_batch_work():
    s = TesseraScheduler([node("a"), node("b")], [QuotaSpec("prod", "H100", 8, 12)])
    s.submit(JobRequest("b1", "prod", "batch", 8))
    s.submit(JobRequest("b2", "prod", "batch", 4, submitted_at=1))
    s.decide(0.0)
    s.submit(JobRequest("serve", "prod", "inference", 8, preemptible=False, submitted_at=2))
    d = s.decide(1000.0)
    # prod must drop to 4 of its 12 limit: b2 alone (4) is not enough, b1 alone (8) is
    assert [p.job_id for p in d.preemptions] == ["b1"]
    assert d.pending["serve"].code == "reserved"
    assert not s.decide(1001.0).preemptions  # b1 is on its way out: nothing more is taken
    s.release("b1", 1030.0)
    assert [b.job_id for b in s.decide(1030.0).bindings] == ["serve"]


def test_while_inference_waits_for_quota_room_its_tenants_later_jobs_do_not_take_it():
    s = TesseraScheduler([node("a"), node("b")], [QuotaSpec("prod", "H100", 8, 12)])
    s.submit(JobRequest("b1", "prod", "batch", 8))
    s.submit(JobRequest("b2", "prod", "batch", 4, submitted_at=1))
    s.decide(0.0)
    s.submit(JobRequest("serve", "prod", "inference", 8, preemptible=False, submitted_at=2))
    assert [p.job_id for p in s.decide(1000.0).preemptions] == ["b1"]
    # 4 GPUs are free and prod is under its limit, but b3 would only be the next victim
    s.submit(JobRequest("b3", "prod", "batch", 4, submitted_at=1001))
    d = s.decide(1001.0)
    assert not d.bindings
    assert d.pending["b3"].code == "quota" and "serve" in d.pending["b3"].message
    s.release("b1", 1030.0)
    d = s.decide(1030.0)
    assert "serve" in [b.job_id for b in d.bindings]
    assert not d.preemptions
    assert s.quotas.used("prod", "H100") <= 12 * 1000


def test_quota_room_comes_from_victims_with_the_shortest_grace_period():
    s = TesseraScheduler([node("a"), node("b")], [QuotaSpec("prod", "H100", 8, 8)])
    s.submit(JobRequest("t1", "prod", "training", 4, grace_s=120.0))
    s.submit(JobRequest("b1", "prod", "batch", 4, grace_s=30.0, submitted_at=1))
    s.decide(0.0)
    s.checkpoint("t1", 990.0)  # t1 would lose the least work, but serve would wait 120 s for it
    s.submit(JobRequest("serve", "prod", "inference", 4, preemptible=False, submitted_at=3))
    d = s.decide(1000.0)
    assert [p.job_id for p in d.preemptions] == ["b1"]
    assert d.pending["serve"].estimated_start == 1030.0


def test_training_does_not_preempt_batch_for_priority_by_default():
    s = TesseraScheduler([node("a", gpus=4, nvlink=4)])
    _full(s)
    s.submit(JobRequest("train", "vision", "training", 4, priority=9, submitted_at=1))
    assert not s.decide(5000.0).preemptions


def test_a_job_refused_a_model_owed_to_another_tenant_starts_there_once_it_is_no_longer_owed():
    s = TesseraScheduler(
        [
            node("h", gpus=1, nvlink=1, cpus=0),
            node("t1", model="T4", gpus=1, nvlink=1, cpus=0),
            node("t2", model="T4", gpus=1, nvlink=1, cpus=0, rack="r1"),
        ],
        [QuotaSpec("vision", "*", 1, 2), QuotaSpec("speech", "*", 1, 1)],
    )
    s.submit(JobRequest("serve", "vision", "inference", 1, preemptible=False))
    s.submit(
        JobRequest("asr", "speech", "inference", 1, accelerators=("T4",), preemptible=False, submitted_at=1)
    )
    s.submit(JobRequest("small", "vision", "training", 0.25, submitted_at=2))
    s.submit(JobRequest("big", "vision", "training", 1, submitted_at=3))
    d = s.decide(0.0)
    assert {b.job_id for b in d.bindings} == {"serve", "asr"}  # T4 was owed to speech
    d = s.decide(500.0)  # speech runs now: nothing is owed, a T4 is free
    assert [b.job_id for b in d.bindings] == ["small"]
    assert d.pending["big"].code == "quota"


def test_a_shrunk_jobs_leaving_replicas_stay_on_its_tenants_quota_until_they_exit():
    s = TesseraScheduler(
        [node("a", gpus=4, nvlink=4), node("b", "T4", gpus=4, nvlink=4)],
        [QuotaSpec("vision", "*", 4, 4), QuotaSpec("speech", "*", 4, 4)],
    )
    el = JobRequest(
        "el",
        "vision",
        "training",
        4,
        replicas=4,
        elastic_min_gpus=2,
        elastic_max_gpus=4,
        accelerators=("H100",),
    )
    s.submit(el)
    assert len(s.decide(0.0).bindings[0].placements) == 4  # vision at its limit of 4
    s.submit(JobRequest("more", "vision", "batch", 1, accelerators=("T4",), submitted_at=1))
    assert not s.decide(1.0).bindings  # over vision's limit
    s.submit(
        JobRequest(
            "serve", "speech", "inference", 2, accelerators=("H100",), preemptible=False, submitted_at=2
        )
    )
    d = s.decide(1000.0)
    assert [len(r.placements) for r in d.resizes] == [2]  # el shrunk; its 2 removed replicas still run
    # el's 2 leaving replicas still hold their H100s: vision is still at its limit
    assert not d.bindings
    assert s.quotas.used("vision", "T4") == 4000
    s.release_leaving("el", 1030.0)
    assert s.quotas.used("vision", "T4") == 2000
    assert sorted(b.job_id for b in s.decide(1030.0).bindings) == ["more", "serve"]


def test_a_pass_from_a_snapshot_charges_the_leaving_replicas_to_their_tenants_quota():
    from scheduling.engine.types import Placement, RunningJob, Snapshot

    el = JobRequest("el", "vision", "training", 2, replicas=2, elastic_min_gpus=2, elastic_max_gpus=4)
    leaving = (Placement(2, "a", (2,)), Placement(3, "a", (3,)))
    running = RunningJob(
        el, (Placement(0, "a", (0,)), Placement(1, "a", (1,))), 0.0, leaving=leaving, leaving_until=60
    )
    more = JobRequest("more", "vision", "batch", 1, accelerators=("T4",), submitted_at=1)
    snapshot = Snapshot(
        now=10.0,
        nodes=(node("a", gpus=4, nvlink=4), node("b", "T4", gpus=4, nvlink=4)),
        quotas=(QuotaSpec("vision", "*", 4, 4),),
        pending=(more,),
        running=(running,),
    )
    s = TesseraScheduler.from_snapshot(snapshot)
    assert s.quotas.used("vision", "H100") == 4000  # 2 running, 2 leaving: vision at its limit
    assert not s.decide(10.0).bindings
    s.release_leaving("el", 40.0)
    assert [b.job_id for b in s.decide(40.0).bindings] == ["more"]
