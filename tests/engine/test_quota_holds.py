"""A quota row held for an aged job its quota refuses keeps off only the later jobs that would
delay it: not its tenant's borrowers when it waits on the guarantee, and not a job expected to end
before the row frees for it (backfill within the quota)."""

from __future__ import annotations

from dataclasses import replace

from scheduling.engine.config import EngineConfig
from scheduling.engine.policy import TesseraScheduler
from scheduling.engine.types import JobRequest, QuotaSpec
from tests.engine.engine_cases import node

QUOTAS = [QuotaSpec("vision", "*", guaranteed=4, limit=8)]


def steady(job_id: str, gpus: float, at: float, limit_s: float) -> JobRequest:
    return JobRequest(
        job_id, "vision", "training", gpus, preemptible=False, submitted_at=at, time_limit_s=limit_s
    )


def world() -> TesseraScheduler:
    """vision's steady job s1 holds 2 of its 4 guaranteed GPUs until t=3600; big (4, steady) waits
    for the guarantee and has aged by t=100. Two nodes: room on nodes is not what big waits for."""
    nodes = [node("a", gpus=8, nvlink=8), node("b", gpus=8, nvlink=8)]
    s = TesseraScheduler(nodes, QUOTAS, EngineConfig(aging_s=60))
    s.submit(steady("s1", 2, 0, 3600))
    assert [b.job_id for b in s.decide(0.0).bindings] == ["s1"]
    s.submit(steady("big", 4, 1, 3600))
    assert s.decide(1.0).pending["big"].code == "borrow-limit"
    return s


def started(s: TesseraScheduler, *jobs: JobRequest) -> dict[str, str]:
    for j in jobs:
        s.submit(j)
    d = s.decide(100.0)
    return {
        j.id: "started" if any(b.job_id == j.id for b in d.bindings) else d.pending[j.id].message
        for j in jobs
    }


def test_a_borrower_is_not_kept_off_by_a_steady_job_waiting_on_the_guarantee():
    # it runs past big's start, so not on big's reserved nodes: it goes to the others
    spot = JobRequest("spot", "vision", "batch", 2, preemptible=True, submitted_at=50, time_limit_s=7200)
    assert started(world(), spot) == {"spot": "started"}


def test_a_steady_job_ending_before_the_row_frees_backfills_and_a_longer_one_waits():
    assert started(world(), steady("short", 1, 50, 600)) == {"short": "started"}
    got = started(world(), steady("long", 1, 50, 7200))
    assert got["long"] == "quota: vision's quota is held for its job big, which has waited longest"


def test_the_nodes_reserved_for_it_are_backfilled_until_its_quota_frees():
    quotas = [*QUOTAS, QuotaSpec("nlp", "*", guaranteed=4, limit=8)]
    s = TesseraScheduler([node("a", gpus=8, nvlink=8)], quotas, EngineConfig(aging_s=60))
    s.submit(steady("s1", 2, 0, 3600))
    s.decide(0.0)
    s.submit(steady("big", 4, 1, 3600))
    s.decide(1.0)
    quick = JobRequest("quick", "nlp", "batch", 4, submitted_at=50, time_limit_s=1800)
    assert started(s, quick) == {"quick": "started"}  # gone by t=3600, when big's quota frees


def test_later_jobs_run_on_what_the_row_frees_beyond_its_need_and_no_more():
    # guarantee 8, 5 used: s1 (2) ends at 3600, the others much later; big (4) waits for 1 more,
    # and at 3600 the row frees 2: one GPU beyond big's need, which one long job may keep
    # (though the guarantee has room for two now), but not two.
    s = TesseraScheduler(
        [node("a", gpus=8, nvlink=8), node("b", gpus=8, nvlink=8)],
        [QuotaSpec("vision", "*", guaranteed=8, limit=16)],
        EngineConfig(aging_s=60),
    )
    for j in (steady("s1", 2, 0, 3600), steady("s2", 2, 0, 20000), steady("s3", 1, 0, 20000)):
        s.submit(j)
    s.decide(0.0)
    s.submit(steady("big", 4, 1, 3600))
    assert s.decide(1.0).pending["big"].code == "borrow-limit"
    got = started(s, steady("long1", 1, 50, 7200), steady("long2", 1, 51, 7200))
    assert got["long1"] == "started"
    assert got["long2"] == "quota: vision's quota is held for its job big, which has waited longest"


