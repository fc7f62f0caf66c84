"""Node health: silent nodes become not-ready; their jobs are requeued only after the lease."""

from __future__ import annotations

import importlib
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from scheduling.choices import JobState, NodeState
from scheduling.models import Allocation, Job, Node
from scheduling.services import passes
from scheduling.services.health import sweep_nodes
from scheduling.services.jobs import do_mark_running

helpers = importlib.import_module("tests.scheduling.helpers")


def _running_job(world, **fields):
    job = helpers.submit(world.alice, world.vision, **fields)
    passes.run_pass()
    with transaction.atomic():
        do_mark_running(Job.objects.select_for_update().select_related("tenant").get(pk=job.pk))
    job.refresh_from_db()
    return job


def test_a_node_whose_heartbeats_stop_becomes_not_ready(world, settings):
    node = helpers.make_node("a100-01")
    late = timezone.now() - timedelta(seconds=settings.TESSERA["HEARTBEAT_TIMEOUT_S"] + 1)
    Node.objects.filter(pk=node.pk).update(last_heartbeat=late)
    assert sweep_nodes() == ["a100-01"]
    assert Node.objects.get(pk=node.pk).state == NodeState.NOT_READY


def test_a_lost_nodes_jobs_keep_their_gpus_until_the_lease_expires(world, settings):
    node = helpers.make_node("a100-01")
    job = _running_job(world, gpus=2, max_retries=1)
    silent_since = timezone.now() - timedelta(seconds=settings.TESSERA["HEARTBEAT_TIMEOUT_S"] + 1)
    Node.objects.filter(pk=node.pk).update(last_heartbeat=silent_since)
    sweep_nodes()
    job.refresh_from_db()
    assert job.state == JobState.RUNNING  # the lease has not expired: it may still be running
    assert Allocation.objects.filter(job=job, released_at__isnull=True).count() == 2

    expired = timezone.now() - timedelta(seconds=settings.TESSERA["LEASE_S"] + 1)
    Node.objects.filter(pk=node.pk).update(last_heartbeat=expired)
    sweep_nodes()
    job.refresh_from_db()
    assert job.state == JobState.PENDING and job.attempts == 1
    assert job.events.filter(type="requeued", reason="node-lost").exists()
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()


def test_a_lost_nodes_job_without_retries_fails_with_node_lost(world, settings):
    node = helpers.make_node("a100-01")
    job = _running_job(world, gpus=1)
    expired = timezone.now() - timedelta(seconds=settings.TESSERA["LEASE_S"] + 1)
    Node.objects.filter(pk=node.pk).update(last_heartbeat=expired, state=NodeState.NOT_READY)
    sweep_nodes()
    job.refresh_from_db()
    assert job.state == JobState.FAILED
    assert job.events.get(type="failed").reason == "node-lost"
