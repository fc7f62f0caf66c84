"""Start estimates (engine/eta.py, engine/forward.py): the queue played forward over the GPUs and
quotas the running jobs will free, with a band from low and high runtimes."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from scheduling.engine import forward
from scheduling.engine.config import EngineConfig
from scheduling.engine.eta_learnt import MIN_SEEN, Learnt, latest_ratio
from scheduling.engine.policy import TesseraScheduler
from scheduling.engine.runtimes import Predictor, RecentRuns
from scheduling.engine.types import Estimate, JobRequest, QuotaSpec
from tests.engine.engine_cases import node


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    running=st.lists(st.tuples(st.integers(1, 500), st.integers(0, 1), st.integers(1, 8)), max_size=6),
    waiting=st.lists(
        st.tuples(st.sampled_from([1, 2, 4, 8]), st.integers(1, 2), st.integers(1, 400)), max_size=8
    ),
)
def test_the_played_queue_never_puts_more_on_a_node_than_it_holds(running, waiting):
    caps = [8.0, 8.0]
    held = [0.0, 0.0]
    spans = []  # (start, end, node, gpus)
    run = []
    for end, i, gpus in running:
        gpus = min(gpus, 8 - int(held[i]))
        if gpus:
            held[i] += gpus
            run.append((float(end), [(i, float(gpus))], [], True))
            spans.append((0.0, float(end), i, float(gpus)))
    jobs = [
        forward.Job(per, replicas, per * replicas, True, {"H100": [[0, 1]]}, {}, float(length), 0.0, math.inf)
        for per, replicas, length in waiting
    ]
    assume(run)  # with nothing running, nothing frees: the pass has just left them waiting
    forward.play(caps, ["H100", "H100"], run, jobs, {}, 0.0)
    for j in jobs:
        assert not math.isinf(j.start) and j.start > 0  # all fit on an empty cluster; none before an end
        spans.extend((j.start, j.start + j.length, i, j.per) for i in j.nodes)
        assert len(set(j.nodes)) == j.replicas
    for t in {s for s, _, _, _ in spans}:
        for i in (0, 1):
            assert sum(g for s, e, n, g in spans if n == i and s <= t < e) <= caps[i]


def world() -> TesseraScheduler:
    s = TesseraScheduler([node("a", gpus=8, nvlink=8)], [QuotaSpec("vision", "*", 8, 8)], EngineConfig())
    s.submit(JobRequest("running", "vision", "training", 8, submitted_at=0, time_limit_s=1000))
    s.decide(0.0)
    return s


def test_a_job_behind_a_full_node_starts_when_the_running_job_ends_and_the_next_after_it():
    s = world()
    s.submit(JobRequest("next", "vision", "training", 8, submitted_at=10, time_limit_s=400))
    s.submit(JobRequest("then", "vision", "training", 8, submitted_at=20, time_limit_s=400))
    d = s.decide(100.0)
    est = s.estimate(d, 100.0)
    # typical runtimes are half the limits: "running" ends at 500, "next" at 700
    assert est["next"].start == 500 and est["then"].start == 700
    assert est["next"].earliest <= est["next"].start <= est["next"].latest == 1000
    assert (est["next"].position, est["then"].ahead) == (1, 1)
    assert "its time limit of 7 min (no history yet)" in est["next"].basis


def test_history_replaces_time_limits_once_there_are_enough_runs():
    s = TesseraScheduler([node("a", gpus=8, nvlink=8)])
    for i, runtime in enumerate((100.0, 120.0, 140.0)):
        s.recent_runs.add("vision", "training", "", "", f"old{i}", runtime, ended_at=float(i))
    s.submit(JobRequest("running", "vision", "training", 8, submitted_at=0))
    s.decide(0.0)
    s.submit(JobRequest("next", "vision", "training", 8, submitted_at=1))
    d = s.decide(10.0)
    got = s.estimate(d, 10.0)["next"]
    # the median run; the band at least half as long again either way (three runs say little)
    assert got.start == 120 and got.earliest == 80 and got.latest == 180
    assert "3 recent training runs of vision" in got.basis


def test_asking_about_some_jobs_gives_them_the_estimates_the_whole_queue_would():
    s = world()
    for i in range(4):
        limit = 400 + 100 * i
        s.submit(JobRequest(f"j{i}", "vision", "training", 8, submitted_at=10 + i, time_limit_s=limit))
    d = s.decide(100.0)
    whole = s.estimate(d, 100.0)
    some = s.estimate(d, 100.0, wanted={"j1"})
    assert some["j1"] == whole["j1"]
    assert s.estimate(d, 100.0, wanted=set()) == {}


def test_a_running_job_past_its_typical_runtime_is_expected_to_end_within_the_rest_of_its_limit():
    s = world()  # "running" started at 0 with a 1,000 s limit: typically 500 s
    s.submit(JobRequest("next", "vision", "training", 8, submitted_at=10, time_limit_s=400))
    d = s.decide(600.0)
    est = s.estimate(d, 600.0)["next"]
    assert 600 < est.start < 1000  # not "any second now", not past the limit
    assert est.start == 800  # halfway through the rest of the limit
    assert est.latest == 1000


def test_an_eight_gpu_job_waits_for_a_whole_node_not_for_eight_gpus_of_the_model():
    s = TesseraScheduler([node("a", labels=(("pool", "a"),)), node("b", labels=(("pool", "b"),))])
    for name, pool, limit in (("half-a", "a", 1000), ("half-b", "b", 2000)):
        s.submit(
            JobRequest(
                name,
                "vision",
                "training",
                4,
                submitted_at=0,
                time_limit_s=limit,
                node_selector=(("pool", pool),),
            )
        )
    s.decide(0.0)
    assert {a.node for j in ("half-a", "half-b") for a in s.state.allocs[j]} == {0, 1}
    s.submit(JobRequest("whole", "vision", "training", 8, submitted_at=1, time_limit_s=100))
    d = s.decide(10.0)
    # 8 GPUs of the model are free now, 4 on each node: the job starts when one node empties
    assert s.estimate(d, 10.0)["whole"].start == 500


def test_a_small_job_behind_a_gang_that_does_not_fit_starts_in_the_first_gap_as_in_the_pass():
    s = TesseraScheduler([node("a"), node("b"), node("c")])
    for name, limit in (("ra", 1000), ("rb", 4000), ("rc", 3000)):
        s.submit(JobRequest(name, "vision", "training", 8, submitted_at=0, time_limit_s=limit))
    s.decide(0.0)  # typically ra ends at 500, rc at 1500, rb at 2000
    s.submit(JobRequest("head", "vision", "training", 8, submitted_at=1, time_limit_s=4000))
    s.submit(JobRequest("gang", "vision", "training", 16, replicas=2, submitted_at=2, time_limit_s=100))
    s.submit(JobRequest("small", "vision", "training", 4, submitted_at=3, time_limit_s=4000))
    d = s.decide(10.0)
    assert [r.job_id for r in s.last_reservations] == ["head"]  # the gang holds no reservation
    est = s.estimate(d, 10.0)
    assert est["head"].start == 500  # on its reserved node, when ra ends
    assert est["small"].start == 1500  # when rc ends: the gang, not fitting then, holds it back not
    assert est["gang"].start == 2500  # two whole nodes: b (free at 2000) and a once head ends


def test_a_reserved_job_is_planned_on_its_reserved_nodes_and_says_whose_end_it_waits_for():
    s = TesseraScheduler([node("a"), node("b")])
    s.submit(JobRequest("long", "vision", "training", 8, submitted_at=0, time_limit_s=4000))
    s.submit(JobRequest("short", "vision", "training", 8, submitted_at=0, time_limit_s=1000))
    s.decide(0.0)
    s.submit(JobRequest("gang", "vision", "training", 16, replicas=2, submitted_at=1, time_limit_s=100))
    d = s.decide(10.0)
    assert [r.job_id for r in s.last_reservations] == ["gang"]
    got = s.estimate(d, 10.0)["gang"]
    assert got.start == 2000  # both nodes: "long" ends typically half way through its limit
    assert "nodes reserved for it free when job long ends" in got.basis


def test_a_users_reruns_of_one_name_come_before_the_tenants_history_of_the_kind():
    s = TesseraScheduler([node("a")])
    for i in range(5):
        s.recent_runs.add("vision", "training", "bob", "other", f"k{i}", 5000.0, ended_at=float(i))
    for i, runtime in enumerate((300.0, 320.0)):
        s.recent_runs.add("vision", "training", "alice", "resnet", f"r{i}", runtime, ended_at=10.0 + i)
    s.submit(JobRequest("running", "vision", "training", 8, submitted_at=0, user="alice", name="resnet"))
    s.decide(20.0)
    s.submit(JobRequest("next", "vision", "training", 8, submitted_at=21, user="carol", name="x"))
    d = s.decide(30.0)
    got = s.estimate(d, 30.0)["next"]
    assert got.start == 20 + 320  # the running rerun's median of its two earlier runs
    assert "7 recent training runs of vision" in got.basis  # carol's job: no runs of its own


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    runtimes=st.lists(st.floats(60, 50_000), min_size=0, max_size=12),
    limit=st.one_of(st.none(), st.floats(60, 100_000)),
    named=st.booleans(),
)
def test_a_predictions_low_typical_and_high_are_ordered_and_never_past_the_time_limit(runtimes, limit, named):
    recent = RecentRuns()
    for i, r in enumerate(runtimes):
        recent.add("t", "batch", "u" if named else "", "n" if named else "", f"j{i}", r, float(i))
    job = JobRequest("x", "t", "batch", 1, time_limit_s=limit, user="u", name="n")
    p = Predictor(recent, 3600.0).predict(job)
    assert p.low <= p.typical <= p.high
    if limit:
        assert p.high <= max(limit, 60.0)
    assert Predictor(recent, 3600.0).predict(job) == p  # the same runs, the same prediction


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=8),
    limits=st.lists(st.one_of(st.none(), st.integers(100, 20_000)), min_size=8, max_size=8),
    waiting=st.lists(st.sampled_from([1, 2, 4, 8, 16]), min_size=1, max_size=6),
)
def test_every_estimate_lies_inside_its_band_and_the_plan_is_deterministic(sizes, limits, waiting):
    def build() -> tuple[TesseraScheduler, dict]:
        s = TesseraScheduler([node("a"), node("b", rack="r1")], [QuotaSpec("vision", "*", 8, 16)])
        for i, g in enumerate(sizes):
            s.submit(JobRequest(f"r{i}", "vision", "training", g, submitted_at=0, time_limit_s=limits[i]))
        s.decide(0.0)
        for i, g in enumerate(waiting):
            replicas = 2 if g == 16 else 1
            s.submit(JobRequest(f"w{i}", "vision", "batch", g, replicas=replicas, submitted_at=1 + i))
        d = s.decide(50.0)
        return s, s.estimate(d, 50.0)

    _, first = build()
    _, again = build()
    assert first == again
    for est in first.values():
        assert est.earliest <= est.start <= est.latest
        assert est.start >= 50.0
        assert est.ahead == est.position - 1 and est.basis


def test_bands_reach_as_late_as_the_first_estimates_turned_out_once_enough_jobs_started():
    learnt = Learnt()
    played = Estimate(1000.0, 100.0, 2000.0, "b", 1, 0)  # played: a wait of 1,000 s from 0
    for i in range(MIN_SEEN):
        assert learnt.widen(f"j{i}", "node/1", played, 0.0) == played  # too few seen: as played
        # one in ten waited 1,000 s as played, the rest 3,000 s: three times the played wait
        learnt.observe(pending=set(), started={f"j{i}": 1000.0 if i % 10 == 0 else 3000.0})
        assert f"j{i}" not in learnt.first  # learnt once, then forgotten
    got = learnt.widen("next", "node/1", played, 0.0)
    assert got.start == 1000.0 and got.earliest == 100.0  # the estimate stays the played one
    assert got.latest == pytest.approx(3000.0, rel=1e-3)  # the band reaches the late starts seen
    assert got.basis == "b; the latest start from how the last 20 such estimates turned out"
    # a band already as late as that is left as played
    wide = Estimate(1000.0, 100.0, 9000.0, "b", 1, 0)
    assert learnt.widen("wide", "node/1", wide, 0.0) == wide
    # a job of another class, none of its own seen yet: widened by all the ratios
    assert learnt.widen("other", "gang/2", played, 0.0).latest == pytest.approx(3000.0, rel=1e-3)


def test_bands_reach_as_late_as_the_jobs_still_waiting_have_waited_already():
    # 20 jobs started as played (a wait of 1,000 s); 20 more, estimated alike, still wait 10,000 s
    # on. Judged by the started ones alone, bands would stay as played; the waiting ones' waits so
    # far are lower bounds of theirs, and the band reaches at least as late.
    learnt = Learnt()
    played = Estimate(1000.0, 100.0, 2000.0, "b", 1, 0)
    for i in range(MIN_SEEN):
        learnt.widen(f"s{i}", "node/1", played, 0.0)
        learnt.widen(f"w{i}", "node/1", played, 0.0)
    waiting = {f"w{i}" for i in range(MIN_SEEN)}
    learnt.observe(pending=waiting, started={f"s{i}": 1000.0 for i in range(MIN_SEEN)})
    now = 10_000.0
    later = Estimate(now + 1000.0, now + 100.0, now + 2000.0, "b", 1, 0)
    assert learnt.widen("next", "node/1", later, now).latest >= now + 10_000.0
    # with none of them waiting any more (they left), the started ones say "as played"
    learnt.observe(pending=set(), started={})
    assert learnt.widen("again", "node/1", later, now) == later


def test_the_latest_ratio_is_the_started_ones_quantile_when_nothing_waits():
    ratios = [0.1 * i for i in range(30)]
    assert latest_ratio(ratios, []) == sorted(ratios)[int(0.9 * 30)]
    # jobs still waiting past every start: the quantile is at least the longest wait so far
    assert latest_ratio(ratios[:20], [5.0] * 20) == 5.0
    # waits shorter than every start change nothing
    assert latest_ratio(ratios[5:25], [0.0] * 10) == latest_ratio(ratios[5:25], [])


@given(
    st.lists(st.floats(-3, 5, allow_nan=False), min_size=1, max_size=60),
    st.lists(st.floats(-3, 5, allow_nan=False), max_size=60),
)
def test_counting_the_jobs_still_waiting_never_pulls_a_band_in(seen, waiting):
    # right-censored waits only add to the jobs that could still start later: the quantile, and
    # so the band's latest start, is never earlier than the started jobs' own
    alone = latest_ratio(seen, [])
    assert alone == sorted(seen)[int(0.9 * len(seen))]
    assert latest_ratio(seen, waiting) >= alone
    assert latest_ratio(seen, waiting) <= max(seen + waiting)


def test_a_job_that_left_the_queue_without_starting_teaches_nothing():
    learnt = Learnt()
    learnt.widen("gone", "part/0", Estimate(100.0, 60.0, 200.0, "b", 1, 0), 0.0)
    learnt.widen("waits", "part/0", Estimate(100.0, 60.0, 200.0, "b", 2, 1), 0.0)
    learnt.observe(pending={"waits"}, started={})
    assert set(learnt.first) == {"waits"} and learnt.seen == {}


def test_a_job_kept_off_its_quota_row_for_an_aged_job_is_played_after_that_job():
    # vision's guarantee is 4: s0 (1 GPU) ends first, s1 (2) later; "big" (4, aged) waits for both,
    # so the pass keeps "long" (1) off the row for it. Played without that hold, "long" would take
    # the GPU s0 frees, before "big"; the pass does not let it.
    def steady(job_id: str, gpus: int, at: float, limit_s: float) -> JobRequest:
        return JobRequest(
            job_id, "vision", "training", gpus, preemptible=False, submitted_at=at, time_limit_s=limit_s
        )

    s = TesseraScheduler(
        [node("a", gpus=8, nvlink=8), node("b", gpus=8, nvlink=8)],
        [QuotaSpec("vision", "*", guaranteed=4, limit=8)],
        EngineConfig(aging_s=60),
    )
    s.submit(steady("s0", 1, 0, 1000))
    s.submit(steady("s1", 2, 0, 3600))
    s.decide(0.0)
    s.submit(steady("big", 4, 1, 3600))
    s.decide(1.0)
    s.submit(steady("long", 1, 50, 7200))
    d = s.decide(100.0)
    assert d.held_for == {"long": "big"}
    est = s.estimate(d, 100.0)
    assert est["big"].start == 1800  # s1's typical end: half its limit
    assert est["long"].start >= est["big"].start + 1800  # after big: the guarantee is big's till then
    assert est["long"].earliest >= est["big"].earliest


def test_the_play_holds_a_job_behind_its_holder_only_until_it_starves():
    caps = [8.0]
    running = [(100.0, [(0, 4.0)], [], True)]
    never = forward.Job(16, 1, 16, True, {"H100": [[0]]}, {}, 50.0, 0.0, math.inf)  # fits no node
    held = forward.Job(2, 1, 2, True, {"H100": [[0]]}, {}, 50.0, 0.0, math.inf, after=0, starves_at=300.0)
    free = forward.Job(2, 1, 2, True, {"H100": [[0]]}, {}, 50.0, 0.0, math.inf)
    forward.play(caps, ["H100"], running, [never, held, free], {}, 0.0)
    assert math.isinf(never.start)
    assert (free.start, held.start) == (100.0, 300.0)  # held back while "never" waits, till it starves


def test_a_borrower_the_pass_refused_for_an_owed_model_waits_in_the_play_until_it_is_owed_no_more():
    # Two 8-GPU nodes; vision holds its guarantee (8): 4 on node 0 till 1000, 3 + 1 on node 1,
    # the 3 till 100. nlp's 8-GPU job is within nlp's guarantee and, from 100, the model has 11
    # GPUs free, but no node 8: the model is owed to nlp until that job starts (at 1000, on
    # node 0). vision's 4-GPU borrower, refused for it by the pass, waits as long; another
    # borrower the pass did not refuse is played as before.
    vision, nlp = ("vision", "*"), ("nlp", "*")
    caps = {vision: (16.0, 8.0), nlp: (16.0, 8.0)}
    running = [
        (1000.0, [(0, 4.0)], [(vision, 4.0)], True),
        (100.0, [(1, 3.0)], [(vision, 3.0)], True),
        (5000.0, [(1, 1.0)], [(vision, 1.0)], True),
    ]

    def jobs(bound: bool) -> list[forward.Job]:
        owed_to = forward.Job(8, 1, 8, True, {"H100": [[0, 1]]}, {"H100": nlp}, 500.0, 0.0, math.inf)
        borrower = forward.Job(
            4, 1, 4, True, {"H100": [[0, 1]]}, {"H100": vision}, 500.0, 0.0, math.inf, owed_bound=bound
        )
        return [owed_to, borrower]

    refused = jobs(True)
    forward.play([8.0, 8.0], ["H100", "H100"], running, refused, caps, 0.0, owed={"H100": [0]})
    assert [j.start for j in refused] == [1000.0, 1000.0]
    other = jobs(False)
    forward.play([8.0, 8.0], ["H100", "H100"], running, other, caps, 0.0, owed={"H100": [0]})
    assert [j.start for j in other] == [1000.0, 100.0]


def test_an_aged_job_its_quota_refuses_drains_no_nodes_in_the_play():
    # vision (guarantee and limit 8) runs 8 GPUs on node 0 till 5000; its aged 8-GPU job waits
    # for its quota, not for nodes. Node 1 frees at 100: the pass drains nothing for a job its
    # quota refuses, so nlp's 8-GPU job starts there at 100, and vision's at 5000.
    vision = ("vision", "*")
    running = [(5000.0, [(0, 8.0)], [(vision, 8.0)], False), (100.0, [(1, 4.0)], [], True)]
    aged = forward.Job(8, 1, 8, False, {"H100": [[0, 1]]}, {"H100": vision}, 500.0, 0.0, 0.0)
    other = forward.Job(8, 1, 8, True, {"H100": [[0, 1]]}, {}, 500.0, 0.0, math.inf)
    forward.play([8.0, 8.0], ["H100", "H100"], running, [aged, other], {vision: (8.0, 8.0)}, 0.0)
    assert (other.start, other.nodes) == (100.0, [1])
    assert aged.start == 5000.0 and aged.reserved == ()


@pytest.mark.parametrize("bound, small_starts", [(1, 10.0), (2, 3000.0), (None, 3000.0)])
def test_no_more_jobs_hold_reserved_nodes_in_the_play_than_the_pass_may_reserve_for(bound, small_starts):
    # Node 0 has 4 GPUs free from 10 (till 1000), node 1 has 4 (till 2000), node 2 none (till
    # 3000). Two aged 8-GPU jobs fit nowhere at 10: the first reserves node 0; the second
    # reserves node 1 only if the pass may hold two reservations, and the 4-GPU job behind them
    # then waits for node 2 instead of starting on node 1 at once.
    running = [
        (1000.0, [(0, 4.0)], [], True),
        (10.0, [(0, 1.0)], [], True),
        (2000.0, [(1, 4.0)], [], True),
        (3000.0, [(2, 8.0)], [], True),
    ]
    aged = [forward.Job(8, 1, 8, True, {"H100": [[0, 1, 2]]}, {}, 5000.0, 0.0, 0.0) for _ in range(2)]
    small = forward.Job(4, 1, 4, True, {"H100": [[0, 1, 2]]}, {}, 500.0, 0.0, math.inf)
    forward.play([8.0] * 3, ["H100"] * 3, running, [*aged, small], {}, 0.0, max_reservations=bound)
    assert aged[0].start == 1000.0 and aged[0].nodes == [0]
    assert small.start == small_starts