def test_no_nodes_are_drained_for_a_job_whose_model_is_owed_to_another_tenant():
    # big has room on vision's row, but H100 above vision's guarantee is owed to speech's job
    # waiting within its guarantee: no running job's end decides when that stops, so nodes
    # drained for big would idle while speech's jobs go on being owed
    s = TesseraScheduler(
        [node("a", gpus=4, nvlink=4, rack="r0"), node("b", gpus=4, nvlink=4, rack="r1")],
        [QuotaSpec("vision", "*", 2, 8), QuotaSpec("speech", "*", 4, 8)],
        EngineConfig(aging_s=0),
    )
    s.submit(JobRequest("base", "vision", "training", 2))
    assert [b.job_id for b in s.decide(0.0).bindings] == ["base"]
    s.submit(JobRequest("asr", "speech", "training", 2, submitted_at=5))
    s.submit(JobRequest("big", "vision", "training", 4, submitted_at=5))
    d = s.decide(10.0)
    assert [b.job_id for b in d.bindings] == ["asr"]
    assert d.pending["big"].code == "borrow-limit"
    assert not s.last_reservations


def test_a_job_its_quota_now_refuses_gives_up_its_reservation():
    # y was reserved while vision's row admitted it; then old, older and aged, holds the row, and
    # y's nodes would sit reserved for a job that may not start (four gangs once deadlocked so)
    nodes = [node(f"n{i}", gpus=4, nvlink=4, rack=f"r{i // 2}") for i in range(4)]
    s = TesseraScheduler(
        nodes, [QuotaSpec("vision", "*", 4, 8), QuotaSpec("nlp", "*", 16, 16)], EngineConfig(aging_s=100)
    )
    for i, lim in enumerate([1000.0, 1000.0, 5000.0]):
        s.submit(JobRequest(f"nlp{i}", "nlp", "training", 4, time_limit_s=lim))
    s.submit(steady("s1", 4, 0, 3600))
    assert len(s.decide(0.0).bindings) == 4
    old = JobRequest("old", "vision", "batch", 8, replicas=2, submitted_at=0, held=True)
    s.submit(old)
    s.submit(JobRequest("y", "vision", "batch", 4, submitted_at=10, time_limit_s=7200))
    assert s.decide(200.0).pending["y"].code == "reserved"
    s.submit(replace(old, held=False))
    d = s.decide(300.0)
    assert d.pending["y"].message == "quota: vision's quota is held for its job old, which has waited longest"
    assert "y" not in {r.job_id for r in s.last_reservations}


def waiting_for_nodes() -> TesseraScheduler:
    """vision (limit 6) runs v1 (2 GPUs, long) on b; nlp's n1 fills a until t=3600. big (4 on one
    node) is admitted by vision's quota (2 + 4 ≤ 6) but no node has 4 free: aged, it reserves a
    from t=3600, and what it needs of vision's quota stays its for the pass."""
    s = TesseraScheduler(
        [node("a", gpus=4, nvlink=4), node("b", gpus=4, nvlink=4)],
        [QuotaSpec("vision", "*", guaranteed=4, limit=6), QuotaSpec("nlp", "*", guaranteed=4, limit=4)],
        EngineConfig(aging_s=60),
    )
    s.submit(JobRequest("n1", "nlp", "training", 4, time_limit_s=3600))
    s.submit(JobRequest("v1", "vision", "training", 2, time_limit_s=20000))
    assert len(s.decide(0.0).bindings) == 2
    s.submit(JobRequest("big", "vision", "training", 4, submitted_at=1, time_limit_s=3600))
    assert s.decide(100.0).pending["big"].code == "reserved"
    return s


def test_a_job_ending_before_an_aged_jobs_reserved_start_takes_the_quota_it_will_use():
    # short ends by t=1,900, before big can start at 3,600: taking big's quota meanwhile delays
    # big nothing (charged outright, it waited on free GPUs for big's whole wait)
    short = JobRequest("short", "vision", "batch", 2, submitted_at=50, time_limit_s=1800)
    assert started(waiting_for_nodes(), short) == {"short": "started"}


