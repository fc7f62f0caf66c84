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
