"""The runtime history a pass reads at once keeps the same runs as one recorded run by run.

The live pass builds the backfill history and the start estimates' recent runs from its whole
history read (``History.of``, ``RecentRuns.of``); the simulator's long-lived engine adds the same
runs one at a time. Both must keep the same runs of each key, in the same order, or a live pass
and the simulator would predict different runtimes (and so reserve and estimate differently)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.engine.backfill import History
from scheduling.engine.runtimes import KEEP, RecentRuns
from scheduling.engine.types import FinishedRun
from tests.engine.engine_cases import finished_runs


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs=finished_runs, keep=st.integers(1, 4))
def test_the_backfill_history_read_at_once_keeps_what_one_run_at_a_time_keeps(runs, keep):
    one_by_one = History(keep)
    for r in runs:
        if r.outcome in ("succeeded", "failed"):
            one_by_one.add(r.tenant, r.kind, r.job_id, r.runtime_s, r.ended_at)
    assert list(History.of(runs, keep).runs.items()) == list(one_by_one.runs.items())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs=finished_runs)
def test_the_recent_runs_read_at_once_keep_what_one_run_at_a_time_keeps(runs):
    one_by_one = RecentRuns()
    for r in runs:
        if r.outcome in ("succeeded", "failed"):
            one_by_one.add(r.tenant, r.kind, r.user, r.name, r.job_id, r.runtime_s, r.ended_at)
    at_once = RecentRuns.of(runs)
    assert list(at_once.kinds.items()) == list(one_by_one.kinds.items())
    assert list(at_once.named.items()) == list(one_by_one.named.items())


def test_only_the_latest_runs_of_a_key_are_kept_each_once():
    runs = [
        FinishedRun(f"j{i}", "a", "batch", 100.0 + i, float(i), "succeeded", "u", "n")
        for i in range(KEEP + 5)
    ]
    recent = RecentRuns.of([*runs, runs[-1]])  # the latest run read twice
    assert [job for _, job, _ in recent.kinds[("a", "batch")]] == [f"j{i}" for i in range(5, KEEP + 5)]
    assert recent.named[("u", "n")] == recent.kinds[("a", "batch")]