def test_a_job_running_past_that_start_waits_for_the_aged_job():
    long = JobRequest("long", "vision", "batch", 2, submitted_at=50, time_limit_s=7200)
    assert started(waiting_for_nodes(), long) == {
        "long": "quota: vision's quota is held for its job big, which has waited longest"
    }


def test_a_starving_jobs_quota_is_backfilled_only_by_jobs_it_could_remove():
    # big starves: on its reserved nodes only jobs it could preempt, or with a hard time limit,
    # backfill on their expected end; its quota is held alike. est and spot are expected to run
    # 600 s (their kinds' history), neither has a time limit; est cannot be preempted.
    s = TesseraScheduler(
        [node("a", gpus=4, nvlink=4), node("b", gpus=4, nvlink=4)],
        [QuotaSpec("vision", "*", guaranteed=4, limit=6), QuotaSpec("nlp", "*", guaranteed=4, limit=4)],
        EngineConfig(aging_s=10, starve_s=50, preemption=False),
    )
    s.submit(JobRequest("n1", "nlp", "training", 4, time_limit_s=3600))
    s.submit(JobRequest("v1", "vision", "training", 2, time_limit_s=20000))
    assert len(s.decide(0.0).bindings) == 2
    for i in range(3):
        s.history.record(JobRequest(f"old{i}", "vision", "batch", 1), 600.0, float(i))
    s.submit(JobRequest("big", "vision", "training", 4, submitted_at=1, time_limit_s=3600))
    assert s.decide(100.0).pending["big"].code == "reserved"
    est = JobRequest("est", "vision", "batch", 2, preemptible=False, submitted_at=90)
    assert started(s, est) == {
        "est": "quota: vision's quota is held for its job big, which has waited longest"
    }
    s.cancel("est")
    spot = JobRequest("spot", "vision", "batch", 2, submitted_at=90)
    assert started(s, spot) == {"spot": "started"}


def test_a_starving_job_is_not_kept_off_by_its_tenants_held_quota():
    # long would keep big's row for longer than big waits, but it has itself waited past the
    # starvation bound: a hold may delay a job, not for ever (a 43-hour job waited 27 hours on
    # free GPUs behind a 64-GPU one)
    s = TesseraScheduler(
        [node("a", gpus=8, nvlink=8), node("b", gpus=8, nvlink=8)],
        QUOTAS,
        EngineConfig(aging_s=60, starve_s=90),
    )
    s.submit(steady("s1", 2, 0, 3600))
    s.decide(0.0)
    s.submit(steady("big", 4, 1, 3600))
    assert s.decide(1.0).pending["big"].code == "borrow-limit"
    assert started(s, steady("long", 1, 5, 7200)) == {"long": "started"}


def test_a_job_that_accepts_another_model_starts_there_not_on_the_held_row():
    # vision's H100 row (guarantee 4, limit 4) runs s1 (2 until t=3600); big (4, H100 only) is
    # refused there and, aged, holds the row (and reserves h1 from t=3600). flex accepts H100 or
    # A100 and runs past t=3600: on h2 it would take 2 of the 4 GPUs big waits for (it did, and
    # big waited until flex ended), so it starts on A100, where nothing is held.
    s = TesseraScheduler(
        [node("h1", "H100"), node("h2", "H100"), node("a", "A100")],
        [QuotaSpec("vision", "H100", 4, 4), QuotaSpec("vision", "A100", 4, 8)],
        EngineConfig(aging_s=60),
    )
    s.submit(replace(steady("s1", 2, 0, 3600), accelerators=("H100",)))
    assert [b.job_id for b in s.decide(0.0).bindings] == ["s1"]
    s.submit(replace(steady("big", 4, 1, 3600), accelerators=("H100",)))
    assert s.decide(1.0).pending["big"].code == "quota"
    flex = replace(steady("flex", 2, 50, 7200), accelerators=("H100", "A100"))
    s.submit(flex)
    d = s.decide(100.0)
    assert [(b.job_id, b.placements[0].node) for b in d.bindings] == [("flex", "a")]
    assert d.pending["big"].message == "quota: vision uses 2 of 4 H100 (limit)"
    # a job that accepts only the held model still waits, as before
    s.submit(replace(steady("only", 2, 60, 7200), accelerators=("H100",)))
    assert s.decide(150.0).pending["only"].code == "quota"


