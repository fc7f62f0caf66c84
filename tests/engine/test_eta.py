"""Start estimates (engine/eta.py): a forward plan of the queue over the GPUs and quotas the
running jobs will free, with a band from low and high runtimes."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from scheduling.engine.config import EngineConfig
from scheduling.engine.eta import Timeline
from scheduling.engine.policy import TesseraScheduler
from scheduling.engine.types import JobRequest, QuotaSpec
from tests.engine.engine_cases import node


def test_a_timeline_finds_the_first_stretch_long_enough_with_room():
    line = Timeline(8, now=0)
    line.add(0, 100, 6)  # 2 free until 100
    line.add(150, 200, 8)  # none free from 150 to 200
    assert line.earliest(0, 10, 2) == 0
    assert line.earliest(0, 10, 4) == 100
    assert line.earliest(0, 60, 4) == 200  # 100-150 is too short
    assert line.earliest(0, 10, 9) == math.inf


@given(
    spans=st.lists(st.tuples(st.integers(0, 50), st.integers(1, 30), st.integers(1, 8)), max_size=8),
    need=st.integers(1, 8),
    length=st.integers(1, 40),
)
def test_the_time_a_timeline_gives_has_room_all_along_and_none_earlier_does(spans, need, length):
    line = Timeline(8, now=0)
    for t0, width, amount in spans:
        line.add(t0, t0 + width, amount)

    def room_all_along(t: int) -> bool:
        used = [sum(a for t0, w, a in spans if t0 <= x < t0 + w) for x in range(t, t + length)]
        return all(8 - u >= need for u in used)

    got = line.earliest(0, length, need)
    assert not math.isinf(got)  # everything ends by t=80
    assert room_all_along(int(got))
    assert not any(room_all_along(t) for t in range(int(got)))


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
    assert "time limits" in est["next"].basis


def test_history_replaces_time_limits_once_there_are_enough_runs():
    s = TesseraScheduler([node("a", gpus=8, nvlink=8)])
    for i, runtime in enumerate((100.0, 120.0, 140.0)):
        s.history.add("vision", "training", f"old{i}", runtime, ended_at=float(i))
    s.submit(JobRequest("running", "vision", "training", 8, submitted_at=0))
    s.decide(0.0)
    s.submit(JobRequest("next", "vision", "training", 8, submitted_at=1))
    d = s.decide(10.0)
    got = s.estimate(d, 10.0)["next"]
    assert got.start == 120 and got.earliest == 100 and got.latest == 140
    assert "3 finished runs of vision's training jobs" in got.basis


def test_asking_about_some_jobs_gives_them_the_estimates_the_whole_queue_would():
    s = world()
    for i in range(4):
        limit = 400 + 100 * i
        s.submit(JobRequest(f"j{i}", "vision", "training", 8, submitted_at=10 + i, time_limit_s=limit))
    d = s.decide(100.0)
    whole = s.estimate(d, 100.0)
    some = s.estimate(d, 100.0, wanted={"j1"})
    assert some["j1"] == whole["j1"]
    assert "j3" not in some  # behind the last job asked about: not planned
    assert s.estimate(d, 100.0, wanted=set()) == {}


def test_the_next_freeing_of_a_timeline_is_the_first_time_its_use_drops():
    line = Timeline(8, now=0)
    line.add(0, 100, 6)
    line.add(50, 300, 2)
    assert line.next_freed(0) == 100
    assert line.next_freed(100) == 300
    assert line.next_freed(300) == math.inf


def test_a_running_job_past_its_typical_runtime_is_expected_to_end_within_the_rest_of_its_limit():
    s = world()  # "running" started at 0 with a 1,000 s limit: typically 500 s
    s.submit(JobRequest("next", "vision", "training", 8, submitted_at=10, time_limit_s=400))
    d = s.decide(600.0)
    est = s.estimate(d, 600.0)["next"]
    assert 600 < est.start < 1000  # not "any second now", not past the limit
    assert est.start == 800  # halfway through the rest of the limit
    assert est.latest == 1000
