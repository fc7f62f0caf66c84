"""A pass with a deadline stops deciding when it passes; the next pass decides the rest.

The engine reads no clock: the driver hands it a ``Deadline`` with its own clock, here a fake
one that moves one second each time it is read (the engine reads it once per job it decides).
"""

from __future__ import annotations

from scheduling.engine.policy import TesseraScheduler
from scheduling.engine.types import Deadline, JobRequest
from tests.engine.engine_cases import node


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def _twelve_jobs_on_two_nodes() -> TesseraScheduler:
    s = TesseraScheduler([node("a"), node("b")])  # 16 GPUs
    for i in range(12):
        s.submit(JobRequest(f"j{i:02d}", "vision", "training", 1, submitted_at=float(i)))
    return s


def test_a_pass_past_its_deadline_decides_no_more_jobs_and_says_which_it_left():
    s = _twelve_jobs_on_two_nodes()
    clock = FakeClock()
    d = s.decide(100.0, Deadline(5.5, clock))  # read at 1..5: in time; at 6: past
    assert [b.job_id for b in d.bindings] == [f"j{i:02d}" for i in range(5)]
    assert d.cut_short and d.undecided == 7
    assert set(d.pending) == {f"j{i:02d}" for i in range(5, 12)}
    assert all(r.code == "priority" and "ran out of time" in r.message for r in d.pending.values())


def test_the_next_passes_decide_the_jobs_a_cut_pass_left():
    s = _twelve_jobs_on_two_nodes()
    clock = FakeClock()
    bound = []
    for now in (100.0, 101.0, 102.0):
        d = s.decide(now, Deadline(clock.t + 5.5, clock))
        bound += [b.job_id for b in d.bindings]
    assert bound == [f"j{i:02d}" for i in range(12)]
    assert not d.cut_short and not d.pending


def test_without_a_deadline_a_pass_decides_every_job():
    d = _twelve_jobs_on_two_nodes().decide(100.0)
    assert len(d.bindings) == 12 and not d.cut_short and d.undecided == 0


def test_a_pass_decides_at_least_one_job_even_past_its_deadline():
    """A driver whose snapshot read took the whole budget still makes progress."""
    s = _twelve_jobs_on_two_nodes()
    clock = FakeClock()
    d = s.decide(100.0, Deadline(-1.0, clock))
    assert [b.job_id for b in d.bindings] == ["j00"] and d.undecided == 11


def test_a_queue_longer_than_a_pass_can_decide_is_worked_through_in_turns():
    """Blocked jobs at the head used up every pass's budget, and a small job further down that
    fits now was never reached. The jobs a cut-short pass leaves are decided first next time."""
    from scheduling.engine.config import EngineConfig

    s = TesseraScheduler([node("a")], config=EngineConfig(resizes=False))  # 8 GPUs
    s.submit(JobRequest("big", "vision", "training", 6, preemptible=False, submitted_at=0.0))
    assert [b.job_id for b in s.decide(1.0).bindings] == ["big"]
    for i in range(6):  # none fits beside "big": each is decided "waiting", pass after pass
        s.submit(JobRequest(f"b{i}", "vision", "training", 4, preemptible=False, submitted_at=10.0 + i))
    s.submit(
        JobRequest("small", "vision", "training", 1, preemptible=False, submitted_at=50.0, time_limit_s=60)
    )
    clock = FakeClock()
    left: frozenset[str] = frozenset()
    bound = []
    for k in range(3):
        d = s.decide(100.0 + k, Deadline(clock.t + 5.5, clock, left))  # 5 jobs' worth a pass
        left = frozenset(d.not_reached)
        bound += [b.job_id for b in d.bindings]
    assert bound == ["small"]
