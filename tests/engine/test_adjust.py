"""The idle policy (engine/adjust.py): who is warned, shrunk, requeued, and on what evidence."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.engine.adjust import (
    REQUEUE,
    SHRINK,
    WARN,
    Bounds,
    GpuSeries,
    IdleSettings,
    JobFacts,
    OverrideRefused,
    Waiting,
    decide,
    decide_job,
    idle_span,
    with_overrides,
)

MIN = 60.0
POLICY = IdleSettings()


def series(gpu: str, utils: list[float], now: float, step: float = MIN) -> GpuSeries:
    """Points one step apart, the last one at ``now``."""
    n = len(utils)
    return GpuSeries(gpu, tuple((now - (n - 1 - i) * step, u) for i, u in enumerate(utils)))


def job(gpus: int = 2, **kw) -> JobFacts:
    return JobFacts(id="7", tenant="vision", gpus=gpus, started_at=0.0, **kw)


def idle_for(minutes: int, gpus: int, now: float, busy_before: int = 5) -> list[GpuSeries]:
    return [series(f"n1/{i}", [0.9] * busy_before + [0.01] * minutes, now) for i in range(gpus)]


def test_a_gpu_idle_for_twenty_minutes_after_busy_ones_is_idle_for_twenty_minutes():
    now = 10_000.0
    e = idle_span(series("n1/0", [0.8] * 10 + [0.02] * 20, now), POLICY, now)
    assert e.idle_s == 20 * MIN
    assert e.max_util == 0.8 and e.points == 30


def test_a_missing_sample_ends_the_idle_span_and_a_stale_series_is_not_idle():
    now = 10_000.0
    points = series("n1/0", [0.01] * 30, now).points
    holed = GpuSeries("n1/0", points[:10] + points[13:])  # three minutes missing
    assert idle_span(holed, POLICY, now).idle_s == 17 * MIN
    stale = GpuSeries("n1/0", points[:-5])  # nothing for the last five minutes
    assert idle_span(stale, POLICY, now).idle_s == 0


def test_a_job_is_warned_at_fifteen_and_forty_five_minutes_once_each():
    now = 100 * MIN
    j = job()
    assert decide_job(j, idle_for(14, 2, now), POLICY, now) is None
    first = decide_job(j, idle_for(15, 2, now), POLICY, now)
    assert first is not None and first.action == WARN and first.level == 1
    assert decide_job(job(warned_at=(now,)), idle_for(20, 2, now), POLICY, now) is None
    second = decide_job(job(warned_at=(now - 25 * MIN,)), idle_for(45, 2, now), POLICY, now)
    assert second is not None and second.action == WARN and second.level == 2


def test_a_warning_from_an_earlier_idle_spell_does_not_count():
    now = 100 * MIN
    old = job(warned_at=(now - 50 * MIN,))  # before this spell (16 min) began
    adjustment = decide_job(old, idle_for(16, 2, now), POLICY, now)
    assert adjustment is not None and adjustment.level == 1


def test_a_job_idle_longer_than_the_window_read_is_not_warned_again():
    now = 200 * MIN
    window = idle_for(61, 1, now, busy_before=0)  # all that is read: idle throughout
    service = job(gpus=1, preemptible=False, warned_at=(now - 185 * MIN, now - 155 * MIN))
    assert decide_job(service, window, POLICY, now) is None
    fresh = job(gpus=1, preemptible=False)
    again = decide_job(fresh, window, POLICY, now)
    assert again is not None and again.action == WARN and again.level == 1


def test_a_preemptible_job_idle_for_an_hour_is_requeued_with_its_evidence():
    now = 100 * MIN
    a = decide_job(job(), idle_for(60, 2, now), POLICY, now)
    assert a is not None and a.action == REQUEUE
    assert a.idle_s == 60 * MIN
    inputs = a.inputs(POLICY)
    assert [g["gpu"] for g in inputs["gpus"]] == ["n1/0", "n1/1"]
    assert all(g["idle_s"] == 3600 and g["max_util"] == 0.9 for g in inputs["gpus"])
    assert inputs["threshold"] == 0.05


def test_an_idle_job_is_requeued_only_when_a_waiting_job_could_use_its_gpus():
    # Requeued with nothing else able to start there, it would be placed back at once: the
    # requeue would only cost it its grace period. It stays warned until something fits waits.
    now = 100 * MIN
    idle = job(gpus=4, held=(("H100", 4),), warned_at=(now - 45 * MIN, now - 15 * MIN))
    series_ = idle_for(60, 4, now)
    for nobody in ([], [Waiting(("A100",), 1)], [Waiting((), 8)], [Waiting(("H100",), 0)]):
        assert decide_job(idle, series_, POLICY, now, nobody) is None, nobody
    for fits in ([Waiting(("A100", "H100"), 4)], [Waiting((), 0.5)], [Waiting(("A100",), 1), Waiting((), 2)]):
        a = decide_job(idle, series_, POLICY, now, fits)
        assert a is not None and a.action == REQUEUE, fits
    split = job(gpus=4, held=(("H100", 2), ("H100", 2)), warned_at=idle.warned_at)
    assert decide_job(split, series_, POLICY, now, [Waiting(("H100",), 4)]) is None  # one node each
    assert decide_job(idle, series_, POLICY, now) is not None  # not told what waits: as before
    assert [a.job_id for a in decide([idle], {"7": series_}, POLICY, now, [])] == []


def test_an_idle_elastic_job_shrinks_whatever_waits():
    now = 100 * MIN
    elastic = job(gpus=4, elastic_min_gpus=1, held=(("H100", 4),))
    a = decide_job(elastic, idle_for(60, 4, now), POLICY, now, [])
    assert a is not None and a.action == SHRINK and a.to_gpus == 1


def test_a_non_preemptible_job_is_only_warned_unless_its_owner_allowed_reclaim():
    now = 100 * MIN
    service = job(preemptible=False, warned_at=(now - 40 * MIN, now - 10 * MIN))
    assert decide_job(service, idle_for(90, 2, now), POLICY, now) is None
    allowed = job(preemptible=False, idle_reclaim="allow")
    a = decide_job(allowed, idle_for(60, 2, now), POLICY, now)
    assert a is not None and a.action == REQUEUE


def test_a_non_preemptible_elastic_job_is_only_warned_unless_its_owner_allowed_reclaim():
    now = 100 * MIN
    gpus = idle_for(60, 4, now) + [series(f"n1/{i}", [0.7] * 65, now) for i in range(4, 8)]
    kept = job(gpus=8, elastic_min_gpus=2, preemptible=False)
    a = decide_job(kept, gpus, POLICY, now)
    assert a is not None and a.action == WARN
    allowed = job(gpus=8, elastic_min_gpus=2, preemptible=False, idle_reclaim="allow")
    b = decide_job(allowed, gpus, POLICY, now)
    assert b is not None and b.action == SHRINK and b.to_gpus == 4


def test_interactive_jobs_and_jobs_in_their_first_ten_minutes_are_exempt():
    now = 100 * MIN
    assert decide_job(job(interactive=True), idle_for(90, 2, now), POLICY, now) is None
    young = JobFacts(id="7", tenant="vision", gpus=2, started_at=now - 9 * MIN)
    assert decide_job(young, idle_for(90, 2, now), POLICY, now) is None


def test_idle_time_counts_only_from_the_current_attempts_start():
    now = 100 * MIN
    restarted = JobFacts(id="7", tenant="vision", gpus=2, started_at=now - 20 * MIN)
    a = decide_job(restarted, idle_for(90, 2, now), POLICY, now)
    assert a is not None and a.action == WARN and a.idle_s == 20 * MIN


def test_an_elastic_job_with_half_its_gpus_idle_shrinks_to_its_busy_gpus():
    now = 100 * MIN
    elastic = job(gpus=8, elastic_min_gpus=2)
    gpus = idle_for(60, 4, now) + [series(f"n1/{i}", [0.7] * 65, now) for i in range(4, 8)]
    a = decide_job(elastic, gpus, POLICY, now)
    assert a is not None and a.action == SHRINK and a.to_gpus == 4
    assert a.release == ("n1/0", "n1/1", "n1/2", "n1/3")


def test_an_idle_elastic_job_shrinks_to_its_minimum_then_waits_a_full_window_again():
    now = 100 * MIN
    a = decide_job(job(gpus=8, elastic_min_gpus=4), idle_for(60, 8, now), POLICY, now)
    assert a is not None and a.action == SHRINK and a.to_gpus == 4 and len(a.release) == 4
    shrunk = job(gpus=4, elastic_min_gpus=4, acted_at=now)
    later = now + 10 * MIN
    assert decide_job(shrunk, idle_for(70, 4, later), POLICY, later) is None


def test_a_partly_idle_job_that_is_not_elastic_is_warned_only():
    now = 100 * MIN
    gpus = idle_for(90, 1, now) + [series("n1/1", [0.7] * 95, now)]
    a = decide_job(job(warned_at=()), gpus, POLICY, now)
    assert a is not None and a.action == WARN
    assert decide_job(job(warned_at=(now - 60 * MIN, now - 30 * MIN)), gpus, POLICY, now) is None


def test_a_job_with_a_gpu_missing_from_the_metrics_is_not_idle():
    now = 100 * MIN
    a = decide_job(job(gpus=2), idle_for(90, 1, now), POLICY, now)
    assert a is not None and a.action == WARN  # the one GPU seen idle: partly idle at most


def test_tenant_overrides_apply_within_bounds_and_name_the_field_outside():
    s = with_overrides(POLICY, {"act_after_s": 7200}, Bounds())
    assert s.act_after_s == 7200 and s.warn_after_s == (1800.0, 5400.0)
    with pytest.raises(OverrideRefused) as refused:
        with_overrides(POLICY, {"threshold": 0.5}, Bounds())
    assert refused.value.field == "threshold"
    with pytest.raises(OverrideRefused) as unknown:
        with_overrides(POLICY, {"step_s": 1}, Bounds())
    assert unknown.value.field == "step_s"
    with pytest.raises(OverrideRefused):
        with_overrides(POLICY, {"exempt_s": True}, Bounds())


def test_decide_uses_each_tenants_own_settings():
    now = 100 * MIN
    jobs = [job(), JobFacts(id="8", tenant="nlp", gpus=2, started_at=0.0)]
    data = {"7": idle_for(60, 2, now), "8": idle_for(60, 2, now)}
    patient = with_overrides(POLICY, {"act_after_s": 7200}, Bounds())
    out = decide(jobs, data, {"vision": POLICY, "nlp": patient}, now)
    assert [(a.job_id, a.action) for a in out] == [("7", REQUEUE), ("8", WARN)]


utils = st.lists(st.one_of(st.just(0.0), st.floats(0, 1)), min_size=0, max_size=90)


@settings(max_examples=200, deadline=None)
@given(
    per_gpu=st.lists(utils, min_size=1, max_size=4),
    holes=st.sets(st.integers(0, 89), max_size=10),
    preemptible=st.booleans(),
    reclaim=st.sampled_from(["never", "allow"]),
    elastic=st.booleans(),
    interactive=st.booleans(),
)
def test_the_policy_never_acts_on_a_busy_exempt_or_protected_job(
    per_gpu, holes, preemptible, reclaim, elastic, interactive
):
    now = 200 * MIN
    data = []
    for i, u in enumerate(per_gpu):
        s = series(f"n/{i}", u, now)
        data.append(GpuSeries(s.gpu, tuple(p for k, p in enumerate(s.points) if k not in holes)))
    j = JobFacts(
        id="1",
        tenant="t",
        gpus=len(per_gpu),
        started_at=0.0,
        preemptible=preemptible,
        idle_reclaim=reclaim,
        interactive=interactive,
        elastic_min_gpus=1 if elastic else None,
    )
    a = decide_job(j, data, POLICY, now)
    if interactive:
        assert a is None
        return
    if a is None:
        return
    spans = [idle_span(s, POLICY, now) for s in data]
    # Whatever it does, the GPUs it names as the cause were idle at least that long, each
    # point of the span under the threshold and none missing.
    assert a.idle_s <= max(e.idle_s for e in spans) + 1e-9
    assert a.idle_s >= POLICY.warn_after_s[0]
    if a.action == REQUEUE:
        assert preemptible or reclaim == "allow"
        assert min(e.idle_s for e in spans) >= POLICY.act_after_s
    if a.action == SHRINK:
        assert elastic and (preemptible or reclaim == "allow") and 1 <= a.to_gpus < j.gpus
        assert all(e.idle_s >= POLICY.act_after_s for e in spans if e.gpu in a.release)
        assert len(a.release) == j.gpus - a.to_gpus
