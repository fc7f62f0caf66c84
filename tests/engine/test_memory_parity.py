"""The engine's memory: an engine rebuilt every pass from a snapshot and the memory the last pass
stored (as the live control plane does) decides exactly what one long-lived engine decides (as
the simulator runs it) — every binding, preemption, resize, rejection and pending reason."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.engine import eta_learnt
from scheduling.engine.config import EngineConfig
from scheduling.engine.fragmentation import TypicalRequest
from scheduling.engine.memory import BadMemory, EngineMemory, HeldReservation, HeldRoom
from scheduling.engine.policy import TesseraScheduler
from scheduling.engine.types import Decisions, JobRequest, NodeSpec, Snapshot
from scheduling.sim.adjusting import AdjustOptions
from scheduling.sim.generate import generate
from scheduling.sim.perpass import PerPassScheduler
from scheduling.sim.replay import replay
from scheduling.sim.traces import read_jobs, read_nodes, read_quotas
from tests.engine.engine_world import Recorded


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory):
    out: Path = tmp_path_factory.mktemp("trace")
    generate(out, seed=8, days=0.5, load=1.2, gpus=64)
    return read_nodes(out / "nodes.csv"), read_jobs(out / "jobs.csv"), read_quotas(out / "quotas.csv")


def both_ways(trace, config: EngineConfig, **per_pass) -> tuple[Recorded, Recorded]:
    nodes, jobs, quotas = trace
    long_lived = Recorded(TesseraScheduler(tuple(nodes), tuple(quotas), config))
    rebuilt = Recorded(PerPassScheduler(nodes, quotas, config, **per_pass))
    replay(nodes, jobs, long_lived)
    replay(nodes, jobs, rebuilt)
    return long_lived, rebuilt


@pytest.mark.parametrize(
    ("resizes", "shuffle"),
    [(False, True), (True, False)],
    ids=["live settings, jobs in another order", "simulator settings"],
)
def test_an_engine_rebuilt_every_pass_from_stored_memory_decides_as_the_long_lived_one(
    trace, resizes: bool, shuffle: bool
) -> None:
    long_lived, rebuilt = both_ways(trace, EngineConfig(resizes=resizes), shuffle=shuffle)
    assert rebuilt.inner.passes == len(long_lived.log) > 100
    codes = {code for entry in long_lived.log for _, code, _, _ in entry[5]}
    # the trace exercises what the memory carries: reservations, preemption rooms, quotas
    assert {"reserved", "quota"} <= codes
    assert any(entry[2] for entry in long_lived.log)
    differing = [i for i, (a, b) in enumerate(zip(long_lived.log, rebuilt.log, strict=True)) if a != b]
    assert differing == []


class NoShrink(Recorded):
    """The long-lived engine without the adjustment pass's shrink (the rebuilt one has none)."""

    shrink = None


def test_with_idle_requeues_an_engine_rebuilt_every_pass_decides_as_the_long_lived_one(
    tmp_path: Path,
) -> None:
    # The adjustment pass requeues idle jobs: each is stopping (terminating) through its grace
    # period, as the live snapshot shows it, and its run is not a runtime either engine learns.
    generate(tmp_path, seed=7, days=1, load=1.5, gpus=64)
    nodes, quotas = read_nodes(tmp_path / "nodes.csv"), read_quotas(tmp_path / "quotas.csv")
    # more idle jobs than drawn: every other one that checkpoints idles its GPUs after 30 min
    jobs = [
        replace(tj, util_profile="idle-after-30") if tj.request.checkpoint_s and i % 2 == 0 else tj
        for i, tj in enumerate(read_jobs(tmp_path / "jobs.csv"))
    ]
    config = EngineConfig(resizes=False)
    long_lived = NoShrink(TesseraScheduler(tuple(nodes), tuple(quotas), config))
    rebuilt = Recorded(PerPassScheduler(nodes, quotas, config))
    a = replay(nodes, jobs, long_lived, adjust=AdjustOptions())
    b = replay(nodes, jobs, rebuilt, adjust=AdjustOptions())
    assert a.adjustments.get("requeue", 0) >= 30
    requeued = {e["job"] for e in a.events if e["event"] == "preempt" and e["reason"].startswith("idle")}
    restarted = [e for e in a.events if e["event"] == "start" and e["job"] in requeued]
    assert len(restarted) > len(requeued)  # they started again
    assert a.events == b.events
    differing = [i for i, (x, y) in enumerate(zip(long_lived.log, rebuilt.log, strict=True)) if x != y]
    assert differing == []


def test_an_engine_rebuilt_without_its_memory_decides_otherwise(trace) -> None:
    class Forgetful(PerPassScheduler):
        def decide(self, now: float) -> Decisions:
            self.stored = None  # as the live pass did before: a fresh engine knowing nothing
            return super().decide(now)

    nodes, jobs, quotas = trace
    long_lived = Recorded(TesseraScheduler(tuple(nodes), tuple(quotas), EngineConfig(resizes=False)))
    forgetful = Recorded(Forgetful(nodes, quotas, EngineConfig(resizes=False)))
    replay(nodes, jobs, long_lived)
    replay(nodes, jobs, forgetful)
    assert long_lived.log != forgetful.log


NODES = (NodeSpec("a", "r1", "H100", 8, 8), NodeSpec("b", "r1", "H100", 8, 8))


