"""Replay's rules of simulated time, with scripted decisions, and whole runs checked end to end."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from fifo_double import FifoFirstFit

from scheduling.engine.types import (
    Binding,
    Decisions,
    JobRequest,
    NodeSpec,
    Placement,
    Preemption,
    Resize,
)
from scheduling.sim.check import check
from scheduling.sim.events import read_events
from scheduling.sim.generate import generate
from scheduling.sim.replay import Replay, ReplayError, replay
from scheduling.sim.runner import run_replay
from scheduling.sim.traces import TraceJob, read_jobs, read_nodes, read_quotas

NODES = [NodeSpec("n1", "r1", "H100", 8, 8), NodeSpec("n2", "r1", "H100", 8, 8)]


def tj(job_id: str, gpus: float = 1, duration: float = 100, submit: float = 0, **kw: object) -> TraceJob:
    req = JobRequest(id=job_id, tenant="t", kind="training", gpus=gpus, submitted_at=submit, **kw)  # type: ignore[arg-type]
    return TraceJob(req, submit, duration)


def on(node: str, *gpus: int, replica: int = 0) -> Placement:
    return Placement(replica, node, tuple(gpus))


class Scripted:
    """Answers ``decide(now)`` from a script: ``{now: Decisions}``; records every call."""

    def __init__(self, script: dict[float, Callable[[], Decisions]]) -> None:
        self.script = script
        self.calls: list[tuple[str, object]] = []

    def submit(self, job: JobRequest) -> None:
        self.calls.append(("submit", job.id))

    def cancel(self, job_id: str) -> None:
        self.calls.append(("cancel", job_id))

    def release(self, job_id: str, now: float) -> None:
        self.calls.append(("release", (job_id, now)))

    def requeue(self, job: JobRequest) -> None:
        self.calls.append(("requeue", job.id))

    def checkpoint(self, job_id: str, at: float) -> None:
        self.calls.append(("checkpoint", (job_id, at)))

    def release_leaving(self, job_id: str, now: float) -> None:
        self.calls.append(("release_leaving", (job_id, now)))

    def decide(self, now: float) -> Decisions:
        self.calls.append(("decide", now))
        make = self.script.get(now)
        return make() if make else Decisions()


def bind(job_id: str, *placements: Placement) -> Callable[[], Decisions]:
    return lambda: Decisions(bindings=[Binding(job_id, placements)])


def brief(events: list[dict]) -> list[tuple[float, str, str]]:
    return [(e["t"], e["event"], e["job"]) for e in events]


def test_a_job_finishes_when_its_work_is_done() -> None:
    result = replay(NODES, [tj("a", submit=10)], Scripted({10: bind("a", on("n1", 0))}), tick_s=0)
    assert brief(result.events) == [(10, "submit", "a"), (10, "start", "a"), (110, "finish", "a")]
    assert result.events[1]["allocations"] == [{"node": "n1", "gpus": [0], "share": 1.0, "replica": 0}]


def test_simultaneous_events_make_one_decision_and_releases_come_first() -> None:
    jobs = [tj("a", duration=100), tj("b", submit=100), tj("c", submit=100)]
    script = {0: bind("a", on("n1", 0)), 100: lambda: Decisions(bindings=[Binding("b", (on("n1", 0),))])}
    sched = Scripted(script)
    result = replay(NODES, jobs, sched, tick_s=0)
    assert [c for c in sched.calls if c[0] == "decide"] == [("decide", 0), ("decide", 100), ("decide", 200)]
    at_100 = [(e["event"], e["job"]) for e in result.events if e["t"] == 100]
    assert at_100 == [("finish", "a"), ("submit", "b"), ("submit", "c"), ("start", "b")]


def test_an_elastic_job_on_half_its_gpus_runs_at_half_speed() -> None:
    job = tj("a", gpus=16, replicas=2, elastic_min_gpus=8, elastic_max_gpus=16)
    result = replay(NODES, [job], Scripted({0: bind("a", on("n1", *range(8)))}), tick_s=0)
    assert brief(result.events)[-1] == (200, "finish", "a")


def test_a_resize_changes_the_rate_from_then_on() -> None:
    job = tj("a", gpus=16, replicas=2, elastic_min_gpus=8, elastic_max_gpus=16)
    full = (on("n1", *range(8)), on("n2", *range(8), replica=1))
    script = {0: bind("a", on("n1", *range(8))), 50: lambda: Decisions(resizes=[Resize("a", full)])}
    jobs = [job, tj("tick", submit=50, duration=1)]
    result = replay(NODES, jobs, Scripted(script), tick_s=0)
    # 50 s at half speed = 25 s of work; the remaining 75 s at full speed end at t=125.
    assert (125, "finish", "a") in brief(result.events)
    assert (50, "resize", "a") in brief(result.events)


def test_a_preempted_job_holds_its_gpus_for_the_grace_and_resumes_from_its_checkpoint() -> None:
    job = tj("a", duration=100, checkpoint_s=30, grace_s=10)
    script = {
        0: bind("a", on("n1", 0)),
        45: lambda: Decisions(preemptions=[Preemption("a", "test")]),
        55: bind("a", on("n1", 1)),
    }
    sched = Scripted(script)
    result = replay(NODES, [job, tj("x", submit=45, duration=1)], sched, tick_s=0)
    events = brief(result.events)
    assert (55, "preempt", "a") in events  # released after the grace, not at the signal
    assert ("release", ("a", 55)) in sched.calls and ("requeue", "a") in sched.calls
    assert ("checkpoint", ("a", 30)) in sched.calls
    # Work stopped at 45 (signal); the checkpoint at 30 is kept: 70 s left from t=55.
    assert (125, "finish", "a") in events
    assert result.preemptions == 1
    assert result.lost_gpu_seconds == pytest.approx(15)


def test_a_job_past_its_time_limit_fails() -> None:
    job = tj("a", duration=100, time_limit_s=60)
    result = replay(NODES, [job], Scripted({0: bind("a", on("n1", 0))}), tick_s=0)
    assert result.events[-1] == {"t": 60, "event": "fail", "job": "a", "reason": "time-limit"}


def test_a_rejection_becomes_a_reject_event() -> None:
    script = {0: lambda: Decisions(rejections={"a": "needs 64 GPUs on one node"})}
    result = replay(NODES, [tj("a", gpus=64)], Scripted(script), tick_s=0)
    assert result.events[-1] == {"t": 0, "event": "reject", "job": "a", "reason": "needs 64 GPUs on one node"}


def test_pending_jobs_get_periodic_decisions_and_a_stuck_queue_ends_the_run() -> None:
    sched = Scripted({})
    result = replay(NODES, [tj("a")], sched, tick_s=300)
    assert [c for c in sched.calls if c[0] == "decide"] == [("decide", 0), ("decide", 300)]
    assert result.unfinished == ["a"]


def test_a_job_without_duration_cannot_be_replayed() -> None:
    with pytest.raises(ReplayError, match="no duration_s"):
        Replay(NODES, [TraceJob(tj("a").request, 0, None)], Scripted({}))


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("small")
    generate(out, seed=7, days=0.5, load=1.1, gpus=64)
    return out


def test_the_fifo_double_with_preemption_passes_the_checker(small: Path) -> None:
    nodes, jobs = read_nodes(small / "nodes.csv"), read_jobs(small / "jobs.csv")
    result = replay(nodes, jobs, FifoFirstFit(nodes, preempt_on_submit=True))
    assert result.preemptions > 0 and not result.unfinished
    events = [(i + 1, e) for i, e in enumerate(result.events)]
    report = check(nodes, jobs, events)
    assert report.ok, report.violations[:5]


def _registered() -> tuple[str, ...]:
    try:
        from scheduling.engine.registry import POLICIES
    except ImportError:
        return ()
    return tuple(POLICIES)


@pytest.mark.parametrize("policy", _registered() or ["(no registry)"])
def test_every_registered_policy_passes_the_checker(small: Path, policy: str, tmp_path: Path) -> None:
    if policy == "(no registry)":
        pytest.skip("scheduling.engine.registry is not there yet")
    summary = run_replay(
        small / "nodes.csv", small / "jobs.csv", small / "quotas.csv", policy, tmp_path, show_progress=False
    )
    report = check(
        read_nodes(small / "nodes.csv"),
        read_jobs(small / "jobs.csv"),
        read_events(tmp_path / "events.jsonl"),
        # the reference that ignores quotas is judged without them, by definition
        None if policy == "greedy" else read_quotas(small / "quotas.csv"),
    )
    assert report.ok, report.violations[:5]
    assert summary["unfinished"] == 0
    for name in ("events.jsonl", "summary.json", "allocation.png", "queue.png", "jct.png"):
        assert (tmp_path / name).exists()


def test_a_shrink_slows_the_job_at_once_and_frees_the_removed_gpus_after_its_grace() -> None:
    job = tj("a", gpus=16, replicas=2, elastic_min_gpus=8, elastic_max_gpus=16, grace_s=30)
    both = (on("n1", *range(8)), on("n2", *range(8), replica=1))
    script = {0: bind("a", *both), 10: lambda: Decisions(resizes=[Resize("a", both[:1])])}
    sched = Scripted(script)
    result = replay(NODES, [job, tj("x", submit=10, duration=1)], sched, tick_s=0)
    seen = [(e["t"], e["event"], len(e.get("allocations", []))) for e in result.events if e["job"] == "a"]
    # Held until the removed replica's grace ends (as live, until its process exits); 10 s of
    # work at full speed, the other 90 at half speed from the shrink on: done at 190.
    assert seen == [(0, "submit", 0), (0, "start", 2), (40, "resize", 1), (190, "finish", 0)]
    assert ("release_leaving", ("a", 40)) in sched.calls
    report = check(NODES, [job], [(i + 1, e) for i, e in enumerate(result.events) if e["job"] == "a"])
    assert not report.violations, report.violations


def test_a_shrink_in_a_preemptions_grace_frees_nothing_before_the_preemption_does() -> None:
    job = tj("a", gpus=16, replicas=2, elastic_min_gpus=8, elastic_max_gpus=16, grace_s=30)
    both = (on("n1", *range(8)), on("n2", *range(8), replica=1))
    script = {
        0: bind("a", *both),
        10: lambda: Decisions(preemptions=[Preemption("a", "x")]),
        11: lambda: Decisions(resizes=[Resize("a", both[:1])]),
    }
    jobs = [job, tj("x", submit=10, duration=1), tj("y", submit=11, duration=1)]
    result = replay(NODES, jobs, Scripted(script), tick_s=0)
    seen = [(e["t"], e["event"], len(e.get("allocations", []))) for e in result.events if e["job"] == "a"]
    assert seen[:3] == [(0, "submit", 0), (0, "start", 2), (40, "preempt", 0)]