def test_one_aged_job_a_row_claims_it_for_nodes_not_every_one():
    # research's two aged 4-GPU jobs fit nowhere (nlp's service leaves 2 GPUs) and get no
    # reservation; the first claims 4 of research's 8 for the pass, the second nothing more, so
    # research's 2-GPU job starts on the 2 free GPUs (both claiming, the row read "8 of 8" while
    # research used none: on a workload with one scarce model its jobs waited days beside free GPUs)
    quotas = [QuotaSpec("research", "H100", 4, 8), QuotaSpec("nlp", "H100", 8, 8)]
    s = TesseraScheduler([node("a")], quotas, EngineConfig(aging_s=60, max_reservations=0))
    s.submit(JobRequest("serve", "nlp", "inference", 6, preemptible=False, submitted_at=0))
    s.decide(0.0)
    for i in (1, 2):
        s.submit(JobRequest(f"big{i}", "research", "training", 4, submitted_at=i))
    s.submit(JobRequest("small", "research", "training", 2, submitted_at=90, time_limit_s=600))
    assert [b.job_id for b in s.decide(100.0).bindings] == ["small"]


def test_one_aged_job_a_row_keeps_nodes_for_its_quota_to_free():
    # vision's two starving steady jobs wait for s1 (its guarantee) to end at t=36000; only the
    # first keeps a reservation (strict: it starves) for then. Each kept one, and prod's steady
    # fine-tune without a time limit, which may not backfill a strict reservation, waited
    # beside a free node both held (a skew-steady-1.2 job waited 16 h so beside free H100 nodes)
    quotas = [QuotaSpec("vision", "H100", 8, 16), QuotaSpec("prod", "H100", 8, 16)]
    s = TesseraScheduler([node(n) for n in "abc"], quotas, EngineConfig(aging_s=60, starve_s=120))
    s.submit(steady("s1", 8, 0, 36000))
    s.decide(0.0)
    for i in (1, 2):
        s.submit(steady(f"big{i}", 8, i, 3600))
    s.decide(10.0)
    s.submit(JobRequest("p", "prod", "finetune", 8, preemptible=False, submitted_at=900, topology="nvlink"))
    d = s.decide(1000.0)
    assert [b.job_id for b in d.bindings] == ["p"]
    assert [(r.job_id, r.start) for r in s.last_reservations] == [("big1", 36000.0)]
    assert d.pending["big2"].code == "borrow-limit"


def test_aged_jobs_on_one_row_each_keep_nodes_for_when_the_row_holds_them_all():
    # vision's steady jobs s1, s2 hold 16 of its 16 guaranteed H100 until t=7200; its two aged steady
    # 8-GPU jobs both fit the guarantee once s1 ends, so each keeps a reservation for then, on a
    # node of its own. With one reservation a row, the second drained nothing until the first
    # started, and 64-GPU gangs of a tenant with several waited up to 19 h longer at load 1.2.
    quotas = [QuotaSpec("vision", "H100", 16, 32)]
    s = TesseraScheduler([node(n) for n in "abcd"], quotas, EngineConfig(aging_s=60, starve_s=120))
    s.submit(steady("s1", 8, 0, 7200))
    s.submit(steady("s2", 8, 0, 7200))
    assert len(s.decide(0.0).bindings) == 2
    for i in (1, 2):
        s.submit(steady(f"big{i}", 8, i, 3600))
    d = s.decide(1000.0)
    assert {d.pending[j].code for j in ("big1", "big2")} == {"borrow-limit"}
    kept = {r.job_id: (r.start, r.nodes) for r in s.last_reservations}
    assert set(kept) == {"big1", "big2"} and {start for start, _ in kept.values()} == {7200.0}
    assert not set(kept["big1"][1]) & set(kept["big2"][1])
    # a third would need 24 of the 16 guaranteed once they end: it keeps none
    s.submit(steady("big3", 8, 3, 3600))
    s.decide(1100.0)
    assert "big3" not in {r.job_id for r in s.last_reservations}
