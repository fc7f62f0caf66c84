"""A job's checkpoint, reported by its agent: what the engine counts as work a preemption loses."""

from __future__ import annotations

import pytest
from django.utils import timezone

from scheduling.choices import JobState
from scheduling.models import Job
from scheduling.services import passes
from scheduling.services.agents import NotYours, Stale, do_report_checkpoint, do_report_started
from scheduling.services.snapshot import load_snapshot
from tests.scheduling import helpers


@pytest.fixture
def running(world):
    node = helpers.make_node("a100-01")
    other = helpers.make_node("a100-02")
    job = helpers.submit(world.alice, world.vision, gpus=8, checkpoint_seconds=600)
    passes.run_pass()
    job.refresh_from_db()
    do_report_started(node, job.pk, job.attempts, 0, timezone.now().timestamp())
    return node, other, job


def test_a_checkpoint_reported_by_the_jobs_agent_reaches_the_engine(running):
    node, _, job = running
    at = timezone.now()  # (kept between the job's binding and now, as its start is)
    do_report_checkpoint(node, job.pk, job.attempts, at.timestamp())
    assert Job.objects.get(pk=job.pk).last_checkpoint_at == at
    (run,) = load_snapshot(timezone.now()).snapshot.running
    assert run.last_checkpoint_at == pytest.approx(at.timestamp())


def test_a_checkpoint_from_another_node_or_an_old_attempt_is_refused(running):
    node, other, job = running
    with pytest.raises(NotYours):
        do_report_checkpoint(other, job.pk, job.attempts, None)
    with pytest.raises(Stale):
        do_report_checkpoint(node, job.pk, job.attempts + 1, None)
    assert Job.objects.get(pk=job.pk).last_checkpoint_at is None
    assert Job.objects.get(pk=job.pk).state == JobState.RUNNING


def test_a_checkpoint_is_an_event_at_most_once_a_minute_and_an_older_one_changes_nothing(running):
    from datetime import timedelta

    node, _, job = running
    first = timezone.now()
    do_report_checkpoint(node, job.pk, job.attempts, first.timestamp(), "step 100")
    do_report_checkpoint(node, job.pk, job.attempts, (first + timedelta(seconds=20)).timestamp(), "step 120")
    do_report_checkpoint(node, job.pk, job.attempts, (first - timedelta(seconds=5)).timestamp(), "step 90")
    job.refresh_from_db()
    # The later one moved the time (clamped to now), the older one did not; one event so far
    assert first < job.last_checkpoint_at <= timezone.now()
    assert list(job.events.filter(type="checkpointed").values_list("reason", flat=True)) == ["step 100"]
