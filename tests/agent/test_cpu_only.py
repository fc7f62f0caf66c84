"""A CPU-only job (``gpus: 0``) reaches its node's agent and runs there without GPUs."""

from __future__ import annotations

from scheduling.choices import JobState
from scheduling.models import Job
from scheduling.services import passes
from tests.agent import helpers as h


def test_a_cpu_only_job_is_started_by_its_agent_and_succeeds(world, join_token):
    node, _ = h.register(join_token, "cpu-01", gpus=0)
    job = h.submit(world.alice, world.vision, gpus=0, cpus=2)
    passes.run_pass()
    (order,) = h.heartbeat(node)["start"]
    assert order["job_id"] == job.pk and order["gpus"] == []
    assert h.report(node, job.pk, "started", attempt=0, replica=0).status_code == 200
    assert h.report(node, job.pk, "exited", attempt=0, replica=0, exit_code=0).status_code == 200
    assert Job.objects.get(pk=job.pk).state == JobState.SUCCEEDED


def test_cpu_only_jobs_that_ask_for_no_cpus_get_the_default_and_cannot_fill_a_node(
    world, join_token, settings
):
    """bob's 40 CPU-only jobs, none saying how many CPUs: each replica counts as
    ``TESSERA_CPU_JOB_CPUS`` (1) of the node's CPUs, so the node runs only as many as it has."""
    from rest_framework.test import APIClient

    settings.TESSERA = {**settings.TESSERA, "CPU_JOB_CPUS": 1.0}
    node, _ = h.register(join_token, "cpu-01", gpus=0, cpus=4)
    api = APIClient()
    api.force_authenticate(world.bob)
    body = {"name": "crunch", "kind": "batch", "command": ["true"], "gpus": 0}
    ids = [api.post("/api/v1/jobs/", {**body, "tenant": "nlp"}, format="json").data["id"] for _ in range(40)]
    two = api.post("/api/v1/jobs/", {**body, "tenant": "nlp", "replicas": 2}, format="json").data
    assert Job.objects.get(pk=ids[0]).cpus == 1.0 and Job.objects.get(pk=two["id"]).cpus == 2.0
    passes.run_pass()
    started = h.heartbeat(node)["start"]
    assert len(started) == 4 and all(order["cpus"] == 1.0 for order in started)
    assert Job.objects.filter(pk__in=ids, state=JobState.PENDING).count() == 36
