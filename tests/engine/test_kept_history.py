"""The runtime histories kept from pass to pass are the ones a pass would build afresh.

The live pass updates the last pass's backfill history and recent runs by the runs that came and
went since (``engine/kept_history.py``) instead of building them from its whole history read.
Any difference would make it predict, and so reserve and estimate, unlike a worker that has just
restarted (which builds them from its first read), and unlike the simulator."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.engine.backfill import History
from scheduling.engine.config import EngineConfig
from scheduling.engine.kept_history import KeptHistory, Runtimes
from scheduling.engine.policy import TesseraScheduler
from scheduling.engine.runtimes import RecentRuns
from scheduling.engine.types import FinishedRun, JobRequest, Placement, RunningJob, Snapshot
from tests.engine.engine_cases import finished_runs, node

# A read: runs of the pool (the same objects from read to read, as the services' row memo gives
# them), some read afresh (equal, not the same object), some given twice.
_reads = st.lists(st.lists(st.tuples(st.integers(0, 59), st.booleans()), max_size=40), max_size=6)


def _afresh(runs: list[FinishedRun]) -> Runtimes:
    return Runtimes(History.of(runs), RecentRuns.of(runs))


def _same(a: Runtimes, b: Runtimes) -> None:
    assert a.history.keep == b.history.keep
    assert a.history.runs == b.history.runs
    assert a.recent.kinds == b.recent.kinds
    assert a.recent.named == b.recent.named


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pool=finished_runs, reads=_reads)
def test_the_kept_histories_are_those_built_afresh_from_each_read(pool, reads):
    if not pool:
        return
    kept = KeptHistory()
    handed: list[tuple[list[FinishedRun], Runtimes]] = []
    for read in reads:
        runs = [replace(pool[i % len(pool)]) if fresh else pool[i % len(pool)] for i, fresh in read]
        last = kept._kept
        got = kept.of(runs)
        _same(got, _afresh(runs))
        handed.append((runs, got))
        kept._kept = last  # another pass updating from the same tables (a dry run beside it)
        _same(kept.of(runs), _afresh(runs))
    for runs, got in handed:  # tables handed out are never changed by later reads
        _same(got, _afresh(runs))


def test_a_read_with_the_same_runs_hands_out_the_same_tables():
    runs = [FinishedRun(f"j{i}", "a", "batch", 60.0 * i, float(i), "succeeded", "u", "n") for i in range(5)]
    kept = KeptHistory()
    assert kept.of(runs) is kept.of(list(reversed(runs)))


def test_an_engine_records_a_finished_run_into_its_own_histories_not_the_kept_ones():
    job = JobRequest("1", "a", "batch", 1.0, user="u", name="n")
    earlier = FinishedRun("0", "a", "batch", 100.0, 50.0, "succeeded", "u", "n")
    snapshot = Snapshot(
        1000.0, (node("n0"),), (RunningJob(job, (Placement(0, "n0", (0,)),), 0.0),), (), (), (earlier,)
    )
    kept = KeptHistory()
    first = TesseraScheduler.from_snapshot(snapshot, EngineConfig(), None, kept)
    first.release("1", 1000.0)
    assert first.history.runs == {("a", "batch"): [(50.0, "0", 100.0), (1000.0, "1", 1000.0)]}
    assert first.recent_runs.named == {("u", "n"): [(50.0, "0", 100.0), (1000.0, "1", 1000.0)]}
    second = TesseraScheduler.from_snapshot(snapshot, EngineConfig(), None, kept)
    assert second.history.runs == {("a", "batch"): [(50.0, "0", 100.0)]}
    assert second.recent_runs.named == {("u", "n"): [(50.0, "0", 100.0)]}
