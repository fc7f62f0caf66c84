"""A job's life through the services: the state machine, events, retries, cancel, preemption."""

from __future__ import annotations

import importlib

import pytest
from django.db import transaction

from scheduling.choices import EventType, JobState
from scheduling.models import Allocation, Job
from scheduling.services import passes
from scheduling.services.jobs import begin_stop, do_cancel_job, do_mark_running, do_record_exit
from scheduling.states import ALLOWED, InvalidTransition, check_transition

helpers = importlib.import_module("tests.scheduling.helpers")


@pytest.fixture
def node(world):
    return helpers.make_node("a100-01")


def _locked(job):
    return Job.objects.select_for_update().select_related("tenant").get(pk=job.pk)


def _run_to_running(job):
    passes.run_pass()
    with transaction.atomic():
        do_mark_running(_locked(job))
    job.refresh_from_db()
    return job


def _types(job):
    return [e.type for e in job.events.order_by("at", "id")]


def test_terminal_states_allow_no_transition():
    for state in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED):
        assert ALLOWED[state] == frozenset()
        with pytest.raises(InvalidTransition):
            check_transition(1, state, JobState.PENDING)


def test_a_pending_job_cannot_jump_to_running():
    with pytest.raises(InvalidTransition):
        check_transition(1, JobState.PENDING, JobState.RUNNING)


def test_a_successful_job_records_every_transition_and_frees_its_gpus(world, node):
    job = _run_to_running(helpers.submit(world.alice, world.vision, gpus=2))
    with transaction.atomic():
        do_record_exit(_locked(job), 0)
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED and job.exit_code == 0 and job.finished_at
    assert _types(job) == ["submitted", "scheduled", "started", "succeeded"]
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()


def test_a_failed_attempt_with_retries_left_is_requeued_after_backoff(world, node):
    job = _run_to_running(helpers.submit(world.alice, world.vision, max_retries=1))
    with transaction.atomic():
        do_record_exit(_locked(job), 3)
    job.refresh_from_db()
    assert job.state == JobState.PENDING and job.attempts == 1 and job.not_before
    assert job.events.get(type=EventType.RETRYING).reason == "exit 3"


def test_a_failed_attempt_without_retries_fails_the_job(world, node):
    job = _run_to_running(helpers.submit(world.alice, world.vision))
    with transaction.atomic():
        do_record_exit(_locked(job), 3)
    job.refresh_from_db()
    assert job.state == JobState.FAILED and job.exit_code == 3


def test_cancelling_a_pending_job_is_immediate_and_idempotent(world, node):
    job = helpers.submit(world.alice, world.vision, gpus=64)
    first = do_cancel_job(job.pk)
    again = do_cancel_job(job.pk)
    assert first.state == again.state == JobState.CANCELLED
    assert _types(again).count("cancelled") == 1


def test_cancelling_a_running_job_keeps_its_gpus_until_the_process_exits(world, node):
    job = _run_to_running(helpers.submit(world.alice, world.vision, gpus=2))
    job = do_cancel_job(job.pk)
    assert job.state == JobState.TERMINATING
    assert Allocation.objects.filter(job=job, released_at__isnull=True).count() == 2
    with transaction.atomic():
        do_record_exit(_locked(job), -15)
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()


def test_cancelling_a_succeeded_job_is_a_conflict(world, node):
    job = _run_to_running(helpers.submit(world.alice, world.vision))
    with transaction.atomic():
        do_record_exit(_locked(job), 0)
    with pytest.raises(InvalidTransition):
        do_cancel_job(job.pk)


def test_a_preempted_job_goes_back_to_the_queue_with_one_more_attempt(world, node):
    job = _run_to_running(helpers.submit(world.alice, world.vision, gpus=2))
    with transaction.atomic():
        begin_stop(_locked(job), "preempted: for job 9")
    job.refresh_from_db()
    assert job.state == JobState.TERMINATING and job.stop_deadline
    with transaction.atomic():
        do_record_exit(_locked(job), -15)
    job.refresh_from_db()
    assert job.state == JobState.PENDING and job.attempts == 1
    assert _types(job)[-2:] == ["preempted", "requeued"]
