"""A pass is bounded in time: past its budget it stops deciding, applies what it decided,
records that it was cut short and asks for another pass; the Celery task's soft time limit
leaves no half-applied chunk and no pass lock behind."""

from __future__ import annotations

import logging
import threading

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from django.db import connection

from scheduling.choices import JobState
from scheduling.models import Allocation, Job, SchedulerState
from scheduling.services import passes, triggers
from scheduling.services.bulk import COMMIT
from tests.scheduling import helpers


class FakeClock:
    """Moves one second each time it is read: the pass reads it at its start, the engine once
    per job it decides, and the pass again at its end."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


@pytest.fixture
def many_pending(world, settings, monkeypatch):
    helpers.make_node("a100-01")
    helpers.make_node("a100-02")
    jobs = [helpers.submit(world.alice, world.vision, gpus=1) for _ in range(12)]
    settings.TESSERA = {**settings.TESSERA, "PASS_BUDGET_S": 5.5}  # the engine decides 5 a pass
    monkeypatch.setattr(passes, "clock", FakeClock())
    return jobs


def _states(jobs) -> list[str]:
    rows = Job.objects.filter(pk__in=[j.pk for j in jobs]).order_by("pk")
    return list(rows.values_list("state", flat=True))


def test_a_pass_out_of_time_binds_what_it_decided_and_records_that_it_was_cut_short(
    many_pending, monkeypatch, caplog
):
    asked = []
    monkeypatch.setattr(triggers, "queue_pass", lambda: asked.append("task"))
    with caplog.at_level(logging.INFO, logger="tessera.pass"):
        result = passes.run_pass(max_rounds=1)
    assert len(result.bound) == 5 and result.undecided == 7
    assert _states(many_pending).count(JobState.SCHEDULED) == 5
    left = Job.objects.filter(pk__in=[j.pk for j in many_pending], state=JobState.PENDING)
    assert {(j.pending_code, "ran out of time" in j.pending_reason) for j in left} == {("priority", True)}
    state = SchedulerState.objects.get(id=1)
    assert state.last_pass_decisions["cut_short"] is True
    assert state.last_pass_decisions["undecided"] == 7
    assert state.decisions_total["cut_short"] == 1
    assert "cut short by its time budget, 7 left for the next pass" in caplog.text
    assert asked == ["task"]  # the rest is asked for (after max_rounds: as a new task)
    triggers.take_again()  # leave no flag for the next test


def test_the_passes_after_a_cut_one_bind_the_rest(many_pending):
    first = passes.run_pass()  # three rounds: 5, 5 and the last 2
    assert first is not None and not first.undecided
    assert _states(many_pending) == [JobState.SCHEDULED] * 12
    assert SchedulerState.objects.get(id=1).decisions_total["cut_short"] == 2


def test_a_pass_within_its_budget_is_not_cut_short(world):
    helpers.make_node("a100-01")
    helpers.submit(world.alice, world.vision, gpus=1)
    result = passes.run_pass()
    assert result.bound and not result.undecided
    assert SchedulerState.objects.get(id=1).last_pass_decisions["cut_short"] is False


def _lock_is_free() -> bool:
    """Asked from another connection: advisory locks are re-entrant within their session."""
    out = []

    def ask() -> None:
        try:
            got = passes.try_lock()
            if got:
                passes.unlock()
            out.append(got)
        finally:
            connection.close()

    thread = threading.Thread(target=ask)
    thread.start()
    thread.join(30)
    return out == [True]


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgresql("the pass lock is PostgreSQL's advisory lock, seen from a second connection")
@pytest.mark.parametrize("connection_broken", [False, True])
def test_a_pass_stopped_by_the_soft_time_limit_leaves_no_half_chunk_and_no_lock(
    require_postgres, world, monkeypatch, connection_broken
):
    from scheduling.tasks import scheduling_pass

    helpers.make_node("a100-01")
    job = helpers.submit(world.alice, world.vision, gpus=2)
    real_write = passes.write_together

    def write_then_time_out(*writes):
        # The chunk's allocations and the job's transition, not committed (the COMMIT that
        # rides on them, bulk.riding_transaction, is not sent).
        real_write(*(w for w in writes if w is not COMMIT))
        if connection_broken:  # the limit broke into a query: the connection is unusable
            connection.connection.close()
        raise SoftTimeLimitExceeded()

    monkeypatch.setattr(passes, "write_together", write_then_time_out)
    scheduling_pass.run()  # the task stops the pass, and the worker carries on
    monkeypatch.undo()

    job.refresh_from_db()
    assert job.state == JobState.PENDING
    assert not Allocation.objects.filter(job=job).exists()
    assert _lock_is_free()
    assert passes.run_pass().bound == [str(job.pk)]  # the next pass binds it, once


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgresql("the COMMIT rides on the chunk's writes only on PostgreSQL")
def test_a_pass_stopped_by_the_soft_time_limit_right_after_its_commit_keeps_its_chunk_whole(
    require_postgres, world, monkeypatch
):
    from scheduling.tasks import scheduling_pass

    helpers.make_node("a100-01")
    job = helpers.submit(world.alice, world.vision, gpus=2)
    real_write = passes.write_together

    def commit_then_time_out(*writes):
        real_write(*writes)
        raise SoftTimeLimitExceeded()

    monkeypatch.setattr(passes, "write_together", commit_then_time_out)
    scheduling_pass.run()
    monkeypatch.undo()

    job.refresh_from_db()
    assert job.state == JobState.SCHEDULED
    assert Allocation.objects.filter(job=job, released_at__isnull=True).count() == 2
    assert _lock_is_free()
    assert passes.run_pass().bound == []  # bound once: the next pass finds nothing to bind


def test_a_snapshot_read_longer_than_the_budget_still_leaves_the_budget_to_decide(many_pending, monkeypatch):
    """The budget bounds the deciding: a slow read (here 100 s of the fake clock) must not make
    every pass decide nothing, as it did when the budget counted from the pass's start."""
    load = passes.load_snapshot

    def slow_load(*args, **kwargs):
        passes.clock.t += 100.0
        return load(*args, **kwargs)

    monkeypatch.setattr(passes, "load_snapshot", slow_load)
    monkeypatch.setattr(triggers, "queue_pass", lambda: None)
    result = passes.run_pass(max_rounds=1)
    assert len(result.bound) == 5 and result.undecided == 7
