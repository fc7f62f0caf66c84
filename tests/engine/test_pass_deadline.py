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