def test_a_reservation_naming_a_node_that_left_is_dropped_and_the_rest_kept() -> None:
    memory = EngineMemory(
        reservations=(HeldReservation("j1", ("a", "gone"), 50.0), HeldReservation("j2", ("b",), 60.0, 1)),
        sticky=(("j1", ("a", "gone")), ("j2", ("b",))),
        room=(HeldRoom("j3", ("gone",), 90.0),),
    )
    s = TesseraScheduler.from_snapshot(Snapshot(0.0, NODES, (), ()), EngineConfig(), memory)
    kept = s.memory()
    assert kept.reservations == (HeldReservation("j2", ("b",), 60.0, 1),)
    assert kept.sticky == (("j2", ("b",)),)
    assert kept.room == ()


def test_a_job_is_counted_in_the_request_mix_once_whatever_the_passes_that_see_it() -> None:
    job = JobRequest("j1", "vision", "training", 2.0, submitted_at=5.0)
    first = TesseraScheduler.from_snapshot(Snapshot(5.0, NODES, (), (job,)), EngineConfig(), EngineMemory())
    assert len(first.memory().recent) == 1
    again = TesseraScheduler.from_snapshot(Snapshot(9.0, NODES, (), (job,)), EngineConfig(), first.memory())
    assert again.memory().recent == first.memory().recent
    assert again.memory().frag_changes == first.memory().frag_changes == 1


names = st.text("abcdefgh-0123", min_size=1, max_size=6)
finite = st.floats(allow_nan=False, allow_infinity=False)
shapes = st.tuples(
    st.integers(0, 10**6), st.integers(0, 1000), st.integers(0, 64), st.lists(names, max_size=2).map(tuple)
)
memories = st.builds(
    EngineMemory,
    reservations=st.lists(
        st.builds(HeldReservation, names, st.lists(names).map(tuple), finite, st.none() | st.integers(0, 3))
    ).map(tuple),
    sticky=st.lists(st.tuples(names, st.lists(names).map(tuple))).map(tuple),
    room=st.lists(st.builds(HeldRoom, names, st.lists(names).map(tuple), finite)).map(tuple),
    last_codes=st.lists(st.tuples(names, names)).map(tuple),
    rack_gang_gpus=finite,
    recent=st.lists(shapes, max_size=20).map(tuple),
    frag_changes=st.integers(0, 10**6),
    frag_typical=st.none()
    | st.lists(
        st.builds(
            TypicalRequest,
            st.integers(0, 10**6),
            st.integers(0, 1000),
            st.integers(0, 64),
            st.lists(names, max_size=2).map(tuple),
            st.floats(0, 1),
        ),
        max_size=5,
    ).map(tuple),
    noted_at=st.just(-math.inf) | finite,
    noted_ids=st.lists(names).map(tuple),
    eta_first=st.lists(st.tuples(names, finite, finite, names), max_size=3).map(tuple),
    eta_seen=st.lists(st.tuples(names, st.lists(finite, max_size=3).map(tuple)), max_size=2).map(tuple),
)


@settings(max_examples=50, suppress_health_check=[HealthCheck.too_slow])  # a busy machine: slow draws
@given(memories)
def test_memory_survives_its_json_document_exactly(memory: EngineMemory) -> None:
    assert EngineMemory.from_json(json.loads(json.dumps(memory.to_json()))) == memory


@settings(max_examples=50)
@given(memories)
def test_a_document_of_the_first_version_reads_as_the_same_memory(memory: EngineMemory) -> None:
    """A stored memory from before the request mix was written as runs (version 1) is read,
    not set aside: an upgrade does not make the next pass plan afresh."""
    listed = {
        **memory.to_json(),
        "version": 1,
        "recent": [[c, m, n, list(ms)] for c, m, n, ms in memory.recent],
    }
    assert EngineMemory.from_json(json.loads(json.dumps(listed))) == memory


def test_the_request_mix_is_written_as_runs_of_equal_shapes() -> None:
    one, two = (0, 1000, 1, ("A100",)), (0, 500, 1, ())
    memory = EngineMemory(recent=(one,) * 600 + (two,) * 3 + (one,) * 2)
    assert memory.to_json()["recent"] == [
        [0, 1000, 1, ["A100"], 600],
        [0, 500, 1, [], 3],
        [0, 1000, 1, ["A100"], 2],
    ]


def test_a_memory_stored_before_estimates_were_learnt_reads_as_none_learnt() -> None:
    doc = EngineMemory(noted_ids=("j1",)).to_json()
    del doc["eta_first"], doc["eta_seen"]
    assert EngineMemory.from_json(doc) == EngineMemory(noted_ids=("j1",))


def test_start_estimates_learnt_across_passes_are_those_one_long_lived_engine_learns(
    trace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(eta_learnt, "MIN_SEEN", 3)  # the small trace widens bands from its 4th start on
    nodes, jobs, quotas = trace
    engine = TesseraScheduler(tuple(nodes), tuple(quotas))
    long_lived = replay(nodes, jobs, engine, estimates=True)
    rebuilt = replay(nodes, jobs, PerPassScheduler(nodes, quotas), estimates=True)
    assert len(engine.eta_learnt.seen[eta_learnt.ALL]) > 3  # learnt, and bands widened after
    assert rebuilt.first_estimates == long_lived.first_estimates


@pytest.mark.parametrize(
    "doc",
    [
        None,
        [],
        {"version": 99},
        {"version": 1},
        {**EngineMemory().to_json(), "recent": [[1, 2]]},
        {**EngineMemory().to_json(), "recent": [[0, 1000, 1, [], 0]]},
        {**EngineMemory().to_json(), "recent": [[0, 1000, 1, [], 10**9]]},
    ],
    ids=[
        "null",
        "a list",
        "another version",
        "fields missing",
        "a bad shape",
        "an empty run",
        "a run too long",
    ],
)
def test_a_memory_document_this_engine_did_not_write_is_refused(doc) -> None:
    with pytest.raises(BadMemory):
        EngineMemory.from_json(doc)
