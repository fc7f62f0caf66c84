"""Live, an elastic job runs at the size it started with: the pass never shrinks or grows it.

The agent cannot add or remove a running job's replicas, so the live engine runs with resizes
off. Before, the engine shrank an elastic job in its own state and bound another job on the
GPUs it freed; the database still held them, so the binding was refused as an over-commit every
pass while the elastic job ran, and the waiting job's reason never said why.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from scheduling.choices import JobState
from scheduling.models import Allocation, Job
from scheduling.services import passes
from scheduling.services.jobs import do_mark_running
from tests.scheduling import helpers


@pytest.fixture
def elastic_on_every_gpu(world):
    helpers.make_node("a100-01")  # 8 GPUs
    job = helpers.submit(
        world.alice, world.vision, gpus=4, replicas=4, min_available=2, elastic_min_gpus=2, elastic_max_gpus=8
    )
    assert passes.run_pass().bound == [str(job.pk)]
    assert Allocation.objects.filter(job=job, released_at__isnull=True).count() == 8  # its max
    with transaction.atomic():
        do_mark_running(Job.objects.select_for_update().select_related("tenant").get(pk=job.pk))
    # It has run for 10 minutes: past the minimum run time before a job may be preempted.
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(minutes=10))
    return job


def _held(job) -> int:
    return Allocation.objects.filter(job=job, released_at__isnull=True).count()


def test_a_service_preempts_a_running_elastic_job_instead_of_being_bound_on_its_gpus(
    world, elastic_on_every_gpu
):
    serve = helpers.submit(world.bob, world.nlp, kind="inference", gpus=1, preemptible=False)
    result = passes.run_pass()
    assert result.bound == [] and result.dropped == []  # nothing planned on GPUs still held
    assert result.preempted == [str(elastic_on_every_gpu.pk)]
    serve.refresh_from_db()
    elastic_on_every_gpu.refresh_from_db()
    assert serve.state == JobState.PENDING and serve.pending_code == "reserved"
    assert "preempting 1 job(s)" in serve.pending_reason
    assert elastic_on_every_gpu.state == JobState.TERMINATING
    assert _held(elastic_on_every_gpu) == 8  # through its grace period, whole


def test_a_training_job_waits_for_a_running_elastic_job_and_says_why(world, elastic_on_every_gpu):
    waiting = helpers.submit(world.bob, world.nlp, gpus=2)
    result = passes.run_pass()
    assert result.bound == [] and result.dropped == [] and result.preempted == []
    waiting.refresh_from_db()
    assert waiting.state == JobState.PENDING and waiting.pending_code == "reserved"
    assert _held(elastic_on_every_gpu) == 8
