"""A job's life through the services: the state machine, events, retries, cancel, preemption."""

from __future__ import annotations

import pytest
from django.db import transaction

from scheduling.choices import EventType, JobState
from scheduling.models import Allocation, Job
from scheduling.services import passes
from scheduling.services.jobs import begin_stop, do_cancel_job, do_mark_running, do_record_exit
from scheduling.states import ALLOWED, InvalidTransition, check_transition
from tests.scheduling import helpers


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


def _held(job):
    return Allocation.objects.filter(job=job, released_at__isnull=True).count()


def test_cancelling_a_bound_job_its_agent_already_started_frees_nothing_until_it_exits(world):
    """The binding was pushed and the process runs, but its ``started`` report is not in yet:
    the GPUs stay with the job until the agent says the process has ended."""
    from tests.agent import helpers as agent

    client, _ = agent.register(agent.new_join_token())
    job = agent.bind(helpers.submit(world.alice, world.vision, gpus=2, grace_seconds=7), "gpu-01", [0, 1])
    job = do_cancel_job(job.pk)
    assert job.state == JobState.TERMINATING and _held(job) == 2
    passes.run_pass()  # nothing may be bound onto those GPUs meanwhile
    assert _held(job) == 2
    running = [{"job_id": job.pk, "attempt": 0, "replica": 0, "pid": 1}]
    (order,) = agent.heartbeat(client, running)["stop"]  # the process is there: stop it, with grace
    assert order["reason"] == "cancelled" and 6 <= order["grace_left_seconds"] <= 7
    agent.report(client, job.pk, "exited", attempt=0, replica=0, exit_code=-15, reason="stopped")
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED and _held(job) == 0


def test_cancelling_a_bound_job_its_agent_never_started_ends_at_the_agents_next_heartbeat(world):
    from tests.agent import helpers as agent

    client, _ = agent.register(agent.new_join_token())
    job = agent.bind(helpers.submit(world.alice, world.vision, gpus=2), "gpu-01", [0, 1])
    assert do_cancel_job(job.pk).state == JobState.TERMINATING
    assert agent.heartbeat(client, [])["start"] == []  # no process here: never to be started
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED and _held(job) == 0
    assert _types(job)[-2:] == ["terminating", "cancelled"]


def test_cancelling_a_pending_job_asks_for_a_pass(
    world, node, monkeypatch, django_capture_on_commit_callbacks
):
    """It may have held a reservation, or the head of its queue: what waited behind it may start."""
    asked = []
    monkeypatch.setattr("scheduling.services.triggers.request_pass", lambda: asked.append(1))
    job = helpers.submit(world.alice, world.vision, gpus=64)
    with django_capture_on_commit_callbacks(execute=True):
        do_cancel_job(job.pk)
    assert asked == [1]


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
